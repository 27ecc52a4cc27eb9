"""起几个秩（rank）进程、等它们做完、把结果或错误带回来，而且绝不留下一个进程（第 4 阶段的检查、示例、笔记本
和 ``LLM(tp_size=N)`` 都用它，给定）。

规矩只写在这里一次：

- **spawn，不 fork**：fork 出的子进程带着父进程的 OpenMP 线程池和 torch 的状态，会卡死或算错；
- **集合点端口由父进程向系统要**（绑 ``127.0.0.1:0``），再交给每个秩：固定端口（上游 mini-sglang 用服务端口 + 1，
  nano-vllm 用 2333）在同一台机器上第二次启动时就撞了；
- **每个秩一个 OpenMP 线程**（CPU 上的缺省）：两个秩各开满两个核的线程池，屏障就睡睡醒醒，比一个进程还慢；
- **有界**：任何一个秩出错，立刻停掉其余的秩（它们正卡在等这个秩的集合通信里），把出错秩的 traceback 原样抛给
  调用者；超时也一样；
- **随父进程而去**：父进程不论怎么死的，秩进程都被杀掉（:mod:`minisgl.processes.lifeline`）；
- **脚本要有 ``if __name__ == "__main__":``**：spawn 的子进程先把用户的脚本再执行一遍，起秩的那一行若不在守卫之下，
  子进程里又要起秩。这种情形被认出来，调用者得到一句说清怎么改的错误（:func:`exit_if_rerunning_main`）。

en: Start a few rank processes, wait for them to finish, bring back their results or their error, and never leave a
process behind (stage 4's checks, examples and notebooks and ``LLM(tp_size=N)`` use it; given).

The rules are written here once:

- **spawn, never fork**: a forked child carries the parent's OpenMP pool and torch state, and hangs or computes wrong;
- **the rendezvous port is asked from the OS by the parent** (bind ``127.0.0.1:0``) and handed to every rank: a fixed
  port (upstream mini-sglang uses the server port + 1, nano-vllm 2333) collides on the second launch on one machine;
- **one OpenMP thread per rank** (the CPU default): two ranks each with a pool the size of both cores make the barriers
  sleep and wake, slower than one process;
- **bounded**: when any rank fails, the others (stuck waiting in a collective for it) are stopped at once, and the
  failing rank's traceback is raised to the caller as it was; a timeout likewise;
- **down with the parent**: however the parent dies, the ranks are killed (:mod:`minisgl.processes.lifeline`);
- **scripts need ``if __name__ == "__main__":``**: a spawned child first runs the user's script again, and a line that
  starts ranks outside the guard would start ranks again in the child. That case is recognized and the caller gets one
  error that says how to fix it (:func:`exit_if_rerunning_main`).
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from minisgl.i18n import tr
from minisgl.processes.lifeline import die_with_parent

#: 等全部秩做完的缺省上限（秒）。
#: en: The default limit (seconds) for all ranks to finish.
RANKS_TIMEOUT_S = 300.0
#: 停一个进程时每一步等多久（秒）：先 SIGTERM，再 SIGKILL。
#: en: How long each step of stopping a process waits (seconds): SIGTERM first, then SIGKILL.
STOP_WAIT_S = 5.0
#: 秩进程发现自己正在重新执行用户脚本、脚本又要起秩时（没有 ``if __name__ == "__main__":``）的退出码。
#: en: The exit code of a rank process that finds itself running the user's script again, and the script starting ranks
#: en: again (no ``if __name__ == "__main__":``).
UNGUARDED_MAIN_EXIT = 86


class RankFailed(RuntimeError):
    """某个秩出错、死掉或超时；``ranks`` 是出事的秩，消息里有原因（出错时是它的 traceback）。

    en: A rank failed, died or timed out; ``ranks`` are the ranks concerned, the message holds the cause (the traceback
    when one raised).
    """

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


def exit_if_rerunning_main() -> None:
    """起秩之前调用。spawn 出的子进程先把用户的脚本当作 ``__mp_main__`` 再执行一遍（好找到脚本里定义的函数），然后才跑
    秩的入口。脚本没有 ``if __name__ == "__main__":`` 时，起秩的那一行在子进程里又执行一次——Python 在每个子进程里
    打印一大段 bootstrapping 错误，调用者几秒后才得到一个说不清原因的错误。这里认出这种情形（调用栈里有
    ``__mp_main__`` 的模块顶层），让子进程安静地以 :data:`UNGUARDED_MAIN_EXIT` 退出；父进程见到这个退出码，说清该怎么改
    （:func:`rank_died`）。

    en: Call it before starting ranks. A spawned child first runs the user's script again as ``__mp_main__`` (to find the
    functions defined there), and only then the rank's entry. Without ``if __name__ == "__main__":`` the line that
    starts ranks runs again in the child — Python prints a long bootstrapping error in every child, and the caller gets
    an error with no clear cause seconds later. This recognizes the case (module-level code of ``__mp_main__`` on the
    call stack) and makes the child exit quietly with :data:`UNGUARDED_MAIN_EXIT`; the parent, seeing that exit code,
    says how to fix it (:func:`rank_died`).
    """
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            sys.exit(UNGUARDED_MAIN_EXIT)
        frame = frame.f_back


def rank_died(rank: int, code: int | None) -> RankFailed:
    """秩 ``rank`` 没留下结果就以 ``code`` 退出了：给调用者的错误（:data:`UNGUARDED_MAIN_EXIT` 时说清要加守卫）。

    en: Rank ``rank`` exited with ``code`` leaving no result: the error for the caller (with :data:`UNGUARDED_MAIN_EXIT`,
    saying that the guard is missing).
    """
    if code == UNGUARDED_MAIN_EXIT:
        script = getattr(sys.modules["__main__"], "__file__", None) or "__main__"
        return RankFailed(tr("The rank processes stopped at once: spawn runs your script {script} again in each of them, "
                             "and there the line that starts the ranks ran again. Put the code that starts them "
                             "(LLM(..., tp_size=N), run_ranks) under if __name__ == \"__main__\":", script=script), [rank])
    return RankFailed(tr("Rank {rank} died without a result (exit code {code})", rank=rank, code=code), [rank])


def free_port(host: str = "127.0.0.1") -> int:
    """向系统要一个此刻空闲的 TCP 端口（绑 ``host:0`` 再放开）。

    en: Ask the OS for a TCP port free at this moment (bind ``host:0``, then let it go).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def rank_env(host: str, threads: int) -> dict[str, str]:
    """每个秩进程的环境：与本进程同一套章节实现，不碰模型中心，OpenMP 线程数，集合点在本机时 gloo 只用回环网卡。

    en: Each rank process's environment: the same chapter implementations as this process, no model hub, the OpenMP
    thread count, and gloo on the loopback interface only when the rendezvous is on this machine.
    """
    from minisgl.course import select

    env = {**select.impl_env(), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)}
    if host in ("127.0.0.1", "localhost"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, addr: str, args: tuple[Any, ...],
               env: dict[str, str], threads: int, conn: Connection) -> None:
    """一个秩进程的入口：设好环境和线程数，跑 ``fn``，把结果或 traceback 经管道交回父进程。

    en: A rank process's entry: set the environment and the thread count, run ``fn``, hand the result or the traceback
    back to the parent through the pipe.
    """
    die_with_parent(signal.SIGKILL)
    os.environ.update(env)
    import torch

    torch.set_num_threads(threads)
    try:
        result = fn(rank, world_size, addr, *args)
    except BaseException:  # noqa: BLE001 - 一切都要带回父进程 | en: everything goes back to the parent
        conn.send(("error", traceback.format_exc()))
    else:
        conn.send(("ok", result))
    finally:
        conn.close()


def stop_process(proc: multiprocessing.process.BaseProcess, timeout: float = STOP_WAIT_S) -> None:
    """等进程退出；不退就 SIGTERM，再不退就 SIGKILL。

    en: Wait for a process to exit; SIGTERM if it does not, SIGKILL if it still does not.
    """
    proc.join(timeout)
    if proc.is_alive():
        proc.terminate()
        proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout)


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, threads: int = 1, host: str = "127.0.0.1",
              timeout: float = RANKS_TIMEOUT_S) -> list[Any]:
    """在 ``world_size`` 个 spawn 出的进程里各跑一次 ``fn(rank, world_size, addr, *args)``，按秩号返回它们的结果。

    ``fn`` 必须能按名字导入（模块顶层的函数），结果必须能 pickle；``addr`` 是 ``"host:port"``，端口刚向系统要来。
    任何一个秩抛错、没有结果就死了或超时，其余的秩都会被停掉，再抛 :class:`RankFailed`。

    en: Run ``fn(rank, world_size, addr, *args)`` once in each of ``world_size`` spawned processes and return their
    results by rank.

    ``fn`` must be importable by name (a module-level function) and its result picklable; ``addr`` is ``"host:port"``,
    with a port just asked from the OS. If any rank raises, dies without a result or times out, the other ranks are
    stopped, then :class:`RankFailed` is raised.
    """
    exit_if_rerunning_main()
    ctx = multiprocessing.get_context("spawn")
    addr = f"{host}:{free_port(host)}"
    env = rank_env(host, threads)
    procs, conns = [], {}
    done = False
    try:
        for rank in range(world_size):
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_rank_main, args=(fn, rank, world_size, addr, args, env, threads, send),
                               name=f"minisgl-rank{rank}", daemon=True)
            proc.start()
            send.close()
            procs.append(proc)
            conns[recv] = rank
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while conns:
            ready = wait(list(conns), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RankFailed(tr("Ranks {ranks} did not finish within {seconds:.0f} s",
                                    ranks=sorted(conns.values()), seconds=timeout), sorted(conns.values()))
            for conn in ready:
                rank = conns.pop(conn)  # type: ignore[call-overload]
                try:
                    status, value = conn.recv()  # type: ignore[union-attr]
                except EOFError:
                    procs[rank].join(STOP_WAIT_S)
                    raise rank_died(rank, procs[rank].exitcode) from None
                finally:
                    conn.close()  # type: ignore[union-attr]
                if status == "error":
                    raise RankFailed(tr("Rank {rank} failed:\n{error}", rank=rank, error=value), [rank])
                results[rank] = value
        done = True
        return [results[r] for r in range(world_size)]
    finally:
        if not done:  # 其余的秩正等着出错的那个：不必等它们 | en: the others wait for the failed one: do not wait for them
            for proc in procs:
                proc.terminate()
        for proc in procs:
            stop_process(proc)
        for conn in conns:
            conn.close()  # type: ignore[union-attr]
