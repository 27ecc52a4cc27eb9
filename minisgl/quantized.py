"""量化的权重进引擎（给定的机制，不是某一章要写的）：第 5.4 章的函数把每个线性层的权重量化，这里把结果装回引擎。

:class:`QuantizedWeight` 站在原来那块权重张量的位置上。各章的代码照旧调用 ``F.linear(x, self.weight, bias)``
（第 1.2 章的线性层、第 4.4 章的专家）和 ``F.embedding(ids, self.weight)``（与 LM head 共用权重的词嵌入）；PyTorch
发现参数里有一个带 ``__torch_function__`` 的对象，就把调用交给它（torchao 的量化张量也是这样进模型的）。所以前面
的章节不用知道量化：它在组装里（:mod:`minisgl.llm` 的 ``weights`` 零件）于加载之后发生。

乘法走哪条路：CPU 上、不超过 :data:`KERNEL_ROWS` 行（解码）时用 ``minisgl.kernel`` 的 C 内核，权重在寄存器里才变回
fp32；行数多（预填充）或不在 CPU 上时用第 5.4 章的参考矩阵乘（先还原成浮点数再乘）。两条路只差求和顺序。
量化哪些：每个线性层和混合专家的每个专家；LM head 总是 int8（每个输出通道一个 scale：它把隐藏状态变成每个词的分数，
4 位在这里损失最大，llama.cpp 的 Q4_0 也把输出层留在 6 位；权重与词嵌入共用时词嵌入跟着一起，查表时只还原查到的
那几行）；路由器（``gate``，决定 token 去哪个专家）不量化。融合的 C 解码（:mod:`minisgl.fused`）认得两种量化的权重。

en: Quantized weights in the engine (given machinery, not a chapter's task): chapter 5.4's functions quantize each linear
layer's weight, and this module puts the result back into the engine.

A :class:`QuantizedWeight` stands where the weight tensor stood. The chapters' code still calls
``F.linear(x, self.weight, bias)`` (chapter 1.2's linear layers, chapter 4.4's experts) and ``F.embedding(ids,
self.weight)`` (a word embedding shared with the LM head); PyTorch sees an argument with ``__torch_function__`` and hands
the call to it (torchao's quantized tensors enter models the same way). So earlier chapters need not know about
quantization: it happens in the assembly (:mod:`minisgl.llm`'s ``weights`` part), after loading.

Which path multiplies: on the CPU with at most :data:`KERNEL_ROWS` rows (decoding), ``minisgl.kernel``'s C kernels, the
weights turning into fp32 only in registers; with more rows (prefill) or off the CPU, chapter 5.4's reference matmul
(restore to floats, then multiply). The two differ only in the summation order. What is quantized: every linear layer and
every expert of a mixture of experts; the LM head always as int8 (one scale per output channel: it turns hidden states
into a score per word, where 4 bits lose the most, and llama.cpp's Q4_0 keeps its output layer at 6 bits too; a word
embedding sharing its weight follows, restoring only the rows looked up); the router (``gate``, which decides where
tokens go) is not. The fused C decode
(:mod:`minisgl.fused`) knows both quantized kinds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F

from minisgl import kernel
from minisgl.i18n import tr
from minisgl.quantization import (dequantize_int4, dequantize_int8, linear_int4, linear_int8, pack_int4, quantize_int4,
                                  quantize_int8, unpack_int4)
from minisgl.validation import parse_quantization

if TYPE_CHECKING:
    from minisgl.engine import Engine

__all__ = ["KERNEL_ROWS", "QuantizedWeight", "quantize_engine"]

#: 不超过这么多行的输入在 CPU 上走 C 内核（解码的批）；更多行还原整块权重交给参考矩阵乘（预填充，权重的读取已摊薄）。
#: en: inputs of at most this many rows take the C kernel on the CPU (decode batches); more rows restore the whole
#: en: weight for the reference matmul (prefill, where reading the weights is amortised already).
KERNEL_ROWS = 16


class QuantizedWeight:
    """一块（或一叠：混合专家的 ``[E, N, K]``）量化的权重，代替原来的张量。``method`` 是 ``"int8"`` 或 ``"int4"``；
    ``data`` 是 int8 的 ``[..., N, K]`` 或打包的 uint8 ``[..., N, K / 2]``；``scale`` 是 ``[..., N]``（int8）或
    ``[..., N, K / group_size]``（int4）；``offset`` 只有 int4 有。``shape`` 是原来那块权重的形状。

    en: One quantized weight (or a stack: a mixture of experts' ``[E, N, K]``) standing in for the tensor. ``method`` is
    ``"int8"`` or ``"int4"``; ``data`` is an int8 ``[..., N, K]`` or a packed uint8 ``[..., N, K / 2]``; ``scale`` is
    ``[..., N]`` (int8) or ``[..., N, K / group_size]`` (int4); only int4 has ``offset``. ``shape`` is the original
    weight's shape.
    """

    def __init__(self, method: str, data: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None,
                 group_size: int | None, float_dtype: torch.dtype = torch.float32) -> None:
        self.method, self.data, self.scale, self.offset, self.group_size = method, data, scale, offset, group_size
        self.float_dtype = float_dtype  # 原来那块权重的类型：查表还原出的行是这个类型 | en: the original weight's dtype, that of rows looked up
        k = data.shape[-1] * (2 if method == "int4" else 1)
        self.shape = torch.Size([*data.shape[:-1], k])

    @classmethod
    def quantize(cls, w: torch.Tensor, method: str, group_size: int | None) -> QuantizedWeight:
        """用第 5.4 章的函数量化 ``w``（二维，或一叠二维）。

        en: Quantize ``w`` (2-D, or a stack of 2-D) with chapter 5.4's functions.
        """
        if w.dim() == 3:
            parts = [cls.quantize(m, method, group_size) for m in w.unbind(0)]
            stack = lambda name: torch.stack([getattr(p, name) for p in parts])  # noqa: E731
            offset = None if method == "int8" else stack("offset")
            return cls(method, stack("data"), stack("scale"), offset, group_size, w.dtype)
        if method == "int8":
            q, scale = quantize_int8(w)
            return cls(method, q.contiguous(), scale.contiguous(), None, None, w.dtype)
        q, scale, offset = quantize_int4(w, group_size)
        return cls(method, pack_int4(q).contiguous(), scale.contiguous(), offset.contiguous(), group_size, w.dtype)

    # 让检查“能不能走 fp32 / bf16 内核”的代码（kernel.supports）看到一块不是浮点数的权重
    # en: so that code asking "can the fp32 / bf16 kernel take this" (kernel.supports) sees a non-float weight
    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    def dim(self) -> int:
        return len(self.shape)

    def is_contiguous(self) -> bool:
        return True

    def tensors(self) -> dict[str, torch.Tensor]:
        """存着的张量（按名字），算字节数用。

        en: The stored tensors by name, for counting bytes.
        """
        return {name: t for name, t in (("q", self.data), ("scale", self.scale), ("offset", self.offset)) if t is not None}

    def __getitem__(self, index: int) -> QuantizedWeight:
        """一叠里的第 ``index`` 块（混合专家按专家取）。

        en: Block ``index`` of a stack (a mixture of experts takes one expert).
        """
        offset = None if self.offset is None else self.offset[index]
        return QuantizedWeight(self.method, self.data[index], self.scale[index], offset, self.group_size, self.float_dtype)

    def dequantize(self) -> torch.Tensor:
        """还原成 fp32 的二维权重。

        en: Restore the 2-D weight in fp32.
        """
        if self.method == "int8":
            return dequantize_int8(self.data, self.scale)
        return dequantize_int4(unpack_int4(self.data), self.scale, self.offset, self.group_size)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """第 ``ids`` 行还原出来（词嵌入查表）：每一行有自己的 scale（和偏移），只还原查到的那几行。

        en: Rows ``ids`` restored (a word-embedding lookup): every row has its own scale (and offsets), so only the
        rows looked up are restored.
        """
        flat = ids.reshape(-1).long()
        offset = None if self.offset is None else self.offset[flat]
        part = QuantizedWeight(self.method, self.data[flat], self.scale[flat], offset, self.group_size)
        return part.dequantize().to(self.float_dtype).view(*ids.shape, self.shape[-1])

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x · Wᵀ + bias``：解码的几行在 CPU 上走 C 内核，其余走第 5.4 章的参考矩阵乘。

        en: ``x · Wᵀ + bias``: the few rows of a decode step take the C kernel on the CPU, anything else chapter 5.4's
        reference matmul.
        """
        k = self.shape[-1]
        if x.device.type == "cpu" and x.numel() <= KERNEL_ROWS * k and self._kernel_fits():
            if self.method == "int8":
                return kernel.q8_linear(x, self.data, self.scale, bias)
            return kernel.q4_linear(x, self.data, self.scale, self.offset, self.group_size, bias)
        if self.method == "int8":
            return linear_int8(x, self.data, self.scale, bias)
        return linear_int4(x, self.data, self.scale, self.offset, self.group_size, bias)

    def _kernel_fits(self) -> bool:
        """C 内核能算这块吗：编得出库；int8 的输入维是 8 的倍数（int4 的组总是 32 的倍数）。"""
        return kernel.available() and (self.method == "int4" or self.shape[-1] % 8 == 0)

    @classmethod
    def __torch_function__(cls, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = args
            return weight.linear(x, rest[0] if rest else kwargs.get("bias"))
        if func is F.embedding:
            ids, weight = args[:2]
            return weight.rows(ids)
        raise TypeError(tr("A quantized weight supports F.linear and F.embedding only, not {func}",
                           func=getattr(func, "__name__", func)))


def _targets(model: Any) -> list[tuple[str, Any, str]]:
    """要量化的 (名字, 算子, 属性)：每个线性层的 ``weight``，混合专家的 ``w13`` / ``w2``；路由器 ``gate`` 除外。"""
    from minisgl.layers import Linear

    found = []
    for prefix, op in model.named_ops():
        if isinstance(op, Linear) and not prefix.endswith(".gate"):
            found.append((prefix, op, "weight"))
        for attr in ("w13", "w2"):
            if isinstance(getattr(op, attr, None), torch.Tensor) and getattr(op, attr).dim() == 3:
                found.append((prefix, op, attr))
    return found


def _check_groups(targets: list[tuple[str, Any, str]], method: str, group: int | None, name: str) -> None:
    """量化之前查一遍每块权重的输入维（这个秩上的那一段）：int4 的组要整除它，不然抛 ValueError，说出能用的组。"""
    if method != "int4":
        return
    from minisgl.layers import LMHead

    dims = {prefix or attr: getattr(op, attr).shape[-1] for prefix, op, attr in targets if not isinstance(op, LMHead)}
    bad = {where: k for where, k in dims.items() if k % group}
    if bad:
        where, k = next(iter(bad.items()))
        fits = [g for g in (256, 128, 64, 32) if all(d % g == 0 for d in dims.values())]
        hint = tr("int4wo-{group} fits every layer", group=fits[0]) if fits else tr("no int4 group size fits every layer; use int8wo")
        raise ValueError(tr("{name}: groups of {group} columns do not divide {where}'s {k} input columns (the part on "
                            "this rank; a group is never split across ranks): {hint}", name=name, group=group,
                            where=where, k=k, hint=hint))


def quantize_engine(engine: Engine, name: str) -> int:
    """把 ``engine`` 的线性层和专家的权重量化成 ``name``（``int8wo`` 或 ``int4wo-G``），原来的浮点权重释放；返回量化了
    几块。CPU 快速路径另存的副本丢掉，融合的 C 解码和 CUDA 图按量化后的权重重新装上。

    en: Quantize ``engine``'s linear-layer and expert weights to ``name`` (``int8wo`` or ``int4wo-G``), releasing the
    float weights; return how many were quantized. Copies a fast CPU path kept are dropped, and the fused C decode and
    CUDA graphs are installed again over the quantized weights.
    """
    from minisgl.engine import model_nbytes
    from minisgl.layers import LMHead

    method, group = parse_quantization(name)
    targets = _targets(engine.model)
    _check_groups(targets, method, group, name)
    before = model_nbytes(engine.model)
    done: dict[int, QuantizedWeight] = {}  # 共用的一块（绑定的 LM head）只量化一次 | en: a shared weight (a tied LM head) is quantized once
    for _, op, attr in targets:
        w = getattr(op, attr)
        if id(w) not in done:
            how = "int8" if isinstance(op, LMHead) else method  # LM head 总是 8 位 | en: the LM head always keeps 8 bits
            split = how == "int8" and _row_split(engine, op, attr)
            done[id(w)] = _quantize_split_rows(w) if split else QuantizedWeight.quantize(w, how, group)
        qw = done[id(w)]
        setattr(op, attr, qw)
        for part, t in qw.tensors().items():  # 作为算子的张量属性登记：模型的字节数（model_nbytes）算得到它们
            setattr(op, f"{attr}_{part}", t)
        if hasattr(op, "_packed"):  # 第 1.2 章为快速路径另存的副本（和它选的路）不再有用 | en: chapter 1.2's fast-path copy is of no use now
            op._packed, op._kernel = None, False
    for _, op in engine.model.named_ops():  # 与 LM head 共用权重的词嵌入 | en: a word embedding sharing the LM head's weight
        w = vars(op).get("weight")
        if isinstance(w, torch.Tensor) and id(w) in done:
            op.weight = done[id(w)]
    kernel.trim_heap()  # 浮点的权重已经放掉：把空出来的页还给系统，进程占的内存才真的变小 | en: the float weights are gone: hand the pages back so the process really shrinks
    _reinstall(engine, tr("weights quantized as {name}: {after:.0f} MB, from {before:.0f} MB", name=name,
                          after=model_nbytes(engine.model) / 1e6, before=before / 1e6))
    return len(done)


def _row_split(engine: Engine, op: Any, attr: str) -> bool:
    """这块权重的每一行是不是被切给了几个秩（按输入切的线性层，张量并行时每个专家切开时的 ``w2``）。"""
    if getattr(engine.model, "tp_size", 1) == 1:
        return False
    if attr == "w2":
        return engine.config.ep_size == 1
    from minisgl.tensor_parallel import RowParallelLinear

    return isinstance(op, RowParallelLinear)


def _quantize_split_rows(w: torch.Tensor) -> QuantizedWeight:
    """int8 的一行切在几个秩上：scale 要按整行（与一个秩时相同），所以先在各秩间取每行绝对值的最大值，作为多出来的
    一列交给第 5.4 章的函数（它就选出整行的 scale），量化后去掉这一列。每个秩的整数与一个秩时它那几列的整数相同。

    en: An int8 row split over ranks: the scale must cover the whole row (as on one rank), so each row's largest magnitude
    is taken over the ranks and handed to chapter 5.4's function as one extra column (which makes it choose the whole
    row's scale), and that column is dropped after quantizing. Each rank's integers equal those of its columns on one rank.
    """
    import torch.distributed as dist

    from minisgl.distributed import get_tp_comm

    peak = w.abs().amax(dim=-1, keepdim=True).float()
    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=get_tp_comm().group)
    whole = QuantizedWeight.quantize(torch.cat([w.float(), peak], dim=-1), "int8", None)
    return QuantizedWeight("int8", whole.data[..., :-1].contiguous(), whole.scale, None, None, w.dtype)


def _reinstall(engine: Engine, how: str) -> None:
    """引擎建好时装上的、读着原来那些权重的东西（融合解码、CUDA 图）卸下，按量化后的权重重新决定、重新装；``how``
    接在解码路径那句话后面（服务器启动时打印）。"""
    from minisgl.fused import FusedDecoder, plan_decode
    from minisgl.graph import GraphRunner

    vars(engine.model).pop("forward", None)
    vars(engine.attn_backend).pop("prepare_metadata", None)
    requested = engine.config.cpu_fused_decode
    engine.fused_decode, path = plan_decode(engine, requested)
    engine.decode_path = tr("{path}; {how}", path=path, how=how)
    if engine.graph_runner is not None:
        engine.graph_runner = GraphRunner(engine, engine.graph_mode, engine.config.cuda_graph_max_bs)
    engine.fused_decoder = FusedDecoder(engine) if engine.fused_decode else None
