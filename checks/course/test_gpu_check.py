"""``tools/gpu_check.py`` 在 CPU 上能检查的部分：步骤的先后与预算、怎么读 pytest 的结果、超时的一步留下全部输出、
汇总表、没有 GPU 或缺前置条件时的退出码、``--without-smollm2`` 只取消选中真正用到 SmolLM2 的检查，
以及 ``--dry-run``：同样的步骤在 CPU 上走一遍，整条流程（导入、环境、超时、汇总、退出码）都跑通。"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minisgl.i18n import tr
from minisgl.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tools"))
import gpu_check  # noqa: E402

#: 一次完整的 GPU 检查（连同小号基准）要在一条 10 分钟的命令里跑完，还要留出启动的时间。
ONE_RUN_SECONDS = 570


def test_pytest_counts() -> None:
    out = "....F\n===== 12 passed, 1 failed, 3 deselected in 41.2s =====\n"
    assert gpu_check.pytest_counts(out) == "12 passed, 1 failed, 3 deselected"
    assert gpu_check.pytest_counts("1 passed in 0.1s") == "1 passed"
    assert gpu_check.pytest_counts("109 tests collected in 3.1s") == "109 tests collected"
    assert gpu_check.pytest_counts("Traceback ...\nImportError: x") == ""


def test_real_run_order_and_budget() -> None:
    steps = gpu_check.check_steps("python", have_smollm2=False, bench=False)
    commands = [" ".join(s.command) for s in steps]
    assert "build_models.py" in commands[0] and "checks/gpu" in commands[1], tr(
        "The models are built first, then the CUDA-graph checks run before everything else")
    assert "stage2_milestone.py" in commands[2] and "--overlap" in commands[2] and not steps[2].env.get("MINISGL_DISABLE_CUDA_GRAPH"), tr(
        "The second check is the milestone with CUDA graphs and overlap scheduling (CUDA streams and events)")
    assert steps[3].env.get("MINISGL_DISABLE_CUDA_GRAPH") == "1" and "--overlap" in commands[3]
    assert [c.split()[-1] for c in commands[-2:]] == ["checks/stage1", "checks/stage2"]
    assert "checks/stage5/test_speculative.py::test_token_equal_to_plain_greedy" in steps[-1].command, tr(
        "Speculative decoding's token equality runs on the GPU too")
    for step in steps:
        assert step.env["MINISGL_DEVICE"] == "cuda"
        if "pytest" in step.command:
            assert step.command[step.command.index("--device") + 1] == "cuda" and "--without-smollm2" in step.command
            assert "--collect-only" not in step.command
    assert all("SmolLM2" in s.detail for s in steps if "pytest" in s.command and "checks/gpu" not in s.command)
    assert not any("stage4_milestone.py" in c for c in commands), tr("With one GPU there is no TP=2 step (its reason is printed instead)")
    two = gpu_check.check_steps("python", have_smollm2=False, bench=False, gpus=2)
    tp = [s for s in two if "examples/stage4_milestone.py" in s.command]
    assert len(tp) == 1 and tp[0].command[tp[0].command.index("--device") + 1] == "cuda" and "2" in gpu_check.tp_skip_reason(1), tr(
        "With 2 GPUs the stage 4 milestone runs at TP=2 on CUDA")
    assert gpu_check.plan_budget(two) <= ONE_RUN_SECONDS
    with_bench = gpu_check.check_steps("python", have_smollm2=True, bench=True)
    assert all("--without-smollm2" not in s.command for s in with_bench) and "bench/gpu.py" in with_bench[-1].command
    for plan in (steps, with_bench):
        need = gpu_check.plan_budget(plan)
        assert need == sum(s.timeout for s in plan) + gpu_check.MARGIN and need <= ONE_RUN_SECONDS, tr(
            "The step limits plus the margin ({need:.0f} s) must fit one run of {limit} s", need=need, limit=ONE_RUN_SECONDS)


def test_dry_run_plan_is_the_same_steps_on_cpu() -> None:
    real = gpu_check.check_steps("python", have_smollm2=True, bench=False, gpus=2)
    dry = gpu_check.check_steps("python", have_smollm2=True, bench=False, dry_run=True)
    assert len(dry) == len(real) and all(d.timeout == r.timeout * gpu_check.DRY_RUN_SLOWER for d, r in zip(dry, real))
    assert all(s.env["MINISGL_DEVICE"] == "cpu" for s in dry)
    assert all("--collect-only" in s.command for s in dry if "pytest" in s.command)


def test_summary_lists_every_step() -> None:
    steps = gpu_check.check_steps("python", have_smollm2=False, bench=True)
    steps[0].status, steps[0].detail = "failed", "1 failed"
    text = gpu_check.format_summary(["GPU: X"], steps)
    assert "GPU: X" in text and gpu_check.status_text("failed") in text
    assert all(s.name in text for s in steps)


def test_step_runs_and_reports(tmp_path: Path) -> None:
    ok = gpu_check.Step("ok", [sys.executable, "-c", "print('fine')"], 30)
    bad = gpu_check.Step("bad", [sys.executable, "-c", "import sys; print('坏了', file=sys.stderr); sys.exit(3)"], 30)
    # 超时的一步：输出停在一个汉字的半截（UTF-8 的前两个字节），还写了 stderr
    cut = "import sys, time; sys.stdout.buffer.write(b'half \\xe4\\xb8'); sys.stdout.flush(); print('err', file=sys.stderr, flush=True); time.sleep(30)"
    slow = gpu_check.Step("slow", [sys.executable, "-c", cut], 2)
    for step in (ok, bad, slow):
        gpu_check.run_step(step, tmp_path, time.monotonic() + 60)
    assert (ok.status, bad.status, slow.status) == ("passed", "failed", "timeout")
    assert "坏了" in bad.detail, tr("A failed step's detail must show the end of its stderr")
    assert "err" in slow.detail and "half" in slow.detail and slow.seconds < 10, tr(
        "A step that timed out must be stopped and still report all of its output, stdout and stderr, without a decoding error")
    assert len(list(tmp_path.glob("*.log"))) == 3
    late = gpu_check.Step("late", [sys.executable, "-c", "pass"], 30)
    gpu_check.run_step(late, tmp_path, time.monotonic() + 1)
    assert late.status == "skipped"


def test_refuses_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.fail(tr("This machine has CUDA: run make gpu-check directly"), pytrace=False)
    proc = subprocess.run([sys.executable, "tools/gpu_check.py"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "CUDA" in proc.stderr


def test_missing_prerequisite_stops_at_once(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(gpu_check, "PREREQUISITES", (*gpu_check.PREREQUISITES, "no_such_module_xyz"))
    started = time.monotonic()
    assert gpu_check.main(["--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "no_such_module_xyz" in err and ".whl" in err and time.monotonic() - started < 5, tr(
        "A missing package must be reported within seconds, with what to bring and how")


def test_budget_too_small_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    environ = dict(os.environ)
    assert gpu_check.main(["--dry-run", "--budget", "100", "--out", str(tmp_path)]) == 1
    assert "--budget" in capsys.readouterr().err and not list(tmp_path.glob("*.log"))
    assert dict(os.environ) == environ, tr("gpu_check.main must not change this process's environment (later checks inherit it)")


def test_dry_run_walks_every_step(tmp_path: Path) -> None:
    """检查器自己在 CPU 上从头到尾跑一遍：每一步都通过，汇总写到 --out。"""
    proc = subprocess.run([sys.executable, "tools/gpu_check.py", "--dry-run", "--out", str(tmp_path)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    summary = (tmp_path / "summary.txt").read_text(encoding="utf-8") if (tmp_path / "summary.txt").exists() else ""
    assert proc.returncode == 0, tr("gpu_check.py --dry-run failed:\n{output}", output=proc.stdout[-3000:] + proc.stderr[-3000:])
    steps = gpu_check.check_steps(sys.executable, True, False, dry_run=True)
    assert len(list(tmp_path.glob("*.log"))) == len(steps) and all(s.name in summary for s in steps)


def test_without_smollm2_deselects_exactly_those() -> None:
    args = [sys.executable, "-m", "pytest", "checks/stage2/test_scheduler.py", "--impl", "solution", "--collect-only", "-q"]
    out = subprocess.run([*args, "-p", "no:cacheprovider", "--without-smollm2"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    kept = {ln.split("::")[1].split("[")[0] for ln in out.splitlines() if "::" in ln}
    tree = ast.parse((REPO_ROOT / "checks/stage2/test_scheduler.py").read_text(encoding="utf-8"))
    tests = {f.name: {a.arg for a in f.args.args} for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")}
    uses = {name for name, params in tests.items() if any("smollm2" in p for p in params)}
    assert uses and kept == set(tests) - uses, f"{sorted(kept)} / {sorted(uses)}"
    assert "deselected" in out
