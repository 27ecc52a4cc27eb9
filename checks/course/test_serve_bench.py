"""``bench/serve.py`` 的负载生成器：账算得对（由已知时刻手造的记录）、请求集和泊松到达由种子决定；几家服务器
一起测时：每家的启动命令、没装的 llama.cpp 照样报出来（带安装命令）、起不来的那家记成失败（带输出的末尾）、
比值算得对；再对真服务器（小模型）冒烟跑一次：每个请求都拿到了要的 token 数，服务器关掉后不留下进程。

en: ``bench/serve.py``'s load generator: the accounting is right (records built by hand from known times), the request
sets and the Poisson arrivals follow the seed; with several servers: each one's start command, an absent llama.cpp
still reported (with the install command), a server that does not come up recorded as failed (with the tail of its
output), the ratios right; and one smoke run against the real server (tiny model): every request got the tokens it
asked for, and the server leaves no process behind once stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path

import pytest

from bench import accounting, client, peers, report, serve, workload
from bench.accounting import Record
from checks.stage3.conftest import tiny_model
from minisgl.i18n import tr
from minisgl.paths import REPO_ROOT

#: 小服务器的参数（与第 3 阶段检查的一样，fp32）。
#: en: The small server's flags (as in the stage-3 checks, fp32).
SERVER_FLAGS = ["--dtype", "float32", "--num-pages", "4096", "--max-seq-len", "1024"]


def _approx(actual: object, expected: object, what: str) -> None:
    assert actual == pytest.approx(expected), tr("{what}: expected {expected}, got {actual}", what=what,
                                                 expected=expected, actual=actual)


# ----------------------------------------------------------------------------- 账
# en: ----------------------------------------------------------------------------- accounting


def test_percentile_interpolates() -> None:
    xs = [float(x) for x in range(10, 0, -1)]  # 乱序的 1..10 | en: 1..10 out of order
    for q, expected in [(0, 1.0), (50, 5.5), (90, 9.1), (99, 9.91), (100, 10.0)]:
        _approx(accounting.percentile(xs, q), expected, f"p{q} of 1..10")
    _approx(accounting.percentile([3.0], 99), 3.0, "p99 of one sample")
    assert accounting.percentile([], 50) is None, tr("The percentile of no samples is None")


def _records() -> list:
    """手造的六个请求（时刻以秒计）：A、F 满足 SLO；B 的 TPOT 0.3 超了；C 的 TTFT 2.5 超了；D 要 4 个只答了 2 个；E 出错。

    en: Six hand-made requests (times in seconds): A and F meet the SLO; B's TPOT of 0.3 is over; C's TTFT of 2.5 is
    over; D asked for 4 and got 2; E has an error.
    """
    return [
        Record(send=100.0, asked=5, first_token=100.5, chunks=[100.5, 100.6, 100.7, 100.8, 100.9], end=100.9, got=5),
        Record(send=101.0, asked=3, first_token=102.0, chunks=[102.0, 102.3, 102.6], end=102.6, got=3),
        Record(send=101.5, asked=2, first_token=104.0, chunks=[104.0, 104.1], end=104.1, got=2),
        Record(send=102.0, asked=4, first_token=102.2, chunks=[102.2, 102.4], end=102.4, got=2),
        Record(send=102.5, asked=4, end=103.0, error="APIConnectionError: boom"),
        Record(send=103.0, asked=3, first_token=103.2, chunks=[103.2, 103.25, 103.3], end=103.3, got=3),
    ]


def test_summary_from_known_times() -> None:
    records = _records()
    s = accounting.summarize(records, accounting.Slo(ttft=2.0, tpot=0.2))
    assert (s.requests, s.ok, s.failed) == (6, 4, 2), tr("requests / ok / failed: expected (6, 4, 2), got {got}",
                                                         got=(s.requests, s.ok, s.failed))
    assert records[3].failure() is not None and "4" in records[3].failure(), \
        tr("A request that got fewer tokens than it asked for must count as failed")
    assert s.errors == [records[3].failure(), "APIConnectionError: boom"], tr("The failure texts, in order: {got}", got=s.errors)
    _approx(s.duration, 4.1, "duration (first send to last end)")
    # 只数成功的请求：5 + 3 + 2 + 3
    # en: successful requests only: 5 + 3 + 2 + 3
    assert s.output_tokens == 13, tr("output tokens: expected {expected}, got {actual}", expected=13, actual=s.output_tokens)
    _approx(s.output_throughput, 13 / 4.1, "output tok/s")
    _approx(s.request_throughput, 4 / 4.1, "req/s")
    # 只有 A 和 F 两个 TTFT ≤ 2 s 且 TPOT ≤ 0.2 s
    # en: only A and F have TTFT ≤ 2 s and TPOT ≤ 0.2 s
    assert s.good == 2, tr("goodput counts requests within both TTFT and TPOT: expected {expected}, got {actual}",
                           expected=2, actual=s.good)
    _approx(s.goodput, 2 / 4.1, "goodput")
    # TTFT 0.5, 1.0, 2.5, 0.2；TPOT (e2e − ttft)/(N − 1)：0.1, 0.3, 0.1, 0.05；e2e 0.9, 1.6, 2.6, 0.3
    # en: TTFT 0.5, 1.0, 2.5, 0.2; TPOT (e2e − ttft)/(N − 1): 0.1, 0.3, 0.1, 0.05; e2e 0.9, 1.6, 2.6, 0.3
    for name, p, expected, n in [("TTFT", s.ttft, (0.75, 2.05, 2.455), 4), ("TPOT", s.tpot, (0.1, 0.24, 0.294), 4),
                                 ("E2E", s.e2e, (1.25, 2.3, 2.57), 4), ("ITL", s.itl, (0.1, 0.3, 0.3), 9)]:
        _approx((p.p50, p.p90, p.p99), expected, f"{name} p50/p90/p99")
        assert p.n == n, tr("{name}: expected {expected} samples, got {actual}", name=name, expected=n, actual=p.n)
    _approx(sorted(records[0].itl), [0.1] * 4, "ITL of A (gaps between its chunks)")


def test_single_token_and_empty_runs() -> None:
    one = Record(send=0.0, asked=1, first_token=0.5, chunks=[0.5], end=0.5, got=1)
    s = accounting.summarize([one], accounting.Slo())
    assert one.tpot is None and s.tpot.n == 0 and s.good == 1, \
        tr("One token has no TPOT, and the request still meets the SLO on TTFT alone")
    silent = Record(send=0.0, asked=2, end=1.0, got=None)
    assert silent.failure() is not None, tr("A stream without usage cannot prove its token count: a failure")
    empty = accounting.summarize([], accounting.Slo())
    assert (empty.requests, empty.duration, empty.output_throughput, empty.ttft.p50) == (0, 0.0, 0.0, None), \
        tr("A run without records is all zeros")


# ----------------------------------------------------------------------------- 请求集与到达
# en: ----------------------------------------------------------------------------- request sets and arrivals


IDS = list(range(1000, 6000))


def test_random_requests_follow_the_seed() -> None:
    a = workload.random_requests(50, IDS, (16, 64), (4, 12), seed=7)
    assert a == workload.random_requests(50, IDS, (16, 64), (4, 12), seed=7), \
        tr("The same seed must give the same request set")
    assert a != workload.random_requests(50, IDS, (16, 64), (4, 12), seed=8), \
        tr("Another seed must give another request set")
    assert all(16 <= len(r.prompt) <= 64 and 4 <= r.max_tokens <= 12 and set(r.prompt) <= set(IDS) for r in a), \
        tr("Prompt and output lengths stay within their ranges, and every token id comes from the vocabulary")
    assert len({len(r.prompt) for r in a}) > 5 and len({r.max_tokens for r in a}) > 3, tr("The lengths really vary")


def test_shared_prefix_requests_share_the_prefix() -> None:
    a = workload.shared_prefix_requests(20, IDS, 200, (8, 32), (4, 12), seed=3)
    assert a == workload.shared_prefix_requests(20, IDS, 200, (8, 32), (4, 12), seed=3), \
        tr("The same seed must give the same request set")
    prefix = a[0].prompt[:200]
    assert all(r.prompt[:200] == prefix and 8 <= len(r.prompt) - 200 <= 32 for r in a), \
        tr("Every request starts with the same 200-token prefix, followed by a tail within the range")
    assert len({tuple(r.prompt[200:]) for r in a}) == len(a), tr("The tails are distinct")


def test_repeat_requests_repeat_a_passage() -> None:
    a = workload.repeat_requests(20, IDS, (16, 64), (4, 12), (4, 12), seed=3)
    assert a == workload.repeat_requests(20, IDS, (16, 64), (4, 12), (4, 12), seed=3), \
        tr("The same seed must give the same request set")
    for r in a:
        # 最短的周期就是那段文字：整段提示词按它重复，至少两遍
        # en: the shortest period is the passage: the whole prompt repeats it, at least twice
        period = next((k for k in range(1, len(r.prompt)) if r.prompt[k:] == r.prompt[:-k]), None)
        assert period is not None and 4 <= period <= 12 and max(16, 2 * period) <= len(r.prompt) <= max(64, 2 * period), \
            tr("A prompt repeats a passage of 4 to 12 tokens at least twice, within 16 to 64 tokens: {prompt}",
               prompt=r.prompt)
    assert len({tuple(r.prompt[:4]) for r in a}) == len(a), tr("Every request repeats its own passage")


def test_speculative_variant() -> None:
    ours, spec = peers.build_peers(["minisgl"], "models/m", ["--dtype", "float32"], [peers.SPECULATIVE])
    assert spec.name == "minisgl+ngram" and spec.command == [*ours.command, "--speculative-algorithm", "NGRAM"], \
        tr("--speculative measures our server again with NGRAM speculative decoding: {peer}", peer=spec)
    for argv in (["--url", "http://127.0.0.1:1/v1", "--tokenizer", "t", "--speculative"],
                 ["--model", "models/m", "--peers", "transformers", "--speculative"]):
        with pytest.raises(SystemExit):
            serve.main(argv)


def test_poisson_schedule() -> None:
    times = workload.poisson_schedule(20000, 4.0, seed=1)
    assert times == workload.poisson_schedule(20000, 4.0, seed=1) and times[0] == 0.0, \
        tr("The schedule follows the seed and starts at 0")
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) >= 0 and abs(statistics.mean(gaps) - 0.25) < 0.25 * 0.05, \
        tr("The mean gap is 1/rate = {expected} s, got {actual:.4f} s", expected=0.25, actual=statistics.mean(gaps))
    assert workload.poisson_schedule(5, float("inf"), seed=1) == [0.0] * 5, \
        tr("An infinite rate sends everything at once")


# ----------------------------------------------------------------------------- 几家服务器
# en: ----------------------------------------------------------------------------- several servers


def test_peer_commands() -> None:
    model = "models/SmolLM2-135M-Instruct"
    ours = peers.minisgl_peer(model, ["--dtype", "float32"])
    assert ours.command[1:] == ["-m", "minisgl", "--model", model, "--host", "127.0.0.1", "--port", "0",
                                "--dtype", "float32"] and ours.port is None, \
        tr("Our server: python -m minisgl on port 0 with the extra flags: {command}", command=ours.command)
    hf = peers.transformers_peer(model, port=4321)
    assert hf.command[1:] == ["-m", "transformers.cli.transformers", "serve", "--continuous-batching",
                              "--host", "127.0.0.1", "--port", "4321", "--device", "cpu", "--dtype", "float32",
                              "--cb-num-blocks", "32", "--cb-max-batch-tokens", "2048", "--log-level", "warning", model], \
        tr("transformers serve: continuous batching on the CPU in fp32 at the chosen port: {command}", command=hf.command)
    assert hf.form.text_prompt and "ignore_eos" not in hf.form.no_stop and hf.settings["version"], \
        tr("transformers gets text prompts, no ignore_eos, and its version is recorded: {peer}", peer=hf)
    gguf = Path("/m/SmolLM2-135M-Instruct.F32.gguf")
    cmd = peers.llamacpp_command(gguf, 5678, 2)
    assert cmd[1:] == ["-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", "5678",
                       "--n_ctx", str(peers.LLAMACPP_N_CTX), "--n_batch", "512", "--n_threads", "2",
                       "--n_threads_batch", "2", "--interrupt_requests", "false", "--logits_all", "false"], \
        tr("llama-cpp-python's server: the GGUF, the port, two threads, no interrupted requests: {command}", command=cmd)
    vocab = workload.Vocab(IDS, [0, 1, 2], lambda ids: " ".join(map(str, ids)))
    body = peers.llamacpp_peer(model, port=5678, threads=2).form.extra_body(7, vocab)
    assert body == {"repeat_penalty": 1.0, "min_tokens": 7, "logit_bias": {"0": -100.0, "1": -100.0, "2": -100.0}}, \
        tr("llama.cpp is asked not to stop early with min_tokens and the special tokens pushed down: {body}", body=body)
    assert client.RequestForm().extra_body(7, vocab, no_stop=False) == {}, tr("--no-ignore-eos sends no extra field")


def test_absent_llamacpp_is_reported(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # 不管这台机器装没装，都按没装走一遍（不跳过）
    # en: whether or not this machine has it, go through the not-installed path (never skipped)
    monkeypatch.setattr(peers, "llamacpp_installed", lambda: False)
    result = serve.main(["--model", tiny_model(), "--peers", "llamacpp", "--concurrency", "1", "--num-requests", "1",
                         "--no-progress"])
    printed = capsys.readouterr().out
    [peer] = result["peers"]
    assert peer["status"] == "absent" and peers.LLAMACPP_INSTALL in peer["error"] and peer["command"], \
        tr("An absent llama.cpp is reported with its install command and the command it would run: {peer}", peer=peer)
    assert peers.LLAMACPP_INSTALL in printed and "llamacpp" in printed, \
        tr("The absent server is printed, with the install command:\n{printed}", printed=printed)
    assert serve.exit_code(result) == 0 and result["ratios"] == [], tr("An absent server is not a failure: {report}",
                                                                      report=result)


def test_failed_peer_keeps_its_output(capsys: pytest.CaptureFixture[str]) -> None:
    args, _ = serve.build_parser().parse_known_args(["--model", "unused", "--start-timeout", "30"])
    broken = peers.Peer("broken", [sys.executable, "-c", "print('no weights here'); raise SystemExit(3)"],
                        port=peers.free_port())
    vocab = workload.Vocab(IDS, [], str)
    out = peers.run_peer(broken, [workload.Run("closed", 1)], vocab, client.Options(), args)
    assert out.status == "failed" and "3" in out.info["error"] and "no weights here" in out.info["output_tail"], \
        tr("A server that does not come up is failed, with why and the tail of its output: {info}", info=out.info)
    assert out.info["ready"] is False and not out.info["left_behind"], tr("Not ready, nothing left: {info}", info=out.info)
    assert "no weights here" in capsys.readouterr().out, tr("The tail of its output is printed")


def test_peer_process_stops_its_group() -> None:
    port = peers.free_port()
    # 一个会就绪的小服务器，再带一个子进程：整组都得停掉
    # en: a small server that gets ready, with a child process of its own: the whole group must stop
    code = ("import subprocess, sys, http.server; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, port={port}, bind='127.0.0.1')")
    server = peers.PeerProcess([sys.executable, "-c", code], port, "/", timeout=30)
    server.start()
    assert server.children, tr("The child process is noted once the server is ready")
    server.stop(timeout=10)
    # 只看这台服务器的进程树（就绪时记下的子孙 + 现在的子孙）：pytest 进程自己可能还有别的检查留下的合法子进程
    # en: only this server's process tree (descendants noted when ready + those now): the pytest process may have other
    # en: legitimate children of earlier checks
    assert server.children and not server.left_behind, \
        tr("SIGTERM to the group leaves no process: {pids}", pids=server.left_behind)


def _summary(tput: float, ttft_p99: float | None, tpot_p99: float | None) -> object:
    s = accounting.summarize(_records(), accounting.Slo())
    return dataclasses.replace(s, output_throughput=tput, ttft=accounting.Percentiles(None, None, ttft_p99, 1),
                               tpot=accounting.Percentiles(None, None, tpot_p99, 1))


def test_ratios() -> None:
    r = report.peer_ratios(_summary(30.0, 0.5, 0.1), _summary(10.0, 2.0, None))
    _approx((r["output_throughput"], r["ttft_p99"]), (3.0, 0.25), "ours / theirs: output tok/s and p99 TTFT")
    assert r["tpot_p99"] is None and report.ratio(1.0, 0.0) is None, tr("A missing or zero value gives no ratio")
    run1, run2 = workload.Run("closed", 1), workload.Run("closed", 4)

    def outcome(name: str, status: str, *summaries: object) -> object:
        results = [client.RunResult(run, [], s) for run, s in zip((run1, run2), summaries)]
        return peers.Outcome(name, status, results)

    ours = outcome("minisgl", "ok", _summary(30.0, 0.5, 0.1), _summary(40.0, 1.0, 0.2))
    others = [outcome("transformers", "ok", _summary(10.0, 1.0, 0.5), _summary(8.0, 4.0, 0.4)),
              outcome("llamacpp", "absent")]
    rows = report.ratio_rows([ours, *others])
    assert [(x["run"], x["peer"]) for x in rows] == [(run1.name, "transformers"), (run2.name, "transformers")], \
        tr("One ratio row per run and per measured peer: {rows}", rows=rows)
    _approx([(x["output_throughput"], x["ttft_p99"], x["tpot_p99"]) for x in rows], [(3.0, 0.5, 0.2), (5.0, 0.25, 0.5)],
            "ratios per run")
    failed = outcome("minisgl", "failed")
    assert report.ratio_rows([failed, *others]) == [], tr("Without our own results there is nothing to compare")


def test_ratio_spreads_over_passes() -> None:
    run = workload.Run("closed", 8)
    ours = peers.Outcome("minisgl", "ok", [client.RunResult(run, [], _summary(t, 1.0, 0.1), repeat=i)
                                           for i, t in enumerate((30.0, 20.0, 40.0))])
    theirs = peers.Outcome("llamacpp", "ok", [client.RunResult(run, [], _summary(10.0, 2.0, None), repeat=i)
                                              for i in range(3)])
    rows = report.ratio_rows([ours, theirs])
    assert [x["repeat"] for x in rows] == [0, 1, 2] and {x["key"] for x in rows} == {"closed:8"}, \
        tr("One row per pass, paired pass by pass: {rows}", rows=rows)
    [spread] = report.ratio_spreads(rows)
    tput = spread["output_throughput"]
    _approx((tput["min"], tput["median"], tput["max"]), (2.0, 3.0, 4.0), "min / median / max of the throughput ratio")
    _approx(spread["ttft_p99"]["median"], 0.5, "p99 TTFT ratio")
    assert spread["tpot_p99"] is None, tr("No ratio when the peer has no value in any pass: {spread}", spread=spread)


def test_variants_and_ablations() -> None:
    v = serve.parse_variant("chunk256=minisgl --max-extend-tokens 256 MINISGL_X=1")
    assert v == peers.Variant("chunk256", "minisgl", ("--max-extend-tokens", "256"), (("MINISGL_X", "1"),)), \
        tr("Flags and KEY=VALUE environment words are told apart: {v}", v=v)
    for bad in ("minisgl=minisgl --x 1", "v=nobody --x 1", "v=", "no-equals-sign"):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(bad))):
            serve.parse_variant(bad)
    assert serve.parse_ablations("all") == list(peers.ABLATIONS.values())
    with pytest.raises(argparse.ArgumentTypeError, match="no-batching"):
        serve.parse_ablations("no-such-thing")
    built = peers.build_peers(["minisgl"], "models/m", ["--dtype", "float32"],
                              [peers.ABLATIONS["no-overlap"], peers.ABLATIONS["no-batching"],
                               serve.parse_variant("tf-small=transformers --cb-max-batch-tokens 512")])
    ours, no_overlap, no_batching, tf = built
    assert no_overlap.command == ours.command and no_overlap.env == {"MINISGL_DISABLE_OVERLAP_SCHEDULING": "1"}, \
        tr("Overlap is turned off through the environment of the same command: {peer}", peer=no_overlap)
    assert no_batching.command == [*ours.command, "--max-running-req", "1"] and no_batching.counters, \
        tr("An ablation appends its flags after our flags and keeps our counters: {peer}", peer=no_batching)
    assert tf.command[-2:] == ["--cb-max-batch-tokens", "512"] and tf.settings["variant_of"] == "transformers", \
        tr("A peer's variant appends its flags and says what it is based on: {peer}", peer=tf)
    proc = no_overlap.process(5)
    assert proc.env["MINISGL_DISABLE_OVERLAP_SCHEDULING"] == "1", tr("The environment reaches the started process")
    for argv in (["--ablations", "no-overlap", "--variant", "minisgl-no-overlap=minisgl"],
                 ["--peers", "transformers", "--ablations", "no-overlap"], ["--seed", "-1"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            serve.main(["--model", "models/m", *argv])


def test_warmup_prompts_are_no_run_prefix() -> None:
    # Random(-1) 与 Random(1) 抽出同样的数：预热曾经和第 2 次运行的第一个请求一字不差
    # en: Random(-1) and Random(1) draw the same numbers: the warm-up once equalled the first request of run 2
    warm = [s.prompt for s in workload.warmup_requests(2, IDS, 0)]
    runs = [s.prompt for seed in range(0, 6) for s in workload.random_requests(8, IDS, (16, 16), (4, 4), seed)]
    shared = [w for w in warm for r in runs if w[:4] == r[:4]]
    assert not shared, tr("A warm-up prompt starts like a measured request (a free prefix-cache hit): {shared}",
                          shared=shared)


# ----------------------------------------------------------------------------- 对真服务器冒烟
# en: ----------------------------------------------------------------------------- smoke run against the real server


def test_smoke_run_against_our_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    # 这里测的是负载生成器，不是学员写到一半的服务器：服务器用参考解答
    # en: this checks the load generator, not a learner's half-written server: the server runs the reference solution
    monkeypatch.setenv("MINISGL_IMPL", "solution")
    out = tmp_path / "serve.json"
    result = serve.main(["--serve-model", tiny_model(), "--concurrency", "3", "--num-requests", "6",
                         "--prompt-len", "8,24", "--output-len", "3,10", "--warmup", "1", "--timeout", "60",
                         "--no-progress", "--json", str(out), "--repeats", "2", "--plot", str(tmp_path / "serve.svg"),
                         *SERVER_FLAGS])
    printed = capsys.readouterr().out
    [server] = result["peers"]
    assert (tmp_path / "serve.svg").is_file() and (tmp_path / "serve.en.svg").is_file(), tr("Both pictures are drawn")
    assert [r["repeat"] for r in server["runs"]] == [0, 1], tr("Two passes of the one run")
    for run in server["runs"]:
        c, sent = run["counters"], run["summary"]["prompt_tokens_sent"]
        assert (c["prefill_tokens"], c["prefix_hit_tokens"]) == (sent, 0), \
            tr("Random prompts: every prompt token computed, no prefix-cache hit (the warm-up shares nothing): "
               "{counters}, {sent} sent", counters=c, sent=sent)
        assert c["decode_tokens"] >= run["summary"]["output_tokens"] - 6, tr("Our counters see the decoded tokens: {c}", c=c)
    server = {**server, "runs": server["runs"][:1]}
    assert server["status"] == "ok" and server["exit_code"] == 0 and not server["left_behind"], \
        tr("The server must exit with 0 and leave no process: {server}", server={k: v for k, v in server.items() if k != "runs"})
    assert json.loads(out.read_text(encoding="utf-8")) == json.loads(json.dumps(result)), \
        tr("--json writes the same report that main() returns")
    assert serve.exit_code(result) == 0, tr("A clean run exits with 0")
    [run] = server["runs"]
    records, s = run["records"], run["summary"]
    assert len(records) == 6 and all(r["error"] is None and r["got"] == r["asked"] for r in records), \
        tr("Every request succeeds with exactly the tokens it asked for: {records}", records=records)
    assert (s["requests"], s["ok"], s["failed"], s["output_tokens"]) == (6, 6, 0, sum(r["asked"] for r in records)), \
        tr("The summary counts the six requests and their tokens: {summary}", summary=s)
    assert s["prompt_tokens_counted"] == s["prompt_tokens_sent"] and s["prompt_mismatched"] == 0, \
        tr("Our server counts exactly the prompt ids it was sent: {summary}", summary=s)
    for r in records:
        times = [r["send"], r["first_token"], *r["chunks"], r["end"]]
        assert times[0] < times[1] and times == sorted(times), tr("Times in order: {record}", record=r)
    _approx(s["output_throughput"], s["output_tokens"] / s["duration"], "output tok/s")
    _approx(s["duration"], max(r["end"] for r in records) - min(r["send"] for r in records), "duration")
    p = s["ttft"]
    assert p["n"] == 6 and p["p50"] <= p["p90"] <= p["p99"] <= s["e2e"]["p99"], tr("Percentiles in order: {summary}", summary=s)
    assert run["name"] in printed and "6/6" in printed, tr("The table shows the run:\n{printed}", printed=printed)


# ----------------------------------------------------------------------------- 讲义的录制
# en: ----------------------------------------------------------------------------- the book's recordings

#: 讲义“压力下的服务”引用的录制（``bench/serve.py --record --json docs/outputs/<名字>.json``）。
#: en: The recordings the book page "Serving under load" cites (``bench/serve.py --record --json docs/outputs/<name>.json``).
RECORDINGS = ("serve", "serve-ablations", "serve-prefix", "serve-0.6b")
#: 页面里引用一个比值的写法：``2.3×<!-- serve 录制 运行 对方 量 -->``（讲义其他页面的 ``<!-- ratio -->`` 引用文本录制，
#: 见 checks/docs/test_recorded_ratios.py）。
#: en: How the page cites a ratio: ``2.3×<!-- serve recording run peer quantity -->`` (the book's other pages cite text
#: recordings with ``<!-- ratio -->``, see checks/docs/test_recorded_ratios.py).
CITED = re.compile(r"(?P<num>\d+(?:\.\d+)?)×\s*<!-- serve (?P<rec>[\w.-]+) (?P<key>\S+) (?P<peer>\S+) (?P<metric>\w+) -->")
BARE = re.compile(r"\d+(?:\.\d+)?×(?!\s*<!-- serve )")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _recording(name: str) -> dict:
    return json.loads((REPO_ROOT / "docs" / "outputs" / f"{name}.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", RECORDINGS)
def test_recordings_are_whole_and_quiet(name: str) -> None:
    recording = _recording(name)
    machine = recording["machine"]
    assert machine.get("recorded") and machine.get("quiet"), \
        tr("{name}: recorded with --record on a quiet machine: {machine}", name=name, machine=machine)
    for peer in recording["peers"]:
        assert peer["status"] == "ok" and not peer["left_behind"], \
            tr("{name}: every server measured, nothing left behind: {peer}", name=name,
               peer={k: v for k, v in peer.items() if k != "runs"})
        ours = peer["settings"].get("variant_of", peer["name"]) == "minisgl"
        for run in peer["runs"]:
            s = run["summary"]
            # 别家答得比要的少时记成失败、照样报出来；我们的服务器一个也不许
            # en: a peer answering less than asked is recorded as a failure and reported; our server may have none
            assert s["ok"] + s["failed"] == s["requests"] == len(run["records"]) and not (ours and s["failed"]), \
                tr("{name}: {peer}, {run}: every request got the tokens it asked for: {errors}", name=name,
                   peer=peer["name"], run=run["name"], errors=s["errors"])
            again = accounting.summarize([Record(**r) for r in run["records"]],
                                         accounting.Slo(recording["args"]["slo_ttft"], recording["args"]["slo_tpot"]))
            _approx(again.output_throughput, s["output_throughput"], f"{name}: {peer['name']}, {run['name']}: tok/s from the records")
    # 比值由录下的汇总重新算，确认没有手改
    # en: the ratios recomputed from the recorded summaries, so nothing was edited by hand
    ours = next(p for p in recording["peers"] if p["name"] == "minisgl")
    for row in recording["ratios"]:
        peer = next(p for p in recording["peers"] if p["name"] == row["peer"])
        mine = next(r for r in ours["runs"] if r["key"] == row["key"] and r["repeat"] == row["repeat"])
        theirs = next(r for r in peer["runs"] if r["key"] == row["key"] and r["repeat"] == row["repeat"])
        _approx(row["output_throughput"], mine["summary"]["output_throughput"] / theirs["summary"]["output_throughput"],
                f"{name}: {row['run']} / {row['peer']}: the throughput ratio")
    if name == "serve":
        assert [p["name"] for p in recording["peers"]] == list(peers.PEERS), \
            tr("The main recording has all three servers: {names}", names=[p["name"] for p in recording["peers"]])


@pytest.mark.parametrize("page", ["docs/serving.md", "docs/serving.en.md"])
def test_book_page_cites_the_recordings(page: str) -> None:
    text = (REPO_ROOT / page).read_text(encoding="utf-8")
    cited = list(CITED.finditer(text))
    assert len(cited) >= 8, tr("{page} cites its ratios from the recordings ({n} found)", page=page, n=len(cited))
    spreads = {name: _recording(name)["ratio_spreads"] for name in RECORDINGS}
    for m in cited:
        row = next((r for r in spreads[m["rec"]] if r["key"] == m["key"] and r["peer"] == m["peer"]), None)
        assert row is not None and row[m["metric"]] is not None, \
            tr("{page}: no such ratio in the recording: {cite}", page=page, cite=m[0])
        decimals = len(m["num"].partition(".")[2])
        recorded = round(row[m["metric"]]["median"], decimals)
        assert abs(recorded - float(m["num"])) < 1e-9, \
            tr("{page}: cites {cite} but the recording says {recorded}×", page=page, cite=m[0], recorded=recorded)
    bare = BARE.findall(FENCE.sub("", text))
    assert not bare, tr("{page}: ratios not tied to a recording: {bare}", page=page, bare=bare)
