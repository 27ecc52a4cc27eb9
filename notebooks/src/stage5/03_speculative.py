# %% [markdown] tags=["lang-zh"]
# # 第 5.3 章 speculative：引擎里的投机解码——一次前向验证，KV 收拾干净
#
# 前两章有了“猜”（n-gram 缓存）和“验”（树掩码、位置、接受）。这一章把它们装进引擎的主循环 `SpeculativeLoop`：
# 预填充照常；每个解码步，先给批里每个请求要一棵草稿树，整批的树根和草稿在**一次前向**里算完，再按接受的结果
# 一次交出好几个 token。要写的是：
#
# - `speculation`：哪些请求能投机（贪心的按 argmax 接受，没有种子的采样请求做投机采样，其余照常解码一步）；
# - `TreeAttnBackend.forward`：按页表取 K/V，用 `[前缀全可见 | 树的掩码]` 调第 1.5 章的 `attend`；
# - `_verify_batch`：把树根和草稿排成一次前向的输入——token、位置、写 K/V 的槽位、掩码；
# - `_commit`：接受的那条路的 K/V 挪到紧挨着前缀的位置，不要的页还回去，token 池写上这一步出的 token。
#
# 打开它只要一个参数：`LLM(path, speculative_algorithm="NGRAM")`（服务器是 `--speculative-algorithm NGRAM`）。
# 它出的 token 和不投机时逐个相同，只是步数少了。

# %% [markdown] tags=["lang-en"]
# # Chapter 5.3 speculative: speculative decoding in the engine — verify in one forward, keep the KV honest
#
# The last two chapters gave the guessing (the n-gram cache) and the verifying (tree mask, positions, acceptance). This
# chapter puts them into the engine's main loop, `SpeculativeLoop`: prefills as usual; at each decode step, a draft tree
# for every request of the batch, all the roots and drafts computed in **one forward**, then several tokens handed out at
# once by what was accepted. To write:
#
# - `speculation`: which requests may speculate (greedy ones accept by argmax, unseeded sampled ones by speculative
#   sampling, the others decode one plain step);
# - `TreeAttnBackend.forward`: gather K/V through the page table and call chapter 1.5's `attend` with
#   `[prefix all visible | the tree's mask]`;
# - `_verify_batch`: lay out the roots and drafts as one forward's input: tokens, positions, the slots the K/V go to,
#   masks;
# - `_commit`: the accepted path's K/V move next to the prefix, unneeded pages go back, and the token pool gets the
#   step's tokens.
#
# Switching it on takes one argument: `LLM(path, speculative_algorithm="NGRAM")` (the server's
# `--speculative-algorithm NGRAM`). It yields exactly the tokens of plain decoding, in fewer steps.

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
# 本章的任务（和 stage5/speculative.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage5/speculative.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("speculative")

# %% [markdown] tags=["lang-zh"]
# ## 1. 哪些请求投机
#
# `speculation(req, 已出的 token 数)` 只看请求的采样参数。会改变分布或要逐个 token 记账的（惩罚、`logit_bias`、
# 对数概率、还没满足的 `min_tokens`、语法）不投机；带种子的采样请求也不投机——它的随机数按位置定，只有一步一采才和
# 不投机时相同。这里用一个只有 `sampling_params` 的小替身来问它：

# %% [markdown] tags=["lang-en"]
# ## 1. Which requests speculate
#
# `speculation(req, outputs_so_far)` looks only at the request's sampling parameters. Anything that changes the
# distribution or keeps per-token state (penalties, `logit_bias`, log-probabilities, an unmet `min_tokens`, a grammar)
# means no speculation; so does a seeded sampled request, whose random numbers follow its positions, so only sampling
# one step at a time matches plain decoding. Here it is asked with a small stand-in that has only `sampling_params`:

# %%
from types import SimpleNamespace

from minisgl.core import SamplingParams
from minisgl.speculative import speculation

KINDS = {
    tr("greedy"): SamplingParams(temperature=0.0),
    tr("sampled, temperature 0.8"): SamplingParams(temperature=0.8),
    tr("sampled with a seed"): SamplingParams(temperature=0.8, seed=1),
    tr("greedy with repetition_penalty 1.2"): SamplingParams(temperature=0.0, repetition_penalty=1.2),
    tr("greedy asking for logprobs"): SamplingParams(temperature=0.0, logprobs=True),
    tr("greedy with a regex"): SamplingParams(temperature=0.0, regex="[0-9]+"),
}
for what, params in KINDS.items():
    print(tr("  {what:<36} -> {how}", what=what, how=speculation(SimpleNamespace(sampling_params=params), 0)))
with_min = SimpleNamespace(sampling_params=SamplingParams(temperature=0.0, min_tokens=4))
print(tr("  min_tokens=4: after 2 outputs {early}, after 4 outputs {late}", early=speculation(with_min, 2),
         late=speculation(with_min, 4)))

# %% [markdown] tags=["lang-zh"]
# ## 2. 打开投机解码：token 逐个相同
#
# 同一个 tiny 模型（随机权重）建两个引擎，一个不投机、一个 `speculative_algorithm="NGRAM"`。提示词是重复着的
# token：同一段出现几次，中间岔开，n-gram 有得猜。两个引擎贪心生成，比一比：

# %% [markdown] tags=["lang-en"]
# ## 2. Switching speculative decoding on: the same tokens
#
# Two engines on the same tiny model (random weights), one plain and one with `speculative_algorithm="NGRAM"`. The
# prompts repeat: one run of tokens several times with forks between, so the n-grams have something to guess. Both
# engines decode greedily; compare:

# %%
import random

import torch

from minisgl import model_zoo
from minisgl.llm import LLM

TINY = str(model_zoo.tiny_qwen3())
KW = dict(dtype=torch.float32, device="cpu", max_running_req=8, num_page_override=2048, max_seq_len_override=512)
rng = random.Random(0)
prompts = []
for _ in range(4):
    base = [rng.randrange(1000, 5000) for _ in range(6)]
    prompts.append(base + base[:2] + [77] + base + base[:2] + [99] + base)
greedy = SamplingParams(max_tokens=40, ignore_eos=True)

plain = LLM(TINY, **KW)
spec = LLM(TINY, speculative_algorithm="NGRAM", **KW)
print(tr("the loops: {plain} and {spec}", plain=type(plain.loop).__name__, spec=type(spec.loop).__name__))
ours = [o["token_ids"] for o in plain.generate(prompts, greedy)]
theirs = [o["token_ids"] for o in spec.generate(prompts, greedy)]
print(tr("{n} prompts of {m} tokens, 40 new tokens each; the same tokens: {same}", n=len(prompts), m=len(prompts[0]),
         same=ours == theirs))
print(tr("the first request's output: {ids}", ids=theirs[0]))

# %% [markdown] tags=["lang-zh"]
# 投机的引擎记下了 `spec_stats`：验证过的草稿 token、其中接受的、带草稿的验证（请求 × 步）次数，以及每次验证出
# 几个 token（含白送的那个）的直方图：

# %% [markdown] tags=["lang-en"]
# The speculating engine keeps `spec_stats`: draft tokens verified, those accepted, verifications with a draft
# (request × step), and a histogram of how many tokens each verification yielded (the bonus included):

# %%
stats = spec.loop.spec_stats
print(stats)
print(tr("accepted {a} of {p} draft tokens; {m:.2f} tokens per verification with a draft", a=stats.accepted,
         p=stats.proposed, m=stats.mean_accept_length))
print(tr("the plain engine has no such statistics: {none}", none=plain.loop.spec_stats))

# %% [markdown] tags=["lang-zh"]
# 随机权重的模型输出没有意义，也很少照着输入重复，猜中的草稿不多——可 token 一个不差，这一节要看的正是这个。
# 猜得中的时候能省多少，要看一个真的模型照着输入写。

# %% [markdown] tags=["lang-en"]
# A random-weight model's output means nothing and seldom repeats its input, so few drafts are accepted; but not one
# token differs, and that is what this section is about. How much guessing right saves takes a real model writing from
# its input.

# %%
plain.shutdown()
spec.shutdown()

# %% [markdown] tags=["lang-zh"]
# ## 3. 真的模型、照着输入写：步数少了多少
#
# SmolLM2 的权重是真的。让它照抄提示词里的一段话（对话模板、贪心）：回答大段重复输入，n-gram 猜得中。每个调度步
# 之后引擎会调用登记的步监听器，数一数投机的引擎走了几步（预填充那一步也算）：不投机时一步出一个 token，投机时一步
# 可以出好几个。速度每台机器不一样（比较输出时会遮住），token 相同、步数和每次验证出几个 token 不依赖计时：

# %% [markdown] tags=["lang-en"]
# ## 3. A real model writing from its input: how many fewer steps
#
# SmolLM2 has real weights. Have it copy a passage given in the prompt (chat template, greedy): the answer repeats the
# input at length, and the n-grams guess well. After each scheduling step the engine calls the registered step
# listeners; count the steps the speculating engine takes (the prefill step included): plain decoding yields one token
# per step, speculating, one step can yield several. The speeds differ from machine to machine (output comparison masks them);
# the equal tokens, the step counts and the tokens per verification depend on no timing:

# %%
import time

SMOL = str(model_zoo.smollm2())
SMOL_KW = dict(dtype=torch.float32, device="cpu", max_running_req=4, max_seq_len_override=512)
PASSAGE = ("A paged KV cache splits the keys and values of every request into pages of a fixed size. The page table "
           "maps each position of a request to a slot in the pool, so a request can grow without moving what it "
           "already wrote.")
smol_plain = LLM(SMOL, **SMOL_KW)
smol_spec = LLM(SMOL, speculative_algorithm="NGRAM", **SMOL_KW)
ids = smol_plain.tokenizer.apply_chat_template(
    [{"role": "user", "content": f"Copy this text exactly, word for word:\n{PASSAGE}"}], add_generation_prompt=True,
    return_dict=False)
params = SamplingParams(max_tokens=64)
runs = {}
for name, llm in (("plain", smol_plain), ("ngram", smol_spec)):
    llm.generate([ids], SamplingParams(max_tokens=4))  # 预热 | en: warm-up
    if llm.loop.spec_stats is not None:
        llm.loop.forget()  # 从一棵空的 n-gram 树开始，不照抄预热的输出 | en: from an empty n-gram tree: no copying the warm-up's output
    steps: list[int] = []
    stop = llm.add_step_listener(lambda t, steps=steps: steps.append(1))
    start = time.perf_counter()
    out = llm.generate([ids], params)[0]
    runs[name] = (out, time.perf_counter() - start, len(steps))
    stop()
(plain_out, plain_s, _), (spec_out, spec_s, spec_steps) = runs["plain"], runs["ngram"]
print(tr("answer: {text!r}", text=spec_out["text"][:90] + "…"))
print(tr("the same tokens: {same} ({n} tokens)", same=plain_out["token_ids"] == spec_out["token_ids"],
         n=len(spec_out["token_ids"])))
print(tr("speculating: {steps} steps for {n} tokens (plain decoding: one step per token, the prefill's included)",
         steps=spec_steps, n=len(spec_out["token_ids"])))
print(tr("tokens per verification with a draft: more than 3: {many}",
         many=smol_spec.loop.spec_stats.mean_accept_length > 3))
print(tr("plain {p:.1f} tok/s, speculative {s:.1f} tok/s: {r:.1f}×", p=len(plain_out["token_ids"]) / plain_s,
         s=len(spec_out["token_ids"]) / spec_s, r=plain_s / spec_s))
smol_plain.shutdown()

# %% [markdown] tags=["lang-zh"]
# 每次带草稿的验证出了几个 token（含白送的那个）：照抄时大多是一整条链全被接受；回答和原文岔开的地方（开头、结尾）
# 只出白送的那一个：

# %% [markdown] tags=["lang-en"]
# How many tokens each verification with a draft yielded (the bonus included): when copying, mostly a whole chain
# accepted; where the answer departs from the passage (its opening, its end) only the bonus:

# %%
import matplotlib.pyplot as plt

lengths = smol_spec.loop.spec_stats.accept_lengths
fig, ax = plt.subplots(figsize=(6, 2.6))
ax.bar(sorted(lengths), [lengths[k] for k in sorted(lengths)], color="#6fa8dc")
ax.set_xlabel(tr("tokens yielded by one verification (the bonus included)"))
ax.set_ylabel(tr("verifications"))
ax.set_title(tr("SmolLM2 copying a passage"))
plt.tight_layout()
plt.show()
smol_spec.shutdown()

# %% [markdown] tags=["lang-zh"]
# ## 4. 动手调：一次最多验证几个 token
#
# `speculative_num_draft_tokens` 是每步最多验证几个 token（含树根），SGLang 的缺省是 12；`max_bfs_breadth` 是最短窗口
# 匹配时每个节点最多几个孩子。改一改，看每次验证出几个 token、猜的和接受的各有多少——输出的 token 始终与不投机时相同。

# %% [markdown] tags=["lang-en"]
# ## 4. Try it: how many tokens one step verifies
#
# `speculative_num_draft_tokens` is the most tokens verified per step (the root included), 12 by SGLang's default;
# `max_bfs_breadth` is the most children per node when the shortest window matches. Change them and see the tokens per
# verification and how many were proposed and accepted; the output tokens always stay those of plain decoding.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def try_settings(num_draft_tokens: int, max_bfs_breadth: int) -> None:
    llm = LLM(SMOL, speculative_algorithm="NGRAM", speculative_num_draft_tokens=num_draft_tokens,
              speculative_ngram_max_bfs_breadth=max_bfs_breadth, **SMOL_KW)
    try:
        out = llm.generate([ids], params)[0]
        s = llm.loop.spec_stats
        print(tr("num_draft_tokens={n}, max_bfs_breadth={b}: the same tokens as plain decoding: {same}",
                 n=num_draft_tokens, b=max_bfs_breadth, same=out["token_ids"] == plain_out["token_ids"]))
        print(tr("{v} verifications with a draft; {p} draft tokens proposed, {a} accepted; {m:.2f} tokens per verification",
                 v=s.verifies, p=s.proposed, a=s.accepted, m=s.mean_accept_length))
    finally:
        llm.shutdown()


explorer = Explorer(
    try_settings,
    title=tr("Speculative decoding on SmolLM2: how much one step verifies"),
    num_draft_tokens=widgets.IntSlider(value=12, min=2, max=24, description="num_draft"),
    max_bfs_breadth=widgets.IntSlider(value=10, min=1, max=10, description="max_breadth"),
)
explorer

# %%
# 用几组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with a few sets of values (this checks it without a browser)
explorer.run(num_draft_tokens=4, max_bfs_breadth=10)

# %% [markdown] tags=["lang-zh"]
# `num_draft_tokens=4` 时每步最多验证 3 个草稿 token，每次验证最多出 4 个 token；照抄一段话时草稿几乎都被接受，
# 上限就成了瓶颈。调到 12 或更大，每次出的 token 多了，可每一行都要算：猜得不准的时候，多验证的行就是白算。

# %% [markdown] tags=["lang-en"]
# With `num_draft_tokens=4` a step verifies at most 3 draft tokens, so a verification yields at most 4 tokens; when
# copying a passage nearly every draft is accepted and the cap becomes the bottleneck. At 12 or more each verification
# yields more, but every row costs compute: where the guesses are poor, the extra rows are computed for nothing.

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 为什么投机解码时重叠调度要关掉？
#
# <details><summary>答案</summary>
#
# 重叠调度在这一步还在算的时候就准备下一步的输入；可下一步的草稿要从这一步接受到哪里接着猜，这一步验证完之前
# 连下一步的树根是哪个 token 都不知道。SGLang 也是这样做的。
# </details>
#
# 2. 接受了一个侧枝上的两个草稿 token（它们在输入里的下标是 2 和 5），它们的 K/V 为什么要挪？
#
# <details><summary>答案</summary>
#
# 草稿的 K/V 按输入下标挨着写在 `L - 1 + i` 的槽位上；接受的路径在序列里是紧接着前缀的第 `L`、`L + 1` 个 token，
# 以后的步骤按页表的前若干个槽位取 K/V。不挪，页表里第 `L`、`L + 1` 个槽位放的就是被拒绝的兄弟的 K/V。
# </details>
#
# 3. 一个请求还能出 3 个 token，它的草稿最多几个？为什么？
#
# <details><summary>答案</summary>
#
# 2 个：草稿最多是还能出的 token 数减一，留一个给白送的 token。这样 `max_tokens` 只可能落在这一步的最后一个 token
# 上，不会有接受了却交不出去的 token。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. Why is overlap scheduling off with speculative decoding?
#
# <details><summary>Answer</summary>
#
# Overlap scheduling prepares the next step's input while this step still computes; but the next step's drafts are
# guessed from where this step's acceptance ends, and until this step is verified not even the next root token is known.
# SGLang does the same.
# </details>
#
# 2. Two draft tokens on a side branch are accepted (input indices 2 and 5). Why must their K/V move?
#
# <details><summary>Answer</summary>
#
# The drafts' K/V are written one after another at slots `L - 1 + i` by input index; the accepted path is tokens `L` and
# `L + 1` of the sequence, right after the prefix, and later steps take K/V from the first slots of the page-table row.
# Without the move, slots `L` and `L + 1` would hold the K/V of rejected siblings.
# </details>
#
# 3. A request may still output 3 tokens. At most how many draft tokens does it get, and why?
#
# <details><summary>Answer</summary>
#
# 2: at most the tokens it may still output minus one, keeping one for the bonus. So `max_tokens` can only fall on the
# step's last token, and no accepted token is left that cannot be handed out.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage5/speculative.py` 里的任务后运行下面这一格（`python -m minisgl.course check speculative`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage5/speculative.py`, run the cell below (`python -m minisgl.course check speculative`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("speculative")
