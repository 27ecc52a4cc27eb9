"""第 4 阶段的扩展基准（不是测试）：同一台机器、同样的请求，一个进程对 ``--tp N``、``--ep N``（混合专家模型；N 是切得开的最小秩数）和
``--dp 2`` 配三种路由策略，在共享前缀的负载（几段系统提示词轮流）和随机负载上各测一遍；报服务器自己数的预填充 token、
前缀缓存命中的比例，以及 TTFT、TPOT、输出 token/s。只报告，不判对错。

每一行都是 ``bench/serve.py`` 的一个变体（同一套请求、同样的账）；这个脚本只把它们排好、把两种负载的结果拼成一张表。
集合通信搬了多少字节看 ``bench/tp.py``（离线、逐步计时）。

    python bench/scale.py                                  # SmolLM2，fp32，每种负载 24 个请求，4 个并发
    python bench/scale.py --moe models/qwen3-moe-tiny-random   # 另测混合专家模型：一个进程、--tp N、--ep N
    python bench/scale.py --json /tmp/scale.json --record
    python bench/scale.py --model models/qwen3-0.6b-random --device cuda   # 不认识的参数给每个服务器（GPU：每个副本一张卡）

在 2 核的 CPU 上，两个副本各只有一个核，谁也不会比一个进程快多少；能看清的是账：轮流时每段系统提示词在两个副本上
各算一遍，缓存感知时只算一遍。GPU 上（每个副本一张卡）这笔账直接变成吞吐。

en: The stage 4 scale benchmark (not a test): on the same machine with the same requests, one process against
``--tp N``, ``--ep N`` (for a mixture of experts; N the fewest ranks that split the model) and ``--dp 2`` under the three router policies, once on a
shared-prefix workload (a few system prompts taking turns) and once on a random one; reports the prefill tokens the
servers counted themselves, the prefix-cache hit share, and TTFT, TPOT, output token/s. It reports and judges nothing.

Every row is a variant of ``bench/serve.py`` (the same requests, the same accounting); this script only lines them up
and joins the two workloads' results into one table. The bytes the collectives move are in ``bench/tp.py`` (offline,
timed step by step).

On a 2-core CPU two replicas have one core each, so none is much faster than one process; what shows clearly is the
account: in turn, each system prompt is computed on both replicas; cache-aware computes it once. On GPUs (one device per
replica) that account turns straight into throughput.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench import serve
from minisgl.i18n import tr
from minisgl.server.args import ROUTER_POLICIES

#: 共享前缀负载的形状：几段系统提示词、每段多长、尾巴多长。
#: en: The shape of the shared-prefix workload: how many system prompts, how long each, how long the tails.
PREFIX_GROUPS, PREFIX_LEN, TAIL_LEN = 3, 256, "8,32"


def smallest_split(model: str, ep: bool = False) -> int:
    """切得开这个模型的最小的 ``--tp``（大于 1）：SmolLM2 的 9 个头切不成 2 份，就是 3。

    en: The smallest ``--tp`` above 1 that splits this model: SmolLM2's 9 heads do not split in 2, so 3.
    """
    from minisgl.architectures import load_model_config
    from minisgl.llm import check_split

    config = load_model_config(model)
    for n in range(2, 9):
        try:
            check_split(config, n, n if ep else 1)
            return n
        except ValueError:
            continue
    raise SystemExit(tr("{model} splits over no tp from 2 to 8", model=model))


def variants(model: str, moe: bool) -> list[str]:
    """要测的变体（``--variant`` 的写法）：稠密模型是 TP 和三种策略的 DP，混合专家模型是 TP 和 EP（各用切得开的最小的秩数）。

    en: The variants to measure (as ``--variant`` takes them): TP and DP under the three policies for a dense model, TP
    and EP for a mixture of experts (each with the fewest ranks that split it).
    """
    tp = smallest_split(model)
    if moe:
        ep = smallest_split(model, ep=True)
        return [f"tp{tp}=minisgl --tp {tp}", f"ep{ep}=minisgl --tp {ep} --ep {ep}"]
    return [f"tp{tp}=minisgl --tp {tp}", *(f"dp2-{p}=minisgl --dp 2 --router-policy {p}" for p in ROUTER_POLICIES)]


def measure(model: str, workload: str, args: argparse.Namespace, moe: bool, server_flags: list[str]) -> dict[str, Any]:
    """``bench/serve.py`` 在一种负载上测一个进程和各个变体；不认识的参数（``server_flags``）给每个服务器。

    en: ``bench/serve.py`` measuring one process and the variants on one workload; unknown flags (``server_flags``) go
    to every server.
    """
    argv = ["--model", model, "--peers", "minisgl", "--requests", workload, "--concurrency", str(args.concurrency),
            "--num-requests", str(args.num_requests), "--output-len", args.output_len, "--dtype", "float32",
            "--prefix-groups", str(PREFIX_GROUPS), "--prefix-len", str(PREFIX_LEN), "--tail-len", TAIL_LEN,
            "--prompt-len", f"{PREFIX_LEN},{PREFIX_LEN + 32}"]
    for v in variants(model, moe):
        argv += ["--variant", v]
    if args.record:
        argv.append("--record")
    if args.no_progress:
        argv.append("--no-progress")
    return serve.main([*argv, *server_flags])


def _ms(seconds: float | None, digits: int = 0) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.{digits}f}"


def rows(report: dict[str, Any], workload: str) -> list[list[str]]:
    out = []
    for peer in report["peers"]:
        for run in peer.get("runs", []):
            s, c = run["summary"], run.get("counters") or {}
            prefill, hits = c.get("prefill_tokens"), c.get("prefix_hit_tokens")
            share = f"{hits / (hits + prefill):.0%}" if prefill is not None and hits is not None and hits + prefill else "–"
            out.append([workload, peer["name"], f"{prefill:.0f}" if prefill is not None else "–", share,
                        f"{_ms(s['ttft']['p50'])} / {_ms(s['ttft']['p99'])}", _ms(s["tpot"]["p50"], 1),
                        f"{s['output_throughput']:.1f}",
                        f"{s['ok']}/{s['requests']}"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="models/SmolLM2-135M-Instruct", help=tr("dense model folder (default SmolLM2)"))
    p.add_argument("--moe", default=None, help=tr("also measure this mixture-of-experts model folder with --tp N and --ep N"))
    p.add_argument("--num-requests", type=int, default=24)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--output-len", default="16,32")
    p.add_argument("--json", type=Path, help=tr("write both workloads' reports to this JSON file"))
    p.add_argument("--record", action="store_true", help=tr("wait for a quiet machine and watch it (as bench/serve.py)"))
    p.add_argument("--no-progress", action="store_true")
    args, server_flags = p.parse_known_args(argv)
    reports: dict[str, Any] = {}
    table = []
    for model, moe in [(args.model, False), *([(args.moe, True)] if args.moe else [])]:
        for workload in ("shared-prefix", "random"):
            report = measure(model, workload, args, moe, server_flags)
            reports[f"{Path(model).name} {workload}"] = report
            table += rows(report, f"{Path(model).name} {workload}")
    header = [tr("workload"), tr("server"), tr("prefill tokens computed"), tr("prefix-cache hits"),
              tr("TTFT p50 / p99 (ms)"), tr("TPOT p50 (ms)"), tr("output tok/s"), tr("succeeded")]
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in table:
        print("| " + " | ".join(row) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps(reports, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return max(serve.exit_code(r) for r in reports.values())


if __name__ == "__main__":
    sys.exit(main())
