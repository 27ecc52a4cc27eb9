"""第 3.5 章示例：SmolLM2 上的采样控制——重复 / 出现 / 频率惩罚、logit 偏置、最少 token 数、对数概率，
以及同一批里各行互不影响。

    python examples/chapters/sampling.py

en: Chapter 3.5 example: sampling controls on SmolLM2 — repetition / presence / frequency penalties, logit bias, a
minimum number of tokens, log-probabilities, and rows of one batch that do not affect each other.

    python examples/chapters/sampling.py
"""

import torch
from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.model_zoo import smollm2

path = smollm2()
tok = AutoTokenizer.from_pretrained(path)
llm = LLM(path, dtype=torch.float32, max_running_req=4, num_page_override=512, max_seq_len_override=256)
PROMPT = "List the days of the week: Monday, Tuesday,"

# 1. 惩罚：贪心解码，只改一个控制
# en: 1. penalties: greedy decoding, one control changed at a time
print(tr("Greedy, 16 tokens after {prompt!r}:", prompt=PROMPT))
settings = [
    (tr("no control"), SamplingParams(max_tokens=16)),
    ("repetition_penalty=1.3", SamplingParams(max_tokens=16, repetition_penalty=1.3)),
    ("presence_penalty=1.5", SamplingParams(max_tokens=16, presence_penalty=1.5)),
    ("frequency_penalty=1.0", SamplingParams(max_tokens=16, frequency_penalty=1.0)),
]
outs = llm.generate([PROMPT] * len(settings), [sp for _, sp in settings])
for (name, _), out in zip(settings, outs):
    print(f"  {name:<24} {out['text']!r}")

# 2. logit 偏置：-100 等于禁掉一个 token
# en: 2. logit bias: -100 as good as bans a token
wednesday = tok.encode(" Wednesday")[0]
out = llm.generate([PROMPT], SamplingParams(max_tokens=8, logit_bias={str(wednesday): -100.0}))[0]
print(tr("\nlogit_bias bans ' Wednesday' (token {id}, bias -100): {text!r}", id=wednesday, text=out["text"]))

# 3. 最少 token 数：EOS 在那之前被屏蔽
# en: 3. minimum number of tokens: EOS is masked until then
QUESTION = "What is 2+2? Reply with the number only."
chat = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=False)
print(tr("\nA chat answer to {q!r}, greedy, max_tokens=20:", q=QUESTION))
for min_tokens in (0, 8):
    out = llm.generate([chat], SamplingParams(max_tokens=20, min_tokens=min_tokens))[0]
    print(tr("  min_tokens={m}: {n} tokens before EOS, {text!r}", m=min_tokens, n=len(out["token_ids"]), text=out["text"]))

# 4. 对数概率：采到的 token 和概率最大的几个
# en: 4. log-probabilities: the sampled token and the most likely ones
out = llm.generate([PROMPT], SamplingParams(max_tokens=4, logprobs=True, top_logprobs=3))[0]
print(tr("\nlogprobs=True, top_logprobs=3 (greedy, so the sampled token is always the first of the top 3):"))
for token, lp in zip(out["token_ids"], out["logprobs"]):
    top = ", ".join(f"{tok.decode([t])!r} {v:.1f}" for t, v in zip(lp.top_ids, lp.top_logprobs))
    print(f"  {tok.decode([token])!r:<14} {lp.logprob:.1f}   top: {top}")

# 5. 同一批里：用控制的行不影响不用的行
# en: 5. within one batch: a row using controls does not change the rows that do not
plain = SamplingParams(max_tokens=12)
alone = llm.generate([PROMPT], plain)[0]["token_ids"]
mixed = llm.generate([PROMPT, PROMPT], [SamplingParams(max_tokens=12, repetition_penalty=1.3, min_p=0.2), plain])
print(tr("\nA plain request in a batch next to one with penalties: same tokens as alone: {same}",
         same=mixed[1]["token_ids"] == alone))
llm.shutdown()
