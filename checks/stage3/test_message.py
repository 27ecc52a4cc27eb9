"""第 3.1 章 message 的检查：消息（含嵌套的批量消息、各种 dtype 的一维张量、SamplingParams）原样往返；
不认识的类型、不是一维的张量被拒绝，错误里写明字段路径；hypothesis 随机造嵌套消息的往返性质；
ZMQ 的“慢加入者”（普通 PUB 丢掉订阅到达前的第一条，握手之后一条不丢）；握手超时；linger 0 让进程立刻退出；
ipc 路径的长度上限。

en: Checks of chapter 3.1 message: messages (nested batch messages, 1-D tensors of several dtypes, SamplingParams)
round-trip unchanged; unknown types and tensors that are not 1-D are refused with the field path in the error; a
hypothesis property over randomly built nested messages; ZMQ's "slow joiner" (a plain PUB drops the first message sent
before the subscription arrives, none is lost after the handshake); the handshake timeout; linger 0 lets a process exit
at once; the ipc path length limit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import msgpack
import pytest
import torch
import zmq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from minisgl.core import SamplingParams
from minisgl.course import select
from minisgl.i18n import tr
from minisgl.message import (
    TENSOR_KEY,
    TYPE_KEY,
    AbortBackendMsg,
    AbortMsg,
    BatchBackendMsg,
    BatchFrontendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    RejectMsg,
    SchedulerStats,
    TokenizeMsg,
    UserMsg,
    UserReply,
    ZmqAsyncPullQueue,
    ZmqAsyncPushQueue,
    ZmqPubQueue,
    ZmqPullQueue,
    ZmqPushQueue,
    ZmqSubQueue,
    deserialize,
    from_wire,
    ipc_addr,
    make_ipc_dir,
    serialize,
    to_wire,
    unwrap,
)
from minisgl.paths import REPO_ROOT

DTYPES = [torch.int32, torch.int64, torch.int8, torch.uint8, torch.int16, torch.float32, torch.float16, torch.bfloat16,
          torch.float64, torch.bool]


def difference(a: Any, b: Any, where: str = "msg") -> str | None:
    """两个值（消息、张量、列表、字典……）的第一处不同，写成 ``路径: 说明``；完全相同返回 None。

    en: The first difference between two values (messages, tensors, lists, dicts, ...) as ``path: what``; None if they
    are the same.
    """
    if type(a) is not type(b) and not (isinstance(a, tuple) and isinstance(b, list)):  # 元组收回来是列表 | en: a tuple comes back as a list
        return f"{where}: {type(b).__name__} != {type(a).__name__}"
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{where}: {b.dtype}{tuple(b.shape)} != {a.dtype}{tuple(a.shape)}"
        if not torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)):
            return f"{where}: {b.tolist()} != {a.tolist()}"
        return None
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            d = difference(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: len {len(b)} != {len(a)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := difference(x, y, f"{where}[{i}]"))), None)
    if isinstance(a, dict):
        if set(a) != set(b):
            return f"{where}: keys {sorted(b)} != {sorted(a)}"
        return next((d for k in a if (d := difference(a[k], b[k], f"{where}.{k}"))), None)
    return None if a == b else f"{where}: {b!r} != {a!r}"


def assert_round_trip(msg: Any) -> Any:
    back = deserialize(serialize(msg))
    diff = difference(msg, back)
    assert diff is None, tr("The message changed on the way through serialize / deserialize: {diff} (got != sent)", diff=diff)
    return back


def sample_messages() -> list[Any]:
    sp = SamplingParams(temperature=0.7, top_k=20, top_p=0.95, ignore_eos=True, max_tokens=33, seed=12345)
    return [
        BatchTokenizerMsg([
            DetokenizeMsg(7, 151645, True, "stop"),
            DetokenizeMsg(8, 42),
            RejectMsg(9, "prompt too long: 600 >= 512"),
            TokenizeMsg(10, "Hello, wörld 😀", sp, 512, ("\n\n", "User:")),  # type: ignore[arg-type]
            TokenizeMsg(11, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], SamplingParams(), 512),
            TokenizeMsg(12, [1, 2, 3, 151000], sp, 512),
            AbortMsg(13),
        ]),
        BatchBackendMsg([
            UserMsg(1, torch.tensor([9707, 1879, 0, 151643], dtype=torch.int32), sp),
            AbortBackendMsg(2),
            ExitMsg(),
            BatchBackendMsg([AbortBackendMsg(3)]),
        ]),
        BatchFrontendMsg([
            UserReply(5, "piece", finished=True, finish_reason="length", prompt_tokens=4, completion_tokens=9),
            UserReply(6, "", finished=True, error="boom"),
            SchedulerStats(1, 2, 3, 4, 5, 6, 7, 8, 9),
        ]),
    ]


@pytest.mark.parametrize("index", range(3))
def test_nested_batch_messages_round_trip(index: int) -> None:
    msg = sample_messages()[index]
    back = assert_round_trip(msg)
    inner = unwrap(back)
    assert [type(m) for m in inner] == [type(m) for m in msg.data], (
        tr("Each message inside a batch comes back as its own class: sent {sent}, got {got}",
           sent=[type(m).__name__ for m in msg.data], got=[type(m).__name__ for m in inner]))
    for m in inner:
        if hasattr(m, "sampling_params"):
            assert isinstance(m.sampling_params, SamplingParams), tr("sampling_params comes back as a SamplingParams, got {type}",
                                                                     type=type(m.sampling_params).__name__)


def test_wire_format_of_messages_and_tensors() -> None:
    wire = to_wire(AbortMsg(3))
    assert wire == {TYPE_KEY: "AbortMsg", "uid": 3}, tr("A message goes on the wire as a dict with its class name under TYPE_KEY and its fields: got {wire!r}", wire=wire)
    ids = torch.tensor([100000, 100001, 5], dtype=torch.int32)
    wire = to_wire(ids)
    assert isinstance(wire, dict) and wire.get("dtype") == "int32" and wire.get(TENSOR_KEY) == ids.numpy().tobytes(), (
        tr("A 1-D tensor goes on the wire as {{TENSOR_KEY: its raw bytes, 'dtype': 'int32'}}: got {wire!r}", wire=wire))
    big = UserMsg(1, torch.full((10000,), 100000, dtype=torch.int32), SamplingParams())
    size = len(serialize(big))
    assert size < 40000 + 1000, tr("10000 int32 token ids should take about 40000 bytes on the wire (raw bytes), got {size}: are they sent as Python ints?", size=size)


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).removeprefix("torch.") for d in DTYPES])
@pytest.mark.parametrize("n", [0, 1, 7])
def test_tensor_dtypes_round_trip(dtype: torch.dtype, n: int) -> None:
    torch.manual_seed(n)
    t = (torch.randn(n) * 100).to(dtype) if dtype != torch.bool else torch.rand(n) > 0.5
    back = assert_round_trip(UserMsg(1, t, SamplingParams()))
    assert back.input_ids.dtype == dtype and back.input_ids.shape == (n,), (
        tr("The tensor comes back as {dtype} of shape ({n},), got {got_dtype} {got_shape}", dtype=dtype, n=n,
           got_dtype=back.input_ids.dtype, got_shape=tuple(back.input_ids.shape)))


def test_strided_and_writable_tensors() -> None:
    base = torch.arange(20, dtype=torch.int64)
    strided = base[::3]  # 不连续的一维视图 | en: a non-contiguous 1-D view
    back = assert_round_trip(UserMsg(1, strided, SamplingParams()))
    assert back.input_ids.tolist() == strided.tolist(), tr("A non-contiguous 1-D tensor is sent by its values: {got}", got=back.input_ids.tolist())
    grad = torch.tensor([1.5, -2.0], requires_grad=True)
    back = deserialize(serialize(UserMsg(1, grad * 2, SamplingParams())))
    assert back.input_ids.tolist() == [3.0, -4.0] and not back.input_ids.requires_grad, (
        tr("A tensor that is part of an autograd graph is sent by its values: {got}", got=back.input_ids))
    data = serialize(UserMsg(2, torch.tensor([1, 2, 3], dtype=torch.int32), SamplingParams()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            ids = deserialize(data).input_ids
        except UserWarning as w:
            pytest.fail(tr("Rebuilding the tensor warned: {warning} (copy the bytes into a bytearray first: the tensor must be writable)", warning=w))
    ids[0] = 99
    assert ids.tolist() == [99, 2, 3] and deserialize(data).input_ids.tolist() == [1, 2, 3], (
        tr("The received tensor is writable and owns its memory"))


@dataclass
class Unregistered:
    x: int


#: 与登记过的类同名、却不是那个类的冒牌货。
#: en: An impostor with the name of a registered class that is not that class.
UserReplyImpostor = dataclasses.make_dataclass("UserReply", [("uid", int)])

REFUSED = [
    (TokenizeMsg(1, object(), SamplingParams(), 512), "msg.prompt", "object"),  # type: ignore[arg-type]
    (BatchBackendMsg([AbortBackendMsg(1), UserMsg(2, torch.zeros(2, 3, dtype=torch.int32), SamplingParams())]), "msg.data[1].input_ids", "(2, 3)"),
    (UserMsg(3, torch.tensor(5, dtype=torch.int32), SamplingParams()), "msg.input_ids", "()"),
    (BatchFrontendMsg([UserReply(1, "a"), Unregistered(3)]), "msg.data[1]", "Unregistered"),  # type: ignore[list-item]
    (BatchFrontendMsg([UserReplyImpostor(4)]), "msg.data[0]", "UserReply"),
    (TokenizeMsg(5, [{"role": "user", "content": {1, 2}}], SamplingParams(), 512), "msg.prompt[0].content", "set"),  # type: ignore[list-item]
    (TokenizeMsg(6, [{1: "a"}], SamplingParams(), 512), "msg.prompt[0]", "dict"),  # type: ignore[list-item]
    (RejectMsg(7, 3 + 4j), "msg.error", "complex"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("case", range(len(REFUSED)))
def test_unknown_types_refused_with_field_path(case: int) -> None:
    msg, path, what = REFUSED[case]
    with pytest.raises(TypeError) as raised:
        serialize(msg)
    text = str(raised.value)
    assert path in text and what in text, tr("The TypeError should name the field {path} and {what}, got: {text}", path=path, what=what, text=text)


def test_unknown_type_name_refused_on_receive() -> None:
    for wire in ({TYPE_KEY: "NoSuchMsg", "uid": 1}, [{TYPE_KEY: "AbortMsg", "uid": 1}, {TYPE_KEY: "os.system"}]):
        with pytest.raises(TypeError) as raised:
            deserialize(msgpack.packb(wire, use_bin_type=True))
        assert "NoSuchMsg" in str(raised.value) or "os.system" in str(raised.value), (
            tr("The TypeError for an unknown type name should name it, got: {text}", text=raised.value))
    plain = {"role": "user", "content": "hi", "n": [1, 2.5, None, True, b"\x00\xff"], "inner": {"msg": AbortMsg(4), "ids": torch.tensor([5, 6])}}
    diff = difference(plain, from_wire(msgpack.unpackb(msgpack.packb(to_wire(plain), use_bin_type=True), raw=False)))
    assert diff is None, tr("Plain dicts, lists and primitives pass through unchanged, and messages and tensors inside them come back: {diff}", diff=diff)


# ----------------------------------------------------------------------------- hypothesis：随机嵌套消息
# en: ----------------------------------------------------------------------------- hypothesis: random nested messages

ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)
uids = st.integers(min_value=0, max_value=2**62)
texts = st.text(max_size=20)
floats = st.floats(allow_nan=False)
sampling = st.builds(SamplingParams, temperature=floats, top_k=ints, top_p=floats, ignore_eos=st.booleans(),
                     max_tokens=ints, seed=st.none() | ints)


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from([torch.int32, torch.int64, torch.float32, torch.uint8, torch.bool]))
    if dtype == torch.bool:
        return torch.tensor(draw(st.lists(st.booleans(), max_size=16)), dtype=dtype)
    if dtype == torch.float32:
        return torch.tensor(draw(st.lists(st.floats(width=32, allow_nan=False), max_size=16)), dtype=dtype)
    info = torch.iinfo(dtype)
    return torch.tensor(draw(st.lists(st.integers(info.min, info.max), max_size=16)), dtype=dtype)


prompts = texts | st.lists(st.integers(0, 2**31 - 1), max_size=8) | st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": texts}), min_size=1, max_size=3)
tokenizer_msgs = st.one_of(
    st.builds(TokenizeMsg, uids, prompts, sampling, st.integers(1, 2**20), st.lists(texts, max_size=3)),
    st.builds(AbortMsg, uids),
    st.builds(DetokenizeMsg, uids, ints, st.booleans(), st.none() | st.sampled_from(["length", "stop", "abort"])),
    st.builds(RejectMsg, uids, texts),
)
backend_msgs = st.one_of(st.builds(UserMsg, uids, tensors(), sampling), st.builds(AbortBackendMsg, uids), st.builds(ExitMsg))
frontend_msgs = st.one_of(
    st.builds(UserReply, uids, texts, st.booleans(), st.none() | texts, ints, ints, st.none() | texts),
    st.builds(SchedulerStats, *[ints] * 9),
)
messages = st.one_of(
    tokenizer_msgs, backend_msgs, frontend_msgs,
    st.builds(BatchTokenizerMsg, st.lists(tokenizer_msgs | st.builds(BatchTokenizerMsg, st.lists(tokenizer_msgs, max_size=3)), max_size=5)),
    st.builds(BatchBackendMsg, st.lists(backend_msgs, max_size=5)),
    st.builds(BatchFrontendMsg, st.lists(frontend_msgs, max_size=5)),
)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow], print_blob=True,
          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
@given(msg=messages)
def test_random_nested_messages_round_trip(msg: Any) -> None:
    assert_round_trip(msg)


# ----------------------------------------------------------------------------- ZMQ
# en: ----------------------------------------------------------------------------- ZMQ


@pytest.fixture
def ipc_dir() -> Any:
    path = make_ipc_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_push_pull_and_asyncio_variants(ipc_dir: str) -> None:
    msg = sample_messages()[1]
    pull = ZmqPullQueue(ipc_addr(ipc_dir, "a"), create=True)
    push = ZmqPushQueue(ipc_addr(ipc_dir, "a"), create=False)
    try:
        assert pull.get(timeout=0.05) is None and pull.get_nowait() is None, tr("An empty queue gives None within the timeout")
        push.put(msg)
        assert difference(msg, pull.get(timeout=5)) is None, tr("PUSH → PULL delivers the message unchanged")

        async def main() -> Any:
            apull = ZmqAsyncPullQueue(ipc_addr(ipc_dir, "b"), create=True)
            apush = ZmqAsyncPushQueue(ipc_addr(ipc_dir, "b"), create=False)
            try:
                await apush.put(msg)
                return await asyncio.wait_for(apull.get(), 5)
            finally:
                apush.close()
                apull.close()

        assert difference(msg, asyncio.run(main())) is None, tr("The asyncio PUSH → PULL delivers the message unchanged")
    finally:
        push.close()
        pull.close()


def _sub_before_pub(ipc_dir: str, name: str, ctx: zmq.Context) -> ZmqSubQueue:
    """订阅端先连（发布端还没绑定：ZMQ 在后台每隔 RECONNECT_IVL 重试），让“订阅还没到”这件事确定无疑。

    ``connect()`` 立刻返回，真正的第一次连接由 ZMQ 的 I/O 线程稍后去做：机器忙时发布端可能抢先绑定好，第一次就连上。
    所以等到第一次尝试有了结果（连上，或者失败、排好了 RECONNECT_IVL 之后重试）才返回。

    en: The subscriber connects first (the publisher is not bound yet: ZMQ retries in the background every
    RECONNECT_IVL), which makes "the subscription has not arrived yet" certain.

    ``connect()`` returns at once and ZMQ's I/O thread makes the first attempt a little later: on a busy machine the
    publisher could bind first and that attempt would succeed. So this returns only once the first attempt has an
    outcome (connected, or failed with a retry scheduled RECONNECT_IVL later).
    """
    sub = ZmqSubQueue.__new__(ZmqSubQueue)
    sub.ctx = ctx
    sub.socket = ctx.socket(zmq.SUB)
    sub.socket.setsockopt(zmq.RECONNECT_IVL, 300)
    sub.socket.setsockopt(zmq.SUBSCRIBE, b"")
    sub.addr = ipc_addr(ipc_dir, name)
    monitor = sub.socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED)
    try:
        sub.socket.connect(sub.addr)
        assert monitor.poll(5000), tr("The subscriber's first connection attempt had no outcome within 5 s")
    finally:
        sub.socket.disable_monitor()
        monitor.close(linger=0)
    return sub


#: 握手的检查各自的时限：卡住时一分钟内失败，而不是等整轮的超时。
#: en: The time limit of each handshake check: a stuck handshake fails within a minute, not at the whole run's timeout.
HANDSHAKE_LIMIT = pytest.mark.timeout(60)


@contextmanager
def no_blocking_recv(xpub: ZmqPubQueue) -> Iterator[None]:
    """握手若不先 poll 就 ``recv()``，没有订阅可读时会永远卡住：给套接字一个接收超时，卡住变成几秒内的失败。

    en: A handshake that calls ``recv()`` without polling first blocks forever when there is no subscription to read:
    a receive timeout on the socket turns that hang into a failure within seconds.
    """
    xpub.socket.setsockopt(zmq.RCVTIMEO, 3000)
    try:
        yield
    except zmq.Again:
        pytest.fail(tr("wait_for_subscribers blocked in recv() with nothing to read: poll with the time that is left before each recv, so that the timeout holds"))


@HANDSHAKE_LIMIT
def test_slow_joiner_plain_pub_loses_first_message_handshake_does_not(ipc_dir: str) -> None:
    ctx = zmq.Context()
    first, second = DetokenizeMsg(1, 11), DetokenizeMsg(2, 22)
    try:
        # 普通 PUB：订阅到达前发的第一条被丢掉。第二条等订阅到了再发：先收到的是第二条，证明第一条是丢了而不是晚到
        # en: A plain PUB: the first message, sent before the subscription arrives, is dropped. The second is sent once
        # en: the subscription is in: receiving the second first proves the first was lost, not late
        sub = _sub_before_pub(ipc_dir, "plain", ctx)
        pub = ctx.socket(zmq.PUB)
        pub.bind(ipc_addr(ipc_dir, "plain"))
        pub.send(serialize(first))
        got = sub.get(timeout=0.1)
        assert got is None, tr("A plain PUB was expected to drop the message sent before the subscription arrived, but {got} came", got=got)
        deadline = time.monotonic() + 10
        while got is None and time.monotonic() < deadline:
            pub.send(serialize(second))
            got = sub.get(timeout=0.05)
        assert difference(second, got) is None, tr("Once subscribed, the plain PUB's later message arrives: got {got}", got=got)
        pub.close(linger=0)
        sub.close()
        # 握手：XPUB 等到订阅再发，第一条就到
        # en: The handshake: the XPUB waits for the subscription before sending, and the first message arrives
        for i in range(2):
            sub = _sub_before_pub(ipc_dir, f"hs{i}", ctx)
            xpub = ZmqPubQueue(ipc_addr(ipc_dir, f"hs{i}"), create=True, ctx=ctx)
            xpub.wait_for_subscribers(1, timeout=10)
            xpub.put(first)
            got = sub.get(timeout=5)
            assert difference(first, got) is None, tr("After wait_for_subscribers the first message must arrive, got {got}", got=got)
            xpub.close()
            sub.close()
    finally:
        ctx.destroy(linger=0)


@HANDSHAKE_LIMIT
def test_handshake_waits_for_every_subscriber(ipc_dir: str) -> None:
    ctx = zmq.Context()
    try:
        xpub = ZmqPubQueue(ipc_addr(ipc_dir, "many"), create=True, ctx=ctx)
        subs = [_sub_before_pub(ipc_dir, "many", ctx) for _ in range(3)]
        xpub.wait_for_subscribers(3, timeout=10)
        assert xpub.subscribers == 3, tr("Three subscribers connected: subscribers should be 3, got {n}", n=xpub.subscribers)
        xpub.put(AbortMsg(5))
        for sub in subs:
            got = sub.get(timeout=5)
            assert difference(AbortMsg(5), got) is None, tr("Every subscriber gets the first broadcast, got {got}", got=got)
    finally:
        ctx.destroy(linger=0)


@HANDSHAKE_LIMIT
def test_handshake_counts_unsubscriptions(ipc_dir: str) -> None:
    ctx = zmq.Context()
    try:
        xpub = ZmqPubQueue(ipc_addr(ipc_dir, "unsub"), create=True, ctx=ctx)
        first = _sub_before_pub(ipc_dir, "unsub", ctx)
        xpub.wait_for_subscribers(1, timeout=10)
        # 唯一的订阅端退订（XPUB 收到 0x00 开头的帧）：一个也不剩，等第 2 个要超时
        # en: The only subscriber unsubscribes (the XPUB gets a frame starting with 0x00): none left, and waiting for
        # en: a 2nd times out
        first.socket.setsockopt(zmq.UNSUBSCRIBE, b"")
        with no_blocking_recv(xpub), pytest.raises(TimeoutError):
            xpub.wait_for_subscribers(2, timeout=0.5)
        assert xpub.subscribers == 0, tr("An unsubscription takes one away: expected {n} subscribers, got {got}", n=0, got=xpub.subscribers)
        second = _sub_before_pub(ipc_dir, "unsub", ctx)
        xpub.wait_for_subscribers(1, timeout=10)
        assert xpub.subscribers == 1, tr("An unsubscription takes one away: expected {n} subscribers, got {got}", n=1, got=xpub.subscribers)
        # 带主题的订阅帧是 0x01 / 0x00 后面跟着主题：也是一个订阅 / 退订（“以它开头”，不是“等于它”）
        # en: A subscription with a topic is 0x01 / 0x00 followed by the topic: still one subscription / unsubscription
        # en: ("starts with", not "equals")
        second.socket.setsockopt(zmq.SUBSCRIBE, b"topic")
        xpub.wait_for_subscribers(2, timeout=10)
        second.socket.setsockopt(zmq.UNSUBSCRIBE, b"topic")
        with no_blocking_recv(xpub), pytest.raises(TimeoutError):
            xpub.wait_for_subscribers(3, timeout=0.5)
        assert xpub.subscribers == 1, tr("A subscription frame starts with 0x01 and an unsubscription with 0x00, topic or not: expected {n} subscribers, got {got}",
                                         n=1, got=xpub.subscribers)
        second.close()
    finally:
        ctx.destroy(linger=0)


@HANDSHAKE_LIMIT
def test_handshake_times_out_without_subscribers(ipc_dir: str) -> None:
    ctx = zmq.Context()
    try:
        xpub = ZmqPubQueue(ipc_addr(ipc_dir, "none"), create=True, ctx=ctx)
        start = time.monotonic()
        with no_blocking_recv(xpub), pytest.raises(TimeoutError) as raised:
            xpub.wait_for_subscribers(1, timeout=0.3)
        took = time.monotonic() - start
        assert 0.25 <= took < 3, tr("The handshake should give up after its timeout (0.3 s), it took {took:.2f} s", took=took)
        assert "0" in str(raised.value) and "1" in str(raised.value), tr("The TimeoutError says how many subscribers arrived, got: {text}", text=raised.value)
        assert xpub.subscribers == 0
        # 截止时间已经过了（剩下的时间是负数）：立刻超时。负数交给 poll 就是“永远等”
        # en: A deadline already passed (negative time left): time out at once. A negative timeout given to poll means
        # en: "wait forever"
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            xpub.wait_for_subscribers(1, timeout=-0.5)
        assert time.monotonic() - start < 3, tr("With no time left, wait_for_subscribers must give up at once (a negative timeout given to poll waits forever)")
    finally:
        ctx.destroy(linger=0)


LINGER_SCRIPT = """
import sys, zmq
from minisgl.message import ZmqPushQueue, AbortMsg
q = ZmqPushQueue("ipc://" + sys.argv[1], create=False)  # nobody binds: the message cannot go
q.put(AbortMsg(1))
{close}
print("closed", flush=True)
zmq.Context.instance().term()
"""


def _exit_after_close(close: str, path: str, wait: float) -> tuple[str, int | None]:
    """跑一个留着未送出消息的进程；返回 (它的输出, 关掉套接字之后 ``wait`` 秒内的退出码，没退出就是 None)。

    en: Run a process that leaves a message unsent; return (its output, its exit code within ``wait`` seconds after
    closing the socket, None if it had not exited).
    """
    env = {**os.environ, **select.impl_env()}
    proc = subprocess.Popen([sys.executable, "-c", LINGER_SCRIPT.format(close=close), path], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = ""
        while (line := proc.stdout.readline()) and line != "closed\n":  # type: ignore[union-attr]
            out += line
        if line != "closed\n":
            proc.wait(timeout=60)
            return out, proc.returncode
        try:
            return out + line, proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return out + line, None
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]


def test_linger_zero_lets_the_process_exit(ipc_dir: str) -> None:
    path = os.path.join(ipc_dir, "nobody")
    out, code = _exit_after_close("q.close()", path, wait=10)
    assert "closed" in out and code == 0, tr("A process with an unsent message and its queue closed should exit at once; it did not: {out}",
                                           out=out[-2000:])
    # 对照：默认 linger（-1）时同样的进程卡在 term() 上
    # en: The control: with the default linger (-1) the same process hangs in term()
    out, code = _exit_after_close("q.socket.close()", path, wait=1.5)
    assert "closed" in out and code is None, tr("Control: with the default linger the process was expected to hang on the unsent message")


def test_ipc_path_limit(ipc_dir: str) -> None:
    room = 107 - len(ipc_dir.encode()) - 1
    ok = ipc_addr(ipc_dir, "p" * room)
    assert ok == f"ipc://{ipc_dir}/{'p' * room}"
    for name in ("p" * (room + 1), "é" * ((room + 2) // 2)):
        with pytest.raises(ValueError) as raised:
            ipc_addr(ipc_dir, name)
        assert "107" in str(raised.value), tr("The error names the limit of 107 bytes, got: {text}", text=raised.value)
    pull = ZmqPullQueue(ok, create=True)
    push = ZmqPushQueue(ok, create=False)
    try:
        push.put(ExitMsg())
        got = pull.get(timeout=5)
        assert isinstance(got, ExitMsg), tr("A socket at a path of exactly 107 bytes works, got {got}", got=got)
    finally:
        push.close()
        pull.close()
    assert len(make_ipc_dir()) < 40, tr("make_ipc_dir gives a short directory")


def test_round_trip_in_another_process(ipc_dir: str) -> None:
    """另一个进程（同一套实现）收到的消息与发出的相同：序列化不依赖本进程里的对象。

    en: A message received by another process (same implementation) equals the one sent: the serialization does not
    depend on objects in this process.
    """
    script = textwrap.dedent("""
        import sys
        from minisgl.message import ZmqPullQueue, ZmqPushQueue
        inbox = ZmqPullQueue("ipc://" + sys.argv[1] + "/in", create=False)
        outbox = ZmqPushQueue("ipc://" + sys.argv[1] + "/out", create=False)
        outbox.put(inbox.get(timeout=30))
        outbox.close(); inbox.close()
    """)
    send = ZmqPushQueue(ipc_addr(ipc_dir, "in"), create=True)
    recv = ZmqPullQueue(ipc_addr(ipc_dir, "out"), create=True)
    env = {**os.environ, **select.impl_env()}
    proc = subprocess.Popen([sys.executable, "-c", script, ipc_dir], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        msg = sample_messages()[0]
        send.put(msg)
        got = recv.get(timeout=60)
        out = proc.communicate(timeout=60)[0]
        assert got is not None, tr("The echo process sent nothing back: {out}", out=out[-2000:])
        assert difference(msg, got) is None, tr("The message came back changed from another process: {diff}", diff=difference(msg, got))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        send.close()
        recv.close()
