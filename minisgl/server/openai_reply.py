"""OpenAI 回答里第 3.4 章的学员不写的小零件（给定）：回答的 id、一个 server-sent event、流的结束标记、``usage``、
对数概率的样子。学员写的 ``stream_chunks`` / ``full_response`` 和给定的 :mod:`minisgl.server.choices` 都用它们。

en: The small parts of an OpenAI answer that chapter 3.4's learner does not write (given): the answer's id, one
server-sent event, the end marker of a stream, ``usage``, the shape of log-probabilities. The learner's
``stream_chunks`` / ``full_response`` and the given :mod:`minisgl.server.choices` use them.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from minisgl.core import SamplingParams
from minisgl.message import UserReply

#: 流的最后一个事件。
#: en: The last event of a stream.
DONE = "data: [DONE]\n\n"


class Answerable(Protocol):
    """给定代码从第 3.4 章的 ``ParsedRequest`` 里读的那几项（给定模块不导入章节，按形状认它）。

    en: The fields given code reads from chapter 3.4's ``ParsedRequest`` (given modules do not import the chapter, they
    know it by its shape).
    """

    kind: str
    model: str
    created: int
    sampling_params: SamplingParams


def response_id(req: Answerable, uid: int) -> str:
    """回答的 id：对话是 ``chatcmpl-<uid>``，补全是 ``cmpl-<uid>``。

    en: The answer's id: ``chatcmpl-<uid>`` for chat, ``cmpl-<uid>`` for completions.
    """
    return f"chatcmpl-{uid}" if req.kind == "chat" else f"cmpl-{uid}"


def sse(data: Any) -> str:
    """一个 server-sent event：``data: <JSON>`` 加一个空行。

    en: One server-sent event: ``data: <JSON>`` followed by a blank line.
    """
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def usage_of(reply: UserReply) -> dict[str, int]:
    """最后一条回复里的 token 计数 → OpenAI 的 ``usage``。

    en: The token counts of the last reply → OpenAI's ``usage``.
    """
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def logprobs_block(req: Answerable, entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """一个 choice 的 ``logprobs``：请求没要对数概率时是 None；要了就把反分词进程给的各项（每个 token 一项，
    见 :class:`~minisgl.message.UserReply`）写成 OpenAI 的样子——对话是 ``{"content": [...], "refusal": None}``，
    补全是 ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` 四个并排的列表。

    en: A choice's ``logprobs``: None when the request did not ask for log-probabilities; otherwise the entries from the
    detokenizer (one per token, see :class:`~minisgl.message.UserReply`) in OpenAI's shape: for chat
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
