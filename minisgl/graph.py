"""解码的 CUDA 图：把一整步解码前向录制一次，之后每步只回放。

小批次解码时，GPU 上真正的计算只有几百微秒，而 Python 逐层发出几百个内核要花毫秒级的主机时间——主机成了瓶颈
（第 2.5 章的重叠调度把调度藏到了计算后面，却藏不掉“发内核”本身）。CUDA 图把一步里的全部内核连同它们的参数
录下来，回放时一次提交，主机开销几乎为零。代价是形状必须固定：

- 批大小补齐到录制过的档位（1, 2, 4, 8, 16, 32, …），补的行算一个假请求，K/V 写进单独留出的一页；
- 注意力读的 key 数也补齐到档位（256, 512, …），多出来的位置用掩码屏蔽——所以图里的注意力是 SDPA 的
  “补齐成矩形”那一种（第 1.5 章），它的每个张量形状只取决于档位；
- 输入（token、位置、写入槽位、各行的 K/V 槽位和长度）先拷进固定的缓冲区，再回放。

不是某一章的内容，而是引擎的一个选项（``EngineConfig.cuda_graph``）：``auto`` 在 CUDA 上开、CPU 上关
（``ENV.DISABLE_CUDA_GRAPH.value = True`` 或环境变量 ``MINISGL_DISABLE_CUDA_GRAPH=1`` 让 ``auto`` 也关）；
``off`` 关；``eager`` 走同样的缓冲区和补齐、只是不录制而直接调用——在 CPU 上也能检查这条路径算得对不对。
只有解码批次走图；预填充、超过最大档位的批次照常前向。
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

import torch

from minisgl.attention import PaddedMetadata, SDPAAttnBackend
from minisgl.core import Batch, Context, get_global_ctx, set_global_ctx
from minisgl.env import ENV
from minisgl.i18n import tr

if TYPE_CHECKING:
    from minisgl.engine import Engine

__all__ = ["GRAPH_MODES", "MAX_GRAPH_KV_LEN", "resolve_graph_mode", "batch_size_buckets", "kv_len_buckets", "GraphRunner"]

GRAPH_MODES = ("auto", "off", "eager", "cuda")
#: 图里注意力最多读多少个 key：再长的解码批次照常前向（补齐到很长会读大量无用的 K/V，也要很大的图内存）。
MAX_GRAPH_KV_LEN = 4096
MIN_GRAPH_KV_LEN = 256


def resolve_graph_mode(mode: str, device: torch.device, capturable: bool = True) -> str:
    """``auto`` → CUDA 上 ``cuda``、CPU 上 ``off``（``ENV.DISABLE_CUDA_GRAPH`` 打开时、或模型不能录图时也是 ``off``）；
    ``cuda`` 只能在 CUDA 上、能录图的模型上用。``capturable``：模型每步的形状是否固定（混合专家的不固定：每个专家
    分到几行取决于路由）。

    en: ``auto`` -> ``cuda`` on CUDA, ``off`` on the CPU (also ``off`` with ``ENV.DISABLE_CUDA_GRAPH`` or a model that
    cannot be captured); ``cuda`` only on CUDA with a model that can be captured. ``capturable``: whether the model's
    shapes are fixed per step (a mixture of experts' are not: how many rows each expert gets depends on the routing)."""
    if mode not in GRAPH_MODES:
        raise ValueError(tr("Unknown cuda_graph={mode!r}; choose from: {modes}",
                            mode=mode, modes=", ".join(GRAPH_MODES)))
    if mode == "auto":
        return "cuda" if device.type == "cuda" and capturable and not ENV.DISABLE_CUDA_GRAPH else "off"
    if mode == "cuda" and device.type != "cuda":
        raise ValueError(tr("cuda_graph='cuda' works only on CUDA; to check the graph path on a CPU use 'eager'"))
    if mode == "cuda" and not capturable:
        raise ValueError(tr("cuda_graph='cuda' cannot capture this model: its step shapes depend on the routing of "
                            "tokens to experts; use cuda_graph='auto' or 'off'"))
    return mode


def batch_size_buckets(max_bs: int) -> list[int]:
    """录制哪些批大小：1, 2, 4, 8，然后每 16 一档，最后一档是 ``max_bs`` 本身。"""
    sizes = {b for b in (1, 2, 4, 8) if b <= max_bs} | set(range(16, max_bs + 1, 16)) | {max_bs}
    return sorted(sizes)


def kv_len_buckets(max_len: int) -> list[int]:
    """注意力读多少个 key 的档位：256 起每档翻倍，最后一档是 ``max_len``（页表宽度和上限中较小的）。"""
    sizes, k = [], MIN_GRAPH_KV_LEN
    while k < max_len:
        sizes.append(k)
        k *= 2
    return [*sizes, max_len]


def smallest_fit(buckets: list[int], n: int) -> int | None:
    return next((b for b in buckets if b >= n), None)


@dataclass
class DecodeGraph:
    """一个档位（批大小 ``bs``、key 数 ``kv_len``）的图和它的回放函数。"""

    bs: int
    kv_len: int
    replay: Callable[[], torch.Tensor]  # 回放，返回 [bs, vocab] 的 logits（CUDA 图里是同一块固定输出）


class GraphRunner:
    """为解码批次录制 / 回放前向。装上以后 ``engine.model.forward`` 会先问它：能走图就回放，否则照常前向。"""

    def __init__(self, engine: Engine, mode: str, max_bs: int) -> None:
        if mode not in ("eager", "cuda"):
            raise ValueError(tr("GraphRunner mode must be 'eager' or 'cuda', got {mode!r}", mode=mode))
        self.mode, self.ctx, self.device = mode, engine.ctx, engine.device
        self.page_table = engine.page_table
        self.max_bs = min(max_bs, engine.config.max_running_req)
        self.bs_buckets = batch_size_buckets(self.max_bs)
        self.kv_buckets = kv_len_buckets(min(self.page_table.shape[1], MAX_GRAPH_KV_LEN))
        # 补齐的行：页表最后一行（专门留给假请求）全部指向 KV 池最后一页——引擎在开图时多分配了这一页
        self.scratch_slot = engine.num_pages * engine.config.page_size
        if engine.kv_cache.num_slots <= self.scratch_slot:
            raise RuntimeError(tr("With CUDA graphs the KV pool needs one page more than the allocatable pages (where the padding dummy requests write their K/V)"))
        self.dummy_row = self.page_table.shape[0] - 1
        self.page_table[self.dummy_row].fill_(self.scratch_slot)
        self.backend = SDPAAttnBackend(engine.kv_cache, self.page_table)

        max_b, max_k, dev = self.bs_buckets[-1], self.kv_buckets[-1], self.device
        self.input_ids = torch.zeros(max_b, dtype=torch.int32, device=dev)
        self.positions = torch.zeros(max_b, dtype=torch.int32, device=dev)
        self.out_loc = torch.full((max_b,), self.scratch_slot, dtype=torch.int32, device=dev)
        self.kv_slots = torch.full((max_b, max_k), self.scratch_slot, dtype=torch.int64, device=dev)
        self.mask = torch.zeros((max_b, 1, 1, max_k), dtype=torch.bool, device=dev)
        self.mask[..., 0] = True  # 录制前空跑时每行至少看得到一个 key，不让全屏蔽的行算出 NaN 写进 K/V
        self.key_index = torch.arange(max_k, device=dev)

        self._model_forward = engine.model.forward
        self._prepare_metadata = engine.attn_backend.prepare_metadata
        self.graphs: dict[tuple[int, int], DecodeGraph] = {}
        self.replays: Counter[tuple[int, int, int]] = Counter()  # (真实批大小, 档位批大小, 档位 key 数) → 回放次数
        self._capture_all()
        engine.model.forward = self.forward  # 从此模型的前向先经过这里
        engine.attn_backend.prepare_metadata = self.prepare_metadata  # 准备批次时顺便备好图的输入 | en: preparing a batch also prepares the graph's inputs

    # ------------------------------------------------------------------ 录制

    def _static_batch(self, bs: int, kv_len: int) -> Batch:
        """档位 (bs, kv_len) 的固定批次：各字段都是固定缓冲区的视图，回放前只改它们的内容。"""
        batch = Batch([None] * bs, "decode")  # type: ignore[list-item] - 只用到 size
        batch.input_ids, batch.positions, batch.out_loc = self.input_ids[:bs], self.positions[:bs], self.out_loc[:bs]
        rows = list(range(bs))
        batch.attn_metadata = PaddedMetadata(
            cu_seqlens_q=torch.arange(bs + 1, dtype=torch.int32, device=self.device),
            cu_seqlens_q_cpu=list(range(bs + 1)),
            cached_lens=[0] * bs,
            seq_lens=[kv_len] * bs,
            table_idx=rows,
            q_index=torch.arange(bs, device=self.device)[:, None],
            out_index=torch.arange(bs, device=self.device),
            kv_slots=self.kv_slots[:bs, :kv_len],
            mask=self.mask[:bs, :, :, :kv_len],
        )
        return batch

    @contextmanager
    def _as_current(self, batch: Batch) -> Iterator[None]:
        """让模型把 ``batch`` 当作当前批次、用图里的 SDPA 后端：回放时引擎的上下文里还有真正的批次（不能嵌套），
        所以这段时间换上一个替身上下文（同一个页表和 KV 池），结束时换回。

        en: Make the model take ``batch`` as the current batch with the graph's SDPA backend: during a replay the engine's
        context still holds the real batch (no nesting), so a stand-in context (same page table and KV pool) is global
        meanwhile, and the engine's comes back afterwards.
        """
        stand_in = Context(page_size=self.ctx.page_size)
        stand_in.page_table, stand_in.kv_cache, stand_in.attn_backend = self.ctx.page_table, self.ctx.kv_cache, self.backend
        outer = get_global_ctx()
        set_global_ctx(stand_in)
        try:
            with stand_in.forward_batch(batch):
                yield
        finally:
            set_global_ctx(outer)

    def _run_static(self, batch: Batch) -> torch.Tensor:
        with self._as_current(batch):
            return self._model_forward()

    def _capture_all(self) -> None:
        pool = None
        for bs in reversed(self.bs_buckets):  # 先录最大的：后面的图共用它的内存池
            for kv_len in reversed(self.kv_buckets):
                batch = self._static_batch(bs, kv_len)
                if self.mode == "eager":
                    replay = (lambda b=batch: self._run_static(b))  # noqa: E731 - 不录制，直接调用
                else:
                    replay, pool = self._capture(batch, pool)
                self.graphs[bs, kv_len] = DecodeGraph(bs, kv_len, replay)

    @torch.no_grad()
    def _capture(self, batch: Batch, pool: object) -> tuple[Callable[[], torch.Tensor], object]:
        """在 CUDA 上录一张图；先空跑两次，让 cuBLAS 等库把工作区分配好（录制期间不能分配新内存）。"""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._run_static(batch)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            logits = self._run_static(batch)

        def replay() -> torch.Tensor:
            graph.replay()
            return logits

        return replay, graph.pool()

    # ------------------------------------------------------------------ 回放

    def pick(self, batch: Batch) -> DecodeGraph | None:
        """这个批次走哪张图；不是解码、太大或太长就返回 None（照常前向）。"""
        if not batch.is_decode:
            return None
        bs = smallest_fit(self.bs_buckets, batch.size)
        kv_len = smallest_fit(self.kv_buckets, max(batch.attn_metadata.seq_lens))
        if bs is None or kv_len is None:
            return None
        return self.graphs[bs, kv_len]

    def prepare_metadata(self, batch: Batch) -> None:
        """代替后端的 ``prepare_metadata``：照常准备，能走图的批次再备好补齐后的 K/V 槽位和掩码。

        页表要在这里读，而不是回放时：准备发生在调度器的流上、发出之前，之后调度器改页表（下一步的分页、
        前缀去重）也在同一条流上，顺序有保证；回放跑在重叠调度的引擎流上，那时读页表会和这些改动抢跑。
        行号和长度从锁页内存异步拷上设备，不让主机等。

        en: Replaces the backend's ``prepare_metadata``: prepare as usual, then, for a batch that can use a graph,
        build the padded K/V slots and mask. The page table must be read here, not at replay: preparation happens on
        the scheduler's stream before the launch, and the scheduler's later page-table writes (the next step's pages,
        prefix de-duplication) go to the same stream, so the order is guaranteed; replay runs on the engine stream of
        overlap scheduling, where reading the page table would race with those writes. Row numbers and lengths are
        copied from pinned memory asynchronously, so the host does not wait.
        """
        self._prepare_metadata(batch)
        graph = self.pick(batch)
        if graph is None:
            return
        n, bs, kv_len = batch.size, graph.bs, graph.kv_len
        md = batch.attn_metadata
        rows = self._to_device(torch.tensor([*md.table_idx, *[self.dummy_row] * (bs - n)], dtype=torch.int64))
        lens = self._to_device(torch.tensor([*md.seq_lens, *[1] * (bs - n)], dtype=torch.int64))
        batch.graph_inputs = (self.page_table[rows, :kv_len].long(), self.key_index[None, :kv_len] < lens[:, None])

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def forward(self) -> torch.Tensor:
        """代替 ``model.forward``：当前批次能走图就把输入拷进固定缓冲区、回放，取前 ``batch.size`` 行。

        en: Stands in for ``model.forward``: if the current batch can use a graph, copy its inputs into the fixed buffers,
        replay, and take the first ``batch.size`` rows.
        """
        batch = self.ctx.batch
        graph = self.pick(batch)
        if graph is None:
            return self._model_forward()
        n, bs, kv_len = batch.size, graph.bs, graph.kv_len
        slots, mask = batch.graph_inputs
        self.input_ids[:n].copy_(batch.input_ids)
        self.input_ids[n:bs].zero_()
        self.positions[:n].copy_(batch.positions)
        self.positions[n:bs].zero_()
        self.out_loc[:n].copy_(batch.out_loc)
        self.out_loc[n:bs].fill_(self.scratch_slot)
        self.kv_slots[:bs, :kv_len].copy_(slots)
        self.mask[:bs, 0, 0, :kv_len].copy_(mask)
        self.replays[n, bs, kv_len] += 1
        return graph.replay()[:n]
