# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint spec_tree <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint spec_tree <task>` gives the next hint.
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

from minisgl.course.skeleton import TaskNotDone

from typing import Sequence

import torch

from minisgl.ngram_cache import DraftTree


def tree_mask(draft: DraftTree) -> torch.Tensor:
    """``[n + 1, n + 1]`` 的布尔掩码（树根在下标 0）：第 i 行里为真的是 i 自己和它的祖先（树根是所有节点的祖先）。
    前缀（已经在 KV 缓存里的部分）所有节点都能看见，不在这个掩码里。

    en: A ``[n + 1, n + 1]`` boolean mask (the root at index 0): row i is true at i itself and its ancestors (the root is
    everyone's ancestor). The prefix (already in the KV cache) is visible to every node and is not in this mask.
    """
    # TODO 任务 tree_mask：返回 [n + 1, n + 1] 的布尔掩码（树根在下标 0，草稿 token i 在下标 i + 1）：每一行为真的恰是这个节点自己和它的所有祖先（树根是所有节点的祖先），兄弟、堂兄弟、后代都是假
    # TODO task tree_mask: return the [n + 1, n + 1] boolean mask (the root at index 0, draft token i at index i + 1): each row is true exactly at the node itself and all its ancestors (the root is everyone's ancestor); siblings, cousins and descendants are false
    raise TaskNotDone("spec_tree", "tree_mask")


def tree_positions(draft: DraftTree, root_position: int) -> torch.Tensor:
    """树根和每个草稿 token 的位置：``root_position`` 加深度（树根的深度是 0）。

    en: The positions of the root and of each draft token: ``root_position`` plus the depth (the root's is 0).
    """
    # TODO 任务 tree_positions：返回 n + 1 个位置（64 位整数的一维张量）：树根就在给定的树根位置，每个草稿 token 在树根位置加它的深度，而不是加它在输入里的下标
    # TODO task tree_positions: return n + 1 positions (a one-dimensional tensor of 64-bit integers): the root at the root position given, each draft token at the root position plus its depth, not plus its index in the input
    raise TaskNotDone("spec_tree", "tree_positions")


def accept_greedy(draft: DraftTree, target: Sequence[int]) -> tuple[list[int], list[int]]:
    """贪心地接受：``target[i]`` 是节点 i（0 是树根）上目标模型的 argmax。返回（接受的草稿节点的下标，从 1 起，
    从浅到深；这一步出的 token：接受的草稿 token 加上最后的 bonus）。

    en: Greedy acceptance: ``target[i]`` is the target model's argmax at node i (0 is the root). Returns (the indices of
    the accepted draft nodes, from 1, shallow to deep; the tokens this step yields: the accepted draft tokens followed
    by the bonus).
    """
    # TODO 任务 accept_greedy：从树根（节点 0）往下走：当前节点上目标模型要的 token（target[节点]）先记进输出；它的孩子里有 token 等于它的，就接受那个孩子（记下下标、走过去）接着来；没有就停——最后记进输出的那个就是白送的 token。返回（接受的节点下标，从浅到深；输出的 token）
    # TODO task accept_greedy: walk down from the root (node 0): the token the target model wants at the current node (target[node]) goes into the output first; if one of its children carries that token, accept that child (note its index, move there) and go on; if none does, stop: the last token written to the output is the bonus. Return (the accepted node indices, shallow to deep; the output tokens)
    raise TaskNotDone("spec_tree", "accept_greedy")


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
    # TODO 任务 accept_sampled：从树根起：p 是当前节点的分布（一份拷贝，双精度）；按顺序试它的孩子：孩子的 token x 以 p[x] / p.sum() 的概率被接受（一个 [0, 1) 的均匀随机数乘 p.sum() 小于 p[x]），接受就记下它、输出 x、走过去从它的分布接着来；不接受就把 p[x] 置 0 再试下一个。没有孩子被接受时，从剩下的 p（归一化之后）用 multinomial 采一个 token 输出，结束。随机数都取自 generator。返回值同 accept_greedy
    # TODO task accept_sampled: from the root: p is the current node's distribution (a copy, double precision); try its children in order: a child's token x is accepted with probability p[x] / p.sum() (a uniform random number in [0, 1) times p.sum() below p[x]); if accepted, note it, output x and move there, going on from its distribution; if not, set p[x] to 0 and try the next. When no child is accepted, sample one token from what is left of p (normalised) with multinomial, output it and stop. All random numbers come from generator. Returns the same as accept_greedy
    raise TaskNotDone("spec_tree", "accept_sampled")
