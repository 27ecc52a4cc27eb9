# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint scheduler <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint scheduler <task>` gives the next hint.
"""第 2.1 章 scheduler：调度器骨架与离线接口 ``LLM.generate``。

第一阶段结束时，一个批次里有哪些请求、每个 token 的位置、K/V 写到哪个槽位，都是你手工填的。
调度器把这些自动化，并让请求来来去去：

- **主循环**：接收新请求 → 选出下一批 → 准备输入（positions、输入映射、``out_loc``）→ 前向 → 处理结果；
- **预填充优先**：有等待的请求就先做预填充，否则让正在运行的请求一起解码一步；
- **准入控制**：请求槽（页表的一行）只有 ``max_running_req`` 个；一步预填充的 token 数有预算
  ``max_extend_tokens``，用完就不再接纳新请求；
- **连续批处理**：请求一结束就离开、归还槽位，等待的请求下一步就能加入，不必等整批结束；
- **结果处理**：把采样出的 token 接到请求后面，判断是否结束（``max_tokens``，或没设
  ``ignore_eos`` 时遇到 EOS），并把决定告诉监听者：每个请求每一步一个 :class:`~minisgl.scheduling.RequestEvent`
  （留下的 token、结束没有、为什么）。``generate`` 就是靠这些事件收集输出的。

本章的 KV 页面还是静态分配：每个请求槽固定分到同样多的页（第一阶段手工填页表的做法，自动化了）。

想知道每个请求的结果，用 ``llm.add_result_listener(fn)``；想看每一步做了什么，用 ``llm.add_step_listener(fn)``
（见 :mod:`minisgl.trace`）；每一步的采样器由 ``make_sampler`` 给（见 :data:`~minisgl.scheduling.SamplerFactory`）。
不要去包私有方法；唯一的例外是 ``_forward(fi)``：一步真正计算的那一处，包住它（在调用原函数之前读 ``fi.batch``）是
公开的接口，和 mini-sglang 的写法一样，每一章都保持它的签名。

派生本章 ``Scheduler`` 的调度器只改它新增能力的那几处，经由这些接口（约定写在各自的文档字符串里）：

- 部件：``engine_cls``、``decode_manager_cls``、``_make_cache_manager``、``prefill_adder_cls``、``supported_cache_types``、
  ``reserved_tokens``、``pages_in_use``；
- 一步算什么：``_schedule_next_batch``、``_samples_output``、``PrefillAdder._add_one_req`` 的 ``req_cls`` / ``end``；
- 怎么算：``step``、``_forward``；
- 请求了结：``_end`` 是唯一的地方（生成完、EOS、取消都经过它），资源经 ``_release_req`` → ``_free_req_resources``
  归还；``_drain`` 等在途的计算算完。

en: Chapter 2.1 scheduler: the scheduler's skeleton and the offline interface ``LLM.generate``.

At the end of stage 1 you filled in by hand which requests a batch holds, each token's position and the slot its K/V
goes to. The scheduler automates this and lets requests come and go:

- **main loop**: receive new requests -> pick the next batch -> prepare inputs (positions, input mapping, ``out_loc``)
  -> forward -> process results;
- **prefill first**: if requests are waiting, prefill them first; otherwise every running request decodes one step
  together;
- **admission control**: there are only ``max_running_req`` request slots (rows of the page table); one prefill step has
  a budget of ``max_extend_tokens`` tokens, and once it is spent no new request is admitted;
- **continuous batching**: a request leaves and returns its slot as soon as it finishes, and a waiting request can join
  the next step without waiting for the whole batch to end;
- **result processing**: append the sampled token to its request, decide whether the request is finished
  (``max_tokens``, or EOS when ``ignore_eos`` is not set), and tell the listeners: one
  :class:`~minisgl.scheduling.RequestEvent` per request and step (the token kept, finished or not, why). ``generate``
  collects its outputs from these events.

KV pages are still allocated statically in this chapter: every request slot gets the same number of pages (stage 1's
hand-filled page table, automated).

To learn each request's results, use ``llm.add_result_listener(fn)``; to see what each step did, use
``llm.add_step_listener(fn)`` (see :mod:`minisgl.trace`); the sampler comes from ``make_sampler`` (see
:data:`~minisgl.scheduling.SamplerFactory`). Do not wrap private methods; the one exception is ``_forward(fi)``: the one
place a step is really computed, and wrapping it (reading ``fi.batch`` before calling the original) is a public seam,
as in mini-sglang, whose signature every chapter keeps.

A scheduler derived from this chapter's ``Scheduler`` changes only the places its new feature touches, through these
hooks (their contracts are in their docstrings):

- parts: ``engine_cls``, ``decode_manager_cls``, ``_make_cache_manager``, ``prefill_adder_cls``,
  ``supported_cache_types``, ``reserved_tokens``, ``pages_in_use``;
- what a step computes: ``_schedule_next_batch``, ``_samples_output``, the ``req_cls`` / ``end`` parameters of
  ``PrefillAdder._add_one_req``;
- how it is computed: ``step``, ``_forward``;
- a request's end: ``_end`` is the one place (generated enough, EOS and abort all go through it); resources go back via
  ``_release_req`` -> ``_free_req_resources``; ``_drain`` waits for computations in flight.
"""

from __future__ import annotations

from minisgl.course.skeleton import TaskNotDone

import time
from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

import torch
from transformers import AutoTokenizer

from minisgl.i18n import tr
from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig, ForwardOutput
from minisgl.scheduling import (
    DecodeManager,
    ForwardInput,
    PendingReq,
    RequestEvent,
    RequestStatus,
    ResultListener,
    SchedulerConfig,
    TableManager,
    SamplerFactory,
    div_ceil,
)
from minisgl.trace import StepListener, StepTracer
from minisgl.validation import validate_config, validate_requests


class StaticCacheManager:
    """本章的 KV 分配：每个请求槽固定分到 ``num_pages // max_running_req`` 页，启动时一次写进页表。

    这样每个请求最多只能放 ``max_req_tokens`` 个 token（提示词 + 输出），哪怕别的槽位空着也借不到；
    按需分配的缓存管理器（换掉 ``_make_cache_manager`` 即可）解决这个问题。

    en: This chapter's KV allocation: each request slot gets a fixed ``num_pages // max_running_req`` pages, written
    into the page table once at start-up.

    So a request holds at most ``max_req_tokens`` tokens (prompt + output), and cannot borrow from other slots even when
    they are empty; a cache manager that allocates on demand (swap ``_make_cache_manager``) solves this.
    """

    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor, max_running_req: int) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.page_table = page_table
        self.slot_tokens = (num_pages // max_running_req) * page_size
        self.max_req_tokens = min(self.slot_tokens, page_table.shape[1])
        if self.max_req_tokens < 2:
            raise ValueError(
                tr(
                    "The KV pool is too small: {num_pages} pages for {max_running_req} request slots leaves less than "
                    "2 tokens per slot; raise num_page_override or lower max_running_req",
                    num_pages=num_pages, max_running_req=max_running_req,
                )
            )
        # TODO 任务 static_pages：填好页表：每个请求槽一行，前 width 列依次是这个槽独占的那一段 KV 槽位（KV 池按 slot_tokens 个一段切开，第 r 段归第 r 个请求槽），各段互不重叠；width 取 self.max_req_tokens，任务之后的代码还要用这个变量
        # TODO task static_pages: fill the page table: one row per request slot, whose first width entries are, in order, the run of KV slots that slot owns (the pool cut into runs of slot_tokens, run r for request slot r), with no overlap; width is self.max_req_tokens, and the code after the task uses that variable
        raise TaskNotDone("scheduler", "static_pages")
        self._static = page_table[:max_running_req, :width].clone()

    def allocate_paged(self, reqs: Sequence[Req]) -> None:
        """静态分配：页表早就填好了，每步什么也不用做。

        en: Static allocation: the page table was filled in long ago, so there is nothing to do each step.
        """

    def cache_req(self, req: Req, *, finished: bool) -> None:
        """静态分配：请求结束时页面随槽位一起归还，不用做任何事。

        en: Static allocation: a finished request's pages go back with its slot, so there is nothing to do.
        """

    def check_integrity(self) -> None:
        width = self._static.shape[1]
        if not torch.equal(self.page_table[: len(self._static), :width], self._static):
            raise RuntimeError(tr("The static page table was modified"))


@dataclass
class PrefillAdder:
    """一步预填充的“装车员”：按顺序尝试接纳等待的请求，直到槽位、页面或预算用完。

    它要用的东西都写在字段里：预算、已预留的 token 数、两个管理器和 token 池；调度器每步新建一个。

    en: The loader of one prefill step: tries to admit waiting requests in order until slots, pages or the budget run
    out.

    Everything it needs is in its fields: the budget, the tokens reserved so far, the two managers and the token pool;
    the scheduler makes a new one each step.
    """

    token_budget: int  # 这一步还能预填充多少个 token | en: how many more tokens this step can prefill
    # 运行中的请求将来还要的 token 位置（按需分配时用来做准入）
    # en: token positions the running requests will still need (used for admission when pages are allocated on demand)
    reserved_size: int
    table_manager: TableManager
    # StaticCacheManager，或 _make_cache_manager 换上的那一个
    # en: StaticCacheManager, or whichever _make_cache_manager provides
    cache_manager: Any
    token_pool: torch.Tensor

    def try_add_one(self, pending: PendingReq) -> Req | None:
        """能接纳就返回新建的 ``Req``，否则返回 None（调用者就此停下，保持先来先服务）。

        en: Return the new ``Req`` if the request can be admitted, otherwise None (the caller stops there, keeping first
        come, first served).
        """
        if self.token_budget <= 0:
            return None
        resource = self._try_allocate_one(pending)
        if resource is None:
            return None
        cache_handle, table_idx, cached_len = resource
        return self._add_one_req(pending, cache_handle, table_idx, cached_len)

    def _try_allocate_one(self, pending: PendingReq) -> tuple[Any, int, int] | None:
        """给请求找资源：一个请求槽。返回 ``(缓存句柄, 槽号, 已缓存长度)``；本章没有前缀缓存。

        en: Find resources for a request: one request slot. Returns ``(cache handle, slot number, cached length)``; this
        chapter has no prefix cache.
        """
        if self.table_manager.available_size == 0:
            return None
        return None, self.table_manager.allocate(), 0

    def _add_one_req(
        self, pending: PendingReq, cache_handle: Any, table_idx: int, cached_len: int, req_cls: type[Req] = Req, end: int | None = None
    ) -> Req:
        """接纳提示词的 ``[cached_len, end)`` 这一段（``end`` 缺省为整段）：写进 token 池、扣预算、建请求。

        没有分块时，最后一个请求可以超出剩余预算（否则比预算长的提示词永远进不来）。
        分块预填充时传入更小的 ``end`` 和自己的 ``req_cls``。

        en: Admit the span ``[cached_len, end)`` of the prompt (``end`` defaults to the whole prompt): write it into the
        token pool, charge the budget, build the request.

        Without chunking, the last request may go over the remaining budget (otherwise a prompt longer than the budget
        could never get in). Chunked prefill passes a smaller ``end`` and its own ``req_cls``.
        """
        end = pending.input_len if end is None else end
        # TODO 任务 add_one_req：接纳提示词的 [cached_len, end) 这一段：写进 token 池里这个请求那一行的同样位置（别处不动），预算扣掉这一段的长度；返回一个 req_cls 的新请求，提示词只到 end，带上槽号、cached_len、缓存句柄，以及等待请求自带的那几个字段
        # TODO task add_one_req: admit the span [cached_len, end) of the prompt: it goes into this request's row of the token pool at the same positions (nothing else changes), and its length is charged to the budget; return a new request of class req_cls whose prompt stops at end, carrying the slot, cached_len, the cache handle and the fields the waiting request brings along
        raise TaskNotDone("scheduler", "add_one_req")


class PrefillManager:
    """等待队列：先来先服务，预填充一步接纳尽量多的请求。

    en: The waiting queue: first come, first served; one prefill step admits as many requests as it can.
    """

    def __init__(self) -> None:
        self.pending_list: list[PendingReq] = []

    def add_one_req(self, pending: PendingReq) -> None:
        self.pending_list.append(pending)

    @property
    def runnable(self) -> bool:
        return len(self.pending_list) > 0

    def schedule_next_batch(self, adder: PrefillAdder) -> Batch | None:
        """从队首开始让 ``adder`` 接纳请求，第一个接纳不了的就停下；一个都没有就返回 None。

        接纳了但提示词没算完的请求（新请求的 ``device_len`` 还小于等待请求的 ``input_len``；只有第 2.4 章的分块请求
        会这样）留在队首，下一步接着算。

        en: Let ``adder`` admit requests from the front of the queue, stopping at the first it cannot admit; return None
        if none was admitted.

        An admitted request whose prompt is not finished yet (the new request's ``device_len`` is still below the
        waiting request's ``input_len``; only chapter 2.4's chunked requests do that) stays at the front of the queue
        and continues next step.
        """
        # TODO 任务 schedule_prefill：从队首起依次让 adder 接纳，遇到第一个接纳不了的就停（不跳过它去试后面的）；一个都没接纳就返回 None；否则接纳了的离开 pending_list——提示词还没全算完的除外，它们留在队首——其余的保持原来的顺序，返回这些新请求按顺序组成的预填充 Batch。给定：adder.try_add_one
        # TODO task schedule_prefill: let the adder admit requests from the head of the queue in turn, and stop at the first it cannot admit (never skip it for later ones); if it admits none, return None; otherwise the requests it took leave pending_list, except any whose prompt is not fully computed yet (they stay at the head), the rest keep their order, and you return a prefill Batch of the new requests in order. Given: adder.try_add_one
        raise TaskNotDone("scheduler", "schedule_prefill")

    def abort_req(self, uid: int) -> PendingReq | None:
        for i, pending in enumerate(self.pending_list):
            if pending.uid == uid:
                return self.pending_list.pop(i)
        return None


class Scheduler:
    """调度器兼离线接口：``Scheduler(model_path, dtype=..., **配置)``，然后 ``generate(prompts, sampling_params)``。

    每一章在上一章的 ``Scheduler`` 上派生，只改它新增能力的那几个方法；``LLM`` 就是本章的调度器。

    en: The scheduler and offline interface: ``Scheduler(model_path, dtype=..., **config)``, then ``generate(prompts,
    sampling_params)``.

    Each chapter derives from the previous chapter's ``Scheduler`` and changes only the methods of its new feature;
    ``LLM`` is this chapter's scheduler.
    """

    #: 本章支持的前缀缓存种类，第一个是默认值。
    #: en: The prefix-cache kinds this chapter supports; the first is the default.
    supported_cache_types: tuple[str, ...] = ("naive",)
    prefill_adder_cls: type[PrefillAdder] = PrefillAdder
    engine_cls: type[Engine] = Engine
    decode_manager_cls: type[DecodeManager] = DecodeManager

    def __init__(self, model_path: str, dtype: torch.dtype | None = None, *, make_sampler: SamplerFactory | None = None,
                 **kwargs: Any) -> None:
        config = SchedulerConfig(model_path=str(model_path), dtype=dtype, **kwargs)
        config.cache_type = self._resolve_cache_type(config.cache_type)
        validate_config(config)
        self.config = config
        engine_fields = {f.name: getattr(config, f.name) for f in fields(EngineConfig)}
        self.engine = self.engine_cls(EngineConfig(**engine_fields))
        self.device = self.engine.device
        self.page_size = config.page_size
        self.page_table: torch.Tensor = self.engine.page_table
        self.token_pool: torch.Tensor = self.engine.token_pool
        self.max_running_req = config.max_running_req
        # 页表 / token 池的最后一行：不属于任何请求，写了也无妨
        # en: the last row of the page table / token pool: it belongs to no request, so writing there is harmless
        self.scratch_row = self.max_running_req
        self.tokenizer = AutoTokenizer.from_pretrained(config.model_path)
        self.eos_token_id = self.tokenizer.eos_token_id
        if make_sampler is not None:  # 组装好的引擎换上更全的采样器 | en: the assembled engine swaps in a fuller sampler
            self.engine.sampler = make_sampler(self.engine, self.eos_token_id, self.tokenizer)
        self.table_manager = TableManager(self.max_running_req)
        self.cache_manager = self._make_cache_manager()
        self.prefill_manager = PrefillManager()
        self.decode_manager = self.decode_manager_cls()
        self.prefill_budget = config.max_extend_tokens
        self.status: dict[int, RequestStatus] = {}
        self.tracer = StepTracer(self.device)
        self._result_listeners: list[ResultListener] = []
        self._uid_counter = 0

    def add_step_listener(self, fn: StepListener) -> Callable[[], None]:
        """每一步的结果处理完，就调用 ``fn(trace)``（:class:`~minisgl.trace.StepTrace`）。返回取消监听的函数。

        en: Call ``fn(trace)`` (a :class:`~minisgl.trace.StepTrace`) after each step's results are processed. Returns a
        function that removes the listener.
        """
        return self.tracer.add_listener(fn)

    def add_result_listener(self, fn: ResultListener) -> Callable[[], None]:
        """结果处理每为一个请求做出决定（出了 token、结束、被取消），就调用 ``fn(event)``。返回取消监听的函数。

        en: Call ``fn(event)`` each time result processing decides something for a request (a token output, finished,
        aborted). Returns a function that removes the listener.
        """
        self._result_listeners.append(fn)
        return lambda: self._result_listeners.remove(fn) if fn in self._result_listeners else None

    def _emit(self, event: RequestEvent) -> None:
        for fn in list(self._result_listeners):
            fn(event)

    # ------------------------------------------------------------------ 后面几章换掉的部件
    # en: ------------------------------------------------------------------ parts that later chapters replace

    def _resolve_cache_type(self, cache_type: str | None) -> str:
        if cache_type is None:
            return self.supported_cache_types[0]
        if cache_type not in self.supported_cache_types:
            known = ", ".join(repr(t) for t in self.supported_cache_types)
            raise ValueError(tr("Unknown cache_type={cache_type!r}, or not supported in this chapter: this chapter's "
                                "engine supports {known} (the radix prefix cache comes in chapter 2.3)",
                                cache_type=cache_type, known=known))
        return cache_type

    def _make_cache_manager(self) -> Any:
        return StaticCacheManager(self.engine.num_pages, self.page_size, self.page_table, self.max_running_req)

    def _make_prefill_adder(self) -> PrefillAdder:
        return self.prefill_adder_cls(
            token_budget=self.prefill_budget,
            reserved_size=self.reserved_tokens(),
            table_manager=self.table_manager,
            cache_manager=self.cache_manager,
            token_pool=self.token_pool,
        )

    def reserved_tokens(self) -> int:
        """运行中的请求将来还要新分配的 token 位置。静态分配时它们的页早就分好了：0。

        en: Token positions the running requests will still need allocated. With static allocation their pages were
        allocated long ago: 0.
        """
        return 0

    def pages_in_use(self) -> int:
        """KV 池里正被占用的页数。本章：每个占用中的请求槽静态分到的那些页。

        en: Pages of the KV pool in use. In this chapter: the pages statically given to each occupied request slot.
        """
        busy = self.max_running_req - self.table_manager.available_size
        return busy * self.cache_manager.slot_tokens // self.page_size

    @property
    def max_seq_len(self) -> int:
        """一个请求最多有多少个 token（提示词 + 输出）：受页表宽度和静态分到的页面两重限制。

        en: The most tokens one request can hold (prompt + output): limited both by the page table's width and by the
        pages statically given to a slot.
        """
        return min(self.engine.max_seq_len, self.cache_manager.max_req_tokens)

    def _samples_output(self, req: Req) -> bool:
        """这一步为 ``req`` 采样的 token 是否是真正的输出。本章总是；只算了提示词的一部分的请求不是。

        en: Whether the token sampled for ``req`` this step is real output. Always in this chapter; not for a request
        that computed only part of its prompt.
        """
        return True

    # ------------------------------------------------------------------ 接收请求
    # en: ------------------------------------------------------------------ receiving requests

    def add_request(
        self, input_ids: torch.Tensor | Sequence[int], sampling_params: SamplingParams, uid: int | None = None
    ) -> int:
        """提交一个已经校验过的请求（token id），返回它的 uid。``uid`` 可以由调用者指定（服务器自己分配 uid），
        不能和还没了结的请求重复。

        en: Submit a request that has been validated (token ids); returns its uid. The caller may choose ``uid`` (a server
        assigns its own), which must not repeat one of a request not settled yet.
        """
        input_ids = torch.as_tensor(input_ids, dtype=torch.int32).reshape(-1).cpu()
        if uid is None:
            uid = self._uid_counter
            self._uid_counter += 1
        if uid in self.status:
            raise ValueError(tr("Request id {uid} is already in use", uid=uid))
        self.status[uid] = RequestStatus(uid, len(input_ids), sampling_params.max_tokens)
        self.prefill_manager.add_one_req(PendingReq(uid, input_ids, sampling_params))
        return uid

    def abort(self, uid: int) -> None:
        """取消一个请求：它离开等待和运行队列，不再输出任何 token，占用的槽位和页面全部归还（恰好一次）。
        不认识或已经结束的 uid 什么也不做。

        en: Cancel a request: it leaves the waiting and running queues, outputs no more tokens, and its slot and pages
        are all given back (exactly once). An unknown or finished uid does nothing.
        """
        status = self.status.get(uid)
        if status is None or status.finished:
            return
        self.prefill_manager.abort_req(uid)
        self.decode_manager.abort_req(uid)
        self._end(status, None, "abort")

    # ------------------------------------------------------------------ 调度与准备
    # en: ------------------------------------------------------------------ scheduling and preparing

    def _schedule_next_batch(self) -> ForwardInput | None:
        """预填充优先：有能接纳的等待请求就做预填充，否则所有运行中的请求解码一步。

        en: Prefill first: prefill if a waiting request can be admitted, otherwise every running request decodes one
        step.
        """
        # TODO 任务 prefill_first：预填充优先：等待的请求里有能接纳的，这一步就是预填充（准入员每步新建一个，带着这一步的预算）；否则所有运行中的请求一起解码一步；两样都没有就返回 None，有就返回准备好的这一步。给定：两个队列管理器各自的调度方法、_make_prefill_adder、_prepare_batch
        # TODO task prefill_first: prefill first: if some waiting request can be admitted, this step is a prefill (with a new adder each step, holding this step's budget); otherwise every running request decodes one step together; if neither gives anything, return None, else return the prepared step. Given: the scheduling method of each of the two queue managers, _make_prefill_adder, _prepare_batch
        raise TaskNotDone("scheduler", "prefill_first")

    def _prepare_batch(self, batch: Batch) -> ForwardInput:
        """算出这一步的 positions、输入映射、``out_loc`` 和新 token 的写回位置，并准备注意力与采样。

        en: Work out this step's positions, input mapping, ``out_loc`` and where the new tokens are written back, and
        prepare attention and sampling.
        """
        started = time.perf_counter()
        self.cache_manager.allocate_paged(batch.reqs)
        for req in batch.reqs:
            self.status[req.uid].req = req
        # TODO 任务 prepare_batch：算出这一步的两组索引，存成局部变量 input_mapping 和 write_mapping（任务之后要用）：前者是这一步每个要算的 token 的（行号, 位置），请求按批次里的顺序，各自从已缓存的长度到设备上的长度；后者每个请求一对，是采样结果写回的地方——它那一行里紧接着已有 token 的位置，采到的不是输出时改写到 scratch_row 的第 0 列。两组都是（行号, 位置）两个一维张量的二元组，经 _to_device 放上设备；再填好 batch.positions（int32）和 batch.out_loc（页表在这些（行号, 位置）上的值）
        # TODO task prepare_batch: compute this step's two index sets and keep them as the local variables input_mapping and write_mapping (used after the task): the first gives (row, position) for every token this step computes, requests in their order in the step, each over the range from its cached length until its length on the device; the second has one pair per request, where its sample is written back: its own row, right after the ids it already has, or column 0 of scratch_row when that sample is no output. Both are pairs of 1-D index vectors (row ids, positions) put on the device via _to_device; also fill batch.positions (int32) and batch.out_loc (the page table's values at those (row, position) pairs)
        raise TaskNotDone("scheduler", "prepare_batch")
        self.engine.attn_backend.prepare_metadata(batch)
        sample_args = self.engine.sampler.prepare(batch)
        outputs = [self._samples_output(r) for r in batch.reqs]
        trace = self.tracer.begin(batch, outputs, self.pages_in_use(), started, write_mapping)
        return ForwardInput(batch, sample_args, input_mapping, write_mapping, trace)

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    # ------------------------------------------------------------------ 前向
    # en: ------------------------------------------------------------------ forward

    def _forward(self, fi: ForwardInput) -> ForwardOutput:
        """发出一步：在设备上算它，推进每个请求的长度记账，再更新运行中的请求（刚预填充完的加入，生成够了的离开）。

        ``complete_one()`` 在发出时就调用，所以要读这一步的 ``extend_len``，得在调用本函数之前。

        en: Launch a step: compute it on the device, advance each request's length bookkeeping, then update the running
        requests (those just prefilled join, those done generating leave).

        ``complete_one()`` is called at launch, so anything that reads this step's ``extend_len`` must do so before
        calling this function.
        """
        output = self._run_batch(fi)
        for req in fi.batch.reqs:
            req.complete_one()
        self.decode_manager.filter_reqs(fi.batch.reqs)
        return output

    # 推理模式是线程局部的：派生类可能在后台线程里调用它，也要在这里进入
    # en: inference mode is per thread: a derived scheduler may call this on a background thread, so enter it here too
    @torch.inference_mode()
    def _run_batch(self, fi: ForwardInput) -> ForwardOutput:
        """在设备上跑一步：从 token 池取输入 → 引擎前向并采样 → 新 token 按 ``write_mapping`` 写回 token 池。

        en: Run one step on the device: take the inputs from the token pool -> the engine's forward and sampling ->
        write the new tokens back into the token pool by ``write_mapping``.
        """
        started = self.tracer.forward_started(fi.trace)
        fi.batch.input_ids = self.token_pool[fi.input_mapping]
        output = self.engine.forward_batch(fi.batch, fi.sample_args)
        self.token_pool[fi.write_mapping] = output.next_tokens_gpu
        self.tracer.forward_done(fi.trace, started)
        return output

    # ------------------------------------------------------------------ 处理结果
    # en: ------------------------------------------------------------------ processing results

    def _process_last_data(self, last_data: tuple[ForwardInput, ForwardOutput] | None) -> None:
        """把一步的采样结果交给各个请求：记下输出、判断结束、归还资源。

        en: Hand a step's sampled tokens to their requests: record the output, decide which requests are finished, free
        resources.
        """
        if last_data is None:
            return
        fi, output = last_data
        output.copy_done_event.synchronize()
        started = time.perf_counter()
        batch = fi.batch
        next_tokens = output.next_tokens_cpu.tolist()
        for row, (req, token) in enumerate(zip(batch.reqs, next_tokens)):
            if not self._samples_output(req):
                continue
            status = self.status[req.uid]
            # 已经了结：被取消了，或者是结束之后（结束还不知道时）就发出的一步算出来的，丢掉
            # en: already settled: aborted, or computed by a step launched after its end (before the end was known): drop
            if status.finished:
                continue
            status.logprobs = self.engine.sampler.logprob_of(fi.sample_args, row)
            # TODO 任务 process_results：把这一步采到的 token 交给它的请求：请求的 input_ids 随之多一个（append_host；它得跟着 device_len 长，前缀缓存按它插入）；不是未被忽略的 EOS 就记进 output_ids；输出够了 max_tokens、或采到未被忽略的 EOS，请求就结束：离开 decode_manager（EOS 提前结束的不会自己离开），交给 _end（EOS 时不留 token；原因分别是 "length" 和 "stop"）；刚预填充完、还没结束的请求交给缓存管理器的 cache_req（标明未结束）
            # TODO task process_results: hand this step's sampled token to its request: the request's input_ids grows by one (append_host; it must keep pace with device_len, since the prefix cache inserts by it); record it in output_ids unless it is an EOS that is not ignored; once max_tokens are output, or on such an EOS, the request ends: it leaves decode_manager (one ended early by EOS would not leave by itself) and goes to _end (keeping nothing on EOS; the reason is "length" or "stop"); a request just prefilled that goes on is handed to the cache manager's cache_req, marked as not over
            raise TaskNotDone("scheduler", "process_results")
            if not status.finished:  # 没结束：告诉监听者这一步留下的 token | en: not finished: tell the listeners the token kept
                self._emit(RequestEvent(req.uid, token, False, None, status.logprobs))
        self.tracer.finish(fi.trace, started)

    def _end(self, status: RequestStatus, token: int | None, reason: str) -> None:
        """一个请求了结的唯一地方（生成够了、遇到 EOS、被取消）：记下原因，告诉监听者，归还资源。

        en: The one place a request ends (generated enough, EOS, aborted): note why, tell the listeners, give the
        resources back.
        """
        status.finish_reason = reason
        self._emit(RequestEvent(status.uid, token, True, reason, status.logprobs if token is not None else None))
        if status.req is not None:
            self._release_req(status.req)
        else:  # 还没被接纳：什么也没占着 | en: never admitted: it holds nothing
            del self.status[status.uid]

    def _release_req(self, req: Req) -> None:
        """请求了结：归还它的资源。本章立刻归还；设备还可能在用它时，派生类可以延后到用到它的批次都算完。

        en: A request is settled: give its resources back. This chapter does so at once; while the device may still use
        them, a derived scheduler can defer it until every batch using them is computed.
        """
        self._free_req_resources(req)

    def _free_req_resources(self, req: Req) -> None:
        """真正归还：请求槽、页面（交给缓存管理器），最后删掉它的账目。

        en: The actual freeing: the request slot, the pages (through the cache manager), and finally its bookkeeping.
        """
        self.table_manager.free(req.table_idx)
        self.cache_manager.cache_req(req, finished=True)
        self.status.pop(req.uid, None)

    # ------------------------------------------------------------------ 主循环
    # en: ------------------------------------------------------------------ main loop

    @property
    def busy(self) -> bool:
        return self.prefill_manager.runnable or self.decode_manager.runnable

    def step(self) -> bool:
        """主循环的一次迭代。没事可做时返回 False。

        en: One iteration of the main loop. Returns False when there is nothing to do.
        """
        return self.normal_loop()

    def normal_loop(self) -> bool:
        """调度 → 准备 → 前向 → 处理结果，一步一步地来。

        en: Schedule -> prepare -> forward -> process results, one step at a time.
        """
        # TODO 任务 normal_loop：主循环的一次迭代，一步算完才处理：调度不出下一步就返回 False（什么也不算）；否则算这一步、处理它的结果，返回 True。给定：本类里调度、发出、处理结果的三个方法
        # TODO task normal_loop: one iteration of the main loop, one step at a time: if no next step can be scheduled, return False (compute nothing); otherwise compute that step, process its results and return True. Given: this class's three methods for scheduling, launching and processing results
        raise TaskNotDone("scheduler", "normal_loop")

    @torch.inference_mode()
    def run_until_idle(self) -> None:
        """一直迭代到所有请求都结束。

        en: Iterate until every request is finished.
        """
        while self.busy:
            if not self.step() and self.busy:
                raise RuntimeError(tr("The scheduler is stuck: requests are waiting, yet none can be admitted (not "
                                      "enough slots or KV pages, and no running request will free them)"))
        self._drain()

    def _drain(self) -> None:
        """等在途的计算都结束，处理完它们的结果。本章一步一步同步地算，没有在途的计算。

        en: Wait for computations in flight to finish and process their results. This chapter computes step by step,
        synchronously: nothing is ever in flight.
        """

    def check_integrity(self) -> None:
        """空闲时调用：请求槽全部归还，缓存管理器的账目对得上。

        en: Call when idle: every request slot is back, and the cache manager's totals match.
        """
        if self.busy:
            raise RuntimeError(tr("Some requests have not finished yet; the integrity check cannot run"))
        self.table_manager.check_integrity()
        self.cache_manager.check_integrity()

    # ------------------------------------------------------------------ 离线接口
    # en: ------------------------------------------------------------------ offline interface

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[dict[str, Any]]:
        """为每个提示词生成文本，按输入顺序返回 ``{"text": ..., "token_ids": [...]}``（不含 EOS）；要了对数概率
        （``logprobs=True``）的请求再多一个 ``"logprobs"``：每个输出 token 一个 :class:`~minisgl.scheduling.TokenLogprob`。

        先校验全部请求，有任何一个不合法就抛错，一个 token 也不算。

        en: Generate text for each prompt; returns ``{"text": ..., "token_ids": [...]}`` in input order (without EOS); a
        request that asked for log-probabilities (``logprobs=True``) also gets ``"logprobs"``: one
        :class:`~minisgl.scheduling.TokenLogprob` per output token.

        All requests are validated first: if any is invalid, it raises before a single token is computed.
        """
        requests = validate_requests(
            prompts,
            sampling_params,
            tokenizer=self.tokenizer,
            max_seq_len=self.max_seq_len,
        )
        uids = [self.add_request(ids, sp) for ids, sp in requests]
        outputs: dict[int, list[int]] = {uid: [] for uid in uids}
        logprobs: dict[int, list[Any]] = {uid: [] for uid, (_, sp) in zip(uids, requests) if sp.logprobs}

        def collect(event: RequestEvent) -> None:
            if event.token is not None and event.uid in outputs:
                outputs[event.uid].append(event.token)
                if event.uid in logprobs:
                    logprobs[event.uid].append(event.logprobs)

        stop_listening = self.add_result_listener(collect)
        try:
            self.run_until_idle()
        finally:
            stop_listening()
        self.check_integrity()
        results: list[dict[str, Any]] = [{"text": self.tokenizer.decode(outputs[uid]), "token_ids": outputs[uid]} for uid in uids]
        for uid, result in zip(uids, results):
            if uid in logprobs:
                result["logprobs"] = logprobs[uid]
        return results

    def shutdown(self) -> None:
        self._drain()
        self.engine.shutdown()


#: 离线接口：本章的调度器本身就提供 ``generate``。
#: en: Offline interface: this chapter's scheduler itself provides ``generate``.
LLM = Scheduler
