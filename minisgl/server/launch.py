"""``python -m minisgl`` 的启动器：起两个工作进程、等它们就绪、监听、服务，关机时让每个进程都退出（给定）。
``--dp N`` 交给 :mod:`minisgl.server.replicas`。

顺序有讲究：先做几秒内就能发现的检查（模型目录、端口），再 spawn 工作进程，**然后**才导入第 3.4 章的 API 服务器
（它连带导入 torch，要几秒）——这几秒和工作进程加载模型重叠，服务器更早就绪。

en: The launcher of ``python -m minisgl``: start the two worker processes, wait until they are ready, listen, serve, and
make every process exit on shutdown (given). ``--dp N`` is handed to :mod:`minisgl.server.replicas`.

The order matters: first the checks that take seconds (the model folder, the port), then spawn the workers, and only
**then** import chapter 3.4's API server (it brings torch along, seconds) — those seconds overlap with the workers
loading the model, so the server is ready sooner.
"""

from __future__ import annotations

import multiprocessing
import shutil
import signal
import socket
import sys
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

import uvicorn

from minisgl.processes.by_name import ByName
from minisgl.i18n import tr
from minisgl.processes.lifeline import run_tethered
from minisgl.processes.tree import DEAD_WORKER_GRACE_S, READY_TIMEOUT_S, cpu_budget, interrupt_on_signals, say_shutting_down
from minisgl.processes.ranks import free_port, rank_env, stop_process
from minisgl.server.args import (ServerAddrs, ServerArgs, check_model_dir, make_ipc_dir, offline_hub, parse_args, port_problem,
                             set_process_name)
from minisgl.server.standby import Standby

#: 调度器握着组装好的引擎的零件（:data:`minisgl.llm.FULL_PARTS`），子进程按名字导入它们。
#: en: The scheduler holds the assembled engine's parts (:data:`minisgl.llm.FULL_PARTS`), imported by name in the child.
FULL_PARTS = ByName("minisgl.llm", "FULL_PARTS")
#: 一个秩时的两个工作进程：名字 → (公共模块, 入口函数, 额外参数)。
#: en: The two worker processes with one rank: name → (public module, entry function, extra arguments).
WORKERS: dict[str, tuple[str, str, tuple[Any, ...]]] = {
    "tokenizer": ("minisgl.tokenizer", "tokenize_worker", ()),
    "scheduler": ("minisgl.scheduler_io", "scheduler_worker", (FULL_PARTS,)),
}
#: 关机时每一步等多久（秒）：先等调度器自己退出，再 SIGTERM，最后 SIGKILL。
#: en: How long each shutdown step waits (seconds): first for the scheduler to exit by itself, then SIGTERM, last SIGKILL.
SHUTDOWN_WAIT_S = 10.0
#: 多节点时看门狗隔多久（秒）敲一下秩 0（见 :meth:`Launcher._knock`）。
#: en: With several nodes, how often (seconds) the watchdog knocks on rank 0 (see :meth:`Launcher._knock`).
KNOCK_EVERY_S = 2.0
#: 敲门用的那条取消消息里的请求号：没有哪个请求用它。
#: en: The request id of the abort used to knock: no request has it.
NO_REQUEST = -1


def plan_workers(args: ServerArgs) -> dict[str, tuple[str, str, tuple[Any, ...]]]:
    """这次启动要起的工作进程。一个秩：分词进程和调度器。``--tp N``：本节点上的那几个秩各一个调度器进程（第 4.3 章的
    ``tp_scheduler_worker``；秩 0 仍叫 "scheduler"），节点 0 另有分词进程。集合点是 ``--dist-init-addr``，单节点时
    缺省为向系统要来的 127.0.0.1 上的空闲端口；CPU 上各秩平分本机的核（每个秩一个 OpenMP 线程池）。

    en: The worker processes this launch starts. One rank: the tokenizer and the scheduler. ``--tp N``: one scheduler
    process for each rank of this node (chapter 4.3's ``tp_scheduler_worker``; rank 0 is still called "scheduler"), plus
    the tokenizer on node 0. The rendezvous is ``--dist-init-addr``; on one node it defaults to a free port on 127.0.0.1
    asked from the OS; on the CPU the ranks share this machine's cores (one OpenMP pool per rank).
    """
    if args.tp_size == 1:
        return dict(WORKERS)
    per_node = args.tp_size // args.nnodes
    dist_addr = args.dist_init_addr or f"127.0.0.1:{free_port()}"
    threads = max(1, cpu_budget() // per_node)
    env = rank_env(dist_addr.rsplit(":", 1)[0], threads)
    workers = {"tokenizer": WORKERS["tokenizer"]} if args.node_rank == 0 else {}
    for rank in range(args.node_rank * per_node, (args.node_rank + 1) * per_node):
        name = "scheduler" if rank == 0 else f"rank {rank}"
        workers[name] = ("minisgl.tp_scheduler", "tp_scheduler_worker", (rank, dist_addr, env, threads, FULL_PARTS))
    return workers


class Launcher:
    """拉起工作进程（见 :func:`plan_workers`）并看着它们；关机时让它们全部退出。

    en: Starts the worker processes (see :func:`plan_workers`) and watches them; on shutdown makes all of them exit.
    """

    def __init__(self, args: ServerArgs) -> None:
        self.args = args
        self.ipc_dir = make_ipc_dir()
        self.addrs = ServerAddrs.in_dir(self.ipc_dir)
        self.procs: dict[str, multiprocessing.process.BaseProcess] = {}
        self.pipes: dict[str, Connection] = {}
        self.stopping = threading.Event()
        self.died: str | None = None
        self.ready: set[str] = set()  # 报告过就绪的工作进程 | en: the workers that reported ready

    def spawn_workers(self) -> None:
        """spawn 出 :func:`plan_workers` 里的工作进程（不等它们）。

        启动时暂时忽略 SIGINT：子进程继承“忽略”，终端里的 Ctrl-C 只由启动器处理，由它有序地关掉大家。启动器不论怎么死的，
        每个子进程都随之退出（:func:`~minisgl.processes.lifeline.run_tethered`）。

        en: Spawn the worker processes of :func:`plan_workers` (without waiting for them).

        SIGINT is ignored while they start: the children inherit "ignore", so a Ctrl-C in the terminal is handled by the
        launcher alone, which then shuts everyone down in order. Each child goes down with the launcher however it dies
        (:func:`~minisgl.processes.lifeline.run_tethered`).
        """
        ctx = multiprocessing.get_context("spawn")
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for name, (module, entry, extra) in plan_workers(self.args).items():
                here, there = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=run_tethered, args=(ByName(module, entry), self.args, self.addrs, there, *extra),
                                   name=f"minisgl-{name.replace(' ', '')}", daemon=False)
                proc.start()
                there.close()
                self.procs[name], self.pipes[name] = proc, here
        finally:
            signal.signal(signal.SIGINT, previous)

    def wait_ready(self) -> dict[str, dict[str, Any]]:
        """等每个工作进程都经管道报告 ``("ready", 信息)``；返回名字 → 信息（调度器的有 max_seq_len 等）。报告了错误、
        没报告就退出了、或者超时：抛 RuntimeError，说清是哪个进程、为什么。

        en: Wait until every worker reports ``("ready", info)`` through its pipe; return name → info (the scheduler's
        has max_seq_len and so on). One that reports an error, exits without reporting or times out raises
        RuntimeError saying which process and why.
        """
        infos: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(infos) < len(self.pipes):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [n for n in self.pipes if n not in infos]
                raise RuntimeError(tr("The {names} process did not report ready within {seconds:.0f} s",
                                      names=", ".join(missing), seconds=READY_TIMEOUT_S))
            waiting = {self.pipes[n]: n for n in self.pipes if n not in infos}
            for conn in wait(list(waiting), timeout=min(left, 1.0)):
                name = waiting[conn]  # type: ignore[index]
                try:
                    kind, payload = conn.recv()
                except EOFError:
                    self.procs[name].join(1.0)
                    raise RuntimeError(tr("The {name} process exited before it was ready (exit code {code})",
                                          name=name, code=self.procs[name].exitcode)) from None
                if kind != "ready":
                    raise RuntimeError(tr("The {name} process cannot start: {why}", name=name, why=payload))
                infos[name] = dict(payload or {})
                self.ready.add(name)
        return infos

    def watch(self, on_death: Callable[[str], None]) -> threading.Thread:
        """后台线程：有工作进程退出（而不是在关机）就调用 ``on_death(原因)``。多节点时它还按时敲一敲秩 0
        （:meth:`_knock`），别的节点上死了的秩也在几秒内被发觉。

        en: A background thread: when a worker exits (other than during shutdown), call ``on_death(why)``. With several
        nodes it also knocks on rank 0 at intervals (:meth:`_knock`), so a rank that died on another node is found
        within seconds too.
        """

        def run() -> None:
            sentinels = {p.sentinel: name for name, p in self.procs.items()}
            knock_at = time.monotonic() + KNOCK_EVERY_S
            while not self.stopping.is_set():
                gone = wait(list(sentinels), timeout=0.2)
                if not gone:
                    if self.args.nnodes > 1 and time.monotonic() >= knock_at:
                        self._knock()
                        knock_at = time.monotonic() + KNOCK_EVERY_S
                    continue
                if self.stopping.wait(0.3):  # Ctrl-C 也会让子进程退出：那是关机，不是故障 | en: Ctrl-C makes children exit too: a shutdown, not a failure
                    return
                name = sentinels[gone[0]]  # type: ignore[index]
                self.died = tr("The {name} process died (exit code {code}); the server cannot answer any more",
                               name=name, code=self.procs[name].exitcode)
                on_death(self.died)
                return

        thread = threading.Thread(target=run, name="minisgl-watchdog", daemon=True)
        thread.start()
        return thread

    def shutdown(self) -> None:
        """调度器收到 :class:`ExitMsg` 自己退出，分词进程收到 SIGTERM 退出；还没就绪的马上 SIGTERM；不退的 SIGTERM、
        再 SIGKILL；删掉 ipc 目录。

        en: The scheduler exits on an :class:`ExitMsg`, the tokenizer on SIGTERM; one not ready yet gets SIGTERM at once;
        one that does not exit gets SIGTERM, then SIGKILL; the ipc folder is removed.
        """
        self.stopping.set()
        for name, proc in self.procs.items():
            if name not in self.ready:  # 还没就绪（例如还在集合点上等）：没有谁会收退出消息 | en: not ready (e.g. still at the rendezvous): nobody reads an exit message
                proc.terminate()
        scheduler = self.procs.get("scheduler")
        if scheduler is not None and scheduler.is_alive() and "scheduler" in self.ready:
            try:
                self._send_exit()
            except Exception:  # 例如消息那一章导入不了：改用 SIGTERM | en: e.g. the message chapter does not import: SIGTERM instead
                scheduler.terminate()
        tokenizer = self.procs.get("tokenizer")
        if tokenizer is not None and tokenizer.is_alive():
            tokenizer.terminate()
        if scheduler is None:  # 别的节点：它的秩等不到节点 0 的退出消息了 | en: another node: its ranks will not get node 0's exit message
            for proc in self.procs.values():
                proc.terminate()
        for proc in self.procs.values():
            stop_process(proc, SHUTDOWN_WAIT_S)
        shutil.rmtree(self.ipc_dir, ignore_errors=True)

    def _send_exit(self) -> None:
        from minisgl.message import ExitMsg

        self._send_to_scheduler(ExitMsg(), linger_ms=1000)  # 留一秒把 ExitMsg 送出去 | en: allow a second to deliver the ExitMsg

    def _knock(self) -> None:
        """多节点时，别的节点上的秩死了，这里看不到它的进程；空闲的秩 0 阻塞在自己的收件箱上，也不会发觉——它只在集合通信里
        才碰到别的秩。所以看门狗每 :data:`KNOCK_EVERY_S` 秒给秩 0 送一条无害的消息（取消一个不存在的请求）：各秩都走一次
        迭代、进一次广播；对端死了，广播马上出错，秩 0 的进程退出，看门狗照常看到它。

        en: With several nodes, a rank that died on another node is a process this launcher cannot see; an idle rank 0,
        blocked on its inbox, does not notice either — it meets the other ranks only in collectives. So every
        :data:`KNOCK_EVERY_S` seconds the watchdog sends rank 0 a harmless message (an abort of a request that does not
        exist): every rank takes one iteration and enters one broadcast; with a peer dead the broadcast fails at once,
        rank 0's process exits, and the watchdog sees it as usual.
        """
        from minisgl.message import AbortBackendMsg

        self._send_to_scheduler(AbortBackendMsg(NO_REQUEST), linger_ms=100)

    def _send_to_scheduler(self, msg: Any, linger_ms: int) -> None:
        import zmq

        from minisgl.message import ZmqPushQueue  # 通常 API 服务器早已导入了它 | en: usually the API server imported it long ago

        queue = ZmqPushQueue(self.addrs.backend, create=False, ctx=zmq.Context.instance())
        queue.put(msg)  # 连接那一端的管道立刻就有，不会阻塞 | en: a connecting socket has its pipe at once: this never blocks
        queue.socket.close(linger=linger_ms)


class _Server(uvicorn.Server):
    """关机时先让还在等回复的请求都收到一条“服务器正在关闭”的错误（503），它们马上结束，不必等 uvicorn 超时取消。

    en: On shutdown, first give every request still waiting for replies a "server shutting down" error (503), so they end
    at once instead of waiting for uvicorn's timeout to cancel them.
    """

    def __init__(self, config: uvicorn.Config, state: Any) -> None:
        super().__init__(config)
        self.state = state

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.state.dead is None:
            self.state.mark_dead(tr("The server is shutting down"))
        await super().shutdown(sockets)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def check_tp(args: ServerArgs) -> str | None:
    """``--tp N``（和 ``--ep``）切不开这个模型时的说明（说出哪些大小行得通），在起任何进程之前；切得开就是 None。

    en: Why ``--tp N`` (and ``--ep``) cannot split this model (naming the sizes that work), before any process starts;
    None when it can.
    """
    if args.tp_size == 1 and args.ep_size == 1:
        return None
    from minisgl.architectures import load_model_config
    from minisgl.llm import check_split  # 组装：它登记了后面各章的检查点种类 | en: the assembly: it registers the later chapters' checkpoint kinds

    try:
        check_split(load_model_config(args.model_path), args.tp_size, args.ep_size)
    except ValueError as e:
        return str(e)
    return None


def announce_rendezvous(args: ServerArgs) -> None:
    """多个节点时说一句：各节点在哪儿会合、最多等多久（一个节点时什么也不说）。

    en: With several nodes, say where the nodes meet and for how long at most (nothing with one node).
    """
    if args.nnodes > 1:
        print(tr("Waiting for {nnodes} nodes at {addr} (at most {seconds:g} s; --dist-timeout changes it) ...",
                 nnodes=args.nnodes, addr=args.dist_init_addr, seconds=args.dist_timeout), flush=True)


def serve_node(launcher: Launcher) -> int:
    """节点 1、2……：只起本节点的秩，它们从节点 0 的秩 0 收消息；不开 HTTP。秩都正常退出（节点 0 关机时转来的
    ``ExitMsg``）就返回 0，有一个出错退出就停掉其余的、返回 1。

    en: Nodes 1, 2, ...: start only this node's ranks, which receive from rank 0 on node 0; no HTTP. Return 0 when the
    ranks all exit normally (the ``ExitMsg`` passed on when node 0 shuts down), or stop the others and return 1 when one
    exits with an error.
    """
    args = launcher.args
    print(tr("Node {node} of {nnodes}: starting ranks {ranks} for {model}; node 0 serves HTTP ...", node=args.node_rank,
             nnodes=args.nnodes, ranks=", ".join(n.removeprefix("rank ") for n in plan_workers(args)), model=args.model_path),
          flush=True)
    launcher.spawn_workers()
    announce_rendezvous(args)
    launcher.wait_ready()
    print(tr("Node {node} ready", node=args.node_rank), flush=True)
    procs = list(launcher.procs.items())
    while procs:
        wait([p.sentinel for _, p in procs])
        for name, proc in [(n, p) for n, p in procs if not p.is_alive()]:
            procs.remove((name, proc))
            if proc.exitcode != 0:
                launcher.died = tr("The {name} process died (exit code {code}); the server cannot answer any more",
                                   name=name, code=proc.exitcode)
                print(launcher.died, file=sys.stderr, flush=True)
                return 1
    return 0


def launch(argv: list[str] | None = None) -> int:
    """``python -m minisgl`` 的主体：起工作进程、等就绪、监听、服务；返回退出码（工作进程死了是 1）。

    en: The body of ``python -m minisgl``: start the workers, wait until ready, listen, serve; return the exit status (1
    if a worker died).
    """
    args = parse_args(argv)
    # 先做几秒内就能发现的检查，再花时间加载模型：模型目录、端口
    # en: first the checks that take seconds, before spending time on loading the model: the model folder, the port
    if (problem := check_model_dir(args.model_path)) is not None:
        print(tr("Error: {error}", error=problem), file=sys.stderr, flush=True)
        return 1
    if (problem := check_tp(args)) is not None:
        print(tr("Error: {error}", error=problem), file=sys.stderr, flush=True)
        return 1
    offline_hub()
    sock = None
    try:
        if args.node_rank == 0:  # 只有节点 0 开 HTTP | en: only node 0 serves HTTP
            sock = _listen(args.host, args.port)
    except OSError as e:
        print(tr("Error: {error}", error=port_problem(args.host, args.port, e)), file=sys.stderr, flush=True)
        return 1
    set_process_name("msgl-api-server" if sock is not None else "msgl-node")
    # 端口已经在监听：就绪之前每个请求马上得到 503 "starting"，而不是挂着
    # en: the port listens already: until ready, every request gets a 503 "starting" at once instead of hanging
    standby = Standby(sock) if sock is not None else None
    if args.dp_size > 1:
        from minisgl.server.replicas import serve_replicas_until_stopped

        assert sock is not None and standby is not None
        return serve_replicas_until_stopped(args, sock, standby)
    launcher = Launcher(args)
    with interrupt_on_signals() as stop_requested:
        try:
            if sock is None:
                return serve_node(launcher)
            print(tr("Starting the tokenizer and scheduler processes for {model} ...", model=args.model_path), flush=True)
            launcher.spawn_workers()
            announce_rendezvous(args)
            # 工作进程加载模型的同时导入 API 服务器（连带 torch）
            # en: import the API server (torch along with it) while the workers load the model
            from minisgl.api_server import ServerState, create_app

            info = launcher.wait_ready()["scheduler"]
            print(tr("Ready: context {max_seq_len} tokens, {num_pages} KV pages, {slots} request slots",
                     max_seq_len=info.get("max_seq_len"), num_pages=info.get("num_pages"), slots=info.get("max_running_req")),
                  flush=True)
            if info.get("decode_path"):
                print(info["decode_path"], flush=True)
            state = ServerState(args, launcher.addrs, info)
            host, port = sock.getsockname()[:2]
            config = uvicorn.Config(create_app(state), log_level="warning", access_log=False, lifespan="on",
                                    timeout_graceful_shutdown=2)
            server = _Server(config, state)

            def on_death(why: str) -> None:
                print(why, file=sys.stderr, flush=True)
                if state.loop is not None:
                    state.loop.call_soon_threadsafe(state.mark_dead, why)
                time.sleep(DEAD_WORKER_GRACE_S)
                server.should_exit = True

            launcher.watch(on_death)
            assert standby is not None
            standby.stop()  # 套接字交给 uvicorn：之后的连接在队列里等它 | en: the socket goes to uvicorn: later connections wait in the backlog for it
            shown = f"[{host}]" if ":" in host else host
            print(tr("listening on http://{host}:{port}", host=shown, port=port), flush=True)
            if not stop_requested.is_set():
                server.run(sockets=[sock])  # 收到 SIGINT / SIGTERM 时 uvicorn 自己收尾，然后把信号再交给我们 | en: on SIGINT / SIGTERM uvicorn winds down, then hands the signal back to us
        except KeyboardInterrupt:
            pass
        except (RuntimeError, OSError) as e:
            print(tr("Error: {error}", error=e), file=sys.stderr, flush=True)
            launcher.died = launcher.died or str(e)
        finally:
            stop_requested.set()
            if standby is not None:
                standby.stop()
            if sock is not None:
                sock.close()
            say_shutting_down()
            launcher.shutdown()
    return 1 if launcher.died else 0


def main(argv: list[str] | None = None) -> None:
    """命令行入口：``python -m minisgl --model DIR [...]``。

    en: The command-line entry point: ``python -m minisgl --model DIR [...]``.
    """
    sys.exit(launch(argv))
