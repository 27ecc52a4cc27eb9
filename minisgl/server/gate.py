"""API 服务器最外层的 ASGI 中间件（第 3.4 章用它，给定）：在请求进到任何接口之前，挡住不该进来的。

en: The API server's outermost ASGI middleware (chapter 3.4 uses it; given): it turns away what must not come in before
a request reaches any endpoint.
"""

from __future__ import annotations

import hmac
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from minisgl.server.api_errors import ApiError
from minisgl.i18n import tr

#: 不算作“正在处理”的 HTTP 请求的路径（监控自己的抓取不该改变它看到的数）。
#: en: Paths not counted as HTTP requests in flight (a monitor's own scrape must not change what it sees).
UNCOUNTED = ("/metrics", "/health")


class Gate:
    """工作进程死了就回 503（``/metrics`` 除外）；设了 ``--api-key`` 就检查 ``/v1/*`` 和 ``/generate`` 的
    ``Authorization: Bearer <key>``（错了或没给都是 401）；数正在处理的 HTTP 请求。``state`` 是第 3.4 章的
    ``ServerState``（用到它的 ``dead``、``args.api_key`` 和 ``metrics``）。

    en: A 503 once a worker died (except ``/metrics``); with ``--api-key``, check ``Authorization: Bearer <key>`` on
    ``/v1/*`` and ``/generate`` (wrong or missing: 401); count the HTTP requests in flight. ``state`` is chapter 3.4's
    ``ServerState`` (its ``dead``, ``args.api_key`` and ``metrics`` are used).
    """

    def __init__(self, app: ASGIApp, state: Any) -> None:
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
        if err is not None:
            self.state.metrics.error(err.status)
            await err.response()(scope, receive, send)
        elif scope["type"] == "http" and scope.get("path") not in UNCOUNTED:
            with self.state.metrics.in_flight.track_inprogress():
                await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, send)
