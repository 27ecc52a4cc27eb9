"""第 2.3 章 radix_cache 的检查：匹配、插入（只插整页）、节点分裂、沿路径加锁 / 解锁、LRU 驱逐（只驱逐没上锁的
叶子）、重复前缀、节点的值是拷贝、会重新清点的完整性检查；端到端：共享系统提示词只算一次，与 HF 逐 token 一致。"""

from __future__ import annotations

import copy
import random
from functools import partial

import pytest
import torch

from .conftest import QUESTIONS, SMOL_KW, SMOLLM2_TOKENS, SYSTEM_PROMPT, TINY_KW, assert_idle, expect, integrity_error, record, results, run_under_later_chapters, tree_state
from minisgl.i18n import tr
from minisgl.core import SamplingParams
from minisgl.overlap import PARTS as FINAL_PARTS
from minisgl.radix_cache import PARTS, RadixPrefixCache, hold_back_shared
from minisgl.scheduler import Scheduler

#: 本章的引擎：第 2.1 章的调度器握着到本章为止的零件。
LLM = partial(Scheduler, parts=PARTS)


def ids(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int32)


def slots(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.int32)


# ----------------------------------------------------------------------------- 结构：分裂、匹配、插入（先于引用计数和 LRU）


def _keys(node) -> list[int]:  # noqa: ANN001
    return node.key.tolist()


def test_split_at_builds_both_halves() -> None:
    """最先跑：节点分裂的结构。分裂错了，后面关于拷贝、引用计数、LRU 的检查都会跟着失败，先看这一条。"""
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(100, 6))
    (node,) = cache.root.children.values()
    node.ref_count, node.timestamp = 2, 7
    what = tr("split_at(2) of the node [1,2,3,4,5,6] (slots 100..105, ref_count 2, timestamp 7)")
    head = node.split_at(2)
    expect(_keys(head), [1, 2], tr("{what}: the new first half's key", what=what))
    expect(head.value.tolist(), [100, 101], tr("{what}: the new first half's value (its slots)", what=what))
    expect(_keys(node), [3, 4, 5, 6], tr("{what}: the original node keeps the second half of the key", what=what))
    expect(node.value.tolist(), [102, 103, 104, 105], tr("{what}: the original node keeps the second half of the value", what=what))
    expect(head.parent is cache.root, True, tr("{what}: the first half hangs under the old parent (the root)", what=what))
    expect(cache.root.children.get(1) is head, True, tr("{what}: the parent's entry for token 1 now points to the first half", what=what))
    expect(len(cache.root.children), 1, tr("{what}: the parent still has exactly one child", what=what))
    expect(node.parent is head, True, tr("{what}: the second half hangs under the first half", what=what))
    expect(list(head.children), [3], tr("{what}: the first half's only child is indexed by the second half's first token", what=what))
    expect(head.children.get(3) is node, True, tr("{what}: the first half's child is the original node", what=what))
    expect((head.ref_count, node.ref_count), (2, 2), tr("{what}: both halves keep ref_count 2 (first half, second half)", what=what))
    expect(head.timestamp, 7, tr("{what}: the first half inherits the timestamp", what=what))


def test_match_insert_and_split() -> None:
    cache = RadixPrefixCache(1)
    res = cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(100, 6))
    expect(res.cached_len, 0, tr("Insert into an empty tree: InsertResult.cached_len (nothing was cached before)"))
    expect(res.handle.cached_len, 6, tr("Insert into an empty tree: the handle covers all 6 tokens"))
    h = cache.match_prefix(ids(1, 2, 3, 9, 9))
    expect(h.cached_len, 3, tr("Match [1,2,3,9,9] against [1,2,3,4,5,6]: matched length (up to the fork)"))
    expect(_keys(h.node), [1, 2, 3], tr("The match ends inside the node: the node splits and the handle points to the first half [1,2,3]"))
    expect(h.get_matched_indices().tolist(), [100, 101, 102], tr("Matched slots of [1,2,3]"))
    expect(len(h.node.children), 1, tr("After the split the first half [1,2,3] has one child, the second half"))
    (tail,) = h.node.children.values()
    expect(_keys(tail), [4, 5, 6], tr("The second half's key after the split"))
    expect(tail.value.tolist(), [103, 104, 105], tr("The second half's slots after the split"))
    expect(tail.parent is h.node, True, tr("The second half's parent is the first half"))
    expect(cache.match_prefix(ids(1, 2, 3, 4, 5, 6, 7)).cached_len, 6, tr("After the split the whole sequence still matches"))
    expect(cache.match_prefix(ids(2, 3)).cached_len, 0, tr("A sequence whose first token is not in the tree matches nothing"))
    expect(tuple(cache.size_info), (6, 0), tr("A split does not change the amount cached: (evictable, protected)"))
    cache.check_integrity()


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
        tr("page_size={page_size}: probe {value} and the tree's {value2} agree on {value3} tokens; rounded down to whole pages that is a hit of {page_size}, got {cached_len}", page_size=page_size, value=probe.tolist(), value2=list(range(1, n + 1)), value3=page_size + 1, cached_len=handle.cached_len)
    )
    lengths = sorted(node.length for node in cache._all_nodes() if not node.is_root())
    assert lengths == [page_size, page_size], tr("Splits happen only at page boundaries: node lengths must be {value}, got {lengths}", value=[page_size, page_size], lengths=lengths)
    assert handle.get_matched_indices().tolist() == list(range(100, 100 + page_size)), (
        tr("The matched slots must be the first page {value}, got {value2}", value=list(range(100, 100 + page_size)), value2=handle.get_matched_indices().tolist())
    )
    cache.check_integrity()


@pytest.mark.parametrize("page_size", [4, 16])
def test_whole_pages_only(page_size: int) -> None:
    cache = RadixPrefixCache(page_size)
    n = 2 * page_size + 3
    res = cache.insert_prefix(torch.arange(n, dtype=torch.int32), torch.arange(1000, 1000 + n, dtype=torch.int32))
    expect(res.handle.cached_len, 2 * page_size, tr("Insert {n} tokens with page_size={page_size}: only whole pages are cached, the handle covers them", n=n, page_size=page_size))
    expect(cache.size_info.evictable_size, 2 * page_size, tr("Insert {n} tokens with page_size={page_size}: only whole pages are cached (evictable tokens)", n=n, page_size=page_size))
    probe = torch.cat([torch.arange(page_size + 2, dtype=torch.int32), ids(-5)])
    expect(cache.match_prefix(probe).cached_len, page_size, tr("The match length is rounded down to whole pages"))
    cache.insert_prefix(torch.cat([torch.arange(page_size), torch.full((page_size,), 7)]).int(), torch.arange(2000, 2000 + 2 * page_size, dtype=torch.int32))
    cache.check_integrity()
    evicted = cache.evict(1)
    expect(len(evicted) > 0 and len(evicted) % page_size == 0, True, tr("Eviction works on whole pages: evict(1) must free a positive multiple of page_size={page_size} slots, freed {n}", page_size=page_size, n=len(evicted)))
    firsts = (evicted[::page_size] % page_size).tolist()
    expect(firsts, [evicted[0].item() % page_size] * len(firsts), tr("Every evicted page starts at the same offset inside a page (the pages are whole): first slot of each page modulo page_size"))
    cache.check_integrity()


def test_duplicate_prefix_insert_reports_cached_length() -> None:
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(0, 6))
    res = cache.insert_prefix(ids(1, 2, 3, 4, 7, 8), slots(50, 6))
    expect(res.cached_len, 4, tr("The first 4 are already in the tree: the inserter's own 4 slots are duplicates, which the caller must free"))
    expect(res.handle.cached_len, 6, tr("The handle of an insert covers the whole inserted sequence"))
    expect(res.handle.get_matched_indices().tolist(), [0, 1, 2, 3, 54, 55], tr("The handle's slots: the tree's for the shared part, the inserter's for the new part"))
    again = cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(80, 6))
    expect(again.cached_len, 6, tr("A fully duplicate prefix: all of it was already cached"))
    expect(cache.size_info.evictable_size, 8, tr("A fully duplicate prefix is not inserted again: evictable tokens"))
    cache.check_integrity()


def test_node_values_are_copies() -> None:
    cache = RadixPrefixCache(1)
    row = slots(10, 8)
    cache.insert_prefix(ids(1, 2, 3, 4, 5, 6, 7, 8), row[:8])
    expect(cache.match_prefix(ids(1, 2, 3, 4, 5)).get_matched_indices().tolist(), [10, 11, 12, 13, 14], tr("Matched slots right after the insert"))
    row.fill_(-1)  # 页表的这一行被下一个请求重新使用
    expect(cache.match_prefix(ids(1, 2, 3, 4, 5)).get_matched_indices().tolist(), [10, 11, 12, 13, 14],
           tr("The same match after the page-table row was overwritten with -1: the slots stored in a node must be a copy (clone), not a view of the page table"))  # fmt: skip


# ----------------------------------------------------------------------------- 引用计数（先于 LRU）


def test_lock_unlock_along_the_path() -> None:
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4), slots(0, 4))
    cache.insert_prefix(ids(1, 2, 7, 8, 9), slots(10, 5))
    h = cache.match_prefix(ids(1, 2, 7, 8, 9, 0))
    expect(_keys(h.node), [7, 8, 9], tr("Tree [1,2] -> {{[3,4], [7,8,9]}}: the match of [1,2,7,8,9,0] ends at the node [7,8,9]"))
    cache.lock_handle(h)
    expect((h.node.ref_count, h.node.parent.ref_count), (1, 1), tr("Locking goes along the path up to the root: ref_count of [7,8,9] and of its parent [1,2]"))
    expect(tuple(cache.size_info), (2, 5), tr("The locked [1,2]+[7,8,9] is protected, [3,4] stays evictable: (evictable, protected)"))
    cache.lock_handle(h)
    cache.lock_handle(h, unlock=True)
    expect(tuple(cache.size_info), (2, 5), tr("Locked twice, unlocked once: one lock remains, (evictable, protected) unchanged"))
    cache.lock_handle(h, unlock=True)
    expect(tuple(cache.size_info), (7, 0), tr("Unlocked as often as locked: everything is evictable again, (evictable, protected)"))
    expect(h.node.ref_count, 0, tr("ref_count of [7,8,9] after the last unlock"))
    with pytest.raises(Exception):
        cache.lock_handle(h, unlock=True)
        pytest.fail(tr("Unlocking a node that is not locked must raise an error"))


def test_split_a_locked_node_keeps_the_lock_on_both_halves() -> None:
    """锁着的节点被别的请求部分匹配而分裂：前半段也在被锁的路径上，要继承引用计数；解锁后全部回到可驱逐。"""
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(0, 6))
    h = cache.match_prefix(ids(1, 2, 3, 4, 5, 6, 0))
    cache.lock_handle(h)
    expect(cache.match_prefix(ids(1, 9)).cached_len, 1, tr("Split at token 1 (the edge case): matched length"))
    head = cache.root.children[1]
    expect(_keys(head), [1], tr("The split-off first half's key"))
    expect(head.ref_count, 1, tr("The split-off first half lies on the locked path and must inherit ref count 1: {head}", head=head))
    assert cache.size_info == (0, 6), tr("A split does not change the number of protected tokens: {size_info}", size_info=cache.size_info)
    cache.check_integrity()
    cache.lock_handle(h, unlock=True)
    assert cache.size_info == (6, 0), tr("After unlocking, all 6 tokens are evictable: {size_info}", size_info=cache.size_info)
    cache.check_integrity()


def test_locked_nodes_never_evicted() -> None:
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4), slots(0, 4))
    cache.insert_prefix(ids(1, 2, 5, 6), slots(10, 4))
    cache.insert_prefix(ids(9, 9), slots(20, 2))
    h = cache.match_prefix(ids(1, 2, 3, 4, 0))
    cache.lock_handle(h)
    evictable = cache.size_info.evictable_size
    expect(evictable, 4, tr("Tree [1,2] -> {{[3,4], [5,6]}} and [9,9], with [1,2,3,4] locked: evictable tokens"))
    evicted = sorted(cache.evict(evictable).tolist())
    expect(evicted, [12, 13, 20, 21], tr("Evict only unlocked leaves: the locked path [1,2,3,4] stays untouched (evicted slots)"))
    expect(cache.match_prefix(ids(1, 2, 3, 4, 0)).get_matched_indices().tolist(), [0, 1, 2, 3], tr("The locked path still matches with its slots"))
    with pytest.raises(RuntimeError):
        cache.evict(1)
        pytest.fail(tr("Evicting when nothing is evictable must raise an error"))
    cache.lock_handle(h, unlock=True)
    cache.check_integrity()


def test_evict_never_frees_a_locked_parent() -> None:
    """父节点的子节点被驱逐后它变成叶子，但它还锁着：不能进候选，也就不能被驱逐（否则运行中的请求的槽位被还回去了）。"""
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4), slots(0, 4))
    h = cache.match_prefix(ids(1, 2, 9))  # 分裂成 [1,2] -> [3,4]，句柄在 [1,2]
    expect(_keys(h.node), [1, 2], tr("The match of [1,2,9] ends at the first half [1,2]"))
    cache.lock_handle(h)  # 一个运行中的请求用着 [1,2]
    cache.insert_prefix(ids(9, 9), slots(20, 2))  # 比 [1,2] 新的叶子
    expect(tuple(cache.size_info), (4, 2), tr("[1,2] locked, [3,4] and [9,9] evictable: (evictable, protected)"))
    evicted = sorted(cache.evict(4).tolist())
    expect(evicted, [2, 3, 20, 21],
           tr("evict(4) must free [3,4] and [9,9] (slots 2, 3, 20, 21): once [3,4] is gone its parent [1,2] is a leaf but still locked (ref_count 1), so it must not become a candidate"))  # fmt: skip
    expect(h.get_matched_indices().tolist(), [0, 1], tr("The locked [1,2] still holds its slots"))
    cache.lock_handle(h, unlock=True)
    cache.check_integrity()


def test_evicting_a_leaf_exposes_its_parent() -> None:
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4), slots(0, 4))
    cache.insert_prefix(ids(1, 2, 5), slots(10, 3))
    assert sorted(cache.evict(4).tolist()) == [0, 1, 2, 3, 12], tr("Once its leaves are gone the parent becomes a leaf and is evicted in the same call")
    expect(tuple(cache.size_info), (0, 0), tr("Everything was evicted: (evictable, protected)"))
    expect(cache.root.is_leaf(), True, tr("Everything was evicted: the root has no children left"))
    cache.check_integrity()


# ----------------------------------------------------------------------------- LRU（结构和引用计数都对了以后）


def test_lru_evicts_least_recently_used_leaf() -> None:
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 1, 1), slots(0, 3))
    cache.insert_prefix(ids(2, 2, 2), slots(10, 3))
    cache.insert_prefix(ids(3, 3, 3), slots(20, 3))
    cache.match_prefix(ids(1, 1, 1, 5))  # 最近用过
    expect(sorted(cache.evict(3).tolist()), [10, 11, 12], tr("Inserted [1,1,1], [2,2,2], [3,3,3], then matched [1,1,1]: evict(3) frees the least recently used leaf [2,2,2]"))
    expect(sorted(cache.evict(1).tolist()), [20, 21, 22], tr("evict(1) next frees the whole node [3,3,3] (eviction works on whole nodes)"))
    expect(cache.match_prefix(ids(1, 1, 1, 5)).cached_len, 3, tr("The recently used [1,1,1] is still cached"))
    cache.check_integrity()


def test_lru_partial_match_refreshes_only_the_used_head() -> None:
    """严格的 LRU：只用到节点前半段的匹配，只刷新前半段；没用到的后半段仍是最久没用的，先被驱逐。"""
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(0, 6))  # 最早插入
    cache.insert_prefix(ids(9, 9, 9), slots(10, 3))  # 之后插入
    expect(cache.match_prefix(ids(1, 2, 3, 7)).cached_len, 3, tr("The match of [1,2,3,7] uses only [1,2,3]"))
    evicted = sorted(cache.evict(3).tolist())
    assert evicted == [3, 4, 5], (
        tr("Must evict the least recently used [4,5,6] (slots 3, 4, 5), but evicted slots {evicted}: a partial match must not refresh the unused second half", evicted=evicted)
    )
    cache.check_integrity()


def test_lru_split_head_counts_as_just_used() -> None:
    """部分匹配时分出来的前半段是“刚用过”的：它的尾巴被驱逐、它自己变成叶子以后，也比别的旧叶子晚驱逐。"""
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(0, 6))  # 最早
    cache.insert_prefix(ids(9, 9, 9), slots(10, 3))  # 之后
    expect(cache.match_prefix(ids(1, 2, 3, 7)).cached_len, 3, tr("The match of [1,2,3,7] uses only [1,2,3]"))
    first = sorted(cache.evict(3).tolist())
    assert first == [3, 4, 5], tr("First evict the unused second half [4,5,6] (slots 3, 4, 5), but evicted {first}", first=first)
    second = sorted(cache.evict(3).tolist())
    assert second == [10, 11, 12], (
        tr("[1,2,3] was just matched and [9,9,9] is older: must evict slots 10, 11, 12, but evicted {second} (the split-off first half must refresh its timestamp)", second=second)
    )
    cache.check_integrity()


def test_lru_freshly_inserted_leaf_is_the_newest() -> None:
    """新插入的叶子是“刚用过”的：时间戳取这次插入的 _tree_walk 的时钟，不是 0。"""
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 1, 1), slots(0, 3))  # 时刻 1：A
    cache.insert_prefix(ids(2, 2, 2), slots(10, 3))  # 时刻 2：B
    expect(cache.match_prefix(ids(2, 2, 2, 5)).cached_len, 3, tr("[2,2,2] matches"))  # 时刻 3：B 刚用过
    cache.insert_prefix(ids(1, 1, 1, 4, 4), slots(0, 5))  # 时刻 4：A 下面的新叶子 C=[4,4]
    evicted = sorted(cache.evict(3).tolist())
    expect(evicted, [10, 11, 12],
           tr("Inserted A=[1,1,1] and B=[2,2,2], matched B, then inserted [1,1,1,4,4] (a new leaf C=[4,4] under A): the leaves are B (used at time 3) and C (inserted at time 4), so evict(3) frees B (slots 10, 11, 12). A new leaf must take the insert's clock (self._clock after its _tree_walk), not timestamp 0"))  # fmt: skip
    expect(sorted(cache.evict(2).tolist()), [3, 4], tr("Then the leaf C=[4,4] (slots 3, 4)"))
    cache.check_integrity()


def test_lru_every_node_on_a_matched_path_is_refreshed() -> None:
    """一次匹配刷新路径上的每个节点，不只是最后一个：子节点都被驱逐后，父节点按这次匹配的时间排队。"""
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4), slots(0, 4))  # 时刻 1
    cache.insert_prefix(ids(1, 2, 5, 6), slots(10, 4))  # 时刻 2：分裂成 P=[1,2] -> {X=[3,4], Y=[5,6]}
    w = cache.insert_prefix(ids(9, 9), slots(20, 2)).handle  # 时刻 3：W=[9,9]
    cache.lock_handle(w)  # 先锁住 W，让它在下面的驱逐里不动
    expect(cache.match_prefix(ids(1, 2, 3, 4, 0)).cached_len, 4, tr("[1,2,3,4] matches (it uses P=[1,2] and X=[3,4])"))  # 时刻 4
    first = sorted(cache.evict(4).tolist())
    expect(first, [2, 3, 12, 13], tr("With W=[9,9] locked, evict(4) frees the leaves Y=[5,6] and X=[3,4] (slots 2, 3, 12, 13)"))
    cache.lock_handle(w, unlock=True)
    second = sorted(cache.evict(2).tolist())
    expect(second, [20, 21],
           tr("Now P=[1,2] (used at time 4, by the match of [1,2,3,4]) and W=[9,9] (inserted at time 3) are the leaves: W is older and goes first (slots 20, 21). A match must refresh every node along its path, not only the last one"))  # fmt: skip
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
        pytest.fail(tr("The integrity check must fail when the bookkeeping disagrees with the tree"))
    cache.evictable_size -= 1
    h.node.ref_count = 0
    with pytest.raises(RuntimeError):
        cache.check_integrity()
        pytest.fail(tr("The integrity check must fail when a reference count is corrupted"))


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
    if case == "empty_node":  # page_size=4：直接挂一个空节点（key_fn 对空 key 会报错，所以手工挂）
        cache = RadixPrefixCache(4)
        cache.insert_prefix(ids(1, 2, 3, 4), slots(0, 4))
        (a,) = cache.root.children.values()
        empty = type(a)(cache.key_fn)
        empty.parent = a
        a.children[(0, 0, 0, 0)] = empty
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
        tr("The radix tree's integrity check did not catch '{case}' (bookkeeping: {evictable_size} evictable, {protected_size} protected): check every condition listed in the hint and raise RuntimeError", case=case, evictable_size=cache.evictable_size, protected_size=cache.protected_size)
    ):
        cache.check_integrity()


# ----------------------------------------------------------------------------- 排队看缓存：只看不动的匹配、队内去重
# en: ----------------------------------------------------------------------------- queueing by the cache: a look-only match, in-queue dedup


#: 这几条只跑一小会儿：写错的循环（例如忘了往前走）应当很快失败，而不是卡住整个检查。
#: en: These take a moment: a wrong loop (one that never moves on, say) should fail quickly rather than hang the run.
LOOP_LIMIT = pytest.mark.timeout(60)


def _span(node) -> tuple[int, int]:  # noqa: ANN001
    """节点在提示词里覆盖的 token 区间 [起点, 终点)。

    en: The range of prompt positions [start, end) a node covers.
    """
    end, n = 0, node
    while n.parent is not None:
        end, n = end + n.length, n.parent
    return end - node.length, end


def _random_tree(rng: random.Random, page_size: int) -> tuple[RadixPrefixCache, list[list[int]]]:
    """几段从同一小字母表里取的提示词插进树里（开头常有相同的几页），锁上其中一段，再随手匹配一次（时间各不相同）。

    en: A few prompts over one small alphabet inserted in a tree (they often share their first pages), one of them
    locked, and one match at random (so the times differ).
    """
    cache = RadixPrefixCache(page_size)
    prompts = []
    for i in range(6):
        base = prompts[rng.randrange(len(prompts))][: rng.randrange(0, 24)] if prompts and rng.random() < 0.7 else []
        prompt = base + [rng.randrange(3) for _ in range(rng.randrange(1, 20))]
        prompts.append(prompt)
        res = cache.insert_prefix(torch.tensor(prompt, dtype=torch.int32), slots(100 * i, len(prompt)))
        if i == 2:
            cache.lock_handle(res.handle)
    cache.match_prefix(torch.tensor(prompts[0], dtype=torch.int32))
    return cache, prompts


@LOOP_LIMIT
@pytest.mark.parametrize("page_size", [1, 4])
def test_peek_prefix_hits_like_match_prefix_and_changes_nothing(page_size: int) -> None:
    rng = random.Random(page_size)
    for trial in range(40):
        cache, prompts = _random_tree(rng, page_size)
        base = prompts[rng.randrange(len(prompts))]
        query = base[: rng.randrange(len(base) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 6))]
        what = tr("page_size={ps}, a tree holding {prompts}, peek_prefix({query})", ps=page_size, prompts=prompts, query=query)
        before = tree_state(cache)
        ids_ = torch.tensor(query, dtype=torch.int32)
        got, node = cache.peek_prefix(ids_)
        after = tree_state(cache)
        if after != before:
            pytest.fail(tr("{what} changed the tree. Only before: {gone}. Only after: {new}. (Each entry: a node's tokens, slots, ref_count, timestamp; the last one: the evictable and protected totals and the clock.)",
                           what=what, gone=[x for x in before if x not in after], new=[x for x in after if x not in before]), pytrace=False)
        expect(got, copy.deepcopy(cache).match_prefix(ids_).cached_len,
               tr("{what}: the hit length, against match_prefix on a copy of the tree", what=what))
        start, end = _span(node)
        reached = node is cache.root if got == 0 else start < got <= end
        expect(reached, True, tr("{what}: the node returned covers positions [{start}, {end}) of the prompt; the match of {got} tokens must end inside it or at its end (the root when nothing hits)",
                                 what=what, start=start, end=end, got=got))


@LOOP_LIMIT
def test_peek_prefix_stops_inside_a_node_without_splitting_it() -> None:
    cache = RadixPrefixCache(1)
    cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(100, 6))
    (node,) = cache.root.children.values()
    got, where = cache.peek_prefix(ids(1, 2, 3, 9))
    what = tr("peek_prefix([1,2,3,9]) on a tree holding one node [1,2,3,4,5,6]")
    expect(got, 3, tr("{what}: the hit length", what=what))
    expect(where is node, True, tr("{what}: the node returned is that node itself, not split", what=what))
    expect(_keys(node), [1, 2, 3, 4, 5, 6], tr("{what}: the node's tokens afterwards", what=what))


def shares_held(prompts: list[list[int]], hits: list[int], ahead: list[list[int]], min_shared: int) -> list[bool]:
    """去重的定义，最直接的写法（逐对比较）：检查拿它当标准答案。

    en: The dedup's definition written the plainest way (pair by pair): the checks' reference.
    """
    def common(a: list[int], b: list[int]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    walking, held = list(ahead), []
    for prompt, hit in zip(prompts, hits):
        held.append(max((common(prompt, w) for w in walking), default=0) - hit > min_shared)
        if not held[-1]:
            walking.append(prompt)
    return held


def call_hold_back(prompts: list[list[int]], hits: list[int], ahead: list[list[int]], min_shared: int) -> list[bool]:
    as_ids = lambda ps: [torch.tensor(p, dtype=torch.int32) for p in ps]  # noqa: E731
    return [bool(h) for h in hold_back_shared(as_ids(prompts), list(hits), as_ids(ahead), min_shared)]


@LOOP_LIMIT
@pytest.mark.parametrize("case,prompts,hits,ahead,min_shared,want", [
    ("one ahead of the others", [[1] * 40 + [2], [1] * 40 + [3], [1] * 40 + [4]], [0, 0, 0], [], 32, [False, True, True]),
    ("exactly min_shared more", [[5] * 32 + [1], [5] * 32 + [2], [6] * 33 + [1], [6] * 33 + [2]], [0, 0, 0, 0], [], 32, [False, False, False, True]),
    ("counted past the hit", [[7] * 50 + [1], [7] * 50 + [2]], [0, 20], [], 32, [False, False]),
    ("a prompt ahead counts", [[9] * 40 + [1]], [0], [[9] * 40 + [8]], 32, [True]),
    ("a held-back one walks ahead of no one", [[4] * 40, [4] * 40 + [6] * 40, [4] * 40 + [6] * 40 + [1]], [0, 0, 40], [], 32, [False, True, False]),
    ("a kept one walks ahead of the later ones", [[3] * 40, [3] * 40 + [6] * 40 + [1], [3] * 40 + [6] * 40 + [2]], [0, 40, 40], [], 32, [False, False, True]),
    ("it goes on from where one ahead ends", [[2] * 32 + [5]], [0], [[2] * 32], 31, [True]),
    ("nothing waiting", [], [], [[1] * 40], 32, []),
])
def test_hold_back_shared_cases(case: str, prompts, hits, ahead, min_shared: int, want: list[bool]) -> None:  # noqa: ANN001
    what = tr("hold_back_shared, case '{case}': prompts {prompts}, hits {hits}, ahead {ahead}, min_shared={m}",
              case=case, prompts=[f"{p[:3]}…({len(p)})" for p in prompts], hits=hits, ahead=[f"{p[:3]}…({len(p)})" for p in ahead], m=min_shared)
    expect(call_hold_back(prompts, hits, ahead, min_shared), want, tr("{what}: which prompts are held back", what=what))


@LOOP_LIMIT
def test_hold_back_shared_against_the_definition() -> None:
    rng = random.Random(0)
    for trial in range(200):
        stems = [[rng.randrange(4) for _ in range(rng.randrange(0, 60))] for _ in range(3)]
        make = lambda: rng.choice(stems)[: rng.randrange(61)] + [rng.randrange(4) for _ in range(rng.randrange(0, 8))]  # noqa: E731
        prompts = [make() for _ in range(rng.randrange(1, 7))]
        ahead = [make() for _ in range(rng.randrange(0, 3))]
        hits = [rng.randrange(len(p) + 1) for p in prompts]
        min_shared = rng.choice([0, 3, 16, 17])
        expect(call_hold_back(prompts, hits, ahead, min_shared), shares_held(prompts, hits, ahead, min_shared),
               tr("hold_back_shared(prompts={prompts}, hits={hits}, ahead={ahead}, min_shared={m}): which prompts are held back",
                  prompts=prompts, hits=hits, ahead=ahead, m=min_shared))


def shared_prefix_workload(seed: int = 0, groups: int = 3, per_group: int = 3, prefix: int = 64, suffix: int = 6,
                           unrelated: int = 4) -> list[list[int]]:
    """几组共享前缀的请求按组轮流到达，中间夹着无关的请求。

    en: Groups of requests sharing a prefix arrive taking turns, with unrelated requests in between.
    """
    rng = random.Random(seed)
    word = lambda n: [rng.randrange(10, 1000) for _ in range(n)]  # noqa: E731
    heads = [word(prefix) for _ in range(groups)]
    prompts: list[list[int]] = []
    for i in range(per_group):
        for head in heads:
            prompts.append(head + word(suffix))
            if len(prompts) % 2 == 0 and unrelated > 0:
                prompts.append(word(prefix + suffix))
                unrelated -= 1
    return prompts


def test_lpm_computes_fewer_prefill_tokens_with_the_same_answers(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    prompts = shared_prefix_workload()
    total = sum(len(p) for p in prompts)
    sp = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)
    runs = {}
    for name in ("fcfs", "lpm", "dfs-weight"):
        llm = make_llm(LLM, tiny_path, **{**TINY_KW, "max_running_req": 2, "num_page_override": 300,
                                          "max_seq_len_override": 128, "schedule_policy": name})
        rec = record(llm)
        answers = [o["token_ids"] for o in llm.generate(prompts, sp)]
        runs[name] = (answers, rec.prefill_tokens(), rec.cache_hits())
        assert_idle(llm)
    for name, (answers, prefill, hit) in runs.items():
        expect(answers, runs["fcfs"][0], tr("{name}: each request's greedy answer, compared with fcfs's", name=name))
        expect(prefill + hit, total,
               tr("{name}: prefill tokens computed + prefix-cache hits, against the {total} prompt tokens (what /metrics counts)",
                  name=name, total=total))
    fcfs = runs["fcfs"][1]
    for name in ("lpm", "dfs-weight"):
        expect(runs[name][1] <= 0.8 * fcfs, True,
               tr("{name} computed {ours} prefill tokens, fcfs {fcfs}: at most 0.8 × fcfs's expected",
                  name=name, ours=runs[name][1], fcfs=fcfs))


@pytest.fixture(scope="module")
def tiny_radix(tiny_path: str):  # noqa: ANN201
    llm = LLM(tiny_path, **TINY_KW)
    yield llm
    llm.shutdown()


def test_shared_system_prompt_is_computed_once(tiny_path: str, tiny_radix, qwen_tokenizer, make_llm) -> None:  # noqa: ANN001
    prompts = [SYSTEM_PROMPT + q for q in QUESTIONS]
    lens = [len(qwen_tokenizer.encode(p)) for p in prompts]
    expect(lens, [60, 57, 59, 55], tr("Test setup: token counts of the four prompts with the Qwen3 tokenizer"))
    computed = {}
    for name, llm in [("naive", make_llm(LLM, tiny_path, **TINY_KW, cache_type="naive")), ("radix", tiny_radix)]:
        rec = record(llm)
        sp = SamplingParams(max_tokens=4)
        llm.generate(prompts[:1], sp)
        llm.generate(prompts[1:], sp)
        computed[name] = rec.prefill_tokens()
        assert_idle(llm)
    assert computed == {"naive": 231, "radix": 73}, tr("Tokens actually prefilled: {computed} (expected naive 231, radix 73)", computed=computed)


def test_fully_cached_prompt_still_computes_one_token(tiny_radix) -> None:  # noqa: ANN001
    rec = record(tiny_radix)
    prompt = [[7, 8, 9, 10, 11, 12, 13, 14]]
    first = tiny_radix.generate(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    rec.reset()
    again = tiny_radix.generate(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    assert rec.prefill_steps() == [1], tr("The whole prompt was cached: match at most up to the second-to-last token; the last one must still be computed (to get logits)")
    expect([len(first[0]["token_ids"]), len(again[0]["token_ids"])], [3, 3], tr("Tokens generated the first and the second time (max_tokens=3)"))
    assert_idle(tiny_radix)


def test_lru_eviction_under_memory_pressure(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "num_page_override": 64, "max_seq_len_override": 64})
    rec = record(llm)
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    prompts = [[100 + 10 * i + j for j in range(20)] for i in range(6)]
    for p in prompts:
        llm.generate([p], sp)
        assert_idle(llm)
    total = llm.cache_manager.prefix_cache.size_info.total_size
    assert total <= 64, tr("The radix tree holds {total} tokens, more than the 64 pages that exist", total=total)
    rec.reset()
    llm.generate([prompts[-1]], sp)
    assert rec.prefill_steps() == [1], tr("The most recent prompt is still in the cache")
    rec.reset()
    llm.generate([prompts[0]], sp)
    assert rec.prefill_steps() == [20], tr("The oldest prompt was evicted long ago and is computed from scratch")
    assert_idle(llm)


def test_duplicate_prefix_end_to_end(smollm2_path, smollm2_prompts, smollm2_reference, make_llm) -> None:  # noqa: ANN001
    """同一批里两个相同的提示词：各算一份，后插入的要改指树里的页，再释放自己那份；两者输出都对。"""
    llm = make_llm(LLM, smollm2_path, **{**SMOL_KW, "num_page_override": 200})
    p, ref = smollm2_prompts[4], smollm2_reference[4]
    sp = SamplingParams(max_tokens=SMOLLM2_TOKENS, ignore_eos=True)
    res = results(llm)
    uids = [llm.add_request(p, sp) for _ in range(2)]
    llm.step()  # 两个一起预填充，处理结果时都插入树：第二个发现重复
    reqs = list(llm.decode_manager.running_reqs)
    rows = [r.table_idx for r in reqs]
    n = len(p)
    assert torch.equal(llm.page_table[rows[0], :n], llm.page_table[rows[1], :n]), tr("Duplicate prefix: both page-table rows point to the same pages")
    filler = llm.add_request(smollm2_prompts[7], sp)  # 新请求会用到刚释放的页
    llm.run_until_idle()
    outs = [res.tokens(u) for u in (*uids, filler)]
    assert outs[0] == ref and outs[1] == ref, tr("Both identical requests match HF")
    assert outs[2] == smollm2_reference[7], tr("The request that reused the freed pages differs from HF\nours: {ours}\nHF:   {ref}", ours=outs[2], ref=smollm2_reference[7])
    llm.check_integrity()


@pytest.mark.parametrize("cache_type,page_size", [("radix", 1), ("radix", 4)])  # naive 的情形不经过本章代码，见第 2.2 章
def test_batch_invariance_smollm2(smollm2_path, smollm2_prompts, smollm2_reference, make_llm, cache_type, page_size) -> None:  # noqa: ANN001
    sp = SamplingParams(max_tokens=SMOLLM2_TOKENS, ignore_eos=True)
    llm = make_llm(LLM, smollm2_path, **{**SMOL_KW, "cache_type": cache_type, "page_size": page_size, "num_page_override": 1024 // page_size})
    rec = record(llm)
    for round_ in range(2):  # 第二轮时前缀都在缓存里
        out = [o["token_ids"] for o in llm.generate(smollm2_prompts, sp)]
        for i, (ours, ref) in enumerate(zip(out, smollm2_reference)):
            assert ours == ref, tr("{cache_type}, page_size={page_size}, round {value}: request {i} differs from HF", cache_type=cache_type, page_size=page_size, value=round_ + 1, i=i)
        assert_idle(llm)
    alone = SamplingParams(max_tokens=12, ignore_eos=True)
    singles = [llm.generate([p], alone)[0]["token_ids"] for p in smollm2_prompts[3:6]]
    assert singles == [r[:12] for r in smollm2_reference[3:6]], tr("Running alone after cache hits also matches HF")
    if cache_type == "radix":
        total = sum(len(p) for p in smollm2_prompts)
        assert rec.prefill_tokens() < 2 * total, tr("radix: the second round must reuse prefixes")
    assert_idle(llm)


# ----------------------------------------------------------------------------- 在后面章节下跑本章的代码（issue 24）


@pytest.mark.parametrize("page_size,chunk,overlap", [(4, 5, True)], ids=["page4-chunk5-overlap"])
def test_later_chapters_run_this_radix_cache_and_match_hf(final_llms, tiny_path: str, page_size: int, chunk, overlap: bool) -> None:  # noqa: ANN001
    """分块预填充和重叠调度（第 2.4、2.5 章）按块匹配、插入一个迭代之后才落地：用它们的参考解答跑本章的基数树，与 Hugging Face 逐 token 比较。"""
    llm = final_llms(partial(Scheduler, parts=FINAL_PARTS), page_size)
    assert isinstance(llm.cache_manager.prefix_cache, RadixPrefixCache), tr("Test setup: the final engine must hold this chapter's {name}", name="RadixPrefixCache")
    mode = tr("overlap scheduling on") if overlap else tr("overlap scheduling off")
    what = tr("Your radix cache under chapters 2.4 and 2.5 (page_size={page_size}, chunk size {chunk}, {mode})", page_size=page_size, chunk=chunk, mode=mode)
    run_under_later_chapters(llm, tiny_path, chunk=chunk, overlap=overlap, what=what)
