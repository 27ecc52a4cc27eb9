"""n-gram 草稿（SGLang 的 ``--speculative-algorithm NGRAM``）：从已经见过的 token 里猜接下来的几个。

投机解码先便宜地猜几个 token，再让目标模型一次前向把它们全部验证。n-gram 的猜法不要任何训练过的权重：
一棵所有请求共用的前缀树记下见过的每一段 token（提示词和输出都算，跨请求共享），一段序列的最后几个 token
（匹配窗口）在树里出现过，它们后面跟过什么，就猜什么。

- 树里存的路径：从每个位置起，最多 ``max_window + branch_length`` 个 token（一个匹配窗口，加上最多
  ``branch_length`` 个后续）；
- 猜：从最长的窗口（``max_window``）试到最短的（``min_window``），第一个在树里出现过、后面还有 token 的窗口胜出；
  它下面的子树按广度优先取最多 ``num_draft`` 个 token，每个节点最多展开 ``breadth`` 个孩子，新近出现过的先；
  窗口越长越可信，``breadth`` 从 ``max_breadth``（最短的窗口）线性地收窄到 ``min_breadth``（最长的窗口）；
- 容量：树的节点数超过 ``capacity`` 时，最久没被写到的叶子先删（删到容量的九成，摊薄删的代价）；
- 猜的时候只读，不改树。

草稿是一棵树（:class:`DraftTree`）：``breadth`` 为 1 时是一条链。验证见 :mod:`minisgl.spec_tree`。

en: n-gram drafts (SGLang's ``--speculative-algorithm NGRAM``): guess the next few tokens from tokens already seen.

Speculative decoding guesses a few tokens cheaply, then lets the target model verify all of them in one forward. The
n-gram guess needs no trained weights: a prefix tree shared by all requests records every run of tokens seen (prompts
and outputs alike, across requests); when the last few tokens of a sequence (the match window) occurred before, what
followed them then is the guess.

- the paths the tree holds: from every position, at most ``max_window + branch_length`` tokens (a match window plus at
  most ``branch_length`` tokens after it);
- guessing: windows are tried from the longest (``max_window``) down to the shortest (``min_window``); the first one
  found in the tree with tokens after it wins, and its subtree is walked breadth first for at most ``num_draft`` tokens,
  each node expanding at most ``breadth`` children, the most recently seen first; a longer window is more trustworthy,
  so ``breadth`` narrows linearly from ``max_breadth`` (the shortest window) to ``min_breadth`` (the longest);
- capacity: when the tree holds more than ``capacity`` nodes, the leaves written longest ago go first (down to nine
  tenths of the capacity, spreading the cost of deleting);
- guessing only reads the tree.

A draft is a tree (:class:`DraftTree`); with ``breadth`` 1 it is a chain. Verification: :mod:`minisgl.spec_tree`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

from minisgl.i18n import tr


@dataclass(frozen=True)
class DraftTree:
    """一棵草稿树，广度优先的顺序：``tokens[i]`` 的父节点是 ``parents[i]``（``-1`` 是已经验证过的最后一个 token，
    也就是树根；父节点总排在孩子前面；同一个父节点的孩子 token 各不相同，前缀树的孩子本来就是这样）。

    en: A draft tree in breadth-first order: the parent of ``tokens[i]`` is ``parents[i]`` (``-1`` is the last verified
    token, the root; a parent always comes before its children; the children of one parent carry distinct tokens, as a
    prefix tree's children do).
    """

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)

    def depths(self) -> list[int]:
        """每个草稿 token 离树根多远（树根的孩子是 1）。

        en: How far each draft token is from the root (the root's children are at 1).
        """
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out


class _Node:
    __slots__ = ("children", "parent", "token", "stamp")

    def __init__(self, parent: _Node | None, token: int, stamp: int) -> None:
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.token = token
        self.stamp = stamp


class NgramCache:
    """所有请求共用的 n-gram 前缀树。参数是 SGLang 的同名参数（``--speculative-ngram-*``、
    ``--speculative-num-draft-tokens``）；``num_draft`` 是一次最多猜几个 token。

    en: The n-gram prefix tree all requests share. The parameters are SGLang's of the same names
    (``--speculative-ngram-*``, ``--speculative-num-draft-tokens``); ``num_draft`` is the most tokens one guess makes.
    """

    def __init__(self, *, min_window: int = 1, max_window: int = 12, min_breadth: int = 1, max_breadth: int = 10,
                 branch_length: int = 18, capacity: int = 1_000_000, num_draft: int = 12) -> None:
        check_ngram_args(min_window, max_window, min_breadth, max_breadth, branch_length, capacity, num_draft)
        self.min_window, self.max_window = min_window, max_window
        self.min_breadth, self.max_breadth = min_breadth, max_breadth
        self.branch_length, self.capacity, self.num_draft = branch_length, capacity, num_draft
        self.root = _Node(None, -1, 0)
        self.size = 0  # 树根以外的节点数 | en: nodes besides the root
        self._clock = 0

    def put(self, tokens: Sequence[int], since: int = 0) -> None:
        """把 ``tokens`` 里含有第 ``since`` 个及以后 token 的路径写进树（``since`` 之前的已经写过）。一个请求每多出几个
        token 就调用一次，``since`` 是上一次调用时的长度。

        en: Write into the tree the paths of ``tokens`` that contain a token at index ``since`` or later (those before were
        written already). Call it whenever a request gains tokens, with ``since`` its length at the previous call.
        """
        span = self.max_window + self.branch_length
        for start in range(max(0, since - span + 1), len(tokens)):
            self._clock += 1  # 越靠后写的越新 | en: the later a path starts, the more recent
            node = self.root
            for token in tokens[start : start + span]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node(node, token, self._clock)
                    self.size += 1
                else:
                    child.stamp = self._clock
                node = child
        if self.size > self.capacity:
            self._evict(self.capacity * 9 // 10)

    def propose(self, tokens: Sequence[int]) -> DraftTree:
        """按 ``tokens`` 的最后几个 token 猜一棵草稿树（找不到就是空树）。只读。

        en: Guess a draft tree from the last few tokens of ``tokens`` (empty when nothing matches). Read-only.
        """
        for window in range(min(self.max_window, len(tokens)), self.min_window - 1, -1):
            node: _Node | None = self.root
            for token in tokens[len(tokens) - window :]:
                node = node.children.get(token)
                if node is None:
                    break
            if node is not None and node.children:
                return self._bfs(node, self._breadth(window))
        return DraftTree()

    def _breadth(self, window: int) -> int:
        if self.max_window == self.min_window:
            return self.min_breadth
        frac = (window - self.min_window) / (self.max_window - self.min_window)
        return round(self.max_breadth - frac * (self.max_breadth - self.min_breadth))

    def _bfs(self, start: _Node, breadth: int) -> DraftTree:
        tokens: list[int] = []
        parents: list[int] = []
        frontier = [(start, -1)]
        while frontier and len(tokens) < self.num_draft:
            nxt = []
            for node, index in frontier:
                kids = sorted(node.children.values(), key=lambda c: -c.stamp)[:breadth]
                for kid in kids:
                    if len(tokens) == self.num_draft:
                        break
                    tokens.append(kid.token)
                    parents.append(index)
                    nxt.append((kid, len(tokens) - 1))
            frontier = nxt
        return DraftTree(tuple(tokens), tuple(parents))

    def _evict(self, target: int) -> None:
        """删最久没被写到的叶子，直到节点数不超过 ``target``；叶子删掉后父节点成了叶子，也进候选。

        en: Delete the leaves written longest ago until at most ``target`` nodes remain; a parent left without children
        becomes a candidate too.
        """
        heap = [(n.stamp, id(n), n) for n in self._nodes() if not n.children]
        heapq.heapify(heap)
        while self.size > target and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.token]
            self.size -= 1
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.stamp, id(parent), parent))

    def _nodes(self) -> list[_Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out


def check_ngram_args(min_window: int, max_window: int, min_breadth: int, max_breadth: int, branch_length: int,
                     capacity: int, num_draft: int) -> None:
    """不合理的参数在启动之前就拒绝（ValueError），消息说出是哪一个、要什么。

    en: Refuse unreasonable parameters before anything starts (ValueError), saying which one and what it needs.
    """
    if not 1 <= min_window <= max_window:
        raise ValueError(tr("The n-gram match windows need 1 <= min <= max, got min={lo} and max={hi} "
                            "(--speculative-ngram-min-match-window-size / --speculative-ngram-max-match-window-size)",
                            lo=min_window, hi=max_window))
    if not 1 <= min_breadth <= max_breadth:
        raise ValueError(tr("The n-gram BFS breadths need 1 <= min <= max, got min={lo} and max={hi} "
                            "(--speculative-ngram-min-bfs-breadth / --speculative-ngram-max-bfs-breadth)",
                            lo=min_breadth, hi=max_breadth))
    for name, value in (("--speculative-ngram-branch-length", branch_length), ("--speculative-ngram-capacity", capacity),
                        ("--speculative-num-draft-tokens", num_draft)):
        if value < 1:
            raise ValueError(tr("{name} must be at least 1, got {value}", name=name, value=value))
