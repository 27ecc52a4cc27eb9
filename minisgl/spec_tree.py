"""验证一棵草稿树要的几样：注意力掩码、位置、贪心地接受，以及采样请求的投机采样（:func:`accept_sampled`）。

一次前向同时验证整棵树：输入是已经验证过的最后一个 token（树根，下标 0）加上广度优先排好的草稿 token（下标
1..n）。每个草稿 token 只能看见前缀、它自己和它的祖先——绝不能看见兄弟（兄弟是另一种猜法，不在它的序列里）；它的
位置是序列长度加上它的深度，不是它在输入里的下标。目标模型在每个节点上给出下一个 token 的 argmax：从树根起，
哪个孩子的 token 等于父节点上的 argmax 就接受它、接着往下走，走不下去时父节点上的 argmax 就是白送的那个 token
（bonus）。所以每一步至少出一个 token，和不投机时一样。

en: What verifying a draft tree needs: the attention mask, the positions, greedy acceptance, and speculative sampling
for sampled requests (:func:`accept_sampled`).

One forward verifies the whole tree: its input is the last verified token (the root, index 0) followed by the draft
tokens in breadth-first order (indices 1..n). Each draft token may see the prefix, itself and its ancestors, never a
sibling (a sibling is another guess, not part of its sequence); its position is the sequence length plus its depth, not
its index in the input. The target model gives the argmax of the next token at every node: from the root, a child whose
token equals its parent's argmax is accepted and the walk goes on; where it cannot, the parent's argmax is the token
given for free (the bonus). So every step yields at least one token, as without speculation.
"""

from __future__ import annotations

from typing import Sequence

import torch

from minisgl.ngram_cache import DraftTree


def tree_mask(draft: DraftTree) -> torch.Tensor:
    """``[n + 1, n + 1]`` 的布尔掩码（树根在下标 0）：第 i 行里为真的是 i 自己和它的祖先（树根是所有节点的祖先）。
    前缀（已经在 KV 缓存里的部分）所有节点都能看见，不在这个掩码里。

    en: A ``[n + 1, n + 1]`` boolean mask (the root at index 0): row i is true at i itself and its ancestors (the root is
    everyone's ancestor). The prefix (already in the KV cache) is visible to every node and is not in this mask.
    """
    n = len(draft)
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:, 0] = True
    for i, parent in enumerate(draft.parents, start=1):
        mask[i] = mask[parent + 1]
        mask[i, i] = True
    return mask


def tree_positions(draft: DraftTree, root_position: int) -> torch.Tensor:
    """树根和每个草稿 token 的位置：``root_position`` 加深度（树根的深度是 0）。

    en: The positions of the root and of each draft token: ``root_position`` plus the depth (the root's is 0).
    """
    return torch.tensor([root_position] + [root_position + d for d in draft.depths()], dtype=torch.int64)


def accept_greedy(draft: DraftTree, target: Sequence[int]) -> tuple[list[int], list[int]]:
    """贪心地接受：``target[i]`` 是节点 i（0 是树根）上目标模型的 argmax。返回（接受的草稿节点的下标，从 1 起，
    从浅到深；这一步出的 token：接受的草稿 token 加上最后的 bonus）。

    en: Greedy acceptance: ``target[i]`` is the target model's argmax at node i (0 is the root). Returns (the indices of
    the accepted draft nodes, from 1, shallow to deep; the tokens this step yields: the accepted draft tokens followed
    by the bonus).
    """
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(draft.parents, start=1):
        children.setdefault(parent + 1, []).append(i)
    path, out, node = [], [], 0
    while True:
        want = int(target[node])
        out.append(want)
        nxt = next((c for c in children.get(node, []) if draft.tokens[c - 1] == want), None)
        if nxt is None:
            return path, out
        path.append(nxt)
        node = nxt


def accept_sampled(draft: DraftTree, probs: torch.Tensor, generator: torch.Generator | None = None) -> tuple[list[int], list[int]]:
    """投机采样：``probs[i]`` 是节点 i（0 是树根）上目标模型采样用的分布（按行，不必归一化）。从树根起，按孩子的顺序
    一个个试：孩子的 token x 以它在当前分布里的概率被接受（接受了就走到它那里，从它的分布接着来）；没被接受，就把 x 从
    分布里拿掉（剩下的按比例放大），再试下一个孩子；孩子都没被接受，就从剩下的分布里采一个，这一步到此为止。这样每个
    token 的分布都和不投机时逐个采样一模一样（草稿是确定的：它给 x 的概率是 1）。返回值同 :func:`accept_greedy`。

    en: Speculative sampling: ``probs[i]`` is the distribution the target model samples from at node i (0 is the root),
    row by row, not necessarily normalised. From the root, the children are tried in order: a child's token x is
    accepted with its probability under the current distribution (if accepted the walk moves there and goes on from its
    distribution); if not, x is taken out of the distribution (the rest scaled up) and the next child is tried; when no
    child is accepted, one token is sampled from what is left and the step ends there. Each token then follows exactly
    the distribution plain sampling would draw it from (the draft is deterministic: it gives x probability 1). Returns
    the same as :func:`accept_greedy`.
    """
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(draft.parents, start=1):
        children.setdefault(parent + 1, []).append(i)
    path: list[int] = []
    out: list[int] = []
    node = 0
    while True:
        p = probs[node].double().clone()
        nxt = None
        for child in children.get(node, []):
            x = draft.tokens[child - 1]
            if float(torch.rand((), generator=generator, dtype=torch.float64)) * float(p.sum()) < float(p[x]):
                nxt = child
                break
            p[x] = 0.0
        if nxt is None:
            out.append(int(torch.multinomial(p / p.sum(), 1, generator=generator)))
            return path, out
        path.append(nxt)
        out.append(draft.tokens[nxt - 1])
        node = nxt
