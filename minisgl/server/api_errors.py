"""API 服务器的错误：OpenAI 的错误体，以及把每种异常变成这样一个回答的处理器（第 3.4 章用它们，给定）。

客户端只需认一种错误的样子：``{"error": {"message", "type", "param", "code"}}``——参数不对、路径不存在、方法不对、
API 密钥错了、工作进程死了，都是它。

en: The API server's errors: OpenAI's error body, and the handlers that turn each exception into such an answer
(chapter 3.4 uses them; given).

A client knows one shape of error only: ``{"error": {"message", "type", "param", "code"}}`` — a bad parameter, an unknown
path, a wrong method, a wrong API key, a dead worker all answer with it.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from minisgl.i18n import tr


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

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


#: 框架自己回的错误（路径、方法不对等）→ OpenAI 错误体的 ``code``：路径不存在 ``not_found``、方法不对
#: ``method_not_allowed``、请求体不合要求 ``invalid_request``；其余的 4xx 也是 ``invalid_request``。
#: en: Errors the framework answers itself (wrong path, wrong method, ...) → the ``code`` of the OpenAI error body: an
#: en: unknown path ``not_found``, a wrong method ``method_not_allowed``, a body that does not fit ``invalid_request``;
#: en: any other 4xx is ``invalid_request`` too.
HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 422: "invalid_request"}


def http_code(status: int) -> str:
    """框架回的状态码 → ``code``（:data:`HTTP_CODES`；别的 4xx 是 ``invalid_request``，5xx 是 ``internal_error``）。

    en: A status the framework answers → its ``code`` (:data:`HTTP_CODES`; any other 4xx is ``invalid_request``, a 5xx
    ``internal_error``).
    """
    return HTTP_CODES.get(status, "invalid_request" if status < 500 else "internal_error")


#: 等回答的时候，每隔多久（秒）看一眼客户端还在不在：第 3.4 章的 ``until_disconnect`` 和第 4.6 章的路由器同守这一条规矩。
#: en: While an answer is awaited, how often (seconds) to check that the client is still there: chapter 3.4's
#: en: ``until_disconnect`` and chapter 4.6's router keep this one rule.
DISCONNECT_POLL_S = 0.05


class ClientGone(Exception):
    """客户端在回答写完之前断开了。

    en: The client disconnected before the answer was complete.
    """


def add_error_handlers(app: FastAPI, count: Callable[[int], None], dead: Callable[[], str | None]) -> None:
    """让 ``app`` 的每个错误都以 OpenAI 的样子回答，并用 ``count(状态码)`` 记下来；``dead()`` 不是 None 时（某个工作进程
    死了），回复里带来的错误其实是它，回 503。客户端断开（:class:`ClientGone`）只回一个没人会读到的 499。

    en: Make every error of ``app`` answer the OpenAI way and note it with ``count(status)``; while ``dead()`` is not
    None (a worker died), an error carried by a reply is really that, and answers 503. A client that left
    (:class:`ClientGone`) gets a 499 nobody will read.

    ``code`` of the errors answered here: see :func:`http_code` (404 ``not_found``, 405 ``method_not_allowed``, 422
    ``invalid_request``) and ``internal_error`` for an unexpected exception (500).
    """

    def answer(err: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
        count(err.status)
        response = err.response()
        response.headers.update(headers or {})
        return response

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, err: ApiError) -> JSONResponse:
        why = dead()
        return answer(ApiError(503, why) if why is not None and err.status == 400 else err)

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, err: HTTPException) -> JSONResponse:
        # 路径不存在（404）、方法不对（405）：也回 OpenAI 的错误体
        # en: an unknown path (404) or a wrong method (405) gets OpenAI's error body too
        why = tr("{method} {path}: {detail}", method=request.method, path=request.url.path, detail=err.detail)
        return answer(ApiError(err.status_code, why, type="invalid_request_error", code=http_code(err.status_code)),
                      err.headers)

    @app.exception_handler(RequestValidationError)
    async def on_invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
        # 接口声明的参数对不上（422）：同样是 OpenAI 的错误体
        # en: the endpoint's declared parameters do not fit (422): OpenAI's error body as well
        why = tr("{method} {path}: {detail}", method=request.method, path=request.url.path, detail=err.errors())
        return answer(ApiError(422, why, type="invalid_request_error", code="invalid_request"))

    @app.exception_handler(ClientGone)
    async def on_client_gone(request: Request, err: ClientGone) -> Response:
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def on_error(request: Request, err: Exception) -> JSONResponse:
        return answer(ApiError(500, f"{type(err).__name__}: {err}", code="internal_error"))
