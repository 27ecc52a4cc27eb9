"""``python -m minisgl.course``：看进度、换实现、重置章节、选语言、跑检查、给全班打分。"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

from minisgl.course import hints, language, select
from minisgl.course.pytest_plugin import IMPL_NAMES, Outcome, outcome
from minisgl.course.registry import CHAPTERS, COURSE_ROOT, STAGES, Chapter, get_chapter
from minisgl.course.skeleton import parse_tasks
from minisgl.i18n import saved_language, tr


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


def _outcome(entry: dict | None, ch: Chapter | None = None, workspace: Path | None = None) -> Outcome:
    """一章的结果：``通过 x/y``，加上备注（参考解答、导入失败、拒绝评分）；
    给了 ch 和 workspace 时，学员文件在那次检查之后改过，就标为过期。显示用 ``.text()``。"""
    if not entry:
        return Outcome("none")
    result = outcome(entry, entry)
    if ch is not None and workspace is not None and result.kind != "none":
        learner_result = entry.get("impl", "learner") == "learner" or result.kind == "not_started"
        if learner_result and entry.get("sha256") != select.learner_hash(ch, workspace):
            result = result.with_note("stale")
    return result


def _status(workspace: Path) -> list[tuple[list[str], Outcome]]:
    results = _results(workspace)
    rows = []
    for ch in CHAPTERS:
        if not select.is_written(ch):
            rows.append(([ch.label, ch.id, ch.display_title, "—", tr("not written"), "—"], Outcome("none")))
            continue
        choice = select.choose(ch)
        started = tr("yes") if select.is_started(ch, workspace) else tr("no")
        result = _outcome(results.get(ch.id), ch, workspace)
        impl = tr("{impl} ({reason})", impl=IMPL_NAMES[choice.impl], reason=choice.reason)
        rows.append(([ch.label, ch.id, ch.display_title, started, impl, str(hints.chapter_total(workspace, ch.id))], result))
    return rows


def status_rows() -> list[list[str]]:
    """status 表的行（按当前语言）：章、id、标题、已开始、当前实现、用了几级提示、上次检查。"""
    return [cells + [result.text()] for cells, result in _status(select.workspace_root())]


def cmd_status(args: argparse.Namespace) -> int:
    workspace = select.workspace_root()
    print(tr("Workspace: {path}", path=workspace))
    rows = _status(workspace)
    header = [tr("chapter"), "id", tr("title"), tr("started"), tr("implementation now"), tr("hints"), tr("last check")]
    print(format_table(header, [cells + [result.text()] for cells, result in rows]))
    if any(result.stale for _, result in rows):
        print(tr("\"{stale}\": the chapter's file changed after its last check; run python -m minisgl.course check "
                 "<chapter> to check it again.", stale=tr("stale")))  # fmt: skip
    return 0


def cmd_hint(args: argparse.Namespace) -> int:
    """下一级提示（或 ``--level`` 指定的那一级），并记下来；不给任务名时列出本章的任务和各自要到了第几级。"""
    ch, workspace = get_chapter(args.chapter), select.workspace_root()
    if not select.is_written(ch):
        print(tr("The reference solution of chapter {label} {id} is not written yet.", label=ch.label, id=ch.id))
        return 2
    source = select.shipped_solution(ch).read_text(encoding="utf-8")
    tasks, tree = {t.name: t for t in parse_tasks(source, ch.relpath)}, ast.parse(source)
    got = hints.used(workspace).get(ch.id, {})
    if args.task is None:
        rows = [[t.name, hints.enclosing(tree, t.line), str(got.get(t.name, 0))] for t in tasks.values()]
        print(format_table([tr("task"), tr("where"), tr("hints used")], rows))
        print(tr("Next hint for a task: python -m minisgl.course hint {id} <task>", id=ch.id))
        return 0
    if args.task not in tasks:
        print(tr("Chapter {label} {id} has no task {task!r}; its tasks: {tasks}", label=ch.label, id=ch.id,
                 task=args.task, tasks=", ".join(tasks)), file=sys.stderr)  # fmt: skip
        return 2
    task = tasks[args.task]
    level = args.level or min(got.get(task.name, 0) + 1, hints.LEVELS)
    hints.record(workspace, ch.id, task.name, level)
    print(tr("Chapter {label} {id}, task {task} — {level}:", label=ch.label, id=ch.id, task=task.name,
             level=hints.level_name(level)))  # fmt: skip
    print(tr("Goal: {goal}", goal=task.hint_for()))
    print(hints.level_text(ch, task, level, hints.enclosing(tree, task.line)))
    if level < hints.LEVELS:
        print(tr("(still stuck? run the same command again for {next})", next=hints.level_name(level + 1)))
    return 0


def _chapters(names: list[str]) -> list[Chapter]:
    return list(CHAPTERS) if names == ["all"] else [get_chapter(n) for n in names]


def cmd_use(args: argparse.Namespace) -> int:
    try:
        saved = select.saved_selection()
    except select.ImplSpecError as err:  # a broken selection file is rewritten from scratch
        print(tr("Note: {problem}, writing a fresh one.", problem=err.brief))
        saved = {}
    for ch in _chapters(args.chapters):
        saved[ch.id] = args.impl
        impl = tr("chosen by the rules") if args.impl == "auto" else IMPL_NAMES[args.impl]
        print(tr("Chapter {label} {id} → {impl}", label=ch.label, id=ch.id, impl=impl))
    select.save_selection(saved)
    if os.environ.get(select.ENV_IMPL):
        print(tr("Note: the environment variable {env}={value} takes precedence over this choice.",
                 env=select.ENV_IMPL, value=os.environ[select.ENV_IMPL]))  # fmt: skip
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    ws = select.workspace_root()
    code = 0
    for ch in _chapters(args.chapters):
        if not select.is_written(ch):
            continue
        if select.is_started(ch, ws) and not args.force:
            print(tr("Chapter {label} {id}: {relpath} has your changes, not reset. To throw them away, add --force.",
                     label=ch.label, id=ch.id, relpath=ch.relpath))  # fmt: skip
            code = 1
            continue
        (ws / ch.relpath).write_text(select.skeleton_in(ch, saved_language(ws)), encoding="utf-8")
        _forget_result(ws, ch)
        print(tr("Chapter {label} {id}: restored to the skeleton, its last check result cleared.", label=ch.label, id=ch.id))
    return code


def _language_name(language: str) -> str:
    return tr("Chinese") if language == "zh" else tr("English")


def cmd_lang(args: argparse.Namespace) -> int:
    ws = select.workspace_root()
    if args.language is None:
        current = saved_language(ws)
        if current is None:
            print(tr("Your files show both languages (none chosen). Choose one: python -m minisgl.course lang zh | en"))
        else:
            print(tr("You learn in {name}: your files, check messages and hints use it. Both again: "
                     "python -m minisgl.course lang both", name=_language_name(current)))  # fmt: skip
        return 0
    chosen = None if args.language == "both" else args.language
    for relpath in language.choose(chosen, ws):
        print(tr("Rewrote {relpath}: comments and docstrings in the new language, your code as it was.", relpath=relpath))
    if chosen is None:
        print(tr("Your files show both languages again."))
    else:
        print(tr("From now on you learn in {name}: your files, check messages, hints and the course commands use it "
                 "(MINISGL_LANG still overrides it for one command).", name=_language_name(chosen)))  # fmt: skip
    if os.environ.get("MINISGL_LANG"):
        print(tr("Note: MINISGL_LANG={value} is set in this shell and takes precedence over the choice.",
                 value=os.environ["MINISGL_LANG"]))  # fmt: skip
    return 0


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
    rows = [[c.label, c.id, _outcome(results.get(c.id)).text()] for c in chapters]
    print(format_table([tr("chapter"), "id", tr("result")], rows))
    return code


def workspace_problem(path: Path) -> str | None:
    """不是学员工作区（不存在，或没有 stage1/、stage2/ 这样的目录）→ 一句说明；是 → None。"""
    if not path.exists():
        return tr("Not a learner workspace: {path} (no such directory)", path=path)
    stages = [f"stage{s}/" for s in STAGES]
    if not path.is_dir() or not any((path / s).is_dir() for s in stages):
        return tr("Not a learner workspace: {path} (it has no {dirs})", path=path, dirs=tr(" or ").join(stages))
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
        print(tr("Checking {path} ...", path=ws), flush=True)
        rc, results = run_checks(ws, targets, quiet=args.quiet, grading=True)
        if rc not in (0, 1) or not results:
            print(tr("{path}: the checks did not finish normally (pytest exit code {rc}), this column is incomplete.",
                     path=ws, rc=rc), file=sys.stderr)  # fmt: skip
            code = 1
        columns.append(results)
    rows = [[c.label, c.id, *[cell for ws, col in zip(workspaces, columns)
                              for cell in (_outcome(col.get(c.id)).text() if c.id in col else tr("no result"),
                                           str(hints.chapter_total(ws, c.id)))]]
            for c in chapters]  # fmt: skip
    header = [tr("chapter"), "id", *[cell for ws in workspaces for cell in (ws.name, tr("hints"))]]
    print(format_table(header, rows))
    notes = [
        (ws, col[c.id].get("refused") or col[c.id].get("error"))
        for ws, col in zip(workspaces, columns)
        for c in chapters
        if c.id in col and (col[c.id].get("refused") or col[c.id].get("error"))
    ]
    if notes:
        print("\n" + tr("Chapters not scored on the learner's code:"))
        for ws, message in notes:
            print("  " + tr("{name}: {message}", name=ws.name, message=message.replace("\n", "\n    ")))
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minisgl.course", description=tr("mini-sglang by hand: course tool"))
    sub = parser.add_subparsers(dest="command", required=True)
    chapters_help = tr("chapter ids or numbers (e.g. 2.2), or all")
    status = sub.add_parser("status", help=tr("per chapter: started or not, which implementation is in use, last check result"))
    status.set_defaults(func=cmd_status)
    use = sub.add_parser("use", help=tr("use the reference solution (solution), the learner code (learner) or the rules (auto) "
                                        "for some chapters"))  # fmt: skip
    use.add_argument("impl", choices=("solution", "learner", "skeleton", "auto"))
    use.add_argument("chapters", nargs="+", help=chapters_help)
    use.set_defaults(func=cmd_use)
    reset = sub.add_parser("reset", help=tr("restore chapters to the skeleton and clear their check results "
                                            "(needs --force if you changed them)"))  # fmt: skip
    reset.add_argument("chapters", nargs="+", help=chapters_help)
    reset.add_argument("--force", action="store_true", help=tr("throw away your changes in these chapters"))
    reset.set_defaults(func=cmd_reset)
    hint = sub.add_parser("hint", help=tr("the next hint for a task: 1 a nudge, 2 the walkthrough, 3 where the reference is"))
    hint.add_argument("chapter", help=tr("chapter id or number (e.g. 3.3)"))
    hint.add_argument("task", nargs="?", help=tr("task name (without it: list the chapter's tasks and the hints used)"))
    hint.add_argument("--level", type=int, choices=range(1, hints.LEVELS + 1), help=tr("show this level"))
    hint.set_defaults(func=cmd_hint)
    lang = sub.add_parser("lang", help=tr("the one language you learn in (zh or en; both: as shipped); your code is kept"))
    lang.add_argument("language", nargs="?", choices=("zh", "en", "both"))
    lang.set_defaults(func=cmd_lang)
    check = sub.add_parser("check", help=tr("run these chapters' checks (on the learner code)"))
    check.add_argument("chapters", nargs="+", help=chapters_help)
    check.set_defaults(func=cmd_check)
    grade = sub.add_parser("grade", help=tr("grade one or more workspaces (learner code only) and print each chapter's result"))
    grade.add_argument("workspaces", nargs="*",
                       help=tr("learner workspace directories (with stage1/, stage2/); default: this repository"))
    grade.add_argument("--stage", type=int, default=None, help=tr("check only this stage"))
    grade.add_argument("--quiet", action="store_true", help=tr("do not print pytest's output"))
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
