"""数据并行的路由器（给定）：一个 OpenAI 兼容的地址，后面是 N 个各自完整的副本；第 4.6 章的策略决定每个请求去哪个。

``python -m minisgl --dp N`` 起 N 个副本之后在前面开的就是它；副本已经在跑时也可以单独起（SGLang 的
``launch_router`` 那样）：``python -m minisgl.server.dp_router --worker-urls http://127.0.0.1:30001 http://127.0.0.1:30002``。

路由器只做转发，不分词、不改请求：读出请求的文字给策略挑副本，把原样的请求体发过去，把回答原样传回来——流式的
一段段照传。它自己记着每个副本手上有几个请求（在途的：发出去、还没答完），这是最短队列和负载均衡用的“负载”。

- 客户端断开：路由器照第 3.4 章的规矩（同一个 ``until_disconnect``）发觉，关掉发往副本的那条连接，副本看到断开，照同一条
  规矩取消请求——取消落在算它的那个副本上；
- 副本连不上（还没收下请求）：把它移出轮换，请求换一个活着的副本；正在答的请求连接断了：移出轮换，这个请求回
  503（流式的发一段错误），说清是哪个副本；没有活着的副本了：503；
- ``/metrics``：路由器自己的计数（每个副本路由了几个请求、在途几个、活着没有），外加每个活着的副本自己的
  ``/metrics``，每条加上 ``replica`` 标签——预填充算了多少 token、前缀缓存命中多少，按副本分开看。

en: The data-parallel router (given): one OpenAI-compatible address with N whole replicas behind it; chapter 4.6's
policy decides where each request goes.

``python -m minisgl --dp N`` starts N replicas and then serves this in front of them; it can also start alone when the
replicas already run (like SGLang's ``launch_router``): ``python -m minisgl.server.dp_router --worker-urls
http://127.0.0.1:30001 http://127.0.0.1:30002``.

The router only forwards: it does not tokenize and does not change requests. It reads the request's text for the policy
to pick a replica, sends the body unchanged, and passes the answer back unchanged — a stream piece by piece. It counts
itself how many requests each replica has in hand (in flight: sent, not yet answered): the "load" of the shortest queue
and of load balancing.

- a client disconnects: the router notices by chapter 3.4's rule (the same ``until_disconnect``) and closes its
  connection to the replica, the replica sees the disconnect and aborts the request by the same rule — the abort lands
  on the replica computing it;
- a replica cannot be reached (before it took the request): it is taken out of the rotation and the request goes to
  another live replica; the connection of a request being answered breaks: taken out, and that request answers 503 (a
  stream sends an error piece) naming the replica; no live replica left: 503;
- ``/metrics``: the router's own counts (requests routed per replica, in flight, alive or not), plus each live replica's
  own ``/metrics`` with a ``replica`` label on every sample — prefill tokens computed and prefix-cache hits, per replica.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from minisgl.server.access_log import AccessLog, note_failure
from minisgl.server.api_errors import ApiError, add_error_handlers
from minisgl.api_server import until_disconnect
from minisgl.i18n import tr
from minisgl.processes.lifeline import die_with_parent
from minisgl.server.metrics import CONTENT_TYPE
from minisgl.server.openai_body import messages_of, prompts_of
from minisgl.router import Policy, make_policy
from minisgl.server.args import ROUTER_OPTIONS, ROUTER_POLICIES, add_options, policy_thresholds, port_problem
from minisgl.server.standby import Standby

#: 连副本的时限（秒）；答多久不设限（生成可能很长）。
#: en: The time limit (seconds) to connect to a replica; answering has none (a generation may be long).
CONNECT_TIMEOUT_S = 5.0
#: 单独起的路由器等副本就绪的最长时间（秒）。
#: en: The longest a router started alone waits for its replicas to be ready (seconds).
WAIT_REPLICAS_S = 120.0
#: 转发的接口：路径 → 请求的种类（找文字用）。
#: en: The forwarded endpoints: path -> the kind of request (to find its text).
FORWARDED = {"/v1/chat/completions": "chat", "/v1/completions": "completion", "/generate": "completion"}


def request_text(kind: str, body: bytes) -> str:
    """请求里给策略看的文字：对话是每条消息的角色和内容连起来，补全是提示词（token id 的列表写成“id 空格”）。
    请求体不对时是空字符串：照样转发，由副本回那个 400。

    en: The text of a request the policy looks at: for a chat the role and content of each message joined, for a
    completion the prompt (a list of token ids written as "id space"). An invalid body gives the empty string: it is
    forwarded anyway and the replica answers the 400.
    """
    try:
        parsed = json.loads(body)
        if not isinstance(parsed, dict):
            return ""
        if kind == "chat":
            return "".join(f"<{m['role']}>{m['content']}" for m in messages_of(parsed))
        prompt = prompts_of(parsed)[0]
    except (ValueError, ApiError):
        return ""
    return prompt if isinstance(prompt, str) else "".join(f"{t} " for t in prompt)


@dataclass
class Replica:
    """路由器眼里的一个副本：地址、活着没有（死了为什么）、手上几个请求、一共路由过去几个。

    en: One replica as the router sees it: its address, whether it is alive (and why not), the requests in its hand,
    and how many were routed to it in all.
    """

    index: int
    url: str
    alive: bool = True
    why: str = ""
    in_flight: int = 0


class DpRouter:
    """N 个副本和一个策略：挑副本、记在途的请求、把死了的副本移出轮换。

    en: N replicas and a policy: pick a replica, count requests in flight, take dead replicas out of the rotation.
    """

    def __init__(self, urls: list[str], policy: Policy) -> None:
        self.replicas = [Replica(i, url.rstrip("/")) for i, url in enumerate(urls)]
        self.policy = policy
        self.registry = CollectorRegistry()
        self.routed = Counter("minisgl_router_requests_routed", "Requests the router sent to each replica.", ["replica"],
                              registry=self.registry)
        self.failed = Counter("minisgl_router_requests_failed", "Requests that failed because their replica died.",
                              ["replica"], registry=self.registry)
        for r in self.replicas:
            self.routed.labels(str(r.index))
            self.failed.labels(str(r.index))
        self.registry.register(_ReplicaStateCollector(self))
        self.client: httpx.AsyncClient | None = None

    def loads(self) -> dict[int, int]:
        """活着的副本 → 它手上的请求数（策略的输入）。

        en: Live replica -> the requests in its hand (the policy's input).
        """
        return {r.index: r.in_flight for r in self.replicas if r.alive}

    def pick(self, text: str) -> Replica:
        """按策略挑一个活着的副本，并把请求记在它账上；一个也没有时 503。

        en: Pick a live replica by the policy and put the request on its account; 503 when there is none.
        """
        loads = self.loads()
        if not loads:
            raise ApiError(503, self.none_alive())
        replica = self.replicas[self.policy.choose(text, loads)]
        replica.in_flight += 1
        self.routed.labels(str(replica.index)).inc()
        return replica

    def take_out(self, index: int, why: str) -> None:
        """副本 ``index`` 死了：移出轮换（只做一次），让策略忘掉它，打印一行原因。

        en: Replica ``index`` died: take it out of the rotation (once), make the policy forget it, print one line why.
        """
        replica = self.replicas[index]
        if not replica.alive:
            return
        replica.alive, replica.why = False, why
        self.policy.forget(index)
        left = sum(r.alive for r in self.replicas)
        print(tr("Replica {index} ({url}) is out of the rotation: {why}; {left} of {total} replicas left", index=index,
                 url=replica.url, why=why, left=left, total=len(self.replicas)), file=sys.stderr, flush=True)

    def none_alive(self) -> str:
        whys = "; ".join(f"{r.index}: {r.why}" for r in self.replicas)
        return tr("No replica is alive to take the request ({whys})", whys=whys)

    def failure(self, replica: Replica, error: Exception) -> str:
        """在途请求的副本断了：记一笔、移出轮换，返回给客户端的那句话。

        en: The replica of a request in flight broke off: count it, take it out, return the sentence for the client.
        """
        self.failed.labels(str(replica.index)).inc()
        why = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        self.take_out(replica.index, why)
        return tr("Replica {index} ({url}) stopped answering during the request ({why}); it is out of the rotation, "
                  "send the request again", index=replica.index, url=replica.url, why=why)

    async def scrape(self) -> list[Metric]:
        """每个活着的副本的 ``/metrics``，每条样本加上 ``replica`` 标签；同名的合成一族。读不到的副本跳过。

        en: Every live replica's ``/metrics`` with a ``replica`` label on each sample; same-named ones merged into one
        family. A replica that cannot be read is skipped.
        """
        assert self.client is not None
        live = [r for r in self.replicas if r.alive]
        answers = await asyncio.gather(*(self.client.get(f"{r.url}/metrics", timeout=10.0) for r in live),
                                       return_exceptions=True)
        merged: dict[str, Metric] = {}
        for replica, resp in zip(live, answers):
            if not isinstance(resp, httpx.Response) or resp.status_code != 200:
                continue
            for family in text_string_to_metric_families(resp.text):
                into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                for s in family.samples:
                    into.add_sample(s.name, {**s.labels, "replica": str(replica.index)}, s.value)
        return list(merged.values())


class _ReplicaStateCollector(Collector):
    """抓取时读出每个副本活着没有、手上几个请求。

    en: When scraped, reads whether each replica is alive and how many requests it has in hand.
    """

    def __init__(self, router: DpRouter) -> None:
        self.router = router

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("minisgl_router_replica_up", "1 while the replica is in the rotation.", labels=["replica"])
        busy = GaugeMetricFamily("minisgl_router_requests_in_flight", "Requests sent to the replica and not yet answered.",
                                 labels=["replica"])
        for r in self.router.replicas:
            up.add_metric([str(r.index)], float(r.alive))
            busy.add_metric([str(r.index)], float(r.in_flight))
        yield up
        yield busy


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _forward_headers(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type", "accept")}


class _ClosedByForward:
    """路由器在第 3.4 章 ``until_disconnect`` 眼里的 ``state``。客户端断开时它调 ``state.abort(uid)``；路由器取消请求的
    办法是关掉发往副本的连接（副本随之按同一条规矩取消），:func:`forward` 离开时总会关，所以这里无事可做。

    en: The router as the ``state`` of chapter 3.4's ``until_disconnect``. When the client leaves it calls
    ``state.abort(uid)``; the router aborts a request by closing its connection to the replica (which then aborts by the
    same rule), and :func:`forward` always closes it on the way out, so there is nothing to do here.
    """

    async def abort(self, uid: int) -> None:
        return None


async def forward(router: DpRouter, request: Request, path: str) -> Response:
    """把一个请求转给策略挑的副本，原样传回回答（流式就一段段传）。

    en: Forward one request to the replica the policy picks and pass the answer back unchanged (a stream piece by piece).
    """
    assert router.client is not None
    body = await request.body()
    text = request_text(FORWARDED[path], body)
    headers = _forward_headers(request)
    while True:
        replica = router.pick(text)
        try:
            upstream = await router.client.send(
                router.client.build_request("POST", replica.url + path, content=body, headers=headers), stream=True)
            break
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:  # 副本还没收下请求：换一个 | en: the replica never took it: try another
            replica.in_flight -= 1
            router.take_out(replica.index, f"{type(e).__name__}: {e}")
    if not upstream.headers.get("content-type", "").startswith("text/event-stream"):
        try:
            # 那个函数只用到 state.abort | en: that function uses state.abort only
            content = await until_disconnect(request, _ClosedByForward(), replica.index, upstream.aread())  # type: ignore[arg-type]
        except httpx.TransportError as e:
            raise ApiError(503, router.failure(replica, e)) from None
        finally:
            await upstream.aclose()
            replica.in_flight -= 1
        return Response(content, status_code=upstream.status_code,
                        media_type=upstream.headers.get("content-type", "application/json"))

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for piece in upstream.aiter_raw():
                yield piece
        except httpx.TransportError as e:
            error = ApiError(503, router.failure(replica, e))
            note_failure(error.status)  # 状态行早已是 200：访问日志写实际的结果 | en: the status line was 200 long ago: the access log tells what happened
            yield f"data: {json.dumps(error.body(), ensure_ascii=False)}\n\n".encode()
        finally:
            await upstream.aclose()
            replica.in_flight -= 1

    return StreamingResponse(relay(), status_code=upstream.status_code, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def create_router_app(router: DpRouter, *, access_log: bool = True) -> FastAPI:
    """路由器的 FastAPI 应用：三个生成接口转发，``/v1/models``（和 ``/v1/models/{id}``）、聊天页、``/health_generate``
    问一个活着的副本，``/health``、``/metrics``、``/list_workers`` 路由器自己答；``access_log`` 时每个请求一行访问日志
    （:mod:`minisgl.server.access_log`）。

    en: The router's FastAPI application: the three generation endpoints are forwarded, ``/v1/models`` (and
    ``/v1/models/{id}``), the chat page and ``/health_generate`` ask a live replica, ``/health``, ``/metrics`` and
    ``/list_workers`` the router answers itself; with ``access_log``, one access log line per request
    (:mod:`minisgl.server.access_log`).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        router.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S), limits=limits)
        try:
            yield
        finally:
            await router.client.aclose()

    app = FastAPI(title="mini-sglang router", lifespan=lifespan)
    add_error_handlers(app, count=lambda status: None, dead=lambda: None)
    if access_log:
        app.add_middleware(AccessLog)

    for path in FORWARDED:
        async def endpoint(request: Request, path: str = path) -> Response:
            return await forward(router, request, path)

        app.add_api_route(path, endpoint, methods=["POST"])

    async def ask_any(path: str, request: Request) -> Response:
        assert router.client is not None
        for replica in [r for r in router.replicas if r.alive]:
            try:
                resp = await router.client.get(replica.url + path, headers=_forward_headers(request), timeout=10.0)
            except httpx.TransportError as e:
                router.take_out(replica.index, f"{type(e).__name__}: {e}")
                continue
            return Response(resp.content, status_code=resp.status_code, media_type=resp.headers.get("content-type"))
        raise ApiError(503, router.none_alive())

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await ask_any("/v1/models", request)

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Response:
        return await ask_any(f"/v1/models/{quote(model_id)}", request)

    @app.get("/")
    async def page(request: Request) -> Response:
        return await ask_any("/", request)

    @app.get("/health_generate")
    async def health_generate(request: Request) -> Response:
        return await ask_any("/health_generate", request)

    @app.get("/health")
    async def health() -> Response:
        if not router.loads():
            return ApiError(503, router.none_alive()).response()
        return JSONResponse({"status": "ok", "replicas": sum(r.alive for r in router.replicas)})

    @app.get("/list_workers")
    async def list_workers() -> dict[str, Any]:
        return {"urls": [r.url for r in router.replicas], "alive": [r.alive for r in router.replicas],
                "policy": router.policy.name}

    @app.get("/metrics")
    async def metrics() -> Response:
        registry = CollectorRegistry()
        registry.register(_Families(await router.scrape()))
        return Response(generate_latest(router.registry) + generate_latest(registry), media_type=CONTENT_TYPE)

    return app


def wait_until_healthy(urls: list[str], timeout: float = WAIT_REPLICAS_S) -> None:
    """等每个副本的 ``/health`` 回 200（有时限；到点还有没就绪的就抛 RuntimeError，说出是哪几个）。

    en: Wait until every replica's ``/health`` answers 200 (bounded; raise RuntimeError naming the ones not ready in
    time).
    """
    deadline = time.monotonic() + timeout
    waiting = list(urls)
    with httpx.Client(timeout=5.0) as client:
        while waiting:
            for url in list(waiting):
                try:
                    if client.get(f"{url.rstrip('/')}/health").status_code == 200:
                        waiting.remove(url)
                except httpx.TransportError:
                    pass
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(tr("These replicas were not ready within {seconds:.0f} s: {urls}", seconds=timeout,
                                      urls=", ".join(waiting)))
            if waiting:
                time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    """``python -m minisgl.server.dp_router --worker-urls URL ... [--router-policy P] [--port N]``：在已经在跑的副本前面单独起一个
    路由器。

    en: ``python -m minisgl.server.dp_router --worker-urls URL ... [--router-policy P] [--port N]``: start a router alone in front
    of replicas that already run.
    """
    import uvicorn

    die_with_parent()  # 由别的进程起的（检查、示例）：随它而去 | en: started by another process (a check, an example): go down with it
    p = argparse.ArgumentParser(prog="python -m minisgl.server.dp_router", description=tr("A router in front of running replicas"))
    p.add_argument("--worker-urls", nargs="+", required=True, help=tr("the replicas' addresses, e.g. http://127.0.0.1:30001"))
    add_options(p, ["host", "port", "access_log", *ROUTER_OPTIONS], port={"default": 30000, "help": tr("the port (default 30000)")},
                router_policy={"default": ROUTER_POLICIES[0]})
    args = p.parse_args(argv)
    try:
        sock = socket.create_server((args.host, args.port))
    except OSError as e:
        print(tr("Error: {error}", error=port_problem(args.host, args.port, e)), file=sys.stderr, flush=True)
        sys.exit(1)
    standby = Standby(sock)  # 副本就绪之前每个请求都得到 503 "starting" | en: until the replicas are ready every request gets a 503 "starting"
    try:
        wait_until_healthy(args.worker_urls)
    except RuntimeError as e:
        print(tr("Error: {error}", error=e), file=sys.stderr, flush=True)
        sys.exit(1)
    finally:
        standby.stop()
    router = DpRouter(args.worker_urls, make_policy(args.router_policy, len(args.worker_urls), **policy_thresholds(args)))
    print(tr("listening on http://{host}:{port}", host=args.host, port=sock.getsockname()[1]), flush=True)
    config = uvicorn.Config(create_router_app(router, access_log=args.access_log), log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=2)
    uvicorn.Server(config).run(sockets=[sock])

if __name__ == "__main__":
    main()
