# %% [markdown] tags=["lang-zh"]
# # 第 1.4 章 kvcache：分页 KV 池、页表、token 池
#
# 第 0 步用 `torch.cat` 让每个请求的 K/V 越拼越长：每步都要重新分配、拷贝，也没法把不同请求放进同一批。
# 这里换成启动时一次分配好的三样东西：
#
# - **KV 池**：每层一块 K、一块 V，各有 `num_pages × page_size` 个 token 槽位；
# - **页表**：`[max_running_req + 1, max_seq_len]` 的 int32，第 `table_idx` 行第 `pos` 列是那个请求第 `pos` 个 token
#   的 K/V 所在的槽位（页号 × page_size + 页内偏移）；
# - **token 池**：形状同页表，存每个位置的 token id，解码的输入在设备上直接按行列取。
#
# 页表按 token 记槽位，所以注意力后端查表时不必关心 `page_size`；`page_size` 只决定槽位怎样成组地分出去。

# %% [markdown] tags=["lang-en"]
# # Chapter 1.4 kvcache: the paged KV pool, the page table, the token pool
#
# Step 0 let each request's K/V grow with `torch.cat`: every step reallocates and copies, and different requests cannot
# share a batch. Here it is replaced by three things allocated once at startup:
#
# - **KV pool**: one K block and one V block per layer, each with `num_pages × page_size` token slots;
# - **page table**: an int32 `[max_running_req + 1, max_seq_len]`; row `table_idx`, column `pos` holds the slot of the K/V of
#   that request's token `pos` (page number × page_size + offset in the page);
# - **token pool**: same shape as the page table, holds the token id at each position, so the input of a decode step is taken straight from it on the device.
#
# The page table records slots per token, so the attention backend does not care about `page_size` when it looks slots up;
# `page_size` only decides how slots are handed out in groups.

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
# 本章的任务（和 stage1/kvcache.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage1/kvcache.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("kvcache")

# %% [markdown] tags=["lang-zh"]
# ## 1. 一页有多大
#
# 一页在所有层里占 `2（K 和 V）× 层数 × page_size × KV 头数 × head_dim × 每元素字节数`。
# 引擎用它从剩余内存算出能放几页（第 1.6 章）。

# %% [markdown] tags=["lang-en"]
# ## 1. How big is a page
#
# Across all layers a page takes `2 (K and V) × layers × page_size × KV heads × head_dim × bytes per element`.
# The engine uses it to work out how many pages fit in the free memory (chapter 1.6).

# %%
import torch

from minisgl.kvcache import MHAKVCache
from minisgl.model_zoo import smollm2, tiny_qwen3
from minisgl.models import ModelConfig

shapes = {name: ModelConfig.from_hf(p) for name, p in [(tr("tiny Qwen3"), tiny_qwen3()), ("SmolLM2-135M", smollm2())]}
rows = [(n, c.num_layers, c.num_kv_heads, c.head_dim) for n, c in shapes.items()]
rows.append((tr("Qwen3-0.6B (official)"), 28, 8, 128))
for name, layers, kv_heads, head_dim in rows:
    for dtype in (torch.float32, torch.bfloat16):
        per_token = MHAKVCache.bytes_per_page(kv_heads, layers, head_dim, 1, dtype)
        print(tr("{name:<24}{dtype:<16}{per_token:>8,} bytes per token; 1 GiB holds {n_tokens:>9,} tokens", name=name, dtype=str(dtype), per_token=per_token, n_tokens=2 ** 30 // per_token))

# %% [markdown] tags=["lang-zh"]
# ## 2. 池子、视图和写入
#
# 整个池子是一次分配的一个大张量（里面怎么摆是你在 `kv_pool_init` 里的设计），用 `torch.empty` 分配、不填 0
# （填 0 要把整块内存碰一遍：CPU 上整个池子立刻计入进程内存；不填则只有写过的页才占物理内存）。
# 所以没写过的槽位里可能是任何值，注意力只能读写过的槽位。下面先把这个小池子清零，写入的位置才看得出来。
# `k_cache(layer)` 是摊平成 `[槽位数, KV 头数, head_dim]` 的 **视图**，不拷贝。
# `store_kv` 只写 `out_loc` 指定的槽位，别处一个也不碰。

# %% [markdown] tags=["lang-en"]
# ## 2. The pool, views and writes
#
# The whole pool is one large tensor allocated once (how it is laid out is your design in `kv_pool_init`), allocated with
# `torch.empty`, not filled with 0 (filling touches the whole block: on the CPU the whole pool would count in the process's memory at once;
# unfilled, only pages written take physical memory). So an unwritten slot may hold anything, and attention must read
# written slots only. Below, the small pool is zeroed first so that the written slots show.
# `k_cache(layer)` is a **view** flattened to `[slots, KV heads, head_dim]`, no copy.
# `store_kv` writes only the slots given by `out_loc` and touches nothing else.

# %%
cache = MHAKVCache(num_kv_heads=2, num_layers=3, head_dim=4, num_pages=6, page_size=4, dtype=torch.float32, device="cpu")
cache.zero_()
print(tr("KV pool: {numel} numbers; slots: {num_slots}", numel=cache.k_cache(0).untyped_storage().nbytes() // cache.dtype.itemsize, num_slots=cache.num_slots))
k0 = cache.k_cache(0)
shared = all(view.untyped_storage().data_ptr() == k0.untyped_storage().data_ptr() for view in (cache.v_cache(0), cache.k_cache(2)))
print(tr("layer 0 K view: {shape}, contiguous: {contiguous} ; shares memory with the pool: {shared}", shape=tuple(k0.shape),
         contiguous=k0.is_contiguous(), shared=shared))
out_loc = torch.tensor([5, 6, 17], dtype=torch.int32)
k, v = torch.ones(3, 2, 4), torch.full((3, 2, 4), 2.0)
cache.store_kv(k, v, out_loc, layer_id=1)
written = [(layer, (cache.k_cache(layer).abs().sum(dim=(1, 2)) > 0).nonzero().flatten().tolist()) for layer in range(3)]
print(tr("slots that are non-zero in each layer after the write:"), written)

# %% [markdown] tags=["lang-zh"]
# ## 3. 页表：给请求安排槽位
#
# `pages_to_slots(pages, page_size)` 把页号展开成槽位：页 `p` 的槽位是 `p*page_size … p*page_size+page_size-1`。
# 取前 n 个写进页表的一行，就给一个 n 个 token 的请求安排好了位置。页不必连续——下面从一个打乱的空闲页列表里分。

# %% [markdown] tags=["lang-en"]
# ## 3. The page table: placing requests in slots
#
# `pages_to_slots(pages, page_size)` expands page numbers into slots: page `p` has slots `p*page_size … p*page_size+page_size-1`.
# Writing the first n of them into a row of the page table places a request of n tokens. Pages need not be contiguous — below
# they come from a shuffled list of free pages.

# %%
from minisgl.kvcache import create_page_table, pages_to_slots

print("pages_to_slots([3, 1], page_size=2) =", pages_to_slots(torch.tensor([3, 1]), 2).tolist())


def place(lengths: list[int], page_size: int, num_pages: int, seed: int = 0):
    """按提示词长度给每个请求分页，写页表；返回页表、每个槽位的主人、每个请求分到的页。

    en: Give each request pages for its prompt and fill the page table; return the table, each slot's owner, each request's pages.
    """
    table = create_page_table(max_running_req=len(lengths), max_seq_len=max(lengths) + 1, device="cpu")
    free = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).tolist()
    owners: list[int | None] = [None] * (num_pages * page_size)
    pages_of = []
    for row, n in enumerate(lengths):
        need = -(-(n + 1) // page_size)  # 提示词 + 下一个要生成的 token | en: prompt + the next token to generate
        if need > len(free):
            raise RuntimeError(tr("request {row} needs {need} page(s), only {n_free} left", row=row, need=need, n_free=len(free)))
        pages, free = free[:need], free[need:]
        slots = pages_to_slots(torch.tensor(pages, dtype=torch.int32), page_size)[: n + 1]
        table[row, : n + 1] = slots
        for s in slots.tolist():
            owners[s] = row
        pages_of.append(pages)
    return table, owners, pages_of


lengths, page_size, num_pages = [5, 9, 3], 4, 10
table, owners, pages_of = place(lengths, page_size, num_pages)
for row, (n, pages) in enumerate(zip(lengths, pages_of)):
    print(tr("request {row}: prompt of {n} tokens → pages {pages} → slots {slots}", row=row, n=n, pages=pages, slots=table[row, :n].tolist()))

# %% [markdown] tags=["lang-zh"]
# 预填充时，本批每个 token 的 K/V 写到 `out_loc = page_table[行, cached_len:device_len]`（粗框）；
# 之后的解码每步只写一格：`page_table[行, device_len - 1]`。同一页的槽位同色。

# %% [markdown] tags=["lang-en"]
# During prefill, the K/V of each token of the batch is written to `out_loc = page_table[row, cached_len:device_len]` (bold boxes);
# each later decode step writes just one cell: `page_table[row, device_len - 1]`. Slots of the same page share a color.

# %%
import matplotlib.pyplot as plt

from minisgl.notebook import draw_kv_pool, draw_page_table

prefill = [(row, j) for row, n in enumerate(lengths) for j in range(n)]
out_loc = torch.cat([table[row, :n] for row, n in enumerate(lengths)])
print(tr("out_loc of the prefill batch:"), out_loc.tolist())
decode = [(row, n) for row, n in enumerate(lengths)]
print(tr("out_loc of the next decode step:"), [int(table[row, n]) for row, n in decode])
draw_page_table(table, rows=[0, 1, 2], width=max(lengths) + 1, page_size=page_size, highlight=prefill, lengths=[n + 1 for n in lengths], title=tr("Page table (bold boxes: written by prefill)"))
draw_page_table(table, rows=[0, 1, 2], width=max(lengths) + 1, page_size=page_size, highlight=decode, lengths=[n + 1 for n in lengths], title=tr("Page table (bold boxes: written by the next decode step)"))
draw_kv_pool(owners, page_size)
plt.show()

# %% [markdown] tags=["lang-zh"]
# ## 4. 动手调：page_size、页数和提示词长度
#
# 页越大，每个请求最后一页里空着的槽位（内部碎片）越多；页太少就放不下。

# %% [markdown] tags=["lang-en"]
# ## 4. Try it: page_size, number of pages and prompt lengths
#
# The larger the page, the more slots stay empty in each request's last page (internal fragmentation); with too few pages the requests do not fit.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def explore(page_size: int, num_pages: int, lengths: str) -> None:
    lens = [int(x) for x in lengths.replace("\uff0c", ",").split(",") if x.strip()]
    table, owners, pages_of = place(lens, page_size, num_pages)
    used = sum(len(p) for p in pages_of)
    waste = used * page_size - sum(n + 1 for n in lens)
    print(tr("page_size={page_size}: {n_lens} requests use {used}/{num_pages} pages, {waste} slots empty in their last pages (internal fragmentation)", page_size=page_size, n_lens=len(lens), used=used, num_pages=num_pages, waste=waste))
    for row, pages in enumerate(pages_of):
        print(tr("  request {row} ({n_tokens} tokens + 1) → pages {pages}", row=row, n_tokens=lens[row], pages=pages))
    draw_page_table(table, rows=list(range(len(lens))), width=max(lens) + 1, page_size=page_size, lengths=[n + 1 for n in lens])
    draw_kv_pool(owners, page_size)


explorer = Explorer(
    explore,
    title=tr("Paging"),
    page_size=widgets.SelectionSlider(options=[1, 2, 4, 8], value=4, description="page_size"),
    num_pages=widgets.IntSlider(value=10, min=2, max=32, description=tr("pages")),
    lengths=widgets.Text(value="5, 9, 3", description=tr("prompt lengths")),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (this checks it without a browser)
explorer.run(page_size=8, num_pages=6, lengths="5, 9, 3")

# %%
# 页不够时会清楚地报错（控件的输出区里也一样）
# en: Too few pages is a clear error (in the widget's output area too)
explorer.run(page_size=8, num_pages=3, lengths="5, 9, 3")

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. `page_size = 4`，一个请求的页是 `[7, 2]`。它第 5 个 token（位置 5）的 K/V 在哪个槽位？
#
# <details><summary>答案</summary>
#
# 位置 5 在第 1 页（`5 // 4 = 1`，即页 2）的偏移 1：槽位 `2 × 4 + 1 = 9`。
# </details>
#
# 2. 页表为什么比 `max_running_req` 多一行？
#
# <details><summary>答案</summary>
#
# 留给填充用的假请求（例如凑批大小、或分块预填充时不该写回的 token），它写进去的东西不属于任何真实请求，
# 读写都不会越界，也不会弄脏别人的行。
# </details>
#
# 3. KV 池用 `torch.empty` 分配，没写过的槽位里可能有 NaN。补齐成矩形的批量注意力为什么不能让补齐的 key 读这些槽位，
#    哪怕掩码把它们的权重变成了 0？
#
# <details><summary>答案</summary>
#
# 权重是 0 也要乘：`0 × NaN = NaN`，会污染输出。所以 SDPA 后端把补齐的 key 指向本请求写过的第一个槽位，
# 参考后端只取前 `seq_len` 个；CUDA 上引擎另行把池子清零（显存上清零很快）。
# </details>
#
# 4. 页表里存 token 级的槽位（而不是页号），有什么好处？
#
# <details><summary>答案</summary>
#
# 注意力后端按位置直接查到槽位，不必知道 `page_size`；`page_size` 只影响分配器怎样成组地发放槽位。
# 需要页号的后端（如 FlashAttention）用 `槽位 // page_size` 换算。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. `page_size = 4` and a request has pages `[7, 2]`. In which slot is the K/V of its token at position 5?
#
# <details><summary>Answer</summary>
#
# Position 5 is at offset 1 of its page number 1 (`5 // 4 = 1`, i.e. page 2): slot `2 × 4 + 1 = 9`.
# </details>
#
# 2. Why does the page table have one row more than `max_running_req`?
#
# <details><summary>Answer</summary>
#
# It is reserved for padding dummy requests (for example to round up a batch size, or for tokens of a chunked prefill that
# must not be written back): what they write belongs to no real request, reads and writes stay in bounds, and nobody else's row gets dirty.
# </details>
#
# 3. The KV pool is allocated with `torch.empty`, so an unwritten slot may hold NaN. Why may batched attention, padded to a
#    rectangle, not let its padded keys read such slots, even though the mask gives them weight 0?
#
# <details><summary>Answer</summary>
#
# A weight of 0 is still multiplied: `0 × NaN = NaN` would pollute the output. So the SDPA backend points padded keys at
# the request's first written slot and the reference backend takes the first `seq_len` only; on CUDA the engine zeroes
# the pool separately (zeroing GPU memory is fast).
# </details>
#
# 4. What is gained by storing token-level slots in the page table (rather than page numbers)?
#
# <details><summary>Answer</summary>
#
# The attention backend finds the slot of each position directly, without knowing `page_size`; `page_size` only affects
# how the allocator hands out slots in groups. Backends that need page numbers (such as FlashAttention) convert with `slot // page_size`.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage1/kvcache.py` 里的任务后运行下面这一格（`python -m minisgl.course check kvcache`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage1/kvcache.py`, run the cell below (`python -m minisgl.course check kvcache`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("kvcache")
