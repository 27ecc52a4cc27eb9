"""一个进程只留一个 OpenMP 线程池：在一个线程开始大量 torch 计算之前，让别的线程的线程池退场。

PyTorch 的 CPU 算子用 OpenMP 并行，而 OpenMP 的线程池是**按发起线程**建的：主线程算过一次就有一个池，后台线程算过
又有一个。两个核上有两个池（4 个线程）时，OpenMP 发现线程比核多，就不再在栅栏上忙等、改成睡下再被叫醒——每个算子都多
一次睡醒，前向慢到一半左右（第 2.5 章的页面有实测）。所以第 2.5 章在 CPU 上把前向交给后台线程之前，先让主线程的池退场；
一批请求算完、轮到主线程（或用户自己的代码）时，再让后台线程的池退场。

退场用 OpenMP 5.0 的 ``omp_pause_resource_all(omp_pause_soft)``：它只释放**调用它的线程**建的池，下次并行时自动重建
（建一个池是几十微秒的事）。PyTorch 自带的 OpenMP 运行库（Linux 上是 libgomp，macOS 上是 libomp）都有这个函数；
找不到时什么也不做。

en: One OpenMP thread pool per process: before a thread starts heavy torch work, let the other threads' pools go.

PyTorch's CPU operators run in parallel with OpenMP, and OpenMP builds its thread pool **per launching thread**: the main
thread has a pool once it has computed something, a background thread gets another. With two pools (4 threads) on two
cores, OpenMP sees more threads than cores, stops spinning at its barriers and sleeps there instead, to be woken up
again: one more sleep and wake per operator, and the forward runs at about half speed (chapter 2.5's page has the
measurements). So on the CPU, chapter 2.5 lets the main thread's pool go before handing the forward to the background
thread, and lets the background thread's pool go once a batch of requests is done and the main thread (or the user's
own code) has the cores again.

The pool is let go with OpenMP 5.0's ``omp_pause_resource_all(omp_pause_soft)``: it frees only the pool built by **the
calling thread**, which is rebuilt on the next parallel region (building one takes tens of microseconds). The OpenMP
runtimes that ship with PyTorch (libgomp on Linux, libomp on macOS) both have it; where it cannot be found this does
nothing.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Callable

__all__ = ["release_thread_pool"]

_OMP_PAUSE_SOFT = 1


@functools.cache
def _pause() -> Callable[[int], int] | None:
    import torch  # noqa: F401  # 先加载 torch 和它的 OpenMP 运行库 | en: load torch and its OpenMP runtime first

    fn = getattr(ctypes.CDLL(None), "omp_pause_resource_all", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def release_thread_pool() -> bool:
    """让调用它的线程的 OpenMP 线程池退场；下次并行计算时自动重建。做到了返回 True。

    en: Let the calling thread's OpenMP thread pool go; it is rebuilt on the next parallel computation. Returns True if
    it did.
    """
    pause = _pause()
    return pause is not None and pause(_OMP_PAUSE_SOFT) == 0
