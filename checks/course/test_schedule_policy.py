"""等待队列的顺序（``--schedule-policy``，给定的零件 :mod:`minisgl.schedule_policy`，配上第 2.3 章的只读匹配和去重）
的检查：小队列上每种策略的顺序（一样长的保持到达顺序、空缓存、长队列退回先来先服务、队内去重、分块请求留在队首、
饿死的上限），排队不改变缓存。匹配、去重本身和端到端的效果由第 2.3 章的检查查。

en: Checks of the waiting queue's order (``--schedule-policy``, the given part :mod:`minisgl.schedule_policy` with
chapter 2.3's read-only match and dedup): each policy's order on small queues (ties in arrival order, an empty cache,
the long-queue fallback to first come, first served, the in-queue dedup, chunked requests at the head, the starvation
bound), and queueing that leaves the cache as it was. The match and the dedup themselves, and the effect end to end,
are checked by chapter 2.3's checks.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from checks.common import expect
from checks.stage2.conftest import tree_state
from minisgl import model_zoo
from minisgl.cache_manager import NaivePrefixCache
from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.radix_cache import RadixPrefixCache, hold_back_shared
from minisgl.schedule_policy import SCHEDULE_POLICIES, QueuePolicy
from minisgl.scheduling import PendingReq

GREEDY = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)


def pend(uid: int, tokens: list[int], chunked: bool = False) -> PendingReq:
    p = PendingReq(uid, torch.tensor(tokens, dtype=torch.int32), GREEDY)
    if chunked:
        p.chunked_req = object()  # 只看它在不在 | en: only its presence matters
    return p


def cache_with(*prefixes: list[int], page_size: int = 1) -> RadixPrefixCache:
    cache = RadixPrefixCache(page_size)
    slot = 0
    for prefix in prefixes:
        cache.insert_prefix(torch.tensor(prefix, dtype=torch.int32), torch.arange(slot, slot + len(prefix), dtype=torch.int32))
        slot += len(prefix)
    return cache


def policy_of(name: str, cache: Any, **kwargs: Any) -> QueuePolicy:
    """引擎里的样子：给定的策略，配上第 2.3 章的去重。

    en: As in the engine: the given policy with chapter 2.3's dedup.
    """
    return QueuePolicy(name, cache, hold_back=hold_back_shared, **kwargs)


def uids(reqs: list[PendingReq]) -> list[int]:
    return [p.uid for p in reqs]


A = list(range(100, 140))  # 40 个 token 的前缀 | en: a 40-token prefix
B = list(range(200, 240))


# ----------------------------------------------------------------------------- 小队列上的顺序
# en: ----------------------------------------------------------------------------- the order on small queues


def test_fcfs_changes_nothing() -> None:
    cache = cache_with(A)
    queue = [pend(0, [1, 2, 3]), pend(1, A + [7]), pend(2, A + [8])]
    order, held = policy_of("fcfs", cache).arrange(list(queue))
    expect((uids(order), uids(held)), ([0, 1, 2], []), tr("fcfs: (the order, the held-back requests) of a queue"))


def test_lpm_longest_match_first_ties_in_arrival_order() -> None:
    cache = cache_with(A, B[:8])
    queue = [pend(0, [1, 2, 3, 4]), pend(1, B[:8] + [5, 6]), pend(2, A + [7, 8]), pend(3, [9, 9, 9]),
             pend(4, B[:8] + [6, 5]), pend(5, A[:20] + [1, 1])]
    order, held = policy_of("lpm", cache).arrange(list(queue))
    # 命中：0, 8, 40, 0, 8, 20 | en: hits: 0, 8, 40, 0, 8, 20
    expect(uids(order), [2, 5, 1, 4, 0, 3],
           tr("lpm: the order of requests hitting 0, 8, 40, 0, 8, 20 cached tokens (longest first, ties in arrival order)"))
    expect(uids(held), [], tr("lpm: requests held back when no two share an uncached prefix"))


def test_lpm_on_an_empty_cache_is_arrival_order() -> None:
    queue = [pend(i, [i + 1] * (5 + i)) for i in range(5)]
    order, _ = policy_of("lpm", RadixPrefixCache(1)).arrange(list(queue))
    expect(uids(order), [0, 1, 2, 3, 4], tr("lpm on an empty cache: the order (nothing hits, so arrival order)"))


def test_matching_leaves_the_cache_as_it_was() -> None:
    """匹配停在节点中间（真正的 match_prefix 会分裂它），也刷新不了时间戳、加不了锁：排队前后树完全一样。

    en: A match ending inside a node (the real match_prefix would split it) must not refresh a timestamp or take a lock
    either: the tree is the same before and after queueing.
    """
    for page_size in (1, 4):
        cache = cache_with(A, B, page_size=page_size)
        before = tree_state(cache)
        queue = [pend(0, A[:12] + [1, 2, 3]), pend(1, B + [5]), pend(2, [7] * 9), pend(3, A[:24] + [9] * 6)]
        for name in ("lpm", "dfs-weight"):
            order, _ = policy_of(name, cache).arrange(list(queue))
            expect(tree_state(cache), before,
                   tr("{name} (page_size={page_size}): the radix tree after queueing (nodes with their tokens, slots, reference counts and timestamps; the two totals and the clock): matching must not split, refresh or lock",
                      name=name, page_size=page_size))
        expect(uids(policy_of("lpm", cache).arrange(list(queue))[0]), [1, 3, 0, 2],
               tr("lpm (page_size={page_size}): the order of requests hitting 12, 40, 0, 24 tokens (rounded down to whole pages)",
                  page_size=page_size))


def test_lpm_falls_back_to_fcfs_on_a_long_queue() -> None:
    cache = cache_with(A)
    queue = [pend(0, [1, 2, 3]), pend(1, [4, 5, 6]), pend(2, A + [7]), pend(3, A + [8])]
    short = policy_of("lpm", cache, fallback_above=4)
    expect(uids(short.arrange(list(queue))[0]), [2, 3, 0, 1], tr("lpm with 4 waiting and the fallback above 4: the order (sorted)"))
    long = policy_of("lpm", cache, fallback_above=3)
    expect(uids(long.arrange(list(queue))[0]), [0, 1, 2, 3],
           tr("lpm with 4 waiting and the fallback above 3: the order (first come, first served)"))


def test_dfs_weight_walks_the_tree_by_waiting_count() -> None:
    cache = cache_with(A, B, A[:10] + [55] * 10)
    queue = [pend(0, [3, 3, 3]), pend(1, B + [1]), pend(2, A + [1]), pend(3, A[:10] + [55] * 10 + [4]),
             pend(4, A[:10] + [6, 6]), pend(5, A + [2]), pend(6, A[:10] + [55] * 10 + [7])]
    order, held = policy_of("dfs-weight", cache).arrange(list(queue))
    # A[:10] 下等着 4 个（A 的分支 2 个、[55] 的分支 2 个，一样多的按最早到的）外加停在 A[:10] 上的 1 个，B 下只有 1 个
    # （虽然它到得最早）；不命中的最后
    # en: 4 wait under A[:10] (2 on A's branch, 2 on the [55] branch, a tie broken by the earliest arrival) plus 1
    # en: stopping at A[:10], and only 1 under B (although it came first); no hit last
    expect(uids(order), [2, 5, 3, 6, 4, 1, 0],
           tr("dfs-weight: the order (subtrees by waiting requests, most first, ties by the earliest; a node's own requests after its subtrees; no hit last)"))
    expect(uids(held), [], tr("dfs-weight: requests held back when no two share an uncached prefix"))


def test_random_is_a_seeded_permutation() -> None:
    queue = [pend(0, [1], chunked=True)] + [pend(i, [i + 1, i + 2]) for i in range(1, 9)]
    orders = {}
    for seed in (0, 1, 2):
        first = uids(policy_of("random", RadixPrefixCache(1), seed=seed).arrange(list(queue))[0])
        again = uids(policy_of("random", RadixPrefixCache(1), seed=seed).arrange(list(queue))[0])
        expect(again, first, tr("random with seed {seed}: the order of a second policy with the same seed", seed=seed))
        expect(sorted(first), list(range(9)), tr("random with seed {seed}: the queue's requests, sorted", seed=seed))
        expect(first[0], 0, tr("random with seed {seed}: the first request (a half-computed chunk stays at the head)", seed=seed))
        orders[seed] = first
    expect(len({tuple(o) for o in orders.values()}) > 1, True, tr("random: seeds 0, 1 and 2 give at least two different orders"))


@pytest.mark.parametrize("name", SCHEDULE_POLICIES)
def test_a_chunked_request_stays_at_the_head(name: str) -> None:
    """算了一半的分块请求总在队首，等得再久也只出现一次（它早就在队首了，不算“等得太久”）。

    en: A half-computed chunk is always at the head, and appears once however long it has waited (it has been at the
    head all along; it does not count as overdue).
    """
    cache = cache_with(A)
    chunk = pend(0, [1, 2, 3, 4, 5, 6], chunked=True)
    policy = policy_of(name, cache, seed=3, max_wait_steps=1)
    for step in range(3):
        queue = [chunk, pend(1, A + [1]), pend(2, A + [2]), pend(3, [9, 9])] if step == 0 else order + held
        order, held = policy.arrange(list(queue))
        expect(uids(order)[0], 0, tr("{name}: the first request when a half-computed chunk (uid 0) waits", name=name))
        expect(sorted(uids(order) + uids(held)), [0, 1, 2, 3], tr("{name}: every request either in the order or held back", name=name))


# ----------------------------------------------------------------------------- 护栏
# en: ----------------------------------------------------------------------------- guards


@pytest.mark.parametrize("name", ["lpm", "dfs-weight"])
def test_in_queue_dedup_admits_one_then_the_rest_hit(name: str) -> None:
    """三个请求共享一段缓存里还没有的 40 个 token：这一步只接纳第一个；它还在算提示词时其余的继续等；前缀进了缓存，
    其余的就不再被留下，而且排在最前。

    en: Three requests share 40 tokens the cache does not hold: this step admits only the first; while it is still
    computing its prompt the others keep waiting; once the prefix is in the cache they are held no more and go first.
    """
    cache = RadixPrefixCache(1)
    policy = policy_of(name, cache, dedup_min_tokens=32)
    queue = [pend(0, A + [1]), pend(1, [5, 6, 7]), pend(2, A + [2]), pend(3, A + [3])]
    order, held = policy.arrange(list(queue))
    expect((sorted(uids(order)), uids(held)), ([0, 1], [2, 3]),
           tr("{name}: (admitted, held back) when requests 0, 2, 3 share a 40-token prefix nobody cached", name=name))
    rest = [queue[1], queue[2], queue[3]]  # 0 被接纳、还在算提示词 | en: 0 was admitted and is computing its prompt
    order, held = policy.arrange(list(rest), lambda: [0])
    expect((uids(order), uids(held)), ([1], [2, 3]),
           tr("{name}: (admitted, held back) while request 0 still computes the shared prefix", name=name))
    cache.insert_prefix(torch.tensor(A + [1], dtype=torch.int32), torch.arange(41, dtype=torch.int32))
    order, held = policy.arrange(list(rest), lambda: [])
    expect((uids(order), uids(held)), ([2, 3, 1], []),
           tr("{name}: (admitted, held back) once the shared prefix is in the cache", name=name))


def test_dedup_leaves_short_shared_prefixes_alone() -> None:
    policy = policy_of("lpm", RadixPrefixCache(1), dedup_min_tokens=32)
    queue = [pend(0, A[:20] + [1]), pend(1, A[:20] + [2]), pend(2, A[:33] + [3]), pend(3, A[:33] + [4])]
    order, held = policy.arrange(list(queue))
    # 0、1 共享 20 个，2 与 0 共享 20 个；3 与 2 共享 33 个，多于 32
    # en: 0 and 1 share 20, 2 shares 20 with 0; 3 shares 33 with 2, more than 32
    expect((uids(order), uids(held)), ([0, 1, 2], [3]),
           tr("lpm: (admitted, held back) with shared uncached prefixes of 20, 20, 33 tokens and the dedup threshold 32"))


def test_starvation_is_bounded() -> None:
    """一个不命中的请求排在命中的后面；等了超过 max_wait_steps 步后它排到最前，去重也留不下它。

    en: A request that hits nothing queues behind hitting ones; after more than max_wait_steps steps it goes first, and
    the dedup cannot hold it back either.
    """
    cache = cache_with(A)
    policy = policy_of("lpm", cache, max_wait_steps=3, dedup_min_tokens=4)
    old = pend(0, B + [1])
    firsts = []
    for step in range(6):
        newer = [pend(10 + step, A + [step]), pend(20 + step, [step, 8, 8])]
        order, held = policy.arrange([old, *newer])
        firsts.append(uids(order)[0])
    expect(firsts, [10, 11, 12, 13, 0, 0], tr("lpm, max_wait_steps=3: the first request of each of 6 steps (uid 0 hits nothing and waits throughout)"))
    twin = pend(1, B + [2])  # 与 0 共享 40 个没缓存的 token，但也等得太久了 | en: shares 40 uncached tokens with 0, but waited too long too
    policy = policy_of("lpm", cache, max_wait_steps=1, dedup_min_tokens=4)
    for _ in range(3):
        order, held = policy.arrange([old, twin])
    expect((uids(order), uids(held)), ([0, 1], []),
           tr("lpm, max_wait_steps=1, after 3 steps: (admitted, held back) of two overdue requests sharing an uncached prefix"))


def test_without_a_radix_tree_cache_aware_policies_fall_back() -> None:
    queue = [pend(0, [1, 2, 3]), pend(1, A + [1]), pend(2, A + [2])]
    for name in ("lpm", "dfs-weight"):
        policy = policy_of(name, NaivePrefixCache())
        expect(policy.active, "fcfs", tr("{name} on the naive cache: the policy really used", name=name))
        order, held = policy.arrange(list(queue))
        expect((uids(order), uids(held)), ([0, 1, 2], []), tr("{name} on the naive cache: (the order, the held-back requests)", name=name))


def test_an_unknown_policy_is_refused_before_start() -> None:
    from minisgl.llm import LLM
    from minisgl.server.args import parse_args

    with pytest.raises(ValueError, match="schedule_policy"):
        LLM("/nonexistent-model", schedule_policy="longest")
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--schedule-policy", "longest"])
    expect(parse_args(["--model", "m"]).scheduler_kwargs().get("schedule_policy"), "fcfs",
           tr("the schedule_policy the server hands the scheduler without --schedule-policy"))
    expect(parse_args(["--model", "m", "--schedule-policy", "dfs-weight"]).scheduler_kwargs()["schedule_policy"], "dfs-weight",
           tr("the schedule_policy the server hands the scheduler with --schedule-policy dfs-weight"))
