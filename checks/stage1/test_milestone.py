"""第 1 阶段里程碑：第 0 步的最小引擎与 HF 逐 token 一致；手动驱动的引擎（examples/stage1_milestone.py）
在 page_size 1 和 4 下都跑通，每个请求的 token 都与 HF generate 一致，写入的 KV 页数正好。"""

from __future__ import annotations

import sys

import pytest

from minisgl.i18n import tr
from minisgl.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples"))

import stage1_milestone  # noqa: E402
import step0_tiny_engine as step0  # noqa: E402


def test_step0_equals_hf(smollm2_path: str, smollm2_prompts: list, smollm2_reference: list) -> None:
    cfg, weights, _ = step0.load(smollm2_path)
    for i in (0, 7):  # 一个短提示词、一个带对话模板的
        got = step0.generate(cfg, weights, smollm2_prompts[i], 16)
        assert got == smollm2_reference[i][:16], tr("Step 0 differs from HF generate on prompt {i}", i=i)


@pytest.mark.parametrize("page_size", [1, pytest.param(4, marks=pytest.mark.every_path)])
def test_milestone(smollm2_path: str, page_size: int, capsys: pytest.CaptureFixture) -> None:
    n = 8
    argv = ["--model", smollm2_path, "--page-size", str(page_size), "--max-tokens", str(n), "--skip-step0"]
    result = stage1_milestone.main(argv)  # 第 0 步由上一个检查单独比对
    printed = capsys.readouterr().out
    assert not result["mismatches"], tr("Some requests differ from HF generate: {result_item}", result_item=result['mismatches'])
    assert "Hugging Face generate" in printed and "token/s" in printed, tr("The milestone prints a summary line with 'Hugging Face generate' and 'token/s', got:\n{printed}", printed=printed)  # 两种语言的总结行都有这两段
    lens = [n_prompt + n - 1 for n_prompt in result["batch_prompt_lens"]]  # 最后采样的 token 不进缓存
    assert result["slots_written"] == sum(lens), tr("The number of slots written must equal the total number of tokens that went into the cache, over all requests")
    assert result["pages_written"] == sum(-(-n_tok // page_size) for n_tok in lens), tr("The number of pages written must be the sum of the pages each request occupies")
    assert result["batch_tps"] > 0 and result["single_tps"] > 0, tr("Throughputs must be positive: batch {batch_tps}, single {single_tps} token/s", batch_tps=result["batch_tps"], single_tps=result["single_tps"])
