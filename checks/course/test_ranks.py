"""给定的 ``minisgl.ranks``（第 4 阶段起秩进程用它）：每个秩一个线程、不碰模型中心、gloo 只走回环；端口每次向系统要；
一个秩出错或死掉，调用者拿到写明秩号和原因的错误，其余的秩被停掉，不留下任何进程；超时也有界。

en: The given ``minisgl.ranks`` (stage 4 starts its rank processes with it): one thread per rank, no model hub, gloo on
the loopback only; the port asked from the OS each time; when a rank fails or dies the caller gets an error naming the
rank and the cause, the other ranks are stopped and no process is left; a timeout is bounded too.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from minisgl.harness import child_pids
from minisgl.ranks import RankFailed, run_ranks


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
