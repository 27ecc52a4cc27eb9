"""课程机制：章节登记表、实现选择、骨架生成、命令行 ``python -m minisgl.course``、pytest 插件。

示例和笔记本可以打印 :func:`describe_selection` 的一行，说明各章用的是哪份实现。
"""

from minisgl.course.select import describe_selection

__all__ = ["describe_selection"]
