# %% [markdown] tags=["lang-zh"]
# # 第 4.3 章 tp_scheduler：步调一致的秩
#
# 第 4.2 章切开了模型：每一步，每个秩都得用**同样的批次**、按**同样的顺序**调用前向，集合通信才对得上——多一个请求、
# 换一个顺序，某个秩就在 `all_reduce` 里等一个永远不来的伙伴，或者把别的秩另一个请求的部分和加进来，算出错的数。
#
# 办法是**每个秩都跑完整的调度器**：输入一样、决定的规则是确定的，大家就做出一样的决定，不必每一步互相商量批次。
# 要一样的有三样：
#
# - **输入**：只有秩 0 从分词进程收消息，经 XPUB 转给其余的秩；每个秩要在同一次迭代看到同一批消息——ZMQ 不管消息
#   什么时候到，空闲的秩又不能在集合通信里等，所以得有个小小的协议，每次迭代至多一次集合通信；
# - **规则**：解码批次按 uid 排，采样器各秩同一个种子，KV 页数各秩取最小值（第 4.2 章 `TPEngine` 的 `agree_min`）；
# - **输出**：只有秩 0 有去往分词进程和 API 服务器的套接字；其余的秩照样做出每个决定（取消、结束、拒绝），只是没有地方可说。
#
# 本章要写的是按 uid 排的解码批次（`decode_order`）、接上套接字（`connect`），以及把消息转给每个秩的协议（`fan_out`，
# 由你设计）。

# %% [markdown] tags=["lang-en"]
# # Chapter 4.3 tp_scheduler: ranks that agree
#
# Chapter 4.2 split the model: at every step every rank must call the forward with **the same batch** in **the same
# order**, or the collectives no longer match — one request more, one order different, and a rank waits in `all_reduce`
# for a partner that never comes, or adds in another rank's partial sum for a different request and computes wrong
# numbers.
#
# The way out: **every rank runs the complete scheduler**. With the same input and deterministic rules they all make the
# same decisions, without agreeing on the batch at every step. Three things must be the same:
#
# - **the input**: only rank 0 receives from the tokenizer and passes the messages on to the other ranks over XPUB; every
#   rank must see the same messages in the same iteration — ZMQ does not say when a message arrives, and an idle rank
#   cannot wait inside a collective, so it takes a small protocol, with at most one collective per iteration;
# - **the rules**: the decode batch is ordered by uid, one sampler seed on every rank, and every rank takes the smallest
#   KV page count (`agree_min` in chapter 4.2's `TPEngine`);
# - **the output**: only rank 0 has sockets to the tokenizer and the API server; the other ranks make every decision all
#   the same (abort, finish, reject), they just have no one to tell.
#
# This chapter's tasks are the decode batch in uid order (`decode_order`), attaching the sockets (`connect`), and the
# protocol that passes the messages on to every rank (`fan_out`, of your design).

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
# 本章的任务（和 stage4/tp_scheduler.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage4/tp_scheduler.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("tp_scheduler")

# %% [markdown] tags=["lang-zh"]
# ## 1. 解码批次按 uid 排
#
# 这一步不用起秩。三个请求按 uid 5、2、9 的顺序加入解码管理器（每个先 `complete_one()`，像刚预填充完那样）。
# 第 2 阶段的 `DecodeManager` 按加入的先后排；本章的 `UidOrderDecodeManager` 按 uid 排——顺序只取决于请求本身，
# 不取决于它们是怎么一路走到这里的：

# %% [markdown] tags=["lang-en"]
# ## 1. The decode batch in uid order
#
# No ranks for this step. Three requests join the decode manager in uid order 5, 2, 9 (each after `complete_one()`, as if
# just prefilled). Stage 2's `DecodeManager` keeps the order they joined in; this chapter's `UidOrderDecodeManager` sorts
# by uid — the order depends only on the requests themselves, not on the path that brought them here:

# %%
import torch

from minisgl.core import Req, SamplingParams
from minisgl.scheduling import DecodeManager
from minisgl.tp_scheduler import UidOrderDecodeManager


def make_reqs(uids: list[int]) -> list[Req]:
    reqs = [Req(torch.tensor([1, 2], dtype=torch.int32), row, 0, 4, uid, SamplingParams()) for row, uid in enumerate(uids)]
    for req in reqs:
        req.complete_one()  # 像预填充发出之后那样 | en: as after the prefill's launch
    return reqs


reqs = make_reqs([5, 2, 9])
print(tr("joined in uid order: {uids}", uids=[r.uid for r in reqs]))
for manager in (DecodeManager(), UidOrderDecodeManager()):
    manager.filter_reqs(reqs)
    batch = manager.schedule_next_batch()
    print(tr("{cls}: decode batch {uids}", cls=type(manager).__name__, uids=[r.uid for r in batch.reqs]))
print(tr("with no running request there is no decode batch: {none}",
         none=UidOrderDecodeManager().schedule_next_batch() is None))

# %% [markdown] tags=["lang-zh"]
# 集合（`set`）就不行了。请求按身份比较，它的哈希来自 `id(req)`，也就是对象碰巧落在哪个内存地址；集合的顺序跟着哈希走。
# 下面把同样三个请求重新建几次、放进集合：顺序一会儿一个样。两个进程里的地址各不相同，两个秩就可能按不同的顺序排批次。
# 这一格的输出每次运行都可能不同——这正是要说明的：

# %% [markdown] tags=["lang-en"]
# A `set` will not do. Requests compare by identity, so their hash comes from `id(req)`, the memory address where the
# object happens to sit, and a set's order follows the hash. Below, the same three requests are built again a few times and
# put in a set: the order changes from one build to the next. Two processes have different addresses, so two ranks could
# order the batch differently. This cell's output may differ on every run — which is exactly the point:

# %%
# NBVAL_IGNORE_OUTPUT
keep = []  # 中间夹些别的对象，下一批请求就落到别的地址 | en: other objects in between move the next requests to other addresses
for build in range(6):
    keep.append([object() for _ in range(7 * build)])
    fresh = make_reqs([5, 2, 9])
    print(tr("build {build}: a set iterates as uids {uids}; UidOrderDecodeManager gives {ordered}", build=build,
             uids=[r.uid for r in set(fresh)], ordered=[r.uid for r in sorted(fresh, key=lambda r: r.uid)]))

# %% [markdown] tags=["lang-zh"]
# 自己试试：按任意顺序加入几个 uid，看第 2 阶段的 `DecodeManager`（加入的先后）和 `UidOrderDecodeManager`（按 uid）
# 各排出什么批次。

# %% [markdown] tags=["lang-en"]
# Try it yourself: let a few uids join in any order, and see which batch chapter 2's `DecodeManager` (the order of
# joining) and `UidOrderDecodeManager` (by uid) each make.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def show_order(joined: str) -> None:
    try:
        uids = [int(x) for x in joined.replace(",", " ").split()]
    except ValueError:
        print(tr("write uids as whole numbers separated by commas, got {text!r}", text=joined))
        return
    if len(set(uids)) != len(uids) or not uids:
        print(tr("write at least one uid, each once, got {uids}", uids=uids))
        return
    reqs = make_reqs(uids)
    for manager in (DecodeManager(), UidOrderDecodeManager()):
        manager.filter_reqs(reqs)
        print(tr("{cls}: decode batch {uids}", cls=type(manager).__name__, uids=[r.uid for r in manager.schedule_next_batch().reqs]))


explorer = Explorer(
    show_order,
    title=tr("The decode batch: the order of joining or the order of uids"),
    joined=widgets.Text(value="7, 3, 11, 1", description=tr("uids join")),
)
explorer

# %%
# 用几组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with a few sets of values (this checks it without a browser)
explorer.run(joined="40, 10, 30, 20")

# %%
explorer.run(joined="3, 3")

# %% [markdown] tags=["lang-zh"]
# ## 2. 消息什么时候到
#
# 秩 0 把消息转给秩 1 之后，秩 1 什么时候收得到？ZMQ 只保证按顺序、不丢，不管什么时候。下面在一个进程里开一对
# XPUB/SUB（和 `connect` 接的一样，先握手），一口气发 3 条，马上数一数 SUB 上此刻到了几条，过 50 ms 再数一次。
# 第一次数出来的每次运行都可能不同——这正是要说明的：秩 1 要是“此刻到了几条就取几条”，同一条消息在两个秩上就可能
# 落进不同的迭代。怎样让每个秩在同一次迭代拿到同样的消息，又不让空闲的秩在集合通信里等，是 `fan_out` 要你设计的。

# %% [markdown] tags=["lang-en"]
# ## 2. When does a message arrive?
#
# Once rank 0 has passed a message on to rank 1, when does rank 1 get it? ZMQ promises order and no loss, not timing.
# Below, one process opens an XPUB/SUB pair (as `connect` does, handshake first), sends 3 messages in a row, counts at
# once how many are on the SUB right now, and counts again 50 ms later. The first count may differ on every run — which
# is exactly the point: if rank 1 "took whatever is there right now", one message could land in different iterations on
# the two ranks. How every rank gets the same messages in the same iteration, without an idle rank waiting inside a
# collective, is what `fan_out` asks you to design.

# %%
# NBVAL_IGNORE_OUTPUT
import time

import zmq

from minisgl.message import AbortBackendMsg, ZmqPubQueue, ZmqSubQueue

pub = ZmqPubQueue("tcp://127.0.0.1:*")
sub = ZmqSubQueue(pub.socket.last_endpoint.decode())
pub.wait_for_subscribers(1, 10)


def there_now() -> int:  # SUB 上此刻已经到了几条（不等，取走） | en: how many are on the SUB right now (no waiting; taken)
    n = 0
    while True:
        try:
            sub.socket.recv(zmq.NOBLOCK)
        except zmq.Again:
            return n
        n += 1


for burst in range(4):
    for uid in range(3):
        pub.put(AbortBackendMsg(uid))
    now = there_now()
    time.sleep(0.05)
    print(tr("burst {burst}: 3 sent; there at once: {now}; 50 ms later: {later} more", burst=burst, now=now,
             later=there_now()))
pub.close()
sub.close()

# %% [markdown] tags=["lang-zh"]
# ## 3. 两个秩，步调一致
#
# 现在真的起两个秩。spawn 出的秩要按**名字**导入它跑的函数，所以它写在示例 `examples/chapters/tp_scheduler.py`
# 的模块顶层，这里导入它：每个秩加入进程组、建一个 `TPScheduler` 并接上套接字；秩 0 这边还扮演分词进程：
# 第 0 次迭代之前送来三个请求（uid 5、2、9，一条批量消息，各生成 4 个 token），第 2 次迭代之前取消 9 号，
# 空闲下来就送 `ExitMsg`。每次迭代记下这个秩处理的消息、这一步的批次和占用的页（调度器本身不改，
# 只把它处理消息的方法包一层来记录）。

# %% [markdown] tags=["lang-en"]
# ## 3. Two ranks in step
#
# Now two real ranks. A spawned rank imports the function it runs **by name**, so that function sits at the top level of
# the example `examples/chapters/tp_scheduler.py`, and we import it from there: each rank joins the process group, builds
# a `TPScheduler` and attaches its sockets; on rank 0's side it also plays the tokenizer: before iteration 0 it sends three
# requests (uids 5, 2, 9 in one batch message, 4 tokens each), before iteration 2 it aborts number 9, and once the
# scheduler is idle it sends an `ExitMsg`. Each iteration notes the messages the rank handled, the batch of the step and
# the pages in use (the scheduler itself is unchanged; only its message handler is wrapped to take notes).

# %%
import tempfile

from minisgl.processes.ranks import run_ranks

sys.path.insert(0, str(ROOT / "examples"))  # spawn 出的秩继承这条路径 | en: the spawned ranks inherit this path
from chapters.tp_scheduler import ABORTED, MODEL, NEW_TOKENS, PROMPTS, demo_rank  # noqa: E402

with tempfile.TemporaryDirectory(prefix="msgl-nb-") as ipc_dir:
    ranks = run_ranks(demo_rank, 2, MODEL, ipc_dir)
for lines in zip(*(seen["lines"] for seen in ranks)):
    print(tr("iteration {it}", it=lines[0][0]))
    for rank, (it, handled, steps, pages) in enumerate(lines):
        print(tr("  rank {rank}: messages {handled}; steps {steps}; pages in use {pages}", rank=rank,
                 handled=", ".join(handled) or "-", steps="; ".join(steps) or "-", pages=pages))
print(tr("both ranks saw the same in every iteration: {same}", same=ranks[0]["lines"] == ranks[1]["lines"]))

# %% [markdown] tags=["lang-zh"]
# 两个秩逐次迭代地摆在一起：处理的消息、走的步、占用的页全都一样。秩 1 从没碰过分词进程的套接字，它的消息全是秩 0
# 转过来的原字节。
#
# 读这张表要记得第 2.5 章的重叠调度：一次迭代先**发出**下一步，再**处理**上一步的结果，所以一步的记录（`steps`）
# 晚一次迭代才出现。第 0 次迭代收下三个请求、发出预填充，占 8 页（提示词 3 + 3 + 2 个 token，这里一页一个 token）；
# 预填充的记录出现在第 1 次迭代。第 2 次迭代处理取消的时候，第 1 次迭代发出的那一步里还有 9 号：这一步照样算完、照样
# 记下来，只是 9 号那个 token 丢掉，它的页等这一步算完才还：11 页，加上新发出的一步给 2 号和 5 号各 1 页，
# 减去 9 号的 3 页，是 10 页。第 4 次迭代不再发出新的一步，最后一步的结果处理完，2 号和 5 号结束，页全部归还；
# 第 5 次迭代收到退出。

# %% [markdown] tags=["lang-en"]
# The two ranks side by side, iteration by iteration: the messages handled, the steps taken and the pages in use are all
# the same. Rank 1 never touched the tokenizer's socket: all its messages are the bytes rank 0 passed on.
#
# Read the table with chapter 2.5's overlap scheduling in mind: an iteration first **launches** the next step, then
# **processes** the results of the previous one, so a step's record (`steps`) shows up one iteration later. Iteration 0
# takes in the three requests and launches the prefill, holding 8 pages (prompts of 3 + 3 + 2 tokens, one token per page
# here); the prefill's record appears in iteration 1. When iteration 2 handles the abort, the step launched in iteration 1
# still holds number 9: that step is computed and recorded all the same, only 9's token is dropped, and its pages come
# back once the step is done: 11 pages, plus 1 each for numbers 2 and 5 in the newly launched step, minus number 9's 3,
# makes 10. Iteration 4 launches nothing new: the last step's results are processed, numbers 2 and 5 finish and every
# page is back; iteration 5 receives the exit.

# %% [markdown] tags=["lang-zh"]
# ## 4. 只有秩 0 回话
#
# 两个秩都做出了每个决定，可分词进程只该听到一次。2 号和 5 号各 4 个 token，9 号在取消之前只拿到预填充的那 1 个，
# 取消本身不回话：一共 9 条 `DetokenizeMsg`（结束跟着最后一个 token 一起报）。要是秩 1 也回话，就会是两倍：

# %% [markdown] tags=["lang-en"]
# ## 4. Only rank 0 replies
#
# Both ranks made every decision, yet the tokenizer must hear each one once. Numbers 2 and 5 get 4 tokens each, number 9
# only the prefill's 1 before its abort, and the abort itself gets no reply: 9 `DetokenizeMsg` in all (the finish comes
# with the last token). If rank 1 replied too, it would be twice as many:

# %%
replies = ranks[0]["replies"]
counts = {name: replies.count(name) for name in sorted(set(replies))}
expected = (len(PROMPTS) - 1) * NEW_TOKENS + 1
print(tr("replies that reached the tokenizer: {counts} (rank 0 only; nothing for the abort)", counts=counts))
print(tr("expected: {tokens} tokens for each of the {n} requests that finish, plus 1 for number {aborted} before its "
         "abort = {total}; the same: {same}", tokens=NEW_TOKENS, n=len(PROMPTS) - 1, aborted=ABORTED, total=expected,
         same=counts == {"DetokenizeMsg": expected}))

# %% [markdown] tags=["lang-zh"]
# ## 5. 真的服务器
#
# 服务器里每个秩是一个调度器进程，跑的就是这个 `TPScheduler`；秩 0 的进程旁边还有分词进程和 API 服务器。一台机器两个秩：
#
#     python -m minisgl --model DIR --tp 2
#
# 两个节点（两台机器）各一个秩：在每台机器上各启动一次，`--dist-init-addr` 是节点 0 的地址、每次启动都一样，
# 只有节点 0 提供 HTTP：
#
#     python -m minisgl --model DIR --tp 2 --nnodes 2 --node-rank 0 --dist-init-addr HOST:PORT   # 节点 0
#     python -m minisgl --model DIR --tp 2 --nnodes 2 --node-rank 1 --dist-init-addr HOST:PORT   # 节点 1
#
# 凑不起来的组合在启动任何进程之前就被拒绝（`--tp` 是所有节点合计的秩数）：

# %% [markdown] tags=["lang-en"]
# ## 5. The real server
#
# In the server each rank is a scheduler process running this very `TPScheduler`; next to rank 0's process are the
# tokenizer and the API server. Two ranks on one machine:
#
#     python -m minisgl --model DIR --tp 2
#
# Two nodes (two machines) with one rank each: launch once on each machine; `--dist-init-addr` is node 0's address, the
# same in every launch, and only node 0 serves HTTP:
#
#     python -m minisgl --model DIR --tp 2 --nnodes 2 --node-rank 0 --dist-init-addr HOST:PORT   # node 0
#     python -m minisgl --model DIR --tp 2 --nnodes 2 --node-rank 1 --dist-init-addr HOST:PORT   # node 1
#
# A combination that does not add up is refused before any process starts (`--tp` counts the ranks of all nodes
# together):

# %%
from minisgl.server.args import tp_problems

for tp, nnodes, node_rank, addr in [(2, 2, 1, "10.0.0.1:29500"), (2, 2, 0, None), (3, 2, 2, "10.0.0.1:29500")]:
    print(f"--tp {tp} --nnodes {nnodes} --node-rank {node_rank}" + (f" --dist-init-addr {addr}:" if addr else ":"))
    for problem in tp_problems(tp, nnodes, node_rank, addr) or [tr("fine")]:
        print("  -", problem)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 秩 0 已经把消息原样转给了秩 1，为什么秩 1 不能只收“此刻已经到了的”？
#
# <details><summary>答案</summary>
#
# ZMQ 只保证消息按顺序、不丢，不保证**什么时候**到（第 2 节）。秩 1 要是只收“此刻已经到了的”，一条消息可能秩 0 在第 2 次
# 迭代处理、秩 1 在第 3 次才处理，两个秩的批次就不一样了。秩 1 得从秩 0 那里知道这次迭代到哪一条为止，连“这次没有”也得知道。
# </details>
#
# 2. 服务器空闲了几分钟。空闲的秩 1 为什么不能在集合通信里等下一条消息？
#
# <details><summary>答案</summary>
#
# 集合通信有时限（`COLLECTIVE_TIMEOUT_S`）。秩 0 阻塞在接收上，不在集合通信里；秩 1 要是在集合通信里等，就会等到超时、
# 出错。它得在没有时限的地方等（比如自己的套接字），等到秩 0 也马上就到的时候，再进集合通信。
# </details>
#
# 3. 秩 1 没有去往分词进程的套接字，它还要处理取消吗？
#
# <details><summary>答案</summary>
#
# 要。取消让秩 0 从下一步的批次里拿掉这个请求、归还它的页；秩 1 要是不照做，下一步的批次就比秩 0 的多一个请求，
# 集合通信对不上，页数也分了叉。每个决定每个秩都做，只是秩 1 不说出来。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. Rank 0 already passes every message on to rank 1 unchanged. Why can rank 1 not just take "what has arrived so far"?
#
# <details><summary>Answer</summary>
#
# ZMQ only promises that messages arrive in order and are not lost, not **when** they arrive (section 2). If rank 1 took
# only "what has arrived so far", a message might be handled by rank 0 in iteration 2 and by rank 1 in iteration 3, and
# the two ranks' batches would differ. Rank 1 must learn from rank 0 where this iteration ends, "none this time"
# included.
# </details>
#
# 2. The server has been idle for a few minutes. Why can an idle rank 1 not wait for the next message inside a
#    collective?
#
# <details><summary>Answer</summary>
#
# A collective has a time limit (`COLLECTIVE_TIMEOUT_S`). Rank 0 blocks on its receive, which is not a collective; if
# rank 1 waited inside a collective, it would wait until it timed out and failed. It must wait somewhere without a time
# limit (its own socket, say), and join a collective only once rank 0 is about to join too.
# </details>
#
# 3. Rank 1 has no socket to the tokenizer. Does it still have to handle aborts?
#
# <details><summary>Answer</summary>
#
# Yes. An abort makes rank 0 take the request out of the next batch and free its pages; if rank 1 did not do the same, its
# next batch would hold one request more than rank 0's, the collectives would no longer match and the page counts would
# part ways. Every rank makes every decision; rank 1 just does not say it out loud.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage4/tp_scheduler.py` 里的任务后运行下面这一格（`python -m minisgl.course check tp_scheduler`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage4/tp_scheduler.py`, run the cell below (`python -m minisgl.course check tp_scheduler`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("tp_scheduler")
