"""第 1.3 章示例：读配置、搭模型、流式装载 SmolLM2 的权重，核对合并层里的每一片。

    python examples/chapters/models.py

en: Chapter 1.3 example: read the config, build the model, stream in SmolLM2's weights, and check every part of the
merged layers.

    python examples/chapters/models.py
"""

import torch
from safetensors import safe_open

from minisgl.i18n import tr
from minisgl.model_zoo import qwen3_06b_random, smollm2
from minisgl.models import ModelConfig, create_model, load_weights, safetensors_files

for name, path in (("SmolLM2-135M", smollm2()), (tr("Qwen3-0.6B shape"), qwen3_06b_random())):
    c = ModelConfig.from_hf(path)
    print(
        tr("{name}: {architecture}, {num_layers} layers, hidden {hidden_size}, {num_qo_heads} query heads / {num_kv_heads} KV heads, head_dim {head_dim}, qk_norm={qk_norm}, tied embeddings={tie_word_embeddings}",
           name=name, architecture=c.architecture, num_layers=c.num_layers, hidden_size=c.hidden_size,
           num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, qk_norm=c.qk_norm,
           tie_word_embeddings=c.tie_word_embeddings)
    )

path = smollm2()
config = ModelConfig.from_hf(path)
model = create_model(config, torch.float32, "cpu")
slots = model.checkpoint_slots()
# lm_head 与词嵌入共用一块，只算一次
# en: lm_head shares its weight with the embedding, so it is counted once
unique = {id(w): w for w in model.state_dict().values()}
params = sum(w.numel() for w in unique.values())
print(tr("Weight tensors of the model: {n_unique} (q/k/v and gate/up merged), for {n_slots} names in the checkpoint, {params:,} parameters in all",
         n_unique=len(unique), n_slots=len(slots), params=params))
with safe_open(safetensors_files(path)[0], framework="pt") as f:
    names = list(f.keys())
    print(tr("The checkpoint has {n_names} tensors", n_names=len(names)))
    load_weights(model, path)
    attn = model.model.layers[0].self_attn
    q, k, v = (f.get_tensor(f"model.layers.0.self_attn.{p}_proj.weight") for p in "qkv")
    merged = attn.qkv_proj.weight
    print(tr("Layer 0 qkv_proj: {merged} = q {q} + k {k} + v {v}, equal shard by shard: {same}",
             merged=tuple(merged.shape), q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape),
             same=torch.equal(merged, torch.cat([q, k, v]))))
    print(tr("lm_head and the token embedding share memory: {same}",
             same=model.lm_head.weight is model.model.embed_tokens.weight))

broken = create_model(config, torch.float32, "cpu")
try:
    broken.model.layers[0].mlp.down_proj.load_weight("weight", torch.zeros(3, 3))
except ValueError as err:
    print(tr("Wrong shape: {err}", err=err))
