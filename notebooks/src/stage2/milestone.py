# %% [markdown]
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
# 再把同样的三个实验放到每一章的引擎上（`minisgl.<章>.LLM`）并排比较。

# %%
# 准备：找到仓库根目录（保证导入的是这个仓库里的 minisgl）、关掉进度条、固定随机种子、配好画图
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "minisgl" / "course").is_dir())
sys.path.insert(0, str(ROOT))
from minisgl.notebook import setup_notebook

setup_notebook()

# %% [markdown]
# ## 1. 运行里程碑脚本
#
# 相当于 `python examples/stage2_milestone.py --skip-baselines`（不测第 0 步和第 1 阶段的速度，快一些）。
# 脚本每个实验都新建一个 `LLM`，先预热，再用 `llm.add_step_listener` 监听每一步：轨迹里的长度是前向
# **发出之前**记下的（引擎发出时就推进了请求的长度），数出预填充计算了多少 token、分了几步。
# 重叠调度默认关掉（`ENV.DISABLE_OVERLAP_SCHEDULING.value = True`），速度只反映调度器本身。
# 速度每次运行都不同（CI 比较输出时换成占位符）；token 数和步数是确定的。

# %%
sys.path.insert(0, str(ROOT / "examples"))
import stage2_milestone

results = stage2_milestone.main(["--skip-baselines"])

# %%
print(f"实验 2：提示词 {results['prompt_tokens']}，共 {sum(results['prompt_tokens'])} 个 token；naive 计算 {results['naive_computed']} 个，radix 计算 {results['radix_computed']} 个")
print(f"实验 3：{results['long_prompt_tokens']} 个 token 分 {len(results['chunk_steps'])} 步预填充 {results['chunk_steps']}")

# %% [markdown]
# 想看调度器每一步做了什么，加 `--trace`：每一步一行，预填充还是解码、每个请求算几个 token、KV 池占用几页。
# 下面只有 2 个请求槽、只跑实验 2：请求 4 要等请求 2、3 结束、还回请求槽，才在下一步进来；radix 下它照样命中 52 个 token。
# 用小 Qwen3 跑（分词器相同，每一步的计数一样，几秒就完）。请求编号是 uid；预热用掉了 uid 0 和第 0、1 步。
# 逐行的解释见讲义的里程碑页。

# %%
from minisgl.model_zoo import tiny_qwen3

_ = stage2_milestone.main(["--max-running-req", "2", "--trace", "--experiment", "2", "--model", str(tiny_qwen3())])

# %% [markdown]
# ## 2. 逐章对比
#
# 同样的三个实验（同样的提示词）放到每一章的引擎上。`minisgl.<章>.LLM` 是那一章的调度器（每章在上一章的基础上派生），
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

# %%
import gc
import importlib
import time

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
    """在一个章节的引擎上跑三个实验（只建一次引擎，预填充预算 96），返回确定的计数和（不确定的）时间。"""
    llm = LLM(MODEL, cache_type=cache_type, max_extend_tokens=96, **CONFIG)
    row = {"章": label, "cache_type": llm.config.cache_type}
    rec = StepRecorder(llm)
    llm.generate(BATCH[:1], SamplingParams(max_tokens=2))  # 预热（第一次调用要准备 oneDNN 的计算原语）
    # 实验 1：8 × 16
    rec.clear()
    start = time.perf_counter()
    out = llm.generate(BATCH, SamplingParams(max_tokens=16, ignore_eos=True))
    row.update(time=time.perf_counter() - start, steps=len(rec.steps), tokens=sum(len(o["token_ids"]) for o in out))
    # 实验 2：共享系统提示词，先第一个，再后三个
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    rec.clear()
    llm.generate([SYSTEM + QUESTIONS[0]], sp)
    start = time.perf_counter()
    llm.generate([SYSTEM + q for q in QUESTIONS[1:]], sp)
    row.update(last3=time.perf_counter() - start, prefix=rec.prefill_tokens)
    # 实验 3：302 个 token，每步最多预填充 96 个
    rec.clear()
    try:
        llm.generate([LONG], sp)
        row["chunks"] = [e for s in rec.steps if s["phase"] == "prefill" for _, e, _ in s["reqs"]]
    except ValueError as err:
        row["chunks"] = f"放不下：{err}"
    llm.shutdown()
    del llm
    gc.collect()
    if verbose:
        print(f"[{label}，cache_type={row['cache_type']!r}]")
        print(f"  实验 1：8 个请求 × 16 个 token，{row['steps']} 步，{row['tokens']} 个 token，{row['time']:.2f} s，{row['tokens'] / row['time']:.1f} tok/s")
        print(f"  实验 2：提示词共 231 个 token，预填充计算 {row['prefix']} 个；后三个请求 {fmt_ms(row['last3'])}")
        print(f"  实验 3：302 个 token、max_extend_tokens=96 → 预填充 {row['chunks']}")
    return row


rows = []
for ch in [c for c in CHAPTERS if c.stage == 2]:
    module = importlib.import_module(f"minisgl.{ch.id}")
    rows.append(run_experiments(module.LLM, f"{ch.label} {ch.id}", verbose=False))

# %%
print(f"{'章':<20}{'cache_type':<12}{'实验1 步数':>8}{'实验2 预填充':>10}   实验3 预填充")
for r in rows:
    chunks = r["chunks"] if isinstance(r["chunks"], list) else "放不下（超出单个请求的长度上限 256）"
    print(f"{r['章']:<20}{r['cache_type']:<12}{r['steps']:>8}{r['prefix']:>10}   {chunks}")

# %%
# NBVAL_IGNORE_OUTPUT
# 时间每次运行都不同（CI 不比较这一格）
import matplotlib.pyplot as plt

print(f"{'章':<20}{'实验1 tok/s':>12}{'实验2 后三个':>14}")
for r in rows:
    print(f"{r['章']:<20}{r['tokens'] / r['time']:>12.1f}{fmt_ms(r['last3']):>14}")
fig, axes = plt.subplots(1, 2, figsize=(10, 3))
names = [r["章"].split()[0] for r in rows]
axes[0].bar(names, [r["tokens"] / r["time"] for r in rows], color="#6fa8dc")
axes[0].set_title("实验 1：tok/s（越高越好）", fontsize=10)
axes[1].bar(names, [r["prefix"] for r in rows], color="#f4a261")
axes[1].set_title("实验 2：预填充计算的 token 数（越少越好）", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 3. 动手调：缓存、预算、page_size、重叠
#
# 在小 Qwen3 上跑实验 2 和 3（分词器相同，token 数一样；模型小，几秒就完）。

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
        print(f"cache_type={cache_type!r} max_extend_tokens={max_extend_tokens} page_size={page_size} 重叠={overlap}")
        print(f"  实验 2：预填充计算 {shared} 个 token（提示词共 231 个）")
        print(f"  实验 3：预填充 {len(chunks)} 步 {chunks}")
        draw_steps(rec.steps, title="实验 3 的每一步", budget=max_extend_tokens)
        llm.shutdown()
    finally:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved


explorer = Explorer(
    knobs,
    title="第 2 阶段的旋钮",
    cache_type=widgets.ToggleButtons(options=["radix", "naive"], value="radix", description="cache_type"),
    max_extend_tokens=widgets.SelectionSlider(options=[32, 64, 96, 128, 256, 512], value=96, description="预算"),
    page_size=widgets.SelectionSlider(options=[1, 2, 4, 8, 16], value=1, description="page_size"),
    overlap=widgets.Checkbox(value=True, description="重叠调度"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
explorer.run(cache_type="radix", max_extend_tokens=128, page_size=4, overlap=False)

# %% [markdown]
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

# %% [markdown]
# ## 检查你的代码
#
# 第 2 阶段全部写完后，运行下面这一格跑里程碑检查（`checks/stage2/test_milestone.py`）。

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_milestone_checks

run_milestone_checks(2)
