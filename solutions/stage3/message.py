"""第 3.1 章 message：进程之间说的话——消息、序列化和 ZMQ 队列。

在线服务是几个进程：API 服务器（HTTP）、分词 / 反分词进程、调度器进程。它们之间只传消息：

    API 服务器 --TokenizeMsg--> 分词进程 --UserMsg--> 调度器
    调度器 --DetokenizeMsg--> 反分词进程 --UserReply--> API 服务器

- **按收信人分组**：发给分词进程的都是 :class:`BaseTokenizerMsg`，发给调度器的都是 :class:`BaseBackendMsg`，发给
  API 服务器的都是 :class:`BaseFrontendMsg`；每组都有一个批量消息（``Batch…Msg``），一次发一整步的结果；
- **一个通用的序列化器**：消息是 dataclass，可以嵌套（批量消息里装着消息），字段里可以有一维的 token 张量
  （按原始字节加 dtype 传，不逐个转成 Python 整数）；不认识的类型一律拒绝，并说清是哪个字段——
  悄悄 ``pickle`` 或转成字符串，错误就会到另一个进程里才冒出来；
- **队列**：PUSH/PULL 一对一地送消息（API 服务器那头是 asyncio 版）；PUB/SUB 一对多地广播（第 4 阶段调度器
  把请求转给其他 rank）。ZMQ 的 PUB 在订阅真正到达之前发出的消息会被**直接丢掉**（“慢加入者”）：
  订阅端先连上、发布端用 XPUB 收到订阅之后才开始发，第一条广播就不会丢。

套接字都用 ipc（本机的 Unix 域套接字），路径放在一个很短的临时目录里：Linux 上套接字路径最多 107 个字节。

en: Chapter 3.1 message: what the processes say to each other — messages, serialization and ZMQ queues.

The online service is several processes: the API server (HTTP), the tokenizer / detokenizer process and the scheduler
process. Between them only messages travel:

    API server --TokenizeMsg--> tokenizer --UserMsg--> scheduler
    scheduler --DetokenizeMsg--> detokenizer --UserReply--> API server

- **Grouped by receiver**: everything for the tokenizer process is a :class:`BaseTokenizerMsg`, everything for the
  scheduler a :class:`BaseBackendMsg`, everything for the API server a :class:`BaseFrontendMsg`; each group has a batch
  message (``Batch…Msg``) that carries a whole step's results at once;
- **One generic serializer**: messages are dataclasses and may nest (a batch message holds messages); a field may hold a
  1-D token tensor (sent as raw bytes plus its dtype, not converted to Python ints one by one); an unknown type is always
  refused, naming the field. Quietly pickling it or turning it into a string would make the error surface only in
  another process;
- **Queues**: PUSH/PULL delivers messages one to one (the API server's end is the asyncio variant); PUB/SUB broadcasts
  one to many (in stage 4 the scheduler forwards requests to the other ranks). A ZMQ PUB **silently drops** what it
  sends before a subscription has arrived (the "slow joiner"): the subscriber connects first, and the publisher, an XPUB,
  starts sending only after it has received the subscriptions, so the first broadcast is never lost.

Sockets are ipc (Unix domain sockets on this machine), with paths in a very short temporary directory: a socket path on
Linux holds at most 107 bytes.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack
import torch
import zmq
import zmq.asyncio

from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.server.args import ipc_addr, make_ipc_dir  # noqa: F401 - 给定的工具，各章从这里取 | en: given helpers, the chapters take them from here

# ----------------------------------------------------------------------------- 消息
# en: ----------------------------------------------------------------------------- messages

#: 序列化器认识的类型：类名 → 类。每个消息类定义时自己登记进来。
#: en: The types the serializer knows: class name → class. Every message class registers itself when defined.
MESSAGE_TYPES: dict[str, type] = {"SamplingParams": SamplingParams}


@dataclass
class Message:
    """所有消息的基类：子类一定义就登记进 :data:`MESSAGE_TYPES`，序列化器只认登记过的类。

    en: The base of every message: a subclass registers itself in :data:`MESSAGE_TYPES` when it is defined, and the
    serializer accepts only registered classes.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        MESSAGE_TYPES[cls.__name__] = cls


@dataclass
class BaseTokenizerMsg(Message):
    """发给分词 / 反分词进程的消息。

    en: A message for the tokenizer / detokenizer process.
    """


@dataclass
class BaseBackendMsg(Message):
    """发给调度器的消息。

    en: A message for the scheduler.
    """


@dataclass
class BaseFrontendMsg(Message):
    """发给 API 服务器的消息。

    en: A message for the API server.
    """


@dataclass
class TokenizeMsg(BaseTokenizerMsg):
    """API 服务器 → 分词进程：一个新请求。``prompt`` 是文本、对话消息列表（``[{"role": ..., "content": ...}]``，
    套用模型的对话模板）或现成的 token id 列表，三者之一。``max_seq_len`` 是服务器单个请求的长度上限（调度器就绪时
    报告的）：分词进程数出 token 之后，按它检查长度、定下没给的 ``max_tokens``。

    en: API server → tokenizer: a new request. ``prompt`` is one of: text, a list of chat messages
    (``[{"role": ..., "content": ...}]``, put through the model's chat template), or a ready list of token ids.
    ``max_seq_len`` is the server's length limit for one request (as the scheduler reported when ready): once the
    tokenizer has counted the tokens, it checks the length against it and settles an absent ``max_tokens``.
    """

    uid: int
    prompt: str | list[dict[str, str]] | list[int]
    sampling_params: SamplingParams
    max_seq_len: int
    stop: list[str] = field(default_factory=list)


@dataclass
class AbortMsg(BaseTokenizerMsg):
    """API 服务器 → 分词进程：客户端走了（断开、按了停止），取消这个请求；分词进程转告调度器。

    en: API server → tokenizer: the client is gone (disconnected, pressed stop), abort this request; the tokenizer
    process passes it on to the scheduler.
    """

    uid: int


@dataclass
class DetokenizeMsg(BaseTokenizerMsg):
    """调度器 → 反分词进程：请求 ``uid`` 这一步新得到的 token。结束时 ``finished`` 为真，``finish_reason`` 是
    ``"length"``（到了 max_tokens）或 ``"stop"``（遇到 EOS）；停在 EOS 时 ``next_token`` 是 -1——EOS 不算输出，
    也不计入生成的 token 数。取消没有这条消息：取消是分词进程自己发起的。

    en: scheduler → detokenizer: the token request ``uid`` got this step. On the last one ``finished`` is true and
    ``finish_reason`` is ``"length"`` (max_tokens reached) or ``"stop"`` (EOS); when the request ends at EOS
    ``next_token`` is -1: EOS is not output and does not count as a generated token. An abort has no such message: the
    tokenizer itself started it.
    """

    uid: int
    next_token: int
    finished: bool = False
    finish_reason: str | None = None
    #: 第 3.5 章：请求要了对数概率时，``next_token`` 的（:class:`~minisgl.sampling.TokenLogprob`，线上是列表）
    #: en: chapter 3.5: when the request asked for log-probabilities, those of ``next_token``
    #: en: (:class:`~minisgl.sampling.TokenLogprob`, a list on the wire)
    logprobs: list[Any] | None = None


@dataclass
class RejectMsg(BaseTokenizerMsg):
    """调度器 → 反分词进程：这个请求不能接（提示词太长、页面永远不够……），``error`` 说明原因。
    被拒绝的请求要有回音：客户端不能一直等下去。

    en: scheduler → detokenizer: this request cannot be taken (the prompt is too long, there can never be enough
    pages, ...); ``error`` says why. A refused request must get an answer: the client must not wait forever.
    """

    uid: int
    error: str
    #: OpenAI 错误体里的 ``code``（如 ``"context_length_exceeded"``）；``None``：没有更具体的
    #: en: the ``code`` of the OpenAI error body (such as ``"context_length_exceeded"``); ``None``: nothing more specific
    code: str | None = None


@dataclass
class BatchTokenizerMsg(BaseTokenizerMsg):
    """一次送到分词 / 反分词进程的一批消息（调度器每一步发一条）。

    en: A batch of messages for the tokenizer / detokenizer process (the scheduler sends one per step).
    """

    data: list[BaseTokenizerMsg]


@dataclass
class UserMsg(BaseBackendMsg):
    """分词进程 → 调度器：分好词的请求。``input_ids`` 是一维 int32 张量。

    en: tokenizer → scheduler: a tokenized request. ``input_ids`` is a 1-D int32 tensor.
    """

    uid: int
    input_ids: torch.Tensor
    sampling_params: SamplingParams


@dataclass
class AbortBackendMsg(BaseBackendMsg):
    """分词进程 → 调度器：取消请求 ``uid``，它占的槽位和页面马上归还。

    en: tokenizer → scheduler: abort request ``uid``; its slot and pages come back at once.
    """

    uid: int


@dataclass
class ExitMsg(BaseBackendMsg):
    """让调度器退出主循环（关机）。

    en: Tells the scheduler to leave its main loop (shutdown).
    """


@dataclass
class BatchBackendMsg(BaseBackendMsg):
    """一次送到调度器的一批消息。

    en: A batch of messages for the scheduler.
    """

    data: list[BaseBackendMsg]


@dataclass
class UserReply(BaseFrontendMsg):
    """反分词进程 → API 服务器：请求 ``uid`` 新增的一段文本。最后一条 ``finished`` 为真，带上 ``finish_reason``
    和 token 计数；出错时 ``error`` 非空（这时也是最后一条）。

    en: detokenizer → API server: the new piece of text of request ``uid``. The last one has ``finished`` true, with
    ``finish_reason`` and the token counts; on an error ``error`` is set (and it is the last one too).
    """

    uid: int
    incremental_output: str
    finished: bool = False
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    code: str | None = None  # 出错时 OpenAI 错误体的 code | en: on an error, the code of the OpenAI error body
    #: 第 3.5 章：这段文字里各 token 的对数概率，每个 token 一项
    #: ``{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}``（OpenAI 对话接口的样子）
    #: en: chapter 3.5: the log-probabilities of the tokens of this piece, one entry per token
    #: en: ``{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}`` (the shape of OpenAI's
    #: en: chat API)
    logprobs: list[dict[str, Any]] | None = None


@dataclass
class SchedulerStats(BaseFrontendMsg):
    """调度器 → API 服务器（直接发，不经过反分词）：调度器的现状，``/metrics`` 从这里读。每一步之后、以及空闲下来时各发一条。

    en: scheduler → API server (sent directly, not through the detokenizer): the scheduler's state, which ``/metrics``
    reads. One is sent after every step and once when the scheduler becomes idle.
    """

    running: int  # 正在运行（占着请求槽）的请求数 | en: requests running (holding a request slot)
    waiting: int  # 等待接纳的请求数 | en: requests waiting to be admitted
    pages_in_use: int  # 被请求或前缀缓存占着的 KV 页 | en: KV pages held by requests or the prefix cache
    pages_total: int
    cache_hit_tokens: int  # 累计：前缀缓存省下的预填充 token | en: cumulative: prefill tokens saved by the prefix cache
    prefill_tokens: int  # 累计：真正算过的预填充 token | en: cumulative: prefill tokens actually computed
    decode_tokens: int  # 累计：解码出的 token | en: cumulative: tokens decoded
    max_decode_batch: int  # 到目前为止最大的解码批 | en: the largest decode batch so far
    steps: int  # 累计步数 | en: cumulative steps
    pages_cached: int = 0  # pages_in_use 里只被前缀缓存占着（可驱逐）的页 | en: pages of pages_in_use held only by the prefix cache (evictable)
    # 投机解码（累计；只进 /metrics，不进 repr）：验证过的草稿 token、其中接受的，和每次带草稿的验证出了几个 token
    # （第 k 项：出 k 个的次数）
    # en: speculative decoding (cumulative; for /metrics, not in the repr): draft tokens verified, those accepted, and how
    # en: many tokens each verification with a draft yielded (item k: how often it yielded k)
    spec_draft_tokens: int = field(default=0, repr=False)
    spec_accepted_tokens: int = field(default=0, repr=False)
    spec_accept_lengths: list[int] = field(default_factory=list, repr=False)


@dataclass
class BatchFrontendMsg(BaseFrontendMsg):
    """一次送到 API 服务器的一批消息。

    en: A batch of messages for the API server.
    """

    data: list[BaseFrontendMsg]


def unwrap(msg: Message) -> list[Message]:
    """批量消息 → 里面的各条；单条消息 → 只有它的列表。

    en: A batch message → the messages inside; a single message → a list of just it.
    """
    return list(msg.data) if isinstance(msg, (BatchTokenizerMsg, BatchBackendMsg, BatchFrontendMsg)) else [msg]


# ----------------------------------------------------------------------------- 序列化
# en: ----------------------------------------------------------------------------- serialization

TYPE_KEY = "__type__"
TENSOR_KEY = "__tensor__"


def to_wire(obj: Any, where: str = "msg") -> Any:
    """把消息变成 msgpack 能直接写的东西：dataclass → 带类名的字典，一维张量 → 字节加 dtype，
    列表、字典递归处理；基本类型原样。``where`` 是当前字段的路径，出错时写进消息里。

    en: Turn a message into what msgpack writes directly: a dataclass → a dict with its class name, a 1-D tensor →
    bytes plus dtype, lists and dicts recursively; primitives as they are. ``where`` is the current field's path, put
    into the error message.
    """
    # >>> TASK to_wire: 把一个值变成 msgpack 能直接写、from_wire 能原样建回的东西。约定：None、bool、int、float、str、bytes 原样；登记过的消息 dataclass → 字典，TYPE_KEY 下是类名，其余是各字段的线上形式（与登记的类同名、却不是那个类的，也算没登记）；一维张量 → 字典，TENSOR_KEY 下是它的原始字节，"dtype" 下是 "int32" 这样的名字（不连续的切片、带梯度的张量也按值发）；list 和 tuple → 列表；键全是字符串的 dict → 字典；其余一切，包括不是一维的张量，都抛 TypeError，消息里写明字段路径（从 where 开始，如 msg.data[1].input_ids）和类型名（张量写形状）。给定：MESSAGE_TYPES、TYPE_KEY、TENSOR_KEY。
    # en: Turn a value into what msgpack writes directly and from_wire rebuilds unchanged. Contract: None, bool, int, float, str, bytes as they are; a registered message dataclass → a dict with its class name under TYPE_KEY plus each field in wire form (a class with the name of a registered class that is not that class counts as unregistered); a 1-D tensor → a dict with its raw bytes under TENSOR_KEY and "dtype" holding a name like "int32" (non-contiguous slices and tensors that track gradients go by their values); list and tuple → a list; a dict whose keys are all strings → a dict; anything else, tensors that are not 1-D included, raises TypeError naming the field path (starting at where, e.g. msg.data[1].input_ids) and the type (for a tensor, its sizes). Given: MESSAGE_TYPES, TYPE_KEY, TENSOR_KEY.
    # hint1: 它是递归的：每往下走一层就把路径接长一截（字段接 .名字，列表元素接 [下标]），出错时才说得清是哪个字段。张量的坑：取字节之前先让它脱离计算图、放到 CPU 上、变成连续的，不连续的切片直接取字节是错的。
    # en1: It is recursive: each level down extends the path (.name for a field, [i] for a list element), which is what lets an error name the field.
    # en1: The tensor pitfall: before taking its bytes, detach it, move it to the CPU and make it contiguous; the bytes of a non-contiguous slice are wrong.
    # hint2: 1. None / bool / int / float / str / bytes → 原样返回（bool 是 int 的子类，放在同一个 isinstance 里没关系）；
    # hint2: 2. dataclasses.is_dataclass(obj) 且 obj 不是类本身：name = type(obj).__name__；MESSAGE_TYPES.get(name) is not type(obj) → TypeError；
    # hint2: 否则 {TYPE_KEY: name, 每个 dataclasses.fields(obj) 的 f.name: to_wire(getattr(obj, f.name), f"{where}.{f.name}")}；
    # hint2: 3. torch.Tensor：obj.dim() != 1 → TypeError（写上 tuple(obj.shape)）；host = obj.detach().to("cpu").contiguous()；
    # hint2: 返回 {TENSOR_KEY: host.view(torch.uint8).numpy().tobytes(), "dtype": str(host.dtype).removeprefix("torch.")}；
    # hint2: 4. list / tuple → [to_wire(x, f"{where}[{i}]") for i, x in enumerate(obj)]；
    # hint2: 5. dict 且所有键都是 str → {k: to_wire(v, f"{where}.{k}")}；
    # hint2: 6. 其余 → TypeError，写明 where 和 type(obj).__name__。
    # en2: 1. None / bool / int / float / str / bytes → return as is (bool is a subclass of int, sharing one isinstance is fine);
    # en2: 2. dataclasses.is_dataclass(obj) and obj is not the class itself: name = type(obj).__name__; MESSAGE_TYPES.get(name) is not type(obj) → TypeError;
    # en2: otherwise {TYPE_KEY: name, for each f in dataclasses.fields(obj): f.name: to_wire(getattr(obj, f.name), f"{where}.{f.name}")};
    # en2: 3. torch.Tensor: obj.dim() != 1 → TypeError (with tuple(obj.shape)); host = obj.detach().to("cpu").contiguous();
    # en2: return {TENSOR_KEY: host.view(torch.uint8).numpy().tobytes(), "dtype": str(host.dtype).removeprefix("torch.")};
    # en2: 4. list / tuple → [to_wire(x, f"{where}[{i}]") for i, x in enumerate(obj)];
    # en2: 5. a dict whose keys are all str → {k: to_wire(v, f"{where}.{k}")};
    # en2: 6. anything else → TypeError naming where and type(obj).__name__.
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = type(obj).__name__
        if MESSAGE_TYPES.get(name) is not type(obj):
            raise TypeError(tr("{where}: {name} is not a registered message type", where=where, name=name))
        out: dict[str, Any] = {TYPE_KEY: name}
        for f in dataclasses.fields(obj):
            out[f.name] = to_wire(getattr(obj, f.name), f"{where}.{f.name}")
        return out
    if isinstance(obj, torch.Tensor):
        if obj.dim() != 1:
            raise TypeError(tr("{where}: only one-dimensional tensors can be sent, got shape {shape}", where=where, shape=tuple(obj.shape)))
        host = obj.detach().to("cpu").contiguous()
        return {TENSOR_KEY: host.view(torch.uint8).numpy().tobytes(), "dtype": str(host.dtype).removeprefix("torch.")}
    if isinstance(obj, (list, tuple)):
        return [to_wire(x, f"{where}[{i}]") for i, x in enumerate(obj)]
    if isinstance(obj, dict) and all(isinstance(k, str) for k in obj):
        return {k: to_wire(v, f"{where}.{k}") for k, v in obj.items()}
    raise TypeError(tr("{where}: cannot serialize a value of type {type}", where=where, type=type(obj).__name__))
    # <<< TASK


def from_wire(obj: Any) -> Any:
    """:func:`to_wire` 的逆：按类名重建 dataclass，按 dtype 重建张量。

    en: The inverse of :func:`to_wire`: rebuild dataclasses by class name and tensors by dtype.
    """
    # >>> TASK from_wire: to_wire 的逆：把线上的形式建回原来的值。约定：带 TYPE_KEY 的字典按 MESSAGE_TYPES 建回那个类（类名不认识就抛 TypeError，写明类名，嵌在列表里的也一样）；带 TENSOR_KEY 的字典建回同样 dtype、同样长度的一维张量——可写、有自己的内存、不发警告，0 个元素也要行；其余列表、字典逐个建回，基本类型原样。给定：MESSAGE_TYPES、TYPE_KEY、TENSOR_KEY。
    # en: The inverse of to_wire: rebuild the original value from its wire form. Contract: a dict with TYPE_KEY becomes that class again, looked up in MESSAGE_TYPES (an unknown class raises TypeError naming it, also when it sits inside a list); a dict with TENSOR_KEY becomes a 1-D tensor of the same dtype and length that is writable, owns its memory and raises no warning, with zero elements too; other lists and dicts are rebuilt item by item, primitives stay as they are. Given: MESSAGE_TYPES, TYPE_KEY, TENSOR_KEY.
    # hint1: torch.frombuffer 不拷贝：直接建在 msgpack 给的只读 bytes 上，PyTorch 会警告，张量也不可写；0 个字节它干脆不接受。
    # en1: torch.frombuffer does not copy: built straight on the read-only bytes msgpack gives, PyTorch warns and the tensor is not writable;
    # en1: and it refuses zero bytes outright.
    # hint2: 列表 → [from_wire(x) for x in obj]；
    # hint2: 字典：有 TYPE_KEY → cls = MESSAGE_TYPES.get(obj[TYPE_KEY])，None 就抛 TypeError（写上类名），否则 cls(**{k: from_wire(v) 对 TYPE_KEY 以外的键})；
    # hint2: 有 TENSOR_KEY → dtype = getattr(torch, obj["dtype"])；
    # hint2: 字节非空时 torch.frombuffer(bytearray(字节), dtype=torch.uint8).view(dtype)，空时 torch.empty(0, dtype=dtype)；其余字典 → {k: from_wire(v)}；别的原样返回。
    # en2: list → [from_wire(x) for x in obj];
    # en2: dict: with TYPE_KEY → cls = MESSAGE_TYPES.get(obj[TYPE_KEY]), None raises TypeError (with the class name),
    # en2: otherwise cls(**{k: from_wire(v) for the keys other than TYPE_KEY});
    # en2: with TENSOR_KEY → dtype = getattr(torch, obj["dtype"]); non-empty bytes: torch.frombuffer(bytearray(the bytes), dtype=torch.uint8).view(dtype);
    # en2: empty: torch.empty(0, dtype=dtype); other dicts → {k: from_wire(v)}; anything else is returned as is.
    if isinstance(obj, list):
        return [from_wire(x) for x in obj]
    if isinstance(obj, dict):
        if TYPE_KEY in obj:
            cls = MESSAGE_TYPES.get(obj[TYPE_KEY])
            if cls is None:
                raise TypeError(tr("unknown message type {name!r}", name=obj[TYPE_KEY]))
            return cls(**{k: from_wire(v) for k, v in obj.items() if k != TYPE_KEY})
        if TENSOR_KEY in obj:
            dtype = getattr(torch, obj["dtype"])
            return torch.frombuffer(bytearray(obj[TENSOR_KEY]), dtype=torch.uint8).view(dtype) if obj[TENSOR_KEY] else torch.empty(0, dtype=dtype)
        return {k: from_wire(v) for k, v in obj.items()}
    return obj
    # <<< TASK


def serialize(msg: Message) -> bytes:
    """消息 → 字节（msgpack）。

    en: message → bytes (msgpack).
    """
    return msgpack.packb(to_wire(msg), use_bin_type=True)


def deserialize(data: bytes) -> Message:
    """字节 → 消息。

    en: bytes → message.
    """
    return from_wire(msgpack.unpackb(data, raw=False))


# ----------------------------------------------------------------------------- ZMQ 队列（给定，不是任务）
# en: ----------------------------------------------------------------------------- ZMQ queues (given, not tasks)


class _Queue:
    """一个 ZMQ 套接字加上消息的编解码；``close()`` 用 linger 0，进程退出时不会卡在没送出的消息上。

    en: One ZMQ socket plus message encoding; ``close()`` uses linger 0, so a process never hangs at exit on messages
    not yet delivered.
    """

    kind: ClassVar[int]

    def __init__(self, addr: str, create: bool, ctx: zmq.Context | None = None) -> None:
        self.ctx = ctx or zmq.Context.instance()
        self.socket = self.ctx.socket(self.kind)
        self.configure()
        (self.socket.bind if create else self.socket.connect)(addr)
        self.addr = addr

    def configure(self) -> None:
        """绑定或连接之前设置套接字选项（有些选项之后再设就不算数了）。

        en: Set socket options before binding or connecting (some options do not count once that is done).
        """

    def close(self) -> None:
        self.socket.close(linger=0)


class ZmqPushQueue(_Queue):
    kind = zmq.PUSH

    def put(self, msg: Message) -> None:
        self.socket.send(serialize(msg), copy=False)


class ZmqPullQueue(_Queue):
    kind = zmq.PULL

    def get(self, timeout: float | None = None) -> Message | None:
        """取一条消息；``timeout``（秒）内没有就返回 None（``None`` 表示一直等）。

        en: Take one message; None if none arrives within ``timeout`` seconds (``None`` waits forever).
        """
        if timeout is not None and not self.socket.poll(int(timeout * 1000)):
            return None
        return deserialize(self.socket.recv())

    def get_nowait(self) -> Message | None:
        try:
            return deserialize(self.socket.recv(flags=zmq.NOBLOCK))
        except zmq.Again:
            return None


class ZmqAsyncPushQueue:
    """API 服务器用的 asyncio 版 PUSH。

    en: The asyncio PUSH the API server uses.
    """

    def __init__(self, addr: str, create: bool) -> None:
        self.socket = zmq.asyncio.Context.instance().socket(zmq.PUSH)
        (self.socket.bind if create else self.socket.connect)(addr)

    async def put(self, msg: Message) -> None:
        await self.socket.send(serialize(msg), copy=False)

    def close(self) -> None:
        self.socket.close(linger=0)


class ZmqAsyncPullQueue:
    """API 服务器用的 asyncio 版 PULL。

    en: The asyncio PULL the API server uses.
    """

    def __init__(self, addr: str, create: bool) -> None:
        self.socket = zmq.asyncio.Context.instance().socket(zmq.PULL)
        (self.socket.bind if create else self.socket.connect)(addr)

    async def get(self) -> Message:
        return deserialize(await self.socket.recv())

    def close(self) -> None:
        self.socket.close(linger=0)


class ZmqSubQueue(_Queue):
    """订阅端：连上发布端、订阅全部消息。

    en: The subscriber: connects to the publisher and subscribes to everything.
    """

    kind = zmq.SUB

    def __init__(self, addr: str, create: bool = False, ctx: zmq.Context | None = None) -> None:
        super().__init__(addr, create, ctx)

    def configure(self) -> None:
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.setsockopt(zmq.RCVHWM, 0)  # 不设上限：超过上限的消息会被悄悄丢掉 | en: no limit: messages past the limit would be dropped silently

    def get(self, timeout: float | None = None) -> Message | None:
        if timeout is not None and not self.socket.poll(int(timeout * 1000)):
            return None
        return deserialize(self.socket.recv())


class ZmqPubQueue(_Queue):
    """发布端（XPUB）：先等到 ``num_subscribers`` 个订阅到达再广播，第一条消息就不会被丢掉。

    en: The publisher (XPUB): it waits until ``num_subscribers`` subscriptions have arrived before broadcasting, so the
    first message is never dropped.
    """

    kind = zmq.XPUB

    def __init__(self, addr: str, create: bool = True, ctx: zmq.Context | None = None) -> None:
        super().__init__(addr, create, ctx)
        self.subscribers = 0

    def configure(self) -> None:
        self.socket.setsockopt(zmq.XPUB_VERBOSE, 1)  # 每个订阅都报上来，而不只是第一个 | en: report every subscription, not only the first
        self.socket.setsockopt(zmq.SNDHWM, 0)  # 不设上限：发布端对慢的订阅者是丢消息，而不是等 | en: no limit: a publisher drops messages for a slow subscriber rather than wait

    def wait_for_subscribers(self, n: int, timeout: float) -> None:
        """等 ``n`` 个订阅；超时就抛 TimeoutError（说明有订阅端没起来），而不是把消息发进黑洞。

        en: Wait for ``n`` subscriptions; on timeout raise TimeoutError (a subscriber did not come up) instead of sending
        messages into the void.
        """
        # >>> TASK subscriber_handshake: 等到 self.subscribers 达到 n 就返回，够了就不再多读。约定：收到以 b"\x01" 开头的帧算一个订阅、以 b"\x00" 开头的算一个退订（后面可能跟着主题）；timeout 是总时限，不是每次等待的时限；到时不够就抛 TimeoutError，消息里写明等到了几个、要几个；时间已经用完（timeout ≤ 0）就立刻抛；没有东西可读时绝不能卡在接收上。给定：self.socket（XPUB，已开 XPUB_VERBOSE）、self.subscribers。
        # en: Return once self.subscribers reaches n, reading nothing more after that. Contract: a received message starting with b"\x01" is one subscription and one starting with b"\x00" one unsubscription (a topic may follow); timeout bounds the whole wait, not each single wait; if there are still too few when it runs out, raise TimeoutError saying how many arrived and how many were wanted; with none of it remaining (timeout ≤ 0) raise at once; never hang in a receive when there is nothing to read. Given: self.socket (an XPUB with XPUB_VERBOSE on), self.subscribers.
        # hint1: 先定下截止的时刻；每次只等剩下的那么久，剩下的不是正数就不要再等——负数交给 poll 就是“永远等”。
        # en1: Fix the deadline once; each wait lasts only as long as what remains, and when nothing remains, do not wait at all.
        # en1: A negative timeout given to poll means "wait forever".
        # hint2: deadline = time.monotonic() + timeout；while self.subscribers < n：left = deadline - time.monotonic()；
        # hint2: left ≤ 0 或 self.socket.poll(int(left * 1000)) 为 0 → 抛 TimeoutError（写上 self.subscribers、n 和 timeout）；
        # hint2: 否则 frame = self.socket.recv()；frame[:1] == b"\x01" → self.subscribers += 1；frame[:1] == b"\x00" → self.subscribers -= 1。
        # en2: deadline = time.monotonic() + timeout; while self.subscribers < n: left = deadline - time.monotonic();
        # en2: left ≤ 0 or self.socket.poll(int(left * 1000)) gives 0 → raise TimeoutError (with self.subscribers, n and timeout);
        # en2: otherwise frame = self.socket.recv(); frame[:1] == b"\x01" → self.subscribers += 1; frame[:1] == b"\x00" → self.subscribers -= 1.
        deadline = time.monotonic() + timeout
        while self.subscribers < n:
            left = deadline - time.monotonic()
            if left <= 0 or not self.socket.poll(int(left * 1000)):
                raise TimeoutError(tr("Only {got} of {n} subscribers arrived within {timeout} s", got=self.subscribers, n=n, timeout=timeout))
            frame = self.socket.recv()
            if frame[:1] == b"\x01":
                self.subscribers += 1
            elif frame[:1] == b"\x00":
                self.subscribers -= 1
        # <<< TASK

    def put(self, msg: Message) -> None:
        self.socket.send(serialize(msg), copy=False)
