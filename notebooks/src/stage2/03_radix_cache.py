# %% [markdown] tags=["lang-zh"]
# # 第 2.3 章 radix_cache：Radix 前缀缓存
#
# 很多请求共用同一段开头（系统提示词、多轮对话的历史）。这段前缀的 K/V 算一次就够了：
# 请求预填充完就把算过的 token 和对应的槽位插进一棵基数树（radix tree），后来的请求先在树里找最长的相同前缀，
# 命中的部分直接把槽位写进自己的页表，只算剩下的。
#
# **前缀什么时候进树**：请求预填充之后插入树里并加锁（在处理预填充的结果时；开着重叠调度时晚一个迭代），
# 请求结束时解锁。解锁后它留在树里，可以被后来的请求命中，也可以被驱逐。
#
# - **匹配**：最多匹配到提示词的倒数第二个 token（最后一个总要算，才有 logits）；
# - **插入**：只插整页；已经在树里的部分不重复插入，告诉调用者那段是重复的；
# - **分裂**：只匹配了一个节点的前半段时，把节点一分为二；
# - **引用计数**：请求用着的前缀沿路径加锁，锁着的节点不能驱逐；
# - **驱逐**：空间不够时按最近最少使用（LRU）驱逐没上锁的叶子，整页地还回去。

# %% [markdown] tags=["lang-en"]
# # Chapter 2.3 radix_cache: the radix prefix cache
#
# Many requests start with the same text (a system prompt, the history of a multi-turn conversation). The K/V of such a
# prefix only needs computing once: after its prefill, a request inserts the tokens it computed and their slots into a
# radix tree; a later request first looks for the longest matching prefix in the tree, writes the slots of the hit part
# straight into its own page table, and computes only the rest.
#
# **When a prefix enters the tree**: after its prefill a request inserts it into the tree and locks it (while processing
# the prefill's results; one iteration later with overlap scheduling), and unlocks it when the request finishes. Once
# unlocked it stays in the tree, where later requests can hit it and where it can also be evicted.
#
# - **match**: matches at most up to the second-to-last token of the prompt (the last one must always be computed, to have logits);
# - **insert**: inserts whole pages only; a part already in the tree is not inserted again, and the caller is told that part is a duplicate;
# - **split**: when only the first part of a node matches, the node is split in two;
# - **reference counts**: the prefix a request is using is locked along its path, and locked nodes cannot be evicted;
# - **eviction**: when space runs out, unlocked leaves are evicted least recently used first (LRU), and returned as whole pages.

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
# 本章的任务（和 stage2/radix_cache.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage2/radix_cache.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("radix_cache")

# %% [markdown] tags=["lang-zh"]
# ## 1. 一棵树的一生：插入、匹配（分裂）、加锁、驱逐
#
# 直接操作前缀缓存，槽位号是编的（A 用 100 起，B 用 200 起）。绿色可驱逐，红色被锁住。

# %% [markdown] tags=["lang-en"]
# ## 1. The life of a tree: insert, match (split), lock, evict
#
# We work on the prefix cache directly, with made-up slot numbers (A from 100, B from 200). Green is evictable, red is locked.

# %%
import matplotlib.pyplot as plt
import torch
from transformers import AutoTokenizer

from minisgl.model_zoo import tokenizer_dir
from minisgl.notebook import draw_radix_steps, format_radix, radix_nodes
from minisgl.radix_cache import RadixPrefixCache

tok = AutoTokenizer.from_pretrained(tokenizer_dir())


def enc(text: str) -> torch.Tensor:
    return torch.tensor(tok.encode(text), dtype=torch.int32)


cache = RadixPrefixCache(page_size=1)
snaps = []


def snap(title: str) -> None:
    """记下这一刻的树：文字版打印出来，图最后一起画。

    en: Record the tree as it is now: print the text version, draw all the pictures at the end.
    """
    snaps.append((title, radix_nodes(cache, tok.decode)))
    print(format_radix(cache, tok.decode), end="\n\n")


a = enc("You are helpful. What is 2 + 2?")
res = cache.insert_prefix(a, torch.arange(100, 100 + len(a), dtype=torch.int32))
print(tr("insert A ({n_a} tokens): {cached_len} already there before the insert; {size_info}", n_a=len(a), cached_len=res.cached_len, size_info=cache.size_info))
snap(tr("① insert A"))

b = enc("You are helpful. Name a color.")
h = cache.match_prefix(b)
print(tr("match B: {cached_len} tokens hit, slots {slots} (the node is split in two)", cached_len=h.cached_len, slots=h.get_matched_indices().tolist()))
snap(tr("② match B: split a node"))

slots_b = torch.cat([h.get_matched_indices(), torch.arange(200, 200 + len(b) - h.cached_len, dtype=torch.int32)])
res = cache.insert_prefix(b, slots_b)
cache.lock_handle(res.handle)
print(tr("insert B and lock it: {cached_len} already there before the insert; {size_info}", cached_len=res.cached_len, size_info=cache.size_info))
snap(tr("③ insert B and lock it (B is still running)"))

freed = cache.evict(3)
print(tr("evict at least 3 tokens: slots {freed} returned (the second half of A, a whole leaf); {size_info}", freed=freed.tolist(), size_info=cache.size_info))
snap(tr("④ evict: only unlocked leaves can go"))
cache.check_integrity()
draw_radix_steps(snaps)
plt.show()

# %% [markdown] tags=["lang-zh"]
# `page_size > 1` 时只缓存整页，匹配长度也按页向下取整：

# %% [markdown] tags=["lang-en"]
# With `page_size > 1` only whole pages are cached, and the match length is rounded down to whole pages too:

# %%
paged = RadixPrefixCache(page_size=5)
res = paged.insert_prefix(a, torch.arange(100, 100 + len(a), dtype=torch.int32))
print(tr("A has {n_a} tokens; with page_size=5 only whole pages are inserted: {cached_len} tokens", n_a=len(a), cached_len=res.handle.cached_len))
print(tr("B and A share a prefix of {cached_len} tokens, less than a page; with page_size=5 the match is {hit} tokens", cached_len=h.cached_len, hit=paged.match_prefix(b).cached_len))

# %% [markdown] tags=["lang-zh"]
# ## 2. 里程碑的实验：共享系统提示词
#
# 4 个提示词共用系统提示词 `"You are a helpful assistant. Answer concisely and accurately. " * 4`，
# 先单独跑第一个，再一起跑后三个，`max_tokens=4`。数一数预填充一共算了多少 token。
# 分词器与真 Qwen3 完全一致，所以 token 数就是真实的：提示词共 231 个 token，`naive` 全部要算，`radix` 只算 73 个。
# 这里用小 Qwen3 跑，只看机制（里程碑用 0.6B 形状的模型）。

# %% [markdown] tags=["lang-en"]
# ## 2. The milestone's experiment: a shared system prompt
#
# 4 prompts share the system prompt `"You are a helpful assistant. Answer concisely and accurately. " * 4`; we run the first
# one alone, then the last three together, with `max_tokens=4`, and count how many tokens prefill computes in total.
# The tokenizer is exactly that of the real Qwen3, so the token counts are real: the prompts have 231 tokens in total,
# `naive` computes them all, `radix` computes only 73.
# Here we run the tiny Qwen3 and look only at the mechanics (the milestone uses a model shaped like the 0.6B).

# %% tags=["random-text"]
from minisgl.core import SamplingParams
from minisgl.model_zoo import tiny_qwen3
from minisgl.notebook import StepRecorder, draw_page_usage, page_usage
from minisgl.radix_cache import PARTS
from minisgl.scheduler import Scheduler

TINY = str(tiny_qwen3())
SYSTEM = "You are a helpful assistant. Answer concisely and accurately. " * 4
QUESTIONS = ["What is 2 + 2?", "Name a primary color.", "What is the capital of Japan?", "Spell cat."]
print(tr("tokens of each prompt:"), [len(tok.encode(SYSTEM + q)) for q in QUESTIONS])


def shared_prefix(cache_type: str, page_size: int, show_tree: bool = False):
    llm = Scheduler(TINY, parts=PARTS, dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512,
              cache_type=cache_type, page_size=page_size)  # fmt: skip
    rec = StepRecorder(llm, after=page_usage)
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    llm.generate([SYSTEM + QUESTIONS[0]], sp)
    first = rec.prefill_tokens
    llm.generate([SYSTEM + q for q in QUESTIONS[1:]], sp)
    print(tr("cache_type={cache_type!r} page_size={page_size}: prefill computed {prefill_tokens} tokens (first request {first}, last three {rest})", cache_type=cache_type, page_size=page_size, prefill_tokens=rec.prefill_tokens, first=first, rest=rec.prefill_tokens - first))
    if show_tree and cache_type == "radix":
        print(format_radix(llm.cache_manager.prefix_cache, tok.decode))
        draw_radix_steps([(tr("The radix tree after the last three requests"), radix_nodes(llm.cache_manager.prefix_cache, tok.decode, width=22))], cols=1)
    return llm, rec


for ct in ["naive", "radix"]:
    llm, rec = shared_prefix(ct, 1, show_tree=True)
plt.show()

# %% [markdown] tags=["lang-zh"]
# 为什么是 73 而不是“只算 4 个问题”？共享的前缀结束在空格之前：BPE 把空格并进了每个问题的第一个词
# （`" What"`、`" Name"`……），所以树在那里分叉；而 `" What is"` 又被两个问题共享，再省一点。
# 后三个请求分别省下 52、54、52 个 token，一共 158 个：231 − 158 = 73。
#
# 常见的误读是把 158 当成“共享的系统提示词有 158 个 token”。不是：158 是后三个请求**一共省下**的 token 数。
# 共享的前缀只有 52 个 token（系统提示词去掉末尾的空格），后三个请求各复用这 52 个；请求 3 又和请求 1
# 一样以 `" What is"` 开头，多复用 2 个：52 + 54 + 52 = 158。
#
# ## 3. 页面随时间：请求占用、锁住、可驱逐、空闲
#
# 只给 200 页，跑三轮：第一个问题；后三个问题；再换一段系统提示词问四个问题。
# 请求预填充之后，它算过的部分就插进树里并被它自己锁住（红）；请求结束时解锁，留在树里可驱逐（绿）；
# 第三轮空闲页不够时，旧的前缀按 LRU 被驱逐。第三轮的 4 个请求放不下，第 4 个等前 3 个跑完——那时海盗的前缀已在树里。

# %% [markdown] tags=["lang-en"]
# Why 73 rather than "just the 4 questions"? The shared prefix ends before the space: BPE merges the space into the first
# word of each question (`" What"`, `" Name"`, …), so the tree branches there; and `" What is"` is shared by two of the
# questions, which saves a bit more. The last three requests save 52, 54 and 52 tokens, 158 in total: 231 − 158 = 73.
#
# A common misreading takes 158 as "the shared system prompt has 158 tokens". It does not: 158 is what the last three
# requests **saved in total**. The shared prefix is only 52 tokens (the system prompt without its final space), and each
# of the last three requests reuses those 52; request 3 also starts with `" What is"`, like request 1, and reuses 2 more:
# 52 + 54 + 52 = 158.
#
# ## 3. Pages over time: held by requests, locked, evictable, free
#
# Only 200 pages, three rounds: the first question; the last three questions; then another system prompt with four
# questions. After its prefill, the part a request computed is inserted into the tree and locked by the request itself
# (red); when the request finishes it is unlocked and stays in the tree, evictable (green); in round 3, when free pages
# run short, old prefixes are evicted in LRU order. The 4 requests of round 3 do not all fit: the 4th waits for the first
# 3 to finish — by then the pirate prefix is already in the tree.

# %%
OTHER = "You are a pirate. Answer every question like a pirate would. " * 4
llm = Scheduler(TINY, parts=PARTS, dtype=torch.float32, max_running_req=8, num_page_override=200, max_seq_len_override=512, cache_type="radix")
rec = StepRecorder(llm, after=page_usage)
sp = SamplingParams(max_tokens=4, ignore_eos=True)
for label, prompts in [(tr("round 1"), [SYSTEM + QUESTIONS[0]]), (tr("round 2"), [SYSTEM + q for q in QUESTIONS[1:]]), (tr("round 3"), [OTHER + q for q in QUESTIONS])]:
    before = rec.prefill_tokens
    llm.generate(prompts, sp)
    print(tr("{label}: {n_prompts} request(s), prefill computed {computed} tokens; pages afterwards {usage}", label=label, n_prompts=len(prompts), computed=rec.prefill_tokens - before, usage=page_usage(llm)))
still = llm.cache_manager.prefix_cache.match_prefix(torch.tensor(llm.tokenizer.encode(SYSTEM + QUESTIONS[1]), dtype=torch.int32)).cached_len
print(tr("after round 3, a request with the first system prompt still hits {still} tokens: only the start the two system prompts share is left, the rest was evicted to make room for the pirate", still=still))
draw_page_usage([s["after"] for s in rec.steps], 200, title=tr("The 200 pages after each step"))
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 4. 动手调：cache_type 和 page_size
#
# `page_size` 越大，只能复用整页，省下的越少。

# %% [markdown] tags=["lang-en"]
# ## 4. Try it: cache_type and page_size
#
# The larger `page_size`, the less is saved, since only whole pages can be reused.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def explore(cache_type: str, page_size: int) -> None:
    llm, rec = shared_prefix(cache_type, page_size, show_tree=True)
    print(tr("pages after the run:"), page_usage(llm))
    llm.shutdown()


explorer = Explorer(
    explore,
    title=tr("Prefix reuse"),
    cache_type=widgets.ToggleButtons(options=["radix", "naive"], value="radix", description="cache_type"),
    page_size=widgets.SelectionSlider(options=[1, 2, 4, 8, 16], value=1, description="page_size"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (this checks it without a browser)
explorer.run(cache_type="radix", page_size=16)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 为什么最多只匹配到提示词的倒数第二个 token？
#
# <details><summary>答案</summary>
#
# 请求至少要算一个 token 才有 logits 可以采样（`cached_len < device_len`）。整个提示词都在缓存里时，
# 也要把最后一个 token 重算一遍。
# </details>
#
# 2. 插入时节点的 `value` 为什么要 `clone()`，而不是直接存页表那一行的切片？
#
# <details><summary>答案</summary>
#
# 切片是页表的视图。请求结束后那一行会被别的请求重用、改写，树里存的槽位就跟着变了，指向别人的 K/V。
# </details>
#
# 3. 两个请求带着同样的前缀同时在跑，先结束的那个插入了前缀；后结束的再插入时，它自己那段重复的页怎么办？
#
# <details><summary>答案</summary>
#
# 插入返回“插入前已有的长度”，那一段在树里已经有一份。缓存管理器先把请求的页表改指向树里的槽位，
# 再释放请求自己那份重复的页——顺序反过来，请求接着解码时就会读到已被重新分走的页。
# </details>
#
# 4. 驱逐为什么只挑没上锁的 **叶子**？
#
# <details><summary>答案</summary>
#
# 中间节点是别的（更长的）前缀的一部分，删掉它，下面的节点就接不上根了；锁着的节点正被请求使用。
# 叶子驱逐后父节点可能变成无锁叶子，再成为候选。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. Why does matching stop at most at the second-to-last token of the prompt?
#
# <details><summary>Answer</summary>
#
# A request must compute at least one token to have logits to sample from (`cached_len < device_len`). Even when the whole
# prompt is in the cache, the last token is computed again.
# </details>
#
# 2. When inserting, why must a node's `value` be `clone()`d instead of storing a slice of the page table row directly?
#
# <details><summary>Answer</summary>
#
# The slice is a view of the page table. Once the request finishes, that row is reused and overwritten by another request,
# and the slots stored in the tree would change with it, pointing at someone else's K/V.
# </details>
#
# 3. Two requests with the same prefix are running at the same time; the one that finishes first inserts the prefix. When the other one inserts later, what happens to its own duplicate pages?
#
# <details><summary>Answer</summary>
#
# Insertion returns "the length already there before the insert", and that part already has a copy in the tree. The cache
# manager first points the request's page table at the tree's slots, then frees the request's own duplicate pages — in the
# opposite order, the request would read pages already handed out again when it continues decoding.
# </details>
#
# 4. Why does eviction pick only unlocked **leaves**?
#
# <details><summary>Answer</summary>
#
# An inner node is part of other (longer) prefixes: remove it and the nodes below are cut off from the root; a locked node
# is in use by a request. Once a leaf is evicted, its parent may become an unlocked leaf and a candidate in turn.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage2/radix_cache.py` 里的任务后运行下面这一格（`python -m minisgl.course check radix_cache`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage2/radix_cache.py`, run the cell below (`python -m minisgl.course check radix_cache`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("radix_cache")
