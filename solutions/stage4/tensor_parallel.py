"""第 4.2 章 tensor_parallel：把每一层切给几个秩（Megatron 的切法），一个秩从不持有整个模型。

一个解码层里的矩阵乘法成对出现：先放大（q/k/v、gate/up），再缩回（o_proj、down）。Megatron 的切法让每对只通信一次：

- **按列切**（:class:`ColumnParallelLinear`）：q/k/v 和 gate/up 的**输出**切开，秩 r 算它那几个头（那一段中间维）。
  输入每个秩都有整份，输出各算各的，不用通信；注意力本来就按头各算各的，SwiGLU 按元素，也不用；
- **按行切**（:class:`RowParallelLinear`）：o_proj 和 down 的**输入**切开，正好接住上一步各秩自己的那段；各秩的结果是
  部分和，一次 ``all_reduce`` 加起来。偏置只能加一次：加在求和之后；
- **词表切开**：嵌入（:class:`VocabParallelEmbedding`）每个秩只存一段词表，不归它管的 id 查出 0，再 ``all_reduce``；
  LM head（:class:`ParallelLMHead`）每个秩算它那段词表的 logits，``all_gather`` 拼成整个词表；
- **KV 头比秩少**时（``tp > num_kv_heads``）KV 头不能再切，只能复制：秩 r 用第 ``r * num_kv_heads // tp`` 个。

所以每层正好两次 ``all_reduce``，整个前向再加嵌入一次、LM head 一次 ``all_gather``。

切不开的（头数、中间维或词表不能被 ``tp`` 整除）在加载任何权重之前就报错，并说出哪些 ``tp`` 行得通。
权重一个张量一个张量地读，每个秩只拷走自己那一片。

en: Chapter 4.2 tensor_parallel: cut every layer among a few ranks (Megatron's way); no rank ever holds the whole model.

The matrix multiplications of a decoder layer come in pairs: first widen (q/k/v, gate/up), then narrow back (o_proj,
down). Megatron's cut makes each pair communicate once:

- **column-parallel** (:class:`ColumnParallelLinear`): the **output** of q/k/v and gate/up is cut, rank r computes its
  heads (its stretch of the intermediate dimension). Every rank has the whole input and computes its own outputs, no
  communication; attention works head by head anyway and SwiGLU element by element, so neither needs any;
- **row-parallel** (:class:`RowParallelLinear`): the **input** of o_proj and down is cut, matching exactly what each rank
  produced in the step before; each rank's result is a partial sum, added up by one ``all_reduce``. The bias may be
  added once only: after the sum;
- **the vocabulary cut**: the embedding (:class:`VocabParallelEmbedding`) keeps one stretch of the vocabulary per rank,
  ids it does not own look up 0, then ``all_reduce``; the LM head (:class:`ParallelLMHead`) computes the logits of its
  stretch on each rank, and ``all_gather`` joins the whole vocabulary;
- **fewer KV heads than ranks** (``tp > num_kv_heads``): a KV head cannot be cut further, only copied: rank r uses head
  ``r * num_kv_heads // tp``.

So each layer makes exactly two ``all_reduce``, and the whole forward one more for the embedding and one ``all_gather``
for the LM head.

What cannot be cut (heads, intermediate size or vocabulary not divisible by ``tp``) is refused before any weight is
loaded, naming the ``tp`` values that work. Weights are read one tensor at a time, and each rank copies only its slice.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from minisgl.architectures import create_split_model_for
from minisgl.distributed import get_tp_comm, get_tp_info
from minisgl.engine import Engine
from minisgl.i18n import tr
from minisgl.layers import Linear, LMHead, VocabEmbedding
from minisgl.models import CausalLM, ModelConfig, create_model


# ----------------------------------------------------------------------------- 切得开吗
# en: ----------------------------------------------------------------------------- can it be split


def split_problems(config: ModelConfig, tp: int) -> list[str]:
    """``config`` 在 ``tp`` 个秩上切不开的地方，一条一句；切得开就是空列表。

    en: Where ``config`` cannot be split over ``tp`` ranks, one sentence each; an empty list when it can.
    """
    # >>> TASK split_problems: tp 必须 ≥ 1；query 头数、中间维、词表都要能被 tp 整除；KV 头数要么能被 tp 整除，要么整除 tp（复制）；每条不满足的写一句（带上数字）
    # en: tp must be ≥ 1; the query heads, the intermediate size and the vocabulary must each be divisible by tp; the KV heads must either be divisible by tp or divide tp (copied); one sentence (with the numbers) for each that fails
    if tp < 1:
        return [tr("tp must be at least 1, got {tp}", tp=tp)]
    problems = []
    if config.num_qo_heads % tp:
        problems.append(tr("{n} query heads do not split into {tp} equal parts", n=config.num_qo_heads, tp=tp))
    if config.intermediate_size % tp:
        problems.append(tr("the intermediate size {n} does not split into {tp} equal parts", n=config.intermediate_size,
                           tp=tp))
    if config.vocab_size % tp:
        problems.append(tr("the vocabulary of {n} does not split into {tp} equal parts", n=config.vocab_size, tp=tp))
    kv = config.num_kv_heads
    if kv % tp and tp % kv:
        problems.append(tr("{kv} KV heads neither split into {tp} parts nor divide {tp} (to be copied)", kv=kv, tp=tp))
    return problems
    # <<< TASK


def check_tp_split(config: ModelConfig, tp: int) -> None:
    """切不开就抛 ValueError：说出哪里切不开，以及 1..头数 里哪些 ``tp`` 行得通。加载权重之前调用。

    en: Raise ValueError when it cannot be split: say where, and which ``tp`` in 1..heads work. Call before loading
    weights.
    """
    problems = split_problems(config, tp)
    if problems:
        works = [n for n in range(1, config.num_qo_heads + 1) if not split_problems(config, n)]
        raise ValueError(tr("This model cannot be split over {tp} ranks: {problems}. Sizes that work: {works}",
                            tp=tp, problems="; ".join(problems), works=", ".join(map(str, works))))


def local_config(config: ModelConfig, tp: int) -> ModelConfig:
    """一个秩存的形状：头数、KV 头数（至少 1 个）、中间维、词表都除以 ``tp``。

    en: The shapes one rank stores: heads, KV heads (at least 1), intermediate size and vocabulary divided by ``tp``.
    """
    return dataclasses.replace(config, num_qo_heads=config.num_qo_heads // tp,
                               num_kv_heads=max(1, config.num_kv_heads // tp),
                               intermediate_size=config.intermediate_size // tp, vocab_size=config.vocab_size // tp)


# ----------------------------------------------------------------------------- 切开的层
# en: ----------------------------------------------------------------------------- the split layers


class ColumnParallelLinear(Linear):
    """按输出切：``full_sizes`` 是检查点里各段（q、k、v 或 gate、up）的整段行数，每段各切 ``tp`` 份，本秩拿第
    ``rank`` 份。不通信。

    en: Split by output: ``full_sizes`` are the checkpoint's whole row counts of each part (q, k, v or gate, up); each
    part is cut into ``tp`` pieces and this rank takes piece ``rank``. No communication.
    """

    def __init__(self, input_size: int, full_sizes: list[int], *, bias: bool, shard_names: list[str] | None,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.tp = get_tp_info()
        self.full_sizes = list(full_sizes)
        local = [self.rows(i)[1] for i in range(len(full_sizes))]
        super().__init__(input_size, local, bias=bias, shard_names=shard_names, dtype=dtype, device=device)

    def rows(self, shard: int) -> tuple[int, int]:
        """第 ``shard`` 段在检查点张量里属于本秩的行：``(起始行, 行数)``。

        en: The rows of part ``shard`` in the checkpoint tensor that belong to this rank: ``(first row, row count)``.
        """
        # >>> TASK column_rows: 这一段整段 full_sizes[shard] 行平均切成 tp 份，本秩（self.tp.rank）拿第 rank 份
        # en: the part's full_sizes[shard] rows cut evenly into tp pieces; this rank (self.tp.rank) takes piece rank
        n = self.full_sizes[shard] // self.tp.size
        return self.tp.rank * n, n
        # <<< TASK

    def load_weight(self, attr: str, tensor: torch.Tensor, shard: int = 0) -> None:
        start, n = self.rows(shard)
        super().load_weight(attr, tensor.narrow(0, start, n), shard)


class QKVParallelLinear(ColumnParallelLinear):
    """合并的 q/k/v，按头切。KV 头比秩少时，k、v 段不切而是复制：秩 r 用第 ``r * num_kv_heads // tp`` 个 KV 头。

    en: The merged q/k/v, split by heads. With fewer KV heads than ranks the k and v parts are copied, not cut: rank r
    uses KV head ``r * num_kv_heads // tp``.
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        self.num_kv_heads, self.head_dim = config.num_kv_heads, config.head_dim
        q, kv = config.num_qo_heads * config.head_dim, config.num_kv_heads * config.head_dim
        super().__init__(config.hidden_size, [q, kv, kv], bias=config.attention_bias,
                         shard_names=["q_proj", "k_proj", "v_proj"], dtype=dtype, device=device)

    def rows(self, shard: int) -> tuple[int, int]:
        # >>> TASK kv_heads_copied: q 段（shard 0）、以及 KV 头数 ≥ tp 时，照父类切；否则本秩用第 rank * num_kv_heads // tp 个 KV 头：从它的第一行起 head_dim 行
        # en: the q part (shard 0), and KV heads ≥ tp, split as the parent does; otherwise this rank uses KV head rank * num_kv_heads // tp: head_dim rows from its first row
        if shard == 0 or self.num_kv_heads >= self.tp.size:
            return super().rows(shard)
        head = self.tp.rank * self.num_kv_heads // self.tp.size
        return head * self.head_dim, self.head_dim
        # <<< TASK


class RowParallelLinear(Linear):
    """按输入切：权重 ``[out, in / tp]``，本秩拿第 ``rank`` 段列；各秩的结果是部分和，``all_reduce`` 加起来，
    偏置（每个秩都存了整份）在求和之后加一次。

    en: Split by input: the weight is ``[out, in / tp]``, this rank takes column stretch ``rank``; each rank's result is
    a partial sum, added up by ``all_reduce``, and the bias (every rank stores all of it) is added once, after the sum.
    """

    def __init__(self, full_input: int, output_size: int, *, bias: bool, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        self.tp = get_tp_info()
        super().__init__(full_input // self.tp.size, output_size, bias=bias, dtype=dtype, device=device)

    def load_weight(self, attr: str, tensor: torch.Tensor, shard: int = 0) -> None:
        # >>> TASK row_load: 权重（二维）取本秩那段列：narrow(1, rank * 本地输入宽, 本地输入宽)；偏置（一维）整份装
        # en: the weight (2-D) takes this rank's column stretch: narrow(1, rank * local input width, local input width); the bias (1-D) is loaded whole
        if tensor.dim() == 2:
            n = tensor.shape[1] // self.tp.size
            tensor = tensor.narrow(1, self.tp.rank * n, n)
        super().load_weight(attr, tensor, shard)
        # <<< TASK

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # >>> TASK row_forward: 不带偏置的部分和 self.matmul(x, None)，交给 get_tp_comm().all_reduce，之后（有偏置时）加偏置
        # en: the partial sum without bias self.matmul(x, None), passed to get_tp_comm().all_reduce, then add the bias (if any)
        y = get_tp_comm().all_reduce(self.matmul(x, None))
        return y if self.bias is None else y + self.bias
        # <<< TASK


class VocabParallelEmbedding(VocabEmbedding):
    """每个秩存词表的一段：第 ``rank`` 段 ``[start, start + n)``。

    en: Each rank stores one stretch of the vocabulary: stretch ``rank``, ``[start, start + n)``.
    """

    def __init__(self, vocab_size: int, hidden_size: int, *, dtype: torch.dtype, device: torch.device | str) -> None:
        tp = get_tp_info()
        self.num_local = vocab_size // tp.size
        self.start = tp.rank * self.num_local
        super().__init__(self.num_local, hidden_size, dtype=dtype, device=device)

    def load_weight(self, attr: str, tensor: torch.Tensor, shard: int = 0) -> None:
        super().load_weight(attr, tensor.narrow(0, self.start, self.num_local), shard)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # >>> TASK vocab_embedding_forward: mine = start ≤ id < start + num_local；查 (id - start)（不归本秩的先换成 0，免得越界），再把不归本秩的行清零；get_tp_comm().all_reduce 之后每个秩都有整份
        # en: mine = start ≤ id < start + num_local; look up (id - start) (ids not owned replaced by 0 first, so nothing is out of range), then zero the rows not owned; after get_tp_comm().all_reduce every rank has the whole result
        mine = (input_ids >= self.start) & (input_ids < self.start + self.num_local)
        local = torch.where(mine, input_ids - self.start, 0)
        out = F.embedding(local, self.weight).masked_fill_(~mine.unsqueeze(-1), 0)
        return get_tp_comm().all_reduce(out)
        # <<< TASK


class ParallelLMHead(LMHead):
    """每个秩算它那段词表的 logits，``all_gather`` 拼成整个词表（按秩号，正好是词表的顺序）。共享权重时与
    :class:`VocabParallelEmbedding` 共用同一段。

    en: Each rank computes the logits of its vocabulary stretch, and ``all_gather`` joins the whole vocabulary (in rank
    order, which is the vocabulary's order). With tied weights it shares the same stretch as
    :class:`VocabParallelEmbedding`.
    """

    def __init__(self, vocab_size: int, hidden_size: int, *, tie_to: VocabParallelEmbedding | None,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        tp = get_tp_info()
        self.num_local = vocab_size // tp.size
        self.start = tp.rank * self.num_local
        super().__init__(self.num_local, hidden_size, tie_to=tie_to, dtype=dtype, device=device)

    def load_weight(self, attr: str, tensor: torch.Tensor, shard: int = 0) -> None:
        super().load_weight(attr, tensor.narrow(0, self.start, self.num_local), shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # >>> TASK lm_head_gather: 父类的前向算出本段 logits [B, vocab / tp]，get_tp_comm().all_gather 拼成 [B, vocab]
        # en: the parent's forward gives this stretch's logits [B, vocab / tp]; get_tp_comm().all_gather joins them into [B, vocab]
        return get_tp_comm().all_gather(super().forward(x))
        # <<< TASK


# ----------------------------------------------------------------------------- 切开的模型
# en: ----------------------------------------------------------------------------- the split model


def create_tp_model(config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> CausalLM:
    """本秩的模型：第 1.3 章的解码器按 :func:`local_config` 的形状搭起来，再把线性层、嵌入和 LM head 换成切开的。
    ``model.config`` 是本秩的形状（KV 池和注意力后端按它分配）。切不开时在分配任何权重之前报错。

    en: This rank's model: chapter 1.3's decoder built at the shapes of :func:`local_config`, then its linear layers,
    embedding and LM head swapped for split ones. ``model.config`` is this rank's shapes (the KV pool and attention
    backend are sized from it). Refused before any weight is allocated when it cannot be split.
    """
    tp = get_tp_info().size
    check_tp_split(config, tp)
    kw = {"dtype": dtype, "device": device}
    model = create_model(local_config(config, tp), dtype, device)
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj = QKVParallelLinear(config, **kw)
        attn.o_proj = RowParallelLinear(config.num_qo_heads * config.head_dim, config.hidden_size,
                                        bias=config.attention_bias, **kw)
        mlp.gate_up_proj = ColumnParallelLinear(config.hidden_size, [config.intermediate_size] * 2, bias=config.mlp_bias,
                                                shard_names=["gate_proj", "up_proj"], **kw)
        mlp.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias, **kw)
    model.model.embed_tokens = embed = VocabParallelEmbedding(config.vocab_size, config.hidden_size, **kw)
    model.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size,
                                   tie_to=embed if config.tie_word_embeddings else None, **kw)
    model.tp_size = tp
    return model


class TPEngine(Engine):
    """本秩的引擎：与第 1.6 章相同，只是模型是切开的那份（先 :func:`~minisgl.distributed.init_distributed`）。

    en: This rank's engine: the same as chapter 1.6, except that the model is the split one (call
    :func:`~minisgl.distributed.init_distributed` first).
    """

    def build_model(self) -> CausalLM:
        # 混合专家模型由第 4.5 章切（见 minisgl/architectures.py）
        # en: mixtures of experts are split by chapter 4.5 (see minisgl/architectures.py)
        return create_split_model_for(self.model_config, self.dtype, self.device, self.config.ep_size)

    def _determine_num_pages(self, free_before: int, model_bytes: int) -> int:
        """每个秩按自己看到的空闲内存算出一个页数，大家取最小的那个：页数不同，秩们就会收下不同的请求、各走各的步，
        集合通信从此对不上。

        en: Each rank works out a page count from the free memory it sees, and all take the smallest: with different
        page counts the ranks would admit different requests and take different steps, and their collectives would no
        longer match.
        """
        # >>> TASK agree_pages: 先按第 1.6 章的办法（super()）算出本秩的页数，再用通信器的 agree_min 让所有秩取最小值
        # en: first this rank's count the chapter 1.6 way (super()), then make every rank take the smallest with the communicator's agree_min
        return get_tp_comm().agree_min(super()._determine_num_pages(free_before, model_bytes))
        # <<< TASK
