"""第 1.5 章示例：一个变长批次（一个请求从头预填充，另一个已有 3 个 token 在缓存里）交给两个后端，
和“把整段序列重新算一遍”的稠密注意力对照。

    python examples/chapters/attention.py

en: Chapter 1.5 example: a variable-length batch (one request prefilled from scratch, another with 3 tokens already in
the cache) given to two backends, compared with dense attention that recomputes the whole sequence.

    python examples/chapters/attention.py
"""

import torch
import torch.nn.functional as F

from minisgl.attention import SDPAAttnBackend, TorchAttnBackend, causal_mask_with_prefix
from minisgl.core import Batch, Req, SamplingParams
from minisgl.i18n import tr
from minisgl.kvcache import MHAKVCache, create_page_table

torch.manual_seed(0)
HQ, HKV, D = 4, 2, 8
print(tr("causal_mask_with_prefix(cached_len=3, seq_len=5): 2 new queries × 5 keys (1 = visible)"))
for row in causal_mask_with_prefix(3, 5).int().tolist():
    print(f"  {row}")

cache = MHAKVCache(HKV, num_layers=1, head_dim=D, num_pages=32, page_size=1, dtype=torch.float32, device="cpu")
page_table = create_page_table(max_running_req=2, max_seq_len=8, device="cpu")
page_table[0, :4] = torch.arange(0, 4)  # 请求 A 的 4 个 token 放在槽位 0..3 | en: request A's 4 tokens go to slots 0..3
page_table[1, :5] = torch.arange(10, 15)  # 请求 B 的 5 个 token 放在槽位 10..14 | en: request B's 5 tokens go to slots 10..14

# 请求 B 的前 3 个 token 早已算过：它们的 K/V 已经在池子里
# en: request B's first 3 tokens were computed earlier: their K/V are already in the pool
full_k = {"A": torch.randn(4, HKV, D), "B": torch.randn(5, HKV, D)}
full_v = {"A": torch.randn(4, HKV, D), "B": torch.randn(5, HKV, D)}
cache.store_kv(full_k["B"][:3], full_v["B"][:3], page_table[1, :3], layer_id=0)

params = SamplingParams()
a = Req(torch.zeros(4, dtype=torch.int32), table_idx=0, cached_len=0, output_len=1, uid=0, sampling_params=params)
b = Req(torch.zeros(5, dtype=torch.int32), table_idx=1, cached_len=3, output_len=1, uid=1, sampling_params=params)
batch = Batch(reqs=[a, b], phase="prefill")
batch.positions = torch.tensor([0, 1, 2, 3, 3, 4], dtype=torch.int32)
batch.out_loc = torch.cat([page_table[0, 0:4], page_table[1, 3:5]])
q = torch.randn(6, HQ, D)
k_new = torch.cat([full_k["A"], full_k["B"][3:]])
v_new = torch.cat([full_v["A"], full_v["B"][3:]])
print(tr("Tokens this round: A 4 + B 2 = {n_q}; out_loc={out_loc}", n_q=len(q), out_loc=batch.out_loc.tolist()))

# 对照：每个请求把整段序列重算一遍，取本轮的那几行
# en: for comparison: each request recomputes its whole sequence, and we take this step's rows
reference = []
for name, req, rows in (("A", a, slice(0, 4)), ("B", b, slice(4, 6))):
    qq = torch.zeros(req.device_len, HQ, D)
    qq[req.cached_len :] = q[rows]
    o = F.scaled_dot_product_attention(
        qq.transpose(0, 1), full_k[name].transpose(0, 1), full_v[name].transpose(0, 1), is_causal=True, enable_gqa=True
    ).transpose(0, 1)
    reference.append(o[req.cached_len :])
reference = torch.cat(reference)

for backend in (TorchAttnBackend(cache, page_table), SDPAAttnBackend(cache, page_table)):
    backend.prepare_metadata(batch)
    md = batch.attn_metadata
    out = backend.forward(q, k_new, v_new, layer_id=0, batch=batch)
    print(
        tr("{backend:<17} cu_seqlens_q={cu_seqlens_q_cpu} last token of each request at {last}; matches dense attention: {same}",
           backend=type(backend).__name__, cu_seqlens_q_cpu=md.cu_seqlens_q_cpu,
           last=md.get_last_indices(batch.size).tolist(), same=torch.allclose(out, reference, atol=1e-5))
    )
