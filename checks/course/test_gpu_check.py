"""``tools/gpu_check.py`` 在 CPU 上能检查的部分：要跑哪些步骤、怎么读 pytest 的结果、汇总表、没有 GPU 时的退出码，
以及 ``--without-smollm2`` 只取消选中真正用到 SmolLM2 的检查。"""

from __future__ import annotations

import ast
import subprocess
import sys
import time

import pytest

from minisgl.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tools"))
import gpu_check  # noqa: E402


def test_pytest_counts() -> None:
    out = "....F\n===== 12 passed, 1 failed, 3 deselected in 41.2s =====\n"
    assert gpu_check.pytest_counts(out) == "12 passed, 1 failed, 3 deselected"
    assert gpu_check.pytest_counts("1 passed in 0.1s") == "1 passed"
    assert gpu_check.pytest_counts("Traceback ...\nImportError: x") == ""


def test_steps_without_smollm2_say_why() -> None:
    steps = gpu_check.check_steps("python", have_smollm2=False, bench=False)
    pytest_steps = [s for s in steps if "pytest" in s.command]
    assert len(pytest_steps) == 3
    for step in pytest_steps:
        assert "--device" in step.command and step.command[step.command.index("--device") + 1] == "cuda"
        assert "--without-smollm2" in step.command and "SmolLM2" in step.detail
    assert any("DISABLE_CUDA_GRAPH" in k for s in steps for k in s.env), "里程碑要有关掉 CUDA 图的一次"
    assert not any("bench" in " ".join(s.command) for s in steps)
    with_model = gpu_check.check_steps("python", have_smollm2=True, bench=True)
    assert all("--without-smollm2" not in s.command for s in with_model)
    assert any("bench/gpu.py" in s.command for s in with_model)


def test_summary_lists_every_step() -> None:
    steps = gpu_check.check_steps("python", have_smollm2=False, bench=True)
    steps[0].status, steps[0].detail = "失败", "1 failed"
    text = gpu_check.format_summary(["GPU：某卡"], steps)
    assert "GPU：某卡" in text and "失败" in text
    assert all(s.name in text for s in steps)


def test_step_runs_and_reports(tmp_path) -> None:  # noqa: ANN001
    ok = gpu_check.Step("ok", [sys.executable, "-c", "print('fine')"], 30)
    bad = gpu_check.Step("bad", [sys.executable, "-c", "raise SystemExit('坏了')"], 30)
    slow = gpu_check.Step("slow", [sys.executable, "-c", "import time; time.sleep(5)"], 0.5)
    for step in (ok, bad, slow):
        gpu_check.run_step(step, tmp_path, time.monotonic() + 60)
    assert (ok.status, bad.status, slow.status) == ("通过", "失败", "超时")
    assert "坏了" in bad.detail
    assert len(list(tmp_path.glob("*.log"))) == 3


def test_refuses_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.fail("这台机器有 CUDA：请直接运行 make gpu-check", pytrace=False)
    proc = subprocess.run([sys.executable, "tools/gpu_check.py"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "CUDA" in proc.stderr


def test_without_smollm2_deselects_exactly_those() -> None:
    args = [sys.executable, "-m", "pytest", "checks/stage2/test_scheduler.py", "--impl", "solution", "--collect-only", "-q"]
    out = subprocess.run([*args, "-p", "no:cacheprovider", "--without-smollm2"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    kept = {ln.split("::")[1].split("[")[0] for ln in out.splitlines() if "::" in ln}
    tree = ast.parse((REPO_ROOT / "checks/stage2/test_scheduler.py").read_text(encoding="utf-8"))
    tests = {f.name: {a.arg for a in f.args.args} for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")}
    uses = {name for name, params in tests.items() if any("smollm2" in p for p in params)}
    assert uses and kept == set(tests) - uses, f"留下的 {sorted(kept)}；用到 SmolLM2 的 {sorted(uses)}"
    assert "deselected" in out
