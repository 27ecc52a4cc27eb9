"""所有阶段的检查共用、又不依赖任何章节模块的小工具。

en: Small tools shared by the checks of every stage that depend on no chapter module.
"""

from __future__ import annotations

from typing import Any

import torch

from minisgl.i18n import tr


def expect(got: object, want: object, what: str) -> None:
    """一条性质一次比较：不相等时消息里有“检查的是什么”、期望值和实际值（完整，不截断）。

    en: One property, one comparison: on mismatch the message says what was checked, what was expected and what came,
    in full.
    """
    assert got == want, tr("{what}\nexpected: {want!r}\ngot:      {got!r}", what=what, want=want, got=got)


def expect_close(got: Any, want: torch.Tensor, what: str, *, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """张量（或嵌套列表）与期望几乎相同：不同时消息里有“检查的是什么”和 torch 自己的说明——形状或 dtype 哪里不同，
    或有几个元素不同、最大差多少、第一个不同的位置。

    en: A tensor (or nested list) nearly equal to the expected one: on a difference the message says what was checked,
    followed by torch's own account: which shape or dtype differs, or how many elements differ, by how much at most,
    and where the first one is.
    """
    got_t = got if isinstance(got, torch.Tensor) else torch.tensor(got, dtype=want.dtype)
    torch.testing.assert_close(got_t, want, atol=atol, rtol=rtol, msg=lambda detail: f"{what}\n{detail}")
