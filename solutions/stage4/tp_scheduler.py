"""第 4.3 章 tp_scheduler：步调一致的秩——每个秩都跑整个调度器，输入逐字节相同，只有秩 0 回话。

第 4.2 章切开了模型：每一步，每个秩都得用**同样形状**的批次、按**同样顺序**调用前向，集合通信才对得上——差一个请求、
换一个顺序，某个秩就在 ``all_reduce`` 里等一个永远不来的伙伴（或者更糟：和别的秩的另一层加在一起，算出错的数）。
SGLang 和上游 mini-sglang 的做法：**每个秩都跑完整的调度器**，只要输入一样、决定规则是确定的，大家就做出一样的决定，
不必在每一步互相商量批次。要一样的是：

- **输入**：只有秩 0 从分词进程收消息，再经 XPUB 转给其余的秩（第 3.1 章的订阅握手，订阅端没到齐之前不发，免得第一条
  消息丢掉）。每个秩要在同一次迭代看到同一批消息——ZMQ 本身不保证“什么时候到”，各秩得就“这次迭代的消息到哪一条为止”
  达成一致：每次迭代的代价有上限，空闲的秩也不能在集合通信里等；
- **规则**：解码批次按 uid 排（不按内存地址决定的集合顺序：上游的一个问题就是 ``set`` 的顺序在各秩上不同），采样器
  各秩同一个种子，KV 页数各秩取最小值（第 4.2 章 ``TPEngine`` 的 ``agree_min``）；
- **输出**：只有秩 0 有去往分词进程和 API 服务器的套接字；其余的秩照样做出每个决定（取消、结束、拒绝），只是没有地方
  可说。

取消和退出也是消息，经同一条路到达每个秩：取消在每个秩上释放同样的页，退出让每个秩在同一次迭代离开。

en: Chapter 4.3 tp_scheduler: ranks that agree — every rank runs the whole scheduler on byte-identical input, and only
rank 0 answers.

Chapter 4.2 split the model: at every step every rank must call the forward with a batch of **the same shape** in **the
same order**, or the collectives no longer match — one request more, one order different, and a rank waits in
``all_reduce`` for a partner that never comes (or worse: adds its sum to another rank's different layer and computes
wrong numbers). SGLang and upstream mini-sglang do it like this: **every rank runs the complete scheduler**; with the
same input and deterministic rules all of them make the same decisions, without agreeing on each batch at each step.
What must be the same:

- **the input**: only rank 0 receives from the tokenizer, and passes the messages on to the other ranks over XPUB
  (chapter 3.1's subscriber handshake: nothing is sent before every subscriber is there, so the first message is not
  lost). Every rank must see the same messages in the same iteration — ZMQ alone does not say *when* a message arrives,
  so the ranks must agree on where each iteration's messages end: at a bounded cost per iteration, and with no idle rank
  waiting inside a collective;
- **the rules**: the decode batch is ordered by uid (not by a set's order, which follows memory addresses: one of
  upstream's issues was a ``set`` ordered differently on each rank), one sampler seed on every rank, and every rank
  takes the smallest KV page count (``agree_min`` in chapter 4.2's ``TPEngine``);
- **the output**: only rank 0 has sockets to the tokenizer and the API server; the other ranks make every decision all
  the same (abort, finish, reject), they just have no one to tell.

Aborts and exit are messages too and reach every rank the same way: an abort frees the same pages on every rank, an exit
makes every rank leave in the same iteration.
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist
import zmq

from minisgl.core import Batch
from minisgl.distributed import DistributedInfo, get_tp_comm, get_tp_info, init_distributed
from minisgl.engine import resolve_device
from minisgl.message import BaseBackendMsg, Message, ZmqPubQueue, ZmqSubQueue, deserialize, unwrap
from minisgl.scheduler_io import SchedulerIO, serve_scheduler
from minisgl.scheduling import DecodeManager, SchedulerParts
from minisgl.server.args import ServerAddrs, ServerArgs, set_process_name
from minisgl.tensor_parallel import TPEngine

#: 秩 0 等其余的秩订阅它的 XPUB 的最长时间（秒）。
#: en: The longest time (seconds) rank 0 waits for the other ranks to subscribe to its XPUB.
SUBSCRIBE_TIMEOUT_S = 60.0


class UidOrderDecodeManager(DecodeManager):
    """正在解码的请求，批次里按 uid 排：每个秩上一样，不论它们加入的先后。

    en: The decoding requests, ordered by uid in the batch: the same on every rank, whatever order they joined in.
    """

    def schedule_next_batch(self) -> Batch | None:
        # >>> TASK decode_order: 没有正在运行的请求时返回 None（同父类）；否则返回一个解码批次，装着全部正在运行的请求，按 uid 从小到大排，不论它们加入的先后。running_reqs 本身不能动
        # en: with no running request return None (as the parent does); otherwise return a decode batch of all the running requests ordered by uid, smallest first, whatever order they joined in. Leave running_reqs itself as it is
        # hint1: 父类的做法几乎就是答案，只差顺序：父类按加入的先后（字典的顺序）装批次，而各秩上的先后可以不同；uid 在每个秩上都一样
        # en1: The parent's method is nearly the answer, only the order differs: it fills the batch in joining order (the dict's order),
        # en1: which may differ between ranks; a uid is the same on every rank
        # hint2: 1. if not self.runnable: return None；
        # hint2: 2. return Batch(reqs=sorted(self.running_reqs, key=lambda r: r.uid), phase="decode")（sorted 给出新列表，不改 running_reqs）。
        # en2: 1. if not self.runnable: return None;
        # en2: 2. return Batch(reqs=sorted(self.running_reqs, key=lambda r: r.uid), phase="decode") (sorted makes a new list and leaves running_reqs alone).
        if not self.runnable:
            return None
        return Batch(reqs=sorted(self.running_reqs, key=lambda r: r.uid), phase="decode")
        # <<< TASK


class _Nowhere:
    """秩 0 以外的秩“去往分词进程”的队列：什么都收下，什么都不发。

    en: The "to the tokenizer" queue of ranks other than 0: takes everything, sends nothing.
    """

    def put(self, msg: Message) -> None:
        pass

    def close(self) -> None:
        pass


class TPScheduler(SchedulerIO):
    """一个秩的调度器：第 3.3 章的调度器，引擎换成切开的 :class:`~minisgl.tensor_parallel.TPEngine`，
    解码按 uid 排，消息由秩 0 收下再转给大家。先 :func:`~minisgl.distributed.init_distributed`。

    en: One rank's scheduler: chapter 3.3's scheduler with the split
    :class:`~minisgl.tensor_parallel.TPEngine`, decoding in uid order, and messages received by rank 0 and passed on to
    all. Call :func:`~minisgl.distributed.init_distributed` first.
    """

    engine_cls = TPEngine
    decode_manager_cls = UidOrderDecodeManager

    def __init__(self, model_path: str, dtype: torch.dtype | None = None, **kwargs: Any) -> None:
        super().__init__(model_path, dtype, **kwargs)
        self.tp_info = get_tp_info()
        self.comm = get_tp_comm()
        self.pub: ZmqPubQueue | None = None  # 秩 0：把收到的消息转给其余的秩 | en: rank 0: passes the messages on to the others
        self.sub: ZmqSubQueue | None = None  # 其余的秩：从秩 0 收 | en: the other ranks: receive from rank 0

    def connect(self, addrs: ServerAddrs, host: str = "127.0.0.1") -> None:
        """接上套接字。秩 0：第 3.3 章的那几个，外加在 ``host`` 的一个空闲端口上开 XPUB；其余的秩：订阅它，去往分词
        进程的队列是个空的去处。XPUB 的地址由秩 0 在控制组上广播；秩 0 等到每个秩都订阅了才返回。

        en: Attach the sockets. Rank 0: chapter 3.3's, plus an XPUB on a free port of ``host``; the other ranks:
        subscribe to it, and their queue to the tokenizer goes nowhere. Rank 0 broadcasts the XPUB's address on the
        control group, and returns only once every rank has subscribed.
        """
        # >>> TASK connect: 一个秩时和第 3.3 章完全一样，别的什么都不做。多个秩：秩 0 照第 3.3 章接好，再在 host 的一个空闲端口上开 XPUB（存进 self.pub），并把它真正的地址经控制组告诉其余的秩；其余的秩订阅它（self.sub），去往分词进程的队列换成一个哪儿也不去的。秩 0 等到其余的秩都订阅了才返回，最多等 SUBSCRIBE_TIMEOUT_S 秒。给定：ZmqPubQueue、ZmqSubQueue
        # en: with one rank do exactly what chapter 3.3 does and nothing more. Several ranks: rank 0 attaches as in chapter 3.3, then opens an XPUB on a free port of host (kept in self.pub) and tells the other ranks its real address over the control group; the others subscribe to it (self.sub) and their queue to the tokenizer goes nowhere. Rank 0 returns only once every other rank has subscribed, waiting at most SUBSCRIBE_TIMEOUT_S seconds. Given: ZmqPubQueue, ZmqSubQueue
        # hint1: 交换地址是一次集合通信，每个秩都要参加（其余的秩放个空位，调用之后里面就是秩 0 的地址）。端口要让 ZMQ 挑，再从套接字上读回真正的那个；
        # hint1: 等订阅者一定要放在交换地址之后：反过来，秩 0 在等一群还不知道地址的秩，它们又在集合通信里等秩 0
        # en1: Sharing the address is a collective every rank takes part in (the others put in a placeholder, which holds rank 0's address afterwards).
        # en1: Let ZMQ pick the port and read the real one back from the socket. Waiting for subscribers must come after the address is shared:
        # en1: the other way round, rank 0 waits for ranks that do not know the address while they wait for it in the collective
        # hint2: 1. self.tp_info.size == 1：super().connect(addrs)，return；
        # hint2: 2. endpoint = [None]；
        # hint2:    秩 0（self.tp_info.is_primary）：super().connect(addrs)，self.pub = ZmqPubQueue(f"tcp://{host}:*")，endpoint = [self.pub.socket.last_endpoint.decode()]；
        # hint2: 3. 所有秩：dist.broadcast_object_list(endpoint, src=0, group=self.comm.control)；
        # hint2: 4. 其余的秩：self.sub = ZmqSubQueue(str(endpoint[0]))，self.send_tokenizer = _Nowhere()；
        # hint2: 5. 秩 0：self.pub.wait_for_subscribers(self.tp_info.size - 1, SUBSCRIBE_TIMEOUT_S)。
        # en2: 1. self.tp_info.size == 1: super().connect(addrs) and return;
        # en2: 2. endpoint = [None];
        # en2:    rank 0 (self.tp_info.is_primary): super().connect(addrs), self.pub = ZmqPubQueue(f"tcp://{host}:*"), endpoint = [self.pub.socket.last_endpoint.decode()];
        # en2: 3. every rank: dist.broadcast_object_list(endpoint, src=0, group=self.comm.control);
        # en2: 4. the other ranks: self.sub = ZmqSubQueue(str(endpoint[0])), self.send_tokenizer = _Nowhere();
        # en2: 5. rank 0: self.pub.wait_for_subscribers(self.tp_info.size - 1, SUBSCRIBE_TIMEOUT_S).
        if self.tp_info.size == 1:
            super().connect(addrs)
            return
        endpoint: list[str | None] = [None]
        if self.tp_info.is_primary:
            super().connect(addrs)
            self.pub = ZmqPubQueue(f"tcp://{host}:*")
            endpoint = [self.pub.socket.last_endpoint.decode()]
        dist.broadcast_object_list(endpoint, src=0, group=self.comm.control)
        if not self.tp_info.is_primary:
            self.sub = ZmqSubQueue(str(endpoint[0]))
            self.send_tokenizer = _Nowhere()  # type: ignore[assignment]
        if self.pub is not None:
            self.pub.wait_for_subscribers(self.tp_info.size - 1, SUBSCRIBE_TIMEOUT_S)
        # <<< TASK

    def close(self) -> None:
        super().close()
        for queue in (self.pub, self.sub):
            if queue is not None:
                queue.close()
        self.pub = self.sub = None

    def send_stats(self) -> None:
        """现状只由秩 0 报给 API 服务器（其余的秩没有去那儿的套接字）。

        en: Only rank 0 reports the state to the API server (the other ranks have no socket to it).
        """
        if self.tp_info.is_primary:
            super().send_stats()

    def receive_msg(self, blocking: bool) -> list[BaseBackendMsg]:
        """每个秩这次迭代收到的消息——在每个秩上都是同一批、同样的顺序。``blocking`` 在每个秩上都一样（大家一起空闲）。

        en: The messages of this iteration on each rank — the same ones in the same order on every rank. ``blocking`` is
        the same on every rank (they go idle together).
        """
        if self.tp_info.size == 1:
            return super().receive_msg(blocking)
        # >>> TASK fan_out: 返回这次迭代的消息（批量消息拆成一条一条）：每个秩上都是同一批、同样的顺序，也就是分词进程发出的顺序。只有秩 0 读分词进程那边的队列；其余的秩经 connect 接好的套接字（self.pub → self.sub）从秩 0 拿到消息。blocking 时至少返回一条（没有就等），否则不等新消息（可以返回空列表）。代价有上限：不论这次有几条，每次迭代至多一次集合通信（任何组上、任何 torch.distributed 的集合通信都算；别用数据组，重叠调度的前向可能正同时在上面通信）；空闲的秩不能在集合通信里等下一条消息（集合通信会超时，空闲却可以很久）。给定：deserialize、unwrap
        # en: return this iteration's messages (batch messages split into single ones): on every rank the same ones in the same order, the order the tokenizer sent them in. Only rank 0 reads the tokenizer's queue; the other ranks get the messages from it through the sockets connect set up (self.pub → self.sub). With blocking, return at least one message (wait for it); without, do not wait for new messages (an empty list is fine). A bounded cost: at most one collective per iteration however many messages there are (any torch.distributed collective counts, on any group; keep off the data group, which the overlapped forward may be using at that very moment), and an idle rank must not wait for the next message inside a collective (collectives time out, idle spells may last hours). Given: deserialize, unwrap
        # hint1: ZMQ 只保证顺序，不保证什么时候到：秩 1 自己看不出秩 0 这次迭代收到哪一条为止，得由秩 0 每次迭代告诉它——最省事的是每次迭代在控制组上对一个数达成一致（一次集合通信，0 条也要做）。
        # hint1: 秩 0 可以绕开队列自己的取法（它会反序列化），直接从底下的套接字收字节、原样转发。空闲时其余的秩先在自己的套接字上等到数据，再进集合通信：秩 0 先发消息、再进集合通信
        # en1: ZMQ keeps the order but not the timing: rank 1 cannot tell by itself where rank 0's iteration ends, so rank 0 must tell it every iteration —
        # en1: the simplest way is to agree on one number on the control group each iteration (one collective, even for 0 messages).
        # en1: Rank 0 can bypass the queue's own getter (it deserializes), read the bytes from the socket underneath and pass them on unchanged.
        # en1: When idle, the other ranks first wait on their own socket for data, then join the collective: rank 0 sends the messages before it joins
        # hint2: 1. count = torch.zeros(1, dtype=torch.int64)；
        # hint2: 2. 秩 0：frames = [self.recv_queue.socket.recv()] if blocking else []；
        # hint2:    再循环 frames.append(self.recv_queue.socket.recv(zmq.NOBLOCK))，直到抛 zmq.Again；
        # hint2:    每帧 self.pub.socket.send(frame)；count[0] = len(frames)；dist.broadcast(count, src=0, group=self.comm.control)；
        # hint2: 3. 其余的秩：blocking 时 self.sub.socket.poll()；dist.broadcast(count, src=0, group=self.comm.control)；
        # hint2:    frames = [self.sub.socket.recv() for _ in range(int(count.item()))]；
        # hint2: 4. return [one for frame in frames for one in unwrap(deserialize(frame))]。
        # en2: 1. count = torch.zeros(1, dtype=torch.int64);
        # en2: 2. rank 0: frames = [self.recv_queue.socket.recv()] if blocking else [];
        # en2:    then loop frames.append(self.recv_queue.socket.recv(zmq.NOBLOCK)) until it raises zmq.Again;
        # en2:    self.pub.socket.send(frame) for each; count[0] = len(frames); dist.broadcast(count, src=0, group=self.comm.control);
        # en2: 3. the other ranks: if blocking, self.sub.socket.poll(); dist.broadcast(count, src=0, group=self.comm.control);
        # en2:    frames = [self.sub.socket.recv() for _ in range(int(count.item()))];
        # en2: 4. return [one for frame in frames for one in unwrap(deserialize(frame))].
        count = torch.zeros(1, dtype=torch.int64)
        if self.tp_info.is_primary:
            frames = [self.recv_queue.socket.recv()] if blocking else []
            while True:
                try:
                    frames.append(self.recv_queue.socket.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
            for frame in frames:
                self.pub.socket.send(frame)
            count[0] = len(frames)
            dist.broadcast(count, src=0, group=self.comm.control)
        else:
            if blocking:
                self.sub.socket.poll()
            dist.broadcast(count, src=0, group=self.comm.control)
            frames = [self.sub.socket.recv() for _ in range(int(count.item()))]
        return [one for frame in frames for one in unwrap(deserialize(frame))]
        # <<< TASK


# ----------------------------------------------------------------------------- 进程入口（给定）
# en: ----------------------------------------------------------------------------- process entry (given)


def rank_device(name: str, rank: int) -> torch.device:
    """秩 ``rank`` 用的设备：CUDA 上一个秩一块 GPU（第 ``rank`` 块，设为当前设备），否则是 CPU。

    en: The device of rank ``rank``: on CUDA one GPU per rank (GPU ``rank``, made the current device), else the CPU.
    """
    if resolve_device(name).type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    return resolve_device(name)


def tp_scheduler_worker(args: ServerArgs, addrs: ServerAddrs, ready: Connection, rank: int, dist_addr: str,
                        env: dict[str, str], threads: int, parts: SchedulerParts | None = None) -> None:
    """秩 ``rank`` 的调度器进程的入口（启动器用 spawn 启动它）：设好环境和线程数，加入进程组（在集合点上最多等
    ``args.dist_timeout`` 秒），建 :class:`TPScheduler`，接上套接字，交给第 3.3 章的
    :func:`~minisgl.scheduler_io.serve_scheduler`。``dist_addr`` 是集合点 ``"host:port"``，XPUB 也开在那个 host 上。
    ``parts``：组装好的引擎交给它的零件。

    en: The entry point of rank ``rank``'s scheduler process (the launcher starts it with spawn): set the environment and
    the thread count, join the process group (waiting at most ``args.dist_timeout`` seconds at the rendezvous), build
    the :class:`TPScheduler`, attach the sockets and hand it to chapter 3.3's
    :func:`~minisgl.scheduler_io.serve_scheduler`. ``dist_addr`` is the rendezvous ``"host:port"``; the XPUB opens on
    that host too. ``parts``: the parts the assembled engine hands it.
    """
    set_process_name("msgl-scheduler" if rank == 0 else f"msgl-sched-r{rank}")
    os.environ.update(env)
    torch.set_num_threads(threads)

    def build() -> TPScheduler:
        device = rank_device(args.device, rank)
        init_distributed(DistributedInfo(rank, args.tp_size), dist_addr, device, args.dist_timeout)
        kwargs = {**args.scheduler_kwargs(), "device": str(device)}
        sched = TPScheduler(args.model_path, parts=parts, **kwargs)
        try:
            sched.connect(addrs, dist_addr.rsplit(":", 1)[0])
        except BaseException:
            sched.close()
            raise
        return sched

    serve_scheduler(build, ready)
