# %% [markdown] tags=["lang-zh"]
# # 第 3 阶段里程碑：用官方的 openai 客户端和引擎说话
#
# 第 3 阶段把第 2 阶段的调度器搬进了一个服务：`python -m minisgl --model 目录` 启动 API 服务器、分词进程和调度器进程，
# 三者之间只传 ZMQ 消息。里程碑脚本 `examples/stage3_milestone.py`（`make milestone3` 跑的就是它）在一个空闲端口上
# 启动服务，然后用官方的 `openai` 客户端：
#
# 1. 一次非流式的补全（文本、`usage`、`finish_reason`）；
# 2. 一次流式的对话（第一段什么时候到、一共几段）；
# 3. 8 个线程同时各发一个请求，调度器把它们放进同一个批次（从 `/metrics` 读最大的解码批）；
# 4. 一个客户端流到一半断开，它占的 KV 页回到池子里；
# 5. 列出服务的进程；最后用 Ctrl-C（SIGINT）关掉服务，确认没有留下任何子进程。
#
# 讲义的里程碑页录的是 0.6B 形状的模型；这里用小 Qwen3（分词器相同，几秒就跑完），**生成的文字没有意义**。

# %% [markdown] tags=["lang-en"]
# # Stage 3 milestone: talking to the engine with the official openai client
#
# Stage 3 moved the stage-2 scheduler into a service: `python -m minisgl --model DIR` starts the API server, the
# tokenizer process and the scheduler process, which exchange nothing but ZMQ messages. The milestone script
# `examples/stage3_milestone.py` (the one `make milestone3` runs) starts the service on a free port, then, with the
# official `openai` client:
#
# 1. one non-streamed completion (the text, `usage`, `finish_reason`);
# 2. one streamed chat (when the first piece arrives, how many pieces);
# 3. 8 threads each send a request at once, and the scheduler puts them into one batch (the largest decode batch, read
#    from `/metrics`);
# 4. a client disconnects halfway through a stream, and the KV pages it held go back to the pool;
# 5. lists the service's processes; finally stops the service with Ctrl-C (SIGINT) and makes sure no child process is left.
#
# The book's milestone page records the 0.6B-shaped model; here we use the tiny Qwen3 (same tokenizer, done in seconds),
# and **the generated text is meaningless**.

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

# %% tags=["random-text"]
sys.path.insert(0, str(ROOT / "examples"))
import stage3_milestone
from minisgl.model_zoo import tiny_qwen3

results = stage3_milestone.main(["--model", str(tiny_qwen3()), "--batch-tokens", "160"])

# %%
idle, held, back = results["pages"]
print(tr("largest decode batch: {batch}; KV pages held by requests before the stream and after the disconnect: {idle:.0f}, {back:.0f}; more while streaming: {more}",
         batch=results["largest_batch"], idle=idle, back=back, more=held > idle))
print(tr("processes left behind after Ctrl-C: {n}", n=len(results["left_behind"])))

# %% [markdown] tags=["lang-zh"]
# ## 请求槽与并发
#
# 拖动滑块：服务只有 `max_running_req` 个请求槽，8 个线程同时各发一个请求。槽位少于 8 时，多出来的请求只能等前面的做完，
# 最大的解码批就是槽位数。每换一次都要重启一次服务（小 Qwen3，几秒钟）。

# %% [markdown] tags=["lang-en"]
# ## Request slots and concurrency
#
# Move the slider: the service has only `max_running_req` request slots, and 8 threads each send a request at once. With
# fewer than 8 slots the extra requests wait until earlier ones finish, and the largest decode batch is the number of
# slots. Every change restarts the service (the tiny Qwen3, a few seconds).

# %%
import ipywidgets as widgets
from openai import OpenAI

from minisgl.processes.harness import ServerProcess
from minisgl.notebook import Explorer


def concurrency(max_running_req: int) -> None:
    with ServerProcess(tiny_qwen3(), *stage3_milestone.FLAGS, "--max-running-req", str(max_running_req)) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        stage3_milestone.send_at_once(client, "qwen3-tiny-random", 8, max_tokens=16, prompt="Request {i}")
        batch = int(server.metrics()["minisgl_max_decode_batch"])
    print(tr("{slots} request slots, 8 requests at once: largest decode batch {batch}", slots=max_running_req, batch=batch))


explorer = Explorer(concurrency, title=tr("Request slots"),
                    max_running_req=widgets.IntSlider(value=8, min=1, max=8, description="max_running_req"))
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (checks it without a browser)
explorer.run(max_running_req=2)

# %% [markdown] tags=["lang-zh"]
# ## 试一试
#
# - 在终端里运行 `python -m minisgl --model models/qwen3-tiny-random`，浏览器打开它打印的地址，在聊天页面里发一句话，
#   中途按“停止”，再看 `/metrics` 里被取消的请求数；
# - 把 `--max-running-req` 改成 1 再跑里程碑：8 个请求只能一个接一个地算，最大解码批变成 1；
# - 用 `curl -N` 发一个 `"stream": true` 的请求，看 SSE 的原始样子：每一段是一行 `data: {...}`，最后是 `data: [DONE]`。

# %% [markdown] tags=["lang-en"]
# ## Try this
#
# - In a terminal run `python -m minisgl --model models/qwen3-tiny-random`, open the address it prints in a browser, send a
#   message on the chat page, press "stop" halfway, then look at the count of aborted requests in `/metrics`;
# - run the milestone with `--max-running-req` set to 1: the 8 requests can only be computed one after another, and the
#   largest decode batch becomes 1;
# - send a `"stream": true` request with `curl -N` to see raw SSE: each piece is one `data: {...}` line, and the last is
#   `data: [DONE]`.

# %% [markdown] tags=["lang-zh"]
# ## 检查
#
# 第 3 阶段都写完之后，运行下面这一格跑里程碑的检查（`checks/stage3/test_milestone.py`）。

# %% [markdown] tags=["lang-en"]
# ## Checks
#
# When all of stage 3 is written, run the cell below for the milestone checks (`checks/stage3/test_milestone.py`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_milestone_checks

run_milestone_checks(3)
