"""发请求：官方的异步 ``openai`` 客户端按各家服务器的问法（:class:`RequestForm`）发流式补全、记下时刻，泊松到达（开环）
或闭环；预热之后把每次运行跑完。客户端从不重试：失败要记进账里，而不是被悄悄补上。

en: Sending: the official async ``openai`` client sends streamed completions the way each server is asked
(:class:`RequestForm`) and notes the times, under Poisson arrivals (open loop) or a closed loop; after a warm-up it does
every run. The client never retries: a failure belongs in the accounting, not quietly made up for.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai
from tqdm import tqdm  # type: ignore[import-untyped]

from bench.accounting import Record, Slo, Summary, summarize
from bench.workload import (RequestSpec, Run, Vocab, poisson_schedule, random_requests, repeat_requests,
                            shared_prefix_requests, warmup_requests)
from minisgl.i18n import tr


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
    prefix_groups: int = 1
    seed: int = 0
    timeout: float = 300.0
    ignore_eos: bool = True
    slo: Slo = Slo()

    def request_set(self, ids: Sequence[int], seed: int) -> list[RequestSpec]:
        if self.requests == "shared-prefix":
            return shared_prefix_requests(self.num_requests, ids, self.prefix_len, self.tail_len, self.output_len, seed,
                                          self.prefix_groups)
        if self.requests == "repeat":
            return repeat_requests(self.num_requests, ids, self.prompt_len, self.tail_len, self.output_len, seed)
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
            "decode_tokens": "minisgl_decode_tokens_total", "steps": "minisgl_steps_total",
            "spec_draft_tokens": "minisgl_spec_draft_tokens_total",
            "spec_accepted_tokens": "minisgl_spec_accepted_tokens_total",
            "spec_verifies": "minisgl_spec_accept_length_count"}
#: 最后一个请求答完之后等多久再读计数器：调度器空下来时才补发最后的计数。
#: en: How long to wait after the last answer before reading the counters: the scheduler sends its last counts once idle.
SETTLE_S = 0.5


def counter_total(metrics: dict[str, float], name: str) -> float | None:
    """计数器 ``name`` 的值；``--dp`` 的路由器按副本分开报（``name{replica="0"}`` ……），就加起来。没有就是 None。

    en: The value of counter ``name``; the ``--dp`` router reports it per replica (``name{replica="0"}`` ...), so add
    them up. None when absent.
    """
    values = [v for k, v in metrics.items() if k == name or k.startswith(name + "{")]
    return sum(values) if values else None


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
                if probe is not None:  # 上一次运行（或预热）最后的计数可能还在路上 | en: the last counts of the previous run (or the warm-up) may still be on their way
                    await asyncio.sleep(SETTLE_S)
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
                    pairs = {k: (counter_total(before, m), counter_total(after, m)) for k, m in COUNTERS.items()}
                    counters = {k: a - b for k, (b, a) in pairs.items() if a is not None and b is not None}
                results.append(RunResult(run, records, summarize(records, opts.slo), repeat, counters))
        return name, results
    finally:
        await client.close()
