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

en: Stage 2 milestone: the scheduler makes the engine run by itself.

In stage 1 we filled in every field of a batch by hand; now it only takes ``LLM.generate(prompts, sampling_params)``.
The script runs three experiments, each with a new

    LLM(path, dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512, **kw)

and uses ``llm.add_step_listener`` to see which requests the scheduler computed at each step and how many tokens each,
counting how many tokens the prefills actually computed and in how many steps.

1. 8 requests × 16 tokens (``ignore_eos=True``): time and total token/s, next to the token/s of stage 1 (batched by
hand, 4 at a time) and step 0 (the naive engine, one at a time), measured on the same machine; 2. 4 requests sharing a
system prompt (``max_tokens=4``; the first runs alone, the other three together): the tokens the prefills actually
computed with the ``naive`` and the ``radix`` cache, and the time of the last three requests; 3. a long prompt of 302
tokens with ``max_extend_tokens=96``: how many prefill steps, and how many tokens in each.

Overlap scheduling is off by default (``ENV.DISABLE_OVERLAP_SCHEDULING.value = True``), so the speed reflects the
scheduler alone; ``--overlap`` turns it on.

    python examples/stage2_milestone.py                        # default model: Qwen3-0.6B, or random weights of the same shape without it
    python examples/stage2_milestone.py --skip-baselines       # skip step 0 and stage 1 (faster)
    python examples/stage2_milestone.py --overlap              # turn overlap scheduling on
    python examples/stage2_milestone.py --cache-type naive     # experiment 2 with this cache only (default: both)
    python examples/stage2_milestone.py --max-extend-tokens 64 # experiment 3's prefill budget (default 96)
    python examples/stage2_milestone.py --max-running-req 2 --trace --experiment 2   # only 2 request slots, print every step
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
from minisgl.i18n import tr
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
# 实验 1 的预热：同样 8 个请求一批，但不与 PROMPTS 共享前缀
# en: experiment 1's warm-up: the same 8 requests in a batch, but sharing no prefix with PROMPTS
WARMUP = [f"Warm up {i}." for i in range(8)]


def describe(step: StepTrace) -> str:
    """``--trace`` 的一行：第几步、预填充还是解码、每个请求算几个 token、KV 池占用多少页。

    en: One line of ``--trace``: the step number, prefill or decode, how many tokens each request computes, how many
    pages of the KV pool are in use.
    """
    sep, parts = tr(", "), []
    for uid, extend, cached, output in zip(step.uids, step.extend_lens, step.cached_lens, step.outputs):
        note = []
        if step.is_prefill and cached:
            note.append(tr("{cached} cached", cached=cached))
        if not output:
            note.append(tr("intermediate chunk"))
        parts.append(tr("req{uid}×{n}", uid=uid, n=extend) + (tr(" ({notes})", notes=sep.join(note)) if note else ""))
    phase = tr("prefill") if step.is_prefill else tr("decode ")
    return tr("    step {step:>2} {kind} {work}; {pages} pages in use",
              step=step.index, kind=phase, work=sep.join(parts), pages=step.pages_in_use)


class StepLog:
    """用 ``llm.add_step_listener`` 记下每一步预填充算了多少个 token；``trace=True`` 时每一步打印一行。

    en: Record with ``llm.add_step_listener`` how many tokens each step's prefill computed; with ``trace=True``, print a
    line per step.
    """

    def __init__(self, llm: LLM, trace: bool) -> None:
        self.prefill_steps: list[int] = []
        self.trace = trace
        self.remove = llm.add_step_listener(self)

    def __call__(self, step: StepTrace) -> None:
        if step.is_prefill:
            # 长度是前向发出之前记下的
            # en: lengths recorded before the forward was launched
            self.prefill_steps.append(step.tokens)
        if self.trace:
            print(describe(step))


def make_llm(model: Path, args: argparse.Namespace, warmup: list[str], **kw: Any) -> tuple[LLM, StepLog]:
    """新建 LLM；先预热（第一次前向要准备 oneDNN 的计算原语），再开始记录每一步。

    en: Build an LLM; warm up first (the first forward prepares oneDNN's primitives), then start recording the steps.
    """
    llm = LLM(
        model, dtype=torch.float32, max_running_req=args.max_running_req, num_page_override=2048,
        max_seq_len_override=512, **kw,
    )  # fmt: skip
    llm.generate(warmup, SamplingParams(max_tokens=2, ignore_eos=True))
    return llm, StepLog(llm, args.trace)


def close(llm: LLM) -> None:
    """关掉这个模型再建下一个，免得两份权重同时占内存。

    en: Close this model before building the next, so that two copies of the weights never share memory at once.
    """
    llm.shutdown()
    gc.collect()


def baselines(model: Path, n: int) -> tuple[float, float]:
    """第 0 步（一次 1 个请求）和第 1 阶段（手工成批，4 个一批）的 token/s，同一台机器上现测（都先预热）。

    en: The token/s of step 0 (one request at a time) and stage 1 (batched by hand, 4 at a time), measured now on the
    same machine (both warmed up first).
    """
    import stage1_milestone as stage1  # 同目录下的示例脚本 | en: the example scripts in the same folder
    import step0_tiny_engine as step0
    from minisgl.engine import Engine, EngineConfig

    cfg, weights, tok = step0.load(model)
    single = tok.encode(PROMPTS[0], add_special_tokens=False)
    step0.generate(cfg, weights, single, 2)  # 预热 | en: warm-up
    start = time.perf_counter()
    step0.generate(cfg, weights, single, n)
    step0_tps = n / (time.perf_counter() - start)
    del weights
    gc.collect()

    batch = [tok.encode(p, add_special_tokens=False) for p in PROMPTS[:4]]
    engine = Engine(
        EngineConfig(str(model), dtype=torch.float32, max_running_req=4, max_seq_len_override=512, num_page_override=2048)
    )
    stage1.HandDriver(engine).generate(batch, 2)  # 预热 | en: warm-up
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
    print(tr("\nExperiment 1: {n_prompts} requests × {n} tokens (ignore_eos=True)", n_prompts=len(PROMPTS), n=n))
    start = time.perf_counter()
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=n, ignore_eos=True))
    elapsed = time.perf_counter() - start
    total = sum(len(o["token_ids"]) for o in outs)
    tps = total / elapsed
    results.update(exp1_seconds=elapsed, exp1_tps=tps, step0_tps=step0_tps, stage1_tps=stage1_tps)
    print(tr("  stage 2 LLM.generate (batches of up to {max_running_req}): {elapsed:.2f} s, {total} tokens, {tps:.1f} token/s",
             max_running_req=args.max_running_req, elapsed=elapsed, total=total, tps=tps))
    if step0_tps is not None and stage1_tps is not None:
        print(tr("  stage 1 (batched by hand, 4 per batch): {stage1_tps:.1f} token/s", stage1_tps=stage1_tps))
        print(tr("  step 0 (naive engine, 1 at a time): {step0_tps:.1f} token/s", step0_tps=step0_tps))
        print(tr("  stage 2 is {vs_stage1:.1f}× stage 1 and {vs_step0:.1f}× step 0",
                 vs_stage1=tps / stage1_tps, vs_step0=tps / step0_tps))
    note = tr(" (random weights, meaningless)") if results["random_weights"] else ""
    print(f"  {PROMPTS[0]!r} → {outs[0]['text']!r}{note}")
    close(llm)


def experiment2(model: Path, args: argparse.Namespace, results: dict[str, Any]) -> None:
    prompts = [SYSTEM_PROMPT + q for q in QUESTIONS]
    sp = SamplingParams(max_tokens=4)
    print(tr("\nExperiment 2: 4 requests share a system prompt (max_tokens=4; the first runs alone, the last three together)"))
    for i, cache_type in enumerate([args.cache_type] if args.cache_type else ["naive", "radix"]):
        llm, log = make_llm(model, args, ["Hi"], cache_type=cache_type)
        if i == 0:
            lens = [len(llm.tokenizer.encode(p, add_special_tokens=False)) for p in prompts]
            print(tr("  {total} prompt tokens in all ({each})", total=sum(lens), each=", ".join(map(str, lens))))
            results["prompt_tokens"] = lens
        if args.trace:
            print(tr("  {cache_type}:", cache_type=cache_type))
        llm.generate(prompts[:1], sp)
        start = time.perf_counter()
        llm.generate(prompts[1:], sp)
        ms = 1000 * (time.perf_counter() - start)
        computed = sum(log.prefill_steps)
        results[f"{cache_type}_computed"], results[f"{cache_type}_last3_ms"] = computed, ms
        print(tr("  {cache_type}: prefill actually computed {computed} tokens; the last three requests took {ms:.0f} ms",
                 cache_type=cache_type, computed=computed, ms=ms))
        close(llm)


def experiment3(model: Path, args: argparse.Namespace, kw: dict[str, Any], results: dict[str, Any]) -> None:
    budget = args.max_extend_tokens
    llm, log = make_llm(model, args, ["Hi"], max_extend_tokens=budget, **kw)
    n_long = len(llm.tokenizer.encode(LONG_PROMPT, add_special_tokens=False))
    print(tr("\nExperiment 3: a long prompt of {n_long} tokens, max_extend_tokens={budget}",
             n_long=n_long, budget=budget))
    llm.generate([LONG_PROMPT], SamplingParams(max_tokens=4))
    steps = log.prefill_steps
    results.update(long_prompt_tokens=n_long, chunk_steps=list(steps))
    print(tr("  prefilled in {n_steps} steps of {steps} tokens", n_steps=len(steps), steps=steps))
    close(llm)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=tr("Stage 2 milestone: LLM.generate, prefix caching and chunked prefill"))
    parser.add_argument("--model", default=None, help=tr("model directory (default: Qwen3-0.6B, or the random-weight model of the same shape if that is missing)"))
    parser.add_argument("--cache-type", choices=["naive", "radix"], default=None,
                        help=tr("kind of prefix cache: experiment 2 runs only this one, and experiments 1 and 3 use it too (default: experiment 2 runs both, experiments 1 and 3 use radix)"))
    parser.add_argument("--max-extend-tokens", type=int, default=96, help=tr("the most tokens experiment 3 prefills in one step (default 96)"))
    parser.add_argument("--max-running-req", type=int, default=8, help=tr("number of request slots: the most requests running at once (default 8)"))
    parser.add_argument("--overlap", action="store_true", help=tr("turn overlap scheduling on (off by default, so the speed reflects the scheduler alone)"))
    parser.add_argument("--trace", action="store_true", help=tr("print one line per step: prefill / decode, the tokens computed for each request, the pages in use"))
    parser.add_argument("--experiment", type=int, choices=[1, 2, 3], action="append",
                        help=tr("run only this experiment (may be repeated; default: all three)"))
    parser.add_argument("--skip-baselines", action="store_true", help=tr("do not measure the speed of step 0 and stage 1"))
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
        print(tr("Model: {name}", name=model.name))
        if random_weights:
            if "0.6b" in model.name.lower():
                print(tr("Note: this is a random-weight model of the Qwen3-0.6B shape, so the generated text is meaningless (token counts and compute are the same as the real model)."))
            else:
                print(tr("Note: this is a random-weight model, so the generated text is meaningless (token counts and compute are the same as the real model)."))
        state = tr("on (--overlap)") if args.overlap else tr("off (ENV.DISABLE_OVERLAP_SCHEDULING.value = True)")
        print(tr("Overlap scheduling: {state}; request slots max_running_req={max_running_req}",
                 state=state, max_running_req=args.max_running_req))
        if args.trace:
            print(tr("Step by step (--trace): \"req3×5\" means this step computes 5 tokens for the request with uid 3; warm-up steps are not printed"))
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
