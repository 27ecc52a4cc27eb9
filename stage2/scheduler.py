# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint scheduler <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint scheduler <task>` gives the next hint.
"""第 2.1 章 scheduler：调度器与离线接口 ``generate``。

调度器把第一阶段手工填的东西（批次里有谁、每个 token 的位置、K/V 写到哪）自动化，并让请求来来去去。主循环：
接收请求 → 选出下一步（预填充优先）→ 准备输入 → 前向 → 处理结果。准入受请求槽（``max_running_req``）和每步预填充
预算（``max_extend_tokens``）限制；请求一结束就归还槽位，等待的请求下一步就能加入（连续批处理）。结果处理为每个请求
每一步发一个 :class:`~minisgl.scheduling.RequestEvent`，``generate`` 靠它们收集输出。

本章的 ``Scheduler`` 就是最终引擎的调度器：后面的章节不派生它，而是交出它握着的零件
（:class:`~minisgl.scheduling.SchedulerParts`）。本章自己的零件是 ``StaticCacheManager``（静态分页）、``PrefillAdder``、
``PrefillFirst`` 和 ``NormalLoop``，接口写在各自的文档字符串里。请求只在 ``_end`` 了结。看结果用
``add_result_listener``，看每一步用 ``add_step_listener``；不要包私有方法，唯一的例外是 ``_forward(fi)``：一步真正
计算的那一处，包住它（调用原函数之前读 ``fi.batch``）是公开的接口，和 mini-sglang 一样。

en: Chapter 2.1 scheduler: the scheduler and the offline interface ``generate``.

The scheduler automates what stage 1 filled in by hand (who is in a batch, each token's position, where K/V goes) and
lets requests come and go. The main loop: receive requests -> pick the next step (prefill first) -> prepare inputs ->
forward -> process results. Admission is limited by request slots (``max_running_req``) and a per-step prefill budget
(``max_extend_tokens``); a request returns its slot as soon as it ends, and a waiting one can join the next step
(continuous batching). Result processing emits one :class:`~minisgl.scheduling.RequestEvent` per request and step, from
which ``generate`` collects its outputs.

This chapter's ``Scheduler`` is the final engine's scheduler: later chapters do not derive from it, they deliver the
parts it holds (:class:`~minisgl.scheduling.SchedulerParts`). This chapter's own parts are ``StaticCacheManager``
(static pages), ``PrefillAdder``, ``PrefillFirst`` and ``NormalLoop``, each with its interface in its docstring. A
request ends only in ``_end``. Watch results with ``add_result_listener`` and steps with ``add_step_listener``; do not
wrap private methods, except ``_forward(fi)``: the one place a step is really computed, and wrapping it (reading
``fi.batch`` before calling the original) is a public seam, as in mini-sglang.
"""

from __future__ import annotations

from minisgl.course.skeleton import TaskNotDone

import time
from concurrent.futures import Future
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
    IndexPair,
    MainLoop,
    OutputCollector,
    PendingReq,
    RequestEvent,
    RequestStatus,
    ResultListener,
    SchedulerConfig,
    SchedulerParts,
    StaticCacheManager,
    TableManager,
)
from minisgl.schedule_policy import make_queue_policy
from minisgl.trace import StepListener, StepTracer
from minisgl.validation import validate_config, validate_requests


def static_page_table(slots: int, slot_tokens: int, width: int, device: torch.device) -> torch.Tensor:
    """静态分页的页表：``[slots, width]`` 的 int32 张量，放在 ``device`` 上。KV 池按 ``slot_tokens`` 个槽位一段切开，
    第 r 段归第 r 个请求槽；第 r 行依次是这一段开头的 ``width`` 个槽位，各行互不重叠（``width <= slot_tokens``）。

    en: The page table of static paging: an int32 ``[slots, width]`` tensor on ``device``. The KV pool is cut into runs of
    ``slot_tokens`` slots, run r for request slot r; row r holds, in order, the first ``width`` slots of that run, with
    no overlap between rows (``width <= slot_tokens``).
    """
    # TODO 任务 static_pages：返回静态分页的页表（见文档字符串）：第 r 行第 c 列是 KV 池里第 r 段的第 c 个槽位
    # TODO task static_pages: return the page table of static paging (see the docstring): row r, column c is slot c of run r of the KV pool
    raise TaskNotDone("scheduler", "static_pages")


def static_cache_manager(engine: Engine, config: SchedulerConfig, table_manager: TableManager) -> StaticCacheManager:
    """本章的缓存管理器零件（一个 :data:`~minisgl.scheduling.CacheManagerFactory`）：给定的静态分页，页表按
    :func:`static_page_table` 排。

    en: This chapter's cache-manager part (a :data:`~minisgl.scheduling.CacheManagerFactory`): the given static paging,
    its page table laid out by :func:`static_page_table`.
    """
    return StaticCacheManager(engine.num_pages, config.page_size, engine.page_table, table_manager, static_page_table)


@dataclass
class PrefillAdder:
    """一步预填充的“装车员”：按顺序接纳等待的请求，直到槽位、页面或预算用完。它要用的都在字段里；调度器每步新建一个。

    en: The loader of one prefill step: admits waiting requests in order until slots, pages or the budget run out.
    Everything it needs is in its fields; the scheduler makes a new one each step.
    """

    token_budget: int  # 这一步还能预填充多少个 token | en: how many more tokens this step can prefill
    # 运行中的请求将来还要的 token 位置（按需分配时用来做准入）
    # en: token positions the running requests will still need (used for admission when pages are allocated on demand)
    reserved_size: int
    table_manager: TableManager
    # StaticCacheManager，或零件换上的那一个
    # en: StaticCacheManager, or whichever the parts provide
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
        """从队首起让 ``adder`` 接纳请求，接纳不了就停；提示词没算完的（第 2.4 章的分块）留在队首。

        en: Let ``adder`` admit requests from the front of the queue until it cannot; one whose prompt is not finished
        (chapter 2.4's chunks) stays at the front.
        """
        # TODO 任务 schedule_prefill：从队首起依次让 adder 接纳，遇到第一个接纳不了的就停（不跳过它去试后面的）；一个都没接纳就返回 None；否则接纳了的离开 pending_list——提示词还没全算完的除外，它们留在队首——其余的保持原来的顺序，返回这些新请求按顺序组成的预填充 Batch。给定：adder.try_add_one
        # TODO task schedule_prefill: let the adder admit requests from the head of the queue in turn, and stop at the first it cannot admit (never skip it for later ones); if it admits none, return None; otherwise the requests it took leave pending_list, except any whose prompt is not fully computed yet (they stay at the head), the rest keep their order, and you return a prefill Batch of the new requests in order. Given: adder.try_add_one
        raise TaskNotDone("scheduler", "schedule_prefill")

    def abort_req(self, uid: int) -> PendingReq | None:
        for i, pending in enumerate(self.pending_list):
            if pending.uid == uid:
                return self.pending_list.pop(i)
        return None


class PrefillFirst:
    """本章选下一步的策略零件：预填充优先。调度器每一步调用一次 ``next_batch``。

    en: This chapter's policy part for picking the next step: prefill first. The scheduler calls ``next_batch`` once a
    step.
    """

    def next_batch(
        self, prefill_manager: PrefillManager, decode_manager: DecodeManager, make_adder: Callable[[], PrefillAdder]
    ) -> Batch | None:
        """预填充优先：有能接纳的等待请求就做预填充，否则所有运行中的请求解码一步；都没有就返回 None。

        en: Prefill first: prefill if a waiting request can be admitted, otherwise every running request decodes one
        step; None when there is neither.
        """
        # TODO 任务 prefill_first：预填充优先：等待的请求里有能接纳的，这一步就是预填充（准入员每步新建一个，带着这一步的预算）；否则所有运行中的请求一起解码一步；两样都没有就返回 None，有就返回这一步的 Batch。给定：两个队列管理器各自的调度方法、make_adder
        # TODO task prefill_first: prefill first: if some waiting request can be admitted, this step is a prefill (with a new adder each step, holding this step's budget); otherwise every running request decodes one step together; if neither gives anything, return None, else return that step's Batch. Given: the scheduling method of each of the two queue managers, make_adder
        raise TaskNotDone("scheduler", "prefill_first")


class NormalLoop(MainLoop):
    """本章的主循环零件：一步算完才处理它的结果（发出、归还、收尾都是 :class:`~minisgl.scheduling.MainLoop` 的）。

    en: This chapter's main-loop part: a step is computed to the end before its results are processed (launching,
    releasing and winding down are :class:`~minisgl.scheduling.MainLoop`'s).
    """

    def step(self) -> bool:
        """调度 → 准备 → 前向 → 处理结果，一步一步地来。

        en: Schedule -> prepare -> forward -> process results, one step at a time.
        """
        # TODO 任务 normal_loop：主循环的一次迭代，一步算完才处理：调度不出下一步就返回 False（什么也不算）；否则算这一步、处理它的结果，返回 True。给定：调度器（self.scheduler）调度、发出、处理结果的三个方法
        # TODO task normal_loop: one iteration of the main loop, one step at a time: if no next step can be scheduled, return False (compute nothing); otherwise compute that step, process its results and return True. Given: the scheduler's (self.scheduler) three methods for scheduling, launching and processing results
        raise TaskNotDone("scheduler", "normal_loop")


class Scheduler:
    """调度器兼离线接口：``Scheduler(model_path, dtype=..., parts=..., **配置)``，然后 ``generate(...)``。``parts``
    给出后面各章交出的零件，没给的用本章自己的；组装好的引擎是 ``minisgl.llm.LLM``。

    en: The scheduler and offline interface: ``Scheduler(model_path, dtype=..., parts=..., **config)``, then
    ``generate(...)``. ``parts`` gives the parts later chapters deliver, this chapter's own for the rest; the assembled
    engine is ``minisgl.llm.LLM``.
    """

    #: 一个秩的调度器换上切开的引擎和按 uid 排的解码队列（第 4.3 章）。
    #: en: One rank's scheduler swaps in the split engine and a decode queue in uid order (chapter 4.3).
    engine_cls: type[Engine] = Engine
    decode_manager_cls: type[DecodeManager] = DecodeManager

    def __init__(self, model_path: str, dtype: torch.dtype | None = None, *, parts: SchedulerParts | None = None,
                 **kwargs: Any) -> None:
        parts = parts or SchedulerParts()
        config = SchedulerConfig(model_path=str(model_path), dtype=dtype, **kwargs)
        validate_config(config, parts.cache_types)
        if config.quantization is not None and parts.weights is None:  # 没人接的设置要说出来，不悄悄不管 | en: a setting nobody takes is refused, not silently ignored
            raise ValueError(tr("quantization={name!r} is applied by the assembled engine's weights part: use minisgl.llm.LLM",
                                name=config.quantization))
        self.config = config
        engine_fields = {f.name: getattr(config, f.name) for f in fields(EngineConfig)}
        self.engine = self.engine_cls(EngineConfig(**engine_fields))
        if parts.weights is not None:  # 组装好的引擎可以换掉加载好的权重（第 5.4 章） | en: the assembled engine may replace the loaded weights (chapter 5.4)
            parts.weights(self.engine, config)
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
        if parts.sampler is not None:  # 组装好的引擎换上更全的采样器 | en: the assembled engine swaps in a fuller sampler
            self.engine.sampler = parts.sampler(self.engine, self.eos_token_id, self.tokenizer)
        self.table_manager = TableManager(self.max_running_req)
        self.cache_manager = (parts.cache_manager or static_cache_manager)(self.engine, config, self.table_manager)
        self.prefill_adder_cls: type[PrefillAdder] = parts.prefill_adder or PrefillAdder
        self.policy: PrefillFirst = (parts.policy or PrefillFirst)()
        # 等待队列的顺序（给定的零件，缺省先来先服务）
        # en: the waiting queue's order (a given part; first come, first served by default)
        self.queue_policy = (parts.queue_policy or make_queue_policy)(config, self.cache_manager)
        self.prefill_manager = PrefillManager()
        self.decode_manager = self.decode_manager_cls()
        self.prefill_budget = config.max_extend_tokens
        self.status: dict[int, RequestStatus] = {}
        self.tracer = StepTracer(self.device)
        self._result_listeners: list[ResultListener] = []
        self._uid_counter = 0
        self.loop: NormalLoop = (parts.loop or NormalLoop)(self)

    def add_step_listener(self, fn: StepListener) -> Callable[[], None]:
        """每步结果处理完就调用 ``fn(trace)``；返回取消监听的函数。

        en: Call ``fn(trace)`` after each step's results are processed; returns a function that removes the listener.
        """
        return self.tracer.add_listener(fn)

    def add_result_listener(self, fn: ResultListener) -> Callable[[], None]:
        """每为一个请求做出决定（出了 token、结束、被取消）就调用 ``fn(event)``；返回取消监听的函数。

        en: Call ``fn(event)`` on each decision for a request (a token, finished, aborted); returns the remover.
        """
        self._result_listeners.append(fn)
        return lambda: self._result_listeners.remove(fn) if fn in self._result_listeners else None

    def _emit(self, event: RequestEvent) -> None:
        for fn in list(self._result_listeners):
            fn(event)

    def _make_prefill_adder(self) -> PrefillAdder:
        return self.prefill_adder_cls(
            token_budget=self.prefill_budget,
            reserved_size=self.reserved_tokens(),
            table_manager=self.table_manager,
            cache_manager=self.cache_manager,
            token_pool=self.token_pool,
        )

    def reserved_tokens(self) -> int:
        """占着槽位的请求将来还要新分配的 token 位置：运行中的请求算到提示词 + ``max_tokens``，算了一半的分块请求
        （第 2.4 章）按完整的提示词 + 输出，由缓存管理器按（总长度，已缓存长度）求和。

        en: Token positions the requests holding slots will still need: running ones up to prompt + ``max_tokens``, a
        half-computed chunk (chapter 2.4) at its whole prompt + output, summed by the cache manager.
        """
        claims = [(r.max_device_len, r.cached_len) for r in self.decode_manager.running_reqs]
        claims += [(p.input_len + p.output_len, p.chunked_req.cached_len)
                   for p in self.prefill_manager.pending_list if p.chunked_req is not None]
        return self.cache_manager.reserved_tokens(claims)

    def pages_in_use(self) -> int:
        """KV 池里正被占用的页数（缓存管理器数的）。

        en: Pages of the KV pool in use (as the cache manager counts them).
        """
        return self.cache_manager.pages_in_use()

    @property
    def max_seq_len(self) -> int:
        """一个请求最多有多少个 token（提示词 + 输出）：受页表宽度和静态分到的页面两重限制。

        en: The most tokens one request can hold (prompt + output): limited both by the page table's width and by the
        pages statically given to a slot.
        """
        return min(self.engine.max_seq_len, self.cache_manager.max_req_tokens)

    def _samples_output(self, req: Req) -> bool:
        """准备一步时问：这一步为 ``req`` 采样的 token 是否是真正的输出。整段提示词都已知时才是；只送进了提示词一部分的
        请求（第 2.4 章的分块）不是。

        en: Asked when a step is prepared: whether the token sampled for ``req`` this step is real output. Only once the
        whole prompt is known; not for a request given only part of its prompt (chapter 2.4's chunks).
        """
        return req.device_len >= self.status[req.uid].prompt_len

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

    def _schedule_next_batch(self) -> ForwardInput | None:
        """先让等待队列策略排好这一步的队（它留下的请求这一步不接纳，之后回到队尾），再让策略选出下一步（预填充还是
        解码），准备它；两样都没有就返回 None。

        en: First let the waiting-queue policy arrange this step's queue (the requests it holds back are not admitted this
        step and go back to the tail afterwards), then let the policy pick the next step (a prefill or a decode) and
        prepare it; None when there is neither.
        """
        queue = self.prefill_manager
        queue.pending_list, held = self.queue_policy.arrange(queue.pending_list, self._uids_computing_prompt)
        batch = self.policy.next_batch(queue, self.decode_manager, self._make_prefill_adder)
        queue.pending_list = queue.pending_list + held
        return self._prepare_batch(batch) if batch is not None else None

    def _uids_computing_prompt(self) -> list[int]:
        """已被接纳、提示词还没进前缀缓存的请求（还没交出第一个输出 token）的 uid：等待队列的去重要知道。

        en: The uids of admitted requests whose prompt is not in the prefix cache yet (no first output token handed out
        yet): the waiting queue's dedup needs them.
        """
        return [uid for uid, s in self.status.items() if s.req is not None and not s.output_ids and not s.finished]

    def _prepare_batch(self, batch: Batch) -> ForwardInput:
        """算出这一步的 positions、输入映射、``out_loc`` 和新 token 的写回位置，并准备注意力与采样。

        en: Work out this step's positions, input mapping, ``out_loc`` and where the new tokens are written back, and
        prepare attention and sampling.
        """
        started = time.perf_counter()
        self.cache_manager.allocate_paged(batch.reqs)
        for req in batch.reqs:
            self.status[req.uid].req = req
        outputs = [self._samples_output(r) for r in batch.reqs]
        input_mapping, write_mapping = self._map_batch(batch, outputs)
        self.engine.attn_backend.prepare_metadata(batch)
        sample_args = self.engine.sampler.prepare(batch)
        trace = self.tracer.begin(batch, outputs, self.pages_in_use(), started, write_mapping)
        return ForwardInput(batch, sample_args, input_mapping, write_mapping, trace)

    def _map_batch(self, batch: Batch, outputs: list[bool]) -> tuple[IndexPair, IndexPair]:
        """这一步的输入映射和写回映射（都已在设备上），顺便填好 ``batch.positions`` 和 ``batch.out_loc``。``outputs``：
        每个请求这一步采样的是不是输出（:meth:`_samples_output`）。

        en: This step's input mapping and write-back mapping (both on the device), filling in ``batch.positions`` and
        ``batch.out_loc`` on the way. ``outputs``: whether each request's sample this step is output
        (:meth:`_samples_output`).
        """
        # TODO 任务 prepare_batch：返回这一步的两组索引 (input_mapping, write_mapping)：前者是这一步每个要算的 token 的（行号, 位置），请求按批次里的顺序，各自从已缓存的长度到设备上的长度；后者每个请求一对，是采样结果写回的地方——它那一行里紧接着已有 token 的位置，outputs 里它那一项为假（采到的不是输出）时改写到 scratch_row 的第 0 列。两组都是（行号, 位置）两个一维张量的二元组，经 _to_device 放上设备；再填好 batch.positions（int32）和 batch.out_loc（页表在这些（行号, 位置）上的值）
        # TODO task prepare_batch: return this step's two index sets (input_mapping, write_mapping): the first gives (row, position) for every token this step computes, requests in their order in the step, each over the range from its cached length until its length on the device; the second has one pair per request, where its sample is written back: its own row, right after the ids it already has, or column 0 of scratch_row when its entry of outputs is false (that sample is no output). Both are pairs of 1-D index vectors (row ids, positions) put on the device via _to_device; also fill batch.positions (int32) and batch.out_loc (the page table's values at those (row, position) pairs)
        raise TaskNotDone("scheduler", "prepare_batch")

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def _forward(self, fi: ForwardInput) -> ForwardOutput | Future[ForwardOutput]:
        """发出一步（主循环零件的 ``launch``，返回 ``ForwardOutput`` 或 ``Future``）；之后长度记账已推进，要读这一步的
        ``extend_len`` 得在调用之前。

        en: Launch a step (the main-loop part's ``launch``; returns a ``ForwardOutput`` or a ``Future``); the length
        bookkeeping is advanced after it, so read this step's ``extend_len`` before calling.
        """
        return self.loop.launch(fi)

    # 推理模式是线程局部的：主循环零件可能在后台线程里调用它，也要在这里进入
    # en: inference mode is per thread: the main-loop part may call this on a background thread, so enter it here too
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
        for row, (req, token, is_output) in enumerate(zip(batch.reqs, next_tokens, fi.trace.outputs)):
            if not is_output:  # 准备时就定了：不是输出 | en: decided when prepared: not an output
                continue
            status = self.status.get(req.uid)
            if status is None:  # 主循环零件归还得太早 | en: the main-loop part gave it back too early
                raise RuntimeError(tr(
                    "Request {uid} was given back while a launched step still computed it, so this step's token has no request to go to: give a settled request's slot and pages back only once no launched step uses them (the main-loop part's release)",
                    uid=req.uid))
            # 已经了结：被取消了，或者是结束之后（结束还不知道时）就发出的一步算出来的，丢掉
            # en: already settled: aborted, or computed by a step launched after its end (before the end was known): drop
            if status.finished:
                continue
            status.logprobs = self.engine.sampler.logprob_of(fi.sample_args, row)
            more = output.more_tokens[row] if output.more_tokens else []
            for k, tok in enumerate([token, *more]):
                if status.finished:  # 结束了，或被监听者取消了 | en: ended, or aborted by a listener
                    break
                if k:  # 同一步里验证出的下一个 token：记账像普通解码又走了一步 | en: the next token verified in the same step: bookkeeping as if plain decoding took one more step
                    req.complete_one()
                    status.logprobs = None
                self._take_token(req, status, tok, batch.is_prefill)
                if not status.finished:  # 没结束：告诉监听者这一步留下的 token | en: not finished: tell the listeners the token kept
                    self._emit(RequestEvent(req.uid, tok, False, None, status.logprobs))
        self.tracer.finish(fi.trace, started)

    def _take_token(self, req: Req, status: RequestStatus, token: int, prefill: bool) -> None:
        """把这一步为 ``req`` 采到的 ``token``（是输出，请求还没了结）交给它：记账、判断结束。``prefill``：这一步是不是
        预填充。

        en: Hand ``token``, sampled for ``req`` this step (an output, the request not settled yet), to its request:
        bookkeeping and deciding whether it ends. ``prefill``: whether this step is a prefill.
        """
        # TODO 任务 process_results：把这一步采到的 token 交给它的请求：请求的 input_ids 随之多一个（append_host；它得跟着 device_len 长，前缀缓存按它插入）；不是未被忽略的 EOS 就记进 output_ids；输出够了 max_tokens、或采到未被忽略的 EOS，请求就结束：离开 decode_manager（EOS 提前结束的不会自己离开），交给 _end（EOS 时不留 token；原因分别是 "length" 和 "stop"）；刚预填充完、还没结束的请求交给缓存管理器的 cache_req（标明未结束）
        # TODO task process_results: hand this step's sampled token to its request: the request's input_ids grows by one (append_host; it must keep pace with device_len, since the prefix cache inserts by it); record it in output_ids unless it is an EOS that is not ignored; once max_tokens are output, or on such an EOS, the request ends: it leaves decode_manager (one ended early by EOS would not leave by itself) and goes to _end (keeping nothing on EOS; the reason is "length" or "stop"); a request just prefilled that goes on is handed to the cache manager's cache_req, marked as not over
        raise TaskNotDone("scheduler", "process_results")

    def _end(self, status: RequestStatus, token: int | None, reason: str) -> None:
        """请求了结的唯一地方（生成够了、EOS、取消）：记下原因，告诉监听者，归还资源。

        en: The one place a request ends (enough tokens, EOS, abort): note why, tell the listeners, free its resources.
        """
        status.finish_reason = reason
        self._emit(RequestEvent(status.uid, token, True, reason, status.logprobs if token is not None else None))
        if status.req is not None:
            self._release_req(status.req)
        else:  # 还没被接纳：什么也没占着 | en: never admitted: it holds nothing
            del self.status[status.uid]

    def _release_req(self, req: Req) -> None:
        """请求了结：归还资源，什么时候还由主循环零件定（重叠时等用到它的批次算完）。

        en: A request is settled: give its resources back when the main-loop part decides (with overlap, once the
        batches using them are computed).
        """
        self.loop.release(req)

    def _free_req_resources(self, req: Req) -> None:
        """真正归还：请求槽、页面（交给缓存管理器），最后删掉它的账目。

        en: The actual freeing: the request slot, the pages (through the cache manager), and finally its bookkeeping.
        """
        self.table_manager.free(req.table_idx)
        self.cache_manager.cache_req(req, finished=True)
        self.status.pop(req.uid, None)

    @property
    def busy(self) -> bool:
        return self.prefill_manager.runnable or self.decode_manager.runnable or self.loop.busy

    def step(self) -> bool:
        """主循环的一次迭代。没事可做时返回 False。

        en: One iteration of the main loop. Returns False when there is nothing to do.
        """
        return self.loop.step()

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
        """等在途的计算算完、处理完结果（主循环零件的 ``drain``）。

        en: Finish computations in flight and their results (the main-loop part's ``drain``).
        """
        self.loop.drain()

    def check_integrity(self) -> None:
        """空闲时调用：请求槽全部归还，缓存管理器的账目对得上。

        en: Call when idle: every request slot is back, and the cache manager's totals match.
        """
        if self.busy:
            raise RuntimeError(tr("Some requests have not finished yet; the integrity check cannot run"))
        self.table_manager.check_integrity()
        self.cache_manager.check_integrity()

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[dict[str, Any]]:
        """按输入顺序返回 ``{"text", "token_ids"}``（不含 EOS；要了 ``logprobs`` 的再加 ``"logprobs"``）。先校验全部
        请求：有一个不合法就抛错，一个 token 也不算。

        en: Returns ``{"text", "token_ids"}`` in input order (without EOS; plus ``"logprobs"`` when asked). Every request
        is validated first: if one is invalid, it raises before a single token is computed.
        """
        requests = validate_requests(prompts, sampling_params, tokenizer=self.tokenizer, max_seq_len=self.max_seq_len)
        uids = [self.add_request(ids, sp) for ids, sp in requests]
        collector = OutputCollector(uids, [sp.logprobs for _, sp in requests])
        stop_listening = self.add_result_listener(collector)
        try:
            self.run_until_idle()
        finally:
            stop_listening()
        self.check_integrity()
        return collector.results(self.tokenizer.decode)

    def shutdown(self) -> None:
        self._drain()
        self.engine.shutdown()
        self.loop.shutdown()
