"""第 2.2 章 cache_manager 的检查：按需分配页面、回收、page_size 1/4/16、准入时预留（内存不够就等，
永不死锁）、放不下的请求立刻拒绝、重复前缀先改指再释放、完整性检查，以及与 Hugging Face 逐 token 一致。"""

from __future__ import annotations

import pytest
import torch

from .conftest import SMOL_KW, SMOLLM2_TOKENS, TINY_KW, assert_idle, integrity_error, record
from minisgl.cache_manager import LLM, CacheManager, NaivePrefixCache, ReservingPrefillAdder
from minisgl.core import Req, SamplingParams
from minisgl.radix_cache import RadixPrefixCache
from minisgl.scheduler import PendingReq
from minisgl.scheduling import TableManager


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
    assert len(cm.free_slots) == 40 - need, "只分配这一步要写的位置所需的整页"
    for req, n in [(a, 10), (b, 3)]:
        slots = cm.page_table[req.table_idx, :n]
        assert torch.equal(slots % page_size, torch.arange(n, dtype=torch.int32) % page_size), "同一页里的位置连续排列"
        assert torch.equal(slots // page_size, slots[:: page_size].repeat_interleave(page_size)[:n] // page_size)
    assert not set(pages_of(cm, a, 10).tolist()) & set(pages_of(cm, b, 3).tolist()), "两个请求不共用页面"
    a.complete_one()  # 预填充那一步发出：cached_len = 10
    a.append_host(torch.tensor([7], dtype=torch.int32))
    before = len(cm.free_slots)
    grow(cm, a, page_size)  # 解码 page_size 步：恰好要再用到 1 页（ps=1 时每步 1 页）
    used = -(-(10 + page_size) // page_size) - -(-10 // page_size)
    assert before - len(cm.free_slots) == used, "解码时只在跨进新的一页时才分配"


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_pages_reclaimed_when_request_finishes(page_size: int) -> None:
    cm = make_manager(num_pages=64, page_size=page_size)
    reqs = [make_req(cm, i, list(range(5 + 3 * i))) for i in range(3)]
    for r in reqs:
        grow(cm, r, 6)
    assert len(cm.free_slots) < 64
    for r in reqs:
        cm.cache_req(r, finished=True)
    assert len(cm.free_slots) == 64, "请求结束后它的页面全部回到空闲池"
    cm.check_integrity()


def test_check_integrity_detects_leaks_and_double_frees() -> None:
    cm = make_manager(num_pages=16, page_size=4)
    r = make_req(cm, 0, list(range(6)))
    grow(cm, r, 3)
    with pytest.raises(RuntimeError):
        cm.check_integrity()
        pytest.fail("有页面没还（泄漏）时完整性检查要报错")
    cm.cache_req(r, finished=True)
    cm.check_integrity()
    cm.free_slots = torch.cat([cm.free_slots, cm.free_slots[:1]])
    with pytest.raises(RuntimeError):
        cm.check_integrity()
        pytest.fail("同一页被还了两次时完整性检查要报错")


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
    assert torch.equal(cm.page_table[1, :6], cm.page_table[0, :6]), "b 的页表前 6 列要改指树里（a 的）页"
    assert set(b_own.tolist()) <= set(cm.free_slots.tolist()), "b 自己那份重复的页要释放"
    assert b.cache_handle.cached_len == 6, "b 换上覆盖整段前缀的新句柄"
    grow(cm, b, 3)
    for r in (a, b):
        cm.cache_req(r, finished=True)
    cm.check_integrity()


def test_allocation_evicts_prefix_cache_when_free_pages_run_out() -> None:
    cm = make_manager(num_pages=12, page_size=1, prefix_cache=RadixPrefixCache(1))
    r = make_req(cm, 0, list(range(8)))
    grow(cm, r, 1)
    cm.cache_req(r, finished=True)  # 8 个 token 进了树，没人锁：可驱逐
    assert len(cm.free_slots) == 4 and cm.available_size == 12
    other = make_req(cm, 1, [100 + i for i in range(10)])
    cm.allocate_paged([other])
    assert cm.prefix_cache.size_info.evictable_size == 0 and len(cm.free_slots) == 2, "空闲页不够时先从前缀缓存驱逐"
    other.complete_one()
    cm.cache_req(other, finished=True)
    cm.check_integrity()


def test_on_demand_admits_what_static_slots_could_not(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "num_page_override": 64, "max_running_req": 4})
    assert llm.max_seq_len == 64, "按需分配：一个请求最多可以用满整个 KV 池（静态分配时每个槽只有 16）"
    out = llm.generate([[3] * 40, "short"], SamplingParams(max_tokens=10, ignore_eos=True))
    assert [len(o["token_ids"]) for o in out] == [10, 10]
    assert_idle(llm)


def test_admission_reserves_for_running_requests(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    """A 将来还要长很多：B 得等 A 结束，不能趁 A 现在用得少就挤进来（否则 A 半路没页可用）。"""
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "num_page_override": 48})
    rec = record(llm)
    a, b = [1] * 5, [2] * 5
    out = llm.generate([a, b], [SamplingParams(max_tokens=35, ignore_eos=True), SamplingParams(max_tokens=12, ignore_eos=True)])
    assert [len(o["token_ids"]) for o in out] == [35, 12]
    uid_a, uid_b = rec.steps[0].uids[0], max(u for s in rec.steps for u in s.uids)
    last_a = max(i for i, s in enumerate(rec.steps) if uid_a in s.uids)
    first_b = min(i for i, s in enumerate(rec.steps) if uid_b in s.uids)
    assert first_b > last_a, "A 要用 40 页、B 要用 17 页、池子只有 48 页：B 必须等 A 结束"
    assert_idle(llm)


def test_admission_waits_when_memory_short_never_deadlocks(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "num_page_override": 45, "page_size": 1})
    rec = record(llm)
    out = llm.generate([[i + 1] * 10 for i in range(6)], SamplingParams(max_tokens=10, ignore_eos=True))
    assert [len(o["token_ids"]) for o in out] == [10] * 6, "内存不够时新请求先等，最后全部完成（不死锁）"
    assert max(len(s.uids) for s in rec.steps) == 2, "每个请求要 20 页、池子 45 页：同时最多运行 2 个"
    assert_idle(llm)


def test_request_that_can_never_fit_is_refused_up_front(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "num_page_override": 8, "page_size": 4, "max_seq_len_override": 64})
    assert llm.max_seq_len == 32, "整个 KV 池只有 8 页 × 4 = 32 个 token：一个请求最多这么长"
    rec = record(llm)
    with pytest.raises(ValueError, match="32"):
        llm.generate(["fine", [5] * 40], SamplingParams(max_tokens=4))
        pytest.fail("提示词比整个 KV 池还长时要立刻报错（说出上限），而不是永远等下去")
    assert rec.steps == [], "有放不下的请求时一个 token 也不算"
    with pytest.warns(UserWarning, match="max_tokens"):
        out = llm.generate([[5] * 20, [6] * 4], SamplingParams(max_tokens=20, ignore_eos=True))
    assert [len(o["token_ids"]) for o in out] == [12, 20], "max_tokens 截到恰好放得下（20 + 12 = 32 = 8 页），照常完成"
    assert_idle(llm)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_all_pages_back_after_generate(tiny_path: str, make_llm, page_size: int) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "page_size": page_size, "num_page_override": 2048 // page_size})
    rec = record(llm)
    out = llm.generate([f"prompt {i} " * (i + 1) for i in range(6)], SamplingParams(max_tokens=7, ignore_eos=True))
    assert [len(o["token_ids"]) for o in out] == [7] * 6
    assert any(s.phase == "decode" for s in rec.steps)
    assert len(llm.cache_manager.free_slots) == llm.cache_manager.num_pages, "naive 缓存：结束后全部页面空闲"
    assert_idle(llm)


@pytest.mark.parametrize("page_size", [1, 4])
def test_batch_invariance_smollm2(smollm2_path, smollm2_prompts, smollm2_reference, make_llm, page_size: int) -> None:  # noqa: ANN001
    sp = SamplingParams(max_tokens=SMOLLM2_TOKENS, ignore_eos=True)
    llm = make_llm(LLM, smollm2_path, **{**SMOL_KW, "page_size": page_size, "num_page_override": 1024 // page_size})
    batched = [o["token_ids"] for o in llm.generate(smollm2_prompts, sp)]
    for i, (ours, ref) in enumerate(zip(batched, smollm2_reference)):
        assert ours == ref, f"page_size={page_size} 成批：第 {i} 个请求与 Hugging Face 不一致\n我们：{ours}\nHF：  {ref}"
    assert_idle(llm)
    alone = SamplingParams(max_tokens=12, ignore_eos=True)
    singles = [llm.generate([p], alone)[0]["token_ids"] for p in smollm2_prompts[:3]]
    assert singles == [r[:12] for r in smollm2_reference[:3]], "单独跑也与 HF 一致"
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
        f"完整性检查没有发现「{case}」：空闲页首 {free}，缓存 可驱逐 {evictable} / 受保护 {protected} 个 token，"
        f"共 4 页 × 4（提示里列出的每一条都要检查，并抛 RuntimeError）"
    ):
        cm.check_integrity()


def test_last_page_may_stick_out_of_the_page_table() -> None:
    """页表只有 10 列、page_size 4：第 3 页的后两个位置伸出页表，不能写，但这一页照样要分配。"""
    cm = make_manager(num_pages=8, page_size=4, width=10)
    r = make_req(cm, 0, list(range(10)))
    cm.allocate_paged([r])
    assert len(cm.free_slots) == 8 - 3, f"10 个 token 要 3 页，实际分配了 {8 - len(cm.free_slots)} 页"
    row = cm.page_table[0, :10]
    assert torch.equal(row % 4, torch.arange(10, dtype=torch.int32) % 4), f"页内位置要连续：{row.tolist()}"
    assert len(torch.unique(row // 4)) == 3, f"前 10 列应落在 3 个不同的页里：{row.tolist()}"
    assert torch.equal(cm.page_table[1:], torch.zeros_like(cm.page_table[1:])), "别的行不能被写到"
    r.complete_one()
    cm.cache_req(r, finished=True)
    assert sorted(cm.free_slots.tolist()) == [0, 4, 8, 12, 16, 20, 24, 28], "结束后 3 页全部回来（伸出去的那页也要还）"


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
            assert all(r.cache_handle.cached_len == 8 for r in reqs), "第二轮应命中共享的 8 个 token"
        for r in reqs:
            grow(cm, r, 2)
            cm.cache_req(r, finished=False)  # 预填充后：换上新句柄、锁住，旧句柄解锁
            assert cache.size_info.protected_size > 0
        for r in reqs:
            grow(cm, r, 3)
            cm.cache_req(r, finished=True)
    refs = [n.ref_count for n in cache._all_nodes() if not n.is_root()]
    assert all(c == 0 for c in refs), f"请求都结束了，树里还有节点被锁着：ref_count = {refs}"
    info = cache.size_info
    assert info.protected_size == 0, f"请求都结束了，还有 {info.protected_size} 个 token 受保护（忘了解锁）"
    assert len(cm.free_slots) + info.total_size // page_size == 64, (
        f"空闲 {len(cm.free_slots)} 页 + 缓存 {info.total_size // page_size} 页 != 64 页"
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
        f"一个 12 token 的请求算完并 cache_req(finished=True) 之后：树里应有 12 个可驱逐、0 个受保护的 token，"
        f"可用 64；实际 可驱逐 {info.evictable_size}、受保护 {info.protected_size}、可用 {cm.available_size}"
        "（可用多于 64 说明有页被还了两次，受保护不为 0 说明没解锁）"
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
        assert req is None, "锁住命中的 12 个 token 后可用只剩 52 < 12 + 48：第二次检查不通过，不能接纳"
        assert info.protected_size == 0, (
            f"第二次检查没通过、请求没被接纳，前缀缓存里却还有 {info.protected_size} 个 token 被锁着"
            "（返回 None 之前要先 unlock 句柄，否则这段前缀再也驱逐不了）"
        )
        assert info.evictable_size == 12, f"没接纳的请求不该改变可驱逐的量：应为 12，实际 {info.evictable_size}"
        assert tables.available_size == 4, f"没接纳的请求不能占着请求槽：空闲槽 {tables.available_size}/4"
        assert adder.reserved_size == 48, f"没接纳的请求不能计入预留：reserved_size={adder.reserved_size}，应仍为 48"
    else:
        assert req is not None, "锁住后可用 52 >= 12 + 40：应当接纳（第二次检查用的是锁住之后的 available_size）"
        assert req.cached_len == 12, f"命中 12 个 token，Req.cached_len 却是 {req.cached_len}"
        assert info.protected_size == 12, f"接纳之后命中的 12 个 token 要锁着，实际受保护 {info.protected_size}"
        assert adder.reserved_size == 52, f"接纳之后 reserved_size 要加上这个请求要的 12 个 token：应为 52，实际 {adder.reserved_size}"


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
    assert (r.cached_len, r.device_len) == (8, 9)
    own_pages = set((cm.page_table[0, :8] // 4 * 4).tolist())
    cm.cache_req(r, finished=True)
    free = cm.free_slots.tolist()
    wrongly = sorted(set(free) & other_pages)
    assert not wrongly, (
        f"请求结束时把别人正在用的页首 {wrongly} 还进了空闲池：页表第 0 行第 8 列以后是残留的旧槽位，"
        f"要还的尾巴只到 req.cached_len=8（不是 device_len=9）"
    )
    assert len(free) == len(set(free)), f"空闲池里有重复的页首：{sorted(free)}"
    in_cache = prefix_cache.size_info.total_size // 4
    assert len(free) + in_cache == 16 - len(other_pages), (
        f"请求自己的 {len(own_pages)} 页要么还回空闲池、要么留在缓存：空闲 {len(free)} 页 + 缓存 {in_cache} 页，"
        f"应为 16 - other 占的 {len(other_pages)} 页 = {16 - len(other_pages)}"
    )


def test_allocation_evicts_whole_pages_counted_in_tokens() -> None:
    """page_size 4：空闲页不够时驱逐的差额按 token 数算（缺的页数 × 4），驱逐出来的每页取页首并回空闲池。"""
    cm = make_manager(num_pages=6, page_size=4, prefix_cache=RadixPrefixCache(4))
    for i in range(4):  # 4 个互不相同的单页前缀：树里 4 片叶子，各 4 个 token，都可驱逐
        r = make_req(cm, 0, [10 * i + 1 + j for j in range(4)])
        grow(cm, r, 1)
        cm.cache_req(r, finished=True)
    assert len(cm.free_slots) == 2 and cm.prefix_cache.size_info.evictable_size == 16
    other = make_req(cm, 1, [100 + i for i in range(20)])  # 要 5 页：空闲 2 页，还缺 3 页 = 12 个 token
    cm.allocate_paged([other])
    row = cm.page_table[1, :20]
    pages = torch.unique(row // 4)
    assert len(pages) == 5 and torch.equal(row % 4, torch.arange(20, dtype=torch.int32) % 4), (
        f"20 个 token 应落在 5 个不同的整页里，实际页表 {row.tolist()}（驱逐的差额要按 token 数：缺 3 页 = 12 个 token）"
    )
    left = cm.prefix_cache.size_info.evictable_size
    assert left == 4 and len(cm.free_slots) == 0, (
        f"缺 3 页只该驱逐 3 页：缓存里应剩 4 个 token、空闲 0 页，实际剩 {left} 个 token、空闲 {len(cm.free_slots)} 页"
    )
    other.complete_one()
    cm.cache_req(other, finished=True)
    cm.check_integrity()


def test_check_integrity_catches_slot_minus_one_with_page_size_1() -> None:
    """page_size=1 时 -1 也“是页首”：范围检查要从 0 开始（free >= 0），不能只挡更小的负数。"""
    cm = make_manager(num_pages=4, page_size=1, prefix_cache=_StubCache(1, 0))
    cm.free_slots = torch.tensor([-1, 0, 1], dtype=torch.int32)  # 3 + 1 == 4、不重复、都对齐，只有 -1 在池外
    with integrity_error("空闲池里有槽位 -1（KV 池外），完整性检查没有报错"):
        cm.check_integrity()


def test_admission_waits_for_a_free_slot_when_memory_is_plenty(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    """KV 页面足够、请求槽只有 2 个：第 3 个请求起要等有槽位空出来，而不是去拿一个不存在的槽。"""
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "max_running_req": 2})
    rec = record(llm)
    out = llm.generate([[i + 1] * 6 for i in range(5)], SamplingParams(max_tokens=4, ignore_eos=True))
    assert [len(o["token_ids"]) for o in out] == [4] * 5, "5 个请求都应完成"
    most = max(len(s.uids) for s in rec.steps)
    assert most == 2, f"只有 2 个请求槽：同一步最多 2 个请求，实际有一步 {most} 个"
    assert_idle(llm)


class RadixLLM(LLM):
    """本章的调度器换上 radix 前缀缓存（第 2.3 章的接口），才能测到“命中的前缀写进页表”。"""

    def _make_prefix_cache(self):  # noqa: ANN202
        return RadixPrefixCache(self.page_size, self.device)


def test_admission_writes_prefix_hits_into_the_page_table(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    """换上 radix 前缀缓存（第 2.3 章的接口）：命中的前缀槽位要在准入时写进页表 [:cached_len]，否则读到的是别的 K/V。"""
    llm = make_llm(RadixLLM, tiny_path, **TINY_KW)
    rec = record(llm)
    prompt = [[10 + i for i in range(30)]]
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    first = llm.generate(prompt, sp)[0]["token_ids"]
    rec.reset()
    second = llm.generate([[99] * 5, prompt[0]], sp)[1]["token_ids"]  # 这次它在第 1 行：页表那行原来没有这些槽位
    assert rec.prefill_tokens() < 35, f"第二次应命中前缀缓存，实际预填充了 {rec.prefill_tokens()} 个 token"
    assert second == first, f"命中前缀后输出变了：第一次 {first}，第二次 {second}（命中的槽位没写进页表？）"
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
    assert 1 in hits, f"应当恰好命中 1 个 token，预填充时的 cached_len 是 {hits}"
    assert out == fresh, f"命中 1 个 token 后输出变了：没有缓存时 {fresh}，命中后 {out}（这个槽位没写进页表？）"
    assert_idle(llm)
