"""``python -m minisgl --dp N`` 的副本（给定）：起 N 个完整的服务器（各自一个 ``python -m minisgl``，端口由它们向系统要），
把本机的核或 GPU 分给它们，等都就绪，在前面开第 4.6 章的路由器（:mod:`minisgl.server.dp_router`）；副本的进程退出了就把它移出
轮换；关机时让每个副本有序退出。

en: The replicas of ``python -m minisgl --dp N`` (given): start N whole servers (each its own ``python -m minisgl``,
asking the OS for its port), share this machine's cores or GPUs out among them, wait until all are ready, and serve
chapter 4.6's router (:mod:`minisgl.server.dp_router`) in front; a replica whose process exits is taken out of the rotation; on
shutdown every replica exits in order.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import uvicorn

from minisgl.i18n import tr
from minisgl.processes.tree import (DEAD_WORKER_GRACE_S, READY_TIMEOUT_S, ServerProcess, cpu_budget, interrupt_on_signals,
                                  say_shutting_down)
from minisgl.server.args import ROUTER_OPTIONS, ServerArgs
from minisgl.server.standby import Standby

#: 副本的设置里不转给副本的：地址由副本向系统要，数据并行和路由器的设置只属于前面的路由器；访问日志由路由器写
#: （副本总是 ``--no-access-log``：它的输出没人看，只攒在内存里）。
#: en: Settings not passed on to a replica: it asks the OS for its own address; data parallelism and the router's
#: en: settings belong to the router in front only; the router writes the access log (a replica always runs with
#: en: ``--no-access-log``: nobody reads its output, which only piles up in memory).
NOT_FOR_REPLICAS = ("model_path", "host", "port", "dp_size", "access_log", *ROUTER_OPTIONS)
#: 关机时等一个副本有序退出的最长时间（秒）；它的子进程随它而去，不必另等。
#: en: The longest wait (seconds) for a replica to exit in order on shutdown; its children go down with it, no extra wait.
REPLICA_STOP_S = 5.0


def replica_flags(args: ServerArgs) -> list[str]:
    """``--dp`` 的每个副本的命令行参数：``args`` 里与缺省值不同的设置（:meth:`ServerArgs.flags`），去掉
    :data:`NOT_FOR_REPLICAS`。

    en: The command-line flags of each ``--dp`` replica: the settings of ``args`` that differ from the defaults
    (:meth:`ServerArgs.flags`), without :data:`NOT_FOR_REPLICAS`.
    """
    return args.flags(leave_out=NOT_FOR_REPLICAS)


def visible_gpus() -> list[str]:
    """这台机器上看得见的 NVIDIA GPU（``CUDA_VISIBLE_DEVICES`` 给了就按它；否则数 ``/proc/driver/nvidia/gpus``），不导入 torch。

    en: The NVIDIA GPUs visible on this machine (by ``CUDA_VISIBLE_DEVICES`` when set; otherwise counted in
    ``/proc/driver/nvidia/gpus``), without importing torch.
    """
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [d for d in given.split(",") if d.strip()]
    found = Path("/proc/driver/nvidia/gpus")
    return [str(i) for i in range(len(list(found.iterdir())))] if found.is_dir() else []


def replica_env(index: int, args: ServerArgs, threads: int) -> dict[str, str]:
    """第 ``index`` 个副本的环境：CPU 上它那一份核（``OMP_NUM_THREADS``）；GPU 够每个副本 ``--tp`` 张时，它自己的那几张。

    en: Replica ``index``'s environment: its share of the cores on the CPU (``OMP_NUM_THREADS``); when there are enough
    GPUs for ``--tp`` each, its own ones.
    """
    env = {"OMP_NUM_THREADS": str(threads)}
    gpus = visible_gpus() if args.device != "cpu" else []
    if len(gpus) >= args.dp_size * args.tp_size:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[index * args.tp_size:(index + 1) * args.tp_size])
    return env


def serve_replicas(args: ServerArgs, sock: socket.socket, standby: Standby) -> int:
    """``--dp N``：起 N 个副本（各自一个 ``python -m minisgl``，端口由它们向系统要，CPU 上平分本机的核），等都就绪，
    停下 ``standby``（在那之前它对每个请求回 503），在 ``sock`` 上开路由器（``minisgl.server.dp_router``）；副本的进程退出了就把
    它移出轮换；关机时同时给每个副本发 SIGTERM，等它们有序退出（最多 :data:`REPLICA_STOP_S` 秒，之后整组杀掉）。
    副本从主线程启动，随本进程而去（:mod:`minisgl.processes.lifeline`）。

    en: ``--dp N``: start N replicas (each its own ``python -m minisgl``, asking the OS for its port, sharing this
    machine's cores on the CPU), wait until all are ready, stop ``standby`` (which answers 503 to every request until
    then), serve the router (``minisgl.server.dp_router``) on ``sock``; a replica whose process exits is taken out of the
    rotation; on shutdown every replica gets SIGTERM at once and is waited for while it exits in order (at most
    :data:`REPLICA_STOP_S` seconds, then its group is killed). The replicas are started from the main thread and go down
    with this process (:mod:`minisgl.processes.lifeline`).
    """
    threads = max(1, cpu_budget() // args.dp_size)
    flags = [*replica_flags(args), "--no-access-log"]
    print(tr("Starting {dp} replicas of {model} ({threads} threads each) ...", dp=args.dp_size, model=args.model_path,
             threads=threads), flush=True)
    replicas = [ServerProcess(args.model_path, *flags, env=replica_env(i, args, threads), timeout=READY_TIMEOUT_S)
                for i in range(args.dp_size)]
    try:
        for replica in replicas:  # 全部先起，再逐个等：它们同时加载 | en: start all, then wait for each: they load at once
            replica.spawn()
        for replica in replicas:
            replica.wait_ready()
        from minisgl.server.dp_router import DpRouter, create_router_app
        from minisgl.router import make_policy
        from minisgl.server.args import policy_thresholds

        standby.stop()  # 套接字交给路由器 | en: the socket goes to the router
        router = DpRouter([r.url for r in replicas], make_policy(args.router_policy, args.dp_size, **policy_thresholds(args)))
        app = create_router_app(router, access_log=args.access_log)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                               lifespan="on", timeout_graceful_shutdown=2))
        gone: set[int] = set()

        def watch() -> None:
            while not server.should_exit:
                for i, replica in enumerate(replicas):
                    code = replica.proc.poll() if replica.proc is not None else None
                    if code is not None and i not in gone:
                        gone.add(i)
                        print(replica.output, file=sys.stderr, flush=True)
                        why = tr("its process exited (exit code {code})", code=code)
                        router.take_out(i, why)  # 只改几个属性，事件循环那边读到的是旧值或新值 | en: sets a few attributes; the event loop reads the old or the new value
                        if len(gone) == len(replicas):
                            time.sleep(DEAD_WORKER_GRACE_S)
                            server.should_exit = True
                time.sleep(0.2)

        threading.Thread(target=watch, name="minisgl-replica-watch", daemon=True).start()
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(tr("Router ({policy}) in front of {dp} replicas", policy=args.router_policy, dp=args.dp_size), flush=True)
        print(tr("listening on http://{host}:{port}", host=shown, port=port), flush=True)
        for i, replica in enumerate(replicas):  # 在监听的地址之后：头一个打印出的地址是路由器的 | en: after the listening address: the first address printed is the router's
            print(tr("Replica {index} ready at {url}", index=i, url=replica.url), flush=True)
        server.run(sockets=[sock])
        return 1 if len(gone) == len(replicas) else 0
    finally:
        say_shutting_down()
        stoppers = [threading.Thread(target=r.stop, args=(signal.SIGTERM, REPLICA_STOP_S)) for r in replicas]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()


def serve_replicas_until_stopped(args: ServerArgs, sock: socket.socket, standby: Standby) -> int:
    """:func:`serve_replicas`，Ctrl-C / SIGTERM 时有序关机；副本起不来时说清原因、返回 1。

    en: :func:`serve_replicas`, shutting down in order on Ctrl-C / SIGTERM; when a replica does not start, say why and
    return 1.
    """
    with interrupt_on_signals():
        try:
            return serve_replicas(args, sock, standby)
        except KeyboardInterrupt:
            return 0
        except (RuntimeError, OSError) as e:
            print(tr("Error: {error}", error=e), file=sys.stderr, flush=True)
            return 1
        finally:
            standby.stop()
            sock.close()
