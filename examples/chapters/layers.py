"""第 1.2 章示例：合并线性层怎样装载 HF 的 q/k/v 三个张量；RMSNorm、SwiGLU、RoPE 与 Hugging Face 对照。

    python examples/chapters/layers.py

en: Chapter 1.2 example: how a merged linear layer loads HF's three q/k/v tensors; RMSNorm, SwiGLU and RoPE against
Hugging Face.

    python examples/chapters/layers.py
"""

import torch
import torch.nn.functional as F
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

from minisgl.i18n import tr
from minisgl.layers import Linear, RMSNorm, RotaryEmbedding, silu_and_mul

torch.manual_seed(0)
hidden, heads, kv_heads, head_dim = 64, 4, 2, 16
q_size, kv_size = heads * head_dim, kv_heads * head_dim

# 合并线性层：HF 检查点里的 q_proj / k_proj / v_proj 装进同一块 qkv_proj 权重
# en: merged linear layer: the HF checkpoint's q_proj / k_proj / v_proj go into one qkv_proj weight
qkv = Linear(hidden, [q_size, kv_size, kv_size], shard_names=["q_proj", "k_proj", "v_proj"], dtype=torch.float32, device="cpu")
slots = qkv.own_slots("layers.0.self_attn.qkv_proj")
for name, slot in slots.items():
    print(tr("checkpoint {name:<34} → qkv_proj.{attr} shard {shard}", name=name, attr=slot.attr, shard=slot.shard))
hf = {"q_proj": torch.randn(q_size, hidden), "k_proj": torch.randn(kv_size, hidden), "v_proj": torch.randn(kv_size, hidden)}
for shard, name in enumerate(hf):
    qkv.load_weight("weight", hf[name], shard)
print(tr("Merged weight shape: {shape} ({q_size} + {kv_size} + {kv_size} rows)",
         shape=tuple(qkv.weight.shape), q_size=q_size, kv_size=kv_size))
x = torch.randn(5, hidden)
separate = torch.cat([F.linear(x, w) for w in hf.values()], dim=-1)
print(tr("One matmul == three matmuls concatenated: {same}", same=torch.allclose(qkv.forward(x), separate, atol=1e-5)))
try:
    qkv.load_weight("weight", torch.randn(kv_size + 1, hidden), 1)
except ValueError as err:
    print(tr("With the wrong shape: {err}", err=err))

# RMSNorm 与 HF 对照
# en: RMSNorm against HF
norm = RMSNorm(hidden, 1e-6, dtype=torch.float32, device="cpu")
norm.weight.copy_(torch.rand(hidden) + 0.5)
ref = Qwen3RMSNorm(hidden, eps=1e-6)
ref.weight.data.copy_(norm.weight)
print(tr("RMSNorm matches HF: {same}", same=torch.allclose(norm.forward(x), ref(x), atol=1e-6)))

# SwiGLU：前一半是 gate，后一半是 up
# en: SwiGLU: the first half is gate, the second half up
gate_up = torch.randn(5, 2 * hidden)
gate, up = gate_up[:, :hidden], gate_up[:, hidden:]
print(tr("silu_and_mul shape: {before} → {after}, equals silu(gate) * up: {same}",
         before=tuple(gate_up.shape), after=tuple(silu_and_mul(gate_up).shape),
         same=torch.allclose(silu_and_mul(gate_up), F.silu(gate) * up)))

# RoPE 与 HF 对照：同一组位置，q、k 转过同样的角度
# en: RoPE against HF: for the same positions, q and k are rotated by the same angles
rope = RotaryEmbedding(head_dim, 1_000_000.0, 4096, device="cpu")
positions = torch.tensor([0, 1, 2, 7, 100])
q, k = torch.randn(5, heads, head_dim), torch.randn(5, kv_heads, head_dim)
q_rot, k_rot = rope.forward(positions, q, k)
cos, sin = rope.cos_sin(positions)
q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
print(tr("RoPE matches HF: q {q_same}, k {k_same}",
         q_same=torch.allclose(q_rot, q_ref[0].transpose(0, 1), atol=1e-5),
         k_same=torch.allclose(k_rot, k_ref[0].transpose(0, 1), atol=1e-5)))
print(tr("Position 0 is not rotated: {unrotated}; rotation keeps the norm: {norm_kept}",
         unrotated=torch.allclose(q_rot[0], q[0]),
         norm_kept=torch.allclose(q_rot.norm(dim=-1), q.norm(dim=-1), atol=1e-5)))
