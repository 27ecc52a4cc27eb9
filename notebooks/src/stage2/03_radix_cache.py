# %% [markdown]
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
# 本章的任务（和 stage2/radix_cache.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
from minisgl.notebook import show_tasks

show_tasks("radix_cache")

# %% [markdown]
# ## 1. 一棵树的一生：插入、匹配（分裂）、加锁、驱逐
#
# 直接操作前缀缓存，槽位号是编的（A 用 100 起，B 用 200 起）。绿色可驱逐，红色被锁住。

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
    """记下这一刻的树：文字版打印出来，图最后一起画。"""
    snaps.append((title, radix_nodes(cache, tok.decode)))
    print(format_radix(cache, tok.decode), end="\n\n")


a = enc("You are helpful. What is 2 + 2?")
res = cache.insert_prefix(a, torch.arange(100, 100 + len(a), dtype=torch.int32))
print(f"插入 A（{len(a)} 个 token）：插入前已有 {res.cached_len} 个；{cache.size_info}")
snap("① 插入 A")

b = enc("You are helpful. Name a color.")
h = cache.match_prefix(b)
print(f"匹配 B：命中 {h.cached_len} 个 token，槽位 {h.get_matched_indices().tolist()}（节点被一分为二）")
snap("② 匹配 B：分裂节点")

slots_b = torch.cat([h.get_matched_indices(), torch.arange(200, 200 + len(b) - h.cached_len, dtype=torch.int32)])
res = cache.insert_prefix(b, slots_b)
cache.lock_handle(res.handle)
print(f"插入 B 并锁住：插入前已有 {res.cached_len} 个；{cache.size_info}")
snap("③ 插入 B 并加锁（B 还在用）")

freed = cache.evict(3)
print(f"驱逐至少 3 个 token：还回槽位 {freed.tolist()}（A 的后半段，整个叶子）；{cache.size_info}")
snap("④ 驱逐：只能动没上锁的叶子")
cache.check_integrity()
draw_radix_steps(snaps)
plt.show()

# %% [markdown]
# `page_size > 1` 时只缓存整页，匹配长度也按页向下取整：

# %%
paged = RadixPrefixCache(page_size=5)
res = paged.insert_prefix(a, torch.arange(100, 100 + len(a), dtype=torch.int32))
print(f"A 有 {len(a)} 个 token，page_size=5 时只插入整页的 {res.handle.cached_len} 个")
print(f"B 与 A 共有 {h.cached_len} 个 token 的前缀，不满一页，page_size=5 时命中 {paged.match_prefix(b).cached_len} 个")

# %% [markdown]
# ## 2. 里程碑的实验：共享系统提示词
#
# 4 个提示词共用系统提示词 `"You are a helpful assistant. Answer concisely and accurately. " * 4`，
# 先单独跑第一个，再一起跑后三个，`max_tokens=4`。数一数预填充一共算了多少 token。
# 分词器与真 Qwen3 完全一致，所以 token 数就是真实的：提示词共 231 个 token，`naive` 全部要算，`radix` 只算 73 个。
# 这里用小 Qwen3 跑，只看机制（里程碑用 0.6B 形状的模型）。

# %%
from minisgl.core import SamplingParams
from minisgl.model_zoo import tiny_qwen3
from minisgl.notebook import StepRecorder, draw_page_usage, page_usage
from minisgl.radix_cache import LLM

TINY = str(tiny_qwen3())
SYSTEM = "You are a helpful assistant. Answer concisely and accurately. " * 4
QUESTIONS = ["What is 2 + 2?", "Name a primary color.", "What is the capital of Japan?", "Spell cat."]
print("每个提示词的 token 数：", [len(tok.encode(SYSTEM + q)) for q in QUESTIONS])


def shared_prefix(cache_type: str, page_size: int, show_tree: bool = False):
    llm = LLM(TINY, dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512,
              cache_type=cache_type, page_size=page_size)  # fmt: skip
    rec = StepRecorder(llm, after=page_usage)
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    llm.generate([SYSTEM + QUESTIONS[0]], sp)
    first = rec.prefill_tokens
    llm.generate([SYSTEM + q for q in QUESTIONS[1:]], sp)
    print(f"cache_type={cache_type!r} page_size={page_size}：预填充计算 {rec.prefill_tokens} 个 token（第一个 {first}，后三个 {rec.prefill_tokens - first}）")
    if show_tree and cache_type == "radix":
        print(format_radix(llm.cache_manager.prefix_cache, tok.decode))
        draw_radix_steps([("后三个请求跑完后的基数树", radix_nodes(llm.cache_manager.prefix_cache, tok.decode, width=22))], cols=1)
    return llm, rec


for ct in ["naive", "radix"]:
    llm, rec = shared_prefix(ct, 1, show_tree=True)
plt.show()

# %% [markdown]
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

# %%
OTHER = "You are a pirate. Answer every question like a pirate would. " * 4
llm = LLM(TINY, dtype=torch.float32, max_running_req=8, num_page_override=200, max_seq_len_override=512, cache_type="radix")
rec = StepRecorder(llm, after=page_usage)
sp = SamplingParams(max_tokens=4, ignore_eos=True)
for label, prompts in [("第一轮", [SYSTEM + QUESTIONS[0]]), ("第二轮", [SYSTEM + q for q in QUESTIONS[1:]]), ("第三轮", [OTHER + q for q in QUESTIONS])]:
    before = rec.prefill_tokens
    llm.generate(prompts, sp)
    print(f"{label}：{len(prompts)} 个请求，预填充计算 {rec.prefill_tokens - before} 个 token；之后的页面 {page_usage(llm)}")
still = llm.cache_manager.prefix_cache.match_prefix(torch.tensor(llm.tokenizer.encode(SYSTEM + QUESTIONS[1]), dtype=torch.int32)).cached_len
print(f"第三轮之后，第一段系统提示词的请求还能命中 {still} 个 token：只剩两段系统提示词共有的开头，其余被驱逐了，给海盗腾地方")
draw_page_usage([s["after"] for s in rec.steps], 200, title="每步之后的 200 页")
plt.show()

# %% [markdown]
# ## 4. 动手调：cache_type 和 page_size
#
# `page_size` 越大，只能复用整页，省下的越少。

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def explore(cache_type: str, page_size: int) -> None:
    llm, rec = shared_prefix(cache_type, page_size, show_tree=True)
    print("结束后的页面：", page_usage(llm))
    llm.shutdown()


explorer = Explorer(
    explore,
    title="前缀复用",
    cache_type=widgets.ToggleButtons(options=["radix", "naive"], value="radix", description="cache_type"),
    page_size=widgets.SelectionSlider(options=[1, 2, 4, 8, 16], value=1, description="page_size"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
explorer.run(cache_type="radix", page_size=16)

# %% [markdown]
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

# %% [markdown]
# ## 检查你的代码
#
# 写完 `stage2/radix_cache.py` 里的任务后运行下面这一格（`python -m minisgl.course check radix_cache`）。

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("radix_cache")
