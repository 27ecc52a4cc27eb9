"""可选的 bf16 权重路径：与 Hugging Face 在 bf16 下对照，用 bf16 自己的容差规则。

fp32 下我们要求与 HF 逐 token 相同；bf16 只有 8 位有效二进制位，两个实现只要求和顺序不同，logits 就会差在
小数点后第二位，遇到几乎并列的两个候选，贪心选哪个都对。所以规则是：把我们生成的整段交给 HF（bf16）
再算一遍，每一步我们选的 token 在 HF 的 logits 里必须与最大值相差不超过 1%（相对这一行 logits 的最大绝对值）；
并且这个容差要真能分辨——落在容差内的候选不到词表的千分之一，否则这条检查什么也没证明。
解码的两条路都这样查：缺省的（CPU 上是融合的 C 解码，见 minisgl/fused.py）和逐层走各章代码的（cpu_fused_decode=False）。
"""

from __future__ import annotations

import pytest
import torch
import transformers

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.model_zoo import smollm2

PROMPTS = [[1, 504, 3458, 282, 4649, 314], [1, 22, 1353, 30, 21, 1354, 30], [1, 3303, 1435, 2443, 28]]
NEW_TOKENS = 12
REL_TOL = 1e-2


@pytest.fixture(scope="module", params=[None, False], ids=["default-decode", "layer-by-layer"])
def outputs(request: pytest.FixtureRequest) -> tuple[list[list[int]], torch.nn.Module]:
    llm = LLM(str(smollm2()), dtype=torch.bfloat16, device="auto", max_running_req=4, num_page_override=256, max_seq_len_override=64,
              cpu_fused_decode=request.param)
    try:
        ours = [o["token_ids"] for o in llm.generate(PROMPTS, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))]
    finally:
        llm.shutdown()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2()), dtype=torch.bfloat16).eval()
    return ours, hf


def test_engine_runs_in_bf16(outputs) -> None:  # noqa: ANN001
    ours, _ = outputs
    assert [len(t) for t in ours] == [NEW_TOKENS] * len(PROMPTS)


@pytest.mark.parametrize("row", range(len(PROMPTS)))
def test_each_token_is_a_hf_bf16_choice(outputs, row: int) -> None:  # noqa: ANN001
    ours, hf = outputs
    seq = torch.tensor([PROMPTS[row] + ours[row]])
    with torch.inference_mode():
        logits = hf(seq).logits[0].float()
    start = len(PROMPTS[row]) - 1  # 第 i 个生成的 token 由位置 start + i 的 logits 决定
    for i, token in enumerate(ours[row]):
        scores = logits[start + i]
        tol = REL_TOL * scores.abs().max()
        best = scores.max()
        within = int((scores >= best - tol).sum())
        assert within <= scores.numel() // 1000, f"tolerance too loose to tell anything: {within} candidates within it"
        assert scores[token] >= best - tol, (
            f"prompt {row}, token {i}: ours picked {token} (HF logit {scores[token]:.3f}), "
            f"HF's best is {int(scores.argmax())} ({best:.3f}), tolerance {tol:.3f}"
        )
