# %% [markdown] tags=["lang-zh"]
# # 第 5.2 章 spec_tree：验证——树掩码、按深度的位置与接受
#
# 第 5.1 章猜出了一棵草稿树；这一章让目标模型**一次前向**验证整棵树，需要四样东西：
#
# - **树掩码** `tree_mask`：输入是树根（已经验证过的最后一个 token，下标 0）加上广度优先排好的草稿（下标 1..n）。
#   每一行只能看见它自己和它的祖先，绝不能看见兄弟——兄弟是另一种猜法，不在它的序列里；
# - **位置** `tree_positions`：一个草稿 token 的位置是树根的位置加它的深度，不是它在输入里的下标（两个兄弟位置相同）；
# - **贪心地接受** `accept_greedy`：从树根起，哪个孩子的 token 等于父节点上目标模型的 argmax，就接受它、接着往下走；
#   走不下去时，父节点上的 argmax 就是白送的那个 token（bonus）。所以每一步至少出一个 token；
# - **投机采样** `accept_sampled`：采样的请求按概率接受草稿，每个 token 的分布和一步一采时一模一样。

# %% [markdown] tags=["lang-en"]
# # Chapter 5.2 spec_tree: verification — the tree mask, positions by depth and acceptance
#
# Chapter 5.1 guessed a draft tree; this chapter has the target model verify the whole tree **in one forward**, which
# takes four things:
#
# - the **tree mask** `tree_mask`: the input is the root (the last verified token, index 0) followed by the draft in
#   breadth-first order (indices 1..n). Each row may see itself and its ancestors, never a sibling: a sibling is another
#   guess, not part of its sequence;
# - the **positions** `tree_positions`: a draft token's position is the root's position plus its depth, not its index in
#   the input (two siblings share a position);
# - **greedy acceptance** `accept_greedy`: from the root, a child whose token equals the target model's argmax at its
#   parent is accepted and the walk goes on; where it cannot, the parent's argmax is the token given for free (the
#   bonus). So every step yields at least one token;
# - **speculative sampling** `accept_sampled`: sampled requests accept drafts with probabilities such that every token
#   follows exactly the distribution of sampling one step at a time.

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
# 本章的任务（和 stage5/spec_tree.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage5/spec_tree.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("spec_tree")

# %% [markdown] tags=["lang-zh"]
# ## 1. 一棵小树的掩码
#
# 还是第 5.1 章那棵树：树根下面两种猜法 7 和 8，7 下面接着 9，9 下面接着 4。输入一共 5 行：树根、7、8、9、4。
# 掩码的第 i 行为真的列就是第 i 行能看见的：

# %% [markdown] tags=["lang-en"]
# ## 1. The mask of a small tree
#
# Chapter 5.1's tree again: two guesses under the root, 7 and 8; 9 follows 7, and 4 follows 9. The input has 5 rows: the
# root, 7, 8, 9, 4. Row i of the mask is true at the columns row i may see:

# %%
import torch

from minisgl.ngram_cache import DraftTree
from minisgl.spec_tree import accept_greedy, accept_sampled, tree_mask, tree_positions

tree = DraftTree(tokens=(7, 8, 9, 4), parents=(-1, -1, 0, 2))
labels = [tr("root")] + [str(t) for t in tree.tokens]


def show_mask(mask: torch.Tensor, labels: list[str]) -> None:
    """把布尔掩码打印成 0 / 1 的表格，行和列都标上 token。

    en: Print a boolean mask as a table of 0 / 1, rows and columns labelled with their tokens.
    """
    width = max(len(label) for label in labels) + 1
    print(" " * width + "".join(f"{label:>{width}}" for label in labels))
    for label, row in zip(labels, mask.tolist()):
        print(f"{label:>{width}}" + "".join(f"{int(v):>{width}}" for v in row))


mask = tree_mask(tree)
print(tr("tree_mask: shape {shape}, dtype {dtype}", shape=list(mask.shape), dtype=mask.dtype))
show_mask(mask, labels)

# %% [markdown] tags=["lang-zh"]
# 读一读：4 这一行看见树根、7、9 和它自己——正好是序列 `… 树根 7 9 4`；8 这一行只看见树根和自己，7 那一支的东西
# 它一个也看不见。已经在 KV 缓存里的前缀所有行都看得见，不在这个掩码里；第 5.3 章把 `[前缀全为真 | 树的掩码]`
# 拼起来交给注意力。前缀 6 个 token 时整张掩码的样子：

# %% [markdown] tags=["lang-en"]
# Reading it: the row of 4 sees the root, 7, 9 and itself, exactly the sequence `… root 7 9 4`; the row of 8 sees only
# the root and itself, nothing of the branch under 7. The prefix already in the KV cache is visible to every row and is
# not in this mask; chapter 5.3 joins `[prefix all true | the tree's mask]` and hands it to attention. The whole mask
# with a prefix of 6 tokens:

# %%
from minisgl.notebook import draw_mask

prefix = 6
full = torch.cat([torch.ones(len(tree) + 1, prefix, dtype=torch.bool), mask], dim=1)
draw_mask(full, cached_len=prefix, title=tr("Verifying a draft tree after a prefix of {n} tokens", n=prefix))

# %% [markdown] tags=["lang-zh"]
# 纵轴是按输入下标数的绝对位置（`draw_mask` 把第 i 行画在 `cached_len + i`），这正是下一节要纠正的：草稿 token 的
# 位置按深度算，不按下标。

# %% [markdown] tags=["lang-en"]
# The vertical axis counts absolute positions by input index (`draw_mask` puts row i at `cached_len + i`), which is
# exactly what the next section corrects: a draft token's position goes by its depth, not its index.

# %% [markdown] tags=["lang-zh"]
# ## 2. 位置按深度
#
# 树根是序列里的第 `L - 1` 个 token（`L` 是已知 token 数）。第 5.3 章把第 i 个草稿 token 的 K/V 写在这一行的第
# `L - 1 + i` 个槽位（挨着往后排），可它的 RoPE 位置是 `L - 1 + 深度`：7 和 8 都是树根之后的第一个 token。
# `L = 7` 时：

# %% [markdown] tags=["lang-en"]
# The root is token `L - 1` of the sequence (`L` known tokens). Chapter 5.3 writes draft token i's K/V in slot
# `L - 1 + i` of the request's row (one after another), but its RoPE position is `L - 1 + depth`: 7 and 8 are both the
# first token after the root. With `L = 7`:

# %%
L = 7
positions = tree_positions(tree, L - 1)
print(tr("positions: {positions} ({dtype})", positions=positions.tolist(), dtype=positions.dtype))
for i, label in enumerate(labels):
    print(tr("  {label:>4}: slot {slot}, position {position}", label=label, slot=L - 1 + i, position=int(positions[i])))

# %% [markdown] tags=["lang-zh"]
# ## 3. 掩码为什么必须挡住兄弟
#
# 拿随机的 q、k、v 做一次“注意力”（第 1.5 章的 `attend`）：前缀 6 个 token 加上这棵树，整块一起算，用树掩码。
# 再对每个节点单独算一遍，只给它自己那条序列（前缀、祖先、它自己）。两种算法逐行相同，说明一次前向等于把每条
# 分支分开算；换成普通的因果掩码（下标在前就看得见），8 就看见了 7 那一支，结果就错了：

# %% [markdown] tags=["lang-en"]
# ## 3. Why the mask must hide siblings
#
# Take random q, k and v through one "attention" (chapter 1.5's `attend`): a prefix of 6 tokens plus this tree, all in
# one go, with the tree mask. Then compute each node alone, given only its own sequence (the prefix, its ancestors,
# itself). The two agree row by row: one forward equals computing every branch apart. With a plain causal mask instead
# (an earlier index is visible), 8 sees the branch under 7 and the result is wrong:

# %%
from minisgl.attention import attend


def ancestry(draft: DraftTree, node: int) -> list[int]:
    """节点 node（0 是树根）的序列：从树根到它自己的下标，从浅到深。

    en: Node ``node``'s sequence (0 is the root): the indices from the root down to itself, shallow to deep.
    """
    path = [node]
    while path[-1] > 0:
        path.append(draft.parents[path[-1] - 1] + 1)
    return path[::-1]


g = torch.Generator().manual_seed(0)
rows, heads, dim = len(tree) + 1, 2, 8
q = torch.randn(rows, heads, dim, generator=g)
k = torch.randn(prefix + rows, heads, dim, generator=g)
v = torch.randn(prefix + rows, heads, dim, generator=g)
together = attend(q, k, v, full, dim ** -0.5)
causal = torch.cat([torch.ones(rows, prefix, dtype=torch.bool), torch.ones(rows, rows, dtype=torch.bool).tril()], dim=1)
wrong = attend(q, k, v, causal, dim ** -0.5)
for node, label in enumerate(labels):
    keys = list(range(prefix)) + [prefix + j for j in ancestry(tree, node)]
    alone = attend(q[node : node + 1], k[keys], v[keys], torch.ones(1, len(keys), dtype=torch.bool), dim ** -0.5)
    print(tr("  {label:>4}: its sequence {seq}; tree mask = alone: {a}, causal mask = alone: {b}", label=label,
             seq=[labels[j] for j in ancestry(tree, node)], a=torch.allclose(together[node], alone[0], atol=1e-5),
             b=torch.allclose(wrong[node], alone[0], atol=1e-5)))

# %% [markdown] tags=["lang-zh"]
# 因果掩码下只有树根和 7 还对（排在它们前面的恰好都是祖先），8、9、4 都看见了不属于自己的东西。

# %% [markdown] tags=["lang-en"]
# Under the causal mask the root and 7 are still right, while 8, 9 and 4 each see something that is not theirs.

# %% [markdown] tags=["lang-zh"]
# ## 4. 贪心地接受
#
# 目标模型在每一行给出下一个 token 的 argmax：`target[i]` 是节点 i（0 是树根）之后模型要的 token。编三组：

# %% [markdown] tags=["lang-en"]
# ## 4. Greedy acceptance
#
# The target model gives the argmax of the next token on every row: `target[i]` is the token the model wants after node
# i (0 is the root). Three made-up cases:

# %%
CASES = {
    tr("the model agrees with 7, 9, 4, then wants 5"): [7, 9, 2, 4, 5],
    tr("the model wants 8, then 2"): [8, 9, 2, 4, 5],
    tr("the model wants 6 at once"): [6, 9, 2, 4, 5],
}
for what, target in CASES.items():
    accepted, out = accept_greedy(tree, target)
    print(tr("{what}: target {target} -> accepted nodes {accepted}, tokens of the step {out}", what=what,
             target=target, accepted=accepted, out=out))

# %% [markdown] tags=["lang-zh"]
# 第一组一路接受 7、9、4，第 4 个节点上模型要 5，白送：一次前向出了 4 个 token。第二组树根要 8，走进 8 那一支，
# 8 没有孩子，8 这一行的 argmax 2 就是白送的。第三组一个也没接受，树根那一行的 argmax 6 照样出来——和不投机时这一步
# 出的完全一样。注意 `target` 里没被走到的行（比如第一组的 8 那一行）根本没人看。

# %% [markdown] tags=["lang-en"]
# The first case accepts 7, 9 and 4 all the way; at node 4 the model wants 5, the bonus: one forward, 4 tokens. In the
# second the root wants 8, so the walk enters the branch of 8, which has no children, and the argmax on 8's row, 2, is
# the bonus. The third accepts nothing, and the root row's argmax 6 still comes out, exactly the token plain decoding
# would have produced at this step. The rows of `target` that the walk never reaches (the row of 8 in the first case)
# are never looked at.

# %% [markdown] tags=["lang-zh"]
# ## 5. 投机采样：分布不变
#
# 采样的请求不能只比 argmax。`accept_sampled` 按孩子的顺序一个个试：孩子的 token x 以它在当前分布里的概率被接受；
# 没被接受就把 x 从分布里拿掉、剩下的放大，再试下一个；都没被接受就从剩下的里采一个。这样出来的第一个 token 的分布
# 应当就是树根那一行的分布。一个 5 个 token 的小词表，树根有两个孩子 0 和 1，各做 20000 次：

# %% [markdown] tags=["lang-en"]
# ## 5. Speculative sampling: the distribution is kept
#
# A sampled request cannot just compare argmaxes. `accept_sampled` tries the children in order: a child's token x is
# accepted with its probability under the current distribution; if not, x is taken out of the distribution, the rest
# scaled up, and the next child is tried; if none is accepted, one token is sampled from what is left. The first token
# that comes out should then follow the root row's distribution. A vocabulary of 5 tokens, a root with two children 0
# and 1, 20000 draws:

# %%
two = DraftTree(tokens=(0, 1), parents=(-1, -1))
probs = torch.tensor([[0.1, 0.3, 0.4, 0.2, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2, 0.2, 0.2]])
g = torch.Generator().manual_seed(0)
draws = 20000
first = torch.zeros(5)
lengths = torch.zeros(3)
for _ in range(draws):
    accepted, out = accept_sampled(two, probs, g)
    first[out[0]] += 1
    lengths[len(out)] += 1
print(tr("the root row's distribution:   {p}", p=[round(x, 3) for x in probs[0].tolist()]))
print(tr("first token over {n} draws: {f}", n=draws, f=[round(x, 3) for x in (first / draws).tolist()]))
print(tr("draws yielding 1 token: {one:.0f}, 2 tokens: {two:.0f}", one=lengths[1], two=lengths[2]))

# %% [markdown] tags=["lang-zh"]
# 接受 0 的概率是 0.1，接受 1 的是 0.3 ÷ 0.9（0 已经被拿掉）乘以没接受 0 的 0.9，也就是 0.3：所以大约 40% 的时候
# 一次出 2 个 token，其余时候从剩下的 2、3 里采，分布还是原来的。

# %% [markdown] tags=["lang-en"]
# Token 0 is accepted with probability 0.1, token 1 with 0.3 ÷ 0.9 (0 taken out) times the 0.9 of not accepting 0, that
# is 0.3: so about 40% of the draws yield 2 tokens, and the others sample from the remaining 2 and 3, the distribution
# still the original one.

# %% [markdown] tags=["lang-zh"]
# ## 6. 动手调：树的形状和目标模型
#
# 自己写一棵草稿树（`tokens` 和 `parents`，广度优先，兄弟的 token 各不相同）和每个节点上目标模型的 argmax，看掩码、
# 位置和这一步出的 token。先预测再运行：把 `target` 的第一个数改成 8，接受的是哪几个节点？

# %% [markdown] tags=["lang-en"]
# ## 6. Try it: the tree's shape and the target model
#
# Write a draft tree yourself (`tokens` and `parents`, breadth first, siblings carrying distinct tokens) and the target
# model's argmax at every node, and see the mask, the positions and the step's tokens. Predict before running: change
# the first number of `target` to 8; which nodes are accepted?

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def numbers(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(",", " ").split())


def verify_by_hand(tokens: str, parents: str, target: str, root_position: int) -> None:
    draft = DraftTree(numbers(tokens), numbers(parents))
    if len(draft.tokens) != len(draft.parents) or len(numbers(target)) != len(draft) + 1:
        print(tr("tokens and parents need one number per draft token, target one more (the root first)"))
        return
    show_mask(tree_mask(draft), [tr("root")] + [str(t) for t in draft.tokens])
    print(tr("positions: {positions}", positions=tree_positions(draft, root_position).tolist()))
    accepted, out = accept_greedy(draft, list(numbers(target)))
    print(tr("accepted nodes {accepted}; tokens of the step {out} ({n} from one forward)", accepted=accepted, out=out,
             n=len(out)))


explorer = Explorer(
    verify_by_hand,
    title=tr("Verifying a draft tree by hand"),
    tokens=widgets.Text(value="7 8 9 4", description="tokens"),
    parents=widgets.Text(value="-1 -1 0 2", description="parents"),
    target=widgets.Text(value="7 9 2 4 5", description="target"),
    root_position=widgets.IntSlider(value=6, min=0, max=50, description="root_position"),
)
explorer

# %%
# 用几组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with a few sets of values (this checks it without a browser)
explorer.run(tokens="5 6 7 8 9", parents="-1 -1 0 0 1", target="6 2 1 3 4 0")

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 一棵树有 n 个草稿 token，这一步最少出几个 token、最多出几个？
#
# <details><summary>答案</summary>
#
# 最少 1 个（一个也没接受，只有白送的那个），最多是树的最大深度加 1（最深的一条路全被接受，再加白送的）。是一条链时
# 最多 n + 1 个。
# </details>
#
# 2. 两个兄弟的位置相同、槽位不同。为什么槽位不能也相同？
#
# <details><summary>答案</summary>
#
# 槽位是 K/V 写进缓存的地方，两个兄弟各有各的 K/V（token 不同），写在同一个槽位就互相覆盖了。位置只决定 RoPE 怎么
# 转，两个兄弟都是树根之后的第一个 token，位置就该相同。
# </details>
#
# 3. 贪心接受时，为什么树根那一行的 argmax 一定会出现在这一步的输出里？
#
# <details><summary>答案</summary>
#
# 走的第一步就是比较树根的孩子和树根上的 argmax：要么某个孩子等于它（被接受，输出的第一个 token 就是它），要么
# 没有孩子等于它（它就是白送的）。两种情况第一个 token 都是它，和不投机时这一步出的一样。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. A tree has n draft tokens. At least and at most how many tokens does this step yield?
#
# <details><summary>Answer</summary>
#
# At least 1 (nothing accepted, just the bonus); at most the tree's greatest depth plus 1 (the deepest path accepted all
# the way, plus the bonus). For a chain, at most n + 1.
# </details>
#
# 2. Two siblings share a position but not a slot. Why can they not share the slot too?
#
# <details><summary>Answer</summary>
#
# The slot is where the K/V are written in the cache, and each sibling has its own K/V (different tokens): in one slot
# they would overwrite each other. The position only decides how RoPE rotates, and both siblings are the first token
# after the root, so their position should be the same.
# </details>
#
# 3. With greedy acceptance, why does the root row's argmax always appear in the step's output?
#
# <details><summary>Answer</summary>
#
# The walk's first move compares the root's children with the root's argmax: either a child equals it (accepted, and
# the first output token is that one) or none does (it is the bonus). Either way the first token is the root's argmax,
# the same token plain decoding would produce at this step.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage5/spec_tree.py` 里的任务后运行下面这一格（`python -m minisgl.course check spec_tree`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage5/spec_tree.py`, run the cell below (`python -m minisgl.course check spec_tree`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("spec_tree")
