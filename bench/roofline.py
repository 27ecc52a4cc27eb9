"""离极限还有多远（基准，不是测试）：一步解码与“把权重读一遍”的时间下限之比，在同一次运行里测。

小批次解码几乎不做计算，时间花在把全部权重从内存读一遍上：0.6B 形状的模型 fp32 一步要读约 2.4 GB
（绑定的 LM head 会把 151,936 × 1,024 的词表矩阵整个读一遍）。所以一步的下限 ≈ 权重字节数 ÷ 内存读带宽。
这里每一轮依次测：

1. 内存读带宽：对一个 1 GiB 的 fp32 张量求和（所有线程一起读）；
2. 我们的一步解码（batch 1 和 batch 8，关掉重叠，取每步的前向时间）；
3. Hugging Face 的一步解码（同样的 batch，带 KV 缓存逐 token 前向）；

然后用同一轮的带宽算下限，报每一步是下限的几倍、我们对 HF 的 token/s 倍数，都给中位数（最小 – 最大）。

    python bench/roofline.py                 # 默认 3 轮（另加 1 轮预热）
    python bench/roofline.py --repeats 5 --model models/SmolLM2-135M-Instruct
    python bench/roofline.py --llamacpp      # SmolLM2，另加 llama.cpp 一个请求的一步（要先装 llama-cpp-python）
    python bench/roofline.py --dtype bf16    # 权重用 bf16（我们和 HF 都是）：每步少读一半字节

``--llamacpp`` 时先确认 llama.cpp 与我们的贪心输出逐 token 相同（同一份权重），再计时。
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from common import Stats
from transformers import AutoModelForCausalLM

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.model_zoo import default_model, smollm2

PROMPT_LEN = 32
DECODE_STEPS = 16
PROMPTS = [[100 + 7 * i + j for j in range(PROMPT_LEN)] for i in range(8)]  # token ids：各模型的词表都有


def read_bandwidth(buf: torch.Tensor) -> float:
    """GB/s：把 ``buf`` 整个读一遍（求和）。"""
    start = time.perf_counter()
    buf.sum()
    return buf.numel() * buf.element_size() / (time.perf_counter() - start) / 1e9


def weight_bytes(model: torch.nn.Module) -> int:
    """一步解码要读的权重字节数：每块存储只算一次（绑定的 LM head 与词嵌入是同一块，解码时它被整个读一遍）。"""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[p.untyped_storage().data_ptr()] = p.untyped_storage().nbytes()
    return sum(seen.values())


def our_step_ms(llm: LLM, bs: int) -> float:
    """我们一步 batch-``bs`` 解码的前向时间（毫秒，这一轮各步的中位数）。"""
    steps: list[float] = []

    def listen(trace) -> None:  # noqa: ANN001
        if trace.phase == "decode" and len(trace.uids) == bs:
            steps.append(trace.device_ms)

    prompts = PROMPTS[:bs]
    remove = llm.add_step_listener(listen)
    try:
        llm.generate(prompts, SamplingParams(max_tokens=DECODE_STEPS + 1, ignore_eos=True))
    finally:
        remove()
    return statistics.median(steps)


@torch.inference_mode()
def hf_step_ms(hf: torch.nn.Module, bs: int) -> float:
    """HF 一步 batch-``bs`` 解码（带 KV 缓存，逐 token 前向）的时间（毫秒，这一轮各步的中位数）。"""
    ids = torch.tensor(PROMPTS[:bs])
    out = hf(input_ids=ids, use_cache=True)
    times = []
    for _ in range(DECODE_STEPS):
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        start = time.perf_counter()
        out = hf(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help=tr("model directory (default: Qwen3-0.6B, or the random-weight model of the same shape if that is missing)"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--llamacpp", action="store_true",
                        help=tr("SmolLM2, plus llama.cpp's batch-1 decode step on the same fp32 weights"))
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help=tr("weight dtype for ours and HF (default fp32; --llamacpp needs fp32)"))
    args = parser.parse_args()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    if args.llamacpp and args.dtype != "fp32":
        parser.error(tr("--llamacpp compares fp32 weights: leave --dtype at fp32"))
    if args.llamacpp:
        import llamacpp

        args.model = args.model or str(smollm2())
        try:
            llama = llamacpp.load(torch.get_num_threads())
        except llamacpp.LlamaCppMissing as err:
            print(err, file=sys.stderr)
            return 2
    model = Path(args.model) if args.model else default_model()
    print(tr("Model: {name} ({dtype}, {threads} threads), {repeats} interleaved rounds (plus 1 warm-up round)",
             name=model.name, dtype=args.dtype, threads=torch.get_num_threads(), repeats=args.repeats))
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).eval()
    llm = LLM(model, dtype=dtype, max_running_req=8, num_page_override=1024, max_seq_len_override=256)
    nbytes = weight_bytes(hf)
    buf = torch.ones(1 << 28)  # 1 GiB
    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # 逐步计时：不让主线程的活儿和前向抢 CPU

    def ours(bs: int) -> str:  # 表格的行名
        return tr("ours batch {bs}", bs=bs)

    measures: dict[str, Callable[[], float]] = {
        "bandwidth": lambda: read_bandwidth(buf),
        ours(1): lambda: our_step_ms(llm, 1),
        ours(8): lambda: our_step_ms(llm, 8),
        "HF batch 1": lambda: hf_step_ms(hf, 1),
        "HF batch 8": lambda: hf_step_ms(hf, 8),
    }
    if args.llamacpp:
        prompt = PROMPTS[0]
        ours_tokens = llm.generate([prompt], SamplingParams(max_tokens=DECODE_STEPS, ignore_eos=True))[0]["token_ids"]
        theirs = llamacpp.greedy(llama, prompt, DECODE_STEPS)
        same = sum(a == b for a, b in zip(ours_tokens, theirs))
        print(tr("llama.cpp and ours, greedy on the same weights: {same}/{n} tokens equal", same=same, n=DECODE_STEPS))
        measures["llama.cpp batch 1"] = lambda: llamacpp.step_ms(llama, prompt, DECODE_STEPS)
    rounds: list[dict[str, float]] = []
    try:
        for r in range(1 + args.repeats):
            rounds.append({name: fn() for name, fn in measures.items()})
            warm = tr(" (warm-up, not counted)") if r == 0 else ""
            print(tr("  round {done}/{total} done", done=r + 1, total=1 + args.repeats) + warm)
    finally:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved
        llm.shutdown()
    rounds = rounds[1:]

    def stat(fn: Callable[[dict[str, float]], float]) -> Stats:
        return Stats.of([fn(r) for r in rounds])

    def bound_ms(r: dict[str, float]) -> float:
        return nbytes / (r["bandwidth"] * 1e9) * 1000

    print(tr("\nWeights read per step: {gb:.2f} GB; memory read bandwidth {bandwidth} GB/s",
             gb=nbytes / 1e9, bandwidth=stat(lambda r: r["bandwidth"])))
    print(tr("Lower bound (weights ÷ bandwidth): {bound} ms\n", bound=stat(bound_ms)))
    print(f"{'':17}" + tr("  step (ms): median (min – max)    × the lower bound"))
    for name in [n for n in measures if n != "bandwidth"]:
        print(f"{name:17}  {stat(lambda r: r[name])}    {stat(lambda r: r[name] / bound_ms(r))}×")
    for bs in (1, 8):
        print(tr("batch {bs}: ours / HF token/s (per-round ratio): {ratio}×",
                 bs=bs, ratio=stat(lambda r: r[f'HF batch {bs}'] / r[ours(bs)])))
    if args.llamacpp:
        print(tr("batch 1: ours / llama.cpp token/s (per-round ratio): {ratio}×",
                 ratio=stat(lambda r: r["llama.cpp batch 1"] / r[ours(1)])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
