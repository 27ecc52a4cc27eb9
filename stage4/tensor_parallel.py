# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint tensor_parallel <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint tensor_parallel <task>` gives the next hint.
"""第 4.2 章 tensor_parallel：把每一层切给几个秩（Megatron 的切法），一个秩从不持有整个模型。

一个解码层里的矩阵乘法成对出现：先放大（q/k/v、gate/up），再缩回（o_proj、down）。Megatron 的切法让每对只通信一次：

- **按列切**（:class:`ColumnParallelLinear`）：q/k/v 和 gate/up 的**输出**切开，秩 r 算它那几个头（那一段中间维）。
  输入每个秩都有整份，输出各算各的，不用通信；注意力本来就按头各算各的，SwiGLU 按元素，也不用；
- **按行切**（:class:`RowParallelLinear`）：o_proj 和 down 的**输入**切开，正好接住上一步各秩自己的那段；各秩的结果是
  部分和，一次 ``all_reduce`` 加起来。偏置只能加一次：加在求和之后；
- **词表切开**：嵌入（:class:`VocabParallelEmbedding`）每个秩只存一段词表，不归它管的 id 查出 0，再 ``all_reduce``；
  LM head（:class:`ParallelLMHead`）每个秩算它那段词表的 logits，``all_gather`` 拼成整个词表；
- **KV 头比秩少**时（``tp > num_kv_heads``）KV 头不能再切，只能复制：每个秩存一个完整的 KV 头，几个秩共用同一个。

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
- **fewer KV heads than ranks** (``tp > num_kv_heads``): a KV head cannot be cut further, only copied: each rank stores
  one whole KV head, and a few ranks share the same one.

So each layer makes exactly two ``all_reduce``, and the whole forward one more for the embedding and one ``all_gather``
for the LM head.

What cannot be cut (heads, intermediate size or vocabulary not divisible by ``tp``) is refused before any weight is
loaded, naming the ``tp`` values that work. Weights are read one tensor at a time, and each rank copies only its slice.
"""

from __future__ import annotations

from minisgl.course.skeleton import TaskNotDone

import dataclasses

import torch
import torch.nn.functional as F

from minisgl.architectures import refuse_ep, registered
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
    # TODO 任务 split_problems：返回切不开的每一处，各一句话、带上数字（都切得开就是空列表）；要一次列全，不能碰到第一处就停。每个秩要拿到同样多的整 query 头、同样长的一段中间维和一段词表；KV 头从不切开：要么每个秩分到同样多的整 KV 头，要么每个 KV 头复制给同样多的秩。tp < 1 只返回一句，不许抛异常
    # TODO task split_problems: return every place where it does not split, one sentence each with the numbers in it (an empty list when it splits); list them all, do not stop at the first. Every rank must get the same number of whole query heads, an equal stretch of the intermediate size and of the vocabulary; a KV head is never cut: either every rank gets the same number of whole KV heads, or every KV head is copied to the same number of ranks. tp < 1 gives just one sentence, never an exception
    raise TaskNotDone("tensor_parallel", "split_problems")


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
        n = self.full_sizes[shard] // self.tp.size
        return self.tp.rank * n, n

    def load_weight(self, attr: str, tensor: torch.Tensor, shard: int = 0) -> None:
        start, n = self.rows(shard)
        super().load_weight(attr, tensor.narrow(0, start, n), shard)


class QKVParallelLinear(ColumnParallelLinear):
    """合并的 q/k/v，按头切。KV 头比秩少时，k、v 段不切而是复制：几个秩存同一个完整的 KV 头。

    en: The merged q/k/v, split by heads. With fewer KV heads than ranks the k and v parts are copied, not cut: a few
    ranks store the same whole KV head.
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        self.num_kv_heads, self.head_dim = config.num_kv_heads, config.head_dim
        q, kv = config.num_qo_heads * config.head_dim, config.num_kv_heads * config.head_dim
        super().__init__(config.hidden_size, [q, kv, kv], bias=config.attention_bias,
                         shard_names=["q_proj", "k_proj", "v_proj"], dtype=dtype, device=device)

    def rows(self, shard: int) -> tuple[int, int]:
        # TODO 任务 kv_heads_copied：返回 (起始行, 行数)，和父类一样。q 段照父类切；KV 头至少和秩一样多时 k、v 段也照父类切；KV 头比秩少时一个 KV 头不能再切，只能复制：本秩拿一个完整的 KV 头，正是本秩那几个 query 头在没切的模型里读的那一个
        # TODO task kv_heads_copied: return (first row, row count) like the parent. The q part splits as the parent does, and so do the k and v parts when there are at least as many KV heads as ranks; with fewer KV heads than ranks a KV head cannot be cut further, only copied: this rank takes one whole KV head, the very one its query heads read in the unsplit model
        raise TaskNotDone("tensor_parallel", "kv_heads_copied")


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
        # TODO 任务 row_load：装好本秩的那份：权重（二维，[out, in]）只留本秩那一段输入列，偏置（一维）每个秩都装整份；真正的存放交给父类的 load_weight
        # TODO task row_load: load this rank's share: the weight (2-D, [out, in]) keeps only this rank's stretch of input columns, the bias (1-D) is loaded whole on every rank; the storing itself is the parent's load_weight
        raise TaskNotDone("tensor_parallel", "row_load")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO 任务 row_forward：返回和没切的线性层一样的结果：各秩用自己那段输入列算出的部分积在所有秩之间加起来，有偏置时只加一次、加在求和之后。一个秩时就是普通的线性层
        # TODO task row_forward: return what the unsplit linear layer returns: each rank's partial product (from its own input columns) summed over all ranks, and the bias, when there is one, added exactly once, after the sum. With one rank it is a plain linear layer
        raise TaskNotDone("tensor_parallel", "row_forward")


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
        # TODO 任务 vocab_embedding_forward：返回这些 id 在整张词表里查出的向量，每个秩都拿到整份。本秩只存 [start, start + num_local) 这段词表：段外的 id 本秩贡献 0 行，而且查表时不能越界；各秩的结果在所有秩之间相加
        # TODO task vocab_embedding_forward: return the vectors these ids look up in the whole vocabulary, every rank getting all of them. This rank stores only the stretch [start, start + num_local): for ids outside it this rank contributes zero rows, and its lookup must never go past its table; the ranks' results are summed over all ranks
        raise TaskNotDone("tensor_parallel", "vocab_embedding_forward")


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
        # TODO 任务 lm_head_gather：返回整个词表的 logits，[B, vocab]，每个秩都一样；按秩号把各段接起来正好是词表的顺序。本秩只算得出自己那段 [B, vocab / tp]，父类正好就算这个
        # TODO task lm_head_gather: return the logits over the whole vocabulary, [B, vocab], the same on every rank; the stretches joined in rank order are the vocabulary's order. This rank can compute only its own stretch [B, vocab / tp], which is exactly what the parent class computes
        raise TaskNotDone("tensor_parallel", "lm_head_gather")


# ----------------------------------------------------------------------------- 切开的模型
# en: ----------------------------------------------------------------------------- the split model


def create_tp_model(config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> CausalLM:
    """本秩的模型：它只存、只算本秩那一份，前向给出的 token 与没切的模型相同。``model.config`` 是本秩的形状（KV 池和
    注意力后端按它分配）。切不开时在分配任何权重之前报错。

    en: This rank's model: it stores and computes only this rank's share, and its forward gives the unsplit model's
    tokens. ``model.config`` is this rank's shapes (the KV pool and attention backend are sized from it). Refused before
    any weight is allocated when it cannot be split.
    """
    tp = get_tp_info().size
    # TODO 任务 tp_model：搭出本秩的模型 model：前向和没切的模型给出同样的 token；每个解码层正好通信两次，嵌入一次、LM head 一次；每个秩只存大约 1/tp 的权重，整份大小的形状一次也不分配；model.config 是本秩的形状（KV 池和注意力后端按它分配）；共享权重的模型切开后仍然共享；切不开时在分配任何权重之前就报错。一个秩时就是普通的模型。手边的零件：本章切开的各层、local_config、check_tp_split，第 1.3 章的 create_model
    # TODO task tp_model: build this rank's model, model: its forward gives the unsplit model's tokens; each decoder layer communicates exactly twice, plus once for the embedding and once for the LM head; each rank stores about 1/tp of the weights and never allocates a whole-size shape; model.config is this rank's shapes (the KV pool and attention backend are sized from it); a model with tied weights stays tied once split; what cannot be split is refused before any weight is allocated. With one rank it is the plain model. Parts at hand: this chapter's split layers, local_config, check_tp_split, chapter 1.3's create_model
    raise TaskNotDone("tensor_parallel", "tp_model")
    # 融合解码按这个数拒绝切开的模型（第 1.3 章的模型是 1）
    # en: the fused decode refuses a split model by this number (chapter 1.3's model says 1)
    model.tp_size = tp
    return model


class TPEngine(Engine):
    """本秩的引擎：与第 1.6 章相同，只是模型是切开的那份（先 :func:`~minisgl.distributed.init_distributed`）。

    en: This rank's engine: the same as chapter 1.6, except that the model is the split one (call
    :func:`~minisgl.distributed.init_distributed` first).
    """

    def build_model(self) -> CausalLM:
        # 后面的章节切的种类（混合专家：第 4.5 章，由组装登记；见 minisgl/architectures.py）
        # en: a kind a later chapter splits (mixtures of experts: chapter 4.5, registered by the assembly; see
        # en: minisgl/architectures.py)
        arch = registered(self.model_config.architecture)
        if arch is not None:
            return arch.create_split_model(self.model_config, self.dtype, self.device, self.config.ep_size)
        refuse_ep(self.model_config, self.config.ep_size)
        return create_tp_model(self.model_config, self.dtype, self.device)

    def _determine_num_pages(self, free_before: int, model_bytes: int) -> int:
        """每个秩按自己看到的空闲内存算出一个页数，大家取最小的那个：页数不同，秩们就会收下不同的请求、各走各的步，
        集合通信从此对不上。

        en: Each rank works out a page count from the free memory it sees, and all take the smallest: with different
        page counts the ranks would admit different requests and take different steps, and their collectives would no
        longer match.
        """
        # TODO 任务 agree_pages：返回所有秩都同意的 KV 页数：每个秩按第 1.6 章的办法、用自己看到的内存各算一个，取其中最小的。各秩看到的内存可以不同，得到的页数必须一样。给定：4.1 章通信器的 agree_min
        # TODO task agree_pages: return the KV page count every rank agrees on: each rank works one out the chapter 1.6 way from the memory it sees, and the smallest of them wins. The ranks may see different memory; the count they end up with must be the same. Given: the chapter 4.1 communicator's agree_min
        raise TaskNotDone("tensor_parallel", "agree_pages")
