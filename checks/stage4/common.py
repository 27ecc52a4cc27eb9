"""第 4 阶段检查共用的工具：每个秩上按步骤跑、记下结果或错误（一步没写完，其余几步照样检查），在父进程里按步骤取回。
秩进程按名字导入这个模块，所以这里只放模块顶层的函数。

en: Shared tools of the stage 4 checks: run steps on each rank and note each result or error (one unwritten step does
not stop the others being checked), then fetch them by step in the parent. Rank processes import this module by name,
so it holds only module-level functions.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch

from minisgl.i18n import tr


def rank_input(rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    """每个秩不同、各处不同的数：``100 * (rank + 1)`` 加上位置。

    en: Numbers different on every rank and at every place: ``100 * (rank + 1)`` plus the position.
    """
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape) + 100 * (rank + 1)


def run_step(out: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    """跑一步，记下 ``("ok", 结果)`` 或 ``("error", traceback)``。

    en: Run one step and note ``("ok", result)`` or ``("error", traceback)``.
    """
    try:
        out[name] = ("ok", fn())
    except Exception:  # noqa: BLE001
        out[name] = ("error", traceback.format_exc())


#: torch.distributed 里和别的秩碰头的函数：检查在每个秩上把它们包一层，数每次迭代调用了几次。
#: en: The torch.distributed functions that meet the other ranks: the checks wrap them on each rank to count the calls
#: en: of every iteration.
COLLECTIVES = ("broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "gather",
               "gather_object", "scatter", "scatter_object_list", "broadcast_object_list", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "send", "recv",
               "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list")


def count_collectives(note: Callable[[str, Any], None]) -> None:
    """把 :data:`COLLECTIVES` 包一层（``torch.distributed`` 和 ``distributed_c10d`` 两处都换）：每次最外层的调用都在
    调用它的线程里 ``note(名字, 组)``——一个集合通信里面再调的（``broadcast_object_list`` 里的 ``broadcast``）不另算。
    每个线程各数各的：重叠调度时前向在另一个线程里跑。

    en: Wrap :data:`COLLECTIVES` (replaced in both ``torch.distributed`` and ``distributed_c10d``): every outermost call
    runs ``note(name, group)`` in the calling thread — calls made inside another collective (the ``broadcast`` inside
    ``broadcast_object_list``) do not count again. Each thread counts on its own: with overlap scheduling the forward
    runs in another thread.
    """
    import inspect

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    local = threading.local()

    def wrap(name: str, real: Any) -> Any:
        params = inspect.signature(real).parameters

        def counted(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(local, "depth", 0)
            if depth == 0:
                bound = {**dict(zip(params, args)), **kwargs}
                note(name, bound.get("group"))
            local.depth = depth + 1
            try:
                return real(*args, **kwargs)
            finally:
                local.depth = depth

        return counted

    for name in COLLECTIVES:
        real = getattr(c10d, name, None)
        if real is None:
            continue
        counted = wrap(name, real)
        setattr(c10d, name, counted)
        if getattr(dist, name, None) is real:
            setattr(dist, name, counted)


def step(ranks: list[dict[str, Any]], name: str, first: str = "init") -> list[Any]:
    """各秩这一步的结果；哪个秩这一步（或没走到这一步时的 ``first`` 步）出了错，就带着它的 traceback 失败。

    en: Each rank's result of this step; fails with the traceback of any rank whose step (or, if it never got there,
    whose ``first`` step) raised.
    """
    results = []
    for rank, out in enumerate(ranks):
        status, value = out.get(name) or out[first]
        if status == "error":
            pytest.fail(tr("Rank {rank} failed in step {step}:\n{error}", rank=rank, step=name, error=value))
        results.append(value)
    return results
