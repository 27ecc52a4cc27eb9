"""API 服务器里不属于第 3.4 章主题的那部分应用（给定）：生命周期、API 密钥和 503 的门、访问日志、错误体、
``/v1/models``、``/health``、``/metrics``、对话页面，以及 ``/health_generate`` 的探针。章节在 :func:`base_app` 上加
用学员的函数作答的接口。

en: The part of the API server's application that is not chapter 3.4's subject (given): the lifespan, the gate for the
API key and the 503, the access log, error bodies, ``/v1/models``, ``/health``, ``/metrics``, the chat page, and the
probe of ``/health_generate``. The chapter adds the endpoints answered by the learner's functions onto
:func:`base_app`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse, Response

from minisgl.server.access_log import AccessLog
from minisgl.server.api_errors import ApiError, add_error_handlers
from minisgl.server.chat_page import chat_page
from minisgl.server.choices import Server
from minisgl.server.frontend import Frontend
from minisgl.server.gate import Gate
from minisgl.i18n import tr
from minisgl.message import UserReply
from minisgl.server.metrics import CONTENT_TYPE
from minisgl.server.openai_body import check_model

#: ``/health_generate`` 等那一个 token 的最长时间（秒；SGLang 也是 20）。
#: en: The longest ``/health_generate`` waits for its one token (seconds; SGLang's is 20 too).
HEALTH_GENERATE_TIMEOUT_S = 20.0
#: ``/health_generate`` 的请求体：一个 token 的贪心生成。
#: en: The request body of ``/health_generate``: a one-token greedy generation.
PROBE_BODY = {"prompt": "ping", "max_tokens": 1, "temperature": 0}
#: 服务器启动的时刻（``/v1/models`` 的 ``created``）。
#: en: When the server started (``created`` in ``/v1/models``).
STARTED = time.time()


def base_app(state: Frontend) -> FastAPI:
    """FastAPI 应用的底子：``state`` 随应用启停，API 密钥、错误体、工作进程死掉后的 503、访问日志
    （``--no-access-log`` 关掉），``/v1/models``、``/health``、``/metrics`` 和对话页面 ``/``。

    en: The base of the FastAPI application: ``state`` starts and stops with the app; the API key, error bodies, the 503
    after a worker died, the access log (``--no-access-log`` turns it off), ``/v1/models``, ``/health``, ``/metrics``
    and the chat page ``/``.
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

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/")
    async def page() -> HTMLResponse:
        return HTMLResponse(chat_page(state.model_name))

    return app


async def generation_probe(state: Server, req: Any,
                           full_response: Callable[[Any, int, AsyncIterator[UserReply]], Awaitable[Any]]) -> Response:
    """``/health_generate``（SGLang 的名字）：一个 token 的贪心生成走完整条路——分词进程、调度器的每个秩、反分词进程。
    ``/health`` 只说进程都活着，这个还说它们真的能一起干活。提交 ``req``（:data:`PROBE_BODY` 解析成的请求），用学员的
    ``full_response`` 收它的回答（给定模块不导入章节，由参数传进来）：:data:`HEALTH_GENERATE_TIMEOUT_S` 秒内答完是 200，
    否则 503（没答完的请求取消掉）。

    en: ``/health_generate`` (SGLang's name): a one-token greedy generation through the whole path — the tokenizer, every
    scheduler rank, the detokenizer. ``/health`` only says the processes are alive; this says they really work together.
    Submit ``req`` (the request parsed from :data:`PROBE_BODY`) and collect its answer with the learner's
    ``full_response`` (given modules do not import chapters: it comes in as a parameter): answered within
    :data:`HEALTH_GENERATE_TIMEOUT_S` seconds it is a 200, otherwise a 503 (the unfinished request is aborted).
    """
    uid, queue = await state.submit(req)
    try:
        await asyncio.wait_for(full_response(req, uid, state.replies(queue)), HEALTH_GENERATE_TIMEOUT_S)
    except (ApiError, asyncio.TimeoutError) as err:
        await state.abort(uid)
        why = str(err) or tr("no token within {seconds:.0f} s", seconds=HEALTH_GENERATE_TIMEOUT_S)
        raise ApiError(503, tr("A one-token generation did not come through: {why}", why=why)) from None
    return JSONResponse({"status": "ok"})
