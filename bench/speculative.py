"""投机解码快多少：同一个引擎开着和关着 ``speculative_algorithm="NGRAM"``，在同一次运行里轮流跑，报比值（每轮一个，
中位数和最小、最大）；装了 llama-cpp-python 时再加上 llama.cpp 的普通解码和它的提示词查找解码
（``LlamaPromptLookupDecoding``），同一份 F32 权重。

投机的引擎每一轮都从一棵空的 n-gram 树开始（各轮用同样的提示词，照抄上一轮的输出量的就是记性，不是投机）；同一轮里
的请求互相借 n-gram，和服务时一样。

两种工作负载，都用 SmolLM2 的对话模板、贪心：
- **照着输入写**（grounded）：改写、摘录、编辑提示词里给出的一段文字或代码——输出大段重复输入，n-gram 猜得中；
- **自由对话**（chat）：普通的问题，几乎没有可照抄的。

批大小 1：每个请求单独跑，计的是第一个 token 之后的解码（token/s = 之后的 token 数 ÷ 之后的时间）；批大小 8：一批
8 个请求，计从提交到全部结束（预填充两边一样，也算在内）。投机解码和不投机时逐 token 相同（检查里比过），所以
比的是同样的输出用了多久；另报每次带草稿的验证平均出几个 token（含白送的那个），它不依赖计时。

    python bench/speculative.py                 # 缺省：3 轮，每个请求最多 256 个 token
    python bench/speculative.py --rounds 5 --llamacpp

en: How much faster speculative decoding is: the same engine with ``speculative_algorithm="NGRAM"`` on and off, taking
turns in one run, reporting ratios (one per round: median, min and max); with llama-cpp-python installed, also
llama.cpp's plain decoding and its prompt-lookup decoding (``LlamaPromptLookupDecoding``) on the same F32 weights.

Each round starts the speculating engine from an empty n-gram tree (the rounds reuse their prompts, and copying the
previous round's outputs would measure memory, not speculation); within a round, requests share n-grams as when serving.

Two workloads, both with SmolLM2's chat template, greedy:
- **grounded**: rewrite, extract or edit a passage or code given in the prompt: the output repeats the input at length,
  so the n-grams guess well;
- **chat**: ordinary questions, with next to nothing to copy.

Batch 1: each request runs alone and the decode after the first token is timed (token/s = tokens after the first ÷ the
time after it); batch 8: one batch of 8 requests, timed from submission to the end (the prefill is the same on both
sides and included). Speculative decoding yields exactly the plain tokens (the checks compare them), so the comparison
is how long the same output takes; the mean tokens per verification with a draft (the bonus included) is reported too,
and depends on no timing.

    python bench/speculative.py                 # default: 3 rounds, at most 256 tokens per request
    python bench/speculative.py --rounds 5 --llamacpp
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable

from bench.common import Stats, ratio_stats
from bench.machine import machine_info
from minisgl import model_zoo
from minisgl.core import SamplingParams
from minisgl.i18n import tr

PASSAGE = ("The radix cache keeps the keys and values of every prefix it has seen. When a new request arrives, the "
           "scheduler looks up the longest cached prefix, reuses its slots and computes only the rest. Pages that no "
           "request holds stay in the tree until memory runs short; then the least recently used leaves go first.")
CODE = ("def total(items):\n    result = 0\n    for item in items:\n        if item.count > 0:\n"
        "            result = result + item.price * item.count\n    return result\n\n"
        "def average(items):\n    if not items:\n        return 0\n    return total(items) / len(items)\n")
GROUNDED = [
    f"Copy this text exactly, word for word:\n{PASSAGE}",
    f"Rewrite this passage in the past tense:\n{PASSAGE}",
    f"Rename the variable result to acc in this code and print the whole code:\n{CODE}",
    f"Add a docstring to each function in this code and print the whole code:\n{CODE}",
    f"Extract every sentence of this passage that mentions the cache, one per line:\n{PASSAGE}",
    f"Fix the spelling in this text and print it: {PASSAGE.replace('the ', 'teh ')}",
    f"Translate this code's comments into French and print the code (it has none, so print it unchanged):\n{CODE}",
    f"Repeat the following paragraph twice:\n{PASSAGE}",
]
CHAT = [
    "What is the capital of France? Answer in one sentence.", "Give three tips for writing clear code.",
    "Explain what a hash table is to a child.", "Why is the sky blue?", "Write a short poem about the sea.",
    "How do I make a cup of tea?", "What are the planets of the solar system?", "Tell me a story about a dragon.",
]
WORKLOADS = {"grounded": GROUNDED, "chat": CHAT}


def chat_ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                          return_dict=False) for t in texts]


def ours(llm: Any, prompts: list[list[int]], max_tokens: int, batch: int) -> tuple[float, int]:
    """（秒, token 数）：批大小 1 计每个请求第一个 token 之后的解码，批大小 8 计整批从提交到结束。

    en: (seconds, tokens): with batch 1 the decode after each request's first token, with batch 8 the whole batch from
    submission to the end.
    """
    sp = SamplingParams(max_tokens=max_tokens)
    if llm.loop.spec_stats is not None:  # 每一轮从空的 n-gram 树开始：不照抄上一轮 | en: each round from an empty n-gram tree: no copying the last round
        llm.loop.forget()
    if batch > 1:
        start = time.perf_counter()
        outs = llm.generate(prompts, sp)
        return time.perf_counter() - start, sum(len(o["token_ids"]) for o in outs)
    seconds, tokens = 0.0, 0
    for prompt in prompts:  # 同一轮里的请求互相借 n-gram，和服务时一样 | en: requests of one round share n-grams, as when serving
        first: list[float] = []
        stop = llm.add_result_listener(lambda e: first.append(time.perf_counter()) if not first else None)
        try:
            n = len(llm.generate([prompt], sp)[0]["token_ids"])
        finally:
            stop()
        seconds += time.perf_counter() - first[0]
        tokens += n - 1
    return seconds, tokens


def llamacpp_decode(llama: Any, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    """llama.cpp（``create_completion``，贪心、流式）每个请求第一个 token 之后的解码：（秒, token 数）。

    en: llama.cpp (``create_completion``, greedy, streamed): the decode after each request's first token: (seconds,
    tokens).
    """
    seconds, tokens = 0.0, 0
    for prompt in prompts:
        llama.reset()
        first, n = None, 0
        for _ in llama.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, top_k=1, stream=True):
            first = first or time.perf_counter()
            n += 1
        seconds += time.perf_counter() - first
        tokens += n - 1
    return seconds, tokens


def start(model: Path | None) -> tuple[str, dict[str, Any]]:
    """打印机器那一行，返回模型目录（缺省 SmolLM2）和各引擎共用的设置（这里的投机基准都用它）。

    en: Print the machine line; return the model directory (SmolLM2 by default) and the settings every engine shares
    (the speculative benchmarks here all use it)."""
    import torch

    info = machine_info()
    print(tr("machine: {cpu}, {cores} cores; load at start {load}", cpu=info["cpu"], cores=info["cores"],
             load=info.get("load_at_start")))
    return str(model or model_zoo.smollm2()), dict(dtype=torch.float32, device="cpu", max_running_req=8,
                                                   max_seq_len_override=1024)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=tr("Speculative decoding against plain decoding, same run"))
    parser.add_argument("--model", type=Path, default=None, help=tr("model directory (default: SmolLM2, built by setup)"))
    parser.add_argument("--rounds", type=int, default=3, help=tr("measured rounds after one warm-up round (default 3)"))
    parser.add_argument("--max-tokens", type=int, default=256, help=tr("tokens generated per request at most (default 256)"))
    parser.add_argument("--llamacpp", action="store_true",
                        help=tr("add llama.cpp, plain and with prompt lookup, at batch 1 (needs llama-cpp-python)"))
    args = parser.parse_args(argv)
    import torch

    from minisgl.llm import LLM

    model, kw = start(args.model)
    engines = {"plain": LLM(model, **kw), "ngram": LLM(model, speculative_algorithm="NGRAM", **kw)}
    tok = engines["plain"].tokenizer
    llamas: dict[str, Any] = {}
    if args.llamacpp:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from bench import llamacpp

        threads = torch.get_num_threads()
        llamas["llama.cpp"] = llamacpp.load(threads, n_ctx=1024)
        llamas["llama.cpp lookup"] = llamacpp.load(threads, n_ctx=1024,
                                                   draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))
    try:
        for name, texts in WORKLOADS.items():
            prompts = chat_ids(tok, texts)
            for batch in (1, 8):
                cases: dict[str, Callable[[], tuple[float, int]]] = {
                    engine: (lambda e=e: ours(e, prompts, args.max_tokens, batch)) for engine, e in engines.items()}
                if batch == 1:
                    cases.update({n: (lambda l=l: llamacpp_decode(l, prompts, args.max_tokens)) for n, l in llamas.items()})
                samples: dict[str, list[float]] = {c: [] for c in cases}
                before = engines["ngram"].loop.spec_stats
                accepted0, verifies0 = before.accepted, before.verifies
                for round_ in range(args.rounds + 1):
                    for case, run in cases.items():
                        seconds, tokens = run()
                        if round_:
                            samples[case].append(tokens / seconds)
                stats = {c: Stats.of(s) for c, s in samples.items()}
                spec = engines["ngram"].loop.spec_stats
                verifies = spec.verifies - verifies0
                per_step = (spec.accepted - accepted0 + verifies) / verifies if verifies else 0.0
                print()
                print(tr("{workload}, batch {batch}: token/s median (min - max); tokens per verification with a draft "
                         "{per_step:.2f}", workload=name, batch=batch, per_step=per_step))
                for case, s in stats.items():
                    ratio = "" if case == "plain" else "   " + tr("{ratio} plain", ratio=ratio_stats(s, stats["plain"]))
                    print(f"  {case:<18} {s}{ratio}")
                if llamas and batch == 1:
                    best = max(llamas, key=lambda n: stats[n].median)
                    print("  " + tr("ngram vs {best} (llama.cpp's better): {ratio}", best=best,
                                    ratio=ratio_stats(stats["ngram"], stats[best])))
    finally:
        for engine in engines.values():
            engine.shutdown()


if __name__ == "__main__":
    main()
