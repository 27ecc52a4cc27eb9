"""第 4.5 章示例：tiny Qwen3-MoE 切给 2 个秩，专家切开（TP=2）和专家分给各秩（EP=2）两种做法：每个秩持有什么、
一次预填充里派发给每个秩几行、每个专家收到多少、交给集合通信多少字节，以及两种做法贪心生成的 token 与一个秩时是否相同。

    python examples/chapters/expert_parallel.py

en: Chapter 4.5 example: the tiny Qwen3-MoE over 2 ranks, experts split (TP=2) and experts dealt out to the ranks (EP=2):
what each rank holds, how many rows one prefill dispatches to each rank, how many each expert receives, how many bytes
go to collectives, and whether both generate the same greedy tokens as one rank.

    python examples/chapters/expert_parallel.py
"""

from __future__ import annotations

import sys
from typing import Any

import torch

import minisgl.llm  # noqa: F401 - 组装登记混合专家（秩进程按名字导入本模块） | en: the assembly registers mixtures of experts (ranks import this module by name)
from minisgl import model_zoo
from minisgl.paths import REPO_ROOT

MODEL = str(model_zoo.tiny_qwen3_moe())
PROMPTS = [[9707, 11, 1879, 0], [785, 3974, 13876, 38835, 34208, 916]]
NEW_TOKENS = 6


def demo_rank(rank: int, world_size: int, addr: str, model_path: str, ep_size: int) -> dict[str, Any]:
    """在每个秩上跑：加入进程组，搭起切开的引擎，两个提示词一起贪心生成，记下第 1 层的专家看到的东西。

    en: Runs on each rank: join the process group, build the split engine, generate greedily for both prompts at once,
    and note what layer 1's experts saw.
    """
    from minisgl.distributed import DistributedInfo, destroy_distributed, get_tp_comm, init_distributed
    from minisgl.engine import EngineConfig
    from minisgl.tensor_parallel import TPEngine

    sys.path.insert(0, str(REPO_ROOT / "examples"))
    from stage1_milestone import HandDriver

    init_distributed(DistributedInfo(rank, world_size), addr)
    engine = TPEngine(EngineConfig(model_path, dtype=torch.float32, max_running_req=len(PROMPTS), num_page_override=256,
                                   max_seq_len_override=32, cpu_fast_linear=False, ep_size=ep_size))
    experts = engine.model.model.layers[1].mlp.experts
    sends: list[list[int]] = []
    if ep_size > 1:
        dispatch = experts.dispatch

        def noted(x: torch.Tensor, topk_ids: torch.Tensor) -> Any:
            # 这段 token 的 (token, 选择) 对各归哪个秩（由路由定，与派发的协议无关）
            # en: which rank each (token, choice) pair of this stretch belongs to (the routing decides, not the
            # en: dispatch protocol)
            owners = topk_ids.reshape(-1) // len(experts.local)
            sends.append(torch.bincount(owners, minlength=world_size).tolist())
            return dispatch(x, topk_ids)

        experts.dispatch = noted
    get_tp_comm().calls.clear()
    tokens, _ = HandDriver(engine).generate(PROMPTS, NEW_TOKENS)
    seen = {"kind": type(experts).__name__, "held": list(getattr(experts, "local", range(experts.num_experts))),
            "w13": list(experts.w13.shape), "prefill_sends": sends[0] if sends else None,
            "tokens_per_expert": experts.tokens_per_expert, "bytes": experts.bytes_moved,
            "calls": dict(get_tp_comm().calls), "tokens": tokens}
    engine.shutdown()
    destroy_distributed()
    return seen


def main() -> None:
    from minisgl.i18n import tr
    from minisgl.processes.ranks import run_ranks

    one = run_ranks(demo_rank, 1, MODEL, 1)[0]
    for ep in (1, 2):
        ranks = run_ranks(demo_rank, 2, MODEL, ep)
        print(tr("TP=2, ep {ep} ({kind}):", ep=ep, kind=ranks[0]["kind"]))
        for rank, seen in enumerate(ranks):
            print(tr("  rank {rank}: experts {held}, w13 {shape}", rank=rank, held=seen["held"], shape=seen["w13"]))
            if seen["prefill_sends"] is not None:
                print(tr("    prefill: rows dispatched to each rank {sends}", sends=seen["prefill_sends"]))
            print(tr("    layer 1, tokens per expert held: {counts}", counts=seen["tokens_per_expert"]))
            print(tr("    layer 1, bytes handed to collectives: {bytes:,}; collectives of the whole model: {calls}",
                     bytes=seen["bytes"], calls=seen["calls"]))
        print(tr("  greedy tokens {tokens} (the same as one rank: {same})", tokens=ranks[0]["tokens"],
                 same=ranks[0]["tokens"] == ranks[1]["tokens"] == one["tokens"]))


if __name__ == "__main__":
    main()
