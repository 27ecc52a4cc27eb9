# %% [markdown] tags=["lang-zh"]
# # 第 3.1 章 message：进程之间的消息、序列化与 ZMQ 队列
#
# 在线服务是几个进程：API 服务器、分词 / 反分词进程、调度器。它们之间只传消息：
#
# - **消息按收信人分组**：发给分词进程的、发给调度器的、发给 API 服务器的，各有一个基类和一个批量消息；
# - **一个通用的序列化器**：dataclass 嵌套 dataclass，一维 token 张量按原始字节传，不认识的类型一律拒绝；
# - **队列**：PUSH/PULL 一对一，PUB/SUB 一对多；PUB 在订阅到达之前发的消息会被丢掉（“慢加入者”），握手解决它。
#
# 本章要写的是序列化的两半（`to_wire`、`from_wire`）和发布端的握手（`wait_for_subscribers`）。

# %% [markdown] tags=["lang-en"]
# # Chapter 3.1 message: messages between processes, serialization and ZMQ queues
#
# The online service is several processes: the API server, the tokenizer / detokenizer and the scheduler. Between them
# only messages travel:
#
# - **messages grouped by receiver**: those for the tokenizer, for the scheduler and for the API server each have a base
#   class and a batch message;
# - **one generic serializer**: dataclasses inside dataclasses, 1-D token tensors sent as raw bytes, any unknown type
#   refused;
# - **queues**: PUSH/PULL one to one, PUB/SUB one to many; a PUB drops what it sends before a subscription has arrived
#   (the "slow joiner"), and a handshake fixes that.
#
# This chapter's tasks are the two halves of serialization (`to_wire`, `from_wire`) and the publisher's handshake
# (`wait_for_subscribers`).

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
# 本章的任务（和 stage3/message.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage3/message.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("message")

# %% [markdown] tags=["lang-zh"]
# ## 1. 一条消息在线上是什么样子
#
# `to_wire` 把消息变成 msgpack 能直接写的东西：dataclass 变成带类名的字典，张量变成原始字节加 dtype。
# 看一条取消消息和一条带 8 个 token 的请求：

# %% [markdown] tags=["lang-en"]
# ## 1. What a message looks like on the wire
#
# `to_wire` turns a message into what msgpack writes directly: a dataclass becomes a dict with its class name, a tensor
# becomes raw bytes plus its dtype. Here are an abort message and a request with 8 tokens:

# %%
import torch

from minisgl.core import SamplingParams
from minisgl.message import AbortBackendMsg, AbortMsg, BatchBackendMsg, UserMsg, deserialize, serialize, to_wire

print(to_wire(AbortMsg(uid=3)))
req = UserMsg(uid=7, input_ids=torch.tensor([9707, 11, 847, 829, 374, 1207, 13, 151645], dtype=torch.int32),
              sampling_params=SamplingParams(max_tokens=16))
print(to_wire(req))
batch = BatchBackendMsg([req, AbortBackendMsg(uid=3)])
back = deserialize(serialize(batch))
print(tr("{n} bytes on the wire; back again: {types}, the same ids: {same}", n=len(serialize(batch)),
         types=[type(m).__name__ for m in back.data], same=torch.equal(back.data[0].input_ids, req.input_ids)))

# %% [markdown] tags=["lang-zh"]
# ## 2. 为什么按字节传张量
#
# 一个 token id 若变成 Python 整数再交给 msgpack，大于 65535 的 id 每个要 5 个字节，还要逐个转换；
# 按原始字节传，int32 每个 4 个字节，一次拷贝。提示词越长差得越多（时间每次运行都不同）：

# %% [markdown] tags=["lang-en"]
# ## 2. Why tensors travel as bytes
#
# Turned into Python ints for msgpack, each token id above 65535 takes 5 bytes and is converted one by one; as raw bytes
# an int32 takes 4, in one copy. The longer the prompt, the bigger the gap (the times differ from run to run):

# %%
import time

import msgpack

from minisgl.notebook import fmt_ms


def wire_sizes(num_tokens: int, dtype: str = "int32") -> None:
    ids = torch.arange(100000, 100000 + num_tokens).to(getattr(torch, dtype))
    start = time.perf_counter()
    as_bytes = len(msgpack.packb(to_wire(ids)))
    mid = time.perf_counter()
    as_ints = len(msgpack.packb(ids.tolist()))
    end = time.perf_counter()
    print(tr("{n} tokens ({dtype}): {as_bytes} bytes as raw bytes ({t_bytes}), {as_ints} bytes as a list of ints ({t_ints})",
             n=num_tokens, dtype=dtype, as_bytes=as_bytes, t_bytes=fmt_ms(mid - start), as_ints=as_ints, t_ints=fmt_ms(end - mid)))


for n in (8, 1000, 32000):
    wire_sizes(n)

# %% [markdown] tags=["lang-zh"]
# ## 3. 不认识的类型：在发送的这一边就报错
#
# 如果序列化器悄悄把不认识的东西 `pickle` 掉或者转成字符串，错误会在另一个进程里、很久以后才冒出来。
# 这里当场拒绝，并写明是哪个字段：

# %% [markdown] tags=["lang-en"]
# ## 3. Unknown types: the error is raised on the sending side
#
# If the serializer quietly pickled an unknown value or turned it into a string, the error would surface in another
# process, much later. Here it is refused on the spot, naming the field:

# %%
for bad in (BatchBackendMsg([req, UserMsg(9, torch.zeros(2, 3, dtype=torch.int32), SamplingParams())]),
            UserMsg(10, {1, 2, 3}, SamplingParams())):  # type: ignore[arg-type]
    try:
        serialize(bad)
    except TypeError as e:
        print("TypeError:", e)

# %% [markdown] tags=["lang-zh"]
# ## 4. 慢加入者
#
# ZMQ 的 PUB 只把消息发给**订阅已经到达**的订阅端，其余的直接丢掉，不报错。订阅是连接建好之后才送过去的，
# 所以刚连上就发的第一条消息最容易丢。下面让订阅端先连（发布端还没绑定，ZMQ 在后台等一会儿再重连），
# 发布端一绑定就发：

# %% [markdown] tags=["lang-en"]
# ## 4. The slow joiner
#
# A ZMQ PUB sends a message only to subscribers **whose subscription has already arrived** and silently drops it for the
# rest. A subscription is sent only once the connection is up, so the first message, sent right after connecting, is
# the easiest to lose. Below the subscriber connects first (the publisher is not bound yet, so ZMQ waits a little before
# it reconnects), and the publisher sends as soon as it is bound:

# %%
import zmq

from minisgl.message import DetokenizeMsg, ZmqPubQueue, ipc_addr, make_ipc_dir

ipc_dir = make_ipc_dir()
ctx = zmq.Context()


def subscriber(name: str) -> zmq.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RECONNECT_IVL, 300)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(ipc_addr(ipc_dir, name))
    return sub


def first_received(sub: zmq.Socket) -> str:
    if not sub.poll(2000):
        return tr("nothing")
    return repr(deserialize(sub.recv()))


sub = subscriber("plain")
pub = ctx.socket(zmq.PUB)
pub.bind(ipc_addr(ipc_dir, "plain"))
pub.send(serialize(DetokenizeMsg(uid=1, next_token=11)))  # 第一条：订阅还没到 | en: the first: the subscription has not arrived
time.sleep(1)
pub.send(serialize(DetokenizeMsg(uid=2, next_token=22)))  # 第二条：订阅早到了 | en: the second: the subscription is long in
print(tr("plain PUB, the first message received: {got}", got=first_received(sub)))

sub = subscriber("handshake")
xpub = ZmqPubQueue(ipc_addr(ipc_dir, "handshake"), ctx=ctx)
xpub.wait_for_subscribers(1, timeout=10)
xpub.put(DetokenizeMsg(uid=1, next_token=11))
print(tr("XPUB after the handshake, the first message received: {got}", got=first_received(sub)))

# %% [markdown] tags=["lang-zh"]
# 普通 PUB 的第一条消息（uid=1）就这么没了，收到的第一条是 uid=2；握手之后第一条就到。第 4 阶段里，调度器 rank 0
# 要把每个请求广播给其他 rank——丢一条，各 rank 的批次就对不上，程序会卡死。

# %% [markdown] tags=["lang-en"]
# The plain PUB's first message (uid=1) is simply gone, and the first one received is uid=2; after the handshake the
# first message arrives. In stage 4 scheduler rank 0 broadcasts every request to the other ranks: lose one and the
# ranks' batches no longer match, and the program hangs.

# %% [markdown] tags=["lang-zh"]
# ## 5. ipc 路径有长度上限
#
# Unix 域套接字的路径最多 107 个字节，所以套接字都放在 `/tmp/msgl-xxxx` 这样很短的目录里。超了就明确报错：

# %% [markdown] tags=["lang-en"]
# ## 5. ipc paths have a length limit
#
# A Unix domain socket path holds at most 107 bytes, which is why the sockets live in a very short folder such as
# `/tmp/msgl-xxxx`. Go over the limit and the error says so:

# %%
try:
    ipc_addr("/tmp/" + "a-very-long-folder-name/" * 5, "tokenizer")
except ValueError as e:
    print("ValueError:", e)
ctx.destroy(linger=0)

# %% [markdown] tags=["lang-zh"]
# ## 6. 动手调：消息有多大
#
# 改 token 数和 dtype，看序列化后的大小。int64 每个 token 要 8 个字节，比 msgpack 的整数还大：
# 所以消息里的 `input_ids` 一律是 int32。

# %% [markdown] tags=["lang-en"]
# ## 6. Try it: how big is a message
#
# Change the number of tokens and the dtype and see the serialized size. At 8 bytes per token, int64 is bigger than
# msgpack's ints: that is why the messages' `input_ids` are always int32.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

explorer = Explorer(
    wire_sizes,
    title=tr("Size of a request on the wire"),
    num_tokens=widgets.IntSlider(value=1000, min=1, max=32000, description=tr("tokens")),
    dtype=widgets.Dropdown(options=["int32", "int64"], value="int32", description="dtype"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它；CI 比较时把时间遮掉）
# en: Call the widget's handler with one set of values (checks it without a browser; the times are masked when CI compares)
explorer.run(num_tokens=4096, dtype="int64")

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 为什么 `from_wire` 重建张量前要把字节拷进一个 `bytearray`？
#
# <details><summary>答案</summary>
#
# `torch.frombuffer` 直接用那块内存：msgpack 给的是只读的 `bytes`，在上面建的张量不能写（PyTorch 会警告，写了是未定义行为）。
# 拷进 `bytearray` 之后张量有了自己的、可写的内存。
# </details>
#
# 2. 一条 `BatchTokenizerMsg` 里装着 3 条 `DetokenizeMsg`，`to_wire` 出错时 `where` 写成什么？
#
# <details><summary>答案</summary>
#
# 从 `msg` 起逐层加上字段名和下标，例如 `msg.data[2].next_token`：一眼就知道是哪条消息的哪个字段。
# </details>
#
# 3. 发布端为什么要设 `XPUB_VERBOSE`？
#
# <details><summary>答案</summary>
#
# 默认 XPUB 只报告每个主题的**第一个**订阅；好几个订阅端订阅同一个主题（这里都是空主题）时，后面的就看不见了，
# 等 `n` 个订阅会一直等下去。`XPUB_VERBOSE` 让每个订阅都报上来。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. Why does `from_wire` copy the bytes into a `bytearray` before rebuilding a tensor?
#
# <details><summary>Answer</summary>
#
# `torch.frombuffer` uses that very memory: msgpack hands over read-only `bytes`, and a tensor built on them cannot be
# written (PyTorch warns; writing is undefined behaviour). Copied into a `bytearray`, the tensor has writable memory of
# its own.
# </details>
#
# 2. A `BatchTokenizerMsg` holds 3 `DetokenizeMsg`. When `to_wire` fails, what does `where` say?
#
# <details><summary>Answer</summary>
#
# The path from `msg` down, field names and indices, such as `msg.data[2].next_token`: you see at once which field of
# which message it was.
# </details>
#
# 3. Why does the publisher set `XPUB_VERBOSE`?
#
# <details><summary>Answer</summary>
#
# By default an XPUB reports only the **first** subscription to each topic; when several subscribers subscribe to the
# same topic (here all use the empty topic), the later ones are invisible, and waiting for `n` subscriptions would wait
# forever. `XPUB_VERBOSE` reports every one.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage3/message.py` 里的任务后运行下面这一格（`python -m minisgl.course check message`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage3/message.py`, run the cell below (`python -m minisgl.course check message`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("message")
