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
from minisgl.course.pytest_plugin import IMPL_NAMES, summary
from minisgl.course.registry import CHAPTERS, COURSE_ROOT, STAGES, Chapter, get_chapter


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """按显示宽度对齐（一个汉字占两格）。"""
    widths = [max(_width(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, ["-" * w for w in widths], *rows]:
        lines.append("  ".join(cell + " " * (w - _width(cell)) for cell, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def _results_file(workspace: Path) -> Path:
    return workspace / ".minisgl" / "results.json"


def _results(workspace: Path) -> dict:
    path = _results_file(workspace)
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}


def _outcome(entry: dict | None, ch: Chapter | None = None, workspace: Path | None = None) -> str:
    """一章的结果：``通过 x/y``，加上备注（参考解答、导入失败、拒绝评分）；
    给了 ch 和 workspace 时，学员文件在那次检查之后改过，就标为过期。"""
    if not entry:
        return "—"
    text = summary(entry, entry)
    if ch is not None and workspace is not None and text != "—":
        learner_result = entry.get("impl", "learner") == "learner" or text == "未开始"
        if learner_result and entry.get("sha256") != select.learner_hash(ch, workspace):
            text = text[:-1] + "，过期）" if text.endswith("）") else text + "（过期）"
    return text


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
        outcome = _outcome(results.get(ch.id), ch, workspace)
        rows.append([ch.label, ch.id, ch.title, started, f"{IMPL_NAMES[choice.impl]}（{choice.reason}）", outcome])
    return rows


def cmd_status(args: argparse.Namespace) -> int:
    print(f"工作区：{select.workspace_root()}")
    rows = status_rows()
    print(format_table(["章", "id", "标题", "已开始", "当前实现", "上次检查"], rows))
    if any("过期" in r[-1] for r in rows):
        print("「过期」：这一章的文件在上次检查之后改过，运行 python -m minisgl.course check <章> 重新检查。")
    return 0


def _chapters(names: list[str]) -> list[Chapter]:
    return list(CHAPTERS) if names == ["all"] else [get_chapter(n) for n in names]


def cmd_use(args: argparse.Namespace) -> int:
    try:
        saved = select.saved_selection()
    except select.ImplSpecError as err:  # a broken selection file is rewritten from scratch
        print(f"注意：{str(err).split('；')[0]}，这次重新写一份。")
        saved = {}
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
        _forget_result(ws, ch)
        print(f"第 {ch.label} 章 {ch.id}：已恢复为骨架，上次检查结果已清除。")
    return code


def _save_results(workspace: Path, results: dict) -> None:
    path = _results_file(workspace)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def _forget_result(workspace: Path, ch: Chapter) -> None:
    results = _results(workspace)
    if results.pop(ch.id, None) is not None:
        _save_results(workspace, results)


def run_checks(workspace: Path, targets: list[str], quiet: bool = False, grading: bool = False) -> tuple[int, dict]:
    """在子进程里对一个工作区跑检查，返回退出码和每章结果。

    ``grading=True``：只认学员代码（不管 ``MINISGL_IMPL`` 和保存的选择），拒绝引用参考解答的学员文件。
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        env = {**os.environ, select.ENV_WORKSPACE: str(workspace)}
        env.pop(select.ENV_IMPL, None)
        env.pop(select.ENV_GRADING, None)
        if grading:
            env[select.ENV_GRADING] = "1"
        cmd = [sys.executable, "-m", "pytest", *targets, "--impl", "learner", "--results-json", str(out), "-q"]
        code = subprocess.call(cmd, cwd=COURSE_ROOT, env=env, stdout=subprocess.DEVNULL if quiet else None)
        return code, json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {}


def cmd_check(args: argparse.Namespace) -> int:
    chapters = _chapters(args.chapters)
    workspace = select.workspace_root()
    code, results = run_checks(workspace, [str(COURSE_ROOT / ch.check_file) for ch in chapters])
    if results:  # status shows the latest check
        _save_results(workspace, {**_results(workspace), **results})
    print(format_table(["章", "id", "结果"], [[c.label, c.id, _outcome(results.get(c.id))] for c in chapters]))
    return code


def workspace_problem(path: Path) -> str | None:
    """不是学员工作区（不存在，或没有 stage1/、stage2/ 这样的目录）→ 一句说明；是 → None。"""
    if not path.exists():
        return f"不是学员工作区：{path}（目录不存在）"
    stages = [f"stage{s}/" for s in STAGES]
    if not path.is_dir() or not any((path / s).is_dir() for s in stages):
        return f"不是学员工作区：{path}（里面没有 {' 或 '.join(stages)}）"
    return None


def cmd_grade(args: argparse.Namespace) -> int:
    workspaces = [Path(w).resolve() for w in args.workspaces] or [select.workspace_root()]
    problems = [p for p in map(workspace_problem, workspaces) if p]
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        return 2
    chapters = [c for c in CHAPTERS if select.is_written(c) and (args.stage is None or c.stage == args.stage)]
    targets = [str(COURSE_ROOT / c.check_file) for c in chapters]
    columns: list[dict] = []
    code = 0
    for ws in workspaces:
        print(f"正在检查 {ws} ……", flush=True)
        rc, results = run_checks(ws, targets, quiet=args.quiet, grading=True)
        if rc not in (0, 1) or not results:
            print(f"{ws}：检查没有正常结束（pytest 退出码 {rc}），这一列的结果不完整。", file=sys.stderr)
            code = 1
        columns.append(results)
    rows = [[c.label, c.id, *[_outcome(col.get(c.id)) if c.id in col else "没有结果" for col in columns]] for c in chapters]
    print(format_table(["章", "id", *[ws.name for ws in workspaces]], rows))
    notes = [
        (ws, col[c.id].get("refused") or col[c.id].get("error"))
        for ws, col in zip(workspaces, columns)
        for c in chapters
        if c.id in col and (col[c.id].get("refused") or col[c.id].get("error"))
    ]
    if notes:
        print("\n没有按学员代码计分的章节：")
        for ws, message in notes:
            print(f"  {ws.name}：" + message.replace("\n", "\n    "))
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minisgl.course", description="手写 mini-sglang 课程工具")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="每章：是否开始、当前用哪份实现、上次检查结果").set_defaults(func=cmd_status)
    use = sub.add_parser("use", help="指定某章用参考解答（solution）、学员代码（learner）或按规则（auto）")
    use.add_argument("impl", choices=("solution", "learner", "skeleton", "auto"))
    use.add_argument("chapters", nargs="+", help="章节 id 或编号（如 2.2），或 all")
    use.set_defaults(func=cmd_use)
    reset = sub.add_parser("reset", help="把章节恢复为骨架并清除它的检查结果（有改动时需 --force）")
    reset.add_argument("chapters", nargs="+", help="章节 id 或编号（如 2.2），或 all")
    reset.add_argument("--force", action="store_true", help="丢掉你在这些章节里的改动")
    reset.set_defaults(func=cmd_reset)
    check = sub.add_parser("check", help="跑这些章节的检查（学员代码）")
    check.add_argument("chapters", nargs="+", help="章节 id 或编号（如 2.2），或 all")
    check.set_defaults(func=cmd_check)
    grade = sub.add_parser("grade", help="给一个或多个工作区打分（只认学员代码），打印每章通过情况")
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
    except select.ImplSpecError as err:
        print(err, file=sys.stderr)
        return 2
