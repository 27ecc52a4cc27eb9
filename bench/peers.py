"""同一次运行里测的几家服务器：我们的（``python -m minisgl``）、``transformers serve`` 和 llama-cpp-python 的服务器
（同一份权重的 F32 GGUF，由 :mod:`bench.llamacpp` 生成），各自确切的启动命令、问法和设置，以及变体与消融；一家一家地
起、预热、测量、关掉，确认没有留下子进程。

en: The servers measured in one run: ours (``python -m minisgl``), ``transformers serve`` and llama-cpp-python's server
(on the same weights as an F32 GGUF, made by :mod:`bench.llamacpp`), each with its exact start command, request form
and settings, plus variants and ablations; each is started, warmed up, measured and stopped in turn, making sure no
child process is left.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shlex
import signal
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import openai

from bench.client import Options, RequestForm, RunResult, measure
from bench.llamacpp import weights_gguf
from bench.workload import Run, Vocab
from minisgl.processes.harness import ServerProcess
from minisgl.i18n import tr
from minisgl.model_zoo import models_dir

#: 能一起测的服务器；第一个是我们的，比值都是“我们 / 对方”。
#: en: The servers that can be measured together; the first is ours, and every ratio is "ours / the peer".
PEERS = ("minisgl", "transformers", "llamacpp")
OURS = PEERS[0]
LLAMACPP_INSTALL = "pip install 'llama-cpp-python[server]'"
#: 起不来的服务器在报告里留下它最后多少行输出。
#: en: How many last lines of its output a server that did not come up leaves in the report.
OUTPUT_TAIL = 40
#: ``transformers serve`` 连续批处理的 KV 缓存：CPU 上不给块数它会按“空闲设备内存的九成”去分（这里是几十 GB），
#: 所以写死：32 块 × 每块 256 个 token（``page_size`` 的缺省值）= 8192 个 token 的位置，fp32 的 SmolLM2 约 0.4 GB，
#: 缺省负载（8 个并发、提示词 ≤ 256、输出 ≤ 128）装得下；一批最多 2048 个 token，够 8 个最长的提示词一起预填充。
#: en: The KV cache of ``transformers serve``'s continuous batching: without a block count it sizes itself to 90% of
#: the free device memory (tens of GB on this CPU), so it is fixed here: 32 blocks × 256 tokens each (``page_size``'s
#: default) = room for 8192 tokens, about 0.4 GB for fp32 SmolLM2, enough for the default load (8 concurrent, prompts
#: ≤ 256, outputs ≤ 128); at most 2048 tokens a batch, enough to prefill 8 of the longest prompts together.
TRANSFORMERS_CB = {"--cb-num-blocks": "32", "--cb-max-batch-tokens": "2048"}
#: llama.cpp 的上下文长度（提示词 + 输出，缺省负载最多 384）。
#: en: llama.cpp's context length (prompt + output: at most 384 in the default load).
LLAMACPP_N_CTX = 2048


def free_port() -> int:
    """让系统在 127.0.0.1 上挑一个空闲端口（绑上、读出端口号、关掉）。

    en: Let the OS pick a free port on 127.0.0.1 (bind, read the port, close).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PeerProcess(ServerProcess):
    """别家的服务器：端口事先挑好，就绪看 ``ready_path`` 回不回 200；启动、整组杀掉、查留下的子进程都沿用
    :class:`~minisgl.processes.harness.ServerProcess`。关的时候先给整个进程组发 SIGTERM，等不到再整组 SIGKILL。

    en: A peer's server: the port is picked beforehand, and it is ready once ``ready_path`` answers 200; starting,
    killing the whole group and finding what was left behind all come from :class:`~minisgl.processes.harness.ServerProcess`.
    Stopping sends SIGTERM to the whole process group first, then SIGKILL to the group when it does not exit in time.
    """

    def __init__(self, command: list[str], port: int, ready_path: str, timeout: float,
                 env: dict[str, str] | None = None) -> None:
        super().__init__("", env=env, timeout=timeout)
        self.command = list(command)
        self.url = f"http://127.0.0.1:{port}"
        self.ready_path = ready_path
        self.drained = threading.Event()  # 输出读到了头 | en: the output was read to its end

    def _pump(self, found: threading.Event) -> None:
        found.set()  # 地址事先就知道，不用从输出里找 | en: the address is known beforehand, not read from the output
        try:
            super()._pump(found)
        finally:
            self.drained.set()

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}{self.ready_path}", timeout=5) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
        return super().stop(sig, timeout)


@dataclass
class Peer:
    """一家要测的服务器：名字、确切的启动命令、端口（None 是我们的服务器：端口由系统挑，它自己打印地址）、就绪的路径、
    怎样问它（:class:`RequestForm`）、写进报告的设置；``absent`` 是它在这台机器上用不了的原因（带安装命令），
    ``url`` 是已经在跑的服务（``--url``：不启动也不关），``prepare`` 在启动前做的准备（例如生成 GGUF）；``env`` 加进它的
    环境变量；``counters``：它有我们的 ``/metrics``（算了多少预填充 token、前缀缓存命中多少），每次运行前后各读一次。

    en: One server to measure: its name, the exact command that starts it, its port (None for ours: the OS picks the
    port and the server prints its address), the readiness path, how to ask it (:class:`RequestForm`), the settings
    that go into the report; ``absent`` is why it cannot run on this machine (with the install command), ``url`` an
    already running service (``--url``: neither started nor stopped), ``prepare`` what to do before starting it (e.g.
    make a GGUF); ``env`` is added to its environment; ``counters``: it serves our ``/metrics`` (prefill tokens
    computed, prefix-cache hits), read before and after every run.
    """

    name: str
    command: list[str] = field(default_factory=list)
    port: int | None = None
    ready_path: str = "/health"
    form: RequestForm = field(default_factory=RequestForm)
    settings: dict[str, Any] = field(default_factory=dict)
    absent: str | None = None
    url: str | None = None
    prepare: Callable[[], object] | None = None
    env: dict[str, str] = field(default_factory=dict)
    counters: bool = False

    def process(self, timeout: float) -> ServerProcess:
        """启动、停止它的进程对象（还没启动）。

        en: The process object that starts and stops it (not started yet).
        """
        if self.port is None:
            proc = ServerProcess("", env=self.env, timeout=timeout)
            proc.command = list(self.command)
            return proc
        return PeerProcess(self.command, self.port, self.ready_path, timeout, env=self.env)


def minisgl_peer(model: str | Path, flags: Sequence[str]) -> Peer:
    """我们的服务器：和以前一样用 ``ServerProcess``，不认识的参数都给它。

    en: Our server: ``ServerProcess`` as before, with every unknown flag.
    """
    from importlib.metadata import version

    settings = {"version": f"{version('handwritten-minisgl')}, torch {version('torch')}", "flags": list(flags)}
    return Peer(OURS, ServerProcess(model, *flags).command, settings=settings, counters=True)


def transformers_command(model: str | Path, port: int) -> list[str]:
    """``transformers serve``（就是 ``transformers`` 命令的入口，用同一个 Python）：连续批处理，CPU，fp32，
    预载这个模型，只绑 127.0.0.1。

    en: ``transformers serve`` (the ``transformers`` command's entry point, with the same Python): continuous
    batching, CPU, fp32, this model preloaded, bound to 127.0.0.1 only.
    """
    cb = [x for kv in TRANSFORMERS_CB.items() for x in kv]
    return [sys.executable, "-m", "transformers.cli.transformers", "serve", "--continuous-batching",
            "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32", *cb,
            "--log-level", "warning", str(model)]


def transformers_peer(model: str | Path, port: int | None = None) -> Peer:
    """``transformers serve`` 作对照。它的 ``/v1/completions`` 只收字符串提示词（id 列表回 400），不认识的字段一律
    回 422（``ignore_eos`` 也是）；别提前停的等价写法是它认的 ``generation_config`` 字段（一段 JSON）里
    ``eos_token_id = -1``：连续批处理把 −1 当作“没有结束 token”，按请求生效。流的最后一段总带 ``usage``。

    en: ``transformers serve`` as a peer. Its ``/v1/completions`` takes string prompts only (a list of ids gets 400)
    and answers 422 to any field it does not know (``ignore_eos`` included); the equivalent of not stopping early is
    ``eos_token_id = -1`` in the ``generation_config`` field it does know (a JSON string): continuous batching reads
    −1 as "no end token", per request. The stream's last chunk always carries ``usage``.
    """
    import transformers

    port = port or free_port()
    form = RequestForm(text_prompt=True, no_stop={"generation_config": json.dumps({"eos_token_id": -1})})
    settings = {"version": transformers.__version__, "continuous_batching": True, "device": "cpu", "dtype": "float32",
                **{k.lstrip("-").replace("-", "_"): int(v) for k, v in TRANSFORMERS_CB.items()},
                "threads": os.cpu_count(), "prompt": "text", "no_stop": form.no_stop}
    return Peer("transformers", transformers_command(model, port), port, form=form, settings=settings)


def llamacpp_installed() -> bool:
    """装没装 llama-cpp-python（只找模块，不导入）。

    en: Whether llama-cpp-python is installed (the module is looked up, not imported).
    """
    return importlib.util.find_spec("llama_cpp") is not None


def llamacpp_gguf(model: str | Path) -> Path:
    """``bench/llamacpp.py`` 给这个模型做的 F32 GGUF 放在哪儿（``models/.cache/gguf/<名字>.F32.gguf``）。

    en: Where ``bench/llamacpp.py`` puts this model's F32 GGUF (``models/.cache/gguf/<name>.F32.gguf``).
    """
    return models_dir() / ".cache" / "gguf" / f"{Path(model).name}.F32.gguf"


def llamacpp_command(gguf: str | Path, port: int, threads: int) -> list[str]:
    """llama-cpp-python 的 OpenAI 兼容服务器。它的设置是 pydantic 字段，命令行参数就是字段名（下划线）：

    - ``n_ctx``：上下文长度，见 :data:`LLAMACPP_N_CTX`；``n_batch`` 512：一次喂进去的提示词 token 数（缺省值）；
    - ``n_threads`` 和 ``n_threads_batch`` 都是 ``threads``（核数）：缺省分别是核数的一半和全部，和另两家一样用满核；
    - ``interrupt_requests false``：缺省为真时，新请求一到就打断正在流式输出的那个，并发负载下全是失败；
    - ``logits_all false``：缺省为真时预填充要给每个提示词位置都算整张词表的 logits，我们不要 logprobs，白白多算。

    它没有 llama.cpp 自带服务器的 ``--parallel``：一个模型一把锁，请求一个接一个地算（这正是要测的）。

    en: llama-cpp-python's OpenAI-compatible server. Its settings are pydantic fields and the flags are the field names
    (with underscores):

    - ``n_ctx``: the context length, see :data:`LLAMACPP_N_CTX`; ``n_batch`` 512: prompt tokens fed at once (the default);
    - ``n_threads`` and ``n_threads_batch`` both ``threads`` (the cores): their defaults are half the cores and all of
      them; like the other two servers it uses every core;
    - ``interrupt_requests false``: when true (the default) a new request interrupts the one streaming, so a concurrent
      load would be all failures;
    - ``logits_all false``: when true (the default) prefill computes logits over the whole vocabulary at every prompt
      position; we want no logprobs, so that would be wasted work.

    It has no ``--parallel`` like llama.cpp's own server: one model, one lock, requests computed one after another
    (which is what is measured).
    """
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", str(LLAMACPP_N_CTX), "--n_batch", "512", "--n_threads", str(threads),
            "--n_threads_batch", str(threads), "--interrupt_requests", "false", "--logits_all", "false"]


def _make_f32_gguf(model: str | Path) -> Path:
    """要时用 ``bench/llamacpp.py`` 生成 F32 GGUF（只有 SmolLM2-135M-Instruct 有源 GGUF）。

    en: Make the F32 GGUF with ``bench/llamacpp.py`` when needed (only SmolLM2-135M-Instruct has a source GGUF).
    """
    gguf = llamacpp_gguf(model)
    if gguf.is_file():
        return gguf
    if Path(model).name != "SmolLM2-135M-Instruct":
        raise FileNotFoundError(tr("{path} is missing: bench/llamacpp.py makes the F32 GGUF of SmolLM2-135M-Instruct only",
                                   path=gguf))
    return weights_gguf("F32")


def llamacpp_peer(model: str | Path, port: int | None = None, threads: int | None = None) -> Peer:
    """llama-cpp-python 的服务器作对照，权重是同一份的 F32 GGUF。它的请求类型里提示词是字符串（或只含一个字符串的
    列表），所以发文字；没有 ``ignore_eos``，别提前停用它的 ``min_tokens = N``（只压住 ``token_eos()`` 这一个），
    再把全部特殊 token 的 logit 压下去（它遇到任何一个“生成结束”的 token 都会停）；它的服务器缺省 ``repeat_penalty``
    1.1，这里给 1.0，和另两家一样是纯贪心。它的流里没有 ``usage``：输出 token 数按流里的文字段数
    （见 :func:`bench.client.send_one`）。没装时返回的 ``Peer`` 带着 ``absent``（安装命令在里面）。

    en: llama-cpp-python's server as a peer, on the same weights as an F32 GGUF. Its request type has a string prompt
    (or a list holding one string), so it gets text; it has no ``ignore_eos``, so not stopping early uses its
    ``min_tokens = N`` (which holds back ``token_eos()`` alone) and pushes down every special token's logit (it stops at
    any end-of-generation token); its server defaults to ``repeat_penalty`` 1.1, so 1.0 is sent, plain greedy like the
    other two. Its stream carries no ``usage``: output tokens are counted as the stream's text chunks (see
    :func:`bench.client.send_one`). When it is not installed the ``Peer`` comes back with ``absent`` (holding the
    install command).
    """
    port = port or free_port()
    threads = threads or os.cpu_count() or 1
    gguf = llamacpp_gguf(model)
    form = RequestForm(text_prompt=True, extra={"repeat_penalty": 1.0}, no_stop={}, min_tokens=True, ban_special=True,
                       stream_usage=False)
    settings: dict[str, Any] = {"gguf": str(gguf), "n_ctx": LLAMACPP_N_CTX, "n_batch": 512, "threads": threads,
                                "interrupt_requests": False, "logits_all": False, "prompt": "text",
                                "no_stop": "min_tokens = max_tokens, logit_bias -100 on the special tokens",
                                "output_tokens": "streamed text chunks (no usage in its stream)"}
    peer = Peer("llamacpp", llamacpp_command(gguf, port, threads), port, ready_path="/v1/models", form=form,
                settings=settings)
    if not llamacpp_installed():
        peer.absent = tr("llama-cpp-python is not installed; install it with: {command} (it compiles llama.cpp: "
                         "about 7–8 minutes on a 2-core machine)", command=LLAMACPP_INSTALL)
        return peer
    from importlib.metadata import version

    settings["version"] = version("llama-cpp-python")
    peer.prepare = lambda: _make_f32_gguf(model)
    return peer


@dataclass(frozen=True)
class Variant:
    """一家服务器换了设置的变体：名字、基于哪一家（:data:`PEERS` 之一）、追加在它命令末尾的参数（后写的算数）、
    加进它环境变量的 ``(名字, 值)``。消融（关掉第二阶段的一样机制）和找各家最好的设置都用它。

    en: A server with changed settings: its name, which server it is based on (one of :data:`PEERS`), flags appended to
    that server's command (the last one written wins), and ``(name, value)`` pairs added to its environment. Ablations
    (one stage-2 mechanism turned off) and the search for each server's best settings both use it.
    """

    name: str
    base: str
    flags: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


#: 第二阶段各机制的消融，每个变体关掉一样：连续批处理（一个请求槽）、基数树前缀缓存（朴素缓存）、分块预填充
#: （一步能预填充的 token 数大到不再分块）、重叠调度（环境变量开关）。
#: en: Ablations of the stage-2 mechanisms, each variant turning one off: continuous batching (one request slot), the
#: radix prefix cache (the naive cache), chunked prefill (so many prefill tokens a step that nothing is chunked), and
#: overlap scheduling (its environment switch).
ABLATIONS: dict[str, Variant] = {
    "no-batching": Variant("minisgl-no-batching", OURS, ("--max-running-req", "1")),
    "naive-cache": Variant("minisgl-naive-cache", OURS, ("--cache-type", "naive")),
    "no-chunking": Variant("minisgl-no-chunking", OURS, ("--max-extend-tokens", "1000000")),
    "no-overlap": Variant("minisgl-no-overlap", OURS, env=(("MINISGL_DISABLE_OVERLAP_SCHEDULING", "1"),)),
}


#: 投机解码的变体（``--speculative``）：我们的服务器开着 n-gram 投机解码，别的设置不变。
#: en: The speculative variant (``--speculative``): our server with n-gram speculative decoding, nothing else changed.
SPECULATIVE = Variant("minisgl+ngram", OURS, ("--speculative-algorithm", "NGRAM"))


def build_peers(names: Sequence[str], model: str | Path, flags: Sequence[str],
                variants: Sequence[Variant] = ()) -> list[Peer]:
    """按 ``names`` 的顺序给每家服务器一个 :class:`Peer`（命令都用同一个模型目录），再给每个变体一个：基础那家的
    命令后面追加变体的参数（我们的服务器先带上 ``flags``），环境变量加进去，设置里记下它基于谁、改了什么。

    en: A :class:`Peer` for each server in the order of ``names`` (every command uses the same model folder), then one
    per variant: its base server's command with the variant's flags appended (ours with ``flags`` first), the
    environment added, and the settings noting what it is based on and what changed.
    """
    makers: dict[str, Callable[[], Peer]] = {
        "minisgl": lambda: minisgl_peer(model, flags),
        "transformers": lambda: transformers_peer(model),
        "llamacpp": lambda: llamacpp_peer(model),
    }
    peers = [makers[name]() for name in names]
    for v in variants:
        peer = makers[v.base]()
        peer.name, peer.env = v.name, dict(v.env)
        peer.command = [*peer.command, *v.flags]
        peer.settings = {**peer.settings, "variant_of": v.base, "extra_flags": list(v.flags), "env": dict(v.env)}
        peers.append(peer)
    return peers


@dataclass
class Outcome:
    """一家服务器的结果：``status`` 是 ``"ok"``、``"failed"``（起不来或不能用，``info`` 里有原因和输出的末尾）或
    ``"absent"``（没装）；``info`` 是写进报告的其余内容（命令、设置、就绪用时、地址、退出码、留下的进程……）。

    en: One server's outcome: ``status`` is ``"ok"``, ``"failed"`` (did not come up or was not usable; ``info`` holds
    why and the tail of its output) or ``"absent"`` (not installed); ``info`` is the rest of its report (command,
    settings, time to ready, address, exit code, processes left behind…).
    """

    peer: str
    status: str
    results: list[RunResult] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        runs = [{"name": r.run.name, "key": r.run.key, **asdict(r.run), "repeat": r.repeat, "summary": asdict(r.summary),
                 "counters": r.counters, "records": [asdict(x) for x in r.records]} for r in self.results]
        return {"name": self.peer, "status": self.status, **self.info, "runs": runs}


def run_peer(peer: Peer, runs: Sequence[Run], vocab: Vocab, opts: Options, args: argparse.Namespace) -> Outcome:
    """测一家服务器：没装就报出来；否则启动（记下就绪用时）、预热、测量、关掉，确认没有留下子进程。起不来、不能用都
    记成 ``failed``（带原因和它输出的末尾），不抛出：别的服务器照样测。

    en: Measure one server: report it when absent; otherwise start it (noting the time to ready), warm it up, measure,
    stop it and make sure no child process is left. Not coming up or not being usable is recorded as ``failed`` (with
    why and the tail of its output), never raised: the other servers are still measured.
    """
    info: dict[str, Any] = {"command": peer.command, "settings": peer.settings}
    if peer.absent is not None:
        print(tr("{name}: absent: {why}", name=peer.name, why=peer.absent))
        return Outcome(peer.name, "absent", info={**info, "error": peer.absent})
    server = None
    error: str | None = None
    results: list[RunResult] = []
    try:
        url = peer.url
        if url is None:
            if peer.prepare is not None:
                peer.prepare()
            server = peer.process(args.start_timeout)
            print(tr("Starting {name}: {command} …", name=peer.name, command=shlex.join(peer.command)))
            start = time.perf_counter()
            try:
                server.start()
            except RuntimeError:
                info["ready"] = False
                code = server.proc.returncode if server.proc is not None else None
                if code is not None and time.perf_counter() - start < args.start_timeout:
                    raise RuntimeError(tr("{name} exited with code {code} before it was ready", name=peer.name,
                                          code=code)) from None
                raise RuntimeError(tr("{name} did not become ready within {timeout:.0f} s", name=peer.name,
                                      timeout=args.start_timeout)) from None
            info.update(ready=True, start_s=time.perf_counter() - start)
            print(tr("{name} ready in {seconds:.1f} s at {url}", name=peer.name, seconds=info["start_s"], url=server.url))
            url = f"{server.url}/v1"
        info["url"] = url
        if peer.settings:
            print(tr("{name} settings: {settings}", name=peer.name, settings=json.dumps(peer.settings, ensure_ascii=False)))
        probe = server.metrics if peer.counters and server is not None else None
        name, results = asyncio.run(measure(url, runs, vocab, opts, form=peer.form, api_key=args.api_key,
                                            model=args.model_name, warmup=args.warmup, progress=not args.no_progress,
                                            label=peer.name, repeats=args.repeats, probe=probe))
        info["model"] = name
        print(tr("{name}: model {model} at {url}", name=peer.name, model=name, url=url))
    except (RuntimeError, OSError, openai.OpenAIError) as e:
        # 起不来、预热失败、列不出模型：这家不能用，接着测别家
        # en: did not come up, a failed warm-up, no model list: this one is not usable, go on with the others
        error = str(e)
    finally:
        if server is not None:
            info["exit_code"] = server.stop()
            info["left_behind"] = server.left_behind
            if server.left_behind:
                server.kill()
                print(tr("Processes left behind after the server stopped: {pids}", pids=server.left_behind))
    if error is not None:
        tail = output_tail(server) if server is not None else ""
        print(tr("{name}: failed: {why}", name=peer.name, why=error))
        if tail:
            print(tr("The last lines of its output:\n{tail}", tail=tail.rstrip()))
        return Outcome(peer.name, "failed", info={**info, "error": error, "output_tail": tail})
    return Outcome(peer.name, "ok", results, info)


def output_tail(server: ServerProcess) -> str:
    """服务器输出的最后 :data:`OUTPUT_TAIL` 行；进程已经退出时先等输出读完（最多 5 秒）。

    en: The last :data:`OUTPUT_TAIL` lines of the server's output; when the process has exited, wait for its output to
    be read to the end first (5 s at most).
    """
    if isinstance(server, PeerProcess) and server.proc is not None and server.proc.poll() is not None:
        server.drained.wait(5)
    return "".join(server.lines[-OUTPUT_TAIL:])
