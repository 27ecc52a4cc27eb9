"""第 1.4 章示例：KV 池有多大、页号怎样变成槽位、两个请求怎样各占页表的一行。

    python examples/chapters/kvcache.py

en: Chapter 1.4 example: how big the KV pool is, how page numbers become slots, how two requests each take a row of the
page table.

    python examples/chapters/kvcache.py
"""

import torch

from minisgl.i18n import tr
from minisgl.kvcache import MHAKVCache, create_page_table, pages_to_slots

# Qwen3-0.6B 的形状：28 层，8 个 KV 头，head_dim 128
# en: Qwen3-0.6B's shape: 28 layers, 8 KV heads, head_dim 128
for dtype in (torch.float32, torch.bfloat16):
    per_token = MHAKVCache.bytes_per_page(8, 28, 128, 1, dtype)
    print(tr("Qwen3-0.6B, {dtype:<14}: K/V of one token takes {per_token:,} bytes; 1 GiB holds {per_gib:,} tokens",
             dtype=str(dtype), per_token=per_token, per_gib=2**30 // per_token))

# 一个小池子：2 层、1 个 KV 头、head_dim 2，8 页 × 每页 2 个 token
# en: a small pool: 2 layers, 1 KV head, head_dim 2, 8 pages × 2 tokens each
cache = MHAKVCache(num_kv_heads=1, num_layers=2, head_dim=2, num_pages=8, page_size=2, dtype=torch.float32, device="cpu")
# 池子用 torch.empty 分配（里面可能是任何值）：清零后写入的槽位才看得出来
# en: the pool is allocated with torch.empty (it may hold anything): zeroed, the written slots show
cache.zero_()
print(tr("Small pool: {num_pages} pages × {page_size} = {num_slots} slots; k_cache(0) has shape {shape}, shares memory with the big tensor: {shared}",
         num_pages=cache.num_pages, page_size=cache.page_size, num_slots=cache.num_slots,
         shape=tuple(cache.k_cache(0).shape), shared=cache.k_cache(0).untyped_storage().data_ptr() == cache.v_cache(1).untyped_storage().data_ptr()))

print(f"pages_to_slots([3, 1], page_size=2) = {pages_to_slots(torch.tensor([3, 1]), 2).tolist()}")

# 请求 A（5 个 token）分到第 3、1、6 页，请求 B（3 个 token）分到第 0、5 页
# en: request A (5 tokens) gets pages 3, 1 and 6, request B (3 tokens) pages 0 and 5
page_table = create_page_table(max_running_req=2, max_seq_len=6, device="cpu")
for row, (pages, n) in enumerate((([3, 1, 6], 5), ([0, 5], 3))):
    page_table[row, :n] = pages_to_slots(torch.tensor(pages, dtype=torch.int32), 2)[:n]
print(tr("Page table (row 2 is reserved for the dummy padding request):"))
for row in page_table.tolist():
    print(f"  {row}")

# 第 1 层：把请求 B 的 3 个 token 的 K/V 写进它的槽位，别处一个也不碰
# en: layer 1: write the K/V of request B's 3 tokens into its slots, touching nothing else
out_loc = page_table[1, :3]
k = torch.arange(1, 7, dtype=torch.float32).view(3, 1, 2)
cache.store_kv(k, -k, out_loc, layer_id=1)
written = (cache.k_cache(1) != 0).any(dim=-1).flatten().nonzero().flatten().tolist()
print(tr("After writing out_loc={out_loc}, nonzero slots in layer 1: {written}; layer 0 is still all 0: {zeros}",
         out_loc=out_loc.tolist(), written=written, zeros=bool((cache.k_cache(0) == 0).all())))
print(tr("K of request B read back through the page table: {k}",
         k=cache.k_cache(1)[page_table[1, :3].long()].flatten().tolist()))
