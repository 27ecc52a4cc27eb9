"""调度轨迹：看调度器每一步做了什么，而不必去包它的私有方法。

``llm.add_step_listener(fn)`` 之后，每一步的结果处理完时都会调用 ``fn(trace)``，``trace`` 是一个
:class:`StepTrace`：这一步是预填充还是解码、算了哪些请求、各算几个 token、KV 池用了多少页，
以及主机和设备上各花了多少时间。长度是在前向 **发出之前** 记下的（发出时 ``complete_one()`` 就推进了它们）。

轨迹由调度器的框架代码记录，不在你要写的任务里：你的调度器写错了，轨迹照样如实反映它做了什么。

en: Scheduling traces: see what the scheduler did at each step without wrapping its private methods.

After ``llm.add_step_listener(fn)``, ``fn(trace)`` is called once each step's results are processed; ``trace`` is a
:class:`StepTrace`: whether the step was a prefill or a decode, which requests it computed and how many tokens each, how
many pages of the KV pool were in use, and the time spent on the host and on the device. Lengths are recorded **before**
the forward is launched (``complete_one()`` advances them at launch).

The traces are recorded by the scheduler's framework code, not by the tasks you write: if your scheduler is wrong, the
trace still shows faithfully what it did.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass
class StepTrace:
    """一步前向的记录。时间都是 ``time.perf_counter()`` 的秒数（``None``：这一步没有这一段）。

    en: The record of one forward step. Times are ``time.perf_counter()`` seconds (``None``: the step had no such
    phase).
    """

    index: int  #: 第几步（从 0 起，按发出的顺序） | en: step number (from 0, in launch order)
    phase: str  #: ``"prefill"`` 或 ``"decode"`` | en: ``"prefill"`` or ``"decode"``
    uids: list[int]
    rows: list[int]  #: 各请求占的请求槽（页表的行） | en: each request's slot (row of the page table)
    cached_lens: list[int]  #: 发出前各请求已缓存的 token 数 | en: each request's cached tokens before launch
    extend_lens: list[int]  #: 这一步各请求要算的 token 数 | en: tokens each request computes this step
    # : 这一步为该请求采样的 token 是否是输出（分块预填充的中间块不是）
    # en: whether the token sampled for the request this step is output (not for intermediate chunks of a chunked
    # en: prefill)
    outputs: list[bool]
    # : 准备好这一步之后，KV 池里被占用的页数（含前缀缓存占着的页）
    # en: pages of the KV pool in use once this step is prepared (including pages held by the prefix cache)
    pages_in_use: int
    # : 这一步的 ``Batch``（``input_ids``、``positions``、``out_loc`` 都在上面）
    # en: this step's ``Batch`` (with ``input_ids``, ``positions``, ``out_loc``)
    batch: Any = field(repr=False)
    # : 采样结果写回 token 池的 ``(行号, 位置)``，每个请求一对（设备上的两个张量，用到时再拷回主机）
    # en: where the sampled tokens are written back into the token pool, ``(row, position)``, one pair per request (two
    # en: tensors on the device, copied to the host only when used)
    write_mapping: Any = field(default=None, repr=False)
    # : 主机：分配页面、准备输入与元数据
    # en: host: allocate pages, prepare inputs and metadata
    prepare: tuple[float, float] = (0.0, 0.0)
    # : 主机上看到的前向计算（CPU 上就是计算本身）
    # en: the forward as seen from the host (on the CPU, the computation itself)
    forward: tuple[float, float] | None = None
    # : 前向在哪个线程里跑（CPU 上的重叠调度用后台线程）
    # en: the thread the forward runs on (overlap scheduling on the CPU uses a background thread)
    forward_thread: str | None = None
    # : 设备上的前向时间（CUDA 事件；CPU 上等于 forward 的时长）
    # en: forward time on the device (CUDA events; on the CPU, the length of forward)
    device_ms: float | None = None
    process: tuple[float, float] | None = None  #: 主机：处理这一步的结果 | en: host: process this step's results
    _events: tuple[Any, Any] | None = field(default=None, repr=False)

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @property
    def reqs(self) -> list[Any]:
        """这一步的请求对象（之后还会变：要看发出前的长度，用上面的几个列表）。

        en: This step's request objects (they change later: for the lengths before launch, use the lists above).
        """
        return self.batch.reqs

    @property
    def tokens(self) -> int:
        """这一步一共算了多少个 token。

        en: How many tokens this step computed in all.
        """
        return sum(self.extend_lens)


StepListener = Callable[[StepTrace], None]


class StepTracer:
    """调度器里的轨迹记录员：在准备、前向、处理结果三处打点，一步处理完就交给所有监听者。

    en: The scheduler's trace recorder: takes timestamps at prepare, forward and result processing, and hands each
    finished step to every listener.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.listeners: list[StepListener] = []
        self.count = 0

    def add_listener(self, fn: StepListener) -> Callable[[], None]:
        self.listeners.append(fn)
        return lambda: self.listeners.remove(fn) if fn in self.listeners else None

    def begin(self, batch: Any, outputs: list[bool], pages_in_use: int, started: float,
              write_mapping: Any = None) -> StepTrace:
        """准备完一步时调用：记下发出前的长度。

        en: Called once a step is prepared: records the lengths before launch.
        """
        trace = StepTrace(
            index=self.count,
            phase=batch.phase,
            uids=[r.uid for r in batch.reqs],
            rows=[r.table_idx for r in batch.reqs],
            cached_lens=[r.cached_len for r in batch.reqs],
            extend_lens=[r.extend_len for r in batch.reqs],
            outputs=outputs,
            pages_in_use=pages_in_use,
            batch=batch,
            write_mapping=write_mapping,
            prepare=(started, time.perf_counter()),
        )
        self.count += 1
        return trace

    def forward_started(self, trace: StepTrace) -> float:
        trace.forward_thread = threading.current_thread().name
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            trace._events = (start, None)
        return time.perf_counter()

    def forward_done(self, trace: StepTrace, started: float) -> None:
        trace.forward = (started, time.perf_counter())
        if trace._events is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            trace._events = (trace._events[0], end)
        else:
            trace.device_ms = (trace.forward[1] - started) * 1000

    def finish(self, trace: StepTrace, started: float) -> None:
        """这一步的结果处理完：补上时间，交给监听者。

        en: This step's results are processed: fill in the times and hand it to the listeners.
        """
        trace.process = (started, time.perf_counter())
        if trace._events is not None:
            start, end = trace._events
            end.synchronize()
            trace.device_ms = start.elapsed_time(end)
            trace._events = None
        for fn in list(self.listeners):
            fn(trace)
