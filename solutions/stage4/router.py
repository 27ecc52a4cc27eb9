"""第 4.6 章 router：数据并行——几个完整的副本，前面一个记得“谁算过什么”的路由器。

模型放得进一张卡（一个进程）时，扩容最简单的办法是多起几个一模一样的副本（``--dp N``），各自有调度器和 KV 缓存，
前面一个路由器把请求分给它们。分法决定了前缀缓存还有没有用：同一段系统提示词的请求若轮流发给两个副本，两边都要把
它预填充一遍；都发给同一个，只有第一个请求要算。可路由器看不见副本里的基数树，它只能**猜**：

- 每个副本一棵**近似的前缀树**（:class:`PrefixTree`），存的是路由器发给它的请求的文字（不是 token：路由器不分词）。
  请求发给谁，就把它的文字插进谁的树；树太大时按最近最少使用（LRU）删掉叶子，就像副本自己的缓存也会被挤掉；
- **缓存感知**（:class:`CacheAware`）：新请求在每棵树里找最长的公共前缀，匹配的比例超过 ``cache_threshold`` 就发给
  匹配最长的副本（它多半还缓存着）；否则发给手上请求最少的副本（一样多时挑树最小的——缓存里空位最多）；
- **负载不均时**（:func:`is_imbalanced`：最多与最少之差超过 ``balance_abs_threshold``，**并且**最多超过最少的
  ``balance_rel_threshold`` 倍）缓存让位，发给队列最短的副本：缓存命中省下的预填充，抵不过在长队里干等。

两个对照的策略：轮流（:class:`RoundRobin`）和最短队列（:class:`ShortestQueue`）。三者都只做一件事：
``choose(文字, 负载)`` 从活着的副本里挑一个。转发请求、数在途的请求、副本死了怎么办，都在给定的 ``minisgl/dp_router.py``。

en: Chapter 4.6 router: data parallelism — several whole replicas, with a router in front that remembers "who computed
what".

When the model fits one device (one process), the simplest way to scale is to start several identical replicas
(``--dp N``), each with its own scheduler and KV cache, and a router in front that deals the requests out. How it deals
decides whether the prefix cache still helps: requests sharing one system prompt dealt in turn to two replicas make both
prefill it; sent to the same one, only the first request computes it. But the router cannot see the replicas' radix
trees; it can only **guess**:

- per replica an **approximate prefix tree** (:class:`PrefixTree`) of the text of the requests the router sent it (not
  tokens: the router does not tokenize). A request's text goes into the tree of the replica it was sent to; when a tree
  grows too big its least recently used (LRU) leaves go, as the replica's own cache would push them out;
- **cache-aware** (:class:`CacheAware`): look up the longest common prefix of the new request in every tree; when the
  matched share is above ``cache_threshold``, send it to the replica with the longest match (it most likely still has it
  cached); otherwise to the replica with the fewest requests in hand (on a tie the smallest tree: the most room in its
  cache);
- **when the load is imbalanced** (:func:`is_imbalanced`: the most and the fewest differ by more than
  ``balance_abs_threshold`` **and** the most is above ``balance_rel_threshold`` times the fewest) the cache gives way and
  the shortest queue wins: the prefill a cache hit saves does not pay for waiting in a long queue.

Two policies to compare with: in turn (:class:`RoundRobin`) and shortest queue (:class:`ShortestQueue`). All three do one
thing: ``choose(text, loads)`` picks one of the live replicas. Forwarding requests, counting those in flight and what
happens when a replica dies live in the given ``minisgl/dp_router.py``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from minisgl.i18n import tr
from minisgl.serving import ROUTER_POLICIES

#: 匹配的比例超过它才按缓存路由（SGLang 路由器的缺省值）。
#: en: Route by the cache only when the matched share is above this (SGLang's router default).
CACHE_THRESHOLD = 0.5
#: 负载之差超过它（个请求）才可能算不均（SGLang 的缺省值）。
#: en: The load may count as imbalanced only when the difference is above this many requests (SGLang's default).
BALANCE_ABS_THRESHOLD = 32
#: 最多的负载超过最少的这么多倍才可能算不均（SGLang 的缺省值）。
#: en: The load may count as imbalanced only when the most is above this many times the fewest (SGLang's default).
BALANCE_REL_THRESHOLD = 1.0001
#: 每棵树最多存多少个字符，超过就按 LRU 删叶子。
#: en: The most characters one tree keeps; beyond it least recently used leaves go.
MAX_TREE_CHARS = 1 << 22


def common_prefix_len(a: str, b: str) -> int:
    """``a`` 与 ``b`` 开头有几个字符相同。

    en: How many characters ``a`` and ``b`` share at the start.
    """
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Node:
    """前缀树的一个节点：从父节点到它的那条边上的文字 ``text``、按首字符索引的孩子、最近一次用到它的时刻。

    en: A node of the prefix tree: the text ``text`` on the edge from its parent, its children indexed by their first
    character, and when it was last used.
    """

    __slots__ = ("text", "parent", "children", "last_used")

    def __init__(self, text: str, parent: Node | None, last_used: int) -> None:
        self.text = text
        self.parent = parent
        self.children: dict[str, Node] = {}
        self.last_used = last_used


class PrefixTree:
    """一个副本的近似前缀树（按字符的基数树）：``match`` 找最长的公共前缀，``insert`` 记下一段文字，``evict`` 按 LRU
    删叶子。时刻是一个逐次加一的计数器（不是钟表时间：同一毫秒里的两次插入也分得出先后）。``size`` 是树里的字符数。

    en: One replica's approximate prefix tree (a radix tree over characters): ``match`` finds the longest common prefix,
    ``insert`` notes a text, ``evict`` removes least recently used leaves. Time is a counter that goes up by one per
    insert (not the clock: two inserts in the same millisecond still have an order). ``size`` is the number of
    characters in the tree.
    """

    def __init__(self) -> None:
        self.root = Node("", None, 0)
        self.size = 0
        self.clock = 0

    def match(self, text: str) -> int:
        """树里存过的文字与 ``text`` 最长的公共前缀有几个字符（不改动树，也不算一次“用到”）。

        en: The length in characters of the longest common prefix of ``text`` with any text stored in the tree (changes
        nothing, and does not count as a use).
        """
        # >>> TASK prefix_match: 从根往下走：按 text 下一个字符找孩子，比较那条边上的文字，整条边都相同才继续往下，在中途分岔就停下
        # en: walk down from the root: find the child by text's next character, compare the text on that edge, go on down only when the whole edge matches, stop where it forks midway
        node, i = self.root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                break
            n = common_prefix_len(child.text, text[i:])
            i += n
            if n < len(child.text):
                break
            node = child
        return i
        # <<< TASK

    def insert(self, text: str) -> None:
        """记下 ``text``：已有的前缀共用节点，在边的中途分岔时把那条边拆成两段；路上经过的每个节点都记为此刻用过。

        en: Note ``text``: the prefix already there shares its nodes; where it forks midway along an edge that edge is
        split in two; every node passed on the way is marked as used now.
        """
        self.clock += 1
        # >>> TASK tree_insert: 像 match 一样往下走；没有孩子就挂上剩下的文字作一个新叶子（size 加上它的长度）；只有边的前一段相同时，先在相同处把边拆开（中间插一个节点），再往下走；经过的节点（根除外：它永远不删）last_used 都改成 self.clock
        # en: walk down as match does; with no child, hang the rest of the text as a new leaf (size grows by its length); when only the start of an edge matches, first split the edge there (a node in between), then go on; every node passed (but the root: it is never removed) gets last_used = self.clock
        node, i = self.root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                node.children[text[i]] = Node(text[i:], node, self.clock)
                self.size += len(text) - i
                return
            n = common_prefix_len(child.text, text[i:])
            if n < len(child.text):
                mid = Node(child.text[:n], node, self.clock)
                child.text, child.parent = child.text[n:], mid
                mid.children[child.text[0]] = child
                node.children[text[i]] = mid
                child = mid
            child.last_used = self.clock
            node, i = child, i + n
        # <<< TASK

    def evict(self, max_chars: int) -> int:
        """删掉最久没用过的叶子，直到树里不多于 ``max_chars`` 个字符；叶子删了以后父节点成了叶子，它也排进候选。
        返回删掉的字符数。

        en: Remove the least recently used leaves until the tree holds at most ``max_chars`` characters; a parent left
        without children becomes a candidate too. Returns the number of characters removed.
        """
        # >>> TASK tree_evict: 把所有叶子（没有孩子、不是根）按 last_used 放进一个小顶堆；每次取出最旧的，从父节点的 children 里去掉、size 减去它的长度；父节点因此没了孩子（又不是根）就也放进堆
        # en: put every leaf (no children, not the root) in a min-heap by last_used; each time take the oldest out, remove it from its parent's children and subtract its length from size; a parent left without children (and not the root) goes into the heap too
        removed = 0
        heap = [(n.last_used, id(n), n) for n in self._nodes() if not n.children]
        heapq.heapify(heap)
        while self.size > max_chars:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.text[0]]
            self.size -= len(leaf.text)
            removed += len(leaf.text)
            if not parent.children and parent is not self.root:
                heapq.heappush(heap, (parent.last_used, id(parent), parent))
        return removed
        # <<< TASK

    def _nodes(self) -> Iterable[Node]:
        """除根以外的每个节点。

        en: Every node but the root.
        """
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def is_imbalanced(loads: Iterable[int], abs_threshold: int, rel_threshold: float) -> bool:
    """负载不均吗：最多与最少之差超过 ``abs_threshold``，并且最多的超过最少的 ``rel_threshold`` 倍（两条都要）。

    en: Is the load imbalanced: the most and the fewest differ by more than ``abs_threshold``, and the most is above
    ``rel_threshold`` times the fewest (both must hold).
    """
    # >>> TASK imbalanced: 两个条件都是“严格大于”；没有负载（空）时不算不均
    # en: both conditions are "strictly greater"; no loads (empty) is not imbalanced
    values = list(loads)
    if not values:
        return False
    most, fewest = max(values), min(values)
    return most - fewest > abs_threshold and most > rel_threshold * fewest
    # <<< TASK


def _check_loads(loads: Mapping[int, int]) -> None:
    if not loads:
        raise RuntimeError(tr("No replica is alive to take the request"))


class RoundRobin:
    """轮流：活着的副本按编号一个接一个，不看文字也不看负载。

    en: In turn: the live replicas one after another by number, looking at neither the text nor the load.
    """

    name = "round_robin"

    def __init__(self, num_replicas: int) -> None:
        self.num_replicas = num_replicas
        self.next = 0

    def choose(self, text: str, loads: Mapping[int, int]) -> int:
        """从 ``loads``（活着的副本 → 它手上的请求数）里挑一个副本。

        en: Pick a replica from ``loads`` (live replica -> the requests it has in hand).
        """
        _check_loads(loads)
        replica = min(loads, key=lambda r: (r - self.next) % self.num_replicas)  # 从 next 起第一个活着的 | en: the first live one from next on
        self.next = replica + 1
        return replica

    def forget(self, replica: int) -> None:
        """副本 ``replica`` 死了：忘掉关于它的一切（轮流不记任何东西）。

        en: Replica ``replica`` died: forget everything about it (in turn remembers nothing).
        """


class ShortestQueue:
    """最短队列：手上请求最少的副本；一样少时编号小的。

    en: Shortest queue: the replica with the fewest requests in hand; on a tie the lower number.
    """

    name = "shortest_queue"

    def __init__(self, num_replicas: int) -> None:
        self.num_replicas = num_replicas

    def choose(self, text: str, loads: Mapping[int, int]) -> int:
        _check_loads(loads)
        # >>> TASK shortest_queue: 负载最小的那个；一样时编号最小的
        # en: the one with the smallest load; on a tie the lowest number
        return min(loads, key=lambda r: (loads[r], r))
        # <<< TASK

    def forget(self, replica: int) -> None:
        """最短队列不记任何东西。

        en: Shortest queue remembers nothing.
        """


class CacheAware:
    """缓存感知：每个副本一棵 :class:`PrefixTree`；负载均衡时按前缀匹配路由，不均时按最短队列；发给谁就把文字插进
    谁的树，再把那棵树修剪到 ``max_tree_chars`` 以内。

    en: Cache-aware: one :class:`PrefixTree` per replica; route by prefix match while the load is balanced, by the
    shortest queue while it is not; the text goes into the tree of the replica it is sent to, and that tree is then
    trimmed to ``max_tree_chars``.
    """

    name = "cache_aware"

    def __init__(self, num_replicas: int, *, cache_threshold: float = CACHE_THRESHOLD,
                 balance_abs_threshold: int = BALANCE_ABS_THRESHOLD, balance_rel_threshold: float = BALANCE_REL_THRESHOLD,
                 max_tree_chars: int = MAX_TREE_CHARS) -> None:
        self.num_replicas = num_replicas
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.max_tree_chars = max_tree_chars
        self.trees = [PrefixTree() for _ in range(num_replicas)]

    def choose(self, text: str, loads: Mapping[int, int]) -> int:
        _check_loads(loads)
        # >>> TASK cache_aware_choice: 负载不均（is_imbalanced，用本对象的两个门槛）时取负载最小的；否则在每个活着的副本的树里 match，匹配字符数 ÷ 文字长度超过 cache_threshold 就取匹配最长的（一样长时负载小的、再编号小的），不然取负载最小的（一样时树小的、再编号小的）；最后把 text 插进选中副本的树并 evict 到 max_tree_chars
        # en: when the load is imbalanced (is_imbalanced with this object's two thresholds) take the smallest load; otherwise match in every live replica's tree: when matched characters ÷ text length is above cache_threshold take the longest match (ties: smaller load, then lower number), else the smallest load (ties: smaller tree, then lower number); finally insert text into the chosen replica's tree and evict it down to max_tree_chars
        if is_imbalanced(loads.values(), self.balance_abs_threshold, self.balance_rel_threshold):
            chosen = min(loads, key=lambda r: (loads[r], r))
        else:
            matched = {r: self.trees[r].match(text) for r in loads}
            best = min(loads, key=lambda r: (-matched[r], loads[r], r))
            if text and matched[best] / len(text) > self.cache_threshold:
                chosen = best
            else:
                chosen = min(loads, key=lambda r: (loads[r], self.trees[r].size, r))
        self.trees[chosen].insert(text)
        self.trees[chosen].evict(self.max_tree_chars)
        return chosen
        # <<< TASK

    def forget(self, replica: int) -> None:
        """副本死了，它缓存的东西也没了：换一棵空树（它不会再被选中，树只是不再占内存）。

        en: The replica died and its cache with it: a fresh empty tree (it will not be chosen again; the tree just stops
        taking memory).
        """
        self.trees[replica] = PrefixTree()


Policy = RoundRobin | ShortestQueue | CacheAware


def make_policy(name: str, num_replicas: int, **thresholds: float) -> Policy:
    """按名字（``--router-policy``）造一个策略；``thresholds`` 只给缓存感知（没给的用缺省值）。

    en: Make a policy by name (``--router-policy``); ``thresholds`` are for cache-aware only (defaults where not given).
    """
    if name == "cache_aware":
        return CacheAware(num_replicas, **thresholds)  # type: ignore[arg-type]
    if name == "round_robin":
        return RoundRobin(num_replicas)
    if name == "shortest_queue":
        return ShortestQueue(num_replicas)
    raise ValueError(tr("Unknown router policy {name!r}; choose one of {names}", name=name, names=", ".join(ROUTER_POLICIES)))
