# %% [markdown]
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
# 本章的任务（和 stage2/chunked_prefill.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
from minisgl.notebook import show_tasks

show_tasks("chunked_prefill")

# %% [markdown]
# ## 1. 里程碑的实验：302 个 token、每步最多 96 个
#
# `"Explain, step by step, why the sky is blue. " * 25` 用真 Qwen3 分词器是 302 个 token。
# `max_extend_tokens=96` 时分 4 步预填充：96、96、96、14。用小 Qwen3 跑（只看机制）。

# %%
import matplotlib.pyplot as plt
import torch

from minisgl.chunked_prefill import LLM
from minisgl.core import SamplingParams
from minisgl.model_zoo import tiny_qwen3
from minisgl.notebook import StepRecorder, draw_steps

TINY = str(tiny_qwen3())
LONG = "Explain, step by step, why the sky is blue. " * 25
llm = LLM(TINY, dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512, max_extend_tokens=96)
rec = StepRecorder(llm)
out = llm.generate([LONG], SamplingParams(max_tokens=4, ignore_eos=True))
print("提示词 token 数：", len(llm.tokenizer.encode(LONG)))
chunks = [e for s in rec.steps if s["phase"] == "prefill" for _, e, _ in s["reqs"]]
print(f"预填充分 {len(chunks)} 步：{chunks}；输出 {len(out[0]['token_ids'])} 个 token（中间各块采样的 token 没有混进输出）")

# %% [markdown]
# 分块不改变结果：同一个请求分块与不分块，贪心输出逐 token 相同。

# %%
whole = LLM(TINY, dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512)
ref = whole.generate([LONG], SamplingParams(max_tokens=4, ignore_eos=True))
print("不分块的输出：", ref[0]["token_ids"], "；分块的输出：", out[0]["token_ids"], "→ 相同：", ref[0]["token_ids"] == out[0]["token_ids"])

# %% [markdown]
# ## 2. 长提示词来了，正在解码的请求怎样？
#
# 先让 3 个短请求开始解码，再来一个 302 token 的长提示词。不分块时，长提示词一步算完——这一步特别长；
# 分块后每一步的计算量都不超过预算，短请求在长提示词的各块之间继续推进或在同一步里搭车。
# 每格的数字是这一步为该请求计算的 token 数，最上面一行是这一步的合计（≈ 这一步的耗时）。

# %%
SHORT = ["Hello, my name is", "The sky is", "1, 2, 3,"]


def long_arrives(max_extend_tokens: int, long_repeat: int = 25, show: bool = True) -> list[dict]:
    llm = LLM(TINY, dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512,
              max_extend_tokens=max_extend_tokens)  # fmt: skip
    rec = StepRecorder(llm)
    sp = SamplingParams(max_tokens=10, ignore_eos=True)
    uids = [llm.add_request(llm.tokenizer.encode(p), sp) for p in SHORT]
    llm.step()
    llm.step()  # 短请求预填充完，又解码了一步
    long_ids = llm.tokenizer.encode("Explain, step by step, why the sky is blue. " * long_repeat)
    uids.append(llm.add_request(long_ids, SamplingParams(max_tokens=4, ignore_eos=True)))
    llm.run_until_idle()
    outs = [llm.status.pop(u).output_ids for u in uids]
    llm.check_integrity()
    totals = [sum(e for _, e, _ in s["reqs"]) for s in rec.steps]
    long_chunks = [e for s in rec.steps for u, e, _ in s["reqs"] if u == uids[-1] and s["phase"] == "prefill"]
    print(f"max_extend_tokens={max_extend_tokens}：长提示词 {len(long_ids)} 个 token 分成 {long_chunks}；共 {len(rec.steps)} 步")
    print(f"每步合计计算的 token 数：{totals}（最大 {max(totals)}）")
    print("每个请求的输出长度：", [len(o) for o in outs])
    if show:
        draw_steps(rec.steps, budget=max_extend_tokens if max_extend_tokens < 8192 else None)
    llm.shutdown()
    return outs


no_chunk = long_arrives(8192)
chunked = long_arrives(96)
print("两种方式的输出完全相同：", no_chunk == chunked)
plt.show()

# %% [markdown]
# ## 3. 动手调：预算和提示词长度

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

explorer = Explorer(
    long_arrives,
    title="分块预填充",
    max_extend_tokens=widgets.SelectionSlider(options=[16, 32, 64, 96, 128, 256, 8192], value=96, description="预算"),
    long_repeat=widgets.IntSlider(value=25, min=1, max=40, description="长提示词×"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
explorer.run(max_extend_tokens=64, long_repeat=10)

# %% [markdown]
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

# %% [markdown]
# ## 检查你的代码
#
# 写完 `stage2/chunked_prefill.py` 里的任务后运行下面这一格（`python -m minisgl.course check chunked_prefill`）。

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("chunked_prefill")
