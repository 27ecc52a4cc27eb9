"""融合解码（minisgl/fused.py + minisgl/kernel/cpu_decode.c）：与 Hugging Face 逐 token 相同，用错了给出清楚的错误。"""

from __future__ import annotations

import pytest
import torch

from checks.hf_reference import greedy_reference
from minisgl import model_zoo
from minisgl.core import SamplingParams
from minisgl.llm import LLM

#: 长短不一的提示词，请求槽比提示词少：批大小在 1 到 4 之间变化，新请求在别的请求解码到一半时加入。
PROMPTS = [[100 + 7 * i + j for j in range(3 + 5 * i)] for i in range(5)]
MAX_TOKENS = 10
KW = dict(dtype=torch.float32, device="cpu", max_running_req=4, num_page_override=128, max_seq_len_override=64, page_size=4)


@pytest.mark.parametrize("model", ["tiny_qwen3", "smollm2"])  # Qwen3 有 q/k 归一化，Llama 没有
def test_matches_hf(model: str) -> None:
    path = getattr(model_zoo, model)()
    want = greedy_reference(path, PROMPTS, MAX_TOKENS)
    llm = LLM(path, cpu_fused_decode=True, **KW)
    try:
        got = [r["token_ids"] for r in llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))]
        steps = llm.engine.fused_decoder.decode_steps
    finally:
        llm.shutdown()
    assert steps >= MAX_TOKENS - 1, f"解码批次没有走融合解码（只走了 {steps} 步）"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"第 {i} 个提示词：融合解码 {g}，HF {w}"


@pytest.mark.parametrize(("kw", "words"), [
    ({"cpu_kernel": False}, "cpu_kernel"),
    ({"cuda_graph": "eager"}, "cuda_graph"),
    ({"dtype": torch.bfloat16}, "float32"),
])
def test_unsupported_settings_fail_clearly(kw: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        LLM(model_zoo.tiny_qwen3(), cpu_fused_decode=True, **{**KW, **kw})
