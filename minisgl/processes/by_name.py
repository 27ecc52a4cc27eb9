"""按公共名字交给 spawn 子进程的函数（启动器用它）：子进程自己导入它。

各章的实现模块在进程里的名字是内部的（``_minisgl_impl...``），子进程按那个名字导入不到；按公共名字
（``minisgl.tokenizer.tokenize_worker``），子进程按选择规则（环境变量）找到同一套实现。父进程自己也就不必导入它。

en: A function handed to a spawned child by its public name (the launcher uses it): the child imports it itself.

A chapter's implementation module has an internal name inside a process (``_minisgl_impl...``) that a child cannot
import; by the public name (``minisgl.tokenizer.tokenize_worker``), the child finds the same implementation through the
selection rules (environment). The parent itself then need not import it.
"""

from __future__ import annotations

import importlib
from typing import Any


class ByName:
    """被 pickle 成“导入 ``module``，取它的 ``name``”；在子进程里解开时就是那个函数。

    en: Pickled as "import ``module``, take its ``name``"; unpickled in the child it is that function.
    """

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return getattr, (_Module(self.module), self.name)


class _Module:
    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return importlib.import_module, (self.name,)
