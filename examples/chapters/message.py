"""第 3.1 章示例：一条消息在线上的样子和大小；不认识的类型被拒绝；慢加入者——普通 PUB 丢掉第一条，握手之后不丢。

    python examples/chapters/message.py

en: Chapter 3.1 example: what a message looks like on the wire and how big it is; an unknown type refused; the slow
joiner — a plain PUB loses the first message, none is lost after the handshake.

    python examples/chapters/message.py
"""

import shutil
import time

import torch
import zmq

from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.message import (AbortBackendMsg, BatchBackendMsg, DetokenizeMsg, UserMsg, ZmqPubQueue, deserialize,
                             ipc_addr, make_ipc_dir, serialize, to_wire)

req = UserMsg(uid=7, input_ids=torch.tensor([9707, 11, 847, 829], dtype=torch.int32), sampling_params=SamplingParams(max_tokens=16))
print(to_wire(req))
batch = BatchBackendMsg([req, AbortBackendMsg(uid=3)])
back = deserialize(serialize(batch))
print(tr("{n} bytes on the wire; back again: {types}, the same ids: {same}", n=len(serialize(batch)),
         types=[type(m).__name__ for m in back.data], same=torch.equal(back.data[0].input_ids, req.input_ids)))
try:
    serialize(BatchBackendMsg([req, UserMsg(9, torch.zeros(2, 3, dtype=torch.int32), SamplingParams())]))
except TypeError as e:
    print("TypeError:", e)

# 慢加入者：订阅端先连（发布端还没绑定），发布端一绑定就发
# en: The slow joiner: the subscriber connects first (the publisher is not bound yet), the publisher sends as soon as it is bound
ipc_dir = make_ipc_dir()
ctx = zmq.Context()


def subscriber(name: str) -> zmq.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RECONNECT_IVL, 300)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(ipc_addr(ipc_dir, name))
    return sub


sub = subscriber("plain")
pub = ctx.socket(zmq.PUB)
pub.bind(ipc_addr(ipc_dir, "plain"))
pub.send(serialize(DetokenizeMsg(uid=1, next_token=11)))
time.sleep(1)
pub.send(serialize(DetokenizeMsg(uid=2, next_token=22)))
print(tr("plain PUB, the first message received: {got}", got=deserialize(sub.recv()) if sub.poll(2000) else None))
sub = subscriber("handshake")
xpub = ZmqPubQueue(ipc_addr(ipc_dir, "handshake"), ctx=ctx)
xpub.wait_for_subscribers(1, timeout=10)
xpub.put(DetokenizeMsg(uid=1, next_token=11))
print(tr("XPUB after the handshake, the first message received: {got}", got=deserialize(sub.recv()) if sub.poll(2000) else None))
ctx.destroy(linger=0)
shutil.rmtree(ipc_dir, ignore_errors=True)
