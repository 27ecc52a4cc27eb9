"""API 服务器的每一个坏请求都是 4xx 加 OpenAI 的错误体（``code`` 不为空），什么也不漏：一个真的服务器
（``python -m minisgl``，小 Qwen3，带 ``--api-key``），整个模块只起这一个。

- 三十多种坏请求（路径、方法、JSON、类型、取值、种子、模型、密钥、上下文长度、词表、对话消息）：状态码、
  ``{"error": {"message", "type", "param", "code"}}``、``code`` 和 ``param`` 都对；每一个之后
  ``minisgl_active_requests`` 回到 0（登记了的请求出了错也要去掉）；
- ``GET /v1/models/{id}`` 回模型卡；``developer`` 当作 ``system``；``tool`` 消息和带 ``tool_calls`` 的助手消息交给
  对话模板（提示词的 token 数与 Hugging Face 的对话模板一致）；
- 访问日志：每个请求一行（方法、路径、状态码、token 数、毫秒），客户端中途断开的记 499；``--no-access-log`` 关掉它；
- 最后服务器以 0 退出，不留下子进程。

en: Every bad request to the API server is a 4xx with an OpenAI error body (a non-null ``code``), and nothing leaks: one
real server (``python -m minisgl``, the tiny Qwen3, with ``--api-key``), the only one this module starts.

- thirty-odd bad requests (path, method, JSON, types, values, seed, model, key, context length, vocabulary, chat
  messages): the status, ``{"error": {"message", "type", "param", "code"}}``, the ``code`` and the ``param`` are right;
  after each, ``minisgl_active_requests`` is back at 0 (a registered request that fails must be taken out again);
- ``GET /v1/models/{id}`` answers the model card; ``developer`` is taken as ``system``; ``tool`` messages and assistant
  messages with ``tool_calls`` go on to the chat template (the prompt's token count equals Hugging Face's chat template);
- the access log: one line per request (method, path, status, tokens, milliseconds), 499 for a client that left
  midway; ``--no-access-log`` turns it off;
- at the end the server exits with 0 and leaves no child process.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from transformers import AutoTokenizer

from checks.stage3.conftest import Server, descendants, read_events, send_request, serve, stop_server, tiny_model  # noqa: F401
from minisgl.server.access_log import AccessLog
from minisgl.api_server import ServerState, create_app
from minisgl.server.dp_router import DpRouter, create_router_app
from minisgl.i18n import tr
from minisgl.router import make_policy
from minisgl.server.args import ServerAddrs, parse_args

KEY = "sk-openai-errors"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "qwen3-tiny-random"
#: 检查服务器的上下文长度（``TINY_SERVER_ARGS`` 的 ``--max-seq-len``）。
#: en: The context length of the checks' server (``--max-seq-len`` of ``TINY_SERVER_ARGS``).
MAX_SEQ_LEN = 1024
#: 访问日志的一行：方法、路径、状态码、可选的 token 数、毫秒。
#: en: One access log line: method, path, status, the optional token counts, milliseconds.
ACCESS = re.compile(r"minisgl\.access INFO (?P<method>[A-Z]+) (?P<path>\S+) (?P<status>\d{3})"
                    r"(?: prompt_tokens=(?P<prompt>\d+) completion_tokens=(?P<completion>\d+))? (?P<ms>\d+\.\d)ms$")


@pytest.fixture(scope="module")
def server(serve) -> Server:  # noqa: ANN001, F811
    return serve("--api-key", KEY)


def call(server: Server, method: str, path: str, body: Any = None, headers: dict[str, str] | None = AUTH,
         timeout: float = 60.0) -> tuple[int, Any]:
    """``server.call``，缺省带上 API 密钥。

    en: ``server.call``, with the API key by default.
    """
    return server.call(method, path, body, timeout, headers)


def wait_unregistered(server: Server, what: str, timeout: float = 5.0) -> None:
    """等 ``minisgl_active_requests`` 和正在处理的 HTTP 请求都回到 0；到时不回就失败，说出是哪个请求之后。

    en: Wait until ``minisgl_active_requests`` and the HTTP requests in flight are back at 0; fail at the deadline,
    saying after which request.
    """
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if m["minisgl_active_requests"] == 0 and m["minisgl_http_requests_in_flight"] == 0:
            return
        if time.monotonic() > deadline:
            pytest.fail(tr("After {what}, minisgl_active_requests = {active:.0f} and HTTP requests in flight = {busy:.0f}; both must come back to 0 (a request registered and then refused must be taken out again)",
                           what=what, active=m["minisgl_active_requests"], busy=m["minisgl_http_requests_in_flight"]),
                        pytrace=False)
        time.sleep(0.05)


def log_lines(server: Server, since: int) -> list[re.Match[str]]:
    return [m for line in server.lines[since:] if (m := ACCESS.search(line.rstrip("\n")))]


def wait_log(server: Server, since: int, method: str, path: str, status: int, timeout: float = 5.0) -> re.Match[str]:
    """等访问日志里出现 ``method path status`` 的一行（``since`` 之后的输出里）；到时没有就失败，附上看到的输出。

    en: Wait for an access log line ``method path status`` (in the output after ``since``); fail at the deadline with
    the output seen.
    """
    deadline = time.monotonic() + timeout
    while True:
        for m in log_lines(server, since):
            if (m["method"], m["path"], int(m["status"])) == (method, path, status):
                return m
        if time.monotonic() > deadline:
            pytest.fail(tr("No access log line {method} {path} {status} on the server's stderr; its output since:\n{output}",
                           method=method, path=path, status=status, output="".join(server.lines[since:])[-3000:]),
                        pytrace=False)
        time.sleep(0.05)


# ----------------------------------------------------------------------------- 坏请求
# en: ----------------------------------------------------------------------------- bad requests

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"messages": list(messages), **fields}


#: (名字, 方法, 路径, 请求体, 请求头, 状态码, code, param；param 为 ... 表示不查)
#: en: (name, method, path, body, headers, status, code, param; param ... means not checked)
BAD: list[tuple[str, str, str, Any, dict[str, str] | None, int, str, Any]] = [
    ("unknown path", "GET", "/nothing", None, AUTH, 404, "not_found", None),
    ("unknown /v1 path", "POST", "/v1/nothing", {"prompt": "a"}, AUTH, 404, "not_found", None),
    ("GET on completions", "GET", COMPLETIONS, None, AUTH, 405, "method_not_allowed", None),
    ("PUT on chat", "PUT", CHAT, {"messages": []}, AUTH, 405, "method_not_allowed", None),
    ("unknown model card", "GET", "/v1/models/gpt-4", None, AUTH, 404, "model_not_found", "model"),
    ("body not JSON", "POST", COMPLETIONS, b"{bad", AUTH, 400, "invalid_json", None),
    ("body not UTF-8", "POST", COMPLETIONS, b"\xff\xfe\x00", AUTH, 400, "invalid_json", None),
    ("empty body", "POST", CHAT, b"", AUTH, 400, "invalid_json", None),
    ("body a JSON list", "POST", COMPLETIONS, b"[1, 2]", AUTH, 400, "invalid_json", None),
    ("/generate body not an object", "POST", "/generate", b'"hi"', AUTH, 400, "invalid_json", None),
    ("no prompt", "POST", COMPLETIONS, {}, AUTH, 400, "missing_required_parameter", "prompt"),
    ("prompt of mixed types", "POST", COMPLETIONS, {"prompt": [1, "x"]}, AUTH, 400, "invalid_value", "prompt"),
    ("negative max_tokens", "POST", COMPLETIONS, {"prompt": "a", "max_tokens": -1}, AUTH, 400, "invalid_value", "max_tokens"),
    ("max_tokens a string", "POST", COMPLETIONS, {"prompt": "a", "max_tokens": "8"}, AUTH, 400, "invalid_value", "max_tokens"),
    ("max_completion_tokens 0", "POST", CHAT, chat({"role": "user", "content": "a"}, max_completion_tokens=0), AUTH, 400,
     "invalid_value", "max_completion_tokens"),
    ("temperature a string", "POST", COMPLETIONS, {"prompt": "a", "temperature": "hot"}, AUTH, 400, "invalid_value", "temperature"),
    ("top_p 0", "POST", COMPLETIONS, {"prompt": "a", "top_p": 0}, AUTH, 400, "invalid_value", "top_p"),
    ("seed 2**64", "POST", COMPLETIONS, {"prompt": "a", "seed": 2**64}, AUTH, 400, "invalid_value", "seed"),
    ("seed below -2**63", "POST", COMPLETIONS, {"prompt": "a", "seed": -(2**63) - 1}, AUTH, 400, "invalid_value", "seed"),
    ("seed 10**30 streamed", "POST", COMPLETIONS, {"prompt": "a", "seed": 10**30, "stream": True}, AUTH, 400, "invalid_value", "seed"),
    ("seed a float", "POST", COMPLETIONS, {"prompt": "a", "seed": 1.5}, AUTH, 400, "invalid_value", "seed"),
    ("stream not a bool", "POST", COMPLETIONS, {"prompt": "a", "stream": "yes"}, AUTH, 400, "invalid_value", "stream"),
    ("stop a number", "POST", COMPLETIONS, {"prompt": "a", "stop": 5}, AUTH, 400, "invalid_value", "stop"),
    ("n = 2", "POST", COMPLETIONS, {"prompt": "a", "n": 2, "best_of": 2}, AUTH, 400, "unsupported_parameter", ...),
    ("unknown model", "POST", COMPLETIONS, {"prompt": "a", "model": "gpt-4"}, AUTH, 404, "model_not_found", "model"),
    ("max_tokens beyond the context", "POST", COMPLETIONS, {"prompt": "a", "max_tokens": MAX_SEQ_LEN}, AUTH, 400,
     "context_length_exceeded", None),
    ("prompt beyond the context", "POST", COMPLETIONS, {"prompt": [1] * (MAX_SEQ_LEN + 10)}, AUTH, 400,
     "context_length_exceeded", ...),
    ("prompt beyond the context, streamed", "POST", CHAT, chat({"role": "user", "content": "hi " * (MAX_SEQ_LEN + 10)}, stream=True),
     AUTH, 400, "context_length_exceeded", ...),
    ("token id outside the vocabulary", "POST", COMPLETIONS, {"prompt": [5, 10**9]}, AUTH, 400, "invalid_value", ...),
    ("negative token id, /generate", "POST", "/generate", {"prompt": [-1], "stream": False}, AUTH, 400, "invalid_value", ...),
    ("empty messages", "POST", CHAT, chat(), AUTH, 400, "invalid_value", "messages"),
    ("unknown role", "POST", CHAT, chat({"role": "bot", "content": "a"}), AUTH, 400, "invalid_value", "messages[0]"),
    ("image part", "POST", CHAT, chat({"role": "user", "content": [{"type": "text", "text": "see"},
                                                                  {"type": "image_url", "image_url": {"url": "x"}}]}),
     AUTH, 400, "unsupported_value", "messages[0].content[1]"),
    ("tool message without tool_call_id", "POST", CHAT, chat({"role": "user", "content": "a"}, {"role": "tool", "content": "1"}),
     AUTH, 400, "missing_required_parameter", "messages[1].tool_call_id"),
    ("no API key", "POST", COMPLETIONS, {"prompt": "a"}, None, 401, "invalid_api_key", None),
    ("wrong API key", "GET", "/v1/models", None, {"Authorization": "Bearer nope"}, 401, "invalid_api_key", None),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_request_is_4xx_with_code_and_leaks_nothing(server: Server, case: tuple[Any, ...]) -> None:
    name, method, path, body, headers, status, code, param = case
    got, data = call(server, method, path, body, headers)
    error = data.get("error") if isinstance(data, dict) else None
    shaped = (isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
              and isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str))
    assert got == status and shaped and error["code"] == code and (param is ... or error["param"] == param), tr(
        "{name}: {method} {path} must answer {status} with an OpenAI error body whose code is {code!r} (param {param}); got {got}: {data}",
        name=name, method=method, path=path, status=status, code=code, param="…" if param is ... else repr(param), got=got, data=str(data)[:400])
    wait_unregistered(server, name)


def test_model_card_for_the_served_model(server: Server) -> None:
    status, listing = call(server, "GET", "/v1/models")
    assert status == 200, tr("GET /v1/models answered {status}: {data}", status=status, data=listing)
    card = listing["data"][0]
    for model_id in (card["id"], card["root"]):
        status, data = call(server, "GET", f"/v1/models/{model_id}")
        assert status == 200 and data == card, tr("GET /v1/models/{id} must answer the model card {card}; got {status}: {data}",
                                                  id=model_id, card=card, status=status, data=data)


# ----------------------------------------------------------------------------- 对话的角色
# en: ----------------------------------------------------------------------------- chat roles

TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}


def test_developer_and_tool_roles_reach_the_chat_template(server: Server) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model())
    sent = [{"role": "developer", "content": "You add numbers."},
            {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2 + 3?"}]},
            {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    # Hugging Face 的模板看到的应该是：system、连起来的文字、arguments 解析成对象的工具调用、tool 消息
    # en: what Hugging Face's template should see: system, the joined text, the tool call with its arguments parsed
    # en: into an object, the tool message
    meant = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 2 + 3?"},
             {"role": "assistant", "content": "", "tool_calls": [{**TOOL_CALL, "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    want = len(tok.apply_chat_template(meant, add_generation_prompt=True, tokenize=True, return_dict=False))
    body = {"messages": sent, "max_tokens": 2, "temperature": 0}
    status, data = call(server, "POST", CHAT, body)
    assert status == 200 and data["usage"]["prompt_tokens"] == want, tr(
        "A chat with developer, text parts, tool_calls and tool messages must be answered with {want} prompt tokens (Hugging Face's chat template of the same conversation, developer as system); got {status}: {data}",
        want=want, status=status, data=str(data)[:400])
    as_system = {**body, "messages": [{"role": "system", "content": "You add numbers."}, *sent[1:]]}
    status, same = call(server, "POST", CHAT, as_system)
    assert status == 200 and same["choices"][0]["message"] == data["choices"][0]["message"], tr(
        "developer must be taken as system: the same greedy answer; got {a} and {b}", a=data["choices"], b=str(same)[:300])
    wait_unregistered(server, "the tool conversation")


# ----------------------------------------------------------------------------- 访问日志
# en: ----------------------------------------------------------------------------- the access log


def test_access_log_one_line_per_request(server: Server) -> None:
    since = len(server.lines)
    status, data = call(server, "POST", COMPLETIONS, {"prompt": "Hello there", "max_tokens": 3, "ignore_eos": True})
    assert status == 200, tr("A plain completion answered {status}: {data}", status=status, data=data)
    line = wait_log(server, since, "POST", COMPLETIONS, 200)
    usage = data["usage"]
    assert (line["prompt"], line["completion"]) == (str(usage["prompt_tokens"]), str(usage["completion_tokens"])), tr(
        "The access log line must carry the request's tokens {usage}; got {line!r}", usage=usage, line=line.group(0))
    since = len(server.lines)
    call(server, "GET", "/v1/nothing")
    call(server, "POST", COMPLETIONS, {"prompt": "a"}, headers=None)
    wait_log(server, since, "GET", "/v1/nothing", 404)
    wait_log(server, since, "POST", COMPLETIONS, 401)


@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "whole"])
def test_client_that_leaves_is_logged_499(server: Server, streamed: bool) -> None:
    since = len(server.lines)
    conn = send_request(server, COMPLETIONS, {"prompt": "Tell a long story", "max_tokens": 800, "ignore_eos": True,
                                              "stream": streamed}, headers=AUTH)
    if streamed:
        resp = conn.getresponse()
        assert resp.status == 200 and read_events(resp, 2), tr("The stream did not start: {status}", status=resp.status)
    else:
        time.sleep(0.5)
    conn.close()
    wait_log(server, since, "POST", COMPLETIONS, 499, timeout=10.0)
    wait_unregistered(server, tr("a client that left midway"), timeout=10.0)


def test_no_access_log_flag() -> None:
    def logged(app: Any) -> bool:
        return any(m.cls is AccessLog for m in app.user_middleware)

    for flags, on in (([], True), (["--no-access-log"], False)):
        args = parse_args(["--model", tiny_model(), *flags])
        state = ServerState(args, ServerAddrs("ipc://a", "ipc://b", "ipc://c"), {"max_seq_len": 64})
        router = DpRouter(["http://127.0.0.1:1"], make_policy("round_robin", 1))
        got = (args.access_log, logged(create_app(state)), logged(create_router_app(router, access_log=args.access_log)))
        assert got == (on, on, on), tr("python -m minisgl {flags}: the access log must be {on} (flag, API server, router); got {got}",
                                       flags=" ".join(flags), on=on, got=got)


def test_server_exits_cleanly_without_children(server: Server) -> None:
    assert server.proc is not None
    pid = server.proc.pid
    code = stop_server(server)
    assert code == 0 and not descendants(pid), tr("After SIGINT the server must exit with 0 and leave no process; got {code}, left {pids}",
                                                  code=code, pids=descendants(pid))
