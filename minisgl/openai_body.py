"""OpenAI 请求体里不属于采样的部分（第 3.4 章用它们，给定）：JSON 本身、模型名、提示词或对话消息、``stream``。

每个函数遇到不合法的值就抛 :class:`~minisgl.api_errors.ApiError`，点名是哪个参数：客户端拿到的是 400，
而不是 500，也不是一个悄悄改过的请求。

en: The parts of an OpenAI request body that are not sampling (chapter 3.4 uses them; given): the JSON itself, the
model name, the prompt or chat messages, ``stream``.

Every function raises :class:`~minisgl.api_errors.ApiError` naming the parameter when a value is invalid: the client
gets a 400, not a 500, nor a silently altered request.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from minisgl.api_errors import ApiError
from minisgl.i18n import tr


async def json_body(request: Request) -> dict[str, Any]:
    """请求体，必须是一个 JSON 对象。

    en: The request body, which must be a JSON object.
    """
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, tr("The request body is not valid JSON: {error}", error=e), code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, tr("The request body must be a JSON object"), code="invalid_json")
    return body


def check_model(body: dict[str, Any], name: str, path: str) -> None:
    """``model`` 可以不给；给了就得是这个服务器的模型（它的名字或目录），否则 404。

    en: ``model`` may be absent; if given it must be this server's model (its name or directory), else a 404.
    """
    model = body.get("model")
    if model is not None and model not in (name, path):
        raise ApiError(404, tr("The model {model!r} does not exist: this server serves {name!r}", model=model, name=name),
                       param="model", code="model_not_found")


def messages_of(body: dict[str, Any]) -> list[dict[str, str]]:
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


def prompt_of(body: dict[str, Any]) -> str | list[int]:
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


def stream_flags(body: dict[str, Any], default: bool) -> tuple[bool, bool]:
    """``(stream, include_usage)``：``stream`` 不给或 ``null`` 时是 ``default``；``stream_options`` 只能配流式。

    en: ``(stream, include_usage)``: ``stream`` is ``default`` when absent or ``null``; ``stream_options`` goes with a
    stream only.
    """
    stream = body.get("stream")
    stream = default if stream is None else stream
    if not isinstance(stream, bool):
        raise ApiError(400, tr("stream must be true or false, got {value!r}", value=stream), param="stream",
                       code="invalid_value")
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise ApiError(400, tr("stream_options is only allowed with stream: true, as an object"), param="stream_options",
                       code="invalid_value")
    return stream, bool((options or {}).get("include_usage", False))
