"""服务的负载生成器（不是测试）：用官方的异步 ``openai`` 客户端压任何 OpenAI 兼容的服务，流式补全
（``/v1/completions``，``stream=True``，``stream_options={"include_usage": True}``），每次运行报 TTFT、TPOT、ITL、
端到端时延的 p50 / p90 / p99，输出 token/s，失败的请求和 goodput（满足 SLO 的请求数 / 秒）。

- 请求集（``--requests``）：``random`` 是随机的提示词长度和输出长度（固定种子）；``shared-prefix`` 是同一段系统提示词
  加各自一小段不同的尾巴。提示词直接给 token id（``prompt`` 接受 id 列表），长度分毫不差；分词器只用来挑合法的 id。
- 负载的形状：``--rates`` 是泊松到达（每秒几个请求，带种子），``--concurrency`` 是闭环（同时在飞的请求数固定）。
  每次运行换一个种子（种子 + 第几次），前缀缓存里不会留着上一次的提示词。
- 老实的账：每个请求都要 ``max_tokens=N`` 并带 ``ignore_eos``，``usage.completion_tokens`` 不等于 N 就算这个请求失败
  （“答得比要的少”），谁也不能靠少答赢。客户端不重试（``max_retries=0``）。
- ``--url`` 指向一个正在运行的服务；``--serve-model 目录`` 则自己起一个 ``python -m minisgl``（端口由系统挑，只绑
  127.0.0.1），预热、测量、关掉，确认没有留下子进程；不认识的参数都转给服务器。

    python bench/serve.py --serve-model models/qwen3-tiny-random --concurrency 1,4 --num-requests 8 \\
        --dtype float32 --num-pages 4096 --max-seq-len 1024
    python bench/serve.py --url http://127.0.0.1:1919/v1 --tokenizer models/qwen3-tokenizer --rates 0.5,1,2
    python bench/serve.py --serve-model models/qwen3-0.6b-random --requests shared-prefix --json /tmp/serve.json

en: A load generator for serving (not a test): it drives any OpenAI-compatible service with the official async
``openai`` client, streaming completions (``/v1/completions``, ``stream=True``,
``stream_options={"include_usage": True}``), and reports for each run p50 / p90 / p99 of TTFT, TPOT, ITL and end-to-end
latency, output token/s, failed requests and goodput (requests meeting the SLO, per second).

- Request sets (``--requests``): ``random`` has random prompt and output lengths (fixed seed); ``shared-prefix`` is one
  system prompt plus a short distinct tail each. Prompts are token ids (``prompt`` takes a list of ids), so their
  lengths are exact; the tokenizer only picks valid ids.
- Load shapes: ``--rates`` are Poisson arrivals (requests per second, seeded), ``--concurrency`` a closed loop (a fixed
  number of requests in flight). Each run gets its own seed (seed + run index), so the prefix cache holds nothing of
  the previous run's prompts.
- Honest accounting: every request asks ``max_tokens=N`` with ``ignore_eos``, and a ``usage.completion_tokens`` other
  than N fails that request ("answered less than asked"): no server wins by answering less. The client never retries
  (``max_retries=0``).
- ``--url`` points at a running service; ``--serve-model DIR`` starts a ``python -m minisgl`` itself (the OS picks the
  port, bound to 127.0.0.1 only), warms it up, measures, stops it and makes sure no child process is left; unknown flags
  go to the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import openai
from tqdm import tqdm  # type: ignore[import-untyped]

from minisgl.course.cli import format_table
from minisgl.i18n import tr
from minisgl.serving import ServerProcess

#: 每次运行的汇总里留下几条失败的原文。
#: en: How many failure texts each run's summary keeps.
KEPT_ERRORS = 3
REQUEST_SETS = ("random", "shared-prefix")


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
                    seed: int) -> list[RequestSpec]:
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


def valid_token_ids(tokenizer_dir: str | Path) -> list[int]:
    """分词器的普通词表里、不是特殊 token 的全部 id（只为挑合法的 id；本地目录，离线）。

    en: Every id of the tokenizer's base vocabulary that is not a special token (only to pick valid ids; a local folder,
    offline).
    """
    from transformers import AutoTokenizer  # 导入要几秒：只在真要发请求时才导入 | en: a few seconds to import: only when requests are really sent

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    special = set(tok.all_special_ids)
    return [i for i in range(tok.vocab_size) if i not in special]


# ----------------------------------------------------------------------------- 每个请求的记录与汇总
# en: ----------------------------------------------------------------------------- per-request records and the summary


@dataclass
class Record:
    """一个请求的原始记录，时刻全是 ``time.perf_counter()``：发出、第一段文字到达、每段文字到达、结束；要的和拿到的
    token 数（``usage.completion_tokens``，没报就是 None）；出错的原文。

    en: The raw record of one request, all times from ``time.perf_counter()``: sent, first text chunk, every text chunk,
    end; the tokens asked for and got (``usage.completion_tokens``, None when not reported); the error text.
    """

    send: float
    asked: int
    prompt_len: int = 0
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

    en: The summary of one run. Latencies count successful requests only; ``duration`` runs from the first send to the
    last end (seconds); throughput and goodput are per second of it.
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

    def per_second(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    return Summary(requests=len(records), ok=len(ok), failed=len(errors), errors=errors[:KEPT_ERRORS], duration=duration,
                   output_tokens=tokens, output_throughput=per_second(tokens), request_throughput=per_second(len(ok)),
                   good=good, goodput=per_second(good), ttft=Percentiles.of([r.ttft for r in ok]),
                   tpot=Percentiles.of(tpots), itl=Percentiles.of([g for r in ok for g in r.itl]),
                   e2e=Percentiles.of([r.e2e for r in ok]))


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
        if self.shape == "poisson":
            return tr("Poisson {rate:g} req/s", rate=self.value)
        return tr("concurrency {n}", n=int(self.value))


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


async def send_one(client: openai.AsyncOpenAI, model: str, spec: RequestSpec, opts: Options) -> Record:
    """发一个流式补全请求并记下时刻；出错、超时都记进 ``error``，不抛出。

    en: Send one streamed completion request and note the times; errors and timeouts go into ``error``, nothing is
    raised.
    """
    rec = Record(send=time.perf_counter(), asked=spec.max_tokens, prompt_len=len(spec.prompt))
    first_choice: float | None = None

    async def stream() -> None:
        nonlocal first_choice
        response = await client.completions.create(
            model=model, prompt=spec.prompt, max_tokens=spec.max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True} if opts.ignore_eos else None)
        try:
            async for chunk in response:
                now = time.perf_counter()
                if chunk.choices:
                    first_choice = first_choice or now
                    if chunk.choices[0].text:
                        rec.chunks.append(now)
                if chunk.usage is not None:
                    rec.got = chunk.usage.completion_tokens
        finally:
            await response.close()

    try:
        await asyncio.wait_for(stream(), opts.timeout)
    except asyncio.TimeoutError:
        rec.error = tr("no answer within {timeout:g} s", timeout=opts.timeout)
    except Exception as e:  # noqa: BLE001 - 任何错误都是这个请求的失败 | en: any error is this request's failure
        rec.error = f"{type(e).__name__}: {e}"
    rec.end = time.perf_counter()
    # 有的 token 单独解不出文字：那时第一段带选项的事件（哪怕只有 finish_reason）就是第一个 token
    # en: some tokens decode to no text alone: then the first event with a choice (even a bare finish_reason) is the first token
    rec.first_token = rec.chunks[0] if rec.chunks else first_choice
    return rec


async def run_poisson(client: openai.AsyncOpenAI, model: str, specs: list[RequestSpec], rate: float, seed: int,
                      opts: Options, done: Callable[[], object]) -> list[Record]:
    """按泊松到达的时刻发出每个请求，不等前面的回来（开环）。

    en: Send each request at its Poisson arrival time, without waiting for earlier ones (open loop).
    """
    start = time.perf_counter()

    async def at(offset: float, spec: RequestSpec) -> Record:
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        rec = await send_one(client, model, spec, opts)
        done()
        return rec

    return list(await asyncio.gather(*(at(t, s) for t, s in zip(poisson_schedule(len(specs), rate, seed), specs))))


async def run_closed(client: openai.AsyncOpenAI, model: str, specs: list[RequestSpec], concurrency: int,
                     opts: Options, done: Callable[[], object]) -> list[Record]:
    """闭环：``concurrency`` 个工人各自取下一个请求、发出、等它答完再取，直到取完。

    en: Closed loop: ``concurrency`` workers each take the next request, send it and wait for its answer before taking
    another, until none is left.
    """
    todo = iter(enumerate(specs))
    records: list[Record | None] = [None] * len(specs)

    async def worker() -> None:
        for i, spec in todo:
            records[i] = await send_one(client, model, spec, opts)
            done()

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(specs))))))
    return [r for r in records if r is not None]


@dataclass
class RunResult:
    run: Run
    records: list[Record]
    summary: Summary


async def measure(url: str, runs: Sequence[Run], ids: Sequence[int], opts: Options, *, api_key: str = "none",
                  model: str | None = None, warmup: int = 2, progress: bool = True) -> tuple[str, list[RunResult]]:
    """对 ``url`` 先预热（``warmup`` 个短请求，不计；有失败就报错），再依次跑每个 ``runs``；返回模型名和各次结果。

    en: Warm ``url`` up (``warmup`` short requests, not counted; any failure is an error), then do each of ``runs`` in
    turn; return the model name and the results.
    """
    client = openai.AsyncOpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=opts.timeout)
    try:
        name = model or (await client.models.list()).data[0].id
        warm = random_requests(warmup, ids, (16, 16), (4, 4), opts.seed - 1)
        for rec in await asyncio.gather(*(send_one(client, name, s, opts) for s in warm)):
            if (why := rec.failure()) is not None:
                raise RuntimeError(tr("A warm-up request failed: {why}", why=why))
        results = []
        for i, run in enumerate(runs):
            specs = opts.request_set(ids, opts.seed + i)
            with tqdm(total=len(specs), desc=run.name, unit="req", disable=not progress, leave=False,
                      file=sys.stderr) as bar:
                if run.shape == "poisson":
                    records = await run_poisson(client, name, specs, run.value, opts.seed + i, opts, bar.update)
                else:
                    records = await run_closed(client, name, specs, int(run.value), opts, bar.update)
            results.append(RunResult(run, records, summarize(records, opts.slo)))
        return name, results
    finally:
        await client.close()


# ----------------------------------------------------------------------------- 输出
# en: ----------------------------------------------------------------------------- output


def _num(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def _triple(p: Percentiles, scale: float) -> str:
    return "/".join(_num(None if v is None else v * scale) for v in (p.p50, p.p90, p.p99))


def results_table(results: Sequence[RunResult]) -> str:
    """每次运行一行的纯文本表格。

    en: A plain-text table with one row per run.
    """
    header = [tr("run"), tr("ok"), tr("failed"), tr("TTFT ms p50/p90/p99"), tr("TPOT ms p50/p90/p99"),
              tr("ITL ms p50/p90/p99"), tr("E2E s p50/p90/p99"), tr("output tok/s"), tr("req/s"), tr("goodput req/s")]
    rows = []
    for r in results:
        s = r.summary
        rows.append([r.run.name, f"{s.ok}/{s.requests}", str(s.failed), _triple(s.ttft, 1000), _triple(s.tpot, 1000),
                     _triple(s.itl, 1000), _triple(s.e2e, 1), _num(s.output_throughput), _num(s.request_throughput),
                     _num(s.goodput)])
    return format_table(header, rows)


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=tr("Load generator for an OpenAI-compatible server: streamed completions, "
                                               "TTFT / TPOT / ITL / end-to-end latency, throughput, goodput"),
                                epilog=tr("Unknown flags go to the server started with --serve-model "
                                          "(for example --dtype float32 --num-pages 4096)."))
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help=tr("base URL of a running server, e.g. http://127.0.0.1:1919/v1"))
    target.add_argument("--serve-model", help=tr("start python -m minisgl --model DIR on a free port, measure, stop it"))
    p.add_argument("--tokenizer", help=tr("tokenizer folder used to pick valid token ids (default: the --serve-model folder)"))
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
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300.0, help=tr("per-request timeout in seconds (default 300)"))
    p.add_argument("--warmup", type=int, default=2, help=tr("warm-up requests before measuring, not counted (default 2)"))
    p.add_argument("--no-ignore-eos", action="store_true",
                   help=tr("do not send ignore_eos (for servers without it); answers shorter than asked still count as failures"))
    p.add_argument("--slo-ttft", type=float, default=2.0, help=tr("SLO on TTFT in seconds, for goodput (default 2)"))
    p.add_argument("--slo-tpot", type=float, default=0.2, help=tr("SLO on TPOT in seconds, for goodput (default 0.2)"))
    p.add_argument("--json", type=Path, help=tr("write every per-request record and every summary to this JSON file"))
    p.add_argument("--no-progress", action="store_true", help=tr("no progress bar"))
    p.add_argument("--start-timeout", type=float, default=300.0, help=tr("seconds to wait for the started server (default 300)"))
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """跑完全部运行，打印表格，按 ``--json`` 写文件；返回同样内容的报告（``server`` 里有退出码和留下的进程）。

    en: Do every run, print the table, write ``--json``; return the same report (``server`` holds the exit code and the
    processes left behind).
    """
    parser = build_parser()
    args, server_flags = parser.parse_known_args(argv)
    if server_flags and not args.serve_model:
        parser.error(tr("unknown arguments {flags} (server flags are allowed only with --serve-model)", flags=server_flags))
    tokenizer = args.tokenizer or args.serve_model
    if tokenizer is None:
        parser.error(tr("with --url, give --tokenizer DIR (its vocabulary gives the prompt token ids)"))
    runs = [Run("poisson", r) for r in parse_list(args.rates or "", float)]
    runs += [Run("closed", c) for c in parse_list(args.concurrency or ("" if runs else "1,4,8"), int)]
    opts = Options(requests=args.requests, num_requests=args.num_requests, prompt_len=args.prompt_len,
                   output_len=args.output_len, prefix_len=args.prefix_len, tail_len=args.tail_len, seed=args.seed,
                   timeout=args.timeout, ignore_eos=not args.no_ignore_eos, slo=Slo(args.slo_ttft, args.slo_tpot))
    ids = valid_token_ids(tokenizer)

    report: dict[str, Any] = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    server = None
    if args.serve_model:
        server = ServerProcess(args.serve_model, *server_flags, timeout=args.start_timeout)
        print(tr("Starting {command} …", command=" ".join(["python -m minisgl", *server.command[3:]])))
        try:
            server.start()
        except RuntimeError as e:
            parser.exit(2, f"{e}\n")
    failed: Exception | None = None
    try:
        url = f"{server.url}/v1" if server is not None else args.url
        name, results = asyncio.run(measure(url, runs, ids, opts, api_key=args.api_key, model=args.model_name,
                                            warmup=args.warmup, progress=not args.no_progress))
    except (RuntimeError, openai.OpenAIError) as e:
        # 预热失败、列不出模型：服务不能用，没什么可测的
        # en: a failed warm-up, no model list: the service is not usable, nothing to measure
        failed = e
    finally:
        if server is not None:
            code = server.stop()
            report["server"] = {"flags": server_flags, "exit_code": code, "left_behind": server.left_behind}
            if server.left_behind:
                server.kill()
                print(tr("Processes left behind after the server stopped: {pids}", pids=server.left_behind))
    if failed is not None:
        parser.exit(1, f"{failed}\n")

    print(tr("{requests} set, {n} requests per run, {model} at {url}",
             requests=args.requests, n=args.num_requests, model=name, url=url))
    print(results_table(results))
    print(tr("SLO: TTFT ≤ {ttft:g} s and TPOT ≤ {tpot:g} s; goodput = successful requests within both, per second",
             ttft=opts.slo.ttft, tpot=opts.slo.tpot))
    for r in results:
        for why in r.summary.errors:
            print(tr("  {run}: failed: {why}", run=r.run.name, why=why))
    report.update(url=url, model=name, runs=[{"name": r.run.name, **asdict(r.run), "summary": asdict(r.summary),
                                              "records": [asdict(x) for x in r.records]} for r in results])
    if args.json is not None:
        args.json.write_text(json.dumps(report, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(tr("Records and summaries written to {path}", path=args.json))
    return report


if __name__ == "__main__":
    sys.exit(1 if main().get("server", {}).get("left_behind") else 0)
