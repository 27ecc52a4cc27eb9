"""等待队列的顺序（``--schedule-policy``）的基准（不是测试）：共享前缀的工作负载上轮流跑 ``fcfs``、``lpm``、
``dfs-weight``、``random``，每种策略报算了多少预填充 token、前缀缓存命中率、TTFT 的 p50 / p99、输出 token/s 和
最久的等待（最大的 TTFT），以及对 ``fcfs`` 的同一轮比值（中位数（最小 – 最大））。

工作负载（:func:`workload`）：几组请求各用一段长的系统提示词，按组轮流到达，中间夹着无关的请求；全部一起提交
（并发数 = 请求数，远多于请求槽），KV 池只够放下运行中的请求和少数几段前缀，先来先服务时各组互相把前缀挤出缓存。
离线（进程里的 ``LLM``），TTFT 从 ``generate`` 开始计到这个请求的第一个 token 交出来。

    python bench/schedule.py                       # 缺省：Qwen3-0.6B 形状的模型，1 轮
    python bench/schedule.py --model models/qwen3-tiny-random --repeats 3

同样的比较也可以在服务器上做（``/metrics`` 的计数器）：
``python bench/serve.py --model M --requests shared-prefix --prefix-groups 4 --variant "lpm=minisgl --schedule-policy lpm"``。

en: A benchmark (not a test) of the waiting queue's order (``--schedule-policy``): ``fcfs``, ``lpm``, ``dfs-weight`` and
``random`` take turns on a shared-prefix workload; for each it reports the prefill tokens computed, the prefix-cache hit
rate, TTFT p50 / p99, output token/s and the longest wait (the largest TTFT), with the same-round ratios to ``fcfs``
(median (min – max)).

The workload (:func:`workload`): several groups of requests, each with its own long system prompt, arriving group after
group in turn with unrelated requests in between; all submitted together (concurrency = request count, far above the
request slots), with a KV pool holding only the running requests and a few prefixes, so that under first come, first
served the groups push each other's prefixes out of the cache. Offline (an in-process ``LLM``); TTFT runs from the start
of ``generate`` to the moment the request's first token is handed out.

The same comparison runs on the server too (``/metrics`` counters):
``python bench/serve.py --model M --requests shared-prefix --prefix-groups 4 --variant "lpm=minisgl --schedule-policy lpm"``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import Stats
from bench.machine import machine_info
from bench.workload import random_requests, shared_prefix_requests
from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.model_zoo import default_model
from minisgl.schedule_policy import SCHEDULE_POLICIES


def workload(groups: int, per_group: int, prefix: int, tail: int, unrelated: int, seed: int) -> list[list[int]]:
    """``groups`` 段 ``prefix`` 个 token 的系统提示词，每组 ``per_group`` 个请求（各接 ``tail`` 个 token），按组轮流
    到达（:func:`~bench.workload.shared_prefix_requests`）；每两个请求之后夹一个无关的请求（一共 ``unrelated`` 个，
    长度和组里的一样）。

    en: ``groups`` system prompts of ``prefix`` tokens, ``per_group`` requests each (each with ``tail`` tokens of its
    own), arriving group after group in turn (:func:`~bench.workload.shared_prefix_requests`); after every two requests
    one unrelated request (``unrelated`` in all, as long as the grouped ones).
    """
    ids = range(100, 20000)
    grouped = shared_prefix_requests(groups * per_group, ids, prefix, (tail, tail), (1, 1), seed, groups)
    others = iter(random_requests(unrelated, ids, (prefix + tail, prefix + tail), (1, 1), f"{seed}-unrelated"))
    prompts: list[list[int]] = []
    for spec in grouped:
        prompts.append(spec.prompt)
        if len(prompts) % 3 == 2:
            prompts.extend(r.prompt for r in itertools.islice(others, 1))
    return prompts


def run_once(llm: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    """跑一遍：预填充 token、命中、每个请求的 TTFT、总时长。

    en: One pass: prefill tokens, hits, each request's TTFT, the total time.
    """
    counted = {"prefill": 0, "hit": 0}
    first: dict[int, float] = {}

    def step(trace: Any) -> None:
        if trace.is_prefill:
            counted["prefill"] += trace.tokens
            counted["hit"] += sum(trace.cached_lens)

    def result(event: Any) -> None:
        if event.token is not None and event.uid not in first:
            first[event.uid] = time.perf_counter()

    stop_step, stop_result = llm.add_step_listener(step), llm.add_result_listener(result)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    try:
        start = time.perf_counter()
        llm.generate(prompts, params)
        seconds = time.perf_counter() - start
    finally:
        stop_step()
        stop_result()
    ttft = sorted(t - start for t in first.values())
    total = sum(map(len, prompts))
    return {"prefill": counted["prefill"], "hit_rate": counted["hit"] / total,
            "ttft_p50": statistics.median(ttft), "ttft_p99": ttft[min(len(ttft) - 1, round(0.99 * (len(ttft) - 1)))],
            "longest_wait": ttft[-1], "tok_s": len(prompts) * max_tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help=tr("model directory (default: Qwen3-0.6B, or the random-weight model of the same shape if that is missing)"))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--per-group", type=int, default=4)
    parser.add_argument("--prefix", type=int, default=384)
    parser.add_argument("--tail", type=int, default=16)
    parser.add_argument("--unrelated", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--pool", type=int, default=3072, help=tr("KV pool size in tokens"))
    args = parser.parse_args()
    model = Path(args.model) if args.model else default_model()
    prompts = workload(args.groups, args.per_group, args.prefix, args.tail, args.unrelated, seed=0)
    info = machine_info()
    print(tr("Machine: {cpu}, {cores} cores, load {load}; model: {name} (fp32); {n} requests, {tokens} prompt tokens, {slots} request slots, a KV pool of {pool} tokens",
             cpu=info["cpu"], cores=info["cores"], load=info.get("load_at_start"), name=model.name, n=len(prompts),
             tokens=sum(map(len, prompts)), slots=args.slots, pool=args.pool))
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in SCHEDULE_POLICIES}
    for round_ in range(args.repeats):
        # 每种策略一个新引擎（空的前缀缓存），各策略在同一轮里轮流跑
        # en: a new engine per policy (an empty prefix cache); the policies take turns within a round
        for name in SCHEDULE_POLICIES:
            llm = LLM(model, dtype=torch.float32, max_running_req=args.slots, num_page_override=args.pool,
                      max_seq_len_override=args.prefix + args.tail + args.max_tokens + 8, schedule_policy=name)
            try:
                llm.generate([[7] * 16], SamplingParams(max_tokens=2, ignore_eos=True))  # 预热 | en: warm-up
                samples[name].append(run_once(llm, prompts, args.max_tokens))
            finally:
                llm.shutdown()
            del llm
            gc.collect()
        print(tr("  round {done}/{total} done", done=round_ + 1, total=args.repeats))
    metrics = ("prefill", "hit_rate", "ttft_p50", "ttft_p99", "longest_wait", "tok_s")
    header = "| policy | prefill tokens | hit rate | TTFT p50 (s) | TTFT p99 (s) | longest wait (s) | output tok/s |"
    print(header)
    print("|" + " --- |" * 7)
    for name, runs in samples.items():
        cells = [Stats.of([r[m] for r in runs]).median for m in metrics]
        print(f"| {name} | {cells[0]:.0f} | {cells[1]:.1%} | {cells[2]:.2f} | {cells[3]:.2f} | {cells[4]:.2f} | {cells[5]:.1f} |")
    print(tr("Same-round ratios to fcfs, median (min – max):"))
    for name, runs in samples.items():
        if name == "fcfs":
            continue
        parts = []
        for m in ("prefill", "ttft_p99", "tok_s"):
            r = Stats.of([a[m] / b[m] for a, b in zip(runs, samples["fcfs"])])
            parts.append(f"{m} {r.median:.2f}× ({r.min:.2f} – {r.max:.2f})")
        print(f"  {name}: " + ", ".join(parts))


if __name__ == "__main__":
    main()
