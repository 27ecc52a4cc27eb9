"""第 1.2 章 layers：不依赖 ``nn.Module`` 的算子层。

每个算子是一个普通对象：权重是它的张量属性（名字不以 ``_`` 开头），前向是普通方法。
算子自己知道权重的形状和怎样从检查点里装载——合并线性层把 HF 的 q/k/v（或 gate/up）
几个张量按行拼进同一块权重，一次矩阵乘法算完。没有 autograd、没有 hook，推理只要这些。

线性层有一条参考路径和两条 CPU 快速路径：``F.linear`` 是易读的参考实现；在 CPU 上，加载完权重后可以把
权重一次性重排成 oneDNN 喜欢的布局，或者交给本项目自己的小批量内核，或者每种形状量一下哪条快
（:func:`pack_linear_weights`），之后每步解码快好几倍。

en: Chapter 1.2 layers: operator layers without ``nn.Module``.

Each operator is a plain object: its weights are tensor attributes (names not starting with ``_``) and its forward is an
ordinary method. An operator knows its weights' shapes and how to load them from a checkpoint: a merged linear layer
stacks HF's q/k/v (or gate/up) tensors row-wise into one weight and computes them in a single matrix multiplication. No
autograd, no hooks: inference needs only this.

A linear layer has one reference path and two fast CPU paths: ``F.linear`` is the readable reference; on the CPU, once
the weights are loaded, they can be reordered once into the layout oneDNN prefers, or handed to this project's own
small-batch kernel, or each shape can measure which of the two is faster (:func:`pack_linear_weights`), after which each
decode step is several times faster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from minisgl import kernel
from minisgl.i18n import tr
from minisgl.core import get_global_ctx


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@dataclass(frozen=True)
class WeightSlot:
    """检查点里的一个张量该装到哪里：哪个算子的哪个属性，合并权重里的第几片。

    en: Where one checkpoint tensor goes: which attribute of which operator, and which shard of a merged weight.
    """

    op: BaseOP
    attr: str
    shard: int = 0


class BaseOP:
    """算子基类：遍历子算子、列出权重、按检查点名字装载权重。

    en: Operator base class: walks the child operators, lists the weights, loads weights by checkpoint name.
    """

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def children(self) -> Iterator[tuple[str, BaseOP]]:
        """子算子：属性里的 BaseOP，或 BaseOP 的列表（如解码层列表），名字不以 ``_`` 开头。

        en: Child operators: attributes that are a BaseOP or a list of BaseOP (such as the list of decoder layers), with
        names not starting with ``_``.
        """
        for name, value in vars(self).items():
            if name.startswith("_"):
                continue
            if isinstance(value, BaseOP):
                yield name, value
            elif isinstance(value, list) and all(isinstance(v, BaseOP) for v in value):
                for i, op in enumerate(value):
                    yield f"{name}.{i}", op

    def named_ops(self, prefix: str = "") -> Iterator[tuple[str, BaseOP]]:
        yield prefix, self
        for name, child in self.children():
            yield from child.named_ops(_join(prefix, name))

    def own_weights(self) -> dict[str, torch.Tensor]:
        return {n: v for n, v in vars(self).items() if not n.startswith("_") and isinstance(v, torch.Tensor)}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """全部权重，按本项目自己的名字（合并后的 ``qkv_proj`` 等）。

        en: All weights, by this project's own names (the merged ``qkv_proj`` and so on).
        """
        return {_join(p, n): w for p, op in self.named_ops() for n, w in op.own_weights().items()}

    def checkpoint_slots(self) -> dict[str, WeightSlot]:
        """整棵算子树：HF 检查点里的张量名 → 装到哪里。

        en: The whole operator tree: tensor name in the HF checkpoint -> where it goes.
        """
        return {name: slot for prefix, op in self.named_ops() for name, slot in op.own_slots(prefix).items()}

    def own_slots(self, prefix: str) -> dict[str, WeightSlot]:
        """本算子自己的权重在检查点里叫什么。默认与本项目的名字相同；合并线性层会改写。

        en: What this operator's own weights are called in the checkpoint. By default the same as this project's names;
        merged linear layers override it.
        """
        return {_join(prefix, n): WeightSlot(self, n) for n in self.own_weights()}

    def load_weight(self, attr: str, tensor: torch.Tensor, shard: int = 0) -> None:
        """把检查点里的一个张量拷进自己的权重（形状不对就抛 ValueError）。

        en: Copy one checkpoint tensor into this operator's weight (ValueError on a wrong shape).
        """
        target = getattr(self, attr)
        check_shape(target, tensor)
        target.copy_(tensor)

    def pack(self) -> None:
        """为当前设备准备更快的权重布局；默认什么也不做（见 :class:`Linear`）。

        en: Prepare a faster weight layout for the current device; does nothing by default (see :class:`Linear`).
        """


def check_shape(target: torch.Tensor, tensor: torch.Tensor) -> None:
    if tuple(target.shape) != tuple(tensor.shape):
        raise ValueError(tr(
            "Shape mismatch: the model expects {expected}, the checkpoint has {got}",
            expected=tuple(target.shape), got=tuple(tensor.shape),
        ))


# ----------------------------------------------------------------------------- 线性层
# en: ----------------------------------------------------------------------------- linear layers


def fast_linear_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """CPU 上的 oneDNN 快速路径是否可用：fp32 总可以，bf16 要 CPU 支持。

    en: Whether the oneDNN fast path is available on the CPU: always for fp32; bf16 needs CPU support.
    """
    return device.type == "cpu" and kernel.onednn_supports(dtype)


class Linear(BaseOP):
    """``y = x Wᵀ + b``。``output_sizes`` 有多段时是合并线性层，``shard_names`` 是各段在 HF 检查点里的名字。

    例如注意力的 ``qkv_proj``：``output_sizes=[q, kv, kv]``、``shard_names=["q_proj", "k_proj", "v_proj"]``，
    检查点里的 ``...self_attn.k_proj.weight`` 就装进 ``qkv_proj.weight`` 的第 q..q+kv 行。

    en: ``y = x Wᵀ + b``. With several ``output_sizes`` it is a merged linear layer, and ``shard_names`` are the parts'
    names in the HF checkpoint.

    For example attention's ``qkv_proj``: ``output_sizes=[q, kv, kv]``, ``shard_names=["q_proj", "k_proj", "v_proj"]``;
    the checkpoint's ``...self_attn.k_proj.weight`` goes into rows q..q+kv of ``qkv_proj.weight``.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: int | list[int],
        *,
        bias: bool = False,
        shard_names: list[str] | None = None,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.output_sizes = [output_sizes] if isinstance(output_sizes, int) else list(output_sizes)
        if shard_names is not None and len(shard_names) != len(self.output_sizes):
            raise ValueError(tr("shard_names must have as many entries as output_sizes has shards"))
        out = sum(self.output_sizes)
        self.weight = torch.empty(out, input_size, dtype=dtype, device=device)
        self.bias = torch.empty(out, dtype=dtype, device=device) if bias else None
        self._shard_names = shard_names
        # oneDNN 布局的权重副本（不透明张量，不能切片）；self.weight 仍是原样的那块
        # en: a copy of the weight in oneDNN's layout (an opaque tensor that cannot be sliced); self.weight stays as it is
        self._packed: torch.Tensor | None = None
        # 前向走 minisgl.kernel 的小批量内核（权重原样不动）
        # en: the forward uses minisgl.kernel's small-batch kernel (the weight stays as it is)
        self._kernel = False

    def own_slots(self, prefix: str) -> dict[str, WeightSlot]:
        if self._shard_names is None:
            return super().own_slots(prefix)
        parent = prefix.rpartition(".")[0]
        return {
            _join(parent, f"{shard}.{attr}"): WeightSlot(self, attr, i)
            for i, shard in enumerate(self._shard_names)
            for attr in self.own_weights()
        }

    def load_weight(self, attr: str, tensor: torch.Tensor, shard: int = 0) -> None:
        """把第 ``shard`` 段的检查点张量拷进合并权重里属于它的那几行。

        en: Copy the checkpoint tensor of part ``shard`` into its rows of the merged weight.
        """
        # >>> TASK merged_linear_load: 把检查点里第 shard 段的张量原地拷进合并权重里属于这一段的那几行（各段按构造时给的大小自上而下排列，见类文档）；形状不对就抛 ValueError，消息先写模型要的形状、再写检查点给的。给定：check_shape
        # en: copy the checkpoint's part number shard, in place, into that part's own rows of the merged weight (the parts are stacked top to bottom with the sizes given at construction, see the class docstring); a wrong shape raises ValueError that names the model's shape first, then the checkpoint's. Given: check_shape
        # hint1: 第 shard 段的起始行是它前面各段的行数之和。对权重切片得到的是视图，往视图里原地拷贝就是写进权重本身；check_shape 的参数顺序决定消息里哪个形状在前。
        # en1: Part shard starts at the sum of the row counts of the parts before it.
        # en1: Slicing the weight gives a view, and copying into the view in place writes the weight itself;
        # en1: the order of check_shape's arguments decides which shape comes first in the message.
        # hint2: 1. start = sum(self.output_sizes[:shard])；
        # hint2: 2. target = getattr(self, attr)[start : start + self.output_sizes[shard]]（视图，不拷贝）；
        # hint2: 3. check_shape(target, tensor)，再 target.copy_(tensor)。
        # en2: 1. start = sum(self.output_sizes[:shard]);
        # en2: 2. target = getattr(self, attr)[start : start + self.output_sizes[shard]] (a view, no copy);
        # en2: 3. check_shape(target, tensor), then target.copy_(tensor).
        start = sum(self.output_sizes[:shard])
        target = getattr(self, attr)[start : start + self.output_sizes[shard]]
        check_shape(target, tensor)
        target.copy_(tensor)
        # <<< TASK

    def pack(self, kind: str = "onednn") -> None:
        """为 CPU 换一条更快的路径（只做一次）。``self.weight`` 始终是检查点里的那块权重：换哪条路只影响快慢，
        读权重的代码（切片、数字节、融合解码）看到的都一样。

        ``onednn``：另存一份重排成 oneDNN 布局的副本（不透明张量，不能切片），前向用它。``kernel``：前向交给
        ``minisgl.kernel`` 的小批量内核（行数多了它自己转给 ``F.linear``）。``auto``：这种形状在这颗 CPU 上量过
        哪条快（``minisgl.kernel.choice``，第一次遇到时量；环境变量可以指定，见 ``minisgl.kernel.forced``）就走哪条。
        内核不认的权重形状一律用 oneDNN。

        en: Switch to a faster path for the CPU (once only). ``self.weight`` is always the checkpoint's weight: the path
        changes the speed only, and code that reads the weight (slicing it, counting bytes, the fused decode) sees the
        same tensor whichever path was chosen.

        ``onednn``: keep a second copy reordered into oneDNN's layout (an opaque tensor that cannot be sliced) and use it
        in the forward. ``kernel``: the forward goes to ``minisgl.kernel``'s small-batch kernel (which hands larger row
        counts to ``F.linear`` itself). ``auto``: whichever of the two this CPU measured faster for this shape
        (``minisgl.kernel.choice``, measured the first time the shape is seen; an environment variable can force it,
        see ``minisgl.kernel.forced``). Weight shapes the kernel does not handle always use oneDNN.
        """
        if self._packed is not None or self._kernel:
            return
        if kind in ("kernel", "auto") and kernel.supports(self.weight):
            self._kernel = not kernel.choice(self.weight).onednn if kind == "auto" or kernel.forced() else True
        if not self._kernel:
            # 重排用的是 torch.ops.mkldnn._reorder_linear_weight（见 minisgl.kernel.onednn_pack）
            # en: the reorder is torch.ops.mkldnn._reorder_linear_weight (see minisgl.kernel.onednn_pack)
            self._packed = kernel.onednn_pack(self.weight)

    def packed_nbytes(self) -> int:
        """:meth:`pack` 另存的副本占几个字节（没有副本时是 0）：它不算权重，单独报。

        en: The bytes of the copy :meth:`pack` kept beside the weight (0 without one): reported apart from the weights.
        """
        return 0 if self._packed is None else self._packed.numel() * self._packed.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x Wᵀ (+ bias)``，走 :meth:`pack` 选的那条路。偏置单独作参数：部分结果之后还要相加的层，可以在加完之后
        只加一次偏置。

        en: ``x Wᵀ (+ bias)`` on whichever path :meth:`pack` chose. The bias is a parameter of its own: a layer whose
        partial results are summed afterwards can add it once, after the sum.
        """
        if self._packed is not None:
            return kernel.onednn_linear(x, self._packed, bias)
        if self._kernel:
            return kernel.cpu_linear(x, self.weight, bias)
        return F.linear(x, self.weight, bias)


def pack_linear_weights(root: BaseOP, kind: str = "onednn") -> int:
    """把 ``root`` 下所有线性层（含 LM head）换成 CPU 快速路径（``onednn``、``kernel`` 或 ``auto``，见
    :meth:`Linear.pack`），返回换了几个。加载完权重后调用一次。

    en: Switch every linear layer under ``root`` (the LM head included) to a fast CPU path (``onednn``, ``kernel`` or
    ``auto``, see :meth:`Linear.pack`) and return how many were switched. Call once, after the weights are loaded.
    """
    ops = [op for _, op in root.named_ops() if isinstance(op, Linear)]
    for op in ops:
        op.pack(kind)
    return len(ops)


# ----------------------------------------------------------------------------- 嵌入与 LM head
# en: ----------------------------------------------------------------------------- embedding and LM head


class VocabEmbedding(BaseOP):
    """token id → 向量：查表。

    en: token id -> vector: a table lookup.
    """

    def __init__(self, vocab_size: int, hidden_size: int, *, dtype: torch.dtype, device: torch.device | str) -> None:
        self.weight = torch.empty(vocab_size, hidden_size, dtype=dtype, device=device)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class LMHead(Linear):
    """隐藏状态 → 词表 logits，只算每个请求的最后一个 token。

    预填充一段 100 个 token 的提示词，只有最后一个位置的 logits 用来采样；
    词表有十几万行，把其余 99 个也算出来是白费。``tie_to`` 给出时与嵌入层共用权重
    （检查点里没有 ``lm_head.weight``）；打包成快速布局时另做一份，共用的权重原样不动。

    en: Hidden states -> vocabulary logits, for the last token of each request only.

    When a 100-token prompt is prefilled, only the last position's logits are used for sampling; the vocabulary has more
    than a hundred thousand rows, and computing the other 99 would be wasted work. With ``tie_to`` the weight is shared
    with the embedding (the checkpoint has no ``lm_head.weight``); packing into a fast layout makes a separate copy, and
    the shared weight stays as it is.
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        *,
        tie_to: VocabEmbedding | None = None,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__(hidden_size, vocab_size, dtype=dtype, device="meta" if tie_to else device)
        if tie_to is not None:
            self.weight = tie_to.weight
        self._tied = tie_to is not None

    def own_slots(self, prefix: str) -> dict[str, WeightSlot]:
        return {} if self._tied else super().own_slots(prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # >>> TASK lm_head_last_tokens: 返回 [请求数, 词表大小] 的 logits：只算当前批次里每个请求最后一个 token 的那一行；权重打包成快速布局之后，要走打包时选定的那条路（self.weight 仍在，但它只是原样的权重，快速路径不在它身上）。给定：全局上下文里的当前批次（它的注意力元数据知道每个请求的最后一个 token 在哪），父类 Linear 的前向
        # en: return logits of shape [requests, vocabulary], computed only for the row of each request's final token in the current batch; once the weight is packed into a fast layout it must take the path chosen when packing (self.weight is still there, but it is only the plain weight: the fast path does not live on it). Given: the current batch in the global context (its attention metadata knows where each request's final token is), and the parent class Linear's own computation
        # hint1: x 里是本批全部 token 的隐藏状态：挑出每个请求最后的那一行，再交给父类的前向。别自己写 F.linear(x, self.weight)：结果对，却绕过了打包选好的快速路径；只有 Linear.forward 知道走哪条路。
        # en1: x holds the hidden states of every token in the batch: pick each request's last row and hand them to the parent class's forward.
        # en1: Do not write F.linear(x, self.weight) yourself: the numbers come out right but skip the fast path that packing chose;
        # en1: only Linear.forward knows which path to take.
        # hint2: 1. batch = get_global_ctx().batch；
        # hint2: 2. last = batch.attn_metadata.get_last_indices(batch.size)；
        # hint2: 3. return super().forward(x[last])。
        # en2: 1. batch = get_global_ctx().batch;
        # en2: 2. last = batch.attn_metadata.get_last_indices(batch.size);
        # en2: 3. return super().forward(x[last]).
        batch = get_global_ctx().batch
        last = batch.attn_metadata.get_last_indices(batch.size)
        return super().forward(x[last])
        # <<< TASK


# ----------------------------------------------------------------------------- 归一化、激活、位置编码
# en: ----------------------------------------------------------------------------- normalisation, activation, position
# en: encoding


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm：``x / sqrt(mean(x²) + eps) * weight``，在 fp32 里算，再转回原 dtype 乘权重（与 HF 一致）。

    en: RMSNorm: ``x / sqrt(mean(x²) + eps) * weight``, computed in fp32, then cast back to the original dtype and
    multiplied by the weight (as HF does).
    """
    # >>> TASK rms_norm: 返回 x 在最后一维上的 RMSNorm（公式见函数文档），形状、dtype 与 x 相同；bf16 下要与 HF 逐位一致：归一化在 fp32 里做，权重乘的是已经舍入回 x 的 dtype 的结果
    # en: return the RMSNorm of x over its last dimension (formula in the docstring), with the shape and dtype of x; in bf16 it must match HF bit for bit: normalise in fp32, and let the weight multiply the result already rounded back into the dtype of x
    # hint1: 均值只在最后一维上取，并保住这一维好广播；torch 有现成的平方根倒数。乘权重一定放在转回原 dtype 之后。
    # en1: Take the mean over the last dimension only, keeping that dimension so it broadcasts; torch has a reciprocal square root.
    # en1: Multiplying by the weight must come after the cast back to the original dtype.
    # hint2: 1. x32 = x.float()；
    # hint2: 2. x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)；
    # hint2: 3. return weight * x32.to(x.dtype)。
    # en2: 1. x32 = x.float();
    # en2: 2. x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps);
    # en2: 3. return weight * x32.to(x.dtype).
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)
    # <<< TASK


class RMSNorm(BaseOP):
    def __init__(self, size: int, eps: float, *, dtype: torch.dtype, device: torch.device | str) -> None:
        self.weight = torch.empty(size, dtype=dtype, device=device)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU 的激活：``x`` 的前一半是 gate、后一半是 up（合并的 gate_up_proj 的输出），返回 ``silu(gate) * up``。

    en: SwiGLU activation: the first half of ``x`` is gate, the second half up (the output of the merged gate_up_proj);
    returns ``silu(gate) * up``.
    """
    # >>> TASK silu_and_mul: 返回 SwiGLU 的激活（公式见函数文档）：结果的最后一维是 x 的一半；x 的前一半是门控的那一路，后一半是被门控的那一路
    # en: return the SwiGLU activation (formula in the docstring): its last dimension is half of x's; the first half of x is the gating branch, the second half the branch being gated
    # hint1: 沿最后一维对半切开就得到两路；torch.nn.functional 里有现成的 silu。
    # en1: Cutting the last dimension in half gives the two branches; torch.nn.functional has silu ready-made.
    # hint2: 1. gate, up = x.chunk(2, dim=-1)；
    # hint2: 2. return F.silu(gate) * up。
    # en2: 1. gate, up = x.chunk(2, dim=-1);
    # en2: 2. return F.silu(gate) * up.
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
    # <<< TASK


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """旋转位置编码（NeoX / HF 的“前后两半”排布）。``x``: [T, H, D]，``cos``/``sin``: [T, D]。

    把每个头的向量看成 D/2 个二维点 (x[i], x[i + D/2])，按位置转过各自的角度：
    ``x * cos + rotate_half(x) * sin``，其中 ``rotate_half(x) = cat(-x后半, x前半)``。

    en: Rotary position embedding (the NeoX / HF "two halves" layout). ``x``: [T, H, D], ``cos``/``sin``: [T, D].

    Each head's vector is seen as D/2 points in the plane, (x[i], x[i + D/2]), each rotated by its own angle for the
    position: ``x * cos + rotate_half(x) * sin``, where ``rotate_half(x) = cat(-second half of x, first half of x)``.
    """
    # >>> TASK apply_rotary: 返回旋转后的 x，形状、dtype 不变，按函数文档里“前后两半”的配对旋转；两张表是 [T, D] 的 fp32，x 是 [T, H, D]；bf16 下要与 HF 逐位一致，所以表先换成 x 的 dtype 再参与乘法
    # en: return x rotated, same shape and dtype, with the "two halves" pairing of the docstring; the two tables are fp32 [T, D] while x is [T, H, D]; in bf16 the result must match HF bit for bit, so the tables take the dtype of x before they multiply
    # hint1: 表缺一个头维度：插一个长度为 1 的维度就能对 x 广播。rotate_half 就是把后一半取负放到前面、前一半放到后面。
    # en1: The tables lack a head dimension: insert one of length 1 and they broadcast against x.
    # en1: rotate_half puts the negated second half first and the first half second.
    # hint2: 1. cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)；
    # hint2: 2. x1, x2 = x.chunk(2, dim=-1)；
    # hint2: 3. return x * cos + torch.cat((-x2, x1), dim=-1) * sin。
    # en2: 1. cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype);
    # en2: 2. x1, x2 = x.chunk(2, dim=-1);
    # en2: 3. return x * cos + torch.cat((-x2, x1), dim=-1) * sin.
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
    # <<< TASK


class RotaryEmbedding(BaseOP):
    """RoPE 的角度：位置 ``p`` 上第 ``i`` 个二维点（``0 <= i < D/2``，见 :func:`apply_rotary`）转过
    ``p · base^(-2i/D)``。全模型共用一个：每一步的每一层都要这一步各个 token 位置上的 cos/sin。

    en: RoPE's angles: at position ``p`` the ``i``-th 2-D point (``0 <= i < D/2``, see :func:`apply_rotary`) turns by
    ``p · base^(-2i/D)``. One for the whole model: every layer of every step needs the cos/sin at the step's token
    positions.
    """

    def __init__(self, head_dim: int, base: float, max_position: int, *, device: torch.device | str) -> None:
        self.head_dim, self.base, self.max_position = head_dim, base, max_position
        # >>> TASK rotary_init: 准备好 cos_sin 要用的一切（形状、dtype、设备由你定）。之后每一步的每一层都会调用 cos_sin，而它不能再做三角函数或幂运算——那是每层每步都付一次的代价；位置最大到 max_position - 1
        # en: prepare whatever cos_sin needs (shapes, dtypes, device are yours). Every layer of every later step calls cos_sin, which may no longer compute any trigonometric function or power: that cost would be paid by every layer at every step; positions go up to max_position - 1
        # hint1: 角度只取决于位置和 i，而位置只有 max_position 个：全部算一次、存成表，之后只查表。要与 HF 逐位一致，就照它的算法和 dtype：频率先在 int64 上排好 2i 再转 fp32，位置也是 fp32，外积之后把同一组角度并排放两遍（前一半和后一半配对）。
        # en1: The angles depend only on the position and i, and there are only max_position positions: compute them all once into a table and only look it up later.
        # en1: To match HF bit for bit follow its arithmetic and dtypes: lay out 2i in int64 then turn it into fp32, positions in fp32 too,
        # en1: and after the outer product put the same angles side by side twice (the first half pairs with the second).
        # hint2: 1. inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))；
        # hint2: 2. freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)；emb = torch.cat((freqs, freqs), dim=-1)；
        # hint2: 3. self._cos = emb.cos().to(device)；self._sin = emb.sin().to(device)。
        # en2: 1. inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim));
        # en2: 2. freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq); emb = torch.cat((freqs, freqs), dim=-1);
        # en2: 3. self._cos = emb.cos().to(device); self._sin = emb.sin().to(device).
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self._cos = emb.cos().to(device)
        self._sin = emb.sin().to(device)
        # <<< TASK

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions``: [T]（任意顺序、可以重复）→ 两张 [T, D] 的 fp32 表，与 HF 的 ``Qwen3RotaryEmbedding`` 逐位相同。

        en: ``positions``: [T] (any order, repeats allowed) -> two [T, D] fp32 tables, bit-identical to HF's
        ``Qwen3RotaryEmbedding``.
        """
        # >>> TASK rotary_cos_sin: 返回 (cos, sin)，都是 [T, D] 的 fp32、在 positions 所在的设备上：第 t 行是位置 positions[t] 的角度，第 i 列和第 i + D/2 列是同一个角度（apply_rotary 的前后两半配对）；与 HF 逐位相同。这里不做三角函数或幂运算；位置到了 max_position 或更大要报错，不能悄悄给出一行
        # en: return (cos, sin), both [T, D] fp32 on the device of positions: row t holds the angles of position positions[t], columns i and i + D/2 the same angle (apply_rotary's first/second-half pairing); bit-identical to HF. No trigonometric function or power here; a position of max_position or more is an error, never a row made up quietly
        # hint1: 表按位置排好了，查表就是用 positions 当下标取行；越界的下标本身就会报错。
        # en1: The table is ordered by position, so a lookup takes rows with positions as the index; an out-of-range index raises by itself.
        # hint2: return self._cos[positions], self._sin[positions]
        # en2: return self._cos[positions], self._sin[positions]
        return self._cos[positions], self._sin[positions]
        # <<< TASK

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin(positions)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


# ----------------------------------------------------------------------------- 注意力层
# en: ----------------------------------------------------------------------------- the attention layer


class AttentionLayer(BaseOP):
    """注意力层：拆 qkv → （Qwen3 的）q/k 归一化 → RoPE → 交给注意力后端（写 KV 缓存并算注意力）。

    它自己没有权重：q_norm / k_norm 的权重属于外层的 self_attn 块（检查点里也是这么命名的），
    这里只借用；怎样在分页 KV 上算注意力是后端的事（第 1.5 章），本层不关心。

    en: The attention layer: split qkv -> q/k normalisation (Qwen3) -> RoPE -> the attention backend (writes the KV
    cache and computes attention).

    It has no weights of its own: the q_norm / k_norm weights belong to the enclosing self_attn block (which is how the
    checkpoint names them) and are only borrowed here; how attention is computed over the paged KV is the backend's job
    (chapter 1.5), not this layer's.
    """

    def __init__(
        self,
        layer_id: int,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rotary: RotaryEmbedding,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
    ) -> None:
        if num_qo_heads % num_kv_heads != 0:
            raise ValueError(tr(
                "The number of query heads {num_qo_heads} must be a multiple of the number of KV heads {num_kv_heads} "
                "(GQA)",
                num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
            ))
        self.layer_id = layer_id
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self._rotary = rotary
        self._q_norm = q_norm
        self._k_norm = k_norm

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        """``qkv``: [T, (Hq + 2·Hkv)·D] → 注意力输出 [T, Hq·D]。

        en: ``qkv``: [T, (Hq + 2·Hkv)·D] -> attention output [T, Hq·D].
        """
        # >>> TASK attention_layer_forward: 返回 [T, Hq·D] 的注意力输出。交给注意力后端的是：[T, Hq, D] 的 q，[T, Hkv, D] 的 k 和 v，本层的 layer_id 和当前批次；q、k 要经过各自的归一化（有的话）和按每个 token 位置的 RoPE，次序照类文档，v 两样都不做。给定：全局上下文里的后端和批次，本层借来的 _q_norm、_k_norm、_rotary
        # en: return the attention output, [T, Hq·D]. The attention backend gets q as [T, Hq, D], k and v as [T, Hkv, D], this layer's layer_id and the current batch; q and k normalised by their own norms (when present) and rotated by RoPE at each token's position, in the order the class docstring gives; v gets neither. Given: the backend and the batch in the global context; this layer's borrowed _q_norm, _k_norm, _rotary
        # hint1: 合并的 qkv 按段的顺序（q、k、v）沿最后一维切开，各自变成按头的三维；后端返回 [T, Hq, D]，交出去之前摊回二维给 o_proj。
        # en1: Split the merged qkv along the last dimension in the order of its parts (q, k, v) and make each three-dimensional, per head;
        # en1: the backend returns [T, Hq, D], which is flattened back to two dimensions for o_proj.
        # hint2: 1. ctx = get_global_ctx()；qo = self.num_qo_heads * self.head_dim，kv = self.num_kv_heads * self.head_dim；
        # hint2: 2. q, k, v = qkv.split([qo, kv, kv], dim=-1)，再分别 reshape(-1, 各自的头数, self.head_dim)；
        # hint2: 3. self._q_norm / self._k_norm 不是 None 时，q = self._q_norm.forward(q)，k 同理；
        # hint2: 4. q, k = self._rotary.forward(ctx.batch.positions, q, k)；
        # hint2: 5. o = ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch)；return o.reshape(-1, qo)。
        # en2: 1. ctx = get_global_ctx(); qo = self.num_qo_heads * self.head_dim, kv = self.num_kv_heads * self.head_dim;
        # en2: 2. q, k, v = qkv.split([qo, kv, kv], dim=-1), then reshape each to (-1, its number of heads, self.head_dim);
        # en2: 3. when self._q_norm / self._k_norm is not None, q = self._q_norm.forward(q), likewise for k;
        # en2: 4. q, k = self._rotary.forward(ctx.batch.positions, q, k);
        # en2: 5. o = ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch); return o.reshape(-1, qo).
        ctx = get_global_ctx()
        qo, kv = self.num_qo_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([qo, kv, kv], dim=-1)
        q = q.reshape(-1, self.num_qo_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self._q_norm is not None:
            q = self._q_norm.forward(q)
        if self._k_norm is not None:
            k = self._k_norm.forward(k)
        q, k = self._rotary.forward(ctx.batch.positions, q, k)
        o = ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch)
        return o.reshape(-1, qo)
        # <<< TASK
