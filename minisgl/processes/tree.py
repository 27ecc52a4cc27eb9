"""一棵进程树的启动、看守和收尾（给定）：``python -m minisgl`` 的启动器、``--dp`` 的副本、检查和示例里起的服务器
都用它，规矩只写一次。

- 子进程随父进程而去：``spawn`` 起的工作进程经 :func:`~minisgl.processes.lifeline.run_tethered`，subprocess 起的服务器经
  :data:`~minisgl.processes.lifeline.PARENT_ENV`（:mod:`minisgl.processes.lifeline`）；
- 服务器子进程（:class:`ServerProcess`）：端口由系统挑、只绑 127.0.0.1，等它打印地址、``/health`` 回 200；收尾时先发
  信号、等它有序退出，超时就整组杀掉，最后确认没有留下子孙进程；
- 本进程收到的第一个 SIGINT / SIGTERM 变成 KeyboardInterrupt（:func:`interrupt_on_signals`），关机有序进行。

en: Starting, watching and stopping a process tree (given): the launcher of ``python -m minisgl``, the ``--dp``
replicas and the servers of the checks and examples all use it, so the rules are written once.

- children go down with their parent: workers started by ``spawn`` through :func:`~minisgl.processes.lifeline.run_tethered`,
  servers started by subprocess through :data:`~minisgl.processes.lifeline.PARENT_ENV` (:mod:`minisgl.processes.lifeline`);
- a server child (:class:`ServerProcess`): the OS picks the port, it binds 127.0.0.1 only; wait until it prints its
  address and ``/health`` answers 200; to stop it, send a signal and wait while it exits in order, kill the group on
  timeout, and make sure no descendant is left;
- the first SIGINT / SIGTERM this process gets becomes a KeyboardInterrupt (:func:`interrupt_on_signals`), so the
  shutdown goes in order.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from minisgl.i18n import tr
from minisgl.processes.lifeline import PARENT_ENV

#: 启动器就绪时打印的地址（不论哪种语言，这一段都一样）。
#: en: The address the launcher prints once it is ready (the same in every language).
LISTENING = re.compile(r"http://127\.0\.0\.1:\d+")
#: 等两个工作进程报告就绪的最长时间（秒）；加载大模型可能要一会儿。
#: en: The longest wait (seconds) for both workers to report ready; loading a big model may take a while.
READY_TIMEOUT_S = 600.0
#: 工作进程死了之后，服务器还留多久（秒）对请求回 503，然后退出。
#: en: How long (seconds) the server keeps answering 503 after a worker died, before it exits.
DEAD_WORKER_GRACE_S = 3.0


def cpu_budget() -> int:
    """这次启动可用的核数：``OMP_NUM_THREADS`` 给了就是它（``--dp`` 的每个副本这样分到自己那一份），否则本进程能用的核。

    en: The cores this launch may use: ``OMP_NUM_THREADS`` when set (that is how each ``--dp`` replica gets its share),
    otherwise the cores this process may run on.
    """
    given = os.environ.get("OMP_NUM_THREADS", "")
    return int(given) if given.isdigit() and int(given) > 0 else len(os.sched_getaffinity(0))


def say_shutting_down() -> None:
    """打印“正在关闭”。标准输出若是通向一个已经死了的父进程的管道（随它而去的路上），打印会抛 BrokenPipeError：
    吞掉它，收尾要紧——否则工作进程没被叫停，退出时 multiprocessing 还要等它们，永远等下去。

    en: Print "Shutting down". If stdout is a pipe to a parent that died (on the way down with it), printing raises
    BrokenPipeError: swallow it, winding down matters more — otherwise the workers are never told to stop, and at exit
    multiprocessing waits for them forever.
    """
    with contextlib.suppress(OSError):
        print(tr("Shutting down ..."), flush=True)


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[threading.Event]:
    """在这段里，第一个 SIGINT / SIGTERM 变成 KeyboardInterrupt（之后的忽略：关机已在进行）；给出的事件记着是否收到过。

    en: Within this block the first SIGINT / SIGTERM becomes a KeyboardInterrupt (later ones are ignored: the shutdown is
    under way); the event given notes whether one came.
    """
    stop_requested = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if not stop_requested.is_set():
            stop_requested.set()
            raise KeyboardInterrupt

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop_requested
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


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
    ``--dp`` 的副本、示例、笔记本和检查都用它，启动与关闭的规矩只写一次。

    en: Start ``python -m minisgl`` in a child process (the OS picks the port), wait until it is ready, and when done
    stop it and make sure no child process is left. The ``--dp`` replicas, examples, notebooks and checks all use it, so
    starting and stopping are written once.
    """

    def __init__(self, model: str | Path, *flags: str, env: dict[str, str] | None = None, timeout: float = 300.0,
                 module: str = "minisgl") -> None:
        model_flags = ["--model", str(model)] if module == "minisgl" else []
        self.command = [sys.executable, "-m", module, *model_flags, "--host", "127.0.0.1", "--port", "0", *flags]
        self.env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.timeout = timeout
        self.url = ""
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self.found = threading.Event()  # 打印出了地址 | en: the address was printed
        self.children: list[int] = []  # 就绪时记下的子孙进程 | en: the descendants noted when ready
        self.left_behind: list[int] = []

    @classmethod
    def router(cls, urls: list[str], *flags: str, timeout: float = 120.0) -> ServerProcess:
        """单独起的路由器（``python -m minisgl.server.dp_router --worker-urls ...``），在已经在跑的副本前面。

        en: A router started alone (``python -m minisgl.server.dp_router --worker-urls ...``) in front of running replicas.
        """
        return cls("", "--worker-urls", *urls, *flags, timeout=timeout, module="minisgl.server.dp_router")

    @property
    def output(self) -> str:
        return "".join(self.lines[-80:])

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """启动并等到 ``/health`` 回 200（:meth:`spawn`，再 :meth:`wait_ready`）。

        en: Start and wait until ``/health`` answers 200 (:meth:`spawn`, then :meth:`wait_ready`).
        """
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        """启动子进程，不等它就绪。子进程在自己的会话里（终端的 Ctrl-C 到不了它），并经 :data:`~minisgl.processes.lifeline.PARENT_ENV`
        得知本进程的 pid：本进程死了，它随之退出（:mod:`minisgl.processes.lifeline`）；所以要从活得和它一样久的线程里调用。

        en: Start the child process without waiting for it to be ready. The child is in a session of its own (a Ctrl-C in
        the terminal does not reach it) and learns this process's pid through :data:`~minisgl.processes.lifeline.PARENT_ENV`: when
        this process dies it exits too (:mod:`minisgl.processes.lifeline`); so call it from a thread that lives as long as the child.
        """
        self.proc = subprocess.Popen(self.command, env={**self.env, PARENT_ENV: str(os.getpid())}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, encoding="utf-8",
                                     errors="replace", start_new_session=True)
        threading.Thread(target=self._pump, args=(self.found,), daemon=True).start()

    def wait_ready(self) -> None:
        """等 :meth:`spawn` 起的服务器打印出地址、``/health`` 回 200；起不来就整组杀掉、抛 RuntimeError（带上服务的输出）。

        en: Wait until the server :meth:`spawn` started prints its address and ``/health`` answers 200; if it does not
        come up, kill the whole group and raise RuntimeError (with the service's output).
        """
        assert self.proc is not None
        deadline = time.monotonic() + self.timeout
        while not self.found.wait(0.1):
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

    def settled_metrics(self, timeout: float = 10.0) -> dict[str, float]:
        """等计数不再变了再读 ``/metrics``（两次相隔 0.25 秒的读数相同）：调度器空下来时才补发最后一步的计数。

        en: Read ``/metrics`` once the counts stop changing (two reads 0.25 s apart agree): the scheduler sends the last
        step's counts once it is idle.
        """
        deadline = time.monotonic() + timeout
        last = self.metrics()
        while time.monotonic() < deadline:
            time.sleep(0.25)
            now = self.metrics()
            if {k: v for k, v in now.items() if "_total" in k} == {k: v for k, v in last.items() if "_total" in k}:
                return now
            last = now
        return last

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
        while (left := sorted(p for p in pids if alive(p))) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.left_behind = left
        return self.proc.returncode


def alive(pid: int) -> bool:
    """进程 ``pid`` 还在跑吗（读 /proc；僵尸算已经退出）。

    en: Whether process ``pid`` still runs (read from /proc; a zombie counts as exited).
    """
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
