"""OpenAI 请求体里第 3.4 章的学员不写的部分（给定）：JSON 本身、模型名、提示词或对话消息、``n`` 和 ``echo``、
``stream``，以及第 3.5 / 3.6 章的采样控制和语法字段。

每个函数遇到不合法的值就抛 :class:`~minisgl.server.api_errors.ApiError`，点名是哪个参数：客户端拿到的是 400，
而不是 500，也不是一个悄悄改过的请求。

en: The parts of an OpenAI request body that chapter 3.4's learner does not write (given): the JSON itself, the model
name, the prompt or chat messages, ``n`` and ``echo``, ``stream``, and the sampling controls and grammar fields of
chapters 3.5 / 3.6.

Every function raises :class:`~minisgl.server.api_errors.ApiError` naming the parameter when a value is invalid: the client
gets a 400, not a 500, nor a silently altered request.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from fastapi import Request

from minisgl.server.api_errors import ApiError
from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.validation import check_sampling


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


def given_or(body: dict[str, Any], name: str, default: Any) -> Any:
    """``body[name]``，缺省或 ``null`` 时是 ``default``。

    en: ``body[name]``, or ``default`` when absent or ``null``.
    """
    value = body.get(name)
    return default if value is None else value


def check_model(body: dict[str, Any], name: str, path: str) -> None:
    """``model`` 可以不给；给了就得是这个服务器的模型（它的名字或目录），否则 404。

    en: ``model`` may be absent; if given it must be this server's model (its name or directory), else a 404.
    """
    model = body.get("model")
    if model is not None and model not in (name, path):
        raise ApiError(404, tr("The model {model!r} does not exist: this server serves {name!r}", model=model, name=name),
                       param="model", code="model_not_found")


#: 传给对话模板的角色；``developer``（OpenAI 给 system 的新名字）当作 ``system``。
#: en: The roles passed on to the chat template; ``developer`` (OpenAI's new name for system) is taken as ``system``.
CHAT_ROLES = ("system", "user", "assistant", "tool")


def _text_of(content: Any, where: str) -> str | None:
    """消息的文字：字符串原样；文字片段的列表（``[{"type": "text", "text": ...}]``）连起来；``None`` 还是 ``None``。
    别的片段（图片、音频……）是 400，点名是哪一片。

    en: A message's text: a string as it is; a list of text parts (``[{"type": "text", "text": ...}]``) joined; ``None``
    stays ``None``. Any other part (image, audio, ...) is a 400 naming that part.
    """
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, tr("{where} must be a string or a list of text parts, got {value!r}", where=where, value=content),
                       param=where, code="invalid_value")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else None
            raise ApiError(400, tr("{where}[{j}]: only parts of type text are supported here, got {kind!r}",
                                   where=where, j=j, kind=kind if kind is not None else part),
                           param=f"{where}[{j}]", code="unsupported_value" if kind not in (None, "text") else "invalid_value")
        texts.append(part["text"])
    return "".join(texts)


def _tool_calls_of(calls: Any, where: str) -> list[dict[str, Any]]:
    """助手消息的 ``tool_calls``，交给对话模板：每个是 ``{"type": "function", "function": {"name", "arguments"}}``
    （``id`` 有就带上）；``arguments`` 是 JSON 对象的字符串时解析成 dict（模板大多按对象写出它，vLLM 也这样做）。

    en: An assistant message's ``tool_calls`` for the chat template: each ``{"type": "function", "function": {"name",
    "arguments"}}`` (with its ``id`` when given); ``arguments`` given as the string of a JSON object is parsed into a
    dict (most templates write it out as an object; vLLM does the same).
    """
    if not isinstance(calls, list) or not calls:
        raise ApiError(400, tr("{where} must be a non-empty list of tool calls, got {value!r}", where=where, value=calls),
                       param=where, code="invalid_value")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(400, tr("{where}[{j}] must be a function call with a name and arguments, got {value!r}",
                                   where=where, j=j, value=call), param=f"{where}[{j}]", code="invalid_value")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments or "{}")
            except ValueError:
                parsed = None
            arguments = parsed if isinstance(parsed, dict) else arguments
        one: dict[str, Any] = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
        if isinstance(call.get("id"), str):
            one["id"] = call["id"]
        out.append(one)
    return out


def messages_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    """对话消息：非空列表，每条有 ``role`` 和文字 ``content``（也认 OpenAI 的 ``[{"type": "text", "text": ...}]``，
    连起来；别的片段是 400）。角色是 :data:`CHAT_ROLES` 之一，``developer`` 当作 ``system``；``tool`` 消息还要有
    ``tool_call_id``；带 ``tool_calls`` 的助手消息可以没有 ``content``。这些都原样交给对话模板。

    en: Chat messages: a non-empty list, each with a ``role`` and a text ``content`` (OpenAI's ``[{"type": "text",
    "text": ...}]`` is accepted too, joined; any other part is a 400). The role is one of :data:`CHAT_ROLES`,
    ``developer`` taken as ``system``; a ``tool`` message also needs a ``tool_call_id``; an assistant message with
    ``tool_calls`` may have no ``content``. All of it goes on to the chat template.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, tr("messages is missing: give a non-empty list of chat messages, each with a role and a content"),
                       param="messages", code="missing_required_parameter" if messages is None else "invalid_value")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        role = "system" if role == "developer" else role
        if not isinstance(m, dict) or role not in CHAT_ROLES:
            raise ApiError(400, tr("messages[{i}] must have a role (system, developer, user, assistant or tool) and a text content, got {value!r}",
                                   i=i, value=m), param=where, code="invalid_value")
        content = _text_of(m.get("content"), f"{where}.content")
        one: dict[str, Any] = {"role": role}
        if role == "assistant" and m.get("tool_calls") is not None:
            one["tool_calls"] = _tool_calls_of(m["tool_calls"], f"{where}.tool_calls")
            content = content or ""
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise ApiError(400, tr("messages[{i}] is a tool message: it needs the tool_call_id (a string) of the call it answers",
                                       i=i), param=f"{where}.tool_call_id", code="missing_required_parameter")
            one["tool_call_id"] = m["tool_call_id"]
        if content is None:
            raise ApiError(400, tr("messages[{i}] must have a role (system, developer, user, assistant or tool) and a text content, got {value!r}",
                                   i=i, value=m), param=where, code="missing_required_parameter")
        one["content"] = content
        if isinstance(m.get("name"), str):
            one["name"] = m["name"]
        out.append(one)
    return out


def _one_prompt(prompt: Any) -> str | list[int] | None:
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    return None


def prompts_of(body: dict[str, Any]) -> list[str | list[int]]:
    """补全的提示词，总是一个列表：一个字符串或一列 token id 是一个提示词；字符串的列表、token id 列表的列表是几个
    （每个一份回答）。

    en: The completion prompts, always a list: a string or a list of token ids is one prompt; a list of strings or of
    lists of token ids is several (one answer each).
    """
    prompt = body.get("prompt")
    one = _one_prompt(prompt)
    if one is not None:
        return [one]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        many = [_one_prompt(p) for p in prompt]
        if all(p is not None for p in many):
            return many  # type: ignore[return-value]
    if prompt is None or prompt == "" or prompt == []:
        raise ApiError(400, tr("prompt is missing: give a non-empty string or a list of token ids"), param="prompt",
                       code="missing_required_parameter")
    raise ApiError(400, tr("prompt must be a non-empty string, a list of token ids, or a list of those (one answer each), got {value!r}",
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


def choices_of(body: dict[str, Any], prompts: int, slots: int) -> int:
    """OpenAI 的 ``n``：每个提示词采几份。``n`` 乘提示词的个数不能超过服务器的请求槽位 ``slots``，否则 400。

    en: OpenAI's ``n``: how many samples per prompt. ``n`` times the number of prompts may not exceed the server's request
    slots ``slots``, else a 400.
    """
    n = given_or(body, "n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n * prompts <= slots:
        raise ApiError(400, tr("n must be an integer in [1, {slots}] (the request slots of this server, shared by all prompts), got {n!r}",
                               slots=max(1, slots // prompts), n=n), param="n", code="invalid_value")
    return n


def echo_of(body: dict[str, Any], kind: str, prompts: list[Any], logprobs: bool) -> bool:
    """补全的 ``echo``：回答前面带上提示词。只认 ``true`` / ``false``，而且提示词要是文字、不和对数概率同用。

    en: A completion's ``echo``: the answer starts with the prompt. Only ``true`` / ``false``, with text prompts and
    without log-probabilities.
    """
    echo = given_or(body, "echo", False)
    if kind == "completion" and echo is not False:
        if echo is not True or logprobs or not all(isinstance(p, str) for p in prompts):
            raise ApiError(400, tr("echo must be true or false; with true the prompts must be text and logprobs is not supported with it yet"),
                           param="echo", code="unsupported_value")
    return echo is True


def checked(sp: SamplingParams, body: dict[str, Any], kind: str) -> SamplingParams:
    """API 服务器的那一道门：``sp`` 加上第 3.5 章的采样控制和第 3.6 章的语法（:func:`controls_from`），整个过一遍
    :func:`~minisgl.validation.check_sampling`，只这一次（token 和长度由分词进程查）。
    :class:`~minisgl.core.InvalidParam` 变成 400，``param`` 写请求里用的名字（``max_tokens`` 来自
    ``max_completion_tokens`` 时写后者，补全的 ``top_logprobs`` 写作 ``logprobs``，``json_schema`` 来自
    ``response_format`` 时写后者）。

    en: The API server's gate: ``sp`` plus chapter 3.5's sampling controls and chapter 3.6's grammar
    (:func:`controls_from`), the whole passed through :func:`~minisgl.validation.check_sampling`, this once (the
    tokenizer process checks tokens and length). An :class:`~minisgl.core.InvalidParam` becomes a 400 whose ``param``
    is the name the request used (``max_completion_tokens`` when ``max_tokens`` came from it, a completion's
    ``top_logprobs`` is ``logprobs``, a ``json_schema`` from ``response_format`` is the latter).
    """
    names = {"max_tokens": "max_tokens" if body.get("max_tokens") is not None or body.get("max_completion_tokens") is None
             else "max_completion_tokens",
             "top_logprobs": "top_logprobs" if kind == "chat" else "logprobs",
             "json_schema": "response_format" if body.get("response_format") is not None else "json_schema"}
    sp = replace(sp, **controls_from(body, kind))
    try:
        check_sampling(sp)
    except ValueError as e:  # 按基类接住 InvalidParam：课程可能载入了另一套实现的那个类 | en: InvalidParam, caught by its base: the course may load another implementation's class
        param = getattr(e, "param", None)
        raise ApiError(400, str(e), param=names.get(param, param), code="invalid_value") from None
    return sp


def controls_from(body: dict[str, Any], kind: str) -> dict[str, Any]:
    """第 3.5 章的采样控制在请求体里的写法 → ``SamplingParams`` 的字段。对数概率两个接口写法不同：
    对话是 ``logprobs: true`` 加 ``top_logprobs: k``（单给 ``top_logprobs`` 是 400），补全是 ``logprobs: k``
    （k 个最可能的，0 也表示要）。

    en: Chapter 3.5's sampling controls as a request body writes them → ``SamplingParams`` fields. The two endpoints
    write log-probabilities differently: chat has ``logprobs: true`` plus ``top_logprobs: k`` (``top_logprobs`` alone
    is a 400), completions ``logprobs: k`` (the k most likely; 0 still asks).
    """
    out = {name: given_or(body, name, default) for name, default in (
        ("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("min_p", 0.0),
        ("min_tokens", 0))}
    out["logit_bias"] = body.get("logit_bias") or None
    logprobs = body.get("logprobs")
    if kind == "chat":
        out["logprobs"] = given_or(body, "logprobs", False)
        out["top_logprobs"] = given_or(body, "top_logprobs", 0)
        if out["top_logprobs"] and out["logprobs"] is not True:
            raise ApiError(400, tr("top_logprobs needs logprobs: true"), param="top_logprobs", code="invalid_value")
    elif logprobs is not None and logprobs is not False:
        out["logprobs"] = True
        out["top_logprobs"] = logprobs
    out.update(grammar_from(body))
    return out


def grammar_from(body: dict[str, Any]) -> dict[str, Any]:
    """第 3.6 章的语法在请求体里的写法 → ``SamplingParams`` 的字段：OpenAI 的 ``response_format``
    （``{"type": "json_object"}`` 是任意 JSON 对象，``{"type": "json_schema", "json_schema": {"schema": ...}}`` 按
    给的 Schema），或者 SGLang 的扩展字段 ``json_schema`` / ``regex`` / ``ebnf``。

    en: Chapter 3.6's grammar as a request body writes it → ``SamplingParams`` fields: OpenAI's ``response_format``
    (``{"type": "json_object"}`` is any JSON object, ``{"type": "json_schema", "json_schema": {"schema": ...}}``
    follows the schema given), or SGLang's extra fields ``json_schema`` / ``regex`` / ``ebnf``.
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
