"""访问日志（给定）：API 服务器和 ``--dp`` 路由器每答完一个 HTTP 请求，在 ``minisgl.access`` 这个 logger 上以 INFO
级别写一行：方法、路径、状态码、知道时的提示词 / 生成 token 数、用时（毫秒）。回答写完之前客户端就断开了，这一行的
状态码是 499（客户端自己收不到它，日志里看得到）。流式的回答发到一半服务器这边出了错（工作进程死了、副本断了），
状态行早已是 200，日志行却写它失败时的状态码（503），token 数是出错之前已经发出的。

    POST /v1/chat/completions 200 prompt_tokens=12 completion_tokens=8 35.2ms
    POST /v1/completions 499 prompt_tokens=5 completion_tokens=3 120.4ms
    POST /v1/completions 503 prompt_tokens=5 completion_tokens=7 98.1ms

缺省打印到 stderr（用户看到的正是服务器的 stderr）；``--no-access-log`` 关掉。uvicorn 自己的访问日志是关着的：
它不知道 token 数，也不知道 499。

en: The access log (given): for every HTTP request the API server and the ``--dp`` router answer, one line at INFO level
on the logger ``minisgl.access``: method, path, status, the prompt / completion tokens when known, and the time in
milliseconds. A client that disconnected before the answer was complete gets status 499 in its line (the client never
sees it; the log does). A streamed answer that failed half-way on the server's side (a worker died, a replica broke off)
had a 200 status line long ago, but its log line has the status it failed with (503), and the tokens sent before the
failure.

It prints to stderr by default (the server's stderr is what users see); ``--no-access-log`` turns it off. uvicorn's own
access log stays off: it knows neither the tokens nor the 499.
"""

from __future__ import annotations

import logging
import sys
import time
from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: 访问日志的 logger 名字。
#: en: The name of the access log's logger.
LOGGER_NAME = "minisgl.access"
#: 客户端在回答写完之前断开时，日志行里的状态码（nginx 的叫法）。
#: en: The status in the log line when the client disconnected before the answer was complete (nginx's name for it).
CLIENT_CLOSED = 499

#: 正在处理的请求的记录（状态码、token 数……）；处理请求的协程和它派生的任务都看得到同一个字典。
#: en: The record of the request being handled (status, tokens, ...); the coroutine handling it and the tasks it spawns
#: en: all see the same dict.
_RECORD: ContextVar[dict[str, Any] | None] = ContextVar("minisgl_access_record", default=None)


def access_logger() -> logging.Logger:
    """``minisgl.access``：没人配置过它时，加一个写 stderr 的 handler、级别 INFO、不再往上传（免得打印两遍）。

    en: ``minisgl.access``: when nobody configured it, give it a handler on stderr, level INFO, and no propagation (so
    nothing prints twice).
    """
    logger = logging.getLogger(LOGGER_NAME)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    return logger


def note_usage(prompt_tokens: int, completion_tokens: int) -> None:
    """记下当前请求的 token 数（一个请求结束的那条回复）；一个 HTTP 请求里有几个生成时，生成 token 相加、提示词取最大。
    不在访问日志的请求里（离线、测试）什么也不做。

    en: Note the current request's token counts (from a request's finishing reply); with several generations in one HTTP
    request the completion tokens add up and the prompt tokens take the largest. Outside a logged request (offline,
    tests) it does nothing.
    """
    record = _RECORD.get()
    if record is not None:
        record["prompt_tokens"] = max(record.get("prompt_tokens", 0), prompt_tokens)
        record["completion_tokens"] = record.get("completion_tokens", 0) + completion_tokens


def note_failure(status: int) -> None:
    """记下当前请求其实以 ``status`` 失败了：流式的回答在状态行（200）早已发出之后才出错（例如工作进程死了、副本断了），
    日志行写这个状态码，而不是 200。不在访问日志的请求里什么也不做。

    en: Note that the current request in fact failed with ``status``: a streamed answer that failed after its status
    line (200) was long out (a worker died, a replica broke off) is logged with this status instead of 200. Outside a
    logged request it does nothing.
    """
    record = _RECORD.get()
    if record is not None:
        record["failed"] = status


def format_line(method: str, path: str, status: int, record: dict[str, Any], ms: float) -> str:
    """一行日志：``方法 路径 状态码 [prompt_tokens=N completion_tokens=M] 用时ms``。

    en: One log line: ``method path status [prompt_tokens=N completion_tokens=M] timems``.
    """
    tokens = ""
    if "prompt_tokens" in record:
        tokens = f" prompt_tokens={record['prompt_tokens']} completion_tokens={record['completion_tokens']}"
    return f"{method} {path} {status}{tokens} {ms:.1f}ms"


class AccessLog:
    """ASGI 中间件（装在最外层，密钥和 503 的回答也记）：每个 HTTP 请求结束时写一行 :func:`format_line`。
    回答的最后一段发出之前，收到客户端断开（``http.disconnect``）或写回应失败，状态码记为 :data:`CLIENT_CLOSED`；
    状态行发出之后才失败的回答（:func:`note_failure`）记它失败时的状态码。

    en: ASGI middleware (installed outermost, so the answers of the key check and the 503 are logged too): one
    :func:`format_line` line when each HTTP request ends. If the client disconnects (``http.disconnect``) or writing the
    response fails before the last piece of the answer is out, the status is logged as :data:`CLIENT_CLOSED`; an answer
    that failed after its status line was out (:func:`note_failure`) is logged with the status it failed with.
    """

    def __init__(self, app: ASGIApp, logger: logging.Logger | None = None) -> None:
        self.app = app
        self.logger = logger or access_logger()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.logger.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        record: dict[str, Any] = {}
        state = {"status": 500, "done": False, "gone": False}

        async def receive_logged() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" and not state["done"]:
                state["gone"] = True
            return message

        async def send_logged(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["done"] = True
            try:
                await send(message)
            except OSError:
                state["gone"] = True
                raise

        token = _RECORD.set(record)
        try:
            await self.app(scope, receive_logged, send_logged)
        finally:
            _RECORD.reset(token)
            status = CLIENT_CLOSED if state["gone"] else record.get("failed", state["status"])
            ms = (time.perf_counter() - start) * 1000
            self.logger.info(format_line(scope["method"], scope["path"], status, record, ms))
