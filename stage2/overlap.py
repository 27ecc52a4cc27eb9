# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint overlap <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint overlap <task>` gives the next hint.
"""第 2.5 章 overlap：重叠调度——设备算第 N 步的时候，主机处理第 N-1 步的结果并准备第 N+1 步。

普通的主循环里，设备每算完一步都要等主机：拷回结果、记账、调度、准备下一步的输入。
这些主机上的活儿每步可能要一两毫秒，设备就空等着。重叠调度把循环改成：

    发出第 N+1 步  →  处理第 N 步的结果（这时设备在算第 N+1 步）  →  再发出第 N+2 步 …

能这样做，是因为 ``complete_one()`` 在发出时就推进了请求的长度记账，下一步需要的输入 token
也不经过主机：上一步采样的 token 直接写进设备上的 token 池，下一步从那里取。

- GPU 上：前向跑在引擎自己的 CUDA 流上，发出前等待调度器所在的流；结果用事件通知主机；
- CPU 上：前向交给一个后台线程（PyTorch 的算子执行时会释放 GIL），主线程同时做调度。进程里只留一个 OpenMP
  线程池——后台线程的；主线程把核交出去，自己只用一个线程调度（见 :mod:`minisgl.threads`）：两个池挤在两个核上，
  前向会慢到一半左右。

几个坑（都有检查）：

- 结束判断按主机收到的 token 数（见第 2.1 章），不能看 ``can_decode``——它在发出时已经被推进了，
  会提前一个 token 报告结束；
- 遇到 EOS 的请求可能已经被放进了下一步：那一步为它算出的 token 要丢掉；
- 结束或被取消的请求，要等所有用到它的批次都算完，才能归还槽位和页面，否则会被新请求覆盖；
- 预填充之后的前缀插入，晚一个迭代才发生。

``ENV.DISABLE_OVERLAP_SCHEDULING.value = True``（或环境变量 ``MINISGL_DISABLE_OVERLAP_SCHEDULING=1``）
关掉重叠，回到普通的主循环；两种循环的输出完全相同。

发出的一步是一个 ``Future``：CPU 上由后台线程完成；GPU 上内核已经排进流里，``Future`` 当场就有结果，
真正的等待在 ``copy_done_event.synchronize()``。处理结果前先 ``result()`` 拿到 ``ForwardOutput``。

en: Chapter 2.5 overlap: overlap scheduling. While the device computes step N, the host processes the results of step
N-1 and prepares step N+1.

In the plain main loop, the device waits for the host after every step: copying results back, bookkeeping, scheduling,
preparing the next step's inputs. That host work can take a millisecond or two per step, with the device idle. Overlap
scheduling turns the loop into:

    launch step N+1  ->  process the results of step N (the device is computing N+1 meanwhile)  ->  launch step N+2 ...

This works because ``complete_one()`` advances the request's length bookkeeping at launch, and the next step's input
tokens never pass through the host: the token sampled by one step is written straight into the token pool on the device,
where the next step reads it.

- on a GPU: the forward runs on the engine's own CUDA stream, which waits for the scheduler's stream before launching;
  an event tells the host when results are ready;
- on the CPU: the forward goes to a background thread (PyTorch releases the GIL while an operator runs), and the main
  thread schedules meanwhile. The process keeps a single OpenMP pool, the background thread's; the main thread hands
  the cores over and schedules on one thread (see :mod:`minisgl.threads`): two pools crowding two cores make the
  forward about half as fast.

Some traps (all checked):

- decide that a request is finished by the tokens the host has received (see chapter 2.1), not by ``can_decode``: that
  one was already advanced at launch and would report the end one token early;
- a request that hit EOS may already be in the next step: the token computed for it there must be dropped;
- a finished or cancelled request gives back its slot and pages only once every batch using it is computed; otherwise
  new requests would overwrite them;
- the prefix insert after a prefill happens one iteration later.

``ENV.DISABLE_OVERLAP_SCHEDULING.value = True`` (or the environment variable ``MINISGL_DISABLE_OVERLAP_SCHEDULING=1``)
turns overlap off and goes back to the plain main loop; both loops give exactly the same output.

A launched step is a ``Future``: on the CPU the background thread completes it; on a GPU the kernels are already queued
on the stream and the ``Future`` has its result at once, the real wait being ``copy_done_event.synchronize()``. Call
``result()`` to get the ``ForwardOutput`` before processing results.
"""

from __future__ import annotations

from minisgl.course.skeleton import TaskNotDone

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

import torch

from minisgl import chunked_prefill
from minisgl.core import Req
from minisgl.engine import ForwardOutput
from minisgl.env import ENV
from minisgl.scheduler import NormalLoop, Scheduler
from minisgl.scheduling import ForwardInput
from minisgl.threads import hand_over_cores, release_thread_pool, take_back_cores

InFlight = tuple[ForwardInput, "Future[ForwardOutput]"]


class OverlapLoop(NormalLoop):
    """本章的主循环零件：重叠调度（默认开启）。接口是 :class:`~minisgl.scheduling.MainLoop` 的；关掉重叠时就是第 2.1 章的
    :class:`~minisgl.scheduler.NormalLoop`。

    en: This chapter's main-loop part: overlap scheduling (on by default). Its interface is
    :class:`~minisgl.scheduling.MainLoop`'s; with overlap off it is chapter 2.1's :class:`~minisgl.scheduler.NormalLoop`.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__(scheduler)
        if self.scheduler.device.type == "cuda":
            self.engine_stream = torch.cuda.Stream(self.scheduler.device)
        else:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minisgl-forward")
            # 主线程把核交给了后台线程时，它原来的线程数（None：核在主线程手里）
            # en: the main thread's own thread count while it has handed the cores to the worker (None: it holds them)
            self._handed_over: int | None = None
        # TODO 任务 overlap_state：建好你的循环在两次迭代之间要记住的东西。接口只定了一个：self.pending 是已经发出、结果还没处理的那一步（起初没有，是 None；busy 和调度器读它）。其余由你决定：怎样知道设备可能还在用哪些请求，哪些已结束的请求在等着归还资源
        # TODO task overlap_state: set up what your loop remembers between iterations. The interface fixes one thing only: self.pending is the step launched whose results are not processed yet (none at first, None; busy and the scheduler read it). The rest is yours to choose: how you know which requests the device may still be using, and which ended requests are waiting to get their resources back
        raise TaskNotDone("overlap", "overlap_state")

    @property
    def overlap(self) -> bool:
        return not ENV.DISABLE_OVERLAP_SCHEDULING.value

    @property
    def busy(self) -> bool:
        return self.pending is not None

    # ------------------------------------------------------------------ 发出前向
    # en: ------------------------------------------------------------------ launching the forward

    def _launch(self, fi: ForwardInput) -> Future[ForwardOutput]:
        """让设备开始算这一步，不等它算完。CPU：交给后台线程（第一次先把核交出去：主线程的 OpenMP 线程池退场、自己只用
        1 个线程调度）；GPU：在引擎自己的流上排队。

        en: Start the device on this step without waiting for it to finish. CPU: hand it to the background thread (the
        first time, hand the cores over first: the main thread's OpenMP pool goes and it schedules on 1 thread); GPU:
        queue it on the engine's own stream.
        """
        if self.scheduler.device.type == "cuda":
            with torch.cuda.stream(self.engine_stream):
                self.engine_stream.wait_stream(torch.cuda.default_stream(self.scheduler.device))
                launched: Future[ForwardOutput] = Future()
                launched.set_result(self.scheduler._run_batch(fi))
                return launched
        if self._handed_over is None:
            self._handed_over = hand_over_cores()
        return self._worker.submit(self.scheduler._run_batch, fi)

    def launch(self, fi: ForwardInput) -> ForwardOutput | Future[ForwardOutput]:
        """重叠时，发出一步并立刻返回 ``Future``：请求在主线程、发出时就推进，下一步马上可以用新的长度调度。

        关掉重叠时照旧（同步算完，返回 ``ForwardOutput``）。

        en: With overlap, launch a step and return a ``Future`` at once: the requests are advanced on the main thread at
        launch, so the next step can be scheduled with the new lengths right away.

        With overlap off, as before (computed synchronously, returns a ``ForwardOutput``).
        """
        if not self.overlap:
            return super().launch(fi)
        # TODO 任务 launch_on_worker：重叠时发出这一步、不等它算完，把 _launch 给的 Future 原样返回；返回之前，这一步每个请求的长度记账都已在主线程推进（而且在设备开始算之前，免得和后台线程抢），运行队列也已更新（刚预填充完的加入、生成够的离开）。给定：_launch，以及 MainLoop.launch（minisgl/scheduling.py）里同样的那两件事
        # TODO task launch_on_worker: with overlap on, launch this step without waiting for it and return the Future from _launch as it is; by then every request of the step has had its length bookkeeping advanced on the main thread (before the device starts, so the background thread never races it), and the running queue is updated (requests just prefilled join, those done generating leave). Given: _launch, and the same two pieces of work MainLoop.launch (minisgl/scheduling.py) does
        raise TaskNotDone("overlap", "launch_on_worker")

    def _finish(self, last: InFlight | None) -> None:
        """等发出的那一步算完，处理它的结果。

        en: Wait for the launched step to finish and process its results.
        """
        if last is not None:
            fi, launched = last
            self.scheduler._process_last_data((fi, launched.result()))

    # ------------------------------------------------------------------ 主循环
    # en: ------------------------------------------------------------------ main loop

    def step(self) -> bool:
        if not self.overlap:
            self.drain()
            return super().step()
        return self.overlap_loop()

    def overlap_loop(self) -> bool:
        """发出第 N+1 步，再处理第 N 步的结果：设备算的时候，主机在干活。

        en: Launch step N+1, then process the results of step N: the host works while the device computes.
        """
        # TODO 任务 overlap_step：重叠的一次迭代。有下一步就发出它，而且一定在处理上一步的结果之前（重叠全靠这个先后）；处理完上一步之后，已结束、设备又不再用的请求归还资源（设备可能还在用的，是刚发出的这一步里的）；self.pending 换成刚发出的这一步（没发出就是 None）；发出了或处理了东西就返回 True。给定：调度器的 _schedule_next_batch、_forward（重叠时返回 launch 的 Future），本类的 _finish
        # TODO task overlap_step: one overlapped iteration. If there is a next step, launch it, and always before processing the previous step's results (that order is the whole point of overlap); once the previous step is processed, ended requests the device no longer uses get their resources back (the device may still be using those in the step just launched); self.pending becomes the step just launched (None if nothing was launched); return True if anything was launched or processed. Given: the scheduler's _schedule_next_batch and _forward (with overlap it returns launch's Future), and this class's _finish
        raise TaskNotDone("overlap", "overlap_step")

    def release(self, req: Req) -> None:
        """还在途的请求先记下来，等用到它的批次算完再归还资源。

        en: Note a request still in flight, and free its resources once the batches using it are computed.
        """
        # TODO 任务 deferred_free：一个已结束（生成完或被取消）的请求：设备可能还在用它时，先由你的循环留着，等它不再被用了再归还资源（在你的迭代里或 drain 里）；否则立刻归还。每个请求的资源恰好归还一次。给定：调度器的 _free_req_resources
        # TODO task deferred_free: an ended request (done generating or cancelled): while the device may still be using it, your loop keeps it and gives its resources back once it is no longer used (in your iteration or in drain); otherwise they go back at once. Each request's resources go back exactly once. Given: the scheduler's _free_req_resources
        raise TaskNotDone("overlap", "deferred_free")

    def drain(self) -> None:
        """等在途的一步算完并处理它的结果，然后归还所有留着的资源；CPU 上再从后台线程把核拿回来。

        en: Wait for the step in flight to finish and process its results, then give back every resource still held; on
        the CPU, also take the cores back from the background thread.
        """
        # TODO 任务 drain_all：收尾：在途的那一步（如果有）等它算完、处理它的结果；之后设备什么也不用了，你留着的请求全部归还资源，循环回到刚建好时的样子（不忙、什么也不留）。给定：_finish
        # TODO task drain_all: wind down: the step in flight (if any) is waited for and its results processed; after that the device uses nothing, so every request you kept gets its resources back, and the loop is as it was when built (not busy, holding nothing). Given: _finish
        raise TaskNotDone("overlap", "drain_all")
        if self.scheduler.device.type != "cuda" and self._handed_over is not None:
            # 主线程（和用户自己的代码）又要用这些核了：后台线程的池退场，主线程恢复原来的线程数
            # en: the main thread (and the user's own code) gets the cores back: the worker's pool goes, the main thread's
            # en: thread count is restored
            self._worker.submit(release_thread_pool).result()
            take_back_cores(self._handed_over)
            self._handed_over = None

    def shutdown(self) -> None:
        if self.scheduler.device.type != "cuda":
            self._worker.shutdown(wait=True)


#: 到本章为止的引擎，也就是第 2 阶段的整个调度器：第 2.4 章的零件，主循环换成重叠调度的。
#: en: The engine up to this chapter, that is stage 2's whole scheduler: chapter 2.4's parts with the overlapped main
#: loop.
PARTS = replace(chunked_prefill.PARTS, loop=OverlapLoop)
