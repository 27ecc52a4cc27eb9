"""第 5 阶段里程碑（投机解码）：真权重的 SmolLM2（float32）照着提示词里给的一段文字或代码抄写、改写，贪心；同一次运行里
轮流跑不投机的引擎和 ``speculative_algorithm="NGRAM"`` 的引擎。

1. 两个引擎、几个“照着输入写”的提示词（n-gram 猜得中的那种）；
2. 投机解码的输出与不投机的逐 token 相同（每一轮、每个提示词都比）；
3. 接受了多少：带草稿的验证次数、猜了几个 token、接受了几个，平均每次验证出几个 token（含白送的那个）；
4. 快了多少：第一个 token 之后的解码速度，投机 ÷ 不投机，每轮一个比值（每轮从一棵空的 n-gram 树开始，
   ``llm.loop.forget()``），报中位数和最小、最大。

    python examples/stage5_milestone.py
    python examples/stage5_milestone.py --rounds 5 --max-tokens 128

en: Stage 5 milestone (speculative decoding): SmolLM2 with its real weights (float32) copies and edits a passage or
code given in the prompt, greedily; a plain engine and a ``speculative_algorithm="NGRAM"`` engine take turns in one run.

1. the two engines and a few input-grounded prompts (the kind the n-grams guess well);
2. speculative decoding's output is token for token the plain one (compared in every round, for every prompt);
3. how much was accepted: verifications with a draft, draft tokens proposed and accepted, the tokens per verification
   (the bonus included);
4. how much faster: the decode speed after the first token, speculative ÷ plain, one ratio per round (each round
   starts from an empty n-gram tree, ``llm.loop.forget()``), reported as median, min and max.

    python examples/stage5_milestone.py
    python examples/stage5_milestone.py --rounds 5 --max-tokens 128
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from minisgl import model_zoo
from minisgl.i18n import tr

PASSAGE = ("A paged KV cache splits the keys and values of every request into pages of a fixed size. The page table "
           "maps each position of a request to a slot in the pool, so a request can grow without moving what it "
           "already wrote, and a finished request gives its pages back at once.")
CODE = ("def count_words(lines):\n    counts = {}\n    for line in lines:\n        for word in line.split():\n"
        "            counts[word] = counts.get(word, 0) + 1\n    return counts\n")
#: 照着输入写的提示词：（名字, 提示词）；名字的说明见 :func:`describe`。
#: en: Input-grounded prompts: (a name, the prompt); :func:`describe` says what each is.
PROMPTS = [
    ("copy", f"Copy this text exactly, word for word:\n{PASSAGE}"),
    ("rename", f"Rename the variable counts to totals in this code and print the whole code:\n{CODE}"),
    ("repeat", f"Repeat the following paragraph twice:\n{PASSAGE}"),
]
NEW_TOKENS = 96
ROUNDS = 3
#: 两个引擎共用的设置（只差 ``speculative_algorithm``）。
#: en: The settings both engines share (they differ only in ``speculative_algorithm``).
ENGINE = {"dtype": torch.float32, "max_running_req": 4, "max_seq_len_override": 512}


def describe(name: str) -> str:
    """提示词的简短说明（按当前语言）。

    en: A prompt's short description (in the current language)."""
    return {"copy": tr("copy a passage"), "rename": tr("rename a variable in code"),
            "repeat": tr("repeat a paragraph")}[name]


def chat_ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """套上模型的对话模板，得到 token。

    en: Apply the model's chat template, giving tokens."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                          return_dict=False) for t in texts]


def one_round(llm: Any, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float, int]:
    """每个提示词单独生成一遍（批大小 1），返回（每个的 token，第一个 token 之后的秒数，第一个 token 之后的 token 数）。
    投机的引擎先从一棵空的 n-gram 树开始：不然它照抄上一轮的输出，量的是记性，不是投机。

    en: Generate each prompt alone (batch 1); return (each one's tokens, the seconds after the first token, the tokens
    after the first). The speculating engine starts from an empty n-gram tree first: otherwise it copies the previous
    round's output, which measures memory, not speculation.
    """
    from minisgl.core import SamplingParams

    if llm.loop.spec_stats is not None:
        llm.loop.forget()
    sp = SamplingParams(max_tokens=max_tokens)
    outputs, seconds, tokens = [], 0.0, 0
    for prompt in prompts:  # 同一轮里的请求互相借 n-gram，和服务时一样 | en: requests of one round share n-grams, as when serving
        first: list[float] = []
        stop = llm.add_result_listener(lambda e: first.append(time.perf_counter()) if not first else None)
        try:
            ids = llm.generate([prompt], sp)[0]["token_ids"]
        finally:
            stop()
        seconds += time.perf_counter() - first[0]
        tokens += len(ids) - 1
        outputs.append(ids)
    return outputs, seconds, tokens


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from minisgl.llm import LLM

    parser = argparse.ArgumentParser(description=tr("Stage 5 milestone: speculative decoding against plain decoding, same run"))
    parser.add_argument("--model", default=str(model_zoo.smollm2()), help=tr("model directory (default: SmolLM2, built by setup)"))
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=tr("timed rounds after one untimed round (default {n})", n=ROUNDS))
    parser.add_argument("--max-tokens", type=int, default=NEW_TOKENS,
                        help=tr("tokens generated per request at most (default {n})", n=NEW_TOKENS))
    parser.add_argument("--device", default="cpu", help=tr("cpu (default) or cuda"))
    args = parser.parse_args(argv)

    print(tr("1. Two engines on {model} (float32, {device}): plain, and speculative_algorithm=\"NGRAM\"",
             model=args.model.rstrip("/").split("/")[-1], device=args.device))
    plain = LLM(args.model, device=args.device, **ENGINE)
    spec = LLM(args.model, device=args.device, speculative_algorithm="NGRAM", **ENGINE)
    try:
        prompts = chat_ids(plain.tokenizer, [text for _, text in PROMPTS])
        print(tr("   {n} prompts that copy or edit a passage or code given in them, greedy, at most {new} new tokens each:",
                 n=len(prompts), new=args.max_tokens))
        for (what, _), ids in zip(PROMPTS, prompts):
            print(tr("   - {what} ({n} prompt tokens)", what=describe(what), n=len(ids)))

        # 第 0 轮不计时（预热），但也比 token、也数接受了多少；之后各轮计时
        # en: round 0 is not timed (the warm-up) but its tokens are compared and its acceptance counted too; the
        # en: rounds after it are timed
        same, rates, ratios = True, {"plain": [], "ngram": []}, []
        reference: list[list[int]] = []
        for round_ in range(args.rounds + 1):
            ours, plain_s, plain_n = one_round(plain, prompts, args.max_tokens)
            theirs, spec_s, spec_n = one_round(spec, prompts, args.max_tokens)
            if round_ == 0:  # 引擎新建的，统计就是这一轮的 | en: a new engine: the statistics are this round's
                reference, stats = ours, spec.loop.spec_stats
                proposed, accepted, verifies = stats.proposed, stats.accepted, stats.verifies
            same = same and ours == reference and theirs == reference
            if round_:
                rates["plain"].append(plain_n / plain_s)
                rates["ngram"].append(spec_n / spec_s)
                ratios.append(rates["ngram"][-1] / rates["plain"][-1])

        print(tr("\n2. The same tokens"))
        for (what, _), ids in zip(PROMPTS, reference):
            print(tr("   {what}: {n} tokens", what=describe(what), n=len(ids)))
        print(tr("   the answer to \"{what}\" begins: {text!r}", what=describe(PROMPTS[0][0]),
                 text=plain.tokenizer.decode(reference[0][:24])))
        print(tr("   speculative decoding gives exactly the plain tokens, every prompt, every round: {same}", same=same))

        print(tr("\n3. Acceptance (one round: {n} prompts from an empty n-gram tree)", n=len(prompts)))
        per_verification = (accepted + verifies) / verifies if verifies else 0.0
        print(tr("   verifications with a draft: {verifies}; draft tokens proposed {proposed}, accepted {accepted} ({share:.0%})",
                 verifies=verifies, proposed=proposed, accepted=accepted, share=accepted / max(proposed, 1)))
        print(tr("   tokens per verification with a draft (the bonus included): {mean:.2f}", mean=per_verification))

        print(tr("\n4. Decode speed after the first token, {rounds} rounds, each from an empty n-gram tree",
                 rounds=args.rounds))
        for r, (p, s, ratio) in enumerate(zip(rates["plain"], rates["ngram"], ratios), start=1):
            print(tr("   round {r}: plain {p:.1f} tok/s, speculative {s:.1f} tok/s: {ratio:.2f}×", r=r, p=p, s=s, ratio=ratio))
        if ratios:
            print(tr("   speculative ÷ plain: median {median:.2f}× (min {lo:.2f}×, max {hi:.2f}×)",
                     median=statistics.median(ratios), lo=min(ratios), hi=max(ratios)))
    finally:
        plain.shutdown()
        spec.shutdown()
    return {"equal": same, "proposed": proposed, "accepted": accepted, "verifies": verifies,
            "per_verification": per_verification, "ratios": ratios, "rates": rates}


if __name__ == "__main__":
    main()
