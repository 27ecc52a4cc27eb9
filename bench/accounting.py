"""老实的账：每个请求的原始记录（答得比要的少就是失败）、百分位、一次运行的汇总和 goodput。汇总只在这里算，录下的
报告因此能由它的记录重新算出来核对。

en: Honest accounting: each request's raw record (answering less than asked is a failure), percentiles, a run's summary
and goodput. Summaries are computed here only, so a recorded report can be recomputed from its records and checked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from minisgl.i18n import tr

#: 每次运行的汇总里留下几条失败的原文。
#: en: How many failure texts each run's summary keeps.
KEPT_ERRORS = 3


@dataclass
class Record:
    """一个请求的原始记录，时刻全是 ``time.perf_counter()``：发出、第一段文字到达、每段文字到达、结束；要的和拿到的
    token 数（``usage.completion_tokens``，没报就是 None）；发出的提示词 id 数和服务器数的提示词 token 数
    （``usage.prompt_tokens``）；出错的原文。

    en: The raw record of one request, all times from ``time.perf_counter()``: sent, first text chunk, every text chunk,
    end; the tokens asked for and got (``usage.completion_tokens``, None when not reported); the prompt ids sent and the
    prompt tokens the server counted (``usage.prompt_tokens``); the error text.
    """

    send: float
    asked: int
    prompt_len: int = 0
    prompt_tokens: int | None = None
    first_token: float | None = None
    chunks: list[float] = field(default_factory=list)
    end: float | None = None
    got: int | None = None
    error: str | None = None

    def failure(self) -> str | None:
        """失败的原因，成功时为 None：出了错、没报 ``usage``、或者拿到的 token 数不等于要的数。

        en: Why the request failed, None when it succeeded: an error, no ``usage`` reported, or a token count other than
        the one asked for.
        """
        if self.error is not None:
            return self.error
        if self.got is None:
            return tr("no usage in the stream: the number of tokens answered is unknown")
        if self.got != self.asked:
            return tr("answered {got} tokens, asked for {asked}", got=self.got, asked=self.asked)
        if self.first_token is None or self.end is None:
            return tr("the stream ended without any output")
        return None

    @property
    def ttft(self) -> float:
        assert self.first_token is not None
        return self.first_token - self.send

    @property
    def e2e(self) -> float:
        assert self.end is not None
        return self.end - self.send

    @property
    def tpot(self) -> float | None:
        """第一个 token 之后每个 token 的平均用时：(e2e − ttft) / (token 数 − 1)；只有一个 token 时没有定义。

        en: The mean time per token after the first: (e2e − ttft) / (tokens − 1); undefined for a single token.
        """
        assert self.got is not None
        return (self.e2e - self.ttft) / (self.got - 1) if self.got > 1 else None

    @property
    def itl(self) -> list[float]:
        """相邻两段文字到达的间隔。

        en: The gaps between consecutive text chunks.
        """
        return [b - a for a, b in zip(self.chunks, self.chunks[1:])]


@dataclass(frozen=True)
class Slo:
    """服务等级目标（秒）：goodput 只数 TTFT 和 TPOT 都不超过它的成功请求。

    en: The service-level objective (seconds): goodput counts only successful requests within both TTFT and TPOT.
    """

    ttft: float = 2.0
    tpot: float = 0.2


@dataclass(frozen=True)
class Percentiles:
    """一组样本的 p50 / p90 / p99（秒）和样本数；没有样本时百分位为 None。

    en: p50 / p90 / p99 (seconds) of a set of samples and their count; the percentiles are None without samples.
    """

    p50: float | None
    p90: float | None
    p99: float | None
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        return cls(percentile(values, 50), percentile(values, 90), percentile(values, 99), len(values))


def percentile(values: Sequence[float], q: float) -> float | None:
    """第 ``q`` 百分位（0–100），在相邻的两个次序统计量之间线性插值（与 ``numpy.percentile`` 的缺省做法相同）。

    en: The ``q``-th percentile (0–100), linearly interpolated between the two neighbouring order statistics (numpy's
    default method).
    """
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    """一次运行的汇总。时延只统计成功的请求；``duration`` 是最早发出到最晚结束（秒）；吞吐和 goodput 都按它算。
    最后三项也只数成功的请求：发出的提示词 id 数、服务器数的提示词 token 数（有请求没报就是 None）、两者不等的请求数。

    en: The summary of one run. Latencies count successful requests only; ``duration`` runs from the first send to the
    last end (seconds); throughput and goodput are per second of it. The last three count successful requests too: the
    prompt ids sent, the prompt tokens the server counted (None when a request did not report it), and the requests
    where the two differ.
    """

    requests: int
    ok: int
    failed: int
    errors: list[str]
    duration: float
    output_tokens: int
    output_throughput: float
    request_throughput: float
    good: int
    goodput: float
    ttft: Percentiles
    tpot: Percentiles
    itl: Percentiles
    e2e: Percentiles
    prompt_tokens_sent: int = 0
    prompt_tokens_counted: int | None = None
    prompt_mismatched: int = 0


def summarize(records: Sequence[Record], slo: Slo) -> Summary:
    """从每个请求的记录算出一次运行的汇总（唯一算汇总的地方）。

    en: The summary of one run from its per-request records (the one place where summaries are computed).
    """
    ok = [r for r in records if r.failure() is None]
    errors = [f for r in records if (f := r.failure()) is not None]
    ends = [r.end for r in records if r.end is not None]
    duration = max(ends) - min(r.send for r in records) if ends else 0.0
    tokens = sum(r.got or 0 for r in ok)
    tpots = [t for r in ok if (t := r.tpot) is not None]
    good = sum(r.ttft <= slo.ttft and (r.tpot is None or r.tpot <= slo.tpot) for r in ok)
    counted = [r.prompt_tokens for r in ok]

    def per_second(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    return Summary(requests=len(records), ok=len(ok), failed=len(errors), errors=errors[:KEPT_ERRORS], duration=duration,
                   output_tokens=tokens, output_throughput=per_second(tokens), request_throughput=per_second(len(ok)),
                   good=good, goodput=per_second(good), ttft=Percentiles.of([r.ttft for r in ok]),
                   tpot=Percentiles.of(tpots), itl=Percentiles.of([g for r in ok for g in r.itl]),
                   e2e=Percentiles.of([r.e2e for r in ok]), prompt_tokens_sent=sum(r.prompt_len for r in ok),
                   prompt_tokens_counted=None if None in counted else sum(c or 0 for c in counted),
                   prompt_mismatched=sum(r.prompt_tokens is not None and r.prompt_tokens != r.prompt_len for r in ok))
