# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint quantization <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint quantization <task>` gives the next hint.
"""第 5.4 章 quantization：只量化权重——每个权重存成 8 位或 4 位的整数，乘之前再变回浮点数。

小批次解码每一步要把全部权重从内存读一遍，读的字节数决定了一步的下限（见屋顶线那一页）。fp32 每个权重 4 个字节；
存成 int8 只读 1 个，int4 只读半个——一步能快到接近 4 倍、8 倍，只要把整数变回浮点数的那点计算藏在读内存的时间里。
激活（x）仍是浮点数：这叫“只量化权重”（weight-only），与 llama.cpp 的 Q8_0 / Q4_0、torchao 的 int8wo / int4wo 是一类。

两种做法：

- **int8，每个输出通道一个 scale**（对称）：第 n 行的 ``scale[n] = max|W[n]| / 127``，``q = round(W / scale)``，
  落在 [-127, 127]。一整行共用一个 scale，所以 ``y[n] = scale[n] · Σ_k x[k] q[n, k]``：先按整数累加，最后乘一次。
- **int4，按组**（非对称，带偏移）：每行每 ``group_size`` 个输入列一组，组内的最小值到最大值等分成 15 份：
  ``scale = (max - min) / 15``，``offset = min``，``q = round((W - offset) / scale)``（落在 [0, 15]）；还原
  ``W ≈ q · scale + offset``（llama.cpp 的 Q4_1、torchao 的浮点零点都是这个形式）。4 位只有 16 个值，一整行一个 scale
  太粗：一个大的离群值会让整行的其余权重都挤进一两个值里，所以按组；偏移让不对称的组（比如全是正数）也用上全部
  16 个值——只有 scale、没有偏移的对称做法，全是正数的组一半的值白白浪费在负数上。

int4 两个值放一个字节，排法与 llama.cpp 的 Q4_0 相同：每 32 列一块 16 个字节，第 i 个字节的低 4 位是这一块的第 i 列、
高 4 位是第 i + 16 列。一次读 16 个字节，与 15 按位与、右移 4 位，就得到两段各 16 个连续的列，向量指令不用任何重排。

en: Chapter 5.4 quantization: weight-only quantization — every weight stored as an 8- or 4-bit integer and turned back
into a float just before it is multiplied.

A small-batch decode step reads every weight from memory once, and the bytes read set the step's lower bound (see the
roofline page). fp32 is 4 bytes per weight; int8 reads 1, int4 half of one — a step can get close to 4× and 8× faster,
as long as turning integers back into floats hides inside the time spent reading memory. The activations (x) stay
floating point: this is weight-only quantization, the same kind as llama.cpp's Q8_0 / Q4_0 and torchao's int8wo / int4wo.

Two schemes:

- **int8, one scale per output channel** (symmetric): row n has ``scale[n] = max|W[n]| / 127``, ``q = round(W / scale)``
  in [-127, 127]. A whole row shares one scale, so ``y[n] = scale[n] · Σ_k x[k] q[n, k]``: accumulate the integers,
  multiply once at the end.
- **int4 in groups** (asymmetric, with an offset): every ``group_size`` input columns of a row form a group, and the
  group's range from its minimum to its maximum is cut into 15 steps: ``scale = (max - min) / 15``, ``offset = min``,
  ``q = round((W - offset) / scale)`` (in [0, 15]); restored as ``W ≈ q · scale + offset`` (the form of llama.cpp's Q4_1
  and of torchao's floating-point zero point). Four bits have only 16 values, so one scale per row is too coarse: one
  large outlier would squeeze the rest of the row into one or two values. Hence groups; and the offset lets a lopsided
  group (all positive, say) use all 16 values — a symmetric scheme with a scale and no offset wastes half its values on
  negatives such a group never has.

int4 puts two values in a byte, laid out as llama.cpp's Q4_0: every 32 columns make a block of 16 bytes, and byte i
holds column i of the block in its low 4 bits and column i + 16 in its high 4 bits. Read 16 bytes, AND with 15 and
shift right by 4, and you have two runs of 16 consecutive columns, with no shuffling for the vector instructions.
"""

from __future__ import annotations

from minisgl.course.skeleton import TaskNotDone

import torch
import torch.nn.functional as F

from minisgl.i18n import tr

#: int8 的整数范围是 [-INT8_MAX, INT8_MAX]（对称：不用 -128，正负两边一样宽）。
#: en: int8 values lie in [-INT8_MAX, INT8_MAX] (symmetric: -128 is not used, so both sides are equally wide).
INT8_MAX = 127
#: int4 的整数范围是 [0, INT4_MAX]。
#: en: int4 values lie in [0, INT4_MAX].
INT4_MAX = 15
#: int4 打包的一块有几列（Q4_0 的排法：一块 16 个字节）；组的大小要是它的倍数。
#: en: how many columns one packed int4 block holds (Q4_0's layout: 16 bytes per block); group sizes are multiples of it.
INT4_BLOCK = 32


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` 的浮点权重 → (``q``：``[N, K]`` int8，``scale``：``[N]`` fp32)，每个输出行一个 scale，对称。

    en: A ``[N, K]`` float weight → (``q``: ``[N, K]`` int8, ``scale``: ``[N]`` fp32), one scale per output row,
    symmetric.
    """
    # TODO 任务 quantize_int8：返回 (q, scale)：每一行自己的 scale 让这一行绝对值最大的权重正好落在 ±INT8_MAX 上；q 是 int8，取最近的整数，不超出 [-INT8_MAX, INT8_MAX]；scale 是 fp32 的 [N]。全是 0 的一行也要给出有限的 scale（q 全为 0）
    # TODO task quantize_int8: return (q, scale): each row's own scale puts the row's largest weight in absolute value exactly on ±INT8_MAX; q is int8, the nearest integer, never outside [-INT8_MAX, INT8_MAX]; scale is an fp32 [N]. A row of zeros too must get a finite scale (and q all 0)
    raise TaskNotDone("quantization", "quantize_int8")


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """:func:`quantize_int8` 的逆（近似）：fp32 的 ``[N, K]``。

    en: The (approximate) inverse of :func:`quantize_int8`: an fp32 ``[N, K]``.
    """
    # TODO 任务 dequantize_int8：返回 fp32 的 [N, K]：每个整数乘上它那一行的缩放系数
    # TODO task dequantize_int8: return an fp32 [N, K]: each integer times its row's scaling factor
    raise TaskNotDone("quantization", "dequantize_int8")


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[N, K]`` 的浮点权重 → (``q``：``[N, K]`` uint8，值在 [0, 15]；``scale``、``offset``：``[N, K / group_size]``
    的 fp32)，``W ≈ q · scale + offset``。第 n 行第 g 组是第 ``g·group_size`` 到 ``(g+1)·group_size - 1`` 列。

    en: A ``[N, K]`` float weight → (``q``: ``[N, K]`` uint8 with values in [0, 15]; ``scale``, ``offset``: fp32
    ``[N, K / group_size]``), ``W ≈ q · scale + offset``. Group g of row n is columns ``g·group_size`` to
    ``(g+1)·group_size - 1``.
    """
    if group_size <= 0 or w.shape[1] % group_size:
        raise ValueError(tr("group_size {group} does not divide the {k} input columns", group=group_size, k=w.shape[1]))
    # TODO 任务 quantize_int4：返回 (q, scale, offset)：每行每组各自的 scale 把这一组从最小值到最大值的范围等分成 INT4_MAX 份，offset 是这一组的最小值（一个浮点数，对应 q = 0），q 是离 (w - offset) / scale 最近的整数，夹在 [0, INT4_MAX]；q 是 uint8，scale 和 offset 是 fp32。全组相等（范围为 0）时也要给出有限的 scale
    # TODO task quantize_int4: return (q, scale, offset): each group of each row gets its own scale that cuts the group's range from its minimum to its maximum into INT4_MAX steps; offset is the group's minimum (a float, what q = 0 stands for), and q is the integer nearest (w - offset) / scale, clamped to [0, INT4_MAX]; q is uint8, scale and offset are fp32. A group whose values are all equal (range 0) must also get a finite scale
    raise TaskNotDone("quantization", "quantize_int4")


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group_size: int) -> torch.Tensor:
    """:func:`quantize_int4` 的逆（近似）：fp32 的 ``[N, K]``，``q`` 是没打包的 ``[N, K]``。

    en: The (approximate) inverse of :func:`quantize_int4`: an fp32 ``[N, K]``, ``q`` being the unpacked ``[N, K]``.
    """
    # TODO 任务 dequantize_int4：返回 fp32 的 [N, K]：每个整数乘上它那一组的缩放系数，再加上那一组的偏移
    # TODO task dequantize_int4: return an fp32 [N, K]: each integer times its group's scaling factor, plus its group's shift
    raise TaskNotDone("quantization", "dequantize_int4")


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` 的 4 位值（uint8，0..15）→ ``[N, K / 2]`` 的字节，Q4_0 的排法（见模块文档）。

    en: ``[N, K]`` 4-bit values (uint8, 0..15) → ``[N, K / 2]`` bytes in Q4_0's layout (see the module docstring).
    """
    n, k = q.shape
    if k % INT4_BLOCK:
        raise ValueError(tr("{k} columns are not a multiple of {block}", k=k, block=INT4_BLOCK))
    # TODO 任务 pack_int4：返回 [N, K / 2] 的 uint8：每 INT4_BLOCK 列一块，块里第 i 个字节的低 4 位是这一块的第 i 列，高 4 位是第 i + INT4_BLOCK / 2 列
    # TODO task pack_int4: return a [N, K / 2] uint8: every INT4_BLOCK columns make a block, and byte i of a block holds the block's column i in its low 4 bits and column i + INT4_BLOCK / 2 in its high 4 bits
    raise TaskNotDone("quantization", "pack_int4")


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """:func:`pack_int4` 的逆：``[N, K / 2]`` 的字节 → ``[N, K]`` 的 4 位值（uint8）。

    en: The inverse of :func:`pack_int4`: ``[N, K / 2]`` bytes → ``[N, K]`` 4-bit values (uint8).
    """
    # TODO 任务 unpack_int4：返回 [N, K] 的 uint8：把每个字节的低 4 位和高 4 位放回它们原来的列
    # TODO task unpack_int4: return a [N, K] uint8: put each byte's low and high 4 bits back in their original columns
    raise TaskNotDone("quantization", "unpack_int4")


def linear_int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """参考的矩阵乘：``x · dequantize_int8(q, scale)ᵀ + bias``，结果与 ``x`` 同类型。快速的内核（给定，见
    ``minisgl.kernel``）拿它来对。

    en: The reference matmul: ``x · dequantize_int8(q, scale)ᵀ + bias``, in ``x``'s dtype. The fast kernel (given, see
    ``minisgl.kernel``) is checked against it.
    """
    # TODO 任务 linear_int8：返回 x 乘以还原后的权重的转置再加偏置向量（可以没有），与 x 同类型、同形状（最后一维换成 N）。每一行共用一个缩放系数：不必先还原整个矩阵，可以先乘整数、最后把每个输出列乘上它的系数
    # TODO task linear_int8: return x times the transpose of the restored weight plus the offset vector (which may be absent), with x's type and shape (the last dimension becoming N). A whole row shares one scaling factor: there is no need to restore the whole matrix first; multiply by the integers and apply each output column's factor at the end
    raise TaskNotDone("quantization", "linear_int8")


def linear_int4(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group_size: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """参考的矩阵乘：``x · W_int4ᵀ + bias``，``W_int4`` 是打包的 ``packed`` 按组还原的权重；结果与 ``x`` 同类型。

    en: The reference matmul: ``x · W_int4ᵀ + bias``, ``W_int4`` being the weight restored group by group from the packed
    ``packed``; the result has ``x``'s dtype.
    """
    # TODO 任务 linear_int4：返回 x 乘以打包的 int4 权重（解包、按组还原后）的转置再加偏置（可以没有），与 x 同类型。给定：本章前面几个函数
    # TODO task linear_int4: return x times the transpose of the packed int4 weight (unpacked and restored group by group) plus the bias (which may be absent), in x's dtype. Given: this chapter's earlier functions
    raise TaskNotDone("quantization", "linear_int4")
