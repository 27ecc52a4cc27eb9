"""由参考解答生成学员骨架。

解答文件里，学员要写的每一段都夹在一对标记之间::

    # >>> TASK extend_len: 本轮要算的 token 数 = device_len - cached_len
    return self.device_len - self.cached_len
    # <<< TASK

生成骨架时，标记之间的代码换成一条 ``raise NotImplementedError(...)``，
消息里写明章节、任务名、文档页和提示。标记外的代码原样保留。
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from minisgl.course.registry import Chapter

_BEGIN = re.compile(r"^(?P<indent>[ \t]*)# >>> TASK (?P<name>[A-Za-z_][A-Za-z0-9_.]*)\s*[:：]\s*(?P<hint>\S.*?)\s*$")
_END = re.compile(r"^[ \t]*# <<< TASK\s*$")
_ANY_MARKER = re.compile(r"#\s*(>>>|<<<)\s*TASK")

HEADER = "# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。\n"


class MarkerError(ValueError):
    """解答文件里的任务标记写错了（不成对、嵌套、缺名字或提示）。"""


@dataclass(frozen=True)
class Task:
    name: str
    hint: str
    line: int  # 1-based line of the BEGIN marker in the solution


def todo_message(chapter: Chapter, task: str, hint: str) -> str:
    """骨架里 NotImplementedError 的消息；文档和检查都按这里的任务名对照。"""
    return (
        f"第 {chapter.label} 章 {chapter.id} 的任务「{task}」还没有实现。"
        f"文档：{chapter.docs_page}#{task} 提示：{hint}"
    )


def parse_tasks(source: str, origin: str = "<solution>") -> list[Task]:
    """找出所有任务区段，顺便检查标记是否成对、不嵌套、任务名不重复。"""
    tasks: list[Task] = []
    open_task: Task | None = None
    for lineno, line in enumerate(source.splitlines(), start=1):
        begin, end = _BEGIN.match(line), _END.match(line)
        if begin:
            if open_task:
                raise MarkerError(f"{origin}:{lineno}: 任务 {open_task.name} 还没结束，不能嵌套新的任务")
            open_task = Task(begin["name"], begin["hint"], lineno)
        elif end:
            if not open_task:
                raise MarkerError(f"{origin}:{lineno}: 多余的结束标记 '# <<< TASK'")
            tasks.append(open_task)
            open_task = None
        elif _ANY_MARKER.search(line):
            raise MarkerError(f"{origin}:{lineno}: 看不懂的任务标记，应为 '# >>> TASK 名字: 提示' 或 '# <<< TASK'")
    if open_task:
        raise MarkerError(f"{origin}:{open_task.line}: 任务 {open_task.name} 缺少结束标记 '# <<< TASK'")
    names = [t.name for t in tasks]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise MarkerError(f"{origin}: 任务名重复：{', '.join(dupes)}")
    return tasks


def make_skeleton(source: str, chapter: Chapter) -> str:
    """把每个任务区段换成 TODO 注释加 ``raise NotImplementedError``。"""
    parse_tasks(source, chapter.relpath)  # validate first: a broken marker must never yield a skeleton
    out: list[str] = [HEADER]
    skipping = False
    for line in source.splitlines(keepends=True):
        begin = _BEGIN.match(line)
        if begin:
            indent, name, hint = begin["indent"], begin["name"], begin["hint"]
            out.append(f"{indent}# TODO 任务 {name}：{hint}\n")
            out.append(f"{indent}raise NotImplementedError({todo_message(chapter, name, hint)!r})\n")
            skipping = True
        elif skipping and _END.match(line):
            skipping = False
        elif not skipping:
            out.append(line)
    return "".join(out)
