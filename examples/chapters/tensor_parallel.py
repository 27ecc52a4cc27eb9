"""第 4.2 章示例：qwen3-tiny 切给 2 个秩：每个秩上各个权重的形状、每步的集合通信次数、每个秩存了多少，以及 TP=1
和 TP=2 贪心生成的 token 是否相同；SmolLM2 在 TP=2 上为什么被拒绝。

    python examples/chapters/tensor_parallel.py

en: Chapter 4.2 example: qwen3-tiny split over 2 ranks: the shape of each weight on each rank, the collectives per step,
how much each rank stores, and whether TP=1 and TP=2 generate the same greedy tokens; why SmolLM2 is refused at TP=2.

    python examples/chapters/tensor_parallel.py
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from minisgl import model_zoo
from minisgl.paths import REPO_ROOT

MODEL = str(model_zoo.tiny_qwen3())
PROMPTS = [[9707, 11, 1879, 0], [785, 3974, 13876, 38835, 34208, 916]]
NEW_TOKENS = 6


def demo_rank(rank: int, world_size: int, addr: str, model_path: str) -> dict[str, Any]:
    """在每个秩上跑：加入进程组，搭起切开的引擎，两个提示词一起贪心生成（第 1 阶段里程碑的手动循环：一次预填充，
    再逐步解码），返回看到的东西（普通的列表和数，好打印）。

    en: Runs on each rank: join the process group, build the split engine, generate greedily for both prompts at once
    (the stage 1 milestone's hand loop: one prefill, then decode step by step), and return what it saw (plain lists and
    numbers, easy to print).
    """
    from minisgl.distributed import DistributedInfo, destroy_distributed, get_tp_comm, init_distributed
    from minisgl.engine import EngineConfig, model_nbytes
    from minisgl.tensor_parallel import TPEngine

    sys.path.insert(0, str(REPO_ROOT / "examples"))
    from stage1_milestone import HandDriver

    init_distributed(DistributedInfo(rank, world_size), addr)
    engine = TPEngine(EngineConfig(model_path, dtype=torch.float32, max_running_req=len(PROMPTS), num_page_override=256,
                                   max_seq_len_override=32, cpu_fast_linear=False))
    layer = engine.model.model.layers[0]
    weights = {"qkv_proj": layer.self_attn.qkv_proj.weight, "o_proj": layer.self_attn.o_proj.weight,
               "gate_up_proj": layer.mlp.gate_up_proj.weight, "down_proj": layer.mlp.down_proj.weight,
               "embed_tokens": engine.model.model.embed_tokens.weight, "lm_head": engine.model.lm_head.weight}
    get_tp_comm().calls.clear()
    tokens, _ = HandDriver(engine).generate(PROMPTS, NEW_TOKENS)
    seen = {"shapes": {name: list(w.shape) for name, w in weights.items()}, "tokens": tokens,
            "calls": dict(get_tp_comm().calls), "stored_mb": round(model_nbytes(engine.model) / 2**20, 1)}
    engine.shutdown()
    destroy_distributed()
    return seen


def main() -> None:
    from minisgl.i18n import tr
    from minisgl.models import ModelConfig
    from minisgl.processes.ranks import run_ranks
    from minisgl.tensor_parallel import check_tp_split

    try:
        check_tp_split(ModelConfig.from_hf(model_zoo.smollm2()), 2)
    except ValueError as e:
        print(tr("SmolLM2 at TP=2: {error}", error=e))

    one, two = run_ranks(demo_rank, 1, MODEL), run_ranks(demo_rank, 2, MODEL)
    print(tr("TP=1, the whole model in one process:"))
    for name, shape in one[0]["shapes"].items():
        print(f"  {name:<13} {shape}")
    for rank, seen in enumerate(two):
        print(tr("TP=2, rank {rank}:", rank=rank))
        for name, shape in seen["shapes"].items():
            print(f"  {name:<13} {shape}")
    print(tr("stored: TP=1 {one} MiB, each TP=2 rank {two} MiB", one=one[0]["stored_mb"],
             two=[s["stored_mb"] for s in two]))
    print(tr("collectives in {steps} forward steps of 2 layers: TP=1 {one}, each TP=2 rank {two}", steps=NEW_TOKENS,
             one=one[0]["calls"], two=two[0]["calls"]))
    print(tr("greedy tokens, TP=1: {tokens}", tokens=one[0]["tokens"]))
    print(tr("greedy tokens, TP=2: {tokens} (the same: {same})", tokens=two[0]["tokens"],
             same=two[0]["tokens"] == two[1]["tokens"] == one[0]["tokens"]))


if __name__ == "__main__":
    main()
