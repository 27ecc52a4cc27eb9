"""这台机器：录下的速度离不开的事实（CPU、向量指令集、核数、内存、被虚拟机管理程序拿走的 CPU 时间），以及给讲义录制时
先等机器安静、测量期间盯着别的进程（规则与 ``tools/record_outputs.py`` 的录制相同）。

en: This machine: the facts recorded speeds depend on (CPU, vector instruction sets, cores, memory, CPU time taken by
the hypervisor), and, for the book's recordings, waiting for a quiet machine and watching other processes during the
measurement (with the rules of ``tools/record_outputs.py``'s recordings).
"""

from __future__ import annotations

import os
import platform
import threading
from pathlib import Path
from typing import Any

from minisgl.paths import load_script


def machine_info() -> dict[str, Any]:
    """这台机器：CPU 型号、向量指令集、核数、内存、开始时的平均负载（录下的速度离不开它们）。

    en: This machine: the CPU model, its vector instruction sets, cores, memory and the load average at the start (the
    recorded speeds depend on them).
    """
    info: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                            "python": platform.python_version()}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        lines = cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines()
        name = next((ln.partition(":")[2].strip() for ln in lines if ln.startswith("model name")), None)
        flags = next((ln.partition(":")[2].split() for ln in lines if ln.startswith("flags")), [])
        info.update(cpu=name or info["cpu"], vector_flags=sorted(f for f in flags if f.startswith(("avx", "amx", "fma"))))
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        total = next((ln.split()[1] for ln in meminfo.read_text().splitlines() if ln.startswith("MemTotal")), None)
        info["memory_gib"] = round(int(total) / 2**20, 1) if total else None
    if hasattr(os, "getloadavg"):
        info["load_at_start"] = [round(x, 2) for x in os.getloadavg()]
    return info


def cpu_times() -> list[int] | None:
    """``/proc/stat`` 第一行的累计 CPU 时间（user nice system idle iowait irq softirq steal …），没有时为 None。

    en: The cumulative CPU times of ``/proc/stat``'s first line (user nice system idle iowait irq softirq steal …), None
    where there is none.
    """
    stat = Path("/proc/stat")
    if not stat.is_file():
        return None
    return [int(x) for x in stat.read_text().splitlines()[0].split()[1:]]


def steal_percent(before: list[int] | None, after: list[int] | None) -> float | None:
    """两次 :func:`cpu_times` 之间被虚拟机管理程序拿走的 CPU 时间占百分之几（steal：云上的虚拟机与邻居共用物理核，
    它高时同样的代码会慢，录下的速度要带着它看）。

    en: The percentage of CPU time taken by the hypervisor between two :func:`cpu_times` (steal: a cloud VM shares its
    physical cores with neighbours; when it is high the same code runs slower, so recorded speeds go with it).
    """
    if before is None or after is None or len(before) < 8:
        return None
    total = sum(after[:8]) - sum(before[:8])
    return round(100 * (after[7] - before[7]) / total, 1) if total > 0 else None


class QuietWatch:
    """录制时用：开始前等机器安静（同讲义的录制），测量期间每隔几秒看一次有没有别的进程抢 CPU（我们起的服务器是
    子进程，不算）。

    en: For recordings: wait for a quiet machine first (as the book's recordings do), and during the measurement look
    every few seconds for other processes taking CPU (the servers we start are our children and do not count).
    """

    def __init__(self, period: float = 5.0) -> None:
        self.tools = load_script("tools/record_outputs.py", "record_outputs")  # 讲义录制的规则 | en: the book recordings' rules
        self.quiet = self.tools.Quiet(max_load=self.tools.default_max_load(), busy_cpu=20.0, wait=1800.0)
        self.period = period
        self.intruders: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> QuietWatch:
        self.tools.wait_until_quiet(self.quiet, check_load=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        watch = self.tools.CpuWatch()
        while not self._stop.wait(self.period):
            for pid, comm, percent in watch.sample():
                if percent > self.quiet.busy_cpu:
                    self.intruders[pid] = f"{comm} ({percent:.0f}%)"
