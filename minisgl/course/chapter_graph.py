"""章节之间的导入图，从源码读出（函数里的延迟导入也算，``if TYPE_CHECKING:`` 里的不算）：每一章直接用到哪些更早的章，
以及哪里“向前看”了——一章直接或经过给定模块（``minisgl/`` 里不属于任何一章的模块）导入了后面的章。

导入钩子让 ``minisgl.<章>`` 在运行时指向学员代码或参考解答，所以任何照运行时导入画的图都看不到这些箭头；这里按名字
读 ``solutions/`` 和 ``minisgl/`` 的源码。组装（:mod:`minisgl.llm`、启动器）认识所有章节，但没有哪一章导入它，
所以它不会被算成向前看。

en: The import graph between chapters, read from the sources (lazy imports inside functions count, those under ``if
TYPE_CHECKING:`` do not): which earlier chapters each chapter uses directly, and where one "looks forward": a chapter
importing a later chapter directly or through a given module (a module of ``minisgl/`` that belongs to no chapter).

The import hook points ``minisgl.<chapter>`` at learner code or a reference solution at run time, so a drawing of the
run-time imports shows none of these arrows; this reads the sources of ``solutions/`` and ``minisgl/`` by name. The
assembly (:mod:`minisgl.llm`, the launcher) knows every chapter, but no chapter imports it, so it never counts as
looking forward.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

from minisgl.course.registry import CHAPTERS, COURSE_ROOT, Chapter
from minisgl.paths import REPO_ROOT


class ForwardImport(NamedTuple):
    """一章看到了后面的一章：``via`` 是导入链（``文件:行``，从这一章的文件起）。

    en: A chapter that sees a later chapter: ``via`` is the import chain (``file:line``, from the chapter's file on).
    """

    chapter: Chapter
    later: Chapter
    via: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.chapter.label} {self.chapter.id} -> {self.later.label} {self.later.id}: {' -> '.join(self.via)}"


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def imports_of(path: Path) -> list[tuple[str, int]]:
    """文件导入的模块名（``from a import b`` 记 ``a`` 和 ``a.b``：``b`` 可能是子模块）和行号；不看 TYPE_CHECKING 块。

    en: The module names a file imports (``from a import b`` gives ``a`` and ``a.b``: ``b`` may be a submodule) with line
    numbers; ``TYPE_CHECKING`` blocks are skipped.
    """
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    visit(stmt)
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.module, child.lineno))
                found.extend((f"{child.module}.{alias.name}", child.lineno) for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _given_module_file(name: str, root: Path) -> Path | None:
    if name.split(".")[0] != "minisgl" or name.startswith("minisgl.course"):
        return None
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


class ChapterGraph:
    """``solutions/`` 里各章的参考解答和 ``minisgl/`` 里的给定模块之间的导入。

    en: The imports between the chapters' reference solutions in ``solutions/`` and the given modules of ``minisgl/``.
    """

    def __init__(self, chapters: tuple[Chapter, ...] = CHAPTERS, course_root: Path = COURSE_ROOT,
                 repo_root: Path = REPO_ROOT) -> None:
        self.chapters = chapters
        self.course_root = course_root
        self.repo_root = repo_root
        self._index = {c.public_module: i for i, c in enumerate(chapters)}
        self._imports: dict[Path, list[tuple[str, int]]] = {}  # 每个文件只读、只解析一次 | en: each file read and parsed once

    def _imports_of(self, path: Path) -> list[tuple[str, int]]:
        if path not in self._imports:
            self._imports[path] = imports_of(path)
        return self._imports[path]

    def _label(self, path: Path, line: int) -> str:
        for root in (self.course_root, self.repo_root):
            if path.is_relative_to(root):
                return f"{path.relative_to(root).as_posix()}:{line}"
        return f"{path}:{line}"

    def reach(self, path: Path) -> dict[int, tuple[str, ...]]:
        """从这个文件出发、经过给定模块能到的每一章（按章的序号）→ 一条导入链（最先找到的那条）。

        en: Each chapter (by index) reachable from this file through given modules → one import chain (the first found).
        """
        out: dict[int, tuple[str, ...]] = {}
        seen = {path}
        todo: list[tuple[Path, tuple[str, ...]]] = [(path, ())]
        while todo:
            file, chain = todo.pop(0)
            for name, line in self._imports_of(file):
                here = (*chain, self._label(file, line))
                if name in self._index:
                    out.setdefault(self._index[name], here)
                elif (given := _given_module_file(name, self.repo_root)) is not None and given not in seen:
                    seen.add(given)
                    todo.append((given, here))
        return out

    def solution_file(self, chapter: Chapter) -> Path:
        return self.course_root / "solutions" / chapter.relpath

    def direct(self, chapter: Chapter) -> list[Chapter]:
        """这一章的文件自己导入的章（不经过给定模块），按章的顺序。

        en: The chapters this chapter's file imports itself (not through given modules), in chapter order.
        """
        names = {name for name, _ in self._imports_of(self.solution_file(chapter))}
        return [c for c in self.chapters if c.public_module in names and c != chapter]

    def forward_imports(self) -> list[ForwardImport]:
        found = []
        for i, chapter in enumerate(self.chapters):
            for j, chain in sorted(self.reach(self.solution_file(chapter)).items()):
                if j > i:
                    found.append(ForwardImport(chapter, self.chapters[j], chain))
        return found
