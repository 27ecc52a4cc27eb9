# %% [markdown] tags=["lang-zh"]
# # 第 4.2 章 tensor_parallel：切开的层与模型
#
# 解码层里的矩阵乘法成对出现：先放大（q/k/v、gate/up），再缩回（o_proj、down）。Megatron 的切法让每一对只通信一次：
#
# - **按列切**：q/k/v 和 gate/up 的**输出**切开，每个秩算它那几个头、那一段中间维，不通信；合并层的每一段各切各的；
# - **按行切**：o_proj 和 down 的**输入**切开，正好接住上一步；各秩的部分和用一次 `all_reduce` 加起来，偏置在求和之后只加一次；
# - **词表切开**：嵌入里不归本秩管的 id 查出 0，再 `all_reduce`；LM head 按秩号 `all_gather`，拼回整个词表；
# - **KV 头比秩少**时只能复制：几个秩存同一个完整的 KV 头。
#
# 所以每层两次 `all_reduce`，整个前向再加嵌入一次、LM head 一次 `all_gather`。切不开的在加载之前就拒绝。

# %% [markdown] tags=["lang-en"]
# # Chapter 4.2 tensor_parallel: split layers and a split model
#
# The matrix multiplications of a decoder layer come in pairs: first widen (q/k/v, gate/up), then narrow back (o_proj,
# down). Megatron's cut makes each pair communicate only once:
#
# - **column-parallel**: the **output** of q/k/v and gate/up is cut, each rank computes its heads, its stretch of the
#   intermediate dimension, with no communication; each part of a merged layer is cut on its own;
# - **row-parallel**: the **input** of o_proj and down is cut, matching exactly the step before; one `all_reduce` adds up
#   the ranks' partial sums, and the bias is added once, after the sum;
# - **the vocabulary cut**: in the embedding, ids a rank does not own look up 0, then `all_reduce`; the LM head's
#   `all_gather` in rank order joins the whole vocabulary again;
# - **fewer KV heads than ranks**: they can only be copied, a few ranks store the same whole KV head.
#
# So each layer makes two `all_reduce`, and the whole forward one more for the embedding and one `all_gather` for the LM
# head. What cannot be split is refused before loading.

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
# 本章的任务（和 stage4/tensor_parallel.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage4/tensor_parallel.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("tensor_parallel")

# %% [markdown] tags=["lang-zh"]
# ## 1. 切得开吗
#
# query 头数、中间维、词表都要能被 `tp` 整除；KV 头数要么能被 `tp` 整除（切开），要么整除 `tp`（复制）。
# `split_problems` 每条不满足的写一句，`check_tp_split` 在加载任何权重之前就拒绝，并说出哪些 `tp` 行得通。
# 这一步只看配置，不用起秩：

# %% [markdown] tags=["lang-en"]
# ## 1. Can it be split
#
# The query heads, the intermediate size and the vocabulary must each be divisible by `tp`; the KV heads must either be
# divisible by `tp` (cut) or divide it (copied). `split_problems` writes one sentence for each condition that fails, and
# `check_tp_split` refuses before any weight is loaded, naming the `tp` values that work. This step only reads the
# configuration, no ranks needed:

# %%
from minisgl.model_zoo import smollm2, tiny_qwen3
from minisgl.models import ModelConfig
from minisgl.tensor_parallel import check_tp_split, split_problems

CONFIGS = {"qwen3-tiny": ModelConfig.from_hf(tiny_qwen3()), "SmolLM2": ModelConfig.from_hf(smollm2())}
for name, c in CONFIGS.items():
    print(tr("{name}: {heads} query heads, {kv} KV heads, intermediate size {inter}, vocabulary {vocab}", name=name,
             heads=c.num_qo_heads, kv=c.num_kv_heads, inter=c.intermediate_size, vocab=c.vocab_size))
    for tp in (1, 2, 3, 4, 9):
        problems = split_problems(c, tp)
        print(f"  tp={tp}: " + ("; ".join(problems) if problems else tr("splits")))

try:
    check_tp_split(CONFIGS["SmolLM2"], 2)
except ValueError as err:
    print(tr("SmolLM2 at tp=2, before any weight is loaded: ValueError:"), err)

# %% [markdown] tags=["lang-zh"]
# ## 2. 按行切：部分和相加，偏置只加一次
#
# 这一步不用起秩，在本进程里用几行 torch 把两个秩的计算摆出来。按输入切，`x Wᵀ`（不带偏置）正好是各秩部分和的和；
# 偏置要是每个秩都加，求和以后就多了 `(tp − 1)` 份。偏置该在哪里加，是 `row_forward` 要你定的：

# %% [markdown] tags=["lang-en"]
# ## 2. Row-parallel: partial sums add up, the bias is added once
#
# No ranks for this step either: a few lines of torch in this process lay out what two ranks compute. Split by input,
# `x Wᵀ` (without the bias) is exactly the sum of the ranks' partial sums; if every rank added the bias, the sum would
# hold `(tp − 1)` extra copies of it. Where the bias does go is for `row_forward` to decide:

# %%
import torch
import torch.nn.functional as F

x, W, b = torch.randn(3, 8), torch.randn(6, 8), torch.randn(6)  # 随便什么数都行 | en: any numbers will do
whole = F.linear(x, W, b)
tp = 2
n = x.shape[1] // tp
# 秩 r 手里是 x 和 W 的第 r 段列
# en: rank r holds columns r*n:(r+1)*n of x (the previous step's output) and of W
partials = [F.linear(x[:, r * n:(r + 1) * n], W[:, r * n:(r + 1) * n]) for r in range(tp)]
every = sum(p + b for p in partials)  # 每个秩在 all_reduce 之前都加了偏置 | en: every rank adds the bias before all_reduce
print(tr("each rank's partial sum has shape {shape}; {tp} of them", shape=list(partials[0].shape), tp=tp))
print(tr("sum of partials equals x Wᵀ without the bias: {same}", same=torch.allclose(sum(partials), x @ W.T, atol=1e-6)))
print(tr("bias added on every rank equals the unsplit layer: {same}", same=torch.allclose(every, whole, atol=1e-6)))
print(tr("bias added on every rank equals the unsplit layer + (tp - 1) x bias: {same}",
         same=torch.allclose(every, whole + (tp - 1) * b, atol=1e-6)))

# %% [markdown] tags=["lang-zh"]
# 按列切的一半也能这样看：合并的 gate_up 要**每一段各切各的**。把合并后的 `[gate; up]` 当成一整块切成两半，
# 秩 0 拿到的全是 gate，SwiGLU 的 `silu(gate) * up` 就配错了——形状全对，数全错：

# %% [markdown] tags=["lang-en"]
# The column-parallel half can be seen the same way: the merged gate_up must be cut **part by part**. Cut the merged
# `[gate; up]` in half as one block and rank 0 gets nothing but gate, so SwiGLU's `silu(gate) * up` pairs the wrong
# numbers — every shape right, every number wrong:

# %%
inter = 4
gate_w, up_w = torch.randn(inter, 8), torch.randn(inter, 8)
merged = torch.cat([gate_w, up_w])  # 合并的 gate_up 权重 | en: the merged gate_up weight [2 * inter, 8]


def swiglu(w: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    return F.silu(gate) * up


want = swiglu(merged)  # 没切的那层 | en: the unsplit layer: [3, inter]
half = inter // tp
for r in range(tp):
    part_by_part = torch.cat([gate_w[r * half:(r + 1) * half], up_w[r * half:(r + 1) * half]])
    one_block = merged[r * inter:(r + 1) * inter]
    print(tr("rank {rank}: cut part by part equals its stretch of the unsplit output: {good}; cut as one block: {bad}",
             rank=r, good=torch.allclose(swiglu(part_by_part), want[:, r * half:(r + 1) * half]),
             bad=torch.allclose(swiglu(one_block), want[:, r * half:(r + 1) * half])))

# %% [markdown] tags=["lang-zh"]
# ## 3. 词表切开的嵌入：问题在哪
#
# 词表 10 个词、两个秩：秩 0 只存 0–4 行，秩 1 只存 5–9 行。每个 id 只归一个秩管，可每个秩拿到的是**全部** id。
# 先看一个秩要是把 `id - start` 直接拿去查自己那张小表，会查到什么下标；再看 `all_reduce`（逐位置相加）之后要得到整张表
# 的那一行，每个秩在每个位置**该交出**什么——下面用整张表算出这个目标（秩手里并没有整张表，怎么做到是
# `vocab_embedding_forward` 的事）：

# %% [markdown] tags=["lang-en"]
# ## 3. The vocabulary-split embedding: where the problem is
#
# A vocabulary of 10 words over two ranks: rank 0 stores rows 0–4 only, rank 1 rows 5–9. Each id belongs to one rank,
# yet every rank receives **all** the ids. First see which indices a rank would look up in its small table if it used
# `id - start` as it is; then what each rank **must hand over** at each position so that the `all_reduce` (a sum
# position by position) gives the whole table's row — the target is computed below from the whole table (no rank has
# the whole table; how to get there is `vocab_embedding_forward`'s job):

# %%
table = torch.arange(10.0).unsqueeze(-1) * torch.tensor([1.0, 0.1])  # 第 i 行是 [i, i / 10] | en: row i = [i, i / 10]
ids = torch.tensor([0, 4, 5, 9, 7, 2])
local_n = 10 // tp
print(tr("ids: {ids}", ids=ids.tolist()))
for r in range(tp):
    start = r * local_n
    owned = [start <= i < start + local_n for i in ids.tolist()]
    # 目标：归本秩的位置是那一行，其余位置全是 0（用整张表算，只为看清要交出什么）
    # en: the target: the row at the positions this rank owns, zeros elsewhere (computed from the whole table, only to see it)
    target = [table[i].tolist() if mine else [0.0, 0.0] for i, mine in zip(ids.tolist(), owned)]
    print(tr("rank {rank} (rows {first}-{last}): id - start = {local}; valid indices are 0..{top}", rank=r, first=start,
             last=start + local_n - 1, local=(ids - start).tolist(), top=local_n - 1))
    print(tr("  must hand over, first column: {values}", values=[row[0] for row in target]))
# %% [markdown] tags=["lang-zh"]
# ## 4. qwen3-tiny 切给两个秩
#
# 现在真的起两个秩。spawn 出的秩要按**名字**导入它跑的函数，所以它写在示例 `examples/chapters/tensor_parallel.py`
# 的模块顶层，这里导入它：每个秩加入进程组，建 `TPEngine`（它只覆盖 `Engine.build_model`，换上切开的模型），
# 两个提示词一起贪心生成，交回第 0 层各个权重的形状、记下的集合通信次数和生成的 token。

# %% [markdown] tags=["lang-en"]
# ## 4. qwen3-tiny over two ranks
#
# Now two real ranks. A spawned rank imports the function it runs **by name**, so that function sits at the top level of
# the example `examples/chapters/tensor_parallel.py`, and we import it from there: each rank joins the process group,
# builds a `TPEngine` (which overrides only `Engine.build_model`, putting in the split model), generates greedily for two
# prompts at once, and hands back the shapes of layer 0's weights, the collectives it counted and the tokens.

# %%
from minisgl.notebook import show_source
from minisgl.processes.ranks import run_ranks

sys.path.insert(0, str(ROOT / "examples"))  # spawn 出的秩继承这条路径 | en: the spawned ranks inherit this path
from chapters.tensor_parallel import MODEL, PROMPTS, demo_rank  # noqa: E402

show_source(demo_rank)

# %% [markdown] tags=["lang-zh"]
# 同一个函数先在 1 个秩上跑（整个模型在一个进程里，什么都不通信），再在 2 个秩上跑。每个秩上 q/k/v、gate/up
# 的行数、o_proj 和 down 的输入宽、词表都只有一半；隐藏维 64 不切：

# %% [markdown] tags=["lang-en"]
# The same function runs on 1 rank first (the whole model in one process, nothing communicated), then on 2. On each rank
# the rows of q/k/v and gate/up, the input width of o_proj and down, and the vocabulary are all halved; the hidden size
# of 64 is not cut:

# %%
one = run_ranks(demo_rank, 1, MODEL)
two = run_ranks(demo_rank, 2, MODEL)
print(tr("layer 0's weights, the embedding and the LM head: TP=1 -> TP=2 rank 0, rank 1"))
for name, shape in one[0]["shapes"].items():
    print(f"  {name:<13} {str(shape):<13} -> " + ", ".join(str(seen["shapes"][name]) for seen in two))

# %% [markdown] tags=["lang-zh"]
# 每一步前向：每层两次 `all_reduce`（o_proj、down），嵌入一次，LM head 一次 `all_gather`。qwen3-tiny 两层，
# 一次预填充加几次解码，每步都是 5 次和 1 次。两个秩生成的 token 一样，也和一个秩的一样：

# %% [markdown] tags=["lang-en"]
# Every forward step: two `all_reduce` per layer (o_proj, down), one for the embedding, one `all_gather` for the LM head.
# qwen3-tiny has two layers, so each step — one prefill, then a few decodes — makes 5 and 1. The two ranks generate the
# same tokens, and the same as one rank:

# %%
steps = len(two[0]["tokens"][0])  # 一次预填充 + 新 token 数 - 1 次解码 | en: one prefill + (new tokens - 1) decodes
layers = CONFIGS["qwen3-tiny"].num_layers
print(tr("TP=1 collectives: {calls}", calls=one[0]["calls"]))
for rank, seen in enumerate(two):
    print(tr("TP=2, rank {rank}: {calls}; expected {reduce} all_reduce and {gather} all_gather", rank=rank,
             calls=seen["calls"], reduce=steps * (2 * layers + 1), gather=steps))
print(tr("{n} prompts, {steps} new tokens each", n=len(PROMPTS), steps=steps))
print(tr("both TP=2 ranks generate the same tokens: {same}", same=two[0]["tokens"] == two[1]["tokens"]))
print(tr("TP=2 generates the same tokens as TP=1: {same}", same=two[0]["tokens"] == one[0]["tokens"]))

# %%
# NBVAL_IGNORE_OUTPUT
# 每个秩存了多少：大约一半（RMSNorm 的权重每个秩都存整份）
# en: How much each rank stores: about half (the norms are whole on every rank)
print(tr("stored: TP=1 {one} MiB, each TP=2 rank {two} MiB", one=one[0]["stored_mb"], two=[s["stored_mb"] for s in two]))

# %% [markdown] tags=["lang-zh"]
# ## 5. 动手调：哪个模型、几个秩
#
# 选一个模型和 `tp`，看它切不切得开；切得开时，看每个秩拿几个 q 头、用哪几个 KV 头（复制的时候几个秩共用一个）、
# 中间维和词表的哪一段。这一步只算形状，不起秩。试试 qwen3-tiny 的 `tp=4`（KV 头复制）和 SmolLM2 的 `tp=3`。

# %% [markdown] tags=["lang-en"]
# ## 5. Try it: which model, how many ranks
#
# Pick a model and `tp`, and see whether it splits; when it does, see how many q heads each rank takes, which KV heads it
# uses (several ranks share one when they are copied), and which stretch of the intermediate dimension and of the
# vocabulary it owns. This only works out shapes, no ranks are started. Try qwen3-tiny at `tp=4` (KV heads copied) and
# SmolLM2 at `tp=3`.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def show_split(model: str, tp: int) -> None:
    c = CONFIGS[model]
    problems = split_problems(c, tp)
    if problems:
        print(tr("{model} does not split over {tp} ranks:", model=model, tp=tp))
        for problem in problems:
            print("  -", problem)
        return
    heads, inter, vocab = c.num_qo_heads // tp, c.intermediate_size // tp, c.vocab_size // tp
    if c.num_kv_heads < tp:
        kv = tr("1 whole KV head, each one stored on {n} ranks (copied)", n=tp // c.num_kv_heads)
    else:
        kv = tr("KV heads split, {n} per rank", n=c.num_kv_heads // tp)
    for r in range(tp):
        print(tr("rank {rank}: q heads {q}, {kv}, intermediate {i0}:{i1}, vocabulary {v0}:{v1}",
                 rank=r, q=list(range(r * heads, (r + 1) * heads)), kv=kv,
                 i0=r * inter, i1=(r + 1) * inter, v0=r * vocab, v1=(r + 1) * vocab))
    print(tr("each forward step: {reduce} all_reduce, 1 all_gather", reduce=2 * c.num_layers + 1))


explorer = Explorer(
    show_split,
    title=tr("Tensor parallelism: which model, how many ranks"),
    model=widgets.Dropdown(options=list(CONFIGS), value="qwen3-tiny", description=tr("model")),
    tp=widgets.IntSlider(value=2, min=1, max=9, description="tp"),
)
explorer

# %%
# 用几组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with a few sets of values (this checks it without a browser)
explorer.run(model="qwen3-tiny", tp=4)

# %%
explorer.run(model="SmolLM2", tp=3)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. qwen3-tiny 切给两个秩，秩 1 的 `qkv_proj.weight` 的各行来自检查点里哪些张量的哪些行？
#
# <details><summary>答案</summary>
#
# 一共 128 行：`q_proj.weight` 的 64:128 行（q 头 2、3），`k_proj.weight` 的 32:64 行（KV 头 1），`v_proj.weight` 的
# 32:64 行，按这个顺序放好。
# </details>
#
# 2. 按行切的层里，每个秩都在部分和上加偏置 `b`，再 `all_reduce`。结果差多少？
#
# <details><summary>答案</summary>
#
# 多了 `(tp − 1)·b`。先 `all_reduce`，后加偏置，才只加一次——上面第 2 节就是这个。
# </details>
#
# 3. 在 2 核的 CPU 上，TP=2 为什么不会比 TP=1 快？
#
# <details><summary>答案</summary>
#
# 一个进程时每次矩阵乘法本来就用满两个核；两个秩各一个核、各算一半，计算量一点没少，每层还要多等两次 `all_reduce`，
# Python 开销每个秩各有一份。张量并行是为了放得下，和在 GPU 上更快。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. With qwen3-tiny over two ranks, which rows of which checkpoint tensors do the rows of rank 1's `qkv_proj.weight`
#    come from?
#
# <details><summary>Answer</summary>
#
# 128 rows in all: rows 64:128 of `q_proj.weight` (q heads 2 and 3), rows 32:64 of `k_proj.weight` (KV head 1), rows
# 32:64 of `v_proj.weight`, laid out in that order.
# </details>
#
# 2. In a row-parallel layer every rank adds the bias `b` to its partial sum, then `all_reduce`. How far off is the
#    result?
#
# <details><summary>Answer</summary>
#
# By `(tp − 1)·b`. `all_reduce` first, bias after, and it is added once — section 2 above shows exactly this.
# </details>
#
# 3. On a 2-core CPU, why can TP=2 not be faster than TP=1?
#
# <details><summary>Answer</summary>
#
# With one process every matrix multiplication already uses both cores; two ranks with one core each compute half each,
# not one multiplication less in total, plus two `all_reduce` to wait for in every layer and the Python overhead once per
# rank. Tensor parallelism is for fitting, and for going faster on GPUs.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage4/tensor_parallel.py` 里的任务后运行下面这一格（`python -m minisgl.course check tensor_parallel`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage4/tensor_parallel.py`, run the cell below (`python -m minisgl.course check tensor_parallel`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("tensor_parallel")
