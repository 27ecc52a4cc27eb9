"""第 4.4 章 moe：混合专家（Qwen3-MoE）——每个 token 只走几个专家，参数多、每步算得少。

稠密模型的每个 token 都要乘过每一层的整个 MLP。混合专家（MoE）层把 MLP 换成 ``E`` 个小 MLP（专家）和一个路由器：
路由器给每个 token 打 ``E`` 个分，softmax 之后取最大的 ``k`` 个专家，token 只经过这 ``k`` 个，结果按路由权重加起来。
Qwen3-30B-A3B 每层 128 个专家、每个 token 选 8 个：存 300 亿参数，每个 token 只算约 30 亿。

- **路由**（:func:`select_experts`）：对专家那一维做 softmax（fp32），取 top-k；``norm_topk_prob`` 时把选中的 k 个权重
  再归一化成和为 1；
- **参考实现**（:func:`experts_reference`）：一个专家一个专家地找出选了它的 token，算完按权重加回去——最直白，
  专家多时要做 ``E`` 次查找；
- **分组实现**（:func:`fused_experts`）：把 ``(token, 第几个选择)`` 这 ``T × k`` 对按专家排好序，同一个专家的行挨在
  一起，每个专家一次矩阵乘法，最后按 token 加回去。排好序的这一步，正是第 4.5 章把 token 发给别的秩时要做的；
- 哪些层是 MoE 由配置决定（:meth:`MoeConfig.is_sparse`）：``mlp_only_layers`` 里的层和不在 ``decoder_sparse_step``
  节拍上的层保留稠密 MLP。

专家的权重叠成两块 3-D 张量（:class:`FusedMoE`）：``w13[e]`` 是第 ``e`` 个专家合并的 gate/up（与第 1.2 章的
``gate_up_proj`` 同样的排布），``w2[e]`` 是它的 down。检查点里一个专家一个张量，装载时拷进各自的位置。

en: Chapter 4.4 moe: mixture of experts (Qwen3-MoE) — each token goes through a few experts only: many parameters, little
compute per step.

In a dense model every token is multiplied through each layer's whole MLP. A mixture-of-experts (MoE) layer replaces the
MLP with ``E`` small MLPs (experts) and a router: the router scores each token against the ``E`` experts, takes the
``k`` best after a softmax, the token goes through those ``k`` only, and their outputs are added up with the routing
weights. Qwen3-30B-A3B has 128 experts per layer and picks 8 per token: 30 billion parameters stored, about 3 billion
computed per token.

- **routing** (:func:`select_experts`): softmax over the experts' axis (fp32), top-k; with ``norm_topk_prob`` the k
  chosen weights are renormalised to sum to 1;
- **the reference** (:func:`experts_reference`): expert by expert, find the tokens that chose it, compute, add back with
  the weights — the plainest, with ``E`` searches when there are many experts;
- **the grouped path** (:func:`fused_experts`): sort the ``T × k`` pairs ``(token, which choice)`` by expert so that one
  expert's rows sit together, one matrix multiplication per expert, then add back per token. That sorting step is exactly
  what chapter 4.5 does before sending tokens to other ranks;
- which layers are MoE is the config's call (:meth:`MoeConfig.is_sparse`): layers in ``mlp_only_layers`` and layers off
  the ``decoder_sparse_step`` beat keep a dense MLP.

The experts' weights are stacked into two 3-D tensors (:class:`FusedMoE`): ``w13[e]`` is expert ``e``'s merged gate/up
(laid out like chapter 1.2's ``gate_up_proj``), ``w2[e]`` its down. The checkpoint holds one tensor per expert; loading
copies each into its place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minisgl.i18n import tr
from minisgl.layers import BaseOP, Linear, WeightSlot, check_shape, silu_and_mul
from minisgl.models import CausalLM, ModelConfig, create_model

#: MoE 架构 → 注意力部分与它相同的稠密架构（第 1.3 章读得懂的那个）。
#: en: MoE architecture -> the dense architecture whose attention it shares (the one chapter 1.3 reads).
MOE_ARCHITECTURES = {"Qwen3MoeForCausalLM": "Qwen3ForCausalLM"}


@dataclass(frozen=True)
class MoeConfig(ModelConfig):
    """第 1.3 章的 :class:`~minisgl.models.ModelConfig` 加上专家的形状。``intermediate_size`` 是稠密层的中间维，
    ``moe_intermediate_size`` 是每个专家的。

    en: Chapter 1.3's :class:`~minisgl.models.ModelConfig` plus the experts' shapes. ``intermediate_size`` is the dense
    layers' intermediate size, ``moe_intermediate_size`` each expert's.
    """

    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, hf: dict) -> MoeConfig:
        """注意力、嵌入这些与稠密模型相同的部分交给第 1.3 章读，这里只加专家的字段。

        en: The parts shared with the dense model (attention, embedding) are read by chapter 1.3; only the experts'
        fields are added here.
        """
        arch = (hf.get("architectures") or ["?"])[0]
        dense = ModelConfig.from_dict({**hf, "architectures": [MOE_ARCHITECTURES.get(arch, arch)]})
        # 发布的检查点写 num_experts，新版 transformers 存盘时写 num_local_experts
        # en: released checkpoints say num_experts, recent transformers save num_local_experts
        experts = hf["num_experts"] if "num_experts" in hf else hf["num_local_experts"]
        if experts and not 1 <= hf["num_experts_per_tok"] <= experts:
            raise ValueError(tr("num_experts_per_tok must be between 1 and num_experts ({experts}), got {k}",
                                experts=experts, k=hf["num_experts_per_tok"]))
        return cls(
            **{**dataclasses.asdict(dense), "architecture": arch},
            num_experts=experts,
            num_experts_per_tok=hf["num_experts_per_tok"],
            moe_intermediate_size=hf["moe_intermediate_size"],
            norm_topk_prob=hf.get("norm_topk_prob", False),
            decoder_sparse_step=hf.get("decoder_sparse_step", 1),
            mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
        )

    def is_sparse(self, layer_id: int) -> bool:
        """第 ``layer_id`` 层（从 0 数）是 MoE 层吗。与 Hugging Face 的 ``Qwen3MoeDecoderLayer`` 同一条规则。

        en: Is layer ``layer_id`` (counted from 0) an MoE layer? The same rule as Hugging Face's ``Qwen3MoeDecoderLayer``.
        """
        # >>> TASK sparse_layers: 返回这一层（从 0 数）是不是 MoE 层，规则与 Hugging Face 的 Qwen3MoeDecoderLayer 相同：mlp_only_layers 里的层永远稠密；模型没有专家时全都稠密；其余的层按配置的稀疏节拍每隔几层一个，节拍从第 1 层数起（节拍为 2 时，从 0 编号的 1、3、5…是 MoE）
        # en: return whether this layer (counted from 0) is an MoE layer, by the same rule as Hugging Face's Qwen3MoeDecoderLayer: layers in mlp_only_layers are always dense; with no experts everything is dense; any other layer is MoE on the config's sparse beat, once every few layers, counting the beat from layer 1 (with a beat of 2, layers 1, 3, 5, ... numbered from 0 are MoE)
        # hint1: 三个条件同时成立才是 MoE。易错的是节拍：层号从 0 数、节拍从 1 数，差一位就成了 0、2、4
        # en1: All three conditions must hold. The beat is where it goes wrong: layers are numbered from 0 but the beat counts from 1,
        # en1: and an off-by-one gives 0, 2, 4
        # hint2: return (layer_id not in self.mlp_only_layers and self.num_experts > 0 and (layer_id + 1) % self.decoder_sparse_step == 0)
        # en2: return (layer_id not in self.mlp_only_layers and self.num_experts > 0 and (layer_id + 1) % self.decoder_sparse_step == 0)
        return (
            layer_id not in self.mlp_only_layers
            and self.num_experts > 0
            and (layer_id + 1) % self.decoder_sparse_step == 0
        )
        # <<< TASK


# ----------------------------------------------------------------------------- 路由
# en: ----------------------------------------------------------------------------- routing


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """每个 token 选 ``top_k`` 个专家。``router_logits``：``[T, E]``。返回 ``(topk_weights, topk_ids)``，都是
    ``[T, top_k]``：权重是 fp32 的概率（按大小排），ids 是 int64 的专家号。

    en: Pick ``top_k`` experts per token. ``router_logits``: ``[T, E]``. Returns ``(topk_weights, topk_ids)``, both
    ``[T, top_k]``: the weights are fp32 probabilities (largest first), the ids int64 expert numbers.
    """
    # >>> TASK select_experts: 返回 (权重, 专家号)，都是 [T, top_k]：每个 token 选概率最大的 top_k 个专家，权重是 fp32 的概率（从大到小），专家号是 int64。概率一律在 fp32 里算，bf16 的 logits 也一样；renormalize 时每个 token 选中的权重之和为 1。与 Hugging Face 的路由器一致
    # en: return (weights, expert ids), both [T, top_k]: each token picks the top_k experts of highest probability; the weights are fp32 probabilities (largest first), the ids int64. Probabilities are always computed in fp32, bf16 logits too; with renormalize each token's chosen weights sum to 1. It must agree with Hugging Face's router
    # hint1: 概率是沿专家那一维的 softmax，让 softmax 自己先转成 fp32 再算；取前 k 个的那个函数同时给出值和下标。归一化之后权重别转回 logits 的类型
    # en1: The probabilities are a softmax along the experts' dimension; let the softmax itself cast to fp32 first.
    # en1: The top-k function gives values and indices together. Do not cast the weights back to the logits' dtype
    # hint2: 1. probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)；
    # hint2: 2. topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)；
    # hint2: 3. renormalize 时 topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)（keepdim 让它按行广播）；
    # hint2: 4. return topk_weights, topk_ids。
    # en2: 1. probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32);
    # en2: 2. topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1);
    # en2: 3. with renormalize, topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True) (keepdim makes it broadcast per row);
    # en2: 4. return topk_weights, topk_ids.
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids
    # <<< TASK


# ----------------------------------------------------------------------------- 专家
# en: ----------------------------------------------------------------------------- the experts


def expert_mlp(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """一个专家的 SwiGLU：``down(silu(gate(x)) * up(x))``，``w13`` 是合并的 gate/up（第 1.2 章的排布）。

    en: One expert's SwiGLU: ``down(silu(gate(x)) * up(x))``, ``w13`` being the merged gate/up (chapter 1.2's layout).
    """
    return F.linear(silu_and_mul(F.linear(x, w13)), w2)


def experts_reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor) -> torch.Tensor:
    """参考实现：每个 token 的输出 = 它选中的 k 个专家的输出按路由权重相加。``x``：``[T, H]``，``w13``：
    ``[E, 2I, H]``，``w2``：``[E, H, I]``，``topk_*``：``[T, k]``。返回 ``[T, H]``，与 ``x`` 同类型。

    en: The reference: each token's output = the outputs of its k chosen experts added up with the routing weights.
    ``x``: ``[T, H]``, ``w13``: ``[E, 2I, H]``, ``w2``: ``[E, H, I]``, ``topk_*``: ``[T, k]``. Returns ``[T, H]`` of
    ``x``'s dtype.
    """
    # >>> TASK experts_reference: 返回 [T, H]，与 x 同类型：每个 token 的输出是它选中的 k 个专家的输出、各乘自己那一格路由权重后的和。这是最直白的参考实现：一个专家一个专家地来，没被任何 token 选中的专家跳过；分组实现拿它来对。给定：expert_mlp
    # en: return [T, H] in x's dtype: each token's output is the sum of its k chosen experts' outputs, each times its own routing weight. This is the plain reference: go expert by expert, skipping experts no token chose; the grouped path is checked against it. Given: expert_mlp
    # hint1: 对每个专家，要的是“哪些 (token, 第几个选择) 选了它”——一次比较加上找非零下标就都有了。同一个 token 会从几个专家各加一次，
    # hint1: 加回去要用能累加重复下标的办法
    # en1: For each expert you need the (token, choice) pairs that chose it — one comparison and a search for the nonzero positions give them all.
    # en1: A token gets added to by several experts, so add back with something that accumulates repeated indices
    # hint2: 1. out = torch.zeros_like(x)；对 e in range(w13.shape[0])：
    # hint2: 2.   token, choice = torch.where(topk_ids == e)；token.numel() == 0 时 continue；
    # hint2: 3.   y = expert_mlp(x[token], w13[e], w2[e]) * topk_weights[token, choice, None].to(x.dtype)（None 加一维才能和 [n, H] 相乘）；
    # hint2: 4.   out.index_add_(0, token, y)；
    # hint2: 5. return out。
    # en2: 1. out = torch.zeros_like(x); for e in range(w13.shape[0]):
    # en2: 2.   token, choice = torch.where(topk_ids == e); if token.numel() == 0: continue;
    # en2: 3.   y = expert_mlp(x[token], w13[e], w2[e]) * topk_weights[token, choice, None].to(x.dtype) (None adds the dimension to multiply with [n, H]);
    # en2: 4.   out.index_add_(0, token, y);
    # en2: 5. return out.
    out = torch.zeros_like(x)
    for e in range(w13.shape[0]):
        token, choice = torch.where(topk_ids == e)
        if token.numel() == 0:
            continue
        y = expert_mlp(x[token], w13[e], w2[e]) * topk_weights[token, choice, None].to(x.dtype)
        out.index_add_(0, token, y)
    return out
    # <<< TASK


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """分组实现，结果与 :func:`experts_reference` 相同：``T × k`` 对按专家排序，每个专家一次矩阵乘法。``counts[e]``
    是选了专家 ``e`` 的 (token, 选择) 对数（调用方已经数好，在主机上）。

    en: The grouped path, with the same result as :func:`experts_reference`: the ``T × k`` pairs sorted by expert, one
    matrix multiplication per expert. ``counts[e]`` is the number of (token, choice) pairs that chose expert ``e``
    (counted by the caller, on the host).
    """
    # >>> TASK fused_experts: 返回与 experts_reference 相同的结果（[T, H]，x 的类型），但每个被选中的专家只调用一次 expert_mlp，一次算完它的全部 (token, 选择) 对；没人选的专家不调用。怎么把各专家的对凑到一起由你设计。counts（每个专家被选了几次）已在主机上数好：整个过程不要从设备上读回任何数（那会让 CPU 等 GPU）
    # en: return the same as experts_reference ([T, H], x's dtype), but call expert_mlp once per chosen expert, over all of its (token, choice) pairs at once; an expert nobody chose is not called. How the pairs of each expert are brought together is yours to design. counts (how often each expert was chosen) is already on the host: read no number back from the device at any point (that would make the CPU wait for the GPU)
    # hint1: 把专家号拉平了排序，排好的位置除以 k 就是它属于哪个 token；输入行和路由权重都要按同一个顺序取。最后同一个 token 的几行要累加回去，不是覆盖
    # en1: Sort the flattened expert ids: a sorted position divided by k is its token. Take both the input rows and the routing weights in that same order.
    # en1: In the end a token's rows must accumulate, not overwrite
    # hint2: 1. k = topk_ids.shape[1]；order = torch.argsort(topk_ids.reshape(-1))；token = order // k；
    # hint2: 2. rows = x[token]；out_rows = torch.empty_like(rows)；start = 0；
    # hint2: 3. for e, n in enumerate(counts)：n 不为 0 时 out_rows[start:start + n] = expert_mlp(rows[start:start + n], w13[e], w2[e])；无论如何 start += n；
    # hint2: 4. out_rows *= topk_weights.reshape(-1)[order, None].to(x.dtype)；
    # hint2: 5. return torch.zeros_like(x).index_add_(0, token, out_rows)。
    # en2: 1. k = topk_ids.shape[1]; order = torch.argsort(topk_ids.reshape(-1)); token = order // k;
    # en2: 2. rows = x[token]; out_rows = torch.empty_like(rows); start = 0;
    # en2: 3. for e, n in enumerate(counts): if n, out_rows[start:start + n] = expert_mlp(rows[start:start + n], w13[e], w2[e]); always start += n;
    # en2: 4. out_rows *= topk_weights.reshape(-1)[order, None].to(x.dtype);
    # en2: 5. return torch.zeros_like(x).index_add_(0, token, out_rows).
    k = topk_ids.shape[1]
    order = torch.argsort(topk_ids.reshape(-1))
    token = order // k
    rows = x[token]
    out_rows = torch.empty_like(rows)
    start = 0
    for e, n in enumerate(counts):
        if n:
            out_rows[start : start + n] = expert_mlp(rows[start : start + n], w13[e], w2[e])
        start += n
    out_rows *= topk_weights.reshape(-1)[order, None].to(x.dtype)
    return torch.zeros_like(x).index_add_(0, token, out_rows)
    # <<< TASK


class FusedMoE(BaseOP):
    """一层的全部专家，权重叠成 ``w13`` ``[E, 2I, H]`` 和 ``w2`` ``[E, H, I]``。``grouped`` 选分组实现（缺省）还是
    参考实现；``tokens_per_expert`` 累计每个专家收到过几个 (token, 选择) 对。

    en: All experts of one layer, their weights stacked as ``w13`` ``[E, 2I, H]`` and ``w2`` ``[E, H, I]``. ``grouped``
    picks the grouped path (the default) or the reference; ``tokens_per_expert`` counts the (token, choice) pairs each
    expert has received so far.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        self.w13 = torch.empty(num_experts, 2 * intermediate_size, hidden_size, dtype=dtype, device=device)
        self.w2 = torch.empty(num_experts, hidden_size, intermediate_size, dtype=dtype, device=device)
        self.grouped = True
        self.tokens_per_expert = [0] * num_experts
        # 检查点里有几个专家（:meth:`own_slots` 给每个都找个位置）；第 4.5 章只持有其中一部分时比 num_experts 多
        # en: how many experts the checkpoint has (:meth:`own_slots` finds each a place); more than num_experts when
        # en: chapter 4.5 holds only some of them
        self.checkpoint_experts = num_experts

    def own_slots(self, prefix: str) -> dict[str, WeightSlot]:
        """检查点里第 ``e`` 个专家的 ``gate_proj`` / ``up_proj`` 是 ``w13`` 的第 ``2e`` / ``2e + 1`` 片，``down_proj``
        是 ``w2`` 的第 ``e`` 片。

        en: Expert ``e``'s ``gate_proj`` / ``up_proj`` in the checkpoint are shards ``2e`` / ``2e + 1`` of ``w13``, its
        ``down_proj`` is shard ``e`` of ``w2``.
        """
        slots, base = {}, f"{prefix}." if prefix else ""
        for e in range(self.checkpoint_experts):
            slots[f"{base}{e}.gate_proj.weight"] = WeightSlot(self, "w13", 2 * e)
            slots[f"{base}{e}.up_proj.weight"] = WeightSlot(self, "w13", 2 * e + 1)
            slots[f"{base}{e}.down_proj.weight"] = WeightSlot(self, "w2", e)
        return slots

    def load_weight(self, attr: str, tensor: torch.Tensor, shard: int = 0) -> None:
        # >>> TASK expert_load: 把检查点里一个专家的一个权重拷进叠起来的那块，编号与 own_slots 一致：专家 e 的 gate、up 是 w13 的第 2e、2e+1 片，分别占 w13[e] 的前一半行和后一半行；down 是 w2 的第 e 片，即 w2[e]。形状不对时抛 ValueError（给定：check_shape）
        # en: copy one checkpoint weight of one expert into the stacked block, numbered as own_slots numbers them: expert e's gate and up are pieces 2e and 2e+1 of w13, the first and the second half of w13[e]'s lines; its down is piece e of w2, that is w2[e]. A wrong shape raises ValueError (given: check_shape)
        # hint1: 先按要装进哪块权重分两种情形；在叠起来的张量上用下标取出的是视图，形状对了就能直接拷进去
        # en1: Split into two cases by which stacked weight it goes into; indexing the stacked tensor gives a view,
        # en1: which can be copied into directly once its shape is checked
        # hint2: 1. attr == "w13"：n = self.intermediate_size；target = self.w13[shard // 2, (shard % 2) * n : (shard % 2 + 1) * n]；
        # hint2: 2. 否则 target = self.w2[shard]；
        # hint2: 3. check_shape(target, tensor)；target.copy_(tensor)。
        # en2: 1. attr == "w13": n = self.intermediate_size; target = self.w13[shard // 2, (shard % 2) * n : (shard % 2 + 1) * n];
        # en2: 2. otherwise target = self.w2[shard];
        # en2: 3. check_shape(target, tensor); target.copy_(tensor).
        if attr == "w13":
            n = self.intermediate_size
            target = self.w13[shard // 2, (shard % 2) * n : (shard % 2 + 1) * n]
        else:
            target = self.w2[shard]
        check_shape(target, tensor)
        target.copy_(tensor)
        # <<< TASK

    def count_tokens(self, expert_ids: torch.Tensor) -> list[int]:
        """这一步每个专家收到几个 (token, 选择) 对（放在主机上：分组实现按它切段），并记进 ``tokens_per_expert``。

        en: How many (token, choice) pairs each expert receives in this step (on the host: the grouped path cuts its
        stretches by it), also added to ``tokens_per_expert``.
        """
        counts = torch.bincount(expert_ids.reshape(-1), minlength=self.num_experts).tolist()
        self.tokens_per_expert = [a + b for a, b in zip(self.tokens_per_expert, counts)]
        return counts

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        counts = self.count_tokens(topk_ids)
        if self.grouped:
            return fused_experts(x, self.w13, self.w2, topk_weights, topk_ids, counts)
        return experts_reference(x, self.w13, self.w2, topk_weights, topk_ids)


class SparseMoeBlock(BaseOP):
    """代替 MoE 层的 ``mlp``：路由器 ``gate``（``[E, H]`` 的线性层，检查点里的 ``mlp.gate.weight``）加上专家。

    en: Takes the place of an MoE layer's ``mlp``: the router ``gate`` (an ``[E, H]`` linear layer, the checkpoint's
    ``mlp.gate.weight``) plus the experts.
    """

    def __init__(self, config: MoeConfig, dtype: torch.dtype, device: torch.device | str,
                 experts: FusedMoE | None = None) -> None:
        kw = {"dtype": dtype, "device": device}
        self.top_k, self.renormalize = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = Linear(config.hidden_size, config.num_experts, **kw)
        # 第 4.5 章传进切开的专家（张量并行或专家并行）；路由器每个秩都有整份
        # en: chapter 4.5 passes split experts in (tensor or expert parallel); every rank has the whole router
        self.experts = experts or FusedMoE(config.num_experts, config.hidden_size, config.moe_intermediate_size, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # >>> TASK moe_block_forward: 返回这一层 MoE 的输出 [T, H]：路由器给每个 token 打分，按本层从配置存下的 k 和是否重新归一化选出专家和权重，再交给本层的专家去算（分组还是参考实现由专家自己决定）。给定：select_experts
        # en: return this MoE layer's output [T, H]: the router scores every token, the experts and their weights are picked with the k and the renormalisation this layer kept from its config, and this layer's experts compute the result (grouped or reference is their own choice). Given: select_experts
        # hint1: 需要的都在 __init__ 里存好了：路由器是个线性层，k 和是否归一化是两个字段，专家是一个 FusedMoE
        # en1: Everything you need was kept in __init__: the router is a linear layer, k and the renormalisation are two fields, the experts are one FusedMoE
        # hint2: 1. topk_weights, topk_ids = select_experts(self.gate.forward(x), self.top_k, self.renormalize)；
        # hint2: 2. return self.experts.forward(x, topk_weights, topk_ids)。
        # en2: 1. topk_weights, topk_ids = select_experts(self.gate.forward(x), self.top_k, self.renormalize);
        # en2: 2. return self.experts.forward(x, topk_weights, topk_ids).
        topk_weights, topk_ids = select_experts(self.gate.forward(x), self.top_k, self.renormalize)
        return self.experts.forward(x, topk_weights, topk_ids)
        # <<< TASK


def create_moe_model(config: MoeConfig, dtype: torch.dtype, device: torch.device | str) -> CausalLM:
    """第 1.3 章的解码器，MoE 层的 ``mlp`` 换成 :class:`SparseMoeBlock`。每步的形状取决于路由（每个专家几行），
    所以不能录成 CUDA 图（``capturable = False``）。

    en: Chapter 1.3's decoder with the ``mlp`` of each MoE layer replaced by a :class:`SparseMoeBlock`. A step's shapes
    depend on the routing (how many rows each expert gets), so it cannot be captured as a CUDA graph
    (``capturable = False``).
    """
    return put_experts(create_model(config, dtype, device), config, dtype, device)


def put_experts(model: CausalLM, config: MoeConfig, dtype: torch.dtype, device: torch.device | str,
                make_experts: Callable[[], FusedMoE] | None = None) -> CausalLM:
    """把 ``model`` 里每个 MoE 层的 ``mlp`` 换成 :class:`SparseMoeBlock`（专家由 ``make_experts`` 造，缺省是整的
    :class:`FusedMoE`；第 4.5 章传进切开的），并标记它不能录成 CUDA 图。

    en: Replace the ``mlp`` of every MoE layer of ``model`` with a :class:`SparseMoeBlock` (its experts made by
    ``make_experts``, by default a whole :class:`FusedMoE`; chapter 4.5 passes split ones) and mark the model as not
    capturable as a CUDA graph.
    """
    for i, layer in enumerate(model.model.layers):
        if config.is_sparse(i):
            layer.mlp = SparseMoeBlock(config, dtype, device, make_experts() if make_experts else None)
    model.capturable = False
    return model
