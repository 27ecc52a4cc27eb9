"""子进程随父进程而去（给定）。一次启动里的每个子进程——分词进程、调度器的各个秩、``--dp`` 的副本、单独起的路由器、
``run_ranks`` 和 ``LLM(tp_size=N)`` 的秩进程——一开始就调用 :func:`die_with_parent`：父进程不论怎么死的（Ctrl-C、
SIGTERM、SIGKILL、崩溃），子进程都会收到一个信号退出，不会变成还占着端口、内存和 GPU 的孤儿。SGLang 的子进程也这样
盯着父进程。哪个信号：

- 服务器进程（``python -m minisgl``、单独起的路由器）收 SIGTERM：它们在 Python 里等待（asyncio、``select``），收到就
  有序地停下自己的子进程；
- 工作进程（分词进程、调度器的秩、``run_ranks`` 的秩）收 SIGKILL：它们阻塞在 ZMQ、gloo 的 C 代码里，信号若恰好落在
  ZMQ 处理内部命令的间隙里，阻塞的调用不会被打断，Python 的处理函数就一直轮不到；父进程没了，也没有谁等它们收尾。

- Linux：``prctl(PR_SET_PDEATHSIG, 信号)``，父进程一死，内核就发信号。它认的是**启动子进程的那个线程**：那个线程
  退出，子进程也会收到信号，所以子进程都从主线程（或者活得和它们一样久的线程）启动；
- 先死的父进程：spawn 的子进程要先导入模块（几秒），这期间父进程可能已经死了，prctl 不会再发信号。所以设好之后再看一眼
  父进程号还是不是预期的那个，不是就立刻给自己发那个信号；
- 没有 prctl 的系统（macOS）：一个小线程每 :data:`WATCH_INTERVAL_S` 秒看一眼父进程号。

预期的父进程号：multiprocessing spawn 出的子进程从 ``multiprocessing.parent_process()`` 得知；subprocess 起的
（``--dp`` 的副本、检查和示例里起的服务器，见 :class:`~minisgl.processes.tree.ServerProcess`）由父进程放在环境变量
:data:`PARENT_ENV` 里。两者都没有（在终端里启动的 ``python -m minisgl``）就什么也不做。

en: Children go down with their parent (given). Every child process of a launch — the tokenizer, the scheduler ranks,
the ``--dp`` replicas, a router started alone, the rank processes of ``run_ranks`` and ``LLM(tp_size=N)`` — calls
:func:`die_with_parent` first thing: however the parent dies (Ctrl-C, SIGTERM, SIGKILL, a crash), the child gets a
signal and exits, instead of living on as an orphan that holds a port, memory and a GPU. SGLang's children watch their
parent the same way. Which signal:

- server processes (``python -m minisgl``, a router started alone) get SIGTERM: they wait in Python (asyncio,
  ``select``), and on it they stop their own children in order;
- worker processes (the tokenizer, the scheduler ranks, the ranks of ``run_ranks``) get SIGKILL: they block in the C code
  of ZMQ or gloo, and a signal that lands while ZMQ processes its internal commands does not interrupt the blocking call,
  so the Python handler may never get its turn; with the parent gone nobody waits for them to tidy up.

- Linux: ``prctl(PR_SET_PDEATHSIG, signal)``: the kernel sends the signal as soon as the parent dies. It watches **the
  thread that started the child**: when that thread exits the child gets the signal too, so children are started from
  the main thread (or a thread that lives as long as they do);
- a parent that died first: a spawned child imports modules first (seconds), and the parent may die meanwhile; prctl
  sends nothing then. So once it is set, look again whether the parent's pid is still the expected one, and if not send
  the signal to ourselves at once;
- systems without prctl (macOS): a small thread looks at the parent's pid every :data:`WATCH_INTERVAL_S` seconds.

The expected parent pid: a child spawned by multiprocessing learns it from ``multiprocessing.parent_process()``; one
started by subprocess (the ``--dp`` replicas, the servers of the checks and examples, see
:class:`~minisgl.processes.tree.ServerProcess`) from the environment variable :data:`PARENT_ENV` the parent sets. With neither
(``python -m minisgl`` started in a terminal) it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

#: 父进程把自己的 pid 放在这个环境变量里，交给用 subprocess 起的子进程。
#: en: The environment variable in which a parent hands its pid to a child started by subprocess.
PARENT_ENV = "MINISGL_PARENT_PID"
#: 没有 prctl 时多久（秒）看一眼父进程号。
#: en: How often (seconds) to look at the parent's pid where there is no prctl.
WATCH_INTERVAL_S = 0.5
_PR_SET_PDEATHSIG = 1


def expected_parent() -> int | None:
    """本进程该随之而去的父进程号：multiprocessing 的父进程，或者 :data:`PARENT_ENV`（读了就从环境里拿掉，不再传给孙进程）；
    都没有就是 None。

    en: The pid of the parent this process must go down with: multiprocessing's parent, or :data:`PARENT_ENV` (removed
    from the environment once read, so grandchildren do not inherit it); None with neither.
    """
    parent = multiprocessing.parent_process()
    given = os.environ.pop(PARENT_ENV, "")
    if parent is not None:
        return parent.pid
    return int(given) if given.isdigit() else None


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """父进程死了，本进程就收到 ``sig``（服务器进程 SIGTERM，工作进程 SIGKILL，见模块说明）；在子进程的入口处最先调用。

    en: When the parent dies this process gets ``sig`` (SIGTERM for server processes, SIGKILL for workers; see the
    module's notes); call it first thing in a child's entry.
    """
    parent = expected_parent()
    if parent is None:
        return
    if not _set_parent_death_signal(sig):
        threading.Thread(target=_watch, args=(parent, sig), name="minisgl-lifeline", daemon=True).start()
    if os.getppid() != parent:  # 父进程在设好之前就已经死了 | en: the parent died before this was set up
        os.kill(os.getpid(), sig)


def run_tethered(target: Callable[..., Any], *args: Any) -> None:
    """启动器的工作进程的入口外壳：先 ``die_with_parent(SIGKILL)``，再 ``target(*args)``。

    en: The entry wrapper of the launcher's worker processes: ``die_with_parent(SIGKILL)`` first, then ``target(*args)``.
    """
    die_with_parent(signal.SIGKILL)
    target(*args)


def _set_parent_death_signal(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)
    return False


def _watch(parent: int, sig: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_INTERVAL_S)
    os.kill(os.getpid(), sig)
