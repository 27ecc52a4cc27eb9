"""第 4.1 章示例：一个秩时什么都不通信；两个秩（gloo，spawn）各拿一份数，all_reduce、all_gather、agree_min 之后
每个秩看到什么、记了几次通信；以及 all_gather 之后为什么不能直接 reshape。

    python examples/chapters/distributed.py

en: Chapter 4.1 example: with one rank nothing is communicated; two ranks (gloo, spawned) each hold their own numbers,
and what each rank sees after all_reduce, all_gather and agree_min, and how many communications it counted; and why a
plain reshape after all_gather is wrong.

    python examples/chapters/distributed.py
"""

from __future__ import annotations

from typing import Any

import torch


def demo_rank(rank: int, world_size: int, addr: str) -> dict[str, Any]:
    """在每个秩上跑：加入进程组，做三种集合通信，返回看到的结果（普通的列表和整数，好打印）。

    en: Runs on each rank: join the process group, do the three collectives, return what it saw (plain lists and ints,
    easy to print).
    """
    from minisgl.distributed import DistributedInfo, destroy_distributed, init_distributed

    comm = init_distributed(DistributedInfo(rank, world_size), addr)
    mine = torch.tensor([[1.0, 2.0], [3.0, 4.0]]) * (10 ** rank)
    seen = {"mine": mine.tolist(), "all_reduce": comm.all_reduce(mine.clone()).tolist(),
            "all_gather": comm.all_gather(mine).tolist(), "agree_min": comm.agree_min(4096 - 1000 * rank),
            "calls": dict(comm.calls)}
    destroy_distributed()
    return seen


def main() -> None:
    from minisgl.distributed import DistributedInfo, init_distributed
    from minisgl.i18n import tr
    from minisgl.processes.ranks import run_ranks

    one = init_distributed(DistributedInfo(), "127.0.0.1:1")
    x = torch.ones(2, 2)
    print(tr("one rank: all_reduce returns x itself: {same}; calls counted: {calls}", same=one.all_reduce(x) is x,
             calls=dict(one.calls)))

    for rank, seen in enumerate(run_ranks(demo_rank, 2)):
        print(tr("rank {rank}: mine {mine}", rank=rank, mine=seen["mine"]))
        for name in ("all_reduce", "all_gather", "agree_min", "calls"):
            print(f"  {name:<11} {seen[name]}")

    # 底下的集合通信沿第 0 维接：(2 个秩, 2 行, 2 列)。直接 reshape 形状对、数不对；上面 all_gather 那一行才是要的
    # en: the collective underneath joins along dimension 0: (2 ranks, 2 rows, 2 columns). A plain reshape has the right
    # en: shape and the wrong numbers; the all_gather line above is what is wanted
    pieces = [torch.tensor([[1.0, 2.0], [3.0, 4.0]]) * 10 ** r for r in range(2)]
    print(tr("plain reshape (a row holds one rank's whole piece): {value}", value=torch.cat(pieces).reshape(2, 4).tolist()))
    print(tr("wanted, torch.cat along the last dimension:         {value}", value=torch.cat(pieces, dim=-1).tolist()))

if __name__ == "__main__":
    main()
