"""n-gram 草稿能被接受多少（不是测试，也不计时）：先让引擎不投机地贪心解码一批请求，再把每个请求的输出按投机
解码的步子重放一遍——每一步让 :class:`~minisgl.ngram_cache.NgramCache` 按已有的 token 猜一棵树，数真实的输出里
接受了几个（:func:`~minisgl.spec_tree.accept_greedy`，加上白送的那个）。投机解码和不投机时逐 token 相同，所以
这个数就是引擎投机时每一步能出的 token 数，不依赖计时，每次都一样。

工作负载：输出会重复输入的请求（照抄一段文字、改一段代码里的名字、把列表改成 JSON），和一组普通的问答作对照。

    python bench/ngram_acceptance.py                        # 缺省：SmolLM2（setup 建好的）
    python bench/ngram_acceptance.py --model models/qwen3-tiny-random --max-tokens 64

en: How much of the n-gram drafts would be accepted (not a test, and nothing is timed): the engine first decodes a batch
of requests greedily without speculating; each request's output is then replayed step by step as speculative decoding
would take it: at each step :class:`~minisgl.ngram_cache.NgramCache` guesses a tree from the tokens so far, and the
accepted part is counted against the real output (:func:`~minisgl.spec_tree.accept_greedy`, plus the token given for
free). Speculative decoding yields exactly the tokens plain decoding does, so this count is what each speculative step
of the engine would yield; it depends on no timing and is the same on every run.

The workload: requests whose output repeats their input (copying a passage, renaming in a piece of code, turning a list
into JSON), and a group of ordinary questions for comparison.

    python bench/ngram_acceptance.py                        # default: SmolLM2 (built by setup)
    python bench/ngram_acceptance.py --model models/qwen3-tiny-random --max-tokens 64
"""

from __future__ import annotations

import argparse
import collections
import statistics
from pathlib import Path
from typing import Sequence

import torch

from minisgl import model_zoo
from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.ngram_cache import DraftTree, NgramCache
from minisgl.spec_tree import accept_greedy

PASSAGE = ("The radix cache keeps the keys and values of every prefix it has seen. When a new request arrives, the "
           "scheduler looks up the longest cached prefix, reuses its slots and computes only the rest.")
CODE = ("def total(items):\n    result = 0\n    for item in items:\n        result = result + item.price * item.count\n"
        "    return result\n")
WORKLOADS = {
    "repeats": [
        f"Copy this text exactly, word for word:\n{PASSAGE}\nCopy:\n",
        f"Rename the variable result to acc in this code and print the whole code:\n{CODE}\nNew code:\n",
        "Turn this list into a JSON array of objects with name and age: Alice 30, Bob 25, Carol 41, Dave 35, Eve 28.\nJSON:\n",
        f"Repeat the following paragraph twice:\n{PASSAGE}\n",
    ],
    "questions": [
        "What is the capital of France? Answer in one sentence.",
        "Give three tips for writing clear code.",
        "Explain what a hash table is to a child.",
        "Why is the sky blue?",
    ],
}
#: 比较的草稿设置：（名字, NgramCache 的参数）。
#: en: The draft settings compared: (name, NgramCache parameters).
SETTINGS = [
    ("chain-4", dict(max_window=4, max_breadth=1, num_draft=4)),
    ("chain-8", dict(max_window=8, max_breadth=1, num_draft=8)),
    ("tree-12", dict(max_window=12, min_breadth=1, max_breadth=10, num_draft=12)),
]


def true_targets(draft: DraftTree, truth: Sequence[int]) -> list[int]:
    """节点 i（0 是树根）上目标模型的 argmax：在真实输出那条路上的节点就是真实输出里它后面那个 token；不在那条路上的
    节点贪心接受永远走不到，随便填（-1）。

    en: The target model's argmax at node i (0 is the root): for a node on the real output's path, the real next token;
    nodes off that path are never reached by greedy acceptance, so anything goes (-1).
    """
    depths = [0] + draft.depths()
    on_path = [True] + [False] * len(draft)
    for i, parent in enumerate(draft.parents, start=1):
        d = depths[i]
        on_path[i] = on_path[parent + 1] and d <= len(truth) and draft.tokens[i - 1] == truth[d - 1]
    return [truth[depths[i]] if on_path[i] and depths[i] < len(truth) else -1 for i in range(len(draft) + 1)]


def replay(cache: NgramCache, prompt: list[int], output: list[int]) -> list[tuple[int, int]]:
    """把一个请求的输出按投机的步子重放：每一步的（猜了几个, 接受了几个）。

    en: Replay one request's output in speculative steps: (tokens guessed, tokens accepted) for each step.
    """
    seq = list(prompt)
    cache.put(seq)
    steps, t = [], 0
    while t < len(output):
        draft = cache.propose(seq)
        path, out = accept_greedy(draft, true_targets(draft, output[t:]))
        out = out[: len(output) - t]  # 最后一步：输出到头了 | en: the last step: the output ends
        steps.append((len(draft), len(path)))
        since = len(seq)
        seq += out
        t += len(out)
        cache.put(seq, since)
    return steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=tr("How much of the n-gram drafts greedy decoding would accept (replayed, not timed)"))
    parser.add_argument("--model", type=Path, default=None, help=tr("model directory (default: SmolLM2, built by setup)"))
    parser.add_argument("--max-tokens", type=int, default=128, help=tr("tokens generated per request (default 128)"))
    args = parser.parse_args(argv)
    from minisgl.llm import LLM

    model = args.model or model_zoo.smollm2()
    llm = LLM(str(model), dtype=torch.float32, device="cpu", max_running_req=8)
    try:
        greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
        runs = {}
        for name, prompts in WORKLOADS.items():
            ids = [llm.tokenizer.encode(p) for p in prompts]
            runs[name] = list(zip(ids, [o["token_ids"] for o in llm.generate(ids, greedy)]))
    finally:
        llm.shutdown()
    print(tr("model {model}; greedy, {n} tokens at most per request; each step yields the accepted draft tokens plus one",
             model=model.name, n=args.max_tokens))
    print(tr("workload   drafts    tokens  steps   tok/step  guessed  accepted  accepted per step: steps"))
    for name, pairs in runs.items():
        for setting, kwargs in SETTINGS:
            cache = NgramCache(**kwargs)
            steps = [s for prompt, output in pairs for s in replay(cache, prompt, output)]
            tokens = sum(len(output) for _, output in pairs)
            guessed = sum(g for g, _ in steps)
            accepted = sum(a for _, a in steps)
            hist = collections.Counter(a for _, a in steps)
            print(f"{name:<10} {setting:<8} {tokens:>7} {len(steps):>6} {tokens / max(1, len(steps)):>10.2f} "
                  f"{statistics.fmean(g for g, _ in steps) if steps else 0:>8.1f} "
                  f"{accepted / max(1, guessed):>9.1%}  " + " ".join(f"{k}:{hist[k]}" for k in sorted(hist)))


if __name__ == "__main__":
    main()
