"""本章的任务清单，以及在笔记本里对学员自己的代码跑本章（或里程碑）的检查。"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

from minisgl.i18n import tr
from minisgl.paths import REPO_ROOT

__all__ = ["show_tasks", "run_chapter_checks", "run_milestone_checks"]


def _chapter(chapter_id: str):
    from minisgl.course.registry import get_chapter

    return get_chapter(chapter_id)


def show_tasks(chapter_id: str) -> None:
    """列出本章要写的任务和各自的目标（与骨架里的 TODO 一一对应），说明笔记本现在用的是哪份实现、卡住了怎么要提示。

    提示不在笔记本里：在终端里要一级才看一级，要过的都记下来（``course hint``），笔记本不替学员提前展开。

    en: Lists the chapter's tasks and their goals (one per TODO of the skeleton), which implementation the notebook uses,
    and how to ask for a hint. The hints are not in the notebook: in the terminal a learner sees one level when asking
    for it, and what was asked is counted (``course hint``); the notebook does not open them ahead.
    """
    from minisgl.course import select
    from minisgl.course.hints import enclosing
    from minisgl.course.skeleton import parse_tasks

    ch = _chapter(chapter_id)
    if not select.is_written(ch):
        print(tr("The reference solution of chapter {label} {id} is not written yet.", label=ch.label, id=ch.id))
        return
    source = select.shipped_solution(ch).read_text(encoding="utf-8")
    tasks, tree = parse_tasks(source, ch.relpath), ast.parse(source)
    print(tr("Chapter {label} “{title}”: complete {n_tasks} tasks in {relpath}",
             label=ch.label, title=ch.display_title, n_tasks=len(tasks), relpath=ch.relpath))
    for i, t in enumerate(tasks, 1):
        print(f"  {i:>2}. " + tr("{name} ({where}): {hint}", name=t.name, where=enclosing(tree, t.line), hint=t.hint_for()))
    choice = select.choose(ch)
    impl = select.IMPL_NAMES[choice.impl]
    print(tr("In this notebook {module} is: {impl} ({reason})", module=ch.public_module, impl=impl, reason=choice.reason))
    print(tr("Stuck? In a terminal: python -m minisgl.course hint {id} <task> gives the next hint (it remembers the level).",
             id=ch.id))


def _run(cmd: list[str], tail: int) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "MINISGL_IMPL"}
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    out = (proc.stdout + proc.stderr).rstrip().splitlines()
    if len(out) > tail:
        out = [tr("... (earlier lines omitted)"), *out[-tail:]]
    return proc.returncode, "\n".join(out)


def run_chapter_checks(chapter_id: str, tail: int = 40) -> bool:
    """对你自己的代码跑本章的检查（``python -m minisgl.course check <章>``），打印结果并总结。"""
    ch = _chapter(chapter_id)
    print(f"$ python -m minisgl.course check {ch.id}")
    code, text = _run([sys.executable, "-m", "minisgl.course", "check", ch.id], tail)
    print(text)
    print()
    from minisgl.course import select
    from minisgl.course.skeleton import docs_page

    if not select.is_started(ch):
        print(tr("This chapter has not been started: {relpath} is still the skeleton. Write the first task, then run this cell again.", relpath=ch.relpath))
        return False
    if code == 0:
        print(tr("Chapter {label} {id}: all checks pass ✔", label=ch.label, id=ch.id))
        return True
    page = docs_page(ch)
    print(tr("Chapter {label} {id}: some checks still fail ✘ — read the failures above, against {docs_page}.", label=ch.label, id=ch.id, docs_page=page))
    return False


def run_milestone_checks(stage: int, tail: int = 40) -> bool:
    """对当前工作区跑第 ``stage`` 阶段的里程碑检查。"""
    path = f"checks/stage{stage}/test_milestone.py"
    print(f"$ python -m pytest {path} -q")
    code, text = _run([sys.executable, "-m", "pytest", path, "--impl", "learner", "-q"], tail)
    print(text)
    print()
    if code == 0:
        print(tr("Stage {stage} milestone: all checks pass ✔", stage=stage))
    else:
        print(tr("Stage {stage} milestone: some checks still fail ✘", stage=stage))
    return code == 0
