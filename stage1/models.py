# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint models <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint models <task>` gives the next hint.
"""第 1.3 章 models：Qwen3 与 Llama 解码器，以及从 safetensors 流式加载权重。

两种架构共用一份解码器定义，区别只在配置：Qwen3 在注意力里对 q、k 各做一次 RMSNorm（``qk_norm``），
Llama 没有。结构和权重名字都与 HF 的 ``config.json`` / ``model.safetensors`` 对应，
唯一的改动是把 q/k/v 和 gate/up 合并成一个线性层（见第 1.2 章）。

加载权重时一次只读一个张量、拷进预先分配好的位置，峰值内存约等于模型本身。

en: Chapter 1.3 models: the Qwen3 and Llama decoders, and streaming the weights in from safetensors.

Both architectures share one decoder definition and differ only in configuration: Qwen3 applies an RMSNorm to q and to k
inside attention (``qk_norm``), Llama does not. The structure and the weight names follow HF's ``config.json`` /
``model.safetensors``; the only change is that q/k/v and gate/up are merged into one linear layer each (see chapter
1.2).

Weights are loaded one tensor at a time, copied into preallocated places, so peak memory is about the size of the model
itself.
"""

from __future__ import annotations

from minisgl.course.skeleton import TaskNotDone

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open
from tqdm import tqdm

from minisgl.i18n import tr
from minisgl.core import get_global_ctx
from minisgl.layers import (
    AttentionLayer,
    BaseOP,
    Linear,
    LMHead,
    RMSNorm,
    RotaryEmbedding,
    VocabEmbedding,
    silu_and_mul,
)

#: 支持的架构（``config.json`` 里的 ``architectures[0]``）→ 是否有 q/k norm。
#: en: Supported architectures (``architectures[0]`` in ``config.json``) -> whether they have q/k norm.
ARCHITECTURES = {"Qwen3ForCausalLM": True, "LlamaForCausalLM": False}


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool
    attention_bias: bool = False
    mlp_bias: bool = False

    @classmethod
    def from_hf(cls, model_path: str | Path) -> ModelConfig:
        """读 HF 的 ``config.json``。不认识的架构、没有实现的 RoPE 缩放都直接报错，免得算出错的结果。

        en: Read HF's ``config.json``. An unknown architecture or an unimplemented RoPE scaling raises at once, rather
        than computing wrong results.
        """
        path = Path(model_path) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(tr(
                "Model config {path} not found (wrong model directory? run make setup first)",
                path=path,
            ))
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))

    @classmethod
    def from_dict(cls, hf: dict) -> ModelConfig:
        # TODO 任务 model_config_from_hf：由 config.json 的字典返回 ModelConfig。只认 ARCHITECTURES 里的架构，看 architectures 的第一项；缺了、空了或不认识都抛 ValueError，消息写出架构名。RoPE 缩放（rope_parameters 或老的 rope_scaling 里的类型不是 default）和 silu 以外的 hidden_act 抛 NotImplementedError。缺省值：head_dim 是隐藏维度平分给 num_attention_heads 个头的大小，num_key_value_heads 同 num_attention_heads，rope_theta 新版写在 rope_parameters 里、老版在顶层、都没有时取 10000，tie_word_embeddings、attention_bias、mlp_bias 为 False；qk_norm 查 ARCHITECTURES
        # TODO task model_config_from_hf: return a ModelConfig from the config.json dict. Only what ARCHITECTURES lists is accepted, judged by the first entry of architectures; a missing, empty or unknown one raises ValueError naming it. RoPE scaling (a type other than default in rope_parameters or the older rope_scaling) and any hidden_act but silu raise NotImplementedError. Defaults: head_dim is the hidden size split evenly over num_attention_heads, num_key_value_heads equals num_attention_heads, rope_theta comes from rope_parameters in newer configs or the top level in older ones, else 10000; tie_word_embeddings, attention_bias, mlp_bias are False; qk_norm comes from ARCHITECTURES
        raise TaskNotDone("models", "model_config_from_hf")


class SelfAttention(BaseOP):
    """``self_attn`` 块：合并的 qkv_proj → 注意力层 → o_proj。

    en: The ``self_attn`` block: merged qkv_proj -> attention layer -> o_proj.
    """

    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding, dtype: torch.dtype, device) -> None:
        c, kw = config, {"dtype": dtype, "device": device}
        q_size, kv_size = c.num_qo_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.qkv_proj = Linear(
            c.hidden_size, [q_size, kv_size, kv_size], bias=c.attention_bias,
            shard_names=["q_proj", "k_proj", "v_proj"], **kw,
        )  # fmt: skip
        self.o_proj = Linear(q_size, c.hidden_size, bias=c.attention_bias, **kw)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, **kw) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, **kw) if c.qk_norm else None
        self.attn = AttentionLayer(
            layer_id, c.num_qo_heads, c.num_kv_heads, c.head_dim, rotary, self.q_norm, self.k_norm
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj.forward(self.attn.forward(self.qkv_proj.forward(x)))


class MLP(BaseOP):
    """SwiGLU 前馈：合并的 gate_up_proj → silu(gate) * up → down_proj。

    en: SwiGLU feed-forward: merged gate_up_proj -> silu(gate) * up -> down_proj.
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device) -> None:
        c, kw = config, {"dtype": dtype, "device": device}
        self.gate_up_proj = Linear(
            c.hidden_size, [c.intermediate_size] * 2, bias=c.mlp_bias, shard_names=["gate_proj", "up_proj"], **kw
        )
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO 任务 mlp_forward：返回这个 SwiGLU MLP 对 x 的输出，形状与 x 相同（结构见类文档）。给定：本块的两个线性层，第 1.2 章的激活函数
        # TODO task mlp_forward: return this SwiGLU MLP's output for x, of the same shape as x (structure in the class docstring). Given: this block's two linear layers, the activation function of chapter 1.2
        raise TaskNotDone("models", "mlp_forward")


class DecoderLayer(BaseOP):
    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding, dtype: torch.dtype, device) -> None:
        kw = {"dtype": dtype, "device": device}
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.self_attn = SelfAttention(config, layer_id, rotary, dtype, device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.mlp = MLP(config, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-norm 残差：``h = x + attn(norm(x))``，``out = h + mlp(norm(h))``。

        en: Pre-norm residual: ``h = x + attn(norm(x))``, ``out = h + mlp(norm(h))``.
        """
        # TODO 任务 decoder_layer_forward：返回这一层的输出：pre-norm 残差结构（公式见函数文档），注意力和 MLP 两个子层各用自己的那个归一化
        # TODO task decoder_layer_forward: return this layer's output: the pre-norm residual structure (formula in the docstring), where the attention and MLP sub-layers each use a norm of their own
        raise TaskNotDone("models", "decoder_layer_forward")


class DecoderModel(BaseOP):
    """检查点里的 ``model.*``：嵌入、N 个解码层、最后的归一化。

    en: The checkpoint's ``model.*``: embedding, N decoder layers, the final norm.
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device) -> None:
        kw = {"dtype": dtype, "device": device}
        rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position_embeddings, device=device)
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, **kw)
        self.layers = [DecoderLayer(config, i, rotary, dtype, device) for i in range(config.num_layers)]
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens.forward(input_ids)
        for layer in self.layers:
            h = layer.forward(h)
        return self.norm.forward(h)


class CausalLM(BaseOP):
    """完整的模型：``forward()`` 读当前批次的 ``input_ids``，返回每个请求最后一个 token 的 logits ``[B, vocab]``。

    en: The whole model: ``forward()`` reads the current batch's ``input_ids`` and returns the logits of each request's
    last token, ``[B, vocab]``.
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        self.config = config
        # 这个模型切给了几个进程（每个只存一份）；1：整个模型都在这里
        # en: how many processes this model is split over (each stores one part); 1: the whole model is here
        self.tp_size = 1
        self.model = DecoderModel(config, dtype, device)
        tie_to = self.model.embed_tokens if config.tie_word_embeddings else None
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, tie_to=tie_to, dtype=dtype, device=device)

    def forward(self) -> torch.Tensor:
        batch = get_global_ctx().batch
        return self.lm_head.forward(self.model.forward(batch.input_ids))


def create_model(config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> CausalLM:
    """按配置搭出模型，权重只分配、不初始化（接着用 :func:`load_weights` 或 :func:`load_dummy_weights` 填）。

    en: Build the model from the config; weights are allocated but not initialised (fill them next with
    :func:`load_weights` or :func:`load_dummy_weights`).
    """
    return CausalLM(config, dtype, device)


#: 检查点里可以有、但本项目不需要的张量：旧版 Llama 检查点存下的 RoPE 频率表（我们自己算）。
#: en: Tensors a checkpoint may hold that this project does not need: the RoPE frequency table saved by old Llama
#: en: checkpoints (we compute it ourselves).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def safetensors_files(model_path: str | Path) -> list[Path]:
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(tr(
            "{model_path} has no *.safetensors weight files (wrong model directory? run make setup first)",
            model_path=model_path,
        ))
    return files


def iter_safetensors(model_path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """逐个读出检查点里的张量（可能分成多个文件），带进度条。

    en: Read the checkpoint's tensors one by one (possibly from several files), with a progress bar.
    """
    files = safetensors_files(model_path)
    total = 0
    for file in files:
        with safe_open(file, framework="pt") as f:
            total += len(f.keys())
    with tqdm(total=total, desc=tr("Loading weights"), unit=tr("tensor")) as bar:
        for file in files:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
                    bar.update()


def load_weights(model: BaseOP, model_path: str | Path) -> None:
    """把检查点里的张量逐个装进模型；缺了、多了或形状不对都报出张量的名字。

    en: Load the checkpoint's tensors into the model one by one; a missing, extra or wrongly shaped tensor is reported
    by name.
    """
    slots = model.checkpoint_slots()
    # TODO 任务 load_weights：把检查点里的每个张量装进 slots 给它的位置。出错都抛 ValueError 并写出张量名：检查点里有、模型里没处放的（以 IGNORED_SUFFIXES 结尾的和共享权重时多存的 lm_head.weight 除外，这两种跳过）；形状不对的（保留原消息里的两个形状）；全部读完后模型里还空着的位置。给定：iter_safetensors、slots、各算子的 load_weight
    # TODO task load_weights: load every checkpoint tensor into the place slots gives it. Every error is a ValueError naming the tensor: one the checkpoint has but the model has no place for (except those ending in IGNORED_SUFFIXES and the extra lm_head.weight saved with tied weights: skip those); a wrong shape (keeping both shapes of the original message); and, once everything is read, any place in the model still empty. Given: iter_safetensors, slots, each operator's load_weight
    raise TaskNotDone("models", "load_weights")


def load_dummy_weights(model: BaseOP, seed: int = 0) -> None:
    """不读文件，填上随机权重（只测速度和形状时用）：归一化权重为 1，其余 ~ N(0, 0.02)。

    en: Fill in random weights without reading a file (for speed and shape tests only): norm weights are 1, the rest ~
    N(0, 0.02).
    """
    gen = torch.Generator().manual_seed(seed)
    for name, w in model.state_dict().items():
        if name.endswith("norm.weight"):
            w.fill_(1.0)
        else:
            w.copy_(torch.randn(w.shape, generator=gen) * 0.02)
