"""一个进程只留一个 OpenMP 线程池：在一个线程开始大量 torch 计算之前，让别的线程的线程池退场。

PyTorch 的 CPU 算子用 OpenMP 并行，而 OpenMP 的线程池是**按发起线程**建的：主线程算过一次就有一个池，后台线程算过
又有一个。两个核上有两个池（4 个线程）时，OpenMP 发现线程比核多，就不再在栅栏上忙等、改成睡下再被叫醒——每个算子都多
一次睡醒，前向慢到一半左右（第 2.5 章的页面有实测）。所以第 2.5 章在 CPU 上把前向交给后台线程之前，先让主线程的池退场；
一批请求算完、轮到主线程（或用户自己的代码）时，再让后台线程的池退场。

光退场一次还不够：主线程在前向进行时还在调度，它的某个小算子一旦并行就又建起一个池（每步建一次、拆一次，还和前向抢核）。
所以主线程把核交出去时，连自己的线程数也降成 1（``hand_over_cores``），拿回核时再恢复（``take_back_cores``）。这里直接
用 OpenMP 的 ``omp_set_num_threads``：它只改调用它的线程；``torch.set_num_threads`` 还会改 MKL 的全局线程数，后台线程
的预填充也会跟着变成单线程。

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

Letting it go once is not enough: the main thread keeps scheduling while the forward runs, and any of its small operators
that goes parallel builds a pool again (built and torn down every step, and competing with the forward for the cores).
So when the main thread hands the cores over it also drops its own thread count to 1 (``hand_over_cores``), and restores
it when it takes them back (``take_back_cores``). This uses OpenMP's ``omp_set_num_threads`` directly: it changes only
the calling thread, whereas ``torch.set_num_threads`` also changes MKL's global thread count and would make the
background thread's prefill single-threaded too.

The pool is let go with OpenMP 5.0's ``omp_pause_resource_all(omp_pause_soft)``: it frees only the pool built by **the
calling thread**, which is rebuilt on the next parallel region (building one takes tens of microseconds). The OpenMP
runtimes that ship with PyTorch (libgomp on Linux, libomp on macOS) both have it; where it cannot be found this does
nothing.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Callable

__all__ = ["hand_over_cores", "release_thread_pool", "take_back_cores"]

_OMP_PAUSE_SOFT = 1


@functools.cache
def _omp(name: str) -> Callable[..., int] | None:
    """OpenMP 运行库里的一个 ``int f(int)`` / ``int f(void)`` 函数；找不到时是 None。

    en: An ``int f(int)`` / ``int f(void)`` function of the OpenMP runtime; None where it cannot be found.
    """
    import torch  # noqa: F401  # 先加载 torch 和它的 OpenMP 运行库 | en: load torch and its OpenMP runtime first

    fn = getattr(ctypes.CDLL(None), name, None)
    if fn is None:
        return None
    fn.argtypes = [] if name == "omp_get_max_threads" else [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def release_thread_pool() -> bool:
    """让调用它的线程的 OpenMP 线程池退场；下次并行计算时自动重建。做到了返回 True。

    en: Let the calling thread's OpenMP thread pool go; it is rebuilt on the next parallel computation. Returns True if
    it did.
    """
    pause = _omp("omp_pause_resource_all")
    return pause is not None and pause(_OMP_PAUSE_SOFT) == 0


def hand_over_cores() -> int:
    """调用它的线程把核交给另一个线程：让自己的线程池退场，之后只用 1 个线程算，直到 ``take_back_cores``。
    返回它原来的线程数（找不到 OpenMP 时返回 0，什么也没改）。

    en: The calling thread hands the cores to another thread: its pool goes, and it computes on 1 thread until
    ``take_back_cores``. Returns its former thread count (0 where OpenMP cannot be found, nothing changed).
    """
    get, put = _omp("omp_get_max_threads"), _omp("omp_set_num_threads")
    if get is None or put is None:
        return 0
    threads = get()
    release_thread_pool()
    put(1)
    return threads


def take_back_cores(threads: int) -> None:
    """``hand_over_cores`` 的另一半：调用它的线程恢复 ``threads`` 个线程（0：什么也不做）。

    en: The other half of ``hand_over_cores``: the calling thread gets ``threads`` threads back (0: nothing to do).
    """
    put = _omp("omp_set_num_threads")
    if threads > 0 and put is not None:
        put(threads)
