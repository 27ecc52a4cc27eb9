"""第 3.3 章 scheduler_io 的检查：调度器经真实的 ZMQ 套接字收发消息。

检查自己扮演分词进程和 API 服务器：绑定反分词进程与 API 服务器的收信套接字，往调度器的收信套接字里送消息，
一次一次地调用 ``run_once()``（在一个看门的线程里：有事可做时它绝不能等消息）。检查的内容：

- 经消息得到的贪心 token 与 Hugging Face 逐个相同，uid 沿用 API 服务器给的；
- 每一步恰好一条 ``BatchTokenizerMsg``，里面是这一步得到新 token 的请求；几个请求同在一个解码批里；
  ``SchedulerStats`` 每一步之后都有，计数（预填充、前缀缓存命中、解码、步数）准确；
- 结束原因：``length``（max_tokens 恰好，包括填满上下文的）、``stop``（EOS：``next_token`` 为 -1，之后多算的一步
  不再发任何消息）；
- 取消：等待中的、运行中的、已结束的、不认识的；取消不回消息（分词进程已经答复了客户端），取消之后也再没有消息；
  最后页面和请求槽全部回来；
- 进门处已经查过的请求照单收下；只有 uid 重复时回 ``RejectMsg``，调度器接着服务下一个请求；
- 只在空闲时阻塞；``ExitMsg`` 结束循环；
- 调度器进程：报告就绪，SIGTERM 后以 0 退出、不留子进程；起不来时报告错误。

en: Checks of chapter 3.3 scheduler_io: the scheduler sends and receives messages over real ZMQ sockets. The checks play
the tokenizer process and the API server, call ``run_once()`` one iteration at a time (in a watchdog thread: with work
to do it must never wait for a message), and start the real worker process once.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable, Iterator

import pytest
import torch

from checks.hf_reference import greedy_reference
from minisgl.core import SamplingParams
from minisgl.course import select
from minisgl.env import ENV
from minisgl.processes.harness import child_pids
from minisgl.i18n import tr
from minisgl.message import (
    AbortBackendMsg,
    BatchBackendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    RejectMsg,
    SchedulerStats,
    UserMsg,
    UserReply,
    ZmqPullQueue,
    ZmqPushQueue,
)
from minisgl.scheduler_io import SchedulerIO, scheduler_worker
from minisgl.server.args import ServerAddrs, ServerArgs, make_ipc_dir
from minisgl.trace import StepTrace

#: 检查里的调度器：4 个请求槽、每个请求最多 64 个 token、一步预填充最多 32 个 token（长提示词会分块）。
#: en: The scheduler in these checks: 4 request slots, at most 64 tokens per request, at most 32 prefill tokens a step
#: (long prompts are chunked).
KW: dict[str, Any] = dict(dtype=torch.float32, device="auto", max_running_req=4, num_page_override=256,
                          max_seq_len_override=64, max_extend_tokens=32)  # fmt: skip
PROMPTS = ["Hello, my name is", "The capital of France is", "1, 2, 3,", "def add(a, b):", "Once upon a time"]
#: 一次 run_once 最多等这么久（秒）：有事可做时它应当远远更快地返回。
#: en: The longest one run_once may take (seconds) when there is work: it should return far sooner.
STEP_TIMEOUT = 10.0
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


# ----------------------------------------------------------------------------- 扮演分词进程和 API 服务器


class Harness:
    """检查这一头的套接字：往调度器送消息，收反分词进程和 API 服务器该收的消息；在看门线程里调用 ``run_once``。"""

    def __init__(self, sched: Any, addrs: ServerAddrs) -> None:
        self.sched = sched
        self.tok = ZmqPullQueue(addrs.tokenizer, create=True)
        self.front = ZmqPullQueue(addrs.frontend, create=True)
        self.to_sched = ZmqPushQueue(addrs.backend, create=False)
        self.blocked = ""  # 第一次有事可做却阻塞的检查 | en: the first check in which run_once blocked with work to do

    def close(self) -> None:
        for q in (self.tok, self.front, self.to_sched):
            q.close()

    def send(self, *msgs: Any) -> None:
        """几条消息装进一条 ``BatchBackendMsg``，一起到达。"""
        self.to_sched.put(msgs[0] if len(msgs) == 1 else BatchBackendMsg(data=list(msgs)))

    def start_once(self) -> Runner:
        runner = Runner(self.sched.run_once)
        runner.start()
        return runner

    def step(self) -> bool:
        """调用一次 ``run_once``；它等了消息（有事可做却阻塞）就失败。阻塞过一次之后，后面的检查立刻失败，
        不再各等 ``STEP_TIMEOUT`` 秒：同一个错误只花一次时间、只说一次。

        en: Call ``run_once`` once; fail if it waited for a message (blocked although there was work). After one such
        block, later checks fail at once instead of each waiting ``STEP_TIMEOUT`` seconds: one mistake costs its time
        and is told once.
        """
        self.fail_if_blocked()
        runner = self.start_once()
        if not runner.wait(STEP_TIMEOUT):
            busy = self.sched.busy  # 放开之前读：放开之后它可能已经空闲 | en: read before releasing: afterwards it may be idle
            self.blocked = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
            self.send(AbortBackendMsg(uid=-1))  # 放开阻塞的线程 | en: release the blocked thread
            runner.wait(STEP_TIMEOUT)
            pytest.fail(tr("run_once waited for a message for over {seconds} s although the scheduler had work to do "
                           "(busy={busy}): block only when idle", seconds=STEP_TIMEOUT, busy=busy), pytrace=False)  # fmt: skip
        return runner.result()

    def fail_if_blocked(self) -> None:
        """前面的检查里 ``run_once`` 有事可做却阻塞过：立刻失败，指向那一处。

        en: ``run_once`` blocked with work to do in an earlier check: fail at once, pointing at it.
        """
        if self.blocked:
            pytest.fail(tr("run_once blocked with work to do in an earlier check ({first}); fix that one first",
                           first=self.blocked), pytrace=False)

    def run(self, *msgs: Any, max_iters: int = 400) -> int:
        """送出 ``msgs``，然后一直迭代到调度器空闲。返回迭代次数。"""
        if msgs:
            self.send(*msgs)
        for i in range(max_iters):
            if i > 0 and not self.sched.busy:
                return i
            self.step()
        pytest.fail(tr("The scheduler was still busy after {n} iterations", n=max_iters), pytrace=False)

    def batches(self, quiet: float = 0.3) -> list[BatchTokenizerMsg]:
        """收下已经发给反分词进程的全部批量消息（安静 ``quiet`` 秒就算收完）。"""
        return list(_drain(self.tok, quiet))

    def stats(self, quiet: float = 0.3) -> list[SchedulerStats]:
        return list(_drain(self.front, quiet))


class Runner(threading.Thread):
    """在线程里跑一个函数，记下结果或异常。"""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            self.error = err

    def wait(self, timeout: float) -> bool:
        self.join(timeout)
        return not self.is_alive()

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def _drain(queue: ZmqPullQueue, quiet: float) -> Iterator[Any]:
    while (msg := queue.get(timeout=quiet)) is not None:
        yield msg


def user_msg(uid: int, ids: list[int], sp: SamplingParams = GREEDY) -> UserMsg:
    return UserMsg(uid=uid, input_ids=torch.tensor(ids, dtype=torch.int32), sampling_params=sp)


def per_uid(batches: list[BatchTokenizerMsg]) -> dict[int, list[Any]]:
    """uid → 发给它的消息（按顺序）。"""
    out: dict[int, list[Any]] = {}
    for batch in batches:
        assert isinstance(batch, BatchTokenizerMsg), tr("Expected a BatchTokenizerMsg, got {value!r}", value=batch)
        for msg in batch.data:
            out.setdefault(msg.uid, []).append(msg)
    return out


def tokens_of(msgs: list[Any]) -> list[int]:
    return [m.next_token for m in msgs if isinstance(m, DetokenizeMsg) and m.next_token != -1]


def assert_stream(uid: int, msgs: list[Any], tokens: list[int], reason: str | None) -> None:
    """一个请求收到的全部消息：``tokens`` 依次各一条，最后一条结束、带着 ``reason``；结束之后再没有消息。
    ``reason`` 为 ``None``：被取消了，没有结束的那一条。"""
    assert all(isinstance(m, DetokenizeMsg) for m in msgs), tr("Request {uid}: expected only DetokenizeMsg, got {msgs}", uid=uid, msgs=msgs)
    got = [(m.next_token, m.finished, m.finish_reason) for m in msgs]
    want = [(t, False, None) for t in tokens]
    if reason == "length":
        want[-1] = (tokens[-1], True, "length")
    elif reason == "stop":  # EOS：最后一条不是文本 | en: EOS: the last one is not text
        want.append((-1, True, reason))
    assert got == want, tr("Request {uid}: expected the messages (next_token, finished, finish_reason) {want}, got {got}",
                           uid=uid, want=want, got=got)  # fmt: skip


def assert_idle(sched: Any, stats: list[SchedulerStats]) -> None:
    """空闲：请求槽、页面全部回来，没有留下任何请求的账目；最后一条 SchedulerStats 也这么说。"""
    assert not sched.busy, tr("The scheduler is still busy")
    assert sched.table_manager.available_size == sched.max_running_req, tr(
        "Not all request slots were returned: {available_size} / {max_running_req} free",
        available_size=sched.table_manager.available_size, max_running_req=sched.max_running_req)
    sched.cache_manager.check_integrity()
    assert sched.status == {}, tr("Finished requests must not stay in scheduler.status: {uids}", uids=sorted(sched.status))
    cached = sched.cache_manager.prefix_cache.size_info.total_size // sched.page_size
    assert stats, tr("No SchedulerStats arrived")
    last = stats[-1]
    assert (last.running, last.waiting, last.pages_in_use, last.pages_total) == (0, 0, cached, sched.cache_manager.num_pages), tr(
        "The last SchedulerStats should show an idle scheduler (running 0, waiting 0, only the prefix cache's {cached} "
        "pages in use, {total} in total), got {last}", cached=cached, total=sched.cache_manager.num_pages, last=last)


# ----------------------------------------------------------------------------- 夹具


@pytest.fixture(scope="module")
def harness(tiny_path: str) -> Iterator[Harness]:
    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = False  # 重叠调度默认开启 | en: overlap scheduling on, the default
    sched = SchedulerIO(tiny_path, **KW)
    addrs = ServerAddrs.in_dir(make_ipc_dir())
    sched.connect(addrs)
    h = Harness(sched, addrs)
    yield h
    h.close()
    sched.close()
    sched.shutdown()
    ENV.DISABLE_OVERLAP_SCHEDULING.value = saved


@pytest.fixture
def h(harness: Harness) -> Iterator[Harness]:
    """每个检查开始时调度器空闲、套接字里没有残留消息。"""
    harness.batches(quiet=0.05)
    harness.stats(quiet=0.05)
    yield harness


@pytest.fixture(scope="module")
def prompt_ids(harness: Harness) -> list[list[int]]:
    return [harness.sched.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]


@pytest.fixture(scope="module")
def reference(tiny_path: str, prompt_ids: list[list[int]]) -> list[list[int]]:
    return greedy_reference(tiny_path, prompt_ids, GREEDY.max_tokens)


# ----------------------------------------------------------------------------- 检查


def test_greedy_tokens_over_messages_equal_generate_and_hf(h: Harness, prompt_ids, reference) -> None:  # noqa: ANN001
    uids = [1000, 7, 42, 3, 99999]  # API 服务器给的 uid，不从 0 数起 | en: uids from the API server, not counting from 0
    h.run(*[user_msg(uid, ids) for uid, ids in zip(uids, prompt_ids)])
    got = per_uid(h.batches())
    assert sorted(got) == sorted(uids), tr("Replies must use the uids the API server chose {want}; got replies for {got}",
                                           want=sorted(uids), got=sorted(got))  # fmt: skip
    for uid, ref in zip(uids, reference):
        assert_stream(uid, got[uid], ref, "length")
    assert_idle(h.sched, h.stats())


def test_one_batch_per_step_and_a_shared_decode_batch(h: Harness, prompt_ids, reference) -> None:  # noqa: ANN001
    steps: list[StepTrace] = []
    remove = h.sched.add_step_listener(steps.append)
    start = h.stats()[-1:] or [h.sched.stats()]
    max_tokens = [3, 5, 7, 8]
    try:
        # 四个请求各自一条消息，先都送到，再开始跑 | en: four requests, one message each, all delivered before the run
        for i, n in enumerate(max_tokens):
            h.send(user_msg(200 + i, prompt_ids[i], SamplingParams(max_tokens=n, ignore_eos=True)))
        time.sleep(0.3)
        iters = h.run()
    finally:
        remove()
    batches = h.batches()
    with_output = [[u for u, out in zip(s.uids, s.outputs) if out] for s in steps]
    with_output = [uids for uids in with_output if uids]
    got = [[m.uid for m in b.data] for b in batches]
    assert got == with_output, tr(
        "Exactly one BatchTokenizerMsg per step, holding the requests that got a token in that step, in batch order: "
        "steps gave {want}, the messages held {got}", want=with_output, got=got)
    decode = [len(s.uids) for s in steps if not s.is_prefill]
    assert max(decode, default=0) == 4, tr("The four requests should decode in one batch; decode batch sizes: {sizes}", sizes=decode)
    for i, n in enumerate(max_tokens):
        assert_stream(200 + i, per_uid(batches)[200 + i], reference[i][:n], "length")
    stats = h.stats()
    assert_idle(h.sched, stats)
    before, after = start[-1], stats[-1]
    per_step = stats[1:] if stats and stats[0].steps == before.steps and (stats[0].running, stats[0].waiting) == (0, 0) else stats
    assert len(per_step) == iters, tr("One SchedulerStats after each of the {iters} iterations that took a step (plus one "
                                      "when going idle), got {n}: {stats}", iters=iters, n=len(per_step), stats=stats)  # fmt: skip
    seen = {s.steps for s in stats}
    missing = sorted(set(range(before.steps + 1, after.steps + 1)) - seen)
    assert not missing, tr("A SchedulerStats must follow every step; none came after steps {missing}", missing=missing)
    prefill = sum(s.tokens for s in steps if s.is_prefill)
    hits = sum(c for s in steps if s.is_prefill for c in s.cached_lens)
    delta = {
        "steps": after.steps - before.steps,
        "prefill_tokens": after.prefill_tokens - before.prefill_tokens,
        "cache_hit_tokens": after.cache_hit_tokens - before.cache_hit_tokens,
        "decode_tokens": after.decode_tokens - before.decode_tokens,
    }
    want = {"steps": len(steps), "prefill_tokens": prefill, "cache_hit_tokens": hits, "decode_tokens": sum(decode)}
    assert delta == want, tr("SchedulerStats counters grew by {delta}; the steps say {want}", delta=delta, want=want)
    assert after.max_decode_batch >= 4, tr("SchedulerStats.max_decode_batch should be at least 4, got {n}", n=after.max_decode_batch)


def test_cache_hits_and_chunks_in_stats(h: Harness) -> None:
    sched = h.sched
    long_ids = [(i * 7919) % 5000 + 100 for i in range(45)]  # 45 个 token：分两块（32 + 13）| en: 45 tokens: two chunks (32 + 13)
    start = h.stats()[-1:] or [sched.stats()]
    h.run(user_msg(300, long_ids, SamplingParams(max_tokens=2, ignore_eos=True)))
    first = h.stats()[-1]
    assert (first.prefill_tokens - start[-1].prefill_tokens, first.cache_hit_tokens - start[-1].cache_hit_tokens) == (45, 0), tr(
        "A new 45-token prompt computed in two chunks: 45 prefill tokens and no cache hit (the second chunk continues the "
        "first, it is no hit); got prefill {prefill}, hits {hits}",
        prefill=first.prefill_tokens - start[-1].prefill_tokens, hits=first.cache_hit_tokens - start[-1].cache_hit_tokens)
    h.run(user_msg(301, long_ids, SamplingParams(max_tokens=2, ignore_eos=True)))
    second = h.stats()
    again = second[-1]
    assert (again.prefill_tokens - first.prefill_tokens, again.cache_hit_tokens - first.cache_hit_tokens) == (1, 44), tr(
        "The same prompt again: the prefix cache holds all but the last token, so 44 hit tokens and 1 prefill token; got "
        "prefill {prefill}, hits {hits}", prefill=again.prefill_tokens - first.prefill_tokens,
        hits=again.cache_hit_tokens - first.cache_hit_tokens)
    assert_idle(sched, second)
    h.batches()


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_finish_reasons(h: Harness, prompt_ids, overlap: bool) -> None:  # noqa: ANN001
    sched = h.sched
    ids = prompt_ids[4]
    h.run(user_msg(399, ids, SamplingParams(max_tokens=12, ignore_eos=True)))
    full = tokens_of(per_uid(h.batches())[399])
    k = next(i for i in range(1, len(full)) if full[i] not in full[:i])  # 第一次出现的 token 当作 EOS | en: a first-time token as EOS
    limit = sched.max_seq_len
    room = limit - len(prompt_ids[0])
    saved_eos, saved_overlap = sched.eos_token_id, ENV.DISABLE_OVERLAP_SCHEDULING.value
    sched.eos_token_id = full[k]
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    steps: list[StepTrace] = []
    remove = sched.add_step_listener(steps.append)
    try:
        h.send(
            user_msg(400, ids, SamplingParams(max_tokens=12)),  # 在 EOS 处停下 | en: stops at EOS
            user_msg(401, ids, SamplingParams(max_tokens=12, ignore_eos=True)),  # EOS 也是文本 | en: EOS is text too
            user_msg(402, ids, SamplingParams(max_tokens=1, ignore_eos=True)),
            user_msg(403, prompt_ids[0], SamplingParams(max_tokens=room, ignore_eos=True)),  # 直到上下文用完 | en: until the context is full
        )
        late_abort = False
        for i in range(200):
            if i > 0 and not sched.busy:
                break
            status = sched.status.get(400)
            if overlap and not late_abort and status is not None and status.finished:
                # 400 刚在 EOS 处结束、多算的一步还在途：这时来的取消要忽略 | en: 400 has just ended at EOS and the extra
                # en: step is still in flight: an abort arriving now must be ignored
                h.send(AbortBackendMsg(uid=400))
                time.sleep(0.05)
                late_abort = True
            h.step()
        assert late_abort or not overlap, tr("Setup: request 400 should stay known for one more step after EOS (overlap)")
    finally:
        sched.eos_token_id, ENV.DISABLE_OVERLAP_SCHEDULING.value = saved_eos, saved_overlap
        remove()
    got = per_uid(h.batches())
    assert sorted(got) == [400, 401, 402, 403], tr("Replies go to the requests sent, and to no other; got replies for "
                                                   "{uids}", uids=sorted(got))  # fmt: skip
    assert_stream(400, got.get(400, []), full[:k], "stop")
    assert_stream(401, got.get(401, []), full, "length")
    assert_stream(402, got.get(402, []), full[:1], "length")
    n403 = len(tokens_of(got.get(403, [])))
    assert n403 == room and got[403][-1].finish_reason == "length", tr(
        "A request whose max_tokens fills the context up to the limit ({limit}, the prompt has {n} tokens) gets exactly "
        "{room} tokens and finish_reason 'length'; got {got} tokens", n=len(prompt_ids[0]), limit=limit,
        room=room, got=n403)
    if overlap:
        computed = sum(u == 400 for s in steps for u in s.uids)
        assert computed == k + 2, tr("With overlap the step after EOS is already launched and computed ({want} steps for "
                                     "the request), yet sends nothing; it computed {got}", want=k + 2, got=computed)  # fmt: skip
    assert_idle(sched, h.stats())


def test_abort_waiting_running_finished_and_unknown(h: Harness, prompt_ids) -> None:  # noqa: ANN001
    sched = h.sched
    long = SamplingParams(max_tokens=40, ignore_eos=True)
    # 四个槽位被 500..503 占满，504 只能等待；505 在同一批消息里就被取消 | en: 500..503 fill the four slots, 504 waits;
    # en: 505 is aborted in the same batch of messages
    h.send(*[user_msg(500 + i, prompt_ids[i], long) for i in range(5)], user_msg(505, prompt_ids[0]), AbortBackendMsg(uid=505))
    h.step()
    h.step()
    waiting = [p.uid for p in sched.prefill_manager.pending_list]
    running = [r.uid for r in sched.decode_manager.running_reqs]
    assert waiting == [504] and 500 in running, tr("Setup: 504 should be waiting and 500 running; waiting {waiting}, running {running}",
                                                    waiting=waiting, running=running)  # fmt: skip
    # 每个取消都发两次：第二次要忽略 | en: each abort twice: the second must be ignored
    h.send(*[AbortBackendMsg(uid=u) for u in (504, 500, 123456, 504, 500)])
    h.run()
    got = per_uid(h.batches())
    assert 123456 not in got, tr("An abort of an unknown uid must be ignored, yet it got the replies {msgs}", msgs=got.get(123456))
    for uid in (504, 505):
        assert uid not in got, tr("Request {uid} was aborted before it ran: the tokenizer answered the client, so the "
                                  "scheduler sends nothing for it; got {msgs}", uid=uid, msgs=got.get(uid))  # fmt: skip
    assert_stream(500, got.get(500, []), tokens_of(got.get(500, [])), None)
    assert len(tokens_of(got[500])) < 40, tr("Request 500 was aborted while running, yet it got all its tokens")
    for uid in (501, 502, 503):
        assert len(tokens_of(got.get(uid, []))) == 40 and got[uid][-1].finish_reason == "length", tr(
            "Request {uid} was not aborted and must get all 40 tokens", uid=uid)
    h.run(AbortBackendMsg(uid=501), AbortBackendMsg(uid=500))  # 已经结束 / 已经取消 | en: finished / already aborted
    late = h.batches()
    assert late == [], tr("An abort of a finished or already aborted request must be ignored, yet it sent {late}", late=late)
    assert_idle(sched, h.stats())


def test_only_a_repeated_uid_is_refused_and_serving_goes_on(h: Harness, prompt_ids, reference) -> None:  # noqa: ANN001
    sched = h.sched
    h.run(
        user_msg(600, prompt_ids[1], SamplingParams(max_tokens=8, ignore_eos=True)),
        user_msg(600, prompt_ids[2]),  # uid 重复 | en: a duplicate uid
        user_msg(604, prompt_ids[3]),
    )
    got = per_uid(h.batches())
    rejects_600 = [m for m in got.get(600, []) if isinstance(m, RejectMsg)]
    assert len(rejects_600) == 1 and rejects_600[0].error, tr(
        "A second request with uid 600 while 600 runs must be refused once, with an error, got {msgs}", msgs=got.get(600))
    assert_stream(600, [m for m in got[600] if not isinstance(m, RejectMsg)], reference[1], "length")
    assert_stream(604, got.get(604, []), reference[3], "length")
    assert_idle(sched, h.stats())
    h.send(UserReply(uid=606, incremental_output="x"))  # 发给 API 服务器的消息，不该到调度器 | en: a message for the API server
    with pytest.raises(TypeError):
        h.step()


def test_one_receive_takes_every_waiting_message(h: Harness, prompt_ids) -> None:  # noqa: ANN001
    for uid in (801, 802, 803):  # 三条分开发的消息，不是一条批量消息 | en: three messages sent one by one, not one batch
        h.send(user_msg(uid, prompt_ids[0]))
    time.sleep(1.0)  # 让 ZMQ 把三条都送到 | en: let ZMQ deliver all three
    got = h.sched.receive_msg(blocking=False)
    uids = [getattr(m, "uid", None) for m in got]
    assert uids == [801, 802, 803], tr(
        "One receive_msg takes every message that has arrived (three sent one by one), in arrival order; got uids {uids}",
        uids=uids)


def test_blocks_only_when_idle(h: Harness, prompt_ids, reference) -> None:  # noqa: ANN001
    sched = h.sched
    assert not sched.busy
    runner = h.start_once()
    blocked = not runner.wait(0.5)
    if not blocked:
        runner.result()
    assert blocked, tr("With nothing to do, run_once must block until a message arrives; it returned {value!r}", value=runner.value)
    h.send(user_msg(700, prompt_ids[0], SamplingParams(max_tokens=1, ignore_eos=True)))
    assert runner.wait(STEP_TIMEOUT), tr("run_once kept blocking after a message arrived")
    assert runner.result() is True, tr("run_once returns True while the loop goes on")
    assert sched.busy and not sched.prefill_manager.runnable and not sched.decode_manager.runnable, tr(
        "Setup: only the prefill step of request 700 should be in flight")
    h.step()  # 只有一步在途：不能等消息 | en: only a step in flight: must not wait for a message
    got = per_uid(h.batches())
    assert_stream(700, got.get(700, []), reference[0][:1], "length")
    h.stats()
    # 空闲下来：先发一条现状，再阻塞 | en: going idle: one SchedulerStats first, then block
    runner = h.start_once()
    idle = h.front.get(timeout=STEP_TIMEOUT)
    assert isinstance(idle, SchedulerStats) and (idle.running, idle.waiting) == (0, 0), tr(
        "Going idle, the scheduler sends one SchedulerStats (running 0, waiting 0) before it blocks; got {value!r}", value=idle)
    assert not runner.wait(0.3), tr("With nothing to do, run_once must block until a message arrives")
    h.send(AbortBackendMsg(uid=-5))  # 一条不带来任何工作的消息 | en: a message that brings no work
    assert runner.wait(STEP_TIMEOUT) and runner.result() is True, tr("run_once kept blocking after a message arrived")
    runner = h.start_once()
    assert not runner.wait(0.3), tr("With nothing to do, run_once must block until a message arrives")
    h.send(ExitMsg())
    assert runner.wait(STEP_TIMEOUT) and runner.result() is False, tr("run_once returns False after an ExitMsg")
    assert h.stats(quiet=0.2) == [], tr("Only one SchedulerStats when going idle, not one per idle iteration")
    assert_idle(sched, [idle])


def test_exit_msg_ends_run_forever(h: Harness, prompt_ids, reference) -> None:  # noqa: ANN001
    h.fail_if_blocked()
    loop = Runner(h.sched.run_forever)
    loop.start()
    h.send(user_msg(800, prompt_ids[2]))
    replies: dict[int, list[Any]] = {}
    deadline = time.monotonic() + 60
    while not any(m.finished for m in replies.get(800, [])) and time.monotonic() < deadline and loop.is_alive():
        if (batch := h.tok.get(timeout=0.5)) is not None:
            for uid, msgs in per_uid([batch]).items():
                replies.setdefault(uid, []).extend(msgs)
    h.send(ExitMsg())
    assert loop.wait(STEP_TIMEOUT), tr("run_forever did not return after an ExitMsg")
    loop.result()
    assert_stream(800, replies.get(800, []), reference[2], "length")
    assert_idle(h.sched, h.stats())


# ----------------------------------------------------------------------------- 调度器进程


def _worker_entry(args: ServerArgs, addrs: ServerAddrs, ready: Any) -> None:
    """spawn 的子进程从这里进入：它按环境变量选实现，再调用那份实现的 ``scheduler_worker``。"""
    scheduler_worker(args, addrs, ready)


@contextmanager
def child_env(extra: dict[str, str]) -> Iterator[None]:
    """spawn 的子进程在 ``start()`` 那一刻复制 ``os.environ``：临时设上，让它用与这里相同的实现。"""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_worker_process(harness: Harness, tiny_path: str, prompt_ids, reference) -> None:  # noqa: ANN001
    harness.fail_if_blocked()
    ctx = mp.get_context("spawn")
    addrs = ServerAddrs.in_dir(make_ipc_dir())
    bad_addrs = ServerAddrs.in_dir(make_ipc_dir())
    args = ServerArgs(model_path=tiny_path, dtype="float32", max_running_req=4, num_pages=256, max_seq_len=64)
    tok, front = ZmqPullQueue(addrs.tokenizer, create=True), ZmqPullQueue(addrs.frontend, create=True)
    to_sched = ZmqPushQueue(addrs.backend, create=False)
    ready_r, ready_w = ctx.Pipe(duplex=False)
    bad_r, bad_w = ctx.Pipe(duplex=False)
    with child_env(select.impl_env()):
        proc = ctx.Process(target=_worker_entry, args=(args, addrs, ready_w), daemon=True)
        bad = ctx.Process(target=_worker_entry, args=(replace(args, model_path="/nonexistent/model"), bad_addrs, bad_w), daemon=True)
        proc.start()
        bad.start()
    ready_w.close()
    bad_w.close()
    try:
        assert ready_r.poll(180), tr("The scheduler process did not report readiness within {seconds} s", seconds=180)
        kind, info = ready_r.recv()
        assert kind == "ready", tr("The scheduler process should report ready, it reported {kind}: {info}", kind=kind, info=info)
        want = {"max_seq_len": 64, "num_pages": 256, "max_running_req": 4}
        assert {k: info.get(k) for k in want} == want and isinstance(info.get("eos_token_id"), int), tr(
            "The ready info should hold at least {want} and eos_token_id, got {info}", want=want, info=info)
        to_sched.put(BatchBackendMsg(data=[user_msg(900 + i, ids) for i, ids in enumerate(prompt_ids[:2])]))
        replies: dict[int, list[Any]] = {}
        deadline = time.monotonic() + 60
        while sum(any(m.finished for m in v) for v in replies.values()) < 2 and time.monotonic() < deadline and proc.is_alive():
            if (batch := tok.get(timeout=0.5)) is not None:
                for uid, msgs in per_uid([batch]).items():
                    replies.setdefault(uid, []).extend(msgs)
        for i in range(2):
            assert_stream(900 + i, replies.get(900 + i, []), reference[i], "length")
        assert front.get(timeout=5) is not None, tr("The scheduler process sent no SchedulerStats")
        time.sleep(0.3)  # 让它回到空闲、阻塞在接收上 | en: let it go idle, blocked in its receive
        children = child_pids(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)
        proc.join(60)
        assert proc.exitcode == 0, tr("After SIGTERM the scheduler process should exit cleanly with 0, got {code}", code=proc.exitcode)
        left = [p for p in children if _running(p)]
        assert not left, tr("The scheduler process left children behind: {pids}", pids=left)
        assert bad_r.poll(180), tr("A scheduler that cannot start must report an error")
        kind, message = bad_r.recv()
        bad.join(60)
        assert kind == "error" and "/nonexistent/model" in message and bad.exitcode not in (0, None), tr(
            "A scheduler that cannot start reports ('error', message) and exits non-zero; got {kind}: {message}, exit code {code}",
            kind=kind, message=message, code=bad.exitcode)
    finally:
        for p in (proc, bad):
            if p.is_alive():
                p.kill()
                p.join(10)
        for q in (tok, front, to_sched):
            q.close()
