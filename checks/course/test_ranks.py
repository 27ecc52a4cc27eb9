"""给定的 ``minisgl.processes.ranks``（第 4 阶段起秩进程用它）：每个秩一个线程、不碰模型中心、gloo 只走回环；端口每次向系统要；
一个秩出错或死掉，调用者拿到写明秩号和原因的错误，其余的秩被停掉，不留下任何进程；超时也有界。

en: The given ``minisgl.processes.ranks`` (stage 4 starts its rank processes with it): one thread per rank, no model hub, gloo on
the loopback only; the port asked from the OS each time; when a rank fails or dies the caller gets an error naming the
rank and the cause, the other ranks are stopped and no process is left; a timeout is bounded too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from minisgl.course import select
from minisgl.processes.harness import child_pids
from minisgl.i18n import tr
from minisgl.paths import REPO_ROOT
from minisgl.processes.ranks import RankFailed, run_ranks


def left_behind() -> set[int]:
    """本进程还活着的子孙，不算 multiprocessing 自己的 resource_tracker（它一直陪着父进程）。检查之前先记下一份：
    同一个 pytest 进程里先前的检查可能留着自己的子进程（浏览器、笔记本内核）。

    en: This process's living descendants, not counting multiprocessing's own resource_tracker (it stays with the parent).
    Note them before a check: earlier checks in the same pytest process may keep children of their own (a browser, a
    notebook kernel).
    """
    def cmdline(pid: int) -> str:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    return {p for p in child_pids(os.getpid()) if "resource_tracker" not in cmdline(p)}


def facts(rank: int, world_size: int, addr: str) -> dict[str, Any]:
    import torch

    return {"rank": rank, "world": world_size, "addr": addr, "threads": torch.get_num_threads(),
            "hub": os.environ.get("HF_HUB_OFFLINE"), "ifname": os.environ.get("GLOO_SOCKET_IFNAME")}


def fail_on_rank_one(rank: int, world_size: int, addr: str) -> int:
    if rank == 1:
        raise ValueError("rank one says no")
    time.sleep(60)  # 等着一个永远不来的同伴，像卡在集合通信里 | en: waits for a peer that never comes, like a stuck collective
    return rank


def die_on_rank_zero(rank: int, world_size: int, addr: str) -> int:
    if rank == 0:
        os._exit(3)
    time.sleep(60)
    return rank


def sleep_forever(rank: int, world_size: int, addr: str) -> None:
    time.sleep(600)


def test_ranks_get_one_thread_no_hub_the_loopback_and_a_fresh_port() -> None:
    before = left_behind()
    first = run_ranks(facts, 2)
    second = run_ranks(facts, 2)
    assert [f["rank"] for f in first] == [0, 1] and {f["world"] for f in first} == {2}
    assert {(f["threads"], f["hub"], f["ifname"]) for f in first} == {(1, "1", "lo")}
    assert first[0]["addr"] == first[1]["addr"] and first[0]["addr"].startswith("127.0.0.1:")
    assert first[0]["addr"] != second[0]["addr"], "each launch asks the OS for its own port"
    assert left_behind() <= before


@pytest.mark.parametrize(("fn", "rank", "words"), [(fail_on_rank_one, 1, ["ValueError: rank one says no"]),
                                                   (die_on_rank_zero, 0, ["3"])], ids=["raises", "dies"])
def test_a_failing_rank_stops_all_and_names_itself(fn: Any, rank: int, words: list[str]) -> None:
    before = left_behind()
    started = time.monotonic()
    with pytest.raises(RankFailed) as err:
        run_ranks(fn, 2)
    assert time.monotonic() - started < 40, "the other rank is stopped, not waited for"
    assert err.value.ranks == [rank]
    for word in words:
        assert word in str(err.value)
    assert left_behind() <= before


def test_a_timeout_is_bounded_and_leaves_nothing() -> None:
    before = left_behind()
    with pytest.raises(RankFailed) as err:
        run_ranks(sleep_forever, 2, timeout=8)
    assert err.value.ranks == [0, 1]
    assert left_behind() <= before


def _script(tmp_path: Path, body: str) -> list[str]:
    """写一个用 ``run_ranks`` 的小脚本，返回跑它的命令（仓库根在 ``PYTHONPATH`` 里，秩找得到本模块的函数）。

    en: Write a small script that uses ``run_ranks`` and return the command that runs it (the repository root on
    ``PYTHONPATH``, so the ranks find this module's functions).
    """
    script = tmp_path / "script.py"
    script.write_text("from checks.course.test_ranks import facts, sleep_forever\nfrom minisgl.processes.ranks import run_ranks\n\n"
                      + body, encoding="utf-8")
    return [sys.executable, str(script)]


def _env() -> dict[str, str]:
    return {**os.environ, **select.impl_env(), "PYTHONPATH": str(REPO_ROOT)}


def test_ranks_go_down_with_their_parent(tmp_path: Path) -> None:
    parent = subprocess.Popen(_script(tmp_path, 'if __name__ == "__main__":\n    run_ranks(sleep_forever, 2)\n'),
                              env=_env(), stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(ranks := [p for p in child_pids(parent.pid) if "spawn_main" in _cmdline(p)]) < 2:
        assert time.monotonic() < deadline and parent.poll() is None, tr("The two ranks never started")
        time.sleep(0.1)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + 10
    while (left := [p for p in ranks if _cmdline(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, tr("The ranks of a SIGKILLed parent must exit within seconds, left {pids}", pids=left)


def test_a_script_without_the_main_guard_is_told_so(tmp_path: Path) -> None:
    done = subprocess.run(_script(tmp_path, "run_ranks(facts, 2)\n"), env=_env(), capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    told = done.stderr.count('if __name__ == "__main__":') == 1 and "bootstrapping" not in done.stderr
    assert done.returncode != 0 and told, tr(
        "run_ranks in a script without the main guard must fail once, naming if __name__ == \"__main__\": (and no "
        "bootstrapping error from the ranks); exit code {code}, stderr:\n{stderr}", code=done.returncode, stderr=done.stderr)


def _cmdline(pid: int) -> str:
    """进程的命令行（已经退出或是僵尸时为空串）。

    en: The process's command line (empty once it exited or is a zombie).
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""
