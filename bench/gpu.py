"""GPU 基准（不是测试）：bf16、0.6B 形状的模型，一次运行里轮流跑，报中位数 / 最小 / 最大与同一轮的比值。

1. 里程碑的 8 个请求 × 16 个 token：我们（CUDA 图开 / 关，重叠调度开）对 Hugging Face 成批 ``generate``；
2. 离线吞吐（nano-vllm 的做法）：N 个请求（默认 256），随机的输入、输出长度都在 100–1024 之间，``ignore_eos``，
   一次 ``generate`` 全部交给引擎。HF 没有连续批处理，只能整批补齐、按最长的输出生成，所以只让它跑前 32 个请求，
   我们也在同样这 32 个上比一次（token 数只计各请求要的输出）。

    python bench/gpu.py                   # 需要 CUDA；CPU 上请用 bench/stage2.py
    python bench/gpu.py --requests 32 --repeats 1    # 小号：tools/gpu_check.py --bench 跑的就是它（约一分半）
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.common import Case, interleaved, print_table, ratio_stats, timed
from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.model_zoo import default_model
from minisgl.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples"))
from stage2_milestone import PROMPTS  # noqa: E402

#: 同一进程里还要放 HF 模型：KV 池只占可用显存的一部分。
LLM_KW = dict(dtype=torch.bfloat16, memory_ratio=0.4, max_seq_len_override=2304)


def random_workload(n: int, vocab: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, vocab - 100) for _ in range(rng.randint(100, 1024))] for _ in range(n)]
    outputs = [rng.randint(100, 1024) for _ in range(n)]
    return prompts, outputs


def hf_batch(hf: torch.nn.Module, prompts: list[list[int]], new_tokens: int) -> float:
    """左补齐、整批生成 ``new_tokens`` 个 token 的用时（秒）。"""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device="cuda")
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device="cuda")

    def run() -> None:
        with torch.inference_mode():
            hf.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        torch.cuda.synchronize()

    return timed(run)


def ours(llm: LLM, prompts: list[list[int]], outputs: list[int]) -> float:
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in outputs]

    def run() -> None:
        llm.generate(prompts, params)
        torch.cuda.synchronize()

    return timed(run)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help=tr("model directory (default: Qwen3-0.6B, or the random-weight model of the same shape if that is missing)"))
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(tr("No CUDA GPU: the GPU benchmark runs only on a GPU; on a CPU use python bench/stage2.py"), file=sys.stderr)
        return 2
    model = Path(args.model) if args.model else default_model()
    print(tr("GPU: {gpu}; torch {version}; model: {name} (bf16)",
             gpu=torch.cuda.get_device_name(0), version=torch.__version__, name=model.name))
    tok = AutoTokenizer.from_pretrained(model)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).to("cuda").eval()
    hf.generation_config.eos_token_id = None
    graphs = LLM(model, **LLM_KW, max_running_req=args.requests, cuda_graph_max_bs=128)
    # 第二个引擎建在第一个占掉显存之后：按比例算会少分约四成页面。两边用同样多的页，比的才只是 CUDA 图
    eager = LLM(model, **LLM_KW, max_running_req=args.requests, cuda_graph="off", num_page_override=graphs.engine.num_pages)

    enc = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    graph, no_graph = tr("ours: CUDA graph"), tr("ours: no graph")  # 表格的行名
    n = 16
    print(tr("\n[1] milestone workload: 8 requests × {n} tokens", n=n))
    cases = [
        Case("HF generate ×8", lambda: hf_batch(hf, enc, n), 8 * n),
        Case(graph, lambda: ours(graphs, enc, [n] * 8), 8 * n),
        Case(no_graph, lambda: ours(eager, enc, [n] * 8), 8 * n),
    ]
    s1 = interleaved(cases, args.repeats)
    print_table(s1, baseline="HF generate ×8")
    print(tr("CUDA graph / HF: {vs_hf}; CUDA graph / no graph: {vs_eager}",
             vs_hf=ratio_stats(s1[graph], s1["HF generate ×8"]), vs_eager=ratio_stats(s1[graph], s1[no_graph])))

    prompts, outputs = random_workload(args.requests, hf.config.vocab_size)
    sub, sub_out = prompts[:32], outputs[:32]
    total, sub_total = sum(outputs), sum(sub_out)
    print(tr("\n[2] offline throughput: {requests} requests, {inputs} input tokens, {total} output tokens",
             requests=args.requests, inputs=sum(map(len, prompts)), total=total))
    cases = [
        Case(graph, lambda: ours(graphs, prompts, outputs), total),
        Case(no_graph, lambda: ours(eager, prompts, outputs), total),
    ]
    s2 = interleaved(cases, args.repeats)
    print_table(s2, baseline=no_graph)
    print(tr("CUDA graph / no graph: {ratio}", ratio=ratio_stats(s2[graph], s2[no_graph])))

    print(tr("\n[3] the first 32 requests (HF pads the whole batch and generates {longest} tokens; only the {sub_total} tokens the requests asked for count)",
             longest=max(sub_out), sub_total=sub_total))
    cases = [
        Case("HF generate ×32", lambda: hf_batch(hf, sub, max(sub_out)), sub_total),
        Case(graph, lambda: ours(graphs, sub, sub_out), sub_total),
    ]
    s3 = interleaved(cases, 1)
    print_table(s3, baseline="HF generate ×32")
    print(tr("CUDA graph / HF: {ratio}", ratio=ratio_stats(s3[graph], s3["HF generate ×32"])))
    graphs.shutdown()
    eager.shutdown()
    del hf
    gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
