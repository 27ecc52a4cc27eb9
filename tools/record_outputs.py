"""录制示例的输出，给文档引用（``[[output 名字]]`` 读 ``docs/outputs/<名字>.txt``）。

    python tools/record_outputs.py                 # 全部重新录制
    python tools/record_outputs.py stage2_milestone quickstart
    python tools/record_outputs.py --check         # 重跑并与已提交的输出比较确定性的行
    python tools/record_outputs.py --list

示例一律用参考解答运行（``MINISGL_IMPL=solution``），与学员的进度无关。

“确定性的行”怎么比：每一行先把与机器有关的数字遮住——带时间、速度、内存单位的数（``1.23 s``、
``409 ms``、``104.5 tok/s``、``2.4 GB``）和倍数（``1.7×``）——遮住后整行必须与已提交的一致；
所以 token 数、分块、页数、生成的 token 这类数字都要逐字相等。个别示例还可以用 ``volatile``
正则整行跳过（例如打印设备名、线程数的行）。
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUTPUTS = REPO / "docs" / "outputs"


@dataclass(frozen=True)
class Example:
    script: str  # 相对仓库根目录
    args: tuple[str, ...] = ()
    volatile: tuple[str, ...] = ()  # 整行跳过的正则（与机器有关、又不是带单位的数字）
    timeout: int = 900


#: 文档引用的全部示例。名字就是 docs/outputs/<名字>.txt。
EXAMPLES: dict[str, Example] = {
    "step0": Example("examples/step0_tiny_engine.py"),
    "stage1_milestone": Example("examples/stage1_milestone.py", timeout=1800),
    "stage2_milestone": Example("examples/stage2_milestone.py", timeout=1800),
    "quickstart": Example("examples/quickstart.py"),
    # 各章的小示例（examples/chapters/），每章页面的“运行结果”来自这里
    "core": Example("examples/chapters/core.py"),
    "layers": Example("examples/chapters/layers.py"),
    "models": Example("examples/chapters/models.py"),
    "kvcache": Example("examples/chapters/kvcache.py"),
    "attention": Example("examples/chapters/attention.py"),
    "engine": Example("examples/chapters/engine.py"),
    "scheduler": Example("examples/chapters/scheduler.py"),
    "cache_manager": Example("examples/chapters/cache_manager.py"),
    "radix_cache": Example("examples/chapters/radix_cache.py"),
    "chunked_prefill": Example("examples/chapters/chunked_prefill.py"),
    "overlap": Example("examples/chapters/overlap.py"),
}

_UNIT = r"(?:ms|s|秒|毫秒|tok/s|token/s|tokens/s|it/s|GB/s|MB/s|GB|GiB|MB|MiB|KB|KiB|%)"
_MEASURED = re.compile(rf"\d+(?:\.\d+)?(?:e[-+]?\d+)?\s*{_UNIT}(?![A-Za-z])")
_RATIO = re.compile(r"\d+(?:\.\d+)?\s*(?:×|倍|x\b)")


def mask(line: str) -> str:
    """遮住与机器有关的数字，只留下应当逐字相等的部分。"""
    return _RATIO.sub("<倍数>", _MEASURED.sub("<测量值>", line.rstrip()))


def deterministic_lines(text: str, ex: Example) -> list[str]:
    pats = [re.compile(p) for p in ex.volatile]
    return [mask(l) for l in text.splitlines() if not any(p.search(l) for p in pats)]


def command_line(ex: Example) -> str:
    return " ".join(["python", ex.script, *ex.args])


def run(name: str, ex: Example) -> str:
    """运行一个示例（参考解答），返回要写进文件的文本：第一行是命令，后面是标准输出。"""
    env = {**os.environ, "MINISGL_IMPL": "solution", "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1"}
    env.pop("MINISGL_WORKSPACE", None)
    env.pop("MINISGL_SOLUTIONS", None)
    proc = subprocess.run(
        [sys.executable, ex.script, *ex.args], cwd=REPO, env=env, capture_output=True, text=True, timeout=ex.timeout
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise RuntimeError(f"{ex.script} 退出码 {proc.returncode}：\n{tail}")
    # 仓库在哪台机器、哪个目录都一样：绝对路径换成相对仓库根目录的路径
    body = "\n".join(l.rstrip() for l in proc.stdout.replace(str(REPO) + os.sep, "").rstrip().splitlines())
    return f"$ {command_line(ex)}\n{body}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="录制示例输出到 docs/outputs/，或检查它们是否仍然成立")
    parser.add_argument("names", nargs="*", help="只处理这些示例（默认全部）")
    parser.add_argument("--check", action="store_true", help="重跑并比较确定性的行，不写文件；不一致时退出码 1")
    parser.add_argument("--list", action="store_true", help="列出示例和它们的状态")
    args = parser.parse_args(argv)

    unknown = [n for n in args.names if n not in EXAMPLES]
    if unknown:
        print(f"不认识的示例：{', '.join(unknown)}；已知：{', '.join(EXAMPLES)}", file=sys.stderr)
        return 2
    names = args.names or list(EXAMPLES)

    if args.list:
        for name in names:
            ex = EXAMPLES[name]
            state = "已录制" if (OUTPUTS / f"{name}.txt").is_file() else "未录制"
            exists = "" if (REPO / ex.script).is_file() else "（脚本还不存在）"
            print(f"{name:18} {ex.script}{exists}  {state}")
        return 0

    OUTPUTS.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    missing: list[str] = []
    for name in names:
        ex = EXAMPLES[name]
        out_file = OUTPUTS / f"{name}.txt"
        if not (REPO / ex.script).is_file():
            print(f"[缺少] {name}：{ex.script} 还不存在，没有录制", flush=True)
            missing.append(name)
            continue
        t0 = time.perf_counter()
        try:
            text = run(name, ex)
        except subprocess.TimeoutExpired:
            print(f"[超时] {name}：{ex.script} 超过 {ex.timeout} 秒还没结束", flush=True)
            failed.append(name)
            continue
        except RuntimeError as err:
            print(f"[失败] {name}：{err}", flush=True)
            failed.append(name)
            continue
        took = f"{time.perf_counter() - t0:.1f} s"
        if not args.check:
            out_file.write_text(text, encoding="utf-8")
            print(f"[已录制] {name} → {out_file.relative_to(REPO)}（{took}）", flush=True)
            continue
        if not out_file.is_file():
            print(f"[未录制] {name}：没有 {out_file.relative_to(REPO)}，请运行 python tools/record_outputs.py {name}")
            failed.append(name)
            continue
        old = deterministic_lines(out_file.read_text(encoding="utf-8"), ex)
        new = deterministic_lines(text, ex)
        if old == new:
            print(f"[一致] {name}（{took}）", flush=True)
            continue
        failed.append(name)
        print(f"[不一致] {name}：确定性的行与已提交的 {out_file.relative_to(REPO)} 不同（与机器有关的数字已遮住）：")
        diff = difflib.unified_diff(old, new, "已提交", "本次运行", lineterm="", n=1)
        print("\n".join(diff), flush=True)
        print(f"如果改动是有意的，运行 python tools/record_outputs.py {name} 重新录制并提交。", flush=True)

    if missing:
        print(f"还没有脚本的示例：{', '.join(missing)}")
    if failed:
        print(f"{'检查' if args.check else '录制'}失败：{', '.join(failed)}")
    return 1 if failed or (args.check and missing) else 0


if __name__ == "__main__":
    sys.exit(main())
