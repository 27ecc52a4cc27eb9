# %% [markdown] tags=["lang-zh"]
# # 第 1 阶段里程碑：亲手驱动引擎
#
# 六章写完，第 0 步的每个朴素部件都换成了真正的模块：长度记账、算子层、流式加载的模型、分页 KV 池、
# 变长批次的注意力、批量采样器。这个引擎只会“算一步”：给它一个填好的 `Batch`，它前向、采样、推进请求。
# 批次的字段——页表的行、`input_ids`、`positions`、`out_loc`——仍由我们自己动手填。
#
# `examples/stage1_milestone.py` 做四件事：1 个请求的生成速度（旁边是第 0 步）、4 个请求一批的速度、
# 一共写了多少个 KV 页、每个请求的 token 是否与 Hugging Face `generate` 完全一致。
# 这里在真实权重的 SmolLM2 上跑它；`make milestone` 之外，命令行里不带 `--model` 时它用 Qwen3-0.6B 形状的模型。

# %% [markdown] tags=["lang-en"]
# # Stage 1 milestone: driving the engine yourself
#
# Six chapters written, and every naive part of step 0 has been replaced by a real module: length bookkeeping, operator
# layers, a model loaded by streaming, a paged KV pool, attention over variable-length batches, a batched sampler. This
# engine can only "compute one step": give it a filled `Batch`, and it runs the forward pass, samples and advances the
# requests. The batch's fields — page table rows, `input_ids`, `positions`, `out_loc` — are still filled by us, by hand.
#
# `examples/stage1_milestone.py` does four things: the generation speed of 1 request (with step 0 beside it), the speed of
# a batch of 4 requests, how many KV pages were written in total, and whether every request's tokens are exactly those of
# Hugging Face `generate`. Here we run it on SmolLM2 with real weights; outside `make milestone`, without `--model` on the
# command line it uses a model shaped like Qwen3-0.6B.

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
# 相当于 `python examples/stage1_milestone.py --model models/SmolLM2-135M-Instruct --page-size 4 --max-tokens 8`。
# 速度每次运行都不同（CI 比较输出时会把数字换成占位符）；token 数、页数和“是否一致”是确定的。

# %% [markdown] tags=["lang-en"]
# ## 1. Running the milestone script
#
# Equivalent to `python examples/stage1_milestone.py --model models/SmolLM2-135M-Instruct --page-size 4 --max-tokens 8`.
# The speeds differ from run to run (when CI compares outputs, the numbers are replaced by placeholders); the token counts,
# page counts and "identical or not" are deterministic.

# %%
sys.path.insert(0, str(ROOT / "examples"))  # 里程碑脚本要导入同目录的 step0_tiny_engine | en: the milestone script imports step0_tiny_engine from its own folder
import stage1_milestone

from minisgl.model_zoo import smollm2

SMOL = smollm2()
result = stage1_milestone.main(["--model", str(SMOL), "--page-size", "4", "--max-tokens", "8"])

# %%
print(tr("KV pages written: {pages}, token slots: {slots}, requests that differ from HF: {n_mismatches}", pages=result['pages_written'], slots=result['slots_written'], n_mismatches=len(result['mismatches'])))

# %% [markdown] tags=["lang-zh"]
# ## 2. 手工批次里发生了什么
#
# 脚本里的 `HandDriver` 给每个请求固定一行页表，并一次性分给它能装下 `max_seq_len` 个 token 的页——
# 简单，但很浪费：短请求用不完，长请求也借不到别人的。第 2 阶段的调度器按需分页、请求结束就回收。
# 下面用同一个驱动器跑一批，画出每一步算了多少 token，以及最后一步写进了页表的哪些位置。

# %% [markdown] tags=["lang-en"]
# ## 2. What happens in a hand-made batch
#
# The script's `HandDriver` gives each request a fixed row of the page table, and hands it all at once enough pages for
# `max_seq_len` tokens — simple, but wasteful: short requests do not use them up, and long ones cannot borrow from others.
# The stage 2 scheduler assigns pages on demand and reclaims them when a request finishes.
# Below, the same driver runs a batch; we draw how many tokens each step computed, and where in the page table the last step wrote.

# %%
import matplotlib.pyplot as plt
import torch
from transformers import AutoTokenizer

from minisgl.engine import Engine, EngineConfig
from minisgl.notebook import draw_page_table, draw_steps

tok = AutoTokenizer.from_pretrained(SMOL)
PROMPTS = stage1_milestone.BATCH
engines: dict[int, Engine] = {}


def get_engine(page_size: int) -> Engine:
    if page_size not in engines:
        engines[page_size] = Engine(
            EngineConfig(str(SMOL), dtype=torch.float32, max_running_req=len(PROMPTS), max_seq_len_override=64,
                         num_page_override=len(PROMPTS) * 64 // page_size, page_size=page_size)
        )  # fmt: skip
    return engines[page_size]


def hand_batch(page_size: int, num_reqs: int, max_tokens: int) -> None:
    engine = get_engine(page_size)
    driver = stage1_milestone.HandDriver(engine)
    prompts = [tok(p)["input_ids"] for p in PROMPTS[:num_reqs]]
    reqs = [driver.admit(p, row, max_tokens) for row, p in enumerate(prompts)]
    steps = []
    while reqs[0].can_decode:
        phase = "prefill" if reqs[0].cached_len == 0 else "decode"
        steps.append({"phase": phase, "reqs": [(r.uid, r.extend_len, r.cached_len) for r in reqs]})
        last = [(r.table_idx, c) for r in reqs for c in range(r.cached_len, r.device_len)]
        driver.step(reqs)
    for p, r in zip(PROMPTS, reqs):
        print(f"{p!r} → {tok.decode(r.input_ids[len(tok(p)['input_ids']):].tolist())!r}")
    pages = {s // page_size for s in driver.written_slots}
    reserved = num_reqs * driver.pages_per_req
    print(tr("{n_steps} steps; wrote {n_written_slots} slots, {n_pages} pages; {reserved} pages reserved up front ({percent}% used)", n_steps=len(steps), n_written_slots=len(driver.written_slots), n_pages=len(pages), reserved=reserved, percent=100 * len(pages) // reserved))
    draw_steps(steps, title=tr("Tokens computed per request at each step (step 1 is prefill, then decode)"))
    width = max(r.device_len for r in reqs)
    draw_page_table(engine.page_table, list(range(num_reqs)), width, page_size, highlight=last,
                    lengths=[r.device_len - 1 for r in reqs], title=tr("Page table (bold boxes: written by the last step)"))  # fmt: skip


hand_batch(page_size=4, num_reqs=4, max_tokens=6)
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 3. 动手调：page_size、请求数、生成长度

# %% [markdown] tags=["lang-en"]
# ## 3. Try it: page_size, number of requests, generation length

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

explorer = Explorer(
    hand_batch,
    title=tr("Hand-made batch"),
    page_size=widgets.SelectionSlider(options=[1, 2, 4, 8], value=4, description="page_size"),
    num_reqs=widgets.IntSlider(value=4, min=1, max=4, description=tr("requests")),
    max_tokens=widgets.IntSlider(value=6, min=1, max=16, description="max_tokens"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (this checks it without a browser)
explorer.run(page_size=8, num_reqs=2, max_tokens=4)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 手工驱动时，为什么一批里的请求必须同时预填充、同时解码、同时结束？
#
# <details><summary>答案</summary>
#
# `HandDriver` 只看第一个请求决定阶段、也只在它能解码时继续，所以整批同进同出。要让请求随时加入和离开
# （连续批处理），得有人每步决定批次组成、分配槽位、回收资源——这就是第 2 阶段的调度器。
# </details>
#
# 2. 这一批写入的页数，为什么远少于静态预留的页数？
#
# <details><summary>答案</summary>
#
# 每个请求预留了能装 `max_seq_len` 个 token 的页，实际只用到提示词 + 生成的长度。第 2.2 章的
# `CacheManager` 只在要写某个位置时才分配它所在的页，请求结束立刻回收。
# </details>
#
# 3. 第 1 阶段的引擎比第 0 步快在哪里？
#
# <details><summary>答案</summary>
#
# 预先分配的 KV 池不再每步拷贝整个缓存；多个请求放进同一次矩阵乘法（批次越大，每个 token 分摊的权重读取越少）；
# CPU 上线性层走快速路径（第 1.2 章：oneDNN 布局，或引擎默认的小批量内核）；LM head 只算每个请求的最后一个 token。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. When driving by hand, why must the requests of a batch prefill together, decode together and finish together?
#
# <details><summary>Answer</summary>
#
# `HandDriver` looks only at the first request to decide the phase, and continues only while that one can decode, so the
# whole batch moves in lockstep. To let requests join and leave at any time (continuous batching), someone must decide
# the batch at each step, assign slots and reclaim resources — that is the stage 2 scheduler.
# </details>
#
# 2. Why does this batch write far fewer pages than were reserved up front?
#
# <details><summary>Answer</summary>
#
# Each request reserved pages for `max_seq_len` tokens, but uses only the prompt + generated length. The `CacheManager` of
# chapter 2.2 allocates a page only when a position in it is about to be written, and reclaims it as soon as the request finishes.
# </details>
#
# 3. Where is the stage 1 engine faster than step 0?
#
# <details><summary>Answer</summary>
#
# The preallocated KV pool no longer copies the whole cache at every step; several requests share one matrix
# multiplication (the larger the batch, the less weight reading per token); on the CPU the linear layers take a fast
# path (chapter 1.2: the oneDNN layout, or the engine's default small-batch kernel); the LM head computes only the last
# token of each request.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 第 1 阶段全部写完后，运行下面这一格跑里程碑检查（`checks/stage1/test_milestone.py`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When all of stage 1 is written, run the cell below for the milestone checks (`checks/stage1/test_milestone.py`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_milestone_checks

run_milestone_checks(1)
