"""全局开关，和 mini-sglang 的写法一样：每个开关是一个带 ``.value`` 的对象。

- 读：``ENV.DISABLE_OVERLAP_SCHEDULING.value``，或直接当布尔值用（``if ENV.DISABLE_OVERLAP_SCHEDULING:``）；
- 写：``ENV.DISABLE_OVERLAP_SCHEDULING.value = True``（运行时随时生效）；
- 默认值：启动前设环境变量 ``MINISGL_DISABLE_OVERLAP_SCHEDULING=1``（前缀 ``MINISGL_`` 加开关名）。

为了兼容早先的写法，``ENV.DISABLE_OVERLAP_SCHEDULING = True`` 也可以，等同于设 ``.value``。

en: Global switches, written as in mini-sglang: each switch is an object with a ``.value``.

- read: ``ENV.DISABLE_OVERLAP_SCHEDULING.value``, or use it as a boolean (``if ENV.DISABLE_OVERLAP_SCHEDULING:``);
- write: ``ENV.DISABLE_OVERLAP_SCHEDULING.value = True`` (takes effect at once, at any time);
- default: set the environment variable ``MINISGL_DISABLE_OVERLAP_SCHEDULING=1`` before start-up (the prefix
  ``MINISGL_`` plus the switch's name).

For compatibility with the earlier style, ``ENV.DISABLE_OVERLAP_SCHEDULING = True`` also works and is the same as
setting ``.value``.
"""

from __future__ import annotations

import os

from minisgl.i18n import tr

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class EnvBool:
    """一个布尔开关：默认值来自环境变量 ``MINISGL_<名字>``，之后读写 ``.value``。

    en: A boolean switch: its default comes from the environment variable ``MINISGL_<name>``; afterwards read and write
    ``.value``.
    """

    def __init__(self, name: str, default: bool = False) -> None:
        self.name = name
        raw = os.environ.get(f"MINISGL_{name}")
        if raw is None:
            self.value = default
        elif raw.strip().lower() in _TRUE | _FALSE:
            self.value = raw.strip().lower() in _TRUE
        else:
            raise ValueError(tr("Environment variable MINISGL_{name}={raw!r} is not a boolean: set it to 1/0, true/false, yes/no or on/off",
                                name=name, raw=raw))

    def __bool__(self) -> bool:
        return bool(self.value)

    def __repr__(self) -> str:
        return f"EnvBool({self.name}={self.value})"


class _Env:
    """进程级开关的集合。

    en: The set of process-wide switches.
    """

    def __init__(self) -> None:
        object.__setattr__(self, "DISABLE_OVERLAP_SCHEDULING", EnvBool("DISABLE_OVERLAP_SCHEDULING"))
        # cuda_graph="auto" 时不录图
        # en: no graph capture when cuda_graph="auto"
        object.__setattr__(self, "DISABLE_CUDA_GRAPH", EnvBool("DISABLE_CUDA_GRAPH"))

    def __setattr__(self, name: str, value: object) -> None:
        switch = getattr(self, name, None)
        if not isinstance(switch, EnvBool):
            raise AttributeError(tr("ENV has no switch {name}; the switches are: {switches}",
                                    name=name, switches=", ".join(vars(self))))
        switch.value = bool(value.value if isinstance(value, EnvBool) else value)


ENV = _Env()
