# %% [markdown] tags=["lang-zh"]
# # 第 1.3 章 models：Qwen3 / Llama 解码器与流式权重加载
#
# 用上一章的算子搭出完整的解码器。Qwen3 和 Llama 共用一份定义，区别只在配置：Qwen3 在注意力里对 q、k
# 各做一次 RMSNorm（`qk_norm`），Llama 没有。结构与权重名字都与 HF 的 `config.json` / `model.safetensors`
# 对应，唯一的改动是 q/k/v 和 gate/up 合并成一个线性层。
#
# 第 0 步把全部权重读进一个字典再用；这里先按配置搭好模型（只分配、不初始化），再从 safetensors
# **一次一个张量** 地读出来、拷进预先分配好的位置——峰值内存约等于模型本身。

# %% [markdown] tags=["lang-en"]
# # Chapter 1.3 models: the Qwen3 / Llama decoder and streaming weight loading
#
# Build the complete decoder from the operators of the previous chapter. Qwen3 and Llama share one definition and differ
# only in their configuration: inside attention Qwen3 applies an RMSNorm to q and to k (`qk_norm`), Llama does not. The
# structure and weight names follow HF's `config.json` / `model.safetensors`; the only change is that q/k/v and gate/up are
# merged into one linear layer each.
#
# Step 0 read all the weights into a dict before using them; here we first build the model from its configuration (allocated,
# not initialized), then read the safetensors **one tensor at a time** and copy each into its preallocated place — peak
# memory is about the size of the model itself.

# %%
# 准备：找到仓库根目录（保证导入的是这个仓库里的 minisgl）、关掉进度条、固定随机种子、配好画图
# en: Setup: import this repository's minisgl, no progress bars, fixed random seeds, plotting
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "minisgl" / "course").is_dir())
sys.path.insert(0, str(ROOT))
from minisgl.i18n import tr
from minisgl.notebook import setup_notebook

setup_notebook()

# %%
# NBVAL_IGNORE_OUTPUT
# 本章的任务（和 stage1/models.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage1/models.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("models")

# %% [markdown] tags=["lang-zh"]
# ## 1. 读配置
#
# `ModelConfig.from_hf` 把 HF 的 `config.json` 读成一个扁平的配置；不认识的架构、没实现的 RoPE 缩放直接报错，
# 免得算出错的结果。

# %% [markdown] tags=["lang-en"]
# ## 1. Reading the configuration
#
# `ModelConfig.from_hf` reads HF's `config.json` into a flat configuration; an unknown architecture or an unimplemented
# RoPE scaling is an immediate error, rather than silently wrong results.

# %%
import torch

from minisgl.model_zoo import smollm2, tiny_qwen3
from minisgl.models import ModelConfig

SMOL, TINY = smollm2(), tiny_qwen3()
for name, path in [("SmolLM2-135M", SMOL), (tr("tiny Qwen3 (random)"), TINY)]:
    c = ModelConfig.from_hf(path)
    print(
        tr("{name}: {architecture}, {num_layers} layers, hidden {hidden_size}, {num_qo_heads} query heads / {num_kv_heads} KV heads, head_dim {head_dim}, qk_norm={qk_norm}, tied embeddings={tie_word_embeddings}", name=name, architecture=c.architecture, num_layers=c.num_layers, hidden_size=c.hidden_size, num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, qk_norm=c.qk_norm, tie_word_embeddings=c.tie_word_embeddings)
    )
try:
    ModelConfig.from_dict({"architectures": ["GPT2LMHeadModel"]})
except ValueError as err:
    print(tr("unknown architecture: ValueError:"), err)

# %% [markdown] tags=["lang-zh"]
# ## 2. 搭模型、流式装载权重
#
# 模型是一棵算子树。检查点里的每个名字都对应树上某个算子的某个属性（合并层里还要加上第几段）。

# %% [markdown] tags=["lang-en"]
# ## 2. Building the model, streaming the weights in
#
# The model is a tree of operators. Each name in the checkpoint corresponds to an attribute of some operator in the tree
# (plus, for a merged layer, which shard).

# %%
from minisgl.models import create_model, load_weights, safetensors_files

config = ModelConfig.from_hf(SMOL)
model = create_model(config, torch.float32, "cpu")
for name, op in list(model.named_ops())[:12]:
    shapes = {k: tuple(v.shape) for k, v in op.own_weights().items()}
    print(f"{name or tr('(root)'):<38} {type(op).__name__:<14} {shapes if shapes else ''}")
print("……")
load_weights(model, SMOL)

from safetensors import safe_open

with safe_open(safetensors_files(SMOL)[0], framework="pt") as f:
    print(tr("the checkpoint has {n_tensors} tensors", n_tensors=len(list(f.keys()))))
    q, k, v = (f.get_tensor(f"model.layers.0.self_attn.{p}_proj.weight") for p in "qkv")
merged = model.model.layers[0].self_attn.qkv_proj.weight
print(tr("layer 0 qkv_proj {merged} == cat(q {q}, k {k}, v {v}): {same}", merged=tuple(merged.shape), q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape), same=torch.equal(merged, torch.cat([q, k, v]))))
print(tr("lm_head shares its memory with the word embedding:"), model.lm_head.weight is model.model.embed_tokens.weight)

# %% [markdown] tags=["lang-zh"]
# 权重都花在哪里？按算子种类数一数 SmolLM2 的参数（共享的词嵌入只算一次）：

# %% [markdown] tags=["lang-en"]
# Where do the weights go? Count SmolLM2's parameters by kind of operator (the shared embedding counted once):

# %%
import matplotlib.pyplot as plt

groups: dict[str, int] = {}
seen = set()
for name, w in model.state_dict().items():
    if id(w) in seen:
        continue
    seen.add(id(w))
    kind = (tr("embed / LM head") if "embed" in name or "lm_head" in name else "qkv_proj" if "qkv" in name else "o_proj" if "o_proj" in name
            else "gate_up_proj" if "gate_up" in name else "down_proj" if "down" in name else tr("norms"))  # fmt: skip
    groups[kind] = groups.get(kind, 0) + w.numel()
total = sum(groups.values())
for kind, n in sorted(groups.items(), key=lambda kv: -kv[1]):
    print(f"{kind:<16}{n:>12,}  {100 * n / total:5.1f}%")
print(f"{tr('total'):<16}{total:>12,}")
fig, ax = plt.subplots(figsize=(7, 2.8))
kinds = sorted(groups, key=lambda k: -groups[k])
ax.barh(kinds, [groups[k] / 1e6 for k in kinds], color="#6fa8dc")
ax.invert_yaxis()
ax.set_xlabel(tr("parameters (millions)"))
ax.set_title(tr("Parameters of SmolLM2-135M: the embedding is a big share of a small model"))
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 3. 跑一次前向，和 Hugging Face 比 logits
#
# 模型的各层在前向里要从全局上下文拿到当前批次、KV 缓存和注意力后端——这些由第 1.6 章的 `Engine` 准备。
# 这里先借用它：建一个引擎，手工填一个只有一个请求的预填充批次，直接调用 `engine.model.forward()`。

# %% [markdown] tags=["lang-en"]
# ## 3. One forward pass, logits against Hugging Face
#
# During the forward pass every layer of the model gets the current batch, the KV cache and the attention backend from the
# global context — chapter 1.6's `Engine` prepares these. We borrow it here: build an engine, fill a prefill batch with a
# single request by hand, and call `engine.model.forward()` directly.

# %%
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig

engine = Engine(EngineConfig(str(SMOL), dtype=torch.float32, max_running_req=1, num_page_override=256, max_seq_len_override=256))
tok = AutoTokenizer.from_pretrained(SMOL)
hf = AutoModelForCausalLM.from_pretrained(SMOL, dtype=torch.float32)


@torch.inference_mode()
def next_token_logits(prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """我们的模型和 HF 对同一个提示词最后一个位置的 logits。

    en: The logits at the last position of one prompt, from our model and from HF.
    """
    ids = torch.tensor(tok(prompt)["input_ids"], dtype=torch.int32)
    n = len(ids)
    req = Req(ids, table_idx=0, cached_len=0, output_len=1, uid=0, sampling_params=SamplingParams())
    engine.page_table[0, :n] = torch.arange(n, dtype=torch.int32)  # 这个请求的 KV 放在槽位 0..n-1 | en: this request's KV goes to slots 0..n-1
    batch = Batch([req], "prefill")
    batch.input_ids, batch.positions, batch.out_loc = ids, torch.arange(n, dtype=torch.int32), engine.page_table[0, :n]
    engine.attn_backend.prepare_metadata(batch)
    with engine.ctx.forward_batch(batch):
        ours = engine.model.forward()[0]
    ref = hf(ids[None].long()).logits[0, -1]
    return ours, ref


ours, ref = next_token_logits("The capital of France is")
print(tr("logits shape {shape}; max difference from HF < 1e-3: {close}", shape=tuple(ours.shape), close=bool((ours - ref).abs().max() < 0.001)))
print(tr("top-5 of both:"), ours.topk(5).indices.tolist(), ref.topk(5).indices.tolist())
print(tr("next token:"), repr(tok.decode(int(ours.argmax()))))

# %% [markdown] tags=["lang-zh"]
# ## 4. 动手调：换个提示词
#
# 看我们的模型和 HF 给出的前 5 个候选 token 和概率。

# %% [markdown] tags=["lang-en"]
# ## 4. Try it: another prompt
#
# Look at the top 5 candidate tokens and their probabilities from our model and from HF.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def top5(prompt: str) -> None:
    ours, ref = next_token_logits(prompt or " ")
    p_ours, p_ref = ours.softmax(-1), ref.softmax(-1)
    top = p_ours.topk(5).indices.tolist()
    print(f"{'token':<14}{tr('ours'):>8}{'HF':>8}")
    for t in top:
        print(f"{tok.decode(t)!r:<14}{float(p_ours[t]):>8.3f}{float(p_ref[t]):>8.3f}")
    print(tr("top-5 same as HF:"), top == p_ref.topk(5).indices.tolist())
    fig, ax = plt.subplots(figsize=(6, 2.6))
    xs = range(len(top))
    ax.bar([x - 0.2 for x in xs], [float(p_ours[t]) for t in top], width=0.4, label=tr("ours"), color="#f4a261")
    ax.bar([x + 0.2 for x in xs], [float(p_ref[t]) for t in top], width=0.4, label="HF", color="#6fa8dc")
    ax.set_xticks(list(xs), [repr(tok.decode(t)) for t in top])
    ax.set_ylabel(tr("probability"))
    ax.legend(fontsize=8)


explorer = Explorer(top5, title=tr("Next token"), prompt=widgets.Text(value="The capital of France is", description=tr("prompt")))
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (this checks it without a browser)
explorer.run(prompt="def add(a, b):\n    return")

# %% [markdown] tags=["lang-zh"]
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

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. SmolLM2's configuration has `tie_word_embeddings = true`, and the checkpoint has no `lm_head.weight`. How does our model handle that?
#
# <details><summary>Answer</summary>
#
# The LM head refers directly to the embedding's weight (the same tensor), and loading looks up no checkpoint name for it;
# when packing into the fast layout on the CPU, the LM head gets its own copy and the embedding keeps the original weight for lookups.
# </details>
#
# 2. Why "build the model first, then load one tensor at a time" instead of reading everything into a dict as in step 0?
#
# <details><summary>Answer</summary>
#
# With a dict, merging (concatenating q/k/v) or converting the dtype holds two copies of the weights at once, doubling peak
# memory; streaming holds only one extra tensor at a time. Loading by name also means that an extra, missing or misshapen
# tensor is reported by name.
# </details>
#
# 3. What is the only difference between Qwen3 and Llama in our decoder?
#
# <details><summary>Answer</summary>
#
# `qk_norm`: before RoPE, Qwen3 applies an RMSNorm to each head's q and k (weight names `q_norm` / `k_norm`).
# Everything else (RMSNorm placement, SwiGLU, RoPE layout) is the same; the differences are all in the configuration.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage1/models.py` 里的任务后运行下面这一格（`python -m minisgl.course check models`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage1/models.py`, run the cell below (`python -m minisgl.course check models`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("models")
