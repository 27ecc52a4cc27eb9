# %% [markdown] tags=["lang-zh"]
# # 第 3.4 章 api_server：OpenAI 兼容的 HTTP 接口
#
# `python -m minisgl --model DIR` 启动三个进程：API 服务器（HTTP，在启动器自己的进程里）、分词 / 反分词进程、调度器进程。
# 一个请求的路径：
#
#     HTTP 请求 → SamplingParams（本章）→ TokenizeMsg → 分词进程 → UserMsg → 调度器
#     调度器 → DetokenizeMsg → 反分词进程 → UserReply → 按 uid 分给各个请求 → SSE 片段或一整个 JSON（本章）
#
# 本章你写的是对客户端说话的部分：把 OpenAI 的请求变成采样参数（不合法的、不支持的参数回 400，说清是哪个）；
# 流式回答（`data: {json}` 一段段地发，最后 `data: [DONE]`）；非流式回答（全文、真实的 `usage`、正确的
# `finish_reason`）；客户端断开就取消请求（取消消息要真的发出去，页面和请求槽才回得来）。
# 启动器、FastAPI 的接线、`/metrics` 和对话页面是给定的。
#
# 这个笔记本在小模型上启动服务器，用官方的 `openai` 客户端发一个普通请求、一个流式请求，看一眼线上传的是什么、
# 坏请求得到什么、`/metrics` 里有什么，最后关掉服务器。小模型的权重是随机的，**生成的文字没有意义**。

# %% [markdown] tags=["lang-en"]
# # Chapter 3.4 api_server: an OpenAI-compatible HTTP API
#
# `python -m minisgl --model DIR` starts three processes: the API server (HTTP, in the launcher's own process), the
# tokenizer / detokenizer process and the scheduler process. One request's path:
#
#     HTTP request → SamplingParams (this chapter) → TokenizeMsg → tokenizer → UserMsg → scheduler
#     scheduler → DetokenizeMsg → detokenizer → UserReply → handed to its request by uid → SSE chunks or one JSON object (this chapter)
#
# In this chapter you write the part that talks to the client: turning an OpenAI request into sampling parameters (an
# invalid or unsupported parameter gets a 400 that names it); the streamed answer (`data: {json}` piece by piece, then
# `data: [DONE]`); the non-streamed answer (the whole text, the real `usage`, the right `finish_reason`); and aborting the
# request when the client disconnects (the abort must really be sent, or the pages and the request slot never come back).
# The launcher, the FastAPI wiring, `/metrics` and the chat page are given.
#
# This notebook starts the server on the tiny model, sends one plain request and one streamed request with the official
# `openai` client, looks at what actually goes over the wire, at what a bad request gets and at what `/metrics` holds,
# and finally stops the server. The tiny model has random weights: **the generated text is meaningless**.

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
# 本章的任务（和 stage3/api_server.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage3/api_server.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("api_server")

# %% [markdown] tags=["lang-zh"]
# ## 1. 启动服务器
#
# 相当于在终端里运行 `python -m minisgl --model models/qwen3-tiny-random --port 0 ...`：`--port 0` 让系统挑一个空闲端口，
# 启动器等分词进程和调度器进程都报告就绪之后，打印真实的地址（`正在监听 http://127.0.0.1:端口`）。
# `ServerProcess` 读出这个地址，再轮询 `/health` 直到它回答 200。两个工作进程都是用 spawn 方式启动的，
# 另外还有一个 `multiprocessing` 自带的资源跟踪进程。

# %% [markdown] tags=["lang-en"]
# ## 1. Starting the server
#
# The same as running `python -m minisgl --model models/qwen3-tiny-random --port 0 ...` in a terminal: `--port 0` lets
# the system pick a free port, and once the tokenizer and scheduler processes have both reported ready, the launcher
# prints the real address (`listening on http://127.0.0.1:PORT`). `ServerProcess` reads that address, then polls
# `/health` until it answers 200. Both workers are started with the spawn method; there is also `multiprocessing`'s own
# resource tracker process.

# %%
from minisgl.processes.harness import ServerProcess, child_pids
from minisgl.model_zoo import tiny_qwen3

server = ServerProcess(tiny_qwen3(), "--dtype", "float32", "--num-pages", "1024", "--max-seq-len", "256")
server.start()
print(tr("/health answers 200; the launcher has {n} child processes", n=len(child_pids(server.proc.pid))))

# %% [markdown] tags=["lang-zh"]
# ## 2. 一个普通请求：官方的 `openai` 客户端
#
# 客户端只需要知道 `base_url`。`temperature=0` 是贪心，输出每次都一样；`ignore_eos` 是上游的扩展字段（遇到 EOS 也不停），
# 不在 OpenAI 的参数表里，所以放进 `extra_body`。`usage` 里的数是真的：提示词的 token 数来自分词进程（套上了对话模板），
# 生成的 token 数来自反分词进程。`finish_reason` 是 `"length"`：到了 `max_tokens`。

# %% [markdown] tags=["lang-en"]
# ## 2. A plain request: the official `openai` client
#
# The client only needs the `base_url`. `temperature=0` is greedy, so the output is the same every time; `ignore_eos` is
# upstream's extra field (do not stop at EOS), not in OpenAI's parameter list, so it goes into `extra_body`. The numbers
# in `usage` are real: the prompt's token count comes from the tokenizer process (with the chat template applied), the
# generated count from the detokenizer. `finish_reason` is `"length"`: `max_tokens` was reached.

# %%
from openai import OpenAI

client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
MODEL = client.models.list().data[0].id
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True})
print(tr("model:"), MODEL)
print(tr("answer:"), repr(answer.choices[0].message.content))
print(tr("finish_reason:"), answer.choices[0].finish_reason)
print(tr("usage:"), answer.usage.model_dump())

# %% [markdown] tags=["lang-zh"]
# ## 3. 流式请求
#
# `stream=True`：服务器用 server-sent events 一段段地发，客户端收到一段就能显示一段。每段都是新的、完整的文字
# （半个汉字或 emoji 由反分词进程先扣住），所有段拼起来正好等于非流式的全文。`stream_options={"include_usage": True}`
# 让最后多一段 `usage`（它的 `choices` 是空的）。

# %% [markdown] tags=["lang-en"]
# ## 3. A streamed request
#
# `stream=True`: the server sends server-sent events piece by piece, and the client can show each piece as it arrives.
# Every piece is new, complete text (half a Chinese character or an emoji is held back by the detokenizer), and all of
# them joined are exactly the non-streamed text. `stream_options={"include_usage": True}` adds one last chunk with the
# `usage` (its `choices` is empty).

# %%
import time

from minisgl.notebook import fmt_ms

start, first, pieces, usage = time.perf_counter(), None, [], None
for chunk in client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        if choice.delta.content:
            first = first or time.perf_counter()
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            print(tr("finish_reason:"), choice.finish_reason)
print(tr("{n} pieces:", n=len(pieces)), " | ".join(repr(p) for p in pieces))
print(tr("joined, equal to the non-streamed answer:"), "".join(pieces) == answer.choices[0].message.content)
print(tr("usage chunk:"), usage.model_dump())
print(tr("first piece after {ttft}", ttft=fmt_ms((first or start) - start)))

# %% [markdown] tags=["lang-zh"]
# ## 4. 线上传的是什么
#
# 不用客户端，直接看一个流式补全的原始字节：每个事件是 `data: ` 加一个 JSON 对象，事件之间空一行；
# 最后一段带 `finish_reason`，然后是 `data: [DONE]`。（`created` 是时间戳，这里换成了 `…`。）

# %% [markdown] tags=["lang-en"]
# ## 4. What goes over the wire
#
# No client this time: the raw bytes of a streamed completion. Each event is `data: ` plus one JSON object, with a blank
# line between events; the last chunk carries the `finish_reason`, then comes `data: [DONE]`. (`created` is a timestamp,
# shown here as `…`.)

# %%
import json
import re
import urllib.request

body = {"prompt": "Hello, my name is", "max_tokens": 3, "temperature": 0, "ignore_eos": True, "stream": True}
request = urllib.request.Request(server.url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
with urllib.request.urlopen(request) as resp:
    print("Content-Type:", resp.headers["Content-Type"])
    raw = resp.read().decode()
print(re.sub(r'"created": \d+', '"created": …', raw))

# %% [markdown] tags=["lang-zh"]
# ## 5. 坏请求
#
# 会改变结果、这里却不支持的参数（`suffix` 要在中间补全、`tools` 要调用工具……）不能悄悄忽略：回 400，错误体是 OpenAI 的
# 样子，点名是哪些参数。（`n`、`logprobs` 和惩罚从第 3.5 章起支持，`response_format` 从第 3.6 章起支持，它们不在此列。）
# 不合法的值（负的 `temperature` ……）同样是 400。太长的提示词由分词进程拒绝（它数出 token 就按长度规则查），API 服务器同样回 400，客户端不会一直等下去。
# `openai` 客户端把 400 变成 `BadRequestError`。

# %% [markdown] tags=["lang-en"]
# ## 5. Bad requests
#
# A parameter that would change the result but is not supported here (`suffix` asks to fill in the middle, `tools` to
# call tools, ...) must not be silently ignored: a 400 with an OpenAI-style error body that names the parameters. (`n`,
# `logprobs` and the penalties are supported from chapter 3.5 on, `response_format` from chapter 3.6 on; they are not
# among them.) An invalid value (a negative `temperature`, ...) is a 400 as well. A
# prompt that is too long is refused by the tokenizer process (it checks the length rule as soon as it has counted the
# tokens), and the API server answers 400 for it too, so the client never waits forever. The `openai` client turns a
# 400 into a `BadRequestError`.

# %%
import openai

for kwargs in ({"prompt": "Hi", "suffix": " world"}, {"prompt": "hello " * 300}, {"prompt": "Hi", "temperature": -1}):
    try:
        client.completions.create(model=MODEL, max_tokens=4, **kwargs)
    except openai.BadRequestError as err:
        print(err.status_code, json.dumps(err.body, ensure_ascii=False))

# %% [markdown] tags=["lang-zh"]
# ## 6. `/metrics`
#
# Prometheus 的文本格式：调度器的现状（运行中、等待中的请求，KV 页）来自调度器每一步直接发来的 `SchedulerStats`；
# 计数器（提示词和生成的 token、按 `finish_reason` 分的请求数）和首 token 时间、每 token 时间的直方图是 API 服务器自己数的。
# 下面只挑几行；服务器空闲时没有运行中的请求，被请求占着的页都已归还（还占着的是前缀缓存留下的）。

# %% [markdown] tags=["lang-en"]
# ## 6. `/metrics`
#
# The Prometheus text format: the scheduler's state (running and waiting requests, KV pages) comes from the
# `SchedulerStats` the scheduler sends straight to the API server after every step; the counters (prompt and generated
# tokens, requests by `finish_reason`) and the histograms of the time to the first token and per token are counted by the
# API server itself. Only a few lines are shown; with the server idle no request is running, and every page a request
# held is back (the pages still in use are the prefix cache's).

# %%
with urllib.request.urlopen(server.url + "/metrics") as resp:
    lines = resp.read().decode().splitlines()
SHOW = ("minisgl_running_requests", "minisgl_waiting_requests", "minisgl_kv_pages_used", "minisgl_kv_pages_total",
        "minisgl_prompt_tokens_total", "minisgl_generation_tokens_total", "minisgl_requests_finished_total",
        "minisgl_time_to_first_token_seconds_count")
for line in lines:
    if line.startswith(SHOW):
        print(line)

# %% [markdown] tags=["lang-zh"]
# ## 试一试：改参数再问一次
#
# 拖动滑块，用新的 `temperature` 和 `max_tokens` 向还开着的服务器发一次补全请求：`temperature` 为 0 是贪心（每次一样），
# 大于 0 就采样（每次不同）；`max_tokens` 到了就停，`finish_reason` 是 `"length"`。

# %% [markdown] tags=["lang-en"]
# ## Try it: ask again with other settings
#
# Move the sliders to send one completion request with a new `temperature` and `max_tokens` to the server, which is still
# running: `temperature` 0 is greedy (the same every time), above 0 it samples (different every time); it stops when
# `max_tokens` is reached, with `finish_reason` `"length"`.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer


def ask(temperature: float, max_tokens: int) -> None:
    done = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=max_tokens,
                                     temperature=temperature, extra_body={"ignore_eos": True})
    print(tr("answer:"), repr(done.choices[0].text))
    print(tr("finish_reason:"), done.choices[0].finish_reason)
    print(tr("usage:"), done.usage.model_dump())


explorer = Explorer(
    ask,
    title=tr("One completion request"),
    temperature=widgets.FloatSlider(value=0.0, min=0.0, max=2.0, step=0.1, description="temperature"),
    max_tokens=widgets.IntSlider(value=3, min=1, max=16, description="max_tokens"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (checks it without a browser)
explorer.run(temperature=0.0, max_tokens=3)

# %% [markdown] tags=["lang-zh"]
# ## 7. 关掉服务器
#
# `ServerProcess.stop()` 发 SIGINT（和在终端里按 Ctrl-C 一样）：uvicorn 停止接新连接，启动器给调度器发 `ExitMsg`、
# 给分词进程发 SIGTERM，等它们退出（不退就 SIGTERM、再 SIGKILL），删掉 ipc 目录。退出码 0，没有留下任何子进程。

# %% [markdown] tags=["lang-en"]
# ## 7. Stopping the server
#
# `ServerProcess.stop()` sends SIGINT (the same as Ctrl-C in a terminal): uvicorn stops taking connections, the launcher
# sends the scheduler an `ExitMsg` and the tokenizer a SIGTERM, waits for them to exit (SIGTERM, then SIGKILL, if they do
# not), and removes the ipc folder. Exit status 0, and no child process is left.

# %%
code = server.stop()
print(tr("exit status:"), code)
print(tr("processes left behind:"), server.left_behind)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 流式请求为什么要等到第一条回复之后才发 HTTP 状态码？
#
# <details><summary>答案</summary>
#
# 状态码在响应的第一行，一旦发出就改不了。提示词太长的请求由调度器拒绝，拒绝在第一条回复里才知道；先等它，
# 被拒绝的流式请求就还能得到 400，而不是一个 200 的流里夹着错误。
# </details>
#
# 2. 客户端断开了，为什么一定要把 `AbortMsg` 发出去？不发会怎样？
#
# <details><summary>答案</summary>
#
# 调度器不知道客户端走了，会一直生成到 `max_tokens`：请求槽和 KV 页一直被占着，别的请求只能等；生成出来的文字也没人要。
# 上游的一个版本把取消协程交给了后台任务却没有真正调用它，请求就这样白白跑完。
# </details>
#
# 3. `suffix` 为什么回 400，而不是忽略它、照常往后补全？
#
# <details><summary>答案</summary>
#
# 客户端要的是补中间：前文和后文都给了，补出来的要能接上后文。悄悄忽略，它拿到的是只顾前文的续写，却以为服务器支持、
# 拿着错的结果继续跑。会改变结果的参数，不支持就要明说。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. Why does a streamed request wait for the first reply before sending the HTTP status?
#
# <details><summary>Answer</summary>
#
# The status is on the first line of the response and cannot change once sent. A prompt that is too long is refused by
# the scheduler, and the refusal is known only with the first reply; waiting for it lets a refused streamed request still
# get a 400, instead of a 200 stream with an error inside.
# </details>
#
# 2. When the client disconnects, why must the `AbortMsg` really be sent? What happens if it is not?
#
# <details><summary>Answer</summary>
#
# The scheduler does not know the client is gone and keeps generating up to `max_tokens`: the request slot and the KV
# pages stay taken, other requests have to wait, and nobody wants the text. One upstream version handed the abort
# coroutine to a background task without ever calling it, and the request simply ran to the end.
# </details>
#
# 3. Why is `suffix` a 400 rather than ignored with an ordinary continuation?
#
# <details><summary>Answer</summary>
#
# The client asked to fill in the middle: it gave the text before and after, and the answer has to lead into the text
# after. Quietly ignoring it, the client gets a continuation of the text before only, believes the server supports
# `suffix`, and carries on with a wrong result. A parameter that changes the result must be refused out loud if it is not
# supported.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage3/api_server.py` 里的任务后运行下面这一格（`python -m minisgl.course check api_server`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage3/api_server.py`, run the cell below (`python -m minisgl.course check api_server`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("api_server")
