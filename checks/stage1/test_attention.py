"""第 1.5 章 attention 的检查：掩码、按页表取 K/V、GQA 注意力、补齐的元数据（与逐格写出的参考对照），以及两个后端在分页、变长、带缓存前缀的批次上
与一个独立的稠密参考实现（对每个请求的完整序列做因果 SDPA）一致。"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minisgl.i18n import tr
from minisgl.attention import (
    PaddedMetadata,
    SDPAAttnBackend,
    TorchAttnBackend,
    VarlenMetadata,
    attend,
    causal_mask_with_prefix,
    create_attention_backend,
    gather_kv,
    make_varlen_metadata,
    padded_metadata,
)
from minisgl.core import Batch, Req, SamplingParams
from minisgl.kvcache import MHAKVCache, create_page_table

from minisgl.engine import Engine, EngineConfig

from .conftest import assert_close_zh, engine_matches_hf, expect

HQ, HKV, D = 4, 2, 16


def test_causal_mask_with_prefix() -> None:
    for cached, total in [(0, 5), (3, 4), (2, 6), (0, 1)]:
        mask = causal_mask_with_prefix(cached, total)
        want = [[j <= cached + i for j in range(total)] for i in range(total - cached)]
        assert mask.dtype == torch.bool and mask.tolist() == want, tr("Wrong mask for cached_len={cached}, seq_len={total}", cached=cached, total=total)


def test_gather_kv_follows_page_table() -> None:
    cache = MHAKVCache(HKV, 2, D, num_pages=8, page_size=2, dtype=torch.float32, device="cpu")
    cache.k_cache(1).copy_(torch.arange(16.0)[:, None, None].expand(16, HKV, D))
    cache.v_cache(1).copy_(-torch.arange(16.0)[:, None, None].expand(16, HKV, D))
    table = create_page_table(3, 10, "cpu")
    table[2, :5] = torch.tensor([9, 4, 5, 14, 0], dtype=torch.int32)
    k, v = gather_kv(cache, 1, table, 2, 5)
    expect(tuple(k.shape), (5, HKV, D), tr("gather_kv of 5 positions: shape of K [positions, kv heads, head_dim]"))
    assert k[:, 0, 0].tolist() == [9, 4, 5, 14, 0], tr("K must be gathered in the order of the slots in this page-table row")
    expect(v[:, 0, 0].tolist(), [-9, -4, -5, -14, 0], tr("V must be gathered from the same slots as K, from the V pool"))


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """完整序列的因果注意力（[L, H, D] 排布），与被测实现无关。"""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
    )
    return out.transpose(0, 1)


def test_attend_gqa_matches_reference() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(7, HQ, D), torch.randn(7, HKV, D), torch.randn(7, HKV, D)
    got = attend(q, k, v, causal_mask_with_prefix(0, 7), D**-0.5)
    assert_close_zh(got, dense_reference(q, k, v), tr("GQA causal attention differs from the reference"), atol=1e-5, rtol=1e-5)
    got = attend(q[4:], k, v, causal_mask_with_prefix(4, 7), D**-0.5)  # 只算后 3 个 query，前 4 个 key 来自缓存
    assert_close_zh(got, dense_reference(q, k, v)[4:], tr("Attention with a cached prefix differs from the reference"), atol=1e-5, rtol=1e-5)


def make_case(page_size: int, lens: list[tuple[int, int]], seed: int = 0):  # noqa: ANN201
    """造一个批次：每个请求 (cached_len, device_len)，前缀 K/V 已按打乱的页写进池子。返回被测需要的一切和参考输出。

    第 i 个请求不在页表第 i 行：行号打乱（``rows[i] != i``），其余行填上别的页，
    这样用批次里的序号代替 ``req.table_idx`` 去查页表的实现会读到别人的 K/V。"""
    torch.manual_seed(seed)
    num_pages = 96 // page_size
    cache = MHAKVCache(HKV, 2, D, num_pages=num_pages, page_size=page_size, dtype=torch.float32, device="cpu")
    n_rows = len(lens) + 1
    table = create_page_table(n_rows, 16, "cpu")
    perm = torch.randperm(num_pages)
    per_row = 16 // page_size
    rows = [(i + 2) % n_rows for i in range(len(lens))]  # 第 i 个请求在第 (i+2) % n 行，没有一个在第 i 行
    for r in range(n_rows + 1):  # 先把每一行（含留给假请求的最后一行）都填上互不重叠的页
        pages = perm[r * per_row : (r + 1) * per_row]
        table[r] = (pages[:, None] * page_size + torch.arange(page_size)).flatten().to(torch.int32)
    cache.k_cache(1).normal_()  # 没被任何请求用到的槽位也放上数，读错行会得到别的值
    cache.v_cache(1).normal_()
    reqs, qs, ks, vs, refs, out_loc = [], [], [], [], [], []
    for row, (cached, total) in zip(rows, lens):
        q_all, k_all, v_all = torch.randn(total, HQ, D), torch.randn(total, HKV, D), torch.randn(total, HKV, D)
        slots = table[row, :total].long()
        cache.k_cache(1)[slots[:cached]] = k_all[:cached]  # 缓存里的前缀
        cache.v_cache(1)[slots[:cached]] = v_all[:cached]
        req = Req(torch.arange(total, dtype=torch.int32), row, cached, 4, len(reqs), SamplingParams())
        reqs.append(req)
        qs.append(q_all[cached:])
        ks.append(k_all[cached:])
        vs.append(v_all[cached:])
        out_loc.append(table[row, cached:total])
        refs.append(dense_reference(q_all, k_all, v_all)[cached:])
    phase = "decode" if all(t - c == 1 for c, t in lens) else "prefill"
    batch = Batch(reqs, phase)
    batch.out_loc = torch.cat(out_loc)
    return cache, table, batch, torch.cat(qs), torch.cat(ks), torch.cat(vs), torch.cat(refs)


CASES = {
    "prefill": [(0, 5), (0, 1), (0, 9)],
    "prefix": [(3, 7), (0, 4), (8, 9), (5, 12)],
    "decode": [(6, 7), (0, 1), (11, 12), (3, 4)],
    "short_last": [(0, 9), (2, 6), (0, 2)],  # 最后一个请求最短：补齐的 query 行不能越过拼接张量的末尾
}


@pytest.mark.parametrize("backend_cls", [TorchAttnBackend, SDPAAttnBackend], ids=["torch", "sdpa"])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_backend_matches_dense_reference(backend_cls: type, page_size: int, case: str) -> None:
    cache, table, batch, q, k, v, ref = make_case(page_size, CASES[case])
    backend = backend_cls(cache, table)
    backend.prepare_metadata(batch)
    out = backend.forward(q, k, v, 1, batch)
    assert out.shape == q.shape, tr("The output shape must equal the shape of q: [T, Hq, D]")
    rows = [r.table_idx for r in batch.reqs]
    hint = tr("The requests sit in page-table rows {rows} (not 0, 1, 2, ...): do you look up the page table with req.table_idx? Is the scale head_dim ** -0.5?", rows=rows)
    assert_close_zh(out, ref, tr("The attention output for the {case} batch differs from the reference. {hint}", case=case, hint=hint), atol=1e-5, rtol=1e-5)
    assert_close_zh(cache.k_cache(1)[batch.out_loc.long()], k, tr("The backend must first write this step's K into out_loc"))
    last = batch.attn_metadata.get_last_indices(batch.size)
    ends = torch.tensor([r.extend_len for r in batch.reqs]).cumsum(0) - 1
    assert last.tolist() == ends.tolist(), tr("get_last_indices must give the index of each request's last token in the concatenated tensor")


def test_varlen_metadata() -> None:
    _, _, batch, *_ = make_case(1, CASES["prefix"])
    md = make_varlen_metadata(batch, torch.device("cpu"))
    expect(md.cu_seqlens_q.tolist(), [0, 4, 8, 9, 16], tr("cu_seqlens_q for extend lengths 4, 4, 1, 7 (prefix sums starting at 0)"))
    expect(md.cu_seqlens_q_cpu, [0, 4, 8, 9, 16], tr("cu_seqlens_q_cpu: the same prefix sums as a Python list"))
    expect(md.cached_lens, [3, 0, 8, 5], tr("cached_lens: each request's cached_len"))
    expect(md.seq_lens, [7, 4, 9, 12], tr("seq_lens: each request's device_len"))
    assert md.table_idx == [r.table_idx for r in batch.reqs], tr("table_idx must copy req.table_idx request by request, got {table_idx}", table_idx=md.table_idx)


def test_create_backend() -> None:
    cache, table, batch, q, k, v, ref = make_case(1, CASES["decode"])
    auto = create_attention_backend("auto", cache, table, HQ)
    assert isinstance(auto, SDPAAttnBackend), tr("On CPU, auto must choose SDPA")
    auto.prepare_metadata(batch)
    assert_close_zh(auto.forward(q, k, v, 1, batch), ref, tr("The backend chosen by auto computes wrong results"), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        create_attention_backend("nope", cache, table, HQ)
    with pytest.raises(ValueError):
        create_attention_backend("fi", cache, table, HQ)  # FlashInfer 只能在 CUDA 上用


def test_attend_bf16_softmax_in_fp32_and_cast_back() -> None:
    """bf16 输入：docstring 要求 softmax 在 fp32 里算、结果转回 q 的 dtype。参考是 fp64 算出再舍入到 bf16；
    照要求做的实现几乎每个元素都与它相同，在 bf16 里算分数或 softmax 的实现有一大半元素差出一两个 ulp。"""
    torch.manual_seed(0)
    L = 40
    q = (torch.randn(L, HQ, D) * 3).bfloat16()  # 分数大一些，bf16 的舍入误差在 exp 之后才看得出来
    k, v = torch.randn(L, HKV, D).bfloat16(), torch.randn(L, HKV, D).bfloat16()
    mask = causal_mask_with_prefix(0, L)
    got = attend(q, k, v, mask, D**-0.5)
    assert got.dtype == torch.bfloat16, tr("attend must cast its result back to the dtype of q (bfloat16), got {dtype}", dtype=got.dtype)
    kk, vv = k.double().repeat_interleave(HQ // HKV, 1), v.double().repeat_interleave(HQ // HKV, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kk) * D**-0.5
    want = torch.einsum("hqk,khd->qhd", scores.masked_fill(~mask, float("-inf")).softmax(-1), vv).bfloat16()
    differ = (got != want).sum().item()
    assert differ <= got.numel() // 100, (
        tr("With bf16 inputs, {differ}/{value} elements differ from the fp64 reference (rounded to bf16), max difference {value2:.4g}: compute the scores and the softmax after .float(), and .to(q.dtype) at the end", differ=differ, value=got.numel(), value2=(got.float() - want.float()).abs().max().item())
    )


def varlen_by_hand(batch: Batch) -> VarlenMetadata:
    """这个批次的变长元数据，在检查里直接写出来：padded_metadata 的检查不依赖本章的 make_varlen_metadata。

    en: This batch's variable-length metadata, written out in the check: the checks of padded_metadata do not depend on
    this chapter's make_varlen_metadata.
    """
    cu = [0]
    for r in batch.reqs:
        cu.append(cu[-1] + r.extend_len)
    return VarlenMetadata(
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
        cu_seqlens_q_cpu=cu,
        cached_lens=[r.cached_len for r in batch.reqs],
        seq_lens=[r.device_len for r in batch.reqs],
        table_idx=[r.table_idx for r in batch.reqs],
    )


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_padded_metadata_matches_brute_force(case: str, page_size: int) -> None:
    """padded_metadata 的每个量与逐请求、逐位置写出来的参考对照：形状、dtype、设备、下标、槽位和掩码。
    补出来的 query 行只要求至少看得见一个 key（全被屏蔽的行在手写 softmax 里是 NaN；新版 PyTorch 的 CPU SDPA 会悄悄给 0，
    所以输出对了也要单独查掩码）；补出来的 key 位置只要求指向本请求写过的槽位。

    en: Every value of padded_metadata against a reference written out request by request and position by position:
    shapes, dtypes, devices, indices, slots and mask. A padded query row need only see at least one key (a fully masked
    row is NaN in a hand-written softmax; recent PyTorch's CPU SDPA quietly gives 0, so the mask is checked on its own
    even when the output is right); a padded key position need only point at a slot the request has written.
    """
    _, table, batch, *_ = make_case(page_size, CASES[case])
    base = varlen_by_hand(batch)
    md = padded_metadata(base, table)
    assert isinstance(md, PaddedMetadata), tr("padded_metadata must return a PaddedMetadata, got {name}", name=type(md).__name__)
    for field in ("cu_seqlens_q_cpu", "cached_lens", "seq_lens", "table_idx"):
        expect(getattr(md, field), getattr(base, field), tr("padded_metadata must keep the fields of base as they are: {field}", field=field))
    expect(md.cu_seqlens_q.tolist(), base.cu_seqlens_q.tolist(), tr("padded_metadata must keep the fields of base as they are: {field}", field="cu_seqlens_q"))
    for name in ("q_index", "out_index", "kv_slots", "mask"):
        got = getattr(md, name).device
        assert got == table.device, tr("{name} must be on the page table's device {device}, got {got}", name=name, device=table.device, got=got)
    ext = [r.extend_len for r in batch.reqs]
    cu, bs, max_q, max_k = base.cu_seqlens_q_cpu, batch.size, max(ext), max(base.seq_lens)
    expect(tuple(md.q_index.shape), (bs, max_q), tr("q_index: shape [B, max_q]"))
    got_q = md.q_index.tolist()
    expect([row[:ext[b]] for b, row in enumerate(got_q)], [list(range(cu[b], cu[b] + ext[b])) for b in range(bs)],
           tr("q_index: row b starts with the indices of request b's queries in the concatenated tensor"))
    total = int(cu[-1])
    stray_q = [(b, i, row[i]) for b, row in enumerate(got_q) for i in range(ext[b], max_q) if not 0 <= row[i] < total]
    assert not stray_q, tr("q_index: padded positions (request, position, index) {stray} point outside the {total} queries of the batch; any valid index will do, its result is never used", stray=stray_q[:6], total=total)
    want_out = [b * max_q + i for b in range(bs) for i in range(ext[b])]
    expect(md.out_index.tolist(), want_out, tr("out_index: where each query of the concatenated tensor sits in the padded result flattened to B * max_q"))
    assert tuple(md.kv_slots.shape) == (bs, max_k), tr("kv_slots must be [B, max_k] = {value}, got {value2}", value=(bs, max_k), value2=tuple(md.kv_slots.shape))
    assert md.kv_slots.dtype == torch.int64, tr("kv_slots must be int64, got {dtype}", dtype=md.kv_slots.dtype)
    assert tuple(md.mask.shape) == (bs, 1, max_q, max_k), tr("mask must be [B, 1, max_q, max_k] = {value}, got {value2}", value=(bs, 1, max_q, max_k), value2=tuple(md.mask.shape))
    assert md.mask.dtype == torch.bool, tr("mask must be bool, got {dtype}", dtype=md.mask.dtype)
    blind = (~md.mask.any(-1)).nonzero().tolist()
    assert not blind, tr("These (request, head, query row) see no key at all: {blind_item}; padded rows must also see at least one key", blind_item=blind[:6])
    for b, r in enumerate(batch.reqs):
        seq, row = r.device_len, table[r.table_idx]
        expect(md.kv_slots[b, :seq].tolist(), row[:seq].tolist(), tr("Request {b}: the slots of its real keys are the first seq_len={seq_len} slots of its page-table row {row}", b=b, seq_len=seq, row=r.table_idx))
        stray = sorted(set(md.kv_slots[b, seq:].tolist()) - set(row[:seq].tolist()))
        assert not stray, tr("Request {b}: padded key positions point at slots {stray} it has not written; an unwritten slot may hold NaN, and 0 × NaN is NaN", b=b, stray=stray)
        want = [[j <= r.cached_len + i and j < seq for j in range(max_k)] for i in range(r.extend_len)]
        got = md.mask[b, 0, : r.extend_len].tolist()
        assert got == want, tr("Wrong mask on the real query rows of request {b} (cached_len={cached_len}, seq_len={device_len})", b=b, cached_len=r.cached_len, device_len=seq)


@pytest.mark.parametrize("backend_cls", [TorchAttnBackend, SDPAAttnBackend], ids=["torch", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_backend_ignores_nan_in_unwritten_slots(backend_cls: type, case: str) -> None:
    """KV 池用 torch.empty 分配，没写过的槽位里可能是 NaN：把它们都换成 NaN，后端的输出仍要与参考一致
    （被掩掉的 key 权重是 0，但 0 × NaN 仍是 NaN，所以补齐的 key 也不能指向那里）。

    en: The KV pool is allocated with torch.empty, so an unwritten slot may hold NaN: with NaN in all of them, the
    backend's output must still match the reference (a masked key gets weight 0, but 0 × NaN is still NaN, so padded keys
    must not point there either).
    """
    cache, table, batch, q, k, v, ref = make_case(4, CASES[case])
    written = torch.zeros(cache.num_slots, dtype=torch.bool)
    for r in batch.reqs:
        written[table[r.table_idx, : r.device_len].long()] = True
    for pool in (cache.k_cache(1), cache.v_cache(1)):
        pool[~written] = float("nan")
    backend = backend_cls(cache, table)
    backend.prepare_metadata(batch)
    out = backend.forward(q, k, v, 1, batch)
    assert_close_zh(out, ref, tr("With NaN in the unwritten slots of the pool, the output for the {case} batch differs from the reference: read only slots the request has written (padded keys too)", case=case), atol=1e-5, rtol=1e-5)


def test_varlen_metadata_dtypes() -> None:
    """docstring 说 cu_seqlens_q 是设备上的 int32（FlashInfer / FlashAttention 只收 int32）；Python 列表给 Python 循环用。"""
    _, _, batch, *_ = make_case(1, CASES["prefill"])
    md = make_varlen_metadata(batch, torch.device("cpu"))
    assert md.cu_seqlens_q.dtype == torch.int32, tr("cu_seqlens_q must be int32, got {dtype} (torch.tensor(list) defaults to int64)", dtype=md.cu_seqlens_q.dtype)
    assert isinstance(md.cu_seqlens_q_cpu, list) and all(isinstance(x, int) for x in md.cu_seqlens_q_cpu), (
        tr("cu_seqlens_q_cpu must be a Python list of int, got {cu_seqlens_q_cpu!r}", cu_seqlens_q_cpu=md.cu_seqlens_q_cpu)
    )


# ----------------------------------------------------------------------------- 在后面章节下跑本章的代码（issue 24）


@pytest.mark.parametrize("backend", ["torch", "sdpa"])
def test_later_chapters_run_this_attention_and_match_hf(tiny_path: str, backend: str) -> None:
    """引擎（第 1.6 章）用本章的注意力后端（page_size=4，请求不在自己编号的那一行）：贪心输出与 Hugging Face 一致。"""
    classes = dict(Engine=Engine, EngineConfig=EngineConfig, Req=Req, Batch=Batch, SamplingParams=SamplingParams)
    engine_matches_hf(classes, tiny_path, tr("The engine (chapter 1.6) with your {backend} attention backend", backend=backend), page_size=4, backend=backend)
