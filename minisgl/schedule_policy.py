"""等待队列的顺序（SGLang 的 ``--schedule-policy``）：每一步接纳之前，按 radix 缓存里有什么给等待的请求排队。

调度器每一步从队首起接纳，接纳不了就停（第 2.1 章）；所以谁排在前面，就决定了谁先算、谁能复用别人刚算过的前缀。
这里是给定的零件（没有哪一章要你写），调度器每一步调用一次 :meth:`QueuePolicy.arrange`：

- ``fcfs``：先来先服务，什么也不改（缺省）；
- ``lpm``：最长前缀匹配——按提示词在 radix 缓存里能命中多长从长到短排，一样长的保持到达顺序；
- ``dfs-weight``：RadixAttention 论文的树序——按 radix 树的深度优先顺序排，每个节点的子树按下面等着的请求数
  从多到少走（一样多的按最早到的请求），同一前缀的请求挨在一起；
- ``random``：每一步按种子（引擎配置的 ``seed``）洗一次牌，同一种子的顺序完全可复现。

护栏（和 SGLang 一样，外加一个年龄上限）：

- 匹配只读：不加锁、不分裂节点、不刷新时间戳（:func:`peek_prefix`）——排队不改变缓存里有什么，也不改变 LRU 的顺序；
  真正的匹配和加锁仍在接纳时由准入员做；
- 等待的请求超过 :data:`LPM_FALLBACK_QUEUE` 个时，``lpm`` 退回先来先服务（匹配每个请求要花时间）；
- 队内去重（只在 ``lpm`` 和 ``dfs-weight``）：几个请求共享一段缓存里还没有的前缀（比已命中的部分长出
  :data:`DEDUP_MIN_TOKENS` 个 token 以上）时，一步只接纳排在最前的那一个；其余的留在队里，直到那段前缀进了缓存
  （排在前面的那个交出第一个输出 token 时插入），再来就命中了；
- 饿死有上限：等了超过 :data:`MAX_WAIT_STEPS` 步（调度器的步数，不是秒，结果不依赖计时）的请求排到最前，也不会被
  去重留下；
- 算了一半的分块请求（第 2.4 章）在任何策略下都留在队首；
- 没有 radix 缓存（``cache_type="naive"``）时 ``lpm`` 和 ``dfs-weight`` 退回先来先服务（和 SGLang 一样）。

en: The order of the waiting queue (SGLang's ``--schedule-policy``): before each admission, queue the waiting requests
by what the radix cache holds.

The scheduler admits from the head of the queue each step and stops at the first it cannot admit (chapter 2.1); so who
stands in front decides who is computed first and who can reuse a prefix someone just computed. This is a given part
(no chapter has you write it); the scheduler calls :meth:`QueuePolicy.arrange` once a step:

- ``fcfs``: first come, first served, changing nothing (the default);
- ``lpm``: longest prefix match: sort by how much of the prompt hits the radix cache, longest first, ties in arrival
  order;
- ``dfs-weight``: the RadixAttention paper's tree order: a depth-first walk of the radix tree, visiting each node's
  subtrees by how many waiting requests sit under them, most first (ties by the earliest request), so requests of one
  prefix stand together;
- ``random``: shuffled once a step by a seed (the engine config's ``seed``); one seed always gives the same order.

Guards (SGLang's, plus an age bound):

- matching is read-only: no lock, no node split, no timestamp refreshed (:func:`peek_prefix`): queueing neither changes
  what the cache holds nor its LRU order; the real match and lock still happen at admission, in the adder;
- with more than :data:`LPM_FALLBACK_QUEUE` requests waiting, ``lpm`` falls back to first come, first served (matching
  every request costs time);
- in-queue dedup (``lpm`` and ``dfs-weight`` only): when several requests share a prefix the cache does not hold yet
  (longer than their hit by more than :data:`DEDUP_MIN_TOKENS` tokens), one step admits only the first of them; the
  others stay in the queue until that prefix is in the cache (inserted when the first one hands out its first output
  token), and then hit it;
- starvation is bounded: a request that has waited more than :data:`MAX_WAIT_STEPS` steps (scheduler steps, not
  seconds: no result depends on timing) goes to the front and is never held back by the dedup;
- a half-computed chunked request (chapter 2.4) stays at the head under every policy;
- without a radix cache (``cache_type="naive"``) ``lpm`` and ``dfs-weight`` fall back to first come, first served (as
  SGLang does).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Iterable, Sequence

import torch

from minisgl.i18n import tr

#: ``--schedule-policy`` 的取值（SGLang 的名字）；第一个是缺省值。
#: en: The values of ``--schedule-policy`` (SGLang's names); the first is the default.
SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight", "random")
#: 按缓存排队的策略。
#: en: The policies that queue by the cache.
CACHE_AWARE = ("lpm", "dfs-weight")
#: 等待的请求多于这么多个时 ``lpm`` 退回先来先服务（SGLang 的 128）。
#: en: With more requests waiting than this, ``lpm`` falls back to first come, first served (SGLang's 128).
LPM_FALLBACK_QUEUE = 128
#: 队内去重：共享的、还没缓存的前缀比已命中的部分长出多于这么多个 token，才让后面的请求等一等（SGLang 的 32）。
#: en: In-queue dedup: a later request waits only when the shared prefix not cached yet reaches more than this many
#: tokens past its hit (SGLang's 32).
DEDUP_MIN_TOKENS = 32
#: 饿死的上限：等了超过这么多个调度步的请求排到最前。
#: en: The starvation bound: a request that has waited more than this many scheduler steps goes to the front.
MAX_WAIT_STEPS = 256
#: 队内去重的前缀树每一层放多少个 token。
#: en: How many tokens one level of the in-queue dedup's prefix tree holds.
_BLOCK = 16


def check_schedule_policy(name: Any) -> None:
    """不认识的策略名在启动之前就拒绝（ValueError）。

    en: Refuse an unknown policy name before anything starts (ValueError).
    """
    if name not in SCHEDULE_POLICIES:
        raise ValueError(tr("Unknown schedule_policy={name!r} (server: --schedule-policy): choose one of {names}",
                            name=name, names=", ".join(SCHEDULE_POLICIES)))


def peek_prefix(prefix_cache: Any, input_ids: torch.Tensor) -> tuple[int, Any]:
    """只读地匹配：``input_ids`` 在 radix 树里按整页能命中多长，以及匹配到的最深的节点（停在节点中间时就是那个节点）。
    不分裂节点、不刷新时间戳、不加锁，和 ``match_prefix`` 给的长度相同。没有树（naive 缓存）时是 ``(0, None)``。

    en: Match read-only: how much of ``input_ids`` hits the radix tree in whole pages, and the deepest node the match
    reaches (the node itself when the match ends inside it). It splits no node, refreshes no timestamp and takes no
    lock, and gives the same length as ``match_prefix``. Without a tree (the naive cache): ``(0, None)``.
    """
    root = getattr(prefix_cache, "root", None)
    if root is None:
        return 0, None
    ps = prefix_cache.page_size
    node, matched = root, 0
    while len(input_ids) - matched >= ps:
        child = node.children.get(prefix_cache.key_fn(input_ids[matched:]))
        if child is None:
            break
        rest = input_ids[matched : matched + child.length]
        diff = torch.nonzero(child.key[: len(rest)] != rest)
        same = int(diff[0, 0]) if len(diff) > 0 else len(rest)
        same = same // ps * ps
        matched += same
        node = child
        if same < child.length:
            break
    return matched, node


class _PrefixTrie:
    """队内去重用的前缀树：按 :data:`_BLOCK` 个 token 一层，求一段提示词和已放进来的任何一段最长共有多少个 token。

    en: The in-queue dedup's prefix tree, :data:`_BLOCK` tokens a level: the longest prefix a prompt shares with any
    prompt already put in.
    """

    def __init__(self) -> None:
        self.root: dict[tuple[int, ...], dict] = {}

    def shared(self, blocks: Sequence[tuple[int, ...]]) -> int:
        node, total = self.root, 0
        for block in blocks:
            child = node.get(block)
            if child is None:
                best = 0
                for other in node:
                    n = 0
                    while n < min(len(other), len(block)) and other[n] == block[n]:
                        n += 1
                    best = max(best, n)
                return total + best
            node, total = child, total + len(block)
        return total

    def add(self, blocks: Sequence[tuple[int, ...]]) -> None:
        node = self.root
        for block in blocks:
            node = node.setdefault(block, {})


def _blocks(ids: torch.Tensor) -> list[tuple[int, ...]]:
    flat = ids.tolist()
    return [tuple(flat[i : i + _BLOCK]) for i in range(0, len(flat), _BLOCK)]


class QueuePolicy:
    """一个调度器的等待队列策略。``prefix_cache``：缓存管理器的前缀缓存（没有树就退回先来先服务，``active`` 说实际
    用的是哪一种）。``fallback_above``、``dedup_min_tokens``、``max_wait_steps`` 缺省为模块里的常数（检查用小的）。

    en: One scheduler's waiting-queue policy. ``prefix_cache``: the cache manager's prefix cache (without a tree it falls
    back to first come, first served; ``active`` says which one is really used). ``fallback_above``,
    ``dedup_min_tokens`` and ``max_wait_steps`` default to the module's constants (checks use small ones).
    """

    def __init__(self, name: str, prefix_cache: Any = None, *, seed: int = 0, fallback_above: int = LPM_FALLBACK_QUEUE,
                 dedup_min_tokens: int = DEDUP_MIN_TOKENS, max_wait_steps: int = MAX_WAIT_STEPS) -> None:
        check_schedule_policy(name)
        self.name = name
        self.prefix_cache = prefix_cache
        has_tree = getattr(prefix_cache, "root", None) is not None
        self.active = "fcfs" if name in CACHE_AWARE and not has_tree else name
        self.fallback_above = fallback_above
        self.dedup_min_tokens = dedup_min_tokens
        self.max_wait_steps = max_wait_steps
        self.rng = random.Random(seed)
        self.steps = 0
        self.fell_back = 0  # 退回先来先服务的步数（队列太长）| en: steps that fell back to FCFS (queue too long)
        self._arrived: dict[Any, tuple[int, int]] = {}  # 等待的请求 → (第一次见到时的步数, 到达序号) | en: request → (step first seen, arrival number)
        self._arrivals = 0
        self._blocks: dict[int, list[tuple[int, ...]]] = {}  # uid → 提示词的块 | en: uid → the prompt's blocks

    def arrange(self, pending: list[Any], computing: Callable[[], Iterable[int]] = tuple) -> tuple[list[Any], list[Any]]:
        """这一步的等待队列：返回（按这个顺序接纳的请求, 这一步留下不接纳的请求）；两者合起来正好是 ``pending``。
        ``computing()``：已被接纳、提示词还没进缓存的请求的 uid（只有队内去重会问）。

        en: This step's waiting queue: returns (the requests to admit, in this order; those held back this step); the two
        together are exactly ``pending``. ``computing()``: the uids of admitted requests whose prompt is not in the cache
        yet (asked only by the in-queue dedup).
        """
        self.steps += 1
        if self.active == "fcfs" or not pending:
            return pending, []
        for p in pending:
            if p not in self._arrived:
                self._arrived[p] = (self.steps, self._arrivals)
                self._arrivals += 1
        alive = set(pending)
        self._arrived = {p: v for p, v in self._arrived.items() if p in alive}
        head = [p for p in pending if p.chunked_req is not None]
        overdue = sorted((p for p in pending if p.chunked_req is None and self._age(p) > self.max_wait_steps),
                         key=self._arrival)
        late = set(overdue)
        rest = sorted((p for p in pending if p.chunked_req is None and p not in late), key=self._arrival)
        if self.active == "random":
            self.rng.shuffle(rest)
            return head + overdue + rest, []
        if self.active == "lpm" and len(pending) > self.fallback_above:
            self.fell_back += 1
            return head + overdue + rest, []
        hits = {p: peek_prefix(self.prefix_cache, p.input_ids[: p.input_len - 1]) for p in rest}
        if self.active == "lpm":
            rest.sort(key=lambda p: -hits[p][0])  # 稳定排序：一样长的保持到达顺序 | en: stable: ties keep arrival order
        else:
            rest = self._tree_order(rest, hits)
        return self._dedup(head + overdue, rest, hits, computing)

    def _age(self, p: Any) -> int:
        return self.steps - self._arrived[p][0]

    def _arrival(self, p: Any) -> int:
        return self._arrived[p][1]

    def _tree_order(self, reqs: list[Any], hits: dict[Any, tuple[int, Any]]) -> list[Any]:
        """深度优先走 radix 树：子树按下面等着的请求数从多到少（一样多的按最早到的），节点自己的请求排在它的子树之后。

        en: A depth-first walk of the radix tree: subtrees by how many waiting requests sit under them, most first (ties
        by the earliest arrival); a node's own requests come after its subtrees.
        """
        at: dict[Any, list[Any]] = {}
        for p in reqs:  # 已按到达顺序 | en: already in arrival order
            at.setdefault(hits[p][1], []).append(p)
        weight: dict[Any, int] = {}
        first: dict[Any, int] = {}
        for node, here in at.items():
            n = node
            while n is not None:
                weight[n] = weight.get(n, 0) + len(here)
                first[n] = min(first.get(n, 1 << 62), self._arrival(here[0]))
                n = n.parent
        out: list[Any] = []
        stack: list[tuple[Any, bool]] = [(self.prefix_cache.root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                out.extend(at.get(node, []))
                continue
            stack.append((node, True))
            children = sorted((c for c in node.children.values() if c in weight), key=lambda c: (-weight[c], first[c]))
            stack.extend((c, False) for c in reversed(children))
        return out

    def _dedup(self, front: list[Any], ordered: list[Any], hits: dict[Any, tuple[int, Any]],
               computing: Callable[[], Iterable[int]]) -> tuple[list[Any], list[Any]]:
        """队内去重：``ordered`` 里的请求和排在它前面的（``front``、没被留下的、正在算提示词的）共享一段还没缓存的
        前缀、比它已命中的部分长出 ``dedup_min_tokens`` 个 token 以上，就留到下一步。

        en: In-queue dedup: a request of ``ordered`` sharing with someone ahead of it (``front``, those not held, those
        computing their prompt) a prefix longer than its own hit by more than ``dedup_min_tokens`` tokens waits for a
        later step.
        """
        live = {p.uid for p in front + ordered}
        busy = [uid for uid in computing() if uid in self._blocks]
        self._blocks = {uid: b for uid, b in self._blocks.items() if uid in live or uid in busy}
        trie = _PrefixTrie()
        for uid in busy:
            trie.add(self._blocks[uid])
        for p in front:
            trie.add(self._prompt_blocks(p))
        keep, held = list(front), []
        for p in ordered:
            blocks = self._prompt_blocks(p)
            if trie.shared(blocks) - hits[p][0] > self.dedup_min_tokens:
                held.append(p)
                continue
            trie.add(blocks)
            keep.append(p)
        return keep, held

    def _prompt_blocks(self, p: Any) -> list[tuple[int, ...]]:
        blocks = self._blocks.get(p.uid)
        if blocks is None:
            # 最后一个 token 总要算（匹配只到倒数第二个）| en: the last token is always computed (matching stops before it)
            blocks = self._blocks[p.uid] = _blocks(p.input_ids[: p.input_len - 1])
        return blocks


def make_queue_policy(config: Any, cache_manager: Any) -> QueuePolicy:
    """调度器的等待队列策略（一个 :data:`~minisgl.scheduling.QueuePolicyFactory`）：按 ``config.schedule_policy``，
    配上缓存管理器的前缀缓存（没有的就是先来先服务）和 ``config.seed``。

    en: The scheduler's waiting-queue policy (a :data:`~minisgl.scheduling.QueuePolicyFactory`): by
    ``config.schedule_policy``, with the cache manager's prefix cache (first come, first served when it has none) and
    ``config.seed``.
    """
    return QueuePolicy(config.schedule_policy, getattr(cache_manager, "prefix_cache", None), seed=config.seed or 0)
