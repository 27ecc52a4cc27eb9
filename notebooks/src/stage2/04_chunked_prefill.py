# %% [markdown] tags=["lang-zh"]
# # 第 2.4 章 chunked_prefill：分块预填充
#
# 一段很长的提示词一次预填充完，这一步会很久，其他请求的解码全被卡住（延迟尖峰），激活内存也随长度变大。
# 分块预填充给每一步的预填充 token 数设上限 `max_extend_tokens`：
#
# - 预算只剩 `b` 个 token、提示词还有 `r > b` 个没算时，只算前 `b` 个——这个请求成了 **分块请求**，
#   留在等待队列的队首，下一步接着算（不再重新匹配、重新预留，槽位和页面一直占着）；
# - 最后一块是普通的请求：它算完整个提示词，采样出第一个输出 token；
# - 中间各块采样出的 token 是“提示词下一个 token 的预测”，**不是输出**：既不记入结果，
#   也不能写进 token 池覆盖提示词的下一个 token（写到不属于任何请求的草稿行）。

# %% [markdown] tags=["lang-en"]
# # Chapter 2.4 chunked_prefill: chunked prefill
#
# Prefilling a very long prompt in one go makes that step very long and stalls the decoding of every other request (a
# latency spike), and activation memory grows with the length too. Chunked prefill caps the prefill tokens of each step at `max_extend_tokens`:
#
# - when only `b` tokens of budget are left and the prompt still has `r > b` tokens to compute, only the first `b` are
#   computed — the request becomes a **chunked request**, stays at the head of the waiting queue and continues at the next
#   step (without matching or reserving again; it keeps its slot and pages all along);
# - the last chunk is an ordinary request: it finishes the whole prompt and samples the first output token;
# - the tokens sampled by the intermediate chunks are "predictions of the prompt's next token", **not outputs**: they are
#   not recorded in the result, and must not be written into the token pool over the prompt's next token (they go to a scratch row that belongs to no request).

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
# 本章的任务（和 stage2/chunked_prefill.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage2/chunked_prefill.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("chunked_prefill")

# %% [markdown] tags=["lang-zh"]
# ## 1. 里程碑的实验：302 个 token、每步最多 96 个
#
# `"Explain, step by step, why the sky is blue. " * 25` 用真 Qwen3 分词器是 302 个 token。
# `max_extend_tokens=96` 时分 4 步预填充：96、96、96、14。用小 Qwen3 跑（只看机制）。

# %% [markdown] tags=["lang-en"]
# ## 1. The milestone's experiment: 302 tokens, at most 96 per step
#
# `"Explain, step by step, why the sky is blue. " * 25` is 302 tokens with the real Qwen3 tokenizer.
# With `max_extend_tokens=96` it is prefilled in 4 steps: 96, 96, 96, 14. We run the tiny Qwen3 (only the mechanics matter).

# %%
import matplotlib.pyplot as plt
import torch

from minisgl.chunked_prefill import PARTS
from minisgl.scheduler import Scheduler
from minisgl.core import SamplingParams
from minisgl.model_zoo import tiny_qwen3
from minisgl.notebook import StepRecorder, draw_steps

TINY = str(tiny_qwen3())
LONG = "Explain, step by step, why the sky is blue. " * 25
llm = Scheduler(TINY, parts=PARTS, dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512, max_extend_tokens=96)
rec = StepRecorder(llm)
out = llm.generate([LONG], SamplingParams(max_tokens=4, ignore_eos=True))
print(tr("prompt tokens:"), len(llm.tokenizer.encode(LONG)))
chunks = [e for s in rec.steps if s["phase"] == "prefill" for _, e, _ in s["reqs"]]
print(tr("prefill in {n_chunks} steps: {chunks}; {n_out} output tokens (the tokens sampled by intermediate chunks did not get into the output)", n_chunks=len(chunks), chunks=chunks, n_out=len(out[0]['token_ids'])))

# %% [markdown] tags=["lang-zh"]
# 分块不改变结果：同一个请求分块与不分块，贪心输出逐 token 相同。

# %% [markdown] tags=["lang-en"]
# Chunking does not change the result: the same request, chunked or not, gives the same greedy output token for token.

# %%
whole = Scheduler(TINY, parts=PARTS, dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512)
ref = whole.generate([LONG], SamplingParams(max_tokens=4, ignore_eos=True))
same = ref[0]["token_ids"] == out[0]["token_ids"]
print(tr("output without chunking: {whole} ; output with chunking: {chunked} → same: {same}", whole=ref[0]['token_ids'], chunked=out[0]['token_ids'], same=same))

# %% [markdown] tags=["lang-zh"]
# ## 2. 长提示词来了，正在解码的请求怎样？
#
# 先让 3 个短请求开始解码，再来一个 302 token 的长提示词。不分块时，长提示词一步算完——这一步特别长；
# 分块后每一步的计算量都不超过预算，短请求在长提示词的各块之间继续推进或在同一步里搭车。
# 每格的数字是这一步为该请求计算的 token 数，最上面一行是这一步的合计（≈ 这一步的耗时）。

# %% [markdown] tags=["lang-en"]
# ## 2. A long prompt arrives: what happens to the requests being decoded?
#
# First let 3 short requests start decoding, then a 302-token prompt arrives. Without chunking, the long prompt is
# computed in one step — an especially long step; with chunking, no step computes more than the budget, and the short
# requests keep advancing between the long prompt's chunks or ride along in the same step.
# The number in each cell is how many tokens the step computed for that request; the top row is the step's total (≈ the step's duration).

# %%
SHORT = ["Hello, my name is", "The sky is", "1, 2, 3,"]


def long_arrives(max_extend_tokens: int, long_repeat: int = 25, show: bool = True) -> list[dict]:
    llm = Scheduler(TINY, parts=PARTS, dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512,
              max_extend_tokens=max_extend_tokens)  # fmt: skip
    rec = StepRecorder(llm)
    outputs: dict[int, list[int]] = {}

    def collect(event):  # 每个请求每一步一个 | en: one RequestEvent per request and step
        if event.token is not None:
            outputs.setdefault(event.uid, []).append(event.token)

    llm.add_result_listener(collect)
    sp = SamplingParams(max_tokens=10, ignore_eos=True)
    uids = [llm.add_request(llm.tokenizer.encode(p), sp) for p in SHORT]
    llm.step()
    llm.step()  # 短请求预填充完，又解码了一步 | en: the short requests are prefilled and have decoded one step
    long_ids = llm.tokenizer.encode("Explain, step by step, why the sky is blue. " * long_repeat)
    uids.append(llm.add_request(long_ids, SamplingParams(max_tokens=4, ignore_eos=True)))
    llm.run_until_idle()
    outs = [outputs.get(u, []) for u in uids]
    llm.check_integrity()
    totals = [sum(e for _, e, _ in s["reqs"]) for s in rec.steps]
    long_chunks = [e for s in rec.steps for u, e, _ in s["reqs"] if u == uids[-1] and s["phase"] == "prefill"]
    print(tr("max_extend_tokens={max_extend_tokens}: the long prompt of {n_long_ids} tokens is split into {long_chunks}; {n_steps} steps in total", max_extend_tokens=max_extend_tokens, n_long_ids=len(long_ids), long_chunks=long_chunks, n_steps=len(rec.steps)))
    print(tr("tokens computed per step in total: {totals} (max {max_total})", totals=totals, max_total=max(totals)))
    print(tr("output length of each request:"), [len(o) for o in outs])
    if show:
        draw_steps(rec.steps, budget=max_extend_tokens if max_extend_tokens < 8192 else None)
    llm.shutdown()
    return outs


no_chunk = long_arrives(8192)
chunked = long_arrives(96)
print(tr("both ways give exactly the same outputs:"), no_chunk == chunked)
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 3. 动手调：预算和提示词长度

# %% [markdown] tags=["lang-en"]
# ## 3. Try it: budget and prompt length

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

explorer = Explorer(
    long_arrives,
    title=tr("Chunked prefill"),
    max_extend_tokens=widgets.SelectionSlider(options=[16, 32, 64, 96, 128, 256, 8192], value=96, description=tr("budget")),
    long_repeat=widgets.IntSlider(value=25, min=1, max=40, description=tr("long prompt ×")),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (this checks it without a browser)
explorer.run(max_extend_tokens=64, long_repeat=10)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 302 个 token、`max_extend_tokens = 128`，分几块？各多少？
#
# <details><summary>答案</summary>
#
# 3 块：128、128、46。
# </details>
#
# 2. 中间块采样出的 token 为什么不能写回 `token_pool[行, device_len]`？
#
# <details><summary>答案</summary>
#
# 对分块请求来说，那个位置存的是提示词的下一个 token（下一块的输入）。写进去就把提示词改掉了，
# 后面的块算的是另一段文字。所以它的写回位置指向草稿行（`max_running_req` 那一行）。
# </details>
#
# 3. 分块请求下一步继续时，为什么不重新做前缀匹配和页面预留？
#
# <details><summary>答案</summary>
#
# 它已经占着请求槽、锁着命中的前缀、预留了整个提示词加输出要的页；再匹配一次会重复加锁、重复预留，
# 账就对不上了。沿用上一块的句柄、槽位和 `cached_len` 接着切就行。
# </details>
#
# 4. 整个提示词都命中了前缀缓存，分块预填充这一步还要算几个 token？
#
# <details><summary>答案</summary>
#
# 至少 1 个：匹配最多到倒数第二个 token，最后一个总要算，才有 logits 采样第一个输出 token。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. With 302 tokens and `max_extend_tokens = 128`, how many chunks are there, and how large?
#
# <details><summary>Answer</summary>
#
# 3 chunks: 128, 128, 46.
# </details>
#
# 2. Why must the token sampled by an intermediate chunk not be written back to `token_pool[row, device_len]`?
#
# <details><summary>Answer</summary>
#
# For a chunked request that position holds the prompt's next token (the input of the next chunk). Writing there would
# change the prompt, and the later chunks would compute a different text. So its write-back position points at the
# scratch row (row `max_running_req`).
# </details>
#
# 3. When a chunked request continues at the next step, why is there no new prefix match and page reservation?
#
# <details><summary>Answer</summary>
#
# It already holds a request slot, has locked the prefix it hit, and has reserved the pages for the whole prompt plus
# output; matching again would lock and reserve twice, and the books would no longer balance. It just keeps cutting, with
# the previous chunk's handle, slot and `cached_len`.
# </details>
#
# 4. If the whole prompt hits the prefix cache, how many tokens does the chunked prefill step still compute?
#
# <details><summary>Answer</summary>
#
# At least 1: matching goes at most to the second-to-last token, and the last one is always computed, to have logits for sampling the first output token.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage2/chunked_prefill.py` 里的任务后运行下面这一格（`python -m minisgl.course check chunked_prefill`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage2/chunked_prefill.py`, run the cell below (`python -m minisgl.course check chunked_prefill`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("chunked_prefill")
