# %% [markdown] tags=["lang-zh"]
# # 第 4.1 章 distributed：进程组、通信器与集合通信
#
# 模型大到一个设备放不下、或者一个设备算得不够快，就把每一层切开，分给几个进程——几个**秩**（rank）——各算一份，
# 再用**集合通信**把各份合起来。这一章搭起秩之间的线：
#
# - **进程组**：每个秩用同一个集合点 `host:port` 加入，知道自己是第几个、一共几个；端口由父进程向系统要；
# - **两个组**：数据组传张量（CPU 上 gloo，GPU 上 NCCL），另开一个 gloo 控制组传 CPU 上的小整数；
# - **通信器**：`all_reduce`（就地求和）、`all_gather`（沿最后一维按秩号拼接）、`agree_min`（取最小），每次真的通信都记一笔；
# - **一个秩**时什么都不通信，什么都不记。
#
# 本章要写的是通信器的三个操作和 `init_distributed`。起秩的 `minisgl.processes.ranks.run_ranks` 是给定的。

# %% [markdown] tags=["lang-en"]
# # Chapter 4.1 distributed: process groups, the communicator and collectives
#
# When a model does not fit on one device, or one device does not compute it fast enough, each layer is cut and shared
# out among a few processes — a few **ranks** — each computing one part, and **collectives** put the parts back
# together. This chapter lays the wires between the ranks:
#
# - **the process group**: every rank joins at the same rendezvous `host:port` and learns which one it is and how many
#   there are; the parent asks the OS for the port;
# - **two groups**: the data group carries tensors (gloo on the CPU, NCCL on a GPU), and a separate gloo control group
#   carries small integers on the CPU;
# - **the communicator**: `all_reduce` (a sum, in place), `all_gather` (joined along the last dimension in rank order),
#   `agree_min` (the smallest), every real communication counted;
# - with **one rank** nothing is communicated and nothing is counted.
#
# This chapter's tasks are the communicator's three operations and `init_distributed`. `minisgl.processes.ranks.run_ranks`, which
# starts the ranks, is given.

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
# 本章的任务（和 stage4/distributed.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage4/distributed.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("distributed")

# %% [markdown] tags=["lang-zh"]
# ## 1. 一个秩：什么都不通信
#
# `DistributedInfo()` 是一个秩（`rank=0, size=1`）。`init_distributed` 这时不建任何组，也不碰那个地址
# （`127.0.0.1:1` 的 1 号端口从来不会被打开）；三个操作原样返回输入，一笔都不记。切分的代码在一个秩时，
# 就是原来的单进程代码：

# %% [markdown] tags=["lang-en"]
# ## 1. One rank: nothing is communicated
#
# `DistributedInfo()` is one rank (`rank=0, size=1`). Then `init_distributed` makes no group and never touches the
# address (port 1 of `127.0.0.1:1` is never opened); the three operations return their input unchanged and count
# nothing. With one rank, the sharded code is the single-process code it was:

# %%
import torch
import torch.distributed as dist

from minisgl.distributed import DistributedInfo, get_tp_comm, init_distributed

comm = init_distributed(DistributedInfo(), "127.0.0.1:1")
x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
print(tr("one rank: process group made: {made}; get_tp_comm() is this communicator: {same}", made=dist.is_initialized(),
         same=get_tp_comm() is comm))
print(tr("all_reduce(x) is x: {reduce}; all_gather(x) is x: {gather}; agree_min(4096) = {agreed}; calls counted: {calls}",
         reduce=comm.all_reduce(x) is x, gather=comm.all_gather(x) is x, agreed=comm.agree_min(4096), calls=dict(comm.calls)))

# %% [markdown] tags=["lang-zh"]
# ## 2. 两个秩
#
# `run_ranks(fn, 2)` 向系统要一个空闲端口，spawn 两个进程（每个一个 OpenMP 线程），在每个里跑
# `fn(rank, 2, addr)`，按秩号带回结果。spawn 的子进程是全新的 Python，要按**名字**导入 `fn`：笔记本格子里定义的
# 函数，子进程找不到。所以每个秩上跑的函数写在示例 `examples/chapters/distributed.py` 的模块顶层，这里导入它：

# %% [markdown] tags=["lang-en"]
# ## 2. Two ranks
#
# `run_ranks(fn, 2)` asks the OS for a free port, spawns two processes (one OpenMP thread each), runs `fn(rank, 2, addr)`
# in each and brings the results back in rank order. A spawned child is a brand-new Python that imports `fn` **by
# name**: a function defined in a notebook cell cannot be found by the child. So the function each rank runs sits at the
# top level of the example `examples/chapters/distributed.py`, and we import it from there:

# %%
from minisgl.notebook import show_source
from minisgl.processes.ranks import run_ranks

sys.path.insert(0, str(ROOT / "examples"))  # spawn 出的秩继承这条路径 | en: the spawned ranks inherit this path
from chapters.distributed import demo_rank  # noqa: E402

show_source(demo_rank)

# %% [markdown] tags=["lang-zh"]
# 每个秩拿一份不同的数，加入进程组，做三种集合通信，把看到的结果交回来。两个秩的 `all_reduce` 和 `all_gather`
# 一模一样（这正是集合通信的意思），`agree_min` 是两个数里小的那个，每个操作各记一笔：

# %% [markdown] tags=["lang-en"]
# Each rank takes numbers of its own, joins the process group, does the three collectives and hands back what it saw.
# `all_reduce` and `all_gather` are identical on both ranks (that is what a collective means), `agree_min` is the smaller
# of the two numbers, and each operation is counted once:

# %%
results = run_ranks(demo_rank, 2)
for rank, seen in enumerate(results):
    print(tr("rank {rank}:", rank=rank))
    for name in ("all_reduce", "all_gather", "agree_min", "calls"):
        print(f"  {name:<11} {seen[name]}")

# %% [markdown] tags=["lang-zh"]
# ## 3. all_gather：为什么不能直接 reshape
#
# 底下的集合通信只会把各秩的张量沿**第 0 维**首尾接起来，我们要的却是沿**最后一维**拼。这一步不需要真的起秩：
# 用 `torch.cat` 造出通信收到的样子，再比较两种重排。

# %% [markdown] tags=["lang-en"]
# ## 3. all_gather: why a plain reshape is wrong
#
# The collective underneath only joins the ranks' tensors end to end along **dimension 0**, while what we want is a join
# along the **last dimension**. No ranks are needed for this part: `torch.cat` builds what the collective delivers, and
# we compare two ways of rearranging it.

# %%
x0 = torch.arange(6).reshape(3, 2)  # 秩 0 的一份 | en: rank 0's piece
x1 = x0 + 10  # 秩 1 的一份 | en: rank 1's piece
out = torch.cat([x0, x1])  # 通信收到的：形状 (6, 2) | en: what the collective delivers: shape (6, 2)
print(tr("what the collective delivers (joined along dimension 0): {value}", value=out.tolist()))
print(tr("plain reshape: {value}", value=out.reshape(3, 4).tolist()))
print(tr("wanted (torch.cat along the last dimension): {value}", value=torch.cat([x0, x1], dim=-1).tolist()))

# %% [markdown] tags=["lang-zh"]
# 直接 `reshape` 只是把内存里的数重新分行：第 0 行全是秩 0 的，第 1 行一半秩 0、一半秩 1——形状对，数全错，也不报错。
# 通信收到的数在内存里是（秩, 行, 列）的次序，要的结果每一行里先是秩 0 的几列、再是秩 1 的：怎么从前一种次序
# 走到后一种，正是任务 `all_gather` 要想清楚的（三维的 `(batch, seq, d)` 也要对）。

# %% [markdown] tags=["lang-en"]
# A plain `reshape` only cuts the numbers in memory into new rows: row 0 is all rank 0's, row 1 half rank 0's and half
# rank 1's — the shape is right, the numbers are all wrong, and nothing raises. What the collective delivers lies in memory
# in (rank, row, column) order, while every row of the result wants rank 0's columns first, then rank 1's: how to get from
# the first order to the second is what task `all_gather` has to work out (a 3-D `(batch, seq, d)` must come out right
# too).

# %% [markdown] tags=["lang-zh"]
# ## 4. 动手调：几个秩、几行、几列
#
# 改秩数和每个秩的 `x` 的形状，看直接 `reshape` 什么时候碰巧等于沿最后一维的 `torch.cat`。秩 `r` 的数都在
# `100 * r` 这一段里，一眼就能看出每个数来自哪个秩。只有一行时直接 `reshape` 碰巧是对的——这正是它难发现的原因：
# 你的检查要用好几行。

# %% [markdown] tags=["lang-en"]
# ## 4. Try it: how many ranks, rows and columns
#
# Change the number of ranks and the shape of each rank's `x`, and see when a plain `reshape` happens to equal `torch.cat`
# along the last dimension. Rank `r`'s numbers all sit in the range of `100 * r`, so you can tell at a glance which rank
# each number came from. With a single row the plain `reshape` happens to be right — which is exactly why the mistake is
# hard to spot: your checks need several rows.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def gather_layouts(ranks: int, rows: int, cols: int) -> None:
    pieces = [torch.arange(rows * cols).reshape(rows, cols) + 100 * r for r in range(ranks)]
    out = torch.cat(pieces)  # 通信收到的 | en: what the collective delivers
    want = torch.cat(pieces, dim=-1)
    got = out.reshape(rows, ranks * cols)
    print(tr("{ranks} ranks, each x of shape ({rows}, {cols})", ranks=ranks, rows=rows, cols=cols))
    print(tr("{how}: equals torch.cat along the last dimension: {same}", how="reshape", same=torch.equal(got, want)))
    for mine, wanted in zip(got.tolist(), want.tolist()):
        print("   ", mine, "  ←→  ", wanted)


explorer = Explorer(
    gather_layouts,
    title=tr("all_gather: what a plain reshape gives"),
    ranks=widgets.IntSlider(value=2, min=1, max=4, description=tr("ranks")),
    rows=widgets.IntSlider(value=3, min=1, max=4, description=tr("rows")),
    cols=widgets.IntSlider(value=2, min=1, max=3, description=tr("columns")),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (this checks it without a browser)
explorer.run(ranks=3, rows=2, cols=2)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 两个秩，秩 0 的 `x` 是 `[1., 2.]`，秩 1 的是 `[10., 20.]`。`all_reduce(x)` 之后两个秩的 `x` 各是什么？`all_gather(x)` 呢？
#
# <details><summary>答案</summary>
#
# `all_reduce`：两个秩的 `x` 都变成 `[11., 22.]`，返回的就是 `x` 本身（就地）。`all_gather`：两个秩都得到新张量
# `[1., 2., 10., 20.]`，先秩 0 的、再秩 1 的，`x` 不变。
# </details>
#
# 2. 为什么 `agree_min` 走 gloo 控制组，而不是数据组？
#
# <details><summary>答案</summary>
#
# GPU 上数据组是 NCCL，它只收 GPU 上的张量；页数是 CPU 上的一个整数。走数据组就要拷到 GPU、通信完拷回来、等 GPU 同步。
# </details>
#
# 3. 在 2 核的 CPU 上，为什么每个秩只给一个 OpenMP 线程？
#
# <details><summary>答案</summary>
#
# 两个秩各开两个线程，就是 4 个线程抢 2 个核。每个并行区域末尾的屏障要等池里的线程全部到齐，被挤下 CPU 的那个迟迟不到，
# 其余的空转、睡下、再被叫醒，比一个进程还慢。每个秩一个线程，正好各占一个核。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. Two ranks: rank 0's `x` is `[1., 2.]`, rank 1's is `[10., 20.]`. After `all_reduce(x)`, what is `x` on each rank? And
#    after `all_gather(x)`?
#
# <details><summary>Answer</summary>
#
# `all_reduce`: `x` becomes `[11., 22.]` on both ranks, and what it returns is `x` itself (in place). `all_gather`: both
# ranks get a new tensor `[1., 2., 10., 20.]`, rank 0's piece first, then rank 1's; `x` is unchanged.
# </details>
#
# 2. Why does `agree_min` go over the gloo control group rather than the data group?
#
# <details><summary>Answer</summary>
#
# On a GPU the data group is NCCL, which only takes tensors on the GPU, while the page count is an integer on the CPU.
# Going over the data group would mean copying it to the GPU, communicating, copying it back and waiting for a GPU sync.
# </details>
#
# 3. On a 2-core CPU, why does each rank get only one OpenMP thread?
#
# <details><summary>Answer</summary>
#
# Two ranks with two threads each make 4 threads fight over 2 cores. The barrier at the end of every parallel region
# waits for every thread of the pool; the one pushed off the CPU is late, and the others spin, sleep and are woken again,
# slower than one process. With one thread per rank each rank gets a core of its own.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage4/distributed.py` 里的任务后运行下面这一格（`python -m minisgl.course check distributed`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage4/distributed.py`, run the cell below (`python -m minisgl.course check distributed`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("distributed")
