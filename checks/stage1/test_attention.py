"""第 1.5 章 attention 的检查：掩码、按页表取 K/V、GQA 注意力，以及两个后端在分页、变长、带缓存前缀的批次上
与一个独立的稠密参考实现（对每个请求的完整序列做因果 SDPA）一致。"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minisgl.attention import (
    SDPAAttnBackend,
    TorchAttnBackend,
    attend,
    causal_mask_with_prefix,
    create_attention_backend,
    gather_kv,
    make_varlen_metadata,
)
from minisgl.core import Batch, Req, SamplingParams
from minisgl.kvcache import MHAKVCache, create_page_table

HQ, HKV, D = 4, 2, 16


def test_causal_mask_with_prefix() -> None:
    for cached, total in [(0, 5), (3, 4), (2, 6), (0, 1)]:
        mask = causal_mask_with_prefix(cached, total)
        want = [[j <= cached + i for j in range(total)] for i in range(total - cached)]
        assert mask.dtype == torch.bool and mask.tolist() == want, f"cached_len={cached}, seq_len={total} 的掩码不对"


def test_gather_kv_follows_page_table() -> None:
    cache = MHAKVCache(HKV, 2, D, num_pages=8, page_size=2, dtype=torch.float32, device="cpu")
    cache.k_cache(1).copy_(torch.arange(16.0)[:, None, None].expand(16, HKV, D))
    cache.v_cache(1).copy_(-torch.arange(16.0)[:, None, None].expand(16, HKV, D))
    table = create_page_table(3, 10, "cpu")
    table[2, :5] = torch.tensor([9, 4, 5, 14, 0], dtype=torch.int32)
    k, v = gather_kv(cache, 1, table, 2, 5)
    assert k.shape == (5, HKV, D)
    assert k[:, 0, 0].tolist() == [9, 4, 5, 14, 0], "K 应按页表这一行的槽位顺序取出"
    assert v[:, 0, 0].tolist() == [-9, -4, -5, -14, 0]


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
    torch.testing.assert_close(got, dense_reference(q, k, v), atol=1e-5, rtol=1e-5, msg="GQA 因果注意力与参考不一致")
    got = attend(q[4:], k, v, causal_mask_with_prefix(4, 7), D**-0.5)  # 只算后 3 个 query，前 4 个 key 来自缓存
    torch.testing.assert_close(got, dense_reference(q, k, v)[4:], atol=1e-5, rtol=1e-5, msg="带缓存前缀的注意力不一致")


def make_case(page_size: int, lens: list[tuple[int, int]], seed: int = 0):  # noqa: ANN201
    """造一个批次：每个请求 (cached_len, device_len)，前缀 K/V 已按打乱的页写进池子。返回被测需要的一切和参考输出。"""
    torch.manual_seed(seed)
    num_pages = 64 // page_size
    cache = MHAKVCache(HKV, 2, D, num_pages=num_pages, page_size=page_size, dtype=torch.float32, device="cpu")
    table = create_page_table(len(lens), 16, "cpu")
    perm = torch.randperm(num_pages)
    per_row = 16 // page_size
    reqs, qs, ks, vs, refs, out_loc = [], [], [], [], [], []
    for row, (cached, total) in enumerate(lens):
        pages = perm[row * per_row : (row + 1) * per_row]
        table[row] = (pages[:, None] * page_size + torch.arange(page_size)).flatten().to(torch.int32)
        q_all, k_all, v_all = torch.randn(total, HQ, D), torch.randn(total, HKV, D), torch.randn(total, HKV, D)
        slots = table[row, :total].long()
        cache.k_cache(1)[slots[:cached]] = k_all[:cached]  # 缓存里的前缀
        cache.v_cache(1)[slots[:cached]] = v_all[:cached]
        req = Req(torch.arange(total, dtype=torch.int32), row, cached, 4, row, SamplingParams())
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
}


@pytest.mark.parametrize("backend_cls", [TorchAttnBackend, SDPAAttnBackend], ids=["torch", "sdpa"])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_backend_matches_dense_reference(backend_cls: type, page_size: int, case: str) -> None:
    cache, table, batch, q, k, v, ref = make_case(page_size, CASES[case])
    backend = backend_cls(cache, table)
    backend.prepare_metadata(batch)
    out = backend.forward(q, k, v, 1, batch)
    assert out.shape == q.shape, "输出形状应与 q 相同：[T, Hq, D]"
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5, msg=f"{case} 批次的注意力输出与参考不一致")
    torch.testing.assert_close(cache.k_cache(1)[batch.out_loc.long()], k, msg="后端应先把本轮的 K 写进 out_loc")
    last = batch.attn_metadata.get_last_indices(batch.size)
    ends = torch.tensor([r.extend_len for r in batch.reqs]).cumsum(0) - 1
    assert last.tolist() == ends.tolist(), "get_last_indices 应给出每个请求最后一个 token 在拼接张量里的下标"


def test_varlen_metadata() -> None:
    _, _, batch, *_ = make_case(1, CASES["prefix"])
    md = make_varlen_metadata(batch, torch.device("cpu"))
    assert md.cu_seqlens_q.tolist() == md.cu_seqlens_q_cpu == [0, 4, 8, 9, 16]
    assert md.cached_lens == [3, 0, 8, 5] and md.seq_lens == [7, 4, 9, 12] and md.table_idx == [0, 1, 2, 3]


def test_create_backend() -> None:
    cache, table, batch, q, k, v, ref = make_case(1, CASES["decode"])
    auto = create_attention_backend("auto", cache, table, HQ)
    assert isinstance(auto, SDPAAttnBackend), "CPU 上 auto 应选 SDPA"
    auto.prepare_metadata(batch)
    torch.testing.assert_close(auto.forward(q, k, v, 1, batch), ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        create_attention_backend("nope", cache, table, HQ)
    with pytest.raises(ValueError):
        create_attention_backend("fi", cache, table, HQ)  # FlashInfer 只能在 CUDA 上用
