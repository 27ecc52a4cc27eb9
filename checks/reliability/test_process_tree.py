"""一次启动的进程树（给定的 ``minisgl.processes.lifeline``、``minisgl.server.standby``、``minisgl.server.launch``、``minisgl.server.replicas``）：

- 每个进程随它的父进程而去，不论父进程怎么死的：每一层用 SIGKILL 杀一次——``--tp 2`` 的启动器（正答着一个流）、
  它的分词进程、另一个节点上空闲的秩、``--dp 2`` 的一个副本、``--dp 2`` 的启动器——就绪时记下的进程一个也不剩，
  端口空出来，该非零的退出码非零；
- ``/health`` 说实话：启动中马上回 503 ``{"status": "starting"}``（不挂着），工作进程死了回 503（空闲时死的也在几秒内
  发现）；``/health_generate`` 走完整条路；
- 流到一半工作进程死了：访问日志写 503 和已经发出的 token 数，而不是 ``200 completion_tokens=0``；
- 脚本没有 ``if __name__ == "__main__":`` 就 ``LLM(path, tp_size=2)``：一句说清怎么改的错误。

服务器起得尽量少（每次启动要好几秒，杀一次就毁掉一个）：能共用的都共用，全用小模型。

en: The process tree of a launch (the given ``minisgl.processes.lifeline``, ``minisgl.server.standby``, ``minisgl.server.launch``,
``minisgl.server.replicas``):

- every process goes down with its parent however the parent died: each level is SIGKILLed once — the launcher of a
  ``--tp 2`` server (while it streams an answer), its tokenizer, an idle rank on another node, one ``--dp 2`` replica,
  the ``--dp 2`` launcher — and none of the processes noted at readiness is left, the port is free, and exit codes are
  non-zero where something died;
- ``/health`` tells the truth: 503 ``{"status": "starting"}`` at once while starting (no hanging), 503 once a worker
  died (one that died while idle is found within seconds too); ``/health_generate`` goes through the whole path;
- a worker dying in the middle of a stream: the access log says 503 and the tokens sent, not ``200
  completion_tokens=0``;
- ``LLM(path, tp_size=2)`` in a script without ``if __name__ == "__main__":``: one error that says how to fix it.

Few server starts (each costs seconds, and a kill ruins one): shared where possible, the tiny model throughout.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from checks.stage3.conftest import START_TIMEOUT_S, TINY_SERVER_ARGS, Server, read_events, send_request, start_server
from minisgl.course import select
from minisgl.processes.harness import alive, child_pids, per_replica, process_name
from minisgl.i18n import tr
from minisgl.processes.ranks import free_port
from minisgl.server.standby import Standby

#: 父进程死后，它的子孙最多还能活几秒（说好的是“几秒内”）。
#: en: How many seconds the descendants may outlive their parent (the promise is "within seconds").
GONE_WITHIN_S = 10.0
#: 工作进程死后多久之内 ``/health`` 要变成 503（秒）。
#: en: Within how many seconds of a worker's death ``/health`` must answer 503.
NOTICED_WITHIN_S = 10.0
#: 工作进程死后，服务器自己以非零状态退出的上限（秒）：发现、再回几秒 503、收尾。
#: en: The bound (seconds) for the server to exit non-zero by itself after a worker died: noticing, a few more seconds of
#: en: 503, winding down.
EXIT_WITHIN_S = 30.0
#: 长长的流：杀进程时它还在答。
#: en: A long stream: still answering when the kill comes.
LONG_STREAM = {"prompt": "Count slowly: one two three", "max_tokens": 400, "ignore_eos": True, "stream": True}


def running(pids: list[int]) -> list[int]:
    """``pids`` 里还在跑的（僵尸算已经退出）。

    en: Those of ``pids`` still running (a zombie counts as exited).
    """
    return [p for p in pids if alive(p)]


def wait_gone(pids: list[int], seconds: float = GONE_WITHIN_S) -> list[int]:
    """等 ``pids`` 全部退出，至多 ``seconds`` 秒；返回还在跑的（带着名字，好写进失败消息）。

    en: Wait for all of ``pids`` to exit, at most ``seconds``; return those still running (with names, for the failure
    message).
    """
    deadline = time.monotonic() + seconds
    while running(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return running(pids)


def named(pids: list[int]) -> list[str]:
    return [f"{p} {process_name(p)}" for p in pids]


def port_free(url: str) -> bool:
    """一个新的服务器能在 ``url`` 的端口上监听（和启动器一样用 SO_REUSEADDR：TIME_WAIT 里的旧连接不算占着）。

    en: A new server can listen on the port of ``url`` (with SO_REUSEADDR, as the launcher does: old connections in
    TIME_WAIT do not count as taking it).
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", int(url.rsplit(":", 1)[1])))
            s.listen(1)
        except OSError:
            return False
    return True


def get(url: str, timeout: float = 10.0) -> tuple[int | None, str]:
    """GET，返回 (状态码, 正文)；连不上是 (None, 原因)。

    en: GET and return (status, body); (None, why) when it cannot connect.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, repr(e)


def one_named(pids: list[int], name: str) -> int:
    found = [p for p in pids if process_name(p) == name]
    assert len(found) == 1, tr("Expected one {name} process among {pids}", name=name, pids=named(pids))
    return found[0]


def until_503(server: Server, seconds: float = NOTICED_WITHIN_S) -> tuple[int | None, str]:
    """反复问 ``/health``，直到 503 或者 ``seconds`` 秒过去；返回最后的回答。

    en: Ask ``/health`` again and again until it answers 503 or ``seconds`` pass; return the last answer.
    """
    deadline = time.monotonic() + seconds
    while True:
        status, body = get(server.url + "/health", timeout=5)
        if status == 503 or time.monotonic() > deadline:
            return status, body
        time.sleep(0.1)


def expect_down(server: Server, noted: list[int], what: str) -> None:
    """服务器已经退出：就绪时记下的进程一个不剩，端口空出来。

    en: The server has exited: none of the processes noted at readiness is left, and the port is free.
    """
    left = wait_gone(noted)
    assert not left, tr("{what}: processes left behind after {seconds:g} s: {pids}; output:\n{output}", what=what,
                        seconds=GONE_WITHIN_S, pids=named(left), output=server.output)
    assert port_free(server.url), tr("{what}: the port of {url} is still taken", what=what, url=server.url)


def exit_code(proc: subprocess.Popen[str] | None, seconds: float, what: str) -> int:
    assert proc is not None
    try:
        return proc.wait(seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(tr("{what}: the launcher did not exit within {seconds:g} s", what=what, seconds=seconds), pytrace=False)


# ----------------------------------------------------------------------------- 启动期间的 503 | en: the 503 while starting


def test_standby_answers_every_request_then_hands_over() -> None:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        standby = Standby(sock)
        try:
            status, body = get(url + "/health", timeout=5)
            req = urllib.request.Request(url + "/v1/completions", data=json.dumps({"prompt": "x" * 100_000}).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=5)
                posted: int | str = 200
            except urllib.error.HTTPError as e:
                posted = e.code
            except OSError as e:
                posted = repr(e)
        finally:
            standby.stop()
        assert status == 503 and json.loads(body)["status"] == "starting", tr(
            "While starting, /health answers 503 {{\"status\": \"starting\"}} at once, got {status}: {body}", status=status,
            body=body)
        assert posted == 503, tr("While starting, a POST with a body gets the 503 too (not a reset), got {got}", got=posted)
        # 交接：停下之后的连接留给下一个接收的人 | en: the handover: connections after the stop wait for the next acceptor
        client = threading.Thread(target=get, args=(url + "/health", 5), daemon=True)
        client.start()
        sock.settimeout(5)
        conn, _ = sock.accept()
        conn.close()
        client.join()


# ----------------------------------------------------------------------------- --tp 2：启动器 | en: --tp 2: the launcher


@pytest.fixture(scope="module")
def tp_server(tiny_path: str) -> Iterator[tuple[Server, list[tuple[int | None, str]]]]:
    """``--tp 2`` 的服务器，端口事先向系统要好：从启动那一刻起就问 ``/health``，记下就绪之前的每个回答。

    en: A ``--tp 2`` server on a port asked from the OS beforehand: ``/health`` is asked from the moment it starts, and
    every answer before readiness is noted.
    """
    url = f"http://127.0.0.1:{free_port()}"
    server = Server(tiny_path, *TINY_SERVER_ARGS, "--tp", "2", "--port", url.rsplit(":", 1)[1], env=select.impl_env(),
                    timeout=START_TIMEOUT_S)
    server.spawn()
    answers = []
    deadline = time.monotonic() + START_TIMEOUT_S
    while server.proc is not None and server.proc.poll() is None and time.monotonic() < deadline:
        status, body = get(url + "/health", timeout=5)
        if status == 200:
            break
        if status is not None or "timed out" in body:
            answers.append((status, body))
        time.sleep(0.1)
    try:
        server.wait_ready()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    yield server, answers
    server.kill()


def test_health_says_starting_while_loading(tp_server: tuple[Server, list[tuple[int | None, str]]]) -> None:
    _, answers = tp_server
    assert answers, tr("The port listens seconds before the workers are ready: /health must answer then")
    wrong = [(s, b) for s, b in answers if s != 503 or json.loads(b).get("status") != "starting"]
    assert not wrong, tr("Until ready, /health answers 503 {{\"status\": \"starting\"}} at once; also got {wrong}",
                         wrong=wrong[:3])


def test_health_generate_runs_one_token(tp_server: tuple[Server, list[tuple[int | None, str]]]) -> None:
    server, _ = tp_server
    status, body = server.get("/health_generate", timeout=60)
    assert status == 200, tr("/health_generate answers 200 while the server works, got {status}: {body}", status=status,
                             body=body)


def test_sigkilled_launcher_takes_its_tree_down(tp_server: tuple[Server, list[tuple[int | None, str]]]) -> None:
    server, _ = tp_server
    assert server.proc is not None
    noted = list(server.children)
    for name in ("msgl-tokenizer", "msgl-scheduler", "msgl-sched-r1"):
        one_named(noted, name)
    conn = send_request(server, "/v1/completions", LONG_STREAM)
    got = read_events(conn.getresponse(), 2)
    assert len(got) == 2, tr("The stream ended early: {events}", events=got)
    os.kill(server.proc.pid, signal.SIGKILL)
    code = exit_code(server.proc, GONE_WITHIN_S, tr("SIGKILL of the launcher"))
    conn.close()
    assert code == -signal.SIGKILL, tr("The launcher was SIGKILLed, got exit code {code}", code=code)
    expect_down(server, noted, tr("SIGKILL of the --tp 2 launcher while it streamed"))


# ----------------------------------------------------------------------------- --tp 2：分词进程 | en: --tp 2: the tokenizer


def test_sigkilled_tokenizer_gives_503_and_a_nonzero_exit(tiny_path: str) -> None:
    server = start_server("--tp", "2")
    try:
        noted = list(server.children)
        conn = send_request(server, "/v1/completions", LONG_STREAM)
        resp = conn.getresponse()
        got = read_events(resp, 3)
        assert len(got) == 3, tr("The stream ended early: {events}", events=got)
        os.kill(one_named(noted, "msgl-tokenizer"), signal.SIGKILL)
        rest = read_events(resp, 10_000)  # 读到流的结尾 | en: read to the end of the stream
        conn.close()
        assert any('"error"' in event for event in rest), tr(
            "The open stream ends with an error event once the tokenizer died, got the last events {events}", events=rest[-3:])
        status, body = until_503(server)
        assert status == 503, tr("After the tokenizer died, /health answers 503, got {status}: {body}", status=status,
                                 body=body)
        status, body = server.get("/health_generate", timeout=30)
        assert status == 503, tr("After the tokenizer died, /health_generate answers 503, got {status}: {body}",
                                 status=status, body=body)
        code = exit_code(server.proc, EXIT_WITHIN_S, tr("SIGKILL of the tokenizer"))
        assert code != 0, tr("After the tokenizer died the launcher exits non-zero, got {code}", code=code)
        expect_down(server, noted, tr("SIGKILL of the tokenizer"))
        logged = re.search(r"POST /v1/completions (\d+) prompt_tokens=\d+ completion_tokens=(\d+)", "".join(server.lines))
        assert logged is not None and logged.group(1) == "503" and int(logged.group(2)) >= 3, tr(
            "The stream that died half-way is logged with 503 and the tokens sent (3 or more), got {line}",
            line=logged.group(0) if logged else None)
    finally:
        server.kill()


# ----------------------------------------------------------------------------- 两个节点：空闲的秩 | en: two nodes: an idle rank


def test_a_rank_dead_on_another_node_is_noticed_while_idle(tiny_path: str) -> None:
    flags = ["--tp", "2", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{free_port()}"]
    node1 = Server(tiny_path, *TINY_SERVER_ARGS, *flags, "--node-rank", "1", env=select.impl_env(), timeout=START_TIMEOUT_S)
    node1.spawn()  # 它不开 HTTP，也就没有地址可等 | en: it serves no HTTP, so there is no address to wait for
    server = None
    try:
        server = start_server(*flags, "--node-rank", "0")
        assert node1.proc is not None
        node1_procs = child_pids(node1.proc.pid)
        os.kill(one_named(node1_procs, "msgl-sched-r1"), signal.SIGKILL)
        status, body = until_503(server)  # 不发任何请求 | en: no request is sent
        assert status == 503, tr("A rank that died on another node while idle makes /health answer 503 within {seconds:g} s, "
                                 "got {status}: {body}", seconds=NOTICED_WITHIN_S, status=status, body=body)
        codes = (exit_code(server.proc, EXIT_WITHIN_S, tr("node 0")), exit_code(node1.proc, EXIT_WITHIN_S, tr("node 1")))
        assert 0 not in codes, tr("After a rank died both launches exit non-zero, got {codes}", codes=codes)
        expect_down(server, [*server.children, *node1_procs], tr("an idle rank killed on node 1"))
    finally:
        node1.kill()
        if server is not None:
            server.kill()


# ----------------------------------------------------------------------------- --dp 2 | en: --dp 2


@pytest.fixture(scope="module")
def dp_server(tiny_path: str) -> Iterator[Server]:
    server = start_server("--dp", "2")
    yield server
    server.kill()


def test_a_killed_replica_takes_its_children_and_the_router_serves_on(dp_server: Server) -> None:
    replicas = [p for p in dp_server.children if process_name(p) == "msgl-api-server"]
    assert len(replicas) == 2, tr("Expected two replica processes under the --dp 2 server, found {pids}",
                                  pids=named(dp_server.children))
    tree = child_pids(replicas[0])
    os.kill(replicas[0], signal.SIGKILL)
    left = wait_gone(tree)
    assert not left, tr("The children of a SIGKILLed replica must exit within {seconds:g} s, left {pids}",
                        seconds=GONE_WITHIN_S, pids=named(left))
    deadline = time.monotonic() + NOTICED_WITHIN_S
    while sorted((up := per_replica(dp_server.metrics(), "minisgl_router_replica_up")).values()) != [0.0, 1.0]:
        assert time.monotonic() < deadline, tr("/metrics should mark the killed replica down, got {up}", up=up)
        time.sleep(0.1)
    status, data = dp_server.post("/v1/completions", {"prompt": "Still there?", "max_tokens": 2})
    assert status == 200, tr("The router serves on with one replica, got {status}: {data}", status=status, data=data)
    assert dp_server.get("/health")[0] == 200, tr("/health should stay 200 while one replica is alive")


def test_a_killed_dp_launcher_takes_every_replica_down(dp_server: Server) -> None:
    assert dp_server.proc is not None
    noted = list(dp_server.children)
    urls = json.loads(dp_server.get("/list_workers")[1])["urls"]
    os.kill(dp_server.proc.pid, signal.SIGKILL)
    code = exit_code(dp_server.proc, GONE_WITHIN_S, tr("SIGKILL of the --dp 2 launcher"))
    assert code == -signal.SIGKILL, tr("The launcher was SIGKILLed, got exit code {code}", code=code)
    expect_down(dp_server, noted, tr("SIGKILL of the --dp 2 launcher"))
    taken = [url for url in urls if not port_free(url)]
    assert not taken, tr("The replicas' ports are still taken: {urls}", urls=taken)


# ----------------------------------------------------------------------------- 没有守卫的脚本 | en: a script without the guard


def test_llm_tp_in_a_script_without_the_main_guard_says_so(tiny_path: str, tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(f"from minisgl.llm import LLM\n\nllm = LLM({tiny_path!r}, tp_size=2)\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, cwd=tmp_path,
                          env={**os.environ, **select.impl_env(), "PYTHONPATH": str(Path(__file__).parents[2])})
    err = proc.stderr
    assert proc.returncode != 0 and err.count('if __name__ == "__main__":') == 1 and "bootstrapping" not in err, tr(
        "LLM(path, tp_size=2) without the main guard must fail once, naming if __name__ == \"__main__\": (and no "
        "bootstrapping error from the ranks); exit code {code}, stderr:\n{stderr}", code=proc.returncode, stderr=err)
