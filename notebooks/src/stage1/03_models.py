# %% [markdown]
# # 第 1.3 章 models：Qwen3 / Llama 解码器与流式权重加载
#
# 用上一章的算子搭出完整的解码器。Qwen3 和 Llama 共用一份定义，区别只在配置：Qwen3 在注意力里对 q、k
# 各做一次 RMSNorm（`qk_norm`），Llama 没有。结构与权重名字都与 HF 的 `config.json` / `model.safetensors`
# 对应，唯一的改动是 q/k/v 和 gate/up 合并成一个线性层。
#
# 第 0 步把全部权重读进一个字典再用；这里先按配置搭好模型（只分配、不初始化），再从 safetensors
# **一次一个张量** 地读出来、拷进预先分配好的位置——峰值内存约等于模型本身。

# %%
# 准备：找到仓库根目录（保证导入的是这个仓库里的 minisgl）、关掉进度条、固定随机种子、配好画图
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "minisgl" / "course").is_dir())
sys.path.insert(0, str(ROOT))
from minisgl.notebook import setup_notebook

setup_notebook()

# %%
# NBVAL_IGNORE_OUTPUT
# 本章的任务（和 stage1/models.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
from minisgl.notebook import show_tasks

show_tasks("models")

# %% [markdown]
# ## 1. 读配置
#
# `ModelConfig.from_hf` 把 HF 的 `config.json` 读成一个扁平的配置；不认识的架构、没实现的 RoPE 缩放直接报错，
# 免得算出错的结果。

# %%
import torch

from minisgl.model_zoo import smollm2, tiny_qwen3
from minisgl.models import ModelConfig

SMOL, TINY = smollm2(), tiny_qwen3()
for name, path in [("SmolLM2-135M", SMOL), ("小 Qwen3（随机）", TINY)]:
    c = ModelConfig.from_hf(path)
    print(
        f"{name}：{c.architecture}，{c.num_layers} 层，hidden {c.hidden_size}，{c.num_qo_heads} 个 query 头 / "
        f"{c.num_kv_heads} 个 KV 头，head_dim {c.head_dim}，qk_norm={c.qk_norm}，共享词嵌入={c.tie_word_embeddings}"
    )
try:
    ModelConfig.from_dict({"architectures": ["GPT2LMHeadModel"]})
except ValueError as err:
    print("不认识的架构：ValueError：", err)

# %% [markdown]
# ## 2. 搭模型、流式装载权重
#
# 模型是一棵算子树。检查点里的每个名字都对应树上某个算子的某个属性（合并层里还要加上第几段）。

# %%
from minisgl.models import create_model, load_weights, safetensors_files

config = ModelConfig.from_hf(SMOL)
model = create_model(config, torch.float32, "cpu")
for name, op in list(model.named_ops())[:12]:
    shapes = {k: tuple(v.shape) for k, v in op.own_weights().items()}
    print(f"{name or '(根)':<38} {type(op).__name__:<14} {shapes if shapes else ''}")
print("……")
load_weights(model, SMOL)

from safetensors import safe_open

with safe_open(safetensors_files(SMOL)[0], framework="pt") as f:
    print(f"检查点里有 {len(list(f.keys()))} 个张量")
    q, k, v = (f.get_tensor(f"model.layers.0.self_attn.{p}_proj.weight") for p in "qkv")
merged = model.model.layers[0].self_attn.qkv_proj.weight
print(f"第 0 层 qkv_proj {tuple(merged.shape)} == cat(q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})：{torch.equal(merged, torch.cat([q, k, v]))}")
print("lm_head 与词嵌入共用一块内存：", model.lm_head.weight is model.model.embed_tokens.weight)

# %% [markdown]
# 权重都花在哪里？按算子种类数一数 SmolLM2 的参数（共享的词嵌入只算一次）：

# %%
import matplotlib.pyplot as plt

groups: dict[str, int] = {}
seen = set()
for name, w in model.state_dict().items():
    if id(w) in seen:
        continue
    seen.add(id(w))
    kind = ("词嵌入 / LM head" if "embed" in name or "lm_head" in name else "qkv_proj" if "qkv" in name else "o_proj" if "o_proj" in name
            else "gate_up_proj" if "gate_up" in name else "down_proj" if "down" in name else "归一化")  # fmt: skip
    groups[kind] = groups.get(kind, 0) + w.numel()
total = sum(groups.values())
for kind, n in sorted(groups.items(), key=lambda kv: -kv[1]):
    print(f"{kind:<16}{n:>12,}  {100 * n / total:5.1f}%")
print(f"{'合计':<16}{total:>12,}")
fig, ax = plt.subplots(figsize=(7, 2.8))
kinds = sorted(groups, key=lambda k: -groups[k])
ax.barh(kinds, [groups[k] / 1e6 for k in kinds], color="#6fa8dc")
ax.invert_yaxis()
ax.set_xlabel("参数（百万）")
ax.set_title("SmolLM2-135M 的参数分布：小模型里词嵌入占了很大一块")
plt.show()

# %% [markdown]
# ## 3. 跑一次前向，和 Hugging Face 比 logits
#
# 模型的各层在前向里要从全局上下文拿到当前批次、KV 缓存和注意力后端——这些由第 1.6 章的 `Engine` 准备。
# 这里先借用它：建一个引擎，手工填一个只有一个请求的预填充批次，直接调用 `engine.model.forward()`。

# %%
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig

engine = Engine(EngineConfig(str(SMOL), dtype=torch.float32, max_running_req=1, num_page_override=256, max_seq_len_override=256))
tok = AutoTokenizer.from_pretrained(SMOL)
hf = AutoModelForCausalLM.from_pretrained(SMOL, dtype=torch.float32)


@torch.inference_mode()
def next_token_logits(prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """我们的模型和 HF 对同一个提示词最后一个位置的 logits。"""
    ids = torch.tensor(tok(prompt)["input_ids"], dtype=torch.int32)
    n = len(ids)
    req = Req(ids, table_idx=0, cached_len=0, output_len=1, uid=0, sampling_params=SamplingParams())
    engine.page_table[0, :n] = torch.arange(n, dtype=torch.int32)  # 这个请求的 KV 放在槽位 0..n-1
    batch = Batch([req], "prefill")
    batch.input_ids, batch.positions, batch.out_loc = ids, torch.arange(n, dtype=torch.int32), engine.page_table[0, :n]
    engine.attn_backend.prepare_metadata(batch)
    with engine.ctx.forward_batch(batch):
        ours = engine.model.forward()[0]
    ref = hf(ids[None].long()).logits[0, -1]
    return ours, ref


ours, ref = next_token_logits("The capital of France is")
print(f"logits 形状 {tuple(ours.shape)}；与 HF 的最大差 < 1e-3：{bool((ours - ref).abs().max() < 1e-3)}")
print("两边的 top-5：", ours.topk(5).indices.tolist(), ref.topk(5).indices.tolist())
print("下一个 token：", repr(tok.decode(int(ours.argmax()))))

# %% [markdown]
# ## 4. 动手调：换个提示词
#
# 看我们的模型和 HF 给出的前 5 个候选 token 和概率。

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def top5(prompt: str) -> None:
    ours, ref = next_token_logits(prompt or " ")
    p_ours, p_ref = ours.softmax(-1), ref.softmax(-1)
    top = p_ours.topk(5).indices.tolist()
    print(f"{'token':<14}{'我们':>8}{'HF':>8}")
    for t in top:
        print(f"{tok.decode(t)!r:<14}{float(p_ours[t]):>8.3f}{float(p_ref[t]):>8.3f}")
    print("top-5 与 HF 相同：", top == p_ref.topk(5).indices.tolist())
    fig, ax = plt.subplots(figsize=(6, 2.6))
    xs = range(len(top))
    ax.bar([x - 0.2 for x in xs], [float(p_ours[t]) for t in top], width=0.4, label="我们", color="#f4a261")
    ax.bar([x + 0.2 for x in xs], [float(p_ref[t]) for t in top], width=0.4, label="HF", color="#6fa8dc")
    ax.set_xticks(list(xs), [repr(tok.decode(t)) for t in top])
    ax.set_ylabel("概率")
    ax.legend(fontsize=8)


explorer = Explorer(top5, title="下一个 token", prompt=widgets.Text(value="The capital of France is", description="提示词"))
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
explorer.run(prompt="def add(a, b):\n    return")

# %% [markdown]
# ## 自测
#
# 1. SmolLM2 的配置里 `tie_word_embeddings = true`，检查点里没有 `lm_head.weight`。我们的模型怎样处理？
#
# <details><summary>答案</summary>
#
# LM head 直接引用词嵌入那块权重（同一个张量），装载时不为它找检查点名字；
# CPU 上打包成快速布局时给 LM head 另做一份，词嵌入保留原始权重用来查表。
# </details>
#
# 2. 为什么要“先搭模型、再一个一个张量地装载”，而不是像第 0 步那样先读进一个字典？
#
# <details><summary>答案</summary>
#
# 字典方式在合并（拼接 q/k/v）或转换 dtype 时会同时存在两份权重，峰值内存翻倍；流式装载一次只多一个张量。
# 另外装载时按名字对号入座，多了、少了、形状不对都能报出是哪个张量。
# </details>
#
# 3. Qwen3 和 Llama 在我们的解码器里只差在哪里？
#
# <details><summary>答案</summary>
#
# `qk_norm`：Qwen3 在 RoPE 之前对每个头的 q、k 各做一次 RMSNorm（权重名 `q_norm` / `k_norm`）。
# 其余（RMSNorm 位置、SwiGLU、RoPE 排布）都一样，差异全在配置里。
# </details>

# %% [markdown]
# ## 检查你的代码
#
# 写完 `stage1/models.py` 里的任务后运行下面这一格（`python -m minisgl.course check models`）。

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("models")
