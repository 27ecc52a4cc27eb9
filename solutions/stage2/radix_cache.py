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
        # >>> TASK split_node: 在第 pos 个 token 处（pos 是 page_size 的正整数倍、小于本节点长度）把本节点一分为二，返回新建的前一段：它拿 token 和槽位的前 pos 个，接替本节点在父节点下的那一项，并继承引用计数和时间戳；本节点留下其余部分，成为前一段唯一的子节点。给定：set_key_value、set_parent
        # en: split this node in two at token pos (a positive multiple of page_size, below the node's length) and return the new first part: it takes the first pos tokens and slots, takes this node's place under the node above it, and inherits the reference count and the time of last use; this node keeps the rest and becomes the first part's only child. Given: set_key_value, set_parent
        # hint1: 前半段的第一页和本节点原来的第一页相同，所以它挂到原父节点下时正好覆盖字典里本节点那一项，不用先删。
        # hint1: 本节点的 key 改成后半段之后，再把它挂到前半段下面：set_parent 按它新的第一页建索引。
        # en1: The first part starts with the same page as this node did, so hanging it under the old parent overwrites this node's entry in the dict: no need to delete it first.
        # en1: Hang this node under the first part only after its key has become the second part: set_parent indexes it by its new first page.
        # hint2: 1. new_node = RadixTreeNode(self.key_fn, self.timestamp)；new_node.set_key_value(self.key[:pos], self.value[:pos])；new_node.ref_count = self.ref_count；
        # hint2: 2. new_node.set_parent(self.parent)（覆盖父节点字典里本节点那一项）；
        # hint2: 3. self.set_key_value(self.key[pos:], self.value[pos:])；self.set_parent(new_node)；return new_node。
        # en2: 1. new_node = RadixTreeNode(self.key_fn, self.timestamp); new_node.set_key_value(self.key[:pos], self.value[:pos]); new_node.ref_count = self.ref_count;
        # en2: 2. new_node.set_parent(self.parent) (overwriting this node's entry in the parent's dict);
        # en2: 3. self.set_key_value(self.key[pos:], self.value[pos:]); self.set_parent(new_node); return new_node.
        assert 0 < pos < self.length and self.parent is not None
        new_node = RadixTreeNode(self.key_fn, self.timestamp)
        new_node.set_key_value(self.key[:pos], self.value[:pos])
        new_node.ref_count = self.ref_count
        # 与本节点第一页相同，正好替换父节点里的这一项
        # en: same first page as this node, so it replaces this node's entry in the parent
        new_node.set_parent(self.parent)
        self.set_key_value(self.key[pos:], self.value[pos:])
        self.set_parent(new_node)
        return new_node
        # <<< TASK

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
        # >>> TASK tree_walk: 从根往下按整页尽量长地匹配 input_ids，返回（最后一个完全匹配的节点, 匹配长度）；匹配停在某个节点中间，就把它分裂并返回前半段。路上用到的节点都刷新成同一个时间（一次匹配只 _tick 一次）；只用到前半段时，后半段保持原来的时间。剩下不足一页就不再往下找（key_fn 不接受不足一页的输入）。给定：key_fn、_match_len、split_at
        # en: walk down from the top of the tree, matching as much of input_ids as possible in whole pages, and return (the last fully matched node, how many tokens matched); when matching stops inside a node, split it and return the first part. Every node used gets the same new time (one _tick per walk); when only the first part is used, the rest keeps its old time. Stop looking once less than a page remains (key_fn refuses less than a page). Given: key_fn, _match_len, split_at
        # hint1: 子节点按剩余部分的第一页去 children 字典里查。逐 token 的匹配长度先按 page_size 向下取整，再和子节点的长度比：相等就走下去，短了就分裂。
        # en1: Look a child up in the children dict by the first page of what remains. Round the token-by-token match length down to page_size, then compare it
        # en1: with the child's length: equal means walk on, shorter means split.
        # hint2: 1. node, prefix_len, now = self.root, 0, self._tick()；ps = self.page_size；
        # hint2: 2. 当 len(input_ids) - prefix_len >= ps：child = node.children.get(self.key_fn(input_ids[prefix_len:]))；是 None 就 break；
        # hint2: 3. match = _match_len(child.key, input_ids[prefix_len:]) // ps * ps；prefix_len += match；
        # hint2: 4. match < child.length：head = child.split_at(match)；head.timestamp = now；return head, prefix_len；
        # hint2: 5. 否则 child.timestamp = now；node = child，接着循环；循环结束 return node, prefix_len。
        # en2: 1. node, prefix_len, now = self.root, 0, self._tick(); ps = self.page_size;
        # en2: 2. while len(input_ids) - prefix_len >= ps: child = node.children.get(self.key_fn(input_ids[prefix_len:])); break if it is None;
        # en2: 3. match = _match_len(child.key, input_ids[prefix_len:]) // ps * ps; prefix_len += match;
        # en2: 4. if match < child.length: head = child.split_at(match); head.timestamp = now; return head, prefix_len;
        # en2: 5. otherwise child.timestamp = now; node = child and loop on; after the loop return node, prefix_len.
        node, prefix_len, now = self.root, 0, self._tick()
        ps = self.page_size
        while len(input_ids) - prefix_len >= ps:
            child = node.children.get(self.key_fn(input_ids[prefix_len:]))
            if child is None:
                break
            match = _match_len(child.key, input_ids[prefix_len:]) // ps * ps
            prefix_len += match
            # 只用到节点的前半段：只刷新分出来的前半段，没用到的后半段保持原来的时间
            # en: only the first part of the node is used: refresh only the split-off first part; the unused rest keeps
            # en: its time
            if match < child.length:
                head = child.split_at(match)
                head.timestamp = now
                return head, prefix_len
            child.timestamp = now
            node = child
        return node, prefix_len
        # <<< TASK

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
        # >>> TASK peek_prefix: 回答“match_prefix 现在会命中多长”，但树上什么都不变：不分裂节点、不改任何时间、不动时钟、不加锁——排队的人只是看一眼，不该让缓存以为被用过（LRU 的顺序变了，驱逐的就不对了）。返回（命中的长度，和 match_prefix 给的完全相同；匹配到的最深的节点：匹配停在某个节点中间时就是那个节点本身，什么都没命中时是根）。给定：key_fn、_match_len
        # en: Answer "how much would match_prefix hit right now" while nothing in the tree changes: no node split, no time changed, the clock untouched, no lock: someone queueing only takes a look and must not make the cache believe it was used (the LRU order would change, and eviction would pick wrongly). Return (the hit length, exactly what match_prefix gives; the deepest node the match reaches: the node itself when the match stops inside it, the root when nothing hits). Given: key_fn, _match_len
        # hint1: 和你的 tree_walk 走同一条路，区别只在停在节点中间时：那里不分裂，直接带着这个节点返回。长度照样按整页取整。
        # en1: Take the same path as your tree_walk; the only difference is where the match stops inside a node: do not split there, return with that node.
        # en1: Lengths are still rounded down to whole pages.
        # hint2: node, matched, ps = self.root, 0, self.page_size；当 len(input_ids) - matched >= ps：
        # hint2: child = node.children.get(self.key_fn(input_ids[matched:]))，None 就 break；same = _match_len(child.key, input_ids[matched:]) // ps * ps；
        # hint2: matched += same；node = child；same < child.length 就 break；最后 return matched, node。
        # en2: node, matched, ps = self.root, 0, self.page_size; while len(input_ids) - matched >= ps:
        # en2: child = node.children.get(self.key_fn(input_ids[matched:])), break on None; same = _match_len(child.key, input_ids[matched:]) // ps * ps;
        # en2: matched += same; node = child; break if same < child.length; finally return matched, node.
        node, matched, ps = self.root, 0, self.page_size
        while len(input_ids) - matched >= ps:
            child = node.children.get(self.key_fn(input_ids[matched:]))
            if child is None:
                break
            same = _match_len(child.key, input_ids[matched:]) // ps * ps
            matched += same
            node = child
            if same < child.length:
                break
        return matched, node
        # <<< TASK

    # ---------------------------------------------------------------- 插入
    # en: ---------------------------------------------------------------- insertion

    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> InsertResult:
        """插入 ``input_ids`` 的整页部分。返回插入前已有的长度，以及覆盖整段（整页部分）的句柄。

        en: Insert the whole-page part of ``input_ids``. Returns the length that was already cached before the insert,
        and a handle covering the whole inserted part (all of its whole pages).
        """
        # >>> TASK insert: 插入 input_ids 的整页部分（连同 indices 里对应的槽位）：树里已有的部分不重复插入，其余挂成一个新叶子——存的是拷贝，不是传进来的视图，时间和这次匹配用的相同（_tick 给的那个时间，匹配到根时根的时间不会刷新）——并计入可驱逐的账；返回 InsertResult（插入前已有的长度, 指向最后一个节点、覆盖整页部分的句柄）。给定：_tree_walk、RadixCacheHandle、self._clock
        # en: insert the whole-page part of input_ids (with the matching slots of indices): what the tree already holds is not inserted again, the rest becomes one new leaf, storing copies rather than the views passed in, with the same time as this walk (the time _tick gave it: a walk that matches nothing ends at the root, whose time is never refreshed), and it counts as evictable; return InsertResult(how much was already cached, a handle ending where the inserted part ends and covering the whole-page part). Given: _tree_walk, RadixCacheHandle, self._clock
        # hint1: 先把 input_ids 和 indices 按页截短，再走一遍树：走到的节点和长度正好告诉你哪些已有、新叶子挂在哪。
        # hint1: 新叶子的时间用 self._clock（_tree_walk 刚 tick 过），不是 0。
        # en1: Cut input_ids and indices down to whole pages, then walk the tree: the node and length it returns tell you what is already there and where the new leaf hangs.
        # en1: The new leaf's time is self._clock (_tree_walk has just ticked), not 0.
        # hint2: 1. insert_len = len(input_ids) // self.page_size * self.page_size；input_ids、indices 都截到 insert_len；
        # hint2: 2. node, prefix_len = self._tree_walk(input_ids)；
        # hint2: 3. prefix_len < insert_len 时：new_node = RadixTreeNode(self.key_fn, self._clock)；new_node.set_key_value(input_ids[prefix_len:].clone(), indices[prefix_len:].clone())；
        # hint2: new_node.set_parent(node)；self.evictable_size += new_node.length；node = new_node；
        # hint2: 4. return InsertResult(prefix_len, RadixCacheHandle(insert_len, node))。
        # en2: 1. insert_len = len(input_ids) // self.page_size * self.page_size; cut input_ids and indices to insert_len;
        # en2: 2. node, prefix_len = self._tree_walk(input_ids);
        # en2: 3. if prefix_len < insert_len: new_node = RadixTreeNode(self.key_fn, self._clock); new_node.set_key_value(input_ids[prefix_len:].clone(), indices[prefix_len:].clone());
        # en2: new_node.set_parent(node); self.evictable_size += new_node.length; node = new_node;
        # en2: 4. return InsertResult(prefix_len, RadixCacheHandle(insert_len, node)).
        insert_len = len(input_ids) // self.page_size * self.page_size
        input_ids, indices = input_ids[:insert_len], indices[:insert_len]
        node, prefix_len = self._tree_walk(input_ids)
        if prefix_len < insert_len:
            new_node = RadixTreeNode(self.key_fn, self._clock)
            new_node.set_key_value(input_ids[prefix_len:].clone(), indices[prefix_len:].clone())
            new_node.set_parent(node)
            self.evictable_size += new_node.length
            node = new_node
        return InsertResult(prefix_len, RadixCacheHandle(insert_len, node))
        # <<< TASK

    # ---------------------------------------------------------------- 加锁与驱逐
    # en: ---------------------------------------------------------------- locking and eviction

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        """从句柄的节点一直到根，每个节点的 ``ref_count`` 加一（解锁减一）；0 与非 0 之间变化时在两本账之间挪长度。

        en: Add one to the ``ref_count`` of every node from the handle's node up to the root (subtract one to unlock);
        when a count changes between 0 and non-zero, move the node's length between the evictable and the protected
        total.
        """
        assert isinstance(handle, RadixCacheHandle)
        # >>> TASK lock: 从句柄所在的节点一路到根（根不算），每个节点的引用计数加一（unlock 时减一）；计数从 0 变成 1 时，这个节点的长度从可驱逐的账挪到受保护的账，从 1 变回 0 时挪回去；给没锁着的节点解锁要抛 RuntimeError
        # en: for every node from the handle's node up to the root (the root excluded), add one to its reference count (subtract one when unlock is set); when a count goes 0 → 1 the node's tokens move from the evictable total to the protected one, and back when it goes 1 → 0; unlocking a node that is not locked raises RuntimeError
        # hint1: 加锁和解锁走同一条路径、方向相反。想清楚“改计数”和“挪账”的先后：加锁时看改之前是不是 0，解锁时看改之后是不是 0。
        # en1: Locking and unlocking walk the same path in opposite directions. Get the order of "change the count" and "move the total" right:
        # en1: when locking, look at whether it was 0 before; when unlocking, whether it is 0 after.
        # hint2: node = handle.node；当 not node.is_root()：
        # hint2: · unlock：node.ref_count <= 0 就抛 RuntimeError；node.ref_count -= 1；变成 0 时 self.evictable_size += node.length，self.protected_size -= node.length；
        # hint2: · 加锁：node.ref_count == 0 时 self.evictable_size -= node.length，self.protected_size += node.length；然后 node.ref_count += 1；
        # hint2: · node = node.parent。
        # en2: node = handle.node; while not node.is_root():
        # en2: · unlock: raise RuntimeError if node.ref_count <= 0; node.ref_count -= 1; when it becomes 0, self.evictable_size += node.length and self.protected_size -= node.length;
        # en2: · lock: when node.ref_count == 0, self.evictable_size -= node.length and self.protected_size += node.length; then node.ref_count += 1;
        # en2: · node = node.parent.
        node = handle.node
        while not node.is_root():
            if unlock:
                if node.ref_count <= 0:
                    raise RuntimeError(tr("Unlocked a node that was not locked: {node}", node=node))
                node.ref_count -= 1
                if node.ref_count == 0:
                    self.evictable_size += node.length
                    self.protected_size -= node.length
            else:
                if node.ref_count == 0:
                    self.evictable_size -= node.length
                    self.protected_size += node.length
                node.ref_count += 1
            node = node.parent
        # <<< TASK

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
        # >>> TASK evict: 驱逐至少 size 个 token，返回腾出来的槽位（拼成一个张量）：每次挑最久没用、没上锁的叶子（根除外），把它从树上摘掉，从可驱逐的账里扣掉；父节点因此成了没上锁的叶子，也就成了候选；够数就停；候选用完还不够就抛 RuntimeError。节点之间可以直接比新旧（__lt__）。给定：_all_nodes
        # en: evict at least size tokens and return the slots set free, as one tensor: each time take the least recently used unlocked leaf (never the root), detach it from the tree and subtract it from the evictable total; a parent that thereby becomes an unlocked leaf joins the candidates; stop once there is enough; if the candidates run out first, raise RuntimeError. Nodes compare by age directly (__lt__). Given: _all_nodes
        # hint1: 候选要一边弹出最旧的、一边加入新的：这正是堆（heapq）擅长的。节点本身就能比较，堆里直接放节点。
        # en1: The candidates keep losing their oldest and gaining new ones: exactly what a heap (heapq) is good at. Nodes compare themselves, so put the nodes in the heap directly.
        # hint2: 1. heap = [n for n in self._all_nodes() if n.is_leaf() and n.ref_count == 0 and not n.is_root()]；heapq.heapify(heap)；
        # hint2: 2. 当 freed < size：heap 空了就抛 RuntimeError；node = heapq.heappop(heap)；del node.parent.children[self.key_fn(node.key)]；
        # hint2: 3. 记下 node.value；freed += node.length；self.evictable_size -= node.length；
        # hint2: 4. parent = node.parent；它不是根、是叶子、ref_count == 0 就 heapq.heappush(heap, parent)；
        # hint2: 5. return torch.cat(记下的各个 value)。
        # en2: 1. heap = [n for n in self._all_nodes() if n.is_leaf() and n.ref_count == 0 and not n.is_root()]; heapq.heapify(heap);
        # en2: 2. while freed < size: raise RuntimeError if heap is empty; node = heapq.heappop(heap); del node.parent.children[self.key_fn(node.key)];
        # en2: 3. keep node.value; freed += node.length; self.evictable_size -= node.length;
        # en2: 4. parent = node.parent; if it is not the root, is a leaf and has ref_count == 0: heapq.heappush(heap, parent);
        # en2: 5. return torch.cat(the values kept).
        heap = [n for n in self._all_nodes() if n.is_leaf() and n.ref_count == 0 and not n.is_root()]
        heapq.heapify(heap)
        evicted: list[torch.Tensor] = []
        freed = 0
        while freed < size:
            if not heap:
                raise RuntimeError(tr(
                    "Eviction fell short: wanted {size}, evicted only {freed}",
                    size=size, freed=freed,
                ))
            node = heapq.heappop(heap)
            assert node.parent is not None
            del node.parent.children[self.key_fn(node.key)]
            evicted.append(node.value)
            freed += node.length
            self.evictable_size -= node.length
            parent = node.parent
            if not parent.is_root() and parent.is_leaf() and parent.ref_count == 0:
                heapq.heappush(heap, parent)
        return torch.cat(evicted)
        # <<< TASK

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
        # >>> TASK check_tree: 重新数一遍整棵树，下面任何一条不成立就抛 RuntimeError：每个子节点都挂在父节点字典里按 key_fn 算出的那一项下，而且它的父指针指回这个父节点（根只查这一条，也不计入两本账）；其余节点非空、长度是 page_size 的整数倍、token 和槽位一样长；引用计数不为负，也不小于子节点计数之和；按引用计数是否为 0 重新累计两本账，和 evictable_size、protected_size 都相等；全树没有重复的槽位。给定：_all_nodes、cached_indices
        # en: count the whole tree again; raise RuntimeError if any of these fails: every child in a node's dict is filed under what key_fn gives for it and points back at that very node (the only rule for the root, which is not counted in the totals); every other node is non-empty, its size a multiple of page_size, with as many slots as tokens; every reference count is non-negative and not below the sum of the counts directly beneath it; recounting the two totals by whether each count is zero gives evictable_size and protected_size; no slot appears twice in the tree. Given: _all_nodes, cached_indices
        # hint1: 只遍历一次：每个节点先查它的子节点挂得对不对，然后根跳过其余的检查。两本账在循环里累计，循环后再比。重复的槽位：torch.unique 之后长度变没变。
        # en1: One pass is enough: for each node first check how its children hang, then skip the remaining checks for the root.
        # en1: Accumulate the two totals in the loop and compare after it. Repeated slots: does the length change after torch.unique?
        # hint2: 1. evictable = protected = 0；for node in self._all_nodes()：
        # hint2: · 每个 (k, child) in node.children.items()：child.parent is not node 或 self.key_fn(child.key) != k 就抛；node.is_root() 就 continue；
        # hint2: · node.length == 0、node.length % self.page_size != 0 或 len(node.value) != node.length 就抛；
        # hint2: · node.ref_count < 0 或 node.ref_count < sum(c.ref_count for c in node.children.values()) 就抛；
        # hint2: · ref_count == 0 时 evictable += node.length，否则 protected += node.length；
        # hint2: 2. (evictable, protected) != (self.evictable_size, self.protected_size) 就抛；
        # hint2: 3. values = self.cached_indices()；len(torch.unique(values)) != len(values) 就抛。消息用 tr(...) 包起来。
        # en2: 1. evictable = protected = 0; for node in self._all_nodes():
        # en2: · for each (k, child) in node.children.items(): raise if child.parent is not node or self.key_fn(child.key) != k; continue if node.is_root();
        # en2: · raise if node.length == 0, node.length % self.page_size != 0 or len(node.value) != node.length;
        # en2: · raise if node.ref_count < 0 or node.ref_count < sum(c.ref_count for c in node.children.values());
        # en2: · if ref_count == 0, evictable += node.length, else protected += node.length;
        # en2: 2. raise if (evictable, protected) != (self.evictable_size, self.protected_size);
        # en2: 3. values = self.cached_indices(); raise if len(torch.unique(values)) != len(values). Wrap the messages in tr(...).
        evictable = protected = 0
        for node in self._all_nodes():
            for k, child in node.children.items():
                if child.parent is not node or self.key_fn(child.key) != k:
                    raise RuntimeError(tr("The radix tree is broken: {child} hangs in the wrong place", child=child))
            if node.is_root():
                continue
            if node.length == 0 or node.length % self.page_size != 0 or len(node.value) != node.length:
                raise RuntimeError(tr(
                    "Wrong node length (must be a positive multiple of page_size={page_size}, with key/value of equal "
                    "length): {node}",
                    page_size=self.page_size, node=node,
                ))
            if node.ref_count < 0 or node.ref_count < sum(c.ref_count for c in node.children.values()):
                raise RuntimeError(tr(
                    "Wrong reference count: the count of {node} is less than the sum of its children's",
                    node=node,
                ))
            if node.ref_count == 0:
                evictable += node.length
            else:
                protected += node.length
        if (evictable, protected) != (self.evictable_size, self.protected_size):
            raise RuntimeError(
                tr(
                    "The books do not balance: recounting gives {evictable} evictable and {protected} protected, but "
                    "the bookkeeping says {evictable_size} and {protected_size}",
                    evictable=evictable, protected=protected,
                    evictable_size=self.evictable_size, protected_size=self.protected_size,
                )
            )
        values = self.cached_indices()
        if len(torch.unique(values)) != len(values):
            raise RuntimeError(tr("The radix tree holds a slot twice: the same page was cached twice"))
        # <<< TASK


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
    # >>> TASK hold_back_shared: 按顺序决定每个提示词留不留下：它和“走在它前面的”（ahead 里的，以及排在它前面、自己没被留下的）里任何一个共有的开头，比它已经命中的长度多出 min_shared 个 token 以上（恰好多 min_shared 个不算），它就留下——那段前缀已经有人在算，它再算一遍是白算。被留下的不算“走在前面”：它这一步不算任何东西。给定：prompts 的顺序、hits
    # en: Decide in order, for each prompt, whether it is held back: it is held when the beginning it shares with anyone "walking ahead of it" (those in ahead, and those before it in prompts that were not held back themselves) is longer than its own hit by more than min_shared tokens (exactly min_shared more does not count): someone is already computing that prefix, and computing it again is wasted. A held-back prompt does not walk ahead of anyone: it computes nothing this step. Given: the order of prompts, hits
    # hint1: 每个提示词要的是“和已经放过去的任何一个最长共有多少”。一个一个去比，代价是放过去的个数乘提示词长度，每个提示词都要付一遍。
    # hint1: 想一种结构，让开头相同的提示词共用比较开头的那份功夫；被留下的不放进去。
    # en1: What each prompt needs is "the longest beginning shared with any prompt already let through". Comparing one by one costs the number let through
    # en1: times the prompt length, paid again for every prompt. Think of a structure in which prompts that begin alike share the work of comparing that
    # en1: beginning; held-back prompts are not put in.
    # hint2: 一棵按块分支的前缀树（字典套字典，每层一块 16 个 token，比每层一个 token 浅得多），放过去的提示词都存进去。
    # hint2: root = {}；blocks(ids) 把 ids.tolist() 切成 16 个一块的元组；add(ids)：node = root，对每块 node = node.setdefault(块, {})；
    # hint2: shared(ids)：沿块往下走，累计走过的 token 数，某块不在 node 里就加上它和 node 里各块开头相同个数的最大值，返回；
    # hint2: 先 add 每个 ahead；然后对每个 (ids, hit)：held = shared(ids) - hit > min_shared；没留下就 add(ids)；收集 held。
    # en2: A prefix tree branching on blocks (nested dicts, one block of 16 tokens per level: much shallower than one token per level) holding every prompt let through.
    # en2: root = {}; blocks(ids) cuts ids.tolist() into tuples of 16; add(ids): node = root, and for each block node = node.setdefault(block, {});
    # en2: shared(ids): walk down block by block counting the tokens passed; when a block is not in node, add the largest count of equal leading tokens against the blocks in node and return;
    # en2: add every ahead first; then for each (ids, hit): held = shared(ids) - hit > min_shared; add(ids) unless held; collect held.
    block = 16
    root: dict[tuple[int, ...], dict] = {}

    def blocks(ids: torch.Tensor) -> list[tuple[int, ...]]:
        flat = ids.tolist()
        return [tuple(flat[i : i + block]) for i in range(0, len(flat), block)]

    def add(ids: torch.Tensor) -> None:
        node = root
        for b in blocks(ids):
            node = node.setdefault(b, {})

    def common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    def shared(ids: torch.Tensor) -> int:
        node, total = root, 0
        for b in blocks(ids):
            if b not in node:
                return total + max((common(b, other) for other in node), default=0)
            node, total = node[b], total + len(b)
        return total

    for ids in ahead:
        add(ids)
    held = []
    for ids, hit in zip(prompts, hits):
        held.append(shared(ids) - hit > min_shared)
        if not held[-1]:
            add(ids)
    return held
    # <<< TASK


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
