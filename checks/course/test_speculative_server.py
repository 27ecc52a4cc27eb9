"""投机解码接进组装好的引擎和服务器之后的检查：不合理的设置在加载模型之前就被拒绝（参数名是 SGLang 的），
``python -m minisgl --speculative-algorithm NGRAM --tp 2``（两个秩）的补全和不投机的离线引擎相同，``/metrics`` 的投机计数对得上；
停止字符串落在一步验证接受的一串草稿中间时，照样截在不投机时截的地方。投机解码本身的检查在 ``checks/stage5``。

en: Checks of speculative decoding once it is part of the assembled engine and the server: unreasonable settings are
refused before any model loads (naming SGLang's flags), completions of ``python -m minisgl --speculative-algorithm
NGRAM --tp 2`` (two ranks) equal the offline engine's without speculation, the speculative counters of ``/metrics`` add up, and a stop
string inside a run of drafts accepted by one verification still cuts where it does without speculation. Speculative
decoding itself is checked in ``checks/stage5``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
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


#: 每个请求要的 token 数；服务器用贪心、不理 EOS。
#: en: tokens asked per request; the server is greedy and ignores EOS.
MAX_TOKENS = 48
TEXTS = ["one two three one two three one two three", "a b c d a b c d a b"]


@dataclass
class Served:
    """本模块共用的投机服务器（一个模块只起一个），和它按顺序服务过的提示词（都是 ``MAX_TOKENS``、不带停止字符串）：
    n-gram 缓存的内容只由这个历史决定，离线的投机引擎照着重放一遍，就知道服务器的每一步验证出了哪些 token。

    en: The speculating server this module shares (one per module) and the prompts it served, in order (each with
    ``MAX_TOKENS`` and no stop string): the n-gram cache holds what this history put there and nothing else, so an
    offline speculating engine replaying it knows which tokens each of the server's verifications yielded.
    """

    server: Any
    history: list[str] = field(default_factory=list)
    # 带停止字符串的请求是被异步取消的（取消到达之前调度器还在算），之后的 n-gram 缓存不能重放
    # en: a request with a stop string is aborted asynchronously (the scheduler computes on until the abort arrives), so
    # en: the n-gram cache after it cannot be replayed
    replayable: bool = True

    def complete(self, text: str, **extra: Any) -> dict[str, Any]:
        """``/v1/completions`` 的一个贪心请求，返回它的 ``choices[0]``。

        en: One greedy ``/v1/completions`` request; returns its ``choices[0]``."""
        status, body = self.server.post("/v1/completions", {"prompt": text, "max_tokens": MAX_TOKENS, "temperature": 0,
                                                            "ignore_eos": True, **extra})
        assert status == 200, tr("POST /v1/completions answered {status}: {body}", status=status, body=body)
        if "stop" in extra:
            self.replayable = False
        elif self.replayable:
            self.history.append(text)
        return body["choices"][0]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    from checks.stage3.conftest import Server

    # 两个秩（--tp 2）：每个秩从同样的 token 猜出同样的草稿、验证出同样的结果，所以张量并行照样投机
    # en: two ranks (--tp 2): every rank guesses the same drafts from the same tokens and verifies alike, so tensor
    # en: parallelism speculates as well
    with Server(built(model_zoo.tiny_qwen3), "--speculative-algorithm", "ngram", "--tp", "2", "--dtype", "float32",
                "--num-pages", "2048", "--max-seq-len", "512") as server:
        yield Served(server)


@pytest.fixture(scope="module")
def plain() -> Iterator[LLM]:
    """不投机的离线引擎（答案的标准）。

    en: The offline engine without speculation (the reference answers)."""
    llm = LLM(built(model_zoo.tiny_qwen3), **KW)
    try:
        yield llm
    finally:
        llm.shutdown()


def test_the_server_speculates_token_equal_and_reports_it_in_metrics(served: Served, plain: LLM) -> None:
    """``python -m minisgl --speculative-algorithm NGRAM``：补全的文字和不投机的离线引擎一样，``/metrics`` 报出验证过、
    接受了的草稿 token 和每次验证出几个 token 的直方图；解码出的 token 数也算上接受的草稿。

    en: ``python -m minisgl --speculative-algorithm NGRAM``: completions read the same as the offline engine's without
    speculation, and ``/metrics`` reports the draft tokens verified and accepted and a histogram of tokens per
    verification; decoded tokens count the accepted drafts too.
    """
    want = [o["text"] for o in plain.generate(TEXTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))]
    before = served.server.settled_metrics()
    got = [served.complete(text)["text"] for text in TEXTS]
    # 解码出的 token：每个请求除了第一个（预填充出的）都算，接受的草稿也在内
    # en: tokens decoded: each request's all but the first (its prefill yields that one), accepted drafts included
    decoded = before["minisgl_decode_tokens_total"] + 2 * (MAX_TOKENS - 1)
    served.server.wait_metrics(lambda m: m.get("minisgl_decode_tokens_total") == decoded,
                               tr("minisgl_decode_tokens_total = 94 (2 requests x 47 tokens after their first)"))
    m = {k: v - before.get(k, 0.0) for k, v in served.server.settled_metrics().items() if "spec" in k}
    expect(got, want, tr("completion texts with speculation against the offline engine without"))
    assert m["minisgl_spec_draft_tokens_total"] >= m["minisgl_spec_accepted_tokens_total"] > 0, tr(
        "/metrics: {m}", m=m)
    expect(m["minisgl_spec_accept_length_sum"] - m["minisgl_spec_accept_length_count"], m["minisgl_spec_accepted_tokens_total"],
           tr("/metrics: the histogram's tokens beyond one per verification against the accepted drafts"))


def _runs(history: list[str], prompt: str) -> tuple[list[int], list[list[int]]]:
    """离线的投机引擎依次服务 ``history``（和服务器一样，一次一个），再服务 ``prompt``：返回它的输出 token，和按步
    分开的输出（第一段是预填充出的那一个，之后每段是一次验证出的）。

    en: An offline speculating engine serves ``history`` in turn (one at a time, as the server did), then ``prompt``:
    returns its output tokens and the output split by step (the first piece is the prefill's one token, each later
    piece what one verification yielded).
    """
    llm = LLM(built(model_zoo.tiny_qwen3), speculative_algorithm="NGRAM", **KW)
    try:
        sp = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
        for text in history:
            llm.generate([text], sp)
        step, run_step = [0], llm.loop.step

        def counted() -> bool:
            step[0] += 1
            return run_step()

        llm.loop.step = counted  # 给每个 token 记下是第几步出的 | en: note the step each token comes from
        seen: list[tuple[int, int]] = []
        stop = llm.add_result_listener(lambda e: seen.append((step[0], e.token)) if e.token is not None else None)
        try:
            ids = llm.generate([prompt], sp)[0]["token_ids"]
        finally:
            stop()
    finally:
        llm.shutdown()
    pieces: dict[int, list[int]] = {}
    for s, token in seen:
        pieces.setdefault(s, []).append(token)
    return ids, list(pieces.values())


def test_a_stop_string_inside_an_accepted_run_cuts_where_plain_decoding_does(served: Served, plain: LLM) -> None:
    """停止字符串第一次出现在一次验证接受的一串草稿中间（这一步之后还有 token）：服务器照样在它前面截断，和不投机的
    离线引擎的输出截在同一处，``finish_reason`` 是 ``"stop"``。服务器上一次服务过同一个提示词，n-gram 缓存里有它的
    整段输出，所以验证一次接受一长串；离线的投机引擎重放服务器的历史，找出这样一串，停止字符串从串里挑。

    en: A stop string first occurs in the middle of a run of drafts accepted by one verification (tokens follow it
    within that step): the server still cuts before it, at the very place as the offline engine's output without
    speculation, with ``finish_reason`` ``"stop"``. The server has served the same prompt before, so the n-gram cache
    holds its whole output and a verification accepts a long run; an offline speculating engine replays the server's
    history to find such a run, and the stop string is taken from it.
    """
    prompt = TEXTS[0]
    if prompt not in served.history:
        served.complete(prompt)
    assert served.replayable, tr("the server's history holds a request with a stop string; it cannot be replayed")
    full_ids = plain.generate([prompt], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))[0]["token_ids"]
    ids, pieces = _runs(served.history, prompt)
    expect(ids, full_ids, tr("output tokens of the replaying speculative engine against the plain engine"))
    decode = plain.tokenizer.decode
    full, found = decode(full_ids), None
    start = 0
    for piece in pieces:
        a, b = start, start + len(piece)
        start = b
        # 停止字符串是串里的两个 token，前面至少有这一串的一个 token，后面也至少还有一个
        # en: the stop string is two tokens of the run, after at least one token of it and before at least one more
        for k in range(a + 1, b - 2):
            head, stop = decode(full_ids[:k]), decode(full_ids[k:k + 2])
            if stop.strip() and full.startswith(head + stop) and full.find(stop) == len(head):
                found = (stop, len(head), len(piece))
                break
        if found:
            break
    assert found is not None, tr("no accepted run of at least four tokens holds a stop string's first occurrence: "
                                 "steps {pieces}", pieces=[len(p) for p in pieces])
    stop, cut, run = found
    before = served.server.settled_metrics()
    choice = served.complete(prompt, stop=[stop])
    after = served.server.settled_metrics()
    expect((choice["text"], choice["finish_reason"]), (full[:cut], "stop"),
           tr("text and finish_reason with the stop string {stop!r} inside a run of {run} tokens", stop=stop, run=run))
    accepted = after["minisgl_spec_accepted_tokens_total"] - before["minisgl_spec_accepted_tokens_total"]
    assert accepted >= run - 1, tr("/metrics: {accepted:g} draft tokens accepted during the request, expected at least "
                                   "the {n} of the run", accepted=accepted, n=run - 1)


@pytest.mark.parametrize("kwargs", [{"min_window": 0}, {"min_window": 4, "max_window": 3}, {"min_breadth": 0},
                                    {"min_breadth": 5, "max_breadth": 2}, {"branch_length": 0}, {"capacity": 0},
                                    {"num_draft": 0}])
def test_bad_ngram_parameters_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="speculative"):
        NgramCache(**kwargs)
