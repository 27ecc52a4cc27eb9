# %% [markdown] tags=["lang-zh"]
# # 第 4.5 章 expert_parallel：切开的专家与分给各秩的专家
#
# 第 4.4 章的 MoE 层在一个进程里持有全部专家。注意力照第 4.2 章切开以后，专家有两种切法：
#
# - **张量并行的专家**（`TPFusedMoE`，`ep = 1`）：每个秩都有每个专家，但只有中间维的 `1/n`——gate/up 按行切、down 按列切，
#   和第 4.2 章的 MLP 一样；每个秩算出部分和，每层一次 `T × H` 的 `all_reduce`，与路由无关；
# - **专家并行**（`EPMoE`，`ep = n`）：秩 `r` 持有一段连续的**整个的**专家。每个秩负责 `T` 个 token 里的一段，把
#   每个 `(token, 选择)` 对送到持有那个专家的秩（**派发**）；那边按本地专家分组算完，结果再回到来的秩（**合并**），
#   乘上路由权重、按 token 加起来；最后一次 `all_reduce` 把各段拼回整份 `[T, H]`。
#
# 这个笔记本先在本进程里看哪些切法行得通、派发要在各秩之间交多少对，再起两个真的秩比较两种切法：每个秩持有什么、派发了几行、
# 每个专家收到多少、交给集合通信多少字节，以及生成的 token 是否与一个秩相同。

# %% [markdown] tags=["lang-en"]
# # Chapter 4.5 expert_parallel: split experts and experts dealt out to ranks
#
# Chapter 4.4's MoE layer holds every expert in one process. With attention split as in chapter 4.2, the experts can be
# split in two ways:
#
# - **tensor-parallel experts** (`TPFusedMoE`, `ep = 1`): every rank has every expert, but only `1/n` of its
#   intermediate dimension — gate/up cut by rows, down by columns, like chapter 4.2's MLP; each rank computes a partial
#   sum, and each layer makes one `all_reduce` of `T × H`, whatever the routing;
# - **expert parallelism** (`EPMoE`, `ep = n`): rank `r` holds a contiguous block of **whole** experts. Each rank takes
#   charge of one stretch of the `T` tokens and gets each `(token, choice)` pair of it to the rank holding that expert
#   (**dispatch**); there it is computed grouped by local expert, and the result goes back to the rank it came from
#   (**combine**), multiplied by the routing weights and added up per token; a final `all_reduce` joins the stretches
#   into the whole `[T, H]`.
#
# This notebook first looks, in this process, at which splits work and how many pairs dispatch must move between ranks,
# then starts two real ranks to compare the two splits: what each rank holds, how many rows it dispatches, how many
# each expert receives, how many bytes go to collectives, and whether the tokens generated equal one rank's.

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
# 本章的任务（和 stage4/expert_parallel.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage4/expert_parallel.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("expert_parallel")

# %% [markdown] tags=["lang-zh"]
# ## 1. 切得开吗
#
# 第 4.2 章的条件（头数、稠密层的中间维、词表）照旧，再加上专家的：`ep = 1` 时每个专家的中间维要能被 `tp` 整除；
# `ep > 1` 时 `ep` 要等于 `tp`，专家数要能被它整除。`ep` 既不是 1 也不等于 `tp` 的一律拒绝：本章的专家就分在注意力
# 那同一组秩上。除了 tiny MoE，再看一个 Qwen3-30B-A3B 形状的配置（只改形状，不加载任何权重）：

# %% [markdown] tags=["lang-en"]
# ## 1. Can it be split
#
# Chapter 4.2's conditions (heads, the dense layers' intermediate size, the vocabulary) still hold, plus the experts':
# with `ep = 1` each expert's intermediate size must be divisible by `tp`; with `ep > 1`, `ep` must equal `tp` and divide
# the number of experts. An `ep` that is neither 1 nor `tp` is always refused: in this chapter the experts sit on the
# very ranks attention is split over. Besides the tiny MoE, look at a configuration shaped like Qwen3-30B-A3B (shapes
# only, no weight is loaded):

# %%
import dataclasses

from minisgl.expert_parallel import expert_range, moe_split_problems, token_range
from minisgl.model_zoo import tiny_qwen3_moe
from minisgl.moe import MoeConfig

tiny = MoeConfig.from_hf(tiny_qwen3_moe())
# 在 tiny 的配置上换成 Qwen3-30B-A3B 的形状
# en: Qwen3-30B-A3B's shapes on top of the tiny config
big = dataclasses.replace(tiny, hidden_size=2048, intermediate_size=6144, num_layers=48, num_qo_heads=32, num_kv_heads=4,
                          head_dim=128, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768)
CONFIGS = {"tiny MoE": tiny, "Qwen3-30B-A3B-like": big}
for name, c in CONFIGS.items():
    print(tr("{name}: {e} experts of intermediate size {i}, top-{k}, {heads} query heads, {kv} KV heads", name=name,
             e=c.num_experts, i=c.moe_intermediate_size, k=c.num_experts_per_tok, heads=c.num_qo_heads, kv=c.num_kv_heads))
    for tp, ep in ((2, 1), (2, 2), (4, 4), (8, 1), (8, 8), (4, 2)):
        problems = moe_split_problems(c, tp, ep)
        print(f"  tp={tp} ep={ep}: " + ("; ".join(problems) if problems else tr("splits")))

# %% [markdown] tags=["lang-zh"]
# 切得开时，每个秩持有哪些专家（`expert_range`：连续的一段，一样多），每个秩派发 `T` 个 token 里的哪一段（`token_range`：
# 连续的一段，前 `T % n` 个秩各多一个；token 比秩少时有的秩一段是空的，可它照样要参加每一次集合通信）：

# %% [markdown] tags=["lang-en"]
# When it splits: which experts each rank holds (`expert_range`: one contiguous block, the same count on every rank), and
# which stretch of the `T` tokens each rank dispatches (`token_range`: contiguous, the first `T % n` ranks one more each;
# with fewer tokens than ranks some stretch is empty, and that rank still takes part in every collective):

# %%
for n in (2, 4):
    print(tr("8 experts over {n} ranks: {blocks}", n=n, blocks=[list(expert_range(8, r, n)) for r in range(n)]))
for tokens in (7, 5, 1):
    print(tr("{t} tokens over 2 ranks: {stretches}", t=tokens, stretches=[list(token_range(tokens, r, 2)) for r in range(2)]))

# %% [markdown] tags=["lang-zh"]
# ## 2. 派发要解决的问题：每一对该去哪个秩、各秩之间几对
#
# 这一步也不用起秩，在本进程里把两个秩面对的情形摆出来。5 个 token、每个选 2 个专家（8 个专家，秩 0 持有 0–3，秩 1
# 持有 4–7）。每个秩只管自己那段 token；它那段的每个 `(token, 选择)` 对，都要由持有那个专家的秩来算——也许是自己，
# 也许是别的秩。各秩之间要交的对数由路由决定：不对称，可能是 0。算完以后，每个结果都要回到它那个 token 所在的秩，
# 乘上路由权重、按 token 加起来。怎么交、记下什么，是你在 `dispatch` / `combine` 里设计的协议：

# %% [markdown] tags=["lang-en"]
# ## 2. The problem dispatch solves: where each pair must go, and how many between ranks
#
# No ranks needed here either: lay out, in this process, what two ranks face. 5 tokens, each choosing 2 experts (8
# experts, rank 0 holds 0–3, rank 1 holds 4–7). Each rank is in charge of its own stretch of tokens only; each
# `(token, choice)` pair of that stretch must be computed by the rank holding its expert — maybe itself, maybe another.
# How many pairs go between ranks is up to the routing: not symmetric, possibly 0. Once computed, each result must come
# back to the rank its token belongs to, be multiplied by the routing weight and added up per token. How to exchange
# them and what to note is the protocol you design in `dispatch` / `combine`:

# %%
import torch

topk_ids = torch.tensor([[5, 1], [2, 7], [4, 6], [0, 3], [6, 5]])  # 全局专家号 | en: [T=5, k=2], global expert numbers
per_rank = 8 // 2
between = [[0, 0], [0, 0]]  # between[s][r]：秩 s 的 token 里归秩 r 的专家算的对数 | en: pairs of rank s's tokens for rank r's experts
for s in range(2):
    for t in token_range(topk_ids.shape[0], s, 2):
        experts = topk_ids[t].tolist()
        owners = [e // per_rank for e in experts]
        for r in owners:
            between[s][r] += 1
        print(tr("rank {rank} is in charge of token {t}: experts {experts}, held by ranks {owners}", rank=s, t=t,
                 experts=experts, owners=owners))
print(tr("(token, choice) pairs from each rank's tokens (rows) to the rank holding their expert (columns): {m}",
         m=between))
for r in range(2):
    mine = token_range(topk_ids.shape[0], r, 2)
    print(tr("rank {rank} computes {n} pairs; combine must give it back the {k} results of its own {t} tokens",
             rank=r, n=between[0][r] + between[1][r], k=sum(between[r]), t=len(mine)))

# %% [markdown] tags=["lang-zh"]
# ## 3. tiny MoE 切给两个秩
#
# 现在真的起两个秩。spawn 出的秩要按**名字**导入它跑的函数，所以它写在示例 `examples/chapters/expert_parallel.py` 的
# 模块顶层，这里导入它：每个秩加入进程组，建 `TPEngine`（`ep_size` 交给 `EngineConfig`），两个提示词一起贪心生成，
# 交回第 1 层（第一个 MoE 层）的专家看到的东西：持有哪些专家、`w13` 的形状、预填充时派发给每个秩几行、
# 每个专家收到的 `(token, 选择)` 对数、交给集合通信的字节数，以及生成的 token。

# %% [markdown] tags=["lang-en"]
# ## 3. The tiny MoE over two ranks
#
# Now two real ranks. A spawned rank imports the function it runs **by name**, so that function sits at the top level of
# the example `examples/chapters/expert_parallel.py`, and we import it from there: each rank joins the process group,
# builds a `TPEngine` (`ep_size` goes to `EngineConfig`), generates greedily for two prompts at once, and hands back what
# layer 1's experts (the first MoE layer) saw: which experts it holds, the shape of `w13`, the rows dispatched to each
# rank in the prefill, the `(token, choice)` pairs each expert received, the bytes handed to collectives, and the tokens.

# %%
from minisgl.notebook import show_source
from minisgl.processes.ranks import run_ranks

sys.path.insert(0, str(ROOT / "examples"))  # spawn 出的秩继承这条路径 | en: the spawned ranks inherit this path
from chapters.expert_parallel import MODEL, NEW_TOKENS, PROMPTS, demo_rank  # noqa: E402

show_source(demo_rank)

# %% [markdown] tags=["lang-zh"]
# 同一个函数跑三次：1 个秩（整个模型在一个进程里）、2 个秩上的张量并行专家（`ep = 1`）、2 个秩上的专家并行（`ep = 2`）。
# 张量并行时每个秩都有 8 个专家，每个的 gate/up 只有一半行（`w13` 是 `[8, 32, 64]`）；专家并行时每个秩 4 个整的专家
# （`[4, 64, 64]`）——两种切法每个秩存的专家权重一样多：

# %% [markdown] tags=["lang-en"]
# The same function runs three times: 1 rank (the whole model in one process), tensor-parallel experts on 2 ranks
# (`ep = 1`), expert parallelism on 2 ranks (`ep = 2`). With tensor parallelism each rank has all 8 experts, each with
# half of its gate/up rows (`w13` is `[8, 32, 64]`); with expert parallelism each rank has 4 whole experts
# (`[4, 64, 64]`) — either way each rank stores the same amount of expert weights:

# %%
one = run_ranks(demo_rank, 1, MODEL, 1)[0]
RUNS = {"TP": run_ranks(demo_rank, 2, MODEL, 1), "EP": run_ranks(demo_rank, 2, MODEL, 2)}
for kind, ranks in RUNS.items():
    for rank, seen in enumerate(ranks):
        print(tr("{kind} rank {rank}: {cls}, experts {held}, w13 {shape}", kind=kind, rank=rank, cls=seen["kind"],
                 held=seen["held"], shape=seen["w13"]))

# %% [markdown] tags=["lang-zh"]
# 预填充时两个提示词一共 10 个 token，每个秩派发其中 5 个、每个 2 个选择，也就是 10 行。发给自己的那部分不出进程
# （`all_to_all` 里发给自己的只是一次拷贝），发给对方的才真的走通信。每个秩收到的行数，是两个秩发给它的加起来：

# %% [markdown] tags=["lang-en"]
# In the prefill the two prompts make 10 tokens; each rank dispatches 5 of them with 2 choices each, that is 10 rows.
# The part a rank sends to itself never leaves the process (inside `all_to_all` it is just a copy); only the part for
# the other rank really travels. The rows each rank receives are what both ranks sent it, added up:

# %%
ep = RUNS["EP"]
sends = [seen["prefill_sends"] for seen in ep]
for rank, send in enumerate(sends):
    print(tr("EP rank {rank} dispatches {send} (to rank 0, rank 1): {mine} to itself, {away} to the other rank",
             rank=rank, send=send, mine=send[rank], away=sum(send) - send[rank]))
for rank in range(2):
    print(tr("EP rank {rank} receives {rows} rows in the prefill", rank=rank, rows=sum(s[rank] for s in sends)))

# %% [markdown] tags=["lang-zh"]
# ## 4. 负载：热门专家所在的秩是最慢的那个
#
# 下图是第 1 层每个专家在整个生成过程里收到的 `(token, 选择)` 对数，颜色是持有它的秩。张量并行时每个秩都算全部 8 个专家
# （各算一半宽），负载总是平均的；专家并行时秩 `r` 只算它那 4 个专家收到的行，哪个秩的专家热门，哪个秩就算得多，
# 别的秩在合并的 `all_to_all` 里等它。这个模型的权重是随机的，不均衡不大；真实模型里常有几个专家特别忙：

# %% [markdown] tags=["lang-en"]
# The plot shows how many `(token, choice)` pairs each expert of layer 1 received over the whole generation, coloured by
# the rank that holds it. With tensor-parallel experts every rank computes all 8 experts (each at half width), so the
# load is always even; with expert parallelism rank `r` computes only the rows its 4 experts received: whichever rank
# holds the popular experts computes more, and the others wait for it in the combine `all_to_all`. This model's weights
# are random and the imbalance is small; in real models a few experts are often much busier than the rest:

# %%
import matplotlib.pyplot as plt

computed = sum(map(len, PROMPTS)) + len(PROMPTS) * (NEW_TOKENS - 1)
k = tiny.num_experts_per_tok
colours = ["#6fa8dc", "#f6b26b"]
fig, ax = plt.subplots(figsize=(7, 2.8))
for rank, seen in enumerate(ep):
    ax.bar(seen["held"], seen["tokens_per_expert"], color=colours[rank], label=tr("rank {rank}", rank=rank))
    print(tr("EP rank {rank}: experts {held} received {counts}, {total} rows to compute", rank=rank, held=seen["held"],
             counts=seen["tokens_per_expert"], total=sum(seen["tokens_per_expert"])))
total = sum(sum(seen["tokens_per_expert"]) for seen in ep)
print(tr("together {total} = {computed} tokens computed x top-{k}", total=total, computed=computed, k=k))
ax.axhline(total / tiny.num_experts, color="#cc4125", linestyle="--", label=tr("average per expert"))
ax.set_xticks(range(tiny.num_experts))
ax.set_xlabel(tr("expert (colour: the rank holding it)"))
ax.set_ylabel(tr("(token, choice) pairs received"))
ax.set_title(tr("Layer 1 under expert parallelism: rows per expert"))
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 5. 交给集合通信的字节数，和生成的 token
#
# `bytes_moved` 累计第 1 层交给集合通信的字节数。张量并行：每步一次 `[T, 64]` 的 `all_reduce`，整个生成一共算了
# 20 个 token，`20 × 64 × 4 = 5120` 字节，与路由无关。专家并行：同样 5120 字节的拼回（`all_reduce`），再加上派发、
# 合并时发给对方的行——在这个两个秩、每个 token 选 2 个专家的小模型上，专家并行交给通信的字节反而更多。
# 两种切法贪心生成的 token 都和一个秩的一样：

# %% [markdown] tags=["lang-en"]
# `bytes_moved` counts the bytes layer 1 hands to collectives. Tensor parallelism: one `[T, 64]` `all_reduce` per step;
# 20 tokens computed over the whole generation make `20 × 64 × 4 = 5120` bytes, whatever the routing. Expert
# parallelism: the same 5120 bytes for the join (`all_reduce`), plus the rows sent to the other rank in dispatch and
# combine — on this small model, with two ranks and 2 experts per token, expert parallelism hands *more* bytes to the
# collectives. Both splits generate the same greedy tokens as one rank:

# %%
join = computed * tiny.hidden_size * 4
for kind, ranks in RUNS.items():
    print(tr("{kind}: layer 1 bytes per rank {bytes}; collectives of the whole model {calls}", kind=kind,
             bytes=[seen["bytes"] for seen in ranks], calls=ranks[0]["calls"]))
print(tr("the all_reduce of {t} tokens x {h} floats: {join} bytes", t=computed, h=tiny.hidden_size, join=join))
for kind, ranks in RUNS.items():
    print(tr("{kind}: both ranks generate the same tokens as one rank: {same}", kind=kind,
             same=ranks[0]["tokens"] == ranks[1]["tokens"] == one["tokens"]))

# %% [markdown] tags=["lang-zh"]
# ## 6. 放到 Qwen3-30B-A3B 的形状上算一算
#
# 隐藏维 2048、bf16，一行是 4 KiB；128 个专家、每个 token 选 8 个、专家中间维 768。每个秩、这一层每个 token：
#
# - 张量并行：交给 `all_reduce` 一行 4 KiB；环形 all_reduce 在线上每个秩发 `2(n − 1)/n` 倍；
# - 专家并行：每个秩派发 `T/n` 个 token、每个 `k` 行，其中 `(n − 1)/n` 发给别的秩（路由均匀时），去一趟、回一趟。
#
# 两者在线上的比是 `k / n`：秩数比 `k` 少时专家并行发得多，多时发得少；而张量并行把每个专家切得越来越窄。下面按这两条式子
# 算（不起秩，只是算术；本章的专家并行还要另加一次拼回的 `all_reduce`）：

# %% [markdown] tags=["lang-en"]
# A hidden size of 2048 in bf16 makes a row of 4 KiB; 128 experts, 8 chosen per token, an expert intermediate size of
# 768. Per rank, per token of the layer:
#
# - tensor parallelism: one 4 KiB row handed to the `all_reduce`; a ring all_reduce puts `2(n − 1)/n` times that on the
#   wire from each rank;
# - expert parallelism: each rank dispatches `T/n` tokens with `k` rows each, of which `(n − 1)/n` go to other ranks
#   (with even routing), out and back again.
#
# On the wire the two compare as `k / n`: with fewer ranks than `k` expert parallelism sends more, with more ranks less;
# meanwhile tensor parallelism cuts every expert narrower and narrower. The two formulas below, worked out (no ranks,
# arithmetic only; this chapter's expert parallelism adds one more `all_reduce` for the join):

# %%
H, K, INTER, ROW = 2048, 8, 768, 2048 * 2  # bf16 的一行 | en: bf16
for n in (2, 4, 8, 16, 32):
    tp_wire = 2 * (n - 1) / n * ROW
    ep_wire = 2 * K * (n - 1) / n * ROW / n
    print(tr("n={n}: TP all_reduce {tp:.2f} KiB on the wire, each expert {w} wide; EP dispatch + combine {ep:.2f} KiB, "
             "{e} whole experts per rank", n=n, tp=tp_wire / 1024, w=INTER // n, ep=ep_wire / 1024, e=128 // n))

# %% [markdown] tags=["lang-zh"]
# ## 7. 动手调：哪个模型、几个秩
#
# 选一个模型和秩数 `n`，看两种切法切不切得开；切得开时，看每个秩上的专家是什么形状，以及每个 token、每层、每个秩
# 在线上发多少（张量并行按环形 `all_reduce` 算；专家并行只算派发 + 合并，路由均匀时）。这一步只算形状和算术，不起秩。
# 试试 Qwen3-30B-A3B 形状的 `n = 8`（两者相等）和 `n = 32`（张量并行把每个专家切到只剩 24 宽）。

# %% [markdown] tags=["lang-en"]
# ## 7. Try it: which model, how many ranks
#
# Pick a model and a rank count `n`, and see whether each split works; when it does, see the shape of the experts on
# each rank and how much each rank puts on the wire per token and layer (tensor parallelism as a ring `all_reduce`;
# expert parallelism dispatch + combine only, with even routing). This only works out shapes and arithmetic, no ranks
# are started. Try the Qwen3-30B-A3B-like model at `n = 8` (the two are equal) and at `n = 32` (tensor parallelism cuts
# each expert down to 24 wide).

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

#: 每个数几个字节：tiny 是 float32，大的是 bf16
#: en: bytes per number: the tiny model is float32, the big one bf16
ELEMENT = {"tiny MoE": 4, "Qwen3-30B-A3B-like": 2}


def show_experts(model: str, n: int) -> None:
    c = CONFIGS[model]
    row = c.hidden_size * ELEMENT[model]
    for ep in dict.fromkeys((1, n)):  # n = 1 时只一行 | en: n = 1: one line only
        problems = moe_split_problems(c, n, ep)
        kind = tr("tensor-parallel experts (ep=1)") if ep == 1 else tr("expert parallelism (ep={n})", n=n)
        if problems:
            print(tr("{kind}: does not split over {n} ranks: {problems}", kind=kind, n=n, problems="; ".join(problems)))
            continue
        if ep == 1:
            wire = 2 * (n - 1) / n * row
            print(tr("{kind}: each rank has all {e} experts, w13 [{e}, {w13}, {h}], w2 [{e}, {h}, {i}]; all_reduce {kib:.2f} "
                     "KiB per token on the wire", kind=kind, e=c.num_experts, w13=2 * c.moe_intermediate_size // n,
                     h=c.hidden_size, i=c.moe_intermediate_size // n, kib=wire / 1024))
        else:
            wire = 2 * c.num_experts_per_tok * (n - 1) / n * row / n
            held = expert_range(c.num_experts, 0, n)
            print(tr("{kind}: rank 0 holds experts {first}-{last}, w13 [{e}, {w13}, {h}]; dispatch + combine {kib:.2f} KiB "
                     "per token on the wire", kind=kind, first=held.start, last=held.stop - 1, e=len(held),
                     w13=2 * c.moe_intermediate_size, h=c.hidden_size, kib=wire / 1024))


explorer = Explorer(
    show_experts,
    title=tr("Splitting the experts: which model, how many ranks"),
    model=widgets.Dropdown(options=list(CONFIGS), value="Qwen3-30B-A3B-like", description=tr("model")),
    n=widgets.IntSlider(value=8, min=1, max=32, description="n"),
)
explorer

# %%
# 用几组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with a few sets of values (this checks it without a browser)
explorer.run(model="Qwen3-30B-A3B-like", n=32)

# %%
explorer.run(model="tiny MoE", n=4)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. tiny MoE 在 `ep = 2` 时，秩 1 的 `w13` 是什么形状？检查点里专家 5 的 `up_proj.weight` 会放到它的第几片？
#
# <details><summary>答案</summary>
#
# `[4, 64, 64]`：4 个整的专家，每个 gate/up 各 32 行。专家 5 的 `up_proj` 在检查点里是 `w13` 的第 `2 × 5 + 1 = 11` 片；
# 秩 1 的专家从 4 起，本地片号是 `11 − 2 × 4 = 3`，也就是本地专家 1 的 up。
# </details>
#
# 2. 预填充时秩 0 那段 token 的 `(token, 选择)` 对里，4 对归它自己的专家、6 对归秩 1 的；秩 1 那段的有 7 对归秩 0、
#    3 对归自己。每个秩要算几对？合并之后秩 0 要拿回几个结果，其中几个要跨秩？
#
# <details><summary>答案</summary>
#
# 秩 0 算 `4 + 7 = 11` 对，秩 1 算 `6 + 3 = 9` 对：算多少由路由决定，不由 token 的分法决定。秩 0 要拿回自己那段的全部
# 10 个结果：4 个本来就在自己这里算，6 个从秩 1 回来。回程的对数正好是去程的反过来。
# </details>
#
# 3. 一个秩这一段一个 token 也没有（`token_range` 是空的），它还要调用 `all_to_all` 吗？
#
# <details><summary>答案</summary>
#
# 要。它发 0 行，可别的秩可能要发给它行、也要它把算好的行送回；集合通信要每个秩都调用，少一个，其余的就一直等到超时。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. With the tiny MoE at `ep = 2`, what shape is rank 1's `w13`? Which of its shards does expert 5's `up_proj.weight`
#    from the checkpoint go to?
#
# <details><summary>Answer</summary>
#
# `[4, 64, 64]`: 4 whole experts, each with 32 gate rows and 32 up rows. Expert 5's `up_proj` is shard `2 × 5 + 1 = 11`
# of `w13` in the checkpoint; rank 1's experts start at 4, so the local shard is `11 − 2 × 4 = 3`, the up of local
# expert 1.
# </details>
#
# 2. In the prefill, of the `(token, choice)` pairs of rank 0's stretch 4 belong to its own experts and 6 to rank 1's;
#    of rank 1's, 7 belong to rank 0 and 3 to itself. How many pairs does each rank compute? After combine, how many
#    results must rank 0 get back, and how many of them cross ranks?
#
# <details><summary>Answer</summary>
#
# Rank 0 computes `4 + 7 = 11` pairs, rank 1 `6 + 3 = 9`: the routing decides how many, not the way the tokens were
# split. Rank 0 must get back all 10 results of its stretch: 4 computed right there, 6 coming back from rank 1. The
# counts on the way back are those of the way out, reversed.
# </details>
#
# 3. A rank's stretch has no token at all (`token_range` is empty). Does it still call `all_to_all`?
#
# <details><summary>Answer</summary>
#
# Yes. It sends 0 rows, but the other ranks may send it rows and need it to send the results back; every rank must call
# every collective, and if one is missing the others wait until the timeout.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage4/expert_parallel.py` 里的任务后运行下面这一格（`python -m minisgl.course check expert_parallel`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage4/expert_parallel.py`, run the cell below (`python -m minisgl.course check expert_parallel`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("expert_parallel")
