"""第 1.4 章 kvcache 的检查：KV 池的尺寸、形状、不填 0 和视图、只写 out_loc、页号换槽位、每页字节数；经引擎写 KV 也只落在 out_loc。"""

from __future__ import annotations

import psutil
import pytest
import torch

from minisgl.i18n import tr
from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.kvcache import MHAKVCache, create_page_table, pages_to_slots

from .conftest import assert_close_zh, engine_matches_hf, expect


def pool_bytes(cache: MHAKVCache) -> int:
    """池子那一次分配的字节数（各层的视图都落在同一块存储上）。

    en: The bytes of the pool's one allocation (every layer's views lie on the same storage).
    """
    return cache.k_cache(0).untyped_storage().nbytes()


def make_cache(page_size: int = 4, num_pages: int = 6) -> MHAKVCache:
    return MHAKVCache(num_kv_heads=2, num_layers=3, head_dim=8, num_pages=num_pages, page_size=page_size,
                      dtype=torch.float32, device="cpu")  # fmt: skip


def test_init_keeps_sizes_and_allocates_the_pool() -> None:
    cache = MHAKVCache(num_kv_heads=2, num_layers=3, head_dim=8, num_pages=5, page_size=4,
                       dtype=torch.bfloat16, device="cpu")  # fmt: skip
    sizes = (cache.num_kv_heads, cache.num_layers, cache.head_dim, cache.num_pages, cache.page_size)
    expect(sizes, (2, 3, 8, 5, 4), tr("MHAKVCache(num_kv_heads=2, num_layers=3, head_dim=8, num_pages=5, page_size=4): (num_kv_heads, num_layers, head_dim, num_pages, page_size), the arguments kept as attributes"))
    storages = {view.untyped_storage().data_ptr() for layer in range(3) for view in (cache.k_cache(layer), cache.v_cache(layer))}
    expect(len(storages), 1, tr("Every layer's K and V view is a view of one and the same allocation (the whole pool is allocated once)"))
    expect(pool_bytes(cache), 2 * 3 * 5 * 4 * 2 * 8 * 2, tr("The bytes of the pool's allocation: K and V of 3 layers, 5 pages of 4 slots, 2 KV heads of 8, bfloat16 (nothing more)"))
    expect((cache.dtype, cache.device), (torch.bfloat16, torch.device("cpu")), tr("(dtype, device) of the pool: those of the arguments"))


def test_pool_is_not_filled() -> None:
    """类文档：池子只分配、不填 0，没写过的页不占物理内存。建一个 64 MiB 的池子，进程的常驻内存几乎不应变多。

    en: The class docstring: the pool is only allocated, not filled with 0, so unwritten pages take no physical memory.
    Building a 64 MiB pool should barely grow the process's resident memory.
    """
    proc = psutil.Process()
    before = proc.memory_info().rss
    cache = MHAKVCache(num_kv_heads=8, num_layers=4, head_dim=128, num_pages=128, page_size=16,
                       dtype=torch.float32, device="cpu")  # fmt: skip
    grown = proc.memory_info().rss - before
    size = pool_bytes(cache)
    assert grown < size // 4, tr("Building a {size} MiB KV pool made the process's resident memory grow by {grown} MiB: allocate it without filling it (torch.zeros, fill_ and zero_ touch every page)", size=size >> 20, grown=grown >> 20)


def test_buffer_and_views() -> None:
    cache = make_cache()
    storage = cache.k_cache(0).untyped_storage()
    start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    blocks = []
    for layer in range(3):
        k, v = cache.k_cache(layer), cache.v_cache(layer)
        assert k.shape == v.shape == (24, 2, 8), tr("Each layer's K/V must be flattened to [num_pages * page_size, KV heads, head_dim]")
        for name, view in (("K", k), ("V", v)):
            assert view.is_contiguous(), tr("Layer {layer}: the {name} view must be contiguous in memory (kernels read a layer's {name} as one block); its strides are {strides}", layer=layer, name=name, strides=view.stride())
            first = view.data_ptr()
            assert start <= first and first + view.numel() * view.element_size() <= end, tr("Layer {layer}: the {name} view must lie inside the pool's one allocation (a view of the pool, not a tensor of its own)", layer=layer, name=name)
            blocks.append((first, first + view.numel() * view.element_size(), f"{name}{layer}"))
    blocks.sort()
    overlaps = [(a[2], b[2]) for a, b in zip(blocks, blocks[1:]) if b[0] < a[1]]
    assert not overlaps, tr("The per-layer K and V views must not overlap in memory: {pairs}", pairs=overlaps)
    for layer in range(3):
        k, v = cache.k_cache(layer), cache.v_cache(layer)
        v.fill_(-1)  # 池子用 torch.empty 分配，先写上已知的值 | en: the pool comes from torch.empty; write known values first
        k.fill_(layer + 1)  # 是视图：写它就是写池子
    assert cache.k_cache(1)[0, 0, 0] == 2 and cache.k_cache(2)[-1, -1, -1] == 3, tr("k_cache must return a view of the pool, not a copy")
    assert (cache.v_cache(0) == -1).all(), tr("K and V must not share memory")


@pytest.mark.parametrize("page_size", [1, 4])
def test_store_kv_writes_exactly_out_loc(page_size: int) -> None:
    torch.manual_seed(0)
    cache = make_cache(page_size=page_size, num_pages=24 // page_size)
    for layer in range(3):
        cache.k_cache(layer).copy_(torch.randn(24, 2, 8))
        cache.v_cache(layer).copy_(torch.randn(24, 2, 8))
    before_k = [cache.k_cache(i).clone() for i in range(3)]
    before_v = [cache.v_cache(i).clone() for i in range(3)]
    out_loc = torch.tensor([17, 3, 9, 22, 0], dtype=torch.int32)
    k, v = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    cache.store_kv(k, v, out_loc, layer_id=1)
    assert_close_zh(cache.k_cache(1)[out_loc.long()], k, tr("K was not written to the slots given by out_loc"))
    assert_close_zh(cache.v_cache(1)[out_loc.long()], v, tr("V was not written to the slots given by out_loc"))
    untouched = torch.ones(24, dtype=torch.bool)
    untouched[out_loc.long()] = False
    for layer in range(3):
        keep = untouched if layer == 1 else torch.ones(24, dtype=torch.bool)
        assert torch.equal(cache.k_cache(layer)[keep], before_k[layer][keep]), tr("Layer {layer}: K slots that must not be written were changed", layer=layer)
        assert torch.equal(cache.v_cache(layer)[keep], before_v[layer][keep]), tr("Layer {layer}: V slots that must not be written were changed", layer=layer)


def test_pages_to_slots() -> None:
    expect(pages_to_slots(torch.tensor([3, 1], dtype=torch.int32), 2).tolist(), [6, 7, 2, 3], tr("pages_to_slots(pages [3, 1], page_size 2): every slot of each page, in page order"))
    expect(pages_to_slots(torch.tensor([5, 0, 2]), 1).tolist(), [5, 0, 2], tr("pages_to_slots(pages [5, 0, 2], page_size 1): the pages themselves"))
    slots = pages_to_slots(torch.tensor([2, 0], dtype=torch.int32), 4)
    assert slots.tolist() == [8, 9, 10, 11, 0, 1, 2, 3], tr("pages=[2, 0], page_size=4 must give [8..11, 0..3], got {value}", value=slots.tolist())
    assert slots.dtype == torch.int32, tr("The dtype of the page ids (int32) must be kept, got {dtype}", dtype=slots.dtype)


def test_bytes_per_page() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        cache = MHAKVCache(2, 3, 8, num_pages=5, page_size=4, dtype=dtype, device="cpu")
        total = pool_bytes(cache)
        got = MHAKVCache.bytes_per_page(2, 3, 8, 4, dtype)
        assert got * 5 == total, tr("{dtype}: bytes per page × pages must equal the size of the whole KV pool {total}, got {got} × 5 = {value}", dtype=dtype, total=total, got=got, value=got * 5)
    expect(MHAKVCache.bytes_per_page(8, 28, 128, 1, torch.float32), 2 * 28 * 8 * 128 * 4, tr("bytes_per_page(8 kv heads, 28 layers, head_dim 128, page_size 1, fp32) = 2 (K and V) x 28 x 8 x 128 x 4 bytes"))


@pytest.mark.parametrize("page_size", [1, 4])
def test_engine_writes_kv_only_at_out_loc(tiny_path: str, hand, page_size: int) -> None:  # noqa: ANN001
    """经过完整的前向：每层 KV 池里被改动的槽位恰好就是 out_loc（预填充和解码都一样）。"""
    engine = Engine(EngineConfig(tiny_path, max_running_req=2, num_page_override=256 // page_size,
                                 max_seq_len_override=64, page_size=page_size, attention_backend="torch"))  # fmt: skip
    page_table = create_page_table(2, 64, "cpu")
    expect((tuple(page_table.shape), page_table.dtype), (tuple(engine.page_table.shape), torch.int32), tr("create_page_table(2, 64): (shape, dtype), as the engine's page table"))
    reqs = []
    for uid, (row, prompt) in enumerate(zip([1, 0], [[1, 2, 3, 4, 5], [9, 8, 7]])):  # 第 i 个请求不在第 i 行
        hand.assign_pages(engine, row)
        reqs.append(Req(torch.tensor(prompt, dtype=torch.int32), row, 0, 4, uid, SamplingParams()))
    for phase in ("prefill", "decode", "decode"):
        batch = Batch(reqs, phase)
        hand.fill_batch(engine, batch)
        views = [(kv, layer, (engine.kv_cache.k_cache, engine.kv_cache.v_cache)[kv](layer))
                 for layer in range(engine.model_config.num_layers) for kv in (0, 1)]
        before = [view.clone() for *_, view in views]
        out = engine.forward_batch(batch, engine.sampler.prepare(batch))
        for req, token in zip(reqs, out.next_tokens_cpu):
            req.complete_one()
            req.append_host(token.reshape(1))
        for (kv, layer, after), old in zip(views, before):
            # 比较位模式：没写过的槽位（torch.empty）里可能有 NaN，而 NaN != NaN
            # en: compare bit patterns: an unwritten slot (torch.empty) may hold NaN, and NaN != NaN
            changed = (after.view(torch.int32) != old.view(torch.int32)).flatten(1).any(-1)
            assert set(changed.nonzero().flatten().tolist()) == set(batch.out_loc.tolist()), (
                tr("{phase}: the changed slots of the {value} pool in layer {layer} must be exactly out_loc", phase=phase, layer=layer, value='KV'[kv])
            )
    engine.shutdown()


# ----------------------------------------------------------------------------- 在后面章节下跑本章的代码（issue 24）


def test_later_chapters_run_this_kvcache_and_match_hf(tiny_path: str) -> None:
    """引擎（第 1.6 章）用本章的 KV 池和页表（page_size=4，请求不在自己编号的那一行）：贪心输出与 Hugging Face 一致。"""
    classes = dict(Engine=Engine, EngineConfig=EngineConfig, Req=Req, Batch=Batch, SamplingParams=SamplingParams)
    engine_matches_hf(classes, tiny_path, tr("The engine (chapter 1.6) with your KV cache"), page_size=4)
