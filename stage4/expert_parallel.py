# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint expert_parallel <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint expert_parallel <task>` gives the next hint.
"""第 4.5 章 expert_parallel：混合专家切给几个秩——每个专家切开（张量并行），或者专家分给各秩（专家并行）。

第 4.4 章的 MoE 层在一个进程里持有全部专家。切给 ``n`` 个秩（注意力照第 4.2 章切）有两种办法：

- **张量并行**（:class:`TPFusedMoE`，``ep_size = 1``）：每个秩都有每个专家，但只有它中间维的 ``1/n``：gate/up 按行切、
  down 按列切，和第 4.2 章的 MLP 一样；每个秩算出部分和，一次 ``all_reduce``。每层通信 ``T × H``，与路由无关；
  可每个专家的矩阵都变窄了，专家本来就小（Qwen3-30B-A3B 的每个专家中间维只有 768），切 8 份就只剩 96；
- **专家并行**（:class:`EPMoE`，``ep_size = n``）：秩 ``r`` 持有一段连续的专家（:func:`expert_range`），每个都是整的。
  token 得**去**持有它的专家的秩那里：每个秩负责 ``T`` 个 token 里的一段（:func:`token_range`），把这段的每个
  ``(token, 选择)`` 对送到持有那个专家的秩（**派发**，各秩之间的条数由路由决定、不等，可以是 0），那边按本地专家
  分组算完，结果再回到来的秩（**合并**），乘上路由权重、按 token 加起来。派发和合并之间怎么通信、记下什么，是你设计的
  协议，预算是两者一共最多 3 次 ``all_to_all``。最后各段拼回整份 ``[T, H]``（这里用一次 ``all_reduce``：注意力按
  第 4.2 章切，每个秩都要全部 token）。

哪个划算看计数：专家并行每个 token 发 ``k`` 行（发到别的秩的那部分）再收回来，外加拼回；张量并行每层一次 ``T × H``。
专家并行的负载还取决于路由：热门专家所在的秩要算的行多，别的秩等它（``tokens_per_expert`` 看得出来）。

en: Chapter 4.5 expert_parallel: a mixture of experts over several ranks — each expert split (tensor parallel), or the
experts dealt out to the ranks (expert parallel).

Chapter 4.4's MoE layer holds every expert in one process. Over ``n`` ranks (attention split as in chapter 4.2) there
are two ways:

- **tensor parallel** (:class:`TPFusedMoE`, ``ep_size = 1``): every rank has every expert, but only ``1/n`` of its
  intermediate dimension: gate/up cut by rows, down by columns, like chapter 4.2's MLP; each rank computes a partial sum,
  one ``all_reduce``. Each layer communicates ``T × H`` whatever the routing; but each expert's matrices get narrow, and
  experts are small to begin with (each of Qwen3-30B-A3B's has an intermediate size of 768: 96 once cut 8 ways);
- **expert parallel** (:class:`EPMoE`, ``ep_size = n``): rank ``r`` holds a contiguous block of experts
  (:func:`expert_range`), each whole. Tokens must *travel* to the rank holding their expert: each rank takes charge of
  one stretch of the ``T`` tokens (:func:`token_range`) and gets each ``(token, choice)`` pair of it to the rank holding
  that expert (**dispatch**: the counts between ranks follow the routing, uneven, possibly 0); there it is computed
  grouped by local expert, and the result goes back to the rank it came from (**combine**), multiplied by the routing
  weights and added up per token. How dispatch and combine communicate, and what they note, is a protocol you design,
  within a budget of at most 3 ``all_to_all`` for the two together. Last, the stretches are joined into the whole
  ``[T, H]`` again (here one ``all_reduce``: attention is split as in chapter 4.2, so every rank needs every token).

Which one pays is a matter of counting: expert parallelism sends ``k`` rows per token (the part bound for other ranks)
and gets them back, plus the join; tensor parallelism moves ``T × H`` once per layer. Expert parallelism's load also
depends on the routing: the rank holding a popular expert has more rows to compute while the others wait
(``tokens_per_expert`` shows it).
"""

from __future__ import annotations

from minisgl.course.skeleton import TaskNotDone

from typing import Any, TypeAlias

import torch

from minisgl.distributed import get_tp_comm, get_tp_info
from minisgl.i18n import tr
from minisgl.models import CausalLM
from minisgl.moe import FusedMoE, MoeConfig, fused_experts, put_experts
from minisgl.tensor_parallel import create_tp_model, split_problems

# ----------------------------------------------------------------------------- 切得开吗
# en: ----------------------------------------------------------------------------- can it be split


def moe_split_problems(config: MoeConfig, tp: int, ep: int) -> list[str]:
    """第 4.2 章的条件（注意力、稠密层、词表），加上专家的：``ep`` 为 1 时每个专家的中间维要能被 ``tp`` 整除；
    ``ep`` 大于 1 时要等于 ``tp``，专家数要能被它整除。

    en: Chapter 4.2's conditions (attention, dense layers, vocabulary) plus the experts': with ``ep`` 1 each expert's
    intermediate size must be divisible by ``tp``; with ``ep`` above 1 it must equal ``tp`` and divide the number of
    experts.
    """
    problems = split_problems(config, tp)
    if ep not in (1, tp):
        problems.append(tr("ep {ep} must be 1 or equal to tp {tp} (the experts are spread over the same ranks)", ep=ep,
                           tp=tp))
    elif ep == 1 and tp > 0 and config.moe_intermediate_size % tp:
        problems.append(tr("the experts' intermediate size {n} does not split into {tp} equal parts",
                           n=config.moe_intermediate_size, tp=tp))
    elif ep > 1 and config.num_experts % ep:
        problems.append(tr("{n} experts do not split over {ep} ranks", n=config.num_experts, ep=ep))
    return problems


def check_moe_split(config: MoeConfig, tp: int, ep: int) -> None:
    """切不开就抛 ValueError，说出哪里切不开，以及哪些大小行得通。加载权重之前调用。

    en: Raise ValueError when it cannot be split, saying where and which sizes work. Call before loading weights.
    """
    problems = moe_split_problems(config, tp, ep)
    if problems:
        works = [n for n in range(1, config.num_qo_heads + 1) if not moe_split_problems(config, n, 1 if ep == 1 else n)]
        raise ValueError(tr("This model cannot be split over {tp} ranks with ep {ep}: {problems}. Sizes that work: {works}",
                            tp=tp, ep=ep, problems="; ".join(problems), works=", ".join(map(str, works))))


# ----------------------------------------------------------------------------- 张量并行的专家
# en: ----------------------------------------------------------------------------- tensor-parallel experts


class TPFusedMoE(FusedMoE):
    """每个秩都有每个专家的 ``1/tp``：中间维的第 ``rank`` 段。``bytes_moved`` 累计本秩交给集合通信的字节数。

    en: Every rank has ``1/tp`` of every expert: stretch ``rank`` of the intermediate dimension. ``bytes_moved`` counts
    the bytes this rank hands to collectives.
    """

    def __init__(self, num_experts: int, hidden_size: int, full_intermediate: int, *, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        self.tp = get_tp_info()
        super().__init__(num_experts, hidden_size, full_intermediate // self.tp.size, dtype=dtype, device=device)
        self.bytes_moved = 0

    def load_weight(self, attr: str, tensor: torch.Tensor, shard: int = 0) -> None:
        # TODO 任务 tp_expert_load：本秩只留每个专家中间维的第 rank 段（段长就是本层的 intermediate_size，构造时已经除过秩数）：gate、up（[I, H]，装进 w13）的中间维在行上，down（[H, I]，装进 w2）的在列上。切好之后，片号不变地交给父类
        # TODO task tp_expert_load: this rank keeps only stretch rank of each expert's intermediate dimension (each stretch as long as this layer's intermediate_size, already divided by the rank count): for gate and up ([I, H], into w13) it runs along the lines, for down ([H, I], into w2) along the columns. Hand the cut piece to the parent with its piece number unchanged
        raise TaskNotDone("expert_parallel", "tp_expert_load")

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        # TODO 任务 tp_moe_forward：返回与没切的专家层相同的 [T, H]，每个秩都拿到整份：父类用本秩那段中间维算出的只是部分和，要在所有秩之间加起来（每次前向正好一次 all_reduce）；bytes_moved 加上交给这次通信的字节数
        # TODO task tp_moe_forward: return the same [T, H] as the unsplit experts, every rank getting all of it: what the parent computes from this rank's stretch of the intermediate dimension is only part of the sum, to be added up over all ranks (exactly one all_reduce per call); bytes_moved grows by the bytes handed to that communication
        raise TaskNotDone("expert_parallel", "tp_moe_forward")


# ----------------------------------------------------------------------------- 专家并行
# en: ----------------------------------------------------------------------------- expert parallelism


def expert_range(num_experts: int, rank: int, size: int) -> range:
    """秩 ``rank``（共 ``size`` 个）持有的专家：连续的一段，每个秩一样多。

    en: The experts rank ``rank`` (of ``size``) holds: one contiguous block, the same count on every rank.
    """
    # TODO 任务 expert_range：返回本秩持有的专家号：连续的一段 range，每个秩一样多，秩号小的拿编号小的（调用前已查过能整除）。调用方拿它判断归属、换算本地编号、分配权重
    # TODO task expert_range: return the expert numbers this rank holds: one contiguous range, the same count on every rank, lower ranks holding lower numbers (divisibility was checked before). Callers use it to test ownership, to turn numbers into local ones and to allocate the weights
    raise TaskNotDone("expert_parallel", "expert_range")


def token_range(num_tokens: int, rank: int, size: int) -> range:
    """``num_tokens`` 个 token 里由秩 ``rank`` 派发的那一段：连续的，前 ``num_tokens % size`` 个秩各多一个
    （token 比秩少时，有的秩一段是空的）。

    en: The stretch of ``num_tokens`` tokens that rank ``rank`` dispatches: contiguous, the first ``num_tokens % size``
    ranks one more each (with fewer tokens than ranks some ranks get an empty stretch).
    """
    base, extra = divmod(num_tokens, size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


#: 派发交给合并的记录：装什么、什么形状，由你设计（一个元组、一个字典、你自己定义的数据类都行）。给定的
#: :meth:`EPMoE.forward` 只把它原样从 ``dispatch`` 递给 ``combine``，从不看里面。
#: en: The record dispatch hands to combine: what it holds and in what shape is your design (a tuple, a dict, a
#: en: dataclass of your own). The given :meth:`EPMoE.forward` only passes it from ``dispatch`` to ``combine`` untouched and
#: en: never looks inside.
Dispatched: TypeAlias = Any


class EPMoE(FusedMoE):
    """本秩持有 :func:`expert_range` 那一段专家，每个都是整的；检查点里别的秩的专家装载时丢掉。``bytes_moved`` 累计
    本秩交给集合通信的字节数：派发、合并真正发给别的秩的（通信器的 ``sent_elsewhere`` 量出），加上拼回的整份。

    en: This rank holds the block of experts of :func:`expert_range`, each whole; other ranks' experts in the checkpoint
    are dropped while loading. ``bytes_moved`` counts the bytes this rank hands to collectives: what dispatch and combine
    really send to other ranks (measured by the communicator's ``sent_elsewhere``), plus the whole joined at the end.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        self.ep = get_tp_info()
        self.local = expert_range(num_experts, self.ep.rank, self.ep.size)
        super().__init__(len(self.local), hidden_size, intermediate_size, dtype=dtype, device=device)
        self.checkpoint_experts = num_experts
        self.bytes_moved = 0

    def load_weight(self, attr: str, tensor: torch.Tensor, shard: int = 0) -> None:
        # TODO 任务 ep_load：片号按检查点里的专家编（w13 每个专家两片，w2 每个专家一片）：不是本秩持有的专家就丢掉，什么都不装；是的就换成本秩自己的片号交给父类——父类只有本秩那几个专家的位置。给定：self.local
        # TODO task ep_load: piece numbers count over the checkpoint's experts (two pieces each in w13, one each in w2): drop pieces of experts this rank does not hold, loading nothing; renumber the others into this rank's own numbering and hand them to the parent, which only has room for this rank's experts. Given: self.local
        raise TaskNotDone("expert_parallel", "ep_load")

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Dispatched]:
        """把本秩这段 token（``x``：``[t, H]``，``topk_ids``：``[t, k]``，专家号是全局的）的每个 (token, 选择) 对
        送到持有那个专家的秩。返回本秩收到的行（每行一对）、它们的**本地**专家号（``0 .. 本秩专家数 - 1``），以及
        交给 :meth:`combine` 的记录（:data:`Dispatched`：由你设计）。

        en: Get each (token, choice) pair of this rank's tokens (``x``: ``[t, H]``, ``topk_ids``: ``[t, k]``, global
        expert numbers) to the rank holding that expert. Returns the rows this rank receives (one per pair), their
        **local** expert numbers (``0 .. this rank's expert count - 1``), and the record handed to :meth:`combine`
        (:data:`Dispatched`: your design).
        """
        comm, per_rank = get_tp_comm(), self.num_experts
        # TODO 任务 dispatch：返回 (收到的行, 它们的本地专家号, 交给合并的记录)：所有秩的 (token, 选择) 对里，专家归本秩的每一对在收到的行里正好一行（那个 token 的输入），同一位置上是它的专家在本秩的编号（0 到本秩专家数 − 1）；本秩这段 token 的每一对都正好送到持有它专家的那个秩一次，不去别的秩（各秩之间的条数不等，可以是 0）。记录里装什么由你设计，给定的 forward 原样把它递给 combine。t 可以是 0，这个秩照样参加通信。预算：派发加合并一共最多 3 次 comm.all_to_all，除此之外不做别的集合通信（最后的 all_reduce 是给定的 forward 做的）。给定：comm、per_rank
        # TODO task dispatch: return (rows received, their local expert numbers, a record for combine): among all ranks' (token, choice) pairs, each pair whose expert this rank holds appears exactly once in the rows received (that token's input), with its expert's number on this rank (0 to this rank's expert count − 1) at the same position; each pair of this rank's own tokens reaches the rank holding its expert exactly once and no other rank (uneven counts between ranks, possibly 0). What the record holds is your design: the given forward passes it to combine untouched. t may be 0, and the rank still joins the communication. Budget: dispatch and combine together make at most 3 comm.all_to_all calls and no other collective (the final all_reduce is the given forward's). Given: comm, per_rank
        raise TaskNotDone("expert_parallel", "dispatch")

    def combine(self, out_rows: torch.Tensor, topk_weights: torch.Tensor, sent: Dispatched) -> torch.Tensor:
        """``out_rows`` 是 :meth:`dispatch` 返回的那些行（同样的顺序）经专家算出的结果（每行权重 1）；把它们送回
        各自那一对来的秩，乘上路由权重，按 token 加成本秩这段的输出 ``[t, H]``。``sent`` 是 :meth:`dispatch`
        返回的记录。

        en: ``out_rows`` are the expert outputs (weight 1 per row) of the rows :meth:`dispatch` returned, in the same
        order; get each back to the rank its pair came from, multiply by the routing weights and add them up per token
        into this rank's stretch of the output, ``[t, H]``. ``sent`` is the record :meth:`dispatch` returned.
        """
        comm = get_tp_comm()
        # TODO 任务 combine：返回本秩这段 token 的输出 [t, H]，等于没切的专家层在这些 token 上的结果：每一行算好的结果都要回到它那一对来的秩（不去别的秩）、只算一次，乘上那一对的路由权重（换成行的类型），一个 token 的 k 对加在一起。t 可以是 0，这个秩照样参加通信。不超出派发时说的预算（两者一共最多 3 次 all_to_all）。给定：comm、sent（你的 dispatch 返回的记录）
        # TODO task combine: return this rank's stretch of the output, [t, H], equal to the unsplit experts on these tokens: each computed row must get back to the rank its pair came from (and to no other) and count exactly once, multiplied by that pair's routing weight (cast to the rows' dtype), a token's k pairs adding up. t may be 0, and the rank still joins the communication. Within the budget stated at dispatch (at most 3 all_to_all for the two together). Given: comm, sent (the record your dispatch returned)
        raise TaskNotDone("expert_parallel", "combine")

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """派发本秩这段 token → 本地专家分组算（第 4.4 章的 :func:`fused_experts`，每行权重 1）→ 合并 → 拼回 ``[T, H]``。
        派发、合并真正发给别的秩的字节由通信器的 ``sent_elsewhere`` 量出，与它们的协议、记录无关。

        en: Dispatch this rank's stretch of tokens → compute grouped by local expert (chapter 4.4's
        :func:`fused_experts`, weight 1 per row) → combine → join back into ``[T, H]``. The bytes dispatch and combine
        really send to other ranks are measured by the communicator's ``sent_elsewhere``, whatever their protocol and record.
        """
        mine = token_range(x.shape[0], self.ep.rank, self.ep.size)
        comm = get_tp_comm()
        before = comm.sent_elsewhere
        rows, local_ids, sent = self.dispatch(x[mine.start : mine.stop], topk_ids[mine.start : mine.stop])
        counts = self.count_tokens(local_ids)
        ones = torch.ones((rows.shape[0], 1), dtype=torch.float32, device=rows.device)
        out_rows = fused_experts(rows, self.w13, self.w2, ones, local_ids[:, None], counts)
        out = x.new_zeros(x.shape)
        out[mine.start : mine.stop] = self.combine(out_rows, topk_weights[mine.start : mine.stop], sent)
        # 派发、合并发给别的秩的，加上最后拼回的整份
        # en: what dispatch and combine sent to other ranks, plus the whole joined at the end
        self.bytes_moved += comm.sent_elsewhere - before + out.numel() * out.element_size() * (self.ep.size > 1)
        return comm.all_reduce(out)


# ----------------------------------------------------------------------------- 切开的 MoE 模型
# en: ----------------------------------------------------------------------------- the split MoE model


def create_moe_tp_model(config: MoeConfig, dtype: torch.dtype, device: torch.device | str, ep_size: int) -> CausalLM:
    """本秩的 MoE 模型：第 4.2 章切开的解码器，MoE 层的 ``mlp`` 换成路由器（每个秩整份）加上切开的专家——
    ``ep_size`` 为 1 时 :class:`TPFusedMoE`，否则 :class:`EPMoE`。切不开时在分配任何权重之前报错。

    en: This rank's MoE model: chapter 4.2's split decoder with the ``mlp`` of each MoE layer replaced by the router (whole
    on every rank) plus split experts — :class:`TPFusedMoE` with ``ep_size`` 1, :class:`EPMoE` otherwise. Refused before
    any weight is allocated when it cannot be split.
    """
    check_moe_split(config, get_tp_info().size, ep_size)
    experts_cls = EPMoE if ep_size > 1 else TPFusedMoE
    return put_experts(create_tp_model(config, dtype, device), config, dtype, device, lambda: experts_cls(
        config.num_experts, config.hidden_size, config.moe_intermediate_size, dtype=dtype, device=device))
