"""手写 mini-sglang 的公共命名空间。

示例、笔记本、检查和学员代码都只从这里导入（如 ``from minisgl.core import Req``）；
每一章的 ``minisgl.<章>`` 按选择规则指向学员代码、参考解答或骨架，见 ``minisgl.course.select``。
"""

from minisgl.course.select import install_finder

install_finder()
