"""CPU 上一步解码的全部解码层一次算完（``minisgl/kernel/cpu_decode.c``）：CUDA 图在 CPU 上的对应物。

Python 逐层发算子，每层几十个小算子（归一化、RoPE、切分、拷贝、注意力……），每个都有几微秒的固定开销。
小模型的一步解码里，这些开销比把权重读一遍还费时（``docs/roofline.md`` 里“窄模型”那一行量的就是它）。
CUDA 图靠“录一次、回放”消掉它；CPU 上没有图可录，于是把同样的计算写成一个 C 函数，每步只调用一次。

不是某一章的内容，而是引擎的一个选项（``EngineConfig.cpu_fused_decode``）。它绕过第 1.2–1.5 章的 Python 代码，
所以缺省（``None``）只在这几章都用参考解答时打开：学员自己写的章节总会真正跑起来。``True`` 强制打开，``False`` 关掉。
要求：CPU、fp32 或 bf16、线性层走 ``minisgl.kernel`` 的内核（权重是原样的连续张量）、不开 CUDA 图。预填充照常走 Python。
bf16 时权重和 KV 缓存都是 bf16（CPU 有 AVX512_BF16 时点积用 vdpbf16ps，否则读进来变成 fp32 再乘），激活在 C 里以 fp32
存放，但在逐层的 bf16 引擎存成 bf16 的每个地方都舍入一次：两条路只差注意力里的求和顺序。

en: All decoder layers of one decode step on the CPU in one call (``minisgl/kernel/cpu_decode.c``): the CPU's
counterpart of CUDA graphs. Issued layer by layer from Python, each layer is dozens of small operators, each with a fixed
cost of a few microseconds; in a small model's decode step that costs more than reading the weights once. Not a
chapter's content but an engine option (``EngineConfig.cpu_fused_decode``). It bypasses the Python code of chapters
1.2–1.5, so by default (``None``) it is on only when those chapters all run the reference solution: a chapter the learner
wrote always runs. ``True`` forces it, ``False`` turns it off. Needs the CPU, fp32 or bf16, linear layers through
``minisgl.kernel``'s kernel (plain contiguous weights) and no CUDA graphs. Prefill takes the Python path as always.
In bf16 the weights and the KV cache are bf16 (dot products by vdpbf16ps when the CPU has AVX512_BF16, otherwise widened
to fp32 and multiplied); activations are held in fp32 inside C but rounded wherever the layer-by-layer bf16 engine stores
a bf16 result: the two paths differ only in the summation order inside attention.
"""

from __future__ import annotations

import ctypes
import importlib
from typing import TYPE_CHECKING, Any

import torch

from minisgl import kernel
from minisgl.architectures import is_moe
from minisgl.course.registry import get_chapter
from minisgl.course.select import loaded_impl
from minisgl.i18n import tr
from minisgl.layers import Linear

if TYPE_CHECKING:
    from minisgl.engine import Engine

__all__ = ["BYPASSED_CHAPTERS", "FusedDecoder", "plan_decode"]

_I64, _F32 = ctypes.c_int64, ctypes.c_float

#: ``cpu_decode.c`` 的 ``W_F32``、``W_BF16_WIDEN``、``W_BF16_DOT``、``W_Q8``、``W_Q4``：权重和 KV 缓存的类型，bf16 时
#: 点积怎么算；量化的权重（第 5.4 章，组装时装上）时激活和 KV 缓存是 fp32。
#: en: ``cpu_decode.c``'s ``W_F32``, ``W_BF16_WIDEN``, ``W_BF16_DOT``, ``W_Q8``, ``W_Q4``: the dtype of the weights and
#: en: the KV cache, and for bf16 how the dot products are computed; with quantized weights (chapter 5.4, put in by the
#: en: assembly) activations and the KV cache are fp32.
_WEIGHTS = {"fp32": 0, "bf16 widen": 1, "bf16 dot": 2, "int8": 3, "int4": 4}


class _Shape(ctypes.Structure):
    """与 ``cpu_decode.c`` 里的 ``Shape`` 一一对应（``weights``：:data:`_WEIGHTS` 里的一个）。"""

    _fields_ = [(name, _I64) for name in
                ("batch", "hidden", "q_heads", "kv_heads", "head_dim", "intermediate", "layers", "weights", "group")] + [("eps", _F32)]


#: 融合解码绕过的章节：算子层、模型、KV 缓存、注意力后端（C 函数里各有一份同样的计算）。
#: en: the chapters a fused decode step bypasses: layers, models, KV cache, attention backends (the C function does
#: en: the same computation for each).
BYPASSED_CHAPTERS = ("layers", "models", "kvcache", "attention")


def _own_chapters() -> list[str]:
    """被绕过的章节里此刻不是参考解答的那些（学员代码或骨架），按编号。"""
    chapters = [get_chapter(cid) for cid in BYPASSED_CHAPTERS]
    return [ch.label for ch in chapters if loaded_impl(importlib.import_module(ch.public_module)) not in (None, "solution")]


def plan_decode(engine: Engine, requested: bool | None) -> tuple[bool, str]:
    """装不装融合解码，以及说明解码走哪条路的一句话（服务器启动时打印，``Engine.decode_path``）。

    在模型加载之后调用（融合解码读各线性层原样的 ``weight``，打包不会动它）；``requested`` 是 ``EngineConfig.cpu_fused_decode``，
    ``True`` 而条件不满足时抛 ValueError，说出缺的那一条。

    en: Whether to install the fused decode, and the sentence saying which path decoding takes (printed by the server
    at start, ``Engine.decode_path``). Called after the model is loaded (the fused decode reads each linear layer's plain
    ``weight``, which packing never changes); ``requested`` is ``EngineConfig.cpu_fused_decode``, and ``True`` while a
    condition is not met raises ValueError naming it.
    """
    # 第 4 阶段之前写的第 1.3 章没有 tp_size
    # en: a chapter 1.3 written before stage 4 has no tp_size
    if getattr(engine.model, "tp_size", 1) > 1:
        problem = tr("cpu_fused_decode runs the whole model in one process; this one is split over {tp} ranks",
                     tp=engine.model.tp_size)
    elif engine.device.type != "cpu" or engine.dtype not in (torch.float32, torch.bfloat16):
        problem = tr("cpu_fused_decode works only on the CPU in float32 or bfloat16")
    elif engine.linear_kind != "kernel":
        problem = tr("cpu_fused_decode needs the CPU kernel (cpu_kernel=True and a C compiler)")
    elif engine.graph_mode != "off":
        problem = tr("cpu_fused_decode and cuda_graph cannot be used together")
    elif is_moe(engine.model_config):
        problem = tr("cpu_fused_decode computes dense MLPs; this model routes tokens to experts")
    elif not all(_fits(op.weight, engine.dtype) for layer in engine.model.model.layers for op in _linears(layer)):
        problem = tr("cpu_fused_decode: a linear layer of this model does not fit the CPU kernel")
    else:
        problem = None
    if requested and problem:
        raise ValueError(problem)
    if requested:
        return True, tr("Decode: every decoder layer in one C call per step ({how}; cpu_fused_decode=True)",
                        how=_describe(_weights(engine)))
    if requested is False:
        return False, tr("Decode: layer by layer through the chapters' code (cpu_fused_decode=False)")
    if engine.graph_mode != "off":
        return False, tr("Decode: layer by layer through the chapters' code, replayed from CUDA graphs")
    if problem:
        return False, tr("Decode: layer by layer through the chapters' code (no fused C path: {problem})",
                         problem=problem)
    own = _own_chapters()
    if own:
        return False, tr("Decode: layer by layer, through your chapters {labels} (the fused C path runs only when "
                         "chapters 1.2–1.5 are the reference solution)", labels=", ".join(own))
    return True, tr("Decode: every decoder layer in one C call per step ({how}), as chapters 1.2–1.5 are the reference "
                    "solution (cpu_fused_decode=False runs them layer by layer)", how=_describe(_weights(engine)))


def _quantized(weight: Any) -> str | None:
    """量化的权重（第 5.4 章的 ``QuantizedWeight``，组装时换上）是哪一种：``"int8"``、``"int4"``；普通张量是 None。
    按属性认，不导入后面的章节。"""
    return None if isinstance(weight, torch.Tensor) else getattr(weight, "method", None)


def _fits(weight: Any, dtype: torch.dtype) -> bool:
    """C 函数能算这块线性层的权重吗：内核认得的原样张量，或者 fp32 模型里量化的权重（int8 的输入维是 8 的倍数）。"""
    method = _quantized(weight)
    if method is None:
        return kernel.supports(weight)
    return dtype == torch.float32 and weight.device.type == "cpu" and (method == "int4" or weight.shape[-1] % 8 == 0)


def _weights(engine: Engine) -> str:
    """C 函数里权重和 KV 缓存的类型（:data:`_WEIGHTS` 的键）：量化的权重按它的种类；bf16 时 CPU 有 AVX512_BF16 就用
    vdpbf16ps 的点积，与逐层的 bf16 引擎（``kernel.kernel_linear``）同一个判断。"""
    method = _quantized(engine.model.model.layers[0].self_attn.qkv_proj.weight)
    if method is not None:
        return method
    dtype = engine.dtype
    if dtype == torch.float32:
        return "fp32"
    return "bf16 dot" if kernel.bf16_dot() else "bf16 widen"


def _describe(weights: str) -> str:
    """``Engine.decode_path`` 里说类型和点积的那一段。"""
    if weights == "fp32":
        return tr("float32 weights and KV cache")
    if weights in ("int8", "int4"):
        return tr("{kind} weights turned into float32 in registers, float32 KV cache", kind=weights)
    if weights == "bf16 dot":
        return tr("bfloat16 weights and KV cache, dot products by vdpbf16ps (AVX512_BF16)")
    return tr("bfloat16 weights and KV cache, widened to float32 for the dot products (no AVX512_BF16 on this CPU)")


def _linears(layer: Any) -> tuple[Any, ...]:
    """一个解码层里 C 函数要用内核算的四个线性层。"""
    return layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _int32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int32).contiguous()


class FusedDecoder:
    """装上以后 ``engine.model.forward`` 先经过这里：解码批次交给 C 函数，其余照常前向。引擎先用
    :func:`plan_decode` 判断能不能装。"""

    def __init__(self, engine: Engine) -> None:
        c, model = engine.model_config, engine.model
        self.ctx, self.page_table, self.model, self.dtype = engine.ctx, engine.page_table, model, engine.dtype
        self.weights = _weights(engine)
        first = model.model.layers[0].self_attn.qkv_proj.weight
        self.shape = _Shape(0, c.hidden_size, c.num_qo_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                            c.num_layers, _WEIGHTS[self.weights], getattr(first, "group_size", None) or 0, c.rms_norm_eps)
        # 归一化权重和偏置在 C 里总是 fp32：bf16 模型另存一份 fp32 副本（同值，很小），这里留着它们
        # en: norm weights and biases are always fp32 in C: a bf16 model keeps an fp32 copy (same values, small) here
        self._fp32: list[torch.Tensor] = []

        def f32(t: torch.Tensor | None) -> int:
            if t is None:
                return 0
            self._fp32.append(t.float().contiguous())  # fp32 的张量原样返回，不复制
            return self._fp32[-1].data_ptr()

        def weight(op: Any) -> int:  # 量化的权重：存着整数的那块 | en: a quantized weight: the block holding the integers
            return _ptr(op.weight.data if _quantized(op.weight) else op.weight)

        def scales(op: Any) -> list[int]:  # 量化的权重的 scale 和偏移（int8 没有偏移），否则两个 0 | en: scale and offset of a quantized weight, else two 0s
            return [_ptr(op.weight.scale), _ptr(op.weight.offset)] if _quantized(op.weight) else [0, 0]

        rows = []
        for i, layer in enumerate(model.model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            rows.append([
                f32(layer.input_layernorm.weight), weight(attn.qkv_proj), f32(attn.qkv_proj.bias),
                f32(attn.q_norm and attn.q_norm.weight), f32(attn.k_norm and attn.k_norm.weight),
                weight(attn.o_proj), f32(attn.o_proj.bias), f32(layer.post_attention_layernorm.weight),
                weight(mlp.gate_up_proj), f32(mlp.gate_up_proj.bias), weight(mlp.down_proj),
                f32(mlp.down_proj.bias), _ptr(engine.kv_cache.k_cache(i)), _ptr(engine.kv_cache.v_cache(i)),
                *(p for op in _linears(layer) for p in scales(op)),
            ])
        self.pointers = torch.tensor(rows, dtype=torch.int64)  # 权重不会再搬家：指针表只做一次
        rotary = model.model.layers[0].self_attn.attn._rotary
        # bf16 时与参考实现的 apply_rotary 一样先把表舍入成 bf16（仍以 fp32 交给 C）
        # en: in bf16 the tables are rounded to bf16 first, as the reference apply_rotary does (still handed to C as fp32)
        tables = rotary.cos_sin(torch.arange(rotary.max_position))
        self.cos, self.sin = (t.to(self.dtype).float().contiguous() for t in tables)
        self.decode_steps = 0
        self._model_forward = model.forward
        model.forward = self.forward

    def forward(self) -> torch.Tensor:
        batch = self.ctx.batch
        if not batch.is_decode:
            return self._model_forward()
        md = batch.attn_metadata
        if max(md.seq_lens) > self.cos.shape[0]:  # 位置超出 RoPE 表：走 Python 那条路（由它报错），C 里不越界读
            return self._model_forward()
        return self.logits(batch.input_ids, batch.positions, batch.out_loc, self.page_table,
                           torch.tensor(md.table_idx, dtype=torch.int32), torch.tensor(md.seq_lens, dtype=torch.int32))

    def logits(self, input_ids: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor, page_table: torch.Tensor,
               table_idx: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """每一行当作一个解码的 token 算完全部解码层，返回每一行的 logits ``[行数, 词表]``：第 r 行的 K/V 写进槽位
        ``out_loc[r]``（每一层先把所有行的都写好，再算注意力），它看 ``page_table`` 第 ``table_idx[r]`` 行的前
        ``seq_lens[r]`` 个槽位。解码批次用引擎的页表；投机解码验证一棵草稿树时给每个节点一行自己的
        （前缀 + 祖先 + 它自己，见 :mod:`minisgl.speculative`）。

        en: Compute every decoder layer for each row as one decoded token and return each row's logits ``[rows,
        vocab]``: row r writes its K/V to slot ``out_loc[r]`` (each layer writes every row's before any attention) and
        looks at the first ``seq_lens[r]`` slots of row ``table_idx[r]`` of ``page_table``. Decode batches use the
        engine's page table; verifying a draft tree in speculative decoding gives each node a row of its own (prefix +
        ancestors + itself, see :mod:`minisgl.speculative`).
        """
        model = self.model
        max_len = int(seq_lens.max())
        x = model.model.embed_tokens.forward(input_ids).float().contiguous()  # C 里残差流是 fp32
        positions, out_loc, table_idx, seq_lens = (_int32(t) for t in (positions, out_loc, table_idx, seq_lens))
        page_table = _int32(page_table)
        lib, shape = kernel.library(), ctypes.addressof(self.shape)
        self.shape.batch = len(input_ids)
        work = torch.empty(lib.cpu_decode_work_floats(shape, max_len), dtype=torch.float32)
        lib.cpu_decode(
            shape, _ptr(self.pointers), _ptr(x), _ptr(self.cos), _ptr(self.sin),
            _ptr(positions), _ptr(out_loc), _ptr(page_table), page_table.shape[1],
            _ptr(table_idx), _ptr(seq_lens), max_len, _ptr(work),
        )
        self.decode_steps += 1
        x = x.to(self.dtype)  # bf16 时 C 存的已是 bf16 的值，这一转不改变它们
        return Linear.forward(model.lm_head, model.model.norm.forward(x))  # 每一行都要 logits | en: every row needs its logits
