"""离极限还有多远（基准，不是测试）：一步解码与这台机器的“屋顶”之比，在同一次运行里测。

小批次解码的一步至少要做两件事：把全部权重从内存读一遍（0.6B 形状的模型 fp32 约 2.4 GB，绑定的 LM head 会把
151,936 × 1,024 的词表矩阵整个读一遍），以及做 2 × 批大小 × 参数个数次浮点运算。所以一步的下限是两者中较大的：

- 读的下限 = 权重字节数 ÷ 内存读带宽（batch 1 时总是它）；
- 算的下限 = 2 × batch × 线性层参数个数 ÷ 乘加峰值（CPU 核少、向量窄时，batch 8 就可能轮到它）。

每一轮依次测：

1. 内存读带宽：对一个比最后一级缓存大得多的 fp32 张量（至少 1 GiB、至少缓存的 4 倍）求和（所有线程一起读），
   读 7 次取最快的，也报最慢的一次（云主机的带宽在几秒里就能差一半：看这个差距，就知道这一轮安不安静）；
2. 乘加峰值：一个放得进缓存的矩阵乘（256 × 1024 乘 1024 × 1024，oneDNN），取五次里最快的；
3. 我们的一步解码，逐层走各章的代码（``cpu_fused_decode=False``；batch 1 和 batch 8，关掉重叠，取每步的前向时间）；
4. 我们的一步解码，解码层整个交给 C 函数（``minisgl/fused.py``；fp32 或 bf16、内核线性层、第 1.2–1.5 章是参考解答时的缺省）；
5. Hugging Face 的一步解码（同样的 batch，带 KV 缓存逐 token 前向）；

然后用同一轮的带宽和峰值算下限，报每一步是下限的几倍、我们对 HF 的 token/s 倍数，都给中位数（最小 – 最大）。

    python bench/roofline.py                 # 默认 3 轮（另加 1 轮预热）
    python bench/roofline.py --repeats 5 --model models/SmolLM2-135M-Instruct
    python bench/roofline.py --llamacpp      # SmolLM2，另加 llama.cpp 一个请求的一步（要先装 llama-cpp-python）
    python bench/roofline.py --dtype bf16    # 权重用 bf16（我们和 HF 都是）：每步少读一半字节
    python bench/roofline.py --llamacpp --dtype bf16   # 我们 bf16 对 llama.cpp 同一份权重的 BF16
    python bench/roofline.py --linear onednn # 我们的线性层换成 oneDNN（或 torch：F.linear），看内核省了多少
    python bench/roofline.py --quantization int8wo   # 我们的权重量化（第 5.4 章）：下限按量化后的字节算，HF 仍是 fp32
    python bench/roofline.py --plot docs/assets/plots/roofline.svg   # 另把结果画成图（标注用当前语言）

``--llamacpp`` 时先比 llama.cpp 与我们的贪心输出（同一份权重、同一种精度；fp32 时应逐 token 相同，bf16 时两边的
累加顺序不同，只供参考），再计时。
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM

from bench.common import Stats, plot_paths
from minisgl import kernel
from minisgl.core import SamplingParams
from minisgl.engine import model_nbytes
from minisgl.env import ENV
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.model_zoo import default_model, smollm2

PROMPT_LEN = 32
DECODE_STEPS = 16
PROMPTS = [[100 + 7 * i + j for j in range(PROMPT_LEN)] for i in range(8)]  # token ids：各模型的词表都有


def best_seconds(fn: Callable[[], object], times: int) -> float:
    """跑 ``times`` 次，取最快的一次（秒）：探针要测的是机器能做到多快，偶尔被打断的那次不算。"""
    best = float("inf")
    for _ in range(times):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


READS = 7  # 每轮读几遍探针缓冲区


def last_level_cache_bytes() -> int:
    """最后一级缓存多大（Linux 的 sysfs，例如 ``266240K``）；读不到时当 64 MiB。"""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text(encoding="utf-8").strip()
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * unit)
    return max(sizes, default=64 << 20)


def probe_buffer() -> torch.Tensor:
    """读带宽的探针：至少 1 GiB、至少最后一级缓存的 4 倍，读它量的是内存而不是缓存。"""
    return torch.ones(max(1 << 30, 4 * last_level_cache_bytes()) // 4)


def read_bandwidths(buf: torch.Tensor) -> list[float]:
    """GB/s：把 ``buf`` 整个读一遍（求和），读 :data:`READS` 次，每次一个数。"""
    seconds = []
    for _ in range(READS):
        start = time.perf_counter()
        buf.sum()
        seconds.append(time.perf_counter() - start)
    return [buf.numel() * buf.element_size() / s / 1e9 for s in seconds]


def peak_gflops(x: torch.Tensor, packed: torch.Tensor) -> float:
    """GFLOP/s：放得进缓存的 oneDNN 矩阵乘（权重已打包），五次里最快的。"""
    flops = 2 * x.shape[0] * x.shape[1] * packed.shape[0]
    run = lambda: kernel.onednn_linear(x, packed)  # noqa: E731
    return flops / best_seconds(run, 5) / 1e9


def weight_bytes(model: torch.nn.Module) -> int:
    """一步解码要读的权重字节数：每块存储只算一次（绑定的 LM head 与词嵌入是同一块，解码时它被整个读一遍）。"""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[p.untyped_storage().data_ptr()] = p.untyped_storage().nbytes()
    return sum(seen.values())


def linear_params(model: torch.nn.Module) -> int:
    """线性层（含 LM head）的参数个数：一步 batch-B 解码约做 2 × B × 这么多次浮点运算（注意力在短序列上可以忽略）。"""
    seen = {m.weight.data_ptr(): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}
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


def fixed_cost_model(model: Path, out: Path) -> Path:
    """同样的层数、同样的算子，只是每个矩阵都缩窄到每个头 8 维（随机权重）：它的一步几乎不读权重、不做计算，
    量出来的就是“每一步固定要花的时间”——Python 逐层调用、几十个小算子的分派。"""
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    width = 8 * config["num_attention_heads"]  # HF 要求隐藏维是头数的倍数
    config.update(hidden_size=width, intermediate_size=width, head_dim=8)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config), encoding="utf-8")
    for f in model.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help=tr("model directory (default: Qwen3-0.6B, or the random-weight model of the same shape if that is missing)"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--llamacpp", action="store_true",
                        help=tr("SmolLM2, plus llama.cpp's batch-1 decode step on the same weights in the same dtype"))
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help=tr("weight dtype for ours, HF and llama.cpp (default fp32; llama.cpp runs the F32 or BF16 GGUF)"))
    parser.add_argument("--linear", choices=("kernel", "onednn", "torch"), default="kernel",
                        help=tr("our linear layers: the small-batch kernel (default), oneDNN, or plain F.linear"))
    parser.add_argument("--quantization", default=None,
                        help=tr("quantize our weights (int8wo or int4wo-G, chapter 5.4): the bound uses the quantized bytes; HF stays in the dtype given"))
    parser.add_argument("--plot", default=None, help=tr("also draw the result into this image file (svg or png; the English one goes beside it as X.en.svg)"))
    args = parser.parse_args()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    if args.llamacpp:
        from bench import llamacpp

        args.model = args.model or str(smollm2())
        try:
            llama = llamacpp.load(torch.get_num_threads(), weights={"fp32": "F32", "bf16": "BF16"}[args.dtype])
        except llamacpp.LlamaCppMissing as err:
            print(err, file=sys.stderr)
            return 2
    model = Path(args.model) if args.model else default_model()
    print(tr("Model: {name} ({dtype}, {threads} threads), {repeats} interleaved rounds (plus 1 warm-up round)",
             name=model.name, dtype=args.dtype, threads=torch.get_num_threads(), repeats=args.repeats))
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).eval()
    linear = {"cpu_fast_linear": args.linear != "torch", "cpu_kernel": args.linear == "kernel"}
    quant = {"quantization": args.quantization}
    llm = LLM(model, dtype=dtype, max_running_req=8, num_page_override=1024, max_seq_len_override=256,
              cpu_fused_decode=False, **linear, **quant)
    print(tr("Our linear layers: {kind}", kind=llm.engine.linear_kind))
    fused = None
    if llm.engine.linear_kind == "kernel":
        fused = LLM(model, dtype=dtype, max_running_req=8, num_page_override=1024, max_seq_len_override=256,
                    cpu_fused_decode=True, **quant)
    scratch = tempfile.TemporaryDirectory()
    narrow = fixed_cost_model(model, Path(scratch.name))
    small = LLM(narrow, dtype=dtype, use_dummy_weight=True, max_running_req=8, num_page_override=1024,
                max_seq_len_override=256, cpu_fused_decode=False)
    small_fused = None if fused is None else LLM(narrow, dtype=dtype, use_dummy_weight=True, max_running_req=8,
                                                 num_page_override=1024, max_seq_len_override=256, cpu_fused_decode=True)
    # 一步要读的字节：量化时按我们的模型算（量化后的整数、scale 和零点），否则按 HF 的权重
    # en: the bytes a step reads: from our model when quantized (the integers, scales and zero points), else HF's weights
    nbytes = model_nbytes(llm.engine.model) if args.quantization else weight_bytes(hf)
    params = linear_params(hf)
    buf = probe_buffer()
    hot_x = torch.randn(256, 1024)
    hot_w = kernel.onednn_pack(torch.randn(1024, 1024))
    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # 逐步计时：不让主线程的活儿和前向抢 CPU

    reads: list[float] = []  # 这一轮读探针的各次带宽

    def bandwidth() -> float:
        reads[:] = read_bandwidths(buf)
        return max(reads)

    probes: dict[str, Callable[[], float]] = {  # 按顺序测："slowest read" 用 "bandwidth" 刚读的那几次
        "bandwidth": bandwidth,
        "slowest read": lambda: min(reads),
        "peak": lambda: peak_gflops(hot_x, hot_w),
    }
    steps: dict[str, tuple[int, Callable[[], float]]] = {  # 行名（英文，显示时翻译）→ (批大小, 测一轮)
        "ours batch 1": (1, lambda: our_step_ms(llm, 1)),
        "ours batch 1, narrow": (1, lambda: our_step_ms(small, 1)),
        "ours batch 8": (8, lambda: our_step_ms(llm, 8)),
        "ours batch 8, narrow": (8, lambda: our_step_ms(small, 8)),
        **({} if fused is None else {
            "ours batch 1, fused": (1, lambda: our_step_ms(fused, 1)),
            "ours batch 1, fused narrow": (1, lambda: our_step_ms(small_fused, 1)),
            "ours batch 8, fused": (8, lambda: our_step_ms(fused, 8)),
            "ours batch 8, fused narrow": (8, lambda: our_step_ms(small_fused, 8)),
        }),
        "HF batch 1": (1, lambda: hf_step_ms(hf, 1)),
        "HF batch 8": (8, lambda: hf_step_ms(hf, 8)),
    }
    if args.llamacpp:
        prompt = PROMPTS[0]
        ours_tokens = llm.generate([prompt], SamplingParams(max_tokens=DECODE_STEPS, ignore_eos=True))[0]["token_ids"]
        theirs = llamacpp.greedy(llama, prompt, DECODE_STEPS)
        same = sum(a == b for a, b in zip(ours_tokens, theirs))
        print(tr("llama.cpp and ours, greedy on the same weights: {same}/{n} tokens equal", same=same, n=DECODE_STEPS))
        steps["llama.cpp batch 1"] = (1, lambda: llamacpp.step_ms(llama, prompt, DECODE_STEPS))
    measures = {**probes, **{name: fn for name, (_, fn) in steps.items()}}
    rounds: list[dict[str, float]] = []
    try:
        for r in range(1 + args.repeats):
            rounds.append({name: fn() for name, fn in measures.items()})
            warm = tr(" (warm-up, not counted)") if r == 0 else ""
            print(tr("  round {done}/{total} done", done=r + 1, total=1 + args.repeats) + warm)
            if r == 0 and llm.engine.linear_kind == "kernel":
                print_linear_plan(llm)
    finally:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved
        for engine in (llm, small, fused, small_fused):
            if engine is not None:
                engine.shutdown()
        scratch.cleanup()
    rounds = rounds[1:]

    def stat(fn: Callable[[dict[str, float]], float]) -> Stats:
        return Stats.of([fn(r) for r in rounds])

    def read_ms(r: dict[str, float]) -> float:
        return nbytes / (r["bandwidth"] * 1e9) * 1000

    def compute_ms(r: dict[str, float], bs: int) -> float:
        return 2 * bs * params / (r["peak"] * 1e9) * 1000

    def bound_ms(r: dict[str, float], bs: int) -> float:
        return max(read_ms(r), compute_ms(r, bs))

    print(tr("\nWeights read per step: {gb:.2f} GB; memory read bandwidth {bandwidth} GB/s",
             gb=nbytes / 1e9, bandwidth=stat(lambda r: r["bandwidth"])))
    print(tr("  (the best of {reads} reads of a {size:.2f} GiB buffer per round, last-level cache {llc:.0f} MiB; "
             "the slowest read of a round: {slowest} GB/s)", reads=READS, size=buf.numel() * 4 / 2**30,
             llc=last_level_cache_bytes() / 2**20, slowest=stat(lambda r: r["slowest read"])))
    print(tr("Linear-layer parameters: {m:.0f} M; fp32 multiply-add peak {peak} GFLOP/s",
             m=params / 1e6, peak=stat(lambda r: r["peak"])))
    print(tr("Reading bound (weights ÷ bandwidth): {bound} ms", bound=stat(read_ms)))
    for bs in (1, 8):
        print(tr("Compute bound at batch {bs} (2 × {bs} × parameters ÷ peak): {bound} ms",
                 bs=bs, bound=stat(lambda r: compute_ms(r, bs))))
    print(tr("The bound of a step is the larger of the two.\n"))
    print(tr("\"narrow\": the same layers and operators with every matrix shrunk to 8 dimensions per head, random weights: "
             "what a step costs without reading weights or computing (Python calls per layer, dispatching dozens of small "
             "operators)\n"))
    print(f"{'':22}" + tr("  step (ms): median (min – max)    × the bound"))
    for name, (bs, _) in steps.items():
        print(f"{row_label(name):22}  {stat(lambda r: r[name])}    {stat(lambda r: r[name] / bound_ms(r, bs))}×")
    variants = ["ours batch {bs}"] + ([] if fused is None else ["ours batch {bs}, fused"])
    for bs in (1, 8):
        for v in variants:
            print(tr("batch {bs}: {row} / HF token/s (per-round ratio): {ratio}×", bs=bs, row=row_label(v.format(bs=bs)),
                     ratio=stat(lambda r: r[f'HF batch {bs}'] / r[v.format(bs=bs)])))
    if args.llamacpp:
        for v in variants:
            print(tr("batch 1: {row} / llama.cpp token/s (per-round ratio): {ratio}×", row=row_label(v.format(bs=1)),
                     ratio=stat(lambda r: r["llama.cpp batch 1"] / r[v.format(bs=1)])))
    if args.plot:
        bounds = {bs: stat(lambda r: bound_ms(r, bs)) for bs in (1, 8)}
        measured = {name: (bs, stat(lambda r: r[name])) for name, (bs, _) in steps.items()}
        for language, path in plot_paths(Path(args.plot)).items():
            plot(path, language, model.name, args.dtype, bounds, measured)
            print(tr("Plot written to {path}", path=path))
    return 0


def print_linear_plan(llm: LLM) -> None:
    """这颗 CPU 上每种线性层形状怎么算（第一次用到时量的，见 ``minisgl/kernel``）：几行到几行用 C 内核、其余
    F.linear，或者整个换成 oneDNN 的打包布局。"""
    plan = {}
    for _, op in llm.engine.model.named_ops():
        if getattr(op, "_packed", None) is not None:
            plan[tuple(op._packed.shape)] = "oneDNN"
        elif getattr(op, "_kernel", False):
            plan[tuple(op.weight.shape)] = kernel.choice(op.weight).rows() or "F.linear"
    table = tr(", ").join(f"{k}→{n} {how}" for (n, k), how in sorted(plan.items(), key=lambda kv: kv[0][::-1]))
    print(tr("Linear layers on this CPU (the rows that go through the C kernel ({isa}), F.linear for the others; or "
             "oneDNN's packed layout for every row count): {table}", isa=kernel.isa(), table=table))


def row_label(name: str, language: str | None = None) -> str:
    """表格和图里的行名：我们的行要翻译，HF 和 llama.cpp 是专名。"""
    if name.startswith("ours batch "):
        bs, _, variant = name.removeprefix("ours batch ").partition(", ")
        if variant == "narrow":
            return tr("ours batch {bs}, narrow", bs=bs, language=language)
        if variant == "fused narrow":
            return tr("ours batch {bs}, fused decode, narrow", bs=bs, language=language)
        if variant == "fused":
            return tr("ours batch {bs}, fused decode", bs=bs, language=language)
        return tr("ours batch {bs}, layer by layer", bs=bs, language=language)
    return name


def row_color(name: str) -> str:
    if name.startswith("ours"):
        return "#9fa8da" if "narrow" in name else "#1a237e" if "fused" in name else "#3f51b5"
    return "#ff7043"


def plot(path: Path, language: str, model: str, dtype: str, bounds: dict[int, Stats],
         steps: dict[str, tuple[int, Stats]]) -> None:
    """横条图：每个批大小一组，下限在最上面，各实现的一步（中位数，细线是最小 – 最大）。"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from minisgl.notebook.setup import setup_matplotlib

    setup_matplotlib(chinese=True)  # 中文字体也带拉丁字母：两种语言的图用同一个字体
    rows: list[tuple[str, Stats, str]] = []
    for bs in bounds:
        rows.append((tr("bound, batch {bs}", bs=bs, language=language), bounds[bs], "#9e9e9e"))
        rows += [(row_label(name, language), st, row_color(name)) for name, (b, st) in steps.items() if b == bs]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    y = list(range(len(rows)))[::-1]
    meds = [st.median for _, st, _ in rows]
    err = [[st.median - st.min for _, st, _ in rows], [st.max - st.median for _, st, _ in rows]]
    ax.barh(y, meds, xerr=err, color=[c for *_, c in rows], capsize=3)
    for yi, (_, st, _) in zip(y, rows):
        ax.text(st.max + max(meds) * 0.01, yi, f"{st.median:.0f} ms", va="center", fontsize=9)
    ax.set_yticks(y, [name for name, *_ in rows])
    ax.set_xlabel(tr("one decode step (ms), median; whiskers: min – max", language=language))
    ax.set_title(tr("How far from the limit: {model}, {dtype}, this machine", model=model, dtype=dtype, language=language))
    ax.set_xlim(0, max(st.max for _, st, _ in rows) * 1.15)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)  # svg 里不写日期：重画时没有无谓的改动
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
