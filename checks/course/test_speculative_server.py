"""投机解码接进组装好的引擎和服务器之后的检查：不合理的设置在加载模型之前就被拒绝（参数名是 SGLang 的），
``python -m minisgl --speculative-algorithm NGRAM`` 的补全和不投机的离线引擎相同，``/metrics`` 的投机计数对得上。
投机解码本身的检查在 ``checks/stage5``。

en: Checks of speculative decoding once it is part of the assembled engine and the server: unreasonable settings are
refused before any model loads (naming SGLang's flags), completions of ``python -m minisgl --speculative-algorithm
NGRAM`` equal the offline engine's without speculation, and the speculative counters of ``/metrics`` add up. Speculative
decoding itself is checked in ``checks/stage5``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from checks.common import expect
from checks.stage2.conftest import TINY_KW, built
from minisgl import model_zoo
from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.ngram_cache import NgramCache

pytestmark = pytest.mark.timeout(300)

#: tiny 模型的引擎参数，dtype 和 device 写明（与 Hugging Face 比对的检查都这样）。
#: en: the tiny model's engine settings, dtype and device stated (as every check comparing with Hugging Face does).
KW: dict[str, Any] = {**TINY_KW, "dtype": torch.float32, "device": "auto"}


@pytest.mark.parametrize("bad", [
    dict(speculative_algorithm="EAGLE"),
    dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=1),
    dict(speculative_algorithm="NGRAM", speculative_ngram_min_match_window_size=4,
         speculative_ngram_max_match_window_size=2),
    dict(speculative_algorithm="NGRAM", speculative_ngram_capacity=0),
])
def test_bad_speculative_settings_are_refused_before_loading(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # engine defaults on purpose: refused before any engine is built
        LLM("/nonexistent-model", **bad)


def test_the_server_speculates_token_equal_and_reports_it_in_metrics() -> None:
    """``python -m minisgl --speculative-algorithm NGRAM``：补全的文字和不投机的离线引擎一样，``/metrics`` 报出验证过、
    接受了的草稿 token 和每次验证出几个 token 的直方图；解码出的 token 数也算上接受的草稿。

    en: ``python -m minisgl --speculative-algorithm NGRAM``: completions read the same as the offline engine's without
    speculation, and ``/metrics`` reports the draft tokens verified and accepted and a histogram of tokens per
    verification; decoded tokens count the accepted drafts too.
    """
    from checks.stage3.conftest import Server

    model, texts = built(model_zoo.tiny_qwen3), ["one two three one two three one two three", "a b c d a b c d a b"]
    plain = LLM(model, **KW)
    try:
        want = [o["text"] for o in plain.generate(texts, SamplingParams(max_tokens=48, ignore_eos=True))]
    finally:
        plain.shutdown()
    with Server(model, "--speculative-algorithm", "ngram", "--dtype", "float32", "--num-pages", "2048",
                "--max-seq-len", "512") as server:
        got = []
        for text in texts:
            status, body = server.post("/v1/completions", {"prompt": text, "max_tokens": 48, "temperature": 0,
                                                           "ignore_eos": True})
            assert status == 200, tr("POST /v1/completions answered {status}: {body}", status=status, body=body)
            got.append(body["choices"][0]["text"])
        # 解码出的 token：每个请求除了第一个（预填充出的）都算，接受的草稿也在内
        # en: tokens decoded: each request's all but the first (its prefill yields that one), accepted drafts included
        m = server.wait_metrics(lambda m: m.get("minisgl_decode_tokens_total") == 2 * 47.0,
                                tr("minisgl_decode_tokens_total = 94 (2 requests x 47 tokens after their first)"))
    expect(got, want, tr("completion texts with speculation against the offline engine without"))
    assert m["minisgl_spec_draft_tokens_total"] >= m["minisgl_spec_accepted_tokens_total"] > 0, tr(
        "/metrics: {m}", m={k: v for k, v in m.items() if "spec" in k})
    expect(m["minisgl_spec_accept_length_sum"] - m["minisgl_spec_accept_length_count"], m["minisgl_spec_accepted_tokens_total"],
           tr("/metrics: the histogram's tokens beyond one per verification against the accepted drafts"))



@pytest.mark.parametrize("kwargs", [{"min_window": 0}, {"min_window": 4, "max_window": 3}, {"min_breadth": 0},
                                    {"min_breadth": 5, "max_breadth": 2}, {"branch_length": 0}, {"capacity": 0},
                                    {"num_draft": 0}])
def test_bad_ngram_parameters_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="speculative"):
        NgramCache(**kwargs)
