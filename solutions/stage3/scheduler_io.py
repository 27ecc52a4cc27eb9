"""第 3.3 章 scheduler_io：由消息驱动的调度循环。

第 2 阶段的调度器由 ``generate(prompts)`` 驱动：请求一次性交进来，算完就返回。服务器里的调度器是一个独立的进程，
请求随时从套接字上到来，结果也要一步一步地送出去。这一章把第 2 阶段的调度器（第 2.1 章的 ``Scheduler`` 配上到第 2.5 章为止的零件）接到消息上：

- **收**：没事可做（没有等待或运行的请求，也没有在途的一步）时**阻塞**等下一条消息；有事可做时只把已经到了的
  消息全部取走，绝不等待——否则正在解码的请求会被一个迟迟不来的新请求卡住；
- **处理消息**：``UserMsg`` 在进门处已经查过（API 服务器查采样参数，分词进程查 token 和长度），这里照单收下，用
  API 服务器给的 **同一个 uid** 加进调度器；只有 uid 与还没了结的请求重复时回一条 ``RejectMsg``，说清原因——绝不
  悄悄丢掉，否则客户端会一直等下去；``AbortBackendMsg`` 取消请求（不认识或已经结束的 uid 直接忽略）；``ExitMsg`` 结束循环；
- **发**：调度器每做出一个决定就有一个 :class:`~minisgl.scheduling.RequestEvent`（第 2.1 章的结果监听）；每个事件变成
  一条 ``DetokenizeMsg``，结束的那条带上原因：``"length"``（到了 max_tokens）或 ``"stop"``（遇到 EOS）。取消不回消息：
  取消是分词进程发来的，它已经答复了客户端。每一步之后把这些消息打包成**恰好一条** ``BatchTokenizerMsg`` 发出；
- **现状**：每一步之后、以及空闲下来时，直接给 API 服务器发一条 ``SchedulerStats``（``/metrics`` 读它）。

``DetokenizeMsg.next_token`` 的约定：它是输出文本的一个 token；因 EOS 结束时为 -1（EOS 本身不是文本，也不计入
completion_tokens），也就是事件的 ``token`` 为 ``None`` 的时候。

重叠调度照旧默认开启：遇到 EOS 之后多算的那一步，第 2 阶段已经把它的 token 丢掉了，不会有事件。

进程入口 :func:`scheduler_worker`（建调度器、绑定套接字、报告就绪、收到 SIGTERM 或 ``ExitMsg`` 时干净地退出）是给定的。
离线接口 ``minisgl.llm.LLM`` 不变；本章的 ``SchedulerIO`` 是服务器跑的那一个：接上套接字之后，它的每个结果都变成消息。

en: Chapter 3.3 scheduler_io: the scheduler loop driven by messages.

The stage-2 scheduler is driven by ``generate(prompts)``: the requests come in all at once and it returns when they are
done. In the server the scheduler is a process of its own: requests arrive on a socket at any time, and the results
have to go out step by step. This chapter connects stage 2's scheduler (chapter 2.1's ``Scheduler`` with the parts up to chapter 2.5) to messages:

- **receive**: with nothing to do (no waiting or running request, no step in flight) **block** for the next message;
  with work to do, take every message that has already arrived and never wait, or the decoding requests would be held up
  by a new request that is slow to come;
- **process messages**: a ``UserMsg`` was checked where it entered (the API server checked its sampling parameters, the
  tokenizer process its tokens and length), so it is taken as it is and added to the scheduler with **the same uid** the
  API server gave it; only a uid equal to that of a request not settled yet is answered with a ``RejectMsg`` that says
  why, never silently dropped, or the client would wait forever; an ``AbortBackendMsg`` aborts a request (an unknown or finished uid is ignored); an
  ``ExitMsg`` ends the loop;
- **send**: each decision of the scheduler is a :class:`~minisgl.scheduling.RequestEvent` (chapter 2.1's result
  listeners); each event becomes one ``DetokenizeMsg``, and the last one of a request carries why it finished:
  ``"length"`` (max_tokens reached) or ``"stop"`` (EOS). An abort is not answered: it came from the tokenizer, which has
  already answered the client. After each step these messages go out packed in **exactly one** ``BatchTokenizerMsg``;
- **state**: after each step, and when it becomes idle, a ``SchedulerStats`` goes straight to the API server (which
  ``/metrics`` reads).

The ``DetokenizeMsg.next_token`` convention: it is a token of the output text, and -1 when a request ends on EOS (EOS
itself is not text and does not count as a completion token), that is when the event's ``token`` is ``None``.

Overlap scheduling stays on by default: stage 2 already drops the token computed in the extra step after EOS, so there
is no event for it.

The process entry :func:`scheduler_worker` (build the scheduler, bind the sockets, report readiness, exit cleanly on
SIGTERM or ``ExitMsg``) is given. The offline interface ``minisgl.llm.LLM`` stays as it was; this chapter's
``SchedulerIO`` is the one the server runs: once its sockets are attached, every result becomes a message.
"""

from __future__ import annotations

import signal
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any, Callable

import torch
import zmq

from minisgl.i18n import tr
from minisgl.message import (
    AbortBackendMsg,
    BaseBackendMsg,
    BaseTokenizerMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    RejectMsg,
    SchedulerStats,
    UserMsg,
    ZmqPullQueue,
    ZmqPushQueue,
    serialize,
    unwrap,
)
from minisgl import overlap
from minisgl.scheduler import Scheduler
from minisgl.scheduling import RequestEvent, SchedulerParts
from minisgl.server.args import ServerAddrs, ServerArgs, set_process_name
from minisgl.trace import StepTrace

#: ``DetokenizeMsg.next_token`` 不是输出文本时的值（EOS）。
#: en: The value of ``DetokenizeMsg.next_token`` when it is not output text (EOS).
NO_TOKEN = -1


class SchedulerIO(Scheduler):
    """第 3.3 章的调度器：第 2 阶段的调度器（``parts`` 缺省是到第 2.5 章为止的零件，重叠调度默认开启），改由消息驱动。

    先 ``connect(addrs)`` 接上套接字，再 ``run_forever()``（或一次一次地 ``run_once()``）；``close()`` 关掉套接字。

    en: The chapter 3.3 scheduler: stage 2's scheduler (``parts`` defaults to the parts up to chapter 2.5; overlap
    scheduling on by default), driven by messages.

    ``connect(addrs)`` attaches the sockets, then ``run_forever()`` (or ``run_once()`` one iteration at a time);
    ``close()`` closes the sockets.
    """

    def __init__(self, model_path: str, dtype: torch.dtype | None = None, *, parts: SchedulerParts | None = None,
                 **kwargs: Any) -> None:
        super().__init__(model_path, dtype, parts=parts or overlap.PARTS, **kwargs)
        self.recv_queue: ZmqPullQueue | None = None
        self.send_tokenizer: ZmqPushQueue | None = None
        self.send_frontend: ZmqPushQueue | None = None
        # 这一步要发给反分词进程的消息（DetokenizeMsg、RejectMsg）
        # en: the messages for the detokenizer this step (DetokenizeMsg, RejectMsg)
        self._replies: list[BaseTokenizerMsg] = []
        # 提示词正分块计算、还没算完的请求（统计前缀缓存命中时，后面的块不算命中）
        # en: requests whose prompt is being computed in chunks (when counting prefix-cache hits, later chunks are no hits)
        self._chunking: set[int] = set()
        self.counters = {"cache_hit_tokens": 0, "prefill_tokens": 0, "decode_tokens": 0, "max_decode_batch": 0, "steps": 0}
        self._exit_requested = False
        self._idle_reported = False  # 上一条 SchedulerStats 之后一直空闲 | en: idle since the last SchedulerStats
        self.add_step_listener(self._count_step)

    # ------------------------------------------------------------------ 套接字（给定）
    # en: ------------------------------------------------------------------ sockets (given)

    def connect(self, addrs: ServerAddrs) -> None:
        """绑定自己的收信套接字（PULL），连上反分词进程和 API 服务器的收信套接字（PUSH），从此结果变成消息。

        en: Bind this process's inbox (PULL) and connect to the inboxes of the detokenizer and the API server (PUSH);
        from now on results become messages.
        """
        self.recv_queue = ZmqPullQueue(addrs.backend, create=True)
        self.send_tokenizer = ZmqPushQueue(addrs.tokenizer, create=False)
        self.send_frontend = ZmqPushQueue(addrs.frontend, create=False)
        self.add_result_listener(self._on_result)

    def close(self) -> None:
        """关掉套接字（linger 0：进程退出时不会卡在没送出去的消息上）。

        en: Close the sockets (linger 0: the process never hangs at exit on undelivered messages).
        """
        for queue in (self.recv_queue, self.send_tokenizer, self.send_frontend):
            if queue is not None:
                queue.close()
        self.recv_queue = self.send_tokenizer = self.send_frontend = None

    def send_stats(self) -> None:
        """把现状发给 API 服务器。它只是一份快照：对方的队列满了就丢掉这一份，绝不让调度器停下来等。

        en: Send the current state to the API server. It is only a snapshot: if the other side's queue is full, this one
        is dropped; the scheduler never stops to wait for it.
        """
        try:
            self.send_frontend.socket.send(serialize(self.stats()), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def server_info(self) -> dict[str, Any]:
        """就绪时报告给启动器的信息。

        en: What the scheduler reports to the launcher when it is ready.
        """
        return {
            "max_seq_len": self.max_seq_len,
            "num_pages": self.cache_manager.num_pages,
            "page_size": self.page_size,
            "max_running_req": self.max_running_req,
            "eos_token_id": self.eos_token_id,
            "cache_type": self.config.cache_type,
            "device": str(self.device),
            "decode_path": self.engine.decode_path,
        }

    def _reject(self, uid: int, error: str | Exception) -> None:
        """回一条 :class:`RejectMsg`。给异常本身：它的 ``code`` 属性（若有）成为 OpenAI 错误体的 ``code``。

        en: Answer with a :class:`RejectMsg`. Pass the exception itself: its ``code`` attribute (if any) becomes the code of
        the OpenAI error body.
        """
        self._replies.append(RejectMsg(uid=uid, error=str(error), code=getattr(error, "code", None)))

    # ------------------------------------------------------------------ 收
    # en: ------------------------------------------------------------------ receiving

    def receive_msg(self, blocking: bool) -> list[BaseBackendMsg]:
        """取走已经到了的全部消息（批量消息拆成一条一条）。``blocking`` 时先等到至少一条。

        en: Take every message that has arrived (batch messages split into single ones). With ``blocking``, first wait
        until there is at least one.
        """
        # >>> TASK receive: 返回此刻已经到了的全部消息，批量消息拆成一条一条，按到达的顺序。约定：blocking 为真时至少要有一条（没有就等）；为假时绝不等待，可以返回空列表；一次调用取走所有在等的消息——每次只取一条是错的。给定：self.recv_queue、unwrap。
        # en: Return every message that has arrived by now, batch messages split into single messages, in arrival order. Contract: with blocking true there is at least a message (wait for it if need be); with it false, never wait, and an empty list is fine; a call takes every message waiting: taking a single message per call is wrong. Given: self.recv_queue, unwrap.
        # hint1: 队列有两种取法：一种会等，一种不等（没有就给 None）。要等也只等第一条，之后的全用不等的那种取。
        # en1: The queue reads in two ways: a waiting read and a non-waiting read (None when nothing is there). If you wait at all, wait only for the first message;
        # en1: take the rest with the non-waiting read.
        # hint2: msgs = [self.recv_queue.get()] if blocking else []；
        # hint2: while (msg := self.recv_queue.get_nowait()) is not None: msgs.append(msg)；
        # hint2: 返回 [one for msg in msgs for one in unwrap(msg)]。
        # en2: msgs = [self.recv_queue.get()] if blocking else [];
        # en2: while (msg := self.recv_queue.get_nowait()) is not None: msgs.append(msg);
        # en2: return [one for msg in msgs for one in unwrap(msg)].
        msgs = [self.recv_queue.get()] if blocking else []
        while (msg := self.recv_queue.get_nowait()) is not None:
            msgs.append(msg)
        return [one for msg in msgs for one in unwrap(msg)]
        # <<< TASK

    def _process_one_msg(self, msg: BaseBackendMsg) -> None:
        """处理一条消息：新请求、取消或退出。新请求在进门时已经查过（API 服务器查采样参数，分词进程查 token 和长度、
        定下 ``max_tokens``），这里不再查。

        en: Handle one message: a new request, an abort or exit. A new request was checked where it entered (the API
        server checked its sampling parameters, the tokenizer process its tokens and length, settling ``max_tokens``);
        nothing is checked again here.
        """
        # >>> TASK process_msg: 处理一条发给调度器的消息：新请求用它自己的编号（API 服务器给的）加进调度器，取消让那个请求结束，退出让这次的 run_once 返回 False。约定：新请求已经在进门处查过，照单收下、不再查；只有调度器自己知道的一种情况要拒绝——编号与还没了结的请求重复——这时只回一条说明原因的 RejectMsg，调度器照常服务别的请求；取消一个不认识的、已经结束或已经取消过的请求什么也不做——不报错、不回消息；不是这三种的消息要抛出类型错误、写明它的类型，不能悄悄吞掉。给定：self.add_request（编号重复时抛异常）、self._reject、self.abort、self._exit_requested。
        # en: Handle one message for the scheduler: a new request is added to the scheduler under its own id (the one the API server gave it), an abort ends that request, exit makes this run_once return False. Contract: a new request was checked where it entered, so take it as it is and check nothing again; only one case, which only the scheduler can know, is refused: an id equal to that of a request not settled yet, answered with exactly one RejectMsg saying why while the scheduler goes on serving the others; aborting an unknown request, or one already finished or aborted, does nothing: no error, no reply; a message of any other kind raises a type error naming its type rather than being swallowed. Given: self.add_request (raises on an id in use), self._reject, self.abort, self._exit_requested.
        # hint1: 按消息的类型分派（isinstance）。第 2.1 章的取消本来就宽容，直接交给它，不必自己先查请求在不在；重复的 uid 也由 add_request 发现，你只需接住它的异常。
        # en1: Dispatch on the type of the message (isinstance).
        # en1: Chapter 2.1's abort is already lenient: hand the uid straight to it, with no check of your own first; add_request also finds a repeated uid, you only catch its exception.
        # hint2: UserMsg → try: self.add_request(msg.input_ids, msg.sampling_params, uid=msg.uid)，except ValueError as err: self._reject(msg.uid, err)；
        # hint2: AbortBackendMsg → self.abort(msg.uid)；ExitMsg → self._exit_requested = True；其余 → raise TypeError（写明 type(msg).__name__）。
        # en2: UserMsg → try: self.add_request(msg.input_ids, msg.sampling_params, uid=msg.uid), except ValueError as err: self._reject(msg.uid, err);
        # en2: AbortBackendMsg → self.abort(msg.uid); ExitMsg → self._exit_requested = True; anything else → raise TypeError (naming type(msg).__name__).
        if isinstance(msg, UserMsg):
            try:
                self.add_request(msg.input_ids, msg.sampling_params, uid=msg.uid)
            except ValueError as err:
                self._reject(msg.uid, err)
        elif isinstance(msg, AbortBackendMsg):
            self.abort(msg.uid)
        elif isinstance(msg, ExitMsg):
            self._exit_requested = True
        else:
            raise TypeError(tr("The scheduler cannot handle a message of type {type}", type=type(msg).__name__))
        # <<< TASK

    # ------------------------------------------------------------------ 发
    # en: ------------------------------------------------------------------ sending

    def _on_result(self, event: RequestEvent) -> None:
        """结果监听者：把调度器的一个决定写成给反分词进程的消息（这一步结束时一起发出）。

        en: The result listener: write one decision of the scheduler as a message for the detokenizer (sent with the
        rest at the end of this step).
        """
        if event.finished:
            self._chunking.discard(event.uid)
        # >>> TASK collect_replies: 把调度器的一个结果事件写成给反分词进程的消息，攒进 self._replies（这一步结束时一起发出，这里不发）。约定：每个事件正好一条 DetokenizeMsg，照抄请求、是否结束、结束原因和对数概率（第 3.5 章，没要时为 None）；事件没带输出（因 EOS 结束）时 next_token 是 NO_TOKEN（-1）；取消（结束原因是 "abort"）什么也不回。给定：NO_TOKEN、self._replies。
        # en: Write one result of the scheduler as a message for the detokenizer into self._replies (they all go out together at the end of the step; nothing is sent here). Contract: exactly one DetokenizeMsg per result, copying the request, whether it is over, its finish_reason and its log-probabilities (chapter 3.5; None when not asked for); a result with no output (the request ended on EOS) has next_token NO_TOKEN (-1); an abort (finish_reason "abort") gets no message at all. Given: NO_TOKEN, self._replies.
        # hint1: 只看事件，不去查 status：请求结束时资源可能当场就归还了，它的账目已经删掉。取消不回话，因为分词进程已经答复了客户端。
        # en1: Look only at the event, never at status: when a request ends its resources may be freed on the spot and its entry is gone.
        # en1: An abort gets no reply because the tokenizer process has already answered the client.
        # hint2: event.reason == "abort" → return；token = NO_TOKEN if event.token is None else event.token；
        # hint2: self._replies.append(DetokenizeMsg(event.uid, token, event.finished, event.reason, event.logprobs))。
        # en2: event.reason == "abort" → return; token = NO_TOKEN if event.token is None else event.token;
        # en2: self._replies.append(DetokenizeMsg(event.uid, token, event.finished, event.reason, event.logprobs)).
        if event.reason == "abort":
            return
        token = NO_TOKEN if event.token is None else event.token
        self._replies.append(DetokenizeMsg(event.uid, token, event.finished, event.reason, event.logprobs))
        # <<< TASK

    def stats(self) -> SchedulerStats:
        """调度器的现状（``/metrics`` 读它）。

        en: The scheduler's current state (which ``/metrics`` reads).
        """
        counters, spec = dict(self.counters), self.loop.spec_stats
        extra: dict[str, Any] = {}
        if spec is not None:  # 投机解码：一步解码出的 token 还有接受的草稿 | en: speculative decoding: a decode step also yields the accepted drafts
            counters["decode_tokens"] += spec.accepted
            lengths = [spec.accept_lengths.get(k, 0) for k in range(max(spec.accept_lengths, default=0) + 1)]
            extra = dict(spec_draft_tokens=spec.proposed, spec_accepted_tokens=spec.accepted, spec_accept_lengths=lengths)
        return SchedulerStats(
            running=self.max_running_req - self.table_manager.available_size,
            waiting=sum(p.chunked_req is None for p in self.prefill_manager.pending_list),
            pages_in_use=self.pages_in_use(),
            pages_total=self.cache_manager.num_pages,
            pages_cached=self.cache_manager.prefix_cache.size_info.evictable_size // self.page_size,
            **counters, **extra,
        )

    def _count_step(self, trace: StepTrace) -> None:
        """步监听器：每处理完一步，累计 :meth:`stats` 里的计数。

        en: The step listener: after each step is processed, add to the counters :meth:`stats` reports.
        """
        # >>> TASK count_step: 每处理完一步，按这一步累加 self.counters。约定：steps 每步加一；预填充步把算过的 token 数加进 prefill_tokens，把每个请求的 cached_len 加进 cache_hit_tokens——但分块预填充里接着上一块往下算的请求不算命中（它的 cached_len 是上一块算过的，不是前缀缓存省下的）；解码步把请求数加进 decode_tokens，max_decode_batch 记下最大的解码批。给定：trace（这一步的 StepTrace；它的 outputs 说每个请求这一步出没出 token）、self._chunking（由你维护：提示词只算了一部分的请求；请求结束时 _on_result 会把它移出）。
        # en: After each step is processed, fold it into self.counters. Contract: steps grows by one per step; a prefill step adds its computed token count to prefill_tokens and each request's cached_len to cache_hit_tokens, except for a request continuing its previous chunk under chunked prefill (its cached_len is what the earlier chunk computed, not something the prefix cache saved); a decode step adds its request count to decode_tokens, and max_decode_batch keeps the largest decode batch. Given: trace (the step's StepTrace; its outputs say whether each request got a token this step), self._chunking (yours to maintain: requests whose prompt is only partly computed; _on_result takes a request out when it ends).
        # hint1: 算了一块、提示词还没算完的请求，这一步不出 token：StepTrace 里记着每个请求这一步出没出 token，靠它认出分块的请求，它的下一块就不算命中。
        # en1: A request that computed a chunk but not yet its whole prompt produces no token in that step: StepTrace records, per request, whether it did.
        # en1: Use that to recognise chunked requests, so that their next chunk is not counted as a hit.
        # hint2: c = self.counters；c["steps"] += 1；
        # hint2: 预填充（trace.is_prefill）：c["prefill_tokens"] += trace.tokens；对 zip(trace.uids, trace.cached_lens, trace.outputs) 里的 uid, cached, output：
        # hint2: uid 不在 self._chunking → c["cache_hit_tokens"] += cached；not output → self._chunking.add(uid)；
        # hint2: 解码：c["decode_tokens"] += len(trace.uids)；len(trace.uids) 更大就更新 c["max_decode_batch"]。
        # en2: c = self.counters; c["steps"] += 1;
        # en2: prefill (trace.is_prefill): c["prefill_tokens"] += trace.tokens; for uid, cached, output in zip(trace.uids, trace.cached_lens, trace.outputs):
        # en2: uid not in self._chunking → c["cache_hit_tokens"] += cached; not output → self._chunking.add(uid);
        # en2: decode: c["decode_tokens"] += len(trace.uids); raise c["max_decode_batch"] to len(trace.uids) if that is larger.
        c = self.counters
        c["steps"] += 1
        if trace.is_prefill:
            c["prefill_tokens"] += trace.tokens
            for uid, cached, output in zip(trace.uids, trace.cached_lens, trace.outputs):
                if uid not in self._chunking:
                    c["cache_hit_tokens"] += cached
                if not output:
                    self._chunking.add(uid)
        else:
            c["decode_tokens"] += len(trace.uids)
            if len(trace.uids) > c["max_decode_batch"]:
                c["max_decode_batch"] = len(trace.uids)
        # <<< TASK

    # ------------------------------------------------------------------ 主循环
    # en: ------------------------------------------------------------------ main loop

    @torch.inference_mode()
    def run_once(self) -> bool:
        """主循环的一次迭代：收消息并处理 → 有事就走一步 → 发出这一步的结果和现状。收到 ``ExitMsg`` 后返回 False。

        en: One iteration of the main loop: receive and handle messages -> take a step if there is work -> send this
        step's results and the state. Returns False once an ``ExitMsg`` has arrived.
        """
        self._exit_requested = False
        # >>> TASK run_once: 主循环的一次迭代。约定：收下此刻在等的全部消息并逐条处理（同一批里退出之后的也处理）；收到退出就返回 False（不再走这一步，没发的回复不必再发：进程就要关了），否则返回 True；有事可做（self.busy：有等待或运行的请求，或有一步还在途）时绝不等消息，空闲时才阻塞；空闲下来、阻塞之前报一次现状（SchedulerStats），一段空闲只报一次；有事就让调度器走一步，走了之后再报一次现状；这次迭代攒下的回复（self._replies）打包成恰好一条 BatchTokenizerMsg 发给反分词进程，没有就不发，发完清空。给定：本类里收消息、处理消息、报现状的方法，以及一个记着“这段空闲已经报过”的标志。
        # en: One iteration of the main loop. Contract: take every message waiting right now and handle each (those after an exit in the same batch too); return False once exit was asked for (without advancing; replies not sent yet need not be: the process is closing), True otherwise; with work to do (self.busy: waiting or running requests, or a launched batch whose results are not processed yet) never wait for a message; block only when idle; on going idle, report the state (a SchedulerStats) once before it blocks, only once per idle spell; with work, have the scheduler advance once, and report the state again after it did; the replies gathered during the iteration (self._replies) go to the detokenizer packed in exactly one BatchTokenizerMsg (none if there are none) and are cleared. Given: this class's methods to receive, handle and report, and a flag remembering that the idle report was sent.
        # hint1: 阻塞与否只看 busy：只看等待、运行队列的话，重叠调度下在途那一步里的最后一个 token 会永远发不出去。“空闲只报一次”靠一个标志，每走一步就把它复位。
        # en1: Whether to block depends on busy alone: looking only at the waiting and running queues would strand the last token of the step
        # en1: in flight under overlap scheduling. "Report idle once" needs a flag that is reset whenever a step is taken.
        # hint2: not self.busy 且 not self._idle_reported → self.send_stats()，self._idle_reported = True；
        # hint2: for msg in self.receive_msg(blocking=not self.busy): self._process_one_msg(msg)；self._exit_requested → return False；
        # hint2: stepped = self.step() if self.busy else False；
        # hint2: self._replies 非空 → self.send_tokenizer.put(BatchTokenizerMsg(data=self._replies))，self._replies = []；
        # hint2: stepped → self.send_stats()，self._idle_reported = False；return True。
        # en2: not self.busy and not self._idle_reported → self.send_stats(), self._idle_reported = True;
        # en2: for msg in self.receive_msg(blocking=not self.busy): self._process_one_msg(msg); self._exit_requested → return False;
        # en2: stepped = self.step() if self.busy else False;
        # en2: self._replies not empty → self.send_tokenizer.put(BatchTokenizerMsg(data=self._replies)), self._replies = [];
        # en2: stepped → self.send_stats(), self._idle_reported = False; return True.
        if not self.busy and not self._idle_reported:
            self.send_stats()
            self._idle_reported = True
        for msg in self.receive_msg(blocking=not self.busy):
            self._process_one_msg(msg)
        if self._exit_requested:
            return False
        stepped = self.step() if self.busy else False
        if self._replies:
            self.send_tokenizer.put(BatchTokenizerMsg(data=self._replies))
            self._replies = []
        if stepped:
            self.send_stats()
            self._idle_reported = False
        return True
        # <<< TASK

    def run_forever(self) -> None:
        """一直迭代到收到 ``ExitMsg``，再等在途的一步算完。

        en: Iterate until an ``ExitMsg`` arrives, then wait for the step in flight to finish.
        """
        while self.run_once():
            pass
        self._drain()


# ----------------------------------------------------------------------------- 进程入口（给定）
# en: ----------------------------------------------------------------------------- process entry (given)


class _Terminated(BaseException):
    """SIGTERM / SIGINT 变成的异常：从阻塞的接收里、从一步的中间跳出来，走 ``finally`` 干净地收尾。

    en: What SIGTERM / SIGINT turns into: it jumps out of a blocking receive or the middle of a step, and the ``finally``
    cleans up.
    """


#: 已经收到过一个 SIGTERM / SIGINT：之后的信号不再打断收尾
#: en: a SIGTERM / SIGINT came already: later signals no longer interrupt the winding down
_stopping = threading.Event()


def _terminate(signum: int, frame: Any) -> None:
    """第一个 SIGTERM / SIGINT 抛 :class:`_Terminated`，之后的什么也不做：终端的 Ctrl-C 和启动器的 SIGTERM 常常前后脚
    到达，第二个不能打断正在进行的收尾。

    en: The first SIGTERM / SIGINT raises :class:`_Terminated`; later ones do nothing: a terminal's Ctrl-C and the
    launcher's SIGTERM often arrive one right after the other, and the second must not interrupt the winding down.
    """
    if not _stopping.is_set():
        _stopping.set()
        raise _Terminated(signum)


def scheduler_worker(args: ServerArgs, addrs: ServerAddrs, ready: Connection,
                     parts: SchedulerParts | None = None) -> None:
    """调度器进程的入口（启动器用 spawn 启动它）：建本章的调度器、接上套接字，交给 :func:`serve_scheduler`。
    ``parts``：组装好的引擎交给它的零件（见 :class:`~minisgl.scheduling.SchedulerParts`）。

    en: The scheduler process's entry point (the launcher starts it with spawn): build this chapter's scheduler, attach
    the sockets, and hand it to :func:`serve_scheduler`. ``parts``: the parts the assembled engine hands it (see
    :class:`~minisgl.scheduling.SchedulerParts`).
    """
    set_process_name("msgl-scheduler")

    def build() -> SchedulerIO:
        sched = SchedulerIO(args.model_path, parts=parts, **args.scheduler_kwargs())
        try:
            sched.connect(addrs)
        except BaseException:
            sched.close()
            raise
        return sched

    serve_scheduler(build, ready)


def serve_scheduler(build: Callable[[], SchedulerIO], ready: Connection) -> None:
    """一个调度器进程的一生：``build()`` 建好调度器并接上套接字，然后通过 ``ready`` 报告 ``("ready", 信息)``（起不来
    就报 ``("error", 原因)`` 并以 1 退出），一直服务到 ``ExitMsg`` 或 SIGTERM / SIGINT；最后关掉套接字（linger 0）、
    关掉引擎，以 0 退出。

    en: A scheduler process's life: ``build()`` makes the scheduler and attaches its sockets, then it reports
    ``("ready", info)`` through ``ready`` (or ``("error", reason)`` and exits with 1 if it cannot start), serves until an
    ``ExitMsg`` or SIGTERM / SIGINT; finally it closes the sockets (linger 0), shuts the engine down and exits with 0.
    """
    _stopping.clear()
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    sched: SchedulerIO | None = None
    try:
        try:
            sched = build()
        except Exception as err:
            ready.send(("error", tr("The scheduler could not start: {error}", error=f"{type(err).__name__}: {err}")))
            ready.close()
            sys.exit(1)
        ready.send(("ready", sched.server_info()))
        ready.close()
        sched.run_forever()
    except _Terminated:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if sched is not None:
            sched.close()
            try:
                sched.shutdown()
            except Exception as err:  # 被信号打断在一步的中间：只求退出 | en: interrupted in the middle of a step: just exit
                print(tr("scheduler: shutdown after a signal: {error}", error=err), file=sys.stderr)
