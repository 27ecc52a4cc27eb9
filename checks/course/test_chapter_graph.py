"""各章只往回看：读源码（函数里的延迟导入也算），没有哪一章直接或经过给定模块导入后面的章；这个读法本身在一个小课程
上确实抓得到向前的导入。

en: Chapters look only backwards: reading the sources (lazy imports inside functions included), no chapter imports a
later chapter, directly or through a given module; and on a small course this reading does catch forward imports.
"""

from __future__ import annotations

from pathlib import Path

from checks.common import expect
from minisgl.course.chapter_graph import ChapterGraph
from minisgl.course.registry import Chapter
from minisgl.i18n import tr


def test_no_chapter_imports_a_later_chapter() -> None:
    found = [str(f) for f in ChapterGraph().forward_imports()]
    expect(found, [], tr("chapters that import a later chapter (directly or through a given module); a later chapter "
                         "enters through the assembly, minisgl/llm.py"))


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_the_reading_catches_lazy_and_indirect_forward_imports(tmp_path: Path) -> None:
    """三章的小课程：第 1 章在函数里导入一个给定模块，它又导入第 3 章；第 2 章只在 TYPE_CHECKING 里提到第 3 章。

    en: A course of three chapters: chapter 1 imports, inside a function, a given module that imports chapter 3;
    chapter 2 mentions chapter 3 only under TYPE_CHECKING.
    """
    chapters = (Chapter("first", 1, 1, "一"), Chapter("second", 1, 2, "二"), Chapter("third", 1, 3, "三"))
    _write(tmp_path, "solutions/stage1/first.py", "def f():\n    from minisgl.helper import g\n    return g\n")
    _write(tmp_path, "minisgl/helper.py", "import minisgl.core_given\n\n\ndef g():\n    from minisgl.third import h\n")
    _write(tmp_path, "minisgl/core_given.py", "x = 1\n")
    _write(tmp_path, "solutions/stage1/second.py",
           "from typing import TYPE_CHECKING\nfrom minisgl.first import f\nif TYPE_CHECKING:\n    from minisgl.third import h\n")
    _write(tmp_path, "solutions/stage1/third.py", "from minisgl.second import f\n")
    graph = ChapterGraph(chapters, course_root=tmp_path, repo_root=tmp_path)
    found = [(f.chapter.id, f.later.id, f.via) for f in graph.forward_imports()]
    expect(found, [("first", "third", ("solutions/stage1/first.py:2", "minisgl/helper.py:5"))],
           tr("forward imports found in the small course (only chapter 1 -> 3, through the given module)"))
    expect([c.id for c in graph.direct(chapters[2])], ["second"], tr("the chapters chapter 3 imports itself"))
