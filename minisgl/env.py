"""全局开关。每个开关都可以在启动前用同名环境变量（加前缀 ``MINISGL_``）设置，也可以在运行时改。"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _flag(name: str) -> bool:
    return os.environ.get(f"MINISGL_{name}", "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass
class _Env:
    """进程级开关；``ENV.DISABLE_OVERLAP_SCHEDULING = True`` 即可关掉重叠调度。"""

    DISABLE_OVERLAP_SCHEDULING: bool = field(default_factory=lambda: _flag("DISABLE_OVERLAP_SCHEDULING"))


ENV = _Env()
