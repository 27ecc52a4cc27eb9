"""第 1.3 章示例：读配置、搭模型、流式装载 SmolLM2 的权重，核对合并层里的每一片。

    python examples/chapters/models.py
"""

import torch
from safetensors import safe_open

from minisgl.model_zoo import qwen3_06b_random, smollm2
from minisgl.models import ModelConfig, create_model, load_weights, safetensors_files

for name, path in (("SmolLM2-135M", smollm2()), ("Qwen3-0.6B 形状", qwen3_06b_random())):
    c = ModelConfig.from_hf(path)
    print(
        f"{name}：{c.architecture}，{c.num_layers} 层，hidden {c.hidden_size}，{c.num_qo_heads} 个 query 头 / "
        f"{c.num_kv_heads} 个 KV 头，head_dim {c.head_dim}，qk_norm={c.qk_norm}，共享词嵌入={c.tie_word_embeddings}"
    )

path = smollm2()
config = ModelConfig.from_hf(path)
model = create_model(config, torch.float32, "cpu")
slots = model.checkpoint_slots()
unique = {id(w): w for w in model.state_dict().values()}  # lm_head 与词嵌入共用一块，只算一次
params = sum(w.numel() for w in unique.values())
print(f"模型的权重张量：{len(unique)} 块（q/k/v、gate/up 已合并），对应检查点里的 {len(slots)} 个名字，共 {params:,} 个参数")
with safe_open(safetensors_files(path)[0], framework="pt") as f:
    names = list(f.keys())
    print(f"检查点里有 {len(names)} 个张量")
    load_weights(model, path)
    attn = model.model.layers[0].self_attn
    q, k, v = (f.get_tensor(f"model.layers.0.self_attn.{p}_proj.weight") for p in "qkv")
    merged = attn.qkv_proj.weight
    print(f"第 0 层 qkv_proj：{tuple(merged.shape)} = q {tuple(q.shape)} + k {tuple(k.shape)} + v {tuple(v.shape)}，"
          f"逐片相等：{torch.equal(merged, torch.cat([q, k, v]))}")
    print(f"lm_head 与词嵌入是同一块内存：{model.lm_head.weight is model.model.embed_tokens.weight}")

broken = create_model(config, torch.float32, "cpu")
try:
    broken.model.layers[0].mlp.down_proj.load_weight("weight", torch.zeros(3, 3))
except ValueError as err:
    print(f"形状不对：{err}")
