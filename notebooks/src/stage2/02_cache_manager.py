# %% [markdown] tags=["lang-zh"]
# # 第 2.2 章 cache_manager：按需分配 KV 页面
#
# 第 2.1 章给每个请求槽静态分了一段页面：短请求用不完，长请求又借不到别人的。`CacheManager` 改成：
#
# - **按需分配**：每一步只给这一步要写的位置 `[cached_len, device_len)` 补齐页面（整页地分）；
# - **回收**：请求一结束，它的页面回到空闲池；
# - **准入时预留**：运行中的请求将来还要的页面先留着，剩下的放得下新请求才接纳，否则它先等着——
#   不会死锁，运行中的请求总能跑完并释放页面；
# - **前缀缓存接口**：缓存管理器通过一个前缀缓存对象决定哪些页面可以复用；本章的 `naive` 缓存什么都不缓存；
# - **完整性检查**：空闲时，空闲页 + 缓存里的页 == 总页数，而且没有残留的锁。

# %% [markdown] tags=["lang-en"]
# # Chapter 2.2 cache_manager: allocating KV pages on demand
#
# Chapter 2.1 statically gave each request slot a range of pages: short requests do not use them up, and long ones cannot
# borrow from others. `CacheManager` changes that to:
#
# - **allocation on demand**: each step gives pages (whole pages) only for the positions written in this step, `[cached_len, device_len)`;
# - **reclaiming**: as soon as a request finishes, its pages go back to the free pool;
# - **reservation at admission**: the pages that running requests will still need are set aside, and a new request is
#   admitted only if it fits in what is left, otherwise it waits — no deadlock: the running requests can always finish and free their pages;
# - **prefix cache interface**: the cache manager asks a prefix cache object which pages can be reused; this chapter's `naive` cache caches nothing;
# - **integrity check**: when idle, free pages + pages in the cache == total pages, and no locks are left over.

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
# 本章的任务（和 stage2/cache_manager.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage2/cache_manager.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("cache_manager")

# %% [markdown] tags=["lang-zh"]
# ## 1. 页面随请求来去
#
# 小 Qwen3、`page_size = 4`、64 页。6 个请求（提示词 5～12 个 token，各生成 8 个），最多同时跑 3 个。
# `StepRecorder` 监听每一步（`llm.add_step_listener`），在这一步的结果处理完之后记下页面账：运行中的请求占着的、空闲的。
# 请求一结束，它的页马上回到空闲池。

# %% [markdown] tags=["lang-en"]
# ## 1. Pages come and go with requests
#
# Tiny Qwen3, `page_size = 4`, 64 pages. 6 requests (prompts of 5 to 12 tokens, 8 generated tokens each), at most 3 running at once.
# `StepRecorder` listens to every step (`llm.add_step_listener`) and, once the step's results are processed, records the
# page accounts: pages held by running requests, and free pages.
# As soon as a request finishes, its pages return to the free pool.

# %%
import warnings

import matplotlib.pyplot as plt
import torch

from minisgl.cache_manager import PARTS
from minisgl.scheduler import Scheduler
from minisgl.core import SamplingParams
from minisgl.model_zoo import tiny_qwen3
from minisgl.notebook import StepRecorder, draw_page_usage, draw_steps, page_usage

TINY = str(tiny_qwen3())
PROMPTS = [list(range(1000, 1000 + n)) for n in (5, 12, 7, 9, 6, 11)]


def run(num_pages: int, page_size: int, max_running_req: int, max_tokens: int = 8, show: bool = True):
    llm = Scheduler(TINY, parts=PARTS, dtype=torch.float32, max_running_req=max_running_req, num_page_override=num_pages,
              max_seq_len_override=64, page_size=page_size)  # fmt: skip
    rec = StepRecorder(llm, after=page_usage)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            llm.generate(PROMPTS, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        for w in caught:
            print(tr("warning:"), w.message)
    except ValueError as err:
        print(tr("ValueError:"), err)
        return None
    peak = max(s["pages_in_use"] for s in rec.steps)  # 准备好每一步时占用的页（步与步之间的最高点） | en: pages in use once each step is prepared (the peak between steps)
    print(tr("num_pages={num_pages} page_size={page_size} max_running_req={max_running_req}: {summary}; at most {peak} pages in use at once", num_pages=num_pages, page_size=page_size, max_running_req=max_running_req, summary=rec.summary(), peak=peak))
    print(tr("requests running at each step:"), [len(s["reqs"]) for s in rec.steps])
    print(tr("after the run: {usage} → all returned", usage=page_usage(llm)))
    if show:
        draw_steps(rec.steps, title=tr("Batch of each step"))
        draw_page_usage([s["after"] for s in rec.steps], num_pages, title=tr("Pages after each step"))
    llm.shutdown()
    return rec


run(num_pages=64, page_size=4, max_running_req=3)
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 2. 内存紧张时，准入会等
#
# 只给 12 页（48 个槽位）。每个请求需要 `ceil((提示词 + 8) / 4)` 页，预留不下就先等着，
# 即使还有空的请求槽。等得多了，每步批次变小、步数变多——但所有请求都能完成，页面也都回来了。

# %% [markdown] tags=["lang-en"]
# ## 2. When memory is tight, admission waits
#
# Only 12 pages (48 slots). Each request needs `ceil((prompt + 8) / 4)` pages; if they cannot be reserved, it waits, even
# if a request slot is empty. The more waiting, the smaller each step's batch and the more steps — but every request
# completes, and all the pages come back.

# %%
run(num_pages=12, page_size=4, max_running_req=3)
plt.show()

# %% [markdown] tags=["lang-zh"]
# 一个请求再怎么等也放不下时（提示词加输出超过了 KV 池能放的 token 数），提交时就报错，而不是永远等下去：

# %% [markdown] tags=["lang-en"]
# When a request can never fit, however long it waits (prompt plus output exceed the tokens the KV pool can hold), it is an error at submission, not an endless wait:

# %%
run(num_pages=3, page_size=4, max_running_req=3)

# %% [markdown] tags=["lang-zh"]
# ## 3. 页表里的一行：分到的页不连续
#
# 按需分配时，请求每长到新的一页，就从空闲池头部取一页。几个请求交替生长，它们的页就交错在一起。
# 手工走几步，看第 0 行的页表。

# %% [markdown] tags=["lang-en"]
# ## 3. A row of the page table: the pages are not contiguous
#
# With allocation on demand, each time a request grows into a new page it takes one from the head of the free pool. When
# several requests grow in turns, their pages interleave. Take a few steps by hand and look at row 0 of the page table.

# %%
from minisgl.notebook import draw_page_table

llm = Scheduler(TINY, parts=PARTS, dtype=torch.float32, max_running_req=2, num_page_override=16, max_seq_len_override=32, page_size=2)
for p in PROMPTS[:2]:
    llm.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True))
for _ in range(4):
    llm.step()
reqs = list(llm.decode_manager.running_reqs)
for r in reqs:
    row = llm.page_table[r.table_idx, : r.cached_len]
    print(tr("request {uid} (row {table_idx}) has {cached_len} cached tokens: slots {slots} → pages {pages}", uid=r.uid, table_idx=r.table_idx, cached_len=r.cached_len, slots=row.tolist(), pages=list(dict.fromkeys((row // 2).tolist()))))
draw_page_table(llm.page_table, [r.table_idx for r in reqs], max(r.cached_len for r in reqs), 2, lengths=[r.cached_len for r in reqs],
                title=tr("Page table after allocation on demand (color = page)"))  # fmt: skip
plt.show()
llm.run_until_idle()
llm.check_integrity()
print(tr("integrity check passed after the run: free pages + cached pages == total pages"))

# %% [markdown] tags=["lang-zh"]
# ## 4. 动手调：页数、page_size、请求槽

# %% [markdown] tags=["lang-en"]
# ## 4. Try it: number of pages, page_size, request slots

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

explorer = Explorer(
    run,
    title=tr("Paging on demand"),
    num_pages=widgets.IntSlider(value=64, min=4, max=96, description=tr("pages")),
    page_size=widgets.SelectionSlider(options=[1, 2, 4, 8], value=4, description="page_size"),
    max_running_req=widgets.IntSlider(value=3, min=1, max=6, description=tr("request slots")),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (this checks it without a browser)
explorer.run(num_pages=20, page_size=2, max_running_req=6)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. `page_size = 4`，请求的 `cached_len = 6`、`device_len = 9`。这一步要新分配几页？
#
# <details><summary>答案</summary>
#
# 已有 `ceil(6/4) = 2` 页，要一直分到 `ceil(9/4) = 3` 页，所以新分配 1 页（第 3 页，放位置 8…11）。
# </details>
#
# 2. 准入时为什么要为运行中的请求“预留”它们将来要的页，而不是只看现在空闲多少？
#
# <details><summary>答案</summary>
#
# 只看现在的空闲页会接纳太多请求；等它们一起往后生成，页面就不够了，谁也跑不完——死锁。
# 预留保证已经接纳的请求一定能跑到 `max_tokens`。
# </details>
#
# 3. 完整性检查为什么要求“没有残留的锁”？
#
# <details><summary>答案</summary>
#
# 空闲时没有请求在用任何前缀。如果还有锁，说明有请求结束时忘了解锁，那段缓存永远不能驱逐——慢性泄漏。
# </details>
#
# 4. `page_size` 变大有什么好处和代价？
#
# <details><summary>答案</summary>
#
# 好处：分配次数少、页表和前缀缓存的节点少，GPU 上的注意力核按页读更高效。代价：每个请求最后一页平均浪费半页；
# 前缀缓存只能按整页复用。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. `page_size = 4`, and a request has `cached_len = 6` and `device_len = 9`. How many new pages does this step allocate?
#
# <details><summary>Answer</summary>
#
# It already has `ceil(6/4) = 2` pages and needs `ceil(9/4) = 3`, so 1 new page (the 3rd, for positions 8…11).
# </details>
#
# 2. At admission, why "reserve" the pages running requests will need later, rather than look only at how many are free now?
#
# <details><summary>Answer</summary>
#
# Looking only at the free pages now admits too many requests; as they all keep generating, the pages run out and none of
# them can finish — a deadlock. Reservation guarantees that every admitted request can run to `max_tokens`.
# </details>
#
# 3. Why does the integrity check require "no locks left over"?
#
# <details><summary>Answer</summary>
#
# When idle, no request is using any prefix. A lock left over means some request forgot to unlock when it finished, and
# that part of the cache can never be evicted — a slow leak.
# </details>
#
# 4. What are the benefits and costs of a larger `page_size`?
#
# <details><summary>Answer</summary>
#
# Benefits: fewer allocations, fewer page table entries and prefix cache nodes, and GPU attention kernels read page by page
# more efficiently. Costs: each request wastes half a page on average in its last page; the prefix cache can reuse only whole pages.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage2/cache_manager.py` 里的任务后运行下面这一格（`python -m minisgl.course check cache_manager`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage2/cache_manager.py`, run the cell below (`python -m minisgl.course check cache_manager`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("cache_manager")
