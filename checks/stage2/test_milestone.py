"""第 2 阶段里程碑的验收：在最终引擎 ``minisgl.llm.LLM`` 上、用真实的 Qwen3 分词器，
从实际运行中数出来：4 个共享系统提示词的请求共 231 个 token，naive 缓存算 231 个、radix 算 73 个；
302 个 token 的提示词在 ``max_extend_tokens=96`` 下分 4 步 [96, 96, 96, 14] 预填充；8 个请求 × 16 个 token 全部完成。
最后一项用离线接口的另一种常见写法（开关写 ``ENV.X.value``、包住 ``llm._forward``）写一个脚本，在子进程里跑，
重叠调度关和开各一次：三个结果都一样，两个开关的写法都生效。

里程碑脚本用 Qwen3-0.6B 形状的模型，这里用同一个分词器的小模型：这些 token 数只取决于分词器和调度。
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch

from .conftest import LONG_PROMPT, QUESTIONS, SYSTEM_PROMPT, assert_idle, expect, record
from minisgl.i18n import tr
from minisgl.core import SamplingParams
from minisgl.course import select
from minisgl.llm import LLM
from minisgl.paths import REPO_ROOT

MILESTONE_KW = dict(dtype=torch.float32, device="auto", max_running_req=8, num_page_override=2048, max_seq_len_override=512)


def test_eight_requests_sixteen_tokens(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **MILESTONE_KW)
    rec = record(llm)
    out = llm.generate([f"Request {i}: tell me something." for i in range(8)], SamplingParams(max_tokens=16, ignore_eos=True))
    assert [len(o["token_ids"]) for o in out] == [16] * 8, tr("Each of the 8 requests generates 16 tokens")
    assert max(len(s.uids) for s in rec.steps) == 8, tr("The 8 requests decode in the same batch")
    assert_idle(llm)


def test_shared_system_prompt_naive_231_radix_73(tiny_path: str, qwen_tokenizer, make_llm) -> None:  # noqa: ANN001
    prompts = [SYSTEM_PROMPT + q for q in QUESTIONS]
    lens = [len(qwen_tokenizer.encode(p)) for p in prompts]
    assert lens == [60, 57, 59, 55] and sum(lens) == 231, tr("Token counts of the 4 prompts: {lens}", lens=lens)
    computed = {}
    for cache_type in ("naive", "radix"):
        llm = make_llm(LLM, tiny_path, **MILESTONE_KW, cache_type=cache_type)
        rec = record(llm)
        sp = SamplingParams(max_tokens=4)
        llm.generate(prompts[:1], sp)  # 第一个单独跑
        llm.generate(prompts[1:], sp)  # 后三个一起
        computed[cache_type] = rec.prefill_tokens()
        assert_idle(llm)
    assert computed == {"naive": 231, "radix": 73}, tr("Prefill must compute naive 231, radix 73 tokens; got {computed}", computed=computed)


def test_long_prompt_prefilled_in_four_chunks(tiny_path: str, qwen_tokenizer, make_llm) -> None:  # noqa: ANN001
    expect(len(qwen_tokenizer.encode(LONG_PROMPT)), 302, tr("Test setup: tokens in the long prompt with the Qwen3 tokenizer"))
    llm = make_llm(LLM, tiny_path, **MILESTONE_KW, max_extend_tokens=96)
    rec = record(llm)
    out = llm.generate([LONG_PROMPT], SamplingParams(max_tokens=4, ignore_eos=True))
    assert rec.prefill_steps() == [96, 96, 96, 14], tr("Tokens prefilled per step: {value}", value=rec.prefill_steps())
    expect(len(out[0]["token_ids"]), 4, tr("Tokens generated (max_tokens=4)"))
    assert_idle(llm)


#: 离线接口的另一种常见写法：开关用 ``.value``，包住 ``llm._forward``、在调用原函数之前读批次。
#: 全仓库只有这里给 ``llm._forward`` 赋值（讲义和示例一律用 ``llm.add_step_listener``）。
UPSTREAM_STYLE_SCRIPT = textwrap.dedent(
    """
    import sys

    import torch

    from minisgl.env import ENV

    ENV.DISABLE_OVERLAP_SCHEDULING.value = sys.argv[2] == "off"

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    MODEL = sys.argv[1]
    SYSTEM_PROMPT = "You are a helpful assistant. Answer concisely and accurately. " * 4
    QUESTIONS = ["What is 2 + 2?", "Name a primary color.", "What is the capital of Japan?", "Spell cat."]
    LONG_PROMPT = "Explain, step by step, why the sky is blue. " * 25


    def make_llm(**kwargs):
        llm = LLM(MODEL, dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512, **kwargs)
        prefill_tokens = []
        original_forward = llm._forward

        def counting_forward(fi):
            if fi.batch.is_prefill:
                prefill_tokens.append(sum(r.extend_len for r in fi.batch.reqs))
            return original_forward(fi)

        llm._forward = counting_forward
        return llm, prefill_tokens


    prompts = [SYSTEM_PROMPT + q for q in QUESTIONS]
    texts = []
    for cache_type in ("naive", "radix"):
        llm, prefill_tokens = make_llm(cache_type=cache_type)
        if cache_type == "naive":
            print("prompt_tokens", sum(len(llm.tokenizer(p).input_ids) for p in prompts))
        sampling_params = SamplingParams(max_tokens=4, ignore_eos=True)
        outputs = llm.generate(prompts[:1], sampling_params)
        outputs += llm.generate(prompts[1:], sampling_params)
        texts += [o["text"] for o in outputs]
        print(cache_type, sum(prefill_tokens))
        llm.shutdown()

    llm, prefill_tokens = make_llm(max_extend_tokens=96)
    steps = []
    llm.add_step_listener(steps.append)
    print("long_prompt_tokens", len(llm.tokenizer(LONG_PROMPT).input_ids))
    outputs = llm.generate([LONG_PROMPT], SamplingParams(max_tokens=4, ignore_eos=True))
    texts += [o["text"] for o in outputs]
    print("chunks", prefill_tokens)
    llm.shutdown()

    overlapped = any(b.prepare[1] < a.process[0] for a, b in zip(steps, steps[1:]))
    print("switch", ENV.DISABLE_OVERLAP_SCHEDULING.value, bool(ENV.DISABLE_OVERLAP_SCHEDULING), overlapped)
    print("texts", texts)
    """
)


def _run_upstream_style(tiny_path: str, overlap: bool) -> dict[str, str]:
    """在子进程里跑上面的脚本（用和本进程相同的实现）；环境变量给的默认值与脚本里 ``.value`` 写的相反。"""
    impl = ",".join(f"{chapter}={choice.impl}" for chapter, choice in select.active.items())
    env = {**os.environ, "MINISGL_IMPL": impl, "MINISGL_DISABLE_OVERLAP_SCHEDULING": "1" if overlap else "0"}
    res = subprocess.run(
        [sys.executable, "-c", UPSTREAM_STYLE_SCRIPT, tiny_path, "on" if overlap else "off"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    mode = tr("overlap scheduling on") if overlap else tr("overlap scheduling off")
    assert res.returncode == 0, tr("The script in the offline-API style ({mode}) failed:\n{value}", mode=mode, value=res.stderr[-3000:])
    return dict(line.split(" ", 1) for line in res.stdout.splitlines() if " " in line)


def test_upstream_style_script(tiny_path: str) -> None:
    results = {}
    for overlap in (False, True):
        out = _run_upstream_style(tiny_path, overlap)
        mode = tr("overlap scheduling on") if overlap else tr("overlap scheduling off")
        got = {k: out.get(k) for k in ("prompt_tokens", "naive", "radix", "long_prompt_tokens", "chunks")}
        assert got == {
            "prompt_tokens": "231", "naive": "231", "radix": "73", "long_prompt_tokens": "302", "chunks": "[96, 96, 96, 14]",
        }, tr("With {mode}, the counts taken by wrapping llm._forward are wrong: {got}", mode=mode, got=got)  # fmt: skip
        disabled = str(not overlap)
        assert out.get("switch") == f"{disabled} {disabled} {overlap}", (
            tr("ENV.DISABLE_OVERLAP_SCHEDULING.value = {value} must take effect (.value and bool() both {value}, {mode}); got .value, bool(), overlapped: {value2}", value=not overlap, mode=mode, value2=out.get('switch'))
        )
        results[overlap] = out["texts"]
    assert results[False] == results[True], tr("Overlap scheduling on and off must generate exactly the same text")
