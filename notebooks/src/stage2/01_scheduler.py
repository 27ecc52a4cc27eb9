# %% [markdown] tags=["lang-zh"]
# # 第 2.1 章 scheduler：调度器骨架与 LLM.generate
#
# 第 1 阶段结束时，一批里有哪些请求、每个 token 的位置、K/V 写到哪个槽位，都是手工填的，
# 而且整批同进同出。调度器把这些自动化，并让请求来来去去：
#
# - **主循环**：接收新请求 → 选出下一批 → 准备输入（positions、输入映射、`out_loc`）→ 前向 → 处理结果；
# - **预填充优先**：有等待的请求就先做预填充，否则让运行中的请求一起解码一步；
# - **准入控制**：请求槽（页表的一行）只有 `max_running_req` 个；一步预填充的 token 数有预算 `max_extend_tokens`；
# - **连续批处理**：请求一结束就离开、归还槽位，等待的请求下一步就能加入；
# - **结果处理**：把采样出的 token 接到请求后面，生成够 `max_tokens` 或遇到 EOS 就结束。
#
# 本章的 KV 页面还是静态分配：每个请求槽固定分到同样多的页（第 1 阶段的做法，自动化了）。

# %% [markdown] tags=["lang-en"]
# # Chapter 2.1 scheduler: the scheduler skeleton and LLM.generate
#
# At the end of stage 1, which requests are in a batch, the position of each token and the slot its K/V goes to were all
# filled in by hand, and the whole batch moved in lockstep. The scheduler automates this and lets requests come and go:
#
# - **main loop**: receive new requests → pick the next batch → prepare the inputs (positions, input mapping, `out_loc`) → forward → process the results;
# - **prefill first**: if requests are waiting, prefill them first; otherwise the running requests decode one step together;
# - **admission control**: there are only `max_running_req` request slots (rows of the page table); the tokens of one prefill step have a budget, `max_extend_tokens`;
# - **continuous batching**: a request leaves as soon as it finishes and returns its slot, and a waiting request can join at the next step;
# - **result processing**: append the sampled token to its request; the request finishes after `max_tokens` tokens or at EOS.
#
# In this chapter the KV pages are still allocated statically: each request slot gets the same fixed number of pages (stage 1's approach, automated).

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
# 本章的任务（和 stage2/scheduler.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage2/scheduler.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("scheduler")

# %% [markdown] tags=["lang-zh"]
# ## 1. 一次 generate
#
# 用小 Qwen3（随机权重，只看机制；输出的文字没有意义）建本章的调度器 `Scheduler`：最多同时跑 2 个请求。

# %% [markdown] tags=["lang-en"]
# ## 1. One generate call
#
# Build this chapter's `Scheduler` on the tiny Qwen3 (random weights: we only look at the mechanics; the text it outputs is meaningless), with at most 2 requests running at once.

# %%
import torch

from minisgl.core import SamplingParams
from minisgl.model_zoo import tiny_qwen3
from minisgl.scheduler import Scheduler

TINY = str(tiny_qwen3())
llm = Scheduler(TINY, dtype=torch.float32, max_running_req=2, num_page_override=256, max_seq_len_override=128)
print(tr("{max_running_req} request slots; KV pool of {num_pages} pages, each slot statically gets {per_slot} pages → a request can have at most {max_seq_len} tokens", max_running_req=llm.max_running_req, num_pages=llm.engine.num_pages, per_slot=llm.engine.num_pages // llm.max_running_req, max_seq_len=llm.max_seq_len))
out = llm.generate(["Hello, my name is", "The sky is"], SamplingParams(max_tokens=4, ignore_eos=True))
for o in out:
    print(o["token_ids"])

# %% [markdown] tags=["lang-zh"]
# ## 2. 拆开一步看
#
# `generate` 就是 `add_request` 加上反复调用 `step()`。手工走两步（正是 `normal_loop` 的三行：调度并准备 → `_forward` 发出
# → `_process_last_data` 处理结果），看调度器替我们算出的字段：
#
# - `positions`：每个请求 `arange(cached_len, device_len)` 拼起来；
# - `input_mapping`：`(行号, 位置)`，`token_pool[input_mapping]` 就是本步的输入（提示词已由准入时写进 token 池）；
# - `out_loc = page_table[input_mapping]`：本步每个 token 的 K/V 写到哪里；
# - `write_mapping`：每个请求一对 `(行号, device_len)`，采样出的新 token 写回 token 池的这里。
#
# 输出不从调度器里读：`add_result_listener` 收下结果处理为每个请求、每一步做出的决定（`RequestEvent`），`generate` 也是这样收集的。

# %% [markdown] tags=["lang-en"]
# ## 2. One step, taken apart
#
# `generate` is just `add_request` plus calling `step()` again and again. Take two steps by hand (exactly the three lines of
# `normal_loop`: schedule and prepare → issue with `_forward` → process the results with `_process_last_data`) and look at
# the fields the scheduler computes for us:
#
# - `positions`: each request's `arange(cached_len, device_len)`, concatenated;
# - `input_mapping`: `(row, position)`; `token_pool[input_mapping]` is this step's input (the prompt was written into the token pool at admission);
# - `out_loc = page_table[input_mapping]`: where the K/V of each token of this step is written;
# - `write_mapping`: one `(row, device_len)` per request; the newly sampled token is written back to the token pool there.
#
# The outputs are not read out of the scheduler: `add_result_listener` receives what result processing decided for each
# request at each step (a `RequestEvent`), which is also how `generate` collects them.

# %%
ids = [llm.tokenizer.encode(p) for p in ["Hello, my name is", "The sky is"]]
outputs: dict[int, list[int]] = {}


def collect(event):  # 每个请求每一步一个 | en: one RequestEvent per request and step
    if event.token is not None:
        outputs.setdefault(event.uid, []).append(event.token)


llm.add_result_listener(collect)
uids = [llm.add_request(i, SamplingParams(max_tokens=3, ignore_eos=True)) for i in ids]
for step in range(2):
    fi = llm._schedule_next_batch()
    b = fi.batch
    print(tr("step {step}: {phase}, requests {uids}, extend_len {extend_lens}", step=step, phase=b.phase, uids=[r.uid for r in b.reqs], extend_lens=[r.extend_len for r in b.reqs]))
    print(f"  positions    = {b.positions.tolist()}")
    print(tr("  input_mapping= rows {rows}, columns {cols}", rows=fi.input_mapping[0].tolist(), cols=fi.input_mapping[1].tolist()))
    print(f"  out_loc      = {b.out_loc.tolist()}")
    print(tr("  write_mapping= rows {rows}, columns {cols}", rows=fi.write_mapping[0].tolist(), cols=fi.write_mapping[1].tolist()))
    llm._process_last_data((fi, llm._forward(fi)))
llm.run_until_idle()
print(tr("outputs:"), [outputs[u] for u in uids])
llm.check_integrity()
print(tr("integrity check passed: every request slot was returned"))

# %% [markdown] tags=["lang-zh"]
# ## 3. 连续批处理
#
# 每一步做了什么，用 `llm.add_step_listener(fn)` 来看：每一步的结果处理完，调度器就把这一步的轨迹（`StepTrace`：
# 阶段、请求、发出前的长度、占用的页、几段时间）交给 `fn`。下面的 `StepRecorder` 就是这样一个监听者。
#
# 5 个请求、只有 2 个请求槽、各自的 `max_tokens` 不同。预填充优先：一有空槽，等待的请求下一步就预填充进来；
# 谁先生成够谁先走，不用等整批结束。下图每根柱子是一步，按请求分段，高度是这一步为它算的 token 数
# （纵轴是对数刻度；橙边预填充、蓝边解码）。

# %% [markdown] tags=["lang-en"]
# ## 3. Continuous batching
#
# To see what each step did, use `llm.add_step_listener(fn)`: once a step's results are processed, the scheduler hands
# that step's trace (`StepTrace`: phase, requests, lengths before issue, pages in use, a few timings) to `fn`. The
# `StepRecorder` below is such a listener.
#
# 5 requests, only 2 request slots, each request with its own `max_tokens`. Prefill first: as soon as a slot is free, a
# waiting request is prefilled at the next step; whoever has generated enough leaves first, without waiting for the whole
# batch. In the picture each column is a step, split by request, with the number of tokens computed for it in that step
# (log scale; orange edges prefill, blue edges decode).

# %%
import matplotlib.pyplot as plt

from minisgl.notebook import StepRecorder, draw_steps

PROMPTS = ["Hello, my name is", "The capital of France is", "Once upon a time", "1, 2, 3,", "Water boils at a temperature of"]
MAX_TOKENS = [3, 6, 2, 5, 4]


def continuous(max_running_req: int, max_extend_tokens: int, num_prompts: int) -> None:
    llm = Scheduler(TINY, dtype=torch.float32, max_running_req=max_running_req, num_page_override=512,
              max_seq_len_override=64, max_extend_tokens=max_extend_tokens)  # fmt: skip
    rec = StepRecorder(llm)
    sps = [SamplingParams(max_tokens=m, ignore_eos=True) for m in MAX_TOKENS[:num_prompts]]
    out = llm.generate(PROMPTS[:num_prompts], sps)
    print(tr("max_running_req={max_running_req}, max_extend_tokens={max_extend_tokens}: {summary}", max_running_req=max_running_req, max_extend_tokens=max_extend_tokens, summary=rec.summary()))
    for i, s in enumerate(rec.steps):
        print(tr("  step {i:>2} {phase:<7} requests {uids}, computing {extend_lens} token(s) each", i=i, phase=s['phase'], uids=[u for u, _, _ in s['reqs']], extend_lens=[e for _, e, _ in s['reqs']]))
    print(tr("output length of each request:"), [len(o["token_ids"]) for o in out])
    draw_steps(rec.steps, budget=max_extend_tokens if max_extend_tokens < 64 else None)
    llm.shutdown()


continuous(max_running_req=2, max_extend_tokens=8192, num_prompts=5)
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 4. 静态分页的限制
#
# 每个槽只有 `num_pages // max_running_req` 页，超出的请求在提交时就被拒绝（而不是永远等下去），
# 哪怕别的槽空着。`max_tokens` 和提示词加起来超出上限也是错，不悄悄截短；不给 `max_tokens`，就生成到上限为止，
# 也没有警告。第 2.2 章改成按需分配。

# %% [markdown] tags=["lang-en"]
# ## 4. The limits of static paging
#
# Each slot has only `num_pages // max_running_req` pages; a request that needs more is rejected when it is submitted
# (instead of waiting forever), even if other slots are empty. A `max_tokens` that goes past the limit together with the
# prompt is an error too, never silently clipped; with `max_tokens` left out, generation goes up to the limit, with no
# warning either. Chapter 2.2 switches to allocation on demand.

# %%
import warnings

small = Scheduler(TINY, dtype=torch.float32, max_running_req=4, num_page_override=64, max_seq_len_override=64)
print(tr("longest request: {max_seq_len} tokens", max_seq_len=small.max_seq_len))
for ids, sp in ((list(range(100, 120)), SamplingParams(max_tokens=4)),
                (list(range(100, 110)), SamplingParams(max_tokens=50, ignore_eos=True))):
    try:
        small.generate([ids], sp)
    except ValueError as err:
        print(tr("ValueError:"), err)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    res = small.generate([list(range(100, 110))], SamplingParams(ignore_eos=True))  # 不给 max_tokens | en: max_tokens left out
print(tr("warnings:"), [str(w.message) for w in caught])
print(tr("actually generated: {n_tokens} tokens", n_tokens=len(res[0]['token_ids'])))

# %% [markdown] tags=["lang-zh"]
# ## 5. 动手调：请求槽、预填充预算、请求数
#
# 预算 `max_extend_tokens` 限制一步预填充接纳多少 token：本章还没有分块，预算用完就不再接纳新请求
# （但总会接纳至少一个，否则长提示词永远进不来）。

# %% [markdown] tags=["lang-en"]
# ## 5. Try it: request slots, prefill budget, number of requests
#
# The budget `max_extend_tokens` limits how many tokens one prefill step admits: this chapter has no chunking yet, so once
# the budget is used up no new request is admitted (but at least one always is, or a long prompt could never get in).

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

explorer = Explorer(
    continuous,
    title=tr("Continuous batching"),
    max_running_req=widgets.IntSlider(value=2, min=1, max=5, description="max_running_req"),
    max_extend_tokens=widgets.SelectionSlider(options=[4, 8, 16, 8192], value=8192, description=tr("prefill budget")),
    num_prompts=widgets.IntSlider(value=5, min=1, max=5, description=tr("requests")),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (this checks it without a browser)
explorer.run(max_running_req=3, max_extend_tokens=8, num_prompts=5)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. “预填充优先”在什么情况下会让运行中的请求多等？为什么还要这样做？
#
# <details><summary>答案</summary>
#
# 只要有能接纳的等待请求，这一步就做预填充，运行中的请求这一步不解码。这样新请求尽快开始（首 token 延迟小），
# 也尽快把批次填满，之后每一步解码的请求更多、吞吐更高。第 2.4 章的分块预填充限制每步预填充的量，缓解等待。
# </details>
#
# 2. 为什么结束的判断要用主机收到的 token 数，而不是 `req.can_decode`？
#
# <details><summary>答案</summary>
#
# `can_decode` 由 `complete_one()` 推进，而它在前向 **发出** 时就调用了；重叠调度时主机看到结果前，请求已经
# 又被推进了一步，用它判断会提前一个 token 结束。按收到的 token 数判断与发出时机无关。
# </details>
#
# 3. `write_mapping` 为什么是 `(行号, device_len)`？
#
# <details><summary>答案</summary>
#
# 准备批次时请求还没被推进：本步采样出的 token 在序列里的位置正是此刻的 `device_len`。写回 token 池的这个位置，
# 下一步解码的输入映射 `(行号, device_len)` 恰好读到它，token 不必经过主机。
# </details>
#
# 4. 请求槽只有 2 个、5 个请求同时提交，第 3 个请求什么时候开始预填充？
#
# <details><summary>答案</summary>
#
# 前两个请求里有一个结束、归还槽位之后的下一步（预填充优先，它马上被接纳）。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. When does "prefill first" make the running requests wait longer? Why do it anyway?
#
# <details><summary>Answer</summary>
#
# Whenever there is a waiting request that can be admitted, the step is a prefill and the running requests do not decode
# in it. New requests start as early as possible (short time to first token), and the batch fills up sooner, so later
# decode steps carry more requests and throughput is higher. The chunked prefill of chapter 2.4 limits how much is
# prefilled per step, which eases the wait.
# </details>
#
# 2. Why must the end of a request be judged by the number of tokens the host has received, rather than by `req.can_decode`?
#
# <details><summary>Answer</summary>
#
# `can_decode` is advanced by `complete_one()`, which is called when the forward pass is **issued**; with overlap
# scheduling, the request has already been advanced once more before the host sees the result, so judging by it would
# finish one token early. The number of tokens received does not depend on when steps are issued.
# </details>
#
# 3. Why is `write_mapping` `(row, device_len)`?
#
# <details><summary>Answer</summary>
#
# When the batch is prepared the request has not been advanced yet: the position of this step's sampled token in the
# sequence is exactly the current `device_len`. Written back to that place in the token pool, it is exactly what the next
# decode step's input mapping `(row, device_len)` reads, and the token never has to pass through the host.
# </details>
#
# 4. With only 2 request slots and 5 requests submitted at once, when does the 3rd request start its prefill?
#
# <details><summary>Answer</summary>
#
# At the step after one of the first two requests finishes and returns its slot (prefill first: it is admitted right away).
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage2/scheduler.py` 里的任务后运行下面这一格（`python -m minisgl.course check scheduler`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage2/scheduler.py`, run the cell below (`python -m minisgl.course check scheduler`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("scheduler")
