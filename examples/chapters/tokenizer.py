"""第 3.2 章示例：把一句带 emoji 的话一个 token 一个 token 地送进反分词器，看哪些被扣住；再看一个跨 token 的停止字符串。

    python examples/chapters/tokenizer.py

en: Chapter 3.2 example: feed a sentence with an emoji into the detokenizer one token at a time and see what is held
back; then a stop string that spans tokens.

    python examples/chapters/tokenizer.py
"""

from transformers import AutoTokenizer

from minisgl.i18n import tr
from minisgl.message import DetokenizeMsg
from minisgl.model_zoo import tiny_qwen3
from minisgl.tokenizer import DetokenizeManager

tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3())


def show(text: str, stop: str = "") -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    manager = DetokenizeManager(tokenizer)
    manager.add(uid=0, prompt_tokens=0, stop=[stop] if stop else [])
    pieces = []
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        reply = manager.detokenize(DetokenizeMsg(0, token, last, "length" if last else None))
        sent = tr("(no reply: the request has finished)") if reply is None else repr(reply.incremental_output)
        end = tr("  ← finished: {reason}", reason=reply.finish_reason) if reply is not None and reply.finished else ""
        print(f"{i:>4} {token:>8}  {tokenizer.decode([token])!r:<14} {sent}{end}")
        pieces.append("" if reply is None else reply.incremental_output)
    print(tr("joined: {joined!r}", joined="".join(pieces)))


show("Nice weather today, let's go for a walk 🦜")
show("Nice weather today, let's go for a walk, lets see.", stop=", lets")
