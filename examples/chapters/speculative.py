"""第 5.3 章示例：引擎里的投机解码。同样几个照着输入写的请求（SmolLM2，贪心），不投机和 ``speculative_algorithm="NGRAM"``
各跑一遍：输出逐 token 相同，解码步数少得多；统计里看验证了几个草稿 token、接受了几个、每次验证出几个 token、
为了让接受的路挨着挪过几格 K/V。然后是一个自由对话的请求（n-gram 猜得少，少猜、歇着），和一批混着贪心、采样、
带惩罚的请求：哪些投机、哪些照常一步一个。

    python examples/chapters/speculative.py

en: Chapter 5.3 example: speculative decoding in the engine. The same few grounded requests (SmolLM2, greedy), once
plain and once with ``speculative_algorithm="NGRAM"``: the output is token for token the same, with far fewer
decode steps; the statistics show the draft tokens verified and accepted, the tokens per verification and the K/V slots
moved to keep accepted paths contiguous. Then a free chat request (the n-grams guess little: short guesses, rests), and
a batch mixing greedy, sampled and penalised requests: which speculate and which decode one token at a time.

    python examples/chapters/speculative.py
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.model_zoo import smollm2
from minisgl.speculative import speculation

PASSAGE = ("The radix cache keeps the keys and values of every prefix it has seen. When a new request arrives, the "
           "scheduler looks up the longest cached prefix, reuses its slots and computes only the rest.")
GROUNDED = [f"Copy this text exactly, word for word:\n{PASSAGE}",
            f"Fix the spelling in this text and print it: {PASSAGE.replace('the ', 'teh ')}"]
CHAT = ["Why is the sky blue?"]
KW: dict[str, Any] = dict(dtype=torch.float32, max_running_req=4, num_page_override=512, max_seq_len_override=512)

path = smollm2()
tok = AutoTokenizer.from_pretrained(path)


def chat(texts: list[str]) -> list[list[int]]:
    return [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, return_dict=False)
            for t in texts]


class Engine:
    """一个引擎和它的解码步计数（每一步之后调度器调用监听者，见第 2.1 章）。

    en: An engine and its count of decode steps (the scheduler calls its listeners after every step, see chapter 2.1)."""

    def __init__(self, spec: bool) -> None:
        self.llm = LLM(path, **KW, speculative_algorithm="NGRAM" if spec else None)
        self.steps = 0
        self.llm.add_step_listener(self.count)

    def count(self, trace: Any) -> None:
        self.steps += trace.phase == "decode"

    def generate(self, prompts: list[list[int]], sps: Any) -> tuple[list[list[int]], int, Any]:
        """生成一遍：每个请求的 token、这一遍的解码步数、这一遍的投机统计（不投机时 None）。

        en: One pass: each request's tokens, this pass's decode steps, this pass's speculation statistics (None when
        plain)."""
        steps, loop = self.steps, self.llm.loop
        if loop.spec_stats is not None:
            loop.forget()  # 从一棵空的 n-gram 树开始 | en: start from an empty n-gram tree
            loop.spec_stats = type(loop.spec_stats)()
        outs = [o["token_ids"] for o in self.llm.generate(prompts, sps)]
        return outs, self.steps - steps, loop.spec_stats


def compare(plain: Engine, spec: Engine, title: str, texts: list[str], max_tokens: int) -> None:
    print(title)
    prompts, sp = chat(texts), SamplingParams(max_tokens=max_tokens)
    a_out, a_steps, _ = plain.generate(prompts, sp)
    b_out, b_steps, stats = spec.generate(prompts, sp)
    for text, a, b in zip(texts, a_out, b_out):
        print(tr("  {prompt!r}: {n} tokens, the same as plain decoding: {same}", prompt=text.split("\n")[0][:48],
                 n=len(b), same=a == b))
    print(tr("  decode steps: plain {plain}, speculative {spec}", plain=a_steps, spec=b_steps))
    print(tr("  draft tokens verified {p}, accepted {a}; {v} verifications with a draft, {m:.2f} tokens each "
             "(the bonus included); K/V slots moved {moved}", p=stats.proposed, a=stats.accepted, v=stats.verifies,
             m=stats.mean_accept_length, moved=stats.moved))
    print(tr("  tokens per verification -> how often: {hist}", hist=dict(sorted(stats.accept_lengths.items()))))


def mixed_batch(spec: Engine) -> None:
    print(tr("\n== 3. A mixed batch: who speculates =="))
    kinds = [
        (tr("greedy"), SamplingParams(max_tokens=48)),
        (tr("sampled, temperature 0.7"), SamplingParams(max_tokens=48, temperature=0.7)),
        (tr("sampled with a seed"), SamplingParams(max_tokens=48, temperature=0.7, seed=1)),
        (tr("greedy with repetition_penalty 1.2"), SamplingParams(max_tokens=48, repetition_penalty=1.2)),
    ]
    # speculation() 只看请求的采样参数（和已经出了几个 token）：这里给它一个只有 sampling_params 的替身
    # en: speculation() reads only the request's sampling parameters (and how many tokens are out): a stand-in with
    # en: just sampling_params will do here
    for name, sp in kinds:
        print(tr("  {name:<36} speculates as: {how}", name=name, how=speculation(_Req(sp), 0)))
    _, steps, stats = spec.generate(chat(GROUNDED[:1] * len(kinds)), [sp for _, sp in kinds])
    print(tr("  the batch: {steps} decode steps, {v} verifications with a draft, {a} of {p} draft tokens accepted",
             steps=steps, v=stats.verifies, a=stats.accepted, p=stats.proposed))


class _Req:
    def __init__(self, sp: SamplingParams) -> None:
        self.sampling_params = sp


if __name__ == "__main__":
    plain, spec = Engine(False), Engine(True)
    try:
        compare(plain, spec, tr("== 1. Grounded requests (copy, fix the spelling), greedy, plain vs NGRAM =="), GROUNDED, 96)
        compare(plain, spec, tr("\n== 2. A free chat request =="), CHAT, 32)
        mixed_batch(spec)
    finally:
        plain.llm.shutdown()
        spec.llm.shutdown()
