"""检查、示例、笔记本和基准测试用的服务器外壳：在子进程里启动 ``python -m minisgl``，等它就绪，读它的 ``/metrics``，
用完关掉并确认没有留下任何进程。``--dp N`` 的启动器也用它起各个副本。

en: The server harness of the checks, examples, notebooks and benchmarks: start ``python -m minisgl`` in a child process,
wait until it is ready, read its ``/metrics``, and when done stop it and make sure no process is left. The ``--dp N``
launcher also starts each replica with it.
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
from pathlib import Path

from minisgl.i18n import tr
from minisgl.lifeline import PARENT_ENV

#: 启动器就绪时打印的地址（不论哪种语言，这一段都一样）。
#: en: The address the launcher prints once it is ready (the same in every language).
LISTENING = re.compile(r"http://127\.0\.0\.1:\d+")


def shared_prefix_prompts(tag: str, groups: int = 3, tails: int = 3, words: int = 40) -> list[str]:
    """共享前缀的一组提示词：``groups`` 段各不相同的长开头（每段 ``words`` 个词，由 ``tag`` 区分），每段接 ``tails`` 条
    短尾巴，各组轮流着排（组 0、组 1、组 2、组 0……）。换一个 ``tag`` 就是形状相同、开头全不相同的另一组。

    en: A set of shared-prefix prompts: ``groups`` different long beginnings (``words`` words each, told apart by
    ``tag``), each with ``tails`` short tails, the groups taking turns (group 0, 1, 2, 0, ...). Another ``tag`` gives a
    set of the same shape whose beginnings all differ.
    """
    prefixes = [f"{tag} {g}: " + " ".join(f"word{g}{i}{tag}" for i in range(words)) for g in range(groups)]
    return [f"{prefixes[g]} tail {t}." for t in range(tails) for g in range(groups)]


def per_replica(metrics: dict[str, float], name: str) -> dict[int, float]:
    """``--dp`` 路由器的 ``/metrics`` 里一个指标按 ``replica`` 标签分开：副本号 → 值。

    en: One metric of the ``--dp`` router's ``/metrics`` split by its ``replica`` label: replica number -> value.
    """
    return {int(k.split('replica="')[1].split('"')[0]): v for k, v in metrics.items()
            if k.startswith(name + "{") and 'replica="' in k}


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
        """单独起的路由器（``python -m minisgl.dp_router --worker-urls ...``），在已经在跑的副本前面。

        en: A router started alone (``python -m minisgl.dp_router --worker-urls ...``) in front of running replicas.
        """
        return cls("", "--worker-urls", *urls, *flags, timeout=timeout, module="minisgl.dp_router")

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
        """启动子进程，不等它就绪。子进程在自己的会话里（终端的 Ctrl-C 到不了它），并经 :data:`~minisgl.lifeline.PARENT_ENV`
        得知本进程的 pid：本进程死了，它随之退出（:mod:`minisgl.lifeline`）；所以要从活得和它一样久的线程里调用。

        en: Start the child process without waiting for it to be ready. The child is in a session of its own (a Ctrl-C in
        the terminal does not reach it) and learns this process's pid through :data:`~minisgl.lifeline.PARENT_ENV`: when
        this process dies it exits too (:mod:`minisgl.lifeline`); so call it from a thread that lives as long as the child.
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


def process_name(pid: int) -> str:
    """进程 ``pid`` 的名字（``/proc/<pid>/comm``，例如 ``msgl-tokenizer``）；进程已经没了时是空串。

    en: The name of process ``pid`` (``/proc/<pid>/comm``, e.g. ``msgl-tokenizer``); empty when it is gone.
    """
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
