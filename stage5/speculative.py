# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint speculative <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint speculative <task>` gives the next hint.
"""第 5.3 章 speculative：投机解码在引擎里（``speculative_algorithm="NGRAM"``）：每个解码步先猜，再一次前向验证。

解码批次的每个请求是一棵树：树根是最后一个已知 token（普通解码也只算它），下面挂着 起草器猜出的草稿
（第 5.1 章的 :class:`~minisgl.ngram_cache.Drafter`，缺省是 n-gram 缓存；猜不出、或这个请求不投机时 n = 0，就是普通的一行解码）。整批在一次前向里算完：

- **KV 槽位**：草稿顺着请求自己那一行往后排——第 i 个草稿 token（广度优先的下标，从 1 起）写在位置
  ``L - 1 + i``（``L`` 是已知 token 数）；缺的页照常向缓存管理器要。位置（RoPE）却是 ``L - 1 + 深度``；
- **注意力**：每一行看见前缀、自己和祖先，绝不看兄弟（:func:`minisgl.spec_tree.tree_mask`）；按页表取 K/V，交给
  第 1.5 章的 ``attend``，只是掩码换成 [前缀全可见 | 树的掩码]；
- **logits**：每一行都要（元数据的“最后一个 token”就是全部行）；贪心的请求树根那一行交给引擎的采样器（和普通解码
  一样采），其余行取 argmax，:func:`minisgl.spec_tree.accept_greedy` 走出最长的那条路，外加白送的一个 token；
- **把 KV 收拾干净**：接受的那条路的 K/V 挪到位置 ``L .. L+a-1``（一棵树时它们不一定挨着），不要的页还回去，
  token 池写上这一步出的 token；结果处理把它们一个一个交给请求，就像普通解码走了 a + 1 步——EOS、``max_tokens``
  都在那里判，前缀缓存也只会收到交出去了的 token。草稿个数不超过请求还能出的 token 数减一，所以 ``max_tokens``
  只可能落在最后一个；EOS 落在中间时，后面的 token 不再交出，它们占的页在请求归还时一起还掉。

不用采样控制（惩罚、logit_bias、对数概率、min_tokens 未满）和语法的请求才投机：贪心的按 argmax 接受，没有种子的
采样请求做投机采样（:func:`minisgl.spec_tree.accept_sampled`，分布和一步一采相同）；带种子的采样请求和别的请求在
同一批里照常解码一步。重叠调度关掉（和 SGLang 一样：下一步的草稿要等这一步验证完才知道从哪儿猜）；分块预填充照常可用
（预填充步不投机）。一个请求猜错就先歇几步（连错几次歇得越久，最多 32 步），整批每步最多验证
``speculative_num_draft_tokens - 1`` 个草稿 token，按请求最近的命中率分。

en: Chapter 5.3 speculative: speculative decoding in the engine (``speculative_algorithm="NGRAM"``): each decode step
first guesses, then verifies in one forward.

Every request of a decode batch is a tree: the root is the last known token (all that plain decoding computes), with the
drafter's guesses below it (chapter 5.1's :class:`~minisgl.ngram_cache.Drafter`, the n-gram cache by default; n = 0
when nothing matches or the request does not speculate: a plain row of decode). The whole batch is computed in one forward:

- **KV slots**: the drafts are laid along the request's own row: draft token i (breadth-first index, from 1) is written
  at position ``L - 1 + i`` (``L`` known tokens); missing pages come from the cache manager as usual. Their position
  (RoPE) is ``L - 1 + depth`` though;
- **attention**: each row sees the prefix, itself and its ancestors, never a sibling (:func:`minisgl.spec_tree.tree_mask`);
  K/V are gathered through the page table and handed to chapter 1.5's ``attend`` with the mask [prefix all visible |
  the tree's mask];
- **logits**: every row is needed (the metadata's "last tokens" are all rows); for a greedy request the root's row
  goes to the engine's sampler (sampled as plain decoding would), the others take the argmax, and
  :func:`minisgl.spec_tree.accept_greedy` walks the longest matching path, plus the bonus token;
- **keeping the KV honest**: the accepted path's K/V move to positions ``L .. L+a-1`` (in a tree they need not be next to
  each other), unneeded pages go back, and the token pool gets the step's tokens; result processing hands them to the
  request one by one, as if plain decoding had taken a + 1 steps: EOS and ``max_tokens`` are decided there, and the
  prefix cache only ever receives tokens handed out. A request never drafts more than it may still output minus one,
  so ``max_tokens`` can only fall on the last token; after an EOS inside the run the later tokens are not handed out,
  and their pages go back when the request is released.

Only requests without sampling controls (penalties, logit_bias, log-probabilities, min_tokens not yet reached) and
without a grammar speculate: greedy ones accept by argmax, unseeded sampled ones by speculative sampling
(:func:`minisgl.spec_tree.accept_sampled`, distributed as sampling one step at a time); seeded sampled requests and the
others decode one plain step in the same batch. Overlap scheduling is off (as in
SGLang: the next step's drafts depend on where this step's verification ends); chunked prefill works as usual (prefill
steps do not speculate). A request whose guess fails rests a few steps (longer after each miss in a row, at most 32),
and a whole step verifies at most ``speculative_num_draft_tokens - 1`` draft tokens, shared out by the requests' recent
hit rates.
"""

from __future__ import annotations

from minisgl.course.skeleton import TaskNotDone

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch

from minisgl.attention import BaseAttnBackend, BaseAttnMetadata, attend, gather_kv
from minisgl.core import Batch, Req, set_global_ctx
from minisgl.engine import ForwardOutput, HostCopyDone, top_k_top_p_filter
from minisgl.i18n import tr
from minisgl.ngram_cache import Drafter, DraftTree, NgramCache
from minisgl.scheduling import ForwardInput, MainLoop, div_ceil
from minisgl.spec_tree import accept_greedy, accept_sampled, tree_mask, tree_positions

__all__ = ["SpecStats", "SpeculativeLoop", "TreeAttnBackend", "TreeMetadata", "speculation"]

#: 一个请求连续猜错之后最多歇几步。
#: en: The most steps a request rests after missing several times in a row.
MAX_REST = 32
#: 一次验证接受的草稿 token 不到这个比例就算猜错。
#: en: A verification accepting less than this share of its draft tokens counts as a miss.
MISS_BELOW = 0.25


def speculation(req: Req, outputs_so_far: int) -> str | None:
    """这个请求怎样投机：``"greedy"``（贪心地接受）、``"sample"``（投机采样，没有种子的采样请求），或 ``None``（不投机：
    有会改变分布、或要逐个 token 记账的东西——惩罚、logit_bias、对数概率、还没满足的 min_tokens、语法；或者带种子的
    采样请求：它的随机数按位置定，照常一步一采才和不投机时相同）。

    en: How this request speculates: ``"greedy"`` (greedy acceptance), ``"sample"`` (speculative sampling, unseeded
    sampled requests), or ``None`` (no speculation: something changes the distribution or keeps per-token state —
    penalties, logit_bias, log-probabilities, an unmet min_tokens, a grammar; or a seeded sampled request, whose random
    numbers follow its positions, so only sampling one step at a time matches plain decoding).
    """
    # TODO 任务 speculation：返回这个请求怎样投机：用了任何一样会改变分布、或要逐个 token 记账的采样控制（重复、出现、频率惩罚，logit 偏置，要对数概率，已出的 token 还没到最少 token 数，语法约束）就返回 None；否则贪心的返回 "greedy"，没有种子的采样请求返回 "sample"，带种子的返回 None
    # TODO task speculation: return how this request speculates: None if it uses any sampling control that changes the distribution or keeps per-token state (repetition, presence or frequency penalties, a logit bias, log-probabilities wanted, fewer tokens out than its minimum, a grammar); otherwise "greedy" for a greedy request, "sample" for an unseeded sampled one, None for a seeded one
    raise TaskNotDone("speculative", "speculation")


@dataclass
class TreeMetadata(BaseAttnMetadata):
    """一次验证前向的注意力元数据：请求 b 的行是 ``[cu_seqlens_q_cpu[b], cu_seqlens_q_cpu[b+1])``，看页表第
    ``table_idx[b]`` 行的前 ``key_lens[b]`` 个槽位，按 ``masks[b]``（``[行数, key_lens[b]]``）。每一行都要 logits。

    en: The attention metadata of one verifying forward: request b's rows are ``[cu_seqlens_q_cpu[b],
    cu_seqlens_q_cpu[b+1])``; they look at the first ``key_lens[b]`` slots of page-table row ``table_idx[b]`` through
    ``masks[b]`` (``[rows, key_lens[b]]``). Every row needs its logits.
    """

    cu_seqlens_q_cpu: list[int]
    table_idx: list[int]
    key_lens: list[int]
    masks: list[torch.Tensor]
    device: torch.device

    def get_last_indices(self, bs: int) -> torch.Tensor:
        return torch.arange(self.cu_seqlens_q_cpu[-1], device=self.device)


class TreeAttnBackend(BaseAttnBackend):
    """验证前向的注意力：写 K/V，再逐个请求按页表取 K/V、用树的掩码调用第 1.5 章的 ``attend``。

    en: The verifying forward's attention: store K/V, then per request gather K/V through the page table and call
    chapter 1.5's ``attend`` with the tree's mask.
    """

    def __init__(self, kv_cache: Any, page_table: torch.Tensor) -> None:
        self.kv_cache = kv_cache
        self.page_table = page_table

    def prepare_metadata(self, batch: Batch) -> None:
        raise RuntimeError(tr("The tree attention backend takes its metadata from the verifying step"))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        # TODO 任务 tree_attention：K/V 已经写进缓存。对每个请求 b：它的查询是 q 的第 cu_seqlens_q_cpu[b] 到 [b+1] 行，按页表第 table_idx[b] 行取前 key_lens[b] 个槽位的 K/V，用 masks[b] 和缩放 head_dim ** -0.5 调用 attend；按请求的顺序拼起来返回。给定：TreeMetadata、第 1.5 章的 gather_kv、attend
        # TODO task tree_attention: the K/V are already in the cache. For each request b: its queries are rows cu_seqlens_q_cpu[b] to [b+1] of q; gather the K/V of the first key_lens[b] slots of page-table row table_idx[b], call attend with masks[b] and the scale head_dim ** -0.5; concatenate in request order and return. Given: TreeMetadata, chapter 1.5's gather_kv and attend
        raise TaskNotDone("speculative", "tree_attention")


@dataclass
class SpecStats:
    """累计：验证过的草稿 token、其中接受的、带草稿的验证（请求 × 步）次数，以及每次出几个 token（含白送的那个）
    的直方图。

    en: Cumulative: draft tokens verified, those accepted, verifications with a draft (request × step), and a histogram
    of how many tokens each one yielded (the bonus included).
    """

    proposed: int = 0
    accepted: int = 0
    verifies: int = 0
    moved: int = 0  # 为了让接受的路挨着而挪过的 K/V 槽位 | en: K/V slots moved to make accepted paths contiguous
    accept_lengths: Counter[int] = field(default_factory=Counter)

    @property
    def mean_accept_length(self) -> float:
        """每次带草稿的验证平均出几个 token（含白送的那个）。

        en: Tokens per verification with a draft, on average (the bonus included)."""
        return (self.accepted + self.verifies) / self.verifies if self.verifies else 0.0


class _Span(NamedTuple):
    """缓存管理器的 ``allocate_paged`` 读的三样：给草稿要页时用。

    en: The three fields the cache manager's ``allocate_paged`` reads: used to ask pages for the drafts."""

    table_idx: int
    cached_len: int
    device_len: int


@dataclass
class _Track:
    """一个请求在投机这边的状态。

    en: One request's state on the speculating side."""

    tokens: list[int] = field(default_factory=list)  # 告诉过起草器的 token | en: tokens the drafter has been told
    misses: int = 0  # 连续猜错的次数 | en: misses in a row
    rest: int = 0  # 还要歇几步 | en: steps still to rest
    hit_rate: float = 1.0  # 最近接受的草稿 token 的比例（指数平均） | en: recent share of draft tokens accepted (EMA)


class SpeculativeLoop(MainLoop):
    """投机解码的主循环零件：预填充照常，解码步换成一次验证（见模块文档）。没有重叠。

    en: The main-loop part for speculative decoding: prefills as usual, each decode step becomes a verification (see the
    module docstring). No overlap.
    """

    def __init__(self, scheduler: Any, make_drafter: Callable[[int], Drafter] | None = None) -> None:
        super().__init__(scheduler)
        c, engine = scheduler.config, scheduler.engine
        self.budget = c.speculative_num_draft_tokens - 1
        # 起草器在构造时换：make_drafter(一次最多猜几个) 给一个新的起草器，缺省是配置里的 n-gram 缓存
        # en: the drafter is swapped at construction: make_drafter(most tokens per guess) gives a fresh drafter, by
        # en: default the configured n-gram cache
        self._make_drafter = make_drafter or self._ngram
        self.forget()
        self.backend = TreeAttnBackend(engine.kv_cache, engine.page_table)
        self.spec_stats = SpecStats()
        # 投机采样的随机数（没有种子的采样请求才投机采样）
        # en: random numbers of speculative sampling (only unseeded sampled requests sample speculatively)
        self.generator = torch.Generator().manual_seed(c.seed)
        # 这一步验证之后各请求的页分到了哪里（结果处理中途被取消时，多出的页由 release 还）
        # en: where each request's pages reach after this step's verification (release gives back the excess if the
        # request is aborted while its results are processed)
        self._allocated_to: dict[Req, int] = {}
        self._deferred: list[Req] | None = None

    def forget(self) -> None:
        """从一个新的起草器重新开始（n-gram 缓存是空树；基准测试每一轮用同样的提示词，不然后一轮照抄前一轮的输出）。
        只在空闲时调用。

        en: Start again from a fresh drafter (the n-gram cache an empty tree; benchmark rounds reuse their prompts;
        otherwise a round copies the previous one's outputs). Call only when idle.
        """
        self.drafter = self._make_drafter(self.budget)
        self._tracks: dict[int, _Track] = {}

    def _ngram(self, num_draft: int) -> NgramCache:
        c = self.scheduler.config
        return NgramCache(
            min_window=c.speculative_ngram_min_match_window_size, max_window=c.speculative_ngram_max_match_window_size,
            min_breadth=c.speculative_ngram_min_bfs_breadth, max_breadth=c.speculative_ngram_max_bfs_breadth,
            branch_length=c.speculative_ngram_branch_length, capacity=c.speculative_ngram_capacity,
            num_draft=num_draft)

    def step(self) -> bool:
        s = self.scheduler
        fi = s._schedule_next_batch()
        if fi is None:
            return False
        output = self._verify(fi) if fi.batch.is_decode else s._forward(fi)
        # 结果处理途中了结的请求（监听者可能取消同一批里还没轮到的请求）处理完再归还
        # en: requests settled while results are processed (a listener may abort one not reached yet in this batch)
        # en: are given back once processing is done
        self._deferred = []
        try:
            s._process_last_data((fi, output))
        finally:
            deferred, self._deferred = self._deferred, None
            for req in deferred:
                self._release_now(req)
            self._allocated_to.clear()
        return True

    def release(self, req: Req) -> None:
        """请求了结：结果处理途中先记下，处理完这一步再归还。

        en: A request is settled: noted while results are processed, given back once the step is processed."""
        if self._deferred is not None:
            self._deferred.append(req)
        else:
            self._release_now(req)

    def _release_now(self, req: Req) -> None:
        end = self._allocated_to.pop(req, None)
        if end is not None:
            self.scheduler.cache_manager.free_tail(req.table_idx, req.cached_len, end)
        if self._tracks.pop(req.uid, None) is not None:
            self.drafter.drop(req.uid)
        super().release(req)

    # ------------------------------------------------------------------ 猜
    # en: ------------------------------------------------------------------ guessing

    def _observe(self, req: Req) -> _Track:
        """把请求新多出的 token 告诉起草器。

        en: Tell the drafter the request's new tokens."""
        track = self._tracks.setdefault(req.uid, _Track())
        since = len(track.tokens)
        if len(req.input_ids) > since:
            track.tokens.extend(req.input_ids[since:].tolist())
            self.drafter.put(track.tokens, since, req.uid)
        return track

    def _drafts(self, reqs: list[Req]) -> list[DraftTree]:
        """每个请求的草稿（不投机的是空树），整批不超过 ``budget`` 个 token，最近命中率高的先分。

        en: Each request's draft (an empty tree where it does not speculate), at most ``budget`` tokens for the whole
        batch, shared out to the requests with the best recent hit rates first."""
        status, tracks = self.scheduler.status, [self._observe(r) for r in reqs]
        want: list[DraftTree] = []
        for req, track in zip(reqs, tracks):
            room = req.remain_len - 1  # 至少留一个给白送的 token | en: keep one for the bonus
            if track.rest > 0 or room < 1 or speculation(req, len(status[req.uid].output_ids)) is None:
                track.rest = max(track.rest - 1, 0)
                want.append(DraftTree())
                continue
            # 最近命中得多的请求猜得长，少的猜得短（至少 2 个）：验证的每一行都要算
            # en: requests hitting often recently guess long, others short (at least 2): every verified row costs
            allowance = max(2, round(track.hit_rate * self.budget))
            want.append(self.drafter.propose(track.tokens, req.uid, min(room, allowance)))
        left, drafts = self.budget, [DraftTree()] * len(reqs)
        for b in sorted(range(len(reqs)), key=lambda b: -tracks[b].hit_rate):
            drafts[b] = _truncate(want[b], left)
            left -= len(drafts[b])
        return drafts

    # ------------------------------------------------------------------ 验证
    # en: ------------------------------------------------------------------ verifying

    @torch.inference_mode()
    def _verify(self, fi: ForwardInput) -> ForwardOutput:
        s, engine = self.scheduler, self.scheduler.engine
        reqs = fi.batch.reqs
        drafts = self._drafts(reqs)
        if not any(len(d) for d in drafts):
            return s._forward(fi)
        lens = [r.device_len for r in reqs]
        s.cache_manager.allocate_paged([_Span(r.table_idx, L, L + len(d))
                                        for r, L, d in zip(reqs, lens, drafts) if len(d)])
        vb = self._verify_batch(fi, drafts, lens)
        logits = self._fused_logits(vb) if engine.fused_decoder is not None else self._tree_logits(vb)
        cu = vb.attn_metadata.cu_seqlens_q_cpu
        first = engine.sampler.sample(logits[torch.tensor(cu[:-1], device=logits.device)], fi.sample_args)
        first_cpu = first.tolist()
        argmax = logits.argmax(dim=-1).tolist()
        runs = []
        for b, (req, draft) in enumerate(zip(reqs, drafts)):
            if not len(draft):
                path, run = [], [first_cpu[b]]
            elif req.sampling_params.is_greedy:
                target = argmax[cu[b] : cu[b + 1]]
                target[0] = first_cpu[b]
                path, run = accept_greedy(draft, target)
            else:
                path, run = accept_sampled(draft, self._probs(req, logits[cu[b] : cu[b + 1]]), self.generator)
            runs.append(run)
            self._commit(req, draft, path[: len(run) - 1], run, lens[b])
        first_gpu = torch.tensor([run[0] for run in runs], dtype=torch.int32, device=first.device)
        return ForwardOutput(first_gpu, first_gpu.cpu(), HostCopyDone(), [run[1:] for run in runs])

    @staticmethod
    def _probs(req: Req, logits: torch.Tensor) -> torch.Tensor:
        """不投机时采样器用的分布（除以温度，再按 top-k、top-p 过滤；第 1.6 章的做法），每行一个，在 CPU 上。

        en: The distribution the sampler would draw from without speculation (divided by the temperature, then filtered
        by top-k and top-p, as in chapter 1.6), one per row, on the CPU.
        """
        p, rows = req.sampling_params, len(logits)
        probs = (logits.float().cpu() / p.temperature).softmax(dim=-1)
        top_k = torch.full((rows,), p.top_k) if p.top_k > 0 else None
        top_p = torch.full((rows,), p.top_p) if p.top_p < 1.0 else None
        return top_k_top_p_filter(probs, top_k, top_p) if top_k is not None or top_p is not None else probs

    def _tree_logits(self, vb: Batch) -> torch.Tensor:
        """逐层走各章的代码，注意力换成树的（:class:`TreeAttnBackend`）。

        en: Layer by layer through the chapters' code, with the tree's attention (:class:`TreeAttnBackend`)."""
        engine = self.scheduler.engine
        ctx, plain = engine.ctx, engine.ctx.attn_backend
        set_global_ctx(ctx)
        ctx.attn_backend = self.backend
        try:
            with ctx.forward_batch(vb):
                return engine.model.forward()
        finally:
            ctx.attn_backend = plain

    def _fused_logits(self, vb: Batch) -> torch.Tensor:
        """CPU 的融合解码（:mod:`minisgl.fused`）：树的每个节点当作一行解码，它自己的“页表行”是掩码为真的那些槽位
        （前缀、祖先、它自己），所以和普通解码走的是同一个 C 函数。

        en: The CPU's fused decode (:mod:`minisgl.fused`): each node of a tree is one decode row whose own "page-table
        row" is the slots its mask row marks true (the prefix, its ancestors, itself), so it runs the same C function
        as plain decoding.
        """
        s, md = self.scheduler, vb.attn_metadata
        keys = []
        for row, key_len, mask in zip(md.table_idx, md.key_lens, md.masks):
            slots = s.page_table[row, :key_len]
            keys += [slots[m] for m in mask]
        seq_lens = torch.tensor([len(k) for k in keys], dtype=torch.int32)
        table = torch.zeros(len(keys), int(seq_lens.max()), dtype=torch.int32, device=s.device)
        for t, k in enumerate(keys):
            table[t, : len(k)] = k
        rows = torch.arange(len(keys), dtype=torch.int32)
        return s.engine.fused_decoder.logits(vb.input_ids, vb.positions, vb.out_loc, table, rows, seq_lens)

    def _verify_batch(self, fi: ForwardInput, drafts: list[DraftTree], lens: list[int]) -> Batch:
        s, device = self.scheduler, self.scheduler.device
        # TODO 任务 verify_batch：为每个请求（已知 L 个 token，草稿 n 个）准备验证前向的输入：input_ids 是树根（token 池里 input_mapping 那一格）加草稿 token；位置是 tree_positions(草稿, L - 1)；写 K/V 的槽位 out_loc 是页表这一行的第 L - 1 到 L + n - 1 个；掩码是 [n + 1, L - 1 + n + 1]：前缀 L - 1 列全可见，后面接 tree_mask；cu 累加每个请求的行数 n + 1；key_lens 是 L + n。给定：tree_positions、tree_mask（第 5.2 章）
        # TODO task verify_batch: prepare the verifying forward's inputs for each request (L known tokens, n drafts): input_ids are the root (the token pool at input_mapping) followed by the draft tokens; positions are tree_positions(draft, L - 1); the K/V slots out_loc are entries L - 1 to L + n - 1 of its page-table row; the mask is [n + 1, L - 1 + n + 1]: the L - 1 prefix columns all visible, then tree_mask; cu accumulates each request's n + 1 rows; key_lens is L + n. Given: tree_positions, tree_mask (chapter 5.2)
        raise TaskNotDone("speculative", "verify_batch")
        vb = Batch(reqs=fi.batch.reqs, phase="prefill")  # 一次“接着算”的前向：不走解码专用的路 | en: an extend forward, off the decode-only paths
        vb.input_ids = torch.cat(ids)
        vb.positions = torch.cat(positions).to(device=device, dtype=torch.int32)
        vb.out_loc = torch.cat(out_loc)
        vb.attn_metadata = TreeMetadata(cu, [r.table_idx for r in fi.batch.reqs], key_lens, masks, device)
        return vb

    def _commit(self, req: Req, draft: DraftTree, path: list[int], run: list[int], L: int) -> None:
        """接受了 ``a = len(path)`` 个草稿 token 之后：它们的 K/V 挪到位置 ``L .. L+a-1``，多分的页还回去，token 池写上
        ``run``，长度记账推进到“树根算进了缓存”（其余的 token 由结果处理逐个推进）。

        en: After accepting ``a = len(path)`` draft tokens: their K/V move to positions ``L .. L+a-1``, the extra pages go
        back, the token pool gets ``run``, and the bookkeeping advances to "the root is cached" (result processing
        advances the other tokens one by one).
        """
        s, row, a, n = self.scheduler, req.table_idx, len(path), len(draft)
        # TODO 任务 commit_run：接受的第 k 个节点（path[k]，它的 K/V 在这一行的第 L - 1 + path[k] 格）要挪到第 L + k 格：不在原地的，把每一层的 K 和 V 从源槽位拷到目的槽位（spec_stats.moved 加上挪了几格）。有草稿时：第 L + a 到 L + n 格里整页空出来的页还给缓存管理器（free_tail），_allocated_to[req] 记下这一行的页现在分到哪儿（L + a 向上取整到整页），再 _account。最后 token 池这一行从第 L 格起写上 run。给定：CacheManager.free_tail、div_ceil、_account
        # TODO task commit_run: accepted node k (path[k], its K/V in slot L - 1 + path[k] of this row) must move to slot L + k: for those not already in place, copy every layer's K and V from the source slot to the destination slot (spec_stats.moved grows by the number moved). With a draft: give the whole pages freed in slots L + a to L + n back to the cache manager (free_tail), note in _allocated_to[req] how far this row's pages reach now (L + a rounded up to whole pages), then _account. Finally write run into the token pool's row from slot L on. Given: CacheManager.free_tail, div_ceil, _account
        raise TaskNotDone("speculative", "commit_run")
        req.complete_one()

    def _account(self, req: Req, draft: DraftTree, accepted: int) -> None:
        """统计，和这个请求的命中率、歇不歇。

        en: The statistics, and this request's hit rate and whether it rests."""
        stats, track = self.spec_stats, self._tracks[req.uid]
        stats.proposed += len(draft)
        stats.accepted += accepted
        stats.verifies += 1
        stats.accept_lengths[accepted + 1] += 1
        rate = accepted / len(draft)
        track.hit_rate = 0.5 * track.hit_rate + 0.5 * rate
        track.misses = 0 if rate >= MISS_BELOW else track.misses + 1
        track.rest = min(2 ** track.misses - 1, MAX_REST)


def _truncate(draft: DraftTree, n: int) -> DraftTree:
    """广度优先的前 ``n`` 个节点仍是一棵树（父节点总在孩子前面）。

    en: The first ``n`` nodes in breadth-first order are still a tree (a parent always comes before its children)."""
    if len(draft) <= n:
        return draft
    return DraftTree(draft.tokens[:n], draft.parents[:n])
