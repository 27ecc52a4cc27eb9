# %% [markdown] tags=["lang-zh"]
# # 第 1.5 章 attention：变长批次与分页 KV 上的注意力
#
# 一个批次里，每个请求本轮有 `extend_len` 个 query（预填充时是整段未缓存的提示词，解码时是 1），
# 它们要看到这个请求的全部 `device_len` 个 key：前 `cached_len` 个早已在 KV 池里，后面的是这一轮刚写进去的。
# K/V 在池里的位置由页表给出；因果掩码要错开 `cached_len`：第 i 个 query 的绝对位置是 `cached_len + i`。
#
# 后端接口只有两步：每批一次 `prepare_metadata(batch)`，每层一次 `forward(q, k, v, layer_id, batch)`。
# 本章写两个后端：`torch`（逐个请求 gather → 掩码 → einsum，一眼能看懂）和 `sdpa`（补齐成矩形，一次
# `F.scaled_dot_product_attention`，CPU 上的默认）。CUDA 上装了 FlashInfer / FlashAttention 会自动选用它们。

# %% [markdown] tags=["lang-en"]
# # Chapter 1.5 attention: attention over variable-length batches and paged KV
#
# In a batch, each request has `extend_len` queries this round (the whole uncached prompt in prefill, 1 in decode), and
# they must see all `device_len` keys of that request: the first `cached_len` have long been in the KV pool, the rest were
# just written this round. Where the K/V sit in the pool is given by the page table; the causal mask is shifted by
# `cached_len`: the absolute position of query i is `cached_len + i`.
#
# The backend interface has only two steps: `prepare_metadata(batch)` once per batch and `forward(q, k, v, layer_id, batch)`
# once per layer. This chapter writes two backends: `torch` (per request gather → mask → einsum, readable at a glance) and
# `sdpa` (padded into a rectangle, a single `F.scaled_dot_product_attention`, the default on the CPU). On CUDA, FlashInfer /
# FlashAttention are picked automatically when installed.

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
# 本章的任务（和 stage1/attention.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage1/attention.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("attention")

# %% [markdown] tags=["lang-zh"]
# ## 1. 变长批次的元数据
#
# 三个请求放进同一批：A 是全新的预填充，B 的前 3 个 token 命中了前缀缓存，C 在解码。
# 它们的 query 拼成一个一维序列，`cu_seqlens_q`（前缀和）告诉后端每个请求的 query 在哪一段。

# %% [markdown] tags=["lang-en"]
# ## 1. Metadata of a variable-length batch
#
# Three requests in one batch: A is a fresh prefill, B hit 3 tokens in the prefix cache, C is decoding.
# Their queries are concatenated into one flat sequence; `cu_seqlens_q` (prefix sums) tells the backend where each request's queries are.

# %%
import torch

from minisgl.attention import make_varlen_metadata
from minisgl.core import Batch, Req, SamplingParams

specs = [("A", 0, 5), ("B", 3, 7), ("C", 6, 7)]  # (名字, cached_len, device_len) | en: (name, cached_len, device_len)


def make_reqs(specs):
    return [
        Req(torch.arange(n, dtype=torch.int32), table_idx=i, cached_len=c, output_len=4, uid=i, sampling_params=SamplingParams())
        for i, (_, c, n) in enumerate(specs)
    ]


batch = Batch(make_reqs(specs), "prefill")
md = make_varlen_metadata(batch, torch.device("cpu"))
for (name, c, n), r in zip(specs, batch.reqs):
    print(tr("request {name}: cached_len={c} device_len={n} → queries this round: {extend_len}, keys attended to: {n}", name=name, c=c, n=n, extend_len=r.extend_len))
last = md.get_last_indices(batch.size).tolist()
print(tr("cu_seqlens_q = {cu_seqlens_q} ; index of each request's last query = {last}", cu_seqlens_q=md.cu_seqlens_q.tolist(), last=last))

# %% [markdown] tags=["lang-zh"]
# ## 2. 错开 cached_len 的因果掩码
#
# 请求 B：4 个 query（绝对位置 3…6）× 7 个 key。前 3 列是缓存里的前缀，每个 query 都能看到；之后是下三角。

# %% [markdown] tags=["lang-en"]
# ## 2. A causal mask shifted by cached_len
#
# Request B: 4 queries (absolute positions 3…6) × 7 keys. The first 3 columns are the cached prefix, visible to every query; after them the mask is lower triangular.

# %%
import matplotlib.pyplot as plt

from minisgl.attention import causal_mask_with_prefix
from minisgl.notebook import draw_mask

mask = causal_mask_with_prefix(3, 7)
print(mask.int())
draw_mask(mask, 3, title=tr("request B: cached_len=3, seq_len=7"))
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 3. 在分页 KV 上算，和“从头算”的结果对照
#
# 造一个 KV 池和页表（页故意不连续），先把每个请求缓存部分的 K/V 写进池里，再让后端算本轮的注意力。
# 参考答案：把整个序列当作没有缓存，用普通的因果注意力从头算一遍，取最后 `extend_len` 行。

# %% [markdown] tags=["lang-en"]
# ## 3. Computing on paged KV, checked against computing from scratch
#
# Build a KV pool and a page table (pages deliberately not contiguous), first write the K/V of each request's cached part
# into the pool, then let the backend compute this round's attention.
# The reference: treat the whole sequence as uncached, compute plain causal attention from scratch and take the last `extend_len` rows.

# %%
import torch.nn.functional as F

from minisgl.attention import create_attention_backend
from minisgl.kvcache import MHAKVCache, create_page_table, pages_to_slots

HQ, HKV, D, PAGE = 4, 2, 16, 4


def setup(specs, page_size=PAGE, seed=0):
    """KV 池 + 页表 + 每个请求完整序列的 q/k/v；缓存部分的 K/V 先写进池里。

    en: KV pool + page table + q/k/v of each request's whole sequence; the cached part's K/V is written to the pool first.
    """
    g = torch.Generator().manual_seed(seed)
    max_len = max(n for _, _, n in specs)
    num_pages = len(specs) * -(-max_len // page_size) + 2
    cache = MHAKVCache(HKV, 1, D, num_pages, page_size, torch.float32, "cpu")
    table = create_page_table(len(specs), max_len, "cpu")
    free = torch.randperm(num_pages, generator=g)
    full = []
    for i, (_, c, n) in enumerate(specs):
        need = -(-n // page_size)
        pages, free = free[:need], free[need:]
        table[i, :n] = pages_to_slots(pages.to(torch.int32), page_size)[:n]
        q, k, v = torch.randn(n, HQ, D, generator=g), torch.randn(n, HKV, D, generator=g), torch.randn(n, HKV, D, generator=g)
        cache.store_kv(k[:c], v[:c], table[i, :c], layer_id=0)  # 早先几轮已经写进去的前缀 | en: the prefix written by earlier rounds
        full.append((q, k, v))
    return cache, table, full


def run_backend(name, specs, cache, table, full):
    backend = create_attention_backend(name, cache, table, HQ)
    batch = Batch(make_reqs(specs), "prefill")
    batch.out_loc = torch.cat([table[i, c:n] for i, (_, c, n) in enumerate(specs)])
    backend.prepare_metadata(batch)
    q = torch.cat([f[0][c:n] for f, (_, c, n) in zip(full, specs)])
    k = torch.cat([f[1][c:n] for f, (_, c, n) in zip(full, specs)])
    v = torch.cat([f[2][c:n] for f, (_, c, n) in zip(full, specs)])
    return backend.forward(q, k, v, layer_id=0, batch=batch)


def reference(specs, full):
    outs = []
    for (q, k, v), (_, c, n) in zip(full, specs):
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True)
        outs.append(o.transpose(0, 1)[c:n])
    return torch.cat(outs)


cache, table, full = setup(specs)
ref = reference(specs, full)
for name in ["torch", "sdpa"]:
    c2, t2, f2 = setup(specs)  # 每个后端用一份新的池子（forward 会写 KV） | en: a fresh pool for each backend (forward writes KV)
    out = run_backend(name, specs, c2, t2, f2)
    print(tr("{name:<6}output {shape}, same as computing from scratch: {same}", name=name, shape=tuple(out.shape), same=torch.allclose(out, ref, atol=1e-05)))

# %% [markdown] tags=["lang-zh"]
# ## 4. SDPA 后端：补齐成矩形
#
# SDPA 要求矩形输入：把每个请求的 query 补到 `max_q`、key 补到 `max_k`，补出来的位置靠掩码屏蔽。
# 解码批次里 `max_q = 1`，几乎没有浪费；预填充和解码混在一起时浪费就多了（第 2.4 章的分块预填充会遇到）。

# %% [markdown] tags=["lang-en"]
# ## 4. The SDPA backend: padding to a rectangle
#
# SDPA needs rectangular inputs: each request's queries are padded to `max_q` and its keys to `max_k`, and the padded
# positions are masked out. In a decode batch `max_q = 1`, so almost nothing is wasted; when prefill and decode are mixed
# the waste grows (the chunked prefill of chapter 2.4 runs into this).

# %%
from minisgl.attention import SDPAAttnBackend


def draw_padding(specs) -> None:
    cache, table, _ = setup(specs)
    backend = SDPAAttnBackend(cache, table)
    batch = Batch(make_reqs(specs), "prefill")
    backend.prepare_metadata(batch)
    md = batch.attn_metadata
    bs, max_q = md.q_index.shape
    real = sum(r.extend_len for r in batch.reqs)
    print(tr("{bs} requests, padded to {bs} × {max_q} queries ({real} real, {padded} padding); keys padded to {max_k}", bs=bs, max_q=max_q, real=real, padded=bs * max_q - real, max_k=md.kv_slots.shape[1]))
    fig, ax = plt.subplots(figsize=(0.5 * max_q + 2, 0.5 * bs + 1))
    for b, r in enumerate(batch.reqs):
        for i in range(max_q):
            ax.add_patch(plt.Rectangle((i, b), 1, 1, facecolor="#f4a261" if i < r.extend_len else "#e9ecef", edgecolor="white"))
    ax.set_xlim(0, max_q)
    ax.set_ylim(bs, 0)
    ax.set_yticks([b + 0.5 for b in range(bs)], [tr("request {uid}", uid=specs[b][0]) for b in range(bs)])
    ax.set_xlabel(tr("query slot (orange: real, gray: padding)"))


draw_padding(specs)
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 5. 动手调：一个请求的 cached_len 和 seq_len
#
# 拖动看掩码怎样错开，并用两个后端各算一遍、与从头算的结果核对。

# %% [markdown] tags=["lang-en"]
# ## 5. Try it: cached_len and seq_len of one request
#
# Drag the sliders to see how the mask shifts; both backends compute it and are checked against computing from scratch.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def explore(cached_len: int, seq_len: int, page_size: int) -> None:
    cached_len = min(cached_len, seq_len - 1)
    one = [("X", cached_len, seq_len)]
    ref = reference(one, setup(one, page_size)[2])
    for name in ["torch", "sdpa"]:
        out = run_backend(name, one, *setup(one, page_size))
        print(tr("{name:<6}queries × keys = {n_queries} × {seq_len}, page_size={page_size}: same as from scratch {same}", name=name, n_queries=seq_len - cached_len, seq_len=seq_len, page_size=page_size, same=torch.allclose(out, ref, atol=1e-05)))
    draw_mask(causal_mask_with_prefix(cached_len, seq_len), cached_len, title=tr("cached_len={cached_len}, seq_len={seq_len}", cached_len=cached_len, seq_len=seq_len))


explorer = Explorer(
    explore,
    title=tr("Shifted causal mask"),
    cached_len=widgets.IntSlider(value=3, min=0, max=15, description="cached_len"),
    seq_len=widgets.IntSlider(value=7, min=1, max=16, description="seq_len"),
    page_size=widgets.SelectionSlider(options=[1, 2, 4, 8], value=4, description="page_size"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (this checks it without a browser)
explorer.run(cached_len=9, seq_len=10, page_size=2)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 请求的 `cached_len = 4`、`device_len = 6`。本轮第 0 个 query 能看到哪些 key？
#
# <details><summary>答案</summary>
#
# 它的绝对位置是 4，能看到位置 0…4 的 5 个 key（位置 5 是本轮第 1 个 query 自己的 key，看不到）。
# </details>
#
# 2. 后端的 `forward` 为什么要先 `store_kv` 再算注意力？
#
# <details><summary>答案</summary>
#
# 本轮的 query 也要看本轮的 key（包括自己）。先把本轮的 K/V 写进池子，就能统一按页表从池里取出这个请求的全部
# `device_len` 个 key，不必区分“缓存里的”和“刚算的”。
# </details>
#
# 3. SDPA 后端给补齐的 query 行也设了至少一个可见的 key，为什么？
#
# <details><summary>答案</summary>
#
# 一行全被屏蔽时手写 softmax 的分母是 0，得到 NaN（本仓库装的 PyTorch 在 CPU 上的 SDPA 对这种行返回 0，别的内核或版本未必）。
# 补齐的行的结果反正会被丢掉，但 NaN 可能在后续计算里传开，
# 让它们看见真实的 key 最省事。
# </details>
#
# 4. GQA 里 `num_qo_heads = 4`、`num_kv_heads = 2`。query 头 3 用哪个 KV 头？
#
# <details><summary>答案</summary>
#
# 每 `4 / 2 = 2` 个 query 头共用一个 KV 头：头 0、1 用 KV 头 0，头 2、3 用 KV 头 1（`repeat_interleave` 的排法）。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. A request has `cached_len = 4` and `device_len = 6`. Which keys can this round's query 0 see?
#
# <details><summary>Answer</summary>
#
# Its absolute position is 4, so it sees the 5 keys at positions 0…4 (position 5 is the key of this round's query 1, which it cannot see).
# </details>
#
# 2. Why does the backend's `forward` call `store_kv` before computing attention?
#
# <details><summary>Answer</summary>
#
# This round's queries must also see this round's keys (their own included). Once this round's K/V is in the pool, all
# `device_len` keys of the request can be fetched from the pool through the page table in one way, with no distinction
# between "cached" and "just computed".
# </details>
#
# 3. The SDPA backend gives each padded query row at least one visible key. Why?
#
# <details><summary>Answer</summary>
#
# When a whole row is masked, the denominator of a hand-written softmax is 0 and the result is NaN (the CPU SDPA of the
# PyTorch installed in this repository returns 0 for such rows, other kernels or versions may not).
# The results of padded rows are thrown away anyway, but a NaN may spread through later computation;
# letting them see a real key is the simplest fix.
# </details>
#
# 4. In GQA, `num_qo_heads = 4` and `num_kv_heads = 2`. Which KV head does query head 3 use?
#
# <details><summary>Answer</summary>
#
# Every `4 / 2 = 2` query heads share one KV head: heads 0 and 1 use KV head 0, heads 2 and 3 use KV head 1 (the `repeat_interleave` order).
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage1/attention.py` 里的任务后运行下面这一格（`python -m minisgl.course check attention`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage1/attention.py`, run the cell below (`python -m minisgl.course check attention`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("attention")
