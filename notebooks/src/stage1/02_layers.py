# %% [markdown] tags=["lang-zh"]
# # 第 1.2 章 layers：不依赖 nn.Module 的算子层
#
# 推理不需要 autograd、hook 和参数注册，只需要“权重 + 前向”。这一章把每个算子写成普通对象：
# 权重是它的张量属性，前向是普通方法，它自己知道怎样从 HF 检查点里装载权重。
#
# - **合并线性层**：HF 检查点里的 q/k/v（或 gate/up）几个张量按行拼进同一块权重，一次矩阵乘法算完；
# - **RMSNorm**、**SwiGLU**（`silu(gate) * up`）、**RoPE**（旋转位置编码）：都要与 HF 逐元素一致；
# - **LM head** 只算每个请求最后一个 token 的 logits；**注意力层** 拆出 q/k/v、做 RoPE，然后交给注意力后端；
# - CPU 上可以把线性层的权重一次性重排成 oneDNN 的布局，之后每步快好几倍（参考路径 `F.linear` 一直保留）。

# %% [markdown] tags=["lang-en"]
# # Chapter 1.2 layers: operator layers without nn.Module
#
# Inference needs no autograd, hooks or parameter registration, only "weights + forward". This chapter writes each operator
# as a plain object: its weights are tensor attributes, its forward is an ordinary method, and it knows how to load its
# weights from an HF checkpoint.
#
# - **Merged linear layers**: the q/k/v (or gate/up) tensors of an HF checkpoint are stacked row-wise into one weight and computed by one matrix multiplication;
# - **RMSNorm**, **SwiGLU** (`silu(gate) * up`), **RoPE** (rotary position embedding): all must match HF element by element;
# - the **LM head** computes logits only for the last token of each request; the **attention layer** splits q/k/v, applies RoPE and hands over to the attention backend;
# - on the CPU the weights of a linear layer can be reordered once into oneDNN's layout, after which every step is several times faster (the reference path `F.linear` stays).

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
# 本章的任务（和 stage1/layers.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage1/layers.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("layers")

# %% [markdown] tags=["lang-zh"]
# ## 1. 合并线性层
#
# 注意力的 `qkv_proj` 有三段输出：`q`（头数 × head_dim 行）、`k`、`v`（KV 头数 × head_dim 行）。
# 检查点里它们是三个张量，装载时第 `shard` 段拷进自己的那几行。

# %% [markdown] tags=["lang-en"]
# ## 1. Merged linear layers
#
# The attention's `qkv_proj` has three output parts: `q` (heads × head_dim rows), `k` and `v` (KV heads × head_dim rows).
# In the checkpoint they are three tensors; when loading, shard number `shard` is copied into its own rows.

# %%
import torch
import torch.nn.functional as F

from minisgl.layers import Linear

hidden, heads, kv_heads, head_dim = 64, 4, 2, 16
q_size, kv_size = heads * head_dim, kv_heads * head_dim
qkv = Linear(hidden, [q_size, kv_size, kv_size], shard_names=["q_proj", "k_proj", "v_proj"], dtype=torch.float32, device="cpu")
hf = {name: torch.randn(rows, hidden) for name, rows in [("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size)]}
for shard, name in enumerate(hf):
    start = sum(qkv.output_sizes[:shard])
    qkv.load_weight("weight", hf[name], shard)
    print(tr("{name} {shape} → rows {start}..{end} of the merged weight", name=name, shape=tuple(hf[name].shape), start=start, end=start + qkv.output_sizes[shard] - 1))
x = torch.randn(5, hidden)
separate = torch.cat([F.linear(x, w) for w in hf.values()], dim=-1)
print(tr("merged weight {shape}; one matmul == three matmuls concatenated: {same}", shape=tuple(qkv.weight.shape), same=torch.allclose(qkv.forward(x), separate, atol=1e-05)))
try:
    qkv.load_weight("weight", torch.randn(kv_size + 1, hidden), 1)
except ValueError as err:
    print(tr("wrong shape: ValueError:"), err)

# %% [markdown] tags=["lang-zh"]
# ## 2. RMSNorm、SwiGLU、RoPE 与 Hugging Face 逐元素对照

# %% [markdown] tags=["lang-en"]
# ## 2. RMSNorm, SwiGLU, RoPE against Hugging Face, element by element

# %%
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

from minisgl.layers import RotaryEmbedding, rms_norm, silu_and_mul

w = torch.rand(hidden) + 0.5
ref_norm = Qwen3RMSNorm(hidden, eps=1e-6)
ref_norm.weight.data.copy_(w)
print(tr("RMSNorm matches HF:"), torch.allclose(rms_norm(x, w, 1e-6), ref_norm(x), atol=1e-6))
bf = x.bfloat16()
print(tr("also with bf16 input (computed in fp32 inside):"), torch.equal(rms_norm(bf, w.bfloat16(), 1e-6), ref_norm.bfloat16()(bf)))

gate_up = torch.randn(5, 2 * hidden)
gate, up = gate_up.chunk(2, dim=-1)
print(tr("silu_and_mul: {shape_in} → {shape_out}, equals silu(gate) * up: {same}", shape_in=tuple(gate_up.shape), shape_out=tuple(silu_and_mul(gate_up).shape), same=torch.allclose(silu_and_mul(gate_up), F.silu(gate) * up)))

rope = RotaryEmbedding(head_dim, 1_000_000.0, 4096, device="cpu")
positions = torch.tensor([0, 1, 2, 7, 100])
q, k = torch.randn(5, heads, head_dim), torch.randn(5, kv_heads, head_dim)
q_rot, k_rot = rope.forward(positions, q, k)
cos, sin = rope.cos_sin(positions)
q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
print(tr("RoPE matches HF:"), torch.allclose(q_rot, q_ref[0].transpose(0, 1), atol=1e-5), torch.allclose(k_rot, k_ref[0].transpose(0, 1), atol=1e-5))
same_norm = torch.allclose(q_rot.norm(dim=-1), q.norm(dim=-1), atol=1e-5)
print(tr("position 0 is not rotated: {unrotated} ; rotation keeps the length: {same_norm}", unrotated=torch.allclose(q_rot[0], q[0]), same_norm=same_norm))

# %% [markdown] tags=["lang-zh"]
# ## 3. RoPE 长什么样
#
# 把每个头的向量看成 `head_dim / 2` 个二维点，第 `i` 个点每前进一个位置转过角度 `θ_i = base^(-2i/head_dim)`。
# 前面的维度转得快（刻画近距离），后面的转得慢（刻画远距离）。下图是 `cos(位置 × θ_i)`。
# 关键性质：旋转以后 `q_m · k_n` 只取决于相对距离 `m - n`。

# %% [markdown] tags=["lang-en"]
# ## 3. What RoPE looks like
#
# View each head's vector as `head_dim / 2` 2D points; point `i` turns by the angle `θ_i = base^(-2i/head_dim)` per position.
# The first dimensions turn fast (they capture short distances), the last ones slowly (long distances). The picture shows
# `cos(position × θ_i)`. The key property: after rotation `q_m · k_n` depends only on the relative distance `m - n`.

# %%
import matplotlib.pyplot as plt


def draw_rope(base: float, head_dim: int, max_pos: int = 64) -> None:
    rope = RotaryEmbedding(head_dim, base, max_pos + 8, device="cpu")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
    ax1.imshow(rope.cos_sin(torch.arange(max_pos))[0][:, : head_dim // 2].T, aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
    ax1.set_xlabel(tr("position"))
    ax1.set_ylabel(tr("index i of the 2D point"))
    ax1.set_title(tr("cos(position × θ_i), base={base:g}", base=base))
    g = torch.Generator().manual_seed(0)
    qv, kv = torch.randn(1, 1, head_dim, generator=g), torch.randn(1, 1, head_dim, generator=g)
    scores = []
    for m in range(max_pos):  # q 在位置 m，k 在位置 0 和 5：分数只随 m - n 变 | en: q at position m, k at positions 0 and 5: the score varies only with m - n
        qm, _ = rope.forward(torch.tensor([m]), qv, kv)
        row = []
        for n in (0, 5):
            _, kn = rope.forward(torch.tensor([n]), qv, kv)
            row.append(float((qm * kn).sum()))
        scores.append(row)
    s = torch.tensor(scores)
    ax2.plot(range(max_pos), s[:, 0], label=tr("k at position 0"))
    ax2.plot(range(max_pos), s[:, 1], "--", label=tr("k at position 5"))
    ax2.set_xlabel(tr("position m of q"))
    ax2.set_title(tr("q·k: the second curve is the first shifted right by 5"))
    ax2.legend(fontsize=8)
    fig.tight_layout()
    shift = (s[5:, 1] - s[:-5, 0]).abs().max()
    print(tr("base={base:g} head_dim={head_dim}: the fastest point (i=0) turns 1 radian per position, the slowest (i={slowest}) {angle:.2e} radians", base=base, head_dim=head_dim, slowest=head_dim // 2 - 1, angle=base ** (-(head_dim - 2) / head_dim)))
    print(tr("shifted right by 5, the two curves coincide (max difference < 1e-4): {same} — the score depends only on the relative distance", same=bool(shift < 0.0001)))


draw_rope(1_000_000.0, 16)
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 4. CPU 上的快速线性层
#
# `pack()` 把权重一次性重排成 oneDNN 的布局，另存一份（`torch.ops.mkldnn._reorder_linear_weight`；`weight` 本身不变），
# 之后的前向调用 `_linear_pointwise`，结果与 `F.linear` 相差不到 1e-5。下面用 SmolLM2 的 MLP 大小比一比速度
# （时间每次运行都不同）。

# %% [markdown] tags=["lang-en"]
# ## 4. A fast linear layer on the CPU
#
# `pack()` reorders the weight once into oneDNN's layout, kept as a copy (`torch.ops.mkldnn._reorder_linear_weight`;
# `weight` itself stays as it is); the forward then
# calls `_linear_pointwise`, and the result differs from `F.linear` by less than 1e-5. Below we compare the speed on the
# MLP size of SmolLM2 (the times differ from run to run).

# %%
# NBVAL_IGNORE_OUTPUT
import time

from minisgl.layers import fast_linear_supported
from minisgl.notebook import fmt_ms

print(tr("fp32 can take the fast path on this machine:"), fast_linear_supported(torch.device("cpu"), torch.float32))
big = Linear(576, [1536, 1536], dtype=torch.float32, device="cpu")
big.weight.copy_(torch.randn_like(big.weight) * 0.02)
xb = torch.randn(8, 576)
ref = big.forward(xb)


def bench(op: Linear, n: int = 50) -> float:
    op.forward(xb)
    start = time.perf_counter()
    for _ in range(n):
        op.forward(xb)
    return (time.perf_counter() - start) / n


t_ref = bench(big)
plain = big.weight
big.pack()
t_fast = bench(big)
print(tr("F.linear: {t_ref}; packed: {t_fast}; max error {err:.1e}", t_ref=fmt_ms(t_ref), t_fast=fmt_ms(t_fast), err=float((big.forward(xb) - ref).abs().max())))
print(tr("after packing, weight is still the original tensor, and the packed layout is a copy beside it ({mb:.1f} MiB) →",
         mb=big.packed_nbytes() / 2**20), big.weight is plain)

# %% [markdown] tags=["lang-zh"]
# ## 5. 动手调：RoPE 的 base 和 head_dim
#
# Qwen3 用 `base = 1e6`，Llama 2 用 `1e4`。base 越大，最慢的那些维度转得越慢，能区分的距离越远。

# %% [markdown] tags=["lang-en"]
# ## 5. Try it: RoPE's base and head_dim
#
# Qwen3 uses `base = 1e6`, Llama 2 uses `1e4`. The larger the base, the slower the slowest dimensions turn, and the
# longer the distances they can tell apart.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

explorer = Explorer(
    draw_rope,
    title="RoPE",
    base=widgets.SelectionSlider(options=[100.0, 10_000.0, 500_000.0, 1_000_000.0], value=1_000_000.0, description="base"),
    head_dim=widgets.SelectionSlider(options=[8, 16, 32, 64, 128], value=16, description="head_dim"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (this checks it without a browser)
explorer.run(base=100.0, head_dim=32)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 合并的 `qkv_proj` 有 `output_sizes = [1024, 512, 512]`。检查点里的 `v_proj.weight` 装进合并权重的哪几行？
#
# <details><summary>答案</summary>
#
# 第 1536 到 2047 行：第 2 段从 `sum(output_sizes[:2]) = 1536` 行开始，共 512 行。
# </details>
#
# 2. RMSNorm 为什么先转 fp32、算完再转回原 dtype 乘权重？
#
# <details><summary>答案</summary>
#
# bf16 只有 8 位尾数，平方再求均值误差很大；HF 也是这样算的，顺序不同结果就对不上（检查要求与 HF 逐元素一致）。
# </details>
#
# 3. LM head 为什么只算每个请求最后一个 token？
#
# <details><summary>答案</summary>
#
# 只有最后一个位置的 logits 用来采样。词表有十几万行，预填充 100 个 token 时把其余 99 个位置也乘一遍词表矩阵是白费。
# </details>
#
# 4. 旋转位置编码为什么能让注意力分数只依赖相对位置？
#
# <details><summary>答案</summary>
#
# 每个二维点被旋转了 `位置 × θ_i`，两个旋转过的向量做点积，等于原向量之间夹角再加上 `(m - n) × θ_i`，
# 绝对位置互相抵消，只剩差值。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. A merged `qkv_proj` has `output_sizes = [1024, 512, 512]`. Into which rows of the merged weight does the checkpoint's `v_proj.weight` go?
#
# <details><summary>Answer</summary>
#
# Rows 1536 to 2047: part 2 starts at row `sum(output_sizes[:2]) = 1536` and has 512 rows.
# </details>
#
# 2. Why does RMSNorm convert to fp32 first, and convert back to the original dtype before multiplying by the weight?
#
# <details><summary>Answer</summary>
#
# bf16 has only 8 bits of mantissa, so squaring and averaging in bf16 is very inaccurate; HF computes it this way too, and
# a different order would not match (the checks require element-wise agreement with HF).
# </details>
#
# 3. Why does the LM head compute only the last token of each request?
#
# <details><summary>Answer</summary>
#
# Only the logits of the last position are used for sampling. The vocabulary has over a hundred thousand rows; when
# prefilling 100 tokens, multiplying the other 99 positions by the vocabulary matrix would be wasted work.
# </details>
#
# 4. Why does the rotary position embedding make the attention score depend only on the relative position?
#
# <details><summary>Answer</summary>
#
# Each 2D point is rotated by `position × θ_i`; the dot product of two rotated vectors equals that of the original vectors
# with their angle increased by `(m - n) × θ_i`. The absolute positions cancel out and only the difference is left.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage1/layers.py` 里的任务后运行下面这一格（`python -m minisgl.course check layers`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage1/layers.py`, run the cell below (`python -m minisgl.course check layers`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("layers")
