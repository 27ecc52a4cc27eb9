"""学员写一个任务之前，书里能读到它多少答案：一把尺子，界线放在检查里（``checks/docs/test_book.py``）。

- 一个任务的**答案行**：参考解答里任务区段的代码行，去掉注释；在学员手里已有的代码里（各章骨架、``minisgl/`` 的给定
  模块）出现过的不算，不足三个名字或数字的（``return out``）也不算——它们说明不了什么；
- 一行答案**被看到**：它（空白归一以后）出现在学员做这一章之前或之时读的页面上——前面各章和本章的页面、各阶段的
  开篇、阶段之外的页面（老师页除外）——而且不在学员自己选择展开的提示块里。

en: How much of a task's answer the book lets a learner read before writing it: a ruler; the bound lives in the check
(``checks/docs/test_book.py``).

- A task's **answer lines**: the code lines of the task's region in the reference solution, comments left out; lines
  that occur in code the learner already has (every chapter's skeleton, the given modules under ``minisgl/``) do not
  count, and neither do lines with fewer than three names or numbers (``return out``): they tell nothing;
- an answer line is **shown** when it (whitespace normalised) occurs on a page the learner reads before or while doing
  the chapter (the pages of earlier chapters and of this one, each stage's opening page, the pages outside the stages
  but the teacher's), outside the hint blocks the learner chooses to open.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Iterable

from minisgl.course.registry import CHAPTERS, Chapter
from minisgl.course.skeleton import make_skeleton, parse_tasks
from minisgl.paths import REPO_ROOT

#: 学员自己选择展开的折叠块（提示、参考解答的位置、老师构建里的参考解答）。
#: en: The folded blocks a learner chooses to open (hints, where the reference is, the instructor build's reference).
ON_REQUEST = re.compile(r"^(\s*)\?\?\? (tip|note|success)\b")
TOKEN = re.compile(r"[A-Za-z_]\w*|\d+")


def normalise(line: str) -> str:
    return re.sub(r"\s+", " ", line.strip())


def without_requested(markdown: str) -> list[str]:
    """页面上不展开也看得到的行：去掉学员按需展开的折叠块（缩进在块标题之下的行）。

    en: The lines of a page one sees without opening anything: the folded blocks a learner opens on request (the lines
    indented under the block's title) are left out.
    """
    out: list[str] = []
    fold: int | None = None
    for line in markdown.splitlines():
        indent = len(line) - len(line.lstrip())
        if fold is not None and (not line.strip() or indent > fold):
            continue
        fold = None
        if m := ON_REQUEST.match(line):
            fold = len(m[1])
            continue
        out.append(line)
    return out


def known_code() -> set[str]:
    """学员手里已有的代码行：各章的骨架和给定模块。

    en: The code lines a learner already has: every chapter's skeleton and the given modules.
    """
    lines: set[str] = set()
    for ch in CHAPTERS:
        lines |= {normalise(l) for l in make_skeleton(solution_source(ch), ch).splitlines()}
    for path in (REPO_ROOT / "minisgl").rglob("*.py"):
        lines |= {normalise(l) for l in path.read_text(encoding="utf-8").splitlines()}
    return lines


def solution_source(ch: Chapter) -> str:
    return (REPO_ROOT / "solutions" / ch.relpath).read_text(encoding="utf-8")


def answer_lines(ch: Chapter, known: set[str]) -> dict[str, set[str]]:
    """任务名 → 它的答案行（见模块文档）。

    en: Task name → its answer lines (see the module docstring).
    """
    source = solution_source(ch)
    lines = source.splitlines()
    out: dict[str, set[str]] = {}
    for task in parse_tasks(source, ch.relpath):
        body = (normalise(l) for l in lines[task.code - 1 : task.end - 1])
        out[task.name] = {l for l in body if l and not l.startswith("#") and l not in known and len(TOKEN.findall(l)) >= 3}
    return out


def page_order(page: str) -> float | None:
    """页面在学习顺序里的位置（``docs/`` 下的相对路径）：章节页是它那一章的序号，阶段开篇在本阶段各章之前，阶段里程碑
    在之后，阶段之外的页面在最前；老师页学员不读，返回 None。

    en: A page's place in the order of learning (its path under ``docs/``): a chapter's page is its chapter's index, a
    stage's opening page comes before that stage's chapters and its milestone after them, pages outside the stages come
    first; the teacher's page is not a learner's, None.
    """
    stem = page.removesuffix(".md").removesuffix(".en")
    for i, ch in enumerate(CHAPTERS):
        if Path(ch.docs_page).relative_to("docs").with_suffix("").as_posix() == stem:
            return float(i)
    parts = stem.split("/")
    if len(parts) == 2 and parts[0].startswith("stage"):
        in_stage = [i for i, ch in enumerate(CHAPTERS) if ch.relpath.startswith(parts[0] + "/")]
        return min(in_stage) - 0.5 if parts[1] == "index" else max(in_stage) + 0.5
    return None if stem == "teacher" else -1.0


def shown_answers(pages: Iterable[str], render: Callable[[str], str]) -> dict[tuple[str, str], tuple[set[str], set[str]]]:
    """(章, 任务) → (被看到的答案行, 全部答案行)。``pages`` 是 ``docs/`` 下的页面路径，``render(page)`` 给出学员构建里
    那一页展开之后的 Markdown。

    en: (chapter, task) → (answer lines shown, all answer lines). ``pages`` are page paths under ``docs/``, and
    ``render(page)`` gives the page's expanded Markdown in the learner's build.
    """
    visible: list[tuple[float, set[str]]] = []
    for page in pages:
        if (order := page_order(page)) is not None:
            visible.append((order, {normalise(l) for l in without_requested(render(page))}))
    known = known_code()
    out: dict[tuple[str, str], tuple[set[str], set[str]]] = {}
    for i, ch in enumerate(CHAPTERS):
        seen = set().union(*(lines for order, lines in visible if order <= i))
        for name, answer in answer_lines(ch, known).items():
            out[(ch.id, name)] = (answer & seen, answer)
    return out
