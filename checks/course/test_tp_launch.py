"""``python -m minisgl`` 的张量并行参数（给定的 ``minisgl.server.args`` 与 ``minisgl.server.launch``）：说不通的组合在解析时就拒绝，
切不开模型的 ``--tp`` 在起任何进程之前就拒绝，并说出行得通的大小。

en: The tensor-parallel flags of ``python -m minisgl`` (the given ``minisgl.server.args`` and ``minisgl.server.launch``): combinations
that do not add up are refused while parsing, and a ``--tp`` that cannot split the model is refused before any process
starts, naming the sizes that work.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from checks.common import expect
from minisgl import model_zoo
from minisgl.course import select
from minisgl.i18n import tr


def test_launch_flags_are_checked_before_anything_starts() -> None:
    from minisgl.server.args import tp_problems

    expect(tp_problems(2, 1, 0, None), [], tr("--tp 2 on one node needs nothing else"))
    for args, what in (((3, 2, 0, "127.0.0.1:5000"), "--tp 3 over 2 nodes"), ((2, 2, 0, None), "--nnodes 2 without --dist-init-addr"),
                       ((2, 2, 2, "127.0.0.1:5000"), "--node-rank 2 of 2"), ((2, 1, 0, "localhost"), "--dist-init-addr without a port"),
                       ((0, 1, 0, None), "--tp 0")):
        expect(bool(tp_problems(*args)), True, tr("{what} is refused with a sentence", what=what))
    done = subprocess.run([sys.executable, "-m", "minisgl", "--model", str(model_zoo.smollm2()), "--tp", "2", "--port", "0"],
                          env={**os.environ, **select.impl_env()}, capture_output=True, text=True, timeout=120)
    expect((done.returncode, "1, 3" in done.stderr), (1, True), tr(
        "SmolLM2 at --tp 2 is refused before any process starts, naming the sizes that work (1, 3); got {code}: {err}",
        code=done.returncode, err=done.stderr[-500:]))


def test_expert_parallel_flags() -> None:
    from minisgl.server.launch import check_tp
    from minisgl.server.args import parse_args

    moe = str(model_zoo.tiny_qwen3_moe())
    got = [(a.tp_size, a.ep_size, a.scheduler_kwargs().get("ep_size")) for a in (
        parse_args(["--model", moe, "--ep", "2"]), parse_args(["--model", moe, "--tp", "2", "--enable-expert-parallel"]),
        parse_args(["--model", moe, "--tp", "2", "--ep-size", "2"]), parse_args(["--model", moe, "--tp", "2"]))]
    expect(got, [(2, 2, 2), (2, 2, 2), (2, 2, 2), (2, 1, None)],
           tr("--ep 2 alone means 2 ranks; vLLM's --enable-expert-parallel takes --tp; --tp 2 alone splits each expert"))
    expect(check_tp(parse_args(["--model", moe, "--ep", "2"])), None, tr("the tiny MoE splits at --ep 2"))
    refused = check_tp(parse_args(["--model", moe, "--ep", "3"]))
    expect(bool(refused) and "1, 2, 4" in refused, True,
           tr("--ep 3 on the tiny MoE (4 heads, 8 experts) is refused before any process starts, naming the sizes that "
              "work; got {message}", message=refused))
    dense = check_tp(parse_args(["--model", str(model_zoo.tiny_qwen3()), "--ep", "2"]))
    reason = tr("ep_size={ep} applies to mixture-of-experts models; {arch} has no experts", ep=2, arch="Qwen3ForCausalLM")
    expect(dense, reason, tr("--ep on a dense model is refused before any process starts"))


def test_data_parallel_flags() -> None:
    from minisgl.server.replicas import replica_env, replica_flags
    from minisgl.server.args import ServerArgs, dp_problems, parse_args

    tiny = str(model_zoo.tiny_qwen3())
    got = [(a.dp_size, a.router_policy) for a in (
        parse_args(["--model", tiny, "--dp", "2"]), parse_args(["--model", tiny, "--dp-size", "3", "--router-policy", "round_robin"]),
        parse_args(["--model", tiny, "--data-parallel-size", "2", "--router-policy", "shortest_queue"]),
        parse_args(["--model", tiny]))]
    expect(got, [(2, "cache_aware"), (3, "round_robin"), (2, "shortest_queue"), (1, "cache_aware")],
           tr("--dp (SGLang), --dp-size and vLLM's --data-parallel-size; --router-policy defaults to cache_aware"))
    expect(dp_problems(2, 1, None), [], tr("--dp 2 on one machine needs nothing else"))
    expect([bool(dp_problems(0, 1, None)), bool(dp_problems(2, 2, "127.0.0.1:5000")), bool(dp_problems(2, 1, "127.0.0.1:5000"))],
           [True, True, True], tr("--dp 0, and --dp with --nnodes or --dist-init-addr, are refused with a sentence"))
    argv = ["--model", tiny, "--dp", "2", "--port", "9", "--router-policy", "round_robin", "--router-cache-threshold", "0.7",
            "--tp", "2", "--dtype", "float32", "--max-running-req", "4", "--mem-fraction-static", "0.2",
            "--served-model-name", "m", "--api-key", "k"]
    args = parse_args(argv)
    flags = replica_flags(args)
    again = parse_args(["--model", tiny, *flags])
    keep = [f for f in ServerArgs.field_names() if f not in ("port", "dp_size", "router_policy", "router_cache_threshold")]
    expect({f: getattr(again, f) for f in keep}, {f: getattr(args, f) for f in keep},
           tr("Each replica gets every setting but the port and the router's: {flags}", flags=flags))
    expect(("--dp" in flags, "--port" in flags, "--router-policy" in flags), (False, False, False),
           tr("A replica is not told to start replicas or a router, and asks the OS for its own port: {flags}", flags=flags))
    expect(replica_env(1, parse_args(["--model", tiny, "--dp", "2", "--device", "cpu"]), 1), {"OMP_NUM_THREADS": "1"},
           tr("On the CPU each replica gets its share of the cores and no GPU"))


def test_router_flags_without_dp_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from minisgl.server.args import parse_args

    tiny = str(model_zoo.tiny_qwen3())
    for extra in (["--router-policy", "round_robin"], ["--dp", "1", "--router-cache-threshold", "0.7"]):
        with pytest.raises(SystemExit) as stopped:
            parse_args(["--model", tiny, *extra])
        err = capsys.readouterr().err
        expect((stopped.value.code, extra[-2] in err, "--dp N" in err), (2, True, True), tr(
            "{flag} without --dp is refused while parsing (status 2), naming the flag and --dp N, not silently ignored; "
            "got: {err}", flag=extra[-2], err=err))
