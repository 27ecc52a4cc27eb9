"""第 4.3 章 tp_scheduler 的检查：两个真的秩（gloo，本模块一次）各跑一个 :class:`TPScheduler`，由秩 0 这边的一个
“假分词进程”喂消息（几个请求一起到、一个中途取消、一个坏请求、最后退出；转给秩 1 的消息都故意“晚到一会儿”）：每个秩
每次迭代收到同一批消息、按分词进程发出的顺序，每次迭代至多一次集合通信（检查把 torch.distributed 的集合通信包一层来数），
空闲时不在集合通信里等；走同样的步、
解码批次按 uid 排、做出同样的决定（贪心的 token 与 Hugging Face 相同，随机采样的各秩相同）、每次迭代后占用同样多的页、
在同一次迭代退出；只有秩 0 回话、每条回复正好一次。最后是真的服务器：``--tp 2`` 分成两次启动
（两个“节点”，都在 127.0.0.1），流式中途断开释放页面，另一个节点的秩死掉时服务器回 503 并以非 0 退出，不留进程。

en: Checks of chapter 4.3 tp_scheduler: two real ranks (gloo, once for the module) each run a :class:`TPScheduler` fed
by a "fake tokenizer" on rank 0's side (several requests arriving together, one aborted midway, one bad request, then
exit; every message passed on to rank 1 deliberately "arrives a moment late"): in every iteration every rank receives the same messages, in the order the tokenizer sent them, with at most one
collective per iteration (the checks wrap torch.distributed's collectives to count them) and without waiting inside a
collective while idle; every rank takes the same steps, orders the decode batch by uid, makes the same decisions
(greedy tokens equal Hugging Face's, sampled ones equal across ranks), holds the same number of pages after each
iteration and leaves in the same iteration; only rank 0 replies, each reply exactly once. Last, a real
server: ``--tp 2`` as two launches (two "nodes", both on 127.0.0.1), a stream dropped midway frees its pages, and when
the other node's rank dies the server answers 503 and exits non-zero, leaving no process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from checks.common import expect
from checks.hf_reference import greedy_reference
from checks.stage1.conftest import LATER_PROMPTS
from checks.stage3.conftest import (TINY_SERVER_ARGS, Server, descendants, idle, read_events, send_request, start_server,
                                   stop_server)
from checks.stage4.common import count_collectives, run_step, step
from minisgl.i18n import tr

WORLD = 2
#: 喂给调度器的请求：uid → (提示词, max_tokens, 温度)。uid 故意不按加入顺序排；7 号会在中途被取消。
#: en: The requests fed to the schedulers: uid → (prompt, max_tokens, temperature). The uids are deliberately not in
#: en: the order they join; number 7 is aborted midway.
REQUESTS = {5: (LATER_PROMPTS[0], 6, 0.0), 2: (LATER_PROMPTS[1], 6, 0.0), 9: (LATER_PROMPTS[2], 6, 1.0),
            7: (LATER_PROMPTS[3], 40, 0.0)}
ABORTED, LATE = 7, 3
#: 这里的集合通信最多等几秒（课程的缺省是 300 秒），以及最后空闲多久：空闲的秩若在集合通信里等，就会超时出错。
#: en: How long the collectives here wait at most (the course's default is 300 s), and how long the ranks then stay
#: en: idle: an idle rank that waits inside a collective times out with an error.
COLLECTIVE_TIMEOUT_S, IDLE_S = 10, 12
#: 每次迭代收完消息，两个秩经 ipc 目录里的文件（不经 torch.distributed）比一比收到的，最多等对方这么多秒：
#: 一旦不一样就马上说出是哪次迭代、各收到了什么，不必等之后的集合通信卡住。
#: en: After receiving in each iteration, the two ranks compare what they received through files in the ipc directory
#: en: (not through torch.distributed), waiting at most this many seconds for each other: a difference is reported at
#: en: once, naming the iteration and what each received, instead of waiting for a later collective to get stuck.
COMPARE_WAIT_S = 8
def arrive_late(sock: Any) -> None:
    """让这个 SUB 套接字上的每条消息都“晚到一会儿”：对还没露过面的下一条，第一次不等的查看（带 NOBLOCK 的 recv、
    ``poll(0)``）看不到它，之后才看得到；等着的查看（不带 NOBLOCK 的 recv、限时或不限时地 poll）照常。ZMQ 只保证顺序、
    不保证时机，正确的协议分不出这和真的晚到一点有什么不同；“此刻到了几条就取几条”却每次都取少。

    en: Make every message on this SUB socket "arrive a moment late": the first look at the next message that does not
    wait (a recv with NOBLOCK, ``poll(0)``) does not see it yet, later looks do; looks that wait (a recv without NOBLOCK,
    a poll with or without a time limit) work as usual. ZMQ promises order, not timing, so a correct protocol cannot tell
    this from a real late arrival, while "take whatever is there right now" takes too few every time.
    """
    import zmq

    class Late(type(sock)):  # type: ignore[misc]
        shown = False  # 下一条已经露过面 | en: the next message has shown itself

        def poll(self, timeout: int | None = None, flags: int = zmq.POLLIN) -> int:
            if timeout == 0 and flags & zmq.POLLIN and not self.shown and super().poll(0, zmq.POLLIN):
                self.shown = True
                return 0
            events = super().poll(timeout, flags)
            self.shown = self.shown or bool(events & zmq.POLLIN)
            return events

        def recv(self, flags: int = 0, copy: bool = True, track: bool = False) -> Any:
            if flags & zmq.NOBLOCK and not self.shown and super().poll(0, zmq.POLLIN):
                self.shown = True
                raise zmq.Again()
            frame = super().recv(flags, copy=copy, track=track)
            self.shown = bool(self.getsockopt(zmq.RCVMORE))  # 同一条消息的下一部分已经在了 | en: the next part of one message is there already
            return frame

    sock.__class__ = Late


def _user_msg(uid: int, prompt: list[int], max_tokens: int, temperature: float) -> Any:
    from minisgl.core import SamplingParams
    from minisgl.message import UserMsg

    return UserMsg(uid, torch.tensor(prompt, dtype=torch.int32),
                   SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True))


def _feed(sched: Any, push: Any, it: int, state: dict[str, Any]) -> bool:
    """秩 0 这边的假分词进程：按剧本在第几次迭代之前推什么消息；剧本演完、调度器空闲时推 ExitMsg。推过的（拆开的）
    消息按顺序记进 ``state["pushed"]``。返回还要不要迭代。

    en: The fake tokenizer on rank 0's side: what to push before which iteration; once the script is done and the
    scheduler is idle, push an ExitMsg. The (split) messages pushed are noted in order in ``state["pushed"]``. Returns
    whether to iterate further.
    """
    from minisgl.message import AbortBackendMsg, BatchBackendMsg, ExitMsg, unwrap

    def put(msg: Any) -> None:
        push.put(msg)
        state["pushed"] += [(type(m).__name__, getattr(m, "uid", None)) for m in unwrap(msg)]

    if it == 0:
        # 三个一起到（一条批量消息），第四个单独到
        # en: three arrive together (one batch message), the fourth alone
        first = [_user_msg(uid, *REQUESTS[uid]) for uid in (5, 2, 9)]
        put(BatchBackendMsg(data=first))
        put(_user_msg(ABORTED, *REQUESTS[ABORTED]))
    elif not state["aborted"] and (state["tokens"][ABORTED] >= 3 or not sched.busy):  # 没等到也接着演 | en: go on even if it never came
        put(AbortBackendMsg(ABORTED))
        put(_user_msg(LATE, LATER_PROMPTS[0], 4, 0.0))
        put(_user_msg(LATE, [5, 6], 4, 0.0))  # uid 重复：拒绝 | en: a repeated uid: refused
        state["aborted"] = True
    elif state["aborted"] and not sched.busy and not state["exit"]:
        time.sleep(IDLE_S)  # 空闲得比集合通信的时限还久 | en: idle for longer than the collectives' time limit
        put(ExitMsg())
        state["exit"] = True
    if not sched.busy:
        time.sleep(0.05)  # 让刚推的消息到达，秩 0 空闲时会阻塞地等它 | en: let what was just pushed arrive; an idle rank 0 blocks for it
    return True


def loop_steps(rank: int, tiny: str, ipc_dir: str, out: dict[str, Any]) -> None:
    from minisgl.distributed import get_tp_comm

    # 这次迭代收消息时的集合通信：receive_msg 里、在调用它的线程里发起的，任何组上的都算（重叠调度的前向在另一个线程里
    # 同时跑，它的不算）。在导入本章的模块之前包好
    # en: this iteration's collectives while receiving: those started inside receive_msg, in the thread that called it,
    # en: on any group (the overlapped forward runs at the same time in another thread; its own do not count). Wrapped
    # en: before this chapter's module is imported
    noted: list[str] = []
    inside: list[int | None] = [None]  # 正在 receive_msg 里的线程 | en: the thread inside receive_msg

    def note(name: str, group: Any) -> None:
        if inside[0] == threading.get_ident():
            control = get_tp_comm().control
            noted.append(name if group is not None and group is control else
                         tr("{name} (not on the control group)", name=name))

    count_collectives(note)

    from minisgl.message import ZmqPullQueue, ZmqPushQueue, unwrap
    from minisgl.server.args import ServerAddrs
    from minisgl.tp_scheduler import TPScheduler

    addrs = ServerAddrs.in_dir(ipc_dir)
    log: dict[str, Any] = {"msgs": [], "steps": [], "events": [], "pages": [], "replies": [], "collectives": [],
                           "empty_blocking": []}
    state: dict[str, Any] = {"aborted": False, "exit": False, "tokens": Counter(), "pushed": []}

    def build() -> Any:
        return TPScheduler(tiny, dtype=torch.float32, device="cpu", max_running_req=8, num_page_override=512,
                           max_seq_len_override=128, cache_type="naive")

    def connect(sched: Any) -> None:
        sched.connect(addrs)
        log["subscribers"] = sched.pub.subscribers if rank == 0 else None
        if rank != 0 and getattr(sched, "sub", None) is not None:
            arrive_late(sched.sub.socket)  # 转来的消息都晚到一会儿 | en: every message passed on arrives a moment late

    def run(sched: Any) -> dict[str, Any]:
        replies_in = frontend_in = push = None
        if rank == 0:
            replies_in = ZmqPullQueue(addrs.tokenizer, create=True)
            frontend_in = ZmqPullQueue(addrs.frontend, create=True)
            push = ZmqPushQueue(addrs.backend, create=False)
        sched.add_step_listener(lambda t: log["steps"].append((t.phase, list(t.uids))))

        def on_event(e: Any) -> None:
            log["events"].append((e.uid, e.token, e.finished, e.reason))
            if e.token is not None:
                state["tokens"][e.uid] += 1

        sched.add_result_listener(on_event)
        receive = sched.receive_msg  # 公开的接口：每次迭代收到的消息 | en: the public method: the messages each iteration receives

        def record(blocking: bool) -> list[Any]:
            inside[0] = threading.get_ident()
            try:
                msgs = receive(blocking)
            finally:
                inside[0] = None
            log["msgs"][-1].extend((type(msg).__name__, getattr(msg, "uid", None)) for msg in msgs)
            if blocking and not msgs:
                log["empty_blocking"].append(len(log["msgs"]) - 1)
            compare(len(log["msgs"]) - 1, log["msgs"][-1])
            return msgs

        def compare(it: int, got: list[Any]) -> None:
            mine, theirs = (Path(ipc_dir) / f"received-{r}-{it}.json" for r in (rank, 1 - rank))
            mine.with_suffix(".tmp").write_text(json.dumps(got))
            mine.with_suffix(".tmp").replace(mine)
            deadline = time.monotonic() + COMPARE_WAIT_S
            while not theirs.exists():
                if time.monotonic() > deadline:
                    raise AssertionError(tr(
                        "Iteration {it}: rank {rank} received {got}, but rank {other} had not finished receiving after {seconds} s",
                        it=it, rank=rank, got=got, other=1 - rank, seconds=COMPARE_WAIT_S))
                time.sleep(0.002)
            other = [tuple(m) for m in json.loads(theirs.read_text())]
            if other != got:
                zero, one = (got, other) if rank == 0 else (other, got)
                raise AssertionError(tr(
                    "Iteration {it}: rank 0 received {zero}, rank 1 received {one}: every rank must receive the same messages, in the same order, in the same iteration",
                    it=it, zero=zero, one=one))

        sched.receive_msg = record
        try:
            for it in range(400):
                if rank == 0:
                    _feed(sched, push, it, state)
                log["msgs"].append([])
                noted.clear()
                going = sched.run_once()
                log["collectives"].append(list(noted))
                log["pages"].append(sched.pages_in_use())
                if not going:
                    break
            sched._drain()
            if rank == 0:
                while (msg := replies_in.get(timeout=0.5)) is not None:
                    log["replies"] += [(type(m).__name__, m.uid) for m in unwrap(msg)]
            log["status"] = sorted(sched.status)
            log["pushed"] = state["pushed"]
            return log
        finally:
            for queue in (replies_in, frontend_in, push):
                if queue is not None:
                    queue.close()

    holder: dict[str, Any] = {}
    run_step(out, "build", lambda: holder.setdefault("sched", build()) and None)
    if out["build"][0] != "ok":
        return
    sched = holder["sched"]
    run_step(out, "connect", lambda: connect(sched))
    if out["connect"][0] == "ok":
        run_step(out, "loop", lambda: run(sched))
    sched.close()
    sched.shutdown()


def serving_scenario(rank: int, world_size: int, addr: str, tiny: str, ipc_dir: str) -> dict[str, Any]:
    import minisgl.distributed
    from minisgl.distributed import DistributedInfo, destroy_distributed, init_distributed

    minisgl.distributed.COLLECTIVE_TIMEOUT_S = COLLECTIVE_TIMEOUT_S
    out: dict[str, Any] = {}
    run_step(out, "init", lambda: init_distributed(DistributedInfo(rank, world_size), addr) and None)
    if out["init"][0] == "ok":
        loop_steps(rank, tiny, ipc_dir, out)
        destroy_distributed()
    return out


@pytest.fixture(scope="module")
def ranks(tiny_path: str) -> Iterator[list[dict[str, Any]]]:
    """两个秩跑完全部步骤的结果（本模块只起一次）。

    en: The two ranks' results of all steps (started once for this module).
    """
    from minisgl.processes.ranks import run_ranks

    with tempfile.TemporaryDirectory(prefix="msgl-tp-") as ipc_dir:
        yield run_ranks(serving_scenario, WORLD, tiny_path, ipc_dir, timeout=90)


def loops(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return step(ranks, "loop", "build")


# ----------------------------------------------------------------------------- 解码顺序 | en: decode order


def test_decode_batch_is_ordered_by_uid() -> None:
    from minisgl.core import Req, SamplingParams
    from minisgl.tp_scheduler import UidOrderDecodeManager

    manager = UidOrderDecodeManager()
    expect(manager.schedule_next_batch(), None, tr("With no running request there is no decode batch"))
    reqs = [Req(torch.tensor([1, 2], dtype=torch.int32), row, 0, 4, uid, SamplingParams()) for row, uid in
            enumerate([5, 2, 9, 7])]
    for req in reqs:
        req.complete_one()
    manager.filter_reqs(reqs)
    batch = manager.schedule_next_batch()
    expect([r.uid for r in batch.reqs] if batch else None, [2, 5, 7, 9],
           tr("Requests that joined as uid 5, 2, 9, 7 decode in uid order on every rank, whatever order they joined in"))
    expect(batch.phase if batch else None, "decode", tr("The decode batch has phase 'decode'"))


# ----------------------------------------------------------------------------- 秩们步调一致 | en: ranks that agree


def test_every_rank_receives_the_same_messages(ranks: list[dict[str, Any]]) -> None:
    logs = loops(ranks)
    expect(logs[1]["msgs"], logs[0]["msgs"], tr(
        "In every iteration rank 1 must handle exactly the messages rank 0 received, in the same order (a list per iteration)"))
    seen = Counter(m for it in logs[0]["msgs"] for m in it)
    want = Counter({("UserMsg", uid): 1 for uid in REQUESTS} | {("UserMsg", LATE): 2, ("AbortBackendMsg", ABORTED): 1,
                                                                ("ExitMsg", None): 1})
    expect(dict(seen), dict(want), tr("Every message fed to rank 0 is handled once on each rank, none lost, none twice"))
    expect([m for it in logs[0]["msgs"] for m in it], logs[0]["pushed"], tr(
        "The messages are handled in the order the tokenizer sent them (batch messages split in place)"))
    expect(logs[0]["msgs"][-1], [("ExitMsg", None)], tr("The exit message is the last one, and every rank leaves in that iteration"))


def test_a_blocking_receive_returns_a_message(ranks: list[dict[str, Any]]) -> None:
    expect([log["empty_blocking"] for log in loops(ranks)], [[]] * WORLD, tr(
        "With blocking, receive_msg returns at least one message on every rank (iterations where it returned none, per rank)"))


def test_rank_0_connects_once_every_rank_subscribed(ranks: list[dict[str, Any]]) -> None:
    expect(loops(ranks)[0]["subscribers"], WORLD - 1, tr(
        "connect() returns on rank 0 only once the other rank has subscribed (else the first messages can be lost)"))


def test_an_idle_rank_waits_outside_the_collectives(ranks: list[dict[str, Any]]) -> None:
    loops(ranks)  # 秩 1 空闲时若在集合通信里等，会超时出错，这一步就失败 | en: a rank 1 idling inside a collective times out, and this fails
    expect([log["msgs"][-1] for log in loops(ranks)], [[("ExitMsg", None)]] * WORLD, tr(
        "After {idle} s idle (collectives time out after {limit} s) both ranks still take the exit message: an idle rank waits for messages outside any collective",
        idle=IDLE_S, limit=COLLECTIVE_TIMEOUT_S))


def test_every_rank_takes_the_same_steps_in_uid_order(ranks: list[dict[str, Any]]) -> None:
    logs = loops(ranks)
    expect(logs[1]["steps"], logs[0]["steps"], tr("Both ranks take the same steps with the same requests in the same order"))
    unsorted = [uids for phase, uids in logs[0]["steps"] if phase == "decode" and uids != sorted(uids)]
    expect(unsorted, [], tr("Every decode batch is ordered by uid (the requests joined as 5, 2, 9, 7)"))


def test_every_rank_makes_the_same_decisions(ranks: list[dict[str, Any]], tiny_path: str) -> None:
    logs = loops(ranks)
    expect(logs[1]["events"], logs[0]["events"], tr(
        "Both ranks decide the same for every request (tokens, finishes, the abort) — sampled tokens included: one seed"))
    tokens: dict[int, list[int]] = {}
    for uid, token, _, _ in logs[0]["events"]:
        if token is not None:
            tokens.setdefault(uid, []).append(token)
    greedy = [5, 2, LATE]
    want = greedy_reference(tiny_path, [REQUESTS.get(uid, (LATER_PROMPTS[0],))[0] for uid in greedy], 6)
    got = [tokens.get(uid, []) for uid in greedy]
    expect(got, [w[:len(g)] if uid == LATE else w for uid, g, w in zip(greedy, got, want)],
           tr("At TP=2 the greedy requests generate Hugging Face's tokens"))
    expect(len(tokens.get(LATE, [])), 4, tr("The request that arrived after the abort generates its 4 tokens"))
    ends = {uid: reason for uid, _, finished, reason in logs[0]["events"] if finished}
    expect(ends, {5: "length", 2: "length", 9: "length", ABORTED: "abort", LATE: "length"},
           tr("Each request ends once, with the right reason (the aborted one with 'abort')"))


def test_abort_frees_pages_on_every_rank(ranks: list[dict[str, Any]]) -> None:
    logs = loops(ranks)
    expect(logs[1]["pages"], logs[0]["pages"], tr("After every iteration both ranks hold the same number of KV pages"))
    expect([log["pages"][-1] for log in logs], [0, 0], tr("Once everything ended (one request aborted), every rank has all its pages back"))
    expect([log["status"] for log in logs], [[], []], tr("No rank keeps an unsettled request"))


def test_only_rank_0_replies_once(ranks: list[dict[str, Any]]) -> None:
    logs = loops(ranks)
    replies = Counter(logs[0]["replies"])
    events = Counter(("DetokenizeMsg", uid) for uid, _, _, reason in logs[0]["events"] if reason != "abort")
    expect(dict(replies), dict(events | Counter({("RejectMsg", LATE): 1})), tr(
        "The tokenizer gets each decision once (one DetokenizeMsg per token or finish, one RejectMsg for the request with a repeated uid, nothing for the abort): only rank 0 replies"))
    expect(logs[1]["replies"], [], tr("Rank 1 has no socket to the tokenizer"))


def test_at_most_one_collective_per_iteration(ranks: list[dict[str, Any]]) -> None:
    logs = loops(ranks)
    over = [{it: names for it, names in enumerate(log["collectives"]) if len(names) > 1} for log in logs]
    expect(over, [{}] * WORLD, tr(
        "Receiving costs at most one collective per iteration, however many messages arrive (every torch.distributed "
        "collective counts, on any group; the forward's own do not). Per rank, the iterations over budget and their collectives"))


# ----------------------------------------------------------------------------- 一个秩、离线接口 | en: one rank, the offline API


def test_one_rank_is_the_chapter_3_3_scheduler(tiny_path: str) -> None:
    from minisgl.distributed import get_tp_comm
    from minisgl.message import ExitMsg, ZmqPullQueue, ZmqPushQueue, unwrap
    from minisgl.server.args import ServerAddrs
    from minisgl.tp_scheduler import TPScheduler

    with tempfile.TemporaryDirectory(prefix="msgl-tp1-") as ipc_dir:
        addrs = ServerAddrs.in_dir(ipc_dir)
        replies, stats = ZmqPullQueue(addrs.tokenizer, create=True), ZmqPullQueue(addrs.frontend, create=True)
        sched = TPScheduler(tiny_path, dtype=torch.float32, device="cpu", max_running_req=2, num_page_override=64,
                            max_seq_len_override=32, cache_type="naive")
        push = None
        try:
            sched.connect(addrs)
            push = ZmqPushQueue(addrs.backend, create=False)
            push.put(_user_msg(1, LATER_PROMPTS[1], 3, 0.0))
            for _ in range(20):
                sched.run_once()
                if not sched.busy:
                    break
            push.put(ExitMsg())
            going = sched.run_once()
            got = []
            while (msg := replies.get(timeout=0.5)) is not None:
                got += [(type(m).__name__, m.uid, m.finished) for m in unwrap(msg)]
        finally:
            for queue in (replies, stats, push):
                if queue is not None:
                    queue.close()
            sched.close()
            sched.shutdown()
    expect(got, [("DetokenizeMsg", 1, False), ("DetokenizeMsg", 1, False), ("DetokenizeMsg", 1, True)], tr(
        "At one rank TPScheduler connects and replies like chapter 3.3's scheduler (3 tokens, the last one finishing)"))
    expect(going, False, tr("At one rank the exit message still ends the loop"))
    expect(dict(get_tp_comm().calls), {}, tr("At one rank nothing is forwarded or broadcast"))


def test_offline_llm_with_tp_size_2(tiny_path: str) -> None:
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    want = greedy_reference(tiny_path, LATER_PROMPTS[:2], 6)
    llm = LLM(tiny_path, dtype=torch.float32, tp_size=2, device="cpu", num_page_override=256, max_seq_len_override=64)
    procs = list(llm.procs)
    try:
        out = llm.generate(LATER_PROMPTS[:2], SamplingParams(max_tokens=6, ignore_eos=True))
        expect([o["token_ids"] for o in out], want, tr("LLM(path, tp_size=2).generate gives Hugging Face's greedy tokens"))
        with pytest.raises(ValueError):
            llm.generate([[10**7]], SamplingParams(max_tokens=2))
        again = llm.generate(LATER_PROMPTS[:1], SamplingParams(max_tokens=6, ignore_eos=True))
        expect(again[0]["token_ids"], want[0], tr("After a refused bad prompt the ranks still serve the next call"))
    finally:
        llm.shutdown()
    expect([p.is_alive() for p in procs], [False, False], tr("shutdown() stops every rank process"))


# ----------------------------------------------------------------------------- 真的服务器：两个节点 | en: a real server: two nodes


@pytest.fixture(scope="module")
def two_nodes(tiny_path: str) -> Iterator[tuple[Server, subprocess.Popen[str]]]:
    """``--tp 2`` 分成两次启动：节点 1 先起（只有它的秩），节点 0 带 HTTP；集合点的端口由这里向系统要。

    en: ``--tp 2`` as two launches: node 1 first (only its rank), then node 0 with HTTP; the rendezvous port is asked
    from the OS here.
    """
    from minisgl.course import select
    from minisgl.processes.ranks import free_port

    addr = f"127.0.0.1:{free_port()}"
    flags = ["--tp", "2", "--nnodes", "2", "--dist-init-addr", addr]
    log = tempfile.TemporaryFile("w+")
    node1 = subprocess.Popen([sys.executable, "-m", "minisgl", "--model", tiny_path, *TINY_SERVER_ARGS, *flags, "--node-rank", "1"],
                             env={**os.environ, **select.impl_env(), "PYTHONUNBUFFERED": "1"}, stdout=log,
                             stderr=subprocess.STDOUT, text=True)
    server = None
    try:
        server = start_server(*flags, "--node-rank", "0")
        yield server, node1
    finally:
        if server is not None and not server.stopped:
            stop_server(server)
        try:
            node1.wait(30)
        except subprocess.TimeoutExpired:
            node1.kill()
            node1.wait(10)
        log.close()


def test_two_nodes_answer_like_hugging_face(two_nodes: tuple[Server, subprocess.Popen[str]], tiny_path: str) -> None:
    from transformers import AutoTokenizer

    server, _ = two_nodes
    want = AutoTokenizer.from_pretrained(tiny_path).decode(greedy_reference(tiny_path, [LATER_PROMPTS[0]], 6)[0])
    status, data = server.post("/v1/completions", {"prompt": LATER_PROMPTS[0], "max_tokens": 6, "temperature": 0,
                                                   "ignore_eos": True})
    assert status == 200, tr("A completion at TP=2 over two nodes answers 200, got {status}: {data}", status=status, data=data)
    expect(data["choices"][0]["text"], want, tr("Two nodes at TP=2 generate Hugging Face's greedy text"))


def test_two_nodes_free_pages_after_a_dropped_stream(two_nodes: tuple[Server, subprocess.Popen[str]]) -> None:
    server, _ = two_nodes
    before = server.wait_metrics(idle, tr("an idle server"))
    conn = send_request(server, "/v1/completions", {"prompt": LATER_PROMPTS[0], "max_tokens": 100, "temperature": 0,
                                                    "ignore_eos": True, "stream": True})
    got = read_events(conn.getresponse(), 3)
    conn.close()
    assert len(got) == 3, tr("The stream ended early: {events}", events=got)
    m = server.wait_metrics(idle, tr("every page and slot back after the client left"))
    aborted = m["minisgl_aborted_requests_total"] - before["minisgl_aborted_requests_total"]
    generated = m["minisgl_decode_tokens_total"] - before["minisgl_decode_tokens_total"]
    assert aborted == 1 and generated < 100, tr(
        "A client that leaves mid-stream at TP=2 aborts its request on every rank (aborted +1, fewer than 100 tokens), got aborted +{aborted}, {generated} tokens",
        aborted=aborted, generated=generated)
    status, data = server.post("/v1/completions", {"prompt": LATER_PROMPTS[1], "max_tokens": 4, "temperature": 0})
    assert status == 200, tr("After the abort both ranks still serve (they freed the same pages), got {status}: {data}",
                             status=status, data=data)


def test_a_dead_rank_makes_the_server_answer_503_and_exit(two_nodes: tuple[Server, subprocess.Popen[str]]) -> None:
    server, node1 = two_nodes
    assert server.proc is not None
    rank1 = [p for p in descendants(node1.pid) if Path(f"/proc/{p}/comm").read_text().strip() == "msgl-sched-r1"]
    assert len(rank1) == 1, tr("Expected one msgl-sched-r1 process under node 1, found {n}", n=len(rank1))
    node1_procs = descendants(node1.pid)
    os.kill(rank1[0], signal.SIGKILL)
    status, data = server.post("/v1/completions", {"prompt": LATER_PROMPTS[1], "max_tokens": 4}, timeout=60)
    assert status == 503, tr("With rank 1 dead, a request gets 503 (rank 0 fails in its next collective), got {status}: {data}",
                             status=status, data=data)
    try:
        code = server.proc.wait(60)
        node1_code = node1.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail(tr("After a rank died, node 0 and node 1 must exit by themselves"), pytrace=False)
    code = stop_server(server)  # 只收尾并检查没有留下进程 | en: only tidies up and checks nothing is left
    assert code != 0 and node1_code != 0, tr(
        "After a rank died both launches exit non-zero, got node 0: {code}, node 1: {node1}; node 0's output:\n{output}",
        code=code, node1=node1_code, output=server.output)
    left = [p for p in node1_procs if _running(p)]
    assert not left, tr("Node 1 left processes behind: {pids}", pids=left)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
