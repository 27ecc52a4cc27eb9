"""``python -m minisgl.course``：看进度、换实现、重置章节、跑检查、给全班打分。"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

from minisgl.course import select
from minisgl.course.registry import CHAPTERS, COURSE_ROOT, Chapter, get_chapter
from minisgl.course.pytest_plugin import IMPL_NAMES


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """按显示宽度对齐（一个汉字占两格）。"""
    widths = [max(_width(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, ["-" * w for w in widths], *rows]:
        lines.append("  ".join(cell + " " * (w - _width(cell)) for cell, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def _results(workspace: Path) -> dict:
    path = workspace / ".minisgl" / "results.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _outcome(entry: dict | None) -> str:
    if not entry:
        return "—"
    passed, failed = entry.get("passed", 0), entry.get("failed", 0)
    if passed + failed == 0:
        return "未开始" if entry.get("skipped") else "—"
    word = "通过" if failed == 0 and passed > 0 else "失败"
    return f"{word} {passed}/{passed + failed}"


def status_rows() -> list[list[str]]:
    workspace = select.workspace_root()
    results = _results(workspace)
    rows = []
    for ch in CHAPTERS:
        if not select.is_written(ch):
            rows.append([ch.label, ch.id, ch.title, "—", "未编写", "—"])
            continue
        choice = select.choose(ch)
        started = "是" if select.is_started(ch, workspace) else "否"
        rows.append([ch.label, ch.id, ch.title, started, f"{IMPL_NAMES[choice.impl]}（{choice.reason}）", _outcome(results.get(ch.id))])
    return rows


def cmd_status(args: argparse.Namespace) -> int:
    print(f"工作区：{select.workspace_root()}")
    print(format_table(["章", "id", "标题", "已开始", "当前实现", "上次检查"], status_rows()))
    return 0


def _chapters(names: list[str]) -> list[Chapter]:
    return list(CHAPTERS) if names == ["all"] else [get_chapter(n) for n in names]


def cmd_use(args: argparse.Namespace) -> int:
    saved = select.saved_selection()
    for ch in _chapters(args.chapters):
        saved[ch.id] = args.impl
        print(f"第 {ch.label} 章 {ch.id} → {'按规则自动选择' if args.impl == 'auto' else IMPL_NAMES[args.impl]}")
    select.save_selection(saved)
    if os.environ.get(select.ENV_IMPL):
        print(f"注意：环境变量 {select.ENV_IMPL}={os.environ[select.ENV_IMPL]} 优先于这里的选择。")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    ws = select.workspace_root()
    code = 0
    for ch in _chapters(args.chapters):
        if not select.is_written(ch):
            continue
        if select.is_started(ch, ws) and not args.force:
            print(f"第 {ch.label} 章 {ch.id}：{ch.relpath} 里有你的改动，没有重置。确定要丢掉它们，请加 --force。")
            code = 1
            continue
        (ws / ch.relpath).write_text(select.skeleton_source(ch), encoding="utf-8")
        print(f"第 {ch.label} 章 {ch.id}：已恢复为骨架。")
    return code


def run_checks(workspace: Path, targets: list[str], quiet: bool = False) -> tuple[int, dict]:
    """在子进程里对一个工作区跑检查，返回退出码和每章结果。"""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        env = {**os.environ, select.ENV_WORKSPACE: str(workspace)}
        env.pop(select.ENV_IMPL, None)
        cmd = [sys.executable, "-m", "pytest", *targets, "--impl", "learner", "--results-json", str(out), "-q"]
        code = subprocess.call(cmd, cwd=COURSE_ROOT, env=env, stdout=subprocess.DEVNULL if quiet else None)
        return code, json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {}


def cmd_check(args: argparse.Namespace) -> int:
    chapters = _chapters(args.chapters)
    code, results = run_checks(select.workspace_root(), [str(COURSE_ROOT / ch.check_file) for ch in chapters])
    print(format_table(["章", "id", "结果"], [[c.label, c.id, _outcome(results.get(c.id))] for c in chapters]))
    return code


def cmd_grade(args: argparse.Namespace) -> int:
    workspaces = [Path(w).resolve() for w in args.workspaces] or [select.workspace_root()]
    chapters = [c for c in CHAPTERS if select.is_written(c) and (args.stage is None or c.stage == args.stage)]
    targets = [str(COURSE_ROOT / c.check_file) for c in chapters]
    columns: list[dict] = []
    for ws in workspaces:
        print(f"正在检查 {ws} ……", flush=True)
        columns.append(run_checks(ws, targets, quiet=args.quiet)[1])
    rows = [[c.label, c.id, *[_outcome(col.get(c.id)) if c.id in col else "未开始" for col in columns]] for c in chapters]
    print(format_table(["章", "id", *[ws.name for ws in workspaces]], rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minisgl.course", description="手写 mini-sglang 课程工具")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="每章：是否开始、当前用哪份实现、上次检查结果").set_defaults(func=cmd_status)
    use = sub.add_parser("use", help="指定某章用参考解答（solution）、学员代码（learner）或按规则（auto）")
    use.add_argument("impl", choices=("solution", "learner", "skeleton", "auto"))
    use.add_argument("chapters", nargs="+", help="章节 id，或 all")
    use.set_defaults(func=cmd_use)
    reset = sub.add_parser("reset", help="把章节恢复为骨架（有改动时需 --force）")
    reset.add_argument("chapters", nargs="+", help="章节 id，或 all")
    reset.add_argument("--force", action="store_true", help="丢掉你在这些章节里的改动")
    reset.set_defaults(func=cmd_reset)
    check = sub.add_parser("check", help="跑这些章节的检查（学员代码）")
    check.add_argument("chapters", nargs="+", help="章节 id，或 all")
    check.set_defaults(func=cmd_check)
    grade = sub.add_parser("grade", help="给一个或多个工作区打分，打印每章通过情况")
    grade.add_argument("workspaces", nargs="*", help="学员工作区目录（含 stage1/、stage2/），默认当前仓库")
    grade.add_argument("--stage", type=int, default=None, help="只检查这一阶段")
    grade.add_argument("--quiet", action="store_true", help="不打印 pytest 的输出")
    grade.set_defaults(func=cmd_grade)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyError as err:
        print(err.args[0], file=sys.stderr)
        return 2
