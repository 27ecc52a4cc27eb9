"""第 2.2 章 cache_manager 的检查：按需分配页面、回收、page_size 1/4/16、准入时预留（内存不够就等，
永不死锁）、放不下的请求立刻拒绝、重复前缀先改指再释放、完整性检查，以及与 Hugging Face 逐 token 一致。"""

from __future__ import annotations

import pytest
import torch

from .conftest import SMOL_KW, SMOLLM2_TOKENS, TINY_KW, assert_idle, record
from minisgl.cache_manager import LLM, CacheManager, NaivePrefixCache
from minisgl.core import Req, SamplingParams
from minisgl.radix_cache import RadixPrefixCache
from minisgl.scheduler import PendingReq


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
