"""第 2 阶段里程碑（种子页）的验收：在最终引擎 ``minisgl.llm.LLM`` 上、用真实的 Qwen3 分词器，
从实际运行中数出来：4 个共享系统提示词的请求共 231 个 token，naive 缓存算 231 个、radix 算 73 个；
302 个 token 的提示词在 ``max_extend_tokens=96`` 下分 4 步 [96, 96, 96, 14] 预填充；8 个请求 × 16 个 token 全部完成。

里程碑脚本用 Qwen3-0.6B 形状的模型，这里用同一个分词器的小模型：这些 token 数只取决于分词器和调度。
"""

from __future__ import annotations

import torch

from .conftest import LONG_PROMPT, QUESTIONS, SYSTEM_PROMPT, assert_idle, record
from minisgl.core import SamplingParams
from minisgl.llm import LLM

SEED_KW = dict(dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512)


def test_eight_requests_sixteen_tokens(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **SEED_KW)
    rec = record(llm)
    out = llm.generate([f"Request {i}: tell me something." for i in range(8)], SamplingParams(max_tokens=16, ignore_eos=True))
    assert [len(o["token_ids"]) for o in out] == [16] * 8, "8 个请求各生成 16 个 token"
    assert max(len(s.uids) for s in rec.steps) == 8, "8 个请求在同一批里解码"
    assert_idle(llm)


def test_shared_system_prompt_naive_231_radix_73(tiny_path: str, qwen_tokenizer, make_llm) -> None:  # noqa: ANN001
    prompts = [SYSTEM_PROMPT + q for q in QUESTIONS]
    lens = [len(qwen_tokenizer.encode(p)) for p in prompts]
    assert lens == [60, 57, 59, 55] and sum(lens) == 231, f"4 个提示词的 token 数：{lens}"
    computed = {}
    for cache_type in ("naive", "radix"):
        llm = make_llm(LLM, tiny_path, **SEED_KW, cache_type=cache_type)
        rec = record(llm)
        sp = SamplingParams(max_tokens=4)
        llm.generate(prompts[:1], sp)  # 第一个单独跑
        llm.generate(prompts[1:], sp)  # 后三个一起
        computed[cache_type] = rec.prefill_tokens()
        assert_idle(llm)
    assert computed == {"naive": 231, "radix": 73}, f"预填充实际计算的 token 数应为 naive 231、radix 73，实际 {computed}"


def test_long_prompt_prefilled_in_four_chunks(tiny_path: str, qwen_tokenizer, make_llm) -> None:  # noqa: ANN001
    assert len(qwen_tokenizer.encode(LONG_PROMPT)) == 302
    llm = make_llm(LLM, tiny_path, **SEED_KW, max_extend_tokens=96)
    rec = record(llm)
    out = llm.generate([LONG_PROMPT], SamplingParams(max_tokens=4, ignore_eos=True))
    assert rec.prefill_steps() == [96, 96, 96, 14], f"每步预填充的 token 数：{rec.prefill_steps()}"
    assert len(out[0]["token_ids"]) == 4
    assert_idle(llm)
