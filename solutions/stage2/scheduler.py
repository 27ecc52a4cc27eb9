"""第 2.1 章 scheduler：调度器骨架与离线接口 ``LLM.generate``。

第一阶段结束时，一个批次里有哪些请求、每个 token 的位置、K/V 写到哪个槽位，都是你手工填的。
调度器把这些自动化，并让请求来来去去：

- **主循环**：接收新请求 → 选出下一批 → 准备输入（positions、输入映射、``out_loc``）→ 前向 → 处理结果；
- **预填充优先**：有等待的请求就先做预填充，否则让正在运行的请求一起解码一步；
- **准入控制**：请求槽（页表的一行）只有 ``max_running_req`` 个；一步预填充的 token 数有预算
  ``max_extend_tokens``，用完就不再接纳新请求；
- **连续批处理**：请求一结束就离开、归还槽位，等待的请求下一步就能加入，不必等整批结束；
- **结果处理**：把采样出的 token 接到请求后面，判断是否结束（``max_tokens``，或没设
  ``ignore_eos`` 时遇到 EOS）。

本章的 KV 页面还是静态分配：每个请求槽固定分到同样多的页（第一阶段手工填页表的做法，自动化了）。
第 2.2 章换成按需分配。
"""

from __future__ import annotations

import heapq
import warnings
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple, Sequence

import torch
from transformers import AutoTokenizer

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig


def div_ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class SchedulerConfig(EngineConfig):
    """引擎配置再加上调度器的两个参数。

    - ``cache_type``：前缀缓存的种类；``None`` 表示用本章能提供的最好的那种
      （第 2.1、2.2 章只有 ``"naive"``，第 2.3 章起默认 ``"radix"``）；
    - ``max_extend_tokens``：一步预填充最多算多少个 token（预填充预算）。
    """

    cache_type: str | None = None
    max_extend_tokens: int = 8192


@dataclass(eq=False)
class PendingReq:
    """等待预填充的请求：还没有请求槽，也还没有 ``Req`` 对象。"""

    uid: int
    input_ids: torch.Tensor  # CPU 上的 1 维 int32：完整的提示词
    sampling_params: SamplingParams
    chunked_req: Req | None = None  # 第 2.4 章：上一块已经算过的那部分

    @property
    def input_len(self) -> int:
        return len(self.input_ids)

    @property
    def output_len(self) -> int:
        return self.sampling_params.max_tokens


@dataclass
class RequestStatus:
    """一个请求在主机这边的结果：输出的 token（不含 EOS）和状态。"""

    uid: int
    prompt_len: int
    max_tokens: int
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    aborted: bool = False


class ForwardInput(NamedTuple):
    """准备好的一步：批次、采样参数，以及在设备上读写 token 池用的两组下标。

    - ``input_mapping``：``(行号, 位置)``，每个要计算的 token 一对，``token_pool[input_mapping]`` 就是输入；
    - ``write_mapping``：``(行号, 位置)``，每个请求一对，采样出的新 token 写回 ``token_pool`` 的这里。
    """

    batch: Batch
    sample_args: Any
    input_mapping: tuple[torch.Tensor, torch.Tensor]
    write_mapping: tuple[torch.Tensor, torch.Tensor]


class TableManager:
    """请求槽：页表 / token 池的行。总是发出编号最小的空闲行，方便复现。"""

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
            raise RuntimeError(f"请求槽 {table_idx} 被重复释放")
        heapq.heappush(self._free, table_idx)

    def check_integrity(self) -> None:
        if sorted(self._free) != list(range(self.max_running_req)):
            busy = sorted(set(range(self.max_running_req)) - set(self._free))
            raise RuntimeError(f"请求槽没有全部归还：第 {busy} 行仍被占用")


class StaticCacheManager:
    """本章的 KV 分配：每个请求槽固定分到 ``num_pages // max_running_req`` 页，启动时一次写进页表。

    这样每个请求最多只能放 ``max_req_tokens`` 个 token（提示词 + 输出），哪怕别的槽位空着也借不到；
    第 2.2 章的 :class:`CacheManager` 改成按需分配来解决这个问题。
    """

    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor, max_running_req: int) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.page_table = page_table
        self.slot_tokens = (num_pages // max_running_req) * page_size
        self.max_req_tokens = min(self.slot_tokens, page_table.shape[1])
        if self.max_req_tokens < 2:
            raise ValueError(
                f"KV 池太小：{num_pages} 页分给 {max_running_req} 个请求槽，每个槽不到 2 个 token；"
                "请加大 num_page_override 或减小 max_running_req"
            )
        # >>> TASK static_pages: 第 row 行的第 j 列写 row * slot_tokens + j（j < max_req_tokens）：每个槽位一段连续的槽位
        width = self.max_req_tokens
        rows = torch.arange(max_running_req, dtype=torch.int32, device=page_table.device)
        cols = torch.arange(width, dtype=torch.int32, device=page_table.device)
        page_table[:max_running_req, :width] = rows[:, None] * self.slot_tokens + cols[None, :]
        # <<< TASK
        self._static = page_table[:max_running_req, :width].clone()

    def allocate_paged(self, reqs: Sequence[Req]) -> None:
        """静态分配：页表早就填好了，每步什么也不用做。"""

    def cache_req(self, req: Req, *, finished: bool) -> None:
        """静态分配：请求结束时页面随槽位一起归还，不用做任何事。"""

    def check_integrity(self) -> None:
        width = self._static.shape[1]
        if not torch.equal(self.page_table[: len(self._static), :width], self._static):
            raise RuntimeError("静态页表被改动过")


class PrefillAdder:
    """一步预填充的“装车员”：按顺序尝试接纳等待的请求，直到槽位或预算用完。"""

    def __init__(self, scheduler: Scheduler, token_budget: int) -> None:
        self.scheduler = scheduler
        self.table_manager = scheduler.table_manager
        self.cache_manager = scheduler.cache_manager
        self.token_pool = scheduler.token_pool
        self.token_budget = token_budget

    def try_add_one(self, pending: PendingReq) -> Req | None:
        """能接纳就返回新建的 ``Req``，否则返回 None（调用者就此停下，保持先来先服务）。"""
        if self.token_budget <= 0:
            return None
        resource = self._try_allocate_one(pending)
        if resource is None:
            return None
        cache_handle, table_idx, cached_len = resource
        return self._add_one_req(pending, cache_handle, table_idx, cached_len)

    def _try_allocate_one(self, pending: PendingReq) -> tuple[Any, int, int] | None:
        """给请求找资源：一个请求槽。返回 ``(缓存句柄, 槽号, 已缓存长度)``；本章没有前缀缓存。"""
        if self.table_manager.available_size == 0:
            return None
        return None, self.table_manager.allocate(), 0

    def _add_one_req(self, pending: PendingReq, cache_handle: Any, table_idx: int, cached_len: int) -> Req:
        """接纳整段提示词：写进 token 池、扣预算、建 ``Req``。

        没有分块时，最后一个请求可以超出剩余预算（否则比预算长的提示词永远进不来）。
        """
        # >>> TASK add_one_req: 把提示词 input_ids[cached_len:] 写进 token_pool 第 table_idx 行的对应位置；预算减去要算的 token 数；返回 Req
        extend = pending.input_ids[cached_len:]
        self.token_pool[table_idx, cached_len : pending.input_len].copy_(extend, non_blocking=True)
        self.token_budget -= len(extend)
        return Req(
            input_ids=pending.input_ids,
            table_idx=table_idx,
            cached_len=cached_len,
            output_len=pending.output_len,
            uid=pending.uid,
            sampling_params=pending.sampling_params,
            cache_handle=cache_handle,
        )
        # <<< TASK


class PrefillManager:
    """等待队列：先来先服务，预填充一步接纳尽量多的请求。"""

    def __init__(self) -> None:
        self.pending_list: list[PendingReq] = []

    def add_one_req(self, pending: PendingReq) -> None:
        self.pending_list.append(pending)

    @property
    def runnable(self) -> bool:
        return len(self.pending_list) > 0

    def schedule_next_batch(self, adder: PrefillAdder) -> Batch | None:
        """从队首开始让 ``adder`` 接纳请求，第一个接纳不了的就停下；一个都没有就返回 None。

        接纳了但提示词没算完的请求（第 2.4 章的分块）留在队首，下一步接着算。
        """
        # >>> TASK schedule_prefill: 依次 adder.try_add_one(队列里的请求)，遇到 None 就停；更新队列（没算完提示词的留在队首）；返回预填充批次
        admitted: list[tuple[PendingReq, Req]] = []
        for pending in self.pending_list:
            req = adder.try_add_one(pending)
            if req is None:
                break
            admitted.append((pending, req))
        if not admitted:
            return None
        unfinished = [p for p, r in admitted if r.device_len < p.input_len]
        self.pending_list = unfinished + self.pending_list[len(admitted) :]
        return Batch(reqs=[r for _, r in admitted], phase="prefill")
        # <<< TASK

    def abort_req(self, uid: int) -> PendingReq | None:
        for i, pending in enumerate(self.pending_list):
            if pending.uid == uid:
                return self.pending_list.pop(i)
        return None


class DecodeManager:
    """正在运行（已预填充、还要继续解码）的请求，按加入顺序排列。"""

    def __init__(self) -> None:
        self.running_reqs: dict[Req, None] = {}  # 用 dict 当有序集合

    @property
    def runnable(self) -> bool:
        return len(self.running_reqs) > 0

    def filter_reqs(self, reqs: Sequence[Req]) -> None:
        """一步发出之后：刚预填充完的加入，已经生成够 ``max_tokens`` 的离开（``can_decode`` 为假）。"""
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


class Scheduler:
    """调度器兼离线接口：``Scheduler(model_path, dtype=..., **配置)``，然后 ``generate(prompts, sampling_params)``。

    每一章在上一章的 ``Scheduler`` 上派生，只改它新增能力的那几个方法；``LLM`` 就是本章的调度器。
    """

    #: 本章支持的前缀缓存种类，第一个是默认值。
    supported_cache_types: tuple[str, ...] = ("naive",)
    prefill_adder_cls: type[PrefillAdder] = PrefillAdder

    def __init__(self, model_path: str, dtype: torch.dtype | None = None, **kwargs: Any) -> None:
        config = SchedulerConfig(model_path=str(model_path), dtype=dtype, **kwargs)
        config.cache_type = self._resolve_cache_type(config.cache_type)
        if config.max_extend_tokens < 1:
            raise ValueError(f"max_extend_tokens 至少为 1，收到 {config.max_extend_tokens}")
        self.config = config
        engine_fields = {f.name: getattr(config, f.name) for f in fields(EngineConfig)}
        self.engine = Engine(EngineConfig(**engine_fields))
        self.device = self.engine.device
        self.page_size = config.page_size
        self.page_table: torch.Tensor = self.engine.page_table
        self.token_pool: torch.Tensor = self.engine.token_pool
        self.max_running_req = config.max_running_req
        self.scratch_row = self.max_running_req  # 页表 / token 池的最后一行：不属于任何请求，写了也无妨
        self.tokenizer = AutoTokenizer.from_pretrained(config.model_path)
        self.eos_token_id = self.tokenizer.eos_token_id
        self.table_manager = TableManager(self.max_running_req)
        self.cache_manager = self._make_cache_manager()
        self.prefill_manager = PrefillManager()
        self.decode_manager = DecodeManager()
        self.prefill_budget = config.max_extend_tokens
        self.status: dict[int, RequestStatus] = {}
        self._uid_counter = 0

    # ------------------------------------------------------------------ 每章可以换掉的部件

    def _resolve_cache_type(self, cache_type: str | None) -> str:
        if cache_type is None:
            return self.supported_cache_types[0]
        if cache_type not in self.supported_cache_types:
            known = ", ".join(repr(t) for t in self.supported_cache_types)
            raise ValueError(
                f"未知或本章不支持的 cache_type={cache_type!r}：本章的引擎支持 {known}"
                "（radix 前缀缓存在第 2.3 章实现）"
            )
        return cache_type

    def _make_cache_manager(self) -> Any:
        return StaticCacheManager(self.engine.num_pages, self.page_size, self.page_table, self.max_running_req)

    def _make_prefill_adder(self) -> PrefillAdder:
        return self.prefill_adder_cls(self, self.prefill_budget)

    @property
    def max_seq_len(self) -> int:
        """一个请求最多有多少个 token（提示词 + 输出）：受页表宽度和静态分到的页面两重限制。"""
        return min(self.engine.max_seq_len, self.cache_manager.max_req_tokens)

    def _samples_output(self, req: Req) -> bool:
        """这一步为 ``req`` 采样的 token 是否是真正的输出。本章总是；第 2.4 章的分块请求不是。"""
        return True

    # ------------------------------------------------------------------ 接收请求

    def add_request(self, input_ids: torch.Tensor | Sequence[int], sampling_params: SamplingParams) -> int:
        """提交一个已经校验过的请求（token id），返回它的 uid。"""
        input_ids = torch.as_tensor(input_ids, dtype=torch.int32).reshape(-1).cpu()
        uid = self._uid_counter
        self._uid_counter += 1
        self.status[uid] = RequestStatus(uid, len(input_ids), sampling_params.max_tokens)
        self.prefill_manager.add_one_req(PendingReq(uid, input_ids, sampling_params))
        return uid

    def abort(self, uid: int) -> None:
        """取消一个请求：它不再输出任何 token，占用的槽位和页面全部归还。"""
        status = self.status[uid]
        if status.finished or status.aborted:
            return
        status.aborted = True
        if (pending := self.prefill_manager.abort_req(uid)) is not None:
            if pending.chunked_req is not None:  # 第 2.4 章：算了一半的请求已占着槽位和页面
                self._release_req(pending.chunked_req)
            return
        if (req := self.decode_manager.abort_req(uid)) is not None:
            self._release_req(req)

    # ------------------------------------------------------------------ 调度与准备

    def _schedule_next_batch(self) -> ForwardInput | None:
        """预填充优先：有能接纳的等待请求就做预填充，否则所有运行中的请求解码一步。"""
        # >>> TASK prefill_first: 先试 prefill_manager.schedule_next_batch(新的 adder)，没有再试 decode_manager；有批次就 _prepare_batch
        batch = None
        if self.prefill_manager.runnable:
            batch = self.prefill_manager.schedule_next_batch(self._make_prefill_adder())
        batch = batch or self.decode_manager.schedule_next_batch()
        return self._prepare_batch(batch) if batch is not None else None
        # <<< TASK

    def _prepare_batch(self, batch: Batch) -> ForwardInput:
        """算出这一步的 positions、输入映射、``out_loc`` 和新 token 的写回位置，并准备注意力与采样。"""
        self.cache_manager.allocate_paged(batch.reqs)
        # >>> TASK prepare_batch: positions = 各请求 arange(cached_len, device_len) 拼起来；行号按 extend_len 重复；out_loc = page_table[行号, positions]；写回位置 (table_idx, device_len)，不是输出的写到 scratch_row
        reqs = batch.reqs
        positions = torch.cat([torch.arange(r.cached_len, r.device_len, dtype=torch.int64) for r in reqs])
        rows = torch.repeat_interleave(
            torch.tensor([r.table_idx for r in reqs], dtype=torch.int64),
            torch.tensor([r.extend_len for r in reqs], dtype=torch.int64),
        )
        write_rows = [r.table_idx if self._samples_output(r) else self.scratch_row for r in reqs]
        write_cols = [r.device_len if self._samples_output(r) else 0 for r in reqs]
        input_mapping = (self._to_device(rows), self._to_device(positions))
        write_mapping = (self._to_device(torch.tensor(write_rows)), self._to_device(torch.tensor(write_cols)))
        batch.positions = input_mapping[1].to(torch.int32)
        batch.out_loc = self.page_table[input_mapping]
        # <<< TASK
        self.engine.attn_backend.prepare_metadata(batch)
        sample_args = self.engine.sampler.prepare(batch)
        return ForwardInput(batch, sample_args, input_mapping, write_mapping)

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    # ------------------------------------------------------------------ 前向

    def _forward(self, fi: ForwardInput) -> Any:
        """发出一步前向，然后更新运行中的请求（刚预填充完的加入，生成够了的离开）。

        前向发出时每个请求的 ``complete_one()`` 就被调用了，所以读 ``extend_len`` 要在调用本函数之前。
        """
        output = self._run_batch(fi)
        self.decode_manager.filter_reqs(fi.batch.reqs)
        return output

    def _run_batch(self, fi: ForwardInput, complete_reqs: bool = True) -> Any:
        """在设备上跑一步：从 token 池取输入 → 引擎前向并采样 → 新 token 按 ``write_mapping`` 写回 token 池。"""
        batch = fi.batch
        batch.input_ids = self.token_pool[fi.input_mapping]
        output = self.engine.forward_batch(batch, fi.sample_args, complete_reqs=complete_reqs, write_tokens=False)
        self.token_pool[fi.write_mapping] = output.next_tokens_gpu
        return output

    # ------------------------------------------------------------------ 处理结果

    def _process_last_data(self, last_data: tuple[ForwardInput, Any] | None) -> None:
        """把一步的采样结果交给各个请求：记下输出、判断结束、归还资源。"""
        if last_data is None:
            return
        fi, output = last_data
        output.copy_done_event.synchronize()
        batch = fi.batch
        next_tokens = output.next_tokens_cpu.tolist()
        for req, token in zip(batch.reqs, next_tokens):
            status = self.status[req.uid]
            if not self._samples_output(req) or status.aborted:
                continue
            if status.finished:  # 第 2.5 章：请求已经结束，这是它结束后多算的一步，丢掉
                continue
            # >>> TASK process_results: 记下 token（EOS 不记）；生成够 max_tokens、或遇到 EOS 且没设 ignore_eos 就结束并归还资源；预填充完没结束的请求交给 cache_manager.cache_req(finished=False)
            req.append_host(torch.tensor([token], dtype=torch.int32))
            is_eos = token == self.eos_token_id and not req.sampling_params.ignore_eos
            if not is_eos:
                status.output_ids.append(token)
            if is_eos or len(status.output_ids) >= status.max_tokens:
                status.finished = True
                self.decode_manager.remove_req(req)
                self._release_req(req)
            elif batch.is_prefill:
                self.cache_manager.cache_req(req, finished=False)
            # <<< TASK

    def _release_req(self, req: Req) -> None:
        """请求结束或被取消：归还资源（第 2.5 章要等用到它的批次都算完才能还）。"""
        self._free_req_resources(req)

    def _free_req_resources(self, req: Req) -> None:
        self.table_manager.free(req.table_idx)
        self.cache_manager.cache_req(req, finished=True)

    # ------------------------------------------------------------------ 主循环

    @property
    def busy(self) -> bool:
        return self.prefill_manager.runnable or self.decode_manager.runnable

    def step(self) -> bool:
        """主循环的一次迭代：调度 → 准备 → 前向 → 处理结果。没事可做时返回 False。"""
        # >>> TASK normal_loop: 调度出下一步（没有就返回 False），_forward 它，再 _process_last_data((fi, 输出))，返回 True
        fi = self._schedule_next_batch()
        if fi is None:
            return False
        output = self._forward(fi)
        self._process_last_data((fi, output))
        return True
        # <<< TASK

    @torch.inference_mode()
    def run_until_idle(self) -> None:
        """一直迭代到所有请求都结束。"""
        while self.busy:
            if not self.step() and self.busy:
                raise RuntimeError(
                    "调度器卡住了：还有请求在等，却一个也接纳不了（槽位或 KV 页面不够，而且没有运行中的请求会释放它们）"
                )
        self._drain()

    def _drain(self) -> None:
        """等在途的计算都结束（第 2.5 章用）。"""

    def check_integrity(self) -> None:
        """空闲时调用：请求槽全部归还，缓存管理器的账目对得上。"""
        if self.busy:
            raise RuntimeError("还有请求没结束，不能做完整性检查")
        self.table_manager.check_integrity()
        self.cache_manager.check_integrity()

    # ------------------------------------------------------------------ 离线接口

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[dict[str, Any]]:
        """为每个提示词生成文本，按输入顺序返回 ``{"text": ..., "token_ids": [...]}``（不含 EOS）。

        先校验全部请求，有任何一个不合法就抛错，一个 token 也不算。
        """
        requests = self._validate(prompts, sampling_params)
        uids = [self.add_request(ids, sp) for ids, sp in requests]
        self.run_until_idle()
        self.check_integrity()
        results = []
        for uid in uids:
            status = self.status.pop(uid)
            results.append({"text": self.tokenizer.decode(status.output_ids), "token_ids": status.output_ids})
        return results

    def _validate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
    ) -> list[tuple[torch.Tensor, SamplingParams]]:
        if isinstance(prompts, (str, torch.Tensor)) or not isinstance(prompts, Sequence):
            raise TypeError("prompts 应该是列表：每个元素是一个字符串，或一个 token id 列表")
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(
                    f"sampling_params 的个数（{len(params)}）与 prompts 的个数（{len(prompts)}）不一致；"
                    "要么给一个 SamplingParams 让所有提示词共用，要么每个提示词给一个"
                )
        vocab = len(self.tokenizer)
        out: list[tuple[torch.Tensor, SamplingParams]] = []
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            if not isinstance(sp, SamplingParams):
                raise TypeError(f"第 {i} 个提示词的采样参数不是 SamplingParams，而是 {type(sp).__name__}")
            try:
                sp.validate()
            except ValueError as e:
                raise ValueError(f"第 {i} 个提示词的采样参数不合法：{e}") from None
            if isinstance(prompt, str):
                ids = self.tokenizer.encode(prompt, add_special_tokens=False)
            elif isinstance(prompt, (Sequence, torch.Tensor)):
                ids = [int(t) for t in prompt]
            else:
                raise TypeError(f"第 {i} 个提示词既不是字符串也不是 token id 列表：{type(prompt).__name__}")
            if len(ids) == 0:
                raise ValueError(f"第 {i} 个提示词是空的：至少要有 1 个 token")
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"第 {i} 个提示词含有词表（大小 {vocab}）之外的 token id：{bad[:5]}")
            limit = self.max_seq_len
            if len(ids) >= limit:
                raise ValueError(
                    f"第 {i} 个提示词有 {len(ids)} 个 token，达到了单个请求的长度上限 {limit}"
                    "（提示词之后至少还要放 1 个输出 token）"
                )
            if sp.max_tokens > limit - len(ids):
                warnings.warn(
                    f"第 {i} 个提示词：max_tokens={sp.max_tokens} 超出长度上限 {limit}，"
                    f"截成 {limit - len(ids)}（提示词 {len(ids)} 个 token）",
                    stacklevel=3,
                )
                sp = replace(sp, max_tokens=limit - len(ids))
            self._check_fits(i, len(ids), sp.max_tokens)
            out.append((torch.tensor(ids, dtype=torch.int32), sp))
        return out

    def _check_fits(self, index: int, input_len: int, max_tokens: int) -> None:
        """请求再怎么等也放不下时要立刻报错，而不是永远等下去。本章由 max_seq_len 已经保证。"""

    def shutdown(self) -> None:
        self._drain()
        self.engine.shutdown()


#: 离线接口：本章的调度器本身就提供 ``generate``。
LLM = Scheduler
