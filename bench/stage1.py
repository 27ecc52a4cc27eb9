"""第 1 阶段基准（不是测试）：第 0 步 vs 第 1 阶段引擎（1 个请求、4 个请求一批）vs Hugging Face generate，
同样的提示词、同样生成 16 个 token，默认在 Qwen3-0.6B 形状的模型上用 fp32。各项轮流重复跑，报 token/s 的
中位数 / 最小 / 最大，以及相对 HF 的倍数。

    python bench/stage1.py                    # 默认：3 轮（另加 1 轮预热）
    python bench/stage1.py --repeats 5 --model models/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.common import Case, interleaved, print_table, timed
from minisgl.engine import Engine, EngineConfig
from minisgl.i18n import tr
from minisgl.model_zoo import default_model
from minisgl.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples"))
import step0_tiny_engine as step0  # noqa: E402
from stage1_milestone import BATCH, SINGLE, HandDriver  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help=tr("model directory (default: Qwen3-0.6B, or the random-weight model of the same shape if that is missing)"))
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = Path(args.model) if args.model else default_model()
    n = args.tokens
    tok = AutoTokenizer.from_pretrained(model)
    single, batch = tok(SINGLE)["input_ids"], [tok(p)["input_ids"] for p in BATCH]

    print(tr("Loading: the step 0 weight dict, the stage 1 engine and the Hugging Face model ..."))
    cfg, weights, _ = step0.load(model)
    engine = Engine(
        EngineConfig(
            str(model), dtype=torch.float32, max_running_req=len(batch), max_seq_len_override=256,
            num_page_override=len(batch) * 256,
        )
    )  # fmt: skip
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # 和引擎一样不在 EOS 处停，保证都生成 n 个 token
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    width = max(map(len, batch))
    hf_batch = torch.tensor([[pad] * (width - len(p)) + p for p in batch])  # 左侧补齐
    hf_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])

    def hf_generate(ids: torch.Tensor, mask: torch.Tensor) -> float:
        with torch.inference_mode():
            return timed(lambda: hf.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False))

    def engine_generate(prompts: list[list[int]]) -> float:
        return sum(HandDriver(engine).generate(prompts, n)[1])  # 只计前向步，不计手工填页表

    one = torch.tensor([single])
    step0_1, ours_1, ours_b = tr("step 0 ×1"), tr("stage 1 ×1"), tr("stage 1 ×{n_batch}", n_batch=len(batch))  # 表格的行名
    cases = [
        Case(step0_1, lambda: timed(lambda: step0.generate(cfg, weights, single, n)), n),
        Case(ours_1, lambda: engine_generate([single]), n),
        Case(ours_b, lambda: engine_generate(batch), n * len(batch)),
        Case("HF generate ×1", lambda: hf_generate(one, torch.ones_like(one)), n),
        Case(f"HF generate ×{len(batch)}", lambda: hf_generate(hf_batch, hf_mask), n * len(batch)),
    ]
    print(tr("Model: {name} (fp32, {threads} threads), {n} tokens per request, {repeats} interleaved rounds",
             name=model.name, threads=torch.get_num_threads(), n=n, repeats=args.repeats))
    if "random" in model.name:
        print(tr("(random weights: only the speed is compared; the generated text is meaningless)"))
    stats = interleaved(cases, args.repeats)
    print()
    print_table(stats, baseline="HF generate ×1")
    s = {name: st.median for name, st in stats.items()}
    print()
    print(tr("stage 1 ×1 / step 0: {ratio:.2f}×", ratio=s[ours_1] / s[step0_1]))
    print(tr("stage 1 ×{n_batch} / HF generate ×{n_batch}: {ratio:.2f}×",
             n_batch=len(batch), ratio=s[ours_b] / s[f'HF generate ×{len(batch)}']))
    print(tr("stage 1 ×{n_batch} / stage 1 ×1: {ratio:.2f}× (the gain from batching)",
             n_batch=len(batch), ratio=s[ours_b] / s[ours_1]))


if __name__ == "__main__":
    main()
