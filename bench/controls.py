"""第 3.5 / 3.6 章的代价（基准，不是测试）：SmolLM2（fp32）上 8 个请求 × 32 个 token，一次运行里轮流重复跑，报
token/s 的中位数（最小 – 最大）和同一轮的比值：

1. 不用任何控制（第 1.6 章的原路），贪心；另加同样的温度和种子、却不用控制的随机采样（2 的基线）；
2. 用上全部采样控制：重复 / 出现 / 频率惩罚、min-p、logit 偏置、对数概率（top 5）；
3. 用 JSON Schema 约束输出（一个 32 个 token 内写不完的数组，每个请求都正好生成 32 个）；
4. Hugging Face 成批 ``generate(repetition_penalty=1.3)``，对照 2 里的惩罚。

    python bench/controls.py                # 3 轮（另加 1 轮预热）
    python bench/controls.py --repeats 5

en: The cost of chapters 3.5 / 3.6 (a benchmark, not a test): 8 requests × 32 tokens on SmolLM2 (fp32), the cases taking
turns within one run, reporting token/s as median (min – max) and same-round ratios:

1. no control at all (chapter 1.6's path), greedy; plus sampling at the same temperature and seeds without the controls
   (the baseline of 2);
2. every sampling control: repetition / presence / frequency penalties, min-p, logit bias, log-probabilities (top 5);
3. output constrained by a JSON Schema (an array that cannot be finished within 32 tokens, so every request generates
   exactly 32);
4. Hugging Face's batched ``generate(repetition_penalty=1.3)``, against the penalties of 2.
"""

from __future__ import annotations

import argparse
import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.common import Case, interleaved, print_table, ratio_stats, timed
from bench.stage2 import hf_left_padded
from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.model_zoo import smollm2

TOKENS = 32
QUESTIONS = ["What is the capital of France?", "Name three colors.", "Why is the sky blue?", "Count to five.",
             "What do cats eat?", "Describe a tree.", "What is two plus two?", "Say hello in French."]
#: 32 个 token 内写不完：每个请求都正好生成 TOKENS 个。
#: en: Cannot be finished within 32 tokens: every request generates exactly TOKENS.
LONG_ARRAY = json.dumps({"type": "array", "items": {"type": "integer"}, "minItems": 64})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = smollm2()
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for q in QUESTIONS]
    llm = LLM(path, dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512,
              cache_type="naive")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids, mask = hf_left_padded(tok, prompts)
    plain = SamplingParams(max_tokens=TOKENS, ignore_eos=True)
    sampled = [SamplingParams(temperature=0.8, seed=i, max_tokens=TOKENS, ignore_eos=True) for i in range(len(prompts))]
    controls = [SamplingParams(temperature=0.8, seed=i, max_tokens=TOKENS, ignore_eos=True, repetition_penalty=1.3,
                               presence_penalty=0.5, frequency_penalty=0.5, min_p=0.05, logit_bias={"28": -5.0},
                               logprobs=True, top_logprobs=5) for i in range(len(prompts))]
    grammar = SamplingParams(max_tokens=TOKENS, json_schema=LONG_ARRAY)
    llm.generate(prompts[:1], grammar)  # 词表的预处理只做一次，不计时 | en: the vocabulary is preprocessed once, not timed

    def hf_run() -> None:
        with torch.no_grad():
            hf.generate(ids, attention_mask=mask, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False,
                        repetition_penalty=1.3, pad_token_id=tok.pad_token_id)

    n = TOKENS * len(prompts)
    names = {"plain": tr("none of them"), "sampled": tr("sampled, none of them"), "controls": tr("all sampling controls"),
             "grammar": tr("JSON Schema"), "hf": tr("HF generate, repetition penalty")}
    cases = [Case(names["plain"], lambda: timed(lambda: llm.generate(prompts, plain)), n),
             Case(names["sampled"], lambda: timed(lambda: llm.generate(prompts, sampled)), n),
             Case(names["controls"], lambda: timed(lambda: llm.generate(prompts, controls)), n),
             Case(names["grammar"], lambda: timed(lambda: llm.generate(prompts, grammar)), n),
             Case(names["hf"], lambda: timed(hf_run), n)]
    print(tr("SmolLM2 (fp32, {threads} threads): {n} requests × {tokens} tokens, {repeats} interleaved rounds (plus 1 warm-up round)",
             threads=torch.get_num_threads(), n=len(prompts), tokens=TOKENS, repeats=args.repeats))
    stats = interleaved(cases, args.repeats)
    print_table(stats, names["plain"])
    print(tr("all sampling controls / sampled, none of them (per-round ratio): {r}",
             r=ratio_stats(stats[names["controls"]], stats[names["sampled"]])))
    print(tr("JSON Schema / none of them (per-round ratio): {r}", r=ratio_stats(stats[names["grammar"]], stats[names["plain"]])))
    print(tr("all sampling controls / HF with a repetition penalty (per-round ratio): {r}",
             r=ratio_stats(stats[names["controls"]], stats[names["hf"]])))
    llm.shutdown()


if __name__ == "__main__":
    main()
