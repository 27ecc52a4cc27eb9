"""第 4.1 章 distributed：进程组、通信器和引擎要用的集合通信。

一个模型放不进一个设备（或一个设备算得不够快）时，就把每一层切开，分给几个进程——几个**秩**（rank）——各算一份，
再用**集合通信**把各份拼回来。这一章搭起它们之间的线：

- **进程组**：每个秩用同一个集合点地址 ``host:port`` 调 ``torch.distributed.init_process_group``，知道自己是第几个、
  一共几个（:class:`DistributedInfo`）。CPU 上用 gloo，GPU 上用 NCCL；
- **控制组**：在数据组旁边再建一个 gloo 组，专门传小的控制信息（数一数有几条消息、大家都同意的页数）。
  NCCL 只管 GPU 上的张量，而控制信息在 CPU 上。它只归调度器的线程用，前向里的通信一律走数据组：重叠调度时两个线程
  同时通信，同一个组上就会互相等死；
- **通信器**（:class:`Communicator`）：引擎只用它的三个操作——``all_reduce``（各秩的部分和加起来，每个秩都拿到总和）、
  ``all_gather``（各秩的一段沿最后一维按秩号拼起来）、``agree_min``（大家取最小的那个整数）——不管底下是 gloo 还是
  NCCL；每次真的通信都记一笔（``calls``），学员和检查都能数；
- 只有一个秩时什么都不通信：切分的代码在 ``tp_size == 1`` 时就是原来的单进程代码。

起进程、挑端口、每个秩一个 OpenMP 线程、出错时停掉所有秩，是给定的 :mod:`minisgl.processes.ranks`。

en: Chapter 4.1 distributed: process groups, the communicator and the collectives the engine needs.

When a model does not fit on one device (or one device does not compute it fast enough), each layer is cut and shared
out among a few processes — a few **ranks** — each computing one part, and **collectives** put the parts back together.
This chapter lays the wires between them:

- **the process group**: every rank calls ``torch.distributed.init_process_group`` with the same rendezvous address
  ``host:port`` and learns which one it is and how many there are (:class:`DistributedInfo`). gloo on the CPU, NCCL on
  a GPU;
- **the control group**: beside the data group, one more gloo group only for small control data (how many messages
  there are, the page count everyone agrees on). NCCL handles only tensors on the GPU, and control data lives on the
  CPU. It belongs to the scheduler's thread; every collective inside a forward goes over the data group: with overlap
  scheduling both threads communicate at once, and on one group they would wait on each other forever;
- **the communicator** (:class:`Communicator`): the engine uses just its three operations — ``all_reduce`` (the ranks'
  partial sums added, every rank gets the total), ``all_gather`` (each rank's piece joined along the last dimension in
  rank order), ``agree_min`` (everyone takes the smallest integer) — whether gloo or NCCL is underneath; every real
  communication is counted (``calls``), for the learner and the checks to read;
- with one rank nothing is communicated: the sharded code at ``tp_size == 1`` is the single-process code.

Starting the processes, choosing the port, one OpenMP thread per rank and stopping every rank on an error are the given
:mod:`minisgl.processes.ranks`.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from minisgl.i18n import tr

#: 一次集合通信最多等多久（秒）：一个秩死了，别的秩不会永远卡在等它的通信里。要长：一个秩在集合通信里等另一个秩
#: 校准内核、加载权重几秒甚至几十秒，都是正常的。
#: en: The longest a collective waits (seconds): when a rank dies, the others do not wait for it forever. It must be
#: en: long: a rank waiting in a collective for a peer that calibrates a kernel or loads weights for seconds, even tens of
#: en: seconds, is normal.
COLLECTIVE_TIMEOUT_S = 300
#: 集合点最多等多久（秒），与集合通信的上限分开：秩都到齐之前，谁也分不清缺的那个是还在路上，还是根本不会来（地址
#: 写错、节点没起、防火墙挡住）。两分钟够人在几台机器上依次启动；``python -m minisgl --dist-timeout`` 可以改。
#: en: The longest the rendezvous waits (seconds), apart from the collectives' limit: until every rank is there, nobody
#: en: can tell whether a missing one is still on its way or will never come (a wrong address, a node not started, a
#: en: firewall). Two minutes is enough to start the machines one after another; ``python -m minisgl --dist-timeout``
#: en: changes it.
RENDEZVOUS_TIMEOUT_S = 120
#: 集合点上数人数的键：每个秩到了就加 1。
#: en: The key that counts heads at the rendezvous: each rank adds 1 on arrival.
_ARRIVED = "minisgl/arrived"
#: 在集合点上每次只等这么久（秒），再回到 Python：Ctrl-C 随时都能打断。
#: en: Each wait at the rendezvous lasts at most this long (seconds) before returning to Python: Ctrl-C interrupts it at
#: en: any time.
_POLL_S = 0.1


@dataclass(frozen=True)
class DistributedInfo:
    """这个进程是第几个秩（``rank``），一共几个（``size``）。秩 0 是“主”秩：只有它对外说话。

    en: Which rank this process is (``rank``) and how many there are (``size``). Rank 0 is the "primary": only it talks
    to the outside.
    """

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(tr("rank {rank} is outside 0..{last} (size {size})", rank=self.rank, last=self.size - 1,
                                size=self.size))

    @property
    def is_primary(self) -> bool:
        return self.rank == 0


def _all_gather_flat(out: torch.Tensor, x: torch.Tensor, group: dist.ProcessGroup) -> None:
    """``out``（形状 ``(size * n, ...)``）= 各秩的 ``x``（形状 ``(n, ...)``）按秩号沿第 0 维接起来。
    torch 2.13 把 ``all_gather_into_tensor`` 改名为 ``all_gather_single``；更老的 torch 只有旧名字。

    en: ``out`` (shape ``(size * n, ...)``) = every rank's ``x`` (shape ``(n, ...)``) joined along dimension 0 in rank
    order. torch 2.13 renamed ``all_gather_into_tensor`` to ``all_gather_single``; older torch has the old name only.
    """
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, x, group=group)


class Communicator:
    """一组秩之间的集合通信。``group`` 传张量（gloo 或 NCCL），``control`` 传控制信息（总是 gloo，CPU 上的张量）；
    只有一个秩时两者都是 None，什么都不通信。``calls`` 数真的发生过的通信：名字 → 次数；``sent_elsewhere`` 累计
    ``all_to_all`` 发给别的秩的字节（发给自己的不出进程，不算）。

    en: Collectives among a group of ranks. ``group`` carries tensors (gloo or NCCL), ``control`` control data (always
    gloo, CPU tensors); with one rank both are None and nothing is communicated. ``calls`` counts the communications that
    really happened: name → count; ``sent_elsewhere`` adds up the bytes ``all_to_all`` sent to other ranks (rows a rank
    sends itself never leave the process and do not count).
    """

    def __init__(self, info: DistributedInfo, group: dist.ProcessGroup | None = None,
                 control: dist.ProcessGroup | None = None) -> None:
        self.info = info
        self.group = group
        self.control = control
        self.calls: Counter[str] = Counter()
        self.sent_elsewhere = 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """各秩的 ``x`` 逐元素相加，结果**就地**写回每个秩的 ``x`` 并返回它。一个秩时原样返回、不记数。

        en: Add every rank's ``x`` element-wise, write the result **in place** into each rank's ``x`` and return it.
        With one rank, return it unchanged and count nothing.
        """
        # >>> TASK all_reduce: 各秩的 x 逐元素求和，和必须留在调用者手里的那个 x 里（就地）并返回它；真的通信了就在 calls 里按操作名记一笔，走数据组。只有一个秩时原样返回，不通信、不记数
        # en: every rank's x summed element-wise, the sum left in the caller's own x (in place) and that x returned; a real communication is counted once in calls under the operation's name and goes over the data group. With one rank: return it unchanged, no communication, no count
        # hint1: torch.distributed 的求和本身就是就地的、缺省就是 SUM：别返回新张量，也别先 clone。一个秩时根本没有进程组，连通信函数都不能碰
        # en1: torch.distributed's reduction already works in place and sums by default: return no new tensor and clone nothing.
        # en1: With one rank there is no process group, so do not even touch the communication call
        # hint2: 1. self.info.size == 1 时直接 return x；
        # hint2: 2. 否则 dist.all_reduce(x, group=self.group)（数据组，缺省 ReduceOp.SUM）；
        # hint2: 3. self.calls["all_reduce"] += 1，return x。
        # en2: 1. if self.info.size == 1: return x;
        # en2: 2. otherwise dist.all_reduce(x, group=self.group) (the data group, ReduceOp.SUM by default);
        # en2: 3. self.calls["all_reduce"] += 1 and return x.
        if self.info.size == 1:
            return x
        dist.all_reduce(x, group=self.group)
        self.calls["all_reduce"] += 1
        return x
        # <<< TASK

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """各秩的 ``x``（形状 ``(..., d)``，每个秩一样）沿**最后一维**按秩号拼起来：形状 ``(..., size * d)``，
        ``[..., r*d:(r+1)*d]`` 是秩 ``r`` 的那份。一个秩时原样返回、不记数。

        底下的通信只会沿第 0 维接（:func:`_all_gather_flat`）：先收成 ``(size, ...)``，再把秩这一维挪到最后一维
        之前、合并。直接 ``reshape`` 会让一行装下某个秩的整份，而不是每行由各秩的那一段拼成。

        en: Join every rank's ``x`` (shape ``(..., d)``, the same on every rank) along the **last dimension** in rank
        order: shape ``(..., size * d)``, where ``[..., r*d:(r+1)*d]`` is rank ``r``'s piece. With one rank, return it
        unchanged and count nothing.

        The communication underneath only joins along dimension 0 (:func:`_all_gather_flat`): gather into
        ``(size, ...)`` first, then move the rank dimension to just before the last one and merge. A plain ``reshape``
        makes a row hold one rank's whole piece, instead of each row joining every rank's part of it.
        """
        # >>> TASK all_gather: 返回一个新张量：各秩的 x 沿最后一维按秩号拼起来，(..., d) 变成 (..., 秩数·d)，列 r·d 到 (r+1)·d 是秩 r 的那份；二维、三维都要对。一个秩时返回 x 本身、不记数，否则在 calls 里记一笔。给定：_all_gather_flat（只会沿第 0 维接）
        # en: return a new tensor: every rank's x joined along the last dimension in rank order, (..., d) becomes (..., ranks·d), columns r·d to (r+1)·d being rank r's piece; 2-D and 3-D alike. With one rank return x itself and count nothing, otherwise count one in calls. Given: _all_gather_flat (it only joins along dimension 0)
        # hint1: 底下的通信沿第 0 维接，收回来直接 reshape 形状对、数全错（也不报错）：先让“秩”这一维紧挨在最后一维之前，再把这两维合并。
        # hint1: 收的地方要自己先分配好，送出去的张量要连续
        # en1: The communication underneath joins along dimension 0,
        # en1: and a plain reshape of what comes back has the right shape and the wrong numbers (silently):
        # en1: first put the rank dimension just before the last one, then merge those two. Allocate the receiving buffer yourself and send a contiguous tensor
        # hint2: 1. size = self.info.size；为 1 时 return x；
        # hint2: 2. out = x.new_empty((size * x.shape[0], *x.shape[1:]))，_all_gather_flat(out, x.contiguous(), self.group)，self.calls["all_gather"] += 1；
        # hint2: 3. out.view(size, *x.shape) 是 (秩, ..., d)；.movedim(0, -2) 变成 (..., 秩, d)；
        # hint2: 4. 再 .reshape(*x.shape[:-1], size * x.shape[-1]) 返回（movedim(0, -1) 不对：那样每一列都在各秩之间交替）。
        # en2: 1. size = self.info.size; if it is 1, return x;
        # en2: 2. out = x.new_empty((size * x.shape[0], *x.shape[1:])), _all_gather_flat(out, x.contiguous(), self.group), self.calls["all_gather"] += 1;
        # en2: 3. out.view(size, *x.shape) is (rank, ..., d); .movedim(0, -2) makes it (..., rank, d);
        # en2: 4. then return .reshape(*x.shape[:-1], size * x.shape[-1]) (movedim(0, -1) is wrong: every column would alternate between the ranks).
        size = self.info.size
        if size == 1:
            return x
        out = x.new_empty((size * x.shape[0], *x.shape[1:]))
        _all_gather_flat(out, x.contiguous(), self.group)
        self.calls["all_gather"] += 1
        return out.view(size, *x.shape).movedim(0, -2).reshape(*x.shape[:-1], size * x.shape[-1])
        # <<< TASK

    def agree_min(self, value: int) -> int:
        """大家都同意的数：各秩的 ``value`` 里最小的那个（例如每个秩放得下的 KV 页数，取最小的，谁都不会超）。
        走控制组：一个 CPU 上的 int64 张量，``ReduceOp.MIN``。一个秩时原样返回、不记数。

        en: The number everyone agrees on: the smallest of the ranks' ``value`` (e.g. the KV pages each rank can hold:
        take the smallest and nobody overflows). Goes over the control group: one int64 CPU tensor, ``ReduceOp.MIN``.
        With one rank, return it unchanged and count nothing.
        """
        # >>> TASK agree_min: 返回各秩的 value 里最小的那个，是个 Python int；走控制组（gloo、CPU 上的张量，不走数据组），真的通信了就在 calls 里记一笔。一个秩时原样返回 value、不记数
        # en: return the smallest of the ranks' value as a Python int, over the control group (gloo, CPU tensors; not the data group); a real communication is counted once in calls. With one rank return value unchanged and count nothing
        # hint1: 集合通信只收张量：把这个整数装进一个 CPU 上的小整数张量，让归约取最小而不是求和，收完再变回 Python 整数。GPU 上数据组是 NCCL，收不了 CPU 张量
        # en1: Collectives take tensors only: put the integer in a small integer tensor on the CPU, make the reduction take the minimum instead of the sum,
        # en1: and turn the result back into a Python int. On a GPU the data group is NCCL, which cannot take a CPU tensor
        # hint2: 1. self.info.size == 1 时 return value；
        # hint2: 2. t = torch.tensor([value], dtype=torch.int64)；
        # hint2: 3. dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)，self.calls["agree_min"] += 1；
        # hint2: 4. return int(t.item())。
        # en2: 1. if self.info.size == 1: return value;
        # en2: 2. t = torch.tensor([value], dtype=torch.int64);
        # en2: 3. dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control), self.calls["agree_min"] += 1;
        # en2: 4. return int(t.item()).
        if self.info.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)
        self.calls["agree_min"] += 1
        return int(t.item())
        # <<< TASK


    def all_to_all(self, x: torch.Tensor, send_splits: list[int],
                   recv_splits: list[int] | None = None) -> tuple[torch.Tensor, list[int]]:
        """每个秩把 ``x`` 的行按 ``send_splits`` 分给各秩（前 ``send_splits[0]`` 行给秩 0，接着的给秩 1……，条数可以
        不等、可以是 0），返回收到的行（按发出的秩号排）和从每个秩收到几行。``recv_splits`` 已知时（回程：条数就是去程
        的反过来）不再先交换条数。一个秩时原样返回、不记数。第 4.5 章把 token 发给持有它的专家的秩，用的就是它。

        en: Each rank deals the rows of ``x`` out by ``send_splits`` (the first ``send_splits[0]`` rows to rank 0, the
        next ones to rank 1, ...; the counts may differ and may be 0) and gets back the rows it received (in sending-rank
        order) and how many came from each rank. With ``recv_splits`` known (the return trip: the outbound counts
        reversed) the counts are not exchanged first. With one rank, return it unchanged and count nothing. Chapter 4.5
        sends each token to the rank holding its expert with it.
        """
        if self.info.size == 1:
            return x, list(send_splits)
        if recv_splits is None:
            # 每个秩先知道要收几行，才能分配收的地方。条数走数据组（张量放在 x 所在的设备上）、不走控制组：重叠调度时
            # 前向在自己的线程里跑，调度器的线程正同时在控制组上通信，同一个组上两个线程的集合通信在各秩上的先后不同，就会互相等死
            # en: each rank must know how many rows come before it can allocate room for them. The counts go over the data
            # en: group (a tensor on x's device), not the control group: with overlap scheduling the forward runs in a
            # en: thread of its own while the scheduler's thread uses the control group, and two threads' collectives on
            # en: one group, ordered differently on different ranks, wait on each other forever
            send = torch.tensor(send_splits, dtype=torch.int64, device=x.device)
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send, group=self.group)
            recv_splits = recv.tolist()
        out = x.new_empty((sum(recv_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_splits, list(send_splits), group=self.group)
        self.calls["all_to_all"] += 1
        self.sent_elsewhere += (sum(send_splits) - send_splits[self.info.rank]) * x[:1].numel() * x.element_size()
        return out, recv_splits


def default_backend(device: torch.device) -> str:
    """GPU 上是 NCCL，CPU 上是 gloo。

    en: NCCL on a GPU, gloo on the CPU.
    """
    return "nccl" if device.type == "cuda" else "gloo"


def rendezvous(info: DistributedInfo, addr: str, wait: timedelta, timeout: timedelta) -> dist.TCPStore:
    """集合点：秩 0 在 ``addr`` 上开一个键值存储，其余的秩连上去，互相交换地址。秩 0 自己绑好套接字再交给存储：
    不然 torch 的存储会在**所有**网卡上监听，而不只是 ``addr`` 那一个。

    每个秩最多等 ``wait``，直到 ``info.size`` 个秩都到了；等的时候只做很短的、Python 能打断的事（试连端口、数人数），
    所以 Ctrl-C 立刻生效；过了 ``wait`` 就抛 :class:`TimeoutError`，说出地址和该查什么。到齐之后，存储的每次操作最多等
    ``timeout``——集合通信的那个长上限：NCCL 的第一次集合通信也要经它交换地址。

    en: The rendezvous: rank 0 opens a key-value store at ``addr``, the other ranks connect to it and swap addresses.
    Rank 0 binds the socket itself and hands it to the store: otherwise torch's store listens on **every** interface,
    not just the one of ``addr``.

    Each rank waits at most ``wait`` until ``info.size`` ranks are there; while waiting it only does short things Python
    can interrupt (trying the port, counting heads), so Ctrl-C works at once; past ``wait`` it raises
    :class:`TimeoutError`, naming the address and what to check. Once all are there, each operation of the store waits
    at most ``timeout`` — the collectives' long limit: NCCL's first collective swaps addresses through it too.
    """
    host, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + wait.total_seconds()
    try:
        if info.is_primary:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, int(port)))
            except OSError as e:
                sock.close()
                raise RuntimeError(tr("Rank 0 cannot open the rendezvous at {addr}: {error}. It must be an address of "
                                      "node 0 itself, with a free port", addr=addr, error=e.strerror or e)) from None
            sock.listen()
            store = dist.TCPStore(host, int(port), info.size, is_master=True, timeout=wait, wait_for_workers=False,
                                  master_listen_fd=sock.detach())
        else:
            _wait_for_listener(info, host, int(port), deadline, wait)
            store = dist.TCPStore(host, int(port), info.size, is_master=False, timeout=wait, wait_for_workers=False)
        store.add(_ARRIVED, 1)
        while (arrived := store.add(_ARRIVED, 0)) < info.size:
            if time.monotonic() >= deadline:
                raise TimeoutError(tr(
                    "Only {arrived} of {size} ranks reached the rendezvous at {addr} within {seconds:g} s. Check that "
                    "every node is started, all with the same --dist-init-addr and --nnodes, and that port {port} of "
                    "{host} is reachable from the other nodes (a firewall?); --dist-timeout sets this wait",
                    arrived=arrived, size=info.size, addr=addr, seconds=wait.total_seconds(), port=port, host=host))
            time.sleep(_POLL_S)
    except dist.DistError as e:  # 存储本身出错（例如秩 0 先走了）：只留第一行，不带 C++ 调用栈 | en: the store failed (e.g. rank 0 left): keep the first line, no C++ stack
        raise ConnectionError(tr("Rank {rank} lost the rendezvous at {addr}: {error}", rank=info.rank, addr=addr,
                                 error=str(e).strip().splitlines()[0])) from None
    store.set_timeout(timeout)
    return store


def _wait_for_listener(info: DistributedInfo, host: str, port: int, deadline: float, wait: timedelta) -> None:
    """秩 0 以外的秩：一次一次地试连 ``host:port``（每次至多一秒），直到有人在听，或者过了 ``deadline``。
    torch 的存储自己连时卡在 C++ 里：Ctrl-C 不管用，重试还会打印 C++ 调用栈。

    en: Ranks other than 0: try to connect to ``host:port`` again and again (at most a second each time) until someone
    listens or ``deadline`` passes. torch's store connecting by itself blocks in C++: Ctrl-C does nothing, and its
    retries print C++ stacks.
    """
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(1.0, max(deadline - time.monotonic(), _POLL_S))):
                return
        except socket.gaierror as e:
            raise RuntimeError(tr("Rank {rank} cannot resolve the host of the rendezvous {host}:{port}: {error}",
                                  rank=info.rank, host=host, port=port, error=e.strerror or e)) from None
        except OSError as e:
            error = e.strerror or str(e) or type(e).__name__
        if time.monotonic() >= deadline:
            raise TimeoutError(tr(
                "Rank {rank} found no rendezvous at {host}:{port} within {seconds:g} s ({error}). Check that node 0 is "
                "started, with the same --dist-init-addr and --nnodes as this node, and that port {port} of {host} is "
                "reachable from here (a firewall?); --dist-timeout sets this wait",
                rank=info.rank, host=host, port=port, seconds=wait.total_seconds(), error=error))
        time.sleep(_POLL_S)


def init_distributed(info: DistributedInfo, addr: str, device: torch.device | None = None,
                     rendezvous_timeout: float | None = None) -> Communicator:
    """加入进程组，返回这个秩的 :class:`Communicator`，并把它设为本进程的张量并行通信器（:func:`get_tp_comm`）。

    ``addr`` 是集合点 ``"host:port"``，每个秩都一样（端口由父进程向系统要来，见 :func:`minisgl.processes.ranks.free_port`；
    集合点本身是给定的 :func:`rendezvous`）。
    一个秩时不建任何组。数据组的后端按设备选（:func:`default_backend`），控制组总是 gloo。两个上限分开：在集合点上最多等
    ``rendezvous_timeout`` 秒（缺省 :data:`RENDEZVOUS_TIMEOUT_S`），会合之后两个组的集合通信都最多等
    :data:`COLLECTIVE_TIMEOUT_S` 秒。

    en: Join the process group, return this rank's :class:`Communicator`, and make it this process's tensor-parallel
    communicator (:func:`get_tp_comm`).

    ``addr`` is the rendezvous ``"host:port"``, the same on every rank (the parent asked the OS for the port, see
    :func:`minisgl.processes.ranks.free_port`; the rendezvous itself is the given :func:`rendezvous`). With one rank no group is
    made. The data group's backend follows the device (:func:`default_backend`), the control group is always gloo. Two
    separate limits: the rendezvous waits at most ``rendezvous_timeout`` seconds (default :data:`RENDEZVOUS_TIMEOUT_S`);
    once met, collectives of both groups wait at most :data:`COLLECTIVE_TIMEOUT_S` seconds.
    """
    device = device or torch.device("cpu")
    wait = timedelta(seconds=RENDEZVOUS_TIMEOUT_S if rendezvous_timeout is None else rendezvous_timeout)
    timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    # >>> TASK init_distributed: 返回这个秩的 Communicator，并把它设为本进程的张量并行通信器（之后 get_tp_comm 拿到的就是它）。一个秩：什么都不通信，也不碰那个地址。多个秩：全体在集合点会合，人到齐之前最多等 wait；会合之后，任何一次集合通信最多等 timeout——秩之间差几秒是常事，人没到齐却要尽早知道。张量通信走适合张量所在之处的那种；CPU 上的小整数走它自己的、全部秩都在的一条通道，不和张量共用：别的线程可能正在那边搬张量，而且 NCCL（GPU 上的选择）只搬 GPU 上的张量。给定：rendezvous、default_backend、wait、timeout
    # en: return this rank's Communicator and make it this process's tensor-parallel communicator (what get_tp_comm gives afterwards). One rank: communicate nothing and never touch the address. Several ranks: all meet at the rendezvous, waiting at most wait for everyone to arrive; once met, any collective waits at most timeout — ranks a few seconds apart are normal, while a rank that never arrives should be known early. Tensor collectives go through what suits where the tensors live; the small integers on the CPU travel on a channel of their own among all ranks, never shared with the tensors: another thread may be moving tensors at that very moment, and NCCL (the GPU choice) moves GPU tensors only. Given: rendezvous, default_backend, wait, timeout
    # hint1: 集合点的存储交给建进程组的那个函数，它建的缺省组就是数据组；控制组是在它之后每个秩都按同样顺序再建的一个组。
    # hint1: 集合点要两个上限：等人到齐的和之后的。一个秩在集合通信里等另一个秩校准内核几秒是正常的，所以组的上限不能是会合的那个短上限。
    # hint1: 不管几个秩，最后都要登记成本进程的通信器
    # en1: Hand the rendezvous store to the function that makes the process group: the default group it makes is the data group;
    # en1: the control group is one more group every rank makes after it, in the same order. The rendezvous takes two limits:
    # en1: for everyone to arrive, and for afterwards. A rank waiting seconds in a collective while a peer calibrates a kernel is
    # en1: normal, so the groups' limit cannot be the short one of the meeting. Whatever the rank count, register the communicator
    # en1: as this process's at the end
    # hint2: 1. info.size == 1：comm = Communicator(info)；
    # hint2: 2. 否则 dist.init_process_group(default_backend(device), store=rendezvous(info, addr, wait, timeout), rank=info.rank, world_size=info.size, timeout=timeout)；
    # hint2: 3. control = dist.new_group(backend="gloo", timeout=timeout)；comm = Communicator(info, dist.group.WORLD, control)；
    # hint2: 4. set_tp_comm(comm)，return comm。
    # en2: 1. info.size == 1: comm = Communicator(info);
    # en2: 2. otherwise dist.init_process_group(default_backend(device), store=rendezvous(info, addr, wait, timeout), rank=info.rank, world_size=info.size, timeout=timeout);
    # en2: 3. control = dist.new_group(backend="gloo", timeout=timeout); comm = Communicator(info, dist.group.WORLD, control);
    # en2: 4. set_tp_comm(comm) and return comm.
    if info.size == 1:
        comm = Communicator(info)
    else:
        dist.init_process_group(default_backend(device), store=rendezvous(info, addr, wait, timeout), rank=info.rank,
                                world_size=info.size, timeout=timeout)
        control = dist.new_group(backend="gloo", timeout=timeout)
        comm = Communicator(info, dist.group.WORLD, control)
    set_tp_comm(comm)
    return comm
    # <<< TASK


def destroy_distributed() -> None:
    """离开进程组（若加入过），本进程又回到一个秩。

    en: Leave the process group (if joined); this process is one rank again.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    set_tp_comm(Communicator(DistributedInfo()))


_TP_COMM = Communicator(DistributedInfo())


def set_tp_comm(comm: Communicator) -> None:
    """设定本进程的张量并行通信器：切分的层（第 4.2 章）都用它。

    en: Set this process's tensor-parallel communicator: the sharded layers (chapter 4.2) all use it.
    """
    global _TP_COMM
    _TP_COMM = comm


def get_tp_comm() -> Communicator:
    """本进程的张量并行通信器；没调过 :func:`init_distributed` 时是一个秩的那个。

    en: This process's tensor-parallel communicator; the one-rank one until :func:`init_distributed` is called.
    """
    return _TP_COMM


def get_tp_info() -> DistributedInfo:
    """本进程是张量并行的第几个秩、一共几个（上游 mini-sglang 的名字）。

    en: Which tensor-parallel rank this process is, and how many there are (upstream mini-sglang's name).
    """
    return _TP_COMM.info
