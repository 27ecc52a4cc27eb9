# %% [markdown] tags=["lang-zh"]
# # 第 5.1 章 ngram_cache：起草——n-gram 缓存与起草器接口
#
# 投机解码先便宜地猜几个 token（草稿），再让目标模型一次前向把它们全部验证。本章写“猜”的那一半：
#
# - **草稿树** `DraftTree`：广度优先排好的草稿 token，`parents[i]` 是 token i 的父节点（`-1` 是树根，也就是已经验证过的
#   最后一个 token）；只有一条路时就是一条链；
# - **n-gram 缓存** `NgramCache`：一棵所有请求共用的前缀树，记下见过的每一段 token（提示词和输出都算）。一段序列的
#   最后几个 token（匹配窗口）在树里出现过，它们后面跟过什么，就猜什么；
# - **起草器接口** `Drafter`：投机的主循环（第 5.3 章）只通过 `put`、`propose`、`drop` 问草稿，n-gram 缓存是其中一种。
#
# 这种猜法不要任何训练过的权重，在输出大段重复输入的时候（抄写、改写、编辑给定的文字或代码）最灵。

# %% [markdown] tags=["lang-en"]
# # Chapter 5.1 ngram_cache: drafting — the n-gram cache and the drafter interface
#
# Speculative decoding guesses a few tokens cheaply (the draft), then lets the target model verify all of them in one
# forward. This chapter writes the guessing half:
#
# - the **draft tree** `DraftTree`: draft tokens in breadth-first order, `parents[i]` being token i's parent (`-1` is the
#   root, the last verified token); with a single path it is a chain;
# - the **n-gram cache** `NgramCache`: one prefix tree shared by all requests that records every run of tokens seen
#   (prompts and outputs alike). When the last few tokens of a sequence (the match window) occurred before, what
#   followed them then is the guess;
# - the **drafter interface** `Drafter`: the speculative main loop (chapter 5.3) asks for drafts only through `put`,
#   `propose` and `drop`; the n-gram cache is one drafter.
#
# The guess needs no trained weights, and it works best where the output repeats the input at length (copying,
# rewriting, editing a given text or code).

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
# 本章的任务（和 stage5/ngram_cache.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage5/ngram_cache.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("ngram_cache")

# %% [markdown] tags=["lang-zh"]
# ## 1. 草稿树
#
# 一棵草稿树就是两个元组：`tokens` 和 `parents`，按广度优先排好（父节点总排在孩子前面）。下面这棵树的树根有两个
# 孩子 7 和 8（两种猜法），7 下面接着 9，9 下面接着 4。`depths()` 给出每个草稿 token 离树根多远，第 5.2 章算位置时要用：

# %% [markdown] tags=["lang-en"]
# ## 1. The draft tree
#
# A draft tree is two tuples, `tokens` and `parents`, in breadth-first order (a parent always comes before its
# children). The tree below has two children under the root, 7 and 8 (two guesses); 9 follows 7, and 4 follows 9.
# `depths()` gives how far each draft token is from the root, which chapter 5.2 needs for the positions:

# %%
from minisgl.ngram_cache import DraftTree, NgramCache


def show_draft(draft: DraftTree, label=str) -> None:
    """把草稿树画成缩进的文字：每行是 [下标] token，孩子缩进在父节点下面。

    en: Print a draft tree as indented text: each line is [index] token, children indented under their parent.
    """
    below: dict[int, list[int]] = {}
    for i, parent in enumerate(draft.parents):
        below.setdefault(parent, []).append(i)

    def walk(parent: int, depth: int) -> None:
        for i in below.get(parent, []):
            print("    " * depth + f"└─ [{i}] {label(draft.tokens[i])}")
            walk(i, depth + 1)

    print(tr("(root: the last verified token)"))
    walk(-1, 0)


tree = DraftTree(tokens=(7, 8, 9, 4), parents=(-1, -1, 0, 2))
print(tr("tokens {tokens}, parents {parents}, depths {depths}", tokens=tree.tokens, parents=tree.parents,
         depths=tree.depths()))
show_draft(tree)

# %% [markdown] tags=["lang-zh"]
# ## 2. 写进缓存
#
# `put(tokens, since)` 从每个起点写一条最长 `max_window + branch_length` 个 token 的路径；`since` 之前的起点已经写过，
# 不用再写。为了看得清，这里用很小的参数：窗口最长 2、分支长度 1，每条路径最多 3 个 token。写进 `1 2 3 1 2 4`：

# %% [markdown] tags=["lang-en"]
# ## 2. Writing into the cache
#
# `put(tokens, since)` writes a path of at most `max_window + branch_length` tokens from every start; starts before
# `since` were written already. To keep it readable, tiny settings here: windows of at most 2, a branch length of 1, so
# at most 3 tokens per path. Writing `1 2 3 1 2 4`:

# %%
def show_cache(cache: NgramCache) -> None:
    """把整棵 n-gram 树打印出来：每个节点一行，token 和它最近一次被写到的时间戳。

    en: Print the whole n-gram tree: one line per node, its token and the stamp of its latest write.
    """

    def walk(node, depth: int) -> None:  # noqa: ANN001
        for child in sorted(node.children.values(), key=lambda c: c.token):
            print("    " * depth + tr("{token}  (stamp {stamp})", token=child.token, stamp=child.stamp))
            walk(child, depth + 1)

    walk(cache.root, 0)
    print(tr("{size} nodes besides the root", size=cache.size))


small = NgramCache(min_window=1, max_window=2, branch_length=1, min_breadth=1, max_breadth=2, num_draft=4)
small.put([1, 2, 3, 1, 2, 4])
show_cache(small)

# %% [markdown] tags=["lang-zh"]
# 从每个位置起都有一条路径（越靠后的起点时间戳越新），共用的前缀只存一次：`1 2` 后面跟过 3 也跟过 4，是两个孩子。
# 再多来两个 token `5 1`：只有含新 token 的路径要写，`since` 是上一次的长度 6：

# %% [markdown] tags=["lang-en"]
# Every position starts a path (later starts carry newer stamps), and shared prefixes are stored once: `1 2` was followed
# by 3 and by 4, two children. Two more tokens, `5 1`: only the paths holding a new token need writing, and `since` is
# the previous length, 6:

# %%
small.put([1, 2, 3, 1, 2, 4, 5, 1], since=6)
show_cache(small)

# %% [markdown] tags=["lang-zh"]
# ## 3. 猜
#
# `propose(tokens)` 从最长的窗口试到最短的：`tokens` 的最后几个 token 在树里能一路走下去、走到的节点还有孩子，
# 就从那里广度优先地取草稿，每个节点最多取 `breadth` 个孩子，新近写过的先。`... 5 1` 的最后两个 `5 1` 在树里，
# 可它后面什么也没跟过；退到一个 token 的窗口 `1`，后面跟过 2，2 后面跟过 4 和 3：

# %% [markdown] tags=["lang-en"]
# ## 3. Guessing
#
# `propose(tokens)` tries windows from the longest to the shortest: when the last tokens of `tokens` can be walked down
# the tree and the node reached has children, the draft is taken from there breadth first, at most `breadth` children
# per node, the most recently written first. The last two of `... 5 1`, `5 1`, are in the tree, but nothing ever followed
# them; falling back to the 1-token window `1`, it was followed by 2, and 2 by 4 and 3:

# %%
draft = small.propose([1, 2, 3, 1, 2, 4, 5, 1])
print(draft)
show_draft(draft)

# %% [markdown] tags=["lang-zh"]
# 窗口越长越可信，就越不必多猜几个分支：宽度从最短窗口的 `max_breadth` 线性地收窄到最长窗口的 `min_breadth`。
# 缺省参数（SGLang 的：窗口 1 到 12，宽度 10 到 1）下每个窗口长度的宽度：

# %% [markdown] tags=["lang-en"]
# A longer window is more trustworthy, so fewer branches need guessing: the breadth narrows linearly from `max_breadth`
# at the shortest window to `min_breadth` at the longest. The breadth of each window length under the default settings
# (SGLang's: windows 1 to 12, breadths 10 down to 1):

# %%
default = NgramCache()
for window in range(default.min_window, default.max_window + 1):
    print(tr("window {w:>2}: breadth {b}", w=window, b=default._breadth(window)))

# %% [markdown] tags=["lang-zh"]
# ## 4. 在真的 token 上
#
# 用 SmolLM2 的分词器：提示词要求照抄一段话，回答刚抄了开头几个词。把提示词和回答写进缓存，再问接下来是什么——
# 最长的窗口在提示词里找到了同样的一段，草稿就是那段话接下来的 token，一条链（窗口长，宽度 1）：

# %% [markdown] tags=["lang-en"]
# ## 4. On real tokens
#
# With SmolLM2's tokenizer: the prompt asks to copy a passage, and the answer has just copied its first few words. Write
# the prompt and the answer into the cache and ask what comes next: the longest window finds the same run in the prompt,
# and the draft is that passage's next tokens, a chain (a long window, breadth 1):

# %%
from transformers import AutoTokenizer

from minisgl import model_zoo

tokenizer = AutoTokenizer.from_pretrained(str(model_zoo.smollm2()))
PASSAGE = ("A paged KV cache splits the keys and values of every request into pages of a fixed size. "
           "The page table maps each position of a request to a slot in the pool.")
prompt = tokenizer.encode(f"Copy this text exactly:\n{PASSAGE}\n")
answer = tokenizer.encode("A paged KV cache splits the keys")
cache = NgramCache()
cache.put(prompt + answer)
guess = cache.propose(prompt + answer)
print(tr("{n} prompt tokens, {m} answer tokens so far; the draft has {d} tokens", n=len(prompt), m=len(answer), d=len(guess)))
print(tr("parents: {parents}", parents=guess.parents))
print(tr("the guessed continuation: {text!r}", text=tokenizer.decode(list(guess.tokens))))

# %% [markdown] tags=["lang-zh"]
# 缓存是所有请求共用的：一个请求写进去的，别的请求也能拿来猜（`uid` 不用看）；请求结束时 `drop` 什么也不做，
# 它的 token 留给以后的请求。

# %% [markdown] tags=["lang-en"]
# The cache is shared by all requests: what one request writes, others may guess from (`uid` is ignored); `drop` does
# nothing when a request ends, and its tokens stay for later requests.

# %% [markdown] tags=["lang-zh"]
# ## 5. 容量
#
# 节点数超过 `capacity` 时，最久没被写到的叶子先删，一直删到容量的九成。容量 40、每次写一段 10 个随机 token：

# %% [markdown] tags=["lang-en"]
# ## 5. Capacity
#
# When the tree holds more than `capacity` nodes, the leaves written longest ago go first, down to nine tenths of the
# capacity. A capacity of 40, writing a run of 10 random tokens each time:

# %%
import random

rng = random.Random(0)
bounded = NgramCache(max_window=3, branch_length=2, max_breadth=1, capacity=40, num_draft=4)
runs = [[rng.randrange(100, 999) for _ in range(10)] for _ in range(6)]
for i, run in enumerate(runs):
    bounded.put(run)
    print(tr("after run {i}: {size} nodes", i=i, size=bounded.size))
print(tr("propose after the newest run's first 3 tokens: {tokens}", tokens=bounded.propose(runs[-1][:3]).tokens))
print(tr("propose after the oldest run's first 3 tokens: {tokens}", tokens=bounded.propose(runs[0][:3]).tokens))

# %% [markdown] tags=["lang-zh"]
# ## 6. 动手调：一句话、窗口和宽度
#
# 把一句话按空格切成“token”（每个不同的词一个编号），整句写进缓存，再问这句话之后是什么。先预测：最后三个词
# `sat on the` 出现过几次、后面各跟过什么？最长的窗口匹配上时宽度是 `min_breadth`，调大它看草稿怎么长出分叉；
# 把 `num_draft` 调小，看草稿在哪里截断。

# %% [markdown] tags=["lang-en"]
# ## 6. Try it: a sentence, windows and breadths
#
# Split a sentence at spaces into "tokens" (one number per distinct word), write all of it into the cache and ask what
# follows. Predict first: how often did the last three words `sat on the` occur, and what followed each? When the
# longest window matches, the breadth is `min_breadth`: raise it to see the draft branch; lower `num_draft` to see where
# the draft is cut off.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def guess_words(sentence: str, max_window: int, min_breadth: int, max_breadth: int, num_draft: int) -> None:
    words = sentence.split()
    ids = {w: i for i, w in enumerate(dict.fromkeys(words))}
    name = {i: w for w, i in ids.items()}
    cache = NgramCache(max_window=max_window, min_breadth=min_breadth, max_breadth=max_breadth, num_draft=num_draft)
    tokens = [ids[w] for w in words]
    cache.put(tokens)
    draft = cache.propose(tokens)
    print(tr("{n} words, {d} distinct; {size} nodes in the tree", n=len(words), d=len(ids), size=cache.size))
    if not len(draft):
        print(tr("no guess: the last words never had anything after them"))
        return
    show_draft(draft, label=lambda t: name[t])


explorer = Explorer(
    guess_words,
    title=tr("What the n-gram cache guesses after a sentence"),
    sentence=widgets.Text(value="the cat sat on the mat and the dog sat on the rug and the cat sat on the",
                          description=tr("sentence"), layout={"width": "90%"}),
    max_window=widgets.IntSlider(value=3, min=1, max=6, description="max_window"),
    min_breadth=widgets.IntSlider(value=1, min=1, max=6, description="min_breadth"),
    max_breadth=widgets.IntSlider(value=4, min=1, max=6, description="max_breadth"),
    num_draft=widgets.IntSlider(value=6, min=1, max=12, description="num_draft"),
)
explorer

# %%
# 用几组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with a few sets of values (this checks it without a browser)
explorer.run(max_window=3, min_breadth=1, max_breadth=4, num_draft=6)

# %%
explorer.run(max_window=3, min_breadth=2, max_breadth=4, num_draft=6)

# %% [markdown] tags=["lang-zh"]
# 最后三个词 `sat on the` 之前出现过两次，后面跟过 `mat` 和 `rug`。宽度 1 时只取最近的那个：一条链
# `rug and the cat sat on`，照着第二次出现之后的样子一路猜下去。宽度 2 时两个都取，`rug`（更近）在前，每个分支再往下
# 各长一层，直到凑够 `num_draft` 个。

# %% [markdown] tags=["lang-en"]
# The last three words `sat on the` occurred twice before, followed by `mat` and by `rug`. With breadth 1 only the most
# recent is taken: a chain `rug and the cat sat on`, guessing along what followed the second occurrence. With breadth 2
# both are taken, `rug` (more recent) first, and each branch grows level by level until there are `num_draft` tokens.

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. `max_window = 12`、`branch_length = 18` 时，`put` 从一个起点最多写多少个 token？为什么不只写 `max_window` 个？
#
# <details><summary>答案</summary>
#
# 30 个。窗口只用来找到位置，猜的是窗口后面的 token：路径要比窗口长出 `branch_length`，树里才有可猜的东西。
# </details>
#
# 2. 为什么 `propose` 从最长的窗口试起，而不是最短的？
#
# <details><summary>答案</summary>
#
# 最短的窗口（一个 token）几乎总能匹配，但它后面跟过的东西五花八门；长窗口匹配上了，说明最近好几个 token 都一样，
# 接下来也一样的可能大得多。所以长的优先，而且长窗口的宽度更窄。
# </details>
#
# 3. 删的时候为什么只删叶子？
#
# <details><summary>答案</summary>
#
# 中间的节点是它下面每条路径的前缀，删了它孩子就断了。写一条路径会刷新路上每个节点的时间戳，父节点不会比孩子旧，
# 最旧的总是叶子；叶子删光了的父节点变成新的叶子，接着进候选。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. With `max_window = 12` and `branch_length = 18`, at most how many tokens does `put` write from one start? Why not
#    just `max_window`?
#
# <details><summary>Answer</summary>
#
# 30. The window only finds the place; the guess is the tokens after it, so a path must reach `branch_length` beyond
# the window for the tree to hold anything to guess.
# </details>
#
# 2. Why does `propose` try the longest window first, not the shortest?
#
# <details><summary>Answer</summary>
#
# The shortest window (one token) nearly always matches, but all sorts of things followed it. A long window matching
# means the last several tokens are the same, so what comes next is much more likely to be the same too. Hence longest
# first, and a narrower breadth for long windows.
# </details>
#
# 3. Why does eviction remove leaves only?
#
# <details><summary>Answer</summary>
#
# An inner node is the prefix of every path below it; removing it would cut its children off. Writing a path refreshes
# the stamp of every node on it, so a parent is never older than its children and the oldest node is always a leaf; a
# parent whose leaves are all gone becomes a new leaf and joins the candidates.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage5/ngram_cache.py` 里的任务后运行下面这一格（`python -m minisgl.course check ngram_cache`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage5/ngram_cache.py`, run the cell below (`python -m minisgl.course check ngram_cache`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("ngram_cache")
