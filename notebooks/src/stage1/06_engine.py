# %% [markdown] tags=["lang-zh"]
# # 第 1.6 章 engine：Engine 与批量采样器
#
# 把前五章拼起来：`Engine` 按顺序初始化 设备与 dtype → 全局上下文 → 模型与权重 → 由剩余内存定出 KV 页数 →
# KV 池 → 页表与 token 池 → 注意力后端 → 采样器。`forward_batch` 跑一次前向、为每个请求采样一个 token
# 并拷回主机；它只算不记账：推进请求（`complete_one`）和把新 token 写到哪里，都由发出这一步的调用者来做。
#
# 采样器一次为整批采样，每个请求有自己的温度、top-k、top-p 和种子。随机性来自“指数竞赛”：
# `argmax(p / E)`（E 独立服从指数分布）恰好以概率 p 选中每个 token，整批只要一次 argmax。
#
# 第 1 阶段结束时，批次的字段（`input_ids`、`positions`、`out_loc`、页表的行）仍由你手工填——第 2 阶段的调度器再自动化。

# %% [markdown] tags=["lang-en"]
# # Chapter 1.6 engine: the Engine and the batched sampler
#
# Put the first five chapters together: `Engine` initializes, in order, device and dtype → global context → model and
# weights → the number of KV pages from the free memory → KV pool → page table and token pool → attention backend →
# sampler. `forward_batch` runs one forward pass, samples one token per request and copies them back to the host; it
# computes but keeps no books: advancing the requests (`complete_one`) and where to write the new tokens are up to the
# caller that issued the step.
#
# The sampler samples for the whole batch at once, each request with its own temperature, top-k, top-p and seed. The
# randomness comes from an "exponential race": `argmax(p / E)` (E independent and exponentially distributed) picks each
# token with probability exactly p, with a single argmax for the whole batch.
#
# At the end of stage 1 you still fill the batch's fields (`input_ids`, `positions`, `out_loc`, page table rows) by hand — the scheduler of stage 2 automates that.

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
# 本章的任务（和 stage1/engine.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage1/engine.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("engine")

# %% [markdown] tags=["lang-zh"]
# ## 1. 建一个引擎
#
# 不指定页数时，引擎按 `(可用内存 × 比例 − 模型占用) ÷ 每页字节数` 算出页数（CPU 上比例默认 0.3，
# 内存还要留给别的进程）。笔记本里用 `num_page_override` 固定页数，结果与机器无关。

# %% [markdown] tags=["lang-en"]
# ## 1. Building an engine
#
# Without a given number of pages, the engine computes it as `(available memory × ratio − model size) ÷ bytes per page`
# (on the CPU the ratio defaults to 0.3; memory must be left for other processes too). The notebook fixes the number of
# pages with `num_page_override`, so the results do not depend on the machine.

# %%
import torch

from minisgl.engine import Engine, EngineConfig
from minisgl.model_zoo import smollm2

engine = Engine(EngineConfig(str(smollm2()), dtype=torch.float32, max_running_req=4, num_page_override=512, max_seq_len_override=128, page_size=4))
print(tr("device {device}, dtype {dtype}, fast CPU linear layers: {fast_linear}", device=engine.device, dtype=engine.dtype, fast_linear=engine.fast_linear))
print(tr("KV pool: {num_pages} pages × page_size {page_size}, max_seq_len={max_seq_len}", num_pages=engine.num_pages, page_size=engine.config.page_size, max_seq_len=engine.max_seq_len))
print(tr("page table / token pool: {shape} (max_running_req + 1 rows)", shape=tuple(engine.page_table.shape)))
print(tr("attention backend: {backend}; sampler: {sampler}", backend=type(engine.attn_backend).__name__, sampler=type(engine.sampler).__name__))

# %% [markdown] tags=["lang-zh"]
# ## 2. 手工驱动：一批两个请求，和 Hugging Face 逐 token 对照
#
# 每个请求占页表的一行，提前分好页。每一步填好批次的 `input_ids`、`positions`、`out_loc`，
# 准备注意力元数据和采样参数，然后 `forward_batch`；发出之后由我们自己对每个请求调用 `complete_one()`（引擎只算不记账）。

# %% [markdown] tags=["lang-en"]
# ## 2. Driving it by hand: a batch of two requests, token by token against Hugging Face
#
# Each request takes one row of the page table, with its pages assigned in advance. At each step we fill the batch's
# `input_ids`, `positions` and `out_loc`, prepare the attention metadata and sampling parameters, then call `forward_batch`;
# after issuing it we call `complete_one()` on each request ourselves (the engine computes but keeps no books).

# %%
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import Batch, Req, SamplingParams
from minisgl.kvcache import pages_to_slots

tok = AutoTokenizer.from_pretrained(smollm2())
PAGES_PER_ROW = engine.max_seq_len // engine.config.page_size


def admit(prompt: str, row: int, sp: SamplingParams) -> Req:
    pages = torch.arange(row * PAGES_PER_ROW, (row + 1) * PAGES_PER_ROW, dtype=torch.int32)
    engine.page_table[row, :] = pages_to_slots(pages, engine.config.page_size)[: engine.max_seq_len]
    ids = torch.tensor(tok(prompt)["input_ids"], dtype=torch.int32)
    return Req(ids, table_idx=row, cached_len=0, output_len=sp.max_tokens, uid=row, sampling_params=sp)


def step(reqs: list[Req]) -> list[int]:
    batch = Batch(reqs, "prefill" if reqs[0].cached_len == 0 else "decode")
    batch.input_ids = torch.cat([r.input_ids[r.cached_len : r.device_len] for r in reqs])
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len, dtype=torch.int32) for r in reqs])
    batch.out_loc = torch.cat([engine.page_table[r.table_idx, r.cached_len : r.device_len] for r in reqs])
    engine.attn_backend.prepare_metadata(batch)
    out = engine.forward_batch(batch, engine.sampler.prepare(batch))
    for r in reqs:
        r.complete_one()
    out.copy_done_event.synchronize()
    for r, t in zip(reqs, out.next_tokens_cpu):
        r.append_host(t.reshape(1))
    return out.next_tokens_cpu.tolist()


prompts = ["The capital of France is", "The three primary colors are"]
reqs = [admit(p, row, SamplingParams(max_tokens=8)) for row, p in enumerate(prompts)]
n_prompt = [len(r.input_ids) for r in reqs]
while reqs[0].can_decode:
    phase = tr("prefill") if reqs[0].cached_len == 0 else tr("decode")
    extend = [r.extend_len for r in reqs]
    tokens = step(reqs)
    print(tr("{phase}: {extend} token(s) per request → new tokens {tokens}; {req}", phase=phase, extend=extend, tokens=tokens, req=reqs[0]))

hf = AutoModelForCausalLM.from_pretrained(smollm2(), dtype=torch.float32)
for r, n, p in zip(reqs, n_prompt, prompts):
    ours = r.input_ids[n:].tolist()
    ids = torch.tensor([r.input_ids[:n].tolist()])
    ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)[0, n:].tolist()
    print(tr("{p!r} → {text!r}; same as HF: {same}", p=p, text=tok.decode(ours), same=ours == ref))
print(tr("row 0 of the token pool is still all 0:"), bool((engine.token_pool[0] == 0).all()))
print(tr("(the engine computes but does not write: in stage 1 the input comes straight from req.input_ids; in stage 2 the scheduler writes prompts and new tokens into the token pool)"))

# %% [markdown] tags=["lang-zh"]
# ## 3. 批量采样器
#
# 拿一个 8 个 token 的“词表”和固定的 logits，把同一个请求复制 4000 份放进一批，一次采完，
# 数一数每个 token 被选中的频率，和理论分布（温度 → softmax → top-k → top-p）对比。

# %% [markdown] tags=["lang-en"]
# ## 3. The batched sampler
#
# Take a "vocabulary" of 8 tokens with fixed logits, copy one request 4000 times into a batch, sample them all at once,
# count how often each token is picked and compare with the theoretical distribution (temperature → softmax → top-k → top-p).

# %%
import matplotlib.pyplot as plt

from minisgl.engine import Sampler, top_k_top_p_filter

LOGITS = torch.tensor([2.0, 1.5, 1.2, 0.5, 0.0, -0.5, -1.0, -2.0])


def sample_many(sp: SamplingParams, n: int = 4000, seed: int = 0) -> torch.Tensor:
    sampler = Sampler(torch.device("cpu"), vocab_size=len(LOGITS), seed=seed)
    batch = Batch([Req(torch.tensor([0], dtype=torch.int32), i, 0, 4, i, sp) for i in range(n)], "prefill")
    return sampler.sample(LOGITS.repeat(n, 1), sampler.prepare(batch))


def theory(sp: SamplingParams) -> torch.Tensor:
    if sp.is_greedy:
        return torch.nn.functional.one_hot(LOGITS.argmax(), len(LOGITS)).float()
    probs = (LOGITS / sp.temperature).softmax(-1)[None]
    k = torch.tensor([sp.top_k if sp.top_k >= 1 else len(LOGITS)])
    p = torch.tensor([sp.top_p])
    probs = top_k_top_p_filter(probs, k, p)[0]
    return probs / probs.sum()


def draw_sampling(temperature: float, top_k: int, top_p: float) -> None:
    sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    tokens = sample_many(sp)
    freq = torch.bincount(tokens, minlength=len(LOGITS)).float() / len(tokens)
    want = theory(sp)
    print(tr("temperature={temperature} top_k={top_k} top_p={top_p}: greedy={is_greedy}", temperature=temperature, top_k=top_k, top_p=top_p, is_greedy=sp.is_greedy))
    possible, seen = (want > 0).nonzero().flatten().tolist(), (freq > 0).nonzero().flatten().tolist()
    print(tr("tokens that can be picked: {possible} ; tokens that actually came up: {seen}", possible=possible, seen=seen))
    print(tr("max difference between frequencies and probabilities < 0.05: {close}", close=bool((freq - want).abs().max() < 0.05)))
    fig, ax = plt.subplots(figsize=(6, 2.6))
    xs = torch.arange(len(LOGITS))
    ax.bar(xs - 0.2, want, width=0.4, label=tr("probability in theory"), color="#6fa8dc")
    ax.bar(xs + 0.2, freq, width=0.4, label=tr("frequency over 4000 samples"), color="#f4a261")
    ax.set_xticks(xs.tolist())
    ax.set_xlabel(tr("token id (logits from largest to smallest)"))
    ax.legend(fontsize=8)


draw_sampling(1.0, -1, 1.0)
plt.show()

# %% [markdown] tags=["lang-zh"]
# **种子**：给了 `seed` 的请求，随机数只由（种子，位置）决定，与同批还有谁无关。

# %% [markdown] tags=["lang-en"]
# **Seeds**: for a request with a `seed`, the random numbers depend only on (seed, position), not on who else is in the batch.

# %%
sp_seeded = SamplingParams(temperature=1.0, seed=42)
alone = sample_many(sp_seeded, n=1, seed=0)
sampler = Sampler(torch.device("cpu"), vocab_size=len(LOGITS), seed=123)
others = [Req(torch.tensor([0], dtype=torch.int32), i, 0, 4, i, SamplingParams(temperature=1.0)) for i in range(5)]
mixed = Batch([*others[:2], Req(torch.tensor([0], dtype=torch.int32), 9, 0, 4, 9, sp_seeded), *others[2:]], "prefill")
in_batch = sampler.sample(LOGITS.repeat(6, 1), sampler.prepare(mixed))
mine = in_batch[2:3].tolist()
print(tr("sampled alone: {alone} ; between 5 other requests, with another sampler seed: {mine} → same: {same}", alone=alone.tolist(), mine=mine, same=alone.tolist() == mine))

# %% [markdown] tags=["lang-zh"]
# ## 4. 动手调：温度、top-k、top-p

# %% [markdown] tags=["lang-en"]
# ## 4. Try it: temperature, top-k, top-p

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

explorer = Explorer(
    draw_sampling,
    title=tr("Sampling"),
    temperature=widgets.FloatSlider(value=1.0, min=0.0, max=3.0, step=0.1, description="temperature"),
    top_k=widgets.IntSlider(value=-1, min=-1, max=8, description="top_k"),
    top_p=widgets.FloatSlider(value=1.0, min=0.05, max=1.0, step=0.05, description="top_p"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (this checks it without a browser)
explorer.run(temperature=0.7, top_k=5, top_p=0.8)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. `top_k = 3`、`top_p = 0.5`，三个最大的概率（归一化后）是 0.45、0.35、0.20。最后留下哪几个 token？
#
# <details><summary>答案</summary>
#
# 前两个。按从大到小累加：第一个之前的累计是 0 < 0.5，留下；第二个之前是 0.45 < 0.5，留下；
# 第三个之前是 0.80 ≥ 0.5，去掉。
# </details>
#
# 2. 为什么 `argmax(p / E)`（E 服从指数分布）等价于按概率 p 采样？
#
# <details><summary>答案</summary>
#
# `E_i / p_i` 服从速率为 `p_i` 的指数分布，最小的那个是 i 的概率恰好是 `p_i / Σp`（指数分布的“竞赛”性质）；
# 取 `p / E` 的最大值就是取 `E / p` 的最小值。好处是整批一次 argmax，不用逐行 `multinomial`。
# </details>
#
# 3. CPU 上 `copy_to_host` 为什么要 `clone()`？
#
# <details><summary>答案</summary>
#
# CPU 上 `.to("cpu")` 不拷贝、直接返回同一块内存。下一步引擎改写设备上的结果张量时，“主机副本”也跟着变，
# 调度器读到的就不是这一步的 token 了。
# </details>
#
# 4. `forward_batch` 既不推进请求（`complete_one`），也不把新 token 写进 token 池。这两件事由谁做、为什么不放进引擎？
#
# <details><summary>答案</summary>
#
# 都由发出这一步的调用者做：本章是上面手工驱动的 `step`，第 2 阶段是调度器。
# **推进**要在发出时、主线程上做：第 2.5 章的重叠调度紧接着就用推进后的长度调度下一步，这时前向可能还在后台线程里算，
# 放进引擎就会和主线程同时改同一个请求。**写回**的位置只有调度器知道：通常是 token 池的 `(table_idx, device_len)`
# （推进之前的 `device_len`，下一步解码就从这里取输入）；但分块预填充的中间块采样出的不是输出，要写到不属于任何请求的
# 那一行，否则会覆盖提示词的下一个 token。引擎只管算，结果怎么用交给调用者，两个阶段用的是同一个 `forward_batch`。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. With `top_k = 3` and `top_p = 0.5`, the three largest probabilities (normalized) are 0.45, 0.35, 0.20. Which tokens are left?
#
# <details><summary>Answer</summary>
#
# The first two. Accumulating from largest to smallest: the sum before the first is 0 < 0.5, kept; before the second it is
# 0.45 < 0.5, kept; before the third it is 0.80 ≥ 0.5, removed.
# </details>
#
# 2. Why is `argmax(p / E)` (E exponentially distributed) equivalent to sampling with probabilities p?
#
# <details><summary>Answer</summary>
#
# `E_i / p_i` is exponentially distributed with rate `p_i`, and the probability that i is the smallest is exactly `p_i / Σp`
# (the "race" property of exponential distributions); the maximum of `p / E` is the minimum of `E / p`. The benefit: one
# argmax for the whole batch instead of a `multinomial` per row.
# </details>
#
# 3. Why does `copy_to_host` call `clone()` on the CPU?
#
# <details><summary>Answer</summary>
#
# On the CPU `.to("cpu")` does not copy; it returns the same memory. When the engine overwrites the result tensor on the
# device at the next step, the "host copy" would change with it, and the scheduler would no longer read this step's tokens.
# </details>
#
# 4. `forward_batch` neither advances the requests (`complete_one`) nor writes the new tokens into the token pool. Who does these two things, and why are they not in the engine?
#
# <details><summary>Answer</summary>
#
# Whoever issues the step does both: in this chapter the hand-driven `step` above, in stage 2 the scheduler.
# **Advancing** must happen at issue time, on the main thread: the overlap scheduling of chapter 2.5 immediately uses the
# advanced lengths to schedule the next step while the forward pass may still be running in a background thread; inside
# the engine, it would modify the same request at the same time as the main thread. **Where to write back** is known only
# to the scheduler: usually the token pool at `(table_idx, device_len)` (the `device_len` before advancing; the next decode
# step takes its input from there); but what an intermediate chunk of a chunked prefill samples is not an output and must go
# to the row that belongs to no request, or it would overwrite the prompt's next token. The engine only computes and leaves
# the use of its results to the caller; both stages use the same `forward_batch`.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage1/engine.py` 里的任务后运行下面这一格（`python -m minisgl.course check engine`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage1/engine.py`, run the cell below (`python -m minisgl.course check engine`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("engine")
