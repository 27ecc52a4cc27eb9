"""第 2.2 章 cache_manager 的检查：按需分配页面、回收、page_size 1/4/16、准入时预留（内存不够就等，
永不死锁）、放不下的请求立刻拒绝、重复前缀先改指再释放、完整性检查，以及与 Hugging Face 逐 token 一致。"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
import torch

from .conftest import SMOLLM2_TOKENS, SMOL_KW, TINY_KW, assert_idle, expect, integrity_error, record, run_under_later_chapters
from minisgl.i18n import tr
from minisgl.cache_manager import PARTS, CacheManager, NaivePrefixCache, ReservingPrefillAdder
from minisgl.overlap import PARTS as FINAL_PARTS
from minisgl.scheduler import Scheduler
from minisgl.core import Req, SamplingParams
from minisgl.radix_cache import RadixPrefixCache
from minisgl.scheduler import PendingReq
from minisgl.scheduling import TableManager

#: 本章的引擎：第 2.1 章的调度器握着本章的零件。
LLM = partial(Scheduler, parts=PARTS)


def make_manager(num_pages: int, page_size: int, prefix_cache=None, rows: int = 4, width: int = 64) -> CacheManager:  # noqa: ANN001
    page_table = torch.zeros(rows + 1, width, dtype=torch.int32)
    return CacheManager(num_pages, page_size, page_table, prefix_cache or NaivePrefixCache())


def make_req(cm: CacheManager, row: int, prompt: list[int], output_len: int = 8) -> Req:
    req = Req(torch.tensor(prompt, dtype=torch.int32), row, 0, output_len, row, SamplingParams())
    req.cache_handle = cm.match_req(PendingReq(row, req.input_ids, SamplingParams()))
    cm.lock(req.cache_handle)
    return req


def grow(cm: CacheManager, req: Req, steps: int) -> None:
    """模拟请求前进：每步给 [cached_len, device_len) 分配页面，然后 complete_one 并接上一个新 token。"""
    for _ in range(steps):
        cm.allocate_paged([req])
        req.complete_one()
        req.append_host(torch.tensor([7], dtype=torch.int32))


def pages_of(cm: CacheManager, req: Req, upto: int) -> torch.Tensor:
    return torch.unique(cm.page_table[req.table_idx, :upto] // cm.page_size)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_allocate_on_demand(page_size: int) -> None:
    cm = make_manager(num_pages=40, page_size=page_size)
    a, b = make_req(cm, 0, list(range(10))), make_req(cm, 1, list(range(3)))
    cm.allocate_paged([a, b])
    need = -(-10 // page_size) + -(-3 // page_size)
    assert len(cm.free_slots) == 40 - need, tr("Allocate only the whole pages needed for the positions written in this step")
    for req, n in [(a, 10), (b, 3)]:
        slots = cm.page_table[req.table_idx, :n]
        assert torch.equal(slots % page_size, torch.arange(n, dtype=torch.int32) % page_size), tr("Positions within one page are laid out consecutively")
        expect((slots // page_size).tolist(), (slots[:: page_size].repeat_interleave(page_size)[:n] // page_size).tolist(), tr("page_size={page_size}: the page of each position (slot // page_size) in row {row}: every page_size consecutive positions share one page", page_size=page_size, row=req.table_idx))
    assert not set(pages_of(cm, a, 10).tolist()) & set(pages_of(cm, b, 3).tolist()), tr("Two requests must not share pages")
    a.complete_one()  # 预填充那一步发出：cached_len = 10
    a.append_host(torch.tensor([7], dtype=torch.int32))
    before = len(cm.free_slots)
    grow(cm, a, page_size)  # 解码 page_size 步：恰好要再用到 1 页（ps=1 时每步 1 页）
    used = -(-(10 + page_size) // page_size) - -(-10 // page_size)
    assert before - len(cm.free_slots) == used, tr("During decode, allocate only when crossing into a new page")


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_pages_reclaimed_when_request_finishes(page_size: int) -> None:
    cm = make_manager(num_pages=64, page_size=page_size)
    reqs = [make_req(cm, i, list(range(5 + 3 * i))) for i in range(3)]
    for r in reqs:
        grow(cm, r, 6)
    assert len(cm.free_slots) < 64, tr("After 6 tokens for each request, some of the 64 pages must be allocated, but {n} are still free", n=len(cm.free_slots))
    for r in reqs:
        cm.cache_req(r, finished=True)
    assert len(cm.free_slots) == 64, tr("When a request finishes, all its pages return to the free pool")
    cm.check_integrity()


def test_check_integrity_detects_leaks_and_double_frees() -> None:
    cm = make_manager(num_pages=16, page_size=4)
    r = make_req(cm, 0, list(range(6)))
    grow(cm, r, 3)
    with pytest.raises(RuntimeError):
        cm.check_integrity()
        pytest.fail(tr("The integrity check must fail when a page was not returned (a leak)"))
    cm.cache_req(r, finished=True)
    cm.check_integrity()
    cm.free_slots = torch.cat([cm.free_slots, cm.free_slots[:1]])
    with pytest.raises(RuntimeError):
        cm.check_integrity()
        pytest.fail(tr("The integrity check must fail when a page was returned twice"))


def test_duplicate_prefix_is_remapped_before_freeing() -> None:
    """两个请求各自算了同一段前缀：后插入的那个，页表要先改指树里的页，再释放自己那份重复的页。"""
    cm = make_manager(num_pages=64, page_size=1, prefix_cache=RadixPrefixCache(1))
    prompt = [5, 6, 7, 8, 9, 10]
    a, b = make_req(cm, 0, prompt), make_req(cm, 1, prompt)
    grow(cm, a, 1)
    grow(cm, b, 1)
    b_own = cm.page_table[1, :6].clone()
    cm.cache_req(a, finished=False)
    cm.cache_req(b, finished=False)
    assert torch.equal(cm.page_table[1, :6], cm.page_table[0, :6]), tr("The first 6 columns of b's page table must be remapped to the pages in the tree (a's)")
    assert set(b_own.tolist()) <= set(cm.free_slots.tolist()), tr("b's own duplicate pages must be freed")
    assert b.cache_handle.cached_len == 6, tr("b gets a new handle covering the whole prefix")
    grow(cm, b, 3)
    for r in (a, b):
        cm.cache_req(r, finished=True)
    cm.check_integrity()


def test_allocation_evicts_prefix_cache_when_free_pages_run_out() -> None:
    cm = make_manager(num_pages=12, page_size=1, prefix_cache=RadixPrefixCache(1))
    r = make_req(cm, 0, list(range(8)))
    grow(cm, r, 1)
    cm.cache_req(r, finished=True)  # 8 个 token 进了树，没人锁：可驱逐
    expect(len(cm.free_slots), 4, tr("After the finished request's 8 tokens went into the tree: free pages"))
    expect(cm.available_size, 12, tr("available_size = free pages (4) + evictable tokens (8)"))
    other = make_req(cm, 1, [100 + i for i in range(10)])
    cm.allocate_paged([other])
    assert cm.prefix_cache.size_info.evictable_size == 0 and len(cm.free_slots) == 2, tr("When free pages run out, evict from the prefix cache first")
    other.complete_one()
    cm.cache_req(other, finished=True)
    cm.check_integrity()


def test_on_demand_admits_what_static_slots_could_not(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "num_page_override": 64, "max_running_req": 4})
    assert llm.max_seq_len == 64, tr("On-demand allocation: one request may use the whole KV pool (with static allocation each slot had only 16)")
    out = llm.generate([[3] * 40, "short"], SamplingParams(max_tokens=10, ignore_eos=True))
    expect([len(o["token_ids"]) for o in out], [10, 10], tr("Tokens generated per request (max_tokens=10, EOS ignored)"))
    assert_idle(llm)


def test_admission_reserves_for_running_requests(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    """A 将来还要长很多：B 得等 A 结束，不能趁 A 现在用得少就挤进来（否则 A 半路没页可用）。"""
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "num_page_override": 48})
    rec = record(llm)
    a, b = [1] * 5, [2] * 5
    out = llm.generate([a, b], [SamplingParams(max_tokens=35, ignore_eos=True), SamplingParams(max_tokens=12, ignore_eos=True)])
    expect([len(o["token_ids"]) for o in out], [35, 12], tr("Tokens generated per request (max_tokens 35 and 12, EOS ignored)"))
    uid_a, uid_b = rec.steps[0].uids[0], max(u for s in rec.steps for u in s.uids)
    last_a = max(i for i, s in enumerate(rec.steps) if uid_a in s.uids)
    first_b = min(i for i, s in enumerate(rec.steps) if uid_b in s.uids)
    assert first_b > last_a, tr("A needs 40 pages, B needs 17, the pool has only 48: B must wait until A finishes")
    assert_idle(llm)


def test_admission_waits_when_memory_short_never_deadlocks(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "num_page_override": 45, "page_size": 1})
    rec = record(llm)
    out = llm.generate([[i + 1] * 10 for i in range(6)], SamplingParams(max_tokens=10, ignore_eos=True))
    assert [len(o["token_ids"]) for o in out] == [10] * 6, tr("When memory is short new requests wait, and all of them finish in the end (no deadlock)")
    assert max(len(s.uids) for s in rec.steps) == 2, tr("Each request needs 20 pages and the pool has 45: at most 2 can run at once")
    assert_idle(llm)


def test_request_that_can_never_fit_is_refused_up_front(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "num_page_override": 8, "page_size": 4, "max_seq_len_override": 64})
    assert llm.max_seq_len == 32, tr("The whole KV pool is only 8 pages × 4 = 32 tokens: that is the longest a request can be")
    rec = record(llm)
    with pytest.raises(ValueError, match="32"):
        llm.generate(["fine", [5] * 40], SamplingParams(max_tokens=4))
        pytest.fail(tr("A prompt longer than the whole KV pool must be refused at once (stating the limit) instead of waiting forever"))
    assert rec.steps == [], tr("When a request can never fit, not a single token is computed")
    with pytest.raises(ValueError, match="32"):
        llm.generate([[5] * 20], SamplingParams(max_tokens=13))
        pytest.fail(tr("max_tokens past the whole KV pool (20 + 13 > 32) must be refused at once, stating the limit"))
    out = llm.generate([[5] * 20, [6] * 4], SamplingParams(ignore_eos=True))
    assert [len(o["token_ids"]) for o in out] == [12, 28], tr("Without max_tokens each request runs until the context is full (20 + 12 = 4 + 28 = 32 = 8 pages); the two cannot run together and complete one after the other")
    assert_idle(llm)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_all_pages_back_after_generate(tiny_path: str, make_llm, page_size: int) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "page_size": page_size, "num_page_override": 2048 // page_size})
    rec = record(llm)
    out = llm.generate([f"prompt {i} " * (i + 1) for i in range(6)], SamplingParams(max_tokens=7, ignore_eos=True))
    expect([len(o["token_ids"]) for o in out], [7] * 6, tr("Tokens generated per request (max_tokens=7, EOS ignored)"))
    expect(any(s.phase == "decode" for s in rec.steps), True, tr("Some steps must be decode steps"))
    assert len(llm.cache_manager.free_slots) == llm.cache_manager.num_pages, tr("naive cache: every page is free after finishing")
    assert_idle(llm)


@pytest.mark.parametrize("page_size", [1, 4])
def test_batch_invariance_smollm2(smollm2_path, smollm2_prompts, smollm2_reference, make_llm, page_size: int) -> None:  # noqa: ANN001
    sp = SamplingParams(max_tokens=SMOLLM2_TOKENS, ignore_eos=True)
    llm = make_llm(LLM, smollm2_path, **{**SMOL_KW, "page_size": page_size, "num_page_override": 1024 // page_size})
    batched = [o["token_ids"] for o in llm.generate(smollm2_prompts, sp)]
    for i, (ours, ref) in enumerate(zip(batched, smollm2_reference)):
        assert ours == ref, tr("page_size={page_size}, batched: request {i} differs from Hugging Face\nours: {ours}\nHF:   {ref}", page_size=page_size, i=i, ours=ours, ref=ref)
    assert_idle(llm)
    alone = SamplingParams(max_tokens=12, ignore_eos=True)
    singles = [llm.generate([p], alone)[0]["token_ids"] for p in smollm2_prompts[:3]]
    assert singles == [r[:12] for r in smollm2_reference[:3]], tr("Running alone also matches HF")
    assert_idle(llm)


# ----------------------------------------------------------------------------- 完整性检查：每个条件单独抓得到


class _StubCache(NaivePrefixCache):
    """只报一个固定的 ``size_info`` 的前缀缓存（自查总是通过）：单独检验 CacheManager 自己的那几条条件。"""

    def __init__(self, evictable: int, protected: int) -> None:
        self.info = (evictable, protected)

    @property
    def size_info(self):  # noqa: ANN201
        from minisgl.cache_manager import SizeInfo

        return SizeInfo(*self.info)


#: 4 页 × page_size 4；每种情形只破坏一条条件，其余条件都成立：(空闲页首, 缓存可驱逐 token, 缓存受保护 token)
_INTEGRITY_CASES = {
    "ok": ([0, 4, 8], 4, 0),  # 对照：空闲 3 页 + 缓存 1 页 == 4 页
    "protected_left": ([0, 4, 8], 0, 4),  # 页数对得上，但缓存里还有锁
    "duplicate_free_page": ([0, 4, 4], 4, 0),  # 3 + 1 == 4，但第 4 页被还了两次
    "not_page_aligned": ([0, 4, 9], 4, 0),  # 不是页首
    "negative_slot": ([-4, 0, 4], 4, 0),  # 页首、不重复、数目也对，但在 KV 池外
    "slot_past_pool": ([0, 4, 16], 4, 0),  # 16 = num_pages * page_size，已经超出池子
    "page_leaked": ([0, 4], 4, 0),  # 2 + 1 != 4：漏了一页
    "page_counted_twice": ([0, 4, 8, 12], 4, 0),  # 4 + 1 != 4：缓存里的页也在空闲池里
}


@pytest.mark.parametrize("case", list(_INTEGRITY_CASES))
def test_check_integrity_catches_each_condition_alone(case: str) -> None:
    free, evictable, protected = _INTEGRITY_CASES[case]
    cm = make_manager(num_pages=4, page_size=4, prefix_cache=_StubCache(evictable, protected))
    cm.free_slots = torch.tensor(free, dtype=torch.int32)
    if case == "ok":
        cm.check_integrity()
        return
    with integrity_error(
        tr("The integrity check did not catch '{case}': free page starts {free}, cache {evictable} evictable / {protected} protected tokens, 4 pages × 4 in total (check every condition listed in the hint and raise RuntimeError)", case=case, free=free, evictable=evictable, protected=protected)
    ):
        cm.check_integrity()


def test_last_page_may_stick_out_of_the_page_table() -> None:
    """页表只有 10 列、page_size 4：第 3 页的后两个位置伸出页表，不能写，但这一页照样要分配。"""
    cm = make_manager(num_pages=8, page_size=4, width=10)
    r = make_req(cm, 0, list(range(10)))
    cm.allocate_paged([r])
    assert len(cm.free_slots) == 8 - 3, tr("10 tokens need 3 pages, but {value} pages were allocated", value=8 - len(cm.free_slots))
    row = cm.page_table[0, :10]
    assert torch.equal(row % 4, torch.arange(10, dtype=torch.int32) % 4), tr("Positions within a page must be consecutive: {value}", value=row.tolist())
    assert len(torch.unique(row // 4)) == 3, tr("The first 10 columns must fall in 3 different pages: {value}", value=row.tolist())
    assert torch.equal(cm.page_table[1:], torch.zeros_like(cm.page_table[1:])), tr("Other rows must not be written")
    r.complete_one()
    cm.cache_req(r, finished=True)
    assert sorted(cm.free_slots.tolist()) == [0, 4, 8, 12, 16, 20, 24, 28], tr("After finishing, all 3 pages come back (including the one that sticks out)")


def _admit(cm: CacheManager, row: int, prompt: list[int]) -> Req:
    """像准入那样：匹配前缀、锁住句柄、命中的槽位写进页表，从 cached_len 接着算。"""
    ids = torch.tensor(prompt, dtype=torch.int32)
    handle = cm.match_req(PendingReq(row, ids, SamplingParams()))
    cm.lock(handle)
    cm.page_table[row, : handle.cached_len] = handle.get_matched_indices().to(cm.page_table)
    req = Req(ids, row, handle.cached_len, 8, row, SamplingParams())
    req.cache_handle = handle
    return req


@pytest.mark.parametrize("page_size", [1, 4])
def test_finished_requests_leave_no_locks_in_radix_cache(page_size: int) -> None:
    """直接数锁（不只信学员自己的 check_integrity）：请求结束后树里每个节点的 ref_count 都回到 0。"""
    cache = RadixPrefixCache(page_size)
    cm = make_manager(num_pages=64, page_size=page_size, prefix_cache=cache)
    shared = list(range(1, 9))
    for round_ in range(2):  # 第二轮的请求在准入时就命中了第一轮留下的前缀：旧句柄也锁着树里的节点
        reqs = [_admit(cm, i, shared + [50 + i + 10 * round_] * (3 + i)) for i in range(3)]
        if round_:
            assert all(r.cache_handle.cached_len == 8 for r in reqs), tr("The second round must hit the shared 8 tokens")
        for r in reqs:
            grow(cm, r, 2)
            cm.cache_req(r, finished=False)  # 预填充后：换上新句柄、锁住，旧句柄解锁
            assert cache.size_info.protected_size > 0, tr("cache_req(finished=False) must lock the new handle: nothing is protected")
        for r in reqs:
            grow(cm, r, 3)
            cm.cache_req(r, finished=True)
    refs = [n.ref_count for n in cache._all_nodes() if not n.is_root()]
    assert all(c == 0 for c in refs), tr("All requests finished, but nodes in the tree are still locked: ref_count = {refs}", refs=refs)
    info = cache.size_info
    assert info.protected_size == 0, tr("All requests finished, but {protected_size} tokens are still protected (forgot to unlock)", protected_size=info.protected_size)
    assert len(cm.free_slots) + info.total_size // page_size == 64, (
        tr("{n_free_slots} free pages + {value} cached pages != 64 pages", n_free_slots=len(cm.free_slots), value=info.total_size // page_size)
    )


# ----------------------------------------------------------------------------- 学员走查补的检查（issue 16）


def _cached_prefix(page_size: int) -> tuple[CacheManager, RadixPrefixCache, list[int]]:
    """64 个 token 的 KV 池；一个 12 token 的前缀算完、结束，留在 radix 树里没人锁（可驱逐 12 个 token）。"""
    cache = RadixPrefixCache(page_size)
    cm = make_manager(num_pages=64 // page_size, page_size=page_size, prefix_cache=cache, width=64)
    prefix = list(range(1, 13))
    r = make_req(cm, 0, prefix)
    grow(cm, r, 1)
    cm.cache_req(r, finished=True)
    info = cache.size_info
    assert tuple(info) == (12, 0) and cm.available_size == 64, (
        tr("After a 12-token request is computed and cache_req(finished=True) is called, the tree must hold 12 evictable and 0 protected tokens, with 64 available; got {evictable_size} evictable, {protected_size} protected, {available_size} available (more than 64 available means a page was returned twice; protected not 0 means it was not unlocked)", evictable_size=info.evictable_size, protected_size=info.protected_size, available_size=cm.available_size)
    )
    return cm, cache, prefix


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("reserved", [48, 40])
def test_reserve_unlocks_when_second_check_fails(page_size: int, reserved: int) -> None:
    """新请求命中 12 个 token、还要 12 个：锁之前可用 64，锁之后只剩 52。

    ``reserved=48``：第一次比 12 + 48 <= 64 通过，锁住后 12 + 48 > 52 不通过——要解锁再返回 None；
    ``reserved=40``：锁住后 12 + 40 <= 52 仍通过，要接纳（对照）。
    """
    cm, cache, prefix = _cached_prefix(page_size)
    tables = TableManager(4)
    token_pool = torch.zeros(5, 64, dtype=torch.int32)
    adder = ReservingPrefillAdder(token_budget=1024, reserved_size=reserved, table_manager=tables, cache_manager=cm, token_pool=token_pool)
    pending = PendingReq(9, torch.tensor(prefix + [100 + i for i in range(5)], dtype=torch.int32), SamplingParams(max_tokens=7))
    req = adder.try_add_one(pending)
    info = cache.size_info
    if reserved == 48:
        assert req is None, tr("After locking the 12 matched tokens only 52 remain available < 12 + 48: the second check fails and the request must not be admitted")
        assert info.protected_size == 0, (
            tr("The second check failed and the request was not admitted, yet {protected_size} tokens are still locked in the prefix cache (unlock the handle before returning None, otherwise this prefix can never be evicted)", protected_size=info.protected_size)
        )
        assert info.evictable_size == 12, tr("A request that was not admitted must not change the evictable amount: expected 12, got {evictable_size}", evictable_size=info.evictable_size)
        assert tables.available_size == 4, tr("A request that was not admitted must not hold a request slot: {available_size}/4 slots free", available_size=tables.available_size)
        assert adder.reserved_size == 48, tr("A request that was not admitted must not count toward the reservation: reserved_size={reserved_size}, should still be 48", reserved_size=adder.reserved_size)
    else:
        assert req is not None, tr("After locking, 52 available >= 12 + 40: the request must be admitted (the second check uses available_size after locking)")
        assert req.cached_len == 12, tr("12 tokens matched, but Req.cached_len is {cached_len}", cached_len=req.cached_len)
        assert info.protected_size == 12, tr("After admission the 12 matched tokens must stay locked, got {protected_size} protected", protected_size=info.protected_size)
        assert adder.reserved_size == 52, tr("After admission reserved_size must add the 12 tokens this request needs: expected 52, got {reserved_size}", reserved_size=adder.reserved_size)


@pytest.mark.parametrize("cache_kind", ["naive", "radix"])
def test_finished_request_frees_tail_only_up_to_cached_len(cache_kind: str) -> None:
    """请求结束时 cached_len 正好在页边界上（8，page_size 4）：要还的尾巴是页表这行的 [新句柄长度, 8)。

    页表第 0 行第 8 列以后还留着上一个用这一行的请求的槽位——那一页现在属于另一个正在运行的请求。
    切到 device_len（9）会把它“还”回去，等于把别人正在用的页放进空闲池。
    """
    prefix_cache = NaivePrefixCache() if cache_kind == "naive" else RadixPrefixCache(4)
    cm = make_manager(num_pages=16, page_size=4, prefix_cache=prefix_cache, width=32)
    other = make_req(cm, 1, list(range(50, 62)))  # 第 1 行：正在运行，占 3 页
    cm.allocate_paged([other])
    other_pages = set((cm.page_table[1, :12] // 4 * 4).tolist())
    cm.page_table[0, :] = cm.page_table[1, :].clone()  # 第 0 行残留着旧槽位（指向 other 的页）
    r = make_req(cm, 0, list(range(1, 8)))  # 提示词 7 个 token
    grow(cm, r, 2)  # 预填充 + 解码一步：cached_len = 8，device_len = 9
    expect((r.cached_len, r.device_len), (8, 9), tr("Test setup: (cached_len, device_len) after prefill + one decode step"))
    own_pages = set((cm.page_table[0, :8] // 4 * 4).tolist())
    cm.cache_req(r, finished=True)
    free = cm.free_slots.tolist()
    wrongly = sorted(set(free) & other_pages)
    assert not wrongly, (
        tr("When the request finished, page starts {wrongly} that another request is using went back into the free pool: from column 8 on, row 0 of the page table holds stale slots, and the tail to free ends at req.cached_len=8 (not device_len=9)", wrongly=wrongly)
    )
    assert len(free) == len(set(free)), tr("Duplicate page starts in the free pool: {value}", value=sorted(free))
    in_cache = prefix_cache.size_info.total_size // 4
    assert len(free) + in_cache == 16 - len(other_pages), (
        tr("The request's own {n_own_pages} pages must either return to the free pool or stay in the cache: {n_free} free + {in_cache} cached pages, expected 16 - the {n_other_pages} used by other = {value}", n_own_pages=len(own_pages), n_free=len(free), in_cache=in_cache, n_other_pages=len(other_pages), value=16 - len(other_pages))
    )


def test_allocation_evicts_whole_pages_counted_in_tokens() -> None:
    """page_size 4：空闲页不够时驱逐的差额按 token 数算（缺的页数 × 4），驱逐出来的每页取页首并回空闲池。"""
    cm = make_manager(num_pages=6, page_size=4, prefix_cache=RadixPrefixCache(4))
    for i in range(4):  # 4 个互不相同的单页前缀：树里 4 片叶子，各 4 个 token，都可驱逐
        r = make_req(cm, 0, [10 * i + 1 + j for j in range(4)])
        grow(cm, r, 1)
        cm.cache_req(r, finished=True)
    expect(len(cm.free_slots), 2, tr("Free pages after the eviction"))
    expect(cm.prefix_cache.size_info.evictable_size, 16, tr("Evictable tokens left in the tree after the eviction"))
    other = make_req(cm, 1, [100 + i for i in range(20)])  # 要 5 页：空闲 2 页，还缺 3 页 = 12 个 token
    cm.allocate_paged([other])
    row = cm.page_table[1, :20]
    pages = torch.unique(row // 4)
    assert len(pages) == 5 and torch.equal(row % 4, torch.arange(20, dtype=torch.int32) % 4), (
        tr("20 tokens must fall in 5 different whole pages, page table {value} (count the eviction shortfall in tokens: 3 pages short = 12 tokens)", value=row.tolist())
    )
    left = cm.prefix_cache.size_info.evictable_size
    assert left == 4 and len(cm.free_slots) == 0, (
        tr("3 pages short should evict only 3 pages: 4 tokens should stay in the cache with 0 free pages; got {left} tokens left and {n_free_slots} free pages", left=left, n_free_slots=len(cm.free_slots))
    )
    other.complete_one()
    cm.cache_req(other, finished=True)
    cm.check_integrity()


def test_check_integrity_catches_slot_minus_one_with_page_size_1() -> None:
    """page_size=1 时 -1 也“是页首”：范围检查要从 0 开始（free >= 0），不能只挡更小的负数。"""
    cm = make_manager(num_pages=4, page_size=1, prefix_cache=_StubCache(1, 0))
    cm.free_slots = torch.tensor([-1, 0, 1], dtype=torch.int32)  # 3 + 1 == 4、不重复、都对齐，只有 -1 在池外
    with integrity_error(tr("The free pool contains slot -1 (outside the KV pool), but the integrity check did not fail")):
        cm.check_integrity()


def test_admission_waits_for_a_free_slot_when_memory_is_plenty(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    """KV 页面足够、请求槽只有 2 个：第 3 个请求起要等有槽位空出来，而不是去拿一个不存在的槽。"""
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "max_running_req": 2})
    rec = record(llm)
    out = llm.generate([[i + 1] * 6 for i in range(5)], SamplingParams(max_tokens=4, ignore_eos=True))
    assert [len(o["token_ids"]) for o in out] == [4] * 5, tr("All 5 requests must finish")
    most = max(len(s.uids) for s in rec.steps)
    assert most == 2, tr("Only 2 request slots: at most 2 requests per step, but one step had {most}", most=most)
    assert_idle(llm)


def radix_cache_manager(engine, config, table_manager) -> CacheManager:  # noqa: ANN001
    """本章的缓存管理器换上 radix 前缀缓存（第 2.3 章的接口），才能测到“命中的前缀写进页表”。"""
    return CacheManager(engine.num_pages, config.page_size, engine.page_table, RadixPrefixCache(config.page_size, engine.device))


#: 本章的引擎，只是前缀缓存换成 radix 的。
RadixLLM = partial(Scheduler, parts=replace(PARTS, cache_manager=radix_cache_manager))


def test_admission_writes_prefix_hits_into_the_page_table(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    """换上 radix 前缀缓存（第 2.3 章的接口）：命中的前缀槽位要在准入时写进页表 [:cached_len]，否则读到的是别的 K/V。"""
    llm = make_llm(RadixLLM, tiny_path, **TINY_KW)
    rec = record(llm)
    prompt = [[10 + i for i in range(30)]]
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    first = llm.generate(prompt, sp)[0]["token_ids"]
    rec.reset()
    second = llm.generate([[99] * 5, prompt[0]], sp)[1]["token_ids"]  # 这次它在第 1 行：页表那行原来没有这些槽位
    assert rec.prefill_tokens() < 35, tr("The second run must hit the prefix cache, but {value} tokens were prefilled", value=rec.prefill_tokens())
    assert second == first, tr("The output changed after a prefix hit: first {first}, second {second} (matched slots not written into the page table?)", first=first, second=second)
    assert_idle(llm)


def test_admission_writes_a_one_token_prefix_hit_too(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    """只命中 1 个 token 的前缀（两个提示词只有开头那个 token 相同）：这 1 个槽位也要写进页表 [:1]。"""
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    target = [7, *range(50, 70)]
    fresh = make_llm(LLM, tiny_path, **TINY_KW).generate([target], sp)[0]["token_ids"]
    llm = make_llm(RadixLLM, tiny_path, **TINY_KW)
    llm.generate([[99] * 5, [7, *range(200, 220)]], sp)  # 树里留下以 7 开头的前缀，7 的槽位不在第 0 页
    rec = record(llm)
    out = llm.generate([target], sp)[0]["token_ids"]  # 这次它在第 0 行：那一行的 [:1] 原来是 99 的槽位
    hits = [c for s in rec.steps if s.phase == "prefill" for c in s.cached_lens]
    assert 1 in hits, tr("Exactly 1 token should be matched; cached_len at prefill was {hits}", hits=hits)
    assert out == fresh, tr("The output changed after a 1-token hit: without cache {fresh}, after the hit {out} (this slot not written into the page table?)", fresh=fresh, out=out)
    assert_idle(llm)


# ----------------------------------------------------------------------------- 在后面章节下跑本章的代码（issue 24）


@pytest.mark.parametrize("page_size,chunk,overlap", [(1, None, False), (4, 5, True)], ids=["radix-page1", "radix-page4-chunk5-overlap"])
def test_later_chapters_run_this_cache_manager_and_match_hf(final_llms, tiny_path: str, page_size: int, chunk, overlap: bool) -> None:  # noqa: ANN001
    """第 2.3 章的 radix 缓存（以及 2.4、2.5 章）调用本章的准入、按页分配、cache_req（重复前缀改指、释放）：用它们的参考解答跑本章的代码，与 Hugging Face 逐 token 比较，每轮之后页面和锁全部归还。"""
    llm = final_llms(partial(Scheduler, parts=FINAL_PARTS), page_size)
    assert isinstance(llm.cache_manager, CacheManager), tr("Test setup: the final engine must hold this chapter's {name}", name="CacheManager")
    mode = tr("overlap scheduling on") if overlap else tr("overlap scheduling off")
    what = tr("Your cache manager under chapters 2.3 to 2.5 (page_size={page_size}, chunk size {chunk}, {mode})", page_size=page_size, chunk=chunk, mode=mode)
    run_under_later_chapters(llm, tiny_path, chunk=chunk, overlap=overlap, what=what)
