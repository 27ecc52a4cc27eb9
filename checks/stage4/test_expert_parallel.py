"""第 4.5 章 expert_parallel 的检查：先在本进程里看哪些切法行得通、每个秩持有哪些专家；再起真的秩（gloo）：两个秩上
张量并行的专家（中间维切开）和专家并行的专家（专家分给各秩，token 派发过去、合并回来）都等于没切的那层——token 数为
奇数、一个 token（秩 1 一段是空的）、所有 token 都选秩 0 的专家（秩 1 一行也收不到）；三个秩上专家并行也一样——
其中有一个秩一段是空的、有一个秩一行也收不到。派发、合并的协议由学员设计，检查只看行为：每个 (token, 选择) 对由持有
它的专家的秩正好算一次（各秩的 ``tokens_per_expert`` 拼起来就是整层的），一次前向最多 3 次 ``all_to_all``、除了给定
的拼回 ``all_reduce`` 没有别的集合通信，交出去的字节在下限（每行必须去、回的）与上限（每对的行去、回一次，外加每对
16 字节的记录）之间；不读派发交给合并的记录。最后整个 tiny MoE 在 EP=2 和 TP=2 上每步的 logits 与一个秩相差不到
1e-5，贪心生成的 token 与 Hugging Face 相同。

en: Checks of chapter 4.5 expert_parallel: first, in this process, which splits work and which experts each rank holds;
then real ranks (gloo): on two ranks tensor-parallel experts (intermediate dimension cut) and expert-parallel experts
(experts dealt out to the ranks, tokens dispatched to them and combined back) both equal the unsplit layer — with an odd
token count, one token (rank 1's stretch is empty), and every token choosing rank 0's experts (rank 1 receives no row
at all); on three ranks expert parallelism likewise, with one rank's stretch empty and one rank receiving no row. The
dispatch and combine protocol is the learner's design, so the checks judge behaviour only: each (token, choice) pair is
computed exactly once, by the rank holding its expert (the ranks' ``tokens_per_expert`` joined are the whole layer's),
one forward makes at most 3 ``all_to_all`` and no collective besides the given joining ``all_reduce``, and the bytes
handed over lie between a floor (the rows that must go out and back) and a ceiling (each pair's row out and back once,
plus 16 bytes of bookkeeping per pair); the record dispatch hands to combine is never read. Last, the whole tiny MoE at
EP=2 and TP=2 gives each step's logits within 1e-5 of one rank and Hugging Face's greedy tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from checks.common import expect
from checks.hf_reference import greedy_reference
from checks.stage1.conftest import LATER_PROMPTS, LATER_TOKENS, Hand
from checks.stage4.common import count_collectives, run_step, step
from minisgl.i18n import tr

WORLD = 2
HIDDEN, INTER, EXPERTS, TOP_K = 8, 6, 6, 2
#: 两个秩上的几种情形：token 数、只许选的专家（None：随便选）。
#: en: The cases on two ranks: token count, the only experts allowed (None: any).
CASES = {"odd": (7, None), "one-token": (1, None), "rank0-only": (5, [0, 1, 2])}
#: 三个秩上（每个秩 2 个专家）专家并行的情形：2 个 token 时秩 2 一段是空的；只选专家 0、1、4、5 时秩 1 一行也收不到。
#: en: Expert-parallel cases on three ranks (2 experts each): with 2 tokens rank 2's stretch is empty; choosing only
#: en: experts 0, 1, 4, 5 leaves rank 1 with no row to receive.
CASES3 = {"odd-3": (7, None), "two-tokens-3": (2, None), "rank1-idle-3": (8, [0, 1, 4, 5])}
#: 每种情形跑在几个秩上。
#: en: How many ranks each case runs on.
WORLDS = {**{name: WORLD for name in CASES}, **{name: 3 for name in CASES3}}
#: 一次前向最多几次 all_to_all（派发加合并）。
#: en: The most all_to_all calls one forward may make (dispatch and combine together).
ALL_TO_ALL_BUDGET = 3
#: 每对发给别的秩时，除了那一行，最多还能带几个字节的记录（比如一个 int64 的专家号、再一个 int64 的位置）。
#: en: How many bytes of bookkeeping each pair sent to another rank may carry besides its row (say an int64 expert
#: en: number and an int64 position).
BOOKKEEPING_BYTES = 16
#: 检查里一次集合通信最多等几秒（正常的一次不到一秒）。
#: en: The longest a collective waits in these checks, in seconds (a normal one takes under a second).
COLLECTIVE_TIMEOUT_S = 20


def layer_case(name: str) -> tuple[torch.Tensor, ...]:
    """每个秩和父进程用同样的种子拿到同一份：输入、每个专家的 gate/up/down、路由。

    en: Every rank and the parent get the same ones from the same seeds: the input, each expert's gate/up/down, the
    routing.
    """
    from minisgl.moe import select_experts

    tokens, only = {**CASES, **CASES3}[name]
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


def layer_steps(out: dict[str, Any], world: int) -> None:
    """两个秩：两种切开的专家，每种情形一步；三个秩：专家并行的那几种情形。每步记下输出、每个专家算了几对、
    通信了几次、交出多少字节、持有什么——只看行为，不碰派发交给合并的记录。

    en: Two ranks: both kinds of split experts, one step per case; three ranks: the expert-parallel cases. Each step
    notes the output, the pairs each expert computed, the collectives made, the bytes handed over and what is held —
    behaviour only, never the record dispatch hands to combine.
    """
    from minisgl.distributed import get_tp_comm
    from minisgl.expert_parallel import EPMoE, TPFusedMoE

    def run(cls: type, name: str) -> dict[str, Any]:
        x, gate, up, down, weights, ids = layer_case(name)
        experts = cls(EXPERTS, HIDDEN, INTER, dtype=torch.float32, device="cpu")
        load_experts(experts, gate, up, down)
        get_tp_comm().calls.clear()
        y = experts.forward(x, weights, ids)
        return {"y": y.tolist(), "counts": experts.tokens_per_expert, "calls": dict(get_tp_comm().calls),
                "bytes": experts.bytes_moved, "held": [experts.w13.shape[0], experts.w13.shape[1]]}

    for name in CASES if world == WORLD else CASES3:
        if world == WORLD:
            run_step(out, f"tp-{name}", lambda name=name: run(TPFusedMoE, name))
        run_step(out, f"ep-{name}", lambda name=name: run(EPMoE, name))


@dataclasses.dataclass
class ControlWatch:
    """前向里经控制组的通信：:func:`rank_scenario` 包好的集合通信在 ``in_forward`` 时记进 ``calls``。

    en: Communication over the control group inside a forward: the collectives :func:`rank_scenario` wrapped note it in
    ``calls`` while ``in_forward``.
    """

    in_forward: bool = False
    calls: list[str] = dataclasses.field(default_factory=list)


def model_steps(model_path: str, out: dict[str, Any], watch: ControlWatch) -> None:
    """一个秩、TP=2、EP=2 各生成一遍，记下 token、通信、专家的种类和形状、前向里经控制组的通信；最后比 logits。

    en: Generate once on one rank, at TP=2 and at EP=2, noting the tokens, the collectives, the experts' kinds and shapes
    and the forward's communication over the control group; last, compare the logits.
    """
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
            watch.in_forward = True
            try:
                result = forward()
            finally:
                watch.in_forward = False
            seen.append(result.clone())
            return result

        engine.model.forward = noted
        get_tp_comm().calls.clear()
        watch.calls.clear()
        try:
            reqs = []
            for uid, (row, prompt) in enumerate(zip([3, 0, 2, 1], LATER_PROMPTS)):
                Hand.assign_pages(engine, row)
                reqs.append(Req(torch.tensor(prompt, dtype=torch.int32), row, 0, LATER_TOKENS, uid, SamplingParams()))
            tokens = Hand.run_to_completion(engine, Batch, reqs)
            experts = [layer.mlp.experts for layer in engine.model.model.layers if hasattr(layer.mlp, "experts")]
            return {"tokens": tokens, "calls": dict(get_tp_comm().calls), "kinds": [type(e).__name__ for e in experts],
                    "held": [e.w13.shape[0] for e in experts], "control": sorted(set(watch.calls))}
        finally:
            engine.shutdown()

    def differences() -> dict[str, float]:
        return {kind: max(float((a - b).abs().max()) for a, b in zip(logits[kind], logits["one"], strict=True))
                for kind in ("tp", "ep")}

    for kind in ("one", "tp", "ep"):
        run_step(out, f"generate-{kind}", lambda kind=kind: generate(kind))
    run_step(out, "logits", differences)


def rank_scenario(rank: int, world_size: int, addr: str, moe: str | None) -> dict[str, Any]:
    """每个秩上跑的全部步骤：两个秩时层的情形加上整个模型（``moe`` 是它的路径），三个秩时只有层的情形。

    en: All the steps each rank runs: with two ranks the layer cases plus the whole model (``moe`` is its path), with
    three ranks the layer cases only.
    """
    # 在导入本章的模块之前包好集合通信：前向里每次经控制组的通信记进 watch
    # en: wrap the collectives before this chapter's modules are imported: every communication over the control group
    # en: inside a forward is noted in watch
    watch = ControlWatch()

    def note(name: str, group: Any) -> None:
        from minisgl.distributed import get_tp_comm

        if watch.in_forward and group is not None and group is get_tp_comm().control:
            watch.calls.append(name)

    count_collectives(note)

    import minisgl.distributed
    from minisgl.distributed import DistributedInfo, destroy_distributed, init_distributed

    # 一个秩出错（或者跳过了一次集合通信）、别的秩还在集合通信里等时，几十秒后就失败，而不是 5 分钟
    # en: when one rank fails (or skips a collective) while the others wait in a collective, fail after some seconds,
    # en: not 5 minutes
    minisgl.distributed.COLLECTIVE_TIMEOUT_S = COLLECTIVE_TIMEOUT_S
    out: dict[str, Any] = {}
    run_step(out, "init", lambda: init_distributed(DistributedInfo(rank, world_size), addr) and None)
    if out["init"][0] == "ok":
        layer_steps(out, world_size)
        if moe is not None:
            model_steps(moe, out, watch)
        destroy_distributed()
    return out


@pytest.fixture(scope="module")
def ranks(moe_path: str) -> list[dict[str, Any]]:
    """两个秩跑完全部步骤的结果（本模块只起一次）。

    en: The two ranks' results of all steps (started once for this module).
    """
    from minisgl.processes.ranks import run_ranks

    return run_ranks(rank_scenario, WORLD, moe_path, timeout=240)


@pytest.fixture(scope="module")
def three_ranks() -> list[dict[str, Any]]:
    """三个秩跑完专家并行那几种情形的结果（本模块只起一次）。

    en: The three ranks' results of the expert-parallel cases (started once for this module).
    """
    from minisgl.processes.ranks import run_ranks

    return run_ranks(rank_scenario, 3, None, timeout=180)


def ep_results(request: pytest.FixtureRequest, name: str) -> list[dict[str, Any]]:
    """情形 ``name`` 在它那几个秩上的专家并行结果。

    en: The expert-parallel results of case ``name`` on its ranks.
    """
    return step(request.getfixturevalue("ranks" if WORLDS[name] == WORLD else "three_ranks"), f"ep-{name}")


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


def differs_by(y: torch.Tensor, want: torch.Tensor) -> float | str:
    """``y`` 与 ``want`` 最大相差多少；形状不同时说出 ``y`` 的形状。

    en: The largest difference between ``y`` and ``want``; ``y``'s shape when the shapes differ.
    """
    return float((y - want).abs().max()) if y.shape == want.shape else tr("a shape of {shape}", shape=list(y.shape))


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("kind", ["tp", "ep"])
def test_split_experts_equal_the_unsplit_layer(ranks: list[dict[str, Any]], kind: str, name: str) -> None:
    want = unsplit(name)
    for rank, got in enumerate(step(ranks, f"{kind}-{name}")):
        y = torch.tensor(got["y"])
        assert y.shape == want.shape and torch.allclose(y, want, atol=1e-5, rtol=1e-5), tr(
            "Rank {rank}: {kind} experts on case {name} differ from the unsplit layer by {diff}", rank=rank, kind=kind,
            name=name, diff=differs_by(y, want),
        )  # fmt: skip


@pytest.mark.parametrize("name", list(CASES3))
def test_expert_parallel_on_three_ranks_equals_the_unsplit_layer(three_ranks: list[dict[str, Any]], name: str) -> None:
    want = unsplit(name)
    for rank, got in enumerate(step(three_ranks, f"ep-{name}")):
        y = torch.tensor(got["y"])
        assert y.shape == want.shape and torch.allclose(y, want, atol=1e-5, rtol=1e-5), tr(
            "Rank {rank} of 3: expert-parallel experts on case {name} differ from the unsplit layer by {diff}",
            rank=rank, name=name, diff=differs_by(y, want),
        )  # fmt: skip


def test_each_rank_holds_its_part(ranks: list[dict[str, Any]]) -> None:
    for rank in range(WORLD):
        expect(step(ranks, "tp-odd")[rank]["held"], [EXPERTS, 2 * INTER // WORLD],
               tr("Rank {rank}, tensor parallel: every expert, half of each one's gate/up rows", rank=rank))
        expect(step(ranks, "ep-odd")[rank]["held"], [EXPERTS // WORLD, 2 * INTER],
               tr("Rank {rank}, expert parallel: half of the experts, each whole", rank=rank))


@pytest.mark.parametrize("name", list(WORLDS))
def test_each_pair_is_computed_once_by_its_experts_rank(request: pytest.FixtureRequest, name: str) -> None:
    _, _, _, _, _, ids = layer_case(name)
    whole = torch.bincount(ids.reshape(-1), minlength=EXPERTS).tolist()
    got = ep_results(request, name)
    joined = [n for r in got for n in r["counts"]]
    expect(joined, whole, tr("case {name} on {world} ranks: the (token, choice) pairs each expert computed, the ranks' "
                             "tokens_per_expert joined in rank order, against the pairs the routing sent to each expert "
                             "(a pair sent twice, to the wrong rank, or not at all shows here)",
                             name=name, world=WORLDS[name]))


def byte_bounds(name: str, rank: int) -> tuple[int, int]:
    """专家并行一次前向里秩 ``rank`` 交出字节数的下限和上限，两者都加上拼回的整份 ``[T, H]``。交出去的有两种行：
    本秩的 token 去别的秩的（派发），别的秩的 token 在本秩算好、送回去的（合并）。下限：每个 token 至少要有一行
    去到、再从每个持有它所选专家之一的别的秩回来（同一个秩上的几对可以共用一行）。上限：每个跨秩的对，它的行去一趟、
    回一趟，各带 :data:`BOOKKEEPING_BYTES` 字节的记录。

    en: The floor and ceiling of the bytes rank ``rank`` hands over in one expert-parallel forward, both including the
    whole ``[T, H]`` joined. Two kinds of rows go out: this rank's tokens bound for other ranks (dispatch), and other
    ranks' tokens computed here and sent back (combine). Floor: each token needs at least one row out to, and back
    from, every other rank holding one of its experts (pairs on the same rank may share a row). Ceiling: each pair
    crossing ranks has its row out once and back once, each with :data:`BOOKKEEPING_BYTES` bytes of bookkeeping.
    """
    from minisgl.expert_parallel import token_range

    x, _, _, _, _, ids = layer_case(name)
    world = WORLDS[name]
    owners = ids // (EXPERTS // world)
    senders = [s for s in range(world) for _ in token_range(ids.shape[0], s, world)]
    floor = ceiling = 0
    for token, sender in enumerate(senders):
        if sender == rank:  # 派发：本秩的 token 去别的秩 | en: dispatch: this rank's token to other ranks
            away = [int(o) for o in owners[token] if o != rank]
        else:  # 合并：别的秩的 token 从本秩回去 | en: combine: another rank's token back from this rank
            away = [int(o) for o in owners[token] if o == rank]
        floor += len(set(away)) * HIDDEN * x.element_size()
        ceiling += len(away) * (HIDDEN * x.element_size() + BOOKKEEPING_BYTES)
    join = x.numel() * x.element_size()
    return join + floor, join + ceiling


@pytest.mark.parametrize("name", list(WORLDS))
def test_expert_parallel_stays_within_its_communication_budget(request: pytest.FixtureRequest, name: str) -> None:
    world = WORLDS[name]
    for rank, r in enumerate(ep_results(request, name)):
        calls = dict(r["calls"])
        sends = calls.pop("all_to_all", 0)
        assert sends <= ALL_TO_ALL_BUDGET, tr(
            "Rank {rank} of {world}, case {name}: one forward made {n} all_to_all calls; dispatch and combine together "
            "may make at most {budget}", rank=rank, world=world, name=name, n=sends, budget=ALL_TO_ALL_BUDGET)
        expect(calls, {"all_reduce": 1}, tr("Rank {rank} of {world}, case {name}: besides all_to_all, one forward makes "
                                            "only the given forward's joining all_reduce", rank=rank, world=world,
                                            name=name))
        low, high = byte_bounds(name, rank)
        assert low <= r["bytes"] <= high, tr(
            "Rank {rank} of {world}, case {name}: bytes_moved is {got}, outside {low}..{high}: at least one row per "
            "token and other rank holding one of its experts (out at dispatch for this rank's tokens, back at combine "
            "for the others'), at most one row plus {extra} bytes of bookkeeping per pair crossing ranks, both with "
            "the whole output joined", rank=rank, world=world, name=name, got=r["bytes"], low=low, high=high,
            extra=BOOKKEEPING_BYTES)


@pytest.mark.parametrize("kind", ["tp", "ep"])
def test_a_forward_keeps_off_the_control_group(ranks: list[dict[str, Any]], kind: str) -> None:
    """重叠调度时前向在自己的线程里跑，调度器的线程正同时在控制组上广播消息条数：前向里的通信（派发、合并交换的条数
    也算）只能走数据组。

    en: With overlap scheduling the forward runs in a thread of its own while the scheduler's thread broadcasts message
    counts on the control group: a forward's communication (the counts dispatch and combine exchange included) goes over
    the data group only.
    """
    for rank, got in enumerate(step(ranks, f"generate-{kind}")):
        expect(got["control"], [], tr("Rank {rank}, {kind}=2: communication a forward made over the control group (the "
                                      "scheduler's thread uses it at the same time; two threads on one group wait on "
                                      "each other forever)", rank=rank, kind=kind.upper()))


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
