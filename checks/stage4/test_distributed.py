"""第 4.1 章 distributed 的检查：先在本进程里看一个秩的情形（什么都不通信、不记数、不建进程组），再起两个真的秩
（gloo，spawn，各一个线程；整个模块只起一次）：数据组和另开的 gloo 控制组、all_reduce 就地求和、all_gather 沿最后一维
按秩号拼接（二维和三维）、agree_min 取最小、每次通信记一笔、离开进程组后回到一个秩。两个上限分开：没人来的集合点
在自己的短上限内放弃并说出地址，而会合之后，集合通信会等一个晚到的秩，哪怕它晚得比那个短上限还久。

en: Checks of chapter 4.1 distributed: first the one-rank case in this process (nothing communicated, nothing counted,
no process group made), then two real ranks (gloo, spawned, one thread each; once for the whole module): the data group
and a separate gloo control group, all_reduce summing in place, all_gather joining along the last dimension in rank order
(2-D and 3-D), agree_min taking the smallest, one count per communication, one rank again after leaving the group.
Two limits kept apart: a rendezvous nobody else comes to gives up within its own short bound, naming the address, while
ranks that have met wait in a collective for a late peer longer than that bound.
"""

from __future__ import annotations

import contextlib
import ipaddress
import multiprocessing
import os
import time
import traceback
from typing import Any

import pytest
import torch

from checks.common import expect
from checks.stage4.common import rank_input, run_step, step
from minisgl.i18n import tr

WORLD = 2
#: 检查里集合点的上限（秒），和一个秩在会合之后晚到集合通信的秒数：比这个上限还久。
#: en: The rendezvous bound in these checks (seconds), and how late one rank comes to a collective after the meeting:
#: en: longer than that bound.
RENDEZVOUS_S, LATE_S = 2.5, 3.5


def listening_hosts() -> list[str]:
    """本进程正在监听的 TCP 地址（不带端口）：读 ``/proc/self/fd`` 里的套接字，再到 ``/proc/net/tcp{,6}`` 里找。

    en: The TCP addresses (no port) this process listens on: the sockets in ``/proc/self/fd``, looked up in
    ``/proc/net/tcp{,6}``.
    """
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    hosts = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    raw = bytes.fromhex(cols[1].split(":")[0])
                    words = [raw[i:i + 4][::-1] for i in range(0, len(raw), 4)]  # 每 4 字节是小端 | en: little-endian per 4 bytes
                    hosts.append(str(ipaddress.ip_address(b"".join(words))))
    return sorted(set(hosts))


def two_rank_scenario(rank: int, world_size: int, addr: str, barrier: Any) -> dict[str, Any]:
    """每个秩上跑的全部步骤；返回 步骤名 → ("ok", 结果) 或 ("error", traceback)。两个秩先在 ``barrier`` 上对齐，
    再以 :data:`RENDEZVOUS_S` 秒的上限会合（进程启动的快慢不算在里面）。

    en: All steps, run on each rank; returns step name → ("ok", result) or ("error", traceback). The two ranks line up
    at ``barrier`` first, then meet with a bound of :data:`RENDEZVOUS_S` seconds (how fast the processes start does
    not count).
    """
    import torch.distributed as dist

    from minisgl.distributed import DistributedInfo, destroy_distributed, get_tp_comm, get_tp_info, init_distributed

    out: dict[str, Any] = {}
    barrier.wait(120)
    try:
        comm = init_distributed(DistributedInfo(rank, world_size), addr, rendezvous_timeout=RENDEZVOUS_S)
    except Exception:  # noqa: BLE001
        return {"init": ("error", traceback.format_exc())}
    out["init"] = ("ok", {
        "initialized": dist.is_initialized(), "world": dist.get_world_size(), "rank": dist.get_rank(),
        "control": comm.control is not None and comm.control is not dist.group.WORLD
        and dist.get_backend(comm.control) == "gloo" and dist.get_world_size(comm.control) == world_size,
        "current": get_tp_comm() is comm, "info": (get_tp_info().rank, get_tp_info().size),
        "listening": listening_hosts(),
    })

    def reduce() -> dict[str, Any]:
        x = rank_input(rank, (3, 4))
        y = comm.all_reduce(x)
        return {"result": y.tolist(), "in_place": x.tolist()}

    def gather(shape: tuple[int, ...]) -> list[Any]:
        return comm.all_gather(rank_input(rank, shape)).tolist()

    run_step(out, "all_reduce", reduce)
    run_step(out, "all_gather_2d", lambda: gather((3, 2)))
    run_step(out, "all_gather_3d", lambda: gather((2, 3, 4)))
    run_step(out, "agree_min", lambda: comm.agree_min(1000 - 7 * rank))
    out["calls"] = ("ok", dict(comm.calls))

    def late() -> dict[str, Any]:
        # 一个秩晚到集合通信，比集合点的上限还晚，另一个在里面等它：先是控制组上秩 1 晚到，再是数据组上秩 0 晚到
        # en: one rank comes to a collective late, later than the rendezvous bound, and the other waits in it: first rank
        # en: 1 is late on the control group, then rank 0 on the data group
        comm.agree_min(0)  # 先对齐，从这里开始算晚 | en: line up first; lateness counts from here
        if rank == 1:
            time.sleep(LATE_S)
        smallest = comm.agree_min(10 + rank)
        if rank == 0:
            time.sleep(LATE_S)
        return {"sum": comm.all_reduce(rank_input(rank, (2,))).tolist(), "min": smallest}

    run_step(out, "late", late)
    destroy_distributed()
    out["after"] = ("ok", (dist.is_initialized(), get_tp_info().size))
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    """两个秩跑完全部步骤的结果（本模块只起一次进程）。

    en: The two ranks' results of all steps (processes started once for this module).
    """
    from minisgl.processes.ranks import run_ranks

    return run_ranks(two_rank_scenario, WORLD, multiprocessing.get_context("spawn").Barrier(WORLD), timeout=180)


def lonely_rank(rank: int, world_size: int, addr: str) -> list[dict[str, Any]]:
    """一个进程先扮秩 1、再扮秩 0（各是两个秩里的一个，另一个永远不来），集合点的上限 :data:`RENDEZVOUS_S` 秒；
    返回每次等了多久、抛了什么。

    en: One process plays rank 1, then rank 0 (each one of two ranks whose other one never comes), with a rendezvous
    bound of :data:`RENDEZVOUS_S` seconds; returns how long each waited and what it raised.
    """
    from minisgl.distributed import DistributedInfo, init_distributed
    from minisgl.processes.ranks import free_port

    got = []
    for alone in (1, 0):
        where = addr if alone == 1 else f"127.0.0.1:{free_port()}"  # addr：没人监听的空闲端口 | en: addr: a free port nobody listens on
        start = time.monotonic()
        try:
            init_distributed(DistributedInfo(alone, 2), where, rendezvous_timeout=RENDEZVOUS_S)
            error = None
        except Exception as e:  # noqa: BLE001
            error = f"{type(e).__name__}: {e}"
        got.append({"rank": alone, "addr": where, "seconds": time.monotonic() - start, "error": error})
    return got


# ----------------------------------------------------------------------------- 一个秩 | en: one rank


def test_one_rank_communicates_nothing() -> None:
    import torch.distributed as dist

    from minisgl.distributed import Communicator, DistributedInfo, get_tp_comm, init_distributed

    comm = init_distributed(DistributedInfo(), "127.0.0.1:1")
    expect(isinstance(comm, Communicator) and get_tp_comm() is comm, True,
           tr("init_distributed with one rank returns a Communicator and makes it the process's (get_tp_comm)"))
    expect(dist.is_initialized(), False, tr("One rank makes no process group (nothing to talk to)"))
    x = rank_input(0, (2, 3))
    expect(comm.all_reduce(x) is x, True, tr("One rank: all_reduce returns x itself"))
    expect(comm.all_gather(x) is x, True, tr("One rank: all_gather returns x itself"))
    expect(comm.agree_min(42), 42, tr("One rank: agree_min returns the value"))
    expect(dict(comm.calls), {}, tr("One rank: no communication is counted"))


# ----------------------------------------------------------------------------- 两个秩 | en: two ranks


def test_a_rendezvous_nobody_comes_to_gives_up_within_its_bound() -> None:
    from minisgl.processes.ranks import RankFailed, run_ranks

    try:
        got, failed = run_ranks(lonely_rank, 1, timeout=2 * RENDEZVOUS_S + 30), None
    except RankFailed as e:
        got, failed = [[]], str(e)
    if failed is not None:
        pytest.fail(tr("A rank alone at the rendezvous must give up within the rendezvous bound ({seconds:g} s here), not "
                       "the collectives' limit: {error}", seconds=RENDEZVOUS_S, error=failed), pytrace=False)
    for case in got[0]:
        error = case["error"] or ""
        expect((bool(error), case["addr"] in error, "C++" in error), (True, True, False), tr(
            "Rank {rank} of 2, alone at the rendezvous: init_distributed raises a message naming the address {addr} "
            "(no C++ stack), got: {error}", rank=case["rank"], addr=case["addr"], error=error or None))
        expect(case["seconds"] < RENDEZVOUS_S + 5, True, tr(
            "Rank {rank} of 2, alone at the rendezvous, gives up after the rendezvous bound ({bound:g} s), not the "
            "collectives' limit; it waited {seconds:.1f} s", rank=case["rank"], bound=RENDEZVOUS_S, seconds=case["seconds"]))


def test_two_ranks_join_a_data_group_and_a_gloo_control_group(ranks: list[dict[str, Any]]) -> None:
    for rank, got in enumerate(step(ranks, "init")):
        expect((got["initialized"], got["world"], got["rank"]), (True, WORLD, rank),
               tr("Rank {rank}: the process group is made, with this rank and size", rank=rank))
        expect(got["control"], True, tr("Rank {rank}: the control group is a separate gloo group of all ranks", rank=rank))
        expect((got["current"], got["info"]), (True, (rank, WORLD)),
               tr("Rank {rank}: init_distributed makes its Communicator the process's (set_tp_comm)", rank=rank))
        expect(bool(got["listening"]) and set(got["listening"]) <= {"127.0.0.1", "::ffff:127.0.0.1"}, True,
               tr("Rank {rank} listens on the loopback only (the rendezvous from rendezvous(), gloo on lo), got {hosts}",
                  rank=rank, hosts=got["listening"]))


def test_all_reduce_sums_in_place(ranks: list[dict[str, Any]]) -> None:
    want = (rank_input(0, (3, 4)) + rank_input(1, (3, 4))).tolist()
    for rank, got in enumerate(step(ranks, "all_reduce")):
        expect(got["result"], want, tr("Rank {rank}: all_reduce returns the sum of both ranks' tensors", rank=rank))
        expect(got["in_place"], want, tr("Rank {rank}: all_reduce writes the sum into x itself", rank=rank))


@pytest.mark.parametrize("shape", [(3, 2), (2, 3, 4)], ids=["2d", "3d"])
def test_all_gather_joins_the_last_dimension_in_rank_order(ranks: list[dict[str, Any]], shape: tuple[int, ...]) -> None:
    want = torch.cat([rank_input(r, shape) for r in range(WORLD)], dim=-1).tolist()
    for rank, got in enumerate(step(ranks, f"all_gather_{len(shape)}d")):
        expect(got, want, tr("Rank {rank}: all_gather of {shape} joins rank 0's piece, then rank 1's, along the last dimension",
                             rank=rank, shape=shape))


def test_agree_min_takes_the_smallest(ranks: list[dict[str, Any]]) -> None:
    expect(step(ranks, "agree_min"), [993, 993], tr("Both ranks agree on the smaller of 1000 and 993"))


def test_each_communication_is_counted(ranks: list[dict[str, Any]]) -> None:
    step(ranks, "agree_min")
    for rank, got in enumerate(step(ranks, "calls")):
        expect(got, {"all_reduce": 1, "all_gather": 2, "agree_min": 1},
               tr("Rank {rank}: calls counts each communication once", rank=rank))
    expect([a for a in step(ranks, "after")], [(False, 1)] * WORLD,
           tr("After destroy_distributed each process is one rank again"))


def test_collectives_wait_longer_than_the_rendezvous(ranks: list[dict[str, Any]]) -> None:
    want = (rank_input(0, (2,)) + rank_input(1, (2,))).tolist()
    expect(step(ranks, "late"), [{"sum": want, "min": 10}] * WORLD, tr(
        "When one rank comes to a collective {late:g} s late (longer than the rendezvous bound of {bound:g} s), the "
        "other waits for it, on the control group and on the data group: the groups take COLLECTIVE_TIMEOUT_S, not the "
        "rendezvous bound",
        late=LATE_S, bound=RENDEZVOUS_S))
