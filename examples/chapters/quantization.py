"""第 5.4 章示例：只量化权重。一个随机矩阵按行量化成 int8，看每一行的误差都不超过半个 scale；按组量化成 int4，
组分别是 32、128 和一整行时误差差多少；一行 32 个 4 位值打包成 16 个字节（Q4_0 的排法）；最后用真权重的 SmolLM2
比较 fp32、int8wo、int4wo-32、int4wo-64：模型占多少字节、同一个提示词贪心地生成什么、解码一步多快（时间与机器有关）。

    python examples/chapters/quantization.py

en: Chapter 5.4 example: weight-only quantization. A random matrix quantized to int8 row by row, every row's error at
most half its scale; quantized to int4 in groups of 32, 128 and a whole row, and how the error changes; a row of 32
4-bit values packed into 16 bytes (Q4_0's layout); finally SmolLM2 with its real weights in fp32, int8wo,
int4wo-32 and int4wo-64: the model's bytes, what one prompt generates greedily, and how fast a decode step is (timings depend on the
machine).

    python examples/chapters/quantization.py
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.engine import model_nbytes
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.model_zoo import smollm2
from minisgl.quantization import (INT4_BLOCK, INT8_MAX, dequantize_int4, dequantize_int8, pack_int4, quantize_int4,
                                  quantize_int8, unpack_int4)

PROMPT = "Write a short poem about the sea."
MAX_TOKENS = 32
KW: dict[str, Any] = dict(dtype=torch.float32, device="cpu", max_running_req=1, num_page_override=256,
                          max_seq_len_override=256)


def int8_demo() -> None:
    print(tr("== 1. int8, one scale per output row =="))
    g = torch.Generator().manual_seed(0)
    # 5 行，大小差很多：第 3 行有一个离群值，最后一行全是 0
    # en: 5 rows of very different sizes: row 3 has one outlier, the last row is all zeros
    w = torch.randn(5, 256, generator=g) * torch.tensor([0.01, 0.1, 1.0, 0.1, 0.0])[:, None]
    w[3, 7] = 2.0
    q, scale = quantize_int8(w)
    err = (dequantize_int8(q, scale) - w).abs()
    print(tr("W: {shape}, q: {dtype}, scale: {sdtype} {sshape}", shape=list(w.shape), dtype=q.dtype,
             sdtype=scale.dtype, sshape=list(scale.shape)))
    print(tr("row  max|w|    scale      max error  scale/2    values used"))
    for n in range(w.shape[0]):
        print(f"{n:>3}  {float(w[n].abs().max()):.4f}  {float(scale[n]):.3e}  {float(err[n].max()):.3e}  "
              f"{float(scale[n]) / 2:.3e}  {len(q[n].unique()):>4}")
    print(tr("every row: max error <= scale/2: {ok}; the largest |q| is {top} (= INT8_MAX)",
             ok=bool((err.amax(1) <= scale / 2 * (1 + 1e-6)).all()), top=int(q.abs().max())))
    # 整个矩阵只用一个 scale：小的行只剩几个值可用
    # en: one scale for the whole matrix: the small rows are left with a few values
    one = float(w.abs().max()) / INT8_MAX
    used = [len(torch.round(w[n] / one).unique()) for n in range(w.shape[0])]
    print(tr("with one scale for the whole matrix ({s:.3e}) the rows use {used} values: row 0 is almost all zeros",
             s=one, used=used))
    print(tr("row 3's outlier sets its scale: its other weights use {n} values instead of row 1's {m}",
             n=len(q[3].unique()), m=len(q[1].unique())))


def int4_demo() -> None:
    print(tr("\n== 2. int4 in groups: the smaller the group, the smaller the error =="))
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 1024, generator=g) * 0.05
    w[:, 100] *= 20  # 每一行的第 100 列是离群值 | en: column 100 of every row is an outlier
    print(tr("W: {shape}, weights ~ N(0, 0.05²), column 100 multiplied by 20", shape=list(w.shape)))
    print(tr("group  groups per row  mean |error|  max error  max error <= scale/2  bytes per weight read"))
    for group in (32, 128, 1024):
        q, scale, offset = quantize_int4(w, group)
        err = (dequantize_int4(q, scale, offset, group) - w).abs()
        half = scale.repeat_interleave(group, dim=1) / 2
        print(f"{group:>5}  {scale.shape[1]:>14}  {float(err.mean()):.2e}      {float(err.max()):.2e}   "
              f"{str(bool((err <= half * (1 + 1e-6)).all())):>20}  {0.5 + 8 / group:.4f}")
    q, scale, offset = quantize_int4(w, 32)
    print(tr("group 32: q {q} {qt} in [{lo}, {hi}], scale and offset {s} {st}", q=list(q.shape), qt=q.dtype,
             lo=int(q.min()), hi=int(q.max()), s=list(scale.shape), st=offset.dtype))
    # 全是正数的一组（0.2 .. 1.7）：偏移是最小值，16 个值都用上；对称的 4 位（±7 格）只用得上一半
    # en: an all-positive group (0.2 .. 1.7): the offset is its minimum and all 16 values are used; a symmetric 4-bit
    # en: grid (±7 steps) would use half of them
    side = torch.linspace(0.2, 1.7, 32)[None]
    q, scale, offset = quantize_int4(side, 32)
    err = float((dequantize_int4(q, scale, offset, 32) - side).abs().max())
    symmetric = len(torch.round(side / (float(side.abs().max()) / 7)).unique())
    print(tr("an all-positive group 0.2 .. 1.7: offset {o:.4f}, scale {s:.4f}, values used {n}, max error {e:.4f} "
             "(a symmetric grid of ±7 steps would use {m})", o=float(offset), s=float(scale), n=len(q.unique()), e=err,
             m=symmetric))


def pack_demo() -> None:
    print(tr("\n== 3. Two 4-bit values per byte, Q4_0's layout =="))
    # 一块 32 列：前 16 列是 0..15，后 16 列是 15..0
    # en: one block of 32 columns: the first 16 are 0..15, the last 16 are 15..0
    q = torch.cat([torch.arange(16), torch.arange(15, -1, -1)]).to(torch.uint8)[None]
    packed = pack_int4(q)
    print(tr("columns 0..15:  {lo}", lo=q[0, :16].tolist()))
    print(tr("columns 16..31: {hi}", hi=q[0, 16:].tolist()))
    print(tr("{n} bytes: {bytes}", n=packed.shape[1], bytes=" ".join(f"{b:02x}" for b in packed[0].tolist())))
    b0 = int(packed[0, 0])
    print(tr("byte 0 = 0x{b:02x}: low 4 bits {lo} = column 0, high 4 bits {hi} = column {c}", b=b0, lo=b0 & 15,
             hi=b0 >> 4, c=INT4_BLOCK // 2))
    print(tr("unpack_int4(pack_int4(q)) == q: {same}", same=bool(torch.equal(unpack_int4(packed), q))))


def rel_error(w: torch.Tensor, group: int) -> float:
    """按 ``group`` 个一组量化成 int4 再还原，平均绝对误差占平均 |w| 的比例。

    en: Quantize to int4 in groups of ``group`` and restore: the mean absolute error as a fraction of the mean |w|."""
    q, scale, offset = quantize_int4(w, group)
    return float((dequantize_int4(q, scale, offset, group) - w).abs().mean() / w.abs().mean())


class Run:
    """一个引擎：它的字节数、一个提示词贪心生成的 token、解码一步的时间（中位数）。

    en: One engine: its bytes, the tokens one prompt generates greedily, and a decode step's time (the median)."""

    def __init__(self, path: Any, prompt: list[int], quantization: str | None) -> None:
        llm = LLM(path, quantization=quantization, **KW)
        self.nbytes = model_nbytes(llm.engine.model)
        times: list[float] = []
        llm.add_step_listener(lambda t: times.append(t.forward[1] - t.forward[0]) if t.phase == "decode" else None)
        llm.generate([prompt], SamplingParams(max_tokens=8))  # 预热 | en: warm up
        times.clear()
        out = llm.generate([prompt], SamplingParams(max_tokens=MAX_TOKENS))[0]
        self.tokens, self.text, self.step_ms = out["token_ids"], out["text"], 1000 * statistics.median(times)
        self.down = llm.engine.model.model.layers[0].mlp.down_proj.weight  # 第 0 层的 down_proj | en: layer 0's down_proj
        self.head = getattr(llm.engine.model.lm_head.weight, "method", "fp32")  # LM head 存成什么 | en: how the LM head is stored


def engine_demo() -> None:
    print(tr("\n== 4. SmolLM2 (real weights): fp32, int8wo, int4wo-32, int4wo-64 =="))
    path = smollm2()
    tok = AutoTokenizer.from_pretrained(path)
    prompt = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                     return_dict=False)
    print(tr("prompt {p!r}, greedy, {n} tokens", p=PROMPT, n=MAX_TOKENS))
    runs = {name: Run(path, prompt, None if name == "fp32" else name) for name in ("fp32", "int8wo", "int4wo-32", "int4wo-64")}
    base = runs["fp32"]
    for name, run in runs.items():
        same = sum(a == b for a, b in zip(run.tokens, base.tokens))
        first = next((i for i, (a, b) in enumerate(zip(run.tokens, base.tokens)) if a != b), None)
        print(tr("{name}: model {mb:.1f} MB ({frac:.2f} of fp32), LM head {head}", name=name, mb=run.nbytes / 1e6,
                 frac=run.nbytes / base.nbytes, head=run.head))
        print(f"    {run.text!r}")
        if run is base:
            print(tr("    decode step {ms:.1f} ms (machine-dependent)", ms=run.step_ms))
            continue
        if first is None:
            print(tr("    tokens equal to fp32's: all {n}", n=len(base.tokens)))
        else:
            print(tr("    tokens equal to fp32's: {same} of {n}; they part from token {first} on", same=same,
                     n=len(base.tokens), first=first + 1))
        print(tr("    decode step {ms:.1f} ms, {ratio:.1f}× faster than fp32 (machine-dependent)", ms=run.step_ms,
                 ratio=base.step_ms / run.step_ms))
    # 这份检查点来自一个 4 位的 Q4_1 文件：每 32 个权重最多 16 个不同的值
    # en: this checkpoint came from a 4-bit Q4_1 file: at most 16 distinct values in every 32 weights
    w = base.down.float()
    groups = w.reshape(-1, INT4_BLOCK).sort(dim=1).values
    distinct = int(((groups[:, 1:] != groups[:, :-1]).sum(1) + 1).max())
    gauss = torch.randn(w.shape, generator=torch.Generator().manual_seed(0)) * float(w.std())
    print(tr("layer 0's down_proj {shape}: at most {n} distinct values in any group of 32 (the checkpoint was "
             "dequantized from a 4-bit Q4_1 file)", shape=list(w.shape), n=distinct))
    print(tr("    int4, mean |error| / mean |w|: {a:.1%} in groups of 32, {b:.1%} in groups of 64; on Gaussian weights of "
             "the same spread {c:.1%} and {d:.1%}", a=rel_error(w, 32), b=rel_error(w, 64), c=rel_error(gauss, 32),
             d=rel_error(gauss, 64)))
    # 组要整除每一层（这个秩上）的输入维：SmolLM2 的 hidden 是 576 = 4.5 × 128
    # en: a group must divide every layer's input dimension (on this rank): SmolLM2's hidden size is 576 = 4.5 × 128
    try:
        LLM(path, quantization="int4wo-128", **KW)
    except ValueError as e:
        print(tr("int4wo-128 is refused: {error}", error=e))


if __name__ == "__main__":
    int8_demo()
    int4_demo()
    pack_demo()
    engine_demo()
