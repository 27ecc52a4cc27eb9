"""第 2.4 章 chunked_prefill：分块预填充。

一段很长的提示词一次预填充完，这一步会很久，其他请求的解码全被卡住（延迟尖峰），
激活内存也随长度变大。分块预填充给每一步的预填充 token 数设上限 ``max_extend_tokens``：

- 一步里接纳请求时，预算只剩 ``b`` 个 token，而提示词还有 ``r > b`` 个没算，就只算前 ``b`` 个——
  这个请求成了 **分块请求**（:class:`ChunkedReq`），留在等待队列的队首，下一步接着算；
- 分块请求占着请求槽和页面，下一步继续时不用重新匹配、重新预留；
- 最后一块是普通的 ``Req``：它算完整个提示词，采样出第一个输出 token；
- 中间各块采样出的 token 是“提示词下一个 token 的预测”，**不是输出**：既不记入结果，
  也不能写进 token 池覆盖提示词的下一个 token（写到不属于任何请求的草稿行）。

每一步的预填充都不超过预算；算完一块之后，正在解码的请求先走一步，再算下一块——
长提示词不会把别人的解码卡住。

en: Chapter 2.4 chunked_prefill: chunked prefill.

Prefilling a very long prompt in one go makes that step slow, and every other request's decoding is stuck behind it (a
latency spike); activation memory also grows with the length. Chunked prefill caps the tokens prefilled per step at
``max_extend_tokens``:

- when a request is admitted with only ``b`` tokens of budget left and ``r > b`` tokens of its prompt still to compute,
  only the first ``b`` are computed; the request becomes a **chunked request** (:class:`ChunkedReq`), stays at the front
  of the waiting queue and continues next step;
- a chunked request keeps its request slot and pages, so the next chunk needs no new match or reservation;
- the last chunk is an ordinary ``Req``: it finishes the prompt and samples the first output token;
- the token sampled for an earlier chunk is a prediction of the prompt's next token, **not output**: it is not recorded
  in the result, and it must not be written into the token pool over the prompt's next token (it goes to a scratch row
  that belongs to no request).

No step prefills more than the budget; after each chunk, the decoding requests take a step before the next chunk, so a
long prompt does not hold up anyone's decoding.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch

from minisgl import radix_cache
from minisgl.i18n import tr
from minisgl.cache_manager import ReservingPrefillAdder
from minisgl.core import Batch, Req
from minisgl.scheduler import PrefillAdder, PrefillFirst, PrefillManager
from minisgl.scheduling import DecodeManager, PendingReq


class ChunkedReq(Req):
    """提示词只算了一部分的请求：它不能解码，这一步采样的 token 也不是输出。

    en: A request whose prompt is only partly computed: it cannot decode, and the token sampled for it this step is not
    output.
    """

    @property
    def can_decode(self) -> bool:
        return False

    def append_host(self, next_token: torch.Tensor) -> None:
        raise RuntimeError(tr(
            "The token sampled for a chunked request is not an output and cannot be appended to the request",
        ))


class ChunkedPrefillAdder(ReservingPrefillAdder):
    """预算不够时把提示词切块；上一步没算完的分块请求直接接着算。

    en: Cuts the prompt into chunks when the budget is short; a chunked request left unfinished by the previous step
    simply continues.
    """

    def try_add_one(self, pending: PendingReq) -> Req | None:
        """和父类一样：能接纳就返回新请求，否则返回 None；但等待的请求有一块算到一半时，接着切下一块。

        en: As the parent's: the new request if it can be admitted, otherwise None; but a waiting request with a
        half-computed chunk goes on with its next chunk.
        """
        if self.token_budget <= 0:
            return None
        # >>> TASK continue_chunk: 上一步留下了算到一半的分块（记在这个等待请求上）时，接着切下一块：不再匹配前缀、不再预留，沿用那一块的缓存句柄、请求槽和已缓存长度，返回新的一块；没有这样的分块时照父类接纳。给定：_add_one_req、父类的 try_add_one
        # en: when the previous step left a half-computed chunk (noted on this waiting request), cut the next chunk: no new prefix match, no new reservation; reuse that chunk's cache handle, request slot and cached length, and return the new chunk; without such a chunk, admit as the parent does. Given: _add_one_req, the parent's try_add_one
        # hint1: 算到一半的那一块就是 pending.chunked_req，你要沿用的三样东西都在它身上；切多大一块交给 _add_one_req（下一个任务）去决定。
        # en1: The half-computed chunk is pending.chunked_req, and the three things to reuse are all on it;
        # en1: how big the next chunk is, _add_one_req (the next task) decides.
        # hint2: chunked = pending.chunked_req；不是 None 就 return self._add_one_req(pending, chunked.cache_handle, chunked.table_idx, chunked.cached_len)；否则 return super().try_add_one(pending)。
        # en2: chunked = pending.chunked_req; if it is not None: return self._add_one_req(pending, chunked.cache_handle, chunked.table_idx, chunked.cached_len); otherwise return super().try_add_one(pending).
        if (chunked := pending.chunked_req) is not None:
            return self._add_one_req(pending, chunked.cache_handle, chunked.table_idx, chunked.cached_len)
        return super().try_add_one(pending)
        # <<< TASK

    def _add_one_req(
        self, pending: PendingReq, cache_handle: Any, table_idx: int, cached_len: int, req_cls: type[Req] = Req, end: int | None = None
    ) -> Req:
        """预算够算完剩下的提示词就照常接纳；不够就只接纳 ``token_budget`` 个 token，做成 ``ChunkedReq``。

        en: If the budget covers the rest of the prompt, admit it as usual; otherwise admit only ``token_budget``
        tokens, as a ``ChunkedReq``.
        """
        # >>> TASK take_chunk: 提示词剩下没算的部分不超过预算（恰好相等也算）时，这是最后一块：照常由父类建一个普通请求，并清掉等待请求上“有一块算到一半”的标记；否则只接纳预算那么多个 token，做成 ChunkedReq，记成那个标记再返回它。请求仍然只由父类的 _add_one_req 建
        # en: if what remains of the prompt is within the budget (equal counts), this is the last chunk: the parent builds an ordinary request as usual, and the waiting request's "half-computed chunk" mark is cleared; otherwise admit only as many tokens as the budget allows, as a ChunkedReq, record it as that mark and return it. Requests are still built only by the parent's _add_one_req
        # hint1: 父类的 _add_one_req 已经会写 token 池、扣预算、建请求：这里只决定传给它的 end 和 req_cls。那个标记是 pending.chunked_req。
        # en1: The parent's _add_one_req already writes the token pool, charges the budget and builds the request:
        # en1: here you only decide the end and req_cls it gets. The mark is pending.chunked_req.
        # hint2: 1. pending.input_len - cached_len <= self.token_budget 时：pending.chunked_req = None；return super()._add_one_req(pending, cache_handle, table_idx, cached_len)；
        # hint2: 2. 否则 end = cached_len + self.token_budget；pending.chunked_req = super()._add_one_req(pending, cache_handle, table_idx, cached_len, ChunkedReq, end)；
        # hint2: return pending.chunked_req。
        # en2: 1. if pending.input_len - cached_len <= self.token_budget: pending.chunked_req = None; return super()._add_one_req(pending, cache_handle, table_idx, cached_len);
        # en2: 2. otherwise end = cached_len + self.token_budget; pending.chunked_req = super()._add_one_req(pending, cache_handle, table_idx, cached_len, ChunkedReq, end);
        # en2: return pending.chunked_req.
        if pending.input_len - cached_len <= self.token_budget:
            pending.chunked_req = None
            return super()._add_one_req(pending, cache_handle, table_idx, cached_len)
        end = cached_len + self.token_budget
        pending.chunked_req = super()._add_one_req(pending, cache_handle, table_idx, cached_len, ChunkedReq, end)
        return pending.chunked_req
        # <<< TASK


class ChunkInterleave(PrefillFirst):
    """本章选下一步的策略零件：仍然预填充优先，但算完一个中途的分块后，如果有请求在解码，先让它们走一步，再算下一块：
    长提示词不会把解码卡住。

    en: This chapter's policy part for picking the next step: still prefill first, but after an unfinished chunk, if any
    request is decoding, it takes a step before the next chunk: a long prompt does not hold up decoding.
    """

    def __init__(self) -> None:
        # >>> TASK interleave_state: 建好这个策略在两步之间要记住的东西（起初什么都还没算过）。记什么、怎么记由你决定：它要能让下一步知道该不该先让解码走
        # en: set up what this policy remembers between two steps (nothing has been computed at first). What to remember and how is yours to choose: it must let the next step know whether decoding goes first
        # hint1: 下一步要问的只是一件事：上一步有没有算一个没算完的分块。一个布尔值就够。
        # en1: The next step asks one thing only: did the previous step compute an unfinished chunk? One boolean does.
        # hint2: self._yield_to_decode = False
        # en2: self._yield_to_decode = False
        self._yield_to_decode = False  # 上一步算了一个中途的分块 | en: the previous step computed an unfinished chunk
        # <<< TASK

    def next_batch(
        self, prefill_manager: PrefillManager, decode_manager: DecodeManager, make_adder: Callable[[], PrefillAdder]
    ) -> Batch | None:
        # >>> TASK interleave: 返回这一步的 Batch（没有可做的就是 None）。约定：一个长提示词的两块之间，正在解码的请求恰好走一步（不是零步，也不是一直解码到完）；没有请求在解码时，分块一块接一块地算，不插空步；别的时候照常（预填充优先）。用你在 interleave_state 里建的状态
        # en: return this step's Batch (None when there is nothing to do). Contract: between two chunks of a long prompt, the decoding requests take exactly one step (not zero, and not decoding on to the end); with nothing decoding, chunks follow one another with no empty step in between; otherwise as usual (prefill first). Use the state you set up in interleave_state
        # hint1: “照常”就是父类的 next_batch；中途的分块就是这一步里的 ChunkedReq。让解码先走的那一步本身不含分块：别忘了把标记放下。
        # en1: "As usual" is the parent's next_batch; an unfinished chunk is a ChunkedReq in the step.
        # en1: The decode step you let through holds no chunk itself: remember to lower the flag.
        # hint2: 1. self._yield_to_decode 且 decode_manager.runnable 时：self._yield_to_decode = False；return decode_manager.schedule_next_batch()；
        # hint2: 2. 否则 batch = super().next_batch(prefill_manager, decode_manager, make_adder)；self._yield_to_decode = batch 不是 None 且 batch.reqs 里有 ChunkedReq；return batch。
        # en2: 1. if self._yield_to_decode and decode_manager.runnable: self._yield_to_decode = False; return decode_manager.schedule_next_batch();
        # en2: 2. otherwise batch = super().next_batch(prefill_manager, decode_manager, make_adder); self._yield_to_decode = batch is not None and any ChunkedReq is in batch.reqs; return batch.
        if self._yield_to_decode and decode_manager.runnable:
            self._yield_to_decode = False
            return decode_manager.schedule_next_batch()
        batch = super().next_batch(prefill_manager, decode_manager, make_adder)
        self._yield_to_decode = batch is not None and any(isinstance(r, ChunkedReq) for r in batch.reqs)
        return batch
        # <<< TASK


#: 到本章为止的引擎：第 2.3 章的零件，准入员会切块，策略让解码插在分块之间。
#: en: The engine up to this chapter: chapter 2.3's parts, with the adder that cuts chunks and the policy that lets
#: decodes run between chunks.
PARTS = replace(radix_cache.PARTS, prefill_adder=ChunkedPrefillAdder, policy=ChunkInterleave)
