"""自推测（early exit）起草器：用目标模型自己的前 ``k`` 个解码层，接上最后的归一化和（共享权重的）LM head 来猜
接下来的几个 token（LayerSkip 的想法，这里不做任何训练）。``speculative_algorithm="EARLY_EXIT"``、
``speculative_draft_layers=k`` 时，投机的主循环（第 5.3 章）用它代替 n-gram 缓存，验证照旧。

- 不要新的权重：层对象、嵌入、归一化、LM head 都是目标模型的那几个；
- 每个请求一份自己的稠密 K/V（只有前 ``k`` 层，按 ``uid`` 分开）：``put`` 把新来的 token 过一遍这 ``k`` 层，记下最后
  一个 token 的隐藏状态；``propose`` 从它出发贪心地走最多 ``limit`` 步（缺省 ``num_draft``），每步一个 token，K/V 写在已知长度之后的
  空位上（不算数：下一次 ``put`` 从已知长度接着写，盖掉它们）；``drop`` 释放这个请求；
- 注意力走自己的后端对象（:class:`DenseAttnBackend`）：模型的注意力层照常调用 ``ctx.attn_backend.forward``，这个
  后端把 K/V 写进请求的稠密缓存，再用第 1.5 章的 ``attend`` 和因果掩码算；前向期间把它换进引擎的上下文，算完换回；
- 猜多长：``propose`` 拿到主循环这一次最多用得上几个（``limit``），不多算一个。

没训练过的浅层出口猜得准不准，要量（``bench/early_exit.py``）。

en: The self-speculative (early-exit) drafter: the target model's own first ``k`` decoder layers, followed by the
final norm and the (tied) LM head, guess the next few tokens (LayerSkip's idea, here without any training). With
``speculative_algorithm="EARLY_EXIT"`` and ``speculative_draft_layers=k`` the speculative main loop (chapter 5.3) uses
it instead of the n-gram cache; verification is unchanged.

- no new weights: the layer objects, the embedding, the norm and the LM head are the target model's own;
- each request keeps dense K/V of its own (the first ``k`` layers only, keyed by ``uid``): ``put`` runs the new tokens
  through those ``k`` layers and keeps the last token's hidden state; ``propose`` walks at most ``limit`` greedy
  steps from it (``num_draft`` by default), one token each, writing K/V into the free room past the known length (it does not count: the next
  ``put`` writes on from the known length, over them); ``drop`` frees the request;
- attention goes through a backend object of its own (:class:`DenseAttnBackend`): the model's attention layers call
  ``ctx.attn_backend.forward`` as always; this backend writes K/V into the request's dense cache and computes with
  chapter 1.5's ``attend`` and a causal mask. It is swapped into the engine's context for the forward and swapped out
  afterwards;
- how long to guess: ``propose`` gets the most tokens the main loop can use this time (``limit``) and computes no more.

How well an untrained shallow exit guesses has to be measured (``bench/early_exit.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from minisgl.attention import BaseAttnBackend, BaseAttnMetadata, attend
from minisgl.core import Batch, set_global_ctx
from minisgl.i18n import tr
from minisgl.layers import Linear
from minisgl.ngram_cache import DraftTree
from minisgl.validation import check_draft_layers

__all__ = ["DenseAttnBackend", "DenseKV", "DenseMetadata", "EarlyExitDrafter", "default_draft_layers"]


def default_draft_layers(num_layers: int) -> int:
    """没给 ``speculative_draft_layers`` 时起草用几层：模型层数的一半（至少 1）。

    en: How many layers draft when ``speculative_draft_layers`` is not given: half the model's layers (at least 1)."""
    return max(1, num_layers // 2)


class DenseKV:
    """一个请求在前 ``layers`` 层的稠密 K/V：``k[层, 位置]``、``v[层, 位置]``（``[层, 容量, Hkv, D]``），前 ``length``
    个位置是已知的 token；不够时容量翻倍。``hidden`` 是最后一个已知 token 在第 ``layers`` 层之后的隐藏状态。

    en: One request's dense K/V in the first ``layers`` layers: ``k[layer, position]``, ``v[layer, position]``
    (``[layers, capacity, Hkv, D]``); the first ``length`` positions are the known tokens; the capacity doubles when
    short. ``hidden`` is the last known token's hidden state after layer ``layers``.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.shape, self.dtype, self.device = (layers, kv_heads, head_dim), dtype, device
        self.k = self.v = torch.empty(layers, 0, kv_heads, head_dim, dtype=dtype, device=device)
        self.length = 0
        self.hidden: torch.Tensor | None = None

    def reserve(self, n: int) -> None:
        """容量至少 ``n`` 个位置（已有的内容留着）。

        en: Make room for at least ``n`` positions (keeping what is there)."""
        cap = self.k.shape[1]
        if n <= cap:
            return
        cap = max(n, 2 * cap, 64)
        layers, heads, dim = self.shape
        k = torch.empty(layers, cap, heads, dim, dtype=self.dtype, device=self.device)
        v = torch.empty_like(k)
        k[:, : self.k.shape[1]] = self.k
        v[:, : self.v.shape[1]] = self.v
        self.k, self.v = k, v


@dataclass
class DenseMetadata(BaseAttnMetadata):
    """起草器一次前向的元数据：一个请求，``rows`` 个新 token，从位置 ``start`` 起（前面的 ``start`` 个已在缓存里）。

    en: The metadata of one drafter forward: one request, ``rows`` new tokens from position ``start`` on (the
    ``start`` before them already cached).
    """

    kv: DenseKV
    start: int
    rows: int

    def get_last_indices(self, bs: int) -> torch.Tensor:
        return torch.tensor([self.rows - 1], device=self.kv.device)


class DenseAttnBackend(BaseAttnBackend):
    """起草器的注意力：把这一层的 K/V 写进请求的稠密缓存（第 ``start`` 个位置起），再让每个新 token 看它自己和前面的
    全部位置（因果掩码），交给第 1.5 章的 ``attend``。

    en: The drafter's attention: write this layer's K/V into the request's dense cache (from position ``start``), then
    let each new token see itself and every position before it (a causal mask), through chapter 1.5's ``attend``.
    """

    def prepare_metadata(self, batch: Batch) -> None:
        raise RuntimeError(tr("The early-exit drafter's attention backend takes its metadata from the drafter"))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        md: DenseMetadata = batch.attn_metadata  # type: ignore[assignment]
        end = md.start + md.rows
        md.kv.k[layer_id, md.start : end] = k
        md.kv.v[layer_id, md.start : end] = v
        keys = torch.arange(end, device=q.device)
        mask = keys[None, :] <= keys[md.start :, None]
        return attend(q, md.kv.k[layer_id, :end], md.kv.v[layer_id, :end], mask, q.shape[-1] ** -0.5)


class EarlyExitDrafter:
    """用目标模型前 ``layers`` 层起草的 :class:`~minisgl.ngram_cache.Drafter`（见模块文档）。``engine`` 给出模型和
    它的上下文；``num_draft`` 是一次最多猜几个 token。

    en: A :class:`~minisgl.ngram_cache.Drafter` drafting with the target model's first ``layers`` layers (see the
    module docstring). ``engine`` provides the model and its context; ``num_draft`` is the most tokens one guess makes.
    """

    def __init__(self, engine: Any, layers: int, num_draft: int) -> None:
        model = engine.model
        if getattr(model, "tp_size", 1) != 1:
            # 切开的模型每个秩只有一部分词表和头：各秩猜出的草稿会不一样
            # en: a split model holds part of the vocabulary and heads on each rank: the ranks would draft differently
            raise ValueError(tr("EARLY_EXIT drafts on one rank only (the model here is split over {tp})",
                                tp=model.tp_size))
        check_draft_layers(layers, model.config.num_layers)
        if num_draft < 1:
            raise ValueError(tr("{name} must be at least 1, got {value}", name="--speculative-num-draft-tokens",
                                value=num_draft))
        self.num_draft, self.layers = num_draft, layers
        self._ctx, self._model = engine.ctx, model
        self._blocks = model.model.layers[:layers]
        attn = self._blocks[0].self_attn.attn
        weight = model.model.embed_tokens.weight
        self._kv_args = (layers, attn.num_kv_heads, attn.head_dim, weight.dtype, weight.device)
        self._backend = DenseAttnBackend()
        self._reqs: dict[int, DenseKV] = {}

    # ------------------------------------------------------------------ Drafter

    @torch.inference_mode()
    def put(self, tokens: Sequence[int], since: int = 0, uid: int = 0) -> None:
        kv = self._reqs.get(uid)
        if kv is None:
            kv = self._reqs[uid] = DenseKV(*self._kv_args)
        start = min(since, kv.length, len(tokens) - 1)
        if start < 0:
            return
        kv.reserve(len(tokens) + self.num_draft)
        kv.hidden = self._forward(kv, tokens[start:], start)
        kv.length = len(tokens)

    @torch.inference_mode()
    def propose(self, tokens: Sequence[int], uid: int = 0, limit: int | None = None) -> DraftTree:
        kv = self._reqs.get(uid)
        if kv is None or kv.length != len(tokens):
            self.put(tokens, 0 if kv is None else min(kv.length, len(tokens) - 1), uid)
            kv = self._reqs[uid]
        if kv.hidden is None:
            return DraftTree()
        n = self.num_draft if limit is None else min(limit, self.num_draft)
        draft, hidden = [], kv.hidden
        for i in range(n):
            draft.append(int(self._logits(hidden).argmax()))
            if i + 1 < n:
                hidden = self._forward(kv, draft[-1:], kv.length + i)
        return DraftTree(tuple(draft), tuple(range(-1, n - 1)))

    def drop(self, uid: int) -> None:
        self._reqs.pop(uid, None)

    # ------------------------------------------------------------------ 前向 | en: forward

    def _forward(self, kv: DenseKV, ids: Sequence[int], start: int) -> torch.Tensor:
        """``ids``（位置从 ``start`` 起）过前 ``layers`` 层，K/V 写进 ``kv``；返回最后一个的隐藏状态 ``[1, hidden]``。

        en: Run ``ids`` (positions from ``start``) through the first ``layers`` layers, writing K/V into ``kv``; return
        the last one's hidden state, ``[1, hidden]``.
        """
        device = kv.device
        batch = Batch(reqs=[], phase="prefill")
        batch.input_ids = torch.tensor(list(ids), dtype=torch.int32, device=device)
        batch.positions = torch.arange(start, start + len(ids), dtype=torch.int32, device=device)
        batch.attn_metadata = DenseMetadata(kv, start, len(ids))
        ctx, plain = self._ctx, self._ctx.attn_backend
        set_global_ctx(ctx)
        ctx.attn_backend = self._backend
        try:
            with ctx.forward_batch(batch):
                h = self._model.model.embed_tokens.forward(batch.input_ids)
                for block in self._blocks:
                    h = block.forward(h)
        finally:
            ctx.attn_backend = plain
        return h[-1:]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """最后的归一化，再过 LM head（父类 ``Linear`` 的前向：只有一行，不用挑最后的 token）。

        en: The final norm, then the LM head (the parent ``Linear``'s forward: one row, no last token to pick)."""
        return Linear.forward(self._model.lm_head, self._model.model.norm.forward(hidden))[0]
