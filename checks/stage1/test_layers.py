"""第 1.2 章 layers 的检查：与 transformers 的同名算子逐个比对，合并线性层的装载，CPU 快速路径。"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from torch.utils._python_dispatch import TorchDispatchMode
import torch
import torch.nn.functional as F
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, apply_rotary_pos_emb

from minisgl import kernel
from minisgl.i18n import tr
from minisgl.core import Batch, Context, set_global_ctx
from minisgl.layers import (
    AttentionLayer,
    Linear,
    LMHead,
    RMSNorm,
    RotaryEmbedding,
    VocabEmbedding,
    apply_rotary,
    fast_linear_supported,
    pack_linear_weights,
    rms_norm,
    silu_and_mul,
)

from minisgl.core import Req, SamplingParams
from minisgl.engine import Engine, EngineConfig

from .conftest import assert_close_zh, engine_matches_hf, expect

CPU = torch.device("cpu")


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_rms_norm_matches_hf(dtype: torch.dtype, atol: float) -> None:
    torch.manual_seed(0)
    hf = Qwen3RMSNorm(64, eps=1e-6)
    hf.weight.data = torch.randn(64).to(dtype)
    x = (torch.randn(7, 64) * 3).to(dtype)
    ours = RMSNorm(64, 1e-6, dtype=dtype, device=CPU)
    ours.weight.copy_(hf.weight.data)
    got = ours.forward(x)
    want = hf(x)
    assert got.dtype == want.dtype, tr("The output dtype must match HF")
    assert_close_zh(got, want, tr("RMSNorm differs from HF's Qwen3RMSNorm"), atol=atol, rtol=0)
    torch.testing.assert_close(rms_norm(x, hf.weight.data, 1e-6), want, atol=atol, rtol=0)


def test_silu_and_mul_matches_hf_mlp() -> None:
    torch.manual_seed(0)
    cfg = Qwen3Config(hidden_size=16, intermediate_size=24)
    mlp = Qwen3MLP(cfg)
    x = torch.randn(5, 16)
    gate_up = torch.cat([x @ mlp.gate_proj.weight.T, x @ mlp.up_proj.weight.T], dim=-1)
    got = silu_and_mul(gate_up) @ mlp.down_proj.weight.T
    assert_close_zh(got, mlp(x), tr("silu_and_mul: the first half is gate, the second half is up"), atol=1e-6, rtol=1e-5)


def test_rotary_matches_hf() -> None:
    torch.manual_seed(0)
    head_dim, theta = 32, 1_000_000.0
    cfg = Qwen3Config(head_dim=head_dim, hidden_size=64, num_attention_heads=4, rope_theta=theta, max_position_embeddings=512)
    hf_rope = Qwen3RotaryEmbedding(cfg)
    positions = torch.tensor([0, 1, 2, 7, 100, 101, 400], dtype=torch.int32)
    q, k = torch.randn(len(positions), 4, head_dim), torch.randn(len(positions), 2, head_dim)
    cos, sin = hf_rope(q, positions[None].long())  # [1, T, D]
    hq, hk = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    ours = RotaryEmbedding(head_dim, theta, 512, device=CPU)
    gq, gk = ours.forward(positions, q, k)
    assert_close_zh(gq, hq[0].transpose(0, 1), tr("RoPE (q) differs from HF"), atol=1e-5, rtol=1e-5)
    assert_close_zh(gk, hk[0].transpose(0, 1), tr("RoPE (k) differs from HF"), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(apply_rotary(q, cos[0], sin[0]), hq[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


class _CountOps(TorchDispatchMode):
    """记下这段时间里跑过的每个 aten 算子的名字。

    en: Records the name of every aten operator run meanwhile.
    """

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN201
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_rotary_tables_match_hf_and_cost_a_lookup() -> None:
    head_dim, theta, max_pos = 32, 1_000_000.0, 512
    cfg = Qwen3Config(head_dim=head_dim, hidden_size=64, num_attention_heads=4, rope_theta=theta, max_position_embeddings=max_pos)
    rope = RotaryEmbedding(head_dim, theta, max_pos, device=CPU)
    positions = torch.tensor([300, 0, 7, 7, max_pos - 1, 1], dtype=torch.int32)  # 乱序、重复、最后一个位置 | en: unordered, repeated, the last position
    with _CountOps() as ops:
        cos, sin = rope.cos_sin(positions)
    hf_cos, hf_sin = Qwen3RotaryEmbedding(cfg)(torch.zeros(1, dtype=torch.float32), positions[None].long())
    expect((tuple(cos.shape), cos.dtype, tuple(sin.shape), sin.dtype), ((6, head_dim), torch.float32, (6, head_dim), torch.float32),
           tr("cos_sin(positions) gives two [T, D] fp32 tables"))
    assert_close_zh(cos, hf_cos[0], tr("cos_sin's cos table differs from HF's (rows: positions {positions})", positions=positions.tolist()), atol=0, rtol=0)
    assert_close_zh(sin, hf_sin[0], tr("cos_sin's sin table differs from HF's (rows: positions {positions})", positions=positions.tolist()), atol=0, rtol=0)
    costly = sorted({name for name in ops.names if name in {"cos", "sin", "pow", "exp", "outer", "polar"}})
    expect(costly, [], tr("cos_sin runs in every layer of every step: it must only look the angles up, yet it computed with {ops}", ops=costly))
    try:
        rope.cos_sin(torch.tensor([max_pos]))
    except (IndexError, ValueError, RuntimeError):
        return
    pytest.fail(tr("cos_sin({position}) with max_position={max_position} must raise: a position past the end is an error", position=max_pos, max_position=max_pos))


def make_qkv(bias: bool = False) -> tuple[Linear, list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(0)
    sizes = [8, 4, 4]
    ws = [torch.randn(n, 6) for n in sizes]
    bs = [torch.randn(n) for n in sizes]
    op = Linear(6, sizes, bias=bias, shard_names=["q_proj", "k_proj", "v_proj"], dtype=torch.float32, device=CPU)
    slots = op.own_slots("layers.0.self_attn.qkv_proj")
    expect(set(slots), {f"layers.0.self_attn.{n}_proj.{a}" for n in "qkv" for a in (["weight", "bias"] if bias else ["weight"])}, tr("The checkpoint names a merged qkv_proj loads (one per shard)"))
    for name, slot in slots.items():
        shard = "qkv".index(name.split(".")[-2][0])
        slot.op.load_weight(slot.attr, (ws if slot.attr == "weight" else bs)[shard], slot.shard)
    return op, ws, bs


@pytest.mark.parametrize("bias", [False, True])
def test_merged_linear_equals_separate(bias: bool) -> None:
    op, ws, bs = make_qkv(bias)
    x = torch.randn(3, 6)
    want = torch.cat([F.linear(x, w, b if bias else None) for w, b in zip(ws, bs)], dim=-1)
    assert_close_zh(op.forward(x), want, tr("The merged qkv linear layer must equal computing q, k, v separately and concatenating"))
    assert_close_zh(op.weight, torch.cat(ws), tr("Shard i must be loaded into the rows starting at sum(output_sizes[:i])"))


def test_merged_linear_rejects_wrong_shape() -> None:
    op, _, _ = make_qkv()
    with pytest.raises(ValueError, match=r"\(4, 6\).*\(5, 6\)"):  # 模型需要的形状、检查点给的形状
        op.load_weight("weight", torch.randn(5, 6), shard=1)
        pytest.fail(tr("k_proj has 4 rows: loading a tensor with 5 rows must report a shape error"))
    with pytest.raises(ValueError, match=r"\(8, 6\).*\(8, 7\)"):
        op.load_weight("weight", torch.randn(8, 7), shard=0)
        pytest.fail(tr("A wrong number of columns must report a shape error"))


def test_fast_linear_matches_reference() -> None:
    op, ws, _ = make_qkv()
    x = torch.randn(5, 6)
    want = op.forward(x)
    assert fast_linear_supported(CPU, torch.float32), tr("The oneDNN fast path must be available on CPU for fp32")
    weight, before = op.weight, op.weight.clone()
    assert pack_linear_weights(op) == 1, tr("pack_linear_weights must count the linear layers it packed")
    assert op.weight is weight and torch.equal(op.weight, before), tr(
        "Packing keeps self.weight as the checkpoint's weight (the fast layout is a copy beside it)")
    for rows in (1, 5):
        assert_close_zh(op.forward(x[:rows]), want[:rows], tr("The oneDNN path differs from F.linear"), atol=1e-5, rtol=1e-5)


@dataclass
class _LastIndices:
    last: torch.Tensor

    def get_last_indices(self, bs: int) -> torch.Tensor:
        return self.last[:bs]


def _ctx_with_batch(last: list[int], positions: torch.Tensor | None = None, backend=None) -> tuple[Context, Batch]:  # noqa: ANN001
    """一个只填了算子层会读的字段的批次（请求本身用不到，放占位符）。"""
    ctx = Context(page_size=1)
    batch = Batch([None] * len(last), "prefill")
    batch.attn_metadata = _LastIndices(torch.tensor(last))
    if positions is not None:
        batch.positions = positions
    ctx.attn_backend = backend
    set_global_ctx(ctx)
    return ctx, batch


@pytest.mark.parametrize("tied", [False, True])
def test_lm_head_last_tokens_only(tied: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    emb = VocabEmbedding(50, 8, dtype=torch.float32, device=CPU)
    emb.weight.copy_(torch.randn(50, 8))
    head = LMHead(50, 8, tie_to=emb if tied else None, dtype=torch.float32, device=CPU)
    if not tied:
        head.load_weight("weight", torch.randn(50, 8))
        expect(set(head.own_slots("lm_head")), {"lm_head.weight"}, tr("The weight names the lm_head loads"))
    else:
        assert head.own_slots("lm_head") == {}, tr("With tied weights the checkpoint has no lm_head.weight")
    weight = head.weight.clone()
    x = torch.randn(9, 8)  # 三个请求，各 4、1、4 个 token
    ctx, batch = _ctx_with_batch([3, 4, 8])
    with ctx.forward_batch(batch):
        logits = head.forward(x)
        assert logits.shape == (3, 50), tr("Logits must be computed only for the last token of each request")
        torch.testing.assert_close(logits, x[[3, 4, 8]] @ weight.T)
        emb_before = emb.weight.clone()
        pack_linear_weights(head)
        fast_calls: list[int] = []
        onednn_linear = kernel.onednn_linear
        monkeypatch.setattr(kernel, "onednn_linear", lambda *a: fast_calls.append(1) or onednn_linear(*a))
        torch.testing.assert_close(head.forward(x), logits, atol=1e-5, rtol=1e-5)
        expect(len(fast_calls), 1, tr("After packing, the LM head must take the path packing chose (the parent class's "
                                      "forward), not F.linear on self.weight"))
        assert torch.equal(emb.weight, emb_before), tr("Packing the LM head must not change the embedding layer's own weight")
    set_global_ctx(None)


class _RecordingBackend:
    def forward(self, q, k, v, layer_id, batch):  # noqa: ANN001, ANN201
        self.seen = (q, k, v, layer_id)
        return q * 2


@pytest.mark.parametrize("qk_norm", [False, True])
def test_attention_layer_forward(qk_norm: bool) -> None:
    torch.manual_seed(0)
    hq, hkv, d = 4, 2, 16
    rotary = RotaryEmbedding(d, 10000.0, 64, device=CPU)
    norms = [RMSNorm(d, 1e-6, dtype=torch.float32, device=CPU) for _ in range(2)] if qk_norm else [None, None]
    for n in norms:
        if n is not None:
            n.weight.copy_(torch.rand(d) + 0.5)
    layer = AttentionLayer(3, hq, hkv, d, rotary, *norms)
    positions = torch.tensor([5, 6, 7], dtype=torch.int32)
    qkv = torch.randn(3, (hq + 2 * hkv) * d)
    backend = _RecordingBackend()
    ctx, batch = _ctx_with_batch([2], positions, backend)
    with ctx.forward_batch(batch):
        out = layer.forward(qkv)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.view(3, hq, d), k.view(3, hkv, d), v.view(3, hkv, d)
    if qk_norm:
        q, k = norms[0].forward(q), norms[1].forward(k)
    q, k = rotary.forward(positions, q, k)
    got_q, got_k, got_v, layer_id = backend.seen
    expect(layer_id, 3, tr("The attention layer must pass its own layer_id (3) to the backend"))
    assert_close_zh(got_q, q, tr("The q handed to the backend must be [T, Hq, D] after the split, (q_norm,) and RoPE"))
    assert_close_zh(got_k, k, tr("The k handed to the backend must be [T, Hkv, D] after the split, (k_norm,) and RoPE"))
    assert_close_zh(got_v, v, tr("v gets neither normalization nor RoPE"))
    assert out.shape == (3, hq * d), tr("The output must be flattened to [T, Hq * D]")
    set_global_ctx(None)


def test_rotary_bf16_matches_hf() -> None:
    """bf16 的 q/k：cos/sin 表是 fp32，要先转成 x 的 dtype 再乘（HF 的 Qwen3RotaryEmbedding 也这样返回），结果仍是 bf16。"""
    torch.manual_seed(0)
    head_dim, theta = 32, 1_000_000.0
    cfg = Qwen3Config(head_dim=head_dim, hidden_size=64, num_attention_heads=4, rope_theta=theta, max_position_embeddings=512)
    positions = torch.tensor([0, 3, 50, 200, 511], dtype=torch.int32)
    q = torch.randn(len(positions), 4, head_dim).bfloat16()
    k = torch.randn(len(positions), 2, head_dim).bfloat16()
    cos, sin = Qwen3RotaryEmbedding(cfg)(q, positions[None].long())  # 已是 bf16
    hq, hk = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    gq, gk = RotaryEmbedding(head_dim, theta, 512, device=CPU).forward(positions, q, k)
    assert gq.dtype == torch.bfloat16 and gk.dtype == torch.bfloat16, (
        tr("bf16 q/k must still be bf16 after RoPE, got {dtype}/{dtype2}: cos/sin need .to(x.dtype) first", dtype=gq.dtype, dtype2=gk.dtype)
    )
    assert_close_zh(gq, hq[0].transpose(0, 1), tr("RoPE (q) differs from HF in bf16: convert cos/sin to the dtype of x before multiplying"), atol=0, rtol=0)
    assert_close_zh(gk, hk[0].transpose(0, 1), tr("RoPE (k) differs from HF in bf16"), atol=0, rtol=0)


def test_merged_linear_shape_error_names_expected_and_given() -> None:
    """形状错误的消息要说清哪个是模型需要的、哪个是检查点给的（check_shape(模型里的目标, 检查点张量)）。"""
    op, _, _ = make_qkv()
    with pytest.raises(ValueError, match=r"\(4, 6\).*\(5, 6\)"):
        op.load_weight("weight", torch.randn(5, 6), shard=1)
        pytest.fail(tr("k_proj has 4 rows: loading a tensor with 5 rows must report a shape error"))


# ----------------------------------------------------------------------------- 在后面章节下跑本章的代码（issue 24）


def test_later_chapters_run_these_layers_and_match_hf(tiny_path: str) -> None:
    """引擎（第 1.6 章，经第 1.3 章的模型）用本章的层：整批贪心生成，与 Hugging Face 逐 token 比较。"""
    classes = dict(Engine=Engine, EngineConfig=EngineConfig, Req=Req, Batch=Batch, SamplingParams=SamplingParams)
    engine_matches_hf(classes, tiny_path, tr("The engine (chapter 1.6) with your layers"))
