# %% [markdown] tags=["lang-zh"]
# # 第 4.6 章 router：数据并行与缓存感知的路由器
#
# 模型放得进一个设备时，扩容最简单的办法是多起几个完整的**副本**（`python -m minisgl --dp 2`），各有自己的调度器、
# KV 缓存和前缀缓存，前面一个**路由器**把请求分给它们。副本之间不通信；分法决定前缀缓存还有没有用：
#
# - 路由器看不见副本里的基数树，只能按“发给谁的文字”给每个副本记一棵**近似的前缀树**（`PrefixTree`，按字符的基数树），
#   太大时按 LRU 删叶子，就像副本自己的缓存也会挤掉旧的前缀；
# - **缓存感知**（`CacheAware`）：匹配的比例超过 `cache_threshold`（0.5）就回到匹配最长的副本，否则去手上请求最少的
#   （一样时树最小的）；**负载不均**（差 > 32 **并且** 最多 > 1.0001 × 最少）时让位给最短队列；
# - 对照的两种：**轮流**（`RoundRobin`）和**最短队列**（`ShortestQueue`），都不看文字。
#
# 这个笔记本先在本进程里搭一棵树、让三种策略对同一串提示词做决定，再起一个 `--dp 2` 的服务，比较轮流与缓存感知在
# 共享前缀的负载上各预填充了多少 token。

# %% [markdown] tags=["lang-en"]
# # Chapter 4.6 router: data parallelism and a cache-aware router
#
# When the model fits one device, the simplest way to scale is to start several whole **replicas**
# (`python -m minisgl --dp 2`), each with its own scheduler, KV cache and prefix cache, and put a **router** in front
# that deals the requests out. The replicas never talk to each other; how the router deals decides whether the prefix
# cache still helps:
#
# - the router cannot see the radix trees inside the replicas, so it keeps per replica an **approximate prefix tree**
#   (`PrefixTree`, a radix tree over characters) of the text it sent there, evicting least recently used leaves when it
#   grows too big, as the replica's own cache pushes old prefixes out;
# - **cache-aware** (`CacheAware`): when the matched share is above `cache_threshold` (0.5), go back to the replica with
#   the longest match, else to the one with the fewest requests in hand (on a tie the smallest tree); when the **load is
#   imbalanced** (difference > 32 **and** most > 1.0001 × fewest) the shortest queue wins;
# - two to compare with: **in turn** (`RoundRobin`) and the **shortest queue** (`ShortestQueue`), both blind to the text.
#
# This notebook first builds a tree and lets the three policies decide on one sequence of prompts, in this process, then
# starts a `--dp 2` service and compares how many prefill tokens round robin and cache-aware compute on a shared-prefix
# workload.

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
# 本章的任务（和 stage4/router.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage4/router.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("router")

# %% [markdown] tags=["lang-zh"]
# ## 1. 一棵按字符的前缀树
#
# 三个提示词：两个共用同一段系统提示词，一个是翻译。插入第二个时，它与第一个在 `"cat?"` 和 `"dog?"` 处分岔，那条边在分岔处
# 拆成两段；第三个与树里什么都不共享，挂成根下一个新叶子。`size` 是树里的字符数，共用的前缀只算一次。
# 每个节点旁边是它最近一次用到的时刻（每插入一次加一的计数器）：

# %% [markdown] tags=["lang-en"]
# ## 1. A prefix tree over characters
#
# Three prompts: two share one system prompt, one is a translation. When the second is inserted it forks from the first
# at `"cat?"` and `"dog?"`, and that edge is split in two at the fork; the third shares nothing with the tree and hangs
# as a new leaf under the root. `size` is the number of characters in the tree, a shared prefix counted once. Next to
# each node is when it was last used (a counter that goes up by one per insert):

# %%
import matplotlib.pyplot as plt

from minisgl.notebook import draw_tree
from minisgl.router import PrefixTree

sys.path.insert(0, str(ROOT / "examples"))
from chapters.router import SYSTEM, TRANSLATE, show_tree  # noqa: E402


def tree_nodes(tree: PrefixTree) -> list[dict]:
    """画图用：每个节点一个框

    en: The tree for draw_tree: one box per node, its edge text (shortened) and last_used
    """
    nodes = [{"id": 0, "parent": None, "label": tr("(root)")}]

    def walk(node, parent_id: int) -> None:
        for child in sorted(node.children.values(), key=lambda n: n.text):
            text = child.text if len(child.text) <= 18 else child.text[:8] + "…" + child.text[-8:]
            nodes.append({"id": len(nodes), "parent": parent_id, "label": f"{text!r}\nt={child.last_used}",
                          "color": "#d9ead3" if not child.children else "#fff2cc"})
            walk(child, len(nodes) - 1)

    walk(tree.root, 0)
    return nodes


tree = PrefixTree()
snapshots = []
for text in (SYSTEM + "What is a cat?", SYSTEM + "What is a dog?", TRANSLATE + "good morning"):
    tree.insert(text)
    print(tr("insert {text!r}: the tree holds {size} characters", text=text, size=tree.size))
    snapshots.append((tr("after {n} inserts, size {size}", n=len(snapshots) + 1, size=tree.size), tree_nodes(tree)))
show_tree(tree)
fig, axes = plt.subplots(1, 3, figsize=(13, 3))
for ax, (title, nodes) in zip(axes, snapshots):
    draw_tree(nodes, title=title, ax=ax)
plt.tight_layout()
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 2. 匹配与 LRU
#
# `match` 从根往下走，整条边相同才往下，中途分岔就停；它不改树。匹配的字符数 ÷ 文字长度就是缓存感知拿去和 0.5 比的比例：
# 共用系统提示词的新问题能匹配上一大半，与翻译只共用开头的新句子也是，随便一句话则是 0。

# %% [markdown] tags=["lang-en"]
# ## 2. Matching and LRU
#
# `match` walks down from the root, going on only when a whole edge matches and stopping at a fork midway; it changes
# nothing. The matched characters ÷ the text's length is the share cache-aware compares with 0.5: a new question
# sharing the system prompt matches most of its text, so does a new sentence for the translator, and an unrelated line
# matches 0.

# %%
for query in (SYSTEM + "What is a cow?", SYSTEM + "Tell me a joke.", TRANSLATE + "good night", "Hello there"):
    n = tree.match(query)
    print(tr("match {text!r}: {n} of {total} characters ({share:.2f}; above 0.5: {above})", text=query, n=n,
             total=len(query), share=n / len(query), above=n / len(query) > 0.5))

# %% [markdown] tags=["lang-zh"]
# 再插入一次 cat 那个问题：系统提示词、`"cat?"` 这条路径的时刻都更新了，`"dog?"` 和翻译那片叶子成了最旧的。
# 删到比现在少 10 个字符：最旧的叶子是 `"dog?"`（时刻 2），比翻译那片（时刻 3）还旧，先删它——只删 4 个不够，
# 接着删下一片最旧的叶子，也就是翻译那片。系统提示词那条边不是叶子，只要它下面还有孩子就删不掉：

# %% [markdown] tags=["lang-en"]
# Insert the cat question again: the times along the system prompt and `"cat?"` are updated, and `"dog?"` and the
# translation leaf are now the oldest. Evict down to 10 characters fewer than now: the oldest leaf is `"dog?"` (time 2),
# older than the translation (time 3), so `"dog?"` goes first — 4 characters are not enough, so the next oldest leaf goes
# too. The system prompt's edge is not a leaf and cannot go while it has children below it:

# %%
tree.insert(SYSTEM + "What is a cat?")
limit = tree.size - 10
removed = tree.evict(limit)
print(tr("evict down to {limit} characters: removed {removed}, {size} left", limit=limit, removed=removed, size=tree.size))
show_tree(tree)
draw_tree(tree_nodes(tree), title=tr("after evicting: size {size}", size=tree.size))
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 3. 三种策略，同一串提示词
#
# 下面每一行是一个请求（A、B 是两段不同的开头）和它到来时两个副本手上的请求数。三种策略各挑一个副本：轮流不看任何东西，
# 最短队列只看负载，缓存感知先看负载均不均，再看匹配的比例。注意最后两行：负载 `{0: 20, 1: 0}` 差 20，不算不均，
# 缓存感知仍回到有 A 的副本 0；`{0: 40, 1: 3}` 差 37，不均，它让位给最短队列：

# %% [markdown] tags=["lang-en"]
# Each line below is a request (A and B are two different starts) with the requests the two replicas have in hand when it
# arrives. The three policies each pick a replica: in turn looks at nothing, the shortest queue at the load only, and
# cache-aware first at whether the load is balanced, then at the matched share. Note the last two lines: loads
# `{0: 20, 1: 0}` differ by 20, not imbalanced, so cache-aware still goes back to replica 0, which has A; `{0: 40, 1: 3}`
# differ by 37, imbalanced, and it gives way to the shortest queue:

# %%
from chapters.router import policy_demo  # noqa: E402

picks = policy_demo()

# %% [markdown] tags=["lang-zh"]
# 不均的判断要两道门槛都严格超过。几组负载（缺省门槛 32 和 1.0001，以及把相对门槛调到 1.5）：

# %% [markdown] tags=["lang-en"]
# Imbalance needs both thresholds strictly exceeded. A few loads (the default thresholds 32 and 1.0001, and with the
# relative threshold raised to 1.5):

# %%
from minisgl.router import is_imbalanced

for loads in ([40, 8], [41, 8], [3, 0], [1000, 960], [1000, 600]):
    print(tr("loads {loads}: difference {diff}; imbalanced with (32, 1.0001): {default}; with (32, 1.5): {strict}",
             loads=loads, diff=max(loads) - min(loads), default=is_imbalanced(loads, 32, 1.0001),
             strict=is_imbalanced(loads, 32, 1.5)))

# %% [markdown] tags=["lang-zh"]
# ## 4. 动手调：负载与门槛
#
# 副本 0 已经缓存着 A（发过一个 A 开头的请求），副本 1 缓存着 B。现在又来一个 A 开头的请求：拖动两个副本手上的请求数
# 和两道门槛，看缓存感知在什么时候回到副本 0、什么时候让位给最短队列。

# %% [markdown] tags=["lang-en"]
# Replica 0 already caches A (a request starting with A was sent there), replica 1 caches B. Now another request
# starting with A arrives: move the requests each replica has in hand and the two thresholds, and see when cache-aware
# goes back to replica 0 and when it gives way to the shortest queue.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer
from minisgl.router import CacheAware


def decide(load0: int, load1: int, abs_threshold: int, rel_threshold: float) -> None:
    policy = CacheAware(2, balance_abs_threshold=abs_threshold, balance_rel_threshold=rel_threshold)
    policy.choose(SYSTEM + "What is a cat?", {0: 0, 1: 0})
    policy.choose(TRANSLATE + "good morning", {0: 0, 1: 0})
    text = SYSTEM + "What is a dog?"
    loads = {0: load0, 1: load1}
    share = policy.trees[0].match(text) / len(text)
    unbalanced = is_imbalanced(loads.values(), abs_threshold, rel_threshold)
    chosen = policy.choose(text, loads)
    print(tr("loads {loads}, thresholds ({abs_t}, {rel_t}): imbalanced {unbalanced}; matched share on replica 0 {share:.2f}",
             loads=loads, abs_t=abs_threshold, rel_t=rel_threshold, unbalanced=unbalanced, share=share))
    print(tr("cache_aware sends it to replica {r}", r=chosen))


explorer = Explorer(
    decide,
    title=tr("Cache-aware: loads and thresholds"),
    load0=widgets.IntSlider(value=20, min=0, max=100, description=tr("load 0")),
    load1=widgets.IntSlider(value=0, min=0, max=100, description=tr("load 1")),
    abs_threshold=widgets.IntSlider(value=32, min=0, max=64, description="abs"),
    rel_threshold=widgets.FloatSlider(value=1.0001, min=1.0, max=3.0, step=0.05, description="rel"),
)
explorer

# %%
# 用几组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with a few sets of values (this checks it without a browser)
explorer.run(load0=40, load1=0)

# %%
explorer.run(load0=40, load1=30, abs_threshold=5, rel_threshold=1.5)

# %% [markdown] tags=["lang-zh"]
# ## 5. 端到端：两个副本，轮流对缓存感知
#
# 现在起一个真的 `--dp 2`（tiny Qwen3，两个副本，缺省的缓存感知），再在**同样两个副本**前面单独起一个轮流的路由器
# （`python -m minisgl.server.dp_router --worker-urls … --router-policy round_robin`）。两边各发一组形状相同的共享前缀负载：
# 3 段约 500 字符的前缀，每段 3 条短尾巴，一个接一个地发（前缀 0、1、2、0、1、2……），每个生成 6 个 token。
# 两组的前缀互不相同（`alpha`、`beta`），谁也沾不到谁的缓存。每个请求去了哪个副本，看路由器的计数器
# `minisgl_router_requests_routed_total{replica}` 哪个动了；预填充和命中看副本自己的计数器（路由器的 `/metrics` 给每条加上
# `replica` 标签）。这一格要起三个进程，半分钟左右：

# %% [markdown] tags=["lang-en"]
# Now a real `--dp 2` (tiny Qwen3, two replicas, cache-aware by default), and a round-robin router started alone in front
# of **the same two replicas** (`python -m minisgl.server.dp_router --worker-urls … --router-policy round_robin`). Each gets
# one shared-prefix workload of the same shape: 3 prefixes of about 500 characters with 3 short tails each, sent one
# after another (prefix 0, 1, 2, 0, 1, 2, ...), 6 tokens generated each. The two sets have different prefixes (`alpha`,
# `beta`), so neither profits from the other's cache. Which replica each request went to shows in whose router counter
# `minisgl_router_requests_routed_total{replica}` moved; prefill and hits in the replicas' own counters (the router's
# `/metrics` adds a `replica` label to each). This cell starts three processes and takes about half a minute:

# %%
from chapters.router import end_to_end  # noqa: E402

runs = end_to_end()

# %% [markdown] tags=["lang-zh"]
# 轮流时每段前缀都落到了两个副本上（`[0, 1, 0]`、`[1, 0, 1]`），每个副本都要把它预填充一遍；缓存感知时同一段前缀的
# 三个请求都去同一个副本：第一个 `beta` 前缀去副本 0，第二个去树还空着的副本 1，第三个两棵树一样大，回到编号小的副本 0。
# 下图是两个副本各算了多少预填充 token、命中多少：

# %% [markdown] tags=["lang-en"]
# In turn, every prefix landed on both replicas (`[0, 1, 0]`, `[1, 0, 1]`), and each replica had to prefill it; with
# cache-aware the three requests of a prefix all went to the same replica: the first `beta` prefix to replica 0, the
# second to replica 1, whose tree was still empty, the third, with both trees the same size, back to the lower number,
# replica 0. The plot shows the prefill tokens each replica computed and the tokens it hit:

# %%
fig, ax = plt.subplots(figsize=(7, 2.8))
labels, computed, hit = [], [], []
for policy, run in runs.items():
    for r in sorted(run["prefill"]):
        labels.append(f"{policy}\n" + tr("replica {r}", r=r))
        computed.append(run["prefill"][r])
        hit.append(run["hits"].get(r, 0))
ax.bar(labels, computed, color="#6fa8dc", label=tr("prefill tokens computed"))
ax.bar(labels, hit, bottom=computed, color="#b6d7a8", label=tr("prefix-cache hit tokens"))
ax.set_ylabel(tr("tokens (prefill computed + cache hits)"))
ax.set_title(tr("The same shape of workload, two replicas"))
ax.set_ylim(0, 1.4 * max(c + h for c, h in zip(computed, hit)))
ax.legend(ncol=2, loc="upper center")
plt.tight_layout()
plt.show()

# %% [markdown] tags=["lang-zh"]
# 两种路由的回答一样（上面“回答相同”那一行）：每个副本都有整个模型，路由只影响算多少，不影响算出什么。在这台 2 核的
# 机器上两个副本各只有一个核，所以 `--dp 2` 不会更快；GPU 上每个副本有自己的卡，少算的预填充就直接变成吞吐。

# %% [markdown] tags=["lang-en"]
# The two routings give the same answers (the "same answers" line above): every replica has the whole model, so routing
# changes how much is computed, not what. On this 2-core machine the two replicas have one core each, so `--dp 2` is not
# faster; on GPUs, with a device per replica, the prefill not computed turns straight into throughput.

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 两个空闲的副本、两棵空树，缓存感知依次收到 A 开头和 B 开头的请求，各去哪里？
#
# <details><summary>答案</summary>
#
# A 去副本 0（都匹配 0、负载一样、树一样大，挑编号小的）；B 与副本 0 的树匹配 0，负载一样，副本 1 的树更小，去副本 1。
# </details>
#
# 2. 负载 `{0: 40, 1: 8}` 用缺省门槛算不算不均？
#
# <details><summary>答案</summary>
#
# 不算：差正好是 32，门槛是严格大于。`{0: 41, 1: 8}` 才算。
# </details>
#
# 3. 为什么 `evict` 只删叶子？
#
# <details><summary>答案</summary>
#
# 内部节点的文字是它下面每段文字的前缀，删了它孩子就断了。插入时整条路径都记为此刻用过，父节点从不比孩子旧，
# 最旧的节点一定是叶子；孩子删光的父节点成了新叶子，再排进候选。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. Two idle replicas, two empty trees; cache-aware receives a request starting with A, then one starting with B. Where
#    does each go?
#
# <details><summary>Answer</summary>
#
# A goes to replica 0 (both match 0, equal loads, equal trees, so the lower number); B matches 0 in replica 0's tree,
# the loads are equal, and replica 1's tree is smaller, so replica 1.
# </details>
#
# 2. Are loads `{0: 40, 1: 8}` imbalanced with the default thresholds?
#
# <details><summary>Answer</summary>
#
# No: the difference is exactly 32, and the threshold is strictly greater. `{0: 41, 1: 8}` is.
# </details>
#
# 3. Why does `evict` remove leaves only?
#
# <details><summary>Answer</summary>
#
# An inner node's text is the prefix of every text below it; remove it and the children are cut off. Inserting marks the
# whole path as used now, so a parent is never older than its children, and the oldest node is always a leaf; a parent
# left without children becomes a new leaf and joins the candidates.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage4/router.py` 里的任务后运行下面这一格（`python -m minisgl.course check router`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage4/router.py`, run the cell below (`python -m minisgl.course check router`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("router")
