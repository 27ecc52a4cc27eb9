# %% [markdown] tags=["lang-zh"]
# # 第 2.5 章 overlap：重叠调度
#
# 普通的主循环里，设备每算完一步都要等主机：拷回结果、记账、调度、准备下一步的输入。这些主机上的活儿
# 每步要一两毫秒，设备就空等着。重叠调度把循环改成：
#
#     发出第 N+1 步 → 处理第 N 步的结果（这时设备在算第 N+1 步）→ 再发出第 N+2 步 …
#
# 能这样做，是因为 `complete_one()` 在发出时就推进了长度记账，下一步的输入 token 也不经过主机：
# 上一步采样的 token 直接写进设备上的 token 池，下一步从那里取。发出的一步是一个 `Future`：
# GPU 上前向跑在引擎自己的 CUDA 流上；CPU 上交给一个后台线程（PyTorch 的算子执行时会释放 GIL），
# 处理结果前用 `result()` 等它算完。
#
# 几个坑：结束判断按主机收到的 token 数；遇到 EOS 的请求可能已被放进下一步，那一步为它算的 token 要丢掉；
# 结束或取消的请求要等用到它的批次都算完才能归还槽位和页面；预填充之后的前缀插入晚一个迭代。
# `ENV.DISABLE_OVERLAP_SCHEDULING.value = True` 关掉重叠，两种循环的输出完全相同。

# %% [markdown] tags=["lang-en"]
# # Chapter 2.5 overlap: overlap scheduling
#
# In the plain main loop, every time the device finishes a step it waits for the host: copy the results back, keep the
# books, schedule, prepare the next step's inputs. This host work takes a millisecond or two per step, while the device
# sits idle. Overlap scheduling turns the loop into:
#
#     issue step N+1 → process the results of step N (while the device computes step N+1) → issue step N+2 …
#
# This works because `complete_one()` advances the length bookkeeping at issue time, and the next step's input tokens
# never pass through the host: the tokens sampled by one step are written straight into the token pool on the device, and
# the next step takes them from there. An issued step is a `Future`: on the GPU the forward pass runs on the engine's own
# CUDA stream; on the CPU it is handed to a background thread (PyTorch operators release the GIL while they run), and
# `result()` waits for it before its results are processed.
#
# A few pitfalls: judge the end of a request by the number of tokens the host received; a request that hit EOS may already
# be in the next step, and the token computed for it there must be dropped; a finished or cancelled request returns its
# slot and pages only once every batch using it has been computed; the prefix insertion after prefill happens one iteration later.
# `ENV.DISABLE_OVERLAP_SCHEDULING.value = True` turns overlap off, and both loops give exactly the same outputs.

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
# 本章的任务（和 stage2/overlap.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage2/overlap.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("overlap")

# %% [markdown] tags=["lang-zh"]
# ## 1. 重叠与不重叠：输出完全相同
#
# 同一个引擎、同一批请求（有的贪心、有的带种子采样），开关重叠调度各跑一次。

# %% [markdown] tags=["lang-en"]
# ## 1. With and without overlap: exactly the same outputs
#
# The same engine, the same batch of requests (some greedy, some sampling with a seed), run once with overlap scheduling on and once with it off.

# %%
import torch

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.model_zoo import tiny_qwen3
from minisgl.overlap import PARTS
from minisgl.scheduler import Scheduler

TINY = str(tiny_qwen3())
PROMPTS = ["Hello, my name is", "The capital of France is", "Once upon a time", "1, 2, 3,", "Water boils at", "def add(a, b):"]
SPS = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=t, seed=s) for n, t, s in
       [(6, 0.0, None), (9, 0.8, 1), (4, 0.0, None), (12, 1.0, 7), (7, 0.0, None), (5, 0.6, 3)]]  # fmt: skip
llm = Scheduler(TINY, parts=PARTS, dtype=torch.float32, max_running_req=4, num_page_override=512, max_seq_len_override=128)
results = {}
for overlap in (True, False):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    results[overlap] = [o["token_ids"] for o in llm.generate(PROMPTS, SPS)]
    print(tr("overlap={overlap}: output length of each request {lengths}", overlap=overlap, lengths=[len(t) for t in results[overlap]]))
ENV.DISABLE_OVERLAP_SCHEDULING.value = False
print(tr("both loops give the same outputs, token for token:"), results[True] == results[False])
print(tr("each length is exactly its max_tokens:"), [len(t) for t in results[True]] == [sp.max_tokens for sp in SPS])

# %% [markdown] tags=["lang-zh"]
# ## 2. 时间线
#
# `Timeline` 用 `llm.add_step_listener` 收下每一步的轨迹，画出几段活儿的起止时间：准备、处理结果（主线程），
# 前向计算（重叠时在后台线程）。主线程上的空白就是在等结果。
# 不重叠时它们首尾相接；重叠时前向在后台线程里跑，主线程同时处理上一步的结果、准备下一步。
# 在 CPU 上前向占了大头，主线程多半在等；在 GPU 上设备算得快得多，主机上的活儿才是瓶颈，重叠省下的比例大得多。
# 时间每次运行都不同（CI 只比较步数和“输出相同”）。

# %% [markdown] tags=["lang-en"]
# ## 2. The timeline
#
# `Timeline` receives each step's trace through `llm.add_step_listener` and draws when each piece of work started and
# ended: preparing and processing results (main thread), the forward pass (in a background thread with overlap). The gaps on
# the main thread are waiting for results.
# Without overlap they follow one another end to end; with overlap the forward pass runs in a background thread while the
# main thread processes the previous step's results and prepares the next step.
# On the CPU the forward pass takes most of the time and the main thread mostly waits; on the GPU the device computes much
# faster, the host work becomes the bottleneck, and overlap saves a much larger share.
# The times differ from run to run (CI compares only the step counts and "same outputs").

# %%
import matplotlib.pyplot as plt

from minisgl.notebook import Timeline, draw_timeline, fmt_ms


def timeline(num_reqs: int, max_tokens: int, model: str = TINY) -> None:
    llm = Scheduler(model, parts=PARTS, dtype=torch.float32, max_running_req=8, num_page_override=1024, max_seq_len_override=128)
    tl = Timeline(llm)
    prompts = (PROMPTS * 2)[:num_reqs]
    runs, outs = [], {}
    llm.generate(prompts[:1], SamplingParams(max_tokens=2))  # 预热 | en: warm-up
    for overlap in (False, True):
        ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
        tl.start()
        outs[overlap] = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        total = max(r[3] for r in tl.records)
        steps = tl.steps
        mode = tr("overlap") if overlap else tr("no overlap")
        runs.append((tr("{mode}: {steps} steps, {elapsed}", mode=mode, steps=steps, elapsed=fmt_ms(total)), list(tl.records)))
        print(tr("{mode}: {num_reqs} requests × {max_tokens} tokens, {steps} steps, took {elapsed}", mode=mode, num_reqs=num_reqs, max_tokens=max_tokens, steps=steps, elapsed=fmt_ms(total)))
    ENV.DISABLE_OVERLAP_SCHEDULING.value = False
    print(tr("same outputs:"), outs[True] == outs[False])
    draw_timeline(runs)
    llm.shutdown()


timeline(num_reqs=8, max_tokens=8)
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 3. 动手调：请求数和生成长度
#
# 请求越多、每步主机上的活儿越多，重叠省下的时间越明显（在 GPU 上更是如此，设备算得比主机准备得快）。

# %% [markdown] tags=["lang-en"]
# ## 3. Try it: number of requests and generation length
#
# The more requests and the more host work per step, the more visible the time overlap saves (all the more so on the GPU, where the device computes faster than the host prepares).

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

explorer = Explorer(
    timeline,
    title=tr("Timeline of overlap scheduling"),
    num_reqs=widgets.IntSlider(value=8, min=1, max=12, description=tr("requests")),
    max_tokens=widgets.IntSlider(value=8, min=1, max=32, description="max_tokens"),
)
explorer

# %%
# NBVAL_IGNORE_OUTPUT
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它；打印的时间每次不同，CI 不比较这一格）
# en: Call the widget's handler with one set of values (checks it without a browser; the printed times differ from run to run, CI does not compare this cell)
explorer.run(num_reqs=4, max_tokens=6)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 重叠调度里，为什么 `complete_one()` 必须在主线程、发出时调用，而不能在后台线程算完以后？
#
# <details><summary>答案</summary>
#
# 主线程紧接着就要为下一步调度和准备输入，它需要推进后的长度（位置、写入槽位都由长度推出）。
# 放在后台线程里会与主线程同时读写同一个请求的字段，形成竞争。
# </details>
#
# 2. 一个请求在第 N 步采样出 EOS。重叠调度时第 N+1 步已经为它算了一个 token，怎么处理？
#
# <details><summary>答案</summary>
#
# 处理第 N 步结果时把它标为结束；处理第 N+1 步结果时发现它已经结束，这个多算的 token 直接丢掉，
# 不记入输出。它的资源等第 N+1 步算完（不再在途）才归还。
# </details>
#
# 3. 为什么下一步的输入 token 不必经过主机？
#
# <details><summary>答案</summary>
#
# 调度器在发出这一步时（`_run_batch` 里，引擎算完之后）把采样结果按 `write_mapping` 写进设备上的 token 池，
# 下一步的输入映射正好从那里取。主机拿到结果只是为了记账和判断结束，不在关键路径上。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. With overlap scheduling, why must `complete_one()` be called on the main thread at issue time, and not in the background thread after the computation?
#
# <details><summary>Answer</summary>
#
# The main thread immediately schedules the next step and prepares its inputs, and it needs the advanced lengths for that
# (positions and write slots are derived from the lengths). In the background thread it would read and write the same
# request's fields at the same time as the main thread — a race.
# </details>
#
# 2. A request samples EOS at step N. With overlap scheduling, step N+1 has already computed a token for it. What happens?
#
# <details><summary>Answer</summary>
#
# Processing the results of step N marks it finished; processing the results of step N+1 finds it already finished and
# drops the extra token, which does not go into the output. Its resources are returned once step N+1 has been computed (it is no longer in flight).
# </details>
#
# 3. Why do the next step's input tokens not need to pass through the host?
#
# <details><summary>Answer</summary>
#
# When the scheduler issues the step (in `_run_batch`, after the engine has computed), it writes the sampled tokens into
# the token pool on the device according to `write_mapping`, and the next step's input mapping reads them right there. The
# host gets the results only to keep the books and detect the end of requests, off the critical path.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage2/overlap.py` 里的任务后运行下面这一格（`python -m minisgl.course check overlap`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage2/overlap.py`, run the cell below (`python -m minisgl.course check overlap`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("overlap")
