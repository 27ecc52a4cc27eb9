"""第 2 阶段里程碑：调度器让引擎自己跑起来。

第 1 阶段里，批次的每个字段都是我们手工填的；现在只要 ``LLM.generate(prompts, sampling_params)``。
脚本做种子页上的三个实验，每次都像种子页那样新建一个

    LLM(path, dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512, **kw)

并包住 ``llm._forward``：在调用原函数之前读 ``fi.batch.is_prefill``、``fi.batch.reqs`` 和每个请求的
``extend_len``，数出预填充实际计算了多少个 token、分了几步。

1. 8 个请求 × 16 个 token（``ignore_eos=True``）：用时和总 token/s，旁边是第 1 阶段（手工成批，4 个一批）
   和第 0 步（朴素引擎，一次一个）在同一台机器上现测的 token/s；
2. 4 个共享系统提示词的请求（``max_tokens=4``，第一个单独跑，后三个一起跑）：``naive`` 与 ``radix`` 缓存下
   预填充实际计算的 token 数，以及后三个请求的用时；
3. 302 个 token 的长提示词，``max_extend_tokens=96``：分几步预填充、每步多少个 token。

    python examples/stage2_milestone.py                  # 默认模型：Qwen3-0.6B，没有就用同形状的随机权重模型
    python examples/stage2_milestone.py --skip-baselines # 不测第 0 步和第 1 阶段（快一些）
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path
from typing import Any

import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.model_zoo import default_model

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the ocean.",
    "def quicksort(arr):",
    "The three laws of motion are",
    "Once upon a time, in a faraway land,",
    "Water boils at",
    "List three fruits:",
    "Translate 'good morning' into Spanish:",
]
SYSTEM_PROMPT = "You are a helpful assistant. Answer concisely and accurately. " * 4
QUESTIONS = ["What is 2 + 2?", "Name a primary color.", "What is the capital of Japan?", "Spell cat."]
LONG_PROMPT = "Explain, step by step, why the sky is blue. " * 25


def make_llm(model: Path, **kw: Any) -> tuple[LLM, dict[str, list]]:
    """种子页的配置；包住 ``_forward`` 记下每一步预填充算的 token 数（在调用原函数之前读）。"""
    llm = LLM(model, dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512, **kw)
    stats: dict[str, list] = {"prefill_steps": []}
    original = llm._forward

    def counting_forward(fi):  # noqa: ANN001, ANN202
        if fi.batch.is_prefill:
            stats["prefill_steps"].append(sum(r.extend_len for r in fi.batch.reqs))
        return original(fi)

    llm._forward = counting_forward
    llm.generate(["Hi"], SamplingParams(max_tokens=2))  # 预热：第一次前向要准备 oneDNN 的计算原语
    stats["prefill_steps"].clear()
    return llm, stats


def baselines(model: Path, n: int) -> tuple[float, float]:
    """第 0 步（一次 1 个请求）和第 1 阶段（手工成批，4 个一批）的 token/s，同一台机器上现测。"""
    import stage1_milestone as stage1  # 同目录下的示例脚本
    import step0_tiny_engine as step0
    from minisgl.engine import Engine, EngineConfig

    cfg, weights, tok = step0.load(model)
    single = tok.encode(PROMPTS[0], add_special_tokens=False)
    step0.generate(cfg, weights, single, 2)  # 预热
    start = time.perf_counter()
    step0.generate(cfg, weights, single, n)
    step0_tps = n / (time.perf_counter() - start)
    del weights
    gc.collect()

    batch = [tok.encode(p, add_special_tokens=False) for p in PROMPTS[:4]]
    engine = Engine(
        EngineConfig(str(model), dtype=torch.float32, max_running_req=4, max_seq_len_override=512, num_page_override=2048)
    )
    stage1.HandDriver(engine).generate(batch, 2)  # 预热
    _, times = stage1.HandDriver(engine).generate(batch, n)
    stage1_tps = len(batch) * n / sum(times)
    engine.shutdown()
    del engine
    gc.collect()
    return step0_tps, stage1_tps


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="第 2 阶段里程碑：LLM.generate、前缀缓存与分块预填充")
    parser.add_argument("--model", default=None, help="模型目录（默认：Qwen3-0.6B，没有就用同形状的随机权重模型）")
    parser.add_argument("--skip-baselines", action="store_true", help="不测第 0 步和第 1 阶段的速度")
    args = parser.parse_args(argv)
    model = Path(args.model) if args.model else default_model(verbose=False)
    random_weights = "random" in model.name
    results: dict[str, Any] = {"model": model.name}

    print(f"模型：{model.name}")
    if random_weights:
        print("注意：这是 Qwen3-0.6B 形状的随机权重模型，生成的文字没有意义（token 数和计算量与真模型相同）。")

    # ---------------------------------------------------------------- 实验 1
    n = 16
    step0_tps = stage1_tps = None
    if not args.skip_baselines:
        step0_tps, stage1_tps = baselines(model, n)
    llm, _ = make_llm(model)
    start = time.perf_counter()
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=n, ignore_eos=True))
    elapsed = time.perf_counter() - start
    total = sum(len(o["token_ids"]) for o in outs)
    results.update(exp1_seconds=elapsed, exp1_tps=total / elapsed, step0_tps=step0_tps, stage1_tps=stage1_tps)
    print(f"\n实验 1：{len(PROMPTS)} 个请求 × {n} 个 token（ignore_eos=True）")
    print(f"  第 2 阶段 LLM.generate（8 个一批）：用时 {elapsed:.2f} s，共 {total} 个 token，{total / elapsed:.1f} token/s")
    if step0_tps is not None:
        print(f"  第 1 阶段（手工成批，4 个一批）：{stage1_tps:.1f} token/s")
        print(f"  第 0 步（朴素引擎，一次 1 个）：{step0_tps:.1f} token/s")
    print(f"  {PROMPTS[0]!r} → {outs[0]['text']!r}" + ("（随机权重，无意义）" if random_weights else ""))
    llm.shutdown()
    del llm  # 放掉这个模型再建下一个，免得两份权重同时占内存
    gc.collect()

    # ---------------------------------------------------------------- 实验 2
    prompts = [SYSTEM_PROMPT + q for q in QUESTIONS]
    sp = SamplingParams(max_tokens=4)
    print("\n实验 2：4 个请求共享系统提示词（max_tokens=4；第一个单独跑，后三个一起跑）")
    for cache_type in ("naive", "radix"):
        llm, stats = make_llm(model, cache_type=cache_type)
        if cache_type == "naive":
            lens = [len(ids) for ids in (llm.tokenizer.encode(p, add_special_tokens=False) for p in prompts)]
            print(f"  提示词共 {sum(lens)} 个 token（各 {', '.join(map(str, lens))}）")
            results["prompt_tokens"] = lens
        llm.generate(prompts[:1], sp)
        start = time.perf_counter()
        llm.generate(prompts[1:], sp)
        ms = 1000 * (time.perf_counter() - start)
        computed = sum(stats["prefill_steps"])
        results[f"{cache_type}_computed"], results[f"{cache_type}_last3_ms"] = computed, ms
        print(f"  {cache_type}：预填充实际计算 {computed} 个 token，后三个请求用时 {ms:.0f} ms")
        llm.shutdown()
        del llm, stats
        gc.collect()

    # ---------------------------------------------------------------- 实验 3
    llm, stats = make_llm(model, max_extend_tokens=96)
    n_long = len(llm.tokenizer.encode(LONG_PROMPT, add_special_tokens=False))
    llm.generate([LONG_PROMPT], SamplingParams(max_tokens=4))
    steps = stats["prefill_steps"]
    results.update(long_prompt_tokens=n_long, chunk_steps=list(steps))
    print(f"\n实验 3：{n_long} 个 token 的长提示词，max_extend_tokens=96")
    print(f"  分 {len(steps)} 步预填充，每步 {steps} 个 token")
    llm.shutdown()
    return results


if __name__ == "__main__":
    main()
