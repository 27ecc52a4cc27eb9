"""报告：同一次运行里的比值（我们 / 对方，几遍时给最小 / 中位数 / 最大）、终端里的表、延迟随负载变化的图，以及讲义里
直接由录制画出的表（``[[serve 录制名 表名]]``：讲义的钩子导入 :func:`book_table`）。

en: Reports: the ratios in one run (ours / the peer; min / median / max over passes), the terminal table, latency
against load as a plot, and the book's tables rendered straight from a recording (``[[serve recording table]]``: the
book's hook imports :func:`book_table`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.accounting import Percentiles, Summary
from bench.client import Options, RunResult
from bench.common import Stats
from bench.peers import OURS, Outcome, Peer
from bench.workload import run_label
from minisgl.course.cli import format_table
from minisgl.i18n import tr


# ----------------------------------------------------------------------------- 比值
# en: ----------------------------------------------------------------------------- ratios


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
            if r.counters.get("spec_verifies"):
                c = r.counters
                print(tr("  {run}: speculative decoding accepted {accepted:.0f} of {drafts:.0f} draft tokens, "
                         "{per_step:.2f} tokens per verification with a draft", run=run, accepted=c["spec_accepted_tokens"],
                         drafts=c["spec_draft_tokens"],
                         per_step=(c["spec_accepted_tokens"] + c["spec_verifies"]) / c["spec_verifies"]))
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


def _median_spread(values: Sequence[float]) -> str:
    """中位数（取整），几遍时括号里是最小 – 最大。

    en: The median (a whole number), with min – max in brackets over several passes.
    """
    if not values:
        return "–"
    st = Stats.of(list(values))
    return f"{st.median:.0f}" + (f" ({st.min:.0f}–{st.max:.0f})" if len(values) > 1 else "")


def _ms(sums: Sequence[dict[str, Any]], metric: str, q: str) -> str:
    """各遍汇总里一个时延百分位（毫秒）的 :func:`_median_spread`，没有这个数的遍不算。

    en: :func:`_median_spread` of one latency percentile (ms) over the passes' summaries, passes without it left out.
    """
    return _median_spread([v * 1000 for x in sums if (v := x[metric][q]) is not None])


def _passes(report: dict[str, Any], language: str
            ) -> Iterator[tuple[str, str, list[dict[str, Any]], list[dict[str, Any]]]]:
    """每家测成了的服务器、每次运行：(服务器, 运行的名字, 这次运行的各遍, 各遍的汇总)，保持运行的顺序。

    en: For every measured server and run: (server, the run's name, that run's passes, their summaries), in run order.
    """
    for peer in report["peers"]:
        if peer["status"] != "ok":
            continue
        by_run: dict[str, list[dict[str, Any]]] = {}
        for run in peer["runs"]:
            by_run.setdefault(run["key"], []).append(run)
        for runs in by_run.values():
            label = run_label(runs[0]["shape"], runs[0]["value"], language)
            yield peer["name"], label, runs, [r["summary"] for r in runs]


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
        rows = [[server, label, f"{sum(x['ok'] for x in sums)}/{sum(x['requests'] for x in sums)}",
                 _ms(sums, "ttft", "p50"), _ms(sums, "ttft", "p99"), _ms(sums, "tpot", "p50"), _ms(sums, "tpot", "p99"),
                 _median_spread([x["output_throughput"] for x in sums])]
                for server, label, _, sums in _passes(report, language)]
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
        for server, label, runs, sums in _passes(report, language):
            computed = [r["counters"]["prefill_tokens"] for r in runs if r.get("counters")]
            rows.append([server, label, _median_spread([x["prompt_tokens_sent"] for x in sums]),
                         _median_spread(computed) if computed else tr("not reported", language=language),
                         _ms(sums, "ttft", "p50")])
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
