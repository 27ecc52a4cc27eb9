# %% [markdown] tags=["lang-zh"]
# # 第 4.4 章 moe：混合专家——路由、参考实现与分组实现
#
# 混合专家（MoE）层把一个 MLP 换成 `E` 个小 MLP（专家）和一个路由器：
#
# - **路由器**给每个 token 打 `E` 个分，在 fp32 里对专家那一维做 softmax，取最大的 `k` 个；`norm_topk_prob` 时把
#   这 `k` 个权重再归一化成和为 1；
# - token 只经过选中的 `k` 个专家，输出按路由权重加起来；
# - **参考实现**一个专家一个专家地找出选了它的 token；**分组实现**先把 `T × k` 个 `(token, 选择)` 对按专家排好序，
#   每个专家一段、一次矩阵乘法，再用 `index_add_` 按 token 加回去；
# - 哪些层有专家由配置决定：`mlp_only_layers` 里的层和不在 `decoder_sparse_step` 节拍上的层保留稠密 MLP。
#
# 存的参数很多，每个 token 用到的很少：Qwen3-30B-A3B 每层 128 个专家、每个 token 选 8 个。本笔记本用 tiny 的随机
# Qwen3-MoE（3 层，第 0 层稠密，第 1、2 层各 8 个专家、选 2 个）把每一步摆出来。

# %% [markdown] tags=["lang-en"]
# # Chapter 4.4 moe: mixture of experts — routing, the reference and the grouped path
#
# A mixture-of-experts (MoE) layer replaces one MLP with `E` small MLPs (experts) and a router:
#
# - the **router** scores each token against the `E` experts, takes a softmax over the experts' axis in fp32 and keeps
#   the `k` largest; with `norm_topk_prob` those `k` weights are renormalised to add up to 1;
# - the token goes through its `k` chosen experts only, and their outputs are added up with the routing weights;
# - the **reference** finds each expert's tokens one expert at a time; the **grouped path** first sorts the `T × k`
#   pairs `(token, choice)` by expert, one stretch and one matrix multiplication per expert, then adds back per token
#   with `index_add_`;
# - which layers have experts is the config's call: layers in `mlp_only_layers` and layers off the
#   `decoder_sparse_step` beat keep a dense MLP.
#
# Many parameters stored, few used per token: Qwen3-30B-A3B has 128 experts per layer and picks 8 per token. This
# notebook lays out every step on a tiny random Qwen3-MoE (3 layers, layer 0 dense, 8 experts in layers 1 and 2, 2
# chosen).

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
# 本章的任务（和 stage4/moe.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage4/moe.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("moe")

# %% [markdown] tags=["lang-zh"]
# ## 1. 配置：哪些层有专家
#
# `MoeConfig` 是第 1.3 章的 `ModelConfig` 加上专家的字段。`is_sparse(i)` 用 Hugging Face 的规则：不在
# `mlp_only_layers` 里、有专家、`(i + 1) % decoder_sparse_step == 0`。tiny 模型的第 0 层列在 `mlp_only_layers` 里：

# %% [markdown] tags=["lang-en"]
# ## 1. The config: which layers have experts
#
# `MoeConfig` is chapter 1.3's `ModelConfig` plus the experts' fields. `is_sparse(i)` follows Hugging Face's rule: not in
# `mlp_only_layers`, some experts, and `(i + 1) % decoder_sparse_step == 0`. The tiny model lists layer 0 in
# `mlp_only_layers`:

# %%
import dataclasses

from minisgl.model_zoo import tiny_qwen3_moe
from minisgl.moe import MoeConfig

MODEL = str(tiny_qwen3_moe())
c = MoeConfig.from_hf(MODEL)
print(tr("{arch}: {n} layers, hidden size {h}", arch=c.architecture, n=c.num_layers, h=c.hidden_size))
print(tr("experts per MoE layer: {e}, chosen per token: {k}, renormalise: {norm}", e=c.num_experts,
         k=c.num_experts_per_tok, norm=c.norm_topk_prob))
print(tr("intermediate size: dense layers {dense}, each expert {expert}", dense=c.intermediate_size,
         expert=c.moe_intermediate_size))
print(tr("mlp_only_layers={only}, decoder_sparse_step={step}", only=list(c.mlp_only_layers), step=c.decoder_sparse_step))
for i in range(c.num_layers):
    print(tr("layer {i}: {kind}", i=i, kind=tr("experts") if c.is_sparse(i) else tr("dense MLP")))

# %% [markdown] tags=["lang-zh"]
# 同一条规则在别的配置下（6 层）：`decoder_sparse_step = 2` 时每两层一个 MoE 层，从第 1 层数起；
# `mlp_only_layers` 再把列出的层换回稠密：

# %% [markdown] tags=["lang-en"]
# The same rule under other configs (6 layers): with `decoder_sparse_step = 2` every second layer is MoE, counting from
# layer 1; `mlp_only_layers` then turns the listed layers back into dense ones:

# %%
for step, only in ((1, ()), (2, ()), (2, (3,)), (3, (2,))):
    other = dataclasses.replace(c, num_layers=6, decoder_sparse_step=step, mlp_only_layers=only)
    kinds = " ".join("E" if other.is_sparse(i) else "d" for i in range(6))
    print(tr("step={step}, mlp_only_layers={only}: {kinds}", step=step, only=list(only), kinds=kinds))
print(tr("(E: experts, d: dense MLP; layers 0 to 5)"))

# %% [markdown] tags=["lang-zh"]
# ## 2. 路由：softmax、top-k、再归一化
#
# 用 `LLM` 装上 tiny 模型（`minisgl/architectures.py` 看到 `Qwen3MoeForCausalLM`，交给本章搭模型），取第 1 层的路由器，
# 给 4 个随机的隐藏状态选专家。先看完整的概率：每一行是一个 token 在 8 个专家上的分布，加起来是 1：

# %% [markdown] tags=["lang-en"]
# ## 2. Routing: softmax, top-k, renormalisation
#
# Load the tiny model with `LLM` (`minisgl/architectures.py` sees `Qwen3MoeForCausalLM` and has this chapter build the
# model), take layer 1's router, and let it pick experts for 4 random hidden states. First the full probabilities: each
# row is one token's distribution over the 8 experts, adding up to 1:

# %%
import torch

from minisgl.llm import LLM
from minisgl.moe import SparseMoeBlock, select_experts

llm = LLM(MODEL, dtype=torch.float32, device="cpu", max_running_req=2, num_page_override=256, max_seq_len_override=64)
layers = llm.engine.model.model.layers
print(tr("the engine's MLP per layer: {kinds}", kinds=[type(layer.mlp).__name__ for layer in layers]))
block = layers[1].mlp
assert isinstance(block, SparseMoeBlock)
x = torch.randn(4, c.hidden_size, generator=torch.Generator().manual_seed(0))
logits = block.gate.forward(x)  # [T, E]
probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
print(tr("router logits: shape {shape}", shape=list(logits.shape)))
for t in range(4):
    print(tr("  token {t}: probabilities {p} (sum {s:.3f})", t=t, p=[round(v, 2) for v in probs[t].tolist()],
             s=float(probs[t].sum())))

# %% [markdown] tags=["lang-zh"]
# 取最大的 2 个：专家号按权重从大到小排。不归一化时两个权重加起来小于 1，而且每个 token 不一样；归一化以后每个 token
# 都是 1——也正好等于只对选中的那 2 个 logits 做 softmax：

# %% [markdown] tags=["lang-en"]
# Keep the 2 largest: the ids come in order of weight. Without renormalisation the two weights add up to less than 1, and
# differently for each token; renormalised, they add up to 1 for every token — which is exactly a softmax over the 2
# chosen logits alone:

# %%
plain_w, ids = select_experts(logits, c.num_experts_per_tok, renormalize=False)
norm_w, same_ids = select_experts(logits, c.num_experts_per_tok, renormalize=True)
for t in range(4):
    print(tr("  token {t}: experts {ids}, weights {plain} (sum {sp:.3f}) -> renormalised {norm}", t=t, ids=ids[t].tolist(),
             plain=[round(v, 3) for v in plain_w[t].tolist()], sp=float(plain_w[t].sum()),
             norm=[round(v, 3) for v in norm_w[t].tolist()]))
print(tr("the same experts either way: {same}", same=torch.equal(ids, same_ids)))
print(tr("weights: {dtype}, ids: {idtype}", dtype=norm_w.dtype, idtype=ids.dtype))
print(tr("renormalised weights == softmax over the chosen logits only: {same}",
         same=torch.allclose(norm_w, torch.softmax(logits.gather(1, ids), dim=-1))))

# %% [markdown] tags=["lang-zh"]
# ## 3. 按专家排好序
#
# 分组实现要让每个专家的 (token, 选择) 对挨成连续一段。先看看拉平以后的 `T·k` 个专家号是什么样子、每个专家几对
# （`bincount`，也就是 `fused_experts` 收到的 `counts`）。排好序以后，你要能回答：排在第 p 个的那一对，属于哪个
# token？它的路由权重在哪儿？

# %% [markdown] tags=["lang-en"]
# ## 3. Sorted by expert
#
# The grouped path wants each expert's (token, choice) pairs next to each other, one stretch per expert. First look at
# the `T·k` expert ids once flattened, and how many pairs each expert gets (`bincount`, which is the `counts` that
# `fused_experts` receives). Once they are sorted you must be able to answer: the pair at sorted position p, which token
# is it from, and where is its routing weight?

# %%
x = torch.randn(6, c.hidden_size, generator=torch.Generator().manual_seed(1))
weights, ids = select_experts(block.gate.forward(x), c.num_experts_per_tok, c.norm_topk_prob)
flat = ids.reshape(-1)
counts = torch.bincount(flat, minlength=c.num_experts).tolist()
print(tr("expert ids, [T, k] = {shape}: {ids}", shape=list(ids.shape), ids=ids.tolist()))
print(tr("expert ids, flattened: {flat}", flat=flat.tolist()))
print(tr("counts per expert: {counts} (sum {total} = {t} tokens x {k})", counts=counts, total=sum(counts), t=6,
         k=ids.shape[1]))

# %% [markdown] tags=["lang-zh"]
# ## 4. 参考实现与分组实现
#
# 两种算法对同样的输入应得到同样的结果。这里用第 1 层真实的专家权重（`w13 [E, 2I, H]`、`w2 [E, H, I]`）和 64 个随机
# 的隐藏状态。最后一步有个常见的坑：一个 token 的 k 行要加回它那一行，按下标赋值 `out[token] = rows` 在下标重复时只留下
# 其中一行（留下哪一行都不对）——下面用三行数字看清楚：

# %% [markdown] tags=["lang-en"]
# ## 4. The reference and the grouped path
#
# Both algorithms should give the same result for the same input. Here with layer 1's real expert weights
# (`w13 [E, 2I, H]`, `w2 [E, H, I]`) and 64 random hidden states. The last step has a common trap: a token's k rows must
# add up into its one row, and an indexed assignment `out[token] = rows` with repeated indices keeps only one of them
# (whichever it is, it is wrong) — three rows of numbers make it plain:

# %%
from minisgl.moe import experts_reference, fused_experts

w13, w2 = block.experts.w13, block.experts.w2
print(tr("w13: {a}, w2: {b}", a=list(w13.shape), b=list(w2.shape)))
x = torch.randn(64, c.hidden_size, generator=torch.Generator().manual_seed(2))
weights, ids = select_experts(block.gate.forward(x), c.num_experts_per_tok, c.norm_topk_prob)
counts = torch.bincount(ids.reshape(-1), minlength=c.num_experts).tolist()
ref = experts_reference(x, w13, w2, weights, ids)
grouped = fused_experts(x, w13, w2, weights, ids, counts)
print(tr("64 tokens, rows per expert {counts}", counts=counts))
print(tr("reference vs grouped: largest difference {diff:.1e}", diff=float((ref - grouped).abs().max())))

# 同一个下标出现两次：赋值只留下一行，按下标累加才把两行都加进去
# en: the same index twice: assignment keeps one row, an indexed add puts both in
rows = torch.tensor([[1.0, 1.0], [10.0, 10.0], [100.0, 100.0]])
to = torch.tensor([0, 0, 1])  # 前两行属于 token 0 | en: the first two rows belong to token 0
assigned = torch.zeros(2, 2)
assigned[to] = rows
print(tr("out[token] = rows: {out}", out=assigned.tolist()))
print(tr("zeros.index_add_(0, token, rows): {out}", out=torch.zeros(2, 2).index_add_(0, to, rows).tolist()))

# %% [markdown] tags=["lang-zh"]
# ## 5. 整个 tiny MoE 模型：贪心生成，与 Hugging Face 比
#
# 引擎一行没改：`LLM` 照常调度、照常解码（不录 CUDA 图、不走融合的 C 解码，`decode_path` 说出原因）。Hugging Face
# 用它自己的 `Qwen3MoeForCausalLM` 生成同样多的 token：

# %% [markdown] tags=["lang-en"]
# ## 5. The whole tiny MoE model: greedy generation against Hugging Face
#
# The engine has not changed by a line: `LLM` schedules and decodes as always (no CUDA graph and no fused C decode,
# and `decode_path` says why). Hugging Face generates as many tokens with its own `Qwen3MoeForCausalLM`:

# %%
from minisgl.core import SamplingParams

sys.path.insert(0, str(ROOT / "examples"))
from chapters.moe import NEW_TOKENS, PROMPTS, hf_greedy  # 本章的示例 | en: noqa: E402 - the chapter's example

print(llm.engine.decode_path)
for layer in layers:
    if isinstance(layer.mlp, SparseMoeBlock):
        layer.mlp.experts.tokens_per_expert = [0] * c.num_experts
outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True))
ours = [o["token_ids"] for o in outs]
theirs = hf_greedy(PROMPTS)
for i, (a, b) in enumerate(zip(ours, theirs)):
    print(tr("prompt {i}: ours {a}", i=i, a=a))
    print(tr("prompt {i}: HF   {b} (the same: {same})", i=i, b=b, same=a == b))

# %% [markdown] tags=["lang-zh"]
# 生成时每个专家收到了几个 `(token, 选择)` 对：算过的 token 是两个提示词的 10 个，加上每个请求除最后一个以外的输出，
# 每个选 2 个专家。收到的并不平均，有的专家一个也没有——这个模型的权重是随机的，真实的模型也会有忙有闲：

# %% [markdown] tags=["lang-en"]
# How many `(token, choice)` pairs each expert received while generating: the tokens computed are the two prompts' 10
# plus each request's outputs but the last, each choosing 2 experts. The load is not even, and some expert may get none
# at all — this model's weights are random, but real models have busy and idle experts too:

# %%
import matplotlib.pyplot as plt

computed = sum(map(len, PROMPTS)) + len(PROMPTS) * (NEW_TOKENS - 1)
sparse_layers = [i for i in range(c.num_layers) if c.is_sparse(i)]
fig, axes = plt.subplots(1, len(sparse_layers), figsize=(10, 2.8), sharey=True)
for ax, i in zip(axes, sparse_layers):
    seen = layers[i].mlp.experts.tokens_per_expert
    print(tr("layer {i}: {seen}, sum {total} = {computed} tokens x {k}", i=i, seen=seen, total=sum(seen),
             computed=computed, k=c.num_experts_per_tok))
    ax.bar(range(c.num_experts), seen, color="#6fa8dc")
    ax.axhline(sum(seen) / c.num_experts, color="#cc4125", linestyle="--", label=tr("average"))
    ax.set_xticks(range(c.num_experts))
    ax.set_xlabel(tr("expert"))
    ax.set_title(tr("layer {i}", i=i))
axes[0].set_ylabel(tr("(token, choice) pairs"))
axes[0].legend()
fig.suptitle(tr("Tokens per expert while generating"))
plt.tight_layout()
plt.show()
llm.shutdown()  # 下面照样能用路由器和专家的权重 | en: the router and the experts' weights stay usable below

# %% [markdown] tags=["lang-zh"]
# ## 6. 存了多少，一个 token 用到多少
#
# 一个专家是 `3 × H × I` 个参数（gate、up、down）。tiny 模型存了 2 层 × 8 个专家，一个 token 每层只用 2 个。
# 同样的算术放到 Qwen3-30B-A3B 的形状上（48 层、隐藏维 2048、每层 128 个专家、专家中间维 768、选 8 个）：

# %% [markdown] tags=["lang-en"]
# ## 6. How much is stored, how much one token uses
#
# An expert is `3 × H × I` parameters (gate, up, down). The tiny model stores 8 experts in each of 2 layers, and a token
# uses only 2 per layer. The same arithmetic on Qwen3-30B-A3B's shapes (48 layers, hidden size 2048, 128 experts per
# layer, expert intermediate size 768, 8 chosen):

# %%
def expert_params(layers: int, hidden: int, inter: int, experts: int, top_k: int) -> tuple[int, int]:
    per_expert = 3 * hidden * inter
    return layers * experts * per_expert, layers * top_k * per_expert


SHAPES = {
    "tiny": (len(sparse_layers), c.hidden_size, c.moe_intermediate_size, c.num_experts, c.num_experts_per_tok),
    "Qwen3-30B-A3B": (48, 2048, 768, 128, 8),
}
for name, shape in SHAPES.items():
    stored, used = expert_params(*shape)
    print(tr("{name}: expert parameters stored {stored:,}, used per token {used:,} ({frac:.1%})", name=name,
             stored=stored, used=used, frac=used / stored))

# %% [markdown] tags=["lang-zh"]
# ## 7. 动手调：路由器选几个、归一不归一
#
# 用第 1 层的路由器给 `T` 个随机的隐藏状态选专家：`k` 变大，每个专家收到的对就多；不归一化时，每个 token 的权重之和
# 随 `k` 变化（`k = 8` 时是 1：所有专家都选上，就是整个 softmax）。试试 `k = 1` 和 `k = 8`。

# %% [markdown] tags=["lang-en"]
# ## 7. Try it: how many experts the router picks, renormalised or not
#
# Layer 1's router picks experts for `T` random hidden states: a larger `k` gives each expert more pairs; without
# renormalisation, each token's weight sum changes with `k` (it is 1 at `k = 8`: every expert chosen is the whole
# softmax). Try `k = 1` and `k = 8`.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

def show_routing(tokens: int, top_k: int, renormalize: bool) -> None:
    x = torch.randn(tokens, c.hidden_size, generator=torch.Generator().manual_seed(3))
    weights, ids = select_experts(block.gate.forward(x), top_k, renormalize)
    counts = torch.bincount(ids.reshape(-1), minlength=c.num_experts).tolist()
    sums = weights.sum(-1)
    print(tr("{tokens} tokens, top-{k}: pairs per expert {counts} (sum {total})", tokens=tokens, k=top_k, counts=counts,
             total=sum(counts)))
    print(tr("weight sum per token: min {lo:.3f}, max {hi:.3f}", lo=float(sums.min()), hi=float(sums.max())))
    print(tr("busiest expert / average: {ratio:.2f}", ratio=max(counts) / (sum(counts) / c.num_experts)))
    fig, ax = plt.subplots(figsize=(6, 2.4))
    ax.bar(range(c.num_experts), counts, color="#6fa8dc")
    ax.set_xlabel(tr("expert"))
    ax.set_ylabel(tr("(token, choice) pairs"))
    ax.set_title(tr("Routing of {tokens} tokens, top-{k}", tokens=tokens, k=top_k))


explorer = Explorer(
    show_routing,
    title=tr("Routing: how many experts per token"),
    tokens=widgets.IntSlider(value=32, min=1, max=256, description="T"),
    top_k=widgets.IntSlider(value=2, min=1, max=c.num_experts, description="top_k"),
    renormalize=widgets.Checkbox(value=True, description="renormalize"),
)
explorer

# %%
# 用几组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with a few sets of values (this checks it without a browser)
explorer.run(tokens=64, top_k=1, renormalize=False)

# %%
explorer.run(tokens=64, top_k=8, renormalize=False)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 一个 token 的 top-2 概率是 0.3 和 0.1。再归一化以后权重是多少？
#
# <details><summary>答案</summary>
#
# 0.75 和 0.25：各除以和 0.4。这也等于只对这两个专家的 logits 做 softmax。
# </details>
#
# 2. 分组实现里，`T = 6`、`k = 2`，排好序的第 0 对的拉平下标是 7。它属于哪个 token、是这个 token 的第几个选择？
#
# <details><summary>答案</summary>
#
# `7 // 2 = 3`，token 3；`7 % 2 = 1`，它的第二个选择（从 0 数是 1）。
# </details>
#
# 3. 为什么 MoE 模型不能录成 CUDA 图？
#
# <details><summary>答案</summary>
#
# 每个专家分到几行取决于每一步的路由，形状每步都变；`counts` 还要拷回主机，Python 才知道每段从哪里切。CUDA 图只能
# 原样重放录下的形状和地址。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. A token's top-2 probabilities are 0.3 and 0.1. What are its weights after renormalising?
#
# <details><summary>Answer</summary>
#
# 0.75 and 0.25: each divided by their sum, 0.4. This is also a softmax over those two experts' logits alone.
# </details>
#
# 2. In the grouped path with `T = 6` and `k = 2`, the first sorted pair has flat index 7. Which token is it, and which of
#    that token's choices?
#
# <details><summary>Answer</summary>
#
# `7 // 2 = 3`, token 3; `7 % 2 = 1`, its second choice (1 counting from 0).
# </details>
#
# 3. Why can an MoE model not be captured as a CUDA graph?
#
# <details><summary>Answer</summary>
#
# How many rows each expert gets depends on each step's routing, so the shapes change at every step; and `counts` has to
# come back to the host before Python knows where to cut the stretches. A CUDA graph can only replay the shapes and
# addresses it recorded.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage4/moe.py` 里的任务后运行下面这一格（`python -m minisgl.course check moe`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage4/moe.py`, run the cell below (`python -m minisgl.course check moe`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("moe")
