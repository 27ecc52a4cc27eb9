"""等待队列的顺序（SGLang 的 ``--schedule-policy``）：每一步接纳之前，按 radix 缓存里有什么给等待的请求排队。

调度器每一步从队首起接纳，接纳不了就停（第 2.1 章）；所以谁排在前面，就决定了谁先算、谁能复用别人刚算过的前缀。
这里是给定的零件，调度器每一步调用一次 :meth:`QueuePolicy.arrange`；它用到的两样是第 2.3 章你写的：
radix 缓存的只读匹配（``peek_prefix``）和队内去重（``hold_back_shared``），由那一章的零件
（``radix_queue_policy``）交进来：

- ``fcfs``：先来先服务，什么也不改（缺省）；
- ``lpm``：最长前缀匹配——按提示词在 radix 缓存里能命中多长从长到短排，一样长的保持到达顺序；
- ``dfs-weight``：RadixAttention 论文的树序——按 radix 树的深度优先顺序排，每个节点的子树按下面等着的请求数
  从多到少走（一样多的按最早到的请求），同一前缀的请求挨在一起；
- ``random``：每一步按种子（引擎配置的 ``seed``）洗一次牌，同一种子的顺序完全可复现。

护栏（和 SGLang 一样，外加一个年龄上限）：

- 匹配只读：不加锁、不分裂节点、不刷新时间戳（radix 缓存的 ``peek_prefix``）——排队不改变缓存里有什么，也不改变 LRU 的顺序；
  真正的匹配和加锁仍在接纳时由准入员做；
- 等待的请求超过 :data:`LPM_FALLBACK_QUEUE` 个时，``lpm`` 退回先来先服务（匹配每个请求要花时间）；
- 队内去重（只在 ``lpm`` 和 ``dfs-weight``）：几个请求共享一段缓存里还没有的前缀（比已命中的部分长出
  :data:`DEDUP_MIN_TOKENS` 个 token 以上）时，一步只接纳排在最前的那一个；其余的留在队里，直到那段前缀进了缓存
  （排在前面的那个交出第一个输出 token 时插入），再来就命中了；
- 饿死有上限：等了超过 :data:`MAX_WAIT_STEPS` 步（调度器的步数，不是秒，结果不依赖计时）的请求排到最前，也不会被
  去重留下；
- 算了一半的分块请求（第 2.4 章）在任何策略下都留在队首；
- 没有 radix 缓存（``cache_type="naive"``，或第 2.3 章之前的引擎）时 ``lpm`` 和 ``dfs-weight`` 退回先来先服务（和 SGLang 一样）。

en: The order of the waiting queue (SGLang's ``--schedule-policy``): before each admission, queue the waiting requests
by what the radix cache holds.

The scheduler admits from the head of the queue each step and stops at the first it cannot admit (chapter 2.1); so who
stands in front decides who is computed first and who can reuse a prefix someone just computed. This is a given part;
the scheduler calls :meth:`QueuePolicy.arrange` once a step. The two things it relies on are yours in chapter 2.3: the
radix cache's read-only match (``peek_prefix``) and the in-queue dedup (``hold_back_shared``), handed in by that
chapter's part (``radix_queue_policy``):

- ``fcfs``: first come, first served, changing nothing (the default);
- ``lpm``: longest prefix match: sort by how much of the prompt hits the radix cache, longest first, ties in arrival
  order;
- ``dfs-weight``: the RadixAttention paper's tree order: a depth-first walk of the radix tree, visiting each node's
  subtrees by how many waiting requests sit under them, most first (ties by the earliest request), so requests of one
  prefix stand together;
- ``random``: shuffled once a step by a seed (the engine config's ``seed``); one seed always gives the same order.

Guards (SGLang's, plus an age bound):

- matching is read-only: no lock, no node split, no timestamp refreshed (the radix cache's ``peek_prefix``):
  queueing neither changes what the cache holds nor its LRU order; the real match and lock still happen at admission,
  in the adder;
- with more than :data:`LPM_FALLBACK_QUEUE` requests waiting, ``lpm`` falls back to first come, first served (matching
  every request costs time);
- in-queue dedup (``lpm`` and ``dfs-weight`` only): when several requests share a prefix the cache does not hold yet
  (longer than their hit by more than :data:`DEDUP_MIN_TOKENS` tokens), one step admits only the first of them; the
  others stay in the queue until that prefix is in the cache (inserted when the first one hands out its first output
  token), and then hit it;
- starvation is bounded: a request that has waited more than :data:`MAX_WAIT_STEPS` steps (scheduler steps, not
  seconds: no result depends on timing) goes to the front and is never held back by the dedup;
- a half-computed chunked request (chapter 2.4) stays at the head under every policy;
- without a radix cache (``cache_type="naive"``, or an engine before chapter 2.3) ``lpm`` and ``dfs-weight`` fall back
  to first come, first served (as SGLang does).
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

#: 队内去重：``(提示词们, 各自命中的长度, 排在前面的提示词们, dedup_min_tokens) -> 每个提示词留不留``（第 2.3 章的
#: ``hold_back_shared``）。
#: en: The in-queue dedup: ``(prompts, the hit length of each, the prompts ahead, dedup_min_tokens) -> whether each
#: prompt is held back`` (chapter 2.3's ``hold_back_shared``).
HoldBack = Callable[[Sequence[torch.Tensor], Sequence[int], Sequence[torch.Tensor], int], list[bool]]


def check_schedule_policy(name: Any) -> None:
    """不认识的策略名在启动之前就拒绝（ValueError）。

    en: Refuse an unknown policy name before anything starts (ValueError).
    """
    if name not in SCHEDULE_POLICIES:
        raise ValueError(tr("Unknown schedule_policy={name!r} (server: --schedule-policy): choose one of {names}",
                            name=name, names=", ".join(SCHEDULE_POLICIES)))


class QueuePolicy:
    """一个调度器的等待队列策略。``prefix_cache``：缓存管理器的前缀缓存，按缓存排队要它能只读地匹配
    （``peek_prefix(input_ids) -> (命中的长度, 匹配到的最深的节点)``）；``hold_back``：队内去重（第 2.3 章的
    ``hold_back_shared``）。缺了哪一样，``lpm`` 和 ``dfs-weight`` 都退回先来先服务（``active`` 说实际用的是哪一种）。
    ``fallback_above``、``dedup_min_tokens``、``max_wait_steps`` 缺省为模块里的常数（检查用小的）。

    en: One scheduler's waiting-queue policy. ``prefix_cache``: the cache manager's prefix cache; queueing by the cache
    needs it to match read-only (``peek_prefix(input_ids) -> (hit length, deepest node reached)``); ``hold_back``: the
    in-queue dedup (chapter 2.3's ``hold_back_shared``). Without either, ``lpm`` and ``dfs-weight`` fall back to first
    come, first served (``active`` says which one is really used). ``fallback_above``, ``dedup_min_tokens`` and
    ``max_wait_steps`` default to the module's constants (checks use small ones).
    """

    def __init__(self, name: str, prefix_cache: Any = None, *, hold_back: HoldBack | None = None, seed: int = 0,
                 fallback_above: int = LPM_FALLBACK_QUEUE, dedup_min_tokens: int = DEDUP_MIN_TOKENS,
                 max_wait_steps: int = MAX_WAIT_STEPS) -> None:
        check_schedule_policy(name)
        self.name = name
        self.prefix_cache = prefix_cache
        can_peek = callable(getattr(prefix_cache, "peek_prefix", None))
        self.active = "fcfs" if name in CACHE_AWARE and not (can_peek and hold_back is not None) else name
        self.hold_back = hold_back
        self.fallback_above = fallback_above
        self.dedup_min_tokens = dedup_min_tokens
        self.max_wait_steps = max_wait_steps
        self.rng = random.Random(seed)
        self.steps = 0
        self.fell_back = 0  # 退回先来先服务的步数（队列太长）| en: steps that fell back to FCFS (queue too long)
        self._arrived: dict[Any, tuple[int, int]] = {}  # 等待的请求 → (第一次见到时的步数, 到达序号) | en: request → (step first seen, arrival number)
        self._arrivals = 0
        self._prompts: dict[int, torch.Tensor] = {}  # uid → 要匹配的那段提示词 | en: uid → the part of the prompt that is matched

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
        hits = {p: self.prefix_cache.peek_prefix(self._prompt(p)) for p in rest}
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
        """队内去重：排在前面的（``front``、正在算提示词的）之后，``ordered`` 里的请求交给 ``hold_back`` 决定谁留到下一步。

        en: In-queue dedup: with those ahead (``front``, those computing their prompt) in place, ``hold_back`` decides
        which requests of ``ordered`` wait for a later step.
        """
        live = {p.uid for p in front + ordered}
        busy = [uid for uid in computing() if uid in self._prompts]
        self._prompts = {uid: ids for uid, ids in self._prompts.items() if uid in live or uid in busy}
        ahead = [self._prompts[uid] for uid in busy] + [self._prompt(p) for p in front]
        held = self.hold_back([self._prompt(p) for p in ordered], [hits[p][0] for p in ordered], ahead,
                              self.dedup_min_tokens)
        return front + [p for p, h in zip(ordered, held) if not h], [p for p, h in zip(ordered, held) if h]

    def _prompt(self, p: Any) -> torch.Tensor:
        """匹配和去重看的那段提示词：最后一个 token 总要算，匹配只到倒数第二个。

        en: The part of the prompt matching and dedup look at: the last token is always computed, so matching stops
        before it.
        """
        ids = self._prompts.get(p.uid)
        if ids is None:
            ids = self._prompts[p.uid] = p.input_ids[: p.input_len - 1]
        return ids


def make_queue_policy(config: Any, cache_manager: Any, hold_back: HoldBack | None = None) -> QueuePolicy:
    """调度器的等待队列策略（一个 :data:`~minisgl.scheduling.QueuePolicyFactory`）：按 ``config.schedule_policy``，
    配上缓存管理器的前缀缓存、``hold_back``（缺了哪一样就是先来先服务）和 ``config.seed``。

    en: The scheduler's waiting-queue policy (a :data:`~minisgl.scheduling.QueuePolicyFactory`): by
    ``config.schedule_policy``, with the cache manager's prefix cache, ``hold_back`` (first come, first served when
    either is missing) and ``config.seed``.
    """
    return QueuePolicy(config.schedule_policy, getattr(cache_manager, "prefix_cache", None), hold_back=hold_back,
                       seed=config.seed or 0)
