"""所有阶段的检查共用、又不依赖任何章节模块的小工具。

en: Small tools shared by the checks of every stage that depend on no chapter module.
"""

from __future__ import annotations

import math

from minisgl.i18n import tr


def expect(got: object, want: object, what: str) -> None:
    """一条性质一次比较：不相等时消息里有“检查的是什么”、期望值和实际值（完整，不截断）。

    en: One property, one comparison: on mismatch the message says what was checked, what was expected and what came,
    in full.
    """
    assert got == want, tr("{what}\nexpected: {want!r}\ngot:      {got!r}", what=what, want=want, got=got)


def chi_square_limit(dof: int, z: float = 4.75) -> float:
    """自由度 ``dof`` 的卡方分布的上分位点（约百万分之一的误报），Wilson–Hilferty 近似。

    en: The upper quantile of the chi-square distribution with ``dof`` degrees of freedom (about one false alarm in a
    million), by the Wilson–Hilferty approximation.
    """
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
