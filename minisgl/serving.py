"""第 3 阶段共用的、不属于某一章的小东西：服务的设置（命令行参数）和各进程之间的 ipc 地址。

en: Small shared pieces of stage 3 that belong to no chapter: the service's settings (command-line flags) and the ipc
addresses between its processes.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from minisgl.i18n import tr

#: Linux 上 Unix 域套接字路径的上限（``sun_path`` 108 字节，含结尾的 0）。
#: en: The limit on a Unix domain socket path on Linux (``sun_path`` is 108 bytes, including the final 0).
MAX_IPC_PATH = 107
#: 启动器就绪时打印的地址（不论哪种语言，这一段都一样）。
#: en: The address the launcher prints once it is ready (the same in every language).
LISTENING = re.compile(r"http://127\.0\.0\.1:\d+")
#: 上游 mini-sglang 的缺省端口。
#: en: Upstream mini-sglang's default port.
DEFAULT_PORT = 1919


@dataclass
class ServerArgs:
    """``python -m minisgl`` 的设置；名字与上游的命令行参数一致（``--max-running-req`` → ``max_running_req``）。

    en: The settings of ``python -m minisgl``; names follow upstream's flags (``--max-running-req`` →
    ``max_running_req``).
    """

    model_path: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    model_name: str | None = None  # /v1/models 里的名字；缺省为模型目录名 | en: the name in /v1/models; default: the model folder's name
    dtype: str | None = None
    device: str = "auto"
    max_running_req: int = 8
    cache_type: str | None = None  # None：最后一章支持的第一种（radix）| en: None: the first kind the final chapter supports (radix)
    page_size: int = 1
    max_extend_tokens: int | None = None
    num_pages: int | None = None
    # KV 池的 token 数（SGLang 的 --max-total-tokens）：页数 = 它 // page_size；与 num_pages 二选一
    # en: the KV pool's size in tokens (SGLang's --max-total-tokens): pages = it // page_size; num_pages or this, not both
    max_total_tokens: int | None = None
    max_seq_len: int | None = None
    memory_ratio: float | None = None

    def scheduler_kwargs(self) -> dict[str, Any]:
        """交给调度器（``LLM(model_path, **kw)``）的关键字参数：只给设置了的那些。

        en: Keyword arguments for the scheduler (``LLM(model_path, **kw)``): only those that are set.
        """
        names = {"dtype": "dtype", "device": "device", "max_running_req": "max_running_req", "cache_type": "cache_type",
                 "page_size": "page_size", "max_extend_tokens": "max_extend_tokens", "num_pages": "num_page_override",
                 "max_seq_len": "max_seq_len_override", "memory_ratio": "memory_ratio"}
        kwargs = {kw: getattr(self, name) for name, kw in names.items() if getattr(self, name) is not None}
        if self.num_pages is None and self.max_total_tokens is not None:
            kwargs["num_page_override"] = self.max_total_tokens // self.page_size
        return kwargs

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


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
    parser.add_argument("--model", "--model-path", dest="model_path")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
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


def child_pids(pid: int) -> list[int]:
    """``pid`` 的全部后代进程（读 /proc，不依赖 psutil）：检查“关掉服务后没有留下子进程”用。

    en: Every descendant of ``pid`` (read from /proc, no psutil): used to check that no child is left after shutdown.
    """
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields_ = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields_[0] != "Z":  # 僵尸进程已经退出，只差被回收 | en: a zombie has exited, it only awaits reaping
            parents[int(stat.parent.name)] = int(fields_[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        frontier += kids
    return found


class ServerProcess:
    """在子进程里启动 ``python -m minisgl``（端口由系统挑），等它就绪，用完关掉并确认没有留下任何子进程。
    示例、笔记本和检查都用它，启动与关闭的规矩只写一次。

    en: Start ``python -m minisgl`` in a child process (the OS picks the port), wait until it is ready, and when done
    stop it and make sure no child process is left. Examples, notebooks and checks all use it, so starting and stopping
    are written once.
    """

    def __init__(self, model: str | Path, *flags: str, env: dict[str, str] | None = None, timeout: float = 300.0) -> None:
        self.command = [sys.executable, "-m", "minisgl", "--model", str(model), "--host", "127.0.0.1", "--port", "0", *flags]
        self.env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.timeout = timeout
        self.url = ""
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self.children: list[int] = []  # 就绪时记下的子孙进程 | en: the descendants noted when ready
        self.left_behind: list[int] = []

    @property
    def output(self) -> str:
        return "".join(self.lines[-80:])

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """启动并等到 ``/health`` 回 200；起不来就整组杀掉、抛 RuntimeError（带上服务的输出）。

        en: Start and wait until ``/health`` answers 200; if it does not come up, kill the whole group and raise
        RuntimeError (with the service's output).
        """
        self.proc = subprocess.Popen(self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, encoding="utf-8", errors="replace",
                                     start_new_session=True)
        found = threading.Event()
        threading.Thread(target=self._pump, args=(found,), daemon=True).start()
        deadline = time.monotonic() + self.timeout
        while not found.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(tr("The server did not start within {timeout:.0f} s; its output:\n{output}",
                                      timeout=self.timeout, output=self.output))
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(tr("The server never answered /health; its output:\n{output}", output=self.output))
            time.sleep(0.1)
        self.children = child_pids(self.proc.pid)

    def _pump(self, found: threading.Event) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if not found.is_set() and (m := LISTENING.search(line)) is not None:
                self.url = m.group(0)
                found.set()

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def metrics(self) -> dict[str, float]:
        """``/metrics``（Prometheus 文本格式）→ ``{名字{标签}: 值}``。

        en: ``/metrics`` (Prometheus text format) → ``{name{labels}: value}``.
        """
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def kill(self) -> None:
        """最后的手段：整个进程组 SIGKILL，连同记下的子孙进程（出错时也不留下进程）。

        en: The last resort: SIGKILL the whole process group and the descendants noted (no process is left even on an
        error).
        """
        if self.proc is None:
            return
        pids = {self.proc.pid, *self.children, *child_pids(self.proc.pid)}
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60.0) -> int | None:
        """发 ``sig``（缺省 Ctrl-C 那个 SIGINT），等它和它的子孙进程退出；超时就整组杀掉。返回退出码（被杀时为负），
        没退出的子孙进程记在 ``left_behind``。

        en: Send ``sig`` (SIGINT, Ctrl-C's, by default) and wait for it and its descendants to exit; kill the group on
        timeout. Returns the exit code (negative when killed); descendants that did not exit go to ``left_behind``.
        """
        if self.proc is None:
            return None
        pids = set(self.children) | set(child_pids(self.proc.pid))
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        # 子进程在父进程退出后才收尾（例如 multiprocessing 的 resource_tracker）
        # en: children wind down after the parent exits (e.g. multiprocessing's resource_tracker)
        deadline = time.monotonic() + timeout
        while (alive := sorted(p for p in pids if _alive(p))) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.left_behind = alive
        return self.proc.returncode


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def set_process_name(name: str) -> None:
    """给本进程起个名字（Linux 的 ``comm``，最多 15 个字节），``ps``、``top`` 里一眼就能认出谁是谁；别处什么也不做。

    en: Name this process (Linux's ``comm``, at most 15 bytes), so ``ps`` and ``top`` show at a glance which is which;
    a no-op elsewhere.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # 15 = PR_SET_NAME
