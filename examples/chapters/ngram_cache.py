"""第 5.1 章示例：n-gram 缓存怎样猜。先用一句一个词一个 token 的小句子看清楚树里存了什么、哪个窗口胜出、草稿树
长什么样、宽度怎样随窗口收窄、分几次写和一次写得到同一棵树、容量满了删哪些叶子；再在真实分词器的 token 上数一数：
照抄一段给定的文字时，每一步的草稿里有几个 token 正好是接下来要写的。

    python examples/chapters/ngram_cache.py

en: Chapter 5.1 example: how the n-gram cache guesses. First a small sentence with one word per token, to see what the
tree holds, which window wins, what a draft tree looks like, how the breadth narrows with the window, that writing in
pieces builds the same tree as writing at once, and which leaves go when the capacity is reached; then, on the real
tokenizer's tokens, a count of how many tokens of each step's draft are exactly the next ones when copying a given text.

    python examples/chapters/ngram_cache.py
"""

from __future__ import annotations

from transformers import AutoTokenizer

from minisgl.i18n import tr
from minisgl.model_zoo import tokenizer_dir
from minisgl.ngram_cache import DraftTree, NgramCache
from minisgl.spec_tree import accept_greedy

TEXT = "the cat sat on the mat . the cat ate the fish . the dog sat on the cat ."
WORDS = sorted(set(TEXT.split()))
#: 一个词一个 token：词在排好序的词表里的下标。
#: en: one word, one token: the word's index in the sorted vocabulary.
ID = {w: i for i, w in enumerate(WORDS)}


def ids(text: str) -> list[int]:
    return [ID[w] for w in text.split()]


def words(tokens: tuple[int, ...] | list[int]) -> str:
    return " ".join(WORDS[t] for t in tokens)


def show_draft(draft: DraftTree) -> None:
    """草稿树一行一个节点：缩进是深度，后面是它在草稿里的下标和父节点的下标（-1 是树根）。

    en: One line per draft node: the indent is its depth, then its index in the draft and its parent's (-1 the root)."""
    depths = draft.depths()

    def walk(parent: int) -> None:
        for i, p in enumerate(draft.parents):
            if p == parent:
                print(tr("    {indent}{word!r}  (index {i}, parent {p}, depth {d})", indent="  " * (depths[i] - 1),
                         word=WORDS[draft.tokens[i]], i=i, p=p, d=depths[i]))
                walk(i)

    walk(-1)


def words_demo() -> None:
    print(tr("== 1. One word, one token =="))
    cache = NgramCache(min_window=1, max_window=3, min_breadth=1, max_breadth=3, branch_length=3, num_draft=6)
    tokens = ids(TEXT)
    cache.put(tokens)
    print(tr("put {n} tokens ({text!r}): {size} nodes in the tree (paths of at most max_window + branch_length = {span})",
             n=len(tokens), text=TEXT, size=cache.size, span=cache.max_window + cache.branch_length))
    for window in range(cache.min_window, cache.max_window + 1):
        print(tr("  a window of {w} token(s) expands at most {b} children per node", w=window, b=cache._breadth(window)))
    for context in ("we saw the cat", "a dog sat on", "under the", "a fish swam"):
        draft = cache.propose(ids_or_unknown(context))
        print(tr("propose after {text!r}: {n} draft tokens, tokens {tokens!r}, parents {parents}",
                 text=context, n=len(draft), tokens=words(draft.tokens), parents=list(draft.parents)))
        show_draft(draft)
    # 分几次写（每次多一个 token，since 是上一次的长度）和一次写完，是同一棵树
    # en: writing in pieces (one token more each time, since = the previous length) builds the tree written at once
    pieces = NgramCache(min_window=1, max_window=3, min_breadth=1, max_breadth=3, branch_length=3, num_draft=6)
    for end in range(1, len(tokens) + 1):
        pieces.put(tokens[:end], since=end - 1)
    same = all(pieces.propose(ids_or_unknown(c)) == cache.propose(ids_or_unknown(c))
               for c in ("we saw the cat", "a dog sat on", "under the"))
    print(tr("written one token at a time: {size} nodes, the same drafts: {same}", size=pieces.size, same=same))
    small = NgramCache(min_window=1, max_window=3, min_breadth=1, max_breadth=3, branch_length=3, num_draft=6,
                       capacity=30)
    small.put(tokens)
    print(tr("capacity 30: after the same put {size} nodes are left (evicted down to nine tenths, 27)",
             size=small.size))
    for context in ("the cat sat on", "the dog sat on"):
        draft = small.propose(ids_or_unknown(context))
        print(tr("  propose after {text!r}: {tokens!r}", text=context, tokens=words(draft.tokens)))


def ids_or_unknown(text: str) -> list[int]:
    """不在词表里的词换成一个树里没有的 token。

    en: A word outside the vocabulary becomes a token the tree has never seen."""
    return [ID.get(w, len(WORDS)) for w in text.split()]


PASSAGE = ("The radix cache keeps the keys and values of every prefix it has seen. When a new request arrives, the "
           "scheduler looks up the longest cached prefix, reuses its slots and computes only the rest.")


def copy_demo() -> None:
    print(tr("\n== 2. Copying a given text, on real tokens =="))
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    prompt = tok.encode("Copy this text exactly, word for word:\n" + PASSAGE + "\n\n")
    answer = tok.encode(PASSAGE)
    cache = NgramCache()  # SGLang 的缺省值 | en: SGLang's defaults
    tokens = list(prompt)
    cache.put(tokens)
    per_step: list[int] = []
    guessed, proposed = 0, 0
    while len(tokens) < len(prompt) + len(answer):
        done = len(tokens) - len(prompt)
        draft = cache.propose(tokens)
        # 一个“知道答案”的验证者：每个节点要的 token 就是照抄时的下一个 token
        # en: a verifier that "knows the answer": the token each node wants is the next one of the copy
        depths = [0] + draft.depths()
        target = [answer[min(done + d, len(answer) - 1)] for d in depths]
        path, run = accept_greedy(draft, target)
        run = run[: len(answer) - done]
        per_step.append(len(run))
        guessed, proposed = guessed + len(path), proposed + len(draft)
        since = len(tokens)
        tokens += run
        cache.put(tokens, since)
    print(tr("{n} tokens copied in {steps} steps (plain decoding: {n} steps); {g} of {p} draft tokens were right",
             n=len(answer), steps=len(per_step), g=guessed, p=proposed))
    print(tr("  tokens per step: {runs} (the first step finds no match: its window occurs only at the very end)",
             runs=per_step))


if __name__ == "__main__":
    words_demo()
    copy_demo()
