"""第 5.4 章 quantization 的检查：量化再还原差不到半个 scale（int8 每行、int4 每组），scale 和偏移就是定义给的数；
离群值放在组的第一列或最后一列，组的边界挪一列就露馅。打包的字节与 Q4_0 相同；参考矩阵乘等于先还原再乘；C 内核在
每种余数上等于参考矩阵乘。整个引擎：量化的 tiny 模型（稠密和 MoE）贪心的 token 与权重换成还原值的 Hugging Face 逐个
相同，字节数变少，写错的名字和除不尽的组大小报 ValueError。

en: Checks of chapter 5.4 quantization: quantizing and restoring is off by less than half a scale (int8 per row, int4
per group), and scale and offset are the numbers the definition gives; outliers on a group's first or last column
show a boundary moved by one. The packed bytes follow Q4_0; the reference matmuls equal restoring then multiplying; the
C kernels equal them at every remainder. The whole engine: the quantized tiny models (dense and MoE) generate greedily
exactly the tokens of Hugging Face with the restored weights, take fewer bytes, and a misspelt name or a group size that
does not divide a layer raises ValueError.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from checks.common import expect
from checks.stage1.conftest import LATER_PROMPTS, LATER_TOKENS
from checks.stage2.conftest import built
from minisgl import kernel, model_zoo
from minisgl.i18n import tr
from minisgl.quantization import (INT4_MAX, INT8_MAX, dequantize_int4, dequantize_int8, linear_int4, linear_int8,
                                  pack_int4, quantize_int4, quantize_int8, unpack_int4)

pytestmark = pytest.mark.timeout(300)

#: 引擎的参数（dtype 和 device 在每个 LLM(...) 里写明）。
#: en: the engines' settings (dtype and device stated in each LLM(...)).
KW: dict[str, Any] = dict(max_running_req=len(LATER_PROMPTS), num_page_override=256, max_seq_len_override=64)
SLACK = 1e-4  # 误差上界里给 fp32 舍入留的余量（以 scale 为单位） | en: room for fp32 rounding in the bounds (in units of a scale)


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def expect_within(w: torch.Tensor, restored: torch.Tensor, step: torch.Tensor, what: str) -> None:
    """逐个元素 ``|w - restored| ≤ step / 2``（``step`` 与 ``w`` 同形状：每个元素所在行或组的 scale）。

    en: Elementwise ``|w - restored| ≤ step / 2`` (``step`` has ``w``'s shape: the scale of each element's row or group).
    """
    excess = (w.float() - restored).abs() - step * (0.5 + SLACK)
    worst = divmod(int(excess.argmax()), w.shape[1])
    assert bool((excess <= 0).all()), tr(
        "{what}: |w - restored| exceeds half a scale at (row, column) {where}: w = {w}, restored = {r}, scale = {s}",
        what=what, where=worst, w=float(w[worst]), r=float(restored[worst]), s=float(step[worst]))


def expect_close(got: torch.Tensor, want: torch.Tensor, what: str, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    same = got.shape == want.shape and got.dtype == want.dtype
    diff = float((got.float() - want.float()).abs().max()) if same and got.numel() else float("nan")
    assert same and torch.allclose(got.float(), want.float(), rtol=rtol, atol=atol), tr(
        "{what}: got {gs} {gd}, expected {ws} {wd}; largest difference {diff}",
        what=what, gs=tuple(got.shape), gd=got.dtype, ws=tuple(want.shape), wd=want.dtype, diff=diff)


def group_view(w: torch.Tensor, group: int) -> torch.Tensor:
    """第 g 组是第 g·group 到 (g+1)·group - 1 列：``[N, K / group, group]``。

    en: Group g is columns g·group to (g+1)·group - 1: ``[N, K / group, group]``.
    """
    return w.float().reshape(w.shape[0], -1, group)


# ----------------------------------------------------------------------------- int8


def test_int8_one_scale_per_row_and_half_a_step() -> None:
    mags = torch.tensor([1e-3, 0.1, 1.0, 3.0, 50.0, 0.0])  # 每行的量级差很多，最后一行全是 0 | en: rows far apart in size, the last all zeros
    w = randn(6, 40, seed=0) * mags[:, None]
    w[2, 7] = -4.0  # 这一行绝对值最大的是负数 | en: this row's largest magnitude is negative
    q, scale = quantize_int8(w)
    expect((q.dtype, tuple(q.shape), scale.dtype, tuple(scale.shape)), (torch.int8, (6, 40), torch.float32, (6,)),
           tr("quantize_int8 of an fp32 [6, 40]: (q dtype, q shape, scale dtype, scale shape)"))
    want = w.abs().amax(dim=1) / INT8_MAX
    assert torch.equal(scale[:5], want[:5]), tr("int8 scale of each row = max|row| / {m}: got {got}, expected {want}",
                                                m=INT8_MAX, got=scale[:5].tolist(), want=want[:5].tolist())
    assert bool(torch.isfinite(scale[5])) and float(scale[5]) > 0 and not bool(q[5].any()), tr(
        "a row of zeros: a finite, non-zero scale (got {s}) and every q 0 (got {q})", s=float(scale[5]), q=q[5].tolist())
    expect((int(q.min()) >= -INT8_MAX, int(q[2, 7])), (True, -INT8_MAX),
           tr("int8 q never below -{m}, and the row's largest magnitude -4.0 lands on -{m}: (no q below, q of -4.0)", m=INT8_MAX))
    restored = dequantize_int8(q, scale)
    expect((restored.dtype, tuple(restored.shape)), (torch.float32, (6, 40)), tr("dequantize_int8: dtype and shape"))
    expect_within(w, restored, scale[:, None].expand_as(w), tr("int8 quantize then dequantize"))


def test_int8_rounds_to_nearest() -> None:
    w = torch.tensor([[127.0, 0.6, -0.6, 1.4, -1.6, 126.7, -2.7, 0.2], [-2.54, 0.0132, -0.0132, 1.0, 0.034, 2.52, 0.006, -0.466]])
    q, scale = quantize_int8(w)
    expect(q.tolist(), [[127, 1, -1, 1, -2, 127, -3, 0], [-127, 1, -1, 50, 2, 126, 0, -23]],
           tr("int8 q of two hand-made rows (scale 1 and 0.02): nearest integers, not truncated toward zero"))


def test_int8_bf16_weight_scaled_in_fp32() -> None:
    w = (randn(5, 24, seed=1) * 3).to(torch.bfloat16)
    q, scale = quantize_int8(w)
    want = w.float().abs().amax(dim=1) / INT8_MAX
    expect(scale.dtype, torch.float32, tr("quantize_int8 of a bf16 weight: the scale is fp32"))
    assert torch.equal(scale, want), tr("quantize_int8 of a bf16 weight: scale = max|row| / {m} computed in fp32", m=INT8_MAX)
    expect_within(w, dequantize_int8(q, scale), scale[:, None].expand(5, 24), tr("int8 of a bf16 weight"))


# ----------------------------------------------------------------------------- int4


def int4_checks(w: torch.Tensor, group: int, what: str, bound: bool = True) -> tuple[torch.Tensor, ...]:
    """形状、类型、范围、scale 和偏移的定义；``bound`` 时还有半个 scale 的误差上界。返回 (q, scale, offset)。

    en: Shapes, dtypes, ranges, the definitions of scale and offset; with ``bound`` the half-a-scale error bound too.
    Returns (q, scale, offset).
    """
    n, k = w.shape
    q, scale, offset = quantize_int4(w, group)
    expect((q.dtype, tuple(q.shape), scale.dtype, tuple(scale.shape), offset.dtype, tuple(offset.shape)),
           (torch.uint8, (n, k), torch.float32, (n, k // group), torch.float32, (n, k // group)),
           tr("{what}: (q dtype, q shape, scale dtype, scale shape, offset dtype, offset shape)", what=what))
    expect(int(q.max()) <= INT4_MAX, True, tr("{what}: every q within [0, {m}]", what=what, m=INT4_MAX))
    g = group_view(w, group)
    assert torch.equal(offset, g.amin(-1)), tr("{what}: offset of each group = its minimum", what=what)
    span = (g.amax(-1) - g.amin(-1)) / INT4_MAX
    flat = span == 0
    assert torch.equal(scale[~flat], span[~flat]), tr(
        "{what}: scale of each group = (max - min) / {m} of its {group} columns\ngot:      {got}\nexpected: {want}",
        what=what, m=INT4_MAX, group=group, got=scale.tolist(), want=span.tolist())
    assert bool(torch.isfinite(scale).all() and (scale > 0).all()), tr(
        "{what}: a group of equal values still gets a finite, non-zero scale: {got}", what=what, got=scale.tolist())
    if bound:
        restored = dequantize_int4(q, scale, offset, group)
        expect((restored.dtype, tuple(restored.shape)), (torch.float32, (n, k)), tr("dequantize_int4: dtype and shape"))
        expect_within(w, restored, scale.repeat_interleave(group, dim=1), what)
    return q, scale, offset


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_groups_and_half_a_step(group: int) -> None:
    w = randn(5, 3 * group, seed=group) * torch.tensor([0.01, 1.0, 30.0]).repeat_interleave(group)  # 每组量级不同 | en: groups of different sizes
    w = w * torch.tensor([1.0, 0.2, 5.0, 1.0, 0.03])[:, None]
    w[:, ::group] = -w[:, ::group].abs()  # 每组都有正有负 | en: every group holds both signs
    w[:, 1::group] = w[:, 1::group].abs()
    w[3, group:2 * group] = 0.0  # 一组全是 0 | en: one group of zeros
    q, scale, offset = int4_checks(w, group, tr("int4 in groups of {group}", group=group))
    restored = dequantize_int4(q, scale, offset, group)
    expect(restored[3, group:2 * group].abs().max().item(), 0.0, tr("a group of zeros is restored as zeros"))
    g, qg = group_view(w, group), group_view(q, group)
    lo, hi = qg.gather(-1, g.argmin(-1, keepdim=True)), qg.gather(-1, g.argmax(-1, keepdim=True))
    expect((lo[[0, 1, 2, 4]].unique().tolist(), hi[[0, 1, 2, 4]].unique().tolist()), ([0.0], [float(INT4_MAX)]),
           tr("each group's minimum is stored as q 0 and its maximum as q {m}: (q of the minima, q of the maxima)", m=INT4_MAX))


def test_int4_outliers_on_group_edges() -> None:
    """组边界挪一列，离群值就进了旁边的组：那一组的 scale 和误差都不对了。

    en: Move a group boundary by one column and an outlier falls into the next group: that group's scale and error go
    wrong.
    """
    w = (torch.rand(4, 128, generator=torch.Generator().manual_seed(5)) - 0.5) * 0.02
    w[0, 31], w[0, 64] = 5.0, -5.0  # 第 0 组的最后一列、第 2 组的第一列 | en: group 0's last column, group 2's first
    w[1, 0], w[1, 127] = -3.0, 4.0  # 整行的第一列和最后一列 | en: the row's first and last columns
    w[2, 32], w[2, 95] = 2.0, -2.0  # 第 1 组的第一列、第 2 组的最后一列 | en: group 1's first column, group 2's last
    int4_checks(w, 32, tr("int4 in groups of 32 with outliers on the groups' first and last columns"))


def test_int4_lopsided_groups_use_the_whole_range() -> None:
    """偏移的用处：最小值是 0 的组、最大值是 0 的组、几乎全是正数的组、离 0 很远的组，都用上 0 到 15，误差都不到半个 scale。

    en: What the offset is for: a group whose minimum is 0, one whose maximum is 0, one almost all positive and groups
    far from 0 all use 0 to 15, each within half a scale.
    """
    base = torch.linspace(0.0, 1.0, 32)
    w = torch.stack([base, -base, base - 0.12, 2 * base - 0.5, base + 10.0, base - 11.0])
    q, _, _ = int4_checks(w, 32, tr("int4 of lopsided groups"))
    expect((q.amin(1).tolist(), q.amax(1).tolist()), ([0] * 6, [INT4_MAX] * 6),
           tr("each lopsided group uses both 0 and {m}: (smallest q, largest q) per group", m=INT4_MAX))


# ----------------------------------------------------------------------------- 打包
# en: ----------------------------------------------------------------------------- packing


@pytest.mark.parametrize("k", [32, 64, 96, 160])
def test_pack_round_trip(k: int) -> None:
    q = torch.randint(0, 16, (3, k), generator=torch.Generator().manual_seed(k), dtype=torch.uint8)
    packed = pack_int4(q)
    expect((packed.dtype, tuple(packed.shape)), (torch.uint8, (3, k // 2)), tr("pack_int4 of [3, {k}]: dtype and shape", k=k))
    assert torch.equal(unpack_int4(packed), q), tr("unpack_int4(pack_int4(q)) == q for {k} columns", k=k)


def test_pack_byte_layout() -> None:
    rows = [[c // 4 % 16 for c in range(64)], [(5 * c + c // 16) % 16 for c in range(64)], [15 - c % 32 // 2 for c in range(64)]]
    want = [[row[32 * b + i] | row[32 * b + 16 + i] << 4 for b in range(2) for i in range(16)] for row in rows]
    got = pack_int4(torch.tensor(rows, dtype=torch.uint8))
    expect(got.tolist(), want, tr("packed bytes: in each block of 32 columns, byte i = column i | column i + 16 << 4"))


# ----------------------------------------------------------------------------- 参考矩阵乘
# en: ----------------------------------------------------------------------------- reference matmuls


def int4_weight(n: int, k: int, group: int, seed: int) -> tuple[torch.Tensor, ...]:
    w = randn(n, k, seed=seed)
    q, scale, offset = quantize_int4(w, group)
    return w, pack_int4(q), scale, offset, dequantize_int4(q, scale, offset, group)


def test_reference_matmuls() -> None:
    w, x, b = randn(12, 64, seed=6), randn(2, 3, 64, seed=7), randn(12, seed=8)
    q, scale = quantize_int8(w)
    w4, packed, s4, z4, restored4 = int4_weight(12, 64, 32, seed=9)
    cases: list[tuple[str, Callable[..., torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]] = [
        ("linear_int8", lambda x, b: linear_int8(x, q, scale, b), dequantize_int8(q, scale), w, scale[:, None].expand(12, 64)),
        ("linear_int4", lambda x, b: linear_int4(x, packed, s4, z4, 32, b), restored4, w4, s4.repeat_interleave(32, dim=1)),
    ]  # fmt: skip
    for name, fn, restored, original, step in cases:
        for bias in (None, b):
            want = x @ restored.T + (0 if bias is None else bias)
            got = fn(x, bias)
            expect_close(got, want, tr("{name} (bias: {has}) vs x · restoredᵀ + bias", name=name, has=bias is not None))
            slack = (x.abs() @ step.T) * (0.5 + SLACK)  # Σ_k |x_k| · scale / 2
            excess = float(((got - x @ original.T - (0 if bias is None else bias)).abs() - slack).max())
            assert excess <= 1e-4, tr("{name}: differs from the float weight's result by more than Σ|x|·scale/2 (by {e})",
                                      name=name, e=excess)
        xb = x.to(torch.bfloat16)
        got, want = fn(xb, b), xb.float() @ restored.T + b
        expect(got.dtype, torch.bfloat16, tr("{name} of a bf16 x: the result's dtype", name=name))
        ulp = torch.pow(2.0, torch.floor(torch.log2(want.abs().clamp_min(1e-20))) - 7)  # bf16 在 want 处的一格 | en: one bf16 step at want
        steps = float(((got.float() - want).abs() / ulp).max())
        assert steps <= 1, tr("{name} of a bf16 x: {steps:.1f} bf16 steps from the fp32 result; compute in fp32 and round "
                              "once at the end", name=name, steps=steps)


# ----------------------------------------------------------------------------- C 内核
# en: ----------------------------------------------------------------------------- C kernels


def kernel_ready() -> None:
    assert kernel.available(), tr("minisgl.kernel could not be compiled on this machine (a C compiler is needed): the "
                                  "int8/int4 kernels are checked on every host, never skipped")


def test_q8_kernel_at_every_remainder() -> None:
    kernel_ready()
    for k in (64, 72):  # K % 16 ∈ {0, 8}
        for n in (8, 9, 10, 11):  # N % 4 ∈ {0, 1, 2, 3}
            q, scale = quantize_int8(randn(n, k, seed=k + n))
            b = randn(n, seed=n)
            for m in range(1, 10):  # TILE_X 是 6 或 3 | en: TILE_X is 6 or 3
                x, bias = randn(m, k, seed=m), (b if m % 2 else None)
                expect_close(kernel.q8_linear(x, q, scale, bias), linear_int8(x, q, scale, bias),
                             tr("q8_linear vs linear_int8 at M={m}, N={n}, K={k}", m=m, n=n, k=k), atol=1e-4)


def test_q4_kernel_at_every_remainder() -> None:
    kernel_ready()
    for group in (32, 64, 128):
        for blocks in (1, 2, 3):
            k = group * blocks
            for n in (4, 5, 6, 7):
                _, packed, scale, offset, _ = int4_weight(n, k, group, seed=k + n)
                b = randn(n, seed=n)
                for m in range(1, 10):  # QX = 4
                    x, bias = randn(m, k, seed=m), (b if m % 2 else None)
                    expect_close(kernel.q4_linear(x, packed, scale, offset, group, bias),
                                 linear_int4(x, packed, scale, offset, group, bias),
                                 tr("q4_linear vs linear_int4 at M={m}, N={n}, K={k}, groups of {g}", m=m, n=n, k=k, g=group),
                                 atol=1e-4)


# ----------------------------------------------------------------------------- 整个引擎
# en: ----------------------------------------------------------------------------- the whole engine


def restored_weight(w: torch.Tensor, name: str) -> torch.Tensor:
    """本章的函数量化再还原（一叠专家逐个）：``name`` 是 ``int8wo`` 或 ``int4wo-G``。

    en: Quantized and restored by this chapter's functions (a stack of experts one by one): ``name`` is ``int8wo`` or
    ``int4wo-G``.
    """
    if w.dim() == 3:
        return torch.stack([restored_weight(e, name) for e in w])
    if name == "int8wo":
        return dequantize_int8(*quantize_int8(w))
    group = int(name.split("-")[1])
    return dequantize_int4(*quantize_int4(w, group), group)


@torch.inference_mode()
def hf_restored(path: str, name: str) -> tuple[list[list[int]], int]:
    """Hugging Face 的模型，线性层（含 LM head、与它共用的词嵌入）和专家的权重换成还原值，路由器不动：贪心的 token，
    和原来 fp32 权重的字节数。

    en: The Hugging Face model with its linear layers' (the LM head and the word embedding it shares included) and
    experts' weights replaced by the restored values, the router left alone: greedy tokens, and the fp32 weights' bytes.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    head = model.get_output_embeddings().weight
    head.copy_(restored_weight(head, "int8wo"))  # LM head 总是 8 位 | en: the LM head always keeps 8 bits
    for pname, p in model.named_parameters():
        if pname.endswith(("_proj.weight", "experts.gate_up_proj", "experts.down_proj")):
            p.copy_(restored_weight(p, name))
    tokens = []
    for prompt in LATER_PROMPTS:
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=LATER_TOKENS, do_sample=False)
        tokens.append(out[0, len(prompt):].tolist())
    return tokens, nbytes


def engine_run(path: str, name: str, **kw: Any) -> tuple[list[list[int]], dict[str, Any]]:
    """量化的引擎生成一遍：token，和引擎的样子（融合解码、字节数、哪些权重还是浮点数、哪些量化了）。

    en: One generation on a quantized engine: the tokens, and the engine's state (fused decode, bytes, which weights are
    float and which quantized).
    """
    from minisgl.core import SamplingParams
    from minisgl.engine import model_nbytes
    from minisgl.llm import LLM
    from minisgl.quantized import QuantizedWeight

    llm = LLM(path, dtype=torch.float32, device="cpu", quantization=name, **KW, **kw)
    try:
        ops = dict(llm.engine.model.named_ops())
        seen = {"fused": bool(llm.engine.fused_decode), "bytes": model_nbytes(llm.engine.model),
                "float": sorted(p for p, op in ops.items() if isinstance(w := vars(op).get("weight"), torch.Tensor) and w.dim() == 2),
                "quantized": sorted(f"{p}.{a}" for p, op in ops.items() for a, v in vars(op).items() if isinstance(v, QuantizedWeight))}
        outs = llm.generate(LATER_PROMPTS, SamplingParams(temperature=0.0, max_tokens=LATER_TOKENS, ignore_eos=True))
        return [o["token_ids"] for o in outs], seen
    finally:
        llm.shutdown()


@pytest.mark.parametrize("name,ratio", [("int8wo", 0.3), ("int4wo-32", 0.3)])  # tiny 的 LM head 占了大半，它总是 8 位 | en: the LM head, always 8-bit, is most of tiny
def test_tiny_model_matches_hf_with_restored_weights(name: str, ratio: float) -> None:
    path = built(model_zoo.tiny_qwen3)
    want, fp32_bytes = hf_restored(path, name)
    for fused in (True, False):
        got, seen = engine_run(path, name, cpu_fused_decode=fused)
        expect(seen["fused"], fused, tr("{name}: the engine decodes with the fused C decode: {fused}", name=name, fused=fused))
        expect(seen["float"], [], tr("{name}: 2-D weights left in floating point (the tiny model has no router)", name=name))
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            expect(g, w, tr("{name}, request {i} (fused decode: {fused}): greedy tokens vs Hugging Face with the restored "
                            "weights", name=name, i=i, fused=fused))
    assert seen["bytes"] <= ratio * fp32_bytes, tr("{name}: the model takes {got} bytes, more than {ratio} × the {fp32} of fp32",
                                                   name=name, got=seen["bytes"], ratio=ratio, fp32=fp32_bytes)


def test_moe_model_matches_hf_with_restored_experts() -> None:
    path = built(model_zoo.tiny_qwen3_moe)
    want, _ = hf_restored(path, "int8wo")
    got, seen = engine_run(path, "int8wo")
    expect(seen["float"], ["model.layers.1.mlp.gate", "model.layers.2.mlp.gate"],
           tr("int8wo on the tiny MoE model: the 2-D weights left in floating point (the routers only)"))
    experts = [f"model.layers.{i}.mlp.experts.{a}" for i in (1, 2) for a in ("w13", "w2")]
    expect([e for e in experts + ["lm_head.weight"] if e not in seen["quantized"]], [],
           tr("int8wo on the tiny MoE model: expert weights and the LM head left unquantized"))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        expect(g, w, tr("int8wo MoE, request {i}: greedy tokens vs Hugging Face with restored experts, the router in fp32", i=i))


def test_names_and_group_sizes_are_checked() -> None:
    from minisgl.llm import LLM

    tiny, moe = built(model_zoo.tiny_qwen3), built(model_zoo.tiny_qwen3_moe)
    got, seen = engine_run(tiny, "int4wo-64")
    expect((len(got), seen["float"]), (len(LATER_PROMPTS), []), tr("int4wo-64 fits every layer of the tiny model: it runs"))
    for name in ("int3", "int4wo-48", "int4wo-0", "int8"):
        with pytest.raises(ValueError) as err:  # 路径不存在：名字在读任何文件之前就被拒绝 | en: no such path: refused before anything is read
            LLM("/no/such/model", dtype=torch.float32, device="cpu", quantization=name)
        assert "int8wo" in str(err.value) and "int4wo" in str(err.value), tr(
            "quantization={name!r}: the ValueError names the forms known: {message}", name=name, message=err.value)
    for path, name, where, fits in ((tiny, "int4wo-128", "qkv_proj", "int4wo-64"), (moe, "int4wo-64", "experts", "int4wo-32")):
        with pytest.raises(ValueError) as err:
            LLM(path, dtype=torch.float32, device="cpu", quantization=name, **KW)
        message = str(err.value)
        expect((where in message, fits in message), (True, True),
               tr("{name}: the ValueError names the layer ({where}) and a group size that fits ({fits}): {message}",
                  name=name, where=where, fits=fits, message=message))
