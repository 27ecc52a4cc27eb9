"""第 3.4 章 api_server 的检查：先在本进程里逐个查每个任务（参数、SSE 事件、整段回答、取消、断开），
再查真的服务器进程（``python -m minisgl``，小 Qwen3，127.0.0.1，操作系统给的端口）。

贪心输出经 HTTP 与 ``LLM.generate``、Hugging Face 一致；流式的片段拼起来等于非流式的全文；32 个并发的流式客户端
都拿到正确的文字，并且真的进了同一个解码批；客户端断开后页面和请求槽全部归还（从 ``/metrics`` 读）；停止字符串
（包括横跨两个 token 的）；每一种坏输入都得到 OpenAI 样式的错误，服务器照常服务；官方 ``openai`` 客户端原样可用；
API 密钥；SIGTERM / SIGINT 之后没有留下子进程；工作进程被杀 → 503 并以非零状态退出；对话页面在无头 Chromium 里
流式显示、按“停止”真的取消请求。

en: Checks of chapter 3.4 api_server: first each task in this process (parameters, SSE events, the whole answer, abort,
disconnect), then against a real server process (``python -m minisgl``, the tiny Qwen3, 127.0.0.1,
a port from the OS).

Greedy output over HTTP equals ``LLM.generate`` and Hugging Face; streamed pieces join to the non-streamed text; 32
concurrent streaming clients all get the right text and really share a decode batch; after a client disconnects every
page and request slot comes back (read from ``/metrics``); stop strings (one split across two tokens too); every bad
input gets an OpenAI-style error while the server keeps serving; the official ``openai`` client works unchanged; the
API key; no child process left after SIGTERM / SIGINT; a killed worker → 503 and a non-zero exit; the chat page streams
in headless Chromium and its stop button really aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

import openai
import pytest
import torch
from transformers import AutoTokenizer

from .conftest import Server, descendants, idle, read_events, send_request, stop_server, tiny_model
from checks.common import expect
from checks.hf_reference import greedy_reference
from minisgl.i18n import tr
from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.message import AbortMsg, UserReply
from minisgl.server.args import ServerAddrs, ServerArgs

PROMPTS = ["Hello, my name is", "The capital of France is", "今天天气很好，我们", "def add(a, b):\n"]
MAX_TOKENS = 12
GREEDY = {"temperature": 0, "ignore_eos": True}
CHAT = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a colour."}]
LONG_TOKENS = 900  # 够长，检查断开 / 停止时它一定还在生成 | en: long enough to be still generating when we disconnect / stop


# ----------------------------------------------------------------------------- 夹具
# en: ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def server(serve) -> Server:  # noqa: ANN001
    """模块共用的服务器；最后用 SIGTERM 关掉（夹具检查退出码 0、没有留下进程）。

    en: The server shared by the module; stopped with SIGTERM at the end (the fixture checks exit status 0 and that no
    process is left).
    """
    return serve(stop_with=signal.SIGTERM)


@pytest.fixture(scope="module")
def tok() -> Any:
    return AutoTokenizer.from_pretrained(tiny_model())


@pytest.fixture(scope="module")
def llm() -> Iterator[Any]:
    engine = LLM(tiny_model(), dtype=torch.float32, device="cpu", max_running_req=8, num_page_override=2048,
                 max_seq_len_override=1024)
    yield engine
    engine.shutdown()


def chat_ids(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def events(text: str) -> list[str]:
    """SSE 正文 → 每个事件 ``data:`` 后面的内容。

    en: An SSE body → what follows ``data:`` in each event.
    """
    out = []
    for block in text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), tr("Every server-sent event must start with 'data: ', got {block!r}", block=block[:200])
            out.append(block[len("data: "):])
    return out


def stream(server: Server, path: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """发一个流式请求，返回 (JSON 事件, 原始事件)；要求状态 200、最后一个是 ``[DONE]``。

    en: Send a streamed request and return (JSON events, raw events); status 200 and a final ``[DONE]`` are required.
    """
    status, text = server.post(path, {**body, "stream": True})
    assert status == 200, tr("A streamed request to {path} answered {status}: {text}", path=path, status=status, text=str(text)[:500])
    raw = events(text)
    assert raw and raw[-1] == "[DONE]", tr("A stream must end with 'data: [DONE]', got the events {events}", events=raw[-3:])
    return [json.loads(e) for e in raw[:-1]], raw


def ok(server: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, data = server.post(path, body)
    assert status == 200, tr("{path} answered {status}: {data}", path=path, status=status, data=str(data)[:500])
    return data


def check_envelope(obj: dict[str, Any], kind: str) -> None:
    """OpenAI 对象的外层：``object``、``id``、``model``、``created``（现在的时间戳），每个 choice 的 ``index`` 为 0、
    ``logprobs`` 为 None。

    en: An OpenAI object's envelope: ``object``, ``id``, ``model``, ``created`` (a current timestamp), and every choice with
    ``index`` 0 and ``logprobs`` None.
    """
    fine = (obj.get("object") == kind and isinstance(obj.get("id"), str) and obj["id"] and obj.get("model") == Path(tiny_model()).name
            and isinstance(obj.get("created"), int) and abs(obj["created"] - time.time()) < 600
            and all(c.get("index") == 0 and "logprobs" in c and c["logprobs"] is None for c in obj.get("choices", [])))
    assert fine, tr("Expected an OpenAI {kind!r} object with an id, the model's name, created = now, and choices with index 0 and logprobs null; got {obj}",
                    kind=kind, obj=obj)


# ----------------------------------------------------------------------------- 各个任务，在本进程里（快，不起服务器）
# en: ----------------------------------------------------------------------------- each task in this process (fast, no server)


def bad_request(call: Callable[[], Any], param: str, code: str = "invalid_value") -> None:
    """``call()`` 必须抛 400 的 ``ApiError``，``param`` / ``code`` 指出哪个参数、哪种错。

    en: ``call()`` must raise a 400 ``ApiError`` whose ``param`` / ``code`` name the parameter and the kind of error.
    """
    from minisgl.api_server import ApiError

    with pytest.raises(ApiError) as info:
        call()
    got = (info.value.status, info.value.param, info.value.code)
    expect(got, (400, param, code), tr("The error (status, param, code) for a bad {param}", param=param))


def test_unsupported_params_are_named() -> None:
    from minisgl.api_server import unsupported_params

    neutral = {"best_of": 1, "suffix": None, "tools": [], "tool_choice": "auto", "n": 3, "temperature": 0.5, "stream": True}
    expect(unsupported_params(neutral), [], tr("Parameters at their neutral value change nothing and are not refused"))
    body = {"tools": [{"type": "function"}], "suffix": "x", "max_tokens": 4, "best_of": 2, "n": 2}
    expect(unsupported_params(body), ["best_of", "suffix", "tools"],
           tr("Every unsupported parameter that would change the result is named, in the table's order"))


def test_sampling_params_follow_openai() -> None:
    from minisgl.api_server import sampling_params_from

    def parse(default_max_tokens: int | None = 16, **body: Any) -> tuple[SamplingParams, list[str]]:
        return sampling_params_from(body, default_max_tokens=default_max_tokens)

    want = SamplingParams(temperature=1.0, top_k=-1, top_p=1.0, ignore_eos=False, max_tokens=16, seed=None)
    expect(parse(), (want, []), tr("An empty body: OpenAI's defaults (temperature 1, top_p 1, no top_k) and default_max_tokens"))
    expect(parse(default_max_tokens=None)[0].max_tokens, None,
           tr("default_max_tokens None stays None: the tokenizer process settles it once it knows the prompt's length"))
    body = {"temperature": 0, "top_p": 0.5, "top_k": 1, "max_tokens": 99, "ignore_eos": True, "seed": 7, "stop": "\n"}
    want = SamplingParams(temperature=0.0, top_k=1, top_p=0.5, ignore_eos=True, max_tokens=99, seed=7)
    expect(parse(**body), (want, ["\n"]), tr("Every field is read"))
    expect(parse(max_completion_tokens=5)[0].max_tokens, 5, tr("max_completion_tokens counts when max_tokens is absent"))
    expect(parse(max_tokens=None, max_completion_tokens=5)[0].max_tokens, 5,
           tr("max_completion_tokens counts when max_tokens is null"))
    expect(parse(max_tokens=3, max_completion_tokens=5)[0].max_tokens, 3, tr("max_tokens wins over max_completion_tokens"))
    expect(parse(temperature=None, top_p=None, top_k=None, ignore_eos=None)[0], SamplingParams(temperature=1.0, max_tokens=16),
           tr("null is read as absent: the defaults apply"))
    expect(parse(stop=["a", "b"])[1], ["a", "b"], tr("A list of stop strings is kept as it is"))
    expect(parse(temperature=-1.0, max_tokens=0)[0], SamplingParams(temperature=-1.0, max_tokens=0),
           tr("Values are read, not judged: the gate right after checks them, once"))
    for value in (5, ["a", 1], {"a": 1}):
        bad_request(lambda: parse(stop=value), "stop")


def test_the_api_gate_names_the_field_the_request_used() -> None:
    from minisgl.api_server import sampling_params_from
    from minisgl.server.openai_body import checked

    def gate(kind: str = "completion", **body: Any) -> SamplingParams:
        return checked(sampling_params_from(body, default_max_tokens=16)[0], body, kind)

    expect(gate(max_tokens=1, top_k=5, top_p=1.0), SamplingParams(temperature=1.0, top_k=5, max_tokens=1),
           tr("max_tokens 1, top_k 5 and top_p 1 are valid"))
    for field, values in {"temperature": (-0.01, float("nan")), "top_p": (0.0, 1.01, -1.0), "top_k": (0, -2),
                          "max_tokens": (0, -1, 2.5), "ignore_eos": ("yes", 1)}.items():
        for value in values:
            bad_request(lambda: gate(**{field: value}), field)
    bad_request(lambda: gate("chat", max_completion_tokens=0), "max_completion_tokens")
    bad_request(lambda: gate("completion", logprobs=99), "logprobs")


def fake_replies(*replies: UserReply) -> AsyncIterator[UserReply]:
    async def gen() -> AsyncIterator[UserReply]:
        for reply in replies:
            yield reply

    return gen()


def parsed(kind: str, **fields: Any) -> Any:
    from minisgl.api_server import ParsedRequest

    return ParsedRequest(kind=kind, model="m", prompt="p", sampling_params=SamplingParams(), created=123, **fields)


async def collect(chunks: AsyncIterator[str]) -> list[Any]:
    return [c.removeprefix("data: ").rstrip("\n") if c.endswith("[DONE]\n\n") else json.loads(c.removeprefix("data: "))
            async for c in chunks]


def test_stream_chunks_shape() -> None:
    from minisgl.api_server import stream_chunks

    replies = (UserReply(7, "He"), UserReply(7, ""), UserReply(7, "llo"),
               UserReply(7, "!", finished=True, finish_reason="stop", prompt_tokens=3, completion_tokens=4))
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    for kind, obj, key, first, empty in (("chat", "chat.completion.chunk", "delta", [{"role": "assistant", "content": ""}], {}),
                                         ("completion", "text_completion", "text", [], "")):
        got = asyncio.run(collect(stream_chunks(parsed(kind, include_usage=True), 7, fake_replies(*replies))))
        pieces = [{"content": p} for p in ("He", "llo", "!")] if kind == "chat" else ["He", "llo", "!"]
        want = [{"id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-7", "object": obj, "created": 123, "model": "m",
                 "choices": [{"index": 0, key: content, "finish_reason": reason, "logprobs": None}]}
                for content, reason in [(c, None) for c in first + pieces] + [(empty, "stop")]]
        want += [{"id": want[0]["id"], "object": obj, "created": 123, "model": "m", "choices": [], "usage": usage}, "[DONE]"]
        expect(got, want, tr("The events of a {kind} stream (one per non-empty piece, then the finish_reason, the usage, [DONE])", kind=kind))
        got = asyncio.run(collect(stream_chunks(parsed(kind), 7, fake_replies(*replies))))
        expect(got, want[:-2] + ["[DONE]"], tr("Without include_usage there is no usage chunk"))
    error = {"error": {"message": "too long", "type": "invalid_request_error", "param": None, "code": "context_length_exceeded"}}
    got = asyncio.run(collect(stream_chunks(parsed("completion"), 1, fake_replies(
        UserReply(1, "", finished=True, error="too long", code="context_length_exceeded")))))
    expect(got, [error, "[DONE]"], tr("A reply with an error becomes one error event (with the reply's code), then [DONE]"))
    entry = {"token": "He", "logprob": -0.5, "bytes": [72, 101], "top_logprobs": [], "text_offset": 0}
    asked = parsed("chat", n=2)
    asked.sampling_params = SamplingParams(logprobs=True)
    got = asyncio.run(collect(stream_chunks(asked, 7, fake_replies(UserReply(7, "He", logprobs=[entry]),
                                                                   UserReply(7, "", finished=True, finish_reason="stop")), 1)))
    expect([c["choices"][0]["index"] for c in got[:-1]], [1, 1, 1], tr("Every event of the stream carries the index it was given"))
    expect(got[1]["choices"][0]["logprobs"], {"content": [{k: entry[k] for k in ("token", "logprob", "bytes", "top_logprobs")}],
                                              "refusal": None}, tr("A piece of text carries its tokens' log-probabilities"))


def test_full_response_shape() -> None:
    from minisgl.api_server import ApiError, full_response

    replies = (UserReply(2, "a"), UserReply(2, "b"), UserReply(2, "c", finished=True, finish_reason="length",
                                                                prompt_tokens=5, completion_tokens=3))
    usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    for kind, obj, key, content in (("chat", "chat.completion", "message", {"role": "assistant", "content": "abc"}),
                                    ("completion", "text_completion", "text", "abc")):
        got = asyncio.run(full_response(parsed(kind), 2, fake_replies(*replies)))
        want = {"id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-2", "object": obj, "created": 123, "model": "m",
                "choices": [{"index": 0, key: content, "finish_reason": "length", "logprobs": None}], "usage": usage}
        expect(got, want, tr("The non-streamed {kind} answer", kind=kind))
    with pytest.raises(ApiError) as info:
        asyncio.run(full_response(parsed("chat"), 2, fake_replies(UserReply(2, "a"), UserReply(2, "", finished=True, error="bad",
                                                                                               code="invalid_value"))))
    expect((info.value.status, info.value.message, info.value.code), (400, "bad", "invalid_value"),
           tr("A reply with an error raises ApiError(400, its error, code=its code)"))
    entries = [{"token": t, "logprob": -1.0, "bytes": [], "top_logprobs": [{"token": t, "logprob": -1.0, "bytes": []}],
                "text_offset": i} for i, t in enumerate("abc")]
    asked = parsed("completion")
    asked.sampling_params = SamplingParams(logprobs=True)
    got = asyncio.run(full_response(asked, 2, fake_replies(UserReply(2, "a", logprobs=entries[:1]), UserReply(2, "b", logprobs=entries[1:]),
                                                           UserReply(2, "c", finished=True, finish_reason="length"))))
    expect(got["choices"][0]["logprobs"], {"tokens": ["a", "b", "c"], "token_logprobs": [-1.0] * 3,
                                           "top_logprobs": [{"a": -1.0}, {"b": -1.0}, {"c": -1.0}], "text_offset": [0, 1, 2]},
           tr("The log-probabilities of every reply, joined in order (completions shape)"))


class FakeSend:
    """代替发往分词进程的 PUSH：记下发出的消息。

    en: Stands in for the PUSH to the tokenizer: records what is sent.
    """

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def put(self, msg: Any) -> None:
        self.sent.append(msg)


def fake_state() -> Any:
    from minisgl.api_server import ServerState

    state = ServerState(ServerArgs(model_path="m"), ServerAddrs.in_dir("/nonexistent"), {"max_seq_len": 64})
    state.send = FakeSend()  # type: ignore[assignment]
    return state


def test_abort_is_sent_once() -> None:
    state = fake_state()

    async def scenario() -> None:
        state.live[3] = asyncio.Queue()
        state.live[4] = asyncio.Queue()
        for uid in (3, 3, 9):
            await state.abort(uid)

    asyncio.run(scenario())
    expect(state.send.sent, [AbortMsg(3)], tr("Aborting request 3 twice and an unknown request 9 sends one AbortMsg(3)"))
    expect(list(state.live), [4], tr("The aborted request leaves live; the others stay"))


class FakeRequest:
    """代替 Starlette 的 ``Request``：第 ``gone_after`` 次问起时，客户端已经断开（None：一直在）。

    en: Stands in for Starlette's ``Request``: the client is gone from the ``gone_after``-th question on (None: never).
    """

    def __init__(self, gone_after: int | None) -> None:
        self.gone_after = gone_after
        self.asked = 0

    async def is_disconnected(self) -> bool:
        self.asked += 1
        return self.gone_after is not None and self.asked >= self.gone_after


@pytest.mark.timeout(60)  # 不 await 就轮询会卡死事件循环：让它几十秒内失败 | en: polling without awaiting blocks the event loop: fail within a minute
def test_until_disconnect_aborts_and_cancels() -> None:
    from minisgl.api_server import ClientGone, until_disconnect

    state = fake_state()
    outcome: dict[str, Any] = {}

    async def slow(seconds: float, result: str) -> str:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            outcome["cancelled"] = True
            raise
        return result

    async def scenario() -> None:
        state.live[5] = asyncio.Queue()
        outcome["result"] = await until_disconnect(FakeRequest(None), state, 5, slow(0.2, "done"))
        try:
            await until_disconnect(FakeRequest(2), state, 5, slow(60, "never"))
        except ClientGone:
            outcome["gone"] = True
        await asyncio.sleep(0.05)
        outcome["cancelled in time"] = outcome.get("cancelled", False)

    start = time.monotonic()
    asyncio.run(asyncio.wait_for(scenario(), 30))
    expect(outcome.get("result"), "done", tr("While the client stays, until_disconnect returns the work's result"))
    expect((outcome.get("gone"), outcome.get("cancelled in time")), (True, True),
           tr("When the client leaves: ClientGone is raised and the work is cancelled (not left running)"))
    expect(state.send.sent, [AbortMsg(5)], tr("When the client leaves, its request is aborted (one AbortMsg)"))
    assert time.monotonic() - start < 10, tr("until_disconnect must notice a disconnect within a poll or two, not wait for the work")


# ----------------------------------------------------------------------------- 正确的输出
# en: ----------------------------------------------------------------------------- correct output


def test_greedy_text_matches_llm_and_hf(server: Server, tok: Any, llm: Any) -> None:
    ids = [tok.encode(p, add_special_tokens=False) for p in PROMPTS] + [chat_ids(tok, CHAT)]
    hf = greedy_reference(tiny_model(), ids, MAX_TOKENS)
    offline = llm.generate(ids, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    for i, prompt in enumerate(PROMPTS):
        data = ok(server, "/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS, **GREEDY})
        choice = data["choices"][0]
        want = tok.decode(hf[i])
        assert choice["text"] == want == offline[i]["text"], tr(
            "Greedy text over HTTP for {prompt!r}: expected {want!r} (Hugging Face and LLM.generate), got {got!r}",
            prompt=prompt, want=want, got=choice["text"])
        check_envelope(data, "text_completion")
        assert choice["finish_reason"] == "length", tr("max_tokens reached: finish_reason must be 'length', got {got!r}", got=choice["finish_reason"])
        usage = {"prompt_tokens": len(ids[i]), "completion_tokens": MAX_TOKENS, "total_tokens": len(ids[i]) + MAX_TOKENS}
        assert data["usage"] == usage, tr("usage: expected {want}, got {got}", want=usage, got=data["usage"])
    data = ok(server, "/v1/completions", {"prompt": ids[0], "max_tokens": MAX_TOKENS, **GREEDY})
    assert data["choices"][0]["text"] == tok.decode(hf[0]), tr("A prompt given as token ids must give the same text as the string prompt")
    data = ok(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": MAX_TOKENS, **GREEDY})
    message = data["choices"][0]["message"]
    check_envelope(data, "chat.completion")
    assert message == {"role": "assistant", "content": tok.decode(hf[-1])}, tr(
        "Chat (through the chat template): expected the assistant's message {want!r}, got {got}", want=tok.decode(hf[-1]), got=data)
    assert data["usage"]["prompt_tokens"] == len(ids[-1]) and data["usage"]["completion_tokens"] == MAX_TOKENS, tr(
        "usage of the chat answer: expected {prompt} prompt and {n} completion tokens, got {usage}", prompt=len(ids[-1]), n=MAX_TOKENS, usage=data["usage"])


def test_stream_joins_to_full_text(server: Server) -> None:
    for path, body in (("/v1/completions", {"prompt": PROMPTS[2]}), ("/v1/chat/completions", {"messages": CHAT})):
        body = {**body, "max_tokens": MAX_TOKENS, **GREEDY}
        full = ok(server, path, body)
        chunks, _ = stream(server, path, {**body, "stream_options": {"include_usage": True}})
        chat = path.endswith("chat/completions")
        *content, usage_chunk = chunks
        assert usage_chunk["choices"] == [] and usage_chunk["usage"] == full["usage"], tr(
            "With stream_options.include_usage the last chunk has no choices and the usage {want}, got {got}", want=full["usage"], got=usage_chunk)
        kinds = {c["object"] for c in chunks}
        want_kind = "chat.completion.chunk" if chat else "text_completion"
        assert kinds == {want_kind}, tr("Every chunk of the stream is a {want!r} object, got {kinds}", want=want_kind, kinds=kinds)
        assert len({c["id"] for c in chunks}) == 1, tr("Every chunk of one stream carries the same id")
        for c in chunks:
            check_envelope(c, want_kind)
        choices = [c["choices"][0] for c in content]
        if chat:
            assert choices[0]["delta"] == {"role": "assistant", "content": ""}, tr("The first chat chunk carries role 'assistant', got {first}", first=choices[0])
            pieces = [c["delta"].get("content") or "" for c in choices]
            text = full["choices"][0]["message"]["content"]
        else:
            pieces = [c["text"] for c in choices]
            text = full["choices"][0]["text"]
        assert "".join(pieces) == text, tr("The streamed pieces join to {got!r}, the non-streamed text is {want!r}", got="".join(pieces), want=text)
        assert all(p for p in pieces[1 if chat else 0:-1]), tr("No empty pieces in the middle of a stream: {pieces}", pieces=pieces)
        assert choices[-1].get("delta" if chat else "text") == ({} if chat else ""), tr(
            "The closing chunk carries only the finish_reason (an empty delta / text), got {last}", last=choices[-1])
        reasons = [c["finish_reason"] for c in choices]
        assert reasons[-1] == "length" and not any(reasons[:-1]), tr(
            "Only the last chunk carries the finish_reason ('length' here), got {reasons}", reasons=reasons)
        chunks, _ = stream(server, path, body)
        assert all(c["choices"] for c in chunks), tr("Without include_usage there is no usage chunk")
    status, text = server.post("/generate", {"prompt": PROMPTS[2], "max_tokens": MAX_TOKENS, **GREEDY})
    raw = events(text) if status == 200 else []
    joined = "".join(json.loads(e)["choices"][0]["text"] for e in raw[:-1])
    want = ok(server, "/v1/completions", {"prompt": PROMPTS[2], "max_tokens": MAX_TOKENS, **GREEDY})["choices"][0]["text"]
    assert raw[-1:] == ["[DONE]"] and joined == want, tr("/generate streams by default and joins to {want!r}; got {status}: {text}", want=want, status=status, text=str(text)[:300])


def test_sampling_defaults_and_fields(server: Server) -> None:
    def text(**fields: Any) -> str:
        body = {"prompt": PROMPTS[3], "max_tokens": MAX_TOKENS, "ignore_eos": True, **fields}
        return ok(server, "/v1/completions", body)["choices"][0]["text"]

    greedy = text(temperature=0)
    default = text(seed=7)
    explicit = text(seed=7, temperature=1.0, top_p=1.0, top_k=-1)
    assert default == explicit != greedy, tr(
        "OpenAI defaults: no temperature means temperature 1 (sampling, here with seed 7), top_p 1, no top_k; got {default!r} "
        "without them, {explicit!r} with them written out, greedy {greedy!r}", default=default, explicit=explicit, greedy=greedy)
    assert text(seed=8) != default, tr("seed must reach the sampler: seeds 7 and 8 gave the same text")
    for fields in ({"top_k": 1}, {"top_p": 1e-6}):
        got = text(seed=7, temperature=1.0, **fields)
        assert got == greedy, tr("temperature 1 with {fields} keeps only the top token, i.e. greedy {greedy!r}; got {got!r}",
                                 fields=fields, greedy=greedy, got=got)
    one = ok(server, "/v1/completions", {"prompt": PROMPTS[3], "max_tokens": 1, "temperature": 0, "ignore_eos": True})
    assert one["usage"]["completion_tokens"] == 1 and greedy.startswith(one["choices"][0]["text"]), tr(
        "max_tokens=1 is valid and gives one token, got {data}", data=one)
    data = ok(server, "/v1/completions", {"prompt": PROMPTS[3], "temperature": 0, "ignore_eos": True})
    assert data["usage"]["completion_tokens"] == 16 and data["choices"][0]["finish_reason"] == "length", tr(
        "/v1/completions without max_tokens generates 16 tokens (OpenAI's default), got {usage}", usage=data["usage"])


def test_32_concurrent_streams(server: Server, tok: Any, llm: Any) -> None:
    prompts = [f"Request number {i} says" for i in range(32)]
    want = [o["text"] for o in llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))]
    before = server.metrics()
    start = threading.Barrier(32)
    got: dict[int, Any] = {}

    def client(i: int) -> None:
        start.wait()
        try:
            chunks, _ = stream(server, "/v1/completions", {"prompt": prompts[i], "max_tokens": 16, **GREEDY})
            got[i] = "".join(c["choices"][0]["text"] for c in chunks)
        except BaseException as e:  # noqa: BLE001 - 在主线程里报告 | en: reported in the main thread
            got[i] = e

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    wrong = {i: got.get(i) for i in range(32) if got.get(i) != want[i]}
    assert not wrong, tr("Concurrent streams with the wrong text (expected LLM.generate's): {wrong}", wrong=dict(list(wrong.items())[:3]))
    m = server.wait_metrics(idle, tr("an idle server after the 32 streams"))
    assert m["minisgl_max_decode_batch"] > 1, tr("32 concurrent requests never shared a decode batch (largest batch {n})", n=m["minisgl_max_decode_batch"])
    prompt_tokens = sum(len(tok.encode(p, add_special_tokens=False)) for p in prompts)
    grew = {k: m[k] - before[k] for k in ("minisgl_prompt_tokens_total", "minisgl_generation_tokens_total",
                                          "minisgl_time_to_first_token_seconds_count", 'minisgl_requests_finished_total{finish_reason="length"}',
                                          "minisgl_abort_messages_total")}
    assert grew == {"minisgl_prompt_tokens_total": prompt_tokens, "minisgl_generation_tokens_total": 32 * 16,
                    "minisgl_time_to_first_token_seconds_count": 32, 'minisgl_requests_finished_total{finish_reason="length"}': 32,
                    "minisgl_abort_messages_total": 0}, tr(
        "/metrics counters after 32 requests of 16 tokens ({prompt} prompt tokens): grew by {grew}", prompt=prompt_tokens, grew=grew)


def test_disconnect_returns_pages_and_slots(server: Server) -> None:
    server.wait_metrics(idle, tr("an idle server"))
    for path, body in (("/v1/chat/completions", {"messages": CHAT, "stream": True}), ("/v1/completions", {"prompt": "Once upon a time"})):
        before = server.metrics()
        conn = send_request(server, path, {**body, "max_tokens": LONG_TOKENS, **GREEDY})
        if body.get("stream"):
            got = read_events(conn.getresponse(), 3)  # 读到几段文字：请求正在生成 | en: a few pieces read: the request is generating
            assert len(got) == 3, tr("The stream ended early: {events}", events=got)
        else:
            server.wait_metrics(lambda m: m["minisgl_running_requests"] == 1 and m["minisgl_kv_pages_used"] > 0,
                                tr("the request running and holding pages"))
        conn.close()
        m = server.wait_metrics(idle, tr("every page and request slot back after the client disconnected from {path}", path=path))
        aborted = m["minisgl_aborted_requests_total"] - before["minisgl_aborted_requests_total"]
        sent = m["minisgl_abort_messages_total"] - before["minisgl_abort_messages_total"]
        assert sent == 1, tr("One disconnect sends exactly one AbortMsg, got {sent}", sent=sent)
        generated = m["minisgl_decode_tokens_total"] - before["minisgl_decode_tokens_total"]
        assert aborted == 1 and generated < LONG_TOKENS // 2, tr(
            "A client that disconnects from {path} aborts its request (aborted +1, far fewer than {n} tokens decoded); got aborted +{aborted}, {generated} tokens",
            path=path, n=LONG_TOKENS, aborted=aborted, generated=generated)


def stop_case(tok: Any, ids: list[int]) -> tuple[str, int]:
    """找一个横跨两个 token 的停止字符串：第 k 个 token 文字的最后两个字符 + 第 k+1 个的前两个；它在全文里第一次出现
    就在这个边界上。返回 (停止字符串, 它前面的文字长度)。

    en: Find a stop string split across two tokens: the last two characters of token k's text + the first two of token
    k+1's; its first occurrence in the whole text is at that boundary. Return (the stop string, the length of the text
    before it).
    """
    text = tok.decode(ids)
    for k in range(2, len(ids) - 1):
        a, b = tok.decode(ids[:k]), tok.decode(ids[:k + 1])
        c = tok.decode(ids[:k + 2])
        if not (text.startswith(c) and c.startswith(b) and b.startswith(a)) or len(b) - len(a) < 2 or len(c) - len(b) < 2:
            continue
        stop = text[len(b) - 2:len(b) + 2]
        if "\ufffd" not in stop and text.find(stop) == len(b) - 2:
            return stop, len(b) - 2
    raise AssertionError(tr("No stop string split across two tokens found in {text!r}", text=text))


def test_stop_strings(server: Server, tok: Any) -> None:
    body = {"prompt": PROMPTS[0], "max_tokens": 24, **GREEDY}
    full = ok(server, "/v1/completions", body)["choices"][0]["text"]
    ids = greedy_reference(tiny_model(), [tok.encode(PROMPTS[0], add_special_tokens=False)], 24)[0]
    assert tok.decode(ids) == full, tr("The 24-token greedy text differs from Hugging Face's")
    stop, cut = stop_case(tok, ids)
    data = ok(server, "/v1/completions", {**body, "stop": [stop, "never-appears-here"]})
    got = data["choices"][0]
    assert (got["text"], got["finish_reason"]) == (full[:cut], "stop"), tr(
        "stop={stop!r} (split across two tokens): expected the text cut before it, {want!r} with finish_reason 'stop', got {got}",
        stop=stop, want=full[:cut], got=got)
    chunks, _ = stream(server, "/v1/completions", {**body, "stop": stop})
    joined = "".join(c["choices"][0]["text"] for c in chunks)
    assert all(c["choices"][0]["text"] for c in chunks[:-1]), tr("No empty pieces in the middle of a stream: {pieces}",
                                                                  pieces=[c["choices"][0]["text"] for c in chunks])
    assert joined == full[:cut] and chunks[-1]["choices"][0]["finish_reason"] == "stop", tr(
        "Streamed with stop={stop!r}: expected {want!r} then finish_reason 'stop', got {got!r} / {last}",
        stop=stop, want=full[:cut], got=joined, last=chunks[-1]["choices"][0])
    data = ok(server, "/v1/completions", {**body, "stop": "never-appears-here"})
    assert (data["choices"][0]["text"], data["choices"][0]["finish_reason"]) == (full, "length"), tr(
        "A stop string that never appears changes nothing: expected the full text and 'length', got {got}", got=data["choices"][0])
    server.wait_metrics(idle, tr("every page back after the stop-string hits"))


# ----------------------------------------------------------------------------- 坏输入
# en: ----------------------------------------------------------------------------- bad input

BAD = [
    ("/v1/completions", b'{"prompt": "a", ', 400, None, "JSON"),
    ("/v1/completions", [1, 2], 400, None, "JSON"),
    ("/v1/completions", {"max_tokens": 4}, 400, "prompt", "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt", "prompt"),
    ("/v1/chat/completions", {"max_tokens": 4}, 400, "messages", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "messages[0]", "messages[0]"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens", "max_tokens"),
    ("/v1/completions", {"prompt": "a", "max_tokens": -3}, 400, "max_tokens", "max_tokens"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 2.5}, 400, "max_tokens", "max_tokens"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 1024}, 400, None, "1024"),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 5000}, 400, None, "1024"),
    ("/v1/completions", b'{"prompt": "a", "temperature": NaN}', 400, "temperature", "temperature"),
    ("/v1/completions", {"prompt": "a", "temperature": -0.5}, 400, "temperature", "temperature"),
    ("/v1/completions", {"prompt": "a", "temperature": "hot"}, 400, "temperature", "temperature"),
    ("/v1/completions", {"prompt": "a", "top_p": 0}, 400, "top_p", "top_p"),
    ("/v1/completions", {"prompt": "a", "top_p": 1.5}, 400, "top_p", "top_p"),
    ("/v1/completions", {"prompt": "a", "top_k": 0}, 400, "top_k", "top_k"),
    ("/v1/completions", {"prompt": "a", "ignore_eos": "yes"}, 400, "ignore_eos", "ignore_eos"),
    ("/v1/completions", {"prompt": "a", "seed": 2**64}, 400, "seed", "seed"),
    ("/v1/completions", {"prompt": "a", "stop": 5}, 400, "stop", "stop"),
    ("/v1/completions", {"prompt": "a", "stop": ["x", 1]}, 400, "stop", "stop"),
    ("/v1/completions", {"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream_options", "stream_options"),
    ("/v1/completions", {"prompt": "a", "stream": "yes"}, 400, "stream", "stream"),
    ("/v1/completions", {"prompt": "a", "n": 0}, 400, "n", "n"),
    ("/v1/completions", {"prompt": "a", "logprobs": 3, "echo": True}, 400, "echo", "echo"),
    ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, 400, "top_logprobs", "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools", "tools"),
    ("/v1/chat/completions", {"messages": CHAT, "presence_penalty": 3}, 400, "presence_penalty", "presence_penalty"),
    ("/v1/completions", {"prompt": "hello " * 1100, "max_tokens": 4}, 400, None, "1024"),
    ("/v1/completions", {"prompt": "hello " * 1100, "max_tokens": 4, "stream": True}, 400, None, "1024"),
    ("/v1/completions", {"prompt": "a", "model": "gpt-4o"}, 404, "model", "gpt-4o"),
    ("/v1/nothing", {"prompt": "a"}, 404, None, "/v1/nothing"),
]


def test_bad_input_gets_clear_errors_and_server_keeps_serving(server: Server) -> None:
    good = {"prompt": PROMPTS[1], "max_tokens": 6, **GREEDY}
    want = ok(server, "/v1/completions", good)["choices"][0]["text"]
    lock = threading.Lock()
    failures: list[str] = []

    def one(case: tuple[Any, ...]) -> None:
        path, body, status, param, words = case
        got_status, data = server.post(path, body)
        error = data.get("error") if isinstance(data, dict) else None
        fine = (got_status == status and isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
                and isinstance(error["message"], str) and words in error["message"]
                and (param is None or error["param"] == param))
        if not fine:
            with lock:
                failures.append(tr("{path} {body}: expected {status} with an error naming {words!r} (param {param!r}), got {got_status}: {data}",
                                   path=path, body=str(body)[:80], status=status, words=words, param=param, got_status=got_status, data=str(data)[:300]))

    # 坏请求和一个好请求同时发：服务器照常服务周围的请求
    # en: the bad requests go out together with a good one: the server keeps serving the requests around them
    threads = [threading.Thread(target=one, args=(case,)) for case in BAD]
    for t in threads:
        t.start()
    during = ok(server, "/v1/completions", good)["choices"][0]["text"]
    for t in threads:
        t.join(60)
    assert not failures, "\n".join(failures)
    after = ok(server, "/v1/completions", good)["choices"][0]["text"]
    assert during == after == want, tr("A good request during and after the bad ones must still get {want!r}; got {during!r}, {after!r}",
                                       want=want, during=during, after=after)
    status, text = server.get("/v1/completions")
    assert status == 405 and "error" in json.loads(text), tr("GET /v1/completions must answer 405 with an OpenAI error body, got {status}: {text}",
                                                              status=status, text=text[:300])
    server.wait_metrics(idle, tr("an idle server after the bad requests"))


# ----------------------------------------------------------------------------- openai 客户端
# en: ----------------------------------------------------------------------------- the openai client


def test_official_openai_client(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    model = Path(tiny_model()).name
    assert [m.id for m in client.models.list()] == [model], tr("/v1/models must list the served model {model}", model=model)
    extra = {"ignore_eos": True}
    chat = client.chat.completions.create(model=model, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0, extra_body=extra)
    text = chat.choices[0].message.content
    assert chat.choices[0].finish_reason == "length" and chat.usage is not None and chat.usage.completion_tokens == MAX_TOKENS, tr(
        "openai chat.completions.create(stream=False): finish_reason 'length' and {n} completion tokens, got {chat}", n=MAX_TOKENS, chat=chat)
    pieces, reasons, usage = [], [], None
    for chunk in client.chat.completions.create(model=model, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0, stream=True,
                                                stream_options={"include_usage": True}, extra_body=extra):
        usage = chunk.usage or usage
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    assert "".join(pieces) == text and reasons[-1] == "length" and usage is not None and usage.total_tokens == chat.usage.total_tokens, tr(
        "openai chat.completions.create(stream=True): the pieces join to {want!r}, then 'length' and the usage; got {got!r}, {reasons}, {usage}",
        want=text, got="".join(pieces), reasons=reasons[-2:], usage=usage)
    done = client.completions.create(model=model, prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0, extra_body=extra)
    want = server.post("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": MAX_TOKENS, **GREEDY})[1]["choices"][0]["text"]
    assert done.choices[0].text == want and done.usage is not None and done.usage.completion_tokens == MAX_TOKENS, tr(
        "openai completions.create: expected {want!r}, got {got}", want=want, got=done)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model, prompt="a", n=0)
    assert "n" in str(err.value), tr("The openai client should see a 400 naming n, got {err}", err=err.value)


# ----------------------------------------------------------------------------- 进程：密钥、关机、工作进程死掉
# en: ----------------------------------------------------------------------------- processes: the key, shutdown, a dead worker


def test_api_key_and_sigint_mid_stream(serve, server: Server) -> None:  # noqa: ANN001
    body = {"prompt": PROMPTS[1], "max_tokens": 4, **GREEDY}
    want = ok(server, "/v1/completions", body)["choices"][0]["text"]  # 没有密钥的那个服务器给的参考 | en: the reference from the server without a key
    keyed = serve("--api-key", "s3cret", "--max-seq-len", "96")
    for headers, why in (({}, "missing"), ({"Authorization": "Bearer wrong"}, "wrong")):
        status, data = keyed.post("/v1/completions", body, headers=headers)
        assert status == 401 and isinstance(data, dict) and data["error"]["code"] == "invalid_api_key", tr(
            "A {why} API key must get 401 with code invalid_api_key, got {status}: {data}", why=why, status=status, data=data)
    assert keyed.get("/health")[0] == 200, tr("/health needs no key")
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key="s3cret", max_retries=0, timeout=60)
    got = client.completions.create(model=Path(tiny_model()).name, prompt=PROMPTS[1], max_tokens=4, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert got.choices[0].text == want, tr("With the right key the request is served: expected {want!r}, got {got}", want=want, got=got)
    chat = client.chat.completions.create(model=Path(tiny_model()).name, messages=CHAT, temperature=0, extra_body={"ignore_eos": True})
    assert chat.usage is not None and chat.usage.prompt_tokens + chat.usage.completion_tokens == 96 and chat.choices[0].finish_reason == "length", tr(
        "A chat without max_tokens generates until the context (96 tokens here) is full, got {usage}", usage=chat.usage)
    room = 96 - got.usage.prompt_tokens if got.usage is not None else 8  # 填满上下文 | en: fill the context
    conn = send_request(keyed, "/v1/completions", {**body, "max_tokens": room, "stream": True},
                        headers={"Authorization": "Bearer s3cret"})
    assert len(read_events(conn.getresponse(), 3)) == 3, tr("The stream on the server with a key ended early")
    code = stop_server(keyed, signal.SIGINT)  # 流还开着，就像在终端里按 Ctrl-C | en: the stream is still open, as with Ctrl-C in a terminal
    conn.close()
    assert code == 0, tr("After {sig} the server exits with 0, got {code}; its output:\n{output}", sig="SIGINT", code=code, output=keyed.output)


def test_killed_worker_gives_503_and_nonzero_exit(serve, server: Server) -> None:  # noqa: ANN001
    body = {"prompt": PROMPTS[0], "max_tokens": LONG_TOKENS, **GREEDY}
    want = ok(server, "/v1/completions", {**body, "max_tokens": 8})["choices"][0]["text"]
    doomed = serve()
    conn = send_request(doomed, "/v1/completions", {**body, "stream": True})
    resp = conn.getresponse()
    pieces = [json.loads(e)["choices"][0]["text"] for e in read_events(resp, 3)]
    assert len(pieces) == 3 and want.startswith("".join(pieces)), tr(
        "The doomed server streams the same text as the other one: {want!r} begins with {got!r}", want=want, got="".join(pieces))
    workers = sorted(p for p in descendants(doomed.proc.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes())
    assert len(workers) == 2, tr("Expected two worker processes, found {pids}", pids=workers)
    os.kill(workers[-1], signal.SIGKILL)  # 后启动的那个：调度器 | en: the one started second: the scheduler
    rest = read_events(resp, LONG_TOKENS)  # 正在流的请求不能一直挂着：以错误事件结束 | en: the request being streamed must not hang forever: it ends with an error event
    conn.close()
    assert any('"error"' in e for e in rest), tr("The open stream should end with an error event when the scheduler dies, got {rest!r}", rest=rest[-3:])
    status, data = doomed.post("/v1/completions", {**body, "max_tokens": 4})
    assert status == 503 and isinstance(data, dict) and "error" in data, tr(
        "After a worker died, a new request gets 503 with an error body, got {status}: {data}", status=status, data=data)
    assert doomed.get("/health")[0] == 503, tr("After a worker died, /health answers 503")
    try:
        doomed.proc.wait(60)
    except subprocess.TimeoutExpired:
        pass
    code = stop_server(doomed)  # 它应当已经自己退出了；这里只收尾并检查没有留下进程 | en: it should have exited by itself; this only tidies up and checks nothing is left
    assert code != 0, tr(
        "After a worker died, the server must exit by itself with a non-zero status, got {code}; its output:\n{output}", code=code, output=doomed.output)


# ----------------------------------------------------------------------------- 对话页面
# en: ----------------------------------------------------------------------------- the chat page

CHROMIUM = os.environ.get("MINISGL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = os.environ.get("MINISGL_CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"


def _browser() -> Any:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail(tr("selenium is not installed: pip install selenium, and run bash tools/setup_browser.sh"), pytrace=False)
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).is_file()]
    if missing:
        pytest.fail(tr("No headless browser: {missing}; run bash tools/setup_browser.sh", missing=", ".join(missing)), pytrace=False)
    os.environ.setdefault("SE_AVOID_STATS", "true")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-extensions", "--window-size=1100,800"):
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="minisgl-chat-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    drv.profile_dir = profile
    return drv


def _until(predicate: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    pytest.fail(tr("Waited {timeout:.0f} s: {what}", timeout=timeout, what=what), pytrace=False)


@contextlib.contextmanager
def _slowed(server: Server, share: float = 0.1, period: float = 0.05) -> Iterator[None]:
    """让服务器的调度进程只有 ``share`` 的时间在跑（SIGSTOP / SIGCONT 交替），离开时一定让它接着跑。
    小模型每秒能解出上千个 token，比浏览器点一下按钮还快：不放慢，在快机器上答案可能在“停止”到达之前就写完了。

    en: Let the server's scheduler process run only ``share`` of the time (SIGSTOP / SIGCONT in turn), and always let it
    run again on leaving. The tiny model decodes thousands of tokens a second, faster than a browser clicks a button:
    unslowed, on a fast machine the answer can be complete before "stop" arrives.
    """
    assert server.proc is not None
    pids = [p for p in descendants(server.proc.pid) if Path(f"/proc/{p}/comm").read_text().strip() == "msgl-scheduler"]
    assert len(pids) == 1, tr("Expected one msgl-scheduler process under the server, found {n}", n=len(pids))
    done = threading.Event()

    def duty() -> None:
        while not done.is_set():
            os.kill(pids[0], signal.SIGSTOP)
            done.wait(period * (1 - share))
            os.kill(pids[0], signal.SIGCONT)
            done.wait(period * share)

    thread = threading.Thread(target=duty, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        os.kill(pids[0], signal.SIGCONT)


def test_chat_page_streams_and_stop_aborts(server: Server) -> None:
    server.wait_metrics(idle, tr("an idle server"))
    before = server.metrics()
    drv = _browser()
    try:
        with _slowed(server):
            drv.get(server.url + "/")
            title = drv.title
            assert "mini-sglang" in title, tr("The chat page at / has a mini-sglang title, got {title!r}", title=title)
            text = lambda: drv.execute_script("const a = document.getElementById('answer'); return a ? a.textContent : '';")  # noqa: E731
            status = lambda: drv.find_element("id", "status").text  # noqa: E731
            for field, value in (("max-tokens", str(LONG_TOKENS)), ("temperature", "0")):
                box = drv.find_element("id", field)
                box.clear()
                box.send_keys(value)
            drv.find_element("id", "prompt").send_keys("Tell me a long story.")
            drv.find_element("id", "send").click()
            _until(lambda: len(text()) or drv.find_element("id", "send").is_enabled(), tr("the chat page neither streamed nor finished"))
            first = len(text())
            assert first, tr("no streamed text appeared on the chat page; status: {status}", status=status())
            _until(lambda: len(text()) > first, tr("the answer on the chat page did not grow (not streamed)"))
            m = server.metrics()
            assert m["minisgl_running_requests"] == 1, tr("While the page streams, the request runs in the scheduler")
            drv.find_element("id", "stop").click()
            stopped = _until(lambda: drv.find_element("id", "send").is_enabled() and status(), tr("the page did not stop"))
            after_stop = len(text())
        m = server.wait_metrics(idle, tr("every page and slot back after the stop button"))
        assert m["minisgl_aborted_requests_total"] == before["minisgl_aborted_requests_total"] + 1, tr(
            "The stop button aborts the request: aborted_requests_total must grow by 1, got {before} → {after}",
            before=before["minisgl_aborted_requests_total"], after=m["minisgl_aborted_requests_total"])
        sent = m["minisgl_abort_messages_total"] - before["minisgl_abort_messages_total"]
        assert sent == 1, tr("One disconnect sends exactly one AbortMsg, got {sent}", sent=sent)
        generated = m["minisgl_decode_tokens_total"] - before["minisgl_decode_tokens_total"]
        assert generated < LONG_TOKENS // 2 and 0 < after_stop, tr(
            "Stopped early: far fewer than {n} tokens decoded, got {generated} (status {status!r})", n=LONG_TOKENS, generated=generated, status=stopped)
        errors = [e["message"] for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
        assert not errors, tr("The chat page logged errors in the browser console: {errors}", errors=errors)
    finally:
        drv.quit()
        shutil.rmtree(drv.profile_dir, ignore_errors=True)
