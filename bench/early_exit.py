"""自推测（early exit）起草能被接受多少、快不快：同一个模型的普通解码，和 ``speculative_algorithm="EARLY_EXIT"`` 用前
k 层起草（每个 k 一个引擎），在同一次运行里轮流跑，批大小 1。工作负载、计时和 ``ours`` 都是 ``bench/speculative.py``
的（照着输入写的 grounded 和自由对话 chat，SmolLM2 的对话模板，贪心）。

每个 k 报：每次带草稿的验证平均出几个 token（含白送的那个），草稿 token 的接受率（接受的 ÷ 验证过的），每次验证出几个
token 的直方图，以及解码速度（token/s，第一个 token 之后）和对普通解码的比值（每轮一个，中位数和最小、最大）。前两样
不依赖计时；投机的主循环猜错了会让请求歇几步、命中率低时猜得短，所以它们量的是引擎真的走过的验证。

    python bench/early_exit.py                              # 缺省：SmolLM2，k = 4 8 15 22，1 轮，每个请求 128 个 token
    python bench/early_exit.py --layers 8 22 --rounds 3 --max-tokens 256

en: How much of the self-speculative (early-exit) drafts is accepted, and how fast it is: plain decoding of one model and
``speculative_algorithm="EARLY_EXIT"`` drafting with the first k layers (one engine per k), taking turns in one run, at
batch 1. Workloads, timing and ``ours`` come from ``bench/speculative.py`` (grounded: writing from the input; chat: free
questions; SmolLM2's chat template, greedy).

For each k: the mean tokens per verification with a draft (the bonus included), the acceptance rate of the draft tokens
(accepted ÷ verified), the histogram of tokens per verification, and the decode speed (token/s after the first token)
with its ratio to plain decoding (one per round: median, min and max). The first two depend on no timing; the
speculative main loop rests a request after misses and guesses short when the hit rate is low, so they measure the
verifications the engine really made.

    python bench/early_exit.py                              # default: SmolLM2, k = 4 8 15 22, 1 round, 128 tokens per request
    python bench/early_exit.py --layers 8 22 --rounds 3 --max-tokens 256
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.common import Stats, ratio_stats
from bench.speculative import WORKLOADS, chat_ids, ours, start
from minisgl.i18n import tr


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=tr("Early-exit drafting against plain decoding, same run"))
    parser.add_argument("--model", type=Path, default=None, help=tr("model directory (default: SmolLM2, built by setup)"))
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 8, 15, 22],
                        help=tr("draft depths k to measure (default 4 8 15 22)"))
    parser.add_argument("--rounds", type=int, default=1, help=tr("measured rounds (default 1; each engine first warms up on one short request)"))
    parser.add_argument("--max-tokens", type=int, default=128, help=tr("tokens generated per request at most (default 128)"))
    parser.add_argument("--prompts", type=int, default=8, help=tr("prompts per workload (default 8, all of them)"))
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS),
                        help=tr("workloads to run (default: all)"))
    args = parser.parse_args(argv)
    from minisgl.llm import LLM

    model, kw = start(args.model)
    engines: dict[str, Any] = {"plain": LLM(model, **kw)}
    for k in args.layers:
        engines[f"k={k}"] = LLM(model, speculative_algorithm="EARLY_EXIT", speculative_draft_layers=k, **kw)
    tok = engines["plain"].tokenizer
    try:
        for name in args.workloads:
            prompts = chat_ids(tok, WORKLOADS[name][: args.prompts])
            samples: dict[str, list[float]] = {case: [] for case in engines}
            for case, engine in engines.items():  # 热身：一个短请求 | en: warm-up: one short request
                ours(engine, prompts[:1], 8, 1)
            before = {case: _counts(e) for case, e in engines.items() if case != "plain"}
            for _ in range(args.rounds):
                for case, engine in engines.items():
                    seconds, tokens = ours(engine, prompts, args.max_tokens, 1)
                    samples[case].append(tokens / seconds)
            stats = {case: Stats.of(s) for case, s in samples.items()}
            print()
            print(tr("{workload}, batch 1, {n} prompts, at most {m} tokens each: tokens per verification with a draft, "
                     "acceptance rate, token/s median (min - max)", workload=name, n=len(prompts), m=args.max_tokens))
            print(f"  {'plain':<8} {'':>8} {'':>8}  {stats['plain']}")
            for case, engine in engines.items():
                if case == "plain":
                    continue
                proposed, accepted, verifies, lengths = (a - b for a, b in zip(_counts(engine), before[case]))
                per_step = (accepted + verifies) / verifies if verifies else 0.0
                rate = accepted / proposed if proposed else 0.0
                ratio = ratio_stats(stats[case], stats["plain"])
                print(f"  {case:<8} {per_step:>8.2f} {rate:>8.1%}  {stats[case]}   " + tr("{ratio} plain", ratio=ratio))
                print("           " + tr("tokens per verification: verifications {hist}", hist=dict(sorted(lengths.items()))))
    finally:
        for engine in engines.values():
            engine.shutdown()


def _counts(engine: Any) -> tuple[int, int, int, Any]:
    """引擎到现在为止的（验证过的草稿 token, 接受的, 带草稿的验证次数, 每次出几个 token 的直方图）。"""
    s = engine.loop.spec_stats
    return s.proposed, s.accepted, s.verifies, s.accept_lengths.copy()


if __name__ == "__main__":
    main()
