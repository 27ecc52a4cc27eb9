# %% [markdown] tags=["lang-zh"]
# # 第 5.4 章 quantization：只量化权重——int8 每通道、int4 按组
#
# 小批次解码每一步要把全部权重从内存读一遍，读的字节数定下了一步的下限。这一章让每个权重少占几个字节：存成整数，
# 乘之前才在寄存器里变回浮点数。激活和 KV 缓存仍是浮点数。要写的是：
#
# - **int8，每个输出行一个 scale**（对称）：`quantize_int8` / `dequantize_int8`——这一行绝对值最大的权重落在 ±127，
#   取最近的整数；
# - **int4，按组**（非对称，带偏移）：`quantize_int4` / `dequantize_int4`——每组的范围等分成 15 份，偏移是这一组的
#   最小值，q 在 [0, 15]，还原成 `q · scale + 偏移`；
# - **打包**：`pack_int4` / `unpack_int4`——两个 4 位值一个字节，按 llama.cpp 的 Q4_0 排：每 32 列 16 个字节，
#   第 i 个字节的低 4 位是第 i 列、高 4 位是第 i + 16 列；
# - **参考矩阵乘** `linear_int8` / `linear_int4`：`x · Wᵀ + bias`，`W` 是还原后的权重，结果与 `x` 同类型。
#
# 快速的 C 内核、把量化的权重装进引擎（`minisgl/quantized.py`）和融合解码都是给定的。

# %% [markdown] tags=["lang-en"]
# # Chapter 5.4 quantization: weight-only quantization — int8 per channel, int4 in groups
#
# A small-batch decode step reads every weight from memory once, and the bytes read set the step's lower bound. This
# chapter makes each weight take fewer bytes: stored as integers, turned back into floats in registers just before the
# multiplication. Activations and the KV cache stay floating point. You write:
#
# - **int8, one scale per output row** (symmetric): `quantize_int8` / `dequantize_int8` — the row's weight of largest
#   absolute value lands on ±127, the others on the nearest integer;
# - **int4 in groups** (asymmetric, with an offset): `quantize_int4` / `dequantize_int4` — each group's range cut into
#   15 steps, the offset the group's minimum, q in [0, 15], restored as `q · scale + offset`;
# - **packing**: `pack_int4` / `unpack_int4` — two 4-bit values per byte in llama.cpp's Q4_0 layout: 16 bytes per 32
#   columns, byte i holding column i in its low 4 bits and column i + 16 in its high 4 bits;
# - the **reference matmuls** `linear_int8` / `linear_int4`: `x · Wᵀ + bias`, `W` the restored weight, the result in
#   `x`'s dtype.
#
# The fast C kernels, the machinery that puts quantized weights into the engine (`minisgl/quantized.py`) and the fused
# decode are given.

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
# 本章的任务（和 stage5/quantization.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage5/quantization.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("quantization")

# %% [markdown] tags=["lang-zh"]
# ## 1. int8：一行一个 scale
#
# 一个 3 行 8 列的小矩阵，三行大小差很多。每一行的 scale 让这一行绝对值最大的那个数正好是 ±127：

# %% [markdown] tags=["lang-en"]
# ## 1. int8: one scale per row
#
# A small matrix of 3 rows and 8 columns, the rows of very different sizes. Each row's scale puts the row's number of
# largest absolute value exactly on ±127:

# %%
import torch

from minisgl.quantization import (INT4_BLOCK, dequantize_int4, dequantize_int8, linear_int4, linear_int8, pack_int4,
                                  quantize_int4, quantize_int8, unpack_int4)

w = torch.tensor([
    [0.5, -1.27, 0.01, 0.0, 0.3, -0.2, 0.9, 0.05],
    [0.002, -0.001, 0.0005, 0.003, -0.0027, 0.0, 0.001, 0.0015],
    [40.0, -3.0, 12.5, 0.0, -25.4, 7.0, 1.0, -0.5],
])
q, scale = quantize_int8(w)
print(tr("scale: {scale}", scale=[f"{s:.3e}" for s in scale.tolist()]))
print(tr("q:\n{q}", q=q))
err = (dequantize_int8(q, scale) - w).abs()
print(tr("largest error of each row / its scale: {ratio}", ratio=[round(x, 3) for x in (err.amax(1) / scale).tolist()]))

# %% [markdown] tags=["lang-zh"]
# 第 0 行就是书里自测 1 的那一行：每个数都正好落在格子上。第 1 行的数都在千分之几，它自己的 scale 也小，照样用满
# ±127；要是三行共用一个 scale（由第 2 行的 40 定下），第 1 行会全变成 0。每一行最大的误差都不超过半个 scale：
# 取最近的整数最多差半格。
#
# 随机的一大块矩阵上，误差除以它那一行的 scale，应当均匀地落在 [−0.5, 0.5] 里：

# %% [markdown] tags=["lang-en"]
# Row 0 is the book's self-check 1: every number sits exactly on a step. Row 1's numbers are all thousandths, its own
# scale is small too, and it still uses the whole ±127; with one scale shared by the three rows (set by row 2's 40),
# row 1 would become all zeros. Each row's largest error is at most half a scale: rounding to the nearest integer is off
# by half a step at most.
#
# On a large random matrix the error divided by its row's scale should spread evenly over [−0.5, 0.5]:

# %%
import matplotlib.pyplot as plt

g = torch.Generator().manual_seed(0)
big = torch.randn(256, 1024, generator=g) * torch.rand(256, 1, generator=g)
q, scale = quantize_int8(big)
ratio = (dequantize_int8(q, scale) - big) / scale[:, None]
print(tr("error / scale: min {lo:.3f}, max {hi:.3f}", lo=float(ratio.min()), hi=float(ratio.max())))
fig, ax = plt.subplots(figsize=(6, 2.6))
ax.hist(ratio.flatten().numpy(), bins=50)
ax.set_xlabel(tr("error / the row's scale"))
ax.set_ylabel(tr("weights"))
ax.set_title(tr("int8, one scale per row: errors within half a step"))
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 2. int4：为什么按组
#
# 4 位只有 16 个值，格子粗得多。一个离群值能拖累多少权重，取决于一个 scale 管多大一块。下面每一行的第 100 列都大 20 倍，
# 组从 32 列到一整行（1024 列），看平均误差和每个权重要读的字节（内核每组读一个 fp32 的 scale 和一个 fp32 的偏移：
# 0.5 + 8 / 组大小）：

# %% [markdown] tags=["lang-en"]
# ## 2. int4: why groups
#
# Four bits have only 16 values, far coarser steps. How many weights one outlier can spoil depends on how large a block
# one scale covers. Below, column 100 of every row is 20 times larger; groups go from 32 columns to a whole row (1024
# columns), and we look at the mean error and the bytes read per weight (the kernel reads an fp32 scale and an fp32 offset
# per group: 0.5 + 8 / group size):

# %%
w = torch.randn(64, 1024, generator=torch.Generator().manual_seed(0)) * 0.05
w[:, 100] *= 20
groups = [32, 64, 128, 256, 512, 1024]
errors = []
for group in groups:
    q, scale, offset = quantize_int4(w, group)
    errors.append(float((dequantize_int4(q, scale, offset, group) - w).abs().mean()))
    print(tr("group {g:>4}: scale {s}, mean |error| {e:.2e}, bytes per weight {b:.4f}", g=group, s=list(scale.shape),
             e=errors[-1], b=0.5 + 8 / group))
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot([0.5 + 8 / g for g in groups], errors, "o-")
for group, b, e in zip(groups, [0.5 + 8 / g for g in groups], errors):
    ax.annotate(str(group), (b, e), textcoords="offset points", xytext=(4, 4))
ax.set_xlabel(tr("bytes read per weight"))
ax.set_ylabel(tr("mean |error|"))
ax.set_title(tr("int4: smaller groups, smaller error, more bytes"))
plt.show()

# %% [markdown] tags=["lang-zh"]
# 偏移的用处：一组全是正数时（下面是 0.2 到 1.7），格子从这一组的最小值起，16 个值都用上。看一组的 q、偏移和还原值：

# %% [markdown] tags=["lang-en"]
# What the offset is for: when a group is all positive (below, 0.2 to 1.7), the steps start at the group's minimum and
# all 16 values are used. One group's q, offset and restored values:

# %%
side = torch.linspace(0.2, 1.7, 32)[None]
q, scale, offset = quantize_int4(side, 32)
print(tr("scale {s:.4f}, offset {o:.4f}", s=float(scale), o=float(offset)))
print(tr("q: {q}", q=q[0].tolist()))
restored = dequantize_int4(q, scale, offset, 32)
print(tr("largest error {e:.4f} (half a scale is {h:.4f})", e=float((restored - side).abs().max()), h=float(scale) / 2))

# %% [markdown] tags=["lang-zh"]
# ## 3. 打包：Q4_0 的字节排法
#
# 一块 32 列：前 16 列是 0..15，后 16 列是 15..0。打包之后第 i 个字节的低 4 位是第 i 列、高 4 位是第 i + 16 列。
# 内核读这 16 个字节，与 15 按位与就是第 0..15 列，右移 4 位就是第 16..31 列——两段都是连续的列：

# %% [markdown] tags=["lang-en"]
# ## 3. Packing: Q4_0's byte layout
#
# One block of 32 columns: the first 16 are 0..15, the last 16 are 15..0. Once packed, byte i holds column i in its low
# 4 bits and column i + 16 in its high 4 bits. The kernel reads these 16 bytes; an AND with 15 gives columns 0..15, a
# right shift by 4 gives columns 16..31 — both runs of consecutive columns:

# %%
block = torch.cat([torch.arange(16), torch.arange(15, -1, -1)]).to(torch.uint8)[None]
packed = pack_int4(block)
print(tr("packed: {shape} {dtype}", shape=list(packed.shape), dtype=packed.dtype))
print(" ".join(f"{b:02x}" for b in packed[0].tolist()))
print(tr("bytes & 15: {lo}", lo=(packed[0] & 15).tolist()))
print(tr("bytes >> 4: {hi}", hi=(packed[0] >> 4).tolist()))
print(tr("unpack_int4(pack_int4(q)) == q: {same}", same=bool(torch.equal(unpack_int4(packed), block))))

# %% [markdown] tags=["lang-zh"]
# ## 4. 参考矩阵乘和 C 内核
#
# `linear_int8` / `linear_int4` 是参考：对，不求快。给定的 C 内核（`minisgl.kernel.q8_linear` / `q4_linear`）只给解码的
# 几行用，权重读进寄存器才变回 fp32。两者只差求和的顺序：

# %% [markdown] tags=["lang-en"]
# ## 4. The reference matmuls and the C kernels
#
# `linear_int8` / `linear_int4` are the reference: right, not fast. The given C kernels (`minisgl.kernel.q8_linear` /
# `q4_linear`) serve only the few rows of a decode step, turning weights into fp32 only in registers. The two differ
# only in the order of summation:

# %%
from minisgl import kernel

g = torch.Generator().manual_seed(1)
weight = torch.randn(1536, 576, generator=g) * 0.05
bias = torch.randn(1536, generator=g)
x = torch.randn(1, 576, generator=g)
q8, s8 = quantize_int8(weight)
q4, s4, o4 = quantize_int4(weight, 64)
p4 = pack_int4(q4)
ref8, ref4 = linear_int8(x, q8, s8, bias), linear_int4(x, p4, s4, o4, 64, bias)
exact = torch.nn.functional.linear(x, weight, bias)
print(tr("C kernel available: {ok}", ok=kernel.available()))
if kernel.available():
    print(tr("int8: kernel vs reference, largest difference {d:.1e}", d=float((kernel.q8_linear(x, q8, s8, bias) - ref8).abs().max())))
    print(tr("int4: kernel vs reference, largest difference {d:.1e}",
             d=float((kernel.q4_linear(x, p4, s4, o4, 64, bias) - ref4).abs().max())))
print(tr("vs the float weight: int8 off by {a:.3f}, int4 off by {b:.3f} (mean |y| {y:.3f})",
         a=float((ref8 - exact).abs().mean()), b=float((ref4 - exact).abs().mean()), y=float(exact.abs().mean())))

# %% [markdown] tags=["lang-zh"]
# ## 5. 装进引擎
#
# `LLM(path, quantization="int8wo")` 或 `"int4wo-G"`：组装在引擎加载完权重之后量化每个线性层（含 LM head）。前面各章的
# 代码照旧调用 `F.linear(x, self.weight, bias)`，`self.weight` 换成了一个 `QuantizedWeight`，PyTorch 通过它的
# `__torch_function__` 把调用交给它。SmolLM2 的 LM head 和词嵌入共用一块权重，量化之后仍是同一块：

# %% [markdown] tags=["lang-en"]
# ## 5. Into the engine
#
# `LLM(path, quantization="int8wo")` or `"int4wo-G"`: the assembly quantizes every linear layer (the LM head included)
# once the engine has loaded its weights. The earlier chapters' code still calls `F.linear(x, self.weight, bias)`;
# `self.weight` is now a `QuantizedWeight`, and PyTorch hands the call to it through its `__torch_function__`. SmolLM2's
# LM head and word embedding share one weight, and still do once quantized:

# %%
from transformers import AutoTokenizer

from minisgl import model_zoo
from minisgl.core import SamplingParams
from minisgl.engine import model_nbytes
from minisgl.llm import LLM

SMOL = str(model_zoo.smollm2())
KW = dict(dtype=torch.float32, device="cpu", max_running_req=1, num_page_override=256, max_seq_len_override=256)
tok = AutoTokenizer.from_pretrained(SMOL)
prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
                                 add_generation_prompt=True, return_dict=False)
llms = {name: LLM(SMOL, quantization=None if name == "fp32" else name, **KW) for name in ("fp32", "int8wo", "int4wo-64")}
model = llms["int4wo-64"].engine.model
qkv = model.model.layers[0].self_attn.qkv_proj.weight
print(tr("layer 0's qkv_proj: {kind}, method {m}, data {d} {dt}, scale and offset {s}, shape of the weight it stands for {shape}",
         kind=type(qkv).__name__, m=qkv.method, d=list(qkv.data.shape), dt=qkv.data.dtype, s=list(qkv.scale.shape),
         shape=list(qkv.shape)))
print(tr("the LM head: {m} (it always keeps 8 bits); the LM head and the word embedding are one weight: {same}",
         m=model.lm_head.weight.method, same=model.lm_head.weight is model.model.embed_tokens.weight))
for name, llm in llms.items():
    out = llm.generate([prompt], SamplingParams(max_tokens=24))[0]
    print(tr("{name:>9}: {mb:.1f} MB, {text!r}", name=name, mb=model_nbytes(llm.engine.model) / 1e6, text=out["text"]))

# %% [markdown] tags=["lang-zh"]
# 模型的字节：int8 约为 fp32 的四分之一；int4-64 不到五分之一，而不是八分之一：解码层每个权重 0.5 个字节加上每组的 scale 和
# 偏移，可占五分之一权重的 LM head 留在 int8。解码走哪条路写在 `engine.decode_path` 里：融合的 C 解码认得量化的权重。

# %% [markdown] tags=["lang-en"]
# The model's bytes: int8 is about a quarter of fp32; int4-64 is under a fifth rather than an eighth: the decoder layers
# take half a byte per weight plus each group's scale and offset, but the LM head, a fifth of the weights, stays int8.
# The decode path is in `engine.decode_path`: the fused C decode knows quantized weights.

# %%
print(llms["int4wo-64"].engine.decode_path)

# %% [markdown] tags=["lang-zh"]
# 解码一步多快？同一个提示词、每个引擎解码 32 个 token，取每一步前向时间的中位数（时间与机器有关）。这台机器的 L3 缓存
# 很大：量化后的 SmolLM2 整个放得进，fp32 的放不进，所以比值里可能混着缓存的功劳——换一台机器比值会不同。

# %% [markdown] tags=["lang-en"]
# How fast is a decode step? The same prompt, 32 decoded tokens per engine, the median forward time of the steps (timings
# depend on the machine). This machine's L3 cache is large: the quantized SmolLM2 fits in it whole and the fp32 one does
# not, so the ratios may carry some of the cache's merit — on another machine they will differ.

# %%
# NBVAL_IGNORE_OUTPUT
import statistics

from minisgl.notebook import fmt_ms


def decode_step(llm: LLM) -> float:
    """生成 32 个 token，返回解码步前向时间的中位数（秒）；先预热一遍。

    en: Generate 32 tokens and return the median forward time of the decode steps (seconds), after one warm-up pass."""
    times: list[float] = []
    llm.generate([prompt], SamplingParams(max_tokens=4))
    remove = llm.add_step_listener(lambda t: times.append(t.forward[1] - t.forward[0]) if t.phase == "decode" else None)
    llm.generate([prompt], SamplingParams(max_tokens=32, ignore_eos=True))
    remove()
    return statistics.median(times)


steps = {name: decode_step(llm) for name, llm in llms.items()}
for name, t in steps.items():
    print(tr("{name:>9}: decode step {t}, {r:.1f}× fp32's speed", name=name, t=fmt_ms(t), r=steps["fp32"] / t))

# %% [markdown] tags=["lang-zh"]
# ## 6. 动手调：组的大小和离群值
#
# 一个 `[64, 1024]` 的随机矩阵，每一行第 100 列放一个离群值。改组的大小和离群值有多大，看 int4 和 int8 的平均误差。
# 先预测再运行：离群值从 1 倍调到 50 倍，int8（一行一个 scale）和 int4-32 哪个受的影响大？

# %% [markdown] tags=["lang-en"]
# ## 6. Try it: group size and outliers
#
# A random `[64, 1024]` matrix with an outlier in column 100 of every row. Change the group size and the outlier's size
# and see the mean errors of int4 and int8. Predict before running: with the outlier going from 1 to 50 times, which
# suffers more, int8 (one scale per row) or int4-32?

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def errors_by_hand(group: int, outlier: float) -> None:
    m = torch.randn(64, 1024, generator=torch.Generator().manual_seed(0)) * 0.05
    m[:, 100] *= outlier
    q, scale, offset = quantize_int4(m, group)
    e4 = float((dequantize_int4(q, scale, offset, group) - m).abs().mean())
    q8_, s8_ = quantize_int8(m)
    e8 = float((dequantize_int8(q8_, s8_) - m).abs().mean())
    print(tr("outlier ×{o:g}: int4 in groups of {g} mean |error| {e4:.2e} ({b:.4f} bytes per weight); int8 {e8:.2e}",
             o=outlier, g=group, e4=e4, b=0.5 + 8 / group, e8=e8))


explorer = Explorer(
    errors_by_hand,
    title=tr("int4 groups and outliers"),
    group=widgets.Dropdown(options=[32, 64, 128, 256, 512, 1024], value=64, description="group"),
    outlier=widgets.FloatSlider(value=20.0, min=1.0, max=50.0, step=1.0, description="outlier"),
)
explorer

# %%
# 用几组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with a few sets of values (this checks it without a browser)
explorer.run(group=32, outlier=1.0)
explorer.run(group=32, outlier=50.0)
explorer.run(group=1024, outlier=50.0)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 一组的最小值是 −0.3、最大值是 1.2。scale、偏移是多少？0.74 量化成几？
#
# <details><summary>答案</summary>
#
# scale = 1.5 / 15 = 0.1，偏移 = −0.3；(0.74 + 0.3) / 0.1 = 10.4，最近的整数是 10，还原成 10 · 0.1 − 0.3 = 0.7。
# </details>
#
# 2. `int4wo-128` 时内核每个权重读几个字节？为什么不是正好 0.5？
#
# <details><summary>答案</summary>
#
# 0.5 + 8 / 128 = 0.5625：4 位的值本身半个字节，每 128 个权重还要读一个 fp32 的 scale 和一个 fp32 的偏移。
# </details>
#
# 3. 打包时把相邻两列放一个字节，来回一遍照样不变。那为什么不行？
#
# <details><summary>答案</summary>
#
# 字节的排法是和 C 内核的约定：内核把 16 个字节与 15、右移 4 位，当成两段连续的 16 列去乘 `x`。相邻两列放一个字节时，
# 它拿到的是偶数列和奇数列，乘错了 `x` 的位置——只有检查逐个字节对照 Q4_0 的排法、或对照内核，才看得出来。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. A group has minimum −0.3 and maximum 1.2. What are the scale and the offset? What does 0.74 quantize to?
#
# <details><summary>Answer</summary>
#
# scale = 1.5 / 15 = 0.1, offset = −0.3; (0.74 + 0.3) / 0.1 = 10.4, whose nearest integer is 10, restored as
# 10 · 0.1 − 0.3 = 0.7.
# </details>
#
# 2. With `int4wo-128`, how many bytes per weight does the kernel read? Why not exactly 0.5?
#
# <details><summary>Answer</summary>
#
# 0.5 + 8 / 128 = 0.5625: the 4-bit value itself is half a byte, and every 128 weights also read an fp32 scale and an
# fp32 offset.
# </details>
#
# 3. Packing two adjacent columns into a byte survives the round trip all the same. Why is it wrong?
#
# <details><summary>Answer</summary>
#
# The byte layout is a contract with the C kernel: the kernel ANDs 16 bytes with 15 and shifts them right by 4, taking
# them as two runs of 16 consecutive columns to multiply with `x`. With adjacent columns in a byte it gets the even and
# the odd columns and multiplies them with the wrong parts of `x` — only a check comparing bytes with Q4_0's layout, or
# with the kernel, can tell.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage5/quantization.py` 里的任务后运行下面这一格（`python -m minisgl.course check quantization`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage5/quantization.py`, run the cell below (`python -m minisgl.course check quantization`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("quantization")
