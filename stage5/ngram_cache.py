# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint ngram_cache <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint ngram_cache <task>` gives the next hint.
"""第 5.1 章 ngram_cache：起草——n-gram 缓存（SGLang 的 ``--speculative-algorithm NGRAM``）从已经见过的 token 里猜接下来的几个。

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

草稿是一棵树（:class:`DraftTree`）：``breadth`` 为 1 时是一条链。验证见第 5.2 章 :mod:`minisgl.spec_tree`。
投机的主循环（第 5.3 章）只通过 :class:`Drafter` 这个接口问草稿：n-gram 缓存是一种起草器，别的（比如用目标模型自己的
前几层来猜）照着同一个接口接进来。

en: Chapter 5.1 ngram_cache: drafting — the n-gram cache (SGLang's ``--speculative-algorithm NGRAM``) guesses the next
few tokens from tokens already seen.

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

A draft is a tree (:class:`DraftTree`); with ``breadth`` 1 it is a chain. Verification: chapter 5.2,
:mod:`minisgl.spec_tree`. The speculative main loop (chapter 5.3) asks for drafts only through the :class:`Drafter`
interface: the n-gram cache is one drafter; others (say, the target model's own first layers guessing) plug into the
same interface.
"""

from __future__ import annotations

from minisgl.course.skeleton import TaskNotDone

import heapq
from dataclasses import dataclass
from typing import Protocol, Sequence

from minisgl.validation import check_ngram_args


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
        # TODO 任务 draft_depths：返回每个草稿 token 的深度（树根的孩子是 1），与 tokens 一一对应。父节点总排在孩子前面
        # TODO task draft_depths: return each draft token's depth (the root's children are at 1), one per token. A parent always comes before its children
        raise TaskNotDone("ngram_cache", "draft_depths")


class Drafter(Protocol):
    """起草器：投机的主循环只用这三样。``uid`` 是请求的编号：所有请求共用的起草器（n-gram 缓存）可以不看它，按请求记
    状态的起草器（比如有自己 KV 缓存的草稿模型）靠它分开各个请求。

    en: A drafter: the speculative main loop uses only these three. ``uid`` is the request's number: a drafter shared by
    all requests (the n-gram cache) may ignore it; one keeping per-request state (say, a draft model with its own KV
    cache) tells requests apart by it.
    """

    #: 一次最多猜几个 token。
    #: en: The most tokens one guess makes.
    num_draft: int

    def put(self, tokens: Sequence[int], since: int = 0, uid: int = 0) -> None:
        """请求 ``uid`` 的 token 现在是 ``tokens``，第 ``since`` 个起是新的。

        en: Request ``uid``'s tokens are now ``tokens``; those from index ``since`` on are new."""
        ...

    def propose(self, tokens: Sequence[int], uid: int = 0, limit: int | None = None) -> DraftTree:
        """按 ``tokens`` 猜接下来的一棵草稿树（最多 ``limit`` 个节点，缺省 ``num_draft``；猜不出就是空树）。``limit`` 是
        主循环这一次最多用得上几个：多猜的只会被扔掉，要花算力猜的起草器就别去算。

        en: Guess the draft tree that follows ``tokens`` (at most ``limit`` nodes, ``num_draft`` by default; empty when
        there is no guess). ``limit`` is the most the main loop can use this time: more would be thrown away, so a
        drafter that spends compute on guessing should not compute them."""
        ...

    def drop(self, uid: int) -> None:
        """请求 ``uid`` 结束了。

        en: Request ``uid`` has ended."""
        ...


class _Node:
    __slots__ = ("children", "parent", "token", "stamp")

    def __init__(self, parent: _Node | None, token: int, stamp: int) -> None:
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.token = token
        self.stamp = stamp


class NgramCache:
    """所有请求共用的 n-gram 前缀树，一种 :class:`Drafter`（``uid`` 不用看：一个请求见过的，别的请求也能拿来猜）。参数
    是 SGLang 的同名参数（``--speculative-ngram-*``、``--speculative-num-draft-tokens``）；``num_draft`` 是一次最多猜几个
    token。

    en: The n-gram prefix tree all requests share, a :class:`Drafter` (``uid`` is ignored: what one request has seen,
    others may guess from). The parameters are SGLang's of the same names (``--speculative-ngram-*``,
    ``--speculative-num-draft-tokens``); ``num_draft`` is the most tokens one guess makes.
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

    def put(self, tokens: Sequence[int], since: int = 0, uid: int = 0) -> None:
        """把 ``tokens`` 里含有第 ``since`` 个及以后 token 的路径写进树（``since`` 之前的已经写过）。一个请求每多出几个
        token 就调用一次，``since`` 是上一次调用时的长度。

        en: Write into the tree the paths of ``tokens`` that contain a token at index ``since`` or later (those before were
        written already). Call it whenever a request gains tokens, with ``since`` its length at the previous call.
        """
        # TODO 任务 ngram_put：把含有第 since 个及以后 token 的每条路径写进树：从每个这样的起点起，最长是匹配窗口的上限加分支长度；已有的节点共用并刷新它的时间，没有的新建并计入节点数；每条路径一个新的时间，越靠后的起点越新。写完节点数超过容量，就删到容量的九成
        # TODO task ngram_put: write into the tree every path that holds a token at index since or later: from each such start, at most the match window's upper bound plus the branch length long; existing nodes are shared and their time refreshed, missing ones created and counted; each path gets a new time, later starts being newer. Afterwards, if the tree holds more nodes than its capacity, delete down to nine tenths of it
        raise TaskNotDone("ngram_cache", "ngram_put")

    def propose(self, tokens: Sequence[int], uid: int = 0, limit: int | None = None) -> DraftTree:
        """按 ``tokens`` 的最后几个 token 猜一棵草稿树，最多 ``limit`` 个节点（缺省 ``num_draft``；找不到就是空树）。只读。

        en: Guess a draft tree of at most ``limit`` nodes (``num_draft`` by default) from the last few tokens of ``tokens``
        (empty when nothing matches). Read-only.
        """
        # TODO 任务 ngram_propose：从最长的匹配窗口试到最短的（最长不超过序列本身）：序列的最后那么多个 token 在树里能一路走下去、走到的节点后面还有 token，就从那里按这个窗口的宽度取一棵草稿树（最多 limit 个节点，没给时按一次最多猜的个数）；都不行就返回空树。只读，不改树
        # TODO task ngram_propose: try the match windows from the longest to the shortest (never longer than the sequence itself): when the sequence's last that many tokens can be walked down the tree and the node reached has tokens after it, take a draft tree from there with this window's breadth (at most limit nodes, the most one guess makes when not given); if none works, return an empty tree. Read-only
        raise TaskNotDone("ngram_cache", "ngram_propose")

    def drop(self, uid: int) -> None:
        """什么都不做：请求结束了，它写进树的 token 留给以后的请求猜。

        en: Nothing: the request has ended, and the tokens it wrote stay in the tree for later requests to guess from."""

    def _breadth(self, window: int) -> int:
        # TODO 任务 bfs_breadth：返回这个窗口的展开宽度：最短的窗口得最大的宽度，最长的窗口得最小的宽度，中间按窗口长度线性插值、再四舍五入；窗口的上下限相等时得最小的宽度
        # TODO task bfs_breadth: return this window's breadth: the shortest window gets the largest breadth, the longest window the smallest, linear in the window's length in between, then rounded; when the window's bounds are equal, the smallest breadth
        raise TaskNotDone("ngram_cache", "bfs_breadth")

    def _bfs(self, start: _Node, breadth: int, limit: int) -> DraftTree:
        # TODO 任务 bfs_draft：从匹配到的那个节点（它自己不算草稿）起一层一层地取草稿：每个节点最多展开 breadth 个孩子、时间新的先，总共最多 limit 个，取够就停。返回广度优先顺序的草稿树：匹配节点的孩子的父节点记作 -1，其余的记父节点在草稿里的下标
        # TODO task bfs_draft: take the draft level by level from the node matched (not a draft token itself): each node expands at most breadth children, newest first, at most limit in all, stopping once there are enough. Return the draft tree in breadth-first order: the children of the matched node have parent -1, the others their parent's index in the draft
        raise TaskNotDone("ngram_cache", "bfs_draft")

    def _evict(self, target: int) -> None:
        """删最久没被写到的叶子，直到节点数不超过 ``target``；叶子删掉后父节点成了叶子，也进候选。

        en: Delete the leaves written longest ago until at most ``target`` nodes remain; a parent left without children
        becomes a candidate too.
        """
        # TODO 任务 evict_leaves：从最旧的叶子删起，直到节点数不超过 target：删掉的叶子从它父节点的孩子里拿走、节点数减一；父节点因此没了孩子（树根除外），就也成了可删的叶子。给定：_nodes
        # TODO task evict_leaves: delete leaves from the oldest on until at most target nodes remain: a deleted leaf leaves its parent's children and the node count drops by one; a parent thereby left without children (never the root) becomes a leaf that may go too. Given: _nodes
        raise TaskNotDone("ngram_cache", "evict_leaves")

    def _nodes(self) -> list[_Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out
