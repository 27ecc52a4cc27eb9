"""调度器的公共零件：配置、几种纯数据（等待中的请求、请求的结果、准备好的一步）、请求槽管理和解码队列。

它们不含要你写的代码，各章的调度器都用同一份（和 mini-sglang 一样，放在调度器主文件之外）。

en: Shared parts of the scheduler: the configuration, some plain data (waiting requests, request results, a prepared
step), the request-slot manager and the decode queue.

They hold no code for you to write, and every chapter's scheduler uses the same copy (as in mini-sglang, they live
outside the scheduler's main file).
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import torch

from minisgl.core import Batch
from minisgl.engine import Engine, EngineConfig, Sampler
from minisgl.i18n import tr

if TYPE_CHECKING:
    from minisgl.core import Req, SamplingParams
    from minisgl.trace import StepTrace


#: 采样器的做法：``(引擎, EOS 的 id, 分词器) -> 采样器``。调度器默认用引擎自己的（第 1.6 章）；组装好的引擎
#: （:mod:`minisgl.llm`）给它一个带采样控制和语法的（第 3.5、3.6 章）。
#: en: How to make the sampler: ``(engine, EOS id, tokenizer) -> sampler``. The scheduler keeps the engine's own by
#: default (chapter 1.6); the assembled engine (:mod:`minisgl.llm`) hands it one with sampling controls and grammars
#: (chapters 3.5 and 3.6).
SamplerFactory = Callable[[Engine, "int | None", Any], Sampler]

#: KV 缓存管理器的做法：``(引擎, 配置, 请求槽管理器) -> 缓存管理器``。第 2.1 章是静态分页，第 2.2 章按需分页，
#: 第 2.3 章配上 radix 前缀缓存。
#: en: How to make the KV cache manager: ``(engine, config, request-slot manager) -> cache manager``. Chapter 2.1's
#: pages are static, chapter 2.2's are allocated on demand, chapter 2.3 adds the radix prefix cache.
CacheManagerFactory = Callable[[Engine, "SchedulerConfig", "TableManager"], Any]

#: 等待队列策略的做法：``(配置, 缓存管理器) -> 策略``，策略每一步的 ``arrange(等待的请求, 正在算提示词的 uid)``
#: 返回（按这个顺序接纳的, 这一步留下的）。缺省是给定的 :func:`minisgl.schedule_policy.make_queue_policy`（按
#: ``schedule_policy`` 选；按缓存排队要第 2.3 章的零件交进来的只读匹配和去重，没有就是先来先服务）。
#: en: How to make the waiting-queue policy: ``(config, cache manager) -> policy``, whose ``arrange(waiting requests,
#: uids computing their prompt)`` returns, each step, (those to admit, in this order; those held back this step). The
#: default is the given :func:`minisgl.schedule_policy.make_queue_policy` (chosen by ``schedule_policy``; queueing by
#: the cache needs the read-only match and the dedup chapter 2.3's part hands in, and is first come, first served
#: without them).
QueuePolicyFactory = Callable[["SchedulerConfig", Any], Any]

#: 加载完的权重怎么处理：``(引擎, 配置) -> None``，调度器建好引擎后立刻调用一次。缺省什么也不做；组装好的引擎
#: （:mod:`minisgl.llm`）配置了 ``quantization`` 时把线性层的权重换成量化的（第 5.4 章）。
#: en: What to do with the loaded weights: ``(engine, config) -> None``, called once right after the scheduler builds
#: en: its engine. By default nothing; the assembled engine (:mod:`minisgl.llm`) replaces the linear layers' weights
#: en: with quantized ones when ``quantization`` is configured (chapter 5.4).
WeightsHook = Callable[[Engine, "SchedulerConfig"], None]


@dataclass(frozen=True)
class SchedulerParts:
    """调度器除了引擎以外握着的零件。``None`` 就用第 2.1 章自己的；后面每一章交出其中一样，组装
    （:mod:`minisgl.llm`）把它们装在一起。调度器只通过各零件文档里写的那几个方法用它们。

    - ``cache_manager`` / ``cache_types``：KV 缓存管理器的做法，和它认得的前缀缓存种类（第一个是默认值）；
    - ``prefill_adder``：一步预填充的准入员类（第 2.2 章要预留页面，第 2.4 章会切块）；
    - ``policy``：每一步选预填充还是解码的策略类（第 2.4 章让解码插在分块之间）；
    - ``loop``：主循环类，拿到调度器本身（第 2.5 章的重叠调度）；
    - ``sampler``：采样器的做法（第 3.5、3.6 章的采样控制和语法）；
    - ``queue_policy``：等待队列的顺序（按 ``schedule_policy`` 选；第 2.3 章配上只读匹配和去重，见 :mod:`minisgl.schedule_policy`）；
    - ``weights``：引擎加载完权重之后对它们做的事（第 5.4 章：量化），见 :data:`WeightsHook`。

    en: The parts a scheduler holds besides its engine. ``None`` means chapter 2.1's own; each later chapter delivers
    one of them, and the assembly (:mod:`minisgl.llm`) puts them together. The scheduler uses a part only through the
    few methods its docstring names.

    - ``cache_manager`` / ``cache_types``: how to make the KV cache manager, and the prefix-cache kinds it knows (the
      first is the default);
    - ``prefill_adder``: the class that admits requests into one prefill step (chapter 2.2 reserves pages, chapter 2.4
      cuts chunks);
    - ``policy``: the class that picks prefill or decode for each step (chapter 2.4 lets decodes run between chunks);
    - ``loop``: the main-loop class, given the scheduler itself (chapter 2.5's overlap scheduling);
    - ``sampler``: how to make the sampler (chapters 3.5 and 3.6: sampling controls and grammars);
    - ``queue_policy``: the order of the waiting queue (chosen by ``schedule_policy``; chapter 2.3 adds the read-only
      match and the dedup; see :mod:`minisgl.schedule_policy`);
    - ``weights``: what is done to the engine's weights once they are loaded (chapter 5.4: quantization), see
      :data:`WeightsHook`.
    """

    cache_manager: CacheManagerFactory | None = None
    cache_types: tuple[str, ...] = ("naive",)
    prefill_adder: type | None = None
    policy: type | None = None
    loop: Callable[[Any], MainLoop] | None = None
    sampler: SamplerFactory | None = None
    queue_policy: QueuePolicyFactory | None = None
    weights: WeightsHook | None = None


class TokenLogprob(NamedTuple):
    """一个采到的 token 的对数概率，以及概率最大的 ``len(top_ids)`` 个 token 的（从大到小）。

    en: The log-probability of one sampled token, and those of the ``len(top_ids)`` most likely tokens (largest first).
    """

    logprob: float
    top_ids: list[int]
    top_logprobs: list[float]


def div_ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(eq=False)
class PendingReq:
    """等待预填充的请求：还没有请求槽，也还没有 ``Req`` 对象。

    en: A request waiting for prefill: it has no request slot and no ``Req`` object yet.
    """

    uid: int
    input_ids: torch.Tensor  # CPU 上的 1 维 int32：完整的提示词 | en: 1-D int32 on the CPU: the whole prompt
    sampling_params: SamplingParams
    chunked_req: Req | None = None  # 第 2.4 章：上一块已经算过的那部分 | en: chapter 2.4: the part computed by the previous chunk

    @property
    def input_len(self) -> int:
        return len(self.input_ids)

    @property
    def output_len(self) -> int:
        return self.sampling_params.max_tokens


@dataclass
class RequestStatus:
    """调度器对一个还没了结的请求的账目：输出了几个 token（不含 EOS）、是否结束及原因、占着资源的 ``Req``。

    请求的资源归还时，调度器就把它的账目删掉：结果靠 :class:`RequestEvent` 送到监听者手里，不留在这里。

    en: The scheduler's bookkeeping for a request that is not settled yet: the tokens output so far (without EOS),
    whether it finished and why, and the ``Req`` holding its resources.

    Once the request's resources are given back the scheduler deletes this entry: results reach the listeners as
    :class:`RequestEvent`, they are not kept here.
    """

    uid: int
    prompt_len: int
    max_tokens: int
    output_ids: list[int] = field(default_factory=list)
    #: ``"length"`` / ``"stop"`` / ``"abort"``；``None``：还没结束
    #: en: ``"length"`` / ``"stop"`` / ``"abort"``; ``None``: not finished yet
    finish_reason: str | None = None
    #: 占着请求槽和页面的 ``Req``（每次被调度时更新）；``None``：还没被接纳
    #: en: the ``Req`` holding the slot and pages (updated each time it is scheduled); ``None``: not admitted yet
    req: Req | None = None
    #: 这一步交出的 token 的对数概率（第 3.5 章，请求要了才有）
    #: en: the log-probabilities of the token handed out this step (chapter 3.5, only when the request asked)
    logprobs: TokenLogprob | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestEvent(NamedTuple):
    """结果处理为一个请求做出的决定：一步一个（出了 token 或结束时），取消时一个。

    - ``token``：这一步留下的输出 token；``None``：没有（遇到 EOS、被取消）；
    - ``finished`` / ``reason``：结束了没有，为什么：``"length"``（到了 max_tokens）、``"stop"``（EOS）、``"abort"``（取消）。

    en: What result processing decided for one request: one per step (when it output a token or finished), one on abort.

    - ``token``: the output token kept this step; ``None``: none (EOS, aborted);
    - ``finished`` / ``reason``: whether it finished and why: ``"length"`` (max_tokens reached), ``"stop"`` (EOS),
      ``"abort"`` (aborted).
    """

    uid: int
    token: int | None
    finished: bool
    reason: str | None
    logprobs: TokenLogprob | None = None  # 第 3.5 章：``token`` 的对数概率 | en: chapter 3.5: the log-probabilities of ``token``


#: 结果监听者：每个 :class:`RequestEvent` 调用一次。
#: en: A result listener: called once per :class:`RequestEvent`.
ResultListener = Callable[[RequestEvent], None]


#: ``(行号, 位置)``：两个等长的一维下标张量，一次索引页表或 token 池里的许多格。
#: en: ``(rows, positions)``: two 1-D index tensors of equal length that index many cells of the page table or token
#: pool at once.
IndexPair = tuple[torch.Tensor, torch.Tensor]


class ForwardInput(NamedTuple):
    """准备好的一步：批次、采样参数、在设备上读写 token 池用的两组下标，以及这一步的轨迹。

    - ``input_mapping``：``(行号, 位置)``，每个要计算的 token 一对，``token_pool[input_mapping]`` 就是输入；
    - ``write_mapping``：``(行号, 位置)``，每个请求一对，采样出的新 token 写回 ``token_pool`` 的这里。

    en: A prepared step: the batch, the sampling parameters, the two index sets for reading and writing the token pool
    on the device, and the step's trace.

    - ``input_mapping``: ``(row, position)``, one pair per token to compute; ``token_pool[input_mapping]`` is the input;
    - ``write_mapping``: ``(row, position)``, one pair per request; the sampled new token is written back to
      ``token_pool`` there.
    """

    batch: Batch
    sample_args: Any
    input_mapping: IndexPair
    write_mapping: IndexPair
    trace: StepTrace


class StaticCacheManager:
    """第 2.1 章的 KV 分配：每个请求槽固定分到 ``num_pages // max_running_req`` 页，启动时按 ``layout``（第 2.1 章的
    ``static_page_table``）一次写进页表。

    这样每个请求最多只能放 ``max_req_tokens`` 个 token（提示词 + 输出），哪怕别的槽位空着也借不到；
    按需分配的缓存管理器（第 2.2 章换上的零件）解决这个问题。

    调度器用到的缓存管理器接口：``allocate_paged``、``cache_req``、``reserved_tokens``、``pages_in_use``、
    ``max_req_tokens``、``check_integrity``。

    en: Chapter 2.1's KV allocation: each request slot gets a fixed ``num_pages // max_running_req`` pages, written
    into the page table once at start-up by ``layout`` (chapter 2.1's ``static_page_table``).

    So a request holds at most ``max_req_tokens`` tokens (prompt + output), and cannot borrow from other slots even when
    they are empty; a cache manager that allocates on demand (the part chapter 2.2 swaps in) solves this.

    The cache-manager interface the scheduler uses: ``allocate_paged``, ``cache_req``, ``reserved_tokens``,
    ``pages_in_use``, ``max_req_tokens``, ``check_integrity``.
    """

    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor, table_manager: TableManager,
                 layout: Callable[[int, int, int, torch.device], torch.Tensor]) -> None:
        max_running_req = table_manager.max_running_req
        self.table_manager = table_manager
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
        width = self.max_req_tokens
        page_table[:max_running_req, :width] = layout(max_running_req, self.slot_tokens, width, page_table.device)
        self._static = page_table[:max_running_req, :width].clone()

    def allocate_paged(self, reqs: Sequence[Req]) -> None:
        """静态分配：页表早就填好了，每步什么也不用做。

        en: Static allocation: the page table was filled in long ago, so there is nothing to do each step.
        """

    def cache_req(self, req: Req, *, finished: bool) -> None:
        """静态分配：请求结束时页面随槽位一起归还，不用做任何事。

        en: Static allocation: a finished request's pages go back with its slot, so there is nothing to do.
        """

    def reserved_tokens(self, claims: Sequence[tuple[int, int]]) -> int:
        """请求将来还要新分配的 token 位置（``claims``：每个占着槽位的请求一对 ``(总长度, 已缓存长度)``）。静态分配时
        它们的页早就分好了：0。

        en: Token positions requests will still need allocated (``claims``: one ``(total length, cached length)`` pair
        per request holding a slot). With static allocation their pages were allocated long ago: 0.
        """
        return 0

    def pages_in_use(self) -> int:
        """KV 池里正被占用的页数：每个占用中的请求槽静态分到的那些页。

        en: Pages of the KV pool in use: the pages statically given to each occupied request slot.
        """
        busy = self.table_manager.max_running_req - self.table_manager.available_size
        return busy * self.slot_tokens // self.page_size

    def check_integrity(self) -> None:
        width = self._static.shape[1]
        if not torch.equal(self.page_table[: len(self._static), :width], self._static):
            raise RuntimeError(tr("The static page table was modified"))


class MainLoop(ABC):
    """主循环零件共有的部分；``step`` 由各章写（第 2.1 章的 ``NormalLoop``、第 2.5 章的 ``OverlapLoop``）。
    它只用调度器的 ``_schedule_next_batch``、``_forward``、``_run_batch``、``_process_last_data``、
    ``_free_req_resources``、``decode_manager``；调度器只用它的公开方法。

    en: What every main-loop part shares; ``step`` is written by the chapters (chapter 2.1's ``NormalLoop``, chapter
    2.5's ``OverlapLoop``). It uses only the scheduler's ``_schedule_next_batch``, ``_forward``, ``_run_batch``,
    ``_process_last_data``, ``_free_req_resources`` and ``decode_manager``; the scheduler uses only its public methods.
    """

    #: 投机解码的统计（:class:`minisgl.speculative.SpecStats`；只有投机解码的循环有，``/metrics`` 读它）。
    #: en: speculative decoding's statistics (:class:`minisgl.speculative.SpecStats`; only the speculative loop has
    #: en: them, ``/metrics`` reads them).
    spec_stats: Any = None

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    @abstractmethod
    def step(self) -> bool:
        """主循环的一次迭代；没事可做时返回 False。

        en: One iteration of the main loop; returns False when there is nothing to do.
        """

    @property
    def busy(self) -> bool:
        """有没有发出了、结果还没处理的一步。

        en: Whether a launched step's results are still unprocessed.
        """
        return False

    def launch(self, fi: ForwardInput) -> Any:
        """发出一步并同步算完：在设备上算它，推进每个请求的长度记账，再更新运行中的请求（刚预填充完的加入，生成够了的
        离开）。``complete_one()`` 在发出时就调用，所以要读这一步的 ``extend_len``，得在这之前。

        en: Launch a step and compute it synchronously: run it on the device, advance each request's length
        bookkeeping, then update the running requests (those just prefilled join, those done generating leave).
        ``complete_one()`` is called at launch, so anything that reads this step's ``extend_len`` must do so before.
        """
        output = self.scheduler._run_batch(fi)
        for req in fi.batch.reqs:
            req.complete_one()
        self.scheduler.decode_manager.filter_reqs(fi.batch.reqs)
        return output

    def release(self, req: Req) -> None:
        """请求了结：立刻归还资源。

        en: A request is settled: give its resources back at once.
        """
        self.scheduler._free_req_resources(req)

    def drain(self) -> None:
        """等在途的计算算完、处理完结果；这里从来没有。

        en: Finish computations in flight; never any here.
        """

    def shutdown(self) -> None:
        """调度器关掉时调用。

        en: Called when the scheduler shuts down.
        """


class OutputCollector:
    """``generate`` 的结果监听者：按 uid 收集每个请求留下的 token（要了对数概率的也收集它们）。

    en: ``generate``'s result listener: collects the tokens each request keeps, by uid (and their log-probabilities for
    requests that asked).
    """

    def __init__(self, uids: Sequence[int], want_logprobs: Sequence[bool]) -> None:
        self.uids = list(uids)
        self.tokens: dict[int, list[int]] = {uid: [] for uid in self.uids}
        self.logprobs: dict[int, list[Any]] = {uid: [] for uid, want in zip(self.uids, want_logprobs) if want}

    def __call__(self, event: RequestEvent) -> None:
        if event.token is not None and event.uid in self.tokens:
            self.tokens[event.uid].append(event.token)
            if event.uid in self.logprobs:
                self.logprobs[event.uid].append(event.logprobs)

    def results(self, decode: Callable[[list[int]], str]) -> list[dict[str, Any]]:
        """按提交顺序：``{"text", "token_ids"}``，要了对数概率的再加 ``"logprobs"``。

        en: In submission order: ``{"text", "token_ids"}``, plus ``"logprobs"`` for requests that asked.
        """
        results = [{"text": decode(self.tokens[uid]), "token_ids": self.tokens[uid]} for uid in self.uids]
        for uid, result in zip(self.uids, results):
            if uid in self.logprobs:
                result["logprobs"] = self.logprobs[uid]
        return results


class TableManager:
    """请求槽：页表 / token 池的行。总是发出编号最小的空闲行，方便复现。

    en: Request slots: rows of the page table / token pool. Always hands out the lowest free row, so runs are
    reproducible.
    """

    def __init__(self, max_running_req: int) -> None:
        self.max_running_req = max_running_req
        self._free = list(range(max_running_req))

    @property
    def available_size(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        return heapq.heappop(self._free)

    def free(self, table_idx: int) -> None:
        if table_idx in self._free:
            raise RuntimeError(tr("Request slot {table_idx} freed twice", table_idx=table_idx))
        heapq.heappush(self._free, table_idx)

    def check_integrity(self) -> None:
        if sorted(self._free) != list(range(self.max_running_req)):
            busy = sorted(set(range(self.max_running_req)) - set(self._free))
            raise RuntimeError(tr("Not all request slots were returned: rows {busy} are still in use", busy=busy))


@dataclass
class SchedulerConfig(EngineConfig):
    """引擎配置再加上调度器的三个参数。

    - ``cache_type``：前缀缓存的种类；``None`` 表示用本章能提供的最好的那种
      （第 2.1、2.2 章只有 ``"naive"``，第 2.3 章起默认 ``"radix"``）；
    - ``max_extend_tokens``：一步预填充最多算多少个 token（预填充预算）；
    - ``schedule_policy``：等待队列的顺序，``"fcfs"``（缺省）、``"lpm"``、``"dfs-weight"`` 或 ``"random"``
      （见 :mod:`minisgl.schedule_policy`）。

    en: The engine configuration plus three scheduler parameters.

    - ``cache_type``: the kind of prefix cache; ``None`` means the best this chapter offers (only ``"naive"`` in
      chapters 2.1 and 2.2, ``"radix"`` by default from chapter 2.3 on);
    - ``max_extend_tokens``: the most tokens one prefill step computes (the prefill budget);
    - ``schedule_policy``: the order of the waiting queue, ``"fcfs"`` (the default), ``"lpm"``, ``"dfs-weight"`` or
      ``"random"`` (see :mod:`minisgl.schedule_policy`).
    """

    cache_type: str | None = None
    max_extend_tokens: int = 8192
    schedule_policy: str = "fcfs"
    # 投机解码（第 5 阶段，minisgl.speculative），名字和缺省值照 SGLang 的服务器参数（容量除外：这里的树是 Python 对象）；
    # 只有组装好的引擎（minisgl.llm）认得
    # en: speculative decoding (stage 5, minisgl.speculative), names and defaults as SGLang's server flags (except the
    # en: capacity: this tree is made of Python objects); only the assembled engine (minisgl.llm) knows them
    speculative_algorithm: str | None = None  # None | "NGRAM" | "EARLY_EXIT"
    speculative_num_draft_tokens: int = 12  # 每个请求每步验证几个 token，含最后一个已知的 | en: tokens verified per request and step, the last known one included
    speculative_ngram_min_match_window_size: int = 1
    speculative_ngram_max_match_window_size: int = 12
    speculative_ngram_min_bfs_breadth: int = 1
    speculative_ngram_max_bfs_breadth: int = 10
    speculative_ngram_branch_length: int = 18
    speculative_ngram_capacity: int = 1_000_000
    # EARLY_EXIT 用目标模型的前几层起草（minisgl.early_exit）；None：按模型的层数挑
    # en: EARLY_EXIT drafts with the target model's first layers (minisgl.early_exit); None: picked by the model's layers
    speculative_draft_layers: int | None = None
    # 只量化权重（第 5.4 章，minisgl.quantized）：None | "int8wo" | "int4wo-G"，加载后量化；只有组装好的引擎认得
    # en: weight-only quantization (chapter 5.4, minisgl.quantized): None / "int8wo" / "int4wo-G", applied after
    # en: loading; only the assembled engine knows it
    quantization: str | None = None


class DecodeManager:
    """正在运行（已预填充、还要继续解码）的请求，按加入顺序排列。

    en: The running requests (prefilled, still decoding), in the order they joined.
    """

    def __init__(self) -> None:
        self.running_reqs: dict[Req, None] = {}  # 用 dict 当有序集合 | en: a dict used as an ordered set

    @property
    def runnable(self) -> bool:
        return len(self.running_reqs) > 0

    def filter_reqs(self, reqs: Sequence[Req]) -> None:
        """一步发出之后：刚预填充完的加入，已经生成够 ``max_tokens`` 的离开（``can_decode`` 为假）。

        en: After a step is launched: those just prefilled join, those that have generated ``max_tokens`` leave
        (``can_decode`` is false).
        """
        merged = dict.fromkeys([*self.running_reqs, *reqs])
        self.running_reqs = {r: None for r in merged if r.can_decode}

    def remove_req(self, req: Req) -> None:
        self.running_reqs.pop(req, None)

    def abort_req(self, uid: int) -> Req | None:
        for req in self.running_reqs:
            if req.uid == uid:
                del self.running_reqs[req]
                return req
        return None

    def schedule_next_batch(self) -> Batch | None:
        if not self.runnable:
            return None
        return Batch(reqs=list(self.running_reqs), phase="decode")
