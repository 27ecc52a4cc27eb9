"""第 3 阶段里程碑（examples/stage3_milestone.py）在小 Qwen3 上从头跑到尾：官方 openai 客户端的补全和流式对话、
8 个并发请求真的进了同一个解码批、断开的客户端占的页回到池子里、Ctrl-C 之后没有留下子进程。"""

from __future__ import annotations

import sys

from transformers import AutoTokenizer

from minisgl import model_zoo
from minisgl.course import select
from minisgl.i18n import tr
from minisgl.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples"))

import stage3_milestone  # noqa: E402


def test_milestone_end_to_end(monkeypatch) -> None:  # noqa: ANN001
    for key, value in select.impl_env().items():  # 服务器进程用与本检查相同的那套实现
        monkeypatch.setenv(key, value)
    path = str(model_zoo.tiny_qwen3())
    results = stage3_milestone.main(["--model", path])
    prompt_len = len(AutoTokenizer.from_pretrained(path).encode("The capital of France is"))
    assert results["usage"] == (prompt_len, 16), tr(
        "usage of the completion: expected ({prompt}, 16) prompt / completion tokens, got {usage}", prompt=prompt_len, usage=results["usage"])
    assert 1 <= results["pieces"] <= 32, tr("32 streamed tokens make between 1 and 32 pieces, got {n}", n=results["pieces"])
    assert results["largest_batch"] > 1, tr("The 8 concurrent requests never shared a decode batch (largest batch {n})", n=results["largest_batch"])
    idle, held, back = results["pages"]
    assert held > idle and back == idle, tr(
        "KV pages before / while streaming / after the disconnect must be idle < held and back to idle, got {pages}", pages=results["pages"])
    assert results["left_behind"] == [], tr("Processes left behind after Ctrl-C: {pids}", pids=results["left_behind"])
