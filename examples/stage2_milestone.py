"""第 2 阶段里程碑：调度器让引擎自己跑起来。

第 1 阶段里，批次的每个字段都是我们手工填的；现在只要 ``LLM.generate(prompts, sampling_params)``。
脚本做三个实验，每个实验新建一个

    LLM(path, dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512, **kw)

并用 ``llm.add_step_listener`` 看调度器每一步算了哪些请求、各算几个 token，数出预填充实际计算了多少个 token、分了几步。

1. 8 个请求 × 16 个 token（``ignore_eos=True``）：用时和总 token/s，旁边是第 1 阶段（手工成批，4 个一批）
   和第 0 步（朴素引擎，一次一个）在同一台机器上现测的 token/s；
2. 4 个共享系统提示词的请求（``max_tokens=4``，第一个单独跑，后三个一起跑）：``naive`` 与 ``radix`` 缓存下
   预填充实际计算的 token 数，以及后三个请求的用时；
3. 302 个 token 的长提示词，``max_extend_tokens=96``：分几步预填充、每步多少个 token。

重叠调度默认关掉（``ENV.DISABLE_OVERLAP_SCHEDULING.value = True``），速度只反映调度器本身；``--overlap`` 打开它。

    python examples/stage2_milestone.py                        # 默认模型：Qwen3-0.6B，没有就用同形状的随机权重模型
    python examples/stage2_milestone.py --skip-baselines       # 不测第 0 步和第 1 阶段（快一些）
    python examples/stage2_milestone.py --overlap              # 打开重叠调度
    python examples/stage2_milestone.py --cache-type naive     # 实验 2 只跑这一种缓存（默认两种都跑）
    python examples/stage2_milestone.py --max-extend-tokens 64 # 实验 3 的预填充预算（默认 96）
    python examples/stage2_milestone.py --max-running-req 2 --trace --experiment 2   # 只有 2 个请求槽，逐步打印
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path
from typing import Any

import torch

from minisgl.core import SamplingParams
from minisgl.course import describe_selection
from minisgl.env import ENV
from minisgl.llm import LLM
from minisgl.model_zoo import default_model
from minisgl.trace import StepTrace

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
WARMUP = [f"Warm up {i}." for i in range(8)]  # 实验 1 的预热：同样 8 个请求一批，但不与 PROMPTS 共享前缀


def describe(step: StepTrace) -> str:
    """``--trace`` 的一行：第几步、预填充还是解码、每个请求算几个 token、KV 池占用多少页。"""
    parts = []
    for uid, extend, cached, output in zip(step.uids, step.extend_lens, step.cached_lens, step.outputs):
        note = []
        if step.is_prefill and cached:
            note.append(f"已缓存 {cached}")
        if not output:
            note.append("中间块")
        parts.append(f"请求{uid}×{extend}" + (f"（{'，'.join(note)}）" if note else ""))
    phase = "预填充" if step.is_prefill else "解码  "
    return f"    第 {step.index:>2} 步 {phase} {'，'.join(parts)}；占用 {step.pages_in_use} 页"


class StepLog:
    """用 ``llm.add_step_listener`` 记下每一步预填充算了多少个 token；``trace=True`` 时每一步打印一行。"""

    def __init__(self, llm: LLM, trace: bool) -> None:
        self.prefill_steps: list[int] = []
        self.trace = trace
        self.remove = llm.add_step_listener(self)

    def __call__(self, step: StepTrace) -> None:
        if step.is_prefill:
            self.prefill_steps.append(step.tokens)  # 长度是前向发出之前记下的
        if self.trace:
            print(describe(step))


def make_llm(model: Path, args: argparse.Namespace, warmup: list[str], **kw: Any) -> tuple[LLM, StepLog]:
    """新建 LLM；先预热（第一次前向要准备 oneDNN 的计算原语），再开始记录每一步。"""
    llm = LLM(
        model, dtype=torch.float32, max_running_req=args.max_running_req, num_page_override=2048,
        max_seq_len_override=512, **kw,
    )  # fmt: skip
    llm.generate(warmup, SamplingParams(max_tokens=2, ignore_eos=True))
    return llm, StepLog(llm, args.trace)


def close(llm: LLM) -> None:
    """关掉这个模型再建下一个，免得两份权重同时占内存。"""
    llm.shutdown()
    gc.collect()


def baselines(model: Path, n: int) -> tuple[float, float]:
    """第 0 步（一次 1 个请求）和第 1 阶段（手工成批，4 个一批）的 token/s，同一台机器上现测（都先预热）。"""
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


def experiment1(model: Path, args: argparse.Namespace, kw: dict[str, Any], results: dict[str, Any]) -> None:
    n = 16
    step0_tps = stage1_tps = None
    if not args.skip_baselines:
        step0_tps, stage1_tps = baselines(model, n)
    llm, _ = make_llm(model, args, WARMUP, **kw)
    print(f"\n实验 1：{len(PROMPTS)} 个请求 × {n} 个 token（ignore_eos=True）")
    start = time.perf_counter()
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=n, ignore_eos=True))
    elapsed = time.perf_counter() - start
    total = sum(len(o["token_ids"]) for o in outs)
    tps = total / elapsed
    results.update(exp1_seconds=elapsed, exp1_tps=tps, step0_tps=step0_tps, stage1_tps=stage1_tps)
    print(f"  第 2 阶段 LLM.generate（最多 {args.max_running_req} 个一批）：用时 {elapsed:.2f} s，共 {total} 个 token，{tps:.1f} token/s")
    if step0_tps is not None and stage1_tps is not None:
        print(f"  第 1 阶段（手工成批，4 个一批）：{stage1_tps:.1f} token/s")
        print(f"  第 0 步（朴素引擎，一次 1 个）：{step0_tps:.1f} token/s")
        print(f"  第 2 阶段是第 1 阶段的 {tps / stage1_tps:.1f}×，是第 0 步的 {tps / step0_tps:.1f}×")
    note = "（随机权重，无意义）" if results["random_weights"] else ""
    print(f"  {PROMPTS[0]!r} → {outs[0]['text']!r}{note}")
    close(llm)


def experiment2(model: Path, args: argparse.Namespace, results: dict[str, Any]) -> None:
    prompts = [SYSTEM_PROMPT + q for q in QUESTIONS]
    sp = SamplingParams(max_tokens=4)
    print("\n实验 2：4 个请求共享系统提示词（max_tokens=4；第一个单独跑，后三个一起跑）")
    for i, cache_type in enumerate([args.cache_type] if args.cache_type else ["naive", "radix"]):
        llm, log = make_llm(model, args, ["Hi"], cache_type=cache_type)
        if i == 0:
            lens = [len(llm.tokenizer.encode(p, add_special_tokens=False)) for p in prompts]
            print(f"  提示词共 {sum(lens)} 个 token（各 {', '.join(map(str, lens))}）")
            results["prompt_tokens"] = lens
        if args.trace:
            print(f"  {cache_type}：")
        llm.generate(prompts[:1], sp)
        start = time.perf_counter()
        llm.generate(prompts[1:], sp)
        ms = 1000 * (time.perf_counter() - start)
        computed = sum(log.prefill_steps)
        results[f"{cache_type}_computed"], results[f"{cache_type}_last3_ms"] = computed, ms
        print(f"  {cache_type}：预填充实际计算 {computed} 个 token，后三个请求用时 {ms:.0f} ms")
        close(llm)


def experiment3(model: Path, args: argparse.Namespace, kw: dict[str, Any], results: dict[str, Any]) -> None:
    budget = args.max_extend_tokens
    llm, log = make_llm(model, args, ["Hi"], max_extend_tokens=budget, **kw)
    n_long = len(llm.tokenizer.encode(LONG_PROMPT, add_special_tokens=False))
    print(f"\n实验 3：{n_long} 个 token 的长提示词，max_extend_tokens={budget}")
    llm.generate([LONG_PROMPT], SamplingParams(max_tokens=4))
    steps = log.prefill_steps
    results.update(long_prompt_tokens=n_long, chunk_steps=list(steps))
    print(f"  分 {len(steps)} 步预填充，每步 {steps} 个 token")
    close(llm)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="第 2 阶段里程碑：LLM.generate、前缀缓存与分块预填充")
    parser.add_argument("--model", default=None, help="模型目录（默认：Qwen3-0.6B，没有就用同形状的随机权重模型）")
    parser.add_argument("--cache-type", choices=["naive", "radix"], default=None,
                        help="前缀缓存的种类：实验 2 只跑这一种，实验 1、3 也用它（默认：实验 2 两种都跑，实验 1、3 用 radix）")
    parser.add_argument("--max-extend-tokens", type=int, default=96, help="实验 3 一步最多预填充多少个 token（默认 96）")
    parser.add_argument("--max-running-req", type=int, default=8, help="请求槽的个数：最多同时运行多少个请求（默认 8）")
    parser.add_argument("--overlap", action="store_true", help="打开重叠调度（默认关掉，速度只反映调度器本身）")
    parser.add_argument("--trace", action="store_true", help="每一步打印一行：预填充 / 解码、每个请求算几个 token、占用的页数")
    parser.add_argument("--experiment", type=int, choices=[1, 2, 3], action="append",
                        help="只跑这个实验（可以写多次；默认三个都跑）")
    parser.add_argument("--skip-baselines", action="store_true", help="不测第 0 步和第 1 阶段的速度")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    model = Path(args.model) if args.model else default_model(verbose=False)
    random_weights = "random" in model.name
    results: dict[str, Any] = {"model": model.name, "random_weights": random_weights}
    experiments = sorted(set(args.experiment or [1, 2, 3]))
    kw = {"cache_type": args.cache_type} if args.cache_type else {}

    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not args.overlap
    try:
        print(describe_selection())
        print(f"模型：{model.name}")
        if random_weights:
            shape = " Qwen3-0.6B 形状的" if "0.6b" in model.name.lower() else ""
            print(f"注意：这是{shape}随机权重模型，生成的文字没有意义（token 数和计算量与真模型相同）。")
        state = "开（--overlap）" if args.overlap else "关（ENV.DISABLE_OVERLAP_SCHEDULING.value = True）"
        print(f"重叠调度：{state}；请求槽 max_running_req={args.max_running_req}")
        if args.trace:
            print("逐步打印（--trace）：“请求3×5”表示这一步为 uid 3 的请求算 5 个 token；预热的那几步不打印")
        if 1 in experiments:
            experiment1(model, args, kw, results)
        if 2 in experiments:
            experiment2(model, args, results)
        if 3 in experiments:
            experiment3(model, args, kw, results)
    finally:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved
    return results


if __name__ == "__main__":
    main()
