"""第 3 阶段检查共用的工具：在子进程里起一个真的服务器（``python -m minisgl``），等它就绪，用完让它退出，
并证明没有留下任何子进程。

服务器进程只看得见环境变量，看不见 pytest 插件在本进程里换上的那套实现，所以启动时总带上
``select.impl_env()``：``--impl skeleton --expect-red`` 时，服务器里跑的真是骨架。
这里不导入任何章节模块（``minisgl.api_server`` 等）。

en: Shared tools of the stage 3 checks: start a real server (``python -m minisgl``) in a child process, wait until it
is ready, make it exit afterwards, and prove that no child process is left behind.

The server process sees only the environment, not the implementations the pytest plugin switched in inside this
process, so it is always started with ``select.impl_env()``: under ``--impl skeleton --expect-red`` the server really
runs the skeleton. No chapter module (``minisgl.api_server`` and so on) is imported here.
"""

from __future__ import annotations

import http.client
import json
import signal
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Iterator

import pytest

from minisgl import model_zoo
from minisgl.course import select
from minisgl.processes.harness import ServerProcess, child_pids as descendants
from minisgl.i18n import tr

#: 检查里的小服务器：fp32（和 HF 逐 token 比）、不用前缀缓存（空闲时页面正好全部归还，好数）。
#: en: The small server of the checks: fp32 (compared with HF token by token), no prefix cache (when idle, every page is
#: en: back, easy to count).
TINY_SERVER_ARGS = ["--dtype", "float32", "--num-pages", "4096", "--max-seq-len", "1024", "--cache-type", "naive",
                    "--max-running-req", "16"]
#: 等服务器打印出地址、/health 回 200 的最长时间（秒）；两个核上要加载 torch 三次。
#: en: The longest wait (seconds) for the server to print its address and for /health to answer 200; on two cores torch
#: en: is loaded three times.
START_TIMEOUT_S = 180.0
#: 发出信号之后，等服务器和它所有的子进程退出的最长时间（秒）。
#: en: The longest wait (seconds) after the signal for the server and all its children to exit.
STOP_TIMEOUT_S = 40.0


def built(getter: Callable[[], Any]) -> str:
    """模型目录；没建好就直接失败并提示 ``make setup``（不跳过）。

    en: The model folder; if it is not built, fail at once and say ``make setup`` (never skip).
    """
    try:
        return str(getter())
    except FileNotFoundError as e:
        message = str(e)
    pytest.fail(message, pytrace=False)


def tiny_model() -> str:
    return built(model_zoo.tiny_qwen3)


@pytest.fixture(scope="session")
def tiny_path() -> str:
    return tiny_model()


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    return built(model_zoo.smollm2)


# ----------------------------------------------------------------------------- 服务器
# en: ----------------------------------------------------------------------------- the server


class Server(ServerProcess):
    """一个在子进程里运行的 ``python -m minisgl``（启动、关闭和“没有留下进程”见 ``minisgl.processes.harness.ServerProcess``），
    加上检查用的几个 HTTP 小工具。

    en: One ``python -m minisgl`` running in a child process (starting, stopping and "no process left" are
    ``minisgl.processes.harness.ServerProcess``'s), plus a few HTTP helpers for the checks.
    """

    stopped: bool = False

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, str]:
        """GET ``path``，返回 (状态码, 正文)。

        en: GET ``path`` and return (status, body).
        """
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path: str, body: Any, timeout: float = 60.0, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """POST JSON（``body`` 是 bytes 就原样发），返回 (状态码, 解析后的 JSON 或原文)。

        en: POST JSON (``body`` as bytes is sent as it is) and return (status, the parsed JSON or the raw text).
        """
        return self.call("POST", path, body, timeout, headers)

    def call(self, method: str, path: str, body: Any = None, timeout: float = 60.0,
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """任意方法的请求（``body`` 是 bytes 就原样发，None 就不带正文，否则编成 JSON），返回 (状态码, 解析后的 JSON 或原文)。

        en: A request of any method (``body`` as bytes goes as it is, None sends no body, anything else goes as JSON);
        returns (status, the parsed JSON or the raw text).
        """
        data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, text = resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        except TimeoutError:  # 卡住了：带上服务器的输出失败，别只留一个 socket 的超时 | en: stuck: fail with the server's output, not a bare socket timeout
            pytest.fail(tr("{method} {path} got no answer within {timeout:.0f} s; the server's output:\n{output}",
                           method=method, path=path, timeout=timeout, output=self.output), pytrace=False)
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def wait_metrics(self, ok: Callable[[dict[str, float]], bool], what: str, timeout: float = 20.0) -> dict[str, float]:
        """反复读 ``/metrics``，直到 ``ok(指标)``；到时还不满足就失败，说明等的是什么、最后看到了什么。

        en: Read ``/metrics`` again and again until ``ok(metrics)``; fail at the deadline, saying what was awaited and
        what was seen last.
        """
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if ok(m):
                return m
            if time.monotonic() > deadline:
                shown = {k: v for k, v in m.items() if "bucket" not in k}
                pytest.fail(tr("Waited {timeout:.0f} s for /metrics to show {what}; last seen: {metrics}",
                               timeout=timeout, what=what, metrics=shown), pytrace=False)
            time.sleep(0.05)


def send_request(server: Server, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> http.client.HTTPConnection:
    """发出一个 POST 就返回连接，不等回答（之后 ``getresponse()`` 读一部分、或直接 ``close()`` = 客户端断开）。

    en: Send a POST and return the connection without waiting for the answer (later ``getresponse()`` and read part of
    it, or just ``close()`` = the client disconnects).
    """
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
    return conn


def read_events(resp: http.client.HTTPResponse, n: int) -> list[str]:
    """从流式回答里读 ``n`` 个 ``data:`` 事件（读到结尾就少于 ``n`` 个）。

    en: Read ``n`` ``data:`` events from a streamed answer (fewer if the answer ends first).
    """
    out: list[str] = []
    while len(out) < n and (line := resp.readline()):
        if line.startswith(b"data: "):
            out.append(line[len(b"data: "):].decode().rstrip("\n"))
    return out


def idle(m: dict[str, float]) -> bool:
    """空闲：调度器没有请求、页面全部空闲（检查服务器不用前缀缓存）、API 服务器没有在等的请求、也没有还没返回的处理函数。

    en: Idle: no request in the scheduler, every page free (the checks' server has no prefix cache), no request the API
    server waits on, and no handler that has not returned.
    """
    return (m["minisgl_running_requests"] == 0 and m["minisgl_waiting_requests"] == 0 and m["minisgl_kv_pages_used"] == 0
            and m["minisgl_active_requests"] == 0 and m["minisgl_http_requests_in_flight"] == 0)


def start_server(*args: str, env: dict[str, str] | None = None) -> Server:
    """启动 ``python -m minisgl --model <小模型> --port 0 ...``（带上 ``select.impl_env()``），等到就绪；起不来就失败。

    en: Start ``python -m minisgl --model <tiny model> --port 0 ...`` (with ``select.impl_env()``) and wait until it is
    ready; fail if it does not come up.
    """
    server = Server(tiny_model(), *TINY_SERVER_ARGS, *args, env={**select.impl_env(), **(env or {})},
                    timeout=START_TIMEOUT_S)
    try:
        server.start()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    return server


def stop_server(server: Server, sig: int = signal.SIGINT) -> int:
    """发信号让服务器退出，等它和它所有的子孙进程都退出（有截止时间），返回退出码；有进程留下就失败。

    en: Signal the server to exit, wait (with a deadline) until it and all its descendants have exited, and return the
    exit status; fail if any process is left.
    """
    code = server.stop(sig, timeout=STOP_TIMEOUT_S)
    server.stopped = True
    if server.left_behind:
        server.kill()
        pytest.fail(tr("Processes left behind after the server exited: {pids}", pids=server.left_behind), pytrace=False)
    assert code is not None
    return code


@pytest.fixture(scope="module")
def serve() -> Iterator[Callable[..., Server]]:
    """启动服务器的工厂（模块内共用）：``serve(*额外参数, stop_with=信号)``。模块结束时还开着的用 ``stop_with``
    （缺省 SIGINT）关掉：退出码必须是 0，也不能留下进程。

    en: A factory that starts servers (shared within a module): ``serve(*extra_args, stop_with=signal)``. Those still
    running at the end of the module are stopped with ``stop_with`` (SIGINT by default): the exit status must be 0 and no
    process may be left behind.
    """
    started: list[tuple[Server, int]] = []

    def factory(*args: str, env: dict[str, str] | None = None, stop_with: int = signal.SIGINT) -> Server:
        server = start_server(*args, env=env)
        started.append((server, stop_with))
        return server

    yield factory
    for server, sig in started:
        if not server.stopped:
            code = stop_server(server, sig)
            assert code == 0, tr("After {sig} the server exits with 0, got {code}; its output:\n{output}",
                                 sig=signal.Signals(sig).name, code=code, output=server.output)
