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
    # >>> TASK quantize_int8: 返回 (q, scale)：每一行自己的 scale 让这一行绝对值最大的权重正好落在 ±INT8_MAX 上；q 是 int8，取最近的整数，不超出 [-INT8_MAX, INT8_MAX]；scale 是 fp32 的 [N]。全是 0 的一行也要给出有限的 scale（q 全为 0）
    # en: return (q, scale): each row's own scale puts the row's largest weight in absolute value exactly on ±INT8_MAX; q is int8, the nearest integer, never outside [-INT8_MAX, INT8_MAX]; scale is an fp32 [N]. A row of zeros too must get a finite scale (and q all 0)
    # hint1: 先在 fp32 里算（bf16 的除法会再丢精度）。“最近的整数”是 torch.round，不是 .to(torch.int8)（那是向零截断）。最大值为 0 时除以 0：给它一个不为 0 的 scale。
    # en1: Compute in fp32 (division in bf16 loses more precision). "Nearest integer" is torch.round, not .to(torch.int8) (which truncates toward zero).
    # en1: A maximum of 0 divides by 0: give that row a non-zero scale.
    # hint2: 1. w = w.float()；scale = w.abs().amax(dim=1) / INT8_MAX；
    # hint2: 2. scale = torch.where(scale > 0, scale, torch.ones_like(scale))；
    # hint2: 3. q = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)；return q, scale。
    # en2: 1. w = w.float(); scale = w.abs().amax(dim=1) / INT8_MAX;
    # en2: 2. scale = torch.where(scale > 0, scale, torch.ones_like(scale));
    # en2: 3. q = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8); return q, scale.
    w = w.float()
    scale = w.abs().amax(dim=1) / INT8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale
    # <<< TASK


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """:func:`quantize_int8` 的逆（近似）：fp32 的 ``[N, K]``。

    en: The (approximate) inverse of :func:`quantize_int8`: an fp32 ``[N, K]``.
    """
    # >>> TASK dequantize_int8: 返回 fp32 的 [N, K]：每个整数乘上它那一行的缩放系数
    # en: return an fp32 [N, K]: each integer times its row's scaling factor
    # hint1: scale 是 [N]，要沿着行广播到 [N, K]。
    # en1: scale is [N] and must broadcast along the rows to [N, K].
    # hint2: return q.float() * scale[:, None]。
    # en2: return q.float() * scale[:, None].
    return q.float() * scale[:, None]
    # <<< TASK


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[N, K]`` 的浮点权重 → (``q``：``[N, K]`` uint8，值在 [0, 15]；``scale``、``offset``：``[N, K / group_size]``
    的 fp32)，``W ≈ q · scale + offset``。第 n 行第 g 组是第 ``g·group_size`` 到 ``(g+1)·group_size - 1`` 列。

    en: A ``[N, K]`` float weight → (``q``: ``[N, K]`` uint8 with values in [0, 15]; ``scale``, ``offset``: fp32
    ``[N, K / group_size]``), ``W ≈ q · scale + offset``. Group g of row n is columns ``g·group_size`` to
    ``(g+1)·group_size - 1``.
    """
    if group_size <= 0 or w.shape[1] % group_size:
        raise ValueError(tr("group_size {group} does not divide the {k} input columns", group=group_size, k=w.shape[1]))
    # >>> TASK quantize_int4: 返回 (q, scale, offset)：每行每组各自的 scale 把这一组从最小值到最大值的范围等分成 INT4_MAX 份，offset 是这一组的最小值（一个浮点数，对应 q = 0），q 是离 (w - offset) / scale 最近的整数，夹在 [0, INT4_MAX]；q 是 uint8，scale 和 offset 是 fp32。全组相等（范围为 0）时也要给出有限的 scale
    # en: return (q, scale, offset): each group of each row gets its own scale that cuts the group's range from its minimum to its maximum into INT4_MAX steps; offset is the group's minimum (a float, what q = 0 stands for), and q is the integer nearest (w - offset) / scale, clamped to [0, INT4_MAX]; q is uint8, scale and offset are fp32. A group whose values are all equal (range 0) must also get a finite scale
    # hint1: 把 [N, K] 看成 [N, K / group_size, group_size]，每组的最小、最大值沿最后一维取；scale 和 offset 是每组一个数，沿最后一维广播回去。
    # en1: View [N, K] as [N, K / group_size, group_size] and take each group's minimum and maximum along the last dimension;
    # en1: scale and offset are one number per group, broadcast back along the last dimension.
    # hint2: 1. n, k = w.shape；g = w.float().reshape(n, k // group_size, group_size)；lo, hi = g.amin(-1), g.amax(-1)；
    # hint2: 2. scale = (hi - lo) / INT4_MAX；scale = torch.where(scale > 0, scale, torch.ones_like(scale))；
    # hint2: 3. q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, INT4_MAX)；
    # hint2: 4. return q.reshape(n, k).to(torch.uint8), scale, lo。
    # en2: 1. n, k = w.shape; g = w.float().reshape(n, k // group_size, group_size); lo, hi = g.amin(-1), g.amax(-1);
    # en2: 2. scale = (hi - lo) / INT4_MAX; scale = torch.where(scale > 0, scale, torch.ones_like(scale));
    # en2: 3. q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, INT4_MAX);
    # en2: 4. return q.reshape(n, k).to(torch.uint8), scale, lo.
    n, k = w.shape
    g = w.float().reshape(n, k // group_size, group_size)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = (hi - lo) / INT4_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, INT4_MAX)
    return q.reshape(n, k).to(torch.uint8), scale, lo
    # <<< TASK


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group_size: int) -> torch.Tensor:
    """:func:`quantize_int4` 的逆（近似）：fp32 的 ``[N, K]``，``q`` 是没打包的 ``[N, K]``。

    en: The (approximate) inverse of :func:`quantize_int4`: an fp32 ``[N, K]``, ``q`` being the unpacked ``[N, K]``.
    """
    # >>> TASK dequantize_int4: 返回 fp32 的 [N, K]：每个整数乘上它那一组的缩放系数，再加上那一组的偏移
    # en: return an fp32 [N, K]: each integer times its group's scaling factor, plus its group's shift
    # hint1: 同样把 q 看成 [N, 组数, group_size]，两个每组一个的数沿最后一维广播；先转成浮点数再算。
    # en1: Again view q as [N, groups, group_size] and broadcast the two per-group numbers along the last dimension; convert to float first.
    # hint2: 1. n, k = q.shape；g = q.float().reshape(n, k // group_size, group_size)；
    # hint2: 2. return (g * scale[..., None] + offset[..., None]).reshape(n, k)。
    # en2: 1. n, k = q.shape; g = q.float().reshape(n, k // group_size, group_size);
    # en2: 2. return (g * scale[..., None] + offset[..., None]).reshape(n, k).
    n, k = q.shape
    g = q.float().reshape(n, k // group_size, group_size)
    return (g * scale[..., None] + offset[..., None]).reshape(n, k)
    # <<< TASK


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` 的 4 位值（uint8，0..15）→ ``[N, K / 2]`` 的字节，Q4_0 的排法（见模块文档）。

    en: ``[N, K]`` 4-bit values (uint8, 0..15) → ``[N, K / 2]`` bytes in Q4_0's layout (see the module docstring).
    """
    n, k = q.shape
    if k % INT4_BLOCK:
        raise ValueError(tr("{k} columns are not a multiple of {block}", k=k, block=INT4_BLOCK))
    # >>> TASK pack_int4: 返回 [N, K / 2] 的 uint8：每 INT4_BLOCK 列一块，块里第 i 个字节的低 4 位是这一块的第 i 列，高 4 位是第 i + INT4_BLOCK / 2 列
    # en: return a [N, K / 2] uint8: every INT4_BLOCK columns make a block, and byte i of a block holds the block's column i in its low 4 bits and column i + INT4_BLOCK / 2 in its high 4 bits
    # hint1: 把 [N, K] 看成 [N, 块数, 2, 16]：第 2 维的 0 是每块的前一半（低 4 位），1 是后一半（高 4 位，左移 4 位）。
    # en1: View [N, K] as [N, blocks, 2, 16]: index 0 of the third dimension is each block's first half (the low 4 bits), 1 its second half (the high 4 bits, shifted left by 4).
    # hint2: 1. b = q.reshape(n, k // INT4_BLOCK, 2, INT4_BLOCK // 2)；
    # hint2: 2. return torch.bitwise_or(b[:, :, 0], b[:, :, 1] << 4).reshape(n, k // 2)。
    # en2: 1. b = q.reshape(n, k // INT4_BLOCK, 2, INT4_BLOCK // 2);
    # en2: 2. return torch.bitwise_or(b[:, :, 0], b[:, :, 1] << 4).reshape(n, k // 2).
    b = q.reshape(n, k // INT4_BLOCK, 2, INT4_BLOCK // 2)
    return (b[:, :, 0] | (b[:, :, 1] << 4)).reshape(n, k // 2)
    # <<< TASK


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """:func:`pack_int4` 的逆：``[N, K / 2]`` 的字节 → ``[N, K]`` 的 4 位值（uint8）。

    en: The inverse of :func:`pack_int4`: ``[N, K / 2]`` bytes → ``[N, K]`` 4-bit values (uint8).
    """
    # >>> TASK unpack_int4: 返回 [N, K] 的 uint8：把每个字节的低 4 位和高 4 位放回它们原来的列
    # en: return a [N, K] uint8: put each byte's low and high 4 bits back in their original columns
    # hint1: 低 4 位是与 15 按位与，高 4 位是右移 4 位；两半在每块里是前后两段，不是交错的。
    # en1: The low 4 bits are an AND with 15, the high 4 bits a right shift by 4; within a block the two halves are the first and second run, not interleaved.
    # hint2: 1. n, half = packed.shape；b = packed.reshape(n, half // 16, 1, 16)；
    # hint2: 2. return torch.cat([b & 15, b >> 4], dim=2).reshape(n, 2 * half)。
    # en2: 1. n, half = packed.shape; b = packed.reshape(n, half // 16, 1, 16);
    # en2: 2. return torch.cat([b & 15, b >> 4], dim=2).reshape(n, 2 * half).
    n, half = packed.shape
    b = packed.reshape(n, half // (INT4_BLOCK // 2), 1, INT4_BLOCK // 2)
    return torch.cat([b & 15, b >> 4], dim=2).reshape(n, 2 * half)
    # <<< TASK


def linear_int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """参考的矩阵乘：``x · dequantize_int8(q, scale)ᵀ + bias``，结果与 ``x`` 同类型。快速的内核（给定，见
    ``minisgl.kernel``）拿它来对。

    en: The reference matmul: ``x · dequantize_int8(q, scale)ᵀ + bias``, in ``x``'s dtype. The fast kernel (given, see
    ``minisgl.kernel``) is checked against it.
    """
    # >>> TASK linear_int8: 返回 x 乘以还原后的权重的转置再加偏置向量（可以没有），与 x 同类型、同形状（最后一维换成 N）。每一行共用一个缩放系数：不必先还原整个矩阵，可以先乘整数、最后把每个输出列乘上它的系数
    # en: return x times the transpose of the restored weight plus the offset vector (which may be absent), with x's type and shape (the last dimension becoming N). A whole row shares one scaling factor: there is no need to restore the whole matrix first; multiply by the integers and apply each output column's factor at the end
    # hint1: 在 fp32 里算：x.float() @ q.float().T 的第 n 列乘 scale[n]；偏置最后加；最后转回 x 的类型。
    # en1: Compute in fp32: column n of x.float() @ q.float().T times scale[n]; add the bias last; convert back to x's dtype at the end.
    # hint2: 1. y = (x.float() @ q.float().T) * scale；
    # hint2: 2. if bias is not None：y = y + bias.float()；
    # hint2: 3. return y.to(x.dtype)。
    # en2: 1. y = (x.float() @ q.float().T) * scale;
    # en2: 2. if bias is not None: y = y + bias.float();
    # en2: 3. return y.to(x.dtype).
    y = (x.float() @ q.float().T) * scale
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
    # <<< TASK


def linear_int4(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group_size: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """参考的矩阵乘：``x · W_int4ᵀ + bias``，``W_int4`` 是打包的 ``packed`` 按组还原的权重；结果与 ``x`` 同类型。

    en: The reference matmul: ``x · W_int4ᵀ + bias``, ``W_int4`` being the weight restored group by group from the packed
    ``packed``; the result has ``x``'s dtype.
    """
    # >>> TASK linear_int4: 返回 x 乘以打包的 int4 权重（解包、按组还原后）的转置再加偏置（可以没有），与 x 同类型。给定：本章前面几个函数
    # en: return x times the transpose of the packed int4 weight (unpacked and restored group by group) plus the bias (which may be absent), in x's dtype. Given: this chapter's earlier functions
    # hint1: 参考实现要的是对，不是快：解包、还原成 fp32 的矩阵，在 fp32 里乘，最后转回 x 的类型。
    # en1: The reference needs to be right, not fast: unpack, restore an fp32 matrix, multiply in fp32, convert back to x's dtype.
    # hint2: 1. w = dequantize_int4(unpack_int4(packed), scale, offset, group_size)；
    # hint2: 2. return F.linear(x.float(), w, None if bias is None else bias.float()).to(x.dtype)。
    # en2: 1. w = dequantize_int4(unpack_int4(packed), scale, offset, group_size);
    # en2: 2. return F.linear(x.float(), w, None if bias is None else bias.float()).to(x.dtype).
    w = dequantize_int4(unpack_int4(packed), scale, offset, group_size)
    return F.linear(x.float(), w, None if bias is None else bias.float()).to(x.dtype)
    # <<< TASK
