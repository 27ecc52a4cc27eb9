"""第 3.4 章 api_server：OpenAI 兼容的 HTTP 接口、流式输出，以及把几个进程拉起来的启动器。

``python -m minisgl --model DIR`` 启动三个进程：API 服务器（本模块，HTTP，在启动器自己的进程里）、分词 / 反分词
进程、调度器进程。一个请求的路径：

    HTTP 请求 → 解析成 SamplingParams（本章）→ TokenizeMsg → 分词进程 → UserMsg → 调度器
    调度器 → DetokenizeMsg → 反分词进程 → UserReply → 本进程按 uid 分给各个请求 → SSE 片段或一整个 JSON（本章）

你来写的是对客户端说话的部分：

- **请求 → 采样参数**：OpenAI 的语义（``temperature`` 缺省 1，0 是贪心）加上上游的扩展字段（``ignore_eos``、
  ``top_k``）；不合法的值、会改变结果却不支持的参数（``n`` > 1、``logprobs``、``tools`` ……）一律 400，
  错误体是 OpenAI 的样子 ``{"error": {"message", "type", "param", "code"}}``，说清是哪个参数；
- **流式输出**（server-sent events）：``data: {json}\\n\\n`` 一段一段地发，对话的第一段带 ``role``，最后一段带
  ``finish_reason``，要了 ``stream_options.include_usage`` 再发一段 ``usage``，最后 ``data: [DONE]``；
- **非流式输出**：整段文字、真实的 ``usage``、正确的 ``finish_reason``（``"length"`` 还是 ``"stop"``）；
- **客户端断开就取消请求**：取消消息要真的发出去（只发一次），请求的槽位和页面才回得来。

给定的部分（不是任务）：FastAPI / uvicorn 的接线、按 uid 分发回复的后台任务、``/metrics``、对话页面，
以及启动器——用 spawn 方式起两个工作进程、等它们报告就绪、Ctrl-C / SIGTERM 时让每个进程都退出；
某个工作进程死了，服务器对新请求回 503，并以非零状态退出。

en: Chapter 3.4 api_server: the OpenAI-compatible HTTP API, streaming, and the launcher that starts the processes.

``python -m minisgl --model DIR`` starts three processes: the API server (this module, HTTP, in the launcher's own
process), the tokenizer / detokenizer process and the scheduler process. One request's path:

    HTTP request → parsed into SamplingParams (this chapter) → TokenizeMsg → tokenizer → UserMsg → scheduler
    scheduler → DetokenizeMsg → detokenizer → UserReply → this process hands it to its request by uid → SSE chunks or
    one JSON object (this chapter)

You write the part that talks to the client:

- **request → sampling parameters**: OpenAI's semantics (``temperature`` defaults to 1, 0 is greedy) plus upstream's
  extra fields (``ignore_eos``, ``top_k``); an invalid value, or a parameter that would change the result but is not
  supported (``n`` > 1, ``logprobs``, ``tools``, ...), is a 400 with an OpenAI-style body
  ``{"error": {"message", "type", "param", "code"}}`` naming the parameter;
- **streaming** (server-sent events): ``data: {json}\\n\\n`` piece by piece; a chat stream's first chunk carries the
  ``role``, the last one the ``finish_reason``; with ``stream_options.include_usage`` one more chunk carries the
  ``usage``; then ``data: [DONE]``;
- **the non-streamed response**: the whole text, the real ``usage``, the right ``finish_reason`` (``"length"`` or
  ``"stop"``);
- **a client that disconnects aborts its request**: the abort message must really be sent (exactly once), or the
  request's slot and pages never come back.

Given (not tasks): the FastAPI / uvicorn wiring, the background task that hands replies out by uid, ``/metrics``, the
chat page, and the launcher — it starts the two worker processes with the spawn method, waits until they report ready,
and makes every process exit on Ctrl-C / SIGTERM; if a worker dies, the server answers new requests with 503 and exits
with a non-zero status.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import importlib
import json
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable, TypeVar

import uvicorn
import zmq
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from minisgl.core import InvalidParam, SamplingParams
from minisgl.i18n import lang, tr
from minisgl.paths import REPO_ROOT
from minisgl.message import (
    AbortMsg,
    ExitMsg,
    SchedulerStats,
    TokenizeMsg,
    UserReply,
    ZmqAsyncPullQueue,
    ZmqAsyncPushQueue,
    ZmqPushQueue,
    unwrap,
)
from minisgl.serving import (DEFAULT_PORT, ServerAddrs, ServerArgs, check_model_dir, make_ipc_dir, offline_hub, port_problem,
                             set_process_name)
from minisgl.validation import check_sampling

T = TypeVar("T")

#: ``/v1/completions`` 不给 ``max_tokens`` 时生成多少个 token（OpenAI 和上游的缺省都是 16）。
#: en: How many tokens ``/v1/completions`` generates without ``max_tokens`` (16, the default of OpenAI and upstream).
COMPLETION_MAX_TOKENS = 16
#: 会改变结果、但这里不支持的参数：名字 → 仍算“没用它”的取值。取别的值就是 400，而不是悄悄忽略。
#: en: Parameters that would change the result but are not supported here: name → the values that still count as "not
#: en: used". Any other value is a 400, not silently ignored.
UNSUPPORTED_PARAMS: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "min_tokens": (None, 0),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
}
#: 客户端断开的检查间隔（秒）。
#: en: How often (seconds) to check whether the client has disconnected.
DISCONNECT_POLL_S = 0.05
#: 等两个工作进程报告就绪的最长时间（秒）；加载大模型可能要一会儿。
#: en: The longest wait (seconds) for both workers to report ready; loading a big model may take a while.
READY_TIMEOUT_S = 600.0
#: 关机时每一步等多久（秒）：先等调度器自己退出，再 SIGTERM，最后 SIGKILL。
#: en: How long each shutdown step waits (seconds): first for the scheduler to exit by itself, then SIGTERM, last SIGKILL.
SHUTDOWN_WAIT_S = 10.0
#: 工作进程死了之后，服务器还留多久（秒）对请求回 503，然后退出。
#: en: How long (seconds) the server keeps answering 503 after a worker died, before it exits.
DEAD_WORKER_GRACE_S = 3.0
#: 首 token 时间的直方图分桶（秒）。
#: en: Histogram buckets (seconds) of the time to the first token.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: 每个输出 token 的时间的直方图分桶（秒）。
#: en: Histogram buckets (seconds) of the time per output token.
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
#: 对话页面（HTML + JavaScript，不用构建、不连外网）。
#: en: The chat page (HTML + JavaScript, no build step, no network).
CHAT_PAGE = REPO_ROOT / "minisgl" / "static" / "chat.html"
#: 服务器启动的时刻（``/v1/models`` 的 ``created``）。
#: en: When the server started (``created`` in ``/v1/models``).
STARTED = time.time()


# ----------------------------------------------------------------------------- 错误
# en: ----------------------------------------------------------------------------- errors


class ApiError(Exception):
    """一个要以 OpenAI 的样子回给客户端的错误：HTTP 状态码 + ``{"error": {"message", "type", "param", "code"}}``。

    en: An error answered to the client the OpenAI way: an HTTP status + ``{"error": {"message", "type", "param",
    "code"}}``.
    """

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None) -> None:  # noqa: A002 - OpenAI 的字段名 | en: OpenAI's field name
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
                             503: "service_unavailable"}.get(status, "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class ClientGone(Exception):
    """客户端在回答写完之前断开了。

    en: The client disconnected before the answer was complete.
    """


# ----------------------------------------------------------------------------- 请求 → 采样参数
# en: ----------------------------------------------------------------------------- request → sampling parameters


def unsupported_params(body: dict[str, Any]) -> list[str]:
    """请求里用到的、会改变结果却不支持的参数名（按 :data:`UNSUPPORTED_PARAMS` 的顺序）；没有就是空列表。

    en: The names of the parameters in the request that would change the result but are not supported (in the order of
    :data:`UNSUPPORTED_PARAMS`); an empty list if there are none.
    """
    # >>> TASK unsupported_params: 逐个看 UNSUPPORTED_PARAMS：请求里有这个名字、且取值不在“没用它”的那些值里，就记下名字
    # en: go through UNSUPPORTED_PARAMS: if the request has the name and its value is not one of the "not used" values, note the name
    return [name for name, neutral in UNSUPPORTED_PARAMS.items() if name in body and body[name] not in neutral]
    # <<< TASK


def _field(body: dict[str, Any], name: str, default: Any) -> Any:
    """``body[name]``，缺省或 ``null`` 时是 ``default``。

    en: ``body[name]``, or ``default`` when absent or ``null``.
    """
    value = body.get(name)
    return default if value is None else value


def sampling_params_from(body: dict[str, Any], *, max_seq_len: int,
                         default_max_tokens: int | None) -> tuple[SamplingParams, list[str]]:
    """按 OpenAI 的语义把请求体变成 ``(SamplingParams, 停止字符串列表)``，不合法就抛 :class:`ApiError` (400)。

    - 缺省值：``temperature`` 1.0（OpenAI 的缺省，不是贪心）、``top_p`` 1.0、``top_k``（上游的扩展）-1（不限）、
      ``ignore_eos``（上游的扩展）False、``seed`` 不给；
    - ``max_tokens``（对话接口也认 ``max_completion_tokens``）：不给就用 ``default_max_tokens``，它是 None 时表示
      “上下文放得下多少就生成多少”，即 ``max_seq_len - 1``（调度器会按提示词的实际长度截短）；要小于上下文长度
      ``max_seq_len``（提示词至少还要占一个位置），否则是 ``context_length_exceeded``；
    - ``stop``：不给、一个字符串、或字符串列表。

    类型和取值范围不在这里查：它们只有一道门，:func:`~minisgl.validation.check_sampling`（类型，再加第 1.1 章的
    ``SamplingParams.validate``）。它抛的 :class:`~minisgl.core.InvalidParam` 点名了字段，错误的 ``param`` 就写它
    （``max_tokens`` 出错而请求用的是 ``max_completion_tokens`` 时写后者）。

    en: Turn the request body into ``(SamplingParams, list of stop strings)`` with OpenAI's semantics; raise
    :class:`ApiError` (400) when something is invalid.

    - defaults: ``temperature`` 1.0 (OpenAI's default, not greedy), ``top_p`` 1.0, ``top_k`` (upstream's extra) -1 (no
      limit), ``ignore_eos`` (upstream's extra) False, no ``seed``;
    - ``max_tokens`` (the chat endpoint also takes ``max_completion_tokens``): when absent, ``default_max_tokens``,
      where None means "as many as the context holds", i.e. ``max_seq_len - 1`` (the scheduler clips it to the
      prompt's real length); it must stay below the context length ``max_seq_len`` (the prompt needs at least one
      place), otherwise it is ``context_length_exceeded``;
    - ``stop``: absent, one string, or a list of strings.

    Types and ranges are not checked here: they have one gate, :func:`~minisgl.validation.check_sampling` (types, then
    chapter 1.1's ``SamplingParams.validate``). The :class:`~minisgl.core.InvalidParam` it raises names the field, which
    becomes the error's ``param`` (``max_completion_tokens`` when that is what the request used for ``max_tokens``).
    """
    # >>> TASK sampling_params: 按 OpenAI 的缺省值取 temperature、top_p、top_k、ignore_eos、seed 和 max_tokens（先 max_tokens 再 max_completion_tokens；缺省按 default_max_tokens，None 即 max_seq_len-1），组成 SamplingParams 交给 check_sampling（InvalidParam → 400，param 用请求里的名字）；max_tokens ≥ max_seq_len → 400 context_length_exceeded；stop：字符串 → [它]，列表里都得是字符串；返回 (SamplingParams, stop 列表)
    # en: read temperature, top_p, top_k, ignore_eos, seed and max_tokens with OpenAI's defaults (max_tokens first, then max_completion_tokens; default default_max_tokens, None meaning max_seq_len-1), build SamplingParams and pass it to check_sampling (InvalidParam → 400, param named as in the request); max_tokens ≥ max_seq_len → 400 context_length_exceeded; stop: a string → [it], a list must hold only strings; return (SamplingParams, the stop list)
    name = "max_tokens" if body.get("max_tokens") is not None else "max_completion_tokens"
    max_tokens = _field(body, name, default_max_tokens)
    sp = SamplingParams(temperature=_field(body, "temperature", 1.0), top_k=_field(body, "top_k", -1),
                        top_p=_field(body, "top_p", 1.0), ignore_eos=_field(body, "ignore_eos", False),
                        max_tokens=max_seq_len - 1 if max_tokens is None else max_tokens, seed=body.get("seed"))
    try:
        check_sampling(sp)
    except InvalidParam as e:
        raise ApiError(400, str(e), param=name if e.param == "max_tokens" else e.param, code="invalid_value") from None
    if sp.max_tokens >= max_seq_len:
        raise ApiError(400, tr("{name}={value} is beyond the context of this server ({max_seq_len} tokens, prompt included)",
                               name=name, value=sp.max_tokens, max_seq_len=max_seq_len),
                       param=name, code="context_length_exceeded")
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, tr("stop must be a string or a list of strings, got {value!r}", value=body.get("stop")),
                       param="stop", code="invalid_value")
    return sp, stop
    # <<< TASK


# ----------------------------------------------------------------------------- 回答的样子
# en: ----------------------------------------------------------------------------- the shape of the answers


@dataclass
class ParsedRequest:
    """解析好的一个请求。``kind`` 是 ``"chat"``（``/v1/chat/completions``）或 ``"completion"``
    （``/v1/completions`` 和 ``/generate``）；``prompt`` 是文本、token id 列表或对话消息列表。

    en: One parsed request. ``kind`` is ``"chat"`` (``/v1/chat/completions``) or ``"completion"``
    (``/v1/completions`` and ``/generate``); ``prompt`` is text, a list of token ids or a list of chat messages.
    """

    kind: str
    model: str
    prompt: str | list[int] | list[dict[str, str]]
    sampling_params: SamplingParams
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))


def response_id(req: ParsedRequest, uid: int) -> str:
    """回答的 id：对话是 ``chatcmpl-<uid>``，补全是 ``cmpl-<uid>``。

    en: The answer's id: ``chatcmpl-<uid>`` for chat, ``cmpl-<uid>`` for completions.
    """
    return f"chatcmpl-{uid}" if req.kind == "chat" else f"cmpl-{uid}"


def sse(data: Any) -> str:
    """一个 server-sent event：``data: <JSON>`` 加一个空行。

    en: One server-sent event: ``data: <JSON>`` followed by a blank line.
    """
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


#: 流的最后一个事件。
#: en: The last event of a stream.
DONE = "data: [DONE]\n\n"


def usage_of(reply: UserReply) -> dict[str, int]:
    """最后一条回复里的 token 计数 → OpenAI 的 ``usage``。

    en: The token counts of the last reply → OpenAI's ``usage``.
    """
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


async def stream_chunks(req: ParsedRequest, uid: int, replies: AsyncIterator[UserReply]) -> AsyncIterator[str]:
    """流式回答：把 ``replies``（这个请求的 :class:`UserReply`，最后一条 ``finished``）变成一个个 SSE 事件（字符串）。

    - 对话（``kind == "chat"``）：每个事件是 ``chat.completion.chunk``，``choices[0]`` 是
      ``{"index": 0, "delta": {...}, "finish_reason": ..., "logprobs": None}``；第一个事件在任何回复之前发出，
      ``delta`` 是 ``{"role": "assistant", "content": ""}``；之后每段新文字一个事件，``delta`` 是 ``{"content": 文字}``；
    - 补全：每个事件是 ``text_completion``，``choices[0]`` 是 ``{"index": 0, "text": 文字, "finish_reason": ...,
      "logprobs": None}``；
    - 每个事件还有 ``id``（:func:`response_id`）、``object``、``created``（``req.created``）、``model``；
    - 空的片段不发（反分词扣住了半个字符时会有）；回复结束时，先发它带的最后一段文字（若有），再发一个
      ``finish_reason`` 为这条回复的 ``finish_reason`` 的事件（对话的 ``delta`` 为 ``{}``，补全的 ``text`` 为 ``""``）；
    - 回复带 ``error``：发一个 ``{"error": {"message": ..., "type": "invalid_request_error", "param": None,
      "code": None}}`` 事件，然后 ``DONE``，结束；
    - ``req.include_usage`` 时，结束之后再发一个 ``choices`` 为空列表、带 ``usage``（:func:`usage_of`）的事件；
    - 最后是 :data:`DONE`。

    en: The streamed answer: turn ``replies`` (this request's :class:`UserReply` objects, the last one ``finished``)
    into SSE events (strings).

    - chat (``kind == "chat"``): each event is a ``chat.completion.chunk`` whose ``choices[0]`` is
      ``{"index": 0, "delta": {...}, "finish_reason": ..., "logprobs": None}``; the first event goes out before any
      reply, with ``delta`` ``{"role": "assistant", "content": ""}``; then one event per new piece of text, with
      ``delta`` ``{"content": text}``;
    - completions: each event is a ``text_completion`` whose ``choices[0]`` is ``{"index": 0, "text": text,
      "finish_reason": ..., "logprobs": None}``;
    - every event also has ``id`` (:func:`response_id`), ``object``, ``created`` (``req.created``) and ``model``;
    - an empty piece is not sent (the detokenizer holding back half a character makes one); when the replies finish,
      first the last piece they carry (if any), then an event whose ``finish_reason`` is the reply's ``finish_reason``
      (a chat ``delta`` of ``{}``, a completion ``text`` of ``""``);
    - a reply with ``error``: send one ``{"error": {"message": ..., "type": "invalid_request_error", "param": None,
      "code": None}}`` event, then ``DONE``, and stop;
    - with ``req.include_usage``, after the end one more event with an empty ``choices`` list and the ``usage``
      (:func:`usage_of`);
    - last, :data:`DONE`.
    """
    # >>> TASK stream_chunks: 写一个 chunk(内容, finish_reason) 的小函数按 kind 造事件（对话用 delta，补全用 text）；对话先 yield 带 role 的那个；async for 每条回复：有 error → yield 错误事件和 DONE 并 return；有文字就 yield 一个；finished 就 yield 带 finish_reason 的结尾事件并记下 usage；最后按 include_usage 发 usage 事件，再 yield DONE
    # en: write a small chunk(content, finish_reason) that builds an event by kind (delta for chat, text for completions); for chat first yield the one with the role; async for each reply: error → yield the error event and DONE, then return; yield one event if it has text; when finished yield the closing event with the finish_reason and note the usage; at the end the usage event if include_usage, then yield DONE
    chat = req.kind == "chat"
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(content: dict[str, str] | str, finish_reason: str | None) -> str:
        choice: dict[str, Any] = {"index": 0, ("delta" if chat else "text"): content, "finish_reason": finish_reason,
                                  "logprobs": None}
        return sse({"id": response_id(req, uid), "object": obj, "created": req.created, "model": req.model,
                    "choices": [choice]})

    if chat:
        yield chunk({"role": "assistant", "content": ""}, None)
    usage = None
    async for reply in replies:
        if reply.error:
            yield sse(ApiError(400, reply.error).body())
            yield DONE
            return
        if reply.incremental_output:
            yield chunk({"content": reply.incremental_output} if chat else reply.incremental_output, None)
        if reply.finished:
            yield chunk({} if chat else "", reply.finish_reason)
            usage = usage_of(reply)
            break
    if req.include_usage and usage is not None:
        yield sse({"id": response_id(req, uid), "object": obj, "created": req.created, "model": req.model,
                   "choices": [], "usage": usage})
    yield DONE
    # <<< TASK


async def full_response(req: ParsedRequest, uid: int, replies: AsyncIterator[UserReply]) -> dict[str, Any]:
    """非流式回答：收完 ``replies``，返回一整个 OpenAI 对象。

    - 对话：``{"id", "object": "chat.completion", "created", "model", "choices": [{"index": 0, "message":
      {"role": "assistant", "content": 全文}, "finish_reason": ..., "logprobs": None}], "usage": ...}``；
    - 补全：``{"id", "object": "text_completion", "created", "model", "choices": [{"index": 0, "text": 全文,
      "finish_reason": ..., "logprobs": None}], "usage": ...}``；
    - ``finish_reason`` 和 ``usage``（:func:`usage_of`）取自最后一条回复；有回复带 ``error`` 就抛
      ``ApiError(400, error)``。

    en: The non-streamed answer: collect all of ``replies`` and return one OpenAI object.

    - chat: ``{"id", "object": "chat.completion", "created", "model", "choices": [{"index": 0, "message":
      {"role": "assistant", "content": full text}, "finish_reason": ..., "logprobs": None}], "usage": ...}``;
    - completions: ``{"id", "object": "text_completion", "created", "model", "choices": [{"index": 0, "text":
      full text, "finish_reason": ..., "logprobs": None}], "usage": ...}``;
    - ``finish_reason`` and ``usage`` (:func:`usage_of`) come from the last reply; a reply with ``error`` raises
      ``ApiError(400, error)``.
    """
    # >>> TASK full_response: async for 收集每条回复的 incremental_output（遇到 error 抛 ApiError(400, error)），记住最后一条；按 kind 拼出 chat.completion（message）或 text_completion（text），finish_reason 与 usage 取自最后一条
    # en: async for: collect each reply's incremental_output (on an error raise ApiError(400, error)) and remember the last reply; by kind build a chat.completion (message) or a text_completion (text), with the finish_reason and usage of the last reply
    pieces: list[str] = []
    last: UserReply | None = None
    async for reply in replies:
        if reply.error:
            raise ApiError(400, reply.error)
        pieces.append(reply.incremental_output)
        last = reply
    assert last is not None and last.finished
    text = "".join(pieces)
    if req.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text}
        obj = "text_completion"
    choice.update(finish_reason=last.finish_reason, logprobs=None)
    return {"id": response_id(req, uid), "object": obj, "created": req.created, "model": req.model,
            "choices": [choice], "usage": usage_of(last)}
    # <<< TASK


# ----------------------------------------------------------------------------- 指标（给定）
# en: ----------------------------------------------------------------------------- metrics (given)


class Histogram:
    """Prometheus 的直方图：各分桶的累计计数、总和、个数。

    en: A Prometheus histogram: cumulative bucket counts, the sum and the count.
    """

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{le="{bound}"}} {n}' for bound, n in zip(self.buckets, self.counts)]
        lines += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]
        return lines


@dataclass
class Metrics:
    """API 服务器自己数的那些（调度器的现状在 :class:`SchedulerStats` 里）。

    en: What the API server counts itself (the scheduler's state is in :class:`SchedulerStats`).
    """

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # finish_reason → 请求数 | en: finish_reason → requests
    errors: dict[int, int] = field(default_factory=dict)  # HTTP 状态码 → 次数 | en: HTTP status → count
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))


def render_metrics(stats: SchedulerStats | None, m: Metrics, active: int, in_flight: int, aborts_sent: int) -> str:
    """Prometheus 文本格式的 ``/metrics``。

    en: ``/metrics`` in the Prometheus text format.
    """
    s = stats or SchedulerStats(0, 0, 0, 0, 0, 0, 0, 0, 0)
    lines: list[str] = []

    def one(name: str, kind: str, help_text: str, value: float, samples: dict[str, float] | None = None) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
        if samples is None:
            lines.append(f"{name} {value}")
        else:
            lines.extend(f"{name}{{{key}}} {n}" for key, n in samples.items())

    one("minisgl_running_requests", "gauge", "Requests running in the scheduler (holding a request slot).", s.running)
    one("minisgl_waiting_requests", "gauge", "Requests waiting in the scheduler to be admitted.", s.waiting)
    one("minisgl_active_requests", "gauge", "Requests the API server is still waiting on (submitted, not finished, not aborted).", active)
    one("minisgl_http_requests_in_flight", "gauge", "HTTP requests being handled (not counting /metrics and /health).", in_flight)
    one("minisgl_kv_pages_used", "gauge", "KV cache pages held by requests or the prefix cache.", s.pages_in_use)
    one("minisgl_kv_pages_cached", "gauge", "KV cache pages held only by the prefix cache (evictable, no request uses them).", s.pages_cached)
    one("minisgl_kv_pages_free", "gauge", "KV cache pages free.", s.pages_total - s.pages_in_use)
    one("minisgl_kv_pages_total", "gauge", "KV cache pages in all.", s.pages_total)
    one("minisgl_prefix_cache_hit_tokens_total", "counter", "Prefill tokens saved by the prefix cache.", s.cache_hit_tokens)
    one("minisgl_prefill_tokens_total", "counter", "Prefill tokens computed by the scheduler.", s.prefill_tokens)
    one("minisgl_decode_tokens_total", "counter", "Tokens decoded by the scheduler.", s.decode_tokens)
    one("minisgl_max_decode_batch", "gauge", "The largest decode batch so far.", s.max_decode_batch)
    one("minisgl_steps_total", "counter", "Scheduler steps so far.", s.steps)
    one("minisgl_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", m.prompt_tokens)
    one("minisgl_generation_tokens_total", "counter", "Tokens generated for finished requests.", m.generation_tokens)
    reasons = {r: m.finished.get(r, 0) for r in ("stop", "length", "abort", "error")}
    one("minisgl_requests_finished_total", "counter", "Finished requests by finish reason.", 0,
        {f'finish_reason="{r}"': n for r, n in reasons.items()})
    one("minisgl_aborted_requests_total", "counter", "Requests aborted (client gone or stop pressed).", reasons["abort"])
    one("minisgl_abort_messages_total", "counter", "AbortMsg sent by the API server to the tokenizer.", aborts_sent)
    one("minisgl_http_errors_total", "counter", "Error answers by HTTP status.", 0,
        {f'status="{code}"': n for code, n in sorted(m.errors.items())})
    lines += m.ttft.render("minisgl_time_to_first_token_seconds", "Time from the request to its first token.")
    lines += m.tpot.render("minisgl_time_per_output_token_seconds", "Time per output token after the first.")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- 进程里的状态（给定，取消除外）
# en: ----------------------------------------------------------------------------- the process's state (given, except abort)


class CountingPush:
    """发给分词进程的 PUSH，顺便按消息类型数一数发了多少条（``/metrics`` 里的取消消息数就是这里来的）。

    en: The PUSH to the tokenizer, counting what it sends by message type (the number of abort messages in
    ``/metrics`` comes from here).
    """

    def __init__(self, queue: ZmqAsyncPushQueue) -> None:
        self.queue = queue
        self.sent: dict[str, int] = {}

    async def put(self, msg: Any) -> None:
        self.sent[type(msg).__name__] = self.sent.get(type(msg).__name__, 0) + 1
        await self.queue.put(msg)

    def close(self) -> None:
        self.queue.close()


class ServerState:
    """API 服务器的状态：给分词进程的 PUSH、自己的 PULL、``uid → asyncio.Queue``（还没答完的请求）、
    调度器最新的现状和指标。一个后台任务（:meth:`dispatch`）读 PULL，把每条 :class:`UserReply` 放进它那个请求的队列。

    en: The API server's state: the PUSH to the tokenizer, its own PULL, ``uid → asyncio.Queue`` (requests not answered
    yet), the scheduler's latest state and the metrics. A background task (:meth:`dispatch`) reads the PULL and puts
    every :class:`UserReply` into its request's queue.
    """

    def __init__(self, args: ServerArgs, addrs: ServerAddrs, info: dict[str, Any]) -> None:
        self.args = args
        self.addrs = addrs
        self.info = info
        self.max_seq_len = int(info.get("max_seq_len") or 1 << 30)
        self.model_name = args.model_name or Path(args.model_path).name
        self.next_uid = 0
        self.live: dict[int, asyncio.Queue[UserReply]] = {}
        self.started: dict[int, float] = {}  # uid → 提交时刻 | en: uid → when it was submitted
        self.first: dict[int, float] = {}  # uid → 第一条回复的时刻 | en: uid → when its first reply came
        self.stats: SchedulerStats | None = None
        self.metrics = Metrics()
        self.dead: str | None = None
        self.send: CountingPush | None = None
        self.in_flight = 0  # 正在处理的 HTTP 请求（/metrics、/health 不算）| en: HTTP requests being handled (not /metrics, /health)
        self.recv: ZmqAsyncPullQueue | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """在 uvicorn 的事件循环里打开套接字、启动分发任务。

        en: Open the sockets and start the dispatch task in uvicorn's event loop.
        """
        self.loop = asyncio.get_running_loop()
        self.recv = ZmqAsyncPullQueue(self.addrs.frontend, create=True)
        self.send = CountingPush(ZmqAsyncPushQueue(self.addrs.tokenizer, create=False))
        self._task = asyncio.create_task(self.dispatch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for queue in (self.send, self.recv):
            if queue is not None:
                queue.close()

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
                    self.stats = m
                elif isinstance(m, UserReply):
                    self._count(m, now)
                    queue = self.live.pop(m.uid, None) if m.finished else self.live.get(m.uid)
                    if queue is not None:
                        queue.put_nowait(m)

    def _count(self, reply: UserReply, now: float) -> None:
        if reply.uid in self.started and reply.uid not in self.first and not reply.error:
            self.first[reply.uid] = now
            self.metrics.ttft.observe(now - self.started[reply.uid])
        if not reply.finished:
            return
        started, first = self.started.pop(reply.uid, None), self.first.pop(reply.uid, None)
        reason = "error" if reply.error else (reply.finish_reason or "stop")
        self.metrics.finished[reason] = self.metrics.finished.get(reason, 0) + 1
        self.metrics.prompt_tokens += reply.prompt_tokens
        self.metrics.generation_tokens += reply.completion_tokens
        if started is not None and first is not None and reply.completion_tokens > 1:
            self.metrics.tpot.observe((now - first) / (reply.completion_tokens - 1))

    async def submit(self, req: ParsedRequest) -> tuple[int, asyncio.Queue[UserReply]]:
        """给请求一个新 uid、一个回复队列，把 :class:`TokenizeMsg` 发给分词进程。

        en: Give the request a new uid and a reply queue, and send the :class:`TokenizeMsg` to the tokenizer.
        """
        if self.dead is not None:
            raise ApiError(503, self.dead)
        assert self.send is not None
        uid = self.next_uid
        self.next_uid += 1
        queue: asyncio.Queue[UserReply] = asyncio.Queue()
        self.live[uid] = queue
        self.started[uid] = time.monotonic()
        try:
            await self.send.put(TokenizeMsg(uid, req.prompt, req.sampling_params, req.stop))
        except BaseException:  # 没发出去：不留登记（否则 minisgl_active_requests 永远降不下来） | en: not sent: unregister (or minisgl_active_requests never comes down)
            self.live.pop(uid, None)
            self.started.pop(uid, None)
            raise
        return uid, queue

    @staticmethod
    async def replies(queue: asyncio.Queue[UserReply], first: UserReply | None = None) -> AsyncIterator[UserReply]:
        """一个请求的回复，一条接一条，到 ``finished`` 的那条为止（``first`` 是已经取出来的第一条）。

        en: One request's replies, one after another, up to the ``finished`` one (``first``: the first one, already
        taken out).
        """
        reply = first if first is not None else await queue.get()
        while True:
            yield reply
            if reply.finished:
                return
            reply = await queue.get()

    async def abort(self, uid: int) -> None:
        """取消请求 ``uid``：还没答完就发一条 :class:`AbortMsg` 给分词进程（它转告调度器），并不再等它的回复；
        已经答完或已经取消过就什么也不做——同一个请求的取消只发一次。

        en: Abort request ``uid``: if it is not answered yet, send an :class:`AbortMsg` to the tokenizer (which tells the
        scheduler) and stop waiting for its replies; if it is answered already, or aborted already, do nothing — one
        request's abort is sent once.
        """
        # >>> TASK abort_once: 从 self.live 里 pop 这个 uid（不在就直接返回：答完了或取消过了）；在的话 await self.send.put(AbortMsg(uid))
        # en: pop the uid from self.live (absent → just return: answered or aborted already); if it was there, await self.send.put(AbortMsg(uid))
        if self.live.pop(uid, None) is None:
            return
        assert self.send is not None
        await self.send.put(AbortMsg(uid))
        # <<< TASK

    def mark_dead(self, why: str) -> None:
        """某个工作进程死了：以后的请求回 503；正在等回复的请求都收到一条带错误的结束回复，不再干等。

        en: A worker died: later requests get a 503; every request waiting for replies gets a finishing reply with the
        error, instead of waiting forever.
        """
        self.dead = why
        for uid, queue in list(self.live.items()):
            queue.put_nowait(UserReply(uid, "", finished=True, error=why))
        self.live.clear()


async def until_disconnect(request: Request, state: ServerState, uid: int, work: Awaitable[T]) -> T:
    """等 ``work`` 做完并返回它的结果；其间每 :data:`DISCONNECT_POLL_S` 秒看一眼客户端还在不在。客户端走了：
    取消 ``work``、``await state.abort(uid)``（取消请求，真的等它发出去），抛 :class:`ClientGone`。
    无论怎样离开，``work`` 都不能留在后台继续跑。

    en: Wait for ``work`` to finish and return its result; meanwhile check every :data:`DISCONNECT_POLL_S` seconds
    whether the client is still there. If the client is gone: cancel ``work``, ``await state.abort(uid)`` (abort the
    request, really waiting until it is sent) and raise :class:`ClientGone`. However this returns, ``work`` must not be
    left running in the background.
    """
    # >>> TASK abort_on_disconnect: task = asyncio.ensure_future(work)；try：task 没做完就 await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)，再 await request.is_disconnected()，为真就 await state.abort(uid) 并 raise ClientGone()；循环结束返回 task.result()；finally：task.cancel()（做完了的任务取消也无妨）
    # en: task = asyncio.ensure_future(work); try: while the task is not done, await asyncio.wait({task}, timeout=DISCONNECT_POLL_S), then await request.is_disconnected(), and if true await state.abort(uid) and raise ClientGone(); after the loop return task.result(); finally: task.cancel() (cancelling a finished task does no harm)
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if await request.is_disconnected():
                await state.abort(uid)
                raise ClientGone()
        return task.result()
    finally:
        task.cancel()
    # <<< TASK


# ----------------------------------------------------------------------------- HTTP 接口（给定）
# en: ----------------------------------------------------------------------------- the HTTP endpoints (given)


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    """对话消息：非空列表，每条有 ``role`` 和文字 ``content``（也认 OpenAI 的 ``[{"type": "text", "text": ...}]``）。

    en: Chat messages: a non-empty list, each with a ``role`` and a text ``content`` (OpenAI's ``[{"type": "text",
    "text": ...}]`` is accepted too).
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, tr("messages is missing: give a non-empty list of chat messages, each with a role and a content"),
                       param="messages", code="missing_required_parameter" if messages is None else "invalid_value")
    out = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or not isinstance(content, str):
            raise ApiError(400, tr("messages[{i}] must have a role (system, user or assistant) and a text content, got {value!r}",
                                   i=i, value=m), param=f"messages[{i}]", code="invalid_value")
        out.append({"role": m["role"], "content": content})
    return out


def _prompt(body: dict[str, Any]) -> str | list[int]:
    """补全的提示词：一个字符串、一列 token id，或只有一项的列表（OpenAI 客户端会这样包一层）。

    en: A completion prompt: a string, a list of token ids, or a one-item list (the OpenAI client may wrap it so).
    """
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    if prompt is None or prompt == "" or prompt == []:
        raise ApiError(400, tr("prompt is missing: give a non-empty string or a list of token ids"), param="prompt",
                       code="missing_required_parameter")
    raise ApiError(400, tr("prompt must be one non-empty string or one list of token ids (one prompt per request), got {value!r}",
                           value=prompt), param="prompt", code="invalid_value")


def parse_request(kind: str, body: Any, state: ServerState, *, stream_default: bool = False) -> ParsedRequest:
    """请求体 → :class:`ParsedRequest`：模型名、提示词、不支持的参数、采样参数、``stream`` / ``stream_options``。

    en: Request body → :class:`ParsedRequest`: the model name, the prompt, unsupported parameters, the sampling
    parameters, ``stream`` / ``stream_options``.
    """
    if not isinstance(body, dict):
        raise ApiError(400, tr("The request body must be a JSON object"), code="invalid_json")
    model = body.get("model")
    if model is not None and model not in (state.model_name, state.args.model_path):
        raise ApiError(404, tr("The model {model!r} does not exist: this server serves {name!r}", model=model,
                               name=state.model_name), param="model", code="model_not_found")
    prompt = _messages(body) if kind == "chat" else _prompt(body)
    bad = unsupported_params(body)
    if bad:
        raise ApiError(400, tr("Unsupported parameters that would change the result: {names} (remove them)",
                               names=", ".join(bad)), param=bad[0], code="unsupported_parameter")
    sp, stop = sampling_params_from(body, max_seq_len=state.max_seq_len,
                                    default_max_tokens=None if kind == "chat" else COMPLETION_MAX_TOKENS)
    stream = body.get("stream", stream_default)
    stream = stream_default if stream is None else stream
    if not isinstance(stream, bool):
        raise ApiError(400, tr("stream must be true or false, got {value!r}", value=stream), param="stream",
                       code="invalid_value")
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise ApiError(400, tr("stream_options is only allowed with stream: true, as an object"), param="stream_options",
                       code="invalid_value")
    include_usage = bool((options or {}).get("include_usage", False))
    return ParsedRequest(kind, state.model_name, prompt, sp, stop, stream, include_usage)


async def _guard(chunks: AsyncIterator[str], state: ServerState, uid: int) -> AsyncIterator[str]:
    """包住流：生成器自己出了错，就取消请求，别让它在后台白白跑下去。

    en: Wraps the stream: if the generator itself fails, abort the request so it does not run on for nothing.
    """
    try:
        async for chunk in chunks:
            yield chunk
    except Exception:
        await state.abort(uid)
        raise


async def answer(request: Request, state: ServerState, req: ParsedRequest) -> Response:
    """提交请求，再按 ``stream`` 回答：流式先等到第一条回复（被拒绝的请求这时还能回 400），然后一段段发；
    流结束后（正常结束或客户端断开）由后台任务 ``state.abort(uid)`` 收尾——答完了的请求它什么也不做。

    en: Submit the request, then answer according to ``stream``: a stream first waits for the first reply (a refused
    request can still get a 400 then), then sends piece by piece; after the stream ends (normally or because the client
    disconnected) the background task ``state.abort(uid)`` tidies up — for an answered request it does nothing.
    """
    uid, queue = await state.submit(req)
    if not req.stream:
        return JSONResponse(await until_disconnect(request, state, uid, full_response(req, uid, state.replies(queue))))
    first = await until_disconnect(request, state, uid, queue.get())
    if first.error:
        raise ApiError(503 if state.dead else 400, first.error)
    chunks = stream_chunks(req, uid, state.replies(queue, first))
    if asyncio.iscoroutine(chunks):  # 骨架：还没写成生成器，这里就抛出它的 TaskNotDone | en: skeleton: not a generator yet, this raises its TaskNotDone
        await chunks
    return StreamingResponse(_guard(chunks, state, uid), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                             background=BackgroundTask(state.abort, uid))


def _page_text() -> dict[str, str]:
    """对话页面上的文字（按当前语言）。

    en: The text on the chat page (in the current language).
    """
    return {
        "lang": "zh-CN" if lang() == "zh" else "en", "title": tr("mini-sglang chat"), "send": tr("Send"), "stop": tr("Stop"),
        "clear": tr("New chat"), "max_tokens": tr("Max tokens"), "temperature": tr("Temperature"),
        "api_key": tr("API key"), "placeholder": tr("Type a message; Enter sends, Shift+Enter starts a new line"),
        "ready": tr("Ready."), "streaming": tr("Streaming…"), "stopped": tr("Stopped."), "done": tr("Done."),
        "error": tr("Error:"), "tokens": tr("tokens"),
    }


class Gate:
    """最外层的 ASGI 中间件：工作进程死了就回 503（``/metrics`` 除外）；设了 ``--api-key`` 就检查
    ``/v1/*`` 和 ``/generate`` 的 ``Authorization: Bearer <key>``（错了或没给都是 401）。

    en: The outermost ASGI middleware: a 503 once a worker died (except ``/metrics``); with ``--api-key``, check
    ``Authorization: Bearer <key>`` on ``/v1/*`` and ``/generate`` (wrong or missing: 401).
    """

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    def refuse(self, scope: Scope) -> ApiError | None:
        path = scope.get("path", "")
        if self.state.dead is not None and path != "/metrics":
            return ApiError(503, self.state.dead)
        key = self.state.args.api_key
        if key and (path.startswith("/v1/") or path == "/generate"):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, f"Bearer {key}".encode()):
                why = tr("Wrong API key") if given else tr("Missing API key: send the header Authorization: Bearer <key>")
                return ApiError(401, why, code="invalid_api_key")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        err = self.refuse(scope) if scope["type"] == "http" else None
        if err is None:
            counted = scope["type"] == "http" and scope.get("path") not in ("/metrics", "/health")
            self.state.in_flight += counted
            try:
                await self.app(scope, receive, send)
            finally:
                self.state.in_flight -= counted
            return
        self.state.metrics.errors[err.status] = self.state.metrics.errors.get(err.status, 0) + 1
        await JSONResponse(err.body(), status_code=err.status)(scope, receive, send)


def create_app(state: ServerState) -> FastAPI:
    """FastAPI 应用：各个接口、API 密钥、错误体、工作进程死掉后的 503。

    en: The FastAPI application: the endpoints, the API key, error bodies, the 503 after a worker died.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.start()
        yield
        await state.stop()

    app = FastAPI(title="mini-sglang", lifespan=lifespan)
    app.add_middleware(Gate, state=state)

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, err: ApiError) -> JSONResponse:
        if state.dead is not None and err.status == 400:  # 回复里的错误其实是进程死了 | en: the error in the reply is really a dead worker
            err = ApiError(503, state.dead)
        state.metrics.errors[err.status] = state.metrics.errors.get(err.status, 0) + 1
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, err: HTTPException) -> JSONResponse:
        # 路径不存在（404）、方法不对（405）：也回 OpenAI 的错误体，客户端只需认一种
        # en: an unknown path (404) or a wrong method (405) gets OpenAI's error body too: clients know one shape only
        why = tr("{method} {path}: {detail}", method=request.method, path=request.url.path, detail=err.detail)
        state.metrics.errors[err.status_code] = state.metrics.errors.get(err.status_code, 0) + 1
        return JSONResponse(ApiError(err.status_code, why, type="invalid_request_error").body(), status_code=err.status_code,
                            headers=err.headers)

    @app.exception_handler(ClientGone)
    async def on_client_gone(request: Request, err: ClientGone) -> Response:
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def on_error(request: Request, err: Exception) -> JSONResponse:
        state.metrics.errors[500] = state.metrics.errors.get(500, 0) + 1
        return JSONResponse(ApiError(500, f"{type(err).__name__}: {err}").body(), status_code=500)

    async def json_body(request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, tr("The request body is not valid JSON: {error}", error=e), code="invalid_json") from None

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await answer(request, state, parse_request("chat", await json_body(request), state))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer(request, state, parse_request("completion", await json_body(request), state))

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        # 上游的接口：字段与 /v1/completions 相同，缺省流式
        # en: upstream's endpoint: the same fields as /v1/completions, streamed by default
        return await answer(request, state, parse_request("completion", await json_body(request), state, stream_default=True))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": state.model_name, "object": "model", "created": int(STARTED), "owned_by": "minisgl",
                "root": state.args.model_path, "max_model_len": state.max_seq_len}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        aborts = state.send.sent.get("AbortMsg", 0) if state.send is not None else 0
        return PlainTextResponse(render_metrics(state.stats, state.metrics, len(state.live), state.in_flight, aborts),
                                 media_type="text/plain; version=0.0.4")

    @app.get("/")
    async def chat_page() -> HTMLResponse:
        page = CHAT_PAGE.read_text(encoding="utf-8")
        for key, text in {**_page_text(), "model": state.model_name}.items():
            page = page.replace("{{" + key + "}}", json.dumps(text, ensure_ascii=False)[1:-1])
        return HTMLResponse(page)

    return app


# ----------------------------------------------------------------------------- 启动器（给定）
# en: ----------------------------------------------------------------------------- the launcher (given)


#: 两个工作进程：名字 → (公共模块, 入口函数)。
#: en: The two worker processes: name → (public module, entry function).
WORKERS = {"tokenizer": ("minisgl.tokenizer", "tokenize_worker"), "scheduler": ("minisgl.scheduler_io", "scheduler_worker")}


class _ByName:
    """按公共名字（``minisgl.tokenizer.tokenize_worker``）交给 spawn 子进程的函数：子进程自己导入它。

    各章的实现模块在进程里的名字是内部的（``_minisgl_impl...``），子进程按那个名字导入不到；按公共名字，子进程
    按选择规则（环境变量）找到同一套实现。API 服务器自己也就不必加载分词器和整个引擎。

    en: A function handed to a spawned child by its public name (``minisgl.tokenizer.tokenize_worker``): the child
    imports it itself.

    A chapter's implementation module has an internal name inside a process (``_minisgl_impl...``) that a child cannot
    import; by the public name, the child finds the same implementation through the selection rules (environment). The
    API server itself then need not load the tokenizer and the whole engine.
    """

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return getattr, (_Module(self.module), self.name)


class _Module:
    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return importlib.import_module, (self.name,)


def build_parser() -> argparse.ArgumentParser:
    """命令行参数（名字与上游一致；括号里是上游的别名）。

    en: The command-line flags (upstream's names; upstream's aliases too).
    """
    p = argparse.ArgumentParser(prog="python -m minisgl", description=tr("Serve a model over an OpenAI-compatible HTTP API"))
    p.add_argument("--model", "--model-path", dest="model_path", required=True, help=tr("the model folder"))
    p.add_argument("--host", default="127.0.0.1", help=tr("the address to listen on (default 127.0.0.1)"))
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=tr("the port (default {port}; 0: a free port chosen by the system)", port=DEFAULT_PORT))
    p.add_argument("--dtype", choices=["auto", "float32", "float16", "bfloat16"], default="auto", help=tr("the data type of weights and activations"))
    p.add_argument("--max-running-req", "--max-running-requests", dest="max_running_req", type=int, default=ServerArgs.max_running_req,
                   help=tr("the most requests running at once (request slots)"))
    p.add_argument("--cache-type", choices=["radix", "naive"], default=None, help=tr("the prefix cache (default radix)"))
    p.add_argument("--page-size", type=int, default=ServerArgs.page_size, help=tr("tokens per KV page"))
    p.add_argument("--max-extend-tokens", "--max-extend-length", "--max-prefill-length", dest="max_extend_tokens", type=int,
                   default=None, help=tr("the most prefill tokens in one step (chunked prefill)"))
    p.add_argument("--num-pages", type=int, default=None, help=tr("the number of KV pages (default: from the memory)"))
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help=tr("the KV pool's size in tokens (pages = it // page size; default: on the CPU 1.5 × --max-running-req × --max-seq-len, the extra half for the prefix cache; on CUDA from the memory)"))
    p.add_argument("--max-seq-len", "--max-seq-len-override", dest="max_seq_len", type=int, default=None,
                   help=tr("the context length of one request, prompt included"))
    p.add_argument("--mem-fraction-static", "--memory-ratio", "--gpu-memory-utilization", dest="memory_ratio", type=float, default=None,
                   help=tr("the most of the memory available before loading that the model and the KV cache may take (default 0.9 on CUDA, 0.3 on the CPU)"))
    p.add_argument("--device", default="auto", help=tr("cpu, cuda or auto"))
    p.add_argument("--api-key", default=None, help=tr("require Authorization: Bearer <key> on /v1/* and /generate"))
    p.add_argument("--served-model-name", dest="model_name", default=None, help=tr("the name in /v1/models (default: the model folder's name)"))
    return p


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    parser = build_parser()
    ns = parser.parse_args(argv)
    values = vars(ns)
    if values["dtype"] == "auto":
        values["dtype"] = None
    if values["num_pages"] is not None and values["max_total_tokens"] is not None:
        parser.error(tr("give --num-pages or --max-total-tokens, not both"))
    if values["max_total_tokens"] is not None and values["max_total_tokens"] < max(values["page_size"], 1):
        parser.error(tr("--max-total-tokens must be at least the page size ({page_size})", page_size=values["page_size"]))
    return ServerArgs(**values)


def _stop_process(proc: multiprocessing.process.BaseProcess, timeout: float) -> None:
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


class Launcher:
    """拉起两个工作进程并看着它们；关机时让它们全部退出。

    en: Starts the two worker processes and watches them; on shutdown makes all of them exit.
    """

    def __init__(self, args: ServerArgs) -> None:
        self.args = args
        self.ipc_dir = make_ipc_dir()
        self.addrs = ServerAddrs.in_dir(self.ipc_dir)
        self.procs: dict[str, multiprocessing.process.BaseProcess] = {}
        self.stopping = threading.Event()
        self.died: str | None = None

    def start_workers(self) -> dict[str, Any]:
        """spawn 出分词进程和调度器进程，等两个都报告就绪；返回调度器的信息（max_seq_len 等）。

        启动时暂时忽略 SIGINT：子进程继承“忽略”，终端里的 Ctrl-C 只由启动器处理，由它有序地关掉大家。

        en: Spawn the tokenizer and scheduler processes and wait until both report ready; return the scheduler's info
        (max_seq_len and so on).

        SIGINT is ignored while they start: the children inherit "ignore", so a Ctrl-C in the terminal is handled by the
        launcher alone, which then shuts everyone down in order.
        """
        ctx = multiprocessing.get_context("spawn")
        pipes: dict[str, Connection] = {}
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for name, (module, entry) in WORKERS.items():
                here, there = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_ByName(module, entry), args=(self.args, self.addrs, there), name=f"minisgl-{name}", daemon=False)
                proc.start()
                there.close()
                self.procs[name], pipes[name] = proc, here
        finally:
            signal.signal(signal.SIGINT, previous)
        infos: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(infos) < len(pipes):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [n for n in pipes if n not in infos]
                raise RuntimeError(tr("The {names} process did not report ready within {seconds:.0f} s",
                                      names=", ".join(missing), seconds=READY_TIMEOUT_S))
            waiting = {pipes[n]: n for n in pipes if n not in infos}
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
        return infos["scheduler"]

    def watch(self, on_death: Callable[[str], None]) -> threading.Thread:
        """后台线程：有工作进程退出（而不是在关机）就调用 ``on_death(原因)``。

        en: A background thread: when a worker exits (other than during shutdown), call ``on_death(why)``.
        """

        def run() -> None:
            sentinels = {p.sentinel: name for name, p in self.procs.items()}
            while not self.stopping.is_set():
                gone = wait(list(sentinels), timeout=0.2)
                if not gone:
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
        """调度器收到 :class:`ExitMsg` 自己退出，分词进程收到 SIGTERM 退出；不退的 SIGTERM、再 SIGKILL；删掉 ipc 目录。

        en: The scheduler exits on an :class:`ExitMsg`, the tokenizer on SIGTERM; one that does not exit gets SIGTERM,
        then SIGKILL; the ipc folder is removed.
        """
        self.stopping.set()
        scheduler = self.procs.get("scheduler")
        if scheduler is not None and scheduler.is_alive():
            queue = ZmqPushQueue(self.addrs.backend, create=False, ctx=zmq.Context.instance())
            queue.put(ExitMsg())
            queue.socket.close(linger=1000)  # 留一秒把 ExitMsg 送出去 | en: allow a second to deliver the ExitMsg
        tokenizer = self.procs.get("tokenizer")
        if tokenizer is not None and tokenizer.is_alive():
            tokenizer.terminate()
        for proc in self.procs.values():
            _stop_process(proc, SHUTDOWN_WAIT_S)
        shutil.rmtree(self.ipc_dir, ignore_errors=True)


class _Server(uvicorn.Server):
    """关机时先让还在等回复的请求都收到一条“服务器正在关闭”的错误（503），它们马上结束，不必等 uvicorn 超时取消。

    en: On shutdown, first give every request still waiting for replies a "server shutting down" error (503), so they end
    at once instead of waiting for uvicorn's timeout to cancel them.
    """

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
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


def launch(argv: list[str] | None = None) -> int:
    """``python -m minisgl`` 的主体：起工作进程、等就绪、监听、服务；返回退出码（工作进程死了是 1）。

    en: The body of ``python -m minisgl``: start the workers, wait until ready, listen, serve; return the exit status (1
    if a worker died).
    """
    args = parse_args(argv)
    # 先做几秒内就能发现的检查，再花时间加载模型：模型目录、端口
    # en: first the checks that take seconds, before spending time on loading the model: the model folder, the port
    # （``python -m minisgl`` 在导入本模块之前已用 minisgl.serving.preflight 查过一遍，见 minisgl/__main__.py）
    # en: (``python -m minisgl`` already checked once with minisgl.serving.preflight before importing this module, see
    # en: minisgl/__main__.py)
    if (problem := check_model_dir(args.model_path)) is not None:
        print(tr("Error: {error}", error=problem), file=sys.stderr, flush=True)
        return 1
    offline_hub()
    try:
        sock = _listen(args.host, args.port)
    except OSError as e:
        print(tr("Error: {error}", error=port_problem(args.host, args.port, e)), file=sys.stderr, flush=True)
        return 1
    set_process_name("msgl-api-server")
    launcher = Launcher(args)
    stop_requested = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if not stop_requested.is_set():
            stop_requested.set()
            raise KeyboardInterrupt

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(tr("Starting the tokenizer and scheduler processes for {model} ...", model=args.model_path), flush=True)
        info = launcher.start_workers()
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
        sock.close()
        print(tr("Shutting down ..."), flush=True)
        launcher.shutdown()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return 1 if launcher.died else 0


def main(argv: list[str] | None = None) -> None:
    """命令行入口：``python -m minisgl --model DIR [...]``。

    en: The command-line entry point: ``python -m minisgl --model DIR [...]``.
    """
    sys.exit(launch(argv))
