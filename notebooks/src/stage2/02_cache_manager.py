# %% [markdown]
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
# 本章的任务（和 stage2/cache_manager.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
from minisgl.notebook import show_tasks

show_tasks("cache_manager")

# %% [markdown]
# ## 1. 页面随请求来去
#
# 小 Qwen3、`page_size = 4`、64 页。6 个请求（提示词 5～12 个 token，各生成 8 个），最多同时跑 3 个。
# `StepRecorder` 监听每一步（`llm.add_step_listener`），在这一步的结果处理完之后记下页面账：运行中的请求占着的、空闲的。
# 请求一结束，它的页马上回到空闲池。

# %%
import warnings

import matplotlib.pyplot as plt
import torch

from minisgl.cache_manager import LLM
from minisgl.core import SamplingParams
from minisgl.model_zoo import tiny_qwen3
from minisgl.notebook import StepRecorder, draw_page_usage, draw_steps, page_usage

TINY = str(tiny_qwen3())
PROMPTS = [list(range(1000, 1000 + n)) for n in (5, 12, 7, 9, 6, 11)]


def run(num_pages: int, page_size: int, max_running_req: int, max_tokens: int = 8, show: bool = True):
    llm = LLM(TINY, dtype=torch.float32, max_running_req=max_running_req, num_page_override=num_pages,
              max_seq_len_override=64, page_size=page_size)  # fmt: skip
    rec = StepRecorder(llm, after=page_usage)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            llm.generate(PROMPTS, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        for w in caught:
            print("警告：", w.message)
    except ValueError as err:
        print("ValueError：", err)
        return None
    peak = max(s["pages_in_use"] for s in rec.steps)  # 准备好每一步时占用的页（步与步之间的最高点）
    print(f"num_pages={num_pages} page_size={page_size} max_running_req={max_running_req}：{rec.summary()}；最多同时占用 {peak} 页")
    print("每步运行的请求数：", [len(s["reqs"]) for s in rec.steps])
    print("结束后：", page_usage(llm), "→ 全部归还")
    if show:
        draw_steps(rec.steps, title="每步的批次组成")
        draw_page_usage([s["after"] for s in rec.steps], num_pages, title="每步之后的页面")
    llm.shutdown()
    return rec


run(num_pages=64, page_size=4, max_running_req=3)
plt.show()

# %% [markdown]
# ## 2. 内存紧张时，准入会等
#
# 只给 12 页（48 个槽位）。每个请求需要 `ceil((提示词 + 8) / 4)` 页，预留不下就先等着，
# 即使还有空的请求槽。等得多了，每步批次变小、步数变多——但所有请求都能完成，页面也都回来了。

# %%
run(num_pages=12, page_size=4, max_running_req=3)
plt.show()

# %% [markdown]
# 一个请求再怎么等也放不下时（提示词加输出超过了 KV 池能放的 token 数），提交时就报错，而不是永远等下去：

# %%
run(num_pages=3, page_size=4, max_running_req=3)

# %% [markdown]
# ## 3. 页表里的一行：分到的页不连续
#
# 按需分配时，请求每长到新的一页，就从空闲池头部取一页。几个请求交替生长，它们的页就交错在一起。
# 手工走几步，看第 0 行的页表。

# %%
from minisgl.notebook import draw_page_table

llm = LLM(TINY, dtype=torch.float32, max_running_req=2, num_page_override=16, max_seq_len_override=32, page_size=2)
for p in PROMPTS[:2]:
    llm.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True))
for _ in range(4):
    llm.step()
reqs = list(llm.decode_manager.running_reqs)
for r in reqs:
    row = llm.page_table[r.table_idx, : r.cached_len]
    print(f"请求 {r.uid}（第 {r.table_idx} 行）已缓存 {r.cached_len} 个 token：槽位 {row.tolist()} → 页 {list(dict.fromkeys((row // 2).tolist()))}")
draw_page_table(llm.page_table, [r.table_idx for r in reqs], max(r.cached_len for r in reqs), 2, lengths=[r.cached_len for r in reqs],
                title="按需分配后的页表（颜色 = 页号）")  # fmt: skip
plt.show()
llm.run_until_idle()
llm.check_integrity()
print("跑完后完整性检查通过：空闲页 + 缓存页 == 总页数")

# %% [markdown]
# ## 4. 动手调：页数、page_size、请求槽

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

explorer = Explorer(
    run,
    title="按需分页",
    num_pages=widgets.IntSlider(value=64, min=4, max=96, description="页数"),
    page_size=widgets.SelectionSlider(options=[1, 2, 4, 8], value=4, description="page_size"),
    max_running_req=widgets.IntSlider(value=3, min=1, max=6, description="请求槽"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
explorer.run(num_pages=20, page_size=2, max_running_req=6)

# %% [markdown]
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

# %% [markdown]
# ## 检查你的代码
#
# 写完 `stage2/cache_manager.py` 里的任务后运行下面这一格（`python -m minisgl.course check cache_manager`）。

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("cache_manager")
