"""第 4 阶段基准（不是测试）：这台机器上的张量并行（混合专家模型还有专家并行）。同样的核，TP=1（一个进程用全部线程）对 TP=2（两个秩各一个线程），
同一批请求逐步解码，报解码 token/s 的中位数 / 最小 / 最大；再把 TP=2 一步的时间拆开：集合通信（每次 all_reduce /
all_gather 前后计时）占多少，其余（计算）占多少。

在 2 核的 CPU 上 TP 赢不了：每个秩只有一个核，每层还要等两次 all_reduce；它的用处是放得下更大的模型，以及 GPU。
这个脚本量的就是这笔账。

    python bench/tp.py                      # 缺省：Qwen3-0.6B 形状的模型，1 个请求，32 步，3 轮
    python bench/tp.py --batch 8 --model models/qwen3-tiny-random

en: Stage 4 benchmark (not a test): tensor parallelism on this machine (and expert parallelism for a mixture of experts). On the same cores, TP=1 (one process using every
thread) against TP=2 (two ranks of one thread each), decoding the same batch step by step, reporting decode token/s as
median / min / max; then a TP=2 step's time taken apart: how much goes to the collectives (timed around each all_reduce /
all_gather) and how much to the rest (compute).

On a 2-core CPU TP cannot win: each rank has one core, and each layer waits for two all_reduce; its use is fitting a
bigger model, and GPUs. This script measures that account.

    python bench/tp.py                      # default: the Qwen3-0.6B-shaped model, 1 request, 32 steps, 3 rounds
    python bench/tp.py --batch 8 --model models/qwen3-tiny-random
    python bench/tp.py --batch 8 --model models/qwen3-moe-tiny-random   # 混合专家：TP=1、专家切开、专家并行
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import Stats, ratio_stats
from minisgl.i18n import tr
from minisgl.model_zoo import default_model
from minisgl.paths import REPO_ROOT

PROMPT_LEN = 32


def bench_rank(rank: int, world_size: int, addr: str, model: str, batch: int, steps: int, fused: bool | None,
               ep: int) -> dict[str, Any]:
    """在每个秩上跑：加入进程组，搭引擎，预填充 ``batch`` 个提示词再解码 ``steps`` 步；返回每个解码步的秒数和其中花在
    集合通信上的秒数（混合专家模型还有专家层交给集合通信的字节数）。

    en: Runs on each rank: join the process group, build the engine, prefill ``batch`` prompts and decode ``steps``
    steps; returns each decode step's seconds and the seconds of it spent in collectives (for a mixture of experts also
    the bytes its expert layers handed to collectives).
    """
    import torch

    import minisgl.llm  # noqa: F401 - 组装登记混合专家 | en: the assembly registers mixtures of experts
    from minisgl.distributed import DistributedInfo, destroy_distributed, init_distributed
    from minisgl.engine import EngineConfig
    from minisgl.tensor_parallel import TPEngine

    sys.path.insert(0, str(REPO_ROOT / "examples"))
    from stage1_milestone import HandDriver

    comm = init_distributed(DistributedInfo(rank, world_size), addr)
    spent = [0.0]

    def timed(fn: Any) -> Any:
        def call(*args: Any) -> Any:
            start = time.perf_counter()
            y = fn(*args)
            spent[0] += time.perf_counter() - start
            return y
        return call

    comm.all_reduce, comm.all_gather = timed(comm.all_reduce), timed(comm.all_gather)  # type: ignore[method-assign]
    comm.all_to_all = timed(comm.all_to_all)  # type: ignore[method-assign]
    seq = PROMPT_LEN + steps + 1
    engine = TPEngine(EngineConfig(model, dtype=torch.float32, device="cpu", max_running_req=batch,
                                   num_page_override=batch * seq, max_seq_len_override=seq, cpu_fused_decode=fused,
                                   ep_size=ep))
    gen = torch.Generator().manual_seed(0)
    vocab = engine.model_config.vocab_size
    prompts = [torch.randint(0, vocab, (PROMPT_LEN,), generator=gen).tolist() for _ in range(batch)]
    driver = HandDriver(engine)
    steps_s, comm_s = [], []
    original = driver.step

    def step(reqs: Any) -> None:
        spent[0] = 0.0
        start = time.perf_counter()
        original(reqs)
        steps_s.append(time.perf_counter() - start)
        comm_s.append(spent[0])

    driver.step = step  # type: ignore[method-assign]
    driver.generate(prompts, steps + 1)
    path = engine.decode_path
    moved = sum(getattr(layer.mlp.experts, "bytes_moved", 0) for layer in engine.model.model.layers
                if hasattr(layer.mlp, "experts"))
    engine.shutdown()
    destroy_distributed()
    # 第一步是预填充，不算 | en: the first step is the prefill: not counted
    return {"steps": steps_s[1:], "comm": comm_s[1:], "decode_path": path, "calls": dict(comm.calls),
            "threads": torch.get_num_threads(), "expert_bytes": moved}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help=tr("model directory (default: Qwen3-0.6B, or the random-weight model of the same shape if that is missing)"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from minisgl.processes.ranks import run_ranks

    import minisgl.llm  # noqa: F401 - 组装登记混合专家 | en: the assembly registers mixtures of experts
    from minisgl.architectures import is_moe, load_model_config

    model = str(Path(args.model) if args.model else default_model())
    moe = is_moe(load_model_config(model))
    cores = len(os.sched_getaffinity(0))
    half = max(1, cores // 2)
    # 名字 → (秩数, 每个秩的线程数, 融合解码, ep) | en: name → (ranks, threads per rank, fused decode, ep)
    cases: dict[str, tuple[int, int, bool | None, int]] = {
        tr("TP=1, {n} threads, fused C decode", n=cores): (1, cores, True, 1),
        tr("TP=1, {n} threads, layer by layer", n=cores): (1, cores, False, 1),
        tr("TP=2, {n} thread(s) per rank", n=half): (2, half, False, 1),
    }
    if moe:  # 没有融合解码；第三行换成“每个专家切开”，再加专家并行 | en: no fused decode; the third row becomes "each expert split", plus expert parallelism
        cases = {
            tr("TP=1, {n} threads", n=cores): (1, cores, None, 1),
            tr("TP=2, experts split"): (2, half, False, 1),
            tr("EP=2, experts dealt out"): (2, half, False, 2),
        }
    print(tr("Model: {name} (fp32), batch {batch}, {steps} decode steps after a {prompt}-token prefill, {cores} cores, "
             "{repeats} interleaved rounds (plus 1 warm-up)", name=Path(model).name, batch=args.batch, steps=args.steps,
             prompt=PROMPT_LEN, cores=cores, repeats=args.repeats))
    rates: dict[str, list[float]] = {name: [] for name in cases}
    split = [name for name, case in cases.items() if case[0] > 1]
    comm_share: dict[str, list[float]] = {name: [] for name in split}
    comm_ms: dict[str, list[float]] = {name: [] for name in split}
    per_call_ms: dict[str, list[float]] = {name: [] for name in split}
    expert_kib: dict[str, float] = {}
    for round_ in range(args.repeats + 1):
        for name, (world, threads, fused, ep) in cases.items():
            results = run_ranks(bench_rank, world, model, args.batch, args.steps, fused, ep, threads=threads, timeout=1200)
            steps = [max(s) for s in zip(*(r["steps"] for r in results))]  # 一步以最慢的秩为准 | en: a step lasts as long as its slowest rank
            if round_ == 0:
                print(f"  {name}: {results[0]['decode_path']}")
                continue
            rates[name].append(args.batch * len(steps) / sum(steps))
            if world > 1:
                comm = [statistics.mean(c) for c in zip(*(r["comm"] for r in results))]
                comm_share[name].append(sum(comm) / sum(steps))
                comm_ms[name].append(1000 * sum(comm) / len(comm))
                calls_per_step = sum(results[0]["calls"].values()) / (len(steps) + 1)  # 预填充也算了 | en: the prefill counted too
                per_call_ms[name].append(comm_ms[name][-1] / calls_per_step)
                expert_kib[name] = max(r["expert_bytes"] for r in results) / (len(steps) + 1) / 1024
        print(tr("  round {done}/{total} done", done=round_ + 1, total=args.repeats + 1)
              + (tr(" (warm-up, not counted)") if round_ == 0 else ""))
    stats = {name: Stats.of(r) for name, r in rates.items()}
    names = list(cases)
    print()
    width = max(map(len, names))
    print(f"{'':{width}}  " + tr("decode token/s: median (min – max)"))
    for name in names:
        print(f"{name:{width}}  {stats[name]}")
    print()
    if moe:
        for name in split:
            print(tr("{name} / TP=1: {ratio}", name=name, ratio=ratio_stats(stats[name], stats[names[0]])))
    else:
        print(tr("TP=2 / TP=1 layer by layer: {ratio}", ratio=ratio_stats(stats[names[2]], stats[names[1]])))
        print(tr("TP=2 / TP=1 fused: {ratio}", ratio=ratio_stats(stats[names[2]], stats[names[0]])))
    for name in split:
        print(tr("{name}, one decode step: {comm} ms in collectives ({share:.0%} of the step), {per_call} ms per "
                 "collective", name=name, comm=Stats.of(comm_ms[name]), share=statistics.median(comm_share[name]),
                 per_call=Stats.of(per_call_ms[name])))
        if moe:
            print(tr("{name}: the expert layers hand {kib:.1f} KiB per step to collectives (the busiest rank, prefill "
                     "included)", name=name, kib=expert_kib[name]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
