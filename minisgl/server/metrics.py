"""API 服务器的 ``/metrics``（Prometheus 文本格式，由 ``prometheus_client`` 生成；第 3.4 章用它，给定）。

两种来源：API 服务器自己数的（完成的请求、token、错误、首 token 时间和每 token 时间的直方图、取消消息），以及调度器
每一步之后发来的最新 :class:`~minisgl.message.SchedulerStats`（运行 / 等待的请求、KV 页、累计的 token 和步数），
在被抓取时读出。每个服务器一个自己的 registry：同一个进程里的两个服务器（检查里就有）不会互相计数。

en: The API server's ``/metrics`` (the Prometheus text format, made by ``prometheus_client``; chapter 3.4 uses it,
given).

Two sources: what the API server counts itself (finished requests, tokens, errors, histograms of the time to the first
token and per output token, abort messages), and the latest :class:`~minisgl.message.SchedulerStats` the scheduler sends
after every step (running / waiting requests, KV pages, cumulative tokens and steps), read when scraped. One registry
per server: two servers in one process (the checks have them) never count into each other.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from minisgl.message import AbortMsg, SchedulerStats, UserReply, ZmqAsyncPushQueue

#: 首 token 时间的直方图分桶（秒）。
#: en: Histogram buckets (seconds) of the time to the first token.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: 每个输出 token 的时间的直方图分桶（秒）。
#: en: Histogram buckets (seconds) of the time per output token.
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
#: 完成的请求按结束原因计数；四种都总是列出来（为 0 也列）。
#: en: Finished requests are counted by finish reason; all four are always listed (also when 0).
FINISH_REASONS = ("stop", "length", "abort", "error")
#: Prometheus 文本格式的 Content-Type。
#: en: The Content-Type of the Prometheus text format.
CONTENT_TYPE = "text/plain; version=0.0.4"

# 计数器不另带 ``*_created`` 时间戳序列：/metrics 的内容与以前一样
# en: counters carry no extra ``*_created`` timestamp series: /metrics keeps its content
disable_created_metrics()


class _SchedulerCollector(Collector):
    """抓取时把调度器最新的现状变成指标（调度器还没发来过就全是 0）。

    en: When scraped, turns the scheduler's latest state into metrics (all 0 until the scheduler has sent one).
    """

    def __init__(self) -> None:
        self.stats = SchedulerStats(0, 0, 0, 0, 0, 0, 0, 0, 0)

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        yield GaugeMetricFamily("minisgl_running_requests", "Requests running in the scheduler (holding a request slot).", s.running)
        yield GaugeMetricFamily("minisgl_waiting_requests", "Requests waiting in the scheduler to be admitted.", s.waiting)
        yield GaugeMetricFamily("minisgl_kv_pages_used", "KV cache pages held by requests or the prefix cache.", s.pages_in_use)
        yield GaugeMetricFamily("minisgl_kv_pages_cached", "KV cache pages held only by the prefix cache (evictable, no request uses them).", s.pages_cached)
        yield GaugeMetricFamily("minisgl_kv_pages_free", "KV cache pages free.", s.pages_total - s.pages_in_use)
        yield GaugeMetricFamily("minisgl_kv_pages_total", "KV cache pages in all.", s.pages_total)
        yield CounterMetricFamily("minisgl_prefix_cache_hit_tokens", "Prefill tokens saved by the prefix cache.", s.cache_hit_tokens)
        yield CounterMetricFamily("minisgl_prefill_tokens", "Prefill tokens computed by the scheduler.", s.prefill_tokens)
        yield CounterMetricFamily("minisgl_decode_tokens", "Tokens decoded by the scheduler.", s.decode_tokens)
        yield GaugeMetricFamily("minisgl_max_decode_batch", "The largest decode batch so far.", s.max_decode_batch)
        yield CounterMetricFamily("minisgl_steps", "Scheduler steps so far.", s.steps)
        yield CounterMetricFamily("minisgl_spec_draft_tokens", "Speculative decoding: draft tokens verified.", s.spec_draft_tokens)
        yield CounterMetricFamily("minisgl_spec_accepted_tokens", "Speculative decoding: draft tokens accepted.", s.spec_accepted_tokens)
        lengths = s.spec_accept_lengths
        buckets = [(str(k), sum(lengths[: k + 1])) for k in range(1, len(lengths))] + [("+Inf", sum(lengths))]
        yield HistogramMetricFamily("minisgl_spec_accept_length", "Speculative decoding: tokens yielded per verification "
                                    "with a draft (the bonus token included).", buckets=buckets,
                                    sum_value=sum(k * n for k, n in enumerate(lengths)))


class ServerMetrics:
    """一个 API 服务器的全部指标。``active()`` 在抓取时给出还在等回复的请求数。

    en: All the metrics of one API server. ``active()`` gives, when scraped, the number of requests still waiting for
    replies.
    """

    def __init__(self, active: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.scheduler = _SchedulerCollector()
        self.registry.register(self.scheduler)
        opts: dict[str, Any] = {"registry": self.registry}
        self.active = Gauge("minisgl_active_requests", "Requests the API server is still waiting on (submitted, not finished, not aborted).", **opts)
        self.active.set_function(active)
        self.in_flight = Gauge("minisgl_http_requests_in_flight", "HTTP requests being handled (not counting /metrics and /health).", **opts)
        self.prompt_tokens = Counter("minisgl_prompt_tokens", "Prompt tokens of finished requests.", **opts)
        self.generation_tokens = Counter("minisgl_generation_tokens", "Tokens generated for finished requests.", **opts)
        self.finished = Counter("minisgl_requests_finished", "Finished requests by finish reason.", ["finish_reason"], **opts)
        for reason in FINISH_REASONS:
            self.finished.labels(reason)
        self.aborted = Counter("minisgl_aborted_requests", "Requests aborted (client gone or stop pressed).", **opts)
        self.abort_messages = Counter("minisgl_abort_messages", "AbortMsg sent by the API server to the tokenizer.", **opts)
        self.http_errors = Counter("minisgl_http_errors", "Error answers by HTTP status.", ["status"], **opts)
        self.ttft = Histogram("minisgl_time_to_first_token_seconds", "Time from the request to its first token.",
                              buckets=TTFT_BUCKETS, **opts)
        self.tpot = Histogram("minisgl_time_per_output_token_seconds", "Time per output token after the first.",
                              buckets=TPOT_BUCKETS, **opts)
        self._started: dict[int, float] = {}  # uid → 提交时刻 | en: uid → when it was submitted
        self._first: dict[int, float] = {}  # uid → 第一条回复的时刻 | en: uid → when its first reply came

    def submitted(self, uid: int) -> None:
        self._started[uid] = time.monotonic()

    def withdrawn(self, uid: int) -> None:
        """请求没能发出去：忘掉它的时刻。

        en: The request could not be sent: forget its times.
        """
        self._started.pop(uid, None)

    def reply(self, reply: UserReply, now: float) -> None:
        """记一条回复：第一条记首 token 时间；结束的那条记原因、token 数和每 token 时间。

        en: Note one reply: the first one gives the time to the first token; the finishing one its reason, its token
        counts and the time per output token.
        """
        uid = reply.uid
        if uid in self._started and uid not in self._first and not reply.error:
            self._first[uid] = now
            self.ttft.observe(now - self._started[uid])
        if not reply.finished:
            return
        started, first = self._started.pop(uid, None), self._first.pop(uid, None)
        reason = "error" if reply.error else (reply.finish_reason or "stop")
        self.finished.labels(reason).inc()
        if reason == "abort":
            self.aborted.inc()
        self.prompt_tokens.inc(reply.prompt_tokens)
        self.generation_tokens.inc(reply.completion_tokens)
        if started is not None and first is not None and reply.completion_tokens > 1:
            self.tpot.observe((now - first) / (reply.completion_tokens - 1))

    def error(self, status: int) -> None:
        self.http_errors.labels(str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class CountingPush:
    """发给分词进程的 PUSH，顺便数发出的取消消息（``minisgl_abort_messages_total``）。

    en: The PUSH to the tokenizer, counting the abort messages it sends (``minisgl_abort_messages_total``).
    """

    def __init__(self, queue: ZmqAsyncPushQueue, metrics: ServerMetrics) -> None:
        self.queue = queue
        self.metrics = metrics

    async def put(self, msg: Any) -> None:
        if isinstance(msg, AbortMsg):
            self.metrics.abort_messages.inc()
        await self.queue.put(msg)

    def close(self) -> None:
        self.queue.close()
