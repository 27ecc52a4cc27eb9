"""学员写一个任务之前，书里能读到它多少答案：一把尺子，界线放在检查里（``checks/docs/test_book.py``）。

- 一个任务的**答案行**：参考解答里任务区段的代码行，去掉注释；在学员手里已有的代码里（各章骨架、``minisgl/`` 的给定
  模块）出现过的不算，不足三个名字或数字的（``return out``）也不算——它们说明不了什么；
- 一行答案**被看到**：它（空白归一以后）出现在学员做这一章之前或之时读的材料里——前面各章和本章的页面、各阶段的
  开篇、阶段之外的页面（老师页除外），这些章的笔记本（两种语言的代码格和输出），这些章的示例和之前各阶段的里程碑
  脚本。页面上折叠着的块也算：学员的书里不放提示，提示只在终端里按级给出（要过几级都记着）。

en: How much of a task's answer the book lets a learner read before writing it: a ruler; the bound lives in the check
(``checks/docs/test_book.py``).

- A task's **answer lines**: the code lines of the task's region in the reference solution, comments left out; lines
  that occur in code the learner already has (every chapter's skeleton, the given modules under ``minisgl/``) do not
  count, and neither do lines with fewer than three names or numbers (``return out``): they tell nothing;
- an answer line is **shown** when it (whitespace normalised) occurs in what the learner reads before or while doing
  the chapter: the pages of earlier chapters and of this one, each stage's opening page, the pages outside the stages
  but the teacher's; those chapters' notebooks (code cells and outputs, both editions); those chapters' examples and
  the milestone scripts of earlier stages. Folded blocks on a page count too: the learner's book carries no hints,
  the terminal gives them one level at a time (and counts what was asked for).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

from minisgl.course.registry import CHAPTERS, Chapter, notebook_edition
from minisgl.course.skeleton import make_skeleton, parse_tasks
from minisgl.paths import REPO_ROOT

TOKEN = re.compile(r"[A-Za-z_]\w*|\d+")


def normalise(line: str) -> str:
    return re.sub(r"\s+", " ", line.strip())


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


def notebook_texts() -> list[tuple[float, str]]:
    """(学习顺序里的位置, 文字)：每章的笔记本（两种语言），代码格和输出。

    en: (place in the order of learning, text): every chapter's notebook (both editions), code cells and outputs."""
    out = []
    for i, ch in enumerate(CHAPTERS):
        for language in ("zh", "en"):
            path = REPO_ROOT / notebook_edition(ch.notebook, language)
            if not path.is_file():
                continue
            for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
                texts = ["".join(cell["source"])]
                for output in cell.get("outputs", []):
                    texts += ["".join(output.get("text", []))]
                    texts += ["".join(v) if isinstance(v, list) else str(v) for v in output.get("data", {}).values()]
                out.append((float(i), "\n".join(texts)))
    return out


def example_texts() -> list[tuple[float, str]]:
    """(学习顺序里的位置, 文字)：每章的示例 ``examples/chapters/<章>.py``，和各阶段的里程碑脚本（在该阶段之后）。

    en: (place in the order of learning, text): each chapter's example ``examples/chapters/<chapter>.py``, and each
    stage's milestone script (after that stage)."""
    out = []
    for i, ch in enumerate(CHAPTERS):
        path = REPO_ROOT / "examples" / "chapters" / f"{ch.id}.py"
        if path.is_file():
            out.append((float(i), path.read_text(encoding="utf-8")))
    for path in sorted((REPO_ROOT / "examples").glob("stage*_milestone.py")):
        stage = path.name.removeprefix("stage").split("_")[0]
        in_stage = [i for i, ch in enumerate(CHAPTERS) if ch.relpath.startswith(f"stage{stage}/")]
        if in_stage:
            out.append((max(in_stage) + 0.5, path.read_text(encoding="utf-8")))
    return out


def shown_answers(texts: Iterable[tuple[float, str]]) -> dict[tuple[str, str], tuple[set[str], set[str]]]:
    """(章, 任务) → (被看到的答案行, 全部答案行)。``texts`` 是学员读的材料：(学习顺序里的位置, 文字)——页面在学员
    构建里展开之后的 Markdown（位置见 :func:`page_order`）、:func:`notebook_texts`、:func:`example_texts`。

    en: (chapter, task) → (answer lines shown, all answer lines). ``texts`` is what the learner reads: (place in the
    order of learning, text) — pages as expanded in the learner's build (placed by :func:`page_order`),
    :func:`notebook_texts`, :func:`example_texts`.
    """
    visible = [(order, {normalise(l) for l in text.splitlines()}) for order, text in texts]
    known = known_code()
    out: dict[tuple[str, str], tuple[set[str], set[str]]] = {}
    for i, ch in enumerate(CHAPTERS):
        seen = set().union(*(lines for order, lines in visible if order <= i))
        for name, answer in answer_lines(ch, known).items():
            out[(ch.id, name)] = (answer & seen, answer)
    return out
