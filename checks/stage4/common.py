"""第 4 阶段检查共用的工具：每个秩上按步骤跑、记下结果或错误（一步没写完，其余几步照样检查），在父进程里按步骤取回。
秩进程按名字导入这个模块，所以这里只放模块顶层的函数。

en: Shared tools of the stage 4 checks: run steps on each rank and note each result or error (one unwritten step does
not stop the others being checked), then fetch them by step in the parent. Rank processes import this module by name,
so it holds only module-level functions.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator
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


#: torch.distributed 里会发起通信的函数：:func:`control_group_calls` 看它们哪次用了控制组。
#: en: The functions of torch.distributed that communicate: :func:`control_group_calls` watches which use the control group.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
               "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather", "reduce", "reduce_scatter",
               "reduce_scatter_tensor", "scatter", "send", "recv", "isend", "irecv")


@contextlib.contextmanager
def control_group_calls(control: Any) -> Iterator[list[str]]:
    """在这段代码里，记下每次经控制组 ``control`` 的通信（函数名）。前向里一次也不该有：重叠调度时前向在自己的线程里
    跑，调度器的线程正同时在控制组上通信，同一个组上两个线程的通信在各秩上先后不同，就会互相等死。

    en: Note each communication over the control group ``control`` inside this block (by function name). A forward
    should make none: with overlap scheduling the forward runs in a thread of its own while the scheduler's thread uses
    the control group, and two threads' communications on one group, ordered differently on different ranks, wait on
    each other forever.
    """
    import torch.distributed as dist

    seen: list[str] = []
    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def watched(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if control is not None and any(a is control for a in (*args, *kwargs.values())):
                seen.append(name)
            return fn(*args, **kwargs)
        return call

    for name, fn in originals.items():
        setattr(dist, name, watched(name, fn))
    try:
        yield seen
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


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
