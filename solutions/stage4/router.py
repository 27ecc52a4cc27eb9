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
``choose(文字, 负载)`` 从活着的副本里挑一个。转发请求、数在途的请求、副本死了怎么办，都在给定的 ``minisgl/server/dp_router.py``。

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
happens when a replica dies live in the given ``minisgl/server/dp_router.py``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from minisgl.i18n import tr
from minisgl.server.args import ROUTER_POLICIES

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
        # >>> TASK prefix_match: 返回树里存过的任何文字与 text 的最长公共前缀有几个字符；公共前缀可以停在一条边的中途。不改动树，也不算一次“用到”（last_used 一个都不变）。给定：common_prefix_len
        # en: return how many characters the longest common prefix of text with any text stored in the tree has; it may end midway along an edge. Change nothing in the tree, and do not count it as a use (no last_used changes). Given: common_prefix_len
        # hint1: 孩子是按边上文字的第一个字符索引的，所以每一步最多只有一条边可走。一条边只对上了前一段，就停在那里
        # en1: Children are indexed by the first character of their edge, so at each step at most one edge can be followed.
        # en1: When only the start of an edge matches, stop there
        # hint2: 1. node, i = self.root, 0；
        # hint2: 2. while i < len(text)：child = node.children.get(text[i])，是 None 就 break；
        # hint2: 3.   n = common_prefix_len(child.text, text[i:])；i += n；n < len(child.text)（中途分岔）就 break；否则 node = child；
        # hint2: 4. return i。
        # en2: 1. node, i = self.root, 0;
        # en2: 2. while i < len(text): child = node.children.get(text[i]); break if it is None;
        # en2: 3.   n = common_prefix_len(child.text, text[i:]); i += n; break if n < len(child.text) (forks midway); else node = child;
        # en2: 4. return i.
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
        # >>> TASK tree_insert: 记下 text：已有的前缀共用已有的节点；在一条边的中途分岔时，把那条边在分岔处拆成两段（中间多一个节点，字符一个不多）；新挂上的叶子让 size 加上它的字符数。路上经过的每个节点都把 last_used 记成 self.clock（进来时已经加过一）
        # en: note text: the prefix already there shares the nodes already there; where it forks midway along an edge, split that edge in two at the fork (one more in between, not a character more); a newly hung leaf adds its characters to size. Every one passed on the way gets last_used set to self.clock (already advanced on entry)
        # hint1: 走法和 match 一样，只多两种情形：没有能走的边时挂一个叶子就完了；边只对上前一段时，先拆边再接着走。拆边要改三处链接：新节点挂到父亲下，
        # hint1: 原来的孩子挂到新节点下、它的文字只剩后一段
        # en1: Walk as match does, with two extra cases: no edge to follow means hang a leaf and you are done;
        # en1: an edge matching only at its start is split first, then the walk goes on. A split changes three links: the new node under the parent,
        # en1: the old child under the new node with only the rest of its text
        # hint2: 1. node, i = self.root, 0；while i < len(text)：child = node.children.get(text[i])；
        # hint2: 2.   child 是 None：node.children[text[i]] = Node(text[i:], node, self.clock)；self.size += len(text) - i；return；
        # hint2: 3.   n = common_prefix_len(child.text, text[i:])；n < len(child.text) 时拆边：mid = Node(child.text[:n], node, self.clock)；
        # hint2:      child.text, child.parent = child.text[n:], mid；mid.children[child.text[0]] = child；node.children[text[i]] = mid；child = mid；
        # hint2: 4.   child.last_used = self.clock；node, i = child, i + n。
        # en2: 1. node, i = self.root, 0; while i < len(text): child = node.children.get(text[i]);
        # en2: 2.   if child is None: node.children[text[i]] = Node(text[i:], node, self.clock); self.size += len(text) - i; return;
        # en2: 3.   n = common_prefix_len(child.text, text[i:]); if n < len(child.text), split: mid = Node(child.text[:n], node, self.clock);
        # en2:      child.text, child.parent = child.text[n:], mid; mid.children[child.text[0]] = child; node.children[text[i]] = mid; child = mid;
        # en2: 4.   child.last_used = self.clock; node, i = child, i + n.
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
        # >>> TASK tree_evict: 按 last_used 从旧到新删叶子，直到 size 不超过 max_chars；一个节点的孩子都删光了，它自己也成了候选（根永远不删）。返回删掉的字符数；evict(0) 要把树删成只剩一个空根。给定：_nodes
        # en: delete leaves oldest last_used first until size is at most max_chars; a node with nothing left below it becomes a candidate itself (the root is never deleted). Return the number of characters deleted; evict(0) must leave nothing but an empty root. Given: _nodes
        # hint1: “每次取最旧的一个、中途还会加进新的候选”正是小顶堆的用处；时刻相同时堆会去比较节点本身，放一个唯一的数在中间挡住它
        # en1: 'Always take the oldest, with new candidates arriving midway' is what a min-heap is for;
        # en1: on equal times the heap would compare the nodes themselves, so put a unique number in between
        # hint2: 1. removed = 0；heap = [(n.last_used, id(n), n) for n in self._nodes() if not n.children]；heapq.heapify(heap)；
        # hint2: 2. while self.size > max_chars：_, _, leaf = heapq.heappop(heap)；parent = leaf.parent；del parent.children[leaf.text[0]]；
        # hint2: 3.   self.size -= len(leaf.text)；removed += len(leaf.text)；
        # hint2: 4.   not parent.children and parent is not self.root 时 heapq.heappush(heap, (parent.last_used, id(parent), parent))；
        # hint2: 5. return removed。
        # en2: 1. removed = 0; heap = [(n.last_used, id(n), n) for n in self._nodes() if not n.children]; heapq.heapify(heap);
        # en2: 2. while self.size > max_chars: _, _, leaf = heapq.heappop(heap); parent = leaf.parent; del parent.children[leaf.text[0]];
        # en2: 3.   self.size -= len(leaf.text); removed += len(leaf.text);
        # en2: 4.   if not parent.children and parent is not self.root: heapq.heappush(heap, (parent.last_used, id(parent), parent));
        # en2: 5. return removed.
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
    # >>> TASK imbalanced: 返回负载是否不均：最大与最小之差严格大于绝对门槛，并且最大严格大于最小的相对门槛倍，两条都要成立。loads 可能是生成器或字典的值视图；没有负载时不算不均
    # en: return whether the load is imbalanced: the largest and the smallest differ by strictly more than the absolute threshold, and the largest is strictly above the relative threshold times the smallest; both must hold. loads may be a generator or a dict view; no loads at all is not imbalanced
    # hint1: 最大、最小都要用，而生成器只能走一遍：先把它变成列表
    # en1: You need both the largest and the smallest, and a generator can be walked once only: make it a list first
    # hint2: 1. values = list(loads)；空的 return False；
    # hint2: 2. most, fewest = max(values), min(values)；
    # hint2: 3. return most - fewest > abs_threshold and most > rel_threshold * fewest。
    # en2: 1. values = list(loads); if empty, return False;
    # en2: 2. most, fewest = max(values), min(values);
    # en2: 3. return most - fewest > abs_threshold and most > rel_threshold * fewest.
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
        # >>> TASK shortest_queue: 返回手上请求最少的那个活着的副本；一样少时编号小的。只在活着的副本里挑
        # en: return the live replica with the fewest requests in hand; on a tie the lower number. Pick among the live replicas only
        # hint1: min 可以按一个元组比较：先比的放前面
        # en1: min can compare by a tuple: what is compared first goes first
        # hint2: return min(loads, key=lambda r: (loads[r], r))
        # en2: return min(loads, key=lambda r: (loads[r], r))
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
        # >>> TASK cache_aware_choice: 返回选中的活着的副本，并把 text 记进它的树、再把那棵树修剪到 max_tree_chars 以内。负载不均（is_imbalanced，用本对象上的两个门槛，不是模块常量）时取负载最小的（一样时编号小的）；否则看各活着副本的树与 text 的最长匹配：最长的（一样长时负载小的、再编号小的）匹配比例严格大于 cache_threshold 就选它，不然取负载最小的（一样时树小的、再编号小的）。空的 text 当作什么都没匹配上
        # en: return the live replica picked, after noting text in its tree and trimming that tree to max_tree_chars. When the load is imbalanced (is_imbalanced with this object's two thresholds, not the module constants) take the smallest load (ties: lower number); otherwise look at each live replica's longest prefix in common with text: if the longest (ties: smaller load, then lower number) covers a share of text strictly above cache_threshold, pick it, else the smallest load (ties: smaller tree, then lower number). An empty text counts as matching nothing
        # hint1: 三种“最小”都能写成按一个元组取 min：要最长的匹配，就把匹配长度取负放在元组最前面。比例的分母是文字长度，空文字不能去除
        # en1: All three 'smallest' picks are a min over a tuple: for the longest match, put the negated match length first.
        # en1: The share is divided by the text's length, so never divide by the length of an empty text
        # hint2: 1. is_imbalanced(loads.values(), self.balance_abs_threshold, self.balance_rel_threshold) 时 chosen = min(loads, key=lambda r: (loads[r], r))；
        # hint2: 2. 否则 matched = {r: self.trees[r].match(text) for r in loads}；best = min(loads, key=lambda r: (-matched[r], loads[r], r))；
        # hint2: 3.   text and matched[best] / len(text) > self.cache_threshold 时 chosen = best，否则 chosen = min(loads, key=lambda r: (loads[r], self.trees[r].size, r))；
        # hint2: 4. self.trees[chosen].insert(text)；self.trees[chosen].evict(self.max_tree_chars)；return chosen。
        # en2: 1. if is_imbalanced(loads.values(), self.balance_abs_threshold, self.balance_rel_threshold): chosen = min(loads, key=lambda r: (loads[r], r));
        # en2: 2. else matched = {r: self.trees[r].match(text) for r in loads}; best = min(loads, key=lambda r: (-matched[r], loads[r], r));
        # en2: 3.   chosen = best if text and matched[best] / len(text) > self.cache_threshold, else min(loads, key=lambda r: (loads[r], self.trees[r].size, r));
        # en2: 4. self.trees[chosen].insert(text); self.trees[chosen].evict(self.max_tree_chars); return chosen.
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
