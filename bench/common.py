"""基准测试共用的计时工具。

这台机器（和多数云上的 CPU）的内存带宽会在几十秒的尺度上起伏，所以：
- 各个对比项轮流跑（A B C A B C ...），而不是先把 A 跑完再跑 B，起伏对大家的影响相近；
- 报中位数，并给出最小、最大值，让人看到波动有多大；
- 结论只看同一次运行里的比值。
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from minisgl.i18n import tr


@dataclass(frozen=True)
class Stats:
    median: float
    min: float
    max: float
    samples: tuple[float, ...]

    @classmethod
    def of(cls, samples: list[float]) -> Stats:
        return cls(statistics.median(samples), min(samples), max(samples), tuple(samples))

    def __str__(self) -> str:
        return f"{self.median:8.1f}  ({self.min:.1f} – {self.max:.1f})"


@dataclass(frozen=True)
class Case:
    """一个对比项：``run()`` 跑一次并返回它自己计的秒数（只计想比较的那部分），``tokens`` 是这一次产出的 token 数。"""

    name: str
    run: Callable[[], float]
    tokens: int


def timed(fn: Callable[[], object]) -> float:
    """跑一次 ``fn``，返回耗时（秒）。"""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(cases: list[Case], repeats: int, warmup: int = 1, log: Callable[[str], None] = print) -> dict[str, Stats]:
    """轮流跑每个对比项：先预热 ``warmup`` 轮（不计），再跑 ``repeats`` 轮；返回各项 token/s 的统计。"""
    samples: dict[str, list[float]] = {c.name: [] for c in cases}
    for round_ in range(warmup + repeats):
        for case in cases:
            seconds = case.run()
            if round_ >= warmup:
                samples[case.name].append(case.tokens / seconds)
        warm = tr(" (warm-up, not counted)") if round_ < warmup else ""
        log(tr("  round {done}/{total} done", done=round_ + 1, total=warmup + repeats) + warm)
    return {name: Stats.of(s) for name, s in samples.items()}


def ratio_stats(a: Stats, b: Stats) -> str:
    """两项同一轮的样本逐轮相除：中位数（最小 – 最大）。"""
    r = [x / y for x, y in zip(a.samples, b.samples)]
    return str(Stats.of(r)).replace("  ", " ").strip() + "×"


def print_table(stats: dict[str, Stats], baseline: str, title: str | None = None) -> None:
    """每项一行：token/s 的中位数与范围，以及相对 ``baseline`` 的倍数（中位数之比）。"""
    title = title or tr("token/s: median (min – max)")
    width = max(len(name) for name in stats)
    print(f"{'':{width}}" + tr("  {title}    vs {baseline}", title=title, baseline=baseline))
    for name, s in stats.items():
        print(f"{name:{width}}  {s}    {s.median / stats[baseline].median:5.2f}×")


def plot_paths(path: Path) -> dict[str, Path]:
    """一次画两张图：``X.svg`` 是中文的，旁边的 ``X.en.svg`` 是英文的（讲义的英文版用它）。"""
    return {"zh": path, "en": path.with_suffix(".en" + path.suffix)}
