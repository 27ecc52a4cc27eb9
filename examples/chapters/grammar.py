"""第 3.6 章示例：SmolLM2 上的结构化输出——一行位掩码有多大、语法匹配器一步步允许几个 token、JSON Schema /
正则表达式 / EBNF 约束下的贪心输出（和不加约束的对照），以及同一批里不用语法的行不受影响。

    python examples/chapters/grammar.py

en: Chapter 3.6 example: structured output on SmolLM2 — how large one row of the bitmask is, how many tokens a grammar
matcher allows step by step, greedy output under a JSON Schema / a regular expression / an EBNF grammar (next to the
output without one), and a row without a grammar in the same batch, unaffected.

    python examples/chapters/grammar.py
"""

import json

import torch
import xgrammar as xgr
from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.grammar import BITS
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.model_zoo import smollm2

path = smollm2()
tok = AutoTokenizer.from_pretrained(path)
VOCAB = 49152
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"]}

# 1. 位掩码：每个 token 一位，一个 int32 装 32 个
# en: 1. the bitmask: one bit per token, 32 of them in one int32
bitmask = xgr.allocate_token_bitmask(1, VOCAB)
print(tr("Vocabulary {v} tokens → one bitmask row of {w} int32 ({kib} KiB); a float32 row of logits is {logits_kib} KiB",
         v=VOCAB, w=bitmask.shape[1], kib=bitmask.shape[1] * 4 // 1024, logits_kib=VOCAB * 4 // 1024))

# 2. 一个匹配器走过一段合法的 JSON：每一步之前允许几个 token
# en: 2. a matcher walks through a valid JSON: how many tokens are allowed before each step
info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=VOCAB, stop_token_ids=[tok.eos_token_id])
compiler = xgr.GrammarCompiler(info, max_threads=1)
matcher = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(PERSON), any_whitespace=False))
TEXT = '{"name": "Ann", "age": 31}'
shifts = torch.arange(BITS, dtype=torch.int32)
print(tr("\nA matcher for the schema {schema} walks through {text!r} token by token:", schema=json.dumps(PERSON), text=TEXT))
for token in tok.encode(TEXT, add_special_tokens=False) + [tok.eos_token_id]:
    matcher.fill_next_token_bitmask(bitmask, 0)
    allowed = int(((bitmask[0, :, None] >> shifts) & 1).sum())
    accepted = matcher.accept_token(token)
    print(tr("  {token:<14} allowed before it: {n:>5}   accepted: {ok}", token=repr(tok.decode([token])), n=allowed, ok=accepted))
print(tr("  terminated: {done}", done=matcher.is_terminated()))

# 3. 在真的模型上：同一个问题，不加约束和加上语法（贪心）
# en: 3. on the real model: the same question without and with a grammar (greedy)
llm = LLM(path, dtype=torch.float32, max_running_req=4, num_page_override=512, max_seq_len_override=256)


def chat(question: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)


DATE = r"\d{4}-\d{2}-\d{2}"
STRICT_DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
CASES = [
    ("Describe Ann, who is 31.", [("json_schema", json.dumps(PERSON))]),
    ("When did people first land on the Moon? Give the date.", [("regex", DATE), ("regex", STRICT_DATE)]),
    ("Is Paris the capital of France? Answer yes or no.", [("ebnf", 'root ::= ("yes" | "no")')]),
]
for question, grammars in CASES:
    outs = llm.generate([chat(question)] * (1 + len(grammars)),
                        [SamplingParams(max_tokens=24)] + [SamplingParams(max_tokens=48, **{k: g}) for k, g in grammars])
    print("\n" + repr(question))
    print(tr("  no grammar: {text!r}", text=outs[0]["text"]))
    for (kind, grammar), out in zip(grammars, outs[1:]):
        print(tr("  {kind} {grammar}: {text!r} (tokens: {n})", kind=kind, grammar=grammar if kind != "json_schema" else "PERSON",
                 text=out["text"], n=len(out["token_ids"])))
        if kind == "json_schema":
            print(tr("    json.loads: {value}", value=json.loads(out["text"])))

# 4. 同一批里：用语法的行不影响不用的行
# en: 4. within one batch: a row with a grammar does not change the rows without one
plain = SamplingParams(max_tokens=12)
alone = llm.generate([chat("Name a fruit.")], plain)[0]["token_ids"]
mixed = llm.generate([chat("Name a fruit."), chat("Name a fruit.")], [SamplingParams(max_tokens=12, regex="(apple|pear)"), plain])
print(tr("\nregex (apple|pear) next to a plain request in one batch: {text!r}; the plain one has the same tokens as alone: {same}",
         text=mixed[0]["text"], same=mixed[1]["token_ids"] == alone))
llm.shutdown()
