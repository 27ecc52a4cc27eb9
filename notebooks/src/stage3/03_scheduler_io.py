# %% [markdown] tags=["lang-zh"]
# # 第 3.3 章 scheduler_io：由消息驱动的调度循环
#
# 第 2 阶段的调度器由 `generate(prompts)` 驱动：请求一次性交进来，算完才返回。服务器里的调度器是一个独立的进程，
# 请求随时从套接字上到来，每一步的结果也要马上送出去。这一章把第 2.5 章的调度器接到消息上，主循环的一次迭代是：
#
#     （空闲时先报一次现状）→ 收消息（空闲才阻塞）→ 处理：加请求 / 取消 / 退出 → 有事就走一步 → 发出这一步的结果和现状
#
# - 新请求用 API 服务器给的 **同一个 uid**；请求在进门处（API 服务器、分词进程）已经查过，调度器照单收下、不再查；
#   只有 uid 与还没了结的请求重复时回一条 `RejectMsg`，绝不悄悄丢掉；
# - 每一步恰好一条 `BatchTokenizerMsg`，每个结果事件（得到新 token，或在 EOS 结束）一条 `DetokenizeMsg`；
# - 结束原因 `length` / `stop`（EOS）；遇到 EOS 时 `next_token` 为 -1（EOS 不是输出文本）；取消的请求什么也不回；
# - `SchedulerStats` 在每一步之后、以及空闲下来时直接发给 API 服务器。
#
# 这个笔记本自己扮演分词进程和 API 服务器：绑定它们的收信套接字，往调度器的收信套接字里送消息，
# 然后一次一次地调用 `run_once()`，看每一步发出了什么。

# %% [markdown] tags=["lang-en"]
# # Chapter 3.3 scheduler_io: the scheduler loop driven by messages
#
# The stage-2 scheduler is driven by `generate(prompts)`: the requests come in all at once and it returns when they are
# done. In the server the scheduler is a process of its own: requests arrive on a socket at any time, and each step's
# results must go out right away. This chapter connects chapter 2.5's scheduler to messages; one iteration of the main
# loop is:
#
#     (when idle, report the state once) → receive (block only when idle) → handle: add / abort / exit → take a step if there is work → send this step's results and the state
#
# - a new request keeps **the same uid** the API server gave it; it was checked where it entered (the API server, the tokenizer
#   process), so the scheduler takes it as it is and checks nothing again; only a uid equal to that of a request not settled
#   yet gets a `RejectMsg`, never silently dropped;
# - exactly one `BatchTokenizerMsg` per step, with one `DetokenizeMsg` per result event (a new token, or the end at EOS);
# - finish reasons `length` / `stop` (EOS); at EOS `next_token` is -1 (EOS is not output text); an aborted request gets nothing;
# - `SchedulerStats` goes straight to the API server after every step and when the scheduler becomes idle.
#
# This notebook plays the tokenizer process and the API server itself: it binds their inboxes, puts messages into the
# scheduler's inbox, then calls `run_once()` one iteration at a time to see what each step sends.

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
# 本章的任务（和 stage3/scheduler_io.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage3/scheduler_io.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("scheduler_io")

# %% [markdown] tags=["lang-zh"]
# ## 1. 接上套接字，送几个请求
#
# 三个进程各绑定一个 PULL 套接字（收信），用自己的 PUSH 套接字往别人的 PULL 里发信。这里调度器绑定 `addrs.backend`；笔记本绑定
# `addrs.tokenizer`（反分词进程的收信处）和 `addrs.frontend`（API 服务器的收信处），再连上 `addrs.backend` 发消息。
# 三个请求装在一条 `BatchBackendMsg` 里一起到达：uid 是 API 服务器挑的（这里故意不从 0 数起），
# 第三个请求的 uid 和第二个重复——调度器唯一要拒绝的情况（别的毛病在进门处就挡住了，到不了这里）。

# %% [markdown] tags=["lang-en"]
# ## 1. Attach the sockets, send a few requests
#
# Each of the three processes binds one PULL socket (its inbox) and PUSHes to the others'. Here the scheduler binds
# `addrs.backend`; the notebook binds `addrs.tokenizer` (the detokenizer's inbox) and `addrs.frontend` (the API server's
# inbox), and connects to `addrs.backend` to send messages. Three requests arrive together in one `BatchBackendMsg`: the
# API server chose their uids (on purpose not counting from 0), and the third one repeats the second one's uid, the one
# case the scheduler refuses (every other fault is stopped where the request enters and never gets here).

# %%
import torch

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortBackendMsg, BatchBackendMsg, ExitMsg, RejectMsg, UserMsg, ZmqPullQueue, ZmqPushQueue,
)
from minisgl.model_zoo import tiny_qwen3
from minisgl.scheduler_io import SchedulerIO
from minisgl.server.args import ServerAddrs, make_ipc_dir

sched = SchedulerIO(str(tiny_qwen3()), dtype=torch.float32, max_running_req=4, num_page_override=256, max_seq_len_override=48)
addrs = ServerAddrs.in_dir(make_ipc_dir())
sched.connect(addrs)
tokenizer_inbox = ZmqPullQueue(addrs.tokenizer, create=True)  # 反分词进程这一头 | en: the detokenizer's end
frontend_inbox = ZmqPullQueue(addrs.frontend, create=True)  # API 服务器这一头 | en: the API server's end
to_scheduler = ZmqPushQueue(addrs.backend, create=False)
tok = sched.tokenizer
print(tr("one request holds at most {n} tokens (prompt + output)", n=sched.max_seq_len))


def user_msg(uid, prompt, **sp):
    ids = prompt if isinstance(prompt, list) else tok.encode(prompt, add_special_tokens=False)
    return UserMsg(uid=uid, input_ids=torch.tensor(ids, dtype=torch.int32), sampling_params=SamplingParams(**sp))


def show(msg):
    """反分词进程收到的每条消息一行

    en: One line per message the detokenizer would receive
    """
    if isinstance(msg, RejectMsg):
        return tr("  uid {uid}: refused: {error}", uid=msg.uid, error=msg.error)
    end = tr(", finished ({reason})", reason=msg.finish_reason) if msg.finished else ""
    return tr("  uid {uid}: next_token={token}{end}", uid=msg.uid, token=msg.next_token, end=end)


def iterate(max_iters=100, before=None):
    """迭代到空闲，打印每次迭代发给反分词进程的消息

    en: run_once until idle; print what each iteration sent to the detokenizer
    """
    for i in range(max_iters):
        if i > 0 and not sched.busy:
            return
        if before is not None:
            before(i)
        sched.run_once()
        batch = tokenizer_inbox.get(timeout=0.5)
        if batch is None:
            print(tr("iteration {i}: nothing sent", i=i))
            continue
        print(tr("iteration {i}: one BatchTokenizerMsg", i=i))
        for msg in batch.data:
            print(show(msg))


to_scheduler.put(BatchBackendMsg(data=[
    user_msg(1000, "Hello, my name is", max_tokens=3, ignore_eos=True),
    user_msg(7, "The capital of France is", max_tokens=5, ignore_eos=True),
    user_msg(7, list(range(100, 110)), max_tokens=3),  # 又一个 uid 7 | en: uid 7 again
]))
iterate()

# %% [markdown] tags=["lang-zh"]
# 第 0 次迭代只发出了预填充（重叠调度：结果下一次迭代才处理），但拒绝已经发出去了；此后每次迭代恰好一条
# `BatchTokenizerMsg`。uid 1000 到了 max_tokens 就以 `length` 结束、离开批次，uid 7 接着解码。
# 和离线的 `LLM.generate` 比一比：同一个模型、同样的引擎代码，token 逐个相同。

# %% [markdown] tags=["lang-en"]
# Iteration 0 only launched the prefill (overlap scheduling: its results are processed in the next iteration), but the
# refusal already went out; from then on each iteration sends exactly one `BatchTokenizerMsg`. uid 1000 finishes with
# `length` at its max_tokens and leaves the batch; uid 7 keeps decoding. Compare with the offline `LLM.generate`: the same
# model and engine code, the same tokens one by one.

# %%
from minisgl.llm import LLM

offline_llm = LLM(str(tiny_qwen3()), dtype=torch.float32, max_running_req=4, num_page_override=256, max_seq_len_override=48)
offline = offline_llm.generate(["The capital of France is"], SamplingParams(max_tokens=5, ignore_eos=True))[0]["token_ids"]
print(tr("offline generate for the prompt of uid 7: {tokens}", tokens=offline))

# %% [markdown] tags=["lang-zh"]
# ## 2. 只在空闲时阻塞
#
# 没事可做时 `run_once()` 阻塞在接收上（不空转、不占 CPU），并且在阻塞之前先给 API 服务器报一次现状；
# 消息一到就醒来。有事可做时它只取已经到了的消息、绝不等待。

# %% [markdown] tags=["lang-en"]
# ## 2. Block only when idle
#
# With nothing to do, `run_once()` blocks in its receive (no spinning, no CPU), and before it blocks it reports the state
# to the API server once; a message wakes it up. With work to do, it only takes messages that have already arrived and
# never waits.

# %%
import threading
import time

while frontend_inbox.get(timeout=0.2) is not None:  # 丢掉之前的现状 | en: drop the stats seen so far
    pass
worker = threading.Thread(target=sched.run_once)
worker.start()
time.sleep(0.5)
print(tr("idle scheduler still blocked after a while:"), worker.is_alive())
stats = frontend_inbox.get(timeout=2)
print(tr("what it reported before blocking: running={running}, waiting={waiting}, pages_in_use={pages}",
         running=stats.running, waiting=stats.waiting, pages=stats.pages_in_use))
to_scheduler.put(user_msg(5, "Once upon a time", max_tokens=2, ignore_eos=True))
worker.join(10)
print(tr("a message arrived, run_once returned:"), not worker.is_alive())
iterate()

# %% [markdown] tags=["lang-zh"]
# ## 3. EOS 与取消
#
# 随机权重的小模型不会真的生成 EOS，这里把调度器的 `eos_token_id` 临时改成它一定会生成的一个 token。
# 遇到 EOS 的请求以 `stop` 结束，最后一条的 `next_token` 是 -1（EOS 不是文本）；重叠调度为它多算的那一步
# 什么也不发。另一个请求在运行中被取消：之后再没有它的消息——取消来自分词进程，它自己已经答复了客户端。

# %% [markdown] tags=["lang-en"]
# ## 3. EOS and abort
#
# The small random-weight model never really generates EOS, so we temporarily set the scheduler's `eos_token_id` to a
# token it is sure to generate. The request that meets EOS finishes with `stop`, and its last message has `next_token` -1
# (EOS is not text); the extra step overlap scheduling computes for it sends nothing. Another request is aborted while
# running: nothing more is sent for it. The abort came from the tokenizer, which has answered the client itself.

# %%
full = offline_llm.generate(["Hello, my name is"], SamplingParams(max_tokens=8, ignore_eos=True))[0]["token_ids"]
offline_llm.shutdown()
saved_eos, sched.eos_token_id = sched.eos_token_id, full[3]
print(tr("greedy output: {tokens}; EOS is now {eos}", tokens=full, eos=full[3]))


def abort_12_at_iteration_3(i):
    if i == 3:
        print(tr("(the API server sends AbortBackendMsg(uid=12))"))
        to_scheduler.put(AbortBackendMsg(uid=12))
        time.sleep(0.1)  # 等它送到 | en: let it arrive


to_scheduler.put(BatchBackendMsg(data=[user_msg(11, "Hello, my name is", max_tokens=8),
                                       user_msg(12, "1, 2, 3,", max_tokens=30, ignore_eos=True)]))
iterate(before=abort_12_at_iteration_3)
sched.eos_token_id = saved_eos

# %% [markdown] tags=["lang-zh"]
# uid 12 的取消在第 3 次迭代里处理：不回消息，那时在途的一步为它算的 token 被丢掉。uid 11 在 EOS 处以 `stop` 结束；
# 最后一次迭代处理的正是重叠调度在 EOS 之后为它多算的那一步——什么也没发。
# 空闲下来，看一眼现状：请求槽全空，页面只剩前缀缓存占着的那些。

# %% [markdown] tags=["lang-en"]
# The abort of uid 12 is handled in iteration 3: no reply, and the token the step in flight computed for it is dropped. uid 11 finishes with `stop` at EOS; the last iteration processes exactly the extra step overlap scheduling
# computed for it after EOS, and sends nothing.
# Idle again, a look at the state: no slot in use, and only the pages the prefix cache holds.

# %%
while (batch := tokenizer_inbox.get(timeout=0.2)) is not None:
    pass
last = None
while (msg := frontend_inbox.get(timeout=0.2)) is not None:
    last = msg
cached = sched.cache_manager.prefix_cache.size_info.total_size // sched.page_size
print(tr("last SchedulerStats: running={running}, waiting={waiting}, pages_in_use={pages} (prefix cache: {cached}), "
         "steps={steps}, largest decode batch={batch}", running=last.running, waiting=last.waiting,
         pages=last.pages_in_use, cached=cached, steps=last.steps, batch=last.max_decode_batch))

# %% [markdown] tags=["lang-zh"]
# ## 4. 动手调：请求数和生成长度
#
# 一次送来若干个请求（各自的 max_tokens 不同），看每次迭代的批次大小：请求一结束就离开批次，
# 只要槽位够（这里 4 个），同时到的请求都在同一个解码批里。

# %% [markdown] tags=["lang-en"]
# ## 4. Try it: number of requests and generation length
#
# Send a number of requests at once (each with a different max_tokens) and watch the batch size of each iteration: a
# request leaves the batch as soon as it finishes, and as long as there are slots (4 here), requests that arrive together
# share one decode batch.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

PROMPTS = ["Hello, my name is", "The capital of France is", "1, 2, 3,", "def add(a, b):", "Once upon a time", "Water boils at"]
next_uid = [2000]


def serve(num_requests: int, max_tokens: int) -> None:
    uids = list(range(next_uid[0], next_uid[0] + num_requests))
    next_uid[0] += num_requests
    to_scheduler.put(BatchBackendMsg(data=[
        user_msg(uid, PROMPTS[i % len(PROMPTS)], max_tokens=max_tokens + i, ignore_eos=True) for i, uid in enumerate(uids)
    ]))
    sizes = []
    for i in range(200):
        if i > 0 and not sched.busy:
            break
        sched.run_once()
        batch = tokenizer_inbox.get(timeout=0.5)
        sizes.append(len(batch.data) if batch is not None else 0)
    while (msg := frontend_inbox.get(timeout=0.1)) is not None:
        last = msg
    print(tr("{n} requests, max_tokens {lo}..{hi}: messages per iteration {sizes}", n=num_requests, lo=max_tokens,
             hi=max_tokens + num_requests - 1, sizes=sizes))
    print(tr("largest decode batch so far: {batch}; slots in use now: {running}", batch=last.max_decode_batch, running=last.running))


explorer = Explorer(
    serve,
    title=tr("Requests over messages"),
    num_requests=widgets.IntSlider(value=3, min=1, max=6, description=tr("requests")),
    max_tokens=widgets.IntSlider(value=3, min=1, max=12, description="max_tokens"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (checks it without a browser)
explorer.run(num_requests=6, max_tokens=2)

# %%
# 关掉：ExitMsg 结束循环；套接字用 linger 0 关闭
# en: Shut down: ExitMsg ends the loop; sockets closed with linger 0
to_scheduler.put(ExitMsg())
print(tr("run_once after an ExitMsg returns:"), sched.run_once())
for queue in (tokenizer_inbox, frontend_inbox, to_scheduler):
    queue.close()
sched.close()
sched.shutdown()

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 为什么有事可做时不能阻塞在接收上？只看“有没有等待或运行的请求”够不够？
#
# <details><summary>答案</summary>
#
# 阻塞时调度器什么也不算：正在解码的请求会一直停着，直到下一条消息碰巧到来。只看等待和运行的请求也不够：
# 重叠调度下，最后一步可能还在途（主循环零件的 `busy`），它的结果没处理，请求的最后一个 token 就发不出去。
# 所以条件是 `not self.busy`，它把在途的一步也算进去。
# </details>
#
# 2. 一个请求遇到 EOS 结束，反分词进程收到的最后一条 `DetokenizeMsg` 是什么？重叠调度多算的那一步呢？
#
# <details><summary>答案</summary>
#
# `DetokenizeMsg(uid, next_token=-1, finished=True, finish_reason="stop")`：EOS 不是文本，也不计入 completion_tokens。
# 多算的那一步的 token 第 2 阶段已经丢掉了，这里也不为已经结束的请求发任何消息。
# </details>
#
# 3. 调度器为什么不把收到的请求再查一遍（长度、词表、采样参数）？它要拒绝的那一种请求，为什么不能像上游那样记一行日志就丢掉？
#
# <details><summary>答案</summary>
#
# 请求在进门处已经查过一次；再查一遍就多出一条规则，迟早和门口的那条走散：门口放行的请求到了里面被拒绝，或者被悄悄改掉。
# 调度器只拒绝它自己才知道的情况——uid 与还没了结的请求重复。拒绝也要回话：客户端还在等它的回答，没有任何消息回去，
# HTTP 请求就一直挂着。回一条 `RejectMsg`，API 服务器才能立刻答一个错误。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. Why must the scheduler not block in its receive while there is work? Is "are there waiting or running requests?" enough?
#
# <details><summary>Answer</summary>
#
# While blocked the scheduler computes nothing: decoding requests would stand still until the next message happened to
# arrive. Waiting and running requests are not enough either: with overlap scheduling the last step may still be in flight
# (the main-loop part's `busy`), and until its results are processed the request's last token cannot go out. So the condition is
# `not self.busy`, which counts the step in flight too.
# </details>
#
# 2. A request ends at EOS. What is the last `DetokenizeMsg` the detokenizer gets? And for the extra step overlap scheduling computes?
#
# <details><summary>Answer</summary>
#
# `DetokenizeMsg(uid, next_token=-1, finished=True, finish_reason="stop")`: EOS is not text and does not count as a
# completion token. Stage 2 already drops the token of the extra step, and nothing is sent for a request that has finished.
# </details>
#
# 3. Why does the scheduler not check an incoming request again (length, vocabulary, sampling parameters)? And why may the
#    one kind of request it refuses not just be dropped with a log line, as upstream does?
#
# <details><summary>Answer</summary>
#
# The request was checked once, where it entered; checking again adds a second rule, which sooner or later drifts away
# from the door's: a request let in at the door is refused inside, or silently altered. The scheduler refuses only what
# it alone can know: a uid equal to that of a request not settled yet. A refusal needs an answer too: the client is still
# waiting, and with no message going back the HTTP request hangs forever. A `RejectMsg` lets the API server answer with
# an error at once.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage3/scheduler_io.py` 里的任务后运行下面这一格（`python -m minisgl.course check scheduler_io`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage3/scheduler_io.py`, run the cell below (`python -m minisgl.course check scheduler_io`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("scheduler_io")
