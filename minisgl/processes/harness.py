"""检查、示例、笔记本和基准测试用的小工具：共享前缀的提示词、按副本分开的指标、进程名。在子进程里起服务器、用完关掉的
:class:`~minisgl.processes.tree.ServerProcess`（以及 ``child_pids``、``alive``）属于 :mod:`minisgl.processes.tree`，
这里转出，检查、示例和笔记本照旧从这里取。

en: Small tools of the checks, examples, notebooks and benchmarks: shared-prefix prompts, metrics split by replica,
process names. :class:`~minisgl.processes.tree.ServerProcess`, which starts a server in a child process and stops it
again (and ``child_pids``, ``alive``), belongs to :mod:`minisgl.processes.tree` and is passed on here, where the checks,
examples and notebooks take it from.
"""

from __future__ import annotations

from pathlib import Path

from minisgl.processes.tree import ServerProcess, alive, child_pids

__all__ = ["ServerProcess", "alive", "child_pids", "per_replica", "process_name", "shared_prefix_prompts"]


def shared_prefix_prompts(tag: str, groups: int = 3, tails: int = 3, words: int = 40) -> list[str]:
    """共享前缀的一组提示词：``groups`` 段各不相同的长开头（每段 ``words`` 个词，由 ``tag`` 区分），每段接 ``tails`` 条
    短尾巴，各组轮流着排（组 0、组 1、组 2、组 0……）。换一个 ``tag`` 就是形状相同、开头全不相同的另一组。

    en: A set of shared-prefix prompts: ``groups`` different long beginnings (``words`` words each, told apart by
    ``tag``), each with ``tails`` short tails, the groups taking turns (group 0, 1, 2, 0, ...). Another ``tag`` gives a
    set of the same shape whose beginnings all differ.
    """
    prefixes = [f"{tag} {g}: " + " ".join(f"word{g}{i}{tag}" for i in range(words)) for g in range(groups)]
    return [f"{prefixes[g]} tail {t}." for t in range(tails) for g in range(groups)]


def per_replica(metrics: dict[str, float], name: str) -> dict[int, float]:
    """``--dp`` 路由器的 ``/metrics`` 里一个指标按 ``replica`` 标签分开：副本号 → 值。

    en: One metric of the ``--dp`` router's ``/metrics`` split by its ``replica`` label: replica number -> value.
    """
    return {int(k.split('replica="')[1].split('"')[0]): v for k, v in metrics.items()
            if k.startswith(name + "{") and 'replica="' in k}


def process_name(pid: int) -> str:
    """进程 ``pid`` 的名字（``/proc/<pid>/comm``，例如 ``msgl-tokenizer``）；进程已经没了时是空串。

    en: The name of process ``pid`` (``/proc/<pid>/comm``, e.g. ``msgl-tokenizer``); empty when it is gone.
    """
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
