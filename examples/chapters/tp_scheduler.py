"""第 4.3 章示例：两个秩各跑一个 ``TPScheduler``，秩 0 这边有个小小的“分词进程”喂消息：三个请求（uid 故意乱序）
一起到，其中一个中途取消，最后退出。每次迭代打印每个秩收到的消息、这一步的批次和占用的页——两个秩逐行相同；最后
看看分词进程收到了几条回复（只有秩 0 回话）。

    python examples/chapters/tp_scheduler.py

en: Chapter 4.3 example: two ranks each run a ``TPScheduler``, and a tiny "tokenizer" on rank 0's side feeds them: three
requests (uids deliberately out of order) arrive together, one is aborted midway, then exit. Each iteration prints what
each rank received, the batch of its step and the pages it holds — line for line the same on both ranks; last, how many
replies the tokenizer got (only rank 0 replies).

    python examples/chapters/tp_scheduler.py
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import torch

from minisgl import model_zoo

MODEL = str(model_zoo.tiny_qwen3())
#: uid → 提示词的 token id；uid 故意不按加入顺序排。
#: en: uid → the prompt's token ids; the uids are deliberately not in the order they join.
PROMPTS = {5: [9707, 11, 1879], 2: [785, 3974, 13876], 9: [42, 43]}
NEW_TOKENS = 4
ABORTED = 9


def demo_rank(rank: int, world_size: int, addr: str, model_path: str, ipc_dir: str) -> dict[str, Any]:
    """在每个秩上跑：加入进程组，建调度器并接上套接字；秩 0 还扮演分词进程。一次次 ``run_once``，记下每次迭代看到的。

    en: Runs on each rank: join the process group, build the scheduler and attach its sockets; rank 0 also plays the
    tokenizer. Call ``run_once`` again and again and note what each iteration saw.
    """
    from minisgl.core import SamplingParams
    from minisgl.distributed import DistributedInfo, destroy_distributed, init_distributed
    from minisgl.message import AbortBackendMsg, BatchBackendMsg, ExitMsg, UserMsg, ZmqPullQueue, ZmqPushQueue, unwrap
    from minisgl.server.args import ServerAddrs
    from minisgl.tp_scheduler import TPScheduler

    init_distributed(DistributedInfo(rank, world_size), addr)
    addrs = ServerAddrs.in_dir(ipc_dir)
    sched = TPScheduler(model_path, dtype=torch.float32, device="cpu", max_running_req=4, num_page_override=128,
                        max_seq_len_override=64, cache_type="naive")
    tokenizer = stats = push = None
    if rank == 0:  # 扮演分词进程：收回复，也给调度器发消息 | en: playing the tokenizer: receive replies, send the scheduler messages
        tokenizer, stats = ZmqPullQueue(addrs.tokenizer, create=True), ZmqPullQueue(addrs.frontend, create=True)
        push = ZmqPushQueue(addrs.backend, create=False)
    sched.connect(addrs)
    steps: list[str] = []
    sched.add_step_listener(lambda t: steps.append(f"{t.phase} {list(t.uids)}"))
    handled: list[str] = []
    receive = sched.receive_msg

    def note(blocking: bool) -> list[Any]:  # 记下每次收到的消息 | en: note the messages each call receives
        msgs = receive(blocking)
        handled.extend(f"{type(msg).__name__}({getattr(msg, 'uid', '')})" for msg in msgs)
        return msgs

    sched.receive_msg = note
    lines = []
    for it in range(40):
        if push is not None:
            if it == 0:
                push.put(BatchBackendMsg(data=[UserMsg(uid, torch.tensor(ids, dtype=torch.int32),
                                                       SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
                                               for uid, ids in PROMPTS.items()]))
            elif it == 2:
                push.put(AbortBackendMsg(ABORTED))
            elif not sched.busy:
                push.put(ExitMsg())
            time.sleep(0.05)  # 让消息到达 | en: let the message arrive
        handled.clear()
        steps.clear()
        going = sched.run_once()
        lines.append((it, list(handled), list(steps), sched.pages_in_use()))
        if not going:
            break
    sched._drain()
    replies = []
    if tokenizer is not None:
        while (msg := tokenizer.get(timeout=0.5)) is not None:
            replies += [type(m).__name__ for m in unwrap(msg)]
    sched.close()
    for queue in (tokenizer, stats, push):
        if queue is not None:
            queue.close()
    sched.shutdown()
    destroy_distributed()
    return {"lines": lines, "replies": replies}


def main() -> None:
    from minisgl.i18n import tr
    from minisgl.processes.ranks import run_ranks

    with tempfile.TemporaryDirectory(prefix="msgl-ex-") as ipc_dir:
        ranks = run_ranks(demo_rank, 2, MODEL, ipc_dir)
    for (it, handled, steps, pages), other in zip(ranks[0]["lines"], ranks[1]["lines"]):
        print(tr("iteration {it}: messages {handled}, steps {steps}, pages in use {pages}", it=it,
                 handled=", ".join(handled) or "-", steps="; ".join(steps) or "-", pages=pages))
        if other != (it, handled, steps, pages):
            print(tr("  rank 1 differs: {other}", other=other))
    print(tr("both ranks saw the same in every iteration: {same}", same=ranks[0]["lines"] == ranks[1]["lines"]))
    counts = {name: ranks[0]["replies"].count(name) for name in sorted(set(ranks[0]["replies"]))}
    print(tr("replies that reached the tokenizer: {counts} (rank 0 only; nothing for the abort)", counts=counts))


if __name__ == "__main__":
    main()
