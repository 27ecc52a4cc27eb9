"""第 2.3 章 radix_cache 的检查：匹配、插入（只插整页）、节点分裂、沿路径加锁 / 解锁、LRU 驱逐（只驱逐没上锁的
叶子）、重复前缀、节点的值是拷贝、会重新清点的完整性检查；端到端：共享系统提示词只算一次，与 HF 逐 token 一致。"""

from __future__ import annotations

import pytest
import torch

from .conftest import QUESTIONS, SMOL_KW, SMOLLM2_TOKENS, SYSTEM_PROMPT, TINY_KW, assert_idle, integrity_error, record
from minisgl.core import SamplingParams
from minisgl.radix_cache import LLM, RadixPrefixCache


def ids(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int32)


def slots(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.int32)


def test_match_insert_and_split() -> None:
    cache = RadixPrefixCache(1)
    res = cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(100, 6))
    assert res.cached_len == 0 and res.handle.cached_len == 6, "空树里插入：之前没有缓存，句柄覆盖全部 6 个"
    h = cache.match_prefix(ids(1, 2, 3, 9, 9))
    assert h.cached_len == 3 and h.get_matched_indices().tolist() == [100, 101, 102], "匹配到分叉之前"
    assert h.node.key.tolist() == [1, 2, 3] and len(h.node.children) == 1, "只匹配了节点的前半段：节点分裂成 [1,2,3] 和 [4,5,6]"
    (tail,) = h.node.children.values()
    assert tail.key.tolist() == [4, 5, 6] and tail.value.tolist() == [103, 104, 105] and tail.parent is h.node
    assert cache.match_prefix(ids(1, 2, 3, 4, 5, 6, 7)).cached_len == 6, "分裂之后整段仍能匹配"
    assert cache.match_prefix(ids(2, 3)).cached_len == 0
    assert cache.size_info == (6, 0), "分裂不改变缓存的总量"
    cache.check_integrity()


def test_duplicate_prefix_insert_reports_cached_length() -> None:
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(0, 6))
    res = cache.insert_prefix(ids(1, 2, 3, 4, 7, 8), slots(50, 6))
    assert res.cached_len == 4, "前 4 个已经在树里：插入方自己那 4 个槽位是重复的，要由调用者释放"
    assert res.handle.cached_len == 6 and res.handle.get_matched_indices().tolist() == [0, 1, 2, 3, 54, 55]
    again = cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(80, 6))
    assert again.cached_len == 6 and cache.size_info.evictable_size == 8, "完全重复的前缀不再插入"
    cache.check_integrity()


def test_lru_partial_match_refreshes_only_the_used_head() -> None:
    """严格的 LRU：只用到节点前半段的匹配，只刷新前半段；没用到的后半段仍是最久没用的，先被驱逐。"""
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(0, 6))  # 最早插入
    cache.insert_prefix(ids(9, 9, 9), slots(10, 3))  # 之后插入
    assert cache.match_prefix(ids(1, 2, 3, 7)).cached_len == 3  # 只用到 [1,2,3]：节点分裂
    evicted = sorted(cache.evict(3).tolist())
    assert evicted == [3, 4, 5], (
        f"应驱逐最久没用的 [4,5,6]（槽位 3、4、5），实际驱逐了槽位 {evicted}：部分匹配不能刷新没用到的后半段"
    )
    cache.check_integrity()


def test_node_values_are_copies() -> None:
    cache = RadixPrefixCache(1)
    row = slots(10, 8)
    cache.insert_prefix(ids(1, 2, 3, 4, 5, 6, 7, 8), row[:8])
    row.fill_(-1)  # 页表的这一行被下一个请求重新使用
    assert cache.match_prefix(ids(1, 2, 3, 4, 5)).get_matched_indices().tolist() == [10, 11, 12, 13, 14], (
        "节点里存的槽位必须是拷贝，不能是页表的视图"
    )


def test_lock_unlock_along_the_path() -> None:
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4), slots(0, 4))
    cache.insert_prefix(ids(1, 2, 7, 8, 9), slots(10, 5))
    h = cache.match_prefix(ids(1, 2, 7, 8, 9, 0))
    cache.lock_handle(h)
    assert h.node.ref_count == 1 and h.node.parent.ref_count == 1, "加锁沿路径一直到根"
    assert cache.size_info == (2, 5), "锁住的 [1,2]+[7,8,9] 受保护，[3,4] 仍可驱逐"
    cache.lock_handle(h)
    cache.lock_handle(h, unlock=True)
    assert cache.size_info == (2, 5), "还剩一把锁"
    cache.lock_handle(h, unlock=True)
    assert cache.size_info == (7, 0) and h.node.ref_count == 0
    with pytest.raises(Exception):
        cache.lock_handle(h, unlock=True)
        pytest.fail("解锁没有上锁的节点要报错")


def test_lru_evicts_least_recently_used_leaf() -> None:
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 1, 1), slots(0, 3))
    cache.insert_prefix(ids(2, 2, 2), slots(10, 3))
    cache.insert_prefix(ids(3, 3, 3), slots(20, 3))
    cache.match_prefix(ids(1, 1, 1, 5))  # 最近用过
    assert sorted(cache.evict(3).tolist()) == [10, 11, 12], "先驱逐最久没用的叶子"
    assert sorted(cache.evict(1).tolist()) == [20, 21, 22], "驱逐以整个节点为单位"
    assert cache.match_prefix(ids(1, 1, 1, 5)).cached_len == 3
    cache.check_integrity()


def test_locked_nodes_never_evicted() -> None:
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4), slots(0, 4))
    cache.insert_prefix(ids(1, 2, 5, 6), slots(10, 4))
    cache.insert_prefix(ids(9, 9), slots(20, 2))
    h = cache.match_prefix(ids(1, 2, 3, 4, 0))
    cache.lock_handle(h)
    evictable = cache.size_info.evictable_size
    evicted = cache.evict(evictable)
    assert sorted(evicted.tolist()) == [12, 13, 20, 21], "只驱逐没上锁的叶子：锁住的路径 [1,2,3,4] 一个也不动"
    assert cache.match_prefix(ids(1, 2, 3, 4, 0)).get_matched_indices().tolist() == [0, 1, 2, 3]
    with pytest.raises(RuntimeError):
        cache.evict(1)
        pytest.fail("没有可驱逐的了还要驱逐，应当报错")
    cache.lock_handle(h, unlock=True)
    cache.check_integrity()


def test_evicting_a_leaf_exposes_its_parent() -> None:
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4), slots(0, 4))
    cache.insert_prefix(ids(1, 2, 5), slots(10, 3))
    assert sorted(cache.evict(4).tolist()) == [0, 1, 2, 3, 12], "叶子删光后父节点变成叶子，同一次驱逐里接着驱逐它"
    assert cache.size_info == (0, 0) and cache.root.is_leaf()
    cache.check_integrity()


@pytest.mark.parametrize("page_size", [4, 16])
def test_whole_pages_only(page_size: int) -> None:
    cache = RadixPrefixCache(page_size)
    n = 2 * page_size + 3
    res = cache.insert_prefix(torch.arange(n, dtype=torch.int32), torch.arange(1000, 1000 + n, dtype=torch.int32))
    assert res.handle.cached_len == 2 * page_size and cache.size_info.evictable_size == 2 * page_size, "只缓存整页"
    probe = torch.cat([torch.arange(page_size + 2, dtype=torch.int32), ids(-5)])
    assert cache.match_prefix(probe).cached_len == page_size, "匹配长度按页向下取整"
    cache.insert_prefix(torch.cat([torch.arange(page_size), torch.full((page_size,), 7)]).int(), torch.arange(2000, 2000 + 2 * page_size, dtype=torch.int32))
    cache.check_integrity()
    evicted = cache.evict(1)
    assert len(evicted) % page_size == 0 and len(evicted) > 0, "驱逐以整页为单位"
    assert torch.equal(evicted[::page_size] % page_size, torch.zeros(len(evicted) // page_size, dtype=torch.int32) + evicted[0] % page_size)
    cache.check_integrity()


def test_check_integrity_recounts_the_tree() -> None:
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3), slots(0, 3))
    h = cache.match_prefix(ids(1, 2, 3, 4))
    cache.lock_handle(h)
    cache.check_integrity()
    cache.evictable_size += 1
    with pytest.raises(RuntimeError):
        cache.check_integrity()
        pytest.fail("记账和实际不符时完整性检查要报错")
    cache.evictable_size -= 1
    h.node.ref_count = 0
    with pytest.raises(RuntimeError):
        cache.check_integrity()
        pytest.fail("引用计数被改坏时完整性检查要报错")


@pytest.fixture(scope="module")
def tiny_radix(tiny_path: str):  # noqa: ANN201
    llm = LLM(tiny_path, **TINY_KW)
    yield llm
    llm.shutdown()


def test_shared_system_prompt_is_computed_once(tiny_path: str, tiny_radix, qwen_tokenizer, make_llm) -> None:  # noqa: ANN001
    prompts = [SYSTEM_PROMPT + q for q in QUESTIONS]
    lens = [len(qwen_tokenizer.encode(p)) for p in prompts]
    assert lens == [60, 57, 59, 55]
    computed = {}
    for name, llm in [("naive", make_llm(LLM, tiny_path, **TINY_KW, cache_type="naive")), ("radix", tiny_radix)]:
        rec = record(llm)
        sp = SamplingParams(max_tokens=4)
        llm.generate(prompts[:1], sp)
        llm.generate(prompts[1:], sp)
        computed[name] = rec.prefill_tokens()
        assert_idle(llm)
    assert computed == {"naive": 231, "radix": 73}, f"预填充实际计算的 token 数：{computed}（应为 naive 231、radix 73）"


def test_fully_cached_prompt_still_computes_one_token(tiny_radix) -> None:  # noqa: ANN001
    rec = record(tiny_radix)
    prompt = [[7, 8, 9, 10, 11, 12, 13, 14]]
    first = tiny_radix.generate(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    rec.reset()
    again = tiny_radix.generate(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    assert rec.prefill_steps() == [1], "整段提示词都缓存过：最多匹配到倒数第二个 token，最后一个还要算（才有 logits）"
    assert len(again[0]["token_ids"]) == len(first[0]["token_ids"]) == 3
    assert_idle(tiny_radix)


def test_lru_eviction_under_memory_pressure(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "num_page_override": 64, "max_seq_len_override": 64})
    rec = record(llm)
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    prompts = [[100 + 10 * i + j for j in range(20)] for i in range(6)]
    for p in prompts:
        llm.generate([p], sp)
        assert_idle(llm)
    assert llm.cache_manager.prefix_cache.size_info.total_size <= 64
    rec.reset()
    llm.generate([prompts[-1]], sp)
    assert rec.prefill_steps() == [1], "最近的提示词还在缓存里"
    rec.reset()
    llm.generate([prompts[0]], sp)
    assert rec.prefill_steps() == [20], "最早的提示词早被驱逐了，要从头算"
    assert_idle(llm)


def test_duplicate_prefix_end_to_end(smollm2_path, smollm2_prompts, smollm2_reference, make_llm) -> None:  # noqa: ANN001
    """同一批里两个相同的提示词：各算一份，后插入的要改指树里的页，再释放自己那份；两者输出都对。"""
    llm = make_llm(LLM, smollm2_path, **{**SMOL_KW, "num_page_override": 200})
    p, ref = smollm2_prompts[4], smollm2_reference[4]
    sp = SamplingParams(max_tokens=SMOLLM2_TOKENS, ignore_eos=True)
    uids = [llm.add_request(p, sp) for _ in range(2)]
    llm.step()  # 两个一起预填充，处理结果时都插入树：第二个发现重复
    reqs = list(llm.decode_manager.running_reqs)
    rows = [r.table_idx for r in reqs]
    n = len(p)
    assert torch.equal(llm.page_table[rows[0], :n], llm.page_table[rows[1], :n]), "重复的前缀：两行页表指向同一组页"
    filler = llm.add_request(smollm2_prompts[7], sp)  # 新请求会用到刚释放的页
    llm.run_until_idle()
    outs = [llm.status.pop(u).output_ids for u in (*uids, filler)]
    assert outs[0] == ref and outs[1] == ref, "两个相同的请求都与 HF 一致"
    assert outs[2] == smollm2_reference[7]
    llm.check_integrity()


@pytest.mark.parametrize("cache_type,page_size", [("radix", 1), ("radix", 4)])  # naive 的情形不经过本章代码，见第 2.2 章
def test_batch_invariance_smollm2(smollm2_path, smollm2_prompts, smollm2_reference, make_llm, cache_type, page_size) -> None:  # noqa: ANN001
    sp = SamplingParams(max_tokens=SMOLLM2_TOKENS, ignore_eos=True)
    llm = make_llm(LLM, smollm2_path, **{**SMOL_KW, "cache_type": cache_type, "page_size": page_size, "num_page_override": 1024 // page_size})
    rec = record(llm)
    for round_ in range(2):  # 第二轮时前缀都在缓存里
        out = [o["token_ids"] for o in llm.generate(smollm2_prompts, sp)]
        for i, (ours, ref) in enumerate(zip(out, smollm2_reference)):
            assert ours == ref, f"{cache_type}, page_size={page_size}, 第 {round_ + 1} 轮：第 {i} 个请求与 HF 不一致"
        assert_idle(llm)
    alone = SamplingParams(max_tokens=12, ignore_eos=True)
    singles = [llm.generate([p], alone)[0]["token_ids"] for p in smollm2_prompts[3:6]]
    assert singles == [r[:12] for r in smollm2_reference[3:6]], "命中缓存后单独跑也与 HF 一致"
    if cache_type == "radix":
        total = sum(len(p) for p in smollm2_prompts)
        assert rec.prefill_tokens() < 2 * total, "radix：第二轮应当复用前缀"
    assert_idle(llm)


# ----------------------------------------------------------------------------- 完整性检查：每个条件单独抓得到


def _two_level_tree(page_size: int = 1) -> tuple[RadixPrefixCache, object, object]:
    """根 → A[1,2,3] → B[4,5]（page_size=1），返回 (cache, A, B)；一切都对得上账。"""
    cache = RadixPrefixCache(page_size)
    cache.insert_prefix(ids(1, 2, 3), slots(0, 3))
    cache.insert_prefix(ids(1, 2, 3, 4, 5), slots(0, 5))
    (a,) = cache.root.children.values()
    (b,) = a.children.values()
    return cache, a, b


def _corrupt(case: str) -> RadixPrefixCache:
    """每种情形只破坏提示里的一条条件，其余条件（含两本账的合计）都保持成立。"""
    if case == "empty_node":  # page_size=4：空节点的 key_fn 是 ()，挂的位置仍然“正确”
        cache = RadixPrefixCache(4)
        cache.insert_prefix(ids(1, 2, 3, 4), slots(0, 4))
        (a,) = cache.root.children.values()
        empty = type(a)(cache.key_fn)
        empty.set_parent(a)
        return cache
    if case == "partial_page":  # 6 个 token 的节点，page_size=4
        cache = RadixPrefixCache(4)
        cache.insert_prefix(ids(1, 2, 3, 4, 5, 6, 7, 8), slots(0, 8))
        (a,) = cache.root.children.values()
        a.set_key_value(a.key[:6], a.value[:6])
        cache.evictable_size = 6
        return cache
    cache, a, b = _two_level_tree()
    if case == "key_value_lengths_differ":
        b.value = b.value[:1]
    elif case == "wrong_parent_pointer":
        b.parent = cache.root  # 仍在 A 的 children 里
    elif case == "wrong_child_key":
        cache.root.children = {7: a}  # A 的第一个 token 是 1
    elif case == "negative_ref_count":
        b.ref_count = -1  # 受保护的账也照此调整，两本账的合计仍然对得上（叶子为负也就小于子节点之和 0）
        cache.evictable_size, cache.protected_size = 3, 2
    elif case == "child_locked_parent_not":
        b.ref_count = 1
        cache.evictable_size, cache.protected_size = 3, 2
    elif case == "evictable_miscounted":
        cache.evictable_size += 1
    elif case == "protected_miscounted":
        cache.lock_handle(cache.match_prefix(ids(1, 2, 3, 4, 5, 0)))
        cache.protected_size += 1  # 只有受保护的账不对
    elif case == "duplicate_slots":
        cache.insert_prefix(ids(9, 9), slots(3, 2))  # 槽位 3、4 已经在 B 里
    elif case != "ok":
        raise AssertionError(case)
    return cache


_TREE_CASES = [
    "ok", "empty_node", "partial_page", "key_value_lengths_differ", "wrong_parent_pointer", "wrong_child_key",
    "negative_ref_count", "child_locked_parent_not", "evictable_miscounted", "protected_miscounted", "duplicate_slots",
]  # fmt: skip


@pytest.mark.parametrize("case", _TREE_CASES)
def test_check_integrity_catches_each_condition_alone(case: str) -> None:
    cache = _corrupt(case)
    if case == "ok":
        cache.check_integrity()
        return
    with integrity_error(
        f"基数树的完整性检查没有发现「{case}」（记账：可驱逐 {cache.evictable_size}、受保护 {cache.protected_size}）："
        "提示里列出的每一条都要检查，并抛 RuntimeError"
    ):
        cache.check_integrity()


def test_lru_split_head_counts_as_just_used() -> None:
    """部分匹配时分出来的前半段是“刚用过”的：它的尾巴被驱逐、它自己变成叶子以后，也比别的旧叶子晚驱逐。"""
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(0, 6))  # 最早
    cache.insert_prefix(ids(9, 9, 9), slots(10, 3))  # 之后
    assert cache.match_prefix(ids(1, 2, 3, 7)).cached_len == 3  # 刚用过 [1,2,3]
    first = sorted(cache.evict(3).tolist())
    assert first == [3, 4, 5], f"先驱逐没用到的后半段 [4,5,6]（槽位 3、4、5），实际驱逐了 {first}"
    second = sorted(cache.evict(3).tolist())
    assert second == [10, 11, 12], (
        f"[1,2,3] 刚被匹配过，[9,9,9] 更久没用：应驱逐槽位 10、11、12，实际驱逐了 {second}（分裂出的前半段要刷新时间戳）"
    )
    cache.check_integrity()


def test_split_a_locked_node_keeps_the_lock_on_both_halves() -> None:
    """锁着的节点被别的请求部分匹配而分裂：前半段也在被锁的路径上，要继承引用计数；解锁后全部回到可驱逐。"""
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(0, 6))
    h = cache.match_prefix(ids(1, 2, 3, 4, 5, 6, 0))
    cache.lock_handle(h)
    assert cache.match_prefix(ids(1, 9)).cached_len == 1, "在第 1 个 token 处分裂（最靠边的位置）"
    head = cache.root.children[1]
    assert head.key.tolist() == [1] and head.ref_count == 1, f"分出来的前半段要继承引用计数 1：{head}"
    assert cache.size_info == (0, 6), f"分裂不改变受保护的 token 数：{cache.size_info}"
    cache.check_integrity()
    cache.lock_handle(h, unlock=True)
    assert cache.size_info == (6, 0), f"解锁后 6 个 token 全部可驱逐：{cache.size_info}"
    cache.check_integrity()


# ----------------------------------------------------------------------------- 学员走查补的检查（issue 16）


@pytest.mark.parametrize("page_size", [2, 4])
def test_mismatch_inside_a_page_rounds_the_match_down(page_size: int) -> None:
    """树里有 2 页；探针在第 2 页的中间才不一样，而且探针本身足够长（截成整页后仍然跨进第 2 页）。

    逐 token 能匹配 ``page_size + 1`` 个，按整页向下取整只命中 1 页；分裂也只能发生在页边界上。
    """
    cache = RadixPrefixCache(page_size)
    n = 2 * page_size
    cache.insert_prefix(torch.arange(1, n + 1, dtype=torch.int32), slots(100, n))
    probe = torch.cat([torch.arange(1, page_size + 2, dtype=torch.int32), torch.full((page_size,), -5, dtype=torch.int32)])
    handle = cache.match_prefix(probe)
    assert handle.cached_len == page_size, (
        f"page_size={page_size}：探针 {probe.tolist()} 与树里的 {list(range(1, n + 1))} 逐 token 相同 {page_size + 1} 个，"
        f"按整页向下取整应命中 {page_size} 个，实际 {handle.cached_len}"
    )
    lengths = sorted(node.length for node in cache._all_nodes() if not node.is_root())
    assert lengths == [page_size, page_size], f"分裂只能在页边界上：节点长度应为 {[page_size, page_size]}，实际 {lengths}"
    assert handle.get_matched_indices().tolist() == list(range(100, 100 + page_size)), (
        f"命中的槽位应为前 1 页 {list(range(100, 100 + page_size))}，实际 {handle.get_matched_indices().tolist()}"
    )
    cache.check_integrity()
