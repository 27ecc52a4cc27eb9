# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint attention <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint attention <task>` gives the next hint.
"""第 1.5 章 attention：注意力后端——在分页 KV 上为一批长短不一的请求算注意力。

一个批次里，每个请求本轮有 ``extend_len`` 个 query（预填充时是整段提示词，解码时是 1），
它们要看到这个请求的全部 ``device_len`` 个 key：前 ``cached_len`` 个早已在 KV 池里，
后面的是这一轮刚写进去的。K/V 在池里的位置由页表给出；因果掩码要错开 ``cached_len``：
第 i 个 query 的绝对位置是 ``cached_len + i``，它能看到位置 ``<= cached_len + i`` 的 key。

后端：
- ``torch``：参考实现，逐个请求按页表取 K/V、显式掩码、einsum，一眼能看懂；
- ``sdpa``：把整批补齐成矩形，一次 ``F.scaled_dot_product_attention``，CPU 上的默认；
- ``fi`` / ``fa``：CUDA 上装了 FlashInfer / sgl-kernel 的 FlashAttention 就自动选用（可选依赖）。

en: Chapter 1.5 attention: attention backends, computing attention over the paged KV for a batch of requests of
different lengths.

In a batch, each request has ``extend_len`` queries this step (the whole prompt for a prefill, 1 for a decode), and they
must see all ``device_len`` keys of that request: the first ``cached_len`` have long been in the KV pool, the rest were
written this step. The page table gives where the K/V sit in the pool; the causal mask is offset by ``cached_len``:
query i is at absolute position ``cached_len + i`` and sees the keys at positions ``<= cached_len + i``.

Backends:

- ``torch``: the reference, request by request: gather the K/V by the page table, explicit mask, einsum; readable at a
  glance;
- ``sdpa``: pads the whole batch into a rectangle and makes one ``F.scaled_dot_product_attention`` call; the default on
  the CPU;
- ``fi`` / ``fa``: chosen automatically on CUDA when FlashInfer / sgl-kernel's FlashAttention is installed (optional
  dependencies).
"""

from __future__ import annotations

from minisgl.course.skeleton import TaskNotDone

import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn.functional as F

from minisgl.i18n import tr
from minisgl.core import Batch
from minisgl.kvcache import MHAKVCache


class BaseAttnMetadata(ABC):
    """后端为一个批次准备的元数据。LM head 只需要知道每个请求最后一个 token 在哪。

    en: Metadata a backend prepares for a batch. The LM head only needs to know where each request's last token is.
    """

    @abstractmethod
    def get_last_indices(self, bs: int) -> torch.Tensor: ...


class BaseAttnBackend(ABC):
    """注意力后端接口：先 ``prepare_metadata(batch)``（每批一次），再在每层里 ``forward``。

    en: Attention backend interface: ``prepare_metadata(batch)`` first (once per batch), then ``forward`` in each layer.
    """

    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """根据 ``batch.reqs`` 的长度记账和页表，填写 ``batch.attn_metadata``。

        en: Fill in ``batch.attn_metadata`` from the length bookkeeping of ``batch.reqs`` and the page table.
        """

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        """``q``: [T, Hq, D]，``k``/``v``: [T, Hkv, D]（本轮的 token）。先把 k/v 写到 ``batch.out_loc``，
        再让每个 query 看它所属请求的全部 K/V。返回 [T, Hq, D]。

        en: ``q``: [T, Hq, D], ``k``/``v``: [T, Hkv, D] (this step's tokens). First write k/v to ``batch.out_loc``, then
        let each query see all K/V of its request. Returns [T, Hq, D].
        """


@dataclass
class VarlenMetadata(BaseAttnMetadata):
    """变长批次：第 b 个请求的 query 是拼接张量里的 ``[cu_seqlens_q[b], cu_seqlens_q[b+1])``。

    en: Variable-length batch: request b's queries are ``[cu_seqlens_q[b], cu_seqlens_q[b+1])`` of the concatenated
    tensor.
    """

    cu_seqlens_q: torch.Tensor  # 设备上 int32，[B + 1] | en: int32 on the device, [B + 1]
    cu_seqlens_q_cpu: list[int]
    cached_lens: list[int]
    # 每个请求的 device_len：本轮之后缓存里有多少个 key
    # en: each request's device_len: how many keys the cache holds after this step
    seq_lens: list[int]
    table_idx: list[int]

    def get_last_indices(self, bs: int) -> torch.Tensor:
        return self.cu_seqlens_q[1 : bs + 1] - 1


def make_varlen_metadata(batch: Batch, device: torch.device) -> VarlenMetadata:
    """从请求的长度记账算出变长元数据（所有后端共用）。

    en: Work out the variable-length metadata from the requests' length bookkeeping (shared by every backend).
    """
    # TODO 任务 varlen_metadata：返回这个批次的 VarlenMetadata（各字段的含义见它的定义），都按请求在批次里的顺序：本轮各请求 query 的前缀和边界（从 0 开始；设备上 int32 一份，Python 的 int 列表一份），以及每个请求已缓存的长度、总长度和它在页表里的行
    # TODO task varlen_metadata: return this batch's VarlenMetadata (its definition explains the fields), all in the order of the requests in the batch: the prefix-sum boundaries of each request's queries this step (starting at 0; an int32 copy on the device and a Python list of int), and each request's cached length, total length and page-table row
    raise TaskNotDone("attention", "varlen_metadata")


def causal_mask_with_prefix(cached_len: int, seq_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[seq_len - cached_len, seq_len]`` 的布尔掩码：query i（绝对位置 cached_len + i）能否看到 key j。

    en: A ``[seq_len - cached_len, seq_len]`` boolean mask: whether query i (absolute position cached_len + i) sees key
    j.
    """
    # TODO 任务 causal_mask_with_prefix：返回函数文档里那个布尔掩码，放在给定的设备上：本轮每个 query 看得到的，是绝对位置不在它之后的 key（query 的绝对位置从已缓存的长度数起）
    # TODO task causal_mask_with_prefix: return the boolean mask of the docstring, on the given device: each query of this step sees the keys whose absolute position is not after its own (a query's absolute position counts on from the cached length)
    raise TaskNotDone("attention", "causal_mask_with_prefix")


def gather_kv(
    kv_cache: MHAKVCache, layer_id: int, page_table: torch.Tensor, table_idx: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """按页表取出一个请求的全部 K/V：页表第 ``table_idx`` 行的前 ``seq_len`` 个槽位。返回两个 [seq_len, Hkv, D]。

    en: Gather all of a request's K/V through the page table: the first ``seq_len`` slots of row ``table_idx``. Returns
    two [seq_len, Hkv, D].
    """
    # TODO 任务 gather_kv：返回这个请求在 layer_id 层的 K 和 V，各 [seq_len, Hkv, D]：按页表里它那一行记下的槽位顺序取，只取写过的前 seq_len 个
    # TODO task gather_kv: return this request's K and V in layer layer_id, each [seq_len, Hkv, D], taken in the slot order of its page-table row, only the first seq_len (the written ones)
    raise TaskNotDone("attention", "gather_kv")


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """一个请求的注意力。``q``: [Lq, Hq, D]，``k``/``v``: [Lk, Hkv, D]，``mask``: [Lq, Lk]。

    GQA：每 Hq/Hkv 个 query 头共用一个 KV 头。在 fp32 里算 softmax，结果转回 q 的 dtype。

    en: Attention for one request. ``q``: [Lq, Hq, D], ``k``/``v``: [Lk, Hkv, D], ``mask``: [Lq, Lk].

    GQA: every Hq/Hkv query heads share one KV head. The softmax is computed in fp32 and the result cast back to q's
    dtype.
    """
    # TODO 任务 attend：返回一个请求的注意力输出 [Lq, Hq, D]：GQA，每 Hq/Hkv 个相邻的 query 头共用一个 KV 头；mask 为 False 的 key 不参与；分数乘调用者给的 scale。bf16 的输入也要在 fp32 里算分数和归一化，输出的 dtype 与 q 相同
    # TODO task attend: return one request's attention output, [Lq, Hq, D]: GQA, every Hq/Hkv consecutive query heads sharing one KV head; keys where mask is False take no part; the query-key products are multiplied by the caller's scale. Even for bf16 inputs, compute those products and their normalisation in fp32; the output has the dtype of q
    raise TaskNotDone("attention", "attend")


class TorchAttnBackend(BaseAttnBackend):
    """参考后端：逐个请求 gather → 掩码 → einsum。慢，但每一步都看得见。

    en: The reference backend: per request, gather -> mask -> einsum. Slow, but every step is visible.
    """

    def __init__(self, kv_cache: MHAKVCache, page_table: torch.Tensor) -> None:
        self.kv_cache = kv_cache
        self.page_table = page_table

    def prepare_metadata(self, batch: Batch) -> None:
        batch.attn_metadata = make_varlen_metadata(batch, self.page_table.device)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        # TODO 任务 torch_backend_forward：返回 [T, Hq, D]，行的顺序与 q 相同。本轮的 k、v 写进 batch.out_loc 指定的槽位（本轮的 query 也要看到它们）；每个请求的 query 只看本请求的全部 K/V，因果、错开已缓存的部分，scale 为 head_dim 的 −0.5 次方；请求的 K/V 在页表里它自己的那一行，不是它在批次里的序号那一行。给定：KV 池的 store_kv，本文件前面写好的几个函数，batch.attn_metadata
        # TODO task torch_backend_forward: return [T, Hq, D] with the rows in the order of q. This step's k and v are written into the slots batch.out_loc names (this step's queries must see them too); each request's queries see all K/V of that request and nothing else, causally, offset by the cached part, with scale head_dim to the power −0.5; a request's K/V sit in its own page-table row, not the row of its index in the batch. Given: the KV pool's store_kv, the functions written above in this file, batch.attn_metadata
        raise TaskNotDone("attention", "torch_backend_forward")


@dataclass
class PaddedMetadata(VarlenMetadata):
    """把变长批次补齐成 ``[B, max_q]`` 个 query、``[B, max_k]`` 个 key 的矩形，一次算完。

    en: Pad the variable-length batch into a rectangle of ``[B, max_q]`` queries and ``[B, max_k]`` keys, and compute it
    in one go.
    """

    # [B, max_q]：补齐后每个 query 位置取拼接张量里的哪个 token（补的位置重复最后一个）
    # en: [B, max_q]: which token of the concatenated tensor each padded query position takes (padding repeats the last
    # en: one)
    q_index: torch.Tensor
    # [T]：拼接张量里第 t 个 token 在补齐结果（摊平成 B * max_q）里的位置
    # en: [T]: where token t of the concatenated tensor sits in the padded result (flattened to B * max_q)
    out_index: torch.Tensor
    # [B, max_k] int64：每个 key 位置的 KV 槽位（补的位置指向本请求写过的一个槽位）
    # en: [B, max_k] int64: the KV slot of each key position (padding points at a slot this request has written)
    kv_slots: torch.Tensor
    # [B, 1, max_q, max_k] 布尔：因果（错开 cached_len）且不超出本请求的长度
    # en: [B, 1, max_q, max_k] bool: causal (offset by cached_len) and within this request's length
    mask: torch.Tensor


def padded_metadata(base: VarlenMetadata, page_table: torch.Tensor) -> PaddedMetadata:
    """把变长批次 ``base`` 补齐成矩形：返回 :class:`PaddedMetadata`，``base`` 的字段原样保留，另加四个张量
    （含义见它的字段注释），全都放在页表所在的设备上。B 是请求数，``max_q``、``max_k`` 是本批最多的 query 数和 key 数。

    - ``q_index`` [B, max_q]、``out_index`` [T]：补齐和还原 query 用的下标；
    - ``mask`` [B, 1, max_q, max_k] 布尔：真实的 query 与 :func:`causal_mask_with_prefix` 相同（因果、错开 cached_len、
      不超出本请求的 seq_len）；补出来的 query 行也至少要看得到一个 key，否则这一行的 softmax 分母是 0，得 NaN；
    - ``kv_slots`` [B, max_k] int64：key 位置 j < seq_len 是页表里本请求那一行（``base.table_idx``）的第 j 个槽位；
      补出来的位置（j >= seq_len）要指向本请求写过的槽位，例如它的第一个。KV 池用 ``torch.empty`` 分配，没写过的槽位里
      可能是 NaN：被掩掉的 key 权重是 0，但 ``0 × NaN`` 仍是 NaN，会把整行输出弄坏。

    en: Pad the variable-length batch ``base`` into a rectangle: return a :class:`PaddedMetadata` that keeps the fields
    of ``base`` as they are and adds four tensors (its field comments give their meaning), all on the device of the page
    table. B is the number of requests; ``max_q`` and ``max_k`` are the largest query and key counts in the batch.

    - ``q_index`` [B, max_q] and ``out_index`` [T]: the indices that pad the queries and put them back;
    - ``mask`` [B, 1, max_q, max_k] bool: for a real query the same as :func:`causal_mask_with_prefix` (causal, offset
      by cached_len, never beyond the request's seq_len); a padded query row must also see at least one key, or the
      softmax of that row divides by 0 and gives NaN;
    - ``kv_slots`` [B, max_k] int64: key position j < seq_len is the j-th slot of the request's page-table row
      (``base.table_idx``); a padded position (j >= seq_len) must point at a slot the request has written, for
      example its first. The KV pool is allocated with ``torch.empty``, so an unwritten slot may hold NaN: a masked key
      gets weight 0, but ``0 × NaN`` is still NaN and spoils the whole output row.
    """
    # TODO 任务 padded_metadata：返回函数文档里的 PaddedMetadata：base 的字段原样保留，再加 q_index [B, max_q]、out_index [T]、kv_slots [B, max_k]（int64）和布尔的 mask [B, 1, max_q, max_k]，都在页表的设备上。真实的 query 因果、错开已缓存的部分、不超出本请求的长度；补出来的 query 行至少看得到一个 key；补出来的 key 位置指向本请求写过的槽位。给定：变长元数据 base，页表
    # TODO task padded_metadata: return the PaddedMetadata of the docstring: the fields of base kept as they are, plus q_index [B, max_q], out_index [T], kv_slots [B, max_k] (int64) and a boolean mask [B, 1, max_q, max_k], all on the page table's device. A real query is causal, offset by the part already in the cache, and never sees beyond its request's length; a padded query row sees at least one key; a padded key position points at a slot the request has written. Given: the variable-length metadata base, the page table
    raise TaskNotDone("attention", "padded_metadata")


class SDPAAttnBackend(BaseAttnBackend):
    """补齐成矩形后调用一次 ``F.scaled_dot_product_attention``（带 GQA）。解码时 max_q = 1，几乎没有浪费。

    en: One ``F.scaled_dot_product_attention`` call (with GQA) on the padded rectangle. When decoding, max_q = 1, so
    almost nothing is wasted.
    """

    def __init__(self, kv_cache: MHAKVCache, page_table: torch.Tensor) -> None:
        self.kv_cache = kv_cache
        self.page_table = page_table

    def prepare_metadata(self, batch: Batch) -> None:
        batch.attn_metadata = padded_metadata(make_varlen_metadata(batch, self.page_table.device), self.page_table)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        md: PaddedMetadata = batch.attn_metadata
        bs, max_q = md.q_index.shape
        q_pad = take_rows(q, md.q_index).transpose(1, 2)  # [B, Hq, max_q, D]
        k_pad = take_rows(self.kv_cache.k_cache(layer_id), md.kv_slots).transpose(1, 2)  # [B, Hkv, max_k, D]
        v_pad = take_rows(self.kv_cache.v_cache(layer_id), md.kv_slots).transpose(1, 2)
        o = F.scaled_dot_product_attention(q_pad, k_pad, v_pad, attn_mask=md.mask, enable_gqa=True)
        return take_rows(o.transpose(1, 2).reshape(bs * max_q, q.shape[1], q.shape[2]), md.out_index)


def take_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[index]``（按第 0 维取行），用 ``index_select`` 实现：CPU 上比高级索引快几倍（整行拷贝，不逐元素算地址）。

    en: ``x[index]`` (rows along dim 0), done with ``index_select``: several times faster than advanced indexing on the
    CPU (copies whole rows instead of computing an address per element).
    """
    return x.index_select(0, index.reshape(-1)).view(*index.shape, *x.shape[1:])


# ----------------------------------------------------------------------------- CUDA 上的可选后端
# en: ----------------------------------------------------------------------------- optional backends on CUDA


@dataclass
class FlashInferMetadata(VarlenMetadata):
    wrapper: object
    plan_args: tuple
    planned: bool = False


class FlashInferBackend(BaseAttnBackend):
    """FlashInfer（CUDA，可选依赖）。页表按 token 记槽位，所以交给它时把每个槽位当作一页（page_size = 1）。

    ``plan`` 推迟到第一层前向时才做：重叠调度时下一批的元数据会在上一批还在算时就准备好。

    en: FlashInfer (CUDA, optional dependency). The page table records a slot per token, so FlashInfer is told each slot
    is a page (page_size = 1).

    ``plan`` is put off until the first layer's forward: with overlap scheduling, the next batch's metadata is prepared
    while the previous batch is still being computed.
    """

    def __init__(self, kv_cache: MHAKVCache, page_table: torch.Tensor, num_qo_heads: int) -> None:
        import flashinfer

        self.kv_cache, self.page_table, self.num_qo_heads = kv_cache, page_table, num_qo_heads
        workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=kv_cache.device)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=num_qo_heads // kv_cache.num_kv_heads >= 4
        )

    def prepare_metadata(self, batch: Batch) -> None:
        base = make_varlen_metadata(batch, self.page_table.device)
        # 设备上
        # en: on the device
        indices = torch.cat([self.page_table[r.table_idx, : r.device_len] for r in batch.reqs])
        # 下面这些留在主机上
        # en: these stay on the host
        kv_indptr = torch.tensor([0, *accumulate(base.seq_lens)], dtype=torch.int32)
        last_page_len = torch.ones(batch.size, dtype=torch.int32)
        heads = (self.num_qo_heads, self.kv_cache.num_kv_heads, self.kv_cache.head_dim, 1)
        dtype = self.kv_cache.dtype
        if batch.is_decode:
            wrapper = self.decode_wrapper
            plan_args = (kv_indptr, indices, last_page_len, *heads)
            plan_kwargs = {"q_data_type": dtype, "kv_data_type": dtype}
        else:
            wrapper = self.prefill_wrapper
            qo_indptr = torch.tensor(base.cu_seqlens_q_cpu, dtype=torch.int32)
            plan_args = (qo_indptr, kv_indptr, indices, last_page_len, *heads)
            plan_kwargs = {"causal": True, "q_data_type": dtype, "kv_data_type": dtype}
        batch.attn_metadata = FlashInferMetadata(**vars(base), wrapper=wrapper, plan_args=(plan_args, plan_kwargs))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        md: FlashInferMetadata = batch.attn_metadata
        if not md.planned:
            args, kwargs = md.plan_args
            md.wrapper.plan(*args, **kwargs)
            md.planned = True
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        shape = (-1, 1, self.kv_cache.num_kv_heads, self.kv_cache.head_dim)
        paged = (self.kv_cache.k_cache(layer_id).view(shape), self.kv_cache.v_cache(layer_id).view(shape))
        return md.wrapper.run(q, paged)


@dataclass
class FlashAttnMetadata(VarlenMetadata):
    cache_seqlens: torch.Tensor
    page_indices: torch.Tensor  # [B, 页数]：页号（槽位 // page_size） | en: [B, pages]: page numbers (slot // page_size)
    max_seqlen_q: int


class FlashAttnBackend(BaseAttnBackend):
    """sgl-kernel 的 FlashAttention（CUDA，可选依赖）。它按页读 KV，页表要换成页号；
    这要求每一页的槽位连续且从页首开始——用 :func:`minisgl.kvcache.pages_to_slots` 填的页表正是如此。

    en: sgl-kernel's FlashAttention (CUDA, optional dependency). It reads the KV by page, so the page table is converted
    to page numbers; this requires each page's slots to be contiguous and to start at the page's beginning, which a page
    table filled with :func:`minisgl.kvcache.pages_to_slots` satisfies.
    """

    def __init__(self, kv_cache: MHAKVCache, page_table: torch.Tensor) -> None:
        self.kv_cache, self.page_table = kv_cache, page_table

    def prepare_metadata(self, batch: Batch) -> None:
        from sgl_kernel.flash_attn import flash_attn_with_kvcache  # noqa: F401 - fail early on a missing package

        base = make_varlen_metadata(batch, self.page_table.device)
        page_size, rows = self.kv_cache.page_size, torch.tensor(base.table_idx, device=self.page_table.device)
        pages = self.page_table[rows, : max(base.seq_lens) : page_size] // page_size
        batch.attn_metadata = FlashAttnMetadata(
            **vars(base),
            cache_seqlens=torch.tensor(base.seq_lens, dtype=torch.int32, device=self.page_table.device),
            page_indices=pages.to(torch.int32),
            max_seqlen_q=max(r.extend_len for r in batch.reqs),
        )

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        from sgl_kernel.flash_attn import flash_attn_with_kvcache

        md: FlashAttnMetadata = batch.attn_metadata
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        shape = (self.kv_cache.num_pages, self.kv_cache.page_size, self.kv_cache.num_kv_heads, self.kv_cache.head_dim)
        return flash_attn_with_kvcache(
            q=q,
            k_cache=self.kv_cache.k_cache(layer_id).view(shape),
            v_cache=self.kv_cache.v_cache(layer_id).view(shape),
            page_table=md.page_indices,
            cache_seqlens=md.cache_seqlens,
            cu_seqlens_q=md.cu_seqlens_q,
            max_seqlen_q=md.max_seqlen_q,
            softmax_scale=q.shape[-1] ** -0.5,
            causal=True,
        )


BACKENDS = ("auto", "torch", "sdpa", "fi", "fa")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # 父包都不存在 | en: not even the parent package exists
        return False


def resolve_backend_name(name: str, device: torch.device) -> str:
    """``auto``：CUDA 上优先 FlashInfer，其次 FlashAttention，都没装就 SDPA；CPU 上用 SDPA。

    en: ``auto``: on CUDA FlashInfer first, then FlashAttention, SDPA if neither is installed; SDPA on the CPU.
    """
    if name not in BACKENDS:
        raise ValueError(tr(
            "Unknown attention backend {name!r}; choose from: {known}",
            name=name, known=', '.join(BACKENDS),
        ))
    if name != "auto":
        return name
    if device.type == "cuda" and _installed("flashinfer"):
        return "fi"
    if device.type == "cuda" and _installed("sgl_kernel.flash_attn"):
        return "fa"
    return "sdpa"


def create_attention_backend(
    name: str, kv_cache: MHAKVCache, page_table: torch.Tensor, num_qo_heads: int
) -> BaseAttnBackend:
    name = resolve_backend_name(name, kv_cache.device)
    if name in ("fi", "fa") and kv_cache.device.type != "cuda":
        raise ValueError(tr(
            "The attention backend {name!r} works only on CUDA; on the CPU use 'sdpa' or 'torch'",
            name=name,
        ))
    if name == "torch":
        return TorchAttnBackend(kv_cache, page_table)
    if name == "sdpa":
        return SDPAAttnBackend(kv_cache, page_table)
    if name == "fi":
        return FlashInferBackend(kv_cache, page_table, num_qo_heads)
    return FlashAttnBackend(kv_cache, page_table)
