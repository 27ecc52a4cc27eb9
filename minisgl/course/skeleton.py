"""由参考解答生成学员骨架。

解答文件里，学员要写的每一段都夹在一对标记之间。开始标记带这个任务的**目标和约定**（中文），紧跟的一行
``# en:`` 是英文；再往下是按需才给的两级提示（``hint1`` / ``en1``：点一下该用的想法或该避开的坑；``hint2`` /
``en2``：一步步的做法），同一个键连写几行就是几行::

    # >>> TASK extend_len: 返回这一步要为这个请求算多少个 token（设备上有、缓存里还没有的那些）
    # en: return how many tokens this step computes for the request (on the device, not yet in the cache)
    # hint1: 两个长度字段已经在请求里了
    # en1: both lengths are fields of the request already
    # hint2: device_len - cached_len
    # en2: device_len - cached_len
    return self.device_len - self.cached_len
    # <<< TASK

生成骨架时，标记之间的一切（代码和两级提示）换成两行 TODO 注释（中文、英文目标各一行）和一条
``raise TaskNotDone("<章 id>", "<任务名>")``。:class:`TaskNotDone` 是 ``NotImplementedError``，
它在抛出时按当前语言（``MINISGL_LANG``）写出消息：章节、任务名、文档页、目标，以及怎么要下一级提示。
两级提示和参考解答的位置由 ``python -m minisgl.course hint <章> <任务>`` 逐级给出（:mod:`minisgl.course.hints`）。
骨架本身与语言无关。标记外的代码原样保留。
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from minisgl.course.registry import COURSE_ROOT, Chapter, find_chapter
from minisgl.i18n import CJK, lang, tr

_BEGIN = re.compile(r"^(?P<indent>[ \t]*)# >>> TASK (?P<name>[A-Za-z_][A-Za-z0-9_.]*)\s*[:\uff1a]\s*(?P<hint>\S.*?)\s*$")
_EN = re.compile(r"^(?P<indent>[ \t]*)# en:\s*(?P<hint>\S.*?)\s*$")
_LEVEL = re.compile(r"^(?P<indent>[ \t]*)# (?P<key>hint1|en1|hint2|en2):\s?(?P<text>.*?)\s*$")
_END = re.compile(r"^[ \t]*# <<< TASK\s*$")
_ANY_MARKER = re.compile(r"#\s*(>>>|<<<)\s*TASK")

#: 骨架导入 TaskNotDone 的那一行（评分的诚信扫描允许这一个来自课程机制的导入）。
IMPORT_LINE = "from minisgl.course.skeleton import TaskNotDone\n"


class MarkerError(ValueError):
    """解答文件里的任务标记写错了（不成对、嵌套、缺名字、缺中文或英文提示）。"""


@dataclass(frozen=True)
class Task:
    name: str
    hint: str  # 中文的目标和约定（骨架里的 TODO 行）
    line: int  # 1-based line of the BEGIN marker in the solution
    hint_en: str = ""  # English goal and contract (the ``# en:`` line right after the BEGIN marker)
    levels: tuple[tuple[str, str], ...] = ()  # 按需的提示：第 1 级、第 2 级各一对 (中文, English)
    end: int = 0  # 1-based line of the END marker
    code: int = 0  # 1-based line where the task's code starts (after the goal and hint lines)

    def hint_for(self, language: str | None = None) -> str:
        """这一语言（默认当前语言）的目标和约定。"""
        return self.hint_en if (language or lang()) == "en" else self.hint

    def level_for(self, level: int, language: str | None = None) -> str:
        """第 ``level`` 级提示（1：点一下，2：一步步的做法）在这一语言里的文字；没写时是空串。"""
        if not 1 <= level <= len(self.levels):
            return ""
        zh, en = self.levels[level - 1]
        return en if (language or lang()) == "en" else zh


def docs_page(chapter: Chapter, language: str | None = None) -> str:
    """本章的文档页；英文时用 ``.en.md``（存在时）。"""
    page = chapter.docs_page
    if (language or lang()) == "en":
        english = page.removesuffix(".md") + ".en.md"
        if (COURSE_ROOT / english).is_file():
            return english
    return page


def todo_message(chapter: Chapter, task: str, hint: str, language: str | None = None) -> str:
    """骨架里 TaskNotDone（NotImplementedError）的消息；``hint`` 是该语言的目标。文档和检查都按这里的任务名对照。"""
    return tr(
        "Chapter {label} {id}: task '{task}' is not implemented yet. Docs: {docs_page}#{task} Goal: {hint} "
        "Stuck? python -m minisgl.course hint {id} {task}",
        language=language, label=chapter.label, id=chapter.id, task=task, docs_page=docs_page(chapter, language), hint=hint,
    )  # fmt: skip


def parse_tasks(source: str, origin: str = "<solution>") -> list[Task]:
    """找出所有任务区段，顺便检查标记是否成对、不嵌套、带英文提示、任务名不重复。"""
    tasks: list[Task] = []
    open_task: Task | None = None
    lines = source.splitlines()
    for lineno, line in enumerate(lines, start=1):
        begin, end = _BEGIN.match(line), _END.match(line)
        if begin:
            if open_task:
                raise MarkerError(tr("{origin}:{lineno}: task {name} is not closed yet, tasks cannot be nested",
                                     origin=origin, lineno=lineno, name=open_task.name))  # fmt: skip
            en = _EN.match(lines[lineno]) if lineno < len(lines) else None
            if en is None or en["indent"] != begin["indent"]:
                raise MarkerError(tr("{origin}:{lineno}: task {name} needs its English hint on the next line, "
                                     "with the same indent: '# en: hint'", origin=origin, lineno=lineno + 1,
                                     name=begin["name"]))  # fmt: skip
            if CJK.search(en["hint"]):
                raise MarkerError(tr("{origin}:{lineno}: the English hint of task {name} contains Chinese: {hint!r}",
                                     origin=origin, lineno=lineno + 1, name=begin["name"], hint=en["hint"]))  # fmt: skip
            levels, used = _levels(lines, lineno + 1, begin["indent"])
            open_task = Task(begin["name"], begin["hint"], lineno, en["hint"], levels, code=lineno + 2 + used)
        elif end:
            if not open_task:
                raise MarkerError(tr("{origin}:{lineno}: stray end marker '# <<< TASK'", origin=origin, lineno=lineno))
            tasks.append(replace(open_task, end=lineno))
            open_task = None
        elif _ANY_MARKER.search(line):
            raise MarkerError(tr("{origin}:{lineno}: unreadable task marker, expected '# >>> TASK name: hint' or "
                                 "'# <<< TASK'", origin=origin, lineno=lineno))  # fmt: skip
    if open_task:
        raise MarkerError(tr("{origin}:{line}: task {name} has no end marker '# <<< TASK'",
                             origin=origin, line=open_task.line, name=open_task.name))  # fmt: skip
    names = [t.name for t in tasks]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise MarkerError(tr("{origin}: duplicate task names: {names}", origin=origin, names=", ".join(dupes)))
    return tasks


def _levels(lines: list[str], start: int, indent: str) -> tuple[tuple[tuple[str, str], ...], int]:
    """``# en:`` 之后连着的 ``hint1`` / ``en1`` / ``hint2`` / ``en2`` 行（``start`` 是 0-based 的下一行）：同一个键连写
    几行就接成几行。返回两级提示和读了几行；两级都写全了才算有（缺一半的由检查报出来，不在这里猜）。"""
    text: dict[str, list[str]] = {}
    used = 0
    for line in lines[start:]:
        m = _LEVEL.match(line)
        if m is None or m["indent"] != indent:
            break
        text.setdefault(m["key"], []).append(m["text"])
        used += 1
    got = {key: "\n".join(parts) for key, parts in text.items()}
    if not all(got.get(key) for key in ("hint1", "en1", "hint2", "en2")):
        return (), used
    return ((got["hint1"], got["en1"]), (got["hint2"], got["en2"])), used


def _import_position(lines: list[str]) -> int:
    """TaskNotDone 的导入插在哪一行之前：``from __future__`` 之后；没有它就在模块文档字符串之后。"""
    for i, line in enumerate(lines):
        if line.startswith("from __future__ import"):
            return i + 1
    tree = ast.parse("".join(lines))
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.end_lineno or 0
    return 0


def make_skeleton(source: str, chapter: Chapter) -> str:
    """把每个任务区段换成两行 TODO 注释（中文、英文）加 ``raise TaskNotDone(章, 任务)``；骨架与当前语言无关。"""
    tasks = {t.line: t for t in parse_tasks(source, chapter.relpath)}  # validate first: a broken marker never yields a skeleton
    lines = source.splitlines(keepends=True)
    out: list[str] = []
    skipping = False
    for lineno, line in enumerate(lines, start=1):
        if lineno in tasks:
            task, indent = tasks[lineno], _BEGIN.match(line)["indent"]
            for language, hint in (("zh", task.hint), ("en", task.hint_en)):
                out.append(f"{indent}# {tr('TODO task {name}: {hint}', language=language, name=task.name, hint=hint)}\n")
            out.append(f'{indent}raise TaskNotDone("{chapter.id}", "{task.name}")\n')
            skipping = True
        elif skipping and _END.match(line):
            skipping = False
        elif not skipping:
            out.append(line)
    if tasks:
        out.insert(_import_position(out), "\n" + IMPORT_LINE)
    header = [
        "# " + tr("This file is generated from the reference solution by tools/make_skeletons.py. "
                  "Write your implementation at each TODO.", language=language) + "\n"
        for language in ("zh", "en")
    ] + [
        "# " + tr("Each TODO states the goal; stuck? `python -m minisgl.course hint {id} <task>` gives the next hint.",
                  language=language, id=chapter.id) + "\n"
        for language in ("zh", "en")
    ]  # fmt: skip
    return "".join(header + out)


@lru_cache(maxsize=64)
def _solution_tasks(path: str, mtime_ns: int) -> dict[str, Task]:
    return {t.name: t for t in parse_tasks(Path(path).read_text(encoding="utf-8"), path)}


def task_info(chapter_id: str, task: str) -> tuple[Chapter | None, Task | None]:
    """按章 id 和任务名查章节和任务（提示取自随课程发布的解答的标记）；查不到的部分是 None。"""
    ch = find_chapter(chapter_id)
    if ch is None:
        return None, None
    path = COURSE_ROOT / "solutions" / ch.relpath
    try:
        return ch, _solution_tasks(str(path), path.stat().st_mtime_ns).get(task)
    except (OSError, UnicodeDecodeError, MarkerError):
        return ch, None


class TaskNotDone(NotImplementedError):
    """骨架里还没写的任务：``raise TaskNotDone("core", "extend_len")``。

    消息在构造时按当前语言写出（:func:`todo_message`），提示从本章解答的任务标记里查。
    它是 ``NotImplementedError``，所以 ``except NotImplementedError`` 和“骨架上按预期失败”的判断照常成立。
    """

    def __init__(self, chapter_id: str, task: str) -> None:
        self.chapter_id, self.task = chapter_id, task
        super().__init__(self._message(chapter_id, task))

    @staticmethod
    def _message(chapter_id: str, task: str) -> str:
        try:
            ch, info = task_info(chapter_id, task)
            if ch is None:
                return tr("Task '{task}' of chapter {id} is not implemented yet.", task=task, id=chapter_id)
            hint = "" if info is None else info.hint_for()
            return todo_message(ch, task, hint)
        except Exception:  # noqa: BLE001 - a broken message must never hide the real "not done yet"
            return f"{chapter_id}: {task} (TaskNotDone)"

    def __reduce__(self):  # noqa: ANN204 - keeps the exception picklable (worker threads, multiprocessing)
        return type(self), (self.chapter_id, self.task)
