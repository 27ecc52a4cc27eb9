"""第 5 阶段里程碑（examples/stage5_milestone.py）在 SmolLM2 上从头跑到尾：照着输入写的提示词，投机解码的输出与不投机的
逐 token 相同（每个提示词、每一轮），而且真的投机了——猜过、接受过草稿，平均每次验证出不止一个 token。快多少不在这里
检查（计时只放进基准测试和里程碑的输出）。

en: The stage 5 milestone (examples/stage5_milestone.py) end to end on SmolLM2: for input-grounded prompts, speculative
decoding's output is token for token the plain one (every prompt, every round), and speculation really happened: drafts
proposed and accepted, more than one token per verification on average. How much faster is not checked here (timings
live in the benchmarks and the milestone's output).
"""

from __future__ import annotations

import sys

import pytest

from checks.common import expect
from minisgl.i18n import tr
from minisgl.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples"))

import stage5_milestone  # noqa: E402

pytestmark = pytest.mark.timeout(900)


def test_milestone_end_to_end() -> None:
    results = stage5_milestone.main(["--rounds", "1"])  # 一轮计时就够：速度不在这里检查 | en: one timed round will do: speed is not checked here
    expect(results["equal"], True, tr("Speculative decoding gives exactly the plain greedy tokens, every prompt, every round"))
    assert results["verifies"] > 0 and results["accepted"] > 0, tr(
        "Speculation never happened: {verifies} verifications with a draft, {accepted} of {proposed} draft tokens accepted",
        verifies=results["verifies"], accepted=results["accepted"], proposed=results["proposed"])
    assert results["per_verification"] > 1.5, tr(
        "On prompts that copy their input, a verification with a draft yields {mean:.2f} tokens on average; expected more than 1.5",
        mean=results["per_verification"])
