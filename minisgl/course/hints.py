"""按需的提示：骨架里只写目标和约定，卡住了再一级一级地要。

- 第 1 级：点一下——该用哪个想法、该避开哪个坑；
- 第 2 级：一步步的做法；
- 第 3 级：参考解答在哪儿（文件、行、函数），以及怎么先换成参考解答往下走。

每个工作区记下每个任务要到了第几级（``.minisgl/hints.json``），``status`` 和教师的 ``grade`` 都显示一章用了几级提示。

另有一把尺子量骨架里的目标会不会把解答说穿了（:func:`restated`）：解答里出现的标识符，目标里点到了几成。
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import keyword
import re
import tokenize
from pathlib import Path

from minisgl.course.registry import Chapter
from minisgl.course.skeleton import Task
from minisgl.i18n import tr

LEVELS = 3  # 第 3 级是参考解答的位置
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: 不算“说穿”的名字：关键字、内置函数和类型、self / cls，以及单个字母（与英文里的 a、x 分不开）。
COMMON = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | {"self", "cls"}


def solution_names(source: str, task: Task) -> set[str]:
    """参考解答里这个任务那几行代码用到的标识符（不含注释、字符串和 :data:`COMMON`）。"""
    lines = source.splitlines(keepends=True)[task.code - 1 : task.end - 1]
    names: set[str] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
            if tok.type == tokenize.NAME:
                names.add(tok.string)
    except (tokenize.TokenError, IndentationError):  # 一段代码单独拿出来可能缩进不齐：退回逐行找
        code = "".join(line.split("#", 1)[0] for line in lines)
        names = set(IDENT.findall(code))
    return {n for n in names if n not in COMMON and len(n) > 1}


def restated(source: str, task: Task) -> float:
    """骨架里的目标（中文、英文两行）点到了解答里几成的标识符：0 是一个也没说，1 是全说了。

    目标可以说要返回什么、要改哪些字段、可以用哪些现成的部件——这些名字学员在文件里本来就看得到；说穿解答的是
    把每一步用到的名字按顺序列出来。所以量的是比例，界线放在检查里（``checks/course/test_hints.py``）。
    解答一个名字也没有时是 0。
    """
    names = solution_names(source, task)
    if not names:
        return 0.0
    said = set(IDENT.findall(task.hint)) | set(IDENT.findall(task.hint_en))
    return len(names & said) / len(names)


# ---------------------------------------------------------------- 每个工作区记下的级别


def _state_file(workspace: Path) -> Path:
    return workspace / ".minisgl" / "hints.json"


def used(workspace: Path) -> dict[str, dict[str, int]]:
    """这个工作区每章每个任务要到了第几级：``{章 id: {任务: 级}}``（文件坏了当作没有）。"""
    try:
        data = json.loads(_state_file(workspace).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {ch: {t: lv for t, lv in tasks.items() if isinstance(lv, int)} for ch, tasks in data.items() if isinstance(tasks, dict)}


def chapter_total(workspace: Path, chapter_id: str) -> int:
    """一章一共要了几级提示（每个任务要到第几级就算几）。"""
    return sum(used(workspace).get(chapter_id, {}).values())


def record(workspace: Path, chapter_id: str, task: str, level: int) -> None:
    data = used(workspace)
    tasks = data.setdefault(chapter_id, {})
    tasks[task] = max(level, tasks.get(task, 0))
    path = _state_file(workspace)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def enclosing(tree: ast.Module, line: int) -> str:
    """第 ``line`` 行所在的最内层函数（或类），写成 ``类.方法`` 或 ``函数``；不在任何定义里时是空串。
    任务总在函数里，所以它就是任务所在的函数（``tree`` 由调用者解析一次，列出一章的任务时不必每个都重新解析）。"""
    names: list[str] = []
    scope: list[ast.stmt] = tree.body
    while inner := next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                         and n.lineno <= line <= (n.end_lineno or n.lineno)), None):
        names.append(inner.name)
        scope = inner.body
    return ".".join(names)


def level_text(ch: Chapter, task: Task, level: int, symbol: str) -> str:
    """第 ``level`` 级提示的文字（当前语言）。"""
    if level < LEVELS:
        return task.level_for(level)
    return tr("The reference solution of this task: solutions/{path}, lines {start}–{end} ({symbol}). Compare it with "
              "yours once yours runs; to go on with it instead, `python -m minisgl.course use solution {id}`.",
              path=ch.relpath, start=task.code, end=task.end - 1, symbol=symbol, id=ch.id)  # fmt: skip


def level_name(level: int) -> str:
    return {1: tr("hint 1 (a nudge)"), 2: tr("hint 2 (the walkthrough)"), 3: tr("hint 3 (the reference)")}[level]
