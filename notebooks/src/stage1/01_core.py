# %% [markdown] tags=["lang-zh"]
# # 第 1.1 章 core：SamplingParams、Req、Batch、Context
#
# 第 0 步的朴素引擎里，一个请求就是一个不断变长的 token 列表。真正的引擎要同时伺候很多请求，
# 每个请求走到哪一步了、哪些 token 的 K/V 已经在缓存里、这一轮要算哪些 token，都得有人记账。
# 这一章的四样东西就是这本账：
#
# - **SamplingParams**：一个请求怎么采样（温度、top-k、top-p、种子、最多生成几个 token）；
# - **Req**：一个请求和它的三个长度 `cached_len ≤ device_len ≤ max_device_len`；
# - **Batch**：一次前向要算的一批请求（预填充或解码）；
# - **Context**：全局上下文，模型的各层在前向里从这里拿到当前批次。
#
# 这些类不做计算，但后面每一章读写 KV 缓存的位置都由它们的长度推出来。下面先看本章要你写的任务。

# %% [markdown] tags=["lang-en"]
# # Chapter 1.1 core: SamplingParams, Req, Batch, Context
#
# In the naive engine of step 0, a request is just a list of tokens that keeps growing. A real engine serves many requests
# at once, and someone has to keep the books: how far each request has got, which tokens already have their K/V in the
# cache, which tokens must be computed this round. The four things of this chapter are those books:
#
# - **SamplingParams**: how a request samples (temperature, top-k, top-p, seed, how many tokens at most);
# - **Req**: one request and its three lengths `cached_len ≤ device_len ≤ max_device_len`;
# - **Batch**: the requests computed by one forward pass (prefill or decode);
# - **Context**: the global context, from which every layer of the model gets the current batch during a forward pass.
#
# These classes compute nothing, but in every later chapter the positions read and written in the KV cache are derived from
# their lengths. First, the tasks this chapter asks you to write.

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
# 本章的任务（和 stage1/core.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage1/core.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("core")

# %% [markdown] tags=["lang-zh"]
# ## 1. 采样参数
#
# `temperature <= 0` 或 `top_k == 1` 就是贪心。`validate()` 把不可能的参数挡在门外——
# 否则要等到采样时才冒出 NaN 或越界。

# %% [markdown] tags=["lang-en"]
# ## 1. Sampling parameters
#
# `temperature <= 0` or `top_k == 1` means greedy. `validate()` rejects impossible parameters up front —
# otherwise they would only show up at sampling time as NaN or an out-of-range index.

# %%
import torch

from minisgl.core import Batch, Context, Req, SamplingParams

for sp in [SamplingParams(), SamplingParams(temperature=0.8, top_k=1), SamplingParams(temperature=0.7, top_p=0.9)]:
    print(sp, tr("→ greedy") if sp.is_greedy else tr("→ random sampling"))

for bad in [dict(temperature=-1.0), dict(top_k=0), dict(top_p=0.0), dict(max_tokens=0)]:
    try:
        SamplingParams(**bad).validate()
    except ValueError as err:
        print(tr("{bad}: ValueError: {err}", bad=bad, err=err))

# %% [markdown] tags=["lang-zh"]
# ## 2. 请求的三个长度
#
# 拿一句真正的提示词（Qwen3 分词器），建一个最多生成 4 个 token 的请求：
#
# - `cached_len`：K/V 已经写进缓存的 token 数，一开始是 0；
# - `device_len`：已知的 token 数（提示词 + 已生成的），一开始是提示词长度；
# - `max_device_len`：提示词长度 + `max_tokens`，请求最多走到这里；
# - 本轮要算的就是中间那一段：`extend_len = device_len - cached_len`。

# %% [markdown] tags=["lang-en"]
# ## 2. The three lengths of a request
#
# Take a real prompt (Qwen3 tokenizer) and build a request that generates at most 4 tokens:
#
# - `cached_len`: the number of tokens whose K/V is already written to the cache, 0 at first;
# - `device_len`: the number of known tokens (prompt + generated), the prompt length at first;
# - `max_device_len`: prompt length + `max_tokens`, as far as the request can go;
# - what this round computes is the part in between: `extend_len = device_len - cached_len`.

# %%
from transformers import AutoTokenizer

from minisgl.model_zoo import tokenizer_dir

tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
prompt = "The capital of France is"
ids = tokenizer.encode(prompt)
print(tr("prompt {prompt!r} → {n_ids} tokens: {ids}", prompt=prompt, n_ids=len(ids), ids=ids))

sp = SamplingParams(max_tokens=4)
req = Req(torch.tensor(ids, dtype=torch.int32), table_idx=0, cached_len=0, output_len=sp.max_tokens, uid=0, sampling_params=sp)
print(req)
print(f"extend_len={req.extend_len}  remain_len={req.remain_len}  can_decode={req.can_decode}")

# %% [markdown] tags=["lang-zh"]
# 每发出一次前向，发出它的一方（第 1.6 章手工驱动时是我们，第 2 阶段是调度器）就对批次里的每个请求调用一次
# `complete_one()`：这一轮的 token 都进了缓存
# （`cached_len` 追上 `device_len`），并且多了一个刚采样的 token（`device_len` 加一）。
# 采样结果拷回 CPU 以后，再用 `append_host` 把它接到 `input_ids` 后面。
# 下面手工模拟一次预填充和三次解码（“采样”出的 token 是随便编的）。

# %% [markdown] tags=["lang-en"]
# Each time a forward pass is issued, whoever issues it (we do in chapter 1.6, driving it by hand; the scheduler does in
# stage 2) calls `complete_one()` once for every request in the batch: this round's tokens are now in the cache
# (`cached_len` catches up with `device_len`), and there is one more freshly sampled token (`device_len` plus one).
# Once the sampled token has been copied back to the CPU, `append_host` appends it to `input_ids`.
# Below we simulate one prefill and three decodes by hand (the "sampled" tokens are made up).

# %%
snapshots = [(tr("before prefill"), [(req.uid, req.cached_len, req.device_len, req.max_device_len)])]
fake_tokens = [12095, 13, 576, 6722]
for step, token in enumerate(fake_tokens):
    phase = tr("prefill") if step == 0 else tr("decode")
    extend = req.extend_len
    req.complete_one()
    req.append_host(torch.tensor([token], dtype=torch.int32))
    print(tr("step {step} ({phase}): computed {extend} token(s) → {req}, can_decode={can_decode}", step=step, phase=phase, extend=extend, req=req, can_decode=req.can_decode))
    if step == 0:
        snapshots.append((tr("after prefill"), [(req.uid, req.cached_len, req.device_len, req.max_device_len)]))
print(tr("input_ids now has {n_input_ids} tokens", n_input_ids=len(req.input_ids)))

# %% [markdown] tags=["lang-zh"]
# 用图看预填充前后：绿色已缓存，橙色是下一轮要算的，斜线是还能生成的。
# 预填充之后橙色只剩 1 格——这就是解码每步只算 1 个 token 的原因。

# %% [markdown] tags=["lang-en"]
# The same before and after prefill, as a picture: green is cached, orange is what the next round computes, hatched is what
# can still be generated. After prefill only 1 orange cell is left — which is why each decode step computes just 1 token.

# %%
import matplotlib.pyplot as plt

from minisgl.notebook import draw_req_lengths

draw_req_lengths(snapshots, title=tr("The three lengths of a Req"))
plt.show()

# %% [markdown] tags=["lang-zh"]
# 不变式 `0 <= cached_len < device_len <= max_device_len` 在构造时就检查：

# %% [markdown] tags=["lang-en"]
# The invariant `0 <= cached_len < device_len <= max_device_len` is checked at construction:

# %%
for cached in [0, len(ids) - 1, len(ids)]:
    try:
        Req(torch.tensor(ids, dtype=torch.int32), table_idx=0, cached_len=cached, output_len=4, uid=1, sampling_params=sp)
        print(tr("cached_len={cached}: fine ({left} prompt token(s) still to compute)", cached=cached, left=len(ids) - cached))
    except ValueError as err:
        print(tr("cached_len={cached}: ValueError: {err}", cached=cached, err=err))

# %% [markdown] tags=["lang-zh"]
# ## 3. 批次和上下文
#
# 一个批次里的请求可以处在不同的位置。预填充批次里每个请求要算的 token 数不同，它们按请求顺序
# 拼成一个一维的 `input_ids`，总长是各请求 `extend_len` 之和。第 2.3 章的前缀缓存会让 `cached_len`
# 一开始就大于 0——请求 B 假装已经命中了 3 个 token 的缓存。

# %% [markdown] tags=["lang-en"]
# ## 3. Batches and the context
#
# The requests of one batch can be at different places. In a prefill batch each request computes a different number of
# tokens; they are concatenated in request order into one flat `input_ids`, whose length is the sum of the requests'
# `extend_len`. The prefix cache of chapter 2.3 makes `cached_len` larger than 0 from the start — request B pretends it
# already hit 3 cached tokens.

# %%
reqs = [
    Req(torch.tensor(ids, dtype=torch.int32), table_idx=0, cached_len=0, output_len=4, uid=10, sampling_params=sp),
    Req(torch.tensor(ids, dtype=torch.int32), table_idx=1, cached_len=3, output_len=4, uid=11, sampling_params=sp),
]
batch = Batch(reqs=reqs, phase="prefill")
print(f"phase={batch.phase} size={batch.size} is_prefill={batch.is_prefill}")
extend_lens = [r.extend_len for r in batch.reqs]
print(tr("extend_len of each request: {extend_lens} → {total} tokens in this batch", extend_lens=extend_lens, total=sum(extend_lens)))
print(tr("position of each token (positions):"), torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs]).tolist())

# %% [markdown] tags=["lang-zh"]
# `Context.forward_batch` 是一个 with 块：块里 `ctx.batch` 就是当前批次，离开时（包括出错）一定清掉；
# 不允许嵌套。

# %% [markdown] tags=["lang-en"]
# `Context.forward_batch` is a with block: inside it `ctx.batch` is the current batch, and it is always cleared on the way
# out (errors included); nesting is not allowed.

# %%
ctx = Context(page_size=1)
with ctx.forward_batch(batch):
    print(tr("inside the block: ctx.batch.size ="), ctx.batch.size)
try:
    ctx.batch
except RuntimeError as err:
    print(tr("outside the block: RuntimeError:"), err)
try:
    with ctx.forward_batch(batch):
        raise ValueError(tr("error in the forward pass"))
except ValueError:
    pass
try:
    ctx.batch
except RuntimeError:
    print(tr("after the error the batch is cleared: ctx.batch raises RuntimeError"))
try:
    with ctx.forward_batch(batch):
        with ctx.forward_batch(batch):
            pass
except RuntimeError as err:
    print(tr("nested: RuntimeError:"), err)

# %% [markdown] tags=["lang-zh"]
# ## 4. 动手调：提示词、max_tokens、命中的前缀
#
# 改提示词、`max_tokens` 和“前缀缓存命中了几个 token”，看请求从预填充到结束每一步算多少个 token。

# %% [markdown] tags=["lang-en"]
# ## 4. Try it: prompt, max_tokens, cached prefix
#
# Change the prompt, `max_tokens` and "how many tokens the prefix cache hit", and see how many tokens the request computes
# at each step from prefill to the end.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def lifecycle(prompt: str, max_tokens: int, cached: int) -> None:
    ids = tokenizer.encode(prompt) or [0]
    cached = min(cached, len(ids) - 1)
    r = Req(torch.tensor(ids, dtype=torch.int32), 0, cached, max_tokens, 0, SamplingParams(max_tokens=max_tokens))
    shots = [(tr("start"), [(0, r.cached_len, r.device_len, r.max_device_len)])]
    work = []
    while True:
        work.append(r.extend_len)
        r.complete_one()
        r.append_host(torch.tensor([0], dtype=torch.int32))
        if len(work) == 1:
            shots.append((tr("after prefill"), [(0, r.cached_len, r.device_len, r.max_device_len)]))
        if not r.can_decode:
            break
    shots.append((tr("end"), [(0, r.cached_len, r.device_len, r.max_device_len)]))
    print(tr("prompt of {n_ids} tokens, {cached} cached; {n_work} forward passes, tokens computed in each: {work}", n_ids=len(ids), cached=cached, n_work=len(work), work=work))
    print(tr("at the end: {r}", r=r))
    draw_req_lengths(shots)


explorer = Explorer(
    lifecycle,
    title=tr("The life of a request"),
    prompt=widgets.Text(value="The capital of France is", description=tr("prompt")),
    max_tokens=widgets.IntSlider(value=4, min=1, max=16, description="max_tokens"),
    cached=widgets.IntSlider(value=0, min=0, max=16, description=tr("cached prefix")),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (this checks it without a browser)
explorer.run(prompt="You are a helpful assistant. What is 2 + 2?", max_tokens=3, cached=6)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 一个提示词 10 个 token、`max_tokens=5` 的请求，从开始到结束一共前向几次？每次的 `extend_len` 是多少？
#
# <details><summary>答案</summary>
#
# 5 次：预填充一次算 10 个，之后 4 次解码各算 1 个（第 5 个输出 token 由第 5 次前向采样得到，
# 之后 `remain_len = 0`，不再前向）。`extend_len` 依次是 10, 1, 1, 1, 1。
# </details>
#
# 2. 为什么 `complete_one()` 在前向 **发出** 时就推进长度，而不是等采样结果拷回 CPU？
#
# <details><summary>答案</summary>
#
# 这样调度器可以马上为下一步准备批次（位置、写入槽位都只依赖长度），不必等这一步算完；
# 第 2.5 章的重叠调度正是靠这一点让准备和计算同时进行。代价是：要读本轮的 `extend_len`，
# 必须在前向之前读。
# </details>
#
# 3. 为什么不变式要求 `cached_len < device_len`（严格小于）？
#
# <details><summary>答案</summary>
#
# 每次前向至少要算一个 token，才有最后一个位置的 logits 可以采样。即使整段提示词都在前缀缓存里，
# 也要留下最后一个 token 重算一遍。
# </details>
#
# 4. `Req` 为什么用 `@dataclass(eq=False)`？
#
# <details><summary>答案</summary>
#
# 请求按身份比较：两个内容一样的请求仍是两个请求。调度器把请求放进 dict / set，
# 按值比较会把它们混为一谈（而且 dataclass 的 `eq=True` 会让对象不可哈希）。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. A request has a 10-token prompt and `max_tokens=5`. How many forward passes does it take from start to end? What is `extend_len` each time?
#
# <details><summary>Answer</summary>
#
# 5: one prefill computes 10, then 4 decodes compute 1 each (the 5th output token is sampled by the 5th forward pass,
# after which `remain_len = 0` and there is no further forward pass). `extend_len` is 10, 1, 1, 1, 1.
# </details>
#
# 2. Why does `complete_one()` advance the lengths when the forward pass is **issued**, rather than when the sampled tokens are back on the CPU?
#
# <details><summary>Answer</summary>
#
# So that the scheduler can prepare the batch of the next step right away (positions and write slots depend only on the
# lengths) without waiting for this step to finish; the overlap scheduling of chapter 2.5 relies on exactly this to
# prepare and compute at the same time. The price: to read this round's `extend_len`, you must read it before the forward pass.
# </details>
#
# 3. Why does the invariant require `cached_len < device_len` (strictly less)?
#
# <details><summary>Answer</summary>
#
# Every forward pass must compute at least one token, so that there are logits at the last position to sample from. Even if
# the whole prompt is in the prefix cache, the last token is left out and computed again.
# </details>
#
# 4. Why does `Req` use `@dataclass(eq=False)`?
#
# <details><summary>Answer</summary>
#
# Requests compare by identity: two requests with the same content are still two requests. The scheduler puts requests in
# dicts and sets; comparing by value would mix them up (and `eq=True` would make a dataclass unhashable).
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage1/core.py` 里的任务后运行下面这一格：它对你的代码跑本章的检查（`python -m minisgl.course check core`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage1/core.py`, run the cell below: it runs this chapter's checks on your code (`python -m minisgl.course check core`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("core")
