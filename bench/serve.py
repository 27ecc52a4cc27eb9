"""服务的负载生成器（不是测试）：用官方的异步 ``openai`` 客户端压任何 OpenAI 兼容的服务，流式补全
（``/v1/completions``，``stream=True``，``stream_options={"include_usage": True}``），每次运行报 TTFT、TPOT、ITL、
端到端时延的 p50 / p90 / p99，输出 token/s，失败的请求和 goodput（满足 SLO 的请求数 / 秒）。

- 请求集（``--requests``）：``random`` 是随机的提示词长度和输出长度（固定种子）；``shared-prefix`` 是同一段系统提示词
  加各自一小段不同的尾巴；``repeat`` 是一段随机文字（长度按 ``--tail-len``）重复成的提示词，模型会照抄下去，是投机
  解码占便宜的负载。提示词直接给 token id（``prompt`` 接受 id 列表），长度分毫不差；分词器只用来挑合法的 id。
  只收文字的服务器拿到的是这些 id 解码成的文字（它自己重新分词，提示词的 token 数可能差一两个：报告里有它数的数）。
- 负载的形状：``--rates`` 是泊松到达（每秒几个请求，带种子），``--concurrency`` 是闭环（同时在飞的请求数固定）。
  每次运行换一个种子（种子 + 第几次），前缀缓存里不会留着上一次的提示词。
- 老实的账：每个请求都要 ``max_tokens=N`` 并请服务器别提前停（我们的服务器用 ``ignore_eos``，别家用各自的等价写法），
  ``usage.completion_tokens`` 不等于 N 就算这个请求失败（“答得比要的少”），谁也不能靠少答赢。客户端不重试（``max_retries=0``）。
- ``--url`` 指向一个正在运行的服务；``--model 目录``（旧名 ``--serve-model``）则自己起服务器：``--peers`` 里的每一个
  （``minisgl`` 缺省，还有 ``transformers``、``llamacpp``）轮流起、预热、测量、关掉，确认没有留下子进程；
  每家拿到的请求集和负载形状完全相同（同样的种子），最后一张表带 ``server`` 一栏，再给每次运行一行比值（我们 / 对方）。
  不认识的参数都转给我们的服务器。``--speculative`` 再测一个开着 n-gram 投机解码的我们（``minisgl+ngram`` 一行，
  报告里还有它接受了多少草稿），``--variant``、``--ablations`` 是别的变体。

这个文件只是命令行（参数和 ``main``）；库是 ``bench`` 包里的模块，见 ``bench/__init__.py``。

    python bench/serve.py --model models/qwen3-tiny-random --concurrency 1,4 --num-requests 8 \\
        --dtype float32 --num-pages 4096 --max-seq-len 1024
    python bench/serve.py --model models/SmolLM2-135M-Instruct --peers minisgl,transformers --concurrency 1,4 \\
        --num-requests 8 --output-len 32,32 --prompt-len 32,64 --dtype float32
    python bench/serve.py --url http://127.0.0.1:1919/v1 --tokenizer models/qwen3-tokenizer --rates 0.5,1,2
    python bench/serve.py --model models/SmolLM2-135M-Instruct --speculative --requests repeat --concurrency 1,4 \\
        --num-requests 8 --prompt-len 128,256 --tail-len 16,48 --output-len 64,64 --dtype float32

en: A load generator for serving (not a test): it drives any OpenAI-compatible service with the official async
``openai`` client, streaming completions (``/v1/completions``, ``stream=True``,
``stream_options={"include_usage": True}``), and reports for each run p50 / p90 / p99 of TTFT, TPOT, ITL and end-to-end
latency, output token/s, failed requests and goodput (requests meeting the SLO, per second).

- Request sets (``--requests``): ``random`` has random prompt and output lengths (fixed seed); ``shared-prefix`` is one
  system prompt plus a short distinct tail each; ``repeat`` prompts are a random passage (of ``--tail-len`` tokens)
  repeated, which a model goes on copying: the load speculative decoding gains on. Prompts are token ids (``prompt``
  takes a list of ids), so their lengths are exact; the tokenizer only picks valid ids. A server that takes text only gets the text those ids decode
  to (it tokenizes it again, so the prompt may count a token or two more or less: the report shows its count).
- Load shapes: ``--rates`` are Poisson arrivals (requests per second, seeded), ``--concurrency`` a closed loop (a fixed
  number of requests in flight). Each run gets its own seed (seed + run index), so the prefix cache holds nothing of
  the previous run's prompts.
- Honest accounting: every request asks ``max_tokens=N`` and asks the server not to stop early (``ignore_eos`` for ours,
  each peer's own equivalent for the others), and a ``usage.completion_tokens`` other than N fails that request
  ("answered less than asked"): no server wins by answering less. The client never retries (``max_retries=0``).
- ``--url`` points at a running service; ``--model DIR`` (formerly ``--serve-model``) starts servers itself: each of
  ``--peers`` (``minisgl`` by default, also ``transformers`` and ``llamacpp``) in turn is started, warmed up, measured
  and stopped, making sure no child process is left; every server gets the very same request sets and load shapes
  (same seeds), and one table with a ``server`` column is printed, then a ratio line per run (ours / the peer).
  Unknown flags go to our server. ``--speculative`` also measures ours with n-gram speculative decoding (the row
  ``minisgl+ngram``, the report adding how many drafts it accepted); ``--variant`` and ``--ablations`` give other
  variants.

This file is only the command line (flags and ``main``); the library is the modules of the ``bench`` package,
see ``bench/__init__.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.accounting import Slo
from bench.client import Options
from bench.common import plot_paths
from bench.machine import QuietWatch, cpu_times, machine_info, steal_percent
from bench.peers import ABLATIONS, OURS, PEERS, SPECULATIVE, Peer, Variant, build_peers, run_peer
from bench.report import plot, print_report, ratio_rows, ratio_spreads
from bench.workload import REQUEST_SETS, Run, load_vocab
from minisgl.i18n import tr

_ENV_WORD = re.compile(r"[A-Z_][A-Z0-9_]*=")


def parse_variant(text: str) -> Variant:
    """``"名字=基础 参数…"`` → :class:`Variant`，例如 ``"chunk256=minisgl --max-extend-tokens 256"``；
    形如 ``KEY=VALUE``（KEY 全大写）的词是环境变量。

    en: ``"name=base flags…"`` → :class:`Variant`, e.g. ``"chunk256=minisgl --max-extend-tokens 256"``; words like
    ``KEY=VALUE`` (KEY in capitals) are environment variables.
    """
    name, sep, rest = text.partition("=")
    words = shlex.split(rest)
    name = name.strip()
    if not sep or not name or name in PEERS or not words or words[0] not in PEERS:
        raise argparse.ArgumentTypeError(tr("expected NAME=SERVER FLAGS… with SERVER one of {choices} and a new NAME, "
                                            "got {text!r}", choices=",".join(PEERS), text=text))
    env = tuple((w.partition("=")[0], w.partition("=")[2]) for w in words[1:] if _ENV_WORD.match(w))
    flags = tuple(w for w in words[1:] if not _ENV_WORD.match(w))
    return Variant(name, words[0], flags, env)


def parse_ablations(text: str) -> list[Variant]:
    """``"all"`` 或 :data:`ABLATIONS` 里的名字（逗号分隔）→ 变体。

    en: ``"all"`` or names from :data:`ABLATIONS` (comma-separated) → variants.
    """
    names = [x.strip() for x in text.split(",") if x.strip()]
    names = list(ABLATIONS) if names == ["all"] else names
    unknown = [x for x in names if x not in ABLATIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(tr("unknown ablations {unknown}: choose from {choices} or all",
                                            unknown=unknown, choices=",".join(ABLATIONS)))
    return [ABLATIONS[x] for x in names]


def parse_list(text: str, kind: Callable[[str], float]) -> list[float]:
    return [kind(x) for x in text.split(",") if x.strip()]


def parse_range(text: str) -> tuple[int, int]:
    """``"16,256"`` → (16, 256)；一个数表示两端相同。

    en: ``"16,256"`` → (16, 256); a single number means both ends.
    """
    parts = [int(x) for x in text.split(",")]
    lo, hi = parts[0], parts[-1]
    if len(parts) > 2 or lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(tr("expected MIN,MAX with 1 ≤ MIN ≤ MAX, got {text!r}", text=text))
    return lo, hi


def parse_peers(text: str) -> list[str]:
    """``"minisgl,transformers"`` → ``["minisgl", "transformers"]``（去掉重复，保持顺序）；不认识的名字报错。

    en: ``"minisgl,transformers"`` → ``["minisgl", "transformers"]`` (duplicates dropped, order kept); an unknown name is
    an error.
    """
    names = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    unknown = [x for x in names if x not in PEERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(tr("unknown servers {unknown}: choose from {choices}", unknown=unknown,
                                            choices=",".join(PEERS)))
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=tr("Load generator for an OpenAI-compatible server: streamed completions, "
                                               "TTFT / TPOT / ITL / end-to-end latency, throughput, goodput"),
                                epilog=tr("Unknown flags go to our server (minisgl) started with --model "
                                          "(for example --dtype float32 --num-pages 4096)."))
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help=tr("base URL of a running server, e.g. http://127.0.0.1:1919/v1"))
    target.add_argument("--model", "--serve-model", dest="model",
                        help=tr("HF-format model folder: start each of --peers on it in turn on a free port, measure, "
                                "stop it (--serve-model is the old name)"))
    target.add_argument("--replot", type=Path,
                        help=tr("redraw --plot from a report written earlier with --json (nothing is measured)"))
    p.add_argument("--peers", type=parse_peers,
                   help=tr("servers to measure on the same requests, comma-separated, from {choices} (default: minisgl)",
                           choices=",".join(PEERS)))
    p.add_argument("--variant", type=parse_variant, action="append", default=[],
                   help=tr("also measure a server with changed settings, NAME=SERVER FLAGS… (KEY=VALUE words go to its "
                           "environment), e.g. \"chunk256=minisgl --max-extend-tokens 256\"; repeatable"))
    p.add_argument("--ablations", type=parse_ablations, default=[],
                   help=tr("also measure our server with one stage-2 mechanism turned off, comma-separated from {choices}, "
                           "or all", choices=",".join(ABLATIONS)))
    p.add_argument("--speculative", action="store_true",
                   help=tr("also measure our server with n-gram speculative decoding (--speculative-algorithm NGRAM, "
                           "the row {name}); --requests repeat is the load it gains on", name=SPECULATIVE.name))
    p.add_argument("--repeats", type=int, default=1,
                   help=tr("passes over all runs, each with new requests; ratios get min/median/max (default 1)"))
    p.add_argument("--tokenizer", help=tr("tokenizer folder used to pick valid token ids (default: the --model folder)"))
    p.add_argument("--model-name", help=tr("the model field of the requests (default: the first of /v1/models)"))
    p.add_argument("--api-key", default="none")
    p.add_argument("--requests", choices=REQUEST_SETS, default="random", help=tr("request set (default: random)"))
    p.add_argument("--rates", help=tr("Poisson arrival rates in requests/s, comma-separated (inf: all at once)"))
    p.add_argument("--concurrency", help=tr("closed-loop concurrencies, comma-separated (default 1,4,8 when --rates is not given)"))
    p.add_argument("--num-requests", type=int, default=32, help=tr("requests per run (default 32)"))
    p.add_argument("--prompt-len", type=parse_range, default=(16, 256), help=tr("random set: prompt length MIN,MAX in tokens (default 16,256)"))
    p.add_argument("--output-len", type=parse_range, default=(16, 128), help=tr("output length MIN,MAX in tokens (default 16,128)"))
    p.add_argument("--prefix-len", type=int, default=200, help=tr("shared-prefix set: tokens of the shared system prompt (default 200)"))
    p.add_argument("--prefix-groups", type=int, default=1,
                   help=tr("shared-prefix set: this many different system prompts, the requests taking them in turn (default 1)"))
    p.add_argument("--tail-len", type=parse_range, default=(8, 32),
                   help=tr("shared-prefix set: length MIN,MAX of each distinct tail; repeat set: of the repeated passage "
                           "(default 8,32)"))
    p.add_argument("--seed", type=int, default=0, help=tr("seed of the first run's requests; run i of pass r uses seed + i + r × runs (default 0)"))
    p.add_argument("--timeout", type=float, default=300.0, help=tr("per-request timeout in seconds (default 300)"))
    p.add_argument("--warmup", type=int, default=2, help=tr("warm-up requests before measuring, not counted (default 2)"))
    p.add_argument("--no-ignore-eos", action="store_true",
                   help=tr("do not ask the servers not to stop early (ignore_eos or its equivalent); answers shorter "
                           "than asked still count as failures"))
    p.add_argument("--slo-ttft", type=float, default=2.0, help=tr("SLO on TTFT in seconds, for goodput (default 2)"))
    p.add_argument("--slo-tpot", type=float, default=0.2, help=tr("SLO on TPOT in seconds, for goodput (default 0.2)"))
    p.add_argument("--json", type=Path, help=tr("write every per-request record and every summary to this JSON file"))
    p.add_argument("--plot", type=Path,
                   help=tr("draw latency against load into this image (svg or png; the English one goes beside it as X.en.svg)"))
    p.add_argument("--record", action="store_true",
                   help=tr("for the book: wait until the machine is quiet, watch it during the runs, and note in the "
                           "report whether another process took CPU"))
    p.add_argument("--no-progress", action="store_true", help=tr("no progress bar"))
    p.add_argument("--start-timeout", type=float, default=300.0, help=tr("seconds to wait for each started server (default 300)"))
    return p


def _plain(value: Any) -> Any:  # noqa: ANN401 - any parsed argument
    """参数值写进 JSON 的样子：路径变字符串，变体变字典。

    en: How an argument value goes into JSON: paths as strings, variants as dicts.
    """
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list):
        return [_plain(x) for x in value]
    if isinstance(value, Variant):
        return asdict(value)
    return value


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """依次测每家服务器（同样的请求），打印一张表和比值，按 ``--json`` 写文件、按 ``--plot`` 画图；返回同样内容的
    报告（``peers`` 里每家有状态、命令、设置、就绪用时、退出码、留下的进程和各次运行；``machine`` 是这台机器）。

    en: Measure each server in turn (the same requests), print one table and the ratios, write ``--json``, draw
    ``--plot``; return the same report (``peers`` holds, for each, its status, command, settings, time to ready, exit
    code, the processes left behind and its runs; ``machine`` describes this machine).
    """
    parser = build_parser()
    args, server_flags = parser.parse_known_args(argv)
    if args.replot is not None:
        if args.plot is None:
            parser.error(tr("--replot needs --plot"))
        report = json.loads(args.replot.read_text(encoding="utf-8"))
        for language, path in plot_paths(args.plot).items():
            plot(report, path, language)
        return report
    variants = [*args.ablations, *([SPECULATIVE] if args.speculative else []), *args.variant]
    if args.url and (args.peers is not None or variants):
        parser.error(tr("--peers, --variant, --ablations and --speculative need --model (the servers are started on "
                        "that folder)"))
    names = args.peers or [OURS]
    if server_flags and (args.url or OURS not in names):
        parser.error(tr("unknown arguments {flags} (server flags are allowed only with --model and minisgl among --peers)",
                        flags=server_flags))
    if variants and OURS not in names and any(v.base == OURS for v in variants):
        parser.error(tr("variants of minisgl are compared with minisgl itself: add minisgl to --peers"))
    labels = [*names, *(v.name for v in variants)]
    if len(set(labels)) != len(labels):
        parser.error(tr("every server and variant needs its own name: {names}", names=labels))
    if args.seed < 0:
        parser.error(tr("--seed must not be negative (Random(-n) draws the same numbers as Random(n))"))
    if args.repeats < 1:
        parser.error(tr("--repeats must be at least 1"))
    if args.prefix_groups < 1:
        parser.error(tr("--prefix-groups must be at least 1"))
    tokenizer = args.tokenizer or args.model
    if tokenizer is None:
        parser.error(tr("with --url, give --tokenizer DIR (its vocabulary gives the prompt token ids)"))
    runs = [Run("poisson", r) for r in parse_list(args.rates or "", float)]
    runs += [Run("closed", c) for c in parse_list(args.concurrency or ("" if runs else "1,4,8"), int)]
    opts = Options(requests=args.requests, num_requests=args.num_requests, prompt_len=args.prompt_len,
                   output_len=args.output_len, prefix_len=args.prefix_len, tail_len=args.tail_len,
                   prefix_groups=args.prefix_groups, seed=args.seed,
                   timeout=args.timeout, ignore_eos=not args.no_ignore_eos, slo=Slo(args.slo_ttft, args.slo_tpot))
    vocab = load_vocab(tokenizer)
    peers = [Peer("url", url=args.url)] if args.url else build_peers(names, args.model, server_flags, variants)

    machine = machine_info()
    print(tr("{requests} set, {n} requests per run; every server gets the same requests (seed {seed})",
             requests=args.requests, n=args.num_requests, seed=args.seed))
    with QuietWatch() if args.record else contextlib.nullcontext() as watch:
        before = cpu_times()
        outcomes = [run_peer(peer, runs, vocab, opts, args) for peer in peers]
        machine["steal_percent"] = steal_percent(before, cpu_times())
    if watch is not None:
        machine.update(recorded=True, intruders=sorted(watch.intruders.values()), quiet=not watch.intruders)
        if watch.intruders:
            print(tr("Other processes took CPU during the runs, so these timings are not fit for the book: {who}",
                     who="; ".join(watch.intruders.values())))
    ratios = ratio_rows(outcomes)
    print_report(outcomes, ratios, peers, opts)
    report: dict[str, Any] = {"args": {k: _plain(v) for k, v in vars(args).items()}, "server_flags": server_flags,
                              "machine": machine, "peers": [o.report() for o in outcomes], "ratios": ratios,
                              "ratio_spreads": ratio_spreads(ratios)}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(tr("Records and summaries written to {path}", path=args.json))
    if args.plot is not None:
        for language, path in plot_paths(args.plot).items():
            plot(report, path, language)
        print(tr("Plots written to {path}", path=args.plot))
    return report


def exit_code(report: dict[str, Any]) -> int:
    """有服务器没测成（没装的不算）或留下了进程时为 1，否则为 0。

    en: 1 when a server could not be measured (absent ones aside) or left processes behind, else 0.
    """
    return int(any(p["status"] == "failed" or p.get("left_behind") for p in report["peers"]))


if __name__ == "__main__":
    sys.exit(exit_code(main()))
