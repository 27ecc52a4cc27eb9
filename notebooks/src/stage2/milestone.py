# %% [markdown] tags=["lang-zh"]
# # 第 2 阶段里程碑：调度器的三个实验，逐章对比
#
# 第 2 阶段把第 1 阶段的“算一步”变成了一个离线接口 `LLM.generate`：连续批处理、按需分页、
# Radix 前缀复用、分块预填充、重叠调度。里程碑用三个实验衡量它，模型是 Qwen3-0.6B 形状
# （这里是同形状的随机权重：token 数和计算量与真模型相同，**生成的文字没有意义**）：
#
# 1. 8 个提示词 × 16 个 token（`ignore_eos=True`）：总时间和 token/s；
# 2. 4 个提示词共用系统提示词，先单独跑第一个、再一起跑后三个（`max_tokens=4`）：提示词共 **231** 个 token，
#    预填充实际计算 `naive` **231** 个、`radix` **73** 个；
# 3. 302 个 token 的长提示词、`max_extend_tokens=96`：分 **4** 步预填充 **[96, 96, 96, 14]**。
#
# 先运行里程碑脚本 `examples/stage2_milestone.py`（也就是 `make milestone` 跑的那个），
# 再把同样的三个实验放到每一章的引擎上（第 2.1 章的 `Scheduler` 握着 `minisgl.<章>.PARTS`）并排比较。

# %% [markdown] tags=["lang-en"]
# # Stage 2 milestone: the scheduler's three experiments, chapter by chapter
#
# Stage 2 turned stage 1's "compute one step" into an offline interface, `LLM.generate`: continuous batching, paging on
# demand, radix prefix reuse, chunked prefill, overlap scheduling. The milestone measures it with three experiments, on a
# model shaped like Qwen3-0.6B (here with random weights of the same shape: the token counts and the amount of computation
# are those of the real model, **the generated text is meaningless**):
#
# 1. 8 prompts × 16 tokens (`ignore_eos=True`): total time and token/s;
# 2. 4 prompts sharing a system prompt, the first one alone and then the last three together (`max_tokens=4`): the prompts
#    have **231** tokens in total, and prefill actually computes **231** with `naive`, **73** with `radix`;
# 3. a long prompt of 302 tokens with `max_extend_tokens=96`: prefilled in **4** steps, **[96, 96, 96, 14]**.
#
# First run the milestone script `examples/stage2_milestone.py` (the one `make milestone` runs), then put the same three
# experiments on each chapter's engine (chapter 2.1's `Scheduler` holding `minisgl.<chapter>.PARTS`) side by side.

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

# %% [markdown] tags=["lang-zh"]
# ## 1. 运行里程碑脚本
#
# 相当于 `python examples/stage2_milestone.py --skip-baselines`（不测第 0 步和第 1 阶段的速度，快一些）。
# 脚本每个实验都新建一个 `LLM`，先预热，再用 `llm.add_step_listener` 监听每一步：轨迹里的长度是前向
# **发出之前**记下的（引擎发出时就推进了请求的长度），数出预填充计算了多少 token、分了几步。
# 重叠调度默认关掉（`ENV.DISABLE_OVERLAP_SCHEDULING.value = True`），速度只反映调度器本身。
# 速度每次运行都不同（CI 比较输出时换成占位符）；token 数和步数是确定的。

# %% [markdown] tags=["lang-en"]
# ## 1. Running the milestone script
#
# Equivalent to `python examples/stage2_milestone.py --skip-baselines` (skips measuring step 0 and stage 1, a bit faster).
# The script builds a new `LLM` for each experiment, warms it up, then listens to each step with `llm.add_step_listener`:
# the lengths in the trace are recorded **before the forward pass is issued** (the engine advances the requests' lengths
# when it issues), and from them it counts how many tokens prefill computed and in how many steps.
# Overlap scheduling is off by default (`ENV.DISABLE_OVERLAP_SCHEDULING.value = True`), so the speed reflects the scheduler alone.
# The speeds differ from run to run (replaced by placeholders when CI compares outputs); the token and step counts are deterministic.

# %% tags=["random-text"]
sys.path.insert(0, str(ROOT / "examples"))
import stage2_milestone

results = stage2_milestone.main(["--skip-baselines"])

# %%
print(tr("experiment 2: prompts of {prompt_tokens}, {total} tokens in total; naive computes {naive}, radix computes {radix}", prompt_tokens=results['prompt_tokens'], total=sum(results['prompt_tokens']), naive=results['naive_computed'], radix=results['radix_computed']))
print(tr("experiment 3: {long_tokens} tokens prefilled in {n_steps} steps {chunk_steps}", long_tokens=results['long_prompt_tokens'], n_steps=len(results['chunk_steps']), chunk_steps=results['chunk_steps']))

# %% [markdown] tags=["lang-zh"]
# 想看调度器每一步做了什么，加 `--trace`：每一步一行，预填充还是解码、每个请求算几个 token、KV 池占用几页。
# 下面只有 2 个请求槽、只跑实验 2：请求 4 要等请求 2、3 结束、还回请求槽，才在下一步进来；radix 下它照样命中 52 个 token。
# 用小 Qwen3 跑（分词器相同，每一步的计数一样，几秒就完）。请求编号是 uid；预热用掉了 uid 0 和第 0、1 步。
# 逐行的解释见讲义的里程碑页。

# %% [markdown] tags=["lang-en"]
# To see what the scheduler does at each step, add `--trace`: one line per step, prefill or decode, how many tokens each
# request computes, how many pages of the KV pool are in use.
# Below there are only 2 request slots and only experiment 2 runs: request 4 must wait until requests 2 and 3 finish and
# return their slots, and comes in at the next step; with radix it still hits 52 tokens.
# We run the tiny Qwen3 (same tokenizer, same counts at every step, done in seconds). Request numbers are uids; the warm-up used uid 0 and steps 0 and 1.
# The milestone page of the book explains it line by line.

# %%
from minisgl.model_zoo import tiny_qwen3

_ = stage2_milestone.main(["--max-running-req", "2", "--trace", "--experiment", "2", "--model", str(tiny_qwen3())])

# %% [markdown] tags=["lang-zh"]
# ## 2. 逐章对比
#
# 同样的三个实验（同样的提示词）放到每一章的引擎上：第 2.1 章的 `Scheduler` 握着 `minisgl.<章>.PARTS`（到那一章为止的零件；2.1 用自己的），
# 所以这张表就是第 2 阶段一章一章加上去的效果：
#
# - 2.1 静态分页：每个请求槽固定 2048 / 8 = 256 个 token，302 个 token 的长提示词放不下；
# - 2.2 按需分页：放得下了，但没有前缀复用，也不分块；
# - 2.3 Radix：共享系统提示词只算 73 个 token；
# - 2.4 分块预填充：长提示词分 4 步；
# - 2.5 重叠调度：计数与 2.4 完全相同；它省的是设备等主机的时间——在 CPU 上主线程和后台线程抢同几个核，
#   快慢看机器，在 GPU 上设备算得快、主机的活儿占比大，才显出优势。
#
# 每章的引擎用它默认的前缀缓存（2.1、2.2 只有 `naive`，2.3 起默认 `radix`），预填充预算都设为 96，
# 每章只建一次引擎、依次跑三个实验。每一章都要重新加载一次 0.6B 形状的模型，这一格要跑一会儿。

# %% [markdown] tags=["lang-en"]
# ## 2. Chapter by chapter
#
# The same three experiments (same prompts) on each chapter's engine: chapter 2.1's `Scheduler` holding
# `minisgl.<chapter>.PARTS` (the parts up to that chapter; 2.1 uses its own), so the table shows what stage 2 adds
# chapter by chapter:
#
# - 2.1 static paging: each request slot has a fixed 2048 / 8 = 256 tokens, and the 302-token prompt does not fit;
# - 2.2 paging on demand: now it fits, but there is no prefix reuse and no chunking;
# - 2.3 radix: the shared system prompt costs only 73 tokens;
# - 2.4 chunked prefill: the long prompt is split into 4 steps;
# - 2.5 overlap scheduling: exactly the same counts as 2.4; what it saves is the time the device waits for the host — on
#   the CPU the main thread and the background thread compete for the same cores, so whether it is faster depends on the
#   machine; on the GPU, where the device computes fast and the host work is a large share, the advantage shows.
#
# Each chapter's engine uses its default prefix cache (2.1 and 2.2 have only `naive`, from 2.3 on the default is `radix`),
# the prefill budget is 96 everywhere, and each chapter builds its engine once and runs the three experiments in turn.
# Every chapter loads the 0.6B-shaped model again, so this cell takes a while.

# %%
import gc
import importlib
import time
from functools import partial

import torch

from minisgl.core import SamplingParams
from minisgl.course.registry import CHAPTERS
from minisgl.model_zoo import qwen3_06b_random
from minisgl.notebook import StepRecorder, fmt_ms

MODEL = str(qwen3_06b_random())
CONFIG = dict(dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512)
BATCH, SYSTEM = stage2_milestone.PROMPTS, stage2_milestone.SYSTEM_PROMPT
QUESTIONS, LONG = stage2_milestone.QUESTIONS, stage2_milestone.LONG_PROMPT


def run_experiments(LLM, label: str, cache_type: str | None = None, verbose: bool = True) -> dict:
    """在一个章节的引擎上跑三个实验（只建一次引擎，预填充预算 96），返回确定的计数和（不确定的）时间。

    en: Run the three experiments on one chapter's engine (built once, prefill budget 96); return the deterministic counts and the (varying) times.
    """
    llm = LLM(MODEL, cache_type=cache_type, max_extend_tokens=96, **CONFIG)
    row = {"chapter": label, "cache_type": llm.config.cache_type}
    rec = StepRecorder(llm)
    llm.generate(BATCH[:1], SamplingParams(max_tokens=2))  # 预热（第一次调用要准备 oneDNN 的计算原语） | en: warm-up (the first call prepares oneDNN primitives)
    # 实验 1：8 × 16
    # en: experiment 1: 8 × 16
    rec.clear()
    start = time.perf_counter()
    out = llm.generate(BATCH, SamplingParams(max_tokens=16, ignore_eos=True))
    row.update(time=time.perf_counter() - start, steps=len(rec.steps), tokens=sum(len(o["token_ids"]) for o in out))
    # 实验 2：共享系统提示词，先第一个，再后三个
    # en: experiment 2: shared system prompt, the first one, then the last three
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    rec.clear()
    llm.generate([SYSTEM + QUESTIONS[0]], sp)
    start = time.perf_counter()
    llm.generate([SYSTEM + q for q in QUESTIONS[1:]], sp)
    row.update(last3=time.perf_counter() - start, prefix=rec.prefill_tokens)
    # 实验 3：302 个 token，每步最多预填充 96 个
    # en: experiment 3: 302 tokens, at most 96 prefilled per step
    rec.clear()
    try:
        llm.generate([LONG], sp)
        row["chunks"] = [e for s in rec.steps if s["phase"] == "prefill" for _, e, _ in s["reqs"]]
    except ValueError as err:
        row["chunks"] = tr("does not fit: {err}", err=err)
    llm.shutdown()
    del llm
    gc.collect()
    if verbose:
        print(tr("[{label}, cache_type={cache_type!r}]", label=label, cache_type=row['cache_type']))
        print(tr("  experiment 1: 8 requests × 16 tokens, {steps} steps, {tokens} tokens, {seconds:.2f} s, {tps:.1f} tok/s", steps=row['steps'], tokens=row['tokens'], seconds=row['time'], tps=row['tokens'] / row['time']))
        print(tr("  experiment 2: 231 prompt tokens in total, prefill computes {prefix}; last three requests {elapsed}", prefix=row['prefix'], elapsed=fmt_ms(row['last3'])))
        print(tr("  experiment 3: 302 tokens, max_extend_tokens=96 → prefill {chunks}", chunks=row['chunks']))
    return row


rows = []
for ch in [c for c in CHAPTERS if c.stage == 2]:
    module = importlib.import_module(f"minisgl.{ch.id}")
    engine = partial(importlib.import_module("minisgl.scheduler").Scheduler, parts=getattr(module, "PARTS", None))
    rows.append(run_experiments(engine, f"{ch.label} {ch.id}", verbose=False))

# %%
print(f"{tr('chapter'):<20}{'cache_type':<12}{tr('exp. 1 steps'):>14}{tr('exp. 2 prefill'):>16}   {tr('exp. 3 prefill')}")
for r in rows:
    chunks = r["chunks"] if isinstance(r["chunks"], list) else tr("does not fit (over the per-request length limit of 256)")
    print(f"{r['chapter']:<20}{r['cache_type']:<12}{r['steps']:>14}{r['prefix']:>16}   {chunks}")

# %%
# NBVAL_IGNORE_OUTPUT
# 时间每次运行都不同（CI 不比较这一格）
# en: The times differ from run to run (CI does not compare this cell)
import matplotlib.pyplot as plt

print(f"{tr('chapter'):<20}{tr('exp. 1 tok/s'):>14}{tr('exp. 2 last three'):>18}")
for r in rows:
    print(f"{r['chapter']:<20}{r['tokens'] / r['time']:>14.1f}{fmt_ms(r['last3']):>18}")
fig, axes = plt.subplots(1, 2, figsize=(10, 3))
names = [r["chapter"].split()[0] for r in rows]
axes[0].bar(names, [r["tokens"] / r["time"] for r in rows], color="#6fa8dc")
axes[0].set_title(tr("Experiment 1: tok/s (higher is better)"), fontsize=10)
axes[1].bar(names, [r["prefix"] for r in rows], color="#f4a261")
axes[1].set_title(tr("Experiment 2: tokens computed by prefill (fewer is better)"), fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 3. 动手调：缓存、预算、page_size、重叠
#
# 在小 Qwen3 上跑实验 2 和 3（分词器相同，token 数一样；模型小，几秒就完）。

# %% [markdown] tags=["lang-en"]
# ## 3. Try it: cache, budget, page_size, overlap
#
# Run experiments 2 and 3 on the tiny Qwen3 (same tokenizer, same token counts; a small model, done in seconds).

# %%
import ipywidgets as widgets

from minisgl.env import ENV
from minisgl.llm import LLM
from minisgl.model_zoo import tiny_qwen3
from minisgl.notebook import Explorer, draw_steps

TINY = str(tiny_qwen3())


def knobs(cache_type: str, max_extend_tokens: int, page_size: int, overlap: bool) -> None:
    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    try:
        llm = LLM(TINY, cache_type=cache_type, max_extend_tokens=max_extend_tokens, page_size=page_size, **CONFIG)
        rec = StepRecorder(llm)
        sp = SamplingParams(max_tokens=4, ignore_eos=True)
        llm.generate([SYSTEM + QUESTIONS[0]], sp)
        llm.generate([SYSTEM + q for q in QUESTIONS[1:]], sp)
        shared = rec.prefill_tokens
        rec.clear()
        llm.generate([LONG], sp)
        chunks = [e for s in rec.steps if s["phase"] == "prefill" for _, e, _ in s["reqs"]]
        print(tr("cache_type={cache_type!r} max_extend_tokens={max_extend_tokens} page_size={page_size} overlap={overlap}", cache_type=cache_type, max_extend_tokens=max_extend_tokens, page_size=page_size, overlap=overlap))
        print(tr("  experiment 2: prefill computes {shared} tokens (231 prompt tokens in total)", shared=shared))
        print(tr("  experiment 3: prefill in {n_chunks} steps {chunks}", n_chunks=len(chunks), chunks=chunks))
        draw_steps(rec.steps, title=tr("Each step of experiment 3"), budget=max_extend_tokens)
        llm.shutdown()
    finally:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved


explorer = Explorer(
    knobs,
    title=tr("Stage 2 knobs"),
    cache_type=widgets.ToggleButtons(options=["radix", "naive"], value="radix", description="cache_type"),
    max_extend_tokens=widgets.SelectionSlider(options=[32, 64, 96, 128, 256, 512], value=96, description=tr("budget")),
    page_size=widgets.SelectionSlider(options=[1, 2, 4, 8, 16], value=1, description="page_size"),
    overlap=widgets.Checkbox(value=True, description=tr("overlap scheduling")),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (this checks it without a browser)
explorer.run(cache_type="radix", max_extend_tokens=128, page_size=4, overlap=False)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 常见的误读：“共享的系统提示词有 158 个 token”。对吗？
#
# <details><summary>答案</summary>
#
# 不对。158 是后三个请求一共省下的 token 数（52 + 54 + 52）。共享前缀结束在空格之前——BPE 把空格并进了
# 每个问题的第一个词；而 `" What is"` 又被两个问题共享。231 − 158 = 73。
# </details>
#
# 2. 为什么第 2.5 章的三个计数与第 2.4 章完全相同？
#
# <details><summary>答案</summary>
#
# 重叠调度只改变主机和设备谁等谁，不改变每一步的批次组成；输出也逐 token 相同。
# </details>
#
# 3. 第 2.1 章为什么放不下 302 个 token 的提示词，而第 2.2 章放得下？
#
# <details><summary>答案</summary>
#
# 2.1 静态分页：2048 页平分给 8 个请求槽，每个请求最多 256 个 token。2.2 按需分页：一个请求可以用到整个池子
# （受 `max_seq_len_override=512` 限制）。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. A common misreading: "the shared system prompt has 158 tokens". Is that right?
#
# <details><summary>Answer</summary>
#
# No. 158 is the number of tokens the last three requests saved in total (52 + 54 + 52). The shared prefix ends before the
# space — BPE merges the space into the first word of each question; and `" What is"` is shared by two of the questions.
# 231 − 158 = 73.
# </details>
#
# 2. Why are the three counts of chapter 2.5 exactly those of chapter 2.4?
#
# <details><summary>Answer</summary>
#
# Overlap scheduling changes only who waits for whom, host or device; it does not change the batch of any step, and the outputs are the same token for token.
# </details>
#
# 3. Why does chapter 2.1 not fit the 302-token prompt, while chapter 2.2 does?
#
# <details><summary>Answer</summary>
#
# 2.1 pages statically: 2048 pages shared equally among 8 request slots, at most 256 tokens per request. 2.2 pages on
# demand: one request can use the whole pool (up to `max_seq_len_override=512`).
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 第 2 阶段全部写完后，运行下面这一格跑里程碑检查（`checks/stage2/test_milestone.py`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When all of stage 2 is written, run the cell below for the milestone checks (`checks/stage2/test_milestone.py`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_milestone_checks

run_milestone_checks(2)
