"""第 4.5 章 expert_parallel 的检查：先在本进程里看哪些切法行得通、每个秩持有哪些专家；再起两个真的秩（gloo，整个模块
一次）：张量并行的专家（中间维切开）和专家并行的专家（专家分给各秩，token 经 ``all_to_all`` 派发、合并）都等于没切的
那层——token 数为奇数、一个 token、所有 token 都选秩 0 的专家（秩 1 一行也收不到）；派发的行数加起来是 ``T × k``，
两个秩的 ``tokens_per_expert`` 拼起来就是整层的；整个 tiny MoE 在 EP=2 和 TP=2 上每步的 logits 与一个秩相差不到 1e-5，
贪心生成的 token 与 Hugging Face 相同。

en: Checks of chapter 4.5 expert_parallel: first, in this process, which splits work and which experts each rank holds;
then two real ranks (gloo, once for the module): tensor-parallel experts (intermediate dimension cut) and
expert-parallel experts (experts dealt out to the ranks, tokens dispatched and combined with ``all_to_all``) both equal
the unsplit layer — with an odd token count, one token, and every token choosing rank 0's experts (rank 1 receives no
row at all); the rows dispatched add up to ``T × k`` and the two ranks' ``tokens_per_expert`` joined are the whole
layer's; the whole tiny MoE at EP=2 and TP=2 gives each step's logits within 1e-5 of one rank and Hugging Face's greedy
tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from checks.common import expect
from checks.hf_reference import greedy_reference
from checks.stage1.conftest import LATER_PROMPTS, LATER_TOKENS, Hand
from checks.stage4.common import run_step, step
from minisgl.i18n import tr

WORLD = 2
HIDDEN, INTER, EXPERTS, TOP_K = 8, 6, 6, 2
#: 层的几种情形：token 数、只许选的专家（None：随便选）。
#: en: The layer cases: token count, the only experts allowed (None: any).
CASES = {"odd": (7, None), "one-token": (1, None), "rank0-only": (5, [0, 1, 2])}
#: 检查里一次集合通信最多等几秒（正常的一次不到一秒）。
#: en: The longest a collective waits in these checks, in seconds (a normal one takes under a second).
COLLECTIVE_TIMEOUT_S = 20


def layer_case(name: str) -> tuple[torch.Tensor, ...]:
    """每个秩和父进程用同样的种子拿到同一份：输入、每个专家的 gate/up/down、路由。

    en: Every rank and the parent get the same ones from the same seeds: the input, each expert's gate/up/down, the
    routing.
    """
    from minisgl.moe import select_experts

    tokens, only = CASES[name]
    g = torch.Generator().manual_seed(len(name))
    x = torch.randn(tokens, HIDDEN, generator=g)
    gate, up = (torch.randn(EXPERTS, INTER, HIDDEN, generator=g) * 0.4 for _ in range(2))
    down = torch.randn(EXPERTS, HIDDEN, INTER, generator=g) * 0.4
    logits = torch.randn(tokens, EXPERTS, generator=g)
    if only is not None:
        logits[:, [e for e in range(EXPERTS) if e not in only]] = float("-inf")
    weights, ids = select_experts(logits, TOP_K, True)
    return x, gate, up, down, weights, ids


def load_experts(experts: Any, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> None:
    """像加载器那样：检查点里每个专家的每个张量都交给它在 ``checkpoint_slots`` 里的位置。

    en: As the loader does: each tensor of each expert in the checkpoint goes to its place in ``checkpoint_slots``.
    """
    slots = experts.checkpoint_slots()
    for e in range(EXPERTS):
        for part, tensor in (("gate_proj", gate[e]), ("up_proj", up[e]), ("down_proj", down[e])):
            slot = slots[f"{e}.{part}.weight"]
            slot.op.load_weight(slot.attr, tensor.clone(), slot.shard)


def layer_steps(out: dict[str, Any]) -> None:
    from minisgl.distributed import get_tp_comm
    from minisgl.expert_parallel import EPMoE, TPFusedMoE

    def run(cls: type, name: str) -> dict[str, Any]:
        x, gate, up, down, weights, ids = layer_case(name)
        experts = cls(EXPERTS, HIDDEN, INTER, dtype=torch.float32, device="cpu")
        load_experts(experts, gate, up, down)
        get_tp_comm().calls.clear()
        sent: list[list[int]] = []
        if hasattr(experts, "dispatch"):
            dispatch = experts.dispatch

            def noted(*args: Any) -> Any:
                result = dispatch(*args)
                sent.append(result[2].send_splits)
                return result

            experts.dispatch = noted
        y = experts.forward(x, weights, ids)
        return {"y": y.tolist(), "counts": experts.tokens_per_expert, "calls": dict(get_tp_comm().calls),
                "sent": sent, "bytes": experts.bytes_moved, "held": [experts.w13.shape[0], experts.w13.shape[1]]}

    for name in CASES:
        run_step(out, f"tp-{name}", lambda name=name: run(TPFusedMoE, name))
        run_step(out, f"ep-{name}", lambda name=name: run(EPMoE, name))


def model_steps(model_path: str, out: dict[str, Any]) -> None:
    from minisgl.core import Batch, Req, SamplingParams
    from minisgl.distributed import get_tp_comm
    from minisgl.engine import Engine, EngineConfig
    import minisgl.llm  # noqa: F401 - 组装登记混合专家 | en: the assembly registers mixtures of experts
    from minisgl.tensor_parallel import TPEngine

    logits: dict[str, list[torch.Tensor]] = {}

    def generate(kind: str) -> dict[str, Any]:
        config = EngineConfig(model_path, dtype=torch.float32, device="cpu", max_running_req=len(LATER_PROMPTS),
                              num_page_override=512, max_seq_len_override=64, ep_size=2 if kind == "ep" else 1)
        engine = Engine(config) if kind == "one" else TPEngine(config)
        seen = logits.setdefault(kind, [])
        forward = engine.model.forward

        def noted() -> torch.Tensor:
            result = forward()
            seen.append(result.clone())
            return result

        engine.model.forward = noted
        get_tp_comm().calls.clear()
        try:
            reqs = []
            for uid, (row, prompt) in enumerate(zip([3, 0, 2, 1], LATER_PROMPTS)):
                Hand.assign_pages(engine, row)
                reqs.append(Req(torch.tensor(prompt, dtype=torch.int32), row, 0, LATER_TOKENS, uid, SamplingParams()))
            tokens = Hand.run_to_completion(engine, Batch, reqs)
            experts = [layer.mlp.experts for layer in engine.model.model.layers if hasattr(layer.mlp, "experts")]
            return {"tokens": tokens, "calls": dict(get_tp_comm().calls), "kinds": [type(e).__name__ for e in experts],
                    "held": [e.w13.shape[0] for e in experts]}
        finally:
            engine.shutdown()

    def differences() -> dict[str, float]:
        return {kind: max(float((a - b).abs().max()) for a, b in zip(logits[kind], logits["one"], strict=True))
                for kind in ("tp", "ep")}

    for kind in ("one", "tp", "ep"):
        run_step(out, f"generate-{kind}", lambda kind=kind: generate(kind))
    run_step(out, "logits", differences)


def two_rank_scenario(rank: int, world_size: int, addr: str, moe: str) -> dict[str, Any]:
    import minisgl.distributed
    from minisgl.distributed import DistributedInfo, destroy_distributed, init_distributed

    # 一个秩出错、另一个秩还在集合通信里等时，几十秒后就失败，而不是 5 分钟
    # en: when one rank fails while the other waits in a collective, fail after some seconds, not 5 minutes
    minisgl.distributed.COLLECTIVE_TIMEOUT_S = COLLECTIVE_TIMEOUT_S
    out: dict[str, Any] = {}
    run_step(out, "init", lambda: init_distributed(DistributedInfo(rank, world_size), addr) and None)
    if out["init"][0] == "ok":
        layer_steps(out)
        model_steps(moe, out)
        destroy_distributed()
    return out


@pytest.fixture(scope="module")
def ranks(moe_path: str) -> list[dict[str, Any]]:
    """两个秩跑完全部步骤的结果（本模块只起一次）。

    en: The two ranks' results of all steps (started once for this module).
    """
    from minisgl.processes.ranks import run_ranks

    return run_ranks(two_rank_scenario, WORLD, moe_path, timeout=240)


def unsplit(name: str) -> torch.Tensor:
    """没切的那层（第 4.4 章的参考实现）在同一份输入上的输出。

    en: The unsplit layer's output (chapter 4.4's reference) on the same input.
    """
    from minisgl.moe import experts_reference

    x, gate, up, down, weights, ids = layer_case(name)
    return experts_reference(x, torch.cat([gate, up], dim=1), down, weights, ids)


# ----------------------------------------------------------------------------- 本进程 | en: in this process


def test_which_splits_work(moe_path: str) -> None:
    from minisgl.expert_parallel import check_moe_split, expert_range, moe_split_problems, token_range
    from minisgl.moe import MoeConfig

    c = MoeConfig.from_hf(moe_path)
    expect([bool(moe_split_problems(c, tp, ep)) for tp, ep in ((1, 1), (2, 1), (2, 2), (4, 4), (2, 4), (4, 2))],
           [False, False, False, False, True, True],
           tr("the tiny MoE (8 experts of size 32, 4 heads): tp 1, 2 and ep 1, 2, 4 equal to tp split; ep other than 1 "
              "or tp does not"))
    expect(bool(moe_split_problems(dataclasses.replace(c, num_experts=6), 4, 4)), True,
           tr("6 experts do not split over 4 ranks"))
    expect(bool(moe_split_problems(dataclasses.replace(c, moe_intermediate_size=30), 4, 1)), True,
           tr("an expert intermediate size of 30 does not split into 4 parts"))
    with pytest.raises(ValueError):
        check_moe_split(dataclasses.replace(c, num_experts=6), 4, 4)
    expect([list(expert_range(8, r, 2)) for r in range(2)] + [list(expert_range(8, r, 4)) for r in range(4)],
           [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1], [2, 3], [4, 5], [6, 7]],
           tr("the experts each rank holds: 8 over 2 ranks, then over 4"))
    expect([list(token_range(5, r, 2)) for r in range(2)] + [list(token_range(1, r, 2)) for r in range(2)],
           [[0, 1, 2], [3, 4], [0], []], tr("the tokens each rank dispatches: 5 over 2 ranks, then 1"))


# ----------------------------------------------------------------------------- 切开的专家 | en: the split experts


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("kind", ["tp", "ep"])
def test_split_experts_equal_the_unsplit_layer(ranks: list[dict[str, Any]], kind: str, name: str) -> None:
    want = unsplit(name)
    for rank, got in enumerate(step(ranks, f"{kind}-{name}")):
        y = torch.tensor(got["y"])
        assert y.shape == want.shape and torch.allclose(y, want, atol=1e-5, rtol=1e-5), tr(
            "Rank {rank}: {kind} experts on case {name} differ from the unsplit layer by {diff}", rank=rank, kind=kind,
            name=name, diff=float((y - want).abs().max()) if y.shape == want.shape else tr("a shape of {shape}", shape=list(y.shape)),
        )  # fmt: skip


def test_each_rank_holds_its_part(ranks: list[dict[str, Any]]) -> None:
    for rank in range(WORLD):
        expect(step(ranks, "tp-odd")[rank]["held"], [EXPERTS, 2 * INTER // WORLD],
               tr("Rank {rank}, tensor parallel: every expert, half of each one's gate/up rows", rank=rank))
        expect(step(ranks, "ep-odd")[rank]["held"], [EXPERTS // WORLD, 2 * INTER],
               tr("Rank {rank}, expert parallel: half of the experts, each whole", rank=rank))


@pytest.mark.parametrize("name", list(CASES))
def test_dispatch_sends_every_pair_once_to_its_experts_rank(ranks: list[dict[str, Any]], name: str) -> None:
    _, _, _, _, _, ids = layer_case(name)
    whole = torch.bincount(ids.reshape(-1), minlength=EXPERTS).tolist()
    got = step(ranks, f"ep-{name}")
    sent = [r["sent"][0] if r["sent"] else None for r in got]
    expect(sum(sum(s) for s in sent if s), ids.numel(), tr("case {name}: the rows dispatched by both ranks add up to "
                                                            "tokens × top_k", name=name))
    received = [sum(s[r] for s in sent if s) for r in range(WORLD)]
    per_rank = EXPERTS // WORLD
    expect(received, [sum(whole[r * per_rank:(r + 1) * per_rank]) for r in range(WORLD)],
           tr("case {name}: each rank receives exactly the pairs that chose its experts", name=name))
    expect(got[0]["counts"] + got[1]["counts"], whole,
           tr("case {name}: rank 0's tokens_per_expert followed by rank 1's are the whole layer's", name=name))
    tokens = ids.shape[0]
    for rank, r in enumerate(got):
        expect(r["calls"].get("all_to_all"), 3, tr("Rank {rank}: one forward sends with all_to_all three times (rows and "
                                                   "expert numbers out, results back)", rank=rank))
        elsewhere = sum(sent[rank]) - sent[rank][rank]
        expect(r["bytes"], elsewhere * (2 * HIDDEN * 4 + 8) + tokens * HIDDEN * 4,
               tr("Rank {rank}: bytes handed to collectives: {n} rows to the other rank (out with their 8-byte expert "
                  "numbers, back without) and the {t} × {h} floats joined", rank=rank, n=elsewhere, t=tokens, h=HIDDEN))


def test_tensor_parallel_experts_reduce_once(ranks: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(step(ranks, "tp-odd")):
        expect(r["calls"], {"all_reduce": 1}, tr("Rank {rank}: tensor-parallel experts make one all_reduce per forward",
                                                 rank=rank))
        expect(r["bytes"], 7 * HIDDEN * 4, tr("Rank {rank}: bytes handed to the all_reduce (7 tokens × {h} floats)",
                                              rank=rank, h=HIDDEN))


# ----------------------------------------------------------------------------- 整个模型 | en: the whole model


@pytest.mark.every_path
@pytest.mark.parametrize("kind", ["tp", "ep"])
def test_split_moe_model_matches_one_rank_and_hugging_face(ranks: list[dict[str, Any]], moe_path: str, kind: str) -> None:
    reference = greedy_reference(moe_path, LATER_PROMPTS, LATER_TOKENS)
    name = {"tp": "TPFusedMoE", "ep": "EPMoE"}[kind]
    for rank, got in enumerate(step(ranks, f"generate-{kind}")):
        expect(got["kinds"], [name, name], tr("Rank {rank}: the tiny MoE's two MoE layers use {name}", rank=rank, name=name))
        expect(got["tokens"], reference, tr("Rank {rank}: greedy tokens of the tiny MoE at {kind}=2 equal Hugging Face's",
                                            rank=rank, kind=kind.upper()))
    for rank, diff in enumerate(step(ranks, "logits")):
        assert diff[kind] <= 1e-5, tr("Rank {rank}: logits at {kind}=2 differ from one rank's by {diff}", rank=rank,
                                      kind=kind.upper(), diff=diff[kind])
