"""多节点启动的集合点（给定的 ``minisgl.server.launch``、``minisgl.server.args`` 与第 4.1 章的集合点）：会合不了时清楚、很快地失败。

- 节点 1 指向一个没人监听的端口、节点 0 等一个永远不来的节点：过了 ``--dist-timeout`` 就以非零状态退出，说出地址，
  不打印 C++ 调用栈；等之前先说一句在哪儿等；
- 在集合点上按 Ctrl-C（SIGINT 发给整个进程组，像终端那样）：几秒内退出，没有 C++ 调用栈，不留下进程；
- IPv6 的 ``--dist-init-addr`` 在解析时就拒绝；``--dp 2 --nnodes 2`` 的错误说的是 ``--dp`` 的规则；
- ``--dist-timeout`` 的缺省值与第 4.1 章的 ``RENDEZVOUS_TIMEOUT_S`` 相同，也转给 ``--dp`` 的副本。

端口都向系统要（``free_port``），只用 127.0.0.1。

en: The rendezvous of a multi-node launch (the given ``minisgl.server.launch``, ``minisgl.server.args`` and chapter 4.1's
rendezvous): a meeting that cannot happen fails clearly and soon.

- Node 1 pointed at a port nobody listens on, node 0 waiting for a node that never comes: past ``--dist-timeout`` each
  exits non-zero naming the address, without a C++ stack; before that it says where it waits;
- Ctrl-C at the rendezvous (SIGINT to the whole process group, as a terminal sends it): exit within seconds, no C++
  stack, no process left;
- an IPv6 ``--dist-init-addr`` is refused while parsing; the error for ``--dp 2 --nnodes 2`` names the ``--dp`` rule;
- ``--dist-timeout`` defaults to chapter 4.1's ``RENDEZVOUS_TIMEOUT_S`` and is passed on to ``--dp`` replicas.

Ports come from the OS (``free_port``), 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from minisgl.course import select
from minisgl.processes.harness import alive, child_pids, process_name
from minisgl.i18n import tr
from minisgl.processes.ranks import free_port

#: 这些检查里的 ``--dist-timeout``（秒）。 | en: The ``--dist-timeout`` of these checks (seconds).
DIST_TIMEOUT_S = 3.0
#: 从启动到放弃的上限（秒）：``--dist-timeout`` 加上在两个忙碌的核上启动（导入 torch）；远小于集合通信的 300 秒。
#: en: The limit (seconds) from the start to giving up: ``--dist-timeout`` plus starting up on two busy cores (importing
#: en: torch); far below the collectives' 300 s.
GIVE_UP_S = 45.0
#: 按下 Ctrl-C 之后，启动器和它的进程最多还能活几秒。
#: en: How many seconds the launcher and its processes may live on after Ctrl-C.
CTRL_C_S = 5.0
#: 输出里不该出现的东西：C++ 的调用栈、异常和终止。 | en: What must not appear in the output: C++ stacks, exceptions, aborts.
NOISE = ("C++", "frame #", "terminate called", "Traceback")


def _node(node: int, addr: str, *extra: str) -> subprocess.Popen[str]:
    """起 ``--tp 2 --nnodes 2`` 的节点 ``node``（自己一个进程组，像终端里那样）。

    en: Start node ``node`` of ``--tp 2 --nnodes 2`` (its own process group, as in a terminal).
    """
    from minisgl import model_zoo

    argv = [sys.executable, "-m", "minisgl", "--model", str(model_zoo.tiny_qwen3()), "--device", "cpu", "--dtype",
            "float32", "--port", "0", "--tp", "2", "--nnodes", "2", "--node-rank", str(node), "--dist-init-addr", addr,
            *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            stdin=subprocess.DEVNULL,
                            env={**os.environ, **select.impl_env(), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})


def _finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int | None, str]:
    """等进程退出（至多 ``timeout`` 秒），返回退出码（超时为 None）和全部输出；最后总把整个进程组杀掉。

    en: Wait for the process to exit (at most ``timeout`` seconds) and return the exit code (None on a timeout) and all
    its output; in the end always kill the whole process group.
    """
    try:
        out, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        code = None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    if code is None:
        out, _ = proc.communicate(timeout=30)
    return code, out


@pytest.mark.parametrize("node", [1, 0], ids=["node1-nobody-listens", "node0-nobody-comes"])
def test_a_rendezvous_that_cannot_happen_fails_soon_naming_the_address(node: int) -> None:
    addr = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    code, out = _finish(_node(node, addr, "--dist-timeout", f"{DIST_TIMEOUT_S:g}"), GIVE_UP_S)
    seconds = time.monotonic() - start
    assert code is not None and code != 0, tr(
        "Node {node} with --dist-timeout {bound:g} and nobody to meet must exit non-zero within {limit:g} s, got exit "
        "code {code}; output:\n{output}", node=node, bound=DIST_TIMEOUT_S, limit=GIVE_UP_S, code=code, output=out[-3000:])
    waiting = tr("Waiting for {nnodes} nodes at {addr} (at most {seconds:g} s; --dist-timeout changes it) ...", nnodes=2,
                 addr=addr, seconds=DIST_TIMEOUT_S)
    assert waiting in out, tr("Node {node} must say where it waits ({line!r}); output:\n{output}", node=node,
                              line=waiting, output=out[-3000:])
    errors = out.split(waiting, 1)[1]
    assert addr in errors and not any(n in out for n in NOISE), tr(
        "Node {node} must give up with a message naming {addr}, without a C++ stack or a traceback; output:\n{output}",
        node=node, addr=addr, output=out[-3000:])
    print(tr("node {node}: gave up after {seconds:.1f} s", node=node, seconds=seconds))


@pytest.mark.parametrize("node", [1, 0])
def test_ctrl_c_at_the_rendezvous_exits_at_once(node: int) -> None:
    addr = f"127.0.0.1:{free_port()}"
    host, port = addr.rsplit(":", 1)
    proc = _node(node, addr)
    try:
        # 等秩真的在集合点上等：节点 0 的秩 0 开始监听集合点，节点 1 的秩 1 进程有了名字（之后马上就去等）
        # en: wait until a rank really waits at the rendezvous: node 0's rank 0 listens on it, node 1's rank 1 process
        # en: has its name (it goes to wait right after)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if node == 0:
                with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=0.5):
                    break
            elif "msgl-sched-r1" in (process_name(p) for p in child_pids(proc.pid)):
                time.sleep(1.0)
                break
            time.sleep(0.2)
        else:
            _, out = _finish(proc, 0)
            pytest.fail(tr("Node {node}'s rank never reached the rendezvous; output:\n{output}", node=node,
                           output=out[-3000:]), pytrace=False)
        family = child_pids(proc.pid)
        start = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(CTRL_C_S)
        except subprocess.TimeoutExpired:
            pass
        while any(alive(p) for p in family) and time.monotonic() - start < CTRL_C_S:
            time.sleep(0.05)
        seconds = time.monotonic() - start
    finally:
        code, out = _finish(proc, 5)
    left = [p for p in family if alive(p)]
    assert code is not None and seconds < CTRL_C_S and not left, tr(
        "Ctrl-C at the rendezvous: node {node} and its processes must exit within {limit:g} s; took {seconds:.1f} s, "
        "left {left}; output:\n{output}", node=node, limit=CTRL_C_S, seconds=seconds, left=left, output=out[-3000:])
    assert not any(n in out for n in NOISE), tr(
        "Ctrl-C at the rendezvous: no C++ stack or traceback in node {node}'s output:\n{output}", node=node,
        output=out[-3000:])
    print(tr("node {node}: exited {seconds:.1f} s after Ctrl-C", node=node, seconds=seconds))


def test_ipv6_rendezvous_is_refused_while_parsing(capsys: pytest.CaptureFixture[str]) -> None:
    from minisgl import model_zoo
    from minisgl.server.args import parse_args, tp_problems

    for addr in ("[::1]:29500", "::1:29500"):
        problems = tp_problems(2, 2, 0, addr)
        assert len(problems) == 1 and addr in problems[0] and "IPv6" in problems[0], tr(
            "--dist-init-addr {addr} is refused with one sentence naming it and IPv6, got {problems}", addr=addr,
            problems=problems)
    with pytest.raises(SystemExit) as exited:
        parse_args(["--model", str(model_zoo.tiny_qwen3()), "--tp", "2", "--dist-init-addr", "[::1]:29500"])
    assert exited.value.code == 2 and "IPv6" in capsys.readouterr().err, tr(
        "python -m minisgl --dist-init-addr [::1]:PORT stops while parsing (status 2), naming IPv6")


@pytest.mark.parametrize("flags", [["--nnodes", "2"], ["--tp", "2", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:29500"],
                                   ["--nnodes", "2", "--node-rank", "1"]], ids=["nnodes", "tp-nnodes-addr", "node-rank"])
def test_dp_with_nnodes_names_the_dp_rule(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from minisgl import model_zoo
    from minisgl.server.args import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--model", str(model_zoo.tiny_qwen3()), "--dp", "2", *flags])
    err = capsys.readouterr().err
    rule = tr("--dp {dp} starts its replicas on this machine, so it cannot go with --nnodes or --dist-init-addr; start "
              "the replicas on each machine and join them with python -m minisgl.server.dp_router --worker-urls URL ...", dp=2)
    assert rule in err, tr("--dp 2 {flags} must be refused by the --dp rule, got: {err}", flags=" ".join(flags), err=err)


def test_dist_timeout_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from minisgl import model_zoo
    from minisgl.distributed import RENDEZVOUS_TIMEOUT_S
    from minisgl.server.replicas import replica_flags
    from minisgl.server.args import parse_args

    tiny = str(model_zoo.tiny_qwen3())
    assert parse_args(["--model", tiny]).dist_timeout == RENDEZVOUS_TIMEOUT_S, tr(
        "--dist-timeout defaults to chapter 4.1's RENDEZVOUS_TIMEOUT_S ({seconds} s)", seconds=RENDEZVOUS_TIMEOUT_S)
    args = parse_args(["--model", tiny, "--dp", "2", "--tp", "2", "--dist-timeout", "30"])
    flags = replica_flags(args)
    assert args.dist_timeout == 30 and parse_args(["--model", tiny, *flags]).dist_timeout == 30, tr(
        "--dist-timeout 30 is kept and passed on to each --dp replica: {flags}", flags=flags)
    with pytest.raises(SystemExit):
        parse_args(["--model", tiny, "--dist-timeout", "0"])
    assert "--dist-timeout" in capsys.readouterr().err, tr("--dist-timeout 0 is refused, naming the flag")
