"""服务的负载生成器（不是测试）：用官方的异步 ``openai`` 客户端压任何 OpenAI 兼容的服务，流式补全
（``/v1/completions``，``stream=True``，``stream_options={"include_usage": True}``），每次运行报 TTFT、TPOT、ITL、
端到端时延的 p50 / p90 / p99，输出 token/s，失败的请求和 goodput（满足 SLO 的请求数 / 秒）。

- 请求集（``--requests``）：``random`` 是随机的提示词长度和输出长度（固定种子）；``shared-prefix`` 是同一段系统提示词
  加各自一小段不同的尾巴。提示词直接给 token id（``prompt`` 接受 id 列表），长度分毫不差；分词器只用来挑合法的 id。
  只收文字的服务器拿到的是这些 id 解码成的文字（它自己重新分词，提示词的 token 数可能差一两个：报告里有它数的数）。
- 负载的形状：``--rates`` 是泊松到达（每秒几个请求，带种子），``--concurrency`` 是闭环（同时在飞的请求数固定）。
  每次运行换一个种子（种子 + 第几次），前缀缓存里不会留着上一次的提示词。
- 老实的账：每个请求都要 ``max_tokens=N`` 并请服务器别提前停（我们的服务器用 ``ignore_eos``，别家用各自的等价写法），
  ``usage.completion_tokens`` 不等于 N 就算这个请求失败（“答得比要的少”），谁也不能靠少答赢。客户端不重试（``max_retries=0``）。
- ``--url`` 指向一个正在运行的服务；``--model 目录``（旧名 ``--serve-model``）则自己起服务器：``--peers`` 里的每一个
  （``minisgl`` 缺省，还有 ``transformers``、``llamacpp``）轮流起、预热、测量、关掉，确认没有留下子进程；
  每家拿到的请求集和负载形状完全相同（同样的种子），最后一张表带 ``server`` 一栏，再给每次运行一行比值（我们 / 对方）。
  不认识的参数都转给我们的服务器。

    python bench/serve.py --model models/qwen3-tiny-random --concurrency 1,4 --num-requests 8 \\
        --dtype float32 --num-pages 4096 --max-seq-len 1024
    python bench/serve.py --model models/SmolLM2-135M-Instruct --peers minisgl,transformers --concurrency 1,4 \\
        --num-requests 8 --output-len 32,32 --prompt-len 32,64 --dtype float32
    python bench/serve.py --url http://127.0.0.1:1919/v1 --tokenizer models/qwen3-tokenizer --rates 0.5,1,2

en: A load generator for serving (not a test): it drives any OpenAI-compatible service with the official async
``openai`` client, streaming completions (``/v1/completions``, ``stream=True``,
``stream_options={"include_usage": True}``), and reports for each run p50 / p90 / p99 of TTFT, TPOT, ITL and end-to-end
latency, output token/s, failed requests and goodput (requests meeting the SLO, per second).

- Request sets (``--requests``): ``random`` has random prompt and output lengths (fixed seed); ``shared-prefix`` is one
  system prompt plus a short distinct tail each. Prompts are token ids (``prompt`` takes a list of ids), so their
  lengths are exact; the tokenizer only picks valid ids. A server that takes text only gets the text those ids decode
  to (it tokenizes it again, so the prompt may count a token or two more or less: the report shows its count).
- Load shapes: ``--rates`` are Poisson arrivals (requests per second, seeded), ``--concurrency`` a closed loop (a fixed
  number of requests in flight). Each run gets its own seed (seed + run index), so the prefix cache holds nothing of
  the previous run's prompts.
- Honest accounting: every request asks ``max_tokens=N`` and asks the server not to stop early (``ignore_eos`` for ours,
  each peer's own equivalent for the others), and a ``usage.completion_tokens`` other than N fails that request
  ("answered less than asked"): no server wins by answering less. The client never retries (``max_retries=0``).
- ``--url`` points at a running service; ``--model DIR`` (formerly ``--serve-model``) starts servers itself: each of
  ``--peers`` (``minisgl`` by default, also ``transformers`` and ``llamacpp``) in turn is started, warmed up, measured
  and stopped, making sure no child process is left; every server gets the very same request sets and load shapes
  (same seeds), and one table with a ``server`` column is printed, then a ratio line per run (ours / the peer).
  Unknown flags go to our server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import os
import platform
import random
import re
import shlex
import signal
import statistics
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import openai
from common import Stats, plot_paths  # bench/common.py (this script's folder is on sys.path)
from tqdm import tqdm  # type: ignore[import-untyped]

from minisgl.course.cli import format_table
from minisgl.i18n import tr
from minisgl.model_zoo import models_dir
from minisgl.paths import load_script
from minisgl.serving import ServerProcess

#: 每次运行的汇总里留下几条失败的原文。
#: en: How many failure texts each run's summary keeps.
KEPT_ERRORS = 3
REQUEST_SETS = ("random", "shared-prefix")
#: 能一起测的服务器；第一个是我们的，比值都是“我们 / 对方”。
#: en: The servers that can be measured together; the first is ours, and every ratio is "ours / the peer".
PEERS = ("minisgl", "transformers", "llamacpp")
OURS = PEERS[0]
LLAMACPP_INSTALL = "pip install 'llama-cpp-python[server]'"
#: 起不来的服务器在报告里留下它最后多少行输出。
#: en: How many last lines of its output a server that did not come up leaves in the report.
OUTPUT_TAIL = 40
#: ``transformers serve`` 连续批处理的 KV 缓存：CPU 上不给块数它会按“空闲设备内存的九成”去分（这里是几十 GB），
#: 所以写死：32 块 × 每块 256 个 token（``page_size`` 的缺省值）= 8192 个 token 的位置，fp32 的 SmolLM2 约 0.4 GB，
#: 缺省负载（8 个并发、提示词 ≤ 256、输出 ≤ 128）装得下；一批最多 2048 个 token，够 8 个最长的提示词一起预填充。
#: en: The KV cache of ``transformers serve``'s continuous batching: without a block count it sizes itself to 90% of
#: the free device memory (tens of GB on this CPU), so it is fixed here: 32 blocks × 256 tokens each (``page_size``'s
#: default) = room for 8192 tokens, about 0.4 GB for fp32 SmolLM2, enough for the default load (8 concurrent, prompts
#: ≤ 256, outputs ≤ 128); at most 2048 tokens a batch, enough to prefill 8 of the longest prompts together.
TRANSFORMERS_CB = {"--cb-num-blocks": "32", "--cb-max-batch-tokens": "2048"}
#: llama.cpp 的上下文长度（提示词 + 输出，缺省负载最多 384）。
#: en: llama.cpp's context length (prompt + output: at most 384 in the default load).
LLAMACPP_N_CTX = 2048


# ----------------------------------------------------------------------------- 请求集
# en: ----------------------------------------------------------------------------- request sets


@dataclass(frozen=True)
class RequestSpec:
    """一个要发的请求：提示词（token id）和要的输出 token 数。

    en: One request to send: the prompt (token ids) and the number of output tokens asked for.
    """

    prompt: list[int]
    max_tokens: int


def random_requests(n: int, ids: Sequence[int], prompt_len: tuple[int, int], output_len: tuple[int, int],
                    seed: int | str) -> list[RequestSpec]:
    """``n`` 个请求：提示词长度在 ``prompt_len`` 之间、输出长度在 ``output_len`` 之间（两端都含），token 从 ``ids`` 里挑；
    同一个种子总是同一组。

    en: ``n`` requests: prompt lengths within ``prompt_len``, output lengths within ``output_len`` (both ends included),
    tokens drawn from ``ids``; the same seed always gives the same set.
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length, new = rng.randint(*prompt_len), rng.randint(*output_len)
        out.append(RequestSpec(rng.choices(ids, k=length), new))
    return out


def shared_prefix_requests(n: int, ids: Sequence[int], prefix_len: int, tail_len: tuple[int, int],
                           output_len: tuple[int, int], seed: int) -> list[RequestSpec]:
    """``n`` 个请求共用开头的 ``prefix_len`` 个 token（“系统提示词”），后面各接一段长度在 ``tail_len`` 之间的尾巴。

    en: ``n`` requests that share their first ``prefix_len`` tokens (the "system prompt"), each followed by a tail of a
    length within ``tail_len``.
    """
    rng = random.Random(seed)
    prefix = rng.choices(ids, k=prefix_len)
    out = []
    for _ in range(n):
        length, new = rng.randint(*tail_len), rng.randint(*output_len)
        out.append(RequestSpec(prefix + rng.choices(ids, k=length), new))
    return out


def warmup_requests(n: int, ids: Sequence[int], seed: int) -> list[RequestSpec]:
    """预热用的 ``n`` 个短请求。种子是一个字符串，不会和任何一次运行的整数种子相同（``Random(-1)`` 和
    ``Random(1)`` 是同一串数：曾经让预热的提示词成了一次运行里某个请求的前缀，白送它一次前缀缓存命中）。

    en: ``n`` short warm-up requests. Their seed is a string, never equal to any run's integer seed (``Random(-1)`` and
    ``Random(1)`` give the same numbers: that once made a warm-up prompt the prefix of a request in a run, a free
    prefix-cache hit for it).
    """
    return random_requests(n, ids, (16, 16), (4, 4), f"warm-up {seed}")


def poisson_schedule(n: int, rate: float, seed: int) -> list[float]:
    """泊松到达：``n`` 个请求相对开始的发出时刻（秒），第一个在 0，相邻两个的间隔服从均值 ``1/rate`` 的指数分布；
    ``rate`` 为无穷时全部在 0。

    en: Poisson arrivals: the send times (seconds after the start) of ``n`` requests, the first at 0, the gaps
    exponential with mean ``1/rate``; an infinite ``rate`` puts them all at 0.
    """
    rng = random.Random(seed)
    times, t = [], 0.0
    for _ in range(n):
        times.append(t)
        t += 0.0 if math.isinf(rate) else rng.expovariate(rate)
    return times


@dataclass(frozen=True)
class Vocab:
    """分词器里用得着的东西：不是特殊 token 的全部 id（从中挑提示词）、特殊 token 的 id，和把 id 解码成文字的函数
    （给只收文字的服务器）。

    en: What the tokenizer provides: every id that is not a special token (prompts are drawn from them), the special
    tokens' ids, and a function decoding ids to text (for servers that take text only).
    """

    ids: list[int]
    special: list[int]
    decode: Callable[[Sequence[int]], str]


def load_vocab(tokenizer_dir: str | Path) -> Vocab:
    """从本地的分词器目录（离线）读出 :class:`Vocab`。

    en: The :class:`Vocab` of a local tokenizer folder (offline).
    """
    from transformers import AutoTokenizer  # 导入要几秒：只在真要发请求时才导入 | en: a few seconds to import: only when requests are really sent

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    special = sorted(set(tok.all_special_ids))
    skip = set(special)

    def decode(ids: Sequence[int]) -> str:
        return str(tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False))

    return Vocab([i for i in range(tok.vocab_size) if i not in skip], special, decode)


# ----------------------------------------------------------------------------- 每个请求的记录与汇总
# en: ----------------------------------------------------------------------------- per-request records and the summary


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


# ----------------------------------------------------------------------------- 发请求
# en: ----------------------------------------------------------------------------- sending requests


@dataclass(frozen=True)
class Run:
    """一次运行的负载形状：``"poisson"``（``value`` 是每秒几个请求）或 ``"closed"``（``value`` 是并发数）。

    en: The load shape of one run: ``"poisson"`` (``value`` is requests per second) or ``"closed"`` (``value`` is the
    concurrency).
    """

    shape: str
    value: float

    @property
    def name(self) -> str:
        return run_label(self.shape, self.value)

    @property
    def key(self) -> str:
        """与语言无关的名字，讲义引用它：``poisson:2``、``closed:8``。

        en: A language-independent name the book cites: ``poisson:2``, ``closed:8``.
        """
        return f"{self.shape}:{self.value:g}"


def run_label(shape: str, value: float, language: str | None = None) -> str:
    """一次运行的名字（当前语言，或 ``language``）。

    en: A run's name (in the current language, or ``language``).
    """
    if shape == "poisson":
        return tr("Poisson {rate:g} req/s", rate=value, language=language)
    return tr("concurrency {n}", n=int(value), language=language)


@dataclass(frozen=True)
class Options:
    """请求集与发送的设置（命令行参数里除负载形状之外的那些）。

    en: Settings of the request sets and of sending (the command-line flags other than the load shapes).
    """

    requests: str = "random"
    num_requests: int = 32
    prompt_len: tuple[int, int] = (16, 256)
    output_len: tuple[int, int] = (16, 128)
    prefix_len: int = 200
    tail_len: tuple[int, int] = (8, 32)
    seed: int = 0
    timeout: float = 300.0
    ignore_eos: bool = True
    slo: Slo = Slo()

    def request_set(self, ids: Sequence[int], seed: int) -> list[RequestSpec]:
        if self.requests == "shared-prefix":
            return shared_prefix_requests(self.num_requests, ids, self.prefix_len, self.tail_len, self.output_len, seed)
        return random_requests(self.num_requests, ids, self.prompt_len, self.output_len, seed)


@dataclass(frozen=True)
class RequestForm:
    """一家服务器要怎样问：提示词给 token id 还是解码成的文字；每个请求都带的额外字段（``extra``）；请它别提前停的
    字段（``no_stop``，``--no-ignore-eos`` 时不带），再加上 ``min_tokens = N``（``min_tokens``）、把特殊 token 的
    logit 压到 −100（``ban_special``）；它的流里有没有 ``usage``（没有时输出 token 数只能数流里的文字段）。
    缺省是我们的服务器的问法。

    en: How to ask one server: the prompt as token ids or as the text they decode to; extra fields every request
    carries (``extra``); fields asking it not to stop early (``no_stop``, left out with ``--no-ignore-eos``), plus
    ``min_tokens = N`` (``min_tokens``) and the special tokens' logits pushed down by 100 (``ban_special``); whether its
    stream carries ``usage`` (when not, the output tokens can only be counted as the stream's text chunks). The default
    is how our server is asked.
    """

    text_prompt: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    no_stop: dict[str, Any] = field(default_factory=lambda: {"ignore_eos": True})
    min_tokens: bool = False
    ban_special: bool = False
    stream_usage: bool = True

    def prompt(self, ids: list[int], vocab: Vocab) -> list[int] | str:
        return vocab.decode(ids) if self.text_prompt else ids

    def extra_body(self, max_tokens: int, vocab: Vocab, no_stop: bool = True) -> dict[str, Any]:
        body = dict(self.extra)
        if no_stop:
            body.update(self.no_stop)
            if self.min_tokens:
                body["min_tokens"] = max_tokens
            if self.ban_special:
                body["logit_bias"] = {str(i): -100.0 for i in vocab.special}
        return body


async def send_one(client: openai.AsyncOpenAI, model: str, spec: RequestSpec, opts: Options, vocab: Vocab,
                   form: RequestForm = RequestForm()) -> Record:
    """按 ``form`` 发一个流式补全请求并记下时刻；出错、超时都记进 ``error``，不抛出。

    en: Send one streamed completion request the way ``form`` says and note the times; errors and timeouts go into
    ``error``, nothing is raised.
    """
    prompt = form.prompt(spec.prompt, vocab)  # 解码在计时之前 | en: decoded before the clock starts
    extra = form.extra_body(spec.max_tokens, vocab, opts.ignore_eos)
    rec = Record(send=time.perf_counter(), asked=spec.max_tokens, prompt_len=len(spec.prompt))
    first_choice: float | None = None

    async def stream() -> None:
        nonlocal first_choice
        response = await client.completions.create(
            model=model, prompt=prompt, max_tokens=spec.max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body=extra or None)
        try:
            async for chunk in response:
                now = time.perf_counter()
                if chunk.choices:
                    first_choice = first_choice or now
                    if chunk.choices[0].text:
                        rec.chunks.append(now)
                if chunk.usage is not None:
                    rec.got = chunk.usage.completion_tokens
                    rec.prompt_tokens = chunk.usage.prompt_tokens
        finally:
            await response.close()

    try:
        await asyncio.wait_for(stream(), opts.timeout)
    except asyncio.TimeoutError:
        rec.error = tr("no answer within {timeout:g} s", timeout=opts.timeout)
    except Exception as e:  # noqa: BLE001 - 任何错误都是这个请求的失败 | en: any error is this request's failure
        rec.error = f"{type(e).__name__}: {e}"
    rec.end = time.perf_counter()
    if rec.got is None and rec.error is None and not form.stream_usage:
        # 流里没有 usage 的服务器：一段文字至少是一个 token，少数了只会让请求失败，不会让它占便宜
        # en: a server whose stream has no usage: a chunk is at least one token, so miscounting can only fail a
        # request, never favour the server
        rec.got = len(rec.chunks)
    # 有的 token 单独解不出文字：那时第一段带选项的事件（哪怕只有 finish_reason）就是第一个 token
    # en: some tokens decode to no text alone: then the first event with a choice (even a bare finish_reason) is the first token
    rec.first_token = rec.chunks[0] if rec.chunks else first_choice
    return rec


#: 发一个请求、返回它的记录。
#: en: Sends one request and returns its record.
Send = Callable[[RequestSpec], Awaitable[Record]]


async def run_poisson(specs: list[RequestSpec], rate: float, seed: int, send: Send,
                      done: Callable[[], object]) -> list[Record]:
    """按泊松到达的时刻发出每个请求，不等前面的回来（开环）。

    en: Send each request at its Poisson arrival time, without waiting for earlier ones (open loop).
    """
    start = time.perf_counter()

    async def at(offset: float, spec: RequestSpec) -> Record:
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        rec = await send(spec)
        done()
        return rec

    return list(await asyncio.gather(*(at(t, s) for t, s in zip(poisson_schedule(len(specs), rate, seed), specs))))


async def run_closed(specs: list[RequestSpec], concurrency: int, send: Send, done: Callable[[], object]) -> list[Record]:
    """闭环：``concurrency`` 个工人各自取下一个请求、发出、等它答完再取，直到取完。

    en: Closed loop: ``concurrency`` workers each take the next request, send it and wait for its answer before taking
    another, until none is left.
    """
    todo = iter(enumerate(specs))
    records: list[Record | None] = [None] * len(specs)

    async def worker() -> None:
        for i, spec in todo:
            records[i] = await send(spec)
            done()

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(specs))))))
    return [r for r in records if r is not None]


#: 我们的 ``/metrics`` 里每次运行前后各读一次的计数器：报告里的名字 → Prometheus 里的名字。
#: en: The counters of our ``/metrics`` read before and after every run: the name in the report → the Prometheus name.
COUNTERS = {"prefill_tokens": "minisgl_prefill_tokens_total", "prefix_hit_tokens": "minisgl_prefix_cache_hit_tokens_total",
            "decode_tokens": "minisgl_decode_tokens_total", "steps": "minisgl_steps_total"}
#: 最后一个请求答完之后等多久再读计数器：调度器空下来时才补发最后的计数。
#: en: How long to wait after the last answer before reading the counters: the scheduler sends its last counts once idle.
SETTLE_S = 0.5


@dataclass
class RunResult:
    """一次运行（第 ``repeat`` 遍）的记录和汇总；``counters`` 是服务器自己报的计数在这次运行里的增量（只有我们的有）。

    en: One run's records and summary (pass ``repeat``); ``counters`` are how much the server's own counters grew during
    the run (ours only).
    """

    run: Run
    records: list[Record]
    summary: Summary
    repeat: int = 0
    counters: dict[str, float] = field(default_factory=dict)


async def measure(url: str, runs: Sequence[Run], vocab: Vocab, opts: Options, *, form: RequestForm = RequestForm(),
                  api_key: str = "none", model: str | None = None, warmup: int = 2, progress: bool = True,
                  label: str = "", repeats: int = 1,
                  probe: Callable[[], dict[str, float]] | None = None) -> tuple[str, list[RunResult]]:
    """对 ``url`` 先预热（``warmup`` 个短请求，不计；有失败就报错），再把 ``runs`` 依次跑 ``repeats`` 遍；返回模型名和
    各次结果。请求集只由种子决定（每次运行、每一遍各不相同），所以每家服务器拿到的请求完全相同。``probe`` 读服务器
    的计数器（:data:`COUNTERS`），每次运行前后各一次。

    en: Warm ``url`` up (``warmup`` short requests, not counted; any failure is an error), then do ``runs`` in turn,
    ``repeats`` times over; return the model name and the results. The request sets depend on the seed alone (a
    different one for every run and pass), so every server gets the very same requests. ``probe`` reads the server's
    counters (:data:`COUNTERS`) before and after every run.
    """
    client = openai.AsyncOpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=opts.timeout)
    try:
        name = model or (await client.models.list()).data[0].id

        def send(spec: RequestSpec) -> Awaitable[Record]:
            return send_one(client, name, spec, opts, vocab, form)

        warm = warmup_requests(warmup, vocab.ids, opts.seed)
        for rec in await asyncio.gather(*(send(s) for s in warm)):
            if (why := rec.failure()) is not None:
                raise RuntimeError(tr("A warm-up request failed: {why}", why=why))
        results = []
        for repeat in range(repeats):
            for i, run in enumerate(runs):
                seed = opts.seed + i + len(runs) * repeat
                specs = opts.request_set(vocab.ids, seed)
                before = await asyncio.to_thread(probe) if probe is not None else {}
                desc = f"{label} {run.name}" + (f" #{repeat + 1}" if repeats > 1 else "")
                with tqdm(total=len(specs), desc=desc.strip(), unit="req", disable=not progress, leave=False,
                          file=sys.stderr) as bar:
                    if run.shape == "poisson":
                        records = await run_poisson(specs, run.value, seed, send, bar.update)
                    else:
                        records = await run_closed(specs, int(run.value), send, bar.update)
                counters = {}
                if probe is not None:
                    await asyncio.sleep(SETTLE_S)
                    after = await asyncio.to_thread(probe)
                    counters = {k: after[m] - before[m] for k, m in COUNTERS.items() if m in after and m in before}
                results.append(RunResult(run, records, summarize(records, opts.slo), repeat, counters))
        return name, results
    finally:
        await client.close()


# ----------------------------------------------------------------------------- 同一次运行里的几家服务器
# en: ----------------------------------------------------------------------------- several servers in one run


def free_port() -> int:
    """让系统在 127.0.0.1 上挑一个空闲端口（绑上、读出端口号、关掉）。

    en: Let the OS pick a free port on 127.0.0.1 (bind, read the port, close).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PeerProcess(ServerProcess):
    """别家的服务器：端口事先挑好，就绪看 ``ready_path`` 回不回 200；启动、整组杀掉、查留下的子进程都沿用
    :class:`~minisgl.serving.ServerProcess`。关的时候先给整个进程组发 SIGTERM，等不到再整组 SIGKILL。

    en: A peer's server: the port is picked beforehand, and it is ready once ``ready_path`` answers 200; starting,
    killing the whole group and finding what was left behind all come from :class:`~minisgl.serving.ServerProcess`.
    Stopping sends SIGTERM to the whole process group first, then SIGKILL to the group when it does not exit in time.
    """

    def __init__(self, command: list[str], port: int, ready_path: str, timeout: float,
                 env: dict[str, str] | None = None) -> None:
        super().__init__("", env=env, timeout=timeout)
        self.command = list(command)
        self.url = f"http://127.0.0.1:{port}"
        self.ready_path = ready_path
        self.drained = threading.Event()  # 输出读到了头 | en: the output was read to its end

    def _pump(self, found: threading.Event) -> None:
        found.set()  # 地址事先就知道，不用从输出里找 | en: the address is known beforehand, not read from the output
        try:
            super()._pump(found)
        finally:
            self.drained.set()

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}{self.ready_path}", timeout=5) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
        return super().stop(sig, timeout)


@dataclass
class Peer:
    """一家要测的服务器：名字、确切的启动命令、端口（None 是我们的服务器：端口由系统挑，它自己打印地址）、就绪的路径、
    怎样问它（:class:`RequestForm`）、写进报告的设置；``absent`` 是它在这台机器上用不了的原因（带安装命令），
    ``url`` 是已经在跑的服务（``--url``：不启动也不关），``prepare`` 在启动前做的准备（例如生成 GGUF）；``env`` 加进它的
    环境变量；``counters``：它有我们的 ``/metrics``（算了多少预填充 token、前缀缓存命中多少），每次运行前后各读一次。

    en: One server to measure: its name, the exact command that starts it, its port (None for ours: the OS picks the
    port and the server prints its address), the readiness path, how to ask it (:class:`RequestForm`), the settings
    that go into the report; ``absent`` is why it cannot run on this machine (with the install command), ``url`` an
    already running service (``--url``: neither started nor stopped), ``prepare`` what to do before starting it (e.g.
    make a GGUF); ``env`` is added to its environment; ``counters``: it serves our ``/metrics`` (prefill tokens
    computed, prefix-cache hits), read before and after every run.
    """

    name: str
    command: list[str] = field(default_factory=list)
    port: int | None = None
    ready_path: str = "/health"
    form: RequestForm = field(default_factory=RequestForm)
    settings: dict[str, Any] = field(default_factory=dict)
    absent: str | None = None
    url: str | None = None
    prepare: Callable[[], object] | None = None
    env: dict[str, str] = field(default_factory=dict)
    counters: bool = False

    def process(self, timeout: float) -> ServerProcess:
        """启动、停止它的进程对象（还没启动）。

        en: The process object that starts and stops it (not started yet).
        """
        if self.port is None:
            proc = ServerProcess("", env=self.env, timeout=timeout)
            proc.command = list(self.command)
            return proc
        return PeerProcess(self.command, self.port, self.ready_path, timeout, env=self.env)


def minisgl_peer(model: str | Path, flags: Sequence[str]) -> Peer:
    """我们的服务器：和以前一样用 ``ServerProcess``，不认识的参数都给它。

    en: Our server: ``ServerProcess`` as before, with every unknown flag.
    """
    from importlib.metadata import version

    settings = {"version": f"{version('handwritten-minisgl')}, torch {version('torch')}", "flags": list(flags)}
    return Peer(OURS, ServerProcess(model, *flags).command, settings=settings, counters=True)


def transformers_command(model: str | Path, port: int) -> list[str]:
    """``transformers serve``（就是 ``transformers`` 命令的入口，用同一个 Python）：连续批处理，CPU，fp32，
    预载这个模型，只绑 127.0.0.1。

    en: ``transformers serve`` (the ``transformers`` command's entry point, with the same Python): continuous
    batching, CPU, fp32, this model preloaded, bound to 127.0.0.1 only.
    """
    cb = [x for kv in TRANSFORMERS_CB.items() for x in kv]
    return [sys.executable, "-m", "transformers.cli.transformers", "serve", "--continuous-batching",
            "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32", *cb,
            "--log-level", "warning", str(model)]


def transformers_peer(model: str | Path, port: int | None = None) -> Peer:
    """``transformers serve`` 作对照。它的 ``/v1/completions`` 只收字符串提示词（id 列表回 400），不认识的字段一律
    回 422（``ignore_eos`` 也是）；别提前停的等价写法是它认的 ``generation_config`` 字段（一段 JSON）里
    ``eos_token_id = -1``：连续批处理把 −1 当作“没有结束 token”，按请求生效。流的最后一段总带 ``usage``。

    en: ``transformers serve`` as a peer. Its ``/v1/completions`` takes string prompts only (a list of ids gets 400)
    and answers 422 to any field it does not know (``ignore_eos`` included); the equivalent of not stopping early is
    ``eos_token_id = -1`` in the ``generation_config`` field it does know (a JSON string): continuous batching reads
    −1 as "no end token", per request. The stream's last chunk always carries ``usage``.
    """
    import transformers

    port = port or free_port()
    form = RequestForm(text_prompt=True, no_stop={"generation_config": json.dumps({"eos_token_id": -1})})
    settings = {"version": transformers.__version__, "continuous_batching": True, "device": "cpu", "dtype": "float32",
                **{k.lstrip("-").replace("-", "_"): int(v) for k, v in TRANSFORMERS_CB.items()},
                "threads": os.cpu_count(), "prompt": "text", "no_stop": form.no_stop}
    return Peer("transformers", transformers_command(model, port), port, form=form, settings=settings)


def llamacpp_installed() -> bool:
    """装没装 llama-cpp-python（只找模块，不导入）。

    en: Whether llama-cpp-python is installed (the module is looked up, not imported).
    """
    return importlib.util.find_spec("llama_cpp") is not None


def llamacpp_gguf(model: str | Path) -> Path:
    """``bench/llamacpp.py`` 给这个模型做的 F32 GGUF 放在哪儿（``models/.cache/gguf/<名字>.F32.gguf``）。

    en: Where ``bench/llamacpp.py`` puts this model's F32 GGUF (``models/.cache/gguf/<name>.F32.gguf``).
    """
    return models_dir() / ".cache" / "gguf" / f"{Path(model).name}.F32.gguf"


def llamacpp_command(gguf: str | Path, port: int, threads: int) -> list[str]:
    """llama-cpp-python 的 OpenAI 兼容服务器。它的设置是 pydantic 字段，命令行参数就是字段名（下划线）：

    - ``n_ctx``：上下文长度，见 :data:`LLAMACPP_N_CTX`；``n_batch`` 512：一次喂进去的提示词 token 数（缺省值）；
    - ``n_threads`` 和 ``n_threads_batch`` 都是 ``threads``（核数）：缺省分别是核数的一半和全部，和另两家一样用满核；
    - ``interrupt_requests false``：缺省为真时，新请求一到就打断正在流式输出的那个，并发负载下全是失败；
    - ``logits_all false``：缺省为真时预填充要给每个提示词位置都算整张词表的 logits，我们不要 logprobs，白白多算。

    它没有 llama.cpp 自带服务器的 ``--parallel``：一个模型一把锁，请求一个接一个地算（这正是要测的）。

    en: llama-cpp-python's OpenAI-compatible server. Its settings are pydantic fields and the flags are the field names
    (with underscores):

    - ``n_ctx``: the context length, see :data:`LLAMACPP_N_CTX`; ``n_batch`` 512: prompt tokens fed at once (the default);
    - ``n_threads`` and ``n_threads_batch`` both ``threads`` (the cores): their defaults are half the cores and all of
      them; like the other two servers it uses every core;
    - ``interrupt_requests false``: when true (the default) a new request interrupts the one streaming, so a concurrent
      load would be all failures;
    - ``logits_all false``: when true (the default) prefill computes logits over the whole vocabulary at every prompt
      position; we want no logprobs, so that would be wasted work.

    It has no ``--parallel`` like llama.cpp's own server: one model, one lock, requests computed one after another
    (which is what is measured).
    """
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", str(LLAMACPP_N_CTX), "--n_batch", "512", "--n_threads", str(threads),
            "--n_threads_batch", str(threads), "--interrupt_requests", "false", "--logits_all", "false"]


def _make_f32_gguf(model: str | Path) -> Path:
    """要时用 ``bench/llamacpp.py`` 生成 F32 GGUF（只有 SmolLM2-135M-Instruct 有源 GGUF）。

    en: Make the F32 GGUF with ``bench/llamacpp.py`` when needed (only SmolLM2-135M-Instruct has a source GGUF).
    """
    gguf = llamacpp_gguf(model)
    if gguf.is_file():
        return gguf
    if Path(model).name != "SmolLM2-135M-Instruct":
        raise FileNotFoundError(tr("{path} is missing: bench/llamacpp.py makes the F32 GGUF of SmolLM2-135M-Instruct only",
                                   path=gguf))
    module = load_script("bench/llamacpp.py", "bench_llamacpp")
    return Path(module.weights_gguf("F32"))


def llamacpp_peer(model: str | Path, port: int | None = None, threads: int | None = None) -> Peer:
    """llama-cpp-python 的服务器作对照，权重是同一份的 F32 GGUF。它的请求类型里提示词是字符串（或只含一个字符串的
    列表），所以发文字；没有 ``ignore_eos``，别提前停用它的 ``min_tokens = N``（只压住 ``token_eos()`` 这一个），
    再把全部特殊 token 的 logit 压下去（它遇到任何一个“生成结束”的 token 都会停）；它的服务器缺省 ``repeat_penalty``
    1.1，这里给 1.0，和另两家一样是纯贪心。它的流里没有 ``usage``：输出 token 数按流里的文字段数（见 :func:`send_one`）。
    没装时返回的 ``Peer`` 带着 ``absent``（安装命令在里面）。

    en: llama-cpp-python's server as a peer, on the same weights as an F32 GGUF. Its request type has a string prompt
    (or a list holding one string), so it gets text; it has no ``ignore_eos``, so not stopping early uses its
    ``min_tokens = N`` (which holds back ``token_eos()`` alone) and pushes down every special token's logit (it stops at
    any end-of-generation token); its server defaults to ``repeat_penalty`` 1.1, so 1.0 is sent, plain greedy like the
    other two. Its stream carries no ``usage``: output tokens are counted as the stream's text chunks (see
    :func:`send_one`). When it is not installed the ``Peer`` comes back with ``absent`` (holding the install command).
    """
    port = port or free_port()
    threads = threads or os.cpu_count() or 1
    gguf = llamacpp_gguf(model)
    form = RequestForm(text_prompt=True, extra={"repeat_penalty": 1.0}, no_stop={}, min_tokens=True, ban_special=True,
                       stream_usage=False)
    settings: dict[str, Any] = {"gguf": str(gguf), "n_ctx": LLAMACPP_N_CTX, "n_batch": 512, "threads": threads,
                                "interrupt_requests": False, "logits_all": False, "prompt": "text",
                                "no_stop": "min_tokens = max_tokens, logit_bias -100 on the special tokens",
                                "output_tokens": "streamed text chunks (no usage in its stream)"}
    peer = Peer("llamacpp", llamacpp_command(gguf, port, threads), port, ready_path="/v1/models", form=form,
                settings=settings)
    if not llamacpp_installed():
        peer.absent = tr("llama-cpp-python is not installed; install it with: {command} (it compiles llama.cpp: "
                         "about 7–8 minutes on a 2-core machine)", command=LLAMACPP_INSTALL)
        return peer
    from importlib.metadata import version

    settings["version"] = version("llama-cpp-python")
    peer.prepare = lambda: _make_f32_gguf(model)
    return peer


@dataclass(frozen=True)
class Variant:
    """一家服务器换了设置的变体：名字、基于哪一家（:data:`PEERS` 之一）、追加在它命令末尾的参数（后写的算数）、
    加进它环境变量的 ``(名字, 值)``。消融（关掉第二阶段的一样机制）和找各家最好的设置都用它。

    en: A server with changed settings: its name, which server it is based on (one of :data:`PEERS`), flags appended to
    that server's command (the last one written wins), and ``(name, value)`` pairs added to its environment. Ablations
    (one stage-2 mechanism turned off) and the search for each server's best settings both use it.
    """

    name: str
    base: str
    flags: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


#: 第二阶段各机制的消融，每个变体关掉一样：连续批处理（一个请求槽）、基数树前缀缓存（朴素缓存）、分块预填充
#: （一步能预填充的 token 数大到不再分块）、重叠调度（环境变量开关）。
#: en: Ablations of the stage-2 mechanisms, each variant turning one off: continuous batching (one request slot), the
#: radix prefix cache (the naive cache), chunked prefill (so many prefill tokens a step that nothing is chunked), and
#: overlap scheduling (its environment switch).
ABLATIONS: dict[str, Variant] = {
    "no-batching": Variant("minisgl-no-batching", OURS, ("--max-running-req", "1")),
    "naive-cache": Variant("minisgl-naive-cache", OURS, ("--cache-type", "naive")),
    "no-chunking": Variant("minisgl-no-chunking", OURS, ("--max-extend-tokens", "1000000")),
    "no-overlap": Variant("minisgl-no-overlap", OURS, env=(("MINISGL_DISABLE_OVERLAP_SCHEDULING", "1"),)),
}
_ENV_WORD = re.compile(r"[A-Z_][A-Z0-9_]*=")


def parse_variant(text: str) -> Variant:
    """``"名字=基础 参数…"`` → :class:`Variant`，例如 ``"chunk256=minisgl --max-extend-tokens 256"``；
    形如 ``KEY=VALUE``（KEY 全大写）的词是环境变量。

    en: ``"name=base flags…"`` → :class:`Variant`, e.g. ``"chunk256=minisgl --max-extend-tokens 256"``; words like
    ``KEY=VALUE`` (KEY in capitals) are environment variables.
    """
    name, sep, rest = text.partition("=")
    words = shlex.split(rest)
    name = name.strip()
    if not sep or not name or name in PEERS or not words or words[0] not in PEERS:
        raise argparse.ArgumentTypeError(tr("expected NAME=SERVER FLAGS… with SERVER one of {choices} and a new NAME, "
                                            "got {text!r}", choices=",".join(PEERS), text=text))
    env = tuple((w.partition("=")[0], w.partition("=")[2]) for w in words[1:] if _ENV_WORD.match(w))
    flags = tuple(w for w in words[1:] if not _ENV_WORD.match(w))
    return Variant(name, words[0], flags, env)


def parse_ablations(text: str) -> list[Variant]:
    """``"all"`` 或 :data:`ABLATIONS` 里的名字（逗号分隔）→ 变体。

    en: ``"all"`` or names from :data:`ABLATIONS` (comma-separated) → variants.
    """
    names = [x.strip() for x in text.split(",") if x.strip()]
    names = list(ABLATIONS) if names == ["all"] else names
    unknown = [x for x in names if x not in ABLATIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(tr("unknown ablations {unknown}: choose from {choices} or all",
                                            unknown=unknown, choices=",".join(ABLATIONS)))
    return [ABLATIONS[x] for x in names]


def build_peers(names: Sequence[str], model: str | Path, flags: Sequence[str],
                variants: Sequence[Variant] = ()) -> list[Peer]:
    """按 ``names`` 的顺序给每家服务器一个 :class:`Peer`（命令都用同一个模型目录），再给每个变体一个：基础那家的
    命令后面追加变体的参数（我们的服务器先带上 ``flags``），环境变量加进去，设置里记下它基于谁、改了什么。

    en: A :class:`Peer` for each server in the order of ``names`` (every command uses the same model folder), then one
    per variant: its base server's command with the variant's flags appended (ours with ``flags`` first), the
    environment added, and the settings noting what it is based on and what changed.
    """
    makers: dict[str, Callable[[], Peer]] = {
        "minisgl": lambda: minisgl_peer(model, flags),
        "transformers": lambda: transformers_peer(model),
        "llamacpp": lambda: llamacpp_peer(model),
    }
    peers = [makers[name]() for name in names]
    for v in variants:
        peer = makers[v.base]()
        peer.name, peer.env = v.name, dict(v.env)
        peer.command = [*peer.command, *v.flags]
        peer.settings = {**peer.settings, "variant_of": v.base, "extra_flags": list(v.flags), "env": dict(v.env)}
        peers.append(peer)
    return peers


@dataclass
class Outcome:
    """一家服务器的结果：``status`` 是 ``"ok"``、``"failed"``（起不来或不能用，``info`` 里有原因和输出的末尾）或
    ``"absent"``（没装）；``info`` 是写进报告的其余内容（命令、设置、就绪用时、地址、退出码、留下的进程……）。

    en: One server's outcome: ``status`` is ``"ok"``, ``"failed"`` (did not come up or was not usable; ``info`` holds
    why and the tail of its output) or ``"absent"`` (not installed); ``info`` is the rest of its report (command,
    settings, time to ready, address, exit code, processes left behind…).
    """

    peer: str
    status: str
    results: list[RunResult] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        runs = [{"name": r.run.name, "key": r.run.key, **asdict(r.run), "repeat": r.repeat, "summary": asdict(r.summary),
                 "counters": r.counters, "records": [asdict(x) for x in r.records]} for r in self.results]
        return {"name": self.peer, "status": self.status, **self.info, "runs": runs}


def run_peer(peer: Peer, runs: Sequence[Run], vocab: Vocab, opts: Options, args: argparse.Namespace) -> Outcome:
    """测一家服务器：没装就报出来；否则启动（记下就绪用时）、预热、测量、关掉，确认没有留下子进程。起不来、不能用都
    记成 ``failed``（带原因和它输出的末尾），不抛出：别的服务器照样测。

    en: Measure one server: report it when absent; otherwise start it (noting the time to ready), warm it up, measure,
    stop it and make sure no child process is left. Not coming up or not being usable is recorded as ``failed`` (with
    why and the tail of its output), never raised: the other servers are still measured.
    """
    info: dict[str, Any] = {"command": peer.command, "settings": peer.settings}
    if peer.absent is not None:
        print(tr("{name}: absent: {why}", name=peer.name, why=peer.absent))
        return Outcome(peer.name, "absent", info={**info, "error": peer.absent})
    server = None
    error: str | None = None
    results: list[RunResult] = []
    try:
        url = peer.url
        if url is None:
            if peer.prepare is not None:
                peer.prepare()
            server = peer.process(args.start_timeout)
            print(tr("Starting {name}: {command} …", name=peer.name, command=shlex.join(peer.command)))
            start = time.perf_counter()
            try:
                server.start()
            except RuntimeError:
                info["ready"] = False
                code = server.proc.returncode if server.proc is not None else None
                if code is not None and time.perf_counter() - start < args.start_timeout:
                    raise RuntimeError(tr("{name} exited with code {code} before it was ready", name=peer.name,
                                          code=code)) from None
                raise RuntimeError(tr("{name} did not become ready within {timeout:.0f} s", name=peer.name,
                                      timeout=args.start_timeout)) from None
            info.update(ready=True, start_s=time.perf_counter() - start)
            print(tr("{name} ready in {seconds:.1f} s at {url}", name=peer.name, seconds=info["start_s"], url=server.url))
            url = f"{server.url}/v1"
        info["url"] = url
        if peer.settings:
            print(tr("{name} settings: {settings}", name=peer.name, settings=json.dumps(peer.settings, ensure_ascii=False)))
        probe = server.metrics if peer.counters and server is not None else None
        name, results = asyncio.run(measure(url, runs, vocab, opts, form=peer.form, api_key=args.api_key,
                                            model=args.model_name, warmup=args.warmup, progress=not args.no_progress,
                                            label=peer.name, repeats=args.repeats, probe=probe))
        info["model"] = name
        print(tr("{name}: model {model} at {url}", name=peer.name, model=name, url=url))
    except (RuntimeError, OSError, openai.OpenAIError) as e:
        # 起不来、预热失败、列不出模型：这家不能用，接着测别家
        # en: did not come up, a failed warm-up, no model list: this one is not usable, go on with the others
        error = str(e)
    finally:
        if server is not None:
            info["exit_code"] = server.stop()
            info["left_behind"] = server.left_behind
            if server.left_behind:
                server.kill()
                print(tr("Processes left behind after the server stopped: {pids}", pids=server.left_behind))
    if error is not None:
        tail = output_tail(server) if server is not None else ""
        print(tr("{name}: failed: {why}", name=peer.name, why=error))
        if tail:
            print(tr("The last lines of its output:\n{tail}", tail=tail.rstrip()))
        return Outcome(peer.name, "failed", info={**info, "error": error, "output_tail": tail})
    return Outcome(peer.name, "ok", results, info)


def output_tail(server: ServerProcess) -> str:
    """服务器输出的最后 :data:`OUTPUT_TAIL` 行；进程已经退出时先等输出读完（最多 5 秒）。

    en: The last :data:`OUTPUT_TAIL` lines of the server's output; when the process has exited, wait for its output to
    be read to the end first (5 s at most).
    """
    if isinstance(server, PeerProcess) and server.proc is not None and server.proc.poll() is not None:
        server.drained.wait(5)
    return "".join(server.lines[-OUTPUT_TAIL:])


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """``ours / theirs``；缺一个或分母为 0 时没有定义（None）。

    en: ``ours / theirs``; undefined (None) when either is missing or the denominator is 0.
    """
    if ours is None or theirs is None or theirs == 0:
        return None
    return ours / theirs


#: 每次运行比的三个量。
#: en: The three quantities compared in every run.
RATIOS = ("output_throughput", "ttft_p99", "tpot_p99")


def peer_ratios(ours: Summary, theirs: Summary) -> dict[str, float | None]:
    """同一次运行里我们 / 对方：输出 token/s（大于 1 是我们快）、p99 TTFT 和 p99 TPOT（小于 1 是我们快）。

    en: Ours / the peer's in one run: output tok/s (above 1: ours is faster), p99 TTFT and p99 TPOT (below 1: ours is
    faster).
    """
    return {"output_throughput": ratio(ours.output_throughput, theirs.output_throughput),
            "ttft_p99": ratio(ours.ttft.p99, theirs.ttft.p99), "tpot_p99": ratio(ours.tpot.p99, theirs.tpot.p99)}


def ratio_rows(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """每次运行（每一遍）、每家测成了的对方一行比值（我们也得测成了）；两家的结果按同样的顺序（遍 × 运行）配对。

    en: One row of ratios per run (and pass) and per successfully measured peer (ours must have been measured too);
    both servers' results are paired in the same order (pass × run).
    """
    ours = next((o for o in outcomes if o.peer == OURS and o.status == "ok"), None)
    if ours is None:
        return []
    return [{"run": mine.run.name, "key": mine.run.key, "repeat": mine.repeat, "ours": OURS, "peer": o.peer,
             **peer_ratios(mine.summary, theirs.summary)}
            for o in outcomes if o.peer != OURS and o.status == "ok"
            for mine, theirs in zip(ours.results, o.results)]


def ratio_spreads(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """把 :func:`ratio_rows` 按（运行，对方）合起来：每个比值的最小 / 中位数 / 最大（缺的遍不算）。

    en: :func:`ratio_rows` grouped by (run, peer): min / median / max of each ratio (passes without a value left out).
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["key"], row["peer"]), []).append(row)
    out = []
    for (key, peer), group in groups.items():
        spreads = {}
        for metric in RATIOS:
            values = [r[metric] for r in group if r[metric] is not None]
            spreads[metric] = asdict(Stats.of(values)) if values else None
        out.append({"run": group[0]["run"], "key": key, "ours": OURS, "peer": peer, **spreads})
    return out


# ----------------------------------------------------------------------------- 输出
# en: ----------------------------------------------------------------------------- output


def _num(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def _triple(p: Percentiles, scale: float) -> str:
    return "/".join(_num(None if v is None else v * scale) for v in (p.p50, p.p90, p.p99))


def results_table(groups: Sequence[tuple[str, Sequence[RunResult]]]) -> str:
    """每家服务器的每次运行一行的纯文本表格（第一栏是服务器）。

    en: A plain-text table with one row per server and run (the first column is the server).
    """
    header = [tr("server"), tr("run"), tr("ok"), tr("failed"), tr("TTFT ms p50/p90/p99"), tr("TPOT ms p50/p90/p99"),
              tr("ITL ms p50/p90/p99"), tr("E2E s p50/p90/p99"), tr("output tok/s"), tr("req/s"), tr("goodput req/s")]
    rows = []
    for server, results in groups:
        for r in results:
            s = r.summary
            rows.append([server, r.run.name + (f" #{r.repeat + 1}" if r.repeat else ""), f"{s.ok}/{s.requests}", str(s.failed), _triple(s.ttft, 1000),
                         _triple(s.tpot, 1000), _triple(s.itl, 1000), _triple(s.e2e, 1), _num(s.output_throughput),
                         _num(s.request_throughput), _num(s.goodput)])
    return format_table(header, rows)


def _times(x: dict[str, Any] | None) -> str:
    """一个比值的中位数，重复了几遍时括号里是最小 – 最大。

    en: A ratio's median, with min – max in brackets when there were several passes.
    """
    if x is None:
        return "–"
    return f"{x['median']:.2f}×" + (f" ({x['min']:.2f}–{x['max']:.2f})" if len(x["samples"]) > 1 else "")


def parse_list(text: str, kind: Callable[[str], float]) -> list[float]:
    return [kind(x) for x in text.split(",") if x.strip()]


def parse_range(text: str) -> tuple[int, int]:
    """``"16,256"`` → (16, 256)；一个数表示两端相同。

    en: ``"16,256"`` → (16, 256); a single number means both ends.
    """
    parts = [int(x) for x in text.split(",")]
    lo, hi = parts[0], parts[-1]
    if len(parts) > 2 or lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(tr("expected MIN,MAX with 1 ≤ MIN ≤ MAX, got {text!r}", text=text))
    return lo, hi


def parse_peers(text: str) -> list[str]:
    """``"minisgl,transformers"`` → ``["minisgl", "transformers"]``（去掉重复，保持顺序）；不认识的名字报错。

    en: ``"minisgl,transformers"`` → ``["minisgl", "transformers"]`` (duplicates dropped, order kept); an unknown name is
    an error.
    """
    names = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    unknown = [x for x in names if x not in PEERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(tr("unknown servers {unknown}: choose from {choices}", unknown=unknown,
                                            choices=",".join(PEERS)))
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=tr("Load generator for an OpenAI-compatible server: streamed completions, "
                                               "TTFT / TPOT / ITL / end-to-end latency, throughput, goodput"),
                                epilog=tr("Unknown flags go to our server (minisgl) started with --model "
                                          "(for example --dtype float32 --num-pages 4096)."))
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help=tr("base URL of a running server, e.g. http://127.0.0.1:1919/v1"))
    target.add_argument("--model", "--serve-model", dest="model",
                        help=tr("HF-format model folder: start each of --peers on it in turn on a free port, measure, "
                                "stop it (--serve-model is the old name)"))
    target.add_argument("--replot", type=Path,
                        help=tr("redraw --plot from a report written earlier with --json (nothing is measured)"))
    p.add_argument("--peers", type=parse_peers,
                   help=tr("servers to measure on the same requests, comma-separated, from {choices} (default: minisgl)",
                           choices=",".join(PEERS)))
    p.add_argument("--variant", type=parse_variant, action="append", default=[],
                   help=tr("also measure a server with changed settings, NAME=SERVER FLAGS… (KEY=VALUE words go to its "
                           "environment), e.g. \"chunk256=minisgl --max-extend-tokens 256\"; repeatable"))
    p.add_argument("--ablations", type=parse_ablations, default=[],
                   help=tr("also measure our server with one stage-2 mechanism turned off, comma-separated from {choices}, "
                           "or all", choices=",".join(ABLATIONS)))
    p.add_argument("--repeats", type=int, default=1,
                   help=tr("passes over all runs, each with new requests; ratios get min/median/max (default 1)"))
    p.add_argument("--tokenizer", help=tr("tokenizer folder used to pick valid token ids (default: the --model folder)"))
    p.add_argument("--model-name", help=tr("the model field of the requests (default: the first of /v1/models)"))
    p.add_argument("--api-key", default="none")
    p.add_argument("--requests", choices=REQUEST_SETS, default="random", help=tr("request set (default: random)"))
    p.add_argument("--rates", help=tr("Poisson arrival rates in requests/s, comma-separated (inf: all at once)"))
    p.add_argument("--concurrency", help=tr("closed-loop concurrencies, comma-separated (default 1,4,8 when --rates is not given)"))
    p.add_argument("--num-requests", type=int, default=32, help=tr("requests per run (default 32)"))
    p.add_argument("--prompt-len", type=parse_range, default=(16, 256), help=tr("random set: prompt length MIN,MAX in tokens (default 16,256)"))
    p.add_argument("--output-len", type=parse_range, default=(16, 128), help=tr("output length MIN,MAX in tokens (default 16,128)"))
    p.add_argument("--prefix-len", type=int, default=200, help=tr("shared-prefix set: tokens of the shared system prompt (default 200)"))
    p.add_argument("--tail-len", type=parse_range, default=(8, 32), help=tr("shared-prefix set: length MIN,MAX of each distinct tail (default 8,32)"))
    p.add_argument("--seed", type=int, default=0, help=tr("seed of the first run's requests; run i of pass r uses seed + i + r × runs (default 0)"))
    p.add_argument("--timeout", type=float, default=300.0, help=tr("per-request timeout in seconds (default 300)"))
    p.add_argument("--warmup", type=int, default=2, help=tr("warm-up requests before measuring, not counted (default 2)"))
    p.add_argument("--no-ignore-eos", action="store_true",
                   help=tr("do not ask the servers not to stop early (ignore_eos or its equivalent); answers shorter "
                           "than asked still count as failures"))
    p.add_argument("--slo-ttft", type=float, default=2.0, help=tr("SLO on TTFT in seconds, for goodput (default 2)"))
    p.add_argument("--slo-tpot", type=float, default=0.2, help=tr("SLO on TPOT in seconds, for goodput (default 0.2)"))
    p.add_argument("--json", type=Path, help=tr("write every per-request record and every summary to this JSON file"))
    p.add_argument("--plot", type=Path,
                   help=tr("draw latency against load into this image (svg or png; the English one goes beside it as X.en.svg)"))
    p.add_argument("--record", action="store_true",
                   help=tr("for the book: wait until the machine is quiet, watch it during the runs, and note in the "
                           "report whether another process took CPU"))
    p.add_argument("--no-progress", action="store_true", help=tr("no progress bar"))
    p.add_argument("--start-timeout", type=float, default=300.0, help=tr("seconds to wait for each started server (default 300)"))
    return p


def print_report(outcomes: Sequence[Outcome], ratios: Sequence[dict[str, Any]], peers: Sequence[Peer],
                 opts: Options) -> None:
    """一张表（每家服务器的每次运行一行）、SLO、失败的原文、提示词 token 数对不上的地方、比值。

    en: One table (a row per server and run), the SLO, the failure texts, where the prompt token counts differ, the
    ratios.
    """
    measured = [o for o in outcomes if o.status == "ok"]
    if not measured:
        print(tr("No server could be measured."))
        return
    print(results_table([(o.peer, o.results) for o in measured]))
    print(tr("SLO: TTFT ≤ {ttft:g} s and TPOT ≤ {tpot:g} s; goodput = successful requests within both, per second",
             ttft=opts.slo.ttft, tpot=opts.slo.tpot))
    forms = {p.name: p.form for p in peers}
    for o in measured:
        if not forms[o.peer].stream_usage:
            print(tr("{name}: its stream reports no usage, so its output tokens are counted as streamed text chunks "
                     "(a chunk holding two tokens fails the request)", name=o.peer))
        for r in o.results:
            run = f"{o.peer}, {r.run.name}"
            for why in r.summary.errors:
                print(tr("  {run}: failed: {why}", run=run, why=why))
            s = r.summary
            if r.counters:
                print(tr("  {run}: prefill tokens computed {computed:.0f} of {sent} prompt tokens sent, prefix cache "
                         "hits {hits:.0f}", run=run, computed=r.counters.get("prefill_tokens", 0),
                         sent=s.prompt_tokens_sent, hits=r.counters.get("prefix_hit_tokens", 0)))
            if s.prompt_mismatched:
                print(tr("  {run}: the server counted {counted} prompt tokens for {sent} token ids sent; {n} of {ok} "
                         "requests differ (text prompts are tokenized again)", run=run, counted=s.prompt_tokens_counted,
                         sent=s.prompt_tokens_sent, n=s.prompt_mismatched, ok=s.ok))
    if ratios:
        print(tr("Ratios ours / peer in the same run: above 1 is better for us in output tok/s, below 1 in TTFT and TPOT."))
    for row in ratio_spreads(ratios):
        print(tr("  {run}: {ours} / {peer}: output tok/s {tput}, p99 TTFT {ttft}, p99 TPOT {tpot}", run=row["run"],
                 ours=row["ours"], peer=row["peer"], tput=_times(row["output_throughput"]),
                 ttft=_times(row["ttft_p99"]), tpot=_times(row["tpot_p99"])))


def _curves(report: dict[str, Any], shape: str, value: Callable[[dict[str, Any]], float | None]
            ) -> dict[str, tuple[list[float], list[float]]]:
    """每家测成了的服务器一条线：``shape`` 这种负载的每个取值（速率或并发数）→ ``value(summary)`` 在各遍里的中位数。

    en: One line per measured server: each value of the ``shape`` load (rate or concurrency) → the median over passes
    of ``value(summary)``.
    """
    out = {}
    for peer in report["peers"]:
        points: dict[float, list[float]] = {}
        for run in peer.get("runs", []):
            if run["shape"] == shape and (y := value(run["summary"])) is not None:
                points.setdefault(run["value"], []).append(y)
        finite = sorted(x for x in points if math.isfinite(x))
        if finite:
            out[peer["name"]] = (finite, [statistics.median(points[x]) for x in finite])
    return out


def plot(report: dict[str, Any], path: Path, language: str) -> None:
    """延迟随负载变化的图：泊松到达时 p99 TTFT、p99 TPOT 和输出 token/s 随速率，闭环时输出 token/s 随并发数
    （各遍的中位数；对数纵轴；变体画虚线）。拐点就是延迟开始陡升的那个速率。

    en: Latency against load: under Poisson arrivals p99 TTFT, p99 TPOT and output tok/s against the rate; in a closed
    loop output tok/s against the concurrency (medians over passes; log y axes; variants dashed). The knee is the rate
    where latency starts to climb steeply.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from minisgl.notebook.setup import setup_matplotlib

    setup_matplotlib(chinese=True)  # 中文字体也带拉丁字母 | en: the Chinese font has Latin letters too
    panels = [("poisson", tr("p99 TTFT (s)", language=language), lambda s: s["ttft"]["p99"]),
              ("poisson", tr("p99 TPOT (ms)", language=language),
               lambda s: None if s["tpot"]["p99"] is None else 1000 * s["tpot"]["p99"]),
              ("poisson", tr("output tok/s", language=language), lambda s: s["output_throughput"] or None),
              ("closed", tr("output tok/s", language=language), lambda s: s["output_throughput"] or None)]
    panels = [(shape, label, f, c) for shape, label, f in panels if (c := _curves(report, shape, f))]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels) + 0.6, 3.6), squeeze=False)
    colors = {OURS: "#3f51b5", "transformers": "#ff7043", "llamacpp": "#43a047"}
    spare = iter(["#8e24aa", "#00897b", "#f9a825", "#6d4c41", "#e91e63", "#546e7a", "#c0ca33", "#5d4037"] * 4)
    for peer in report["peers"]:
        colors.setdefault(peer["name"], next(spare))
    variants = {p["name"] for p in report["peers"] if "variant_of" in p.get("settings", {})}
    for ax, (shape, label, _, curves) in zip(axes[0], panels):
        for name, (xs, ys) in curves.items():
            ax.plot(xs, ys, marker="o", ms=3, label=name, color=colors[name], linestyle="--" if name in variants else "-")
        ax.set_yscale("log")
        ticks = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(ticks)
        ax.yaxis.set_minor_formatter(ticks)
        ax.tick_params(axis="y", which="minor", labelsize=6)
        ax.set_ylabel(label)
        ax.set_xlabel(tr("arrival rate (req/s)", language=language) if shape == "poisson"
                      else tr("concurrent requests", language=language))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    model = Path(str(report["args"].get("model") or "")).name
    fig.suptitle(tr("Serving under load: {model}, this machine", model=model, language=language))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)  # 重画时没有无谓的改动 | en: no needless diff on redraw
    plt.close(fig)


# ----------------------------------------------------------------------------- 讲义里的表
# en: ----------------------------------------------------------------------------- the book's tables


def _median_spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """中位数，几遍时括号里是最小 – 最大。

    en: The median, with min – max in brackets over several passes.
    """
    if not values:
        return "–"
    st = Stats.of(list(values))
    return fmt(st.median) + (f" ({fmt(st.min)}–{fmt(st.max)})" if len(values) > 1 else "")


def _passes(report: dict[str, Any], language: str) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    """每家测成了的服务器、每次运行：(服务器, 运行的名字, 这次运行的各遍)，保持运行的顺序。

    en: For every measured server and run: (server, the run's name, that run's passes), in run order.
    """
    for peer in report["peers"]:
        if peer["status"] != "ok":
            continue
        by_run: dict[str, list[dict[str, Any]]] = {}
        for run in peer["runs"]:
            by_run.setdefault(run["key"], []).append(run)
        for runs in by_run.values():
            yield peer["name"], run_label(runs[0]["shape"], runs[0]["value"], language), runs


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


#: 讲义里的表：``[[serve 录制名 表名]]`` 读 ``docs/outputs/<录制名>.json``，画成下面一种表。
#: en: The book's tables: ``[[serve recording table]]`` reads ``docs/outputs/<recording>.json`` and renders one of these.
BOOK_TABLES = ("machine", "servers", "results", "ratios", "prefill")
_SETTINGS_SHOWN = ("flags", "extra_flags", "env", "continuous_batching", "cb_num_blocks", "cb_max_batch_tokens",
                   "n_ctx", "n_batch", "threads", "interrupt_requests", "logits_all")


def book_table(report: dict[str, Any], table: str, language: str) -> list[str]:
    """录下的报告画成讲义里的一张 Markdown 表（数字都来自录制，不手抄）：``machine`` 这台机器；``servers`` 每家的
    版本、设置和就绪用时；``results`` 每家每次运行的时延与吞吐（各遍的中位数，括号里最小 – 最大）；``ratios``
    我们 / 对方；``prefill`` 发出的提示词 token、真正算了的预填充 token（我们的计数器）和 TTFT。

    en: A recorded report as one Markdown table of the book (every number comes from the recording, none copied by
    hand): ``machine`` this machine; ``servers`` each server's version, settings and time to ready; ``results`` each
    server's latency and throughput per run (median over passes, min – max in brackets); ``ratios`` ours / the peer;
    ``prefill`` prompt tokens sent, prefill tokens really computed (our counters) and TTFT.
    """
    if table == "machine":
        m = report["machine"]
        quiet = tr("yes", language=language) if m.get("quiet") else tr("no", language=language)
        steal = "–" if m.get("steal_percent") is None else f"{m['steal_percent']:.0f}%"
        return _markdown([tr("CPU", language=language), tr("cores", language=language),
                          tr("memory GiB", language=language), tr("vector instructions", language=language),
                          tr("quiet during the runs", language=language),
                          tr("CPU time taken by the hypervisor (steal)", language=language)],
                         [[str(m.get("cpu")), str(m.get("cores")), str(m.get("memory_gib")),
                           " ".join(m.get("vector_flags", [])) or "–", quiet, steal]])
    if table == "servers":
        rows = []
        for peer in report["peers"]:
            st = peer.get("settings", {})
            shown = "; ".join(f"{k} = {_setting(v)}" for k in _SETTINGS_SHOWN if (v := st.get(k)) not in (None, [], {}))
            ready = f"{peer['start_s']:.1f} s" if "start_s" in peer else "–"
            rows.append([peer["name"], str(st.get("version", "–")), shown or "–", ready,
                         peer["status"] if peer["status"] == "ok" else f"{peer['status']}: {peer.get('error', '')}"])
        return _markdown([tr("server", language=language), tr("version", language=language),
                          tr("settings", language=language), tr("ready in", language=language),
                          tr("status", language=language)], rows)
    if table == "results":
        rows = []
        for server, label, runs in _passes(report, language):
            sums = [r["summary"] for r in runs]

            def ms(get: Callable[[dict[str, Any]], float | None]) -> str:
                return _median_spread([v * 1000 for x in sums if (v := get(x)) is not None], lambda v: f"{v:.0f}")

            rows.append([server, label, f"{sum(x['ok'] for x in sums)}/{sum(x['requests'] for x in sums)}",
                         ms(lambda x: x["ttft"]["p50"]), ms(lambda x: x["ttft"]["p99"]),
                         ms(lambda x: x["tpot"]["p50"]), ms(lambda x: x["tpot"]["p99"]),
                         _median_spread([x["output_throughput"] for x in sums], lambda v: f"{v:.0f}")])
        return _markdown([tr("server", language=language), tr("run", language=language), tr("ok", language=language),
                          tr("TTFT p50 ms", language=language), tr("TTFT p99 ms", language=language),
                          tr("TPOT p50 ms", language=language), tr("TPOT p99 ms", language=language),
                          tr("output tok/s", language=language)], rows)
    if table == "ratios":
        rows = [[run_label(*_split_key(r["key"]), language), f"{r['ours']} / {r['peer']}", _times(r["output_throughput"]),
                 _times(r["ttft_p99"]), _times(r["tpot_p99"])] for r in report["ratio_spreads"]]
        return _markdown([tr("run", language=language), tr("compared", language=language),
                          tr("output tok/s", language=language), tr("p99 TTFT", language=language),
                          tr("p99 TPOT", language=language)], rows)
    if table == "prefill":
        rows = []
        for server, label, runs in _passes(report, language):
            sums = [r["summary"] for r in runs]
            computed = [r["counters"]["prefill_tokens"] for r in runs if r.get("counters")]
            rows.append([server, label, _median_spread([x["prompt_tokens_sent"] for x in sums], lambda v: f"{v:.0f}"),
                         _median_spread(computed, lambda v: f"{v:.0f}") if computed
                         else tr("not reported", language=language),
                         _median_spread([v * 1000 for x in sums if (v := x["ttft"]["p50"]) is not None],
                                        lambda v: f"{v:.0f}")])
        return _markdown([tr("server", language=language), tr("run", language=language),
                          tr("prompt tokens sent", language=language), tr("prefill tokens computed", language=language),
                          tr("TTFT p50 ms", language=language)], rows)
    raise ValueError(tr("unknown table {table!r}: choose from {choices}", table=table, choices=", ".join(BOOK_TABLES)))


def _setting(value: Any) -> str:  # noqa: ANN401 - a settings value
    if isinstance(value, list):
        return " ".join(map(str, value))
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _split_key(key: str) -> tuple[str, float]:
    shape, _, value = key.partition(":")
    return shape, float(value)


def machine_info() -> dict[str, Any]:
    """这台机器：CPU 型号、向量指令集、核数、内存、开始时的平均负载（录下的速度离不开它们）。

    en: This machine: the CPU model, its vector instruction sets, cores, memory and the load average at the start (the
    recorded speeds depend on them).
    """
    info: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                            "python": platform.python_version()}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        lines = cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines()
        name = next((ln.partition(":")[2].strip() for ln in lines if ln.startswith("model name")), None)
        flags = next((ln.partition(":")[2].split() for ln in lines if ln.startswith("flags")), [])
        info.update(cpu=name or info["cpu"], vector_flags=sorted(f for f in flags if f.startswith(("avx", "amx", "fma"))))
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        total = next((ln.split()[1] for ln in meminfo.read_text().splitlines() if ln.startswith("MemTotal")), None)
        info["memory_gib"] = round(int(total) / 2**20, 1) if total else None
    if hasattr(os, "getloadavg"):
        info["load_at_start"] = [round(x, 2) for x in os.getloadavg()]
    return info


def cpu_times() -> list[int] | None:
    """``/proc/stat`` 第一行的累计 CPU 时间（user nice system idle iowait irq softirq steal …），没有时为 None。

    en: The cumulative CPU times of ``/proc/stat``'s first line (user nice system idle iowait irq softirq steal …), None
    where there is none.
    """
    stat = Path("/proc/stat")
    if not stat.is_file():
        return None
    return [int(x) for x in stat.read_text().splitlines()[0].split()[1:]]


def steal_percent(before: list[int] | None, after: list[int] | None) -> float | None:
    """两次 :func:`cpu_times` 之间被虚拟机管理程序拿走的 CPU 时间占百分之几（steal：云上的虚拟机与邻居共用物理核，
    它高时同样的代码会慢，录下的速度要带着它看）。

    en: The percentage of CPU time taken by the hypervisor between two :func:`cpu_times` (steal: a cloud VM shares its
    physical cores with neighbours; when it is high the same code runs slower, so recorded speeds go with it).
    """
    if before is None or after is None or len(before) < 8:
        return None
    total = sum(after[:8]) - sum(before[:8])
    return round(100 * (after[7] - before[7]) / total, 1) if total > 0 else None


class QuietWatch:
    """录制时用：开始前等机器安静（同讲义的录制），测量期间每隔几秒看一次有没有别的进程抢 CPU（我们起的服务器是
    子进程，不算）。

    en: For recordings: wait for a quiet machine first (as the book's recordings do), and during the measurement look
    every few seconds for other processes taking CPU (the servers we start are our children and do not count).
    """

    def __init__(self, period: float = 5.0) -> None:
        self.tools = load_script("tools/record_outputs.py", "record_outputs")  # 讲义录制的规则 | en: the book recordings' rules
        self.quiet = self.tools.Quiet(max_load=self.tools.default_max_load(), busy_cpu=20.0, wait=1800.0)
        self.period = period
        self.intruders: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> QuietWatch:
        self.tools.wait_until_quiet(self.quiet, check_load=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        watch = self.tools.CpuWatch()
        while not self._stop.wait(self.period):
            for pid, comm, percent in watch.sample():
                if percent > self.quiet.busy_cpu:
                    self.intruders[pid] = f"{comm} ({percent:.0f}%)"


def _plain(value: Any) -> Any:  # noqa: ANN401 - any parsed argument
    """参数值写进 JSON 的样子：路径变字符串，变体变字典。

    en: How an argument value goes into JSON: paths as strings, variants as dicts.
    """
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list):
        return [_plain(x) for x in value]
    if isinstance(value, Variant):
        return asdict(value)
    return value


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """依次测每家服务器（同样的请求），打印一张表和比值，按 ``--json`` 写文件、按 ``--plot`` 画图；返回同样内容的
    报告（``peers`` 里每家有状态、命令、设置、就绪用时、退出码、留下的进程和各次运行；``machine`` 是这台机器）。

    en: Measure each server in turn (the same requests), print one table and the ratios, write ``--json``, draw
    ``--plot``; return the same report (``peers`` holds, for each, its status, command, settings, time to ready, exit
    code, the processes left behind and its runs; ``machine`` describes this machine).
    """
    parser = build_parser()
    args, server_flags = parser.parse_known_args(argv)
    if args.replot is not None:
        if args.plot is None:
            parser.error(tr("--replot needs --plot"))
        report = json.loads(args.replot.read_text(encoding="utf-8"))
        for language, path in plot_paths(args.plot).items():
            plot(report, path, language)
        return report
    variants = [*args.ablations, *args.variant]
    if args.url and (args.peers is not None or variants):
        parser.error(tr("--peers, --variant and --ablations need --model (the servers are started on that folder)"))
    names = args.peers or [OURS]
    if server_flags and (args.url or OURS not in names):
        parser.error(tr("unknown arguments {flags} (server flags are allowed only with --model and minisgl among --peers)",
                        flags=server_flags))
    if variants and OURS not in names and any(v.base == OURS for v in variants):
        parser.error(tr("variants of minisgl are compared with minisgl itself: add minisgl to --peers"))
    labels = [*names, *(v.name for v in variants)]
    if len(set(labels)) != len(labels):
        parser.error(tr("every server and variant needs its own name: {names}", names=labels))
    if args.seed < 0:
        parser.error(tr("--seed must not be negative (Random(-n) draws the same numbers as Random(n))"))
    if args.repeats < 1:
        parser.error(tr("--repeats must be at least 1"))
    tokenizer = args.tokenizer or args.model
    if tokenizer is None:
        parser.error(tr("with --url, give --tokenizer DIR (its vocabulary gives the prompt token ids)"))
    runs = [Run("poisson", r) for r in parse_list(args.rates or "", float)]
    runs += [Run("closed", c) for c in parse_list(args.concurrency or ("" if runs else "1,4,8"), int)]
    opts = Options(requests=args.requests, num_requests=args.num_requests, prompt_len=args.prompt_len,
                   output_len=args.output_len, prefix_len=args.prefix_len, tail_len=args.tail_len, seed=args.seed,
                   timeout=args.timeout, ignore_eos=not args.no_ignore_eos, slo=Slo(args.slo_ttft, args.slo_tpot))
    vocab = load_vocab(tokenizer)
    peers = [Peer("url", url=args.url)] if args.url else build_peers(names, args.model, server_flags, variants)

    machine = machine_info()
    print(tr("{requests} set, {n} requests per run; every server gets the same requests (seed {seed})",
             requests=args.requests, n=args.num_requests, seed=args.seed))
    with QuietWatch() if args.record else contextlib.nullcontext() as watch:
        before = cpu_times()
        outcomes = [run_peer(peer, runs, vocab, opts, args) for peer in peers]
        machine["steal_percent"] = steal_percent(before, cpu_times())
    if watch is not None:
        machine.update(recorded=True, intruders=sorted(watch.intruders.values()), quiet=not watch.intruders)
        if watch.intruders:
            print(tr("Other processes took CPU during the runs, so these timings are not fit for the book: {who}",
                     who="; ".join(watch.intruders.values())))
    ratios = ratio_rows(outcomes)
    print_report(outcomes, ratios, peers, opts)
    report: dict[str, Any] = {"args": {k: _plain(v) for k, v in vars(args).items()}, "server_flags": server_flags,
                              "machine": machine, "peers": [o.report() for o in outcomes], "ratios": ratios,
                              "ratio_spreads": ratio_spreads(ratios)}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(tr("Records and summaries written to {path}", path=args.json))
    if args.plot is not None:
        for language, path in plot_paths(args.plot).items():
            plot(report, path, language)
        print(tr("Plots written to {path}", path=args.plot))
    return report


def exit_code(report: dict[str, Any]) -> int:
    """有服务器没测成（没装的不算）或留下了进程时为 1，否则为 0。

    en: 1 when a server could not be measured (absent ones aside) or left processes behind, else 0.
    """
    return int(any(p["status"] == "failed" or p.get("left_behind") for p in report["peers"]))


if __name__ == "__main__":
    sys.exit(exit_code(main()))
