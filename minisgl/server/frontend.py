"""API 服务器这一端的套接字、请求的登记和回复分发（第 3.4 章的 ``ServerState`` 在它上面加请求的取消，给定）。

回复从反分词进程一条条回来，各属于某个还在等的 HTTP 请求。一个后台任务读 PULL，按 uid 把每条回复放进那个请求
自己的 ``asyncio.Queue``；处理请求的协程只从自己的队列里取。上游 mini-sglang 的 ``FrontendManager`` 做的是同一件事。

en: The API server's end of the sockets, the registering of requests and the handing out of replies (chapter 3.4's
``ServerState`` adds the aborting of requests on top; given).

Replies come back one by one from the detokenizer, each belonging to an HTTP request still waiting. A background task
reads the PULL and puts every reply into that request's own ``asyncio.Queue`` by uid; the coroutine serving a request
reads its own queue only. Upstream mini-sglang's ``FrontendManager`` does the same job.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

from minisgl.server.access_log import note_failure, note_usage
from minisgl.server.api_errors import ApiError
from minisgl.core import SamplingParams
from minisgl.message import SchedulerStats, TokenizeMsg, UserReply, ZmqAsyncPullQueue, ZmqAsyncPushQueue, unwrap
from minisgl.server.metrics import CountingPush, ServerMetrics
from minisgl.server.args import ServerAddrs, ServerArgs


class Submitted(Protocol):
    """:meth:`Frontend.submit` 从第 3.4 章的 ``ParsedRequest`` 里读的那几项。

    en: The fields :meth:`Frontend.submit` reads from chapter 3.4's ``ParsedRequest``.
    """

    prompt: Any
    sampling_params: SamplingParams
    stop: list[str]


class Frontend:
    """给分词进程的 PUSH、自己的 PULL、``uid → asyncio.Queue``（``live``：还没答完的请求）和指标
    （:class:`~minisgl.server.metrics.ServerMetrics`）。``dead`` 是某个工作进程死掉的原因（活着时为 None）。

    en: The PUSH to the tokenizer, its own PULL, ``uid → asyncio.Queue`` (``live``: requests not answered yet) and the
    metrics (:class:`~minisgl.server.metrics.ServerMetrics`). ``dead`` is why a worker died (None while all live).
    """

    def __init__(self, args: ServerArgs, addrs: ServerAddrs, info: dict[str, Any]) -> None:
        self.args = args
        self.addrs = addrs
        self.info = info
        self.max_seq_len = int(info.get("max_seq_len") or 1 << 30)
        self.model_name = args.model_name or Path(args.model_path).name
        self.next_uid = 0
        self.live: dict[int, asyncio.Queue[UserReply]] = {}
        self.metrics = ServerMetrics(active=lambda: len(self.live))
        self.dead: str | None = None
        self.send: CountingPush | None = None
        self.recv: ZmqAsyncPullQueue | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """在 uvicorn 的事件循环里打开套接字、启动分发任务。

        en: Open the sockets and start the dispatch task in uvicorn's event loop.
        """
        self.loop = asyncio.get_running_loop()
        self.recv = ZmqAsyncPullQueue(self.addrs.frontend, create=True)
        self.send = CountingPush(ZmqAsyncPushQueue(self.addrs.tokenizer, create=False), self.metrics)
        self._task = asyncio.create_task(self.dispatch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for queue in (self.send, self.recv):
            if queue is not None:
                queue.close()

    async def submit(self, req: Submitted) -> tuple[int, asyncio.Queue[UserReply]]:
        """登记一个请求：给它一个新 uid、一个回复队列（记进 ``live``），把 :class:`TokenizeMsg` 发给分词进程。
        登记了就必须有人把它去掉（答完时 :meth:`dispatch` 去掉，断开时第 3.4 章的 ``abort`` 去掉），否则
        ``minisgl_active_requests`` 永远降不下来，调度器里的槽位也回不来。

        en: Register a request: give it a new uid and a reply queue (put into ``live``), and send the
        :class:`TokenizeMsg` to the tokenizer. Once registered, someone must take it out again (:meth:`dispatch` when it
        is answered, chapter 3.4's ``abort`` when the client leaves), or ``minisgl_active_requests`` never comes down
        and the scheduler's slot never comes back.
        """
        if self.dead is not None:
            raise ApiError(503, self.dead)
        assert self.send is not None
        uid = self.next_uid
        self.next_uid += 1
        queue: asyncio.Queue[UserReply] = asyncio.Queue()
        self.live[uid] = queue
        self.metrics.submitted(uid)
        try:
            await self.send.put(TokenizeMsg(uid, req.prompt, req.sampling_params, self.max_seq_len, req.stop))
        except BaseException:  # 没发出去：不留登记（否则 minisgl_active_requests 永远降不下来） | en: not sent: unregister (or minisgl_active_requests never comes down)
            self.live.pop(uid, None)
            self.metrics.withdrawn(uid)
            raise
        return uid, queue

    async def dispatch(self) -> None:
        """后台任务：每条 :class:`UserReply` 放进它的队列（请求答完了就从 ``live`` 里去掉），记指标；
        :class:`SchedulerStats` 存下来给 ``/metrics``。已经不在 ``live`` 里的请求（被取消了）的回复只记指标。

        en: Background task: put every :class:`UserReply` into its queue (a finished request leaves ``live``) and
        count it; keep the :class:`SchedulerStats` for ``/metrics``. Replies of a request no longer in ``live``
        (it was aborted) are only counted.
        """
        assert self.recv is not None
        while True:
            msg = await self.recv.get()
            now = time.monotonic()
            for m in unwrap(msg):
                if isinstance(m, SchedulerStats):
                    self.metrics.scheduler.stats = m
                elif isinstance(m, UserReply):
                    self.metrics.reply(m, now)
                    queue = self.live.pop(m.uid, None) if m.finished else self.live.get(m.uid)
                    if queue is not None:
                        queue.put_nowait(m)

    async def replies(self, queue: asyncio.Queue[UserReply], first: UserReply | None = None) -> AsyncIterator[UserReply]:
        """一个请求的回复，一条接一条，到 ``finished`` 的那条为止（``first`` 是已经取出来的第一条）。结束的那条的 token
        数记进访问日志（:func:`~minisgl.server.access_log.note_usage`）；它带着错误（例如工作进程死了）时，记的是出错之前
        已经发出的 token 数，以及这个请求不流式时会得到的状态码（:func:`~minisgl.server.access_log.note_failure`）。

        en: One request's replies, one after another, up to the ``finished`` one (``first``: the first one, already
        taken out). The finishing one's token counts go to the access log (:func:`~minisgl.server.access_log.note_usage`);
        when it carries an error (e.g. a worker died), the tokens sent before the error are logged, with the status the
        request would get unstreamed (:func:`~minisgl.server.access_log.note_failure`).
        """
        reply = first if first is not None else await queue.get()
        sent = reply  # 最近一条没出错的回复：token 数到它为止 | en: the latest reply without an error: the token counts so far
        while True:
            if reply.finished:  # 访问日志的那一行 | en: for the access log's line
                if reply.error:
                    note_failure(503 if self.dead is not None else 400)
                note_usage(sent.prompt_tokens, sent.completion_tokens)
            yield reply
            if reply.finished:
                return
            reply = await queue.get()
            if not reply.error:
                sent = reply

    def mark_dead(self, why: str) -> None:
        """某个工作进程死了：以后的请求回 503；正在等回复的请求都收到一条带错误的结束回复，不再干等。

        en: A worker died: later requests get a 503; every request waiting for replies gets a finishing reply with the
        error, instead of waiting forever.
        """
        self.dead = why
        for uid, queue in list(self.live.items()):
            queue.put_nowait(UserReply(uid, "", finished=True, error=why))
        self.live.clear()
