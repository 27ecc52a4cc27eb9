"""第 5.1 章 ngram_cache 的检查：n-gram 缓存怎样猜——重复出现的一段猜成一条链、最长的窗口胜出、宽度随窗口收窄且新近的
孩子在前、深度受分支长度限制而个数受 num_draft 限制、请求之间共用、分几次写和一次写出同一棵树、超过容量删最旧的叶子。

en: Checks of chapter 5.1 ngram_cache: how the n-gram cache guesses — a repeated run proposed as a chain, the longest
window wins, the breadth narrows with the window and recent children come first, the depth is bounded by the branch
length and the size by num_draft, requests share the cache, writing in pieces builds the same tree as writing at once,
and beyond the capacity the oldest leaves go.
"""

from __future__ import annotations

import random


from checks.common import expect
from minisgl.i18n import tr
from minisgl.ngram_cache import DraftTree, NgramCache


def chain(tokens: list[int]) -> DraftTree:
    return DraftTree(tuple(tokens), tuple(range(-1, len(tokens) - 1)))


def test_a_repeated_run_is_proposed_as_a_chain() -> None:
    cache = NgramCache(max_window=3, max_breadth=1, num_draft=4)
    text = [5, 6, 7, 8, 9, 10, 11, 1, 2, 5, 6, 7]
    cache.put(text)
    expect(cache.propose(text), chain([8, 9, 10, 11]),
           tr("propose after {text} was written (window up to 3, breadth 1, 4 draft tokens)", text=text))


def test_the_longest_window_wins() -> None:
    cache = NgramCache(max_window=3, max_breadth=1, num_draft=1)
    cache.put([1, 2, 3, 40, 9, 2, 3, 50])  # "2 3" → 40 或 50；"1 2 3" → 40 | en: "2 3" → 40 or 50; "1 2 3" → 40
    expect(cache.propose([7, 1, 2, 3]).tokens, (40,),
           tr("propose after [.., 1, 2, 3] when '1 2 3' was followed by 40 and the more recent '2 3' by 50"))
    expect(cache.propose([7, 8, 2, 3]).tokens, (50,),
           tr("propose after [.., 8, 2, 3]: only '2 3' matches, and its most recent continuation is 50"))


def test_breadth_narrows_with_the_window_and_recent_children_come_first() -> None:
    cache = NgramCache(min_window=1, max_window=3, min_breadth=1, max_breadth=3, num_draft=3)
    cache.put([1, 2, 3, 7, 1, 2, 3, 8, 1, 2, 3, 9])  # "1 2 3" 和 "3" 后面都跟过 7、8、9 | en: "1 2 3" and "3" were followed by 7, 8, 9
    tree = cache.propose([5, 3])  # 最短的窗口（"3"）：宽 3 | en: the shortest window ("3"): breadth 3
    expect((tree.tokens, tree.parents), ((9, 8, 7), (-1, -1, -1)),
           tr("propose after [5, 3] (only the 1-token window matches, breadth 3): (tokens, parents), most recent first"))
    tree = cache.propose([1, 2, 3])  # 最长的窗口（"1 2 3"）：宽 1 | en: the longest window ("1 2 3"): breadth 1
    expect(tree.tokens[:1], (9,), tr("propose after [1, 2, 3] (the 3-token window matches, breadth 1): the first draft token"))
    expect(tree.parents.count(-1), 1, tr("propose after [1, 2, 3] (the 3-token window matches, breadth 1): children of the root"))


def test_a_window_with_nothing_after_it_gives_way_to_a_shorter_one() -> None:
    cache = NgramCache(max_window=3, max_breadth=1, num_draft=1)
    cache.put([1, 2, 3, 1, 2])  # "3 1 2" 在树里，但后面什么也没有；"1 2" 后面跟过 3 | en: "3 1 2" is in the tree with nothing after it; "1 2" was followed by 3
    expect(cache.propose([3, 1, 2]).tokens, (3,),
           tr("propose after [3, 1, 2] when '3 1 2' has nothing after it but '1 2' was followed by 3"))


def test_a_continuation_seen_again_becomes_the_most_recent() -> None:
    cache = NgramCache(min_window=2, max_window=2, min_breadth=2, max_breadth=2, num_draft=2)
    cache.put([1, 2, 7, 1, 2, 8, 1, 2, 7])  # "1 2" 后面：7，8，又是 7 | en: after "1 2": 7, 8, then 7 again
    expect(cache.propose([1, 2]).tokens, (7, 8),
           tr("propose after [1, 2] when '1 2' was followed by 7, then 8, then 7 again: the most recent first"))


def test_depth_is_bounded_by_the_branch_length_and_size_by_num_draft() -> None:
    cache = NgramCache(max_window=2, max_breadth=1, branch_length=3, num_draft=10)
    text = list(range(100, 120)) + [100, 101]
    cache.put(text)
    expect(cache.propose(text), chain([102, 103, 104]),
           tr("propose after a 20-token run repeated by its first 2 tokens, branch_length 3: at most 3 tokens past the window"))
    small = NgramCache(max_window=2, max_breadth=3, branch_length=8, num_draft=2)
    small.put(text)
    expect(len(small.propose(text)), 2, tr("the number of draft tokens with num_draft=2"))


def test_requests_share_the_cache_and_nothing_matches_in_an_empty_one() -> None:
    cache = NgramCache(max_window=2, max_breadth=1, num_draft=2)
    expect(cache.propose([1, 2, 3]), DraftTree(), tr("propose on an empty cache"))
    cache.put([1, 2, 3, 4, 5])  # 请求 A | en: request A
    expect(cache.propose([9, 9, 2, 3]).tokens, (4, 5), tr("request B after [.., 2, 3], learning from request A's [1, 2, 3, 4, 5]"))


def test_writing_in_pieces_builds_the_same_tree() -> None:
    rng = random.Random(0)
    for _ in range(30):
        text = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        whole = NgramCache(max_window=3, branch_length=4)
        whole.put(text)
        pieces = NgramCache(max_window=3, branch_length=4)
        done = 0
        while done < len(text):
            end = min(len(text), done + rng.randrange(1, 5))
            pieces.put(text[:end], since=done)
            done = end
        shape = lambda c: sorted(map(tuple, _paths(c.root)))  # noqa: E731
        expect(shape(pieces), shape(whole), tr("the tree after writing {text} in pieces, against writing it at once", text=text))


def _paths(node, prefix=()):  # noqa: ANN001, ANN202
    if not node.children:
        return [prefix]
    out = []
    for token, child in node.children.items():
        out += _paths(child, prefix + (token,))
    return out


def test_capacity_evicts_the_oldest_leaves() -> None:
    cache = NgramCache(max_window=2, max_breadth=1, branch_length=2, capacity=40, num_draft=2)
    evicted = False
    for i in range(20):
        before = cache.size
        cache.put([1000 + 10 * i + j for j in range(6)])
        expect(cache.size <= 40, True, tr("nodes in the cache after {n} writes, capacity 40: got {size}", n=i + 1, size=cache.size))
        if cache.size < before + 18:  # 这次写的 18 个新节点没全留下：删过 | en: not all 18 new nodes stayed: it evicted
            evicted = True
            expect(cache.size, 36, tr("nodes right after an eviction with capacity 40 (down to nine tenths)"))
    expect(evicted, True, tr("20 writes of 18 new nodes each into a cache of capacity 40 evicted something"))
    expect(cache.propose([1190, 1191]).tokens, (1192, 1193), tr("propose after the most recently written run"))
    expect(cache.propose([1000, 1001]), DraftTree(), tr("propose after the oldest run, long evicted"))


def test_depths_follow_the_parents() -> None:
    """``DraftTree.depths``：树根的孩子是 1，往下每层加一——拿“数一数走到树根要几步”当标准答案，在随机的树上比。

    en: ``DraftTree.depths``: the root's children are at 1, one more per level down; compared on random trees with
    "count the steps up to the root"."""
    rng = random.Random(1)
    for _ in range(100):
        parents: list[int] = []
        for i in range(rng.randrange(0, 16)):
            parents.append(rng.randrange(-1, i))
        want = []
        for i in range(len(parents)):
            steps, node = 1, parents[i]
            while node >= 0:
                steps, node = steps + 1, parents[node]
            want.append(steps)
        draft = DraftTree(tuple(range(len(parents))), tuple(parents))
        expect(draft.depths(), want, tr("depths of the draft tree with parents {parents}", parents=parents))


def test_every_proposal_is_a_tree_of_continuations_seen() -> None:
    """随机的 token 流上，每次猜出的都是一棵合法的树：父节点在孩子前面（没有环，不会指向自己或后面），同一个父节点的
    孩子 token 各不相同，个数不超过 num_draft、深度不超过树里存的路径允许的（max_window + branch_length 减去窗口），并且从树根到每个节点的路径，接在匹配上的
    窗口后面，在写进去的流里真的出现过。

    en: On random token streams every guess is a well-formed tree: parents before children (no cycle, never pointing at
    itself or later), distinct tokens among one parent's children, at most num_draft nodes, no deeper than the stored
    paths allow (max_window + branch_length minus the window), and the path from the root to each node, after the matched window, really occurred in the stream
    written.
    """
    rng = random.Random(2)
    for _ in range(40):
        stream = [rng.randrange(5) for _ in range(rng.randrange(5, 60))]
        cache = NgramCache(min_window=1, max_window=3, max_breadth=3, branch_length=4, num_draft=6)
        cache.put(stream)
        text = "," + ",".join(map(str, stream)) + ","
        for cut in range(1, len(stream) + 1):
            draft = cache.propose(stream[:cut])
            expect(len(draft) <= 6, True, tr("{n} draft tokens with num_draft=6", n=len(draft)))
            for i, parent in enumerate(draft.parents):
                expect(-1 <= parent < i, True, tr("parent {p} of draft token {i}: parents come before their children "
                                                  "(-1 is the root)", p=parent, i=i))
            siblings = [(p, t) for p, t in zip(draft.parents, draft.tokens)]
            expect(len(set(siblings)), len(siblings), tr("(parent, token) pairs of the draft {d}: siblings repeat a token",
                                                         d=draft))
            for i in range(len(draft)):
                path, node = [], i
                while node >= 0:
                    path.append(draft.tokens[node])
                    node = draft.parents[node]
                path.reverse()
                # 树里的路径最长 max_window + branch_length，窗口至少占一个 | en: stored paths hold at most max_window + branch_length, the window at least one
                expect(len(path) <= 3 + 4 - 1, True, tr("depth {d} of a draft token with max_window 3 and branch_length 4 "
                                                        "(at most 6)", d=len(path)))
                window = stream[max(0, cut - 1) : cut]  # 至少最后一个 token 匹配上了 | en: at least the last token matched
                seen = "," + ",".join(map(str, window + path)) + "," in text
                expect(seen, True, tr("the draft path {path} after {window} never occurred in the stream {s}",
                                      path=path, window=window, s=stream))
