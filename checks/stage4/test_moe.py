"""第 4.4 章 moe 的检查：哪些层是 MoE 与 Hugging Face 的规则相同；路由与 HF 的 ``Qwen3MoeTopKRouter`` 相同（归一化
与不归一化）；参考实现与 HF 的 ``Qwen3MoeSparseMoeBlock`` 相同；分组实现与参考实现、也与检查里自己算的稠密公式
相同（没有 token 的专家、一个 token、每个专家都选、bf16）；每个专家收到的对数加起来是 ``T × k``；整个 tiny MoE 模型
贪心生成的 token 与 HF 逐个相同。

en: Checks of chapter 4.4 moe: which layers are MoE follows Hugging Face's rule; routing equals HF's
``Qwen3MoeTopKRouter`` (with and without renormalisation); the reference equals HF's ``Qwen3MoeSparseMoeBlock``; the
grouped path equals the reference and a dense formula computed in the check itself (experts with no token, one token,
every expert chosen, bf16); the pairs each expert received add up to ``T × k``; the whole tiny MoE model generates
greedily exactly HF's tokens.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from checks.common import expect
from checks.hf_reference import greedy_reference
from checks.stage1.conftest import LATER_PROMPTS, LATER_TOKENS
from minisgl.i18n import tr

HIDDEN, INTER, EXPERTS = 16, 8, 6


def hf_config(**over: Any) -> Any:
    from transformers import Qwen3MoeConfig

    kw = dict(vocab_size=32, hidden_size=HIDDEN, intermediate_size=24, moe_intermediate_size=INTER, num_hidden_layers=4,
              num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_experts=EXPERTS, num_experts_per_tok=2,
              norm_topk_prob=True)
    return Qwen3MoeConfig(**{**kw, **over})


def ours_config(hf: Any) -> Any:
    from minisgl.moe import MoeConfig

    return MoeConfig.from_dict({**hf.to_dict(), "architectures": ["Qwen3MoeForCausalLM"]})


def dense_formula(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                  ids: torch.Tensor) -> torch.Tensor:
    """每个 token、每个选择各算一遍，不排序、不分组：``Σ_j w[t, j] · down(silu(gate) · up)``。

    en: Every token and every choice computed on its own, no sorting, no grouping: ``Σ_j w[t, j] · down(silu(gate) ·
    up)``.
    """
    out = torch.zeros_like(x, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = F.linear(x[t].float(), w13[e].float()).chunk(2)
            out[t] += float(weights[t, j]) * F.linear(F.silu(gate) * up, w2[e].float())
    return out


def case(tokens: int, top_k: int, seed: int, dtype: torch.dtype = torch.float32, only: list[int] | None = None,
         experts: int = EXPERTS) -> tuple[torch.Tensor, ...]:
    """随机的输入、专家权重和路由；``only`` 给出时 token 只在这几个专家里选（其余专家一个 token 也没有）。

    en: Random input, expert weights and routing; with ``only`` given, tokens choose among those experts only (the others
    get no token at all).
    """
    from minisgl.moe import select_experts

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, generator=g).to(dtype)
    w13 = (torch.randn(experts, 2 * INTER, HIDDEN, generator=g) * 0.3).to(dtype)
    w2 = (torch.randn(experts, HIDDEN, INTER, generator=g) * 0.3).to(dtype)
    logits = torch.randn(tokens, experts, generator=g)
    if only is not None:
        mask = torch.full((experts,), float("-inf"))
        mask[only] = 0.0
        logits = logits + mask
    weights, ids = select_experts(logits.to(dtype), top_k, True)
    return x, w13, w2, weights, ids


def test_sparse_layers_follow_hf() -> None:
    from transformers import Qwen3MoeForCausalLM
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    for over in ({}, {"decoder_sparse_step": 2}, {"mlp_only_layers": [0, 3]}, {"decoder_sparse_step": 3, "mlp_only_layers": [2]},
                 {"num_experts": 0}, {"num_experts": 1, "num_experts_per_tok": 1}):  # fmt: skip
        hf = hf_config(**over)
        with torch.device("meta"):
            model = Qwen3MoeForCausalLM(hf)
        want = [isinstance(layer.mlp, Qwen3MoeSparseMoeBlock) for layer in model.model.layers]
        ours = ours_config(hf)
        got = [ours.is_sparse(i) for i in range(hf.num_hidden_layers)]
        expect(got, want, tr("MoE layers for {over} (True: experts, False: a dense MLP), as Hugging Face builds them",
                             over=over))


@pytest.mark.parametrize("renormalize", [True, False])
def test_routing_matches_hf(renormalize: bool) -> None:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    from minisgl.moe import select_experts

    router = Qwen3MoeTopKRouter(hf_config(norm_topk_prob=renormalize, num_experts_per_tok=3))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        router.weight.copy_(torch.randn(EXPERTS, HIDDEN, generator=g))
        x = torch.randn(7, HIDDEN, generator=g)
        logits, want_w, want_ids = router(x)
    weights, ids = select_experts(logits, 3, renormalize)
    expect((tuple(weights.shape), weights.dtype, tuple(ids.shape), ids.dtype), ((7, 3), torch.float32, (7, 3), torch.int64),
           tr("select_experts returns [tokens, top_k] fp32 weights and int64 expert ids"))
    expect(ids.tolist(), want_ids.tolist(), tr("the experts chosen for 7 tokens (3 of 6 each), as Hugging Face's router"))
    assert torch.allclose(weights, want_w, atol=1e-6), tr(
        "routing weights (renormalize={renormalize}) differ from Hugging Face's:\n{got}\n{want}",
        renormalize=renormalize, got=weights, want=want_w,
    )
    if renormalize:
        assert torch.allclose(weights.sum(-1), torch.ones(7)), tr("renormalised weights of each token sum to 1")


def test_routing_of_bf16_logits_in_fp32() -> None:
    from minisgl.moe import select_experts

    logits = torch.randn(5, EXPERTS, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    weights, ids = select_experts(logits, 2, False)
    want_w, want_ids = torch.topk(torch.softmax(logits.float(), dim=-1), 2, dim=-1)
    expect((weights.dtype, ids.tolist()), (torch.float32, want_ids.tolist()),
           tr("bf16 router logits: fp32 weights, the same experts"))
    assert torch.allclose(weights, want_w), tr("bf16 router logits: the softmax is taken in fp32")


def test_expert_weights_load_into_place() -> None:
    from minisgl.moe import FusedMoE

    experts = FusedMoE(EXPERTS, HIDDEN, INTER, dtype=torch.float32, device="cpu")
    slots = experts.checkpoint_slots()
    expect(len(slots), 3 * EXPERTS, tr("one checkpoint tensor per expert and projection"))
    g = torch.Generator().manual_seed(3)
    tensors = {name: torch.randn(slot.op.w2.shape[1:] if slot.attr == "w2" else (INTER, HIDDEN), generator=g)
               for name, slot in slots.items()}  # fmt: skip
    for name, tensor in tensors.items():
        slots[name].op.load_weight(slots[name].attr, tensor, slots[name].shard)
    for e in range(EXPERTS):
        gate, up, down = (tensors[f"{e}.{p}.weight"] for p in ("gate_proj", "up_proj", "down_proj"))
        assert torch.equal(experts.w13[e], torch.cat([gate, up])), tr(
            "w13[{e}] is expert {e}'s gate_proj rows followed by its up_proj rows", e=e)
        assert torch.equal(experts.w2[e], down), tr("w2[{e}] is expert {e}'s down_proj", e=e)
    with pytest.raises(ValueError):
        experts.load_weight("w13", torch.zeros(INTER + 1, HIDDEN), 0)


def test_reference_matches_hf_block() -> None:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from minisgl.moe import SparseMoeBlock

    hf = hf_config()
    block = Qwen3MoeSparseMoeBlock(hf)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        x = torch.randn(9, HIDDEN, generator=g)
        want = block(x[None])[0]
    ours = SparseMoeBlock(ours_config(hf), torch.float32, "cpu")
    ours.gate.load_weight("weight", block.gate.weight.detach())
    for e in range(EXPERTS):
        gate, up = block.experts.gate_up_proj[e].detach().chunk(2)
        ours.experts.load_weight("w13", gate, 2 * e)
        ours.experts.load_weight("w13", up, 2 * e + 1)
        ours.experts.load_weight("w2", block.experts.down_proj[e].detach(), e)
    for grouped in (False, True):
        ours.experts.grouped = grouped
        got = ours.forward(x)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), tr(
            "SparseMoeBlock (grouped={grouped}) differs from Hugging Face's Qwen3MoeSparseMoeBlock by {diff}",
            grouped=grouped, diff=float((got - want).abs().max()),
        )


@pytest.mark.parametrize(
    "tokens,top_k,only,dtype,experts",
    [(11, 2, None, torch.float32, EXPERTS), (10, 2, [1, 4], torch.float32, EXPERTS), (1, 3, None, torch.float32, EXPERTS),
     (5, EXPERTS, None, torch.float32, EXPERTS), (13, 2, None, torch.bfloat16, EXPERTS), (30, 4, None, torch.float32, 40)],
    ids=["random", "two-experts-only", "one-token", "all-experts", "bf16", "more-experts-than-hidden"],
)  # fmt: skip
def test_grouped_equals_reference(tokens: int, top_k: int, only: list[int] | None, dtype: torch.dtype,
                                  experts: int) -> None:
    from minisgl.moe import experts_reference, fused_experts

    x, w13, w2, weights, ids = case(tokens, top_k, seed=tokens * 10 + top_k, dtype=dtype, only=only, experts=experts)
    want = dense_formula(x, w13, w2, weights, ids)
    counts = torch.bincount(ids.reshape(-1), minlength=experts).tolist()
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    for name, got in (("experts_reference", experts_reference(x, w13, w2, weights, ids)),
                      ("fused_experts", fused_experts(x, w13, w2, weights, ids, counts))):  # fmt: skip
        expect((tuple(got.shape), got.dtype), (tuple(x.shape), dtype), tr("{name}: output shape and dtype", name=name))
        assert torch.allclose(got.float(), want, atol=tol, rtol=tol), tr(
            "{name} differs from the sum of each token's chosen experts weighted by its routing weights by {diff}",
            name=name, diff=float((got.float() - want).abs().max()),
        )


def test_grouped_calls_each_chosen_expert_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """分组的意义：每个被选中的专家只算一次，一次算完它的全部 (token, 选择) 对；没人选的专家不算。

    en: The point of grouping: each chosen expert is computed once, over all of its (token, choice) pairs at once; an
    expert nobody chose is not computed at all.
    """
    import minisgl.moe as moe

    x, w13, w2, weights, ids = case(12, 2, seed=7, only=[0, 2, 5])
    counts = torch.bincount(ids.reshape(-1), minlength=EXPERTS).tolist()
    calls: list[tuple[int, int]] = []
    plain = moe.expert_mlp

    def counting(rows: torch.Tensor, w13_e: torch.Tensor, w2_e: torch.Tensor) -> torch.Tensor:
        calls.append((next((e for e in range(EXPERTS) if torch.equal(w13_e, w13[e])), -1), rows.shape[0]))
        return plain(rows, w13_e, w2_e)

    monkeypatch.setattr(moe, "expert_mlp", counting)
    moe.fused_experts(x, w13, w2, weights, ids, counts)
    expect(sorted(calls), [(e, n) for e, n in enumerate(counts) if n],
           tr("fused_experts: one expert_mlp call per chosen expert, over all of its pairs (expert, rows); got {calls}", calls=calls))


def test_tokens_per_expert_add_up() -> None:
    from minisgl.moe import FusedMoE

    experts = FusedMoE(EXPERTS, HIDDEN, INTER, dtype=torch.float32, device="cpu")
    x, w13, w2, weights, ids = case(12, 2, seed=5, only=[0, 2, 5])
    experts.w13.copy_(w13)
    experts.w2.copy_(w2)
    experts.forward(x, weights, ids)
    experts.forward(x[:3], weights[:3], ids[:3])
    want = (torch.bincount(ids.reshape(-1), minlength=EXPERTS) + torch.bincount(ids[:3].reshape(-1), minlength=EXPERTS))
    expect(experts.tokens_per_expert, want.tolist(), tr("tokens_per_expert after two forwards (12 and 3 tokens, top-2)"))
    expect(sum(experts.tokens_per_expert), (12 + 3) * 2, tr("the pairs received add up to tokens × top_k"))


def test_moe_model_generates_like_hf(moe_path: str) -> None:
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM
    from minisgl.moe import SparseMoeBlock

    reference = greedy_reference(moe_path, LATER_PROMPTS, LATER_TOKENS)
    llm = LLM(moe_path, dtype=torch.float32, device="cpu", max_running_req=len(LATER_PROMPTS), num_page_override=256,
              max_seq_len_override=64)  # fmt: skip
    try:
        layers = llm.engine.model.model.layers
        expect([isinstance(layer.mlp, SparseMoeBlock) for layer in layers], [False, True, True],
               tr("the tiny MoE model: layer 0 dense (mlp_only_layers), layers 1 and 2 with experts"))
        outs = llm.generate(LATER_PROMPTS, SamplingParams(temperature=0.0, max_tokens=LATER_TOKENS, ignore_eos=True))
        seen = [layer.mlp.experts.tokens_per_expert for layer in layers[1:]]
    finally:
        llm.shutdown()
    for i, (out, ref) in enumerate(zip(outs, reference, strict=True)):
        expect(out["token_ids"], ref, tr("request {i}: greedy tokens of the tiny MoE model vs Hugging Face", i=i))
    computed = sum(map(len, LATER_PROMPTS)) + len(LATER_PROMPTS) * (LATER_TOKENS - 1)
    expect([sum(s) for s in seen], [2 * computed] * 2,
           tr("every computed token reached 2 experts in each MoE layer (prompt tokens plus all but the last output)"))
