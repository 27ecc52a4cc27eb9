"""所有阶段的检查共用、又不依赖任何章节模块的小工具。

en: Small tools shared by the checks of every stage that depend on no chapter module.
"""

from __future__ import annotations

from minisgl.i18n import tr


def expect(got: object, want: object, what: str) -> None:
    """一条性质一次比较：不相等时消息里有“检查的是什么”、期望值和实际值（完整，不截断）。

    en: One property, one comparison: on mismatch the message says what was checked, what was expected and what came,
    in full.
    """
    assert got == want, tr("{what}\nexpected: {want!r}\ngot:      {got!r}", what=what, want=want, got=got)
