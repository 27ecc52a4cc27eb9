"""第 3.4 章 api_server：OpenAI 兼容的 HTTP 接口和流式输出。

``python -m minisgl --model DIR`` 启动三个进程：API 服务器（本模块，HTTP，在启动器 :mod:`minisgl.server.launch` 的进程里）、
分词 / 反分词进程、调度器进程。一个请求的路径：

    HTTP 请求 → 解析成 SamplingParams（本章）→ TokenizeMsg → 分词进程 → UserMsg → 调度器
    调度器 → DetokenizeMsg → 反分词进程 → UserReply → 本进程按 uid 分给各个请求 → SSE 片段或一整个 JSON（本章）

你来写的是对客户端说话的部分：

- **请求 → 采样参数**：OpenAI 的语义（``temperature`` 缺省 1，0 是贪心）加上上游的扩展字段（``ignore_eos``、
  ``top_k``）；不合法的值、会改变结果却不支持的参数（``tools``、``suffix`` ……）一律 400，
  错误体是 OpenAI 的样子（:class:`~minisgl.server.api_errors.ApiError`），说清是哪个参数；
- **流式输出**（server-sent events）和**非流式输出**：真实的 ``usage``、正确的 ``finish_reason``；
- **客户端断开就取消请求**：取消消息要真的发出去（只发一次），请求的槽位和页面才回得来。

给定的在 ``minisgl/`` 下，一个模块一件事：``frontend``（登记请求、按 uid 分发回复）、``openai_body``（请求体里你不写的
部分）、``openai_reply``（回答的小零件）、``choices``（几个 choice）、``server_app``（其余的接口）、``launch``（启动器）。

en: Chapter 3.4 api_server: the OpenAI-compatible HTTP API and streaming.

``python -m minisgl --model DIR`` starts three processes: the API server (this module, HTTP, in the process of the
launcher :mod:`minisgl.server.launch`), the tokenizer / detokenizer process and the scheduler process. One request's path:

    HTTP request → parsed into SamplingParams (this chapter) → TokenizeMsg → tokenizer → UserMsg → scheduler
    scheduler → DetokenizeMsg → detokenizer → UserReply → this process hands it to its request by uid → SSE chunks or
    one JSON object (this chapter)

You write the part that talks to the client:

- **request → sampling parameters**: OpenAI's semantics (``temperature`` defaults to 1, 0 is greedy) plus upstream's
  extra fields (``ignore_eos``, ``top_k``); an invalid value, or a parameter that would change the result but is not
  supported (``tools``, ``suffix``, ...), is a 400 with an OpenAI-style body
  (:class:`~minisgl.server.api_errors.ApiError`) naming the parameter;
- **streaming** (server-sent events) and **the non-streamed response**: the real ``usage``, the right
  ``finish_reason``;
- **a client that disconnects aborts its request**: the abort message must really be sent (exactly once), or the
  request's slot and pages never come back.

The given parts sit in ``minisgl/``, one job per module: ``frontend`` (registering requests, handing replies out by
uid), ``openai_body`` (the parts of the request body you do not write), ``openai_reply`` (the small parts of an
answer), ``choices`` (several choices), ``server_app`` (the other endpoints), ``launch`` (the launcher).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from minisgl.server.api_errors import DISCONNECT_POLL_S, ApiError, ClientGone
from minisgl.server.choices import abort_all, guarded, merge_answers, merge_streams, open_choices
from minisgl.core import SamplingParams
from minisgl.server.frontend import Frontend
from minisgl.i18n import tr
from minisgl.message import AbortMsg, UserReply
from minisgl.server.openai_body import (check_model, checked, choices_of, echo_of, given_or as _field, json_body, messages_of,
                                 prompts_of, stream_flags)
from minisgl.server.openai_reply import DONE, logprobs_block, response_id, sse, usage_of
from minisgl.server.app import PROBE_BODY, base_app, generation_probe

T = TypeVar("T")

#: ``/v1/completions`` 不给 ``max_tokens`` 时生成多少个 token（OpenAI 和上游的缺省都是 16）。
#: en: How many tokens ``/v1/completions`` generates without ``max_tokens`` (16, the default of OpenAI and upstream).
COMPLETION_MAX_TOKENS = 16
#: 会改变结果、但这里不支持的参数：名字 → 仍算“没用它”的取值。取别的值就是 400，而不是悄悄忽略。
#: en: Parameters that would change the result but are not supported here: name → the values that still count as "not
#: en: used". Any other value is a 400, not silently ignored.
UNSUPPORTED_PARAMS: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1), "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none", "auto"),
    "functions": (None, []), "function_call": (None, "none", "auto")}


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


def sampling_params_from(body: dict[str, Any], *, default_max_tokens: int | None) -> tuple[SamplingParams, list[str]]:
    """按 OpenAI 的语义把请求体读成 ``(SamplingParams, 停止字符串列表)``。

    - 缺省值：``temperature`` 1.0（OpenAI 的缺省，不是贪心）、``top_p`` 1.0、``top_k``（上游的扩展）-1（不限）、
      ``ignore_eos``（上游的扩展）False、``seed`` 不给；
    - ``max_tokens``（对话接口也认 ``max_completion_tokens``）：不给就用 ``default_max_tokens``；None 表示“直到上下文
      用完”，由分词进程数出提示词的 token 之后定下来；
    - ``stop``：不给、一个字符串、或字符串列表，别的是 400 的 :class:`ApiError`。

    采样参数的类型和取值范围不在这里查：给定的 :func:`~minisgl.server.openai_body.checked` 紧接着把第 3.5、3.6 章的
    控制加上，整个过一遍那道门，一次。

    en: Read the request body into ``(SamplingParams, list of stop strings)`` with OpenAI's semantics.

    - defaults: ``temperature`` 1.0 (OpenAI's default, not greedy), ``top_p`` 1.0, ``top_k`` (upstream's extra) -1 (no
      limit), ``ignore_eos`` (upstream's extra) False, no ``seed``;
    - ``max_tokens`` (the chat endpoint also takes ``max_completion_tokens``): when absent, ``default_max_tokens``;
      None means "until the context is full", settled by the tokenizer process once it has counted the prompt's
      tokens;
    - ``stop``: absent, one string, or a list of strings; anything else is a 400 :class:`ApiError`.

    The types and ranges of the sampling parameters are not checked here: right after, the given
    :func:`~minisgl.server.openai_body.checked` adds chapters 3.5 and 3.6's controls and passes the whole through the
    gate, once.
    """
    # >>> TASK sampling_params: 按 OpenAI 的语义把请求里的采样字段读成 (采样参数, 停止字符串列表)。约定：缺省值见文档字符串（温度缺省是 1，不是贪心）；max_tokens 也可以写成 max_completion_tokens（两个都写时前者优先），都没写就用调用方给的缺省（None 也原样留着）；这里不查类型和取值范围——那是紧接着的那道门的事，查两遍就是两条规则；stop 可以不写、是一个字符串或字符串列表，别的都是 400 的 ApiError（param 是 "stop"，code 是 "invalid_value"）。给定：given_or（写作 _field）、ApiError。
    # en: Read the sampling fields of the request, with OpenAI's semantics, into (sampling parameters, list of stop strings). Contract: defaults as the docstring lists them (OpenAI's default samples at 1, it is not greedy); max_tokens may come as max_completion_tokens (max_tokens wins when both are there); with neither, the caller's default applies (None stays None); no types or ranges are checked here: that is the job of the gate right after, and checking twice makes two rules; stop strings may be absent, a string or a list of strings, anything else is a 400 ApiError (param "stop", code "invalid_value"). Given: given_or (imported as _field), ApiError.
    # hint1: null 和没写一样对待：_field 正是这样取值的。max_tokens 写成 null 时 max_completion_tokens 才算数。
    # en1: Treat null as absent: that is how _field reads a value. max_completion_tokens counts when max_tokens is null.
    # hint2: max_tokens = _field(body, "max_tokens", _field(body, "max_completion_tokens", default_max_tokens))；
    # hint2: sp = SamplingParams(temperature=_field(body, "temperature", 1.0)、top_k=_field(body, "top_k", -1)、top_p=_field(body, "top_p", 1.0)、
    # hint2: ignore_eos=_field(body, "ignore_eos", False)、max_tokens=max_tokens、seed=body.get("seed"))；
    # hint2: stop：None → []，str → [它]；结果不是全为 str 的 list → ApiError(400, ..., param="stop", code="invalid_value")；返回 (sp, stop)。
    # en2: max_tokens = _field(body, "max_tokens", _field(body, "max_completion_tokens", default_max_tokens));
    # en2: sp = SamplingParams(temperature=_field(body, "temperature", 1.0), top_k=_field(body, "top_k", -1), top_p=_field(body, "top_p", 1.0),
    # en2: ignore_eos=_field(body, "ignore_eos", False), max_tokens=max_tokens, seed=body.get("seed"));
    # en2: stop: None → [], str → [it]; if the result is not a list of str only → ApiError(400, ..., param="stop", code="invalid_value"); return (sp, stop).
    max_tokens = _field(body, "max_tokens", _field(body, "max_completion_tokens", default_max_tokens))
    sp = SamplingParams(temperature=_field(body, "temperature", 1.0), top_k=_field(body, "top_k", -1),
                        top_p=_field(body, "top_p", 1.0), ignore_eos=_field(body, "ignore_eos", False),
                        max_tokens=max_tokens, seed=body.get("seed"))
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

    有几个 choice 时（``n`` > 1、提示词列表），给定的 :func:`~minisgl.server.choices.merge_streams` 为每一个调用它一次（``index`` 是第几个），把事件合成一个流。

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

    With several choices (``n`` > 1, a list of prompts) the given :func:`~minisgl.server.choices.merge_streams` calls it once per choice
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


# ----------------------------------------------------------------------------- 请求的取消
# en: ----------------------------------------------------------------------------- aborting a request


class ServerState(Frontend):
    """API 服务器的状态：``live``（uid → 回复队列，还没答完的请求）、请求的登记（``submit``）、回复的分发都在给定的
    :class:`~minisgl.server.frontend.Frontend` 里；这里是请求的取消（:meth:`abort`）。

    en: The API server's state: ``live`` (uid → reply queue, the requests not answered yet), registering a request
    (``submit``) and handing replies out are in the given :class:`~minisgl.server.frontend.Frontend`; here is aborting one
    (:meth:`abort`).
    """

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


def parse_request(kind: str, body: dict[str, Any], state: ServerState, *, stream_default: bool = False) -> ParsedRequest:
    """请求体 → :class:`ParsedRequest`：采样参数和不支持的参数由你写的函数读，其余（模型名、提示词、第 3.5 / 3.6 章的
    控制和语法、``n``、``echo``、``stream``）由给定的 :mod:`minisgl.server.openai_body` 读。

    en: Request body → :class:`ParsedRequest`: your functions read the sampling parameters and the unsupported ones, the
    given :mod:`minisgl.server.openai_body` the rest (model name, prompts, chapters 3.5 / 3.6's controls and grammar, ``n``,
    ``echo``, ``stream``).
    """
    check_model(body, state.model_name, state.args.model_path)
    prompts = [messages_of(body)] if kind == "chat" else prompts_of(body)
    bad = unsupported_params(body)
    if bad:
        raise ApiError(400, tr("Unsupported parameters that would change the result: {names} (remove them)",
                               names=", ".join(bad)), param=bad[0], code="unsupported_parameter")
    sp, stop = sampling_params_from(body, default_max_tokens=None if kind == "chat" else COMPLETION_MAX_TOKENS)
    sp = checked(sp, body, kind)
    n = choices_of(body, len(prompts), slots=int(state.info.get("max_running_req") or 1))
    echo = echo_of(body, kind, prompts, sp.logprobs)
    stream, include_usage = stream_flags(body, stream_default)
    return ParsedRequest(kind, state.model_name, prompts[0], sp, stop, stream, include_usage, n=n,
                         prompts=prompts if len(prompts) > 1 else [], echo=echo)


async def answer(request: Request, state: ServerState, req: ParsedRequest) -> Response:
    """提交请求的每个 choice（:mod:`minisgl.server.choices`），再用你的 :func:`full_response` 收齐合成一个对象，或用你的
    :func:`stream_chunks` 一段段发。出了错（拒绝、客户端断开……）就取消提交了的全部；流结束后后台任务 ``abort_all`` 收尾。

    en: Submit each choice of the request (:mod:`minisgl.server.choices`), then collect them with your :func:`full_response`
    into one object, or send them piece by piece with your :func:`stream_chunks`. On a failure (a refusal, the client
    leaving, ...) every submitted choice is aborted; after a stream ends the background task ``abort_all`` tidies up.
    """
    uids: list[int] = []
    try:
        streams = await open_choices(request, state, req, uids, until_disconnect)
        if not req.stream:
            work = asyncio.gather(*(full_response(req, uids[0], replies) for replies in streams))
            return JSONResponse(merge_answers(req, await until_disconnect(request, state, uids[0], work)))
        chunks = await merge_streams(req, uids[0], streams, stream_chunks)
    except BaseException:
        await abort_all(state, uids)
        raise
    return StreamingResponse(guarded(chunks, state, uids), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                             background=BackgroundTask(abort_all, state, uids))


def create_app(state: ServerState) -> FastAPI:
    """FastAPI 应用：给定的 :func:`~minisgl.server.app.base_app` 加上用你写的函数作答的接口。

    en: The FastAPI application: the given :func:`~minisgl.server.app.base_app` plus the endpoints your functions answer.
    """
    app = base_app(state)

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

    @app.get("/health_generate")
    async def health_generate() -> Response:
        return await generation_probe(state, parse_request("completion", PROBE_BODY, state), full_response)

    return app
