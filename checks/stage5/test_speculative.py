"""第 5.3 章 speculative 的检查：引擎里的投机解码（:mod:`minisgl.speculative`）：和不投机的贪心解码逐 token 相同——每一种配置（radix 或不带前缀
缓存、页大小 1 和 4、分块预填充、排队、链和树、采样的和要控制的请求混在一批里），EOS 落在一串接受的 token 中间、
``max_tokens`` 卡在任何地方、结果处理到一半被取消，都一样；每一步之后页面的账分毫不差。比的是同一个引擎关掉投机时
的输出，而且每一项都先确认真的投机了（接受过草稿，需要时还挪过 K/V），免得“从来没猜”也能过。

en: Checks of chapter 5.3 speculative: speculative decoding in the engine (:mod:`minisgl.speculative`): token for token the same as plain greedy decoding
in every configuration (radix or no prefix cache, page sizes 1 and 4, chunked prefill, queueing, chains and trees,
sampled and controlled requests mixed into one batch), with an EOS inside a run of accepted tokens, ``max_tokens``
falling anywhere, or an abort halfway through a step's results; and the page accounting exact after every step. The
reference is the same engine with speculation off, and each check first makes sure speculation really happened (drafts
accepted, K/V moved where that is the point), so that "never guessing" cannot pass.
"""

from __future__ import annotations

import collections
import random
from typing import Any

import pytest
import torch

from checks.common import chi_square_limit, expect
from checks.stage2.conftest import TINY_KW, built
from minisgl import model_zoo
from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.scheduling import div_ceil

pytestmark = pytest.mark.timeout(300)

#: tiny 模型的引擎参数，dtype 和 device 写明（与 Hugging Face 比对的检查都这样）。
#: en: the tiny model's engine settings, dtype and device stated (as every check comparing with Hugging Face does).
KW: dict[str, Any] = {**TINY_KW, "dtype": torch.float32, "device": "auto"}


def prompts(n: int = 6, seed: int = 0) -> list[list[int]]:
    """重复着的提示词：同一段 token 出现几次，中间岔开，n-gram 有得猜，树也有分叉。

    en: Prompts that repeat: one run of tokens several times with forks between, so the n-grams have something to
    guess and the trees branch.
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        base = [rng.randrange(1000, 5000) for _ in range(6)]
        out.append(base + base[:2] + [77] + base + base[:2] + [99] + base)
    return out


def params(n: int, **kw: Any) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=40 + 9 * i, ignore_eos=True, **kw) for i in range(n)]


def run(spec: bool, reqs: list[list[int]], sps: list[SamplingParams], **kw: Any) -> tuple[list[list[int]], Any]:
    """一个新引擎生成一遍（第二遍重跑一次，让前缀缓存和 n-gram 都有存货），返回两遍的 token 和投机的统计。

    en: Generate once on a new engine (then once more, so the prefix cache and the n-grams have stock), returning both
    passes' tokens and the speculation statistics.
    """
    llm = LLM(built(model_zoo.tiny_qwen3), **{**KW, **kw}, speculative_algorithm="NGRAM" if spec else None)
    try:
        outs = [o["token_ids"] for o in llm.generate(reqs, sps)]
        outs += [o["token_ids"] for o in llm.generate(reqs, sps)]
        return outs, llm.loop.spec_stats
    finally:
        llm.shutdown()


def first_difference(a: list[int], b: list[int]) -> str:
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return tr("lengths {la} and {lb}; first difference at token {i}: plain {x} vs speculative {y}",
              la=len(a), lb=len(b), i=i, x=a[i:i + 3], y=b[i:i + 3])


def expect_same(plain: list[list[int]], spec: list[list[int]], what: str) -> None:
    for k, (a, b) in enumerate(zip(plain, spec)):
        assert a == b, tr("{what}: request {k} differs from plain decoding: {diff}", what=what, k=k,
                          diff=first_difference(a, b))


CONFIGS = {
    "radix": {},
    "naive-page4": dict(cache_type="naive", page_size=4, num_page_override=512),
    "radix-page4": dict(page_size=4, num_page_override=512),
    "chunked": dict(max_extend_tokens=16),
    "queueing": dict(max_running_req=2),
    "chain": dict(speculative_ngram_max_bfs_breadth=1, speculative_num_draft_tokens=5),
    "layer-by-layer": dict(cpu_fused_decode=False),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_token_equal_to_plain_greedy(name: str) -> None:
    kw, reqs = CONFIGS[name], prompts()
    sps = params(len(reqs))
    spec, stats = run(True, reqs, sps, **kw)
    plain, _ = run(False, reqs, sps, **kw)
    expect_same(plain, spec, tr("configuration {name} {kw}", name=name, kw=kw))
    assert stats.accepted > 0, tr("configuration {name}: no draft token was ever accepted ({stats}), so this check "
                                  "proves nothing", name=name, stats=stats)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "layer-by-layer"])
def test_tree_branches_are_accepted_and_their_kv_moved(fused: bool) -> None:
    """接受了不是第一个孩子的分支时，它的 K/V 要挪到挨着的位置，位置按深度算，兄弟互相看不见：错一样，后面的
    token 就会变。这一项先确认这种情形真的发生过。CPU 上验证要么走融合的 C 解码（每个节点自己一行），要么逐层走各章的
    代码、注意力换成树的；两条都查。

    en: When a branch other than the first child is accepted, its K/V must move next to the prefix, positions go by
    depth, and siblings never see each other: get one wrong and later tokens change. This check first makes sure that
    case really happened. On the CPU the verification runs in the fused C decode (each node a decode row of its own)
    or layer by layer through the chapters' code with the tree's attention; both are checked.
    """
    reqs = prompts(8, seed=1)
    sps = params(len(reqs))
    spec, stats = run(True, reqs, sps, cpu_fused_decode=fused)
    plain, _ = run(False, reqs, sps, cpu_fused_decode=fused)
    assert stats.moved > 0, tr("no accepted path needed its K/V moved ({stats}): the check would not notice a wrong "
                               "move", stats=stats)
    expect_same(plain, spec, tr("draft trees with accepted side branches"))


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "layer-by-layer"])
def test_each_draft_rows_logits_match_a_dense_forward_of_its_branch(fused: bool) -> None:
    """验证前向里每个草稿节点那一行的 logits，应当等于 Hugging Face 把“已知的 token + 树根到这个节点的路”整段算一遍
    得到的最后一行：掩码让兄弟互相看见、位置按下标排、K/V 写错地方，都会让某一行对不上——哪怕贪心的 token 碰巧没变。

    en: Each draft node's row of logits in the verifying forward must equal the last row Hugging Face computes over
    "the known tokens + the path from the root to this node" as one dense sequence: a mask letting siblings see each
    other, positions by index, K/V written to the wrong place all make some row differ, even when the greedy tokens
    happen not to change.
    """
    from checks.hf_reference import load_hf

    llm = LLM(built(model_zoo.tiny_qwen3), **KW, speculative_algorithm="NGRAM", cpu_fused_decode=fused)
    name = "_fused_logits" if fused else "_tree_logits"
    original, seen = getattr(llm.loop, name), []

    def spy(vb: Any) -> Any:
        logits = original(vb)
        seen.append((vb, [r.input_ids.clone() for r in vb.reqs], logits.clone()))
        return logits

    setattr(llm.loop, name, spy)
    try:
        reqs = prompts(4, seed=1)
        llm.generate(reqs, params(len(reqs)))
    finally:
        llm.shutdown()
    hf, checked, branched = load_hf(built(model_zoo.tiny_qwen3)), 0, 0
    for vb, known, logits in seen[:12]:
        md = vb.attn_metadata
        for b, mask in enumerate(md.masks):
            start, tree = md.cu_seqlens_q_cpu[b], mask[:, mask.shape[1] - mask.shape[0]:].cpu()
            branched += int(tree[1:].sum(dim=1).tolist() != list(range(2, len(tree) + 1)))
            for i in range(1, len(tree)):
                path = [int(vb.input_ids[start + j]) for j in range(1, len(tree)) if tree[i, j]]
                with torch.no_grad():
                    want = hf(torch.tensor([known[b].tolist() + path])).logits[0, -1]
                torch.testing.assert_close(logits[start + i].float(), want.float(), atol=2e-3, rtol=2e-3, msg=lambda m: tr(
                    "step with {n} rows, request {b}, draft node {i} (path {path}): its logits differ from a dense "
                    "forward of the known tokens + the path\n{m}", n=len(vb.input_ids), b=b, i=i, path=path, m=m))
                checked += 1
    assert checked and branched, tr("the verifying steps held {checked} draft rows and {branched} branching trees: "
                                    "nothing to compare", checked=checked, branched=branched)


def test_every_max_tokens_falls_where_plain_decoding_stops() -> None:
    reqs = prompts(1, seed=2) * 12
    sps = [SamplingParams(max_tokens=m, ignore_eos=True) for m in range(1, 13)]
    spec, stats = run(True, reqs, sps)
    plain, _ = run(False, reqs, sps)
    expect_same(plain, spec, tr("max_tokens from 1 to 12"))
    expect([len(t) for t in spec[:12]], list(range(1, 13)), tr("output lengths for max_tokens 1..12"))
    assert stats.accepted > 0, tr("no draft token was accepted ({stats})", stats=stats)


def steps_of(llm: Any, prompt: list[int], sp: SamplingParams) -> list[list[int]]:
    """一个请求的输出，按步分组。"""
    groups: list[list[int]] = []
    current: list[int] = []
    stop_events = llm.add_result_listener(lambda e: e.token is not None and current.append(e.token))
    stop_steps = llm.add_step_listener(lambda trace: (groups.append(list(current)), current.clear()))
    try:
        llm.generate([prompt], [sp])
    finally:
        stop_events(), stop_steps()
    return [g for g in groups if g]


def test_an_eos_inside_an_accepted_run_ends_the_request_there() -> None:
    """先不设 EOS 跑一遍，挑一个第一次出现时在一步的中间（接在别的接受的 token 后面）的 token，把它当 EOS 再跑：
    投机和不投机都该停在它前面，而且停下时页面一页不多。

    en: Run once without an EOS, pick a token whose first appearance is in the middle of a step (after other accepted
    tokens), make it the EOS and run again: speculative and plain decoding must both stop just before it, with not one
    page too many when they stop.
    """
    reqs, sps = prompts(1, seed=3), [SamplingParams(max_tokens=120, ignore_eos=True)]
    llm = LLM(built(model_zoo.tiny_qwen3), **KW, speculative_algorithm="NGRAM")
    try:
        groups = steps_of(llm, reqs[0], sps[0])
        seen: set[int] = set()
        eos = None
        for group in groups:
            for k, token in enumerate(group):
                if k > 0 and token not in seen and eos is None:
                    eos = token
                seen.add(token)
        assert eos is not None, tr("no token first appeared inside a run of accepted tokens: {groups}", groups=groups)
        llm.eos_token_id = eos
        spec = llm.generate(reqs, [SamplingParams(max_tokens=120)])[0]["token_ids"]
    finally:
        llm.shutdown()
    plain_llm = LLM(built(model_zoo.tiny_qwen3), **KW)
    try:
        plain_llm.eos_token_id = eos
        plain = plain_llm.generate(reqs, [SamplingParams(max_tokens=120)])[0]["token_ids"]
    finally:
        plain_llm.shutdown()
    expect(spec, plain, tr("output with token {eos} as EOS", eos=eos))
    assert eos not in spec, tr("the output goes on past the EOS {eos}: {spec}", eos=eos, spec=spec)


def abort_run(reqs: list[list[int]], sps: list[SamplingParams], abort_at: tuple[int, int] | None) -> tuple[list[list[int]], list[list[int]], Any]:
    """新引擎上跑 ``reqs``：``abort_at = (第几步, 第几个)`` 时，请求 0 在它那一步的第几个 token 上被监听者取消，请求 1 的
    第 5 个 token 上取消请求 2（同一批里还没轮到的）。返回各请求的输出、请求 0 按步分组的输出和统计。

    en: Run ``reqs`` on a new engine: with ``abort_at = (step, index)``, a listener aborts request 0 at that token of
    that step of its own, and request 2 (not reached yet in the same batch) at request 1's fifth token. Returns each
    request's output, request 0's output grouped by step, and the statistics.
    """
    llm = LLM(built(model_zoo.tiny_qwen3), **KW, speculative_algorithm="NGRAM")
    try:
        uids = [llm.add_request(p, sp) for p, sp in zip(reqs, sps)]
        tokens: dict[int, list[int]] = {uid: [] for uid in uids}
        groups: list[list[int]] = [[]]

        def on_event(event: Any) -> None:
            if event.token is None:
                return
            tokens[event.uid].append(event.token)
            if event.uid == uids[0]:
                groups[-1].append(event.token)
                if abort_at == (len(groups) - 1, len(groups[-1])):
                    llm.abort(uids[0])
            if abort_at and event.uid == uids[1] and len(tokens[uids[1]]) == 5:
                llm.abort(uids[2])

        stop = llm.add_result_listener(on_event)
        unstep = llm.add_step_listener(lambda trace: groups[-1] and groups.append([]))
        llm.run_until_idle()
        stop(), unstep()
        llm.check_integrity()
        return [tokens[uid] for uid in uids], groups, llm.loop.spec_stats
    finally:
        llm.shutdown()


def test_an_abort_halfway_through_a_steps_tokens_gives_everything_back() -> None:
    """先完整跑一遍，找请求 0 出了至少 3 个 token 的一步；再同样跑一遍，在那一步的第 2 个 token 上取消它（后面的 token
    已经验证过、占着页，却还没交出去），另在请求 1 的第 5 个 token 上取消请求 2：输出是不投机时的前缀，全部资源都还回来
    （完整性检查：空闲页 + 缓存的页 = 总页数）。

    en: Run once to the end and find a step where request 0 got at least 3 tokens; run the same again and abort it at the
    second token of that step (the later tokens verified and holding pages, not handed out yet), and abort request 2 at
    request 1's fifth token: outputs are prefixes of plain decoding's, and every resource comes back (the integrity
    check: free pages + cached pages = all pages).
    """
    reqs = prompts(3, seed=4)
    sps = params(3)
    _, groups, _ = abort_run(reqs, sps, None)
    plain, _ = run(False, reqs, sps)
    step = next((i for i, g in enumerate(groups) if len(g) >= 3), None)
    assert step is not None, tr("request 0 never got 3 tokens in one step: {groups}", groups=groups)
    outs, _, stats = abort_run(reqs, sps, (step, 2))
    expect(len(outs[0]), sum(len(g) for g in groups[:step]) + 2, tr("tokens request 0 kept when aborted"))
    for k in range(3):
        expect(outs[k], plain[k][: len(outs[k])], tr("request {k}'s output is a prefix of plain decoding's", k=k))
    expect(outs[1], plain[1][: len(outs[1])], tr("request 1 (never aborted)"))
    expect(len(outs[1]), len(plain[1]), tr("request 1's length (never aborted)"))


def own_pages(llm: Any) -> int:
    """占着资源的请求自己的页（不算前缀缓存里的；这一步了结的请求处理完这一步才归还）。"""
    ps, reqs = llm.page_size, [st.req for st in llm.status.values() if st.req is not None]
    return sum(div_ceil(r.cached_len, ps) - r.cache_handle.cached_len // ps for r in reqs)


@pytest.mark.parametrize("page_size", [1, 4])
def test_pages_add_up_after_every_step(page_size: int) -> None:
    """每一步之后：空闲页 + 前缀缓存的页 + 占着资源的请求自己的页（到 cached_len 为止）= 总页数。被拒绝的草稿的页要是
    没还，或者还多了，这里当场就不等。

    en: After every step: free pages + the prefix cache's pages + the own pages of the requests holding resources (up to cached_len) =
    all pages. Pages of rejected drafts kept, or too many given back, break the equation on the spot.
    """
    llm = LLM(built(model_zoo.tiny_qwen3), **{**KW, "page_size": page_size, "num_page_override": 2048 // page_size},
              speculative_algorithm="NGRAM")
    cm, problems = llm.cache_manager, []

    def check(trace: Any) -> None:
        total = len(cm.free_slots) + cm.prefix_cache.size_info.total_size // page_size + own_pages(llm)
        if total != cm.num_pages:
            problems.append((trace.index, trace.phase, total))

    stop = llm.add_step_listener(check)
    try:
        reqs = prompts(5, seed=5)
        llm.generate(reqs, params(len(reqs)))
        stats = llm.loop.spec_stats
    finally:
        stop()
        llm.shutdown()
    assert stats.proposed > stats.accepted > 0, tr("some drafts must be accepted and some rejected ({stats})", stats=stats)
    expect(problems, [], tr("steps where free + cached + running pages != {n} pages: (step, phase, sum)", n=cm.num_pages))


def test_a_mixed_batch_speculates_where_it_may_and_matches_plain_decoding() -> None:
    """一批里有贪心的、带种子采样的、要对数概率的、带惩罚的：只有能投机的投机，输出都和不投机时一样。

    en: One batch holds greedy requests, seeded sampled ones, ones asking log-probabilities and penalised ones: only
    those that may speculate do, and every output matches plain decoding.
    """
    reqs = prompts(6, seed=6)
    sps = [SamplingParams(max_tokens=50, ignore_eos=True),
           SamplingParams(max_tokens=50, ignore_eos=True, temperature=0.9, seed=11),
           SamplingParams(max_tokens=50, ignore_eos=True, logprobs=True, top_logprobs=2),
           SamplingParams(max_tokens=50, ignore_eos=True, repetition_penalty=1.3),
           SamplingParams(max_tokens=50, ignore_eos=True, top_k=1, temperature=0.7),
           SamplingParams(max_tokens=50, ignore_eos=True, min_tokens=20)]
    spec, stats = run(True, reqs, sps)
    plain, _ = run(False, reqs, sps)
    expect_same(plain, spec, tr("a batch mixing greedy, sampled, logprobs and penalised requests"))
    assert stats.accepted > 0, tr("no draft token was accepted ({stats})", stats=stats)


def position_counts(spec: bool, n: int, at: int) -> tuple[collections.Counter[int], Any]:
    """``n`` 个同样的、没有种子的采样请求（温度 0.1）第 ``at`` 个输出 token 的分布，和投机的统计。"""
    prompt = prompts(1, seed=7)[0]
    sp = SamplingParams(max_tokens=at + 1, ignore_eos=True, temperature=0.1)
    llm = LLM(built(model_zoo.tiny_qwen3), **{**KW, "max_running_req": 32},
              speculative_algorithm="NGRAM" if spec else None)
    try:
        outs = llm.generate([prompt] * n, sp)
        return collections.Counter(o["token_ids"][at] for o in outs), llm.loop.spec_stats
    finally:
        llm.shutdown()


def test_speculative_sampling_keeps_the_plain_samplers_distribution() -> None:
    """温度 0.1、没有种子：投机和不投机各 240 个请求，第 8 个输出 token 的分布相同（卡方齐性检验，计数少的 token
    并成一格）；先确认投机采样真的接受过草稿。

    en: Temperature 0.1, no seed: 240 requests each with and without speculation, the 8th output token
    distributed the same (a chi-square test of homogeneity, rare tokens pooled into one cell); speculative sampling must
    first have accepted drafts.
    """
    spec, stats = position_counts(True, 240, 8)
    plain, _ = position_counts(False, 240, 8)
    assert stats.accepted > 0, tr("no draft token was accepted ({stats})", stats=stats)
    common = [t for t in plain | spec if plain[t] + spec[t] >= 20]
    cells = [(plain[t], spec[t]) for t in common]
    cells.append((sum(plain.values()) - sum(a for a, _ in cells), sum(spec.values()) - sum(b for _, b in cells)))
    cells = [c for c in cells if sum(c) > 0]
    n1, n2 = sum(a for a, _ in cells), sum(b for _, b in cells)
    stat = sum((a - n1 * (a + b) / (n1 + n2)) ** 2 / (n1 * (a + b) / (n1 + n2))
               + (b - n2 * (a + b) / (n1 + n2)) ** 2 / (n2 * (a + b) / (n1 + n2)) for a, b in cells)
    dof = max(len(cells) - 1, 1)
    limit = chi_square_limit(dof)
    assert stat < limit, tr("the 8th token's counts (plain, speculative) per token {cells} differ (chi-square {stat:.1f}, "
                            "limit {limit:.1f})", cells=dict(zip([*common, "other"], cells)), stat=stat, limit=limit)
