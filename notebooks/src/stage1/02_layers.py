# %% [markdown]
# # 第 1.2 章 layers：不依赖 nn.Module 的算子层
#
# 推理不需要 autograd、hook 和参数注册，只需要“权重 + 前向”。这一章把每个算子写成普通对象：
# 权重是它的张量属性，前向是普通方法，它自己知道怎样从 HF 检查点里装载权重。
#
# - **合并线性层**：HF 检查点里的 q/k/v（或 gate/up）几个张量按行拼进同一块权重，一次矩阵乘法算完；
# - **RMSNorm**、**SwiGLU**（`silu(gate) * up`）、**RoPE**（旋转位置编码）：都要与 HF 逐元素一致；
# - **LM head** 只算每个请求最后一个 token 的 logits；**注意力层** 拆出 q/k/v、做 RoPE，然后交给注意力后端；
# - CPU 上可以把线性层的权重一次性重排成 oneDNN 的布局，之后每步快好几倍（参考路径 `F.linear` 一直保留）。

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
# 本章的任务（和 stage1/layers.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
from minisgl.notebook import show_tasks

show_tasks("layers")

# %% [markdown]
# ## 1. 合并线性层
#
# 注意力的 `qkv_proj` 有三段输出：`q`（头数 × head_dim 行）、`k`、`v`（KV 头数 × head_dim 行）。
# 检查点里它们是三个张量，装载时第 `shard` 段拷进自己的那几行。

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
    print(f"{name} {tuple(hf[name].shape)} → 合并权重的第 {start}..{start + qkv.output_sizes[shard] - 1} 行")
x = torch.randn(5, hidden)
separate = torch.cat([F.linear(x, w) for w in hf.values()], dim=-1)
print(f"合并权重 {tuple(qkv.weight.shape)}；一次矩阵乘法 == 分三次再拼接：{torch.allclose(qkv.forward(x), separate, atol=1e-5)}")
try:
    qkv.load_weight("weight", torch.randn(kv_size + 1, hidden), 1)
except ValueError as err:
    print("形状不对时：ValueError：", err)

# %% [markdown]
# ## 2. RMSNorm、SwiGLU、RoPE 与 Hugging Face 逐元素对照

# %%
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

from minisgl.layers import RotaryEmbedding, rms_norm, silu_and_mul

w = torch.rand(hidden) + 0.5
ref_norm = Qwen3RMSNorm(hidden, eps=1e-6)
ref_norm.weight.data.copy_(w)
print("RMSNorm 与 HF 一致：", torch.allclose(rms_norm(x, w, 1e-6), ref_norm(x), atol=1e-6))
bf = x.bfloat16()
print("bf16 输入时也一致（内部用 fp32 算）：", torch.equal(rms_norm(bf, w.bfloat16(), 1e-6), ref_norm.bfloat16()(bf)))

gate_up = torch.randn(5, 2 * hidden)
gate, up = gate_up.chunk(2, dim=-1)
print(f"silu_and_mul：{tuple(gate_up.shape)} → {tuple(silu_and_mul(gate_up).shape)}，等于 silu(gate) * up：{torch.allclose(silu_and_mul(gate_up), F.silu(gate) * up)}")

rope = RotaryEmbedding(head_dim, 1_000_000.0, 4096, device="cpu")
positions = torch.tensor([0, 1, 2, 7, 100])
q, k = torch.randn(5, heads, head_dim), torch.randn(5, kv_heads, head_dim)
q_rot, k_rot = rope.forward(positions, q, k)
cos, sin = rope._cos[positions], rope._sin[positions]
q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
print("RoPE 与 HF 一致：", torch.allclose(q_rot, q_ref[0].transpose(0, 1), atol=1e-5), torch.allclose(k_rot, k_ref[0].transpose(0, 1), atol=1e-5))
print("位置 0 不旋转：", torch.allclose(q_rot[0], q[0]), "；旋转不改变长度：", torch.allclose(q_rot.norm(dim=-1), q.norm(dim=-1), atol=1e-5))

# %% [markdown]
# ## 3. RoPE 长什么样
#
# 把每个头的向量看成 `head_dim / 2` 个二维点，第 `i` 个点每前进一个位置转过角度 `θ_i = base^(-2i/head_dim)`。
# 前面的维度转得快（刻画近距离），后面的转得慢（刻画远距离）。下图是 `cos(位置 × θ_i)`。
# 关键性质：旋转以后 `q_m · k_n` 只取决于相对距离 `m - n`。

# %%
import matplotlib.pyplot as plt


def draw_rope(base: float, head_dim: int, max_pos: int = 64) -> None:
    rope = RotaryEmbedding(head_dim, base, max_pos + 8, device="cpu")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
    ax1.imshow(rope._cos[:max_pos, : head_dim // 2].T, aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
    ax1.set_xlabel("位置")
    ax1.set_ylabel("二维点的序号 i")
    ax1.set_title(f"cos(位置 × θ_i)，base={base:g}")
    g = torch.Generator().manual_seed(0)
    qv, kv = torch.randn(1, 1, head_dim, generator=g), torch.randn(1, 1, head_dim, generator=g)
    scores = []
    for m in range(max_pos):  # q 在位置 m，k 在位置 0 和 5：分数只随 m - n 变
        qm, _ = rope.forward(torch.tensor([m]), qv, kv)
        row = []
        for n in (0, 5):
            _, kn = rope.forward(torch.tensor([n]), qv, kv)
            row.append(float((qm * kn).sum()))
        scores.append(row)
    s = torch.tensor(scores)
    ax2.plot(range(max_pos), s[:, 0], label="k 在位置 0")
    ax2.plot(range(max_pos), s[:, 1], "--", label="k 在位置 5")
    ax2.set_xlabel("q 的位置 m")
    ax2.set_title("q·k：第二条就是第一条右移 5")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    shift = (s[5:, 1] - s[:-5, 0]).abs().max()
    print(f"base={base:g} head_dim={head_dim}：最快的点（i=0）每个位置转 1 弧度，最慢的（i={head_dim // 2 - 1}）转 {base ** (-(head_dim - 2) / head_dim):.2e} 弧度")
    print(f"右移 5 以后两条曲线重合（最大差 < 1e-4）：{bool(shift < 1e-4)}——分数只取决于相对距离")


draw_rope(1_000_000.0, 16)
plt.show()

# %% [markdown]
# ## 4. CPU 上的快速线性层
#
# `pack()` 把权重一次性重排成 oneDNN 的布局（`torch.ops.mkldnn._reorder_linear_weight`），
# 之后的前向调用 `_linear_pointwise`，结果与 `F.linear` 相差不到 1e-5。下面用 SmolLM2 的 MLP 大小比一比速度
# （时间每次运行都不同）。

# %%
# NBVAL_IGNORE_OUTPUT
import time

from minisgl.layers import fast_linear_supported
from minisgl.notebook import fmt_ms

print("本机 fp32 能走快速路径：", fast_linear_supported(torch.device("cpu"), torch.float32))
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
big.pack()
t_fast = bench(big)
print(f"F.linear：{fmt_ms(t_ref)}；打包后：{fmt_ms(t_fast)}；最大误差 {float((big.forward(xb) - ref).abs().max()):.1e}")
print("打包后原权重被替换掉了（省内存）：weight is None →", big.weight is None)

# %% [markdown]
# ## 5. 动手调：RoPE 的 base 和 head_dim
#
# Qwen3 用 `base = 1e6`，Llama 2 用 `1e4`。base 越大，最慢的那些维度转得越慢，能区分的距离越远。

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
explorer.run(base=100.0, head_dim=32)

# %% [markdown]
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

# %% [markdown]
# ## 检查你的代码
#
# 写完 `stage1/layers.py` 里的任务后运行下面这一格（`python -m minisgl.course check layers`）。

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("layers")
