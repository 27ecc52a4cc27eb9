"""第 3.4 章 api_server：OpenAI 兼容的 HTTP 接口和流式输出。

``python -m minisgl --model DIR`` 启动三个进程：API 服务器（本模块，HTTP，在启动器 :mod:`minisgl.launch` 的进程里）、
分词 / 反分词进程、调度器进程。一个请求的路径：

    HTTP 请求 → 解析成 SamplingParams（本章）→ TokenizeMsg → 分词进程 → UserMsg → 调度器
    调度器 → DetokenizeMsg → 反分词进程 → UserReply → 本进程按 uid 分给各个请求 → SSE 片段或一整个 JSON（本章）

你来写的是对客户端说话的部分：

- **请求 → 采样参数**：OpenAI 的语义（``temperature`` 缺省 1，0 是贪心）加上上游的扩展字段（``ignore_eos``、
  ``top_k``）；不合法的值、会改变结果却不支持的参数（``tools``、``suffix`` ……）一律 400，
  错误体是 OpenAI 的样子（:class:`~minisgl.api_errors.ApiError`），说清是哪个参数；
- **流式输出**（server-sent events）和**非流式输出**：真实的 ``usage``、正确的 ``finish_reason``；
- **客户端断开就取消请求**：取消消息要真的发出去（只发一次），请求的槽位和页面才回得来。

本模块里给定的：请求的登记、接口的接线、第 3.5 / 3.6 章控制和语法的请求字段、几个 choice（``n``、提示词列表）的
提交与合并、对数概率的样子。别处给定的：按 uid 分发回复的后台任务（:mod:`minisgl.frontend`）、
请求体里采样之外的部分（:mod:`minisgl.openai_body`）、错误体（:mod:`minisgl.api_errors`）、API 密钥和 503 的门
（:mod:`minisgl.gate`）、``/metrics``（:mod:`minisgl.metrics`）、对话页面（:mod:`minisgl.chat_page`）、启动器
（:mod:`minisgl.launch`）。

en: Chapter 3.4 api_server: the OpenAI-compatible HTTP API and streaming.

``python -m minisgl --model DIR`` starts three processes: the API server (this module, HTTP, in the process of the
launcher :mod:`minisgl.launch`), the tokenizer / detokenizer process and the scheduler process. One request's path:

    HTTP request → parsed into SamplingParams (this chapter) → TokenizeMsg → tokenizer → UserMsg → scheduler
    scheduler → DetokenizeMsg → detokenizer → UserReply → this process hands it to its request by uid → SSE chunks or
    one JSON object (this chapter)

You write the part that talks to the client:

- **request → sampling parameters**: OpenAI's semantics (``temperature`` defaults to 1, 0 is greedy) plus upstream's
  extra fields (``ignore_eos``, ``top_k``); an invalid value, or a parameter that would change the result but is not
  supported (``tools``, ``suffix``, ...), is a 400 with an OpenAI-style body
  (:class:`~minisgl.api_errors.ApiError`) naming the parameter;
- **streaming** (server-sent events) and **the non-streamed response**: the real ``usage``, the right
  ``finish_reason``;
- **a client that disconnects aborts its request**: the abort message must really be sent (exactly once), or the
  request's slot and pages never come back.

Given in this module: registering a request, the endpoints' wiring, the request fields of chapters 3.5 / 3.6 (controls
and grammars), submitting and merging several choices (``n``, lists of prompts), the shape of the log-probabilities.
Given elsewhere: the background task that hands replies out by uid (:mod:`minisgl.frontend`), the parts of the request
body other than sampling (:mod:`minisgl.openai_body`), the error body (:mod:`minisgl.api_errors`), the gate for the
API key and the 503 (:mod:`minisgl.gate`), ``/metrics`` (:mod:`minisgl.metrics`), the chat page
(:mod:`minisgl.chat_page`), the launcher (:mod:`minisgl.launch`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from minisgl.access_log import AccessLog
from minisgl.api_errors import ApiError, ClientGone, add_error_handlers
from minisgl.chat_page import chat_page
from minisgl.core import InvalidParam, SamplingParams
from minisgl.frontend import Frontend
from minisgl.gate import Gate
from minisgl.i18n import tr
from minisgl.message import AbortMsg, TokenizeMsg, UserReply
from minisgl.metrics import CONTENT_TYPE
from minisgl.openai_body import check_model, json_body, messages_of, prompts_of, stream_flags
from minisgl.validation import check_sampling

T = TypeVar("T")

#: ``/v1/completions`` 不给 ``max_tokens`` 时生成多少个 token（OpenAI 和上游的缺省都是 16）。
#: en: How many tokens ``/v1/completions`` generates without ``max_tokens`` (16, the default of OpenAI and upstream).
COMPLETION_MAX_TOKENS = 16
#: 会改变结果、但这里不支持的参数：名字 → 仍算“没用它”的取值。取别的值就是 400，而不是悄悄忽略。
#: en: Parameters that would change the result but are not supported here: name → the values that still count as "not
#: en: used". Any other value is a 400, not silently ignored.
UNSUPPORTED_PARAMS: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
}
#: 客户端断开的检查间隔（秒）。
#: en: How often (seconds) to check whether the client has disconnected.
DISCONNECT_POLL_S = 0.05
#: ``/health_generate`` 等那一个 token 的最长时间（秒；SGLang 也是 20）。
#: en: The longest ``/health_generate`` waits for its one token (seconds; SGLang's is 20 too).
HEALTH_GENERATE_TIMEOUT_S = 20.0
#: 服务器启动的时刻（``/v1/models`` 的 ``created``）。
#: en: When the server started (``created`` in ``/v1/models``).
STARTED = time.time()


# ----------------------------------------------------------------------------- 请求 → 采样参数
# en: ----------------------------------------------------------------------------- request → sampling parameters


def unsupported_params(body: dict[str, Any]) -> list[str]:
    """请求里用到的、会改变结果却不支持的参数名（按 :data:`UNSUPPORTED_PARAMS` 的顺序）；没有就是空列表。

    en: The names of the parameters in the request that would change the result but are not supported (in the order of
    :data:`UNSUPPORTED_PARAMS`); an empty list if there are none.
    """
    # >>> TASK unsupported_params: 返回请求里用到了的、不支持又会改变结果的参数名，按 UNSUPPORTED_PARAMS 的顺序；没写的、或取的是“没用它”的那些值之一的不算；一个也没有就返回空列表。给定：UNSUPPORTED_PARAMS（参数名 → 仍算“没用它”的取值）。
    # en: Return the names of the parameters the request uses that are unsupported and would change the result, in the order of UNSUPPORTED_PARAMS; a parameter that is absent, or set to one of its "not used" values, does not count; with none, an empty list. Given: UNSUPPORTED_PARAMS (parameter → the values that still count as not used).
    # hint1: 表里已经写好了每个参数哪些值算“没用它”，逐项对照就行；None（JSON 的 null）也在这些值里。
    # en1: The table already lists, per parameter, which values mean "not used": compare entry by entry. None (JSON null) is among those values.
    # hint2: [name for name, neutral in UNSUPPORTED_PARAMS.items() if name in body and body[name] not in neutral]
    # en2: [name for name, neutral in UNSUPPORTED_PARAMS.items() if name in body and body[name] not in neutral]
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
    # >>> TASK sampling_params: 按 OpenAI 的语义把请求里的采样字段读成 (采样参数, 停止字符串列表)，不合法就抛 400 的 ApiError，点名是哪个参数。约定：缺省值见文档字符串（温度缺省是 1，不是贪心）；max_tokens 也可以写成 max_completion_tokens（两个都写时前者优先），都没写就用调用方给的缺省，缺省为 None 就是上下文放得下的最多；类型和取值范围只由 check_sampling 这一道门查，它抛的 InvalidParam 变成 invalid_value，param 写请求里实际用的字段名；max_tokens 要小于 max_seq_len，否则是 context_length_exceeded，消息里写出上下文长度；stop 可以不写、是一个字符串或字符串列表，别的都是 400。给定：check_sampling、ApiError。
    # en: Read the sampling fields of the request, with OpenAI's semantics, into (sampling parameters, list of stop strings); anything invalid raises a 400 ApiError naming the parameter. Contract: defaults as the docstring lists them (OpenAI's default samples at 1, it is not greedy); max_tokens may come as max_completion_tokens (max_tokens wins when both are there); with neither, the caller's default applies, and a None default means as many as the context holds; types and ranges are checked only by check_sampling, the one gate, whose InvalidParam becomes invalid_value with param set to the field the request actually used; max_tokens must stay below max_seq_len, else context_length_exceeded with the context length in the message; stop strings may be absent, a string or a list of strings, anything else is a 400. Given: check_sampling, ApiError.
    # hint1: 先记下 max_tokens 实际来自哪个字段，出错时 param 才写得对。这里只负责组装，不自己查范围；上下文长度的检查放在那道门之后。
    # en1: Note first which field max_tokens actually came from, so an error can name it. This function only assembles, it checks no ranges itself;
    # en1: the context-length check comes after the gate.
    # hint2: name = "max_tokens" 若请求里它不是 None，否则 "max_completion_tokens"；max_tokens = _field(body, name, default_max_tokens)；
    # hint2: sp = SamplingParams(...)，各参数是 temperature=_field(body, "temperature", 1.0)、top_k=_field(body, "top_k", -1)、
    # hint2: top_p=_field(body, "top_p", 1.0)、ignore_eos=_field(body, "ignore_eos", False)、seed=body.get("seed")，max_tokens 为 None 时用 max_seq_len - 1；
    # hint2: try: check_sampling(sp)，except InvalidParam as e → raise ApiError(400, str(e), code="invalid_value", param=name if e.param == "max_tokens" else e.param)；
    # hint2: sp.max_tokens >= max_seq_len → ApiError(400, 写出 max_seq_len 的消息, param=name, code="context_length_exceeded")；
    # hint2: stop：None → []，str → [它]；结果不是全为 str 的 list → ApiError(400, ..., param="stop", code="invalid_value")；返回 (sp, stop)。
    # en2: name = "max_tokens" if it is not None in the request, else "max_completion_tokens"; max_tokens = _field(body, name, default_max_tokens);
    # en2: sp = SamplingParams(temperature=_field(body, "temperature", 1.0), top_k=_field(body, "top_k", -1), top_p=_field(body, "top_p", 1.0),
    # en2: ignore_eos=_field(body, "ignore_eos", False), max_tokens=max_seq_len - 1 when max_tokens is None, seed=body.get("seed"));
    # en2: try: check_sampling(sp), except InvalidParam as e → raise ApiError(400, str(e), code="invalid_value", param=name if e.param == "max_tokens" else e.param);
    # en2: sp.max_tokens >= max_seq_len → ApiError(400, a message naming max_seq_len, param=name, code="context_length_exceeded");
    # en2: stop: None → [], str → [it]; if the result is not a list of str only → ApiError(400, ..., param="stop", code="invalid_value"); return (sp, stop).
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
    #: 每个提示词采几份（OpenAI 的 ``n``）；``/v1/completions`` 的提示词列表放在 ``prompts`` 里（这时 ``prompt`` 是第一个）
    #: en: how many samples per prompt (OpenAI's ``n``); a list of prompts of ``/v1/completions`` sits in ``prompts``
    #: en: (``prompt`` is then the first)
    n: int = 1
    prompts: list[Any] = field(default_factory=list)
    echo: bool = False  # 补全：回答前面带上提示词 | en: completions: the answer starts with the prompt


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


def logprobs_block(req: ParsedRequest, entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """一个 choice 的 ``logprobs``（给定）：请求没要对数概率时是 None；要了就把反分词进程给的各项（每个 token 一项，
    见 :class:`~minisgl.message.UserReply`）写成 OpenAI 的样子——对话是 ``{"content": [...], "refusal": None}``，
    补全是 ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` 四个并排的列表。

    en: A choice's ``logprobs`` (given): None when the request did not ask for log-probabilities; otherwise the entries
    from the detokenizer (one per token, see :class:`~minisgl.message.UserReply`) in OpenAI's shape: for chat
    ``{"content": [...], "refusal": None}``, for completions four parallel lists ``{"tokens", "token_logprobs",
    "top_logprobs", "text_offset"}``.
    """
    if not req.sampling_params.logprobs:
        return None
    entries = entries or []
    if req.kind == "chat":
        return {"content": [{k: e[k] for k in ("token", "logprob", "bytes", "top_logprobs")} for e in entries],
                "refusal": None}
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": [e["text_offset"] for e in entries]}


async def stream_chunks(req: ParsedRequest, uid: int, replies: AsyncIterator[UserReply], index: int = 0,
                        ) -> AsyncIterator[str]:
    """流式回答：把 ``replies``（这个请求的 :class:`UserReply`，最后一条 ``finished``）变成一个个 SSE 事件（字符串）。

    - 对话（``kind == "chat"``）：每个事件是 ``chat.completion.chunk``，``choices[0]`` 是
      ``{"index": index, "delta": {...}, "finish_reason": ..., "logprobs": ...}``；第一个事件在任何回复之前发出，
      ``delta`` 是 ``{"role": "assistant", "content": ""}``；之后每段新文字一个事件，``delta`` 是 ``{"content": 文字}``；
    - 补全：每个事件是 ``text_completion``，``choices[0]`` 是 ``{"index": index, "text": 文字, "finish_reason": ...,
      "logprobs": ...}``；
    - ``logprobs`` 是 ``logprobs_block(req, 这条回复的 logprobs)``（没要对数概率时是 None）；没有文字的事件是 None；
    - 每个事件还有 ``id``（:func:`response_id`）、``object``、``created``（``req.created``）、``model``；
    - 空的片段不发（反分词扣住了半个字符时会有）；回复结束时，先发它带的最后一段文字（若有），再发一个
      ``finish_reason`` 为这条回复的 ``finish_reason`` 的事件（对话的 ``delta`` 为 ``{}``，补全的 ``text`` 为 ``""``）；
    - 回复带 ``error``：发一个 ``{"error": {"message": ..., "type": "invalid_request_error", "param": None,
      "code": 回复的 code}}`` 事件，然后 ``DONE``，结束；
    - ``req.include_usage`` 时，结束之后再发一个 ``choices`` 为空列表、带 ``usage``（:func:`usage_of`）的事件；
    - 最后是 :data:`DONE`。

    有几个 choice 时（``n`` > 1、提示词列表），给定的 :func:`merge_streams` 为每一个调用它一次（``index`` 是第几个），把事件合成一个流。

    en: The streamed answer: turn ``replies`` (this request's :class:`UserReply` objects, the last one ``finished``)
    into SSE events (strings).

    - chat (``kind == "chat"``): each event is a ``chat.completion.chunk`` whose ``choices[0]`` is
      ``{"index": index, "delta": {...}, "finish_reason": ..., "logprobs": ...}``; the first event goes out before any
      reply, with ``delta`` ``{"role": "assistant", "content": ""}``; then one event per new piece of text, with
      ``delta`` ``{"content": text}``;
    - completions: each event is a ``text_completion`` whose ``choices[0]`` is ``{"index": index, "text": text,
      "finish_reason": ..., "logprobs": ...}``;
    - ``logprobs`` is ``logprobs_block(req, that reply's logprobs)`` (None when not asked for); an event without text
      has None;
    - every event also has ``id`` (:func:`response_id`), ``object``, ``created`` (``req.created``) and ``model``;
    - an empty piece is not sent (the detokenizer holding back half a character makes one); when the replies finish,
      first the last piece they carry (if any), then an event whose ``finish_reason`` is the reply's ``finish_reason``
      (a chat ``delta`` of ``{}``, a completion ``text`` of ``""``);
    - a reply with ``error``: send one ``{"error": {"message": ..., "type": "invalid_request_error", "param": None,
      "code": the reply's code}}`` event, then ``DONE``, and stop;
    - with ``req.include_usage``, after the end one more event with an empty ``choices`` list and the ``usage``
      (:func:`usage_of`);
    - last, :data:`DONE`.

    With several choices (``n`` > 1, a list of prompts) the given :func:`merge_streams` calls it once per choice
    (``index`` says which) and merges the events into one stream.
    """
    # >>> TASK stream_chunks: 按文档字符串列出的格式，把这个请求的回复变成流式回答的 SSE 事件。约定：对话流在任何回复到来之前先发带 assistant 角色的那个事件；每段非空的文字一个事件，空的不发，带着这条回复的对数概率；请求结束时先发它带的最后一段文字，再发一个带结束原因的结尾事件；回复出错就只发一个 OpenAI 样式的错误事件（带上回复的错误代码），然后是流的结束标记，到此为止；客户端要了用量时，结尾之后再发一个 choices 为空、带 token 计数的事件；最后总是结束标记。每个 choice 的序号是调用者给的那个。给定：sse、response_id、usage_of、logprobs_block。
    # en: Yield the SSE events of a streamed answer, shaped as the docstring lists them. Contract: a chat stream opens with the assistant-role event before anything arrives; every non-empty piece of text is its own event (empty pieces are skipped), carrying that reply's log-probabilities; when the request ends, its last text goes out first, then a closing event carrying the reason it ended; a failure report becomes a single OpenAI-style failure event (with the reply's error code) followed by the stream's end marker, and nothing else; when the client asked for usage, an event with empty choices and the token counts comes after the closing one; the end marker is always last. Every choice carries the number the caller passed. Given: sse, response_id, usage_of, logprobs_block.
    # hint1: 两种接口的事件只差一个键（对话是 delta，补全是 text）：写一个按 kind 造事件的小函数，生成器就短了。错误事件的正文用 ApiError 的 body()，格式正好。
    # en1: The events of the two endpoints differ in one key (delta for chat, text for completions):
    # en1: a small helper that builds an event by kind keeps the generator short. ApiError's body() gives exactly the body of the failure event.
    # hint2: 一个小函数 chunk(content, finish_reason, logprobs=None)：返回 sse({"id": response_id(req, uid), "object": 对话 "chat.completion.chunk" / 补全 "text_completion",
    # hint2: "created": req.created, "model": req.model, "choices": [{"index": index, "delta"（对话）或 "text"（补全）: content, "finish_reason": finish_reason,
    # hint2: "logprobs": logprobs}]})；
    # hint2: 对话先 yield chunk({"role": "assistant", "content": ""}, None)；
    # hint2: async for reply in replies：reply.error → yield sse(ApiError(400, reply.error, code=reply.code).body())，yield DONE，return；
    # hint2: reply.incremental_output 非空 → yield chunk(对话 {"content": 文字} / 补全 文字, None, logprobs_block(req, reply.logprobs))；
    # hint2: reply.finished → yield chunk(对话 {} / 补全 "", reply.finish_reason)，usage = usage_of(reply)，break；
    # hint2: req.include_usage 且有 usage → yield sse({同样的 id、object、created、model, "choices": [], "usage": usage})；最后 yield DONE。
    # en2: a small chunk(content, finish_reason, logprobs=None) returns sse({"id": response_id(req, uid), "object": "chat.completion.chunk" for chat / "text_completion",
    # en2: "created": req.created, "model": req.model, "choices": [{"index": index, "delta" (chat) or "text" (completion): content, "finish_reason": finish_reason,
    # en2: "logprobs": logprobs}]});
    # en2: for chat, first yield chunk({"role": "assistant", "content": ""}, None);
    # en2: async for reply in replies: reply.error → yield sse(ApiError(400, reply.error, code=reply.code).body()), yield DONE, return;
    # en2: non-empty reply.incremental_output → yield chunk({"content": text} for chat / text, None, logprobs_block(req, reply.logprobs));
    # en2: reply.finished → yield chunk({} for chat / "", reply.finish_reason), usage = usage_of(reply), break;
    # en2: req.include_usage and a usage → yield sse({the same id, object, created, model, "choices": [], "usage": usage}); last, yield DONE.
    chat = req.kind == "chat"
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(content: dict[str, str] | str, finish_reason: str | None, logprobs: dict[str, Any] | None = None) -> str:
        choice: dict[str, Any] = {"index": index, ("delta" if chat else "text"): content, "finish_reason": finish_reason,
                                  "logprobs": logprobs}
        return sse({"id": response_id(req, uid), "object": obj, "created": req.created, "model": req.model,
                    "choices": [choice]})

    if chat:
        yield chunk({"role": "assistant", "content": ""}, None)
    usage = None
    async for reply in replies:
        if reply.error:
            yield sse(ApiError(400, reply.error, code=reply.code).body())
            yield DONE
            return
        if reply.incremental_output:
            yield chunk({"content": reply.incremental_output} if chat else reply.incremental_output, None,
                        logprobs_block(req, reply.logprobs))
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
      {"role": "assistant", "content": 全文}, "finish_reason": ..., "logprobs": ...}], "usage": ...}``；
    - 补全：``{"id", "object": "text_completion", "created", "model", "choices": [{"index": 0, "text": 全文,
      "finish_reason": ..., "logprobs": ...}], "usage": ...}``；
    - ``logprobs`` 是 ``logprobs_block(req, 各条回复的 logprobs 依次连起来)``（没要对数概率时是 None）；
    - ``finish_reason`` 和 ``usage``（:func:`usage_of`）取自最后一条回复；有回复带 ``error`` 就抛
      ``ApiError(400, error, code=回复的 code)``。

    en: The non-streamed answer: collect all of ``replies`` and return one OpenAI object.

    - chat: ``{"id", "object": "chat.completion", "created", "model", "choices": [{"index": 0, "message":
      {"role": "assistant", "content": full text}, "finish_reason": ..., "logprobs": ...}], "usage": ...}``;
    - completions: ``{"id", "object": "text_completion", "created", "model", "choices": [{"index": 0, "text":
      full text, "finish_reason": ..., "logprobs": ...}], "usage": ...}``;
    - ``logprobs`` is ``logprobs_block(req, every reply's logprobs joined in order)`` (None when not asked for);
    - ``finish_reason`` and ``usage`` (:func:`usage_of`) come from the last reply; a reply with ``error`` raises
      ``ApiError(400, error, code=the reply's code)``.
    """
    # >>> TASK full_response: 收完这个请求的全部回复，返回文档字符串里那样的一整个 OpenAI 对象（对话和补全的样子不同）。约定：全文是各段依次拼起来，对数概率的各项也依次连起来；结束原因和 token 计数取自最后一条回复；有回复出错就抛 400 的 ApiError，消息就是那个错误，code 是回复的 code。给定：response_id、usage_of、logprobs_block。
    # en: Read the whole stream for this request and return one OpenAI object shaped as the docstring says (chat and completions differ). Contract: the answer is all pieces concatenated in order, and the log-probability entries joined in order too; why it ended and the token counts come from the final message; any failure report raises a 400 ApiError carrying its message and the reply's code. Given: response_id, usage_of, logprobs_block.
    # hint1: 先全部收下再组装：finish_reason 和计数只有最后一条回复里才有。两种对象只差 choices[0] 里的一个键（message 或 text）和 object 的名字。
    # en1: Gather everything first, then assemble: only the final reply has the finish_reason and the counts.
    # en1: The two objects differ only in one key of choices[0] (message or text) and in the object name.
    # hint2: pieces = []，entries = []，last = None；async for reply in replies：reply.error → raise ApiError(400, reply.error, code=reply.code)；
    # hint2: pieces.append(reply.incremental_output)；entries.extend(reply.logprobs or [])；last = reply；text = "".join(pieces)；
    # hint2: 对话：choice = {"index": 0, "message": {"role": "assistant", "content": text}}，object 是 "chat.completion"；
    # hint2: 补全：choice = {"index": 0, "text": text}，object 是 "text_completion"；choice 再加上 finish_reason=last.finish_reason、logprobs=logprobs_block(req, entries)；
    # hint2: 返回 {"id": response_id(req, uid), "object": ..., "created": req.created, "model": req.model, "choices": [choice], "usage": usage_of(last)}。
    # en2: pieces = [], entries = [], last = None; async for reply in replies: reply.error → raise ApiError(400, reply.error, code=reply.code);
    # en2: pieces.append(reply.incremental_output); entries.extend(reply.logprobs or []); last = reply; text = "".join(pieces);
    # en2: chat: choice = {"index": 0, "message": {"role": "assistant", "content": text}}, object "chat.completion";
    # en2: completion: choice = {"index": 0, "text": text}, object "text_completion"; add finish_reason=last.finish_reason, logprobs=logprobs_block(req, entries) to choice;
    # en2: return {"id": response_id(req, uid), "object": ..., "created": req.created, "model": req.model, "choices": [choice], "usage": usage_of(last)}.
    pieces: list[str] = []
    entries: list[dict[str, Any]] = []
    last: UserReply | None = None
    async for reply in replies:
        if reply.error:
            raise ApiError(400, reply.error, code=reply.code)
        pieces.append(reply.incremental_output)
        entries.extend(reply.logprobs or [])
        last = reply
    assert last is not None and last.finished
    text = "".join(pieces)
    if req.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text}
        obj = "text_completion"
    choice.update(finish_reason=last.finish_reason, logprobs=logprobs_block(req, entries))
    return {"id": response_id(req, uid), "object": obj, "created": req.created, "model": req.model,
            "choices": [choice], "usage": usage_of(last)}
    # <<< TASK


# ----------------------------------------------------------------------------- 请求的登记和取消
# en: ----------------------------------------------------------------------------- registering and aborting a request


class ServerState(Frontend):
    """API 服务器的状态。套接字、``uid → asyncio.Queue``（``live``：还没答完的请求）、按 uid 分发回复的后台任务、
    指标和工作进程死掉后的处理都在给定的 :class:`~minisgl.frontend.Frontend` 里；这里是一个请求的登记和取消：
    登记了就必须有人把它去掉（答完时分发任务去掉，断开时 :meth:`abort` 去掉），否则
    ``minisgl_active_requests`` 永远降不下来，调度器里的槽位也回不来。

    en: The API server's state. The sockets, ``uid → asyncio.Queue`` (``live``: requests not answered yet), the
    background task that hands replies out by uid, the metrics and what happens when a worker dies are in the given
    :class:`~minisgl.frontend.Frontend`; here is one request's registering and aborting: once registered, someone must
    take it out again (the dispatch task when it is answered, :meth:`abort` when the client leaves), or
    ``minisgl_active_requests`` never comes down and the scheduler's slot never comes back.
    """

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
        self.metrics.submitted(uid)
        try:
            await self.send.put(TokenizeMsg(uid, req.prompt, req.sampling_params, req.stop))
        except BaseException:  # 没发出去：不留登记（否则 minisgl_active_requests 永远降不下来） | en: not sent: unregister (or minisgl_active_requests never comes down)
            self.live.pop(uid, None)
            self.metrics.withdrawn(uid)
            raise
        return uid, queue

    async def abort(self, uid: int) -> None:
        """取消请求 ``uid``：还没答完就发一条 :class:`AbortMsg` 给分词进程（它转告调度器），并不再等它的回复；
        已经答完或已经取消过就什么也不做——同一个请求的取消只发一次。

        en: Abort request ``uid``: if it is not answered yet, send an :class:`AbortMsg` to the tokenizer (which tells the
        scheduler) and stop waiting for its replies; if it is answered already, or aborted already, do nothing — one
        request's abort is sent once.
        """
        # >>> TASK abort_once: 取消请求：它还没答完（还在 self.live 里）就把一条 AbortMsg 发给分词进程、真的等它发出去，此后不再等它的回复；已经答完、已经取消过或不认识的请求什么也不做。同一个请求无论从几条路走到这里，取消只发一次——两个调用者可能在等待发送的间隙里交错。给定：self.live，以及本类里发往分词进程的队列。
        # en: Abort the request: if it is not answered yet (still in self.live), an AbortMsg goes to the tokenizer, really awaited until it is out, and its replies are no longer waited for; for a request answered, aborted already or unknown, nothing happens. However many paths reach here for a request, its abort goes out once: two callers may interleave while the message is being written out. Given: self.live and this object's queue to the tokenizer.
        # hint1: 关键在顺序：在任何 await 之前，就把“还在不在 live 里”的判断和把它拿掉合成一步；await 的时候别的任务可能来取消同一个请求。
        # en1: Order is the point: test and remove from live in one step, before any await; during an await another task may come to abort the same request.
        # hint2: if self.live.pop(uid, None) is None: return；然后 await self.send.put(AbortMsg(uid))。
        # en2: if self.live.pop(uid, None) is None: return; then await self.send.put(AbortMsg(uid)).
        if self.live.pop(uid, None) is None:
            return
        assert self.send is not None
        await self.send.put(AbortMsg(uid))
        # <<< TASK


async def until_disconnect(request: Request, state: ServerState, uid: int, work: Awaitable[T]) -> T:
    """等 ``work`` 做完并返回它的结果；其间每 :data:`DISCONNECT_POLL_S` 秒看一眼客户端还在不在。客户端走了：
    取消 ``work``、``await state.abort(uid)``（取消请求，真的等它发出去），抛 :class:`ClientGone`。
    无论怎样离开，``work`` 都不能留在后台继续跑。

    en: Wait for ``work`` to finish and return its result; meanwhile check every :data:`DISCONNECT_POLL_S` seconds
    whether the client is still there. If the client is gone: cancel ``work``, ``await state.abort(uid)`` (abort the
    request, really waiting until it is sent) and raise :class:`ClientGone`. However this returns, ``work`` must not be
    left running in the background.
    """
    # >>> TASK abort_on_disconnect: 让 work 跑完并返回它的结果，其间每隔 DISCONNECT_POLL_S 秒看一眼客户端还在不在（is_disconnected）；客户端走了，就取消它的生成（真的等取消消息发出去）并抛 ClientGone。约定：断开要在一两次查看之内发现，不能等到 work 做完；无论正常返回还是抛出，离开时 work 都不能留在后台继续跑；查看时不能卡住事件循环。给定：is_disconnected、服务器状态的 abort、ClientGone、DISCONNECT_POLL_S。
    # en: Let work run to its end and return its outcome, checking every DISCONNECT_POLL_S seconds whether the client is still connected (is_disconnected); once the client has left, abort its generation (really awaiting until the abort message is out) and raise ClientGone. Contract: a disconnect is noticed within a poll or two, never only after work ends; however this returns or raises, work is not left running in the background; the checks never block the event loop. Given: is_disconnected, the server's abort, ClientGone, DISCONNECT_POLL_S.
    # hint1: 把 work 变成一个独立运行的任务，才能一边让它跑、一边定时去看客户端；“无论怎样离开”就是 finally。
    # en1: Make work a task of its own, so it runs while you look at the client at intervals; "however it leaves" means finally.
    # hint2: task = asyncio.ensure_future(work)；try：while not task.done(): await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)；
    # hint2: if await request.is_disconnected(): await state.abort(uid)；raise ClientGone()；
    # hint2: 循环结束 return task.result()；finally：task.cancel()（做完了的任务取消也无妨）。
    # en2: task = asyncio.ensure_future(work); try: while not task.done(): await asyncio.wait({task}, timeout=DISCONNECT_POLL_S);
    # en2: if await request.is_disconnected(): await state.abort(uid); raise ClientGone();
    # en2: after the loop return task.result(); finally: task.cancel() (cancelling a finished task does no harm).
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


def controls_from(body: dict[str, Any], kind: str) -> dict[str, Any]:
    """第 3.5 章的采样控制在请求体里的写法 → ``SamplingParams`` 的字段（给定）。对数概率两个接口写法不同：
    对话是 ``logprobs: true`` 加 ``top_logprobs: k``（单给 ``top_logprobs`` 是 400），补全是 ``logprobs: k``
    （k 个最可能的，0 也表示要）。

    en: Chapter 3.5's sampling controls as a request body writes them → ``SamplingParams`` fields (given). The two
    endpoints write log-probabilities differently: chat has ``logprobs: true`` plus ``top_logprobs: k`` (``top_logprobs``
    alone is a 400), completions ``logprobs: k`` (the k most likely; 0 still asks).
    """
    out = {name: _field(body, name, default) for name, default in (
        ("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("min_p", 0.0),
        ("min_tokens", 0))}
    out["logit_bias"] = body.get("logit_bias") or None
    logprobs = body.get("logprobs")
    if kind == "chat":
        out["logprobs"] = _field(body, "logprobs", False)
        out["top_logprobs"] = _field(body, "top_logprobs", 0)
        if out["top_logprobs"] and out["logprobs"] is not True:
            raise ApiError(400, tr("top_logprobs needs logprobs: true"), param="top_logprobs", code="invalid_value")
    elif logprobs is not None and logprobs is not False:
        out["logprobs"] = True
        out["top_logprobs"] = logprobs
    out.update(grammar_from(body))
    return out


def grammar_from(body: dict[str, Any]) -> dict[str, Any]:
    """第 3.6 章的语法在请求体里的写法 → ``SamplingParams`` 的字段（给定）：OpenAI 的 ``response_format``
    （``{"type": "json_object"}`` 是任意 JSON 对象，``{"type": "json_schema", "json_schema": {"schema": ...}}`` 按
    给的 Schema），或者 SGLang 的扩展字段 ``json_schema`` / ``regex`` / ``ebnf``。

    en: Chapter 3.6's grammar as a request body writes it → ``SamplingParams`` fields (given): OpenAI's
    ``response_format`` (``{"type": "json_object"}`` is any JSON object, ``{"type": "json_schema", "json_schema":
    {"schema": ...}}`` follows the schema given), or SGLang's extra fields ``json_schema`` / ``regex`` / ``ebnf``.
    """
    out = {name: body[name] for name in ("regex", "ebnf") if body.get(name) is not None}
    schema = body.get("json_schema")
    if schema is not None:
        out["json_schema"] = schema if isinstance(schema, str) else json.dumps(schema)
    fmt = body.get("response_format")
    if fmt is None or fmt == {"type": "text"}:
        return out
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
    if kind == "json_object":
        out["json_schema"] = json.dumps({"type": "object"})
    elif kind == "json_schema" and isinstance(spec, dict) and isinstance(spec.get("schema"), dict):
        out["json_schema"] = json.dumps(spec["schema"])
    else:
        raise ApiError(400, tr('response_format must be {{"type": "text"}}, {{"type": "json_object"}} or {{"type": "json_schema", "json_schema": {{"name": ..., "schema": {{...}}}}}}, got {value!r}',
                               value=fmt), param="response_format", code="invalid_value")
    if len(out) > 1:
        raise ApiError(400, tr("Give at most one of response_format, json_schema, regex and ebnf"), param="response_format",
                       code="invalid_value")
    return out


def checked(sp: SamplingParams, names: dict[str, str] | None = None) -> SamplingParams:
    """过 :func:`~minisgl.validation.check_sampling` 这道门；:class:`~minisgl.core.InvalidParam` 变成 400，``param``
    写请求里用的名字（``names``：字段 → 请求里的名字）。

    en: Pass the :func:`~minisgl.validation.check_sampling` gate; an :class:`~minisgl.core.InvalidParam` becomes a 400
    whose ``param`` is the name the request used (``names``: field → the name in the request).
    """
    try:
        check_sampling(sp)
    except InvalidParam as e:
        raise ApiError(400, str(e), param=(names or {}).get(e.param, e.param), code="invalid_value") from None
    return sp


def parse_request(kind: str, body: dict[str, Any], state: ServerState, *, stream_default: bool = False) -> ParsedRequest:
    """请求体 → :class:`ParsedRequest`：模型名、提示词（:mod:`minisgl.openai_body`；补全可以是提示词列表）、不支持的
    参数、采样参数（第 3.5 章的控制由 :func:`controls_from` 读）、``n``、``echo``、``stream`` / ``stream_options``。

    en: Request body → :class:`ParsedRequest`: the model name, the prompt (:mod:`minisgl.openai_body`; for completions
    it may be a list of prompts), unsupported parameters, the sampling parameters (chapter 3.5's controls read by
    :func:`controls_from`), ``n``, ``echo``, ``stream`` / ``stream_options``.
    """
    check_model(body, state.model_name, state.args.model_path)
    prompts = [messages_of(body)] if kind == "chat" else prompts_of(body)
    bad = unsupported_params(body)
    if bad:
        raise ApiError(400, tr("Unsupported parameters that would change the result: {names} (remove them)",
                               names=", ".join(bad)), param=bad[0], code="unsupported_parameter")
    sp, stop = sampling_params_from(body, max_seq_len=state.max_seq_len,
                                    default_max_tokens=None if kind == "chat" else COMPLETION_MAX_TOKENS)
    names = {"top_logprobs": "top_logprobs" if kind == "chat" else "logprobs",
             "json_schema": "response_format" if body.get("response_format") is not None else "json_schema"}
    sp = checked(replace(sp, **controls_from(body, kind)), names)
    n = _field(body, "n", 1)
    slots = int(state.info.get("max_running_req") or 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n * len(prompts) <= slots:
        raise ApiError(400, tr("n must be an integer in [1, {slots}] (the request slots of this server, shared by all prompts), got {n!r}",
                               slots=max(1, slots // len(prompts)), n=n), param="n", code="invalid_value")
    echo = _field(body, "echo", False)
    if kind == "completion" and echo is not False:
        if echo is not True or sp.logprobs or not all(isinstance(p, str) for p in prompts):
            raise ApiError(400, tr("echo must be true or false; with true the prompts must be text and logprobs is not supported with it yet"),
                           param="echo", code="unsupported_value")
    stream, include_usage = stream_flags(body, stream_default)
    return ParsedRequest(kind, state.model_name, prompts[0], sp, stop, stream, include_usage, n=n,
                         prompts=prompts if len(prompts) > 1 else [], echo=echo is True)


def choice_requests(req: ParsedRequest) -> list[ParsedRequest]:
    """一个 choice 一个请求：每个提示词 ``n`` 份，第 ``k`` 份的 choice 序号是 ``提示词序号 * n + k``；给了种子时
    第 ``k`` 份用 ``seed + k``（各有各的随机数）。

    en: One request per choice: each prompt ``n`` times, sample ``k`` of a prompt being choice number ``prompt index * n +
    k``; with a seed, sample ``k`` uses ``seed + k`` (a random stream of its own).
    """
    out = []
    for prompt in req.prompts or [req.prompt]:
        for k in range(req.n):
            sp = req.sampling_params
            if k and sp.seed is not None:
                sp = replace(sp, seed=(sp.seed + k) % 2**64)
            out.append(replace(req, prompt=prompt, prompts=[], n=1, sampling_params=sp))
    return out


async def open_choices(request: Request, state: ServerState, req: ParsedRequest, uids: list[int],
                       ) -> list[AsyncIterator[UserReply]]:
    """提交每个 choice，等到每个的第一条回复（被拒绝的这时还能回 400），按 choice 的顺序返回它们的回复；提交了的 uid
    记进 ``uids``（出错时调用者全部取消）。

    每个提示词的第一份先提交，其余几份等它的第一条回复到了再提交：那时它的提示词已经进了 Radix 前缀缓存
    （第 2.3 章），其余几份只需预填充最后一个 token——提示词只算一遍。

    en: Submit every choice, wait for each one's first reply (a refused one can still get a 400 then), and return their
    replies in choice order; the uids submitted go into ``uids`` (on an error the caller aborts them all).

    The first sample of each prompt is submitted first, the others once its first reply is there: by then its prompt is
    in the radix prefix cache (chapter 2.3) and the others prefill only the last token: the prompt is computed once.
    """
    subs = choice_requests(req)
    opened: dict[int, AsyncIterator[UserReply]] = {}

    async def open_group(group: list[int]) -> None:
        # 一组一起提交（同一步里预填充），再等每个的第一条回复
        # en: a group is submitted together (prefilled in the same step), then each one's first reply is awaited
        submitted = []
        for k in group:
            uid, queue = await state.submit(subs[k])
            uids.append(uid)
            submitted.append((k, uid, queue))
        for k, uid, queue in submitted:
            first = await until_disconnect(request, state, uid, queue.get())
            if first.error:
                raise ApiError(503 if state.dead else 400, first.error, code=first.code)
            opened[k] = state.replies(queue, first)

    leaders = list(range(0, len(subs), req.n))
    await open_group(leaders)
    await open_group([k for k in range(len(subs)) if k not in leaders])
    return [opened[k] for k in range(len(subs))]


def merge_answers(req: ParsedRequest, answers: list[dict[str, Any]]) -> dict[str, Any]:
    """几个 choice 的非流式回答合成一个：``choices`` 按序号排好，``usage`` 相加（提示词每个只算一次）；``echo`` 时
    文字前面带上提示词。

    en: Merge the non-streamed answers of several choices into one: ``choices`` in order, ``usage`` summed (each prompt
    counted once); with ``echo`` the text starts with the prompt.
    """
    merged = dict(answers[0], choices=[])
    for k, answer in enumerate(answers):
        choice = dict(answer["choices"][0], index=k)
        if req.echo:
            choice["text"] = (req.prompts or [req.prompt])[k // req.n] + choice["text"]
        merged["choices"].append(choice)
    merged["usage"] = summed_usage(req, [a["usage"] for a in answers])
    return merged


def summed_usage(req: ParsedRequest, usages: list[dict[str, int]]) -> dict[str, int]:
    """几个 choice 的 ``usage`` 相加：生成的 token 全部相加，提示词每个只算一次（每个提示词的第一份）。

    en: Sum the ``usage`` of several choices: every choice's completion tokens, each prompt's tokens once (from its first
    sample).
    """
    prompt_tokens = sum(u["prompt_tokens"] for u in usages[::req.n])
    completion_tokens = sum(u["completion_tokens"] for u in usages)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


async def merge_streams(req: ParsedRequest, uid: int, streams: list[AsyncIterator[UserReply]]) -> AsyncIterator[str]:
    """几个 choice 的流合成一个（返回合好的 SSE 事件流）：每个 choice 的事件（:func:`stream_chunks`，``index`` 是它的
    序号）来了就发，只在最后发一次（相加的）``usage`` 和 ``DONE``；``echo`` 时每个 choice 先发提示词。一个 choice 的
    流出错只结束它自己。只有一个 choice 时就是它自己的流。

    en: Merge the streams of several choices into one (returns the merged stream of SSE events): each choice's events
    (:func:`stream_chunks`, ``index`` being its number) go out as they come, and the (summed) ``usage`` and ``DONE`` only
    once at the end; with ``echo`` each choice sends its prompt first. A choice whose stream fails ends only itself.
    With a single choice it is that choice's own stream.
    """
    single = len(streams) == 1 and not req.echo
    last: dict[int, UserReply] = {}

    async def tapped(k: int, replies: AsyncIterator[UserReply]) -> AsyncIterator[UserReply]:
        async for reply in replies:
            last[k] = reply
            yield reply

    sub = req if single else replace(req, include_usage=False)
    chunks = [stream_chunks(sub, uid, tapped(k, r), index=k) for k, r in enumerate(streams)]
    for c in chunks:
        if asyncio.iscoroutine(c):  # 骨架：还没写成生成器，这里就抛出它的 TaskNotDone | en: skeleton: not a generator yet, this raises its TaskNotDone
            await c
    if single:
        return chunks[0]
    return _merged(req, uid, chunks, last)


async def _merged(req: ParsedRequest, uid: int, chunks: list[AsyncIterator[str]], last: dict[int, UserReply],
                  ) -> AsyncIterator[str]:
    events: asyncio.Queue[str | None] = asyncio.Queue()
    prompts = req.prompts or [req.prompt]

    async def pump(k: int) -> None:
        try:
            if req.echo:
                await events.put(sse({"id": response_id(req, uid), "object": "text_completion", "created": req.created,
                                      "model": req.model, "choices": [{"index": k, "text": prompts[k // req.n],
                                                                       "finish_reason": None, "logprobs": None}]}))
            async for event in chunks[k]:
                if event != DONE:
                    await events.put(event)
        finally:
            await events.put(None)

    pumps = [asyncio.create_task(pump(k)) for k in range(len(chunks))]
    try:
        open_pumps = len(pumps)
        while open_pumps:
            event = await events.get()
            if event is None:
                open_pumps -= 1
            else:
                yield event
        for task in pumps:
            task.result()  # 流自己出的错在这里抛出 | en: a stream's own failure is raised here
    finally:
        for task in pumps:
            task.cancel()
    if req.include_usage and len(last) == len(chunks):
        usage = summed_usage(req, [usage_of(last[k]) for k in range(len(chunks))])
        yield sse({"id": response_id(req, uid), "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
                   "created": req.created, "model": req.model, "choices": [], "usage": usage})
    yield DONE


async def _guard(chunks: AsyncIterator[str], state: ServerState, uids: list[int]) -> AsyncIterator[str]:
    """包住流：生成器自己出了错，就取消请求，别让它们在后台白白跑下去。

    en: Wraps the stream: if the generator itself fails, abort the requests so they do not run on for nothing.
    """
    try:
        async for chunk in chunks:
            yield chunk
    except Exception:
        await abort_all(state, uids)
        raise


async def abort_all(state: ServerState, uids: list[int]) -> None:
    for uid in uids:
        await state.abort(uid)


async def answer(request: Request, state: ServerState, req: ParsedRequest) -> Response:
    """提交请求的每个 choice（:func:`open_choices`），再按 ``stream`` 回答：非流式收齐后合成一个对象
    （:func:`merge_answers`），流式一段段发（:func:`merge_streams`）。出了错（拒绝、客户端断开……）就把提交了的全部
    取消；流结束后（正常结束或客户端断开）由后台任务 :func:`abort_all` 收尾——答完了的请求它什么也不做。

    en: Submit each choice of the request (:func:`open_choices`), then answer according to ``stream``: non-streamed,
    collect them all and merge them into one object (:func:`merge_answers`); streamed, send piece by piece
    (:func:`merge_streams`). On a failure (a refusal, the client leaving, ...) every submitted choice is aborted; after
    the stream ends (normally or because the client disconnected) the background task :func:`abort_all` tidies up —
    for an answered request it does nothing.
    """
    uids: list[int] = []
    try:
        streams = await open_choices(request, state, req, uids)
        if not req.stream:
            work = asyncio.gather(*(full_response(req, uids[0], replies) for replies in streams))
            return JSONResponse(merge_answers(req, await until_disconnect(request, state, uids[0], work)))
        chunks = await merge_streams(req, uids[0], streams)
    except BaseException:
        await abort_all(state, uids)
        raise
    return StreamingResponse(_guard(chunks, state, uids), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                             background=BackgroundTask(abort_all, state, uids))


async def generation_probe(state: ServerState) -> Response:
    """``/health_generate``（SGLang 的名字）：一个 token 的贪心生成走完整条路——分词进程、调度器的每个秩、反分词进程。
    :data:`HEALTH_GENERATE_TIMEOUT_S` 秒内答完是 200，否则 503（没答完的请求取消掉）。``/health`` 只说进程都活着，
    这个还说它们真的能一起干活。

    en: ``/health_generate`` (SGLang's name): a one-token greedy generation through the whole path — the tokenizer, every
    scheduler rank, the detokenizer. Answered within :data:`HEALTH_GENERATE_TIMEOUT_S` seconds it is a 200, otherwise a
    503 (the unfinished request is aborted). ``/health`` only says the processes are alive; this says they really work
    together.
    """
    req = parse_request("completion", {"prompt": "ping", "max_tokens": 1, "temperature": 0}, state)
    uid, queue = await state.submit(req)
    try:
        await asyncio.wait_for(full_response(req, uid, state.replies(queue)), HEALTH_GENERATE_TIMEOUT_S)
    except (ApiError, asyncio.TimeoutError) as err:
        await state.abort(uid)
        why = str(err) or tr("no token within {seconds:.0f} s", seconds=HEALTH_GENERATE_TIMEOUT_S)
        raise ApiError(503, tr("A one-token generation did not come through: {why}", why=why)) from None
    return JSONResponse({"status": "ok"})


def create_app(state: ServerState) -> FastAPI:
    """FastAPI 应用：各个接口、API 密钥、错误体、工作进程死掉后的 503、访问日志（``--no-access-log`` 关掉）。

    en: The FastAPI application: the endpoints, the API key, error bodies, the 503 after a worker died, the access log
    (``--no-access-log`` turns it off).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.start()
        yield
        await state.stop()

    app = FastAPI(title="mini-sglang", lifespan=lifespan)
    app.add_middleware(Gate, state=state)
    if state.args.access_log:
        app.add_middleware(AccessLog)  # 最外层：密钥和 503 的回答也记 | en: outermost: the key check's and the 503's answers are logged too
    add_error_handlers(app, count=state.metrics.error, dead=lambda: state.dead)

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

    def card() -> dict[str, Any]:
        return {"id": state.model_name, "object": "model", "created": int(STARTED), "owned_by": "minisgl",
                "root": state.args.model_path, "max_model_len": state.max_seq_len}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        check_model({"model": model_id}, state.model_name, state.args.model_path)
        return card()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health_generate")
    async def health_generate() -> Response:
        return await generation_probe(state)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/")
    async def page() -> HTMLResponse:
        return HTMLResponse(chat_page(state.model_name))

    return app
