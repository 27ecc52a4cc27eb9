"""第 3 阶段共用的、不属于某一章的小东西：服务的设置（命令行参数）、启动前的检查和各进程之间的 ipc 地址。
在子进程里启动服务器、用完关掉的外壳在 :mod:`minisgl.processes.tree`。

en: Small shared pieces of stage 3 that belong to no chapter: the service's settings (command-line flags), the checks
before starting, and the ipc addresses between its processes. The harness that starts a server in a child process and
stops it again is :mod:`minisgl.processes.tree`.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from minisgl.i18n import tr
from minisgl.schedule_policy import SCHEDULE_POLICIES

#: Linux 上 Unix 域套接字路径的上限（``sun_path`` 108 字节，含结尾的 0）。
#: en: The limit on a Unix domain socket path on Linux (``sun_path`` is 108 bytes, including the final 0).
MAX_IPC_PATH = 107
#: 上游 mini-sglang 的缺省端口。
#: en: Upstream mini-sglang's default port.
DEFAULT_PORT = 1919
#: ``--dist-timeout`` 的缺省值（秒）：各秩在集合点上最多等多久，与第 4.1 章的 ``RENDEZVOUS_TIMEOUT_S`` 相同。
#: en: The default of ``--dist-timeout`` (seconds): the longest the ranks wait at the rendezvous, the same as chapter
#: en: 4.1's ``RENDEZVOUS_TIMEOUT_S``.
DEFAULT_DIST_TIMEOUT_S = 120.0


def option(default: Any, /, *flags: str, help: Callable[[], str], engine: str | None = None, unset: Any = None,
           **parse: Any) -> Any:
    """一个设置的唯一声明（像 SGLang 的 ``ServerArgs``）：缺省值；命令行参数名，第一个是它的名字（多跟 SGLang），其余是
    别名（SGLang、vLLM 的写法）；帮助（调用时才翻译）；argparse 的其余参数 ``parse``（``type``、``choices`` ……，
    ``default`` 覆盖命令行上的缺省值）；交给调度器时的关键字 ``engine``——值为 ``unset`` 时不交，调度器用它自己的缺省值。
    命令行解析（:func:`build_parser`）、交给调度器的参数（:meth:`ServerArgs.scheduler_kwargs`）、``--dp`` 的副本的
    参数（:func:`ServerArgs.flags`）都由它而来。

    en: The one declaration of a setting (like SGLang's ``ServerArgs``): the default; the command-line flags, the first
    being its name (mostly SGLang's), the others aliases (SGLang's and vLLM's spellings); the help (translated when
    called); argparse's other arguments ``parse`` (``type``, ``choices``, ...; ``default`` overrides the default on the
    command line); the keyword for the scheduler ``engine`` — not passed while the value is ``unset``, so the scheduler
    keeps its own default. The command-line parser (:func:`build_parser`), the scheduler's arguments
    (:meth:`ServerArgs.scheduler_kwargs`) and the flags of the ``--dp`` replicas (:meth:`ServerArgs.flags`) all come
    from it.
    """
    return field(default=default, metadata={"flags": flags, "help": help, "engine": engine, "unset": unset, "parse": parse})


#: ``--router-policy`` 的取值（第 4.6 章的三种策略）。
#: en: The values of ``--router-policy`` (chapter 4.6's three policies).
ROUTER_POLICIES = ("cache_aware", "round_robin", "shortest_queue")


@dataclass
class ServerArgs:
    """``python -m minisgl`` 的设置：每个字段一个 :func:`option` 声明。

    en: The settings of ``python -m minisgl``: one :func:`option` declaration per field.
    """

    model_path: str = option(MISSING, "--model", "--model-path", required=True, help=lambda: tr("the model folder"))
    host: str = option("127.0.0.1", "--host", help=lambda: tr("the address to listen on (default 127.0.0.1)"))
    port: int = option(DEFAULT_PORT, "--port", type=int,
                       help=lambda: tr("the port (default {port}; 0: a free port chosen by the system)", port=DEFAULT_PORT))
    api_key: str | None = option(None, "--api-key",
                                 help=lambda: tr("require Authorization: Bearer <key> on /v1/* and /generate"))
    model_name: str | None = option(None, "--served-model-name",
                                    help=lambda: tr("the name in /v1/models (default: the model folder's name)"))
    access_log: bool = option(True, "--no-access-log", action="store_false",
                              help=lambda: tr("do not log one line per HTTP request (method, path, status, tokens, time) to stderr"))
    # None：模型自己的类型（命令行上写 auto）| en: None: the model's own type (auto on the command line)
    dtype: str | None = option(None, "--dtype", engine="dtype", choices=["auto", "float32", "float16", "bfloat16"],
                               help=lambda: tr("the data type of weights and activations"))
    device: str = option("auto", "--device", engine="device", help=lambda: tr("cpu, cuda or auto"))
    max_running_req: int = option(8, "--max-running-req", "--max-running-requests", engine="max_running_req", type=int,
                                  help=lambda: tr("the most requests running at once (request slots)"))
    # None：最后一章支持的第一种（radix）| en: None: the first kind the final chapter supports (radix)
    cache_type: str | None = option(None, "--cache-type", engine="cache_type", choices=["radix", "naive"],
                                    help=lambda: tr("the prefix cache (default radix)"))
    # 等待队列的顺序（SGLang 的名字；第 2.3 章 radix 缓存那一页的“等待队列的顺序”）
    # en: the waiting queue's order (SGLang's names; "the order of the waiting queue" on chapter 2.3's radix-cache page)
    schedule_policy: str = option(SCHEDULE_POLICIES[0], "--schedule-policy", engine="schedule_policy", choices=SCHEDULE_POLICIES,
                                  help=lambda: tr("the order of the waiting queue: fcfs (arrival order, the default), lpm (longest cached prefix first), dfs-weight (the radix tree's order), random"))
    page_size: int = option(1, "--page-size", engine="page_size", type=int, help=lambda: tr("tokens per KV page"))
    max_extend_tokens: int | None = option(None, "--max-extend-tokens", "--max-extend-length", "--max-prefill-length",
                                           engine="max_extend_tokens", type=int,
                                           help=lambda: tr("the most prefill tokens in one step (chunked prefill)"))
    num_pages: int | None = option(None, "--num-pages", engine="num_page_override", type=int,
                                   help=lambda: tr("the number of KV pages (default: from the memory)"))
    # KV 池的 token 数（SGLang 的 --max-total-tokens）：页数 = 它 // page_size；与 num_pages 二选一
    # en: the KV pool's size in tokens (SGLang's --max-total-tokens): pages = it // page_size; num_pages or this, not both
    max_total_tokens: int | None = option(
        None, "--max-total-tokens", type=int,
        help=lambda: tr("the KV pool's size in tokens (pages = it // page size; default: on the CPU 1.5 × --max-running-req × --max-seq-len, the extra half for the prefix cache; on CUDA from the memory)"))
    max_seq_len: int | None = option(None, "--max-seq-len", "--max-seq-len-override", "--context-length", "--max-model-len",
                                     engine="max_seq_len_override", type=int,
                                     help=lambda: tr("the context length of one request, prompt included"))
    memory_ratio: float | None = option(
        None, "--mem-fraction-static", "--memory-ratio", "--gpu-memory-utilization", engine="memory_ratio", type=float,
        help=lambda: tr("the most of the memory available before loading that the model and the KV cache may take (default 0.9 on CUDA, 0.3 on the CPU)"))
    # 张量并行：几个秩（跨所有节点），几个节点，本节点是第几个，集合点 HOST:PORT（多节点时必须给）
    # en: tensor parallelism: how many ranks (over all nodes), how many nodes, which node this is, the rendezvous
    # en: HOST:PORT (required with several nodes)
    tp_size: int = option(1, "--tp", "--tp-size", "--tensor-parallel-size", type=int, default=None,
                          help=lambda: tr("tensor parallelism: split the model over this many ranks (over all nodes)"))
    # 专家并行：混合专家模型的专家分给几个秩（1，或等于 tp_size）
    # en: expert parallelism: how many ranks a mixture of experts' experts are dealt out to (1, or equal to tp_size)
    ep_size: int = option(1, "--ep", "--ep-size", "--expert-parallel-size", engine="ep_size", unset=1, type=int, default=None,
                          help=lambda: tr("expert parallelism: deal a mixture of experts' experts out to this many ranks (1 or --tp; "
                                          "alone it sets --tp too)"))
    nnodes: int = option(1, "--nnodes", type=int, help=lambda: tr("the number of nodes (machines) the ranks are spread over"))
    node_rank: int = option(0, "--node-rank", type=int, help=lambda: tr("which node this launch is (0 serves HTTP)"))
    dist_init_addr: str | None = option(
        None, "--dist-init-addr",
        help=lambda: tr("HOST:PORT of node 0 where the ranks meet (required with --nnodes > 1; default: a free port on 127.0.0.1)"))
    # 在集合点上最多等几秒（SGLang 的 --dist-timeout）；之后的集合通信有自己更长的上限
    # en: the most seconds to wait at the rendezvous (SGLang's --dist-timeout); the collectives afterwards have their own,
    # en: longer limit
    dist_timeout: float = option(
        DEFAULT_DIST_TIMEOUT_S, "--dist-timeout", type=float,
        help=lambda: tr("the most seconds the ranks wait at --dist-init-addr for every node before giving up (default "
                        "{seconds:g}; the collectives afterwards keep their own, longer limit)", seconds=DEFAULT_DIST_TIMEOUT_S))
    # 数据并行：几个完整的副本，前面的路由器按哪种策略分请求，缓存感知的三个门槛（None：第 4.6 章的缺省值）
    # en: data parallelism: how many whole replicas, the policy the router in front deals requests by, the three
    # en: cache-aware thresholds (None: chapter 4.6's defaults)
    dp_size: int = option(1, "--dp", "--dp-size", "--data-parallel-size", type=int,
                          help=lambda: tr("data parallelism: this many whole replicas (each with its own scheduler, and --tp ranks each) behind one router"))
    # 命令行上缺省为 None：看得出给没给（没有 --dp 时拒绝路由器参数）| en: None on the command line: tells whether it was given (router flags are refused without --dp)
    router_policy: str = option(ROUTER_POLICIES[0], "--router-policy", choices=ROUTER_POLICIES, default=None,
                                help=lambda: tr("how the router deals requests out to the --dp replicas (default cache_aware)"))
    router_cache_threshold: float | None = option(
        None, "--router-cache-threshold", type=float,
        help=lambda: tr("cache_aware: route by prefix match when the matched share is above this (default 0.5)"))
    router_balance_abs_threshold: int | None = option(
        None, "--router-balance-abs-threshold", type=int,
        help=lambda: tr("cache_aware: the load counts as imbalanced only when the most and the fewest requests in hand differ by more than this (default 32)"))
    router_balance_rel_threshold: float | None = option(
        None, "--router-balance-rel-threshold", type=float,
        help=lambda: tr("cache_aware: ... and the most is above this many times the fewest (default 1.0001)"))

    # 投机解码（SGLang 的参数名；数值参数没给时用调度器的缺省值，见 minisgl/scheduling.py 的 SchedulerConfig）
    # en: speculative decoding (SGLang's flag names; numeric flags not given keep the scheduler's defaults, see
    # en: SchedulerConfig in minisgl/scheduling.py)
    speculative_algorithm: str | None = option(
        None, "--speculative-algorithm", engine="speculative_algorithm", type=str.upper, choices=["NGRAM", "EARLY_EXIT"],
        help=lambda: tr("speculative decoding: NGRAM guesses the next tokens from n-grams already seen and verifies "
                        "them in one forward (greedy requests; overlap scheduling is off with it)") + " " + tr(
            "EARLY_EXIT guesses with the model's own first layers instead (--speculative-draft-layers)"))
    speculative_num_draft_tokens: int | None = option(
        None, "--speculative-num-draft-tokens", engine="speculative_num_draft_tokens", type=int,
        help=lambda: tr("tokens verified per request and step at most, the last known one included (default 12)"))
    speculative_ngram_min_match_window_size: int | None = option(
        None, "--speculative-ngram-min-match-window-size", engine="speculative_ngram_min_match_window_size", type=int,
        help=lambda: tr("the shortest run of last tokens looked up in the n-grams (default 1)"))
    speculative_ngram_max_match_window_size: int | None = option(
        None, "--speculative-ngram-max-match-window-size", engine="speculative_ngram_max_match_window_size", type=int,
        help=lambda: tr("the longest run of last tokens looked up in the n-grams (default 12)"))
    speculative_ngram_min_bfs_breadth: int | None = option(
        None, "--speculative-ngram-min-bfs-breadth", engine="speculative_ngram_min_bfs_breadth", type=int,
        help=lambda: tr("branches per draft node when the longest window matches (default 1)"))
    speculative_ngram_max_bfs_breadth: int | None = option(
        None, "--speculative-ngram-max-bfs-breadth", engine="speculative_ngram_max_bfs_breadth", type=int,
        help=lambda: tr("branches per draft node when only the shortest window matches (default 10)"))
    speculative_ngram_branch_length: int | None = option(
        None, "--speculative-ngram-branch-length", engine="speculative_ngram_branch_length", type=int,
        help=lambda: tr("how many tokens after a window the n-gram tree keeps (default 18)"))
    speculative_ngram_capacity: int | None = option(
        None, "--speculative-ngram-capacity", engine="speculative_ngram_capacity", type=int,
        help=lambda: tr("the most nodes the n-gram tree keeps before it forgets the oldest (default 1000000)"))
    speculative_draft_layers: int | None = option(
        None, "--speculative-draft-layers", engine="speculative_draft_layers", type=int,
        help=lambda: tr("EARLY_EXIT: how many of the model's first layers draft, from 1 to one less than its layers "
                        "(default: half of them)"))

    # 只量化权重（第 5.4 章）：加载后量化，名字照 torchao / SGLang 的写法；--torchao-config 是 SGLang 的同一件事
    # en: weight-only quantization (chapter 5.4): quantized after loading, named as torchao / SGLang write it;
    # en: --torchao-config is SGLang's flag for the same thing
    quantization: str | None = option(
        None, "--quantization", "--torchao-config", engine="quantization", type=str.lower,
        help=lambda: tr("weight-only quantization after loading: int8wo (int8, one scale per output channel) or "
                        "int4wo-G (int4 in groups of G input columns, G a multiple of 32, e.g. int4wo-128)"))

    def scheduler_kwargs(self) -> dict[str, Any]:
        """交给调度器（``LLM(model_path, **kw)``）的关键字参数：声明了 ``engine`` 的设置里设置了的那些；
        ``--max-total-tokens`` 折成页数。

        en: Keyword arguments for the scheduler (``LLM(model_path, **kw)``): the settings that declare an ``engine``
        keyword and are set; ``--max-total-tokens`` becomes a number of pages.
        """
        kwargs = {f.metadata["engine"]: getattr(self, f.name) for f in fields(self)
                  if f.metadata["engine"] is not None and getattr(self, f.name) not in (None, f.metadata["unset"])}
        if self.num_pages is None and self.max_total_tokens is not None:
            kwargs["num_page_override"] = self.max_total_tokens // self.page_size
        return kwargs

    def flags(self, leave_out: tuple[str, ...] = ()) -> list[str]:
        """把设置写回命令行参数（每个用它的第一个名字）：只写与缺省值不同的，``leave_out`` 里的字段不写。

        en: Write the settings back as command-line flags (each by its first name): only those that differ from the
        defaults, leaving out the fields in ``leave_out``.
        """
        out: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in leave_out and value is not None and value != f.default:
                out += [f.metadata["flags"][0], str(value)]
        return out

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def add_options(p: argparse.ArgumentParser, names: list[str], **changes: dict[str, Any]) -> None:
    """把 :class:`ServerArgs` 里 ``names`` 这几个设置的命令行参数加到 ``p`` 上（``changes``：字段 → 改掉的 argparse 参数，
    例如另一个缺省值）。

    en: Add the command-line flags of the :class:`ServerArgs` settings ``names`` to ``p`` (``changes``: field → the
    argparse arguments to change, e.g. another default).
    """
    declared = {f.name: f for f in fields(ServerArgs)}
    for name in names:
        meta = declared[name].metadata
        parse = {"default": declared[name].default, "help": meta["help"](), **meta["parse"], **changes.get(name, {})}
        if parse["default"] is MISSING:
            del parse["default"]
        p.add_argument(*meta["flags"], dest=name, **parse)


def build_parser() -> argparse.ArgumentParser:
    """命令行参数：:class:`ServerArgs` 的每个设置，外加 vLLM 的 ``--enable-expert-parallel``。

    en: The command-line flags: every setting of :class:`ServerArgs`, plus vLLM's ``--enable-expert-parallel``.
    """
    p = argparse.ArgumentParser(prog="python -m minisgl", description=tr("Serve a model over an OpenAI-compatible HTTP API"))
    add_options(p, ServerArgs.field_names())
    p.add_argument("--enable-expert-parallel", action="store_true",
                   help=tr("vLLM's name: expert parallelism over all --tp ranks (the same as --ep equal to --tp)"))
    return p


#: 路由器的设置（``--router-*``，SGLang 路由器的名字加上 ``router-``）；``python -m minisgl.server.dp_router`` 也用它们。
#: en: The router's settings (``--router-*``, SGLang's router names with ``router-`` in front);
#: en: ``python -m minisgl.server.dp_router`` uses them too.
ROUTER_OPTIONS = [name for name in ServerArgs.field_names() if name.startswith("router_")]


def policy_thresholds(args: Any) -> dict[str, float]:
    """命令行里给了的缓存感知门槛，按第 4.6 章 ``CacheAware`` 的参数名。

    en: The cache-aware thresholds given on the command line, by the parameter names of chapter 4.6's ``CacheAware``.
    """
    names = {"router_cache_threshold": "cache_threshold", "router_balance_abs_threshold": "balance_abs_threshold",
             "router_balance_rel_threshold": "balance_rel_threshold"}
    return {kw: getattr(args, name) for name, kw in names.items() if getattr(args, name, None) is not None}


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    """命令行 → :class:`ServerArgs`；写错了就像 argparse 一样打印用法并退出（状态 2）。

    en: Command line → :class:`ServerArgs`; a mistake prints the usage and exits (status 2), as argparse does.
    """
    parser = build_parser()
    ns = parser.parse_args(argv)
    values = vars(ns)
    if values["dtype"] == "auto":
        values["dtype"] = None
    if values["num_pages"] is not None and values["max_total_tokens"] is not None:
        parser.error(tr("give --num-pages or --max-total-tokens, not both"))
    if values["max_total_tokens"] is not None and values["max_total_tokens"] < max(values["page_size"], 1):
        parser.error(tr("--max-total-tokens must be at least the page size ({page_size})", page_size=values["page_size"]))
    # --ep N 单独给出时就是 N 个秩；--enable-expert-parallel 是在全部 --tp 个秩上做专家并行
    # en: --ep N alone means N ranks; --enable-expert-parallel is expert parallelism over all --tp ranks
    ep = values["ep_size"]
    if values["tp_size"] is None:
        values["tp_size"] = ep or 1
    if values.pop("enable_expert_parallel") and ep is None:
        ep = values["tp_size"]
    values["ep_size"] = ep or 1
    # --dp 的规则先说：--dp 2 --nnodes 2 违反的是它，而不是 --tp 在节点间的切分
    # en: the --dp rule first: --dp 2 --nnodes 2 breaks that one, not how --tp splits over the nodes
    for problem in dp_problems(values["dp_size"], values["nnodes"], values["dist_init_addr"]):
        parser.error(problem)
    # 路由器只在 --dp N 的副本前面才有：没有它时给了路由器参数，说出来，而不是悄悄不管
    # en: a router exists only in front of --dp N replicas: router flags without it are refused, not silently ignored
    router_flags = ["--" + name.replace("_", "-") for name, value in values.items()
                    if name.startswith("router_") and value is not None]
    if values["dp_size"] == 1 and router_flags:
        parser.error(tr("{flags}: the router deals requests out to --dp replicas, and without --dp N (N > 1) there is "
                        "none; add --dp N or leave the router flags out", flags=", ".join(router_flags)))
    values["router_policy"] = values["router_policy"] or ROUTER_POLICIES[0]
    for problem in tp_problems(values["tp_size"], values["nnodes"], values["node_rank"], values["dist_init_addr"]):
        parser.error(problem)
    if not values["dist_timeout"] > 0:
        parser.error(tr("--dist-timeout must be a positive number of seconds, got {value}", value=values["dist_timeout"]))
    for problem in speculative_problems(values):
        parser.error(problem)
    if values["quantization"] is not None:
        from minisgl.validation import parse_quantization

        try:
            parse_quantization(values["quantization"])
        except ValueError as e:
            parser.error(str(e))
    if values["ep_size"] not in (1, values["tp_size"]):
        parser.error(tr("--ep {ep} must be 1 or equal to --tp {tp} (the experts are spread over the same ranks)",
                        ep=values["ep_size"], tp=values["tp_size"]))
    return ServerArgs(**values)


def speculative_problems(values: dict[str, Any]) -> list[str]:
    """投机解码的参数里说不通的地方：数值参数没有 ``--speculative-algorithm`` 就不起作用（说出来，不悄悄不管）；数值本身
    由调度器的配置检查（与离线的 ``LLM`` 同一个函数），在起任何进程之前。

    en: What does not add up in the speculative-decoding flags: the numeric flags do nothing without
    ``--speculative-algorithm`` (said, not silently ignored); the values themselves are checked by the scheduler's
    configuration check (the same function as the offline ``LLM``), before any process starts.
    """
    given = {name: value for name, value in values.items() if name.startswith("speculative_") and value is not None}
    if not given:
        return []
    algorithm = str(given.get("speculative_algorithm")).upper()
    if "speculative_draft_layers" in given and algorithm != "EARLY_EXIT":
        return [tr("--speculative-draft-layers sets how deep EARLY_EXIT drafts; add --speculative-algorithm EARLY_EXIT "
                   "or leave it out")]
    ngram = ["--" + name.replace("_", "-") for name in given if name.startswith("speculative_ngram_")]
    if ngram and algorithm == "EARLY_EXIT":
        return [tr("{flags}: these set up the n-gram drafter, which EARLY_EXIT does not use", flags=", ".join(ngram))]
    if "speculative_algorithm" not in given:
        return [tr("{flags}: these set up speculative decoding, which is off without --speculative-algorithm NGRAM",
                   flags=", ".join("--" + name.replace("_", "-") for name in given))]
    if algorithm == "EARLY_EXIT" and values["tp_size"] > 1:
        return [tr("EARLY_EXIT drafts on one rank only (the model here is split over {tp})", tp=values["tp_size"])]
    from minisgl.scheduling import SchedulerConfig
    from minisgl.validation import check_speculative

    try:
        check_speculative(SchedulerConfig(model_path=values["model_path"], **given))
    except ValueError as e:
        return [str(e)]
    return []


def dp_problems(dp_size: int, nnodes: int, dist_init_addr: str | None) -> list[str]:
    """数据并行的参数里说不通的地方：副本数至少 1；每个副本自己在本机挑集合点，所以不与多节点、``--dist-init-addr`` 同用
    （别的机器上的副本各自启动，再用 ``python -m minisgl.server.dp_router --worker-urls`` 接起来）。

    en: What does not add up in the data-parallel flags: at least one replica; each replica picks its own rendezvous on
    this machine, so not with several nodes or ``--dist-init-addr`` (start the replicas on other machines on their own,
    then join them with ``python -m minisgl.server.dp_router --worker-urls``).
    """
    problems = []
    if dp_size < 1:
        problems.append(tr("--dp must be at least 1, got {dp}", dp=dp_size))
    if dp_size > 1 and (nnodes > 1 or dist_init_addr is not None):
        problems.append(tr("--dp {dp} starts its replicas on this machine, so it cannot go with --nnodes or "
                           "--dist-init-addr; start the replicas on each machine and join them with "
                           "python -m minisgl.server.dp_router --worker-urls URL ...", dp=dp_size))
    return problems


def tp_problems(tp_size: int, nnodes: int, node_rank: int, dist_init_addr: str | None) -> list[str]:
    """张量并行与多节点参数里说不通的地方，一条一句。

    en: What does not add up in the tensor-parallel and multi-node flags, one sentence each.
    """
    problems = []
    if tp_size < 1 or nnodes < 1:
        problems.append(tr("--tp and --nnodes must be at least 1, got {tp} and {nnodes}", tp=tp_size, nnodes=nnodes))
    elif tp_size % nnodes:
        problems.append(tr("--tp {tp} does not split evenly over --nnodes {nnodes}", tp=tp_size, nnodes=nnodes))
    if not 0 <= node_rank < max(nnodes, 1):
        problems.append(tr("--node-rank must be in 0..{last}, got {rank}", last=max(nnodes, 1) - 1, rank=node_rank))
    if nnodes > 1 and dist_init_addr is None:
        problems.append(tr("--nnodes {nnodes} needs --dist-init-addr HOST:PORT (node 0's address, the same in every launch)",
                           nnodes=nnodes))
    if dist_init_addr is not None:
        host, _, port = dist_init_addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            problems.append(tr("--dist-init-addr must be HOST:PORT, got {addr!r}", addr=dist_init_addr))
        elif ":" in host or host.startswith("["):  # 集合点的套接字是 IPv4 的 | en: the rendezvous socket is IPv4
            problems.append(tr("--dist-init-addr {addr!r}: the rendezvous takes an IPv4 address or a host name, not IPv6; "
                               "on one machine use 127.0.0.1:{port}", addr=dist_init_addr, port=port))
    return problems


def check_model_dir(model_path: str) -> str | None:
    """启动前查模型目录：不是含 config.json 的目录就返回一行说明（不去模型仓库下载，也不打印调用栈）。

    en: Check the model folder before starting: return a one-line explanation unless it is a folder with a config.json
    (nothing is downloaded from the model hub, no traceback is printed).
    """
    path = Path(model_path)
    if not path.is_dir():
        return tr("the model folder {path} does not exist (--model takes a local folder; this server never downloads)", path=model_path)
    if not (path / "config.json").is_file():
        return tr("{path} has no config.json: is it a Hugging Face model folder?", path=model_path)
    return None


def port_problem(host: str, port: int, error: OSError) -> str:
    return tr("cannot listen on {host}:{port} ({error}); is another server using it? Choose another with --port",
              host=host, port=port, error=error.strerror or error)


def check_port(host: str, port: int) -> str | None:
    """试着绑定（并马上放开）``host:port``：绑不上就返回一行说明。端口 0 总能绑上。

    en: Try to bind (and at once release) ``host:port``: return a one-line explanation if that fails. Port 0 always
    binds.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(1)
    except OSError as e:
        return port_problem(host, port, e)
    return None


def offline_hub() -> None:
    """只用本地文件：之后起的工作进程继承这两个环境变量，找不到文件时不会去模型仓库反复重试。

    en: Local files only: the workers started afterwards inherit these two variables, so a missing file never retries
    the model hub.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def preflight(argv: list[str]) -> str | None:
    """``python -m minisgl`` 在导入任何重的东西（torch、模型）之前做的检查：模型目录和端口；几秒内出结果。
    有问题返回一行说明；命令行本身有错（或 ``--help``）留给完整的解析器去说。

    en: The checks ``python -m minisgl`` makes before importing anything heavy (torch, the model): the model folder and
    the port, within seconds. Returns a one-line explanation on a problem; mistakes in the command line itself (or
    ``--help``) are left to the full parser.
    """
    parser = argparse.ArgumentParser(add_help=False)
    add_options(parser, ["model_path", "host", "port"], model_path={"required": False, "default": None})
    parser.add_argument("-h", "--help", action="store_true")
    try:
        ns, _ = parser.parse_known_args(argv)
    except SystemExit:
        return None
    if ns.help or ns.model_path is None:
        return None
    return check_model_dir(ns.model_path) or check_port(ns.host, ns.port)


@dataclass
class ServerAddrs:
    """三个进程各自绑定一个 PULL 套接字，别人往里 PUSH。

    - ``tokenizer``：分词 / 反分词进程收信（API 服务器送来新请求和取消，调度器送来每一步的 token）；
    - ``backend``：调度器收信（分好词的请求、取消、退出）；
    - ``frontend``：API 服务器收信（文本片段、调度器的现状）。

    en: Each of the three processes binds one PULL socket that the others PUSH to.

    - ``tokenizer``: the tokenizer / detokenizer's inbox (new requests and aborts from the API server, each step's tokens
      from the scheduler);
    - ``backend``: the scheduler's inbox (tokenized requests, aborts, exit);
    - ``frontend``: the API server's inbox (pieces of text, the scheduler's state).
    """

    tokenizer: str
    backend: str
    frontend: str

    @classmethod
    def in_dir(cls, ipc_dir: str) -> ServerAddrs:
        return cls(*(ipc_addr(ipc_dir, name) for name in ("tok", "backend", "frontend")))


def make_ipc_dir() -> str:
    """给一次服务的全部套接字建一个很短的私有临时目录（``/tmp/msgl-xxxx``）；建它的进程退出时删掉。

    en: Make one short private temporary directory (``/tmp/msgl-xxxx``) for all the sockets of one service; it is removed
    when the process that made it exits.
    """
    ipc_dir = tempfile.mkdtemp(prefix="msgl-", dir="/tmp" if os.path.isdir("/tmp") else None)
    atexit.register(shutil.rmtree, ipc_dir, ignore_errors=True)
    return ipc_dir


def ipc_addr(ipc_dir: str, name: str) -> str:
    """``ipc://<目录>/<名字>``；路径超过 Linux 的上限就明确报错，而不是让 ZMQ 报一句看不懂的“文件名太长”。

    en: ``ipc://<dir>/<name>``; a path over the Linux limit is a clear error instead of ZMQ's puzzling "file name too
    long".
    """
    path = os.path.join(ipc_dir, name)
    if len(path.encode()) > MAX_IPC_PATH:
        raise ValueError(tr("The ipc socket path {path!r} is {n} bytes, over the Linux limit of {limit}: use a shorter directory",
                            path=path, n=len(path.encode()), limit=MAX_IPC_PATH))
    return f"ipc://{path}"


def set_process_name(name: str) -> None:
    """给本进程起个名字（Linux 的 ``comm``，最多 15 个字节），``ps``、``top`` 里一眼就能认出谁是谁；别处什么也不做。

    en: Name this process (Linux's ``comm``, at most 15 bytes), so ``ps`` and ``top`` show at a glance which is which;
    a no-op elsewhere.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # 15 = PR_SET_NAME
