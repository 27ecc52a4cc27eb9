"""第 5.2 章示例：验证一棵草稿树。一棵小树的掩码（每一行只看自己和祖先）、位置（按深度）与槽位（按下标）；目标模型
要的 token 给定时，贪心地接受走出哪条路、白送哪个 token、哪些 K/V 要挪；最后是投机采样：同一棵树验证 20000 次，
第一个、第二个 token 的频率和目标模型的分布对得上。

    python examples/chapters/spec_tree.py

en: Chapter 5.2 example: verifying a draft tree. A small tree's mask (each row sees itself and its ancestors only), its
positions (by depth) and slots (by index); given the tokens the target model wants, the path greedy acceptance walks,
the bonus token and the K/V that must move; finally speculative sampling: the same tree verified 20000 times, the
frequencies of the first and second token matching the target model's distribution.

    python examples/chapters/spec_tree.py
"""

from __future__ import annotations

from collections import Counter

import torch

from minisgl.i18n import tr
from minisgl.ngram_cache import DraftTree
from minisgl.spec_tree import accept_greedy, accept_sampled, tree_mask, tree_positions

WORDS = ["the", "cat", "dog", "sat", "ate", "on", "a"]
W = {w: i for i, w in enumerate(WORDS)}
#: 树根是 "the"（最后一个已经验证过的 token）；草稿：两个猜法 cat / dog，cat 下面又分 sat / ate，sat 下面 on。
#: en: the root is "the" (the last verified token); the draft: two guesses cat / dog, below cat sat / ate, below sat on.
DRAFT = DraftTree(tokens=(W["cat"], W["dog"], W["sat"], W["ate"], W["on"]), parents=(-1, -1, 0, 0, 2))
#: 请求已知 L 个 token（树根是第 L 个，下标 L - 1）。
#: en: the request knows L tokens (the root is the L-th, index L - 1).
L = 10


def labels() -> list[str]:
    return ["the*"] + [WORDS[t] for t in DRAFT.tokens]


def layout_demo() -> None:
    print(tr("== 1. Mask, positions and slots of one draft tree =="))
    names = labels()
    mask = tree_mask(DRAFT)
    print(tr("tree_mask (row = query node, column = key node; 1 = visible; the root 'the*' is node 0):"))
    print("          " + " ".join(f"{n:>5}" for n in names))
    for i, row in enumerate(mask.tolist()):
        print(f"    {names[i]:>5} " + " ".join(f"{'1' if v else '.':>5}" for v in row))
    positions = tree_positions(DRAFT, L - 1).tolist()
    print(tr("node  token  parent  depth  position (RoPE)  slot (page-table entry)"))
    for i, name in enumerate(names):
        parent = "-" if i == 0 else names[DRAFT.parents[i - 1] + 1]
        depth = 0 if i == 0 else DRAFT.depths()[i - 1]
        print(f"{i:>4}  {name:>5}  {parent:>6}  {depth:>5}  {positions[i]:>15}  {L - 1 + i:>23}")
    print(tr("cat and dog share position {p}: two guesses for the same next token; each has its own slot",
             p=positions[1]))


def greedy_demo() -> None:
    print(tr("\n== 2. Greedy acceptance =="))
    names = labels()
    cases = [
        (tr("the model wants cat, then ate, then the"), ["cat", "ate", "on", "on", "the", "on"]),
        (tr("the model wants cat, sat, on, then a"), ["cat", "sat", "on", "on", "the", "a"]),
        (tr("the model wants a right away"), ["a", "the", "on", "on", "the", "on"]),
    ]
    for why, wanted in cases:
        # target[i]：节点 i 上目标模型的 argmax（这里是给定的）
        # en: target[i]: the target model's argmax at node i (given here)
        target = [W[w] for w in wanted]
        path, run = accept_greedy(DRAFT, target)
        moves = [(names[node], L - 1 + node, L + k) for k, node in enumerate(path) if node != k + 1]
        print(tr("{why}: accepted nodes {path} ({words}), the step yields {run!r}, bonus {bonus!r}",
                 why=why, path=path, words=[names[n] for n in path], run=" ".join(WORDS[t] for t in run),
                 bonus=WORDS[run[-1]]))
        print(tr("    K/V to move (token, from slot, to slot): {moves}; slots {first}..{last} are not needed any "
                 "more (whole pages among them go back)", moves=moves or tr("none"), first=L + len(path), last=L + len(DRAFT) - 1))


def sampled_demo() -> None:
    print(tr("\n== 3. Speculative sampling: 20000 verifications of the same tree =="))
    # 每个节点上目标模型的分布（7 个词：the cat dog sat ate on a），草稿猜得中的时候多
    # en: the target model's distribution at each node (7 words: the cat dog sat ate on a), often agreeing with the draft
    probs = torch.tensor([
        [0.05, 0.45, 0.25, 0.05, 0.05, 0.05, 0.10],  # the*
        [0.05, 0.05, 0.05, 0.40, 0.25, 0.10, 0.10],  # cat
        [0.10, 0.10, 0.10, 0.30, 0.20, 0.10, 0.10],  # dog
        [0.10, 0.05, 0.05, 0.05, 0.05, 0.60, 0.10],  # sat
        [0.50, 0.05, 0.05, 0.05, 0.05, 0.05, 0.25],  # ate
        [0.70, 0.02, 0.02, 0.02, 0.02, 0.02, 0.20],  # on
    ])
    gen = torch.Generator().manual_seed(0)
    draws = 20000
    first: Counter[int] = Counter()
    second_after_cat: Counter[int] = Counter()
    accepted: Counter[int] = Counter()
    for _ in range(draws):
        path, run = accept_sampled(DRAFT, probs, gen)
        first[run[0]] += 1
        accepted[len(path)] += 1
        if run[0] == W["cat"] and len(run) > 1:
            second_after_cat[run[1]] += 1
    print(tr("first token: frequency vs the root's distribution"))
    for t, w in enumerate(WORDS):
        print(f"    {w:>4}  {first[t] / draws:.3f}  {float(probs[0, t]):.3f}")
    n = sum(second_after_cat.values())
    print(tr("second token after cat ({n} draws): frequency vs cat's distribution", n=n))
    for t, w in enumerate(WORDS):
        print(f"    {w:>4}  {second_after_cat[t] / n:.3f}  {float(probs[1, t]):.3f}")
    print(tr("draft tokens accepted per verification: {hist}", hist=dict(sorted(accepted.items()))))


if __name__ == "__main__":
    layout_demo()
    greedy_demo()
    sampled_demo()
