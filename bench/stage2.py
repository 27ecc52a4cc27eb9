"""第 2 阶段基准（不是测试）：默认在 Qwen3-0.6B 形状的模型上用 fp32，一次运行里轮流重复跑，报中位数 / 最小 / 最大：

1. 里程碑的 8 个请求 × 16 个 token：``LLM.generate`` 对 Hugging Face 成批 ``generate`` 的 token/s 倍数（目标 ≥ 3.0×），
   另加关掉重叠调度（2 个 / 1 个计算线程）的 ``LLM.generate``，以及逐层走各章代码的 ``LLM.generate``
   （``cpu_fused_decode=False``；缺省时第 1.2–1.5 章是参考解答，解码层整个交给 C 函数，见 ``minisgl/fused.py``）；
2. 共享系统提示词的工作负载（第一个单独跑，计后三个一起跑的时间）：radix 对 naive（目标 ≥ 1.7×），
   以及 radix 对 HF 成批生成同样三个提示词；
3. 进步的过程：第 0 步（1 个请求）→ 第 1 阶段手工成批（4 个）→ 第 2 阶段 ``LLM.generate``（8 个）。

一步解码离这台机器的下限（读一遍权重、做完乘加）还有多远，见 ``python bench/roofline.py``。

    python bench/stage2.py                 # 默认：3 轮（另加 1 轮预热）
    python bench/stage2.py --repeats 5
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.common import Case, Stats, interleaved, print_table, ratio_stats, timed
from minisgl.core import SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.env import ENV
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.model_zoo import default_model
from minisgl.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples"))
import step0_tiny_engine as step0  # noqa: E402
from stage1_milestone import HandDriver  # noqa: E402
from stage2_milestone import PROMPTS, QUESTIONS, SYSTEM_PROMPT  # noqa: E402

SEED_KW = dict(dtype=torch.float32, max_running_req=8, num_page_override=2048, max_seq_len_override=512)


def hf_left_padded(tok, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help=tr("model directory (default: Qwen3-0.6B, or the random-weight model of the same shape if that is missing)"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = Path(args.model) if args.model else default_model()
    n = 16
    tok = AutoTokenizer.from_pretrained(model)
    enc = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    print(tr("Model: {name} (fp32, {threads} threads), {repeats} interleaved rounds (plus 1 warm-up round)",
             name=model.name, threads=torch.get_num_threads(), repeats=args.repeats))
    if "random" in model.name:
        print(tr("(random weights: only the speed is compared; the generated text is meaningless)"))

    # ------------------------------------------------------------------ 1 与 2：对 HF、radix 对 naive
    print(tr("\nLoading: the Hugging Face model and three LLMs (radix, naive, radix decoding layer by layer) ..."))
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # 与 ignore_eos 一样，保证生成满 n 个 token
    radix = LLM(model, **SEED_KW)
    naive = LLM(model, **SEED_KW, cache_type="naive")
    layered = LLM(model, **SEED_KW, cpu_fused_decode=False)
    print(radix.engine.decode_path)
    sp8 = SamplingParams(max_tokens=n, ignore_eos=True)
    hf_ids, hf_mask = hf_left_padded(tok, enc)

    def hf_generate(ids: torch.Tensor, mask: torch.Tensor, new: int) -> float:
        with torch.inference_mode():
            return timed(lambda: hf.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False))

    def without_overlap(threads: int) -> float:
        """里程碑负载，关掉重叠调度、用 ``threads`` 个计算线程：2 个核上，主线程排调度和前向的计算线程抢的是同一对核。

        线程数只在不重叠时有意义：``torch.set_num_threads`` 只改调用它的线程，重叠调度的前向跑在另一个线程里。
        """
        saved_overlap, saved_threads = ENV.DISABLE_OVERLAP_SCHEDULING.value, torch.get_num_threads()
        ENV.DISABLE_OVERLAP_SCHEDULING.value = True
        torch.set_num_threads(threads)
        try:
            return timed(lambda: radix.generate(enc, sp8))
        finally:
            ENV.DISABLE_OVERLAP_SCHEDULING.value = saved_overlap
            torch.set_num_threads(saved_threads)

    no_overlap, one_thread = tr("LLM, no overlap ×8"), tr("LLM, no overlap, 1 thread ×8")  # 表格的行名
    layered8 = tr("LLM, layer by layer ×8")
    cases = [
        Case("HF generate ×8", lambda: hf_generate(hf_ids, hf_mask, n), 8 * n),
        Case("LLM.generate ×8", lambda: timed(lambda: radix.generate(enc, sp8)), 8 * n),
        Case(no_overlap, lambda: without_overlap(torch.get_num_threads()), 8 * n),
        Case(one_thread, lambda: without_overlap(1), 8 * n),
        Case(layered8, lambda: timed(lambda: layered.generate(enc, sp8)), 8 * n),
    ]
    print(tr("\n[1] milestone workload: 8 requests × {n} tokens", n=n))
    s1 = interleaved(cases, args.repeats)
    print_table(s1, baseline="HF generate ×8")
    print(tr("LLM.generate / HF (per-round ratio): {ratio} (target ≥ 3.0×)",
             ratio=ratio_stats(s1["LLM.generate ×8"], s1["HF generate ×8"])))
    print(tr("layer by layer / HF (per-round ratio): {ratio}", ratio=ratio_stats(s1[layered8], s1["HF generate ×8"])))
    layered.shutdown()

    # 共享系统提示词：每一轮换一个前缀（前面加轮次编号），radix 缓存每轮都从空开始共享
    rounds = iter(range(1000))
    sp4 = SamplingParams(max_tokens=4, ignore_eos=True)

    def shared(llm: LLM) -> float:
        k = next(rounds)
        prompts = [f"[{k}] {SYSTEM_PROMPT}{q}" for q in QUESTIONS]
        llm.generate(prompts[:1], sp4)
        return timed(lambda: llm.generate(prompts[1:], sp4))

    last3 = [tok.encode(SYSTEM_PROMPT + q, add_special_tokens=False) for q in QUESTIONS[1:]]
    hf3_ids, hf3_mask = hf_left_padded(tok, last3)
    naive3, radix3, hf3 = tr("naive (last three)"), tr("radix (last three)"), tr("HF (last three)")  # 表格的行名
    cases = [
        Case(naive3, lambda: shared(naive), 3 * 4),
        Case(radix3, lambda: shared(radix), 3 * 4),
        Case(hf3, lambda: hf_generate(hf3_ids, hf3_mask, 4), 3 * 4),
    ]
    print(tr("\n[2] shared system prompt: the first request runs alone, then the last three run together (max_tokens=4) and are timed"))
    s2 = interleaved(cases, args.repeats)
    print_table(s2, baseline=naive3, title=tr("token/s (higher is faster): median (min – max)"))
    print(tr("radix / naive (per-round ratio): {ratio} (target ≥ 1.7×)", ratio=ratio_stats(s2[radix3], s2[naive3])))
    print(tr("radix / HF (per-round ratio): {ratio}", ratio=ratio_stats(s2[radix3], s2[hf3])))
    print(tr("naive / HF (per-round ratio): {ratio} (target ≥ 2.0×: the three prompts prefilled from scratch, one step)",
             ratio=ratio_stats(s2[naive3], s2[hf3])))
    ms = {name: 1000 * 12 / st.median for name, st in s2.items()}
    print(tr("Time for the last three requests (median): ") + tr(", ").join(f"{k} {v:.0f} ms" for k, v in ms.items()))

    # 一步解码的时间：batch 8；它离下限多远由 bench/roofline.py 在同一次运行里量出下限来比
    # 每一步的轨迹里有设备上的前向时间（GPU 上是 CUDA 事件，CPU 上就是计算本身）
    steps: list[float] = []

    def on_step(trace):  # noqa: ANN001, ANN202
        if trace.phase == "decode" and len(trace.uids) == 8:
            steps.append(trace.device_ms)

    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # 逐步计时要关掉重叠：不让主线程的活儿和前向抢 CPU
    remove = radix.add_step_listener(on_step)
    try:
        radix.generate(enc, sp8)
    finally:
        remove()
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved
    st = Stats.of(steps)
    print(tr("\nbatch-8 decode step: {st} ms (how far from this machine's bound: python bench/roofline.py)", st=st))

    del hf, naive
    gc.collect()

    # ------------------------------------------------------------------ 3：进步的过程
    print(tr("\nLoading: the step 0 weight dict and the stage 1 engine ..."))
    cfg, weights, _ = step0.load(model)
    engine = Engine(EngineConfig(str(model), dtype=torch.float32, max_running_req=4, max_seq_len_override=512, num_page_override=2048))
    step0_1 = tr("step 0 ×1")  # 表格的行名
    cases = [
        Case(step0_1, lambda: timed(lambda: step0.generate(cfg, weights, enc[0], n)), n),
        Case(tr("stage 1 by hand ×4"), lambda: sum(HandDriver(engine).generate(enc[:4], n)[1]), 4 * n),
        Case(tr("stage 2 LLM ×8"), lambda: timed(lambda: radix.generate(enc, sp8)), 8 * n),
    ]
    print(tr("\n[3] the progression: {n} tokens per request", n=n))
    s3 = interleaved(cases, args.repeats)
    print_table(s3, baseline=step0_1)
    engine.shutdown()
    radix.shutdown()


if __name__ == "__main__":
    main()
