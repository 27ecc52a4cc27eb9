# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint radix_cache <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint radix_cache <task>` gives the next hint.
"""第 2.3 章 radix_cache：用基数树（radix tree）复用相同前缀的 K/V。

很多请求共用同一段开头（系统提示词、多轮对话的历史）。这段前缀的 K/V 算一次就够了：
请求预填充完就把算过的 token 和对应的槽位插进一棵基数树，后来的请求先在树里找最长的相同前缀，
命中的部分直接把槽位写进自己的页表，只算剩下的。

- **匹配**：最多匹配到提示词的倒数第二个 token（最后一个总要算，才有 logits）；
- **插入**：只插整页；已经在树里的部分不重复插入，告诉调用者那段是重复的；
- **分裂**：只匹配了一个节点的前半段时，把节点一分为二；
- **引用计数**：请求用着的前缀沿路径加锁（``ref_count``），锁着的节点不能驱逐；
- **驱逐**：空间不够时按最近最少使用（LRU）驱逐没上锁的叶子，整页地还回去；
- **完整性检查**：重新数一遍整棵树，核对可驱逐 / 受保护的 token 数；
- **排队看缓存**（``--schedule-policy lpm``）：等着的请求按能命中多长排队，排队时只看不动（``peek_prefix``）；
  共享一段还没缓存的前缀的几个请求，一步只放一个去算（``hold_back_shared``），其余的等它进了缓存再命中。

en: Chapter 2.3 radix_cache: reuse the K/V of shared prefixes with a radix tree.

Many requests start with the same text (a system prompt, the history of a multi-turn conversation), and the K/V of such
a prefix only needs computing once: after its prefill, a request inserts the tokens it computed and their slots into a
radix tree; a later request first looks for the longest matching prefix in the tree, writes the slots of the hit part
straight into its own page table, and computes only the rest.

- **match**: at most up to the second-to-last token of the prompt (the last one is always computed, to get logits);
- **insert**: whole pages only; a part already in the tree is not inserted again, and the caller is told it is a
  duplicate;
- **split**: when a match ends inside a node, the node is split in two;
- **reference counts**: the prefix a request uses is locked along its path (``ref_count``); locked nodes cannot be
  evicted;
- **eviction**: when space runs out, unlocked leaves go back, whole pages at a time, least recently used first (LRU);
- **integrity check**: count the whole tree again and compare the evictable / protected token counts;
- **queueing by the cache** (``--schedule-policy lpm``): waiting requests are queued by how much they hit, and queueing
  looks without touching (``peek_prefix``); of several requests sharing a prefix not cached yet, one step lets only one
  compute it (``hold_back_shared``), and the others hit it once it is in the cache.
"""

from __future__ import annotations

from minisgl.course.skeleton import TaskNotDone

import functools
import heapq
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

from minisgl.i18n import tr
from minisgl import cache_manager
from minisgl.cache_manager import BaseCacheHandle, BasePrefixCache, CacheManager, InsertResult, NaivePrefixCache, SizeInfo
from minisgl.engine import Engine
from minisgl.schedule_policy import QueuePolicy, make_queue_policy
from minisgl.scheduling import SchedulerConfig, TableManager


def page_key(ids: torch.Tensor, page_size: int) -> Any:
    """子节点在父节点里的索引：第一页的 token（``page_size == 1`` 时就是第一个 token）。

    不足一页就报错：节点和查找都至少有一整页；空的 key 说明哪里造出了空节点，或者拿不足一页的剩余部分去查了。

    en: A child's index in its parent: the tokens of its first page (the first token when ``page_size == 1``).

    Raises on less than a page: nodes and lookups always hold at least one whole page; an empty key means an empty node
    was made somewhere, or a remainder shorter than a page was looked up.
    """
    if len(ids) < page_size:
        raise RuntimeError(tr(
            "key_fn got {n} tokens, less than one page (page_size={page_size}): every radix node and every lookup "
            "holds at least one whole page. Was an empty node created (an insert with nothing left to add, a split at "
            "0 or at the node's length), or a remainder shorter than a page looked up?",
            n=len(ids), page_size=page_size,
        ))
    return int(ids[0]) if page_size == 1 else tuple(ids[:page_size].tolist())


def _match_len(key: torch.Tensor, input_ids: torch.Tensor) -> int:
    """两段 token 从头开始有多少个相同。

    en: How many tokens two sequences share from the start.
    """
    n = min(len(key), len(input_ids))
    diff = torch.nonzero(key[:n] != input_ids[:n])
    return int(diff[0, 0]) if len(diff) > 0 else n


class RadixTreeNode:
    """树上的一个节点：一段 token（``key``）和它们的 K/V 槽位（``value``，是拷贝，不是页表的视图）。

    子节点按“第一页的 token”索引：同一个父节点下，两个子节点的第一页一定不同。

    en: A node of the tree: a run of tokens (``key``) and their K/V slots (``value``, a copy, not a view of the page
    table).

    Children are indexed by the tokens of their first page: two children of one parent never share a first page.
    """

    _counter = 0

    def __init__(self, key_fn: Callable[[torch.Tensor], Any], timestamp: int = 0) -> None:
        self.key_fn = key_fn
        self.children: dict[Any, RadixTreeNode] = {}
        self.parent: RadixTreeNode | None = None
        self.ref_count = 0
        self.timestamp = timestamp
        self.key = torch.empty(0, dtype=torch.int32)
        self.value = torch.empty(0, dtype=torch.int32)
        self.uid = RadixTreeNode._counter
        RadixTreeNode._counter += 1

    @property
    def length(self) -> int:
        return len(self.key)

    def is_root(self) -> bool:
        return self.parent is None

    def is_leaf(self) -> bool:
        return len(self.children) == 0

    def set_key_value(self, key: torch.Tensor, value: torch.Tensor) -> None:
        assert len(key) == len(value)
        self.key, self.value = key, value

    def set_parent(self, parent: RadixTreeNode) -> None:
        self.parent = parent
        parent.children[self.key_fn(self.key)] = self

    def split_at(self, pos: int) -> RadixTreeNode:
        """在第 ``pos`` 个 token 处一分为二，返回新的上半段节点（它接替本节点在父节点下的位置）。

        新节点继承本节点的引用计数和时间戳：锁过本节点的句柄也锁过它所在的整条路径。

        en: Split in two at token ``pos`` and return the new node holding the first part (it takes this node's place
        under the parent).

        The new node inherits this node's reference count and timestamp: a handle that locked this node also locked
        every node on its path.
        """
        # TODO 任务 split_node：在第 pos 个 token 处（pos 是 page_size 的正整数倍、小于本节点长度）把本节点一分为二，返回新建的前一段：它拿 token 和槽位的前 pos 个，接替本节点在父节点下的那一项，并继承引用计数和时间戳；本节点留下其余部分，成为前一段唯一的子节点。给定：set_key_value、set_parent
        # TODO task split_node: split this node in two at token pos (a positive multiple of page_size, below the node's length) and return the new first part: it takes the first pos tokens and slots, takes this node's place under the node above it, and inherits the reference count and the time of last use; this node keeps the rest and becomes the first part's only child. Given: set_key_value, set_parent
        raise TaskNotDone("radix_cache", "split_node")

    # 给 heapq 用：越久没用的越先驱逐
    # en: for heapq: the longest unused is evicted first
    def __lt__(self, other: RadixTreeNode) -> bool:
        return (self.timestamp, self.uid) < (other.timestamp, other.uid)

    def __repr__(self) -> str:
        return f"RadixTreeNode(len={self.length}, ref={self.ref_count}, t={self.timestamp}, key={self.key[:8].tolist()}...)"


@dataclass(frozen=True)
class RadixCacheHandle(BaseCacheHandle):
    """命中到 ``node`` 为止：从根到 ``node`` 的路径上一共 ``cached_len`` 个 token。

    en: A hit that ends at ``node``: the path from the root to ``node`` holds ``cached_len`` tokens.
    """

    node: RadixTreeNode

    def get_matched_indices(self) -> torch.Tensor:
        values = []
        node = self.node
        while not node.is_root():
            values.append(node.value)
            node = node.parent
        values.reverse()
        return torch.cat(values) if values else torch.empty(0, dtype=torch.int32)


class RadixPrefixCache(BasePrefixCache):
    """基数树前缀缓存。``page_size > 1`` 时只缓存整页，匹配长度也按页向下取整。

    en: Radix-tree prefix cache. With ``page_size > 1`` it caches whole pages only, and match lengths are rounded down
    to whole pages.
    """

    def __init__(self, page_size: int = 1, device: torch.device | str = "cpu") -> None:
        self.page_size = page_size
        self.device = torch.device(device)
        self.key_fn: Callable[[torch.Tensor], Any] = functools.partial(page_key, page_size=page_size)
        self.root = RadixTreeNode(self.key_fn)
        self.root.ref_count = 1  # 根永远受保护 | en: the root is always protected
        self.evictable_size = 0
        self.protected_size = 0
        self._clock = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    # ---------------------------------------------------------------- 查找
    # en: ---------------------------------------------------------------- lookup

    def _tree_walk(self, input_ids: torch.Tensor) -> tuple[RadixTreeNode, int]:
        """从根往下走，尽量长地匹配 ``input_ids``（按整页）；走到节点中间就把它分裂。

        返回最后一个完全匹配的节点和匹配的长度；用到的节点都刷新时间戳（严格的 LRU：只用到前半段的节点先分裂，只刷新前半段）。

        en: Walk down from the root, matching as much of ``input_ids`` as possible (whole pages); a match that ends
        inside a node splits it.

        Returns the last fully matched node and the matched length. Every node used gets a fresh timestamp (strict LRU:
        a node used only in part is split first, and only the first part is refreshed).
        """
        # TODO 任务 tree_walk：从根往下按整页尽量长地匹配 input_ids，返回（最后一个完全匹配的节点, 匹配长度）；匹配停在某个节点中间，就把它分裂并返回前半段。路上用到的节点都刷新成同一个时间（一次匹配只 _tick 一次）；只用到前半段时，后半段保持原来的时间。剩下不足一页就不再往下找（key_fn 不接受不足一页的输入）。给定：key_fn、_match_len、split_at
        # TODO task tree_walk: walk down from the top of the tree, matching as much of input_ids as possible in whole pages, and return (the last fully matched node, how many tokens matched); when matching stops inside a node, split it and return the first part. Every node used gets the same new time (one _tick per walk); when only the first part is used, the rest keeps its old time. Stop looking once less than a page remains (key_fn refuses less than a page). Given: key_fn, _match_len, split_at
        raise TaskNotDone("radix_cache", "tree_walk")

    def match_prefix(self, input_ids: torch.Tensor) -> RadixCacheHandle:
        node, prefix_len = self._tree_walk(input_ids)
        return RadixCacheHandle(prefix_len, node)

    def peek_prefix(self, input_ids: torch.Tensor) -> tuple[int, RadixTreeNode]:
        """只看不动的匹配：``input_ids`` 能命中多长，以及匹配到的最深的节点。等待队列排队（``--schedule-policy lpm``）
        每一步都要问一遍每个等着的请求；真正的匹配和加锁等到接纳时才做。

        en: A match that looks without touching: how much of ``input_ids`` hits, and the deepest node the match reaches.
        Queueing the waiting requests (``--schedule-policy lpm``) asks this of every waiting request each step; the
        real match and lock wait until admission.
        """
        # TODO 任务 peek_prefix：回答“match_prefix 现在会命中多长”，但树上什么都不变：不分裂节点、不改任何时间、不动时钟、不加锁——排队的人只是看一眼，不该让缓存以为被用过（LRU 的顺序变了，驱逐的就不对了）。返回（命中的长度，和 match_prefix 给的完全相同；匹配到的最深的节点：匹配停在某个节点中间时就是那个节点本身，什么都没命中时是根）。给定：key_fn、_match_len
        # TODO task peek_prefix: Answer "how much would match_prefix hit right now" while nothing in the tree changes: no node split, no time changed, the clock untouched, no lock: someone queueing only takes a look and must not make the cache believe it was used (the LRU order would change, and eviction would pick wrongly). Return (the hit length, exactly what match_prefix gives; the deepest node the match reaches: the node itself when the match stops inside it, the root when nothing hits). Given: key_fn, _match_len
        raise TaskNotDone("radix_cache", "peek_prefix")

    # ---------------------------------------------------------------- 插入
    # en: ---------------------------------------------------------------- insertion

    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> InsertResult:
        """插入 ``input_ids`` 的整页部分。返回插入前已有的长度，以及覆盖整段（整页部分）的句柄。

        en: Insert the whole-page part of ``input_ids``. Returns the length that was already cached before the insert,
        and a handle covering the whole inserted part (all of its whole pages).
        """
        # TODO 任务 insert：插入 input_ids 的整页部分（连同 indices 里对应的槽位）：树里已有的部分不重复插入，其余挂成一个新叶子——存的是拷贝，不是传进来的视图，时间和这次匹配用的相同（_tick 给的那个时间，匹配到根时根的时间不会刷新）——并计入可驱逐的账；返回 InsertResult（插入前已有的长度, 指向最后一个节点、覆盖整页部分的句柄）。给定：_tree_walk、RadixCacheHandle、self._clock
        # TODO task insert: insert the whole-page part of input_ids (with the matching slots of indices): what the tree already holds is not inserted again, the rest becomes one new leaf, storing copies rather than the views passed in, with the same time as this walk (the time _tick gave it: a walk that matches nothing ends at the root, whose time is never refreshed), and it counts as evictable; return InsertResult(how much was already cached, a handle ending where the inserted part ends and covering the whole-page part). Given: _tree_walk, RadixCacheHandle, self._clock
        raise TaskNotDone("radix_cache", "insert")

    # ---------------------------------------------------------------- 加锁与驱逐
    # en: ---------------------------------------------------------------- locking and eviction

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        """从句柄的节点一直到根，每个节点的 ``ref_count`` 加一（解锁减一）；0 与非 0 之间变化时在两本账之间挪长度。

        en: Add one to the ``ref_count`` of every node from the handle's node up to the root (subtract one to unlock);
        when a count changes between 0 and non-zero, move the node's length between the evictable and the protected
        total.
        """
        assert isinstance(handle, RadixCacheHandle)
        # TODO 任务 lock：从句柄所在的节点一路到根（根不算），每个节点的引用计数加一（unlock 时减一）；计数从 0 变成 1 时，这个节点的长度从可驱逐的账挪到受保护的账，从 1 变回 0 时挪回去；给没锁着的节点解锁要抛 RuntimeError
        # TODO task lock: for every node from the handle's node up to the root (the root excluded), add one to its reference count (subtract one when unlock is set); when a count goes 0 → 1 the node's tokens move from the evictable total to the protected one, and back when it goes 1 → 0; unlocking a node that is not locked raises RuntimeError
        raise TaskNotDone("radix_cache", "lock")

    def evict(self, size: int) -> torch.Tensor:
        """驱逐至少 ``size`` 个 token：每次驱逐最久没用、没上锁的叶子；父节点因此变成无锁叶子就也加入候选。

        en: Evict at least ``size`` tokens: each time the least recently used unlocked leaf; a parent that becomes an
        unlocked leaf this way joins the candidates.
        """
        if size <= 0:
            return torch.empty(0, dtype=torch.int32, device=self.device)
        if size > self.evictable_size:
            raise RuntimeError(tr(
                "Asked to evict {size} tokens, but only {evictable_size} are evictable",
                size=size, evictable_size=self.evictable_size,
            ))
        # TODO 任务 evict：驱逐至少 size 个 token，返回腾出来的槽位（拼成一个张量）：每次挑最久没用、没上锁的叶子（根除外），把它从树上摘掉，从可驱逐的账里扣掉；父节点因此成了没上锁的叶子，也就成了候选；够数就停；候选用完还不够就抛 RuntimeError。节点之间可以直接比新旧（__lt__）。给定：_all_nodes
        # TODO task evict: evict at least size tokens and return the slots set free, as one tensor: each time take the least recently used unlocked leaf (never the root), detach it from the tree and subtract it from the evictable total; a parent that thereby becomes an unlocked leaf joins the candidates; stop once there is enough; if the candidates run out first, raise RuntimeError. Nodes compare by age directly (__lt__). Given: _all_nodes
        raise TaskNotDone("radix_cache", "evict")

    # ---------------------------------------------------------------- 统计与自查
    # en: ---------------------------------------------------------------- sizes and self-check

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(self.evictable_size, self.protected_size)

    def _all_nodes(self) -> list[RadixTreeNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def cached_indices(self) -> torch.Tensor:
        """树里全部的槽位（检查用）。

        en: Every slot in the tree (for checks).
        """
        values = [n.value for n in self._all_nodes() if not n.is_root()]
        return torch.cat(values) if values else torch.empty(0, dtype=torch.int32)

    def check_integrity(self) -> None:
        """重新数一遍：每个节点的结构、整页、引用计数，以及两本账的合计。不对就抛 RuntimeError。

        en: Count everything again: each node's structure, whole pages and reference count, and the evictable and
        protected totals. Raises RuntimeError on any mismatch.
        """
        # TODO 任务 check_tree：重新数一遍整棵树，下面任何一条不成立就抛 RuntimeError：每个子节点都挂在父节点字典里按 key_fn 算出的那一项下，而且它的父指针指回这个父节点（根只查这一条，也不计入两本账）；其余节点非空、长度是 page_size 的整数倍、token 和槽位一样长；引用计数不为负，也不小于子节点计数之和；按引用计数是否为 0 重新累计两本账，和 evictable_size、protected_size 都相等；全树没有重复的槽位。给定：_all_nodes、cached_indices
        # TODO task check_tree: count the whole tree again; raise RuntimeError if any of these fails: every child in a node's dict is filed under what key_fn gives for it and points back at that very node (the only rule for the root, which is not counted in the totals); every other node is non-empty, its size a multiple of page_size, with as many slots as tokens; every reference count is non-negative and not below the sum of the counts directly beneath it; recounting the two totals by whether each count is zero gives evictable_size and protected_size; no slot appears twice in the tree. Given: _all_nodes, cached_indices
        raise TaskNotDone("radix_cache", "check_tree")


def create_prefix_cache(cache_type: str, page_size: int, device: torch.device | str) -> BasePrefixCache:
    """按名字创建前缀缓存：``"radix"`` 或 ``"naive"``。

    en: Create a prefix cache by name: ``"radix"`` or ``"naive"``.
    """
    if cache_type == "radix":
        return RadixPrefixCache(page_size, device)
    if cache_type == "naive":
        return NaivePrefixCache()
    raise ValueError(tr("Unknown cache_type={cache_type!r}: choose 'radix' or 'naive'", cache_type=cache_type))


def radix_cache_manager(engine: Engine, config: SchedulerConfig, table_manager: TableManager) -> CacheManager:
    """本章的缓存管理器零件：按需分页，前缀缓存按 ``config.cache_type`` 选（关口已把缺省换成 radix）。

    en: This chapter's cache-manager part: pages on demand, the prefix cache chosen by ``config.cache_type`` (the gate
    has already made the default radix).
    """
    prefix_cache = create_prefix_cache(config.cache_type, config.page_size, engine.device)
    return CacheManager(engine.num_pages, config.page_size, engine.page_table, prefix_cache)


def hold_back_shared(prompts: Sequence[torch.Tensor], hits: Sequence[int], ahead: Sequence[torch.Tensor],
                     min_shared: int) -> list[bool]:
    """队内去重：几个等着的请求共享一段缓存里还没有的长前缀时，一步只放一个去算它，其余的等它进了缓存再来命中。

    ``prompts`` 按接纳的顺序排好，``hits[i]`` 是 ``prompts[i]`` 现在能命中多长；``ahead`` 是已经排在它们前面的提示词
    （正在算的、这一步先接纳的）。返回每个提示词这一步留不留下。

    en: In-queue dedup: when several waiting requests share a long prefix the cache does not hold yet, one step lets only
    one of them compute it; the others wait until it is in the cache, and then hit it.

    ``prompts`` are in the order of admission and ``hits[i]`` is how much of ``prompts[i]`` hits now; ``ahead`` are the
    prompts already in front of them (those computing, those admitted first this step). Returns, for each prompt,
    whether it is held back this step.
    """
    # TODO 任务 hold_back_shared：按顺序决定每个提示词留不留下：它和“走在它前面的”（ahead 里的，以及排在它前面、自己没被留下的）里任何一个共有的开头，比它已经命中的长度多出 min_shared 个 token 以上（恰好多 min_shared 个不算），它就留下——那段前缀已经有人在算，它再算一遍是白算。被留下的不算“走在前面”：它这一步不算任何东西。给定：prompts 的顺序、hits
    # TODO task hold_back_shared: Decide in order, for each prompt, whether it is held back: it is held when the beginning it shares with anyone "walking ahead of it" (those in ahead, and those before it in prompts that were not held back themselves) is longer than its own hit by more than min_shared tokens (exactly min_shared more does not count): someone is already computing that prefix, and computing it again is wasted. A held-back prompt does not walk ahead of anyone: it computes nothing this step. Given: the order of prompts, hits
    raise TaskNotDone("radix_cache", "hold_back_shared")


def radix_queue_policy(config: SchedulerConfig, cache_manager: CacheManager) -> QueuePolicy:
    """本章的等待队列零件：给定的 :class:`~minisgl.schedule_policy.QueuePolicy`，用你的 ``peek_prefix`` 匹配、
    你的 :func:`hold_back_shared` 去重（按 ``schedule_policy`` 选；``cache_type="naive"`` 时按缓存排队的策略退回先来先服务）。

    en: This chapter's waiting-queue part: the given :class:`~minisgl.schedule_policy.QueuePolicy`, matching with your
    ``peek_prefix`` and deduplicating with your :func:`hold_back_shared` (chosen by ``schedule_policy``; with
    ``cache_type="naive"`` the cache-aware policies fall back to first come, first served).
    """
    return make_queue_policy(config, cache_manager, hold_back=hold_back_shared)


#: 到本章为止的引擎：第 2.2 章的零件，缓存管理器换成带 radix 前缀缓存的（``cache_type="naive"`` 关掉复用），
#: 等待队列能按缓存排（``schedule_policy``）。
#: en: The engine up to this chapter: chapter 2.2's parts, with the cache manager that holds a radix prefix cache
#: (``cache_type="naive"`` turns reuse off), and a waiting queue that can be ordered by the cache (``schedule_policy``).
PARTS = replace(cache_manager.PARTS, cache_manager=radix_cache_manager, cache_types=("radix", "naive"),
                queue_policy=radix_queue_policy)
