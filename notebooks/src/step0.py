# %% [markdown] tags=["lang-zh"]
# # 第 0 步：一个文件的朴素推理引擎
#
# 课程从 `examples/step0_tiny_engine.py` 出发：一个文件、四个函数、不依赖本课程的任何代码。
# 它已经能和 Hugging Face `generate` 逐 token 一致，但每个部件都是最朴素的做法：
#
# | 第 0 步的做法 | 哪一章换掉它 |
# | --- | --- |
# | 一个请求就是一个 token 列表 | 1.1 core：`Req` 的长度记账、`Batch` |
# | 权重是一个 `{名字: 张量}` 字典，一次全读进来 | 1.2 layers、1.3 models：算子层、流式加载 |
# | 每层的 K/V 用 `torch.cat` 越拼越长 | 1.4 kvcache：预先分配的分页 KV 池 |
# | einsum + 显式因果掩码，一次只算一个请求 | 1.5 attention：变长批次、分页 KV |
# | `argmax` | 1.6 engine：批量采样器（温度、top-k、top-p、种子） |
# | 一次只跑一个请求 | 第 2 阶段：调度器 |
#
# 这一步不用写代码：读懂它、跑一跑，后面每一章都会回头和它比较。

# %% [markdown] tags=["lang-en"]
# # Step 0: a naive inference engine in one file
#
# The course starts from `examples/step0_tiny_engine.py`: one file, four functions, no dependency on any code of this course.
# It already matches Hugging Face `generate` token for token, but every part is done the most naive way:
#
# | What step 0 does | The chapter that replaces it |
# | --- | --- |
# | A request is just a list of tokens | 1.1 core: length bookkeeping in `Req`, `Batch` |
# | Weights are a `{name: tensor}` dict, read all at once | 1.2 layers, 1.3 models: operator layers, streaming loading |
# | Each layer's K/V grows with `torch.cat` | 1.4 kvcache: a preallocated, paged KV pool |
# | einsum + an explicit causal mask, one request at a time | 1.5 attention: variable-length batches, paged KV |
# | `argmax` | 1.6 engine: a batched sampler (temperature, top-k, top-p, seed) |
# | Only one request runs at a time | Stage 2: the scheduler |
#
# There is no code to write in this step: read it and run it; every later chapter compares itself with it.

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
# ## 1. 导入并运行它
#
# 脚本不是包的一部分，按文件路径导入；它只有这几个函数。然后像在命令行里一样调用它的 `main()`，
# 用真实权重的小模型 SmolLM2-135M（Llama 结构）：
#
# ```
# python examples/step0_tiny_engine.py --model models/SmolLM2-135M-Instruct --max-tokens 8
# ```

# %% [markdown] tags=["lang-en"]
# ## 1. Import it and run it
#
# The script is not part of a package, so we import it by file path; it has only these few functions. Then we call its
# `main()` as if from the command line, with SmolLM2-135M, a small model with real weights (Llama architecture):
#
# ```
# python examples/step0_tiny_engine.py --model models/SmolLM2-135M-Instruct --max-tokens 8
# ```

# %%
import importlib.util
import inspect

from minisgl.model_zoo import smollm2

spec = importlib.util.spec_from_file_location("step0", ROOT / "examples" / "step0_tiny_engine.py")
step0 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(step0)
what = {
    "load": tr("reads config.json, all the weights (one dict) and the tokenizer"),
    "rms_norm": tr("RMS normalization"),
    "forward": tr("computes the new tokens ids after the cache kv, returns the logits of the last position; kv grows in place"),
    "generate": tr("greedy generation: the whole prompt once (prefill), then one new token per step (decode)"),
}
for name, summary in what.items():
    n_lines = len(inspect.getsource(getattr(step0, name)).splitlines())
    print(tr("{name:<9}{n_lines:>4} lines  {summary}", name=name, n_lines=n_lines, summary=summary))

# %%
SMOL = smollm2()
sys.argv = ["step0_tiny_engine.py", "--model", str(SMOL), "--max-tokens", "8"]
step0.main()

# %% [markdown] tags=["lang-zh"]
# ## 2. 生成：预填充一次，解码 N 次
#
# `generate` 是整个“引擎”：先把整段提示词算一遍（预填充），之后每步只把上一步的新 token 喂进去（解码）。

# %% [markdown] tags=["lang-en"]
# ## 2. Generation: prefill once, decode N times
#
# `generate` is the whole "engine": first it computes the whole prompt in one pass (prefill), then each step feeds in only
# the token produced by the previous step (decode).

# %%
from minisgl.notebook import show_source

show_source(step0.generate)

# %% [markdown] tags=["lang-zh"]
# ## 3. 和 Hugging Face 逐 token 对照

# %% [markdown] tags=["lang-en"]
# ## 3. Token by token against Hugging Face

# %%
import torch
from transformers import AutoModelForCausalLM

cfg, weights, tok = step0.load(SMOL)
prompt = "The capital of France is"
prompt_ids = tok(prompt)["input_ids"]
ours = step0.generate(cfg, weights, prompt_ids, 8)

hf = AutoModelForCausalLM.from_pretrained(SMOL, dtype=torch.float32)
ids = torch.tensor([prompt_ids])
ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)[0, len(prompt_ids) :].tolist()
print(tr("step 0:"), ours, repr(tok.decode(ours)))
print(tr("HF    :"), ref, repr(tok.decode(ref)))
print(tr("identical:"), ours == ref)

# %% [markdown] tags=["lang-zh"]
# ## 4. KV 缓存越拼越长
#
# `forward(cfg, w, ids, kv)` 把新 token 接在缓存 `kv` 之后算一遍，`kv` 原地变长。
# 看每一步喂进去几个 token、缓存里有几个 token 的 K/V：预填充一次算 5 个，之后每步 1 个。

# %% [markdown] tags=["lang-en"]
# ## 4. A KV cache that keeps growing
#
# `forward(cfg, w, ids, kv)` computes the new tokens after the cache `kv`, and `kv` grows in place.
# Look at how many tokens each step feeds in and how many tokens have K/V in the cache: prefill computes 5 at once, then 1 per step.

# %%
kv = []
step_ids = torch.tensor(prompt_ids)
for step in range(4):
    fed = len(step_ids)
    next_id = int(step0.forward(cfg, weights, step_ids, kv).argmax())
    k0 = kv[0][0]
    print(tr("step {step}: fed {fed} token(s) → layer 0 K has shape {shape} (tokens, KV heads, head_dim), generated {token!r}", step=step, fed=fed, shape=tuple(k0.shape), token=tok.decode([next_id])))
    step_ids = torch.tensor([next_id])

# %% [markdown] tags=["lang-zh"]
# 每一步 `torch.cat` 都重新分配一块更大的内存、把旧的 K/V 全拷一遍；而且每个请求一份，
# 没法把几个请求放进同一次矩阵乘法。第 1.4 章换成一整块预先分配、按页分给请求的 KV 池。
#
# ## 5. 因果掩码
#
# 第 `i` 个新 token 的绝对位置是 `start + i`（`start` = 已缓存的 token 数），它只能看到位置不超过自己的 key。
# 预填充时是一个下三角；解码时只有一行，能看到全部缓存。第 1.5 章的注意力后端对每个请求都这样错开 `cached_len`。

# %% [markdown] tags=["lang-en"]
# Every `torch.cat` allocates a larger block of memory and copies all the old K/V again; and each request has its own
# copy, so several requests cannot share one matrix multiplication. Chapter 1.4 replaces it with a single preallocated KV
# pool handed out to requests page by page.
#
# ## 5. The causal mask
#
# The `i`-th new token sits at absolute position `start + i` (`start` = number of cached tokens), and it can only see keys
# at positions up to its own. In prefill the mask is lower triangular; in decode it is a single row that sees the whole
# cache. The attention backend of chapter 1.5 shifts each request by its own `cached_len` in the same way.

# %%
import matplotlib.pyplot as plt

from minisgl.notebook import draw_mask

n = len(prompt_ids)
prefill_mask = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
decode_mask = torch.arange(n + 1)[None, :] <= torch.tensor([n])[:, None]
draw_mask(prefill_mask, 0, title=tr("prefill: 5 queries × 5 keys"))
draw_mask(decode_mask, n, title=tr("decode: 1 query × 6 keys (the first 5 from the cache)"))
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 6. 动手调：提示词和生成长度
#
# 改提示词、生成长度，看 SmolLM2 说什么、每步喂入几个 token、缓存长到多少。

# %% [markdown] tags=["lang-en"]
# ## 6. Try it: prompt and generation length
#
# Change the prompt and the number of tokens to generate, and see what SmolLM2 says, how many tokens each step feeds in and
# how large the cache grows.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def run_step0(prompt: str, max_tokens: int) -> None:
    ids = tok(prompt)["input_ids"] or [0]
    kv, fed, cache = [], [], []
    cur, out = torch.tensor(ids), []
    for _ in range(max_tokens):
        fed.append(len(cur))
        nxt = int(step0.forward(cfg, weights, cur, kv).argmax())
        cache.append(kv[0][0].shape[0])
        out.append(nxt)
        cur = torch.tensor([nxt])
    print(tr("prompt of {n_ids} tokens → {text!r}", n_ids=len(ids), text=tok.decode(out)))
    print(tr("tokens fed per step: {fed}", fed=fed))
    print(tr("tokens in the cache after each step: {cache}", cache=cache))
    fig, ax = plt.subplots(figsize=(7, 2.6))
    ax.bar(range(len(cache)), cache, color="#6fa8dc", label=tr("tokens in the cache"))
    ax.bar(range(len(fed)), fed, color="#f4a261", label=tr("tokens fed in this step"))
    ax.set_xlabel(tr("step"))
    ax.legend(fontsize=8)


explorer = Explorer(
    run_step0,
    title=tr("Step 0 engine"),
    prompt=widgets.Text(value="The capital of France is", description=tr("prompt")),
    max_tokens=widgets.IntSlider(value=8, min=1, max=24, description=tr("tokens to generate")),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (this checks it without a browser)
explorer.run(prompt="The three primary colors are", max_tokens=10)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 第 0 步的引擎生成 N 个 token，一共调用几次 `forward`？第一次和之后每次各算多少个 token？
#
# <details><summary>答案</summary>
#
# N 次。第一次算整段提示词（预填充），之后每次只算上一步新生成的 1 个 token（解码）。
# </details>
#
# 2. 为什么解码时掩码只有一行、而且全是 `True`？
#
# <details><summary>答案</summary>
#
# 解码时只有 1 个新 query，它的位置是序列里最后一个，之前的所有 key（缓存里的和它自己）都在它前面，都能看。
# </details>
#
# 3. 如果两个请求想放进同一次前向，第 0 步的哪些地方不行？
#
# <details><summary>答案</summary>
#
# KV 缓存是每个请求一份、靠 `torch.cat` 变长的张量列表；注意力按一个请求的形状写死；
# 只取 `h[-1]` 一个位置的 logits；`argmax` 也只对一行。第 1 阶段的各章逐个解决这些问题。
# </details>
#
# 4. 为什么 `torch.cat` 式的 KV 缓存在长序列上越来越慢？
#
# <details><summary>答案</summary>
#
# 每步都分配一块新内存、把旧的 K/V 整个拷一遍，第 t 步拷 t 个 token，N 步总共拷 O(N²) 个 token；
# 预先分配好的池子只写新 token 的那一格。
# </details>
#
# 下一步：第 1.1 章 core，打开 `notebooks/stage1/01_core.ipynb`。

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. To generate N tokens, how many times does the step 0 engine call `forward`? How many tokens does the first call compute, and each later one?
#
# <details><summary>Answer</summary>
#
# N times. The first call computes the whole prompt (prefill); each later call computes only the 1 token generated by the previous step (decode).
# </details>
#
# 2. Why does the mask have only one row in decode, and why is it all `True`?
#
# <details><summary>Answer</summary>
#
# In decode there is only 1 new query, and it is the last position of the sequence: every key (those in the cache and its own) comes before it, so it may see them all.
# </details>
#
# 3. If two requests were to share one forward pass, what in step 0 would not work?
#
# <details><summary>Answer</summary>
#
# The KV cache is a per-request list of tensors that grows with `torch.cat`; attention is hard-wired to the shape of one
# request; only the logits of one position, `h[-1]`, are taken; and `argmax` works on a single row. The chapters of stage 1
# solve these one by one.
# </details>
#
# 4. Why does a `torch.cat`-style KV cache get slower and slower on long sequences?
#
# <details><summary>Answer</summary>
#
# Each step allocates a new block of memory and copies all the old K/V: step t copies t tokens, so N steps copy O(N²)
# tokens in total. A preallocated pool only writes the new token's slot.
# </details>
#
# Next: chapter 1.1 core, open `notebooks/en/stage1/01_core.ipynb`.
