"""第 3.3 章示例：扮演分词进程和 API 服务器，经 ZMQ 套接字给调度器送请求，一次一次地迭代，看每次发出的消息。

    python examples/chapters/scheduler_io.py

en: Chapter 3.3 example: play the tokenizer process and the API server, send requests to the scheduler over ZMQ
sockets, iterate one step at a time and look at the messages each iteration sends.

    python examples/chapters/scheduler_io.py
"""

import torch

from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.message import AbortBackendMsg, BatchBackendMsg, ExitMsg, RejectMsg, UserMsg, ZmqPullQueue, ZmqPushQueue
from minisgl.model_zoo import smollm2
from minisgl.scheduler_io import SchedulerIO
from minisgl.server.args import ServerAddrs, make_ipc_dir

sched = SchedulerIO(smollm2(), max_running_req=4, num_page_override=512, max_seq_len_override=64)
addrs = ServerAddrs.in_dir(make_ipc_dir())
sched.connect(addrs)
detokenizer = ZmqPullQueue(addrs.tokenizer, create=True)  # 反分词进程的收信处 | en: the detokenizer's inbox
api_server = ZmqPullQueue(addrs.frontend, create=True)  # API 服务器的收信处 | en: the API server's inbox
to_scheduler = ZmqPushQueue(addrs.backend, create=False)
tok = sched.tokenizer


def request(uid: int, prompt: str, **sp: object) -> UserMsg:
    ids = tok.encode(prompt, add_special_tokens=False)
    return UserMsg(uid=uid, input_ids=torch.tensor(ids, dtype=torch.int32), sampling_params=SamplingParams(**sp))


def iterate(abort_at: int | None = None, abort_uid: int = -1) -> None:
    """迭代到空闲，每次迭代打印它发给反分词进程的消息。

    en: Iterate until idle, printing what each iteration sent to the detokenizer.
    """
    i = 0
    while i == 0 or sched.busy:
        if i == abort_at:
            print(tr("  (AbortBackendMsg(uid={uid}) arrives)", uid=abort_uid))
            to_scheduler.put(AbortBackendMsg(uid=abort_uid))
            detokenizer.get(timeout=0.1)  # 等它送到 | en: give it time to arrive
        sched.run_once()
        batch = detokenizer.get(timeout=0.5)
        parts = []
        for msg in batch.data if batch is not None else []:
            if isinstance(msg, RejectMsg):
                parts.append(tr("{uid}: refused", uid=msg.uid))
            elif msg.finished:
                text = repr(tok.decode([msg.next_token])) if msg.next_token >= 0 else "-1"
                parts.append(tr("{uid}: {text} finished ({reason})", uid=msg.uid, text=text, reason=msg.finish_reason))
            else:
                parts.append(f"{msg.uid}: {tok.decode([msg.next_token])!r}")
        print(tr("iteration {i}: {parts}", i=i, parts=" | ".join(parts) if parts else tr("(nothing sent)")))
        i += 1


print(tr("1. three requests in one message; the third repeats uid 7, which is still running"))
to_scheduler.put(BatchBackendMsg(data=[
    request(1000, "The capital of France is", max_tokens=4),
    request(7, "My favourite colour is", max_tokens=10),
    request(7, "hello", max_tokens=4),
]))
iterate()
print(tr("2. a long request aborted while it runs"))
to_scheduler.put(request(8, "Once upon a time", max_tokens=40, ignore_eos=True))
iterate(abort_at=3, abort_uid=8)
last = None
while (msg := api_server.get(timeout=0.2)) is not None:
    last = msg
print(tr("3. the last SchedulerStats: {stats}", stats=last))
to_scheduler.put(ExitMsg())
print(tr("run_once after an ExitMsg: {value}", value=sched.run_once()))
for queue in (detokenizer, api_server, to_scheduler):
    queue.close()
sched.close()
sched.shutdown()
