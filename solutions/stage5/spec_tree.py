"""第 5.2 章 spec_tree：验证一棵草稿树要的几样：注意力掩码、位置、贪心地接受，以及采样请求的投机采样（:func:`accept_sampled`）。

一次前向同时验证整棵树：输入是已经验证过的最后一个 token（树根，下标 0）加上广度优先排好的草稿 token（下标
1..n）。每个草稿 token 只能看见前缀、它自己和它的祖先——绝不能看见兄弟（兄弟是另一种猜法，不在它的序列里）；它的
位置是序列长度加上它的深度，不是它在输入里的下标。目标模型在每个节点上给出下一个 token 的 argmax：从树根起，
哪个孩子的 token 等于父节点上的 argmax 就接受它、接着往下走，走不下去时父节点上的 argmax 就是白送的那个 token
（bonus）。所以每一步至少出一个 token，和不投机时一样。

en: Chapter 5.2 spec_tree: what verifying a draft tree needs: the attention mask, the positions, greedy acceptance, and speculative sampling
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
    # >>> TASK tree_mask: 返回 [n + 1, n + 1] 的布尔掩码（树根在下标 0，草稿 token i 在下标 i + 1）：每一行为真的恰是这个节点自己和它的所有祖先（树根是所有节点的祖先），兄弟、堂兄弟、后代都是假
    # en: return the [n + 1, n + 1] boolean mask (the root at index 0, draft token i at index i + 1): each row is true exactly at the node itself and all its ancestors (the root is everyone's ancestor); siblings, cousins and descendants are false
    # hint1: 父节点总排在孩子前面，所以父节点那一行先算好了：孩子那一行就是父节点那一行，再加上它自己。
    # en1: A parent always comes before its children, so the parent's row is ready first: a child's row is its parent's row plus itself.
    # hint2: 1. mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)；mask[:, 0] = True；
    # hint2: 2. for i, parent in enumerate(draft.parents, start=1)：mask[i] = mask[parent + 1]（父节点 -1 就是树根那一行 0）；mask[i, i] = True；
    # hint2: 3. return mask。
    # en2: 1. mask = torch.zeros(n + 1, n + 1, dtype=torch.bool); mask[:, 0] = True;
    # en2: 2. for i, parent in enumerate(draft.parents, start=1): mask[i] = mask[parent + 1] (a parent of -1 is the root's row 0); mask[i, i] = True;
    # en2: 3. return mask.
    n = len(draft)
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:, 0] = True
    for i, parent in enumerate(draft.parents, start=1):
        mask[i] = mask[parent + 1]
        mask[i, i] = True
    return mask
    # <<< TASK


def tree_positions(draft: DraftTree, root_position: int) -> torch.Tensor:
    """树根和每个草稿 token 的位置：``root_position`` 加深度（树根的深度是 0）。

    en: The positions of the root and of each draft token: ``root_position`` plus the depth (the root's is 0).
    """
    # >>> TASK tree_positions: 返回 n + 1 个位置（64 位整数的一维张量）：树根就在给定的树根位置，每个草稿 token 在树根位置加它的深度，而不是加它在输入里的下标
    # en: return n + 1 positions (a one-dimensional tensor of 64-bit integers): the root at the root position given, each draft token at the root position plus its depth, not plus its index in the input
    # hint1: 两个兄弟在同一个位置上：它们是对同一个下一个 token 的两种猜法。
    # en1: Two siblings sit at the same position: they are two guesses for the same next token.
    # hint2: return torch.tensor([root_position] + [root_position + d for d in draft.depths()], dtype=torch.int64)。
    # en2: return torch.tensor([root_position] + [root_position + d for d in draft.depths()], dtype=torch.int64).
    return torch.tensor([root_position] + [root_position + d for d in draft.depths()], dtype=torch.int64)
    # <<< TASK


def accept_greedy(draft: DraftTree, target: Sequence[int]) -> tuple[list[int], list[int]]:
    """贪心地接受：``target[i]`` 是节点 i（0 是树根）上目标模型的 argmax。返回（接受的草稿节点的下标，从 1 起，
    从浅到深；这一步出的 token：接受的草稿 token 加上最后的 bonus）。

    en: Greedy acceptance: ``target[i]`` is the target model's argmax at node i (0 is the root). Returns (the indices of
    the accepted draft nodes, from 1, shallow to deep; the tokens this step yields: the accepted draft tokens followed
    by the bonus).
    """
    # >>> TASK accept_greedy: 从树根（节点 0）往下走：当前节点上目标模型要的 token（target[节点]）先记进输出；它的孩子里有 token 等于它的，就接受那个孩子（记下下标、走过去）接着来；没有就停——最后记进输出的那个就是白送的 token。返回（接受的节点下标，从浅到深；输出的 token）
    # en: walk down from the root (node 0): the token the target model wants at the current node (target[node]) goes into the output first; if one of its children carries that token, accept that child (note its index, move there) and go on; if none does, stop: the last token written to the output is the bonus. Return (the accepted node indices, shallow to deep; the output tokens)
    # hint1: 先把 parents 倒过来变成“每个节点的孩子们”（节点下标从 1 起，树根是 0），走的时候才找得到孩子。同一个父节点的孩子 token 各不相同，最多一个对得上。
    # en1: First turn parents around into "each node's children" (node indices from 1, the root at 0) so the walk can find them. The children of one parent carry distinct tokens, so at most one matches.
    # hint2: 1. children = {}；for i, parent in enumerate(draft.parents, start=1)：children.setdefault(parent + 1, []).append(i)；
    # hint2: 2. path, out, node = [], [], 0；循环：want = int(target[node])；out.append(want)；
    # hint2: 3. nxt = children.get(node, []) 里 draft.tokens[c - 1] == want 的那个 c（没有就 None）；None 就 return path, out；
    # hint2: 4. 否则 path.append(nxt)；node = nxt，继续。
    # en2: 1. children = {}; for i, parent in enumerate(draft.parents, start=1): children.setdefault(parent + 1, []).append(i);
    # en2: 2. path, out, node = [], [], 0; loop: want = int(target[node]); out.append(want);
    # en2: 3. nxt = the c in children.get(node, []) with draft.tokens[c - 1] == want (None if there is none); if None: return path, out;
    # en2: 4. otherwise path.append(nxt); node = nxt, and go on.
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
    # <<< TASK


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
    # >>> TASK accept_sampled: 从树根起：p 是当前节点的分布（一份拷贝，双精度）；按顺序试它的孩子：孩子的 token x 以 p[x] / p.sum() 的概率被接受（一个 [0, 1) 的均匀随机数乘 p.sum() 小于 p[x]），接受就记下它、输出 x、走过去从它的分布接着来；不接受就把 p[x] 置 0 再试下一个。没有孩子被接受时，从剩下的 p（归一化之后）用 multinomial 采一个 token 输出，结束。随机数都取自 generator。返回值同 accept_greedy
    # en: from the root: p is the current node's distribution (a copy, double precision); try its children in order: a child's token x is accepted with probability p[x] / p.sum() (a uniform random number in [0, 1) times p.sum() below p[x]); if accepted, note it, output x and move there, going on from its distribution; if not, set p[x] to 0 and try the next. When no child is accepted, sample one token from what is left of p (normalised) with multinomial, output it and stop. All random numbers come from generator. Returns the same as accept_greedy
    # hint1: 草稿给 x 的概率是 1，所以接受的概率是 min(1, p(x) / 1) = p(x)；被拒之后剩下的分布是 max(0, p - 草稿的分布)，也就是 p 把 x 那一项拿掉。下一个孩子要在这个剩下的分布里试，最后的一个 token 也从它里面采。
    # hint1: p 不必归一化：比较时乘上 p.sum() 就等于先归一化。
    # en1: The draft gives x probability 1, so it is accepted with probability min(1, p(x) / 1) = p(x); after a rejection what is left is max(0, p - the draft's distribution), i.e. p without x. The next child is tried in that remaining distribution, and the final token is drawn from it too.
    # en1: p need not be normalised: multiplying by p.sum() in the comparison is the same as normalising first.
    # hint2: 1. children 同 accept_greedy；path, out, node = [], [], 0；
    # hint2: 2. 循环：p = probs[node].double().clone()；nxt = None；对 children.get(node, []) 里的每个 child：x = draft.tokens[child - 1]；
    # hint2: 3. float(torch.rand((), generator=generator, dtype=torch.float64)) * float(p.sum()) < float(p[x]) 就 nxt = child、break；否则 p[x] = 0.0；
    # hint2: 4. nxt 是 None：out.append(int(torch.multinomial(p / p.sum(), 1, generator=generator)))；return path, out；
    # hint2: 5. 否则 path.append(nxt)；out.append(draft.tokens[nxt - 1])；node = nxt。
    # en2: 1. children as in accept_greedy; path, out, node = [], [], 0;
    # en2: 2. loop: p = probs[node].double().clone(); nxt = None; for each child in children.get(node, []): x = draft.tokens[child - 1];
    # en2: 3. if float(torch.rand((), generator=generator, dtype=torch.float64)) * float(p.sum()) < float(p[x]): nxt = child, break; otherwise p[x] = 0.0;
    # en2: 4. if nxt is None: out.append(int(torch.multinomial(p / p.sum(), 1, generator=generator))); return path, out;
    # en2: 5. otherwise path.append(nxt); out.append(draft.tokens[nxt - 1]); node = nxt.
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
    # <<< TASK
