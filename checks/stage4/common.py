"""第 4 阶段检查共用的工具：每个秩上按步骤跑、记下结果或错误（一步没写完，其余几步照样检查），在父进程里按步骤取回。
秩进程按名字导入这个模块，所以这里只放模块顶层的函数。

en: Shared tools of the stage 4 checks: run steps on each rank and note each result or error (one unwritten step does
not stop the others being checked), then fetch them by step in the parent. Rank processes import this module by name,
so it holds only module-level functions.
"""

from __future__ import annotations

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
