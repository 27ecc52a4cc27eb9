"""第 5.2 章 spec_tree 的检查：验证一棵草稿树要的掩码、位置与接受。掩码和贪心接受拿最直接的定义（逐对看祖先、枚举
每条路径）当标准答案，在随机的树上比；投机采样的每一层拿卡方检验和目标分布比。

en: Checks of chapter 5.2 spec_tree: the mask, positions and acceptance that verifying a draft tree needs. The mask and
greedy acceptance are compared on random trees with their plainest definitions (ancestors pair by pair, every path
enumerated); each level of speculative sampling is compared with the target distribution by a chi-square test.
"""

from __future__ import annotations

import collections
import math
import random

import torch

from checks.common import chi_square_limit, expect
from minisgl.i18n import tr
from minisgl.ngram_cache import DraftTree
from minisgl.spec_tree import accept_greedy, accept_sampled, tree_mask, tree_positions


def chain(tokens: list[int]) -> DraftTree:
    return DraftTree(tuple(tokens), tuple(range(-1, len(tokens) - 1)))


def random_tree(rng: random.Random) -> DraftTree:
    tokens, parents = [], []
    for _ in range(rng.randrange(0, 9)):
        parent = rng.randrange(-1, len(tokens))
        taken = {t for t, p in zip(tokens, parents) if p == parent}  # 兄弟的 token 各不相同 | en: siblings differ
        free = [t for t in range(3) if t not in taken]
        if free:
            parents.append(parent)
            tokens.append(rng.choice(free))
    # 广度优先：按深度稳定排序，父节点的下标跟着换 | en: breadth first: a stable sort by depth, parents re-indexed
    depth = DraftTree(tuple(tokens), tuple(parents)).depths()
    order = sorted(range(len(tokens)), key=lambda i: depth[i])
    where = {old: new for new, old in enumerate(order)}
    return DraftTree(tuple(tokens[i] for i in order), tuple(-1 if parents[i] < 0 else where[parents[i]] for i in order))


def ancestors_or_self(draft: DraftTree, i: int) -> set[int]:
    """节点 i（0 是树根）自己和它的全部祖先。

    en: Node i (0 is the root) and all its ancestors.
    """
    seen, node = {0, i}, i
    while node > 0:
        node = draft.parents[node - 1] + 1
        seen.add(node)
    return seen


def test_tree_mask_against_the_definition() -> None:
    rng = random.Random(1)
    for _ in range(100):
        draft = random_tree(rng)
        n = len(draft) + 1
        want = torch.tensor([[j in ancestors_or_self(draft, i) for j in range(n)] for i in range(n)])
        expect(tree_mask(draft).tolist(), want.tolist(), tr("tree_mask of parents {parents}", parents=draft.parents))


def test_siblings_never_see_each_other_and_positions_follow_depth() -> None:
    draft = DraftTree((7, 8, 9), (-1, -1, 0))  # 7 和 8 是兄弟，9 是 7 的孩子 | en: 7 and 8 are siblings, 9 is 7's child
    mask = tree_mask(draft)
    expect((bool(mask[1, 2]), bool(mask[2, 1]), bool(mask[3, 2])), (False, False, False),
           tr("tree_mask of a root with children 7, 8 and a grandchild 9 under 7: 7 sees 8, 8 sees 7, 9 sees 8"))
    expect(tree_positions(draft, 20).tolist(), [20, 21, 21, 22], tr("positions of the root at 20, its two children and a grandchild"))


def accept_reference(draft: DraftTree, target: list[int]) -> list[int]:
    """每条从树根起的路径都试一遍，取目标模型一路认可的最长那条，加上 bonus。

    en: Try every path from the root and keep the longest the target model agrees with all along, plus the bonus.
    """
    best = [0]
    for leaf in range(len(draft) + 1):
        path = sorted(ancestors_or_self(draft, leaf))  # 广度优先：祖先的下标更小 | en: breadth first: ancestors have smaller indices
        ok = [0]
        for a, b in zip(path, path[1:]):
            if draft.tokens[b - 1] != target[a]:
                break
            ok.append(b)
        if len(ok) > len(best):
            best = ok
    return [draft.tokens[i - 1] for i in best[1:]] + [target[best[-1]]]


def test_greedy_acceptance_against_every_path() -> None:
    rng = random.Random(2)
    for _ in range(300):
        draft = random_tree(rng)
        target = [rng.randrange(3) for _ in range(len(draft) + 1)]
        path, out = accept_greedy(draft, target)
        expect(out, accept_reference(draft, target),
               tr("accept_greedy on tokens {tokens}, parents {parents}, target argmax {target}: the tokens of the step",
                  tokens=draft.tokens, parents=draft.parents, target=target))
        expect([draft.tokens[i - 1] for i in path], out[:-1], tr("accept_greedy: the accepted nodes' tokens are the step's tokens but the bonus"))


def test_a_rejected_first_guess_still_yields_one_token() -> None:
    path, out = accept_greedy(chain([4, 5]), [9, 5, 6])
    expect((path, out), ([], [9]), tr("accept_greedy of the chain 4, 5 when the target wants 9 first: (accepted, tokens)"))
    path, out = accept_greedy(chain([4, 5]), [4, 5, 6])
    expect((path, out), ([1, 2], [4, 5, 6]), tr("accept_greedy of the chain 4, 5 when the target agrees: (accepted, tokens), the bonus last"))


# ----------------------------------------------------------------------------- 投机采样
# en: ----------------------------------------------------------------------------- speculative sampling


def chi_square(counts: collections.Counter[int], probs: torch.Tensor) -> tuple[float, int]:
    """观察到的次数对照分布 ``probs``：（统计量, 自由度）；分布外的 token 出现一次就是无穷大。

    en: Observed counts against the distribution ``probs``: (statistic, degrees of freedom); a token outside the
    distribution makes it infinite.
    """
    n, p = sum(counts.values()), probs / probs.sum()
    if any(p[t] == 0 for t in counts):
        return math.inf, 1
    support = [t for t in range(len(p)) if p[t] > 0]
    return sum((counts[t] - n * float(p[t])) ** 2 / (n * float(p[t])) for t in support), len(support) - 1


def test_speculative_sampling_draws_each_token_from_the_plain_distribution() -> None:
    """树根有孩子 0、1，孩子 0 下面有 3：第一个 token 服从树根的分布；第一个是 0 时第二个服从节点 1 的分布（它的孩子 3
    被试过、可能被拒），是 1 时服从节点 2 的；0、3 之后的第三个服从节点 3 的。拒绝之后从没拿掉草稿 token 的分布里再采，
    或者不按剩下的比例，这里都会偏。

    en: The root has children 0 and 1, child 0 has child 3: the first token follows the root's distribution; after 0 the
    second follows node 1's (its child 3 tried, maybe rejected), after 1 node 2's; after 0, 3 the third follows node 3's.
    Resampling after a rejection from a distribution that still holds the draft token, or not in proportion to what is
    left, skews one of them.
    """
    gen = torch.Generator().manual_seed(0)
    draft = DraftTree((0, 1, 3), (-1, -1, 0))
    probs = torch.tensor([[0.30, 0.25, 0.20, 0.10, 0.10, 0.05],
                          [0.10, 0.05, 0.20, 0.40, 0.05, 0.20],
                          [0.05, 0.05, 0.05, 0.05, 0.40, 0.40],
                          [0.50, 0.00, 0.00, 0.00, 0.25, 0.25]])
    runs = [accept_sampled(draft, probs * 3.0, gen)[1] for _ in range(20000)]  # 不必归一化 | en: need not be normalised
    groups = {
        tr("the first token"): ([r[0] for r in runs], probs[0]),
        tr("the token after 0"): ([r[1] for r in runs if r[0] == 0], probs[1]),
        tr("the token after 1"): ([r[1] for r in runs if r[0] == 1], probs[2]),
        tr("the token after 0, 3"): ([r[2] for r in runs if r[:2] == [0, 3]], probs[3]),
    }
    for what, (tokens, want) in groups.items():
        stat, dof = chi_square(collections.Counter(tokens), want)
        assert stat < chi_square_limit(dof), tr(
            "{what}: {n} draws {counts} do not follow {want} (chi-square {stat:.1f}, limit {limit:.1f})", what=what,
            n=len(tokens), counts=dict(sorted(collections.Counter(tokens).items())), want=want.tolist(), stat=stat,
            limit=chi_square_limit(dof))
    expect(sorted({len(r) for r in runs}), [1, 2, 3], tr("run lengths seen (stop at the root, one or two levels down)"))


def test_speculative_sampling_returns_the_path_it_walked() -> None:
    """``accept_sampled`` 返回的节点是从树根往下的一条路（每个的父节点是前一个），输出的前几个 token 就是这些节点的
    token，最后多一个：引擎靠这条路去挪 K/V。

    en: The nodes ``accept_sampled`` returns are a path down from the root (each one's parent is the one before), and the
    output's first tokens are those nodes' tokens, plus one more at the end: the engine moves K/V along this path.
    """
    rng = random.Random(5)
    gen = torch.Generator().manual_seed(5)
    walked = 0
    for _ in range(200):
        draft = random_tree(rng)
        probs = torch.rand(len(draft) + 1, 8, generator=gen) ** 4
        for i, token in enumerate(draft.tokens, start=1):  # 让草稿常被接受 | en: make the drafts likely to be accepted
            probs[draft.parents[i - 1] + 1, token] += 4.0
        path, out = accept_sampled(draft, probs, gen)
        expect(len(out), len(path) + 1, tr("tokens out ({out}) against the nodes accepted ({path})", out=out, path=path))
        parent = 0
        for node in path:
            expect(draft.parents[node - 1] + 1, parent, tr("the parent of accepted node {node} in {draft}", node=node, draft=draft))
            parent = node
        expect(out[:-1], [draft.tokens[node - 1] for node in path], tr("the tokens of the accepted nodes {path}", path=path))
        walked += len(path)
    expect(walked > 100, True, tr("draft nodes accepted over 200 random trees: {n}", n=walked))
