"""学员选一种语言学：自己的文件、检查消息、命令的输出都只用这一种（``python -m minisgl.course lang en``）。

参考解答、发布的骨架和讲义两种语言并存，是唯一的来源；学员的文件是从骨架按语言渲染出来的
（:func:`minisgl.course.bilingual.for_language`，只动注释和文档字符串）。选择记在工作区的
``.minisgl/language`` 里，:func:`minisgl.i18n.lang` 在没有 ``MINISGL_LANG`` 时读它。

换语言不丢学员写的代码：把文件和它起步时的那份骨架（双语、中文或英文，取最像的一份）逐行对齐，
学员没动过的注释块和文档字符串换成新语言的，其余的行原样保留（:func:`switch`）。

en: A learner chooses one language to learn in: their files, check messages and the commands' output use only that one
(``python -m minisgl.course lang en``).

The reference solutions, the shipped skeletons and the book keep both languages, the one source of truth; a learner's
file is the skeleton rendered in one language (:func:`minisgl.course.bilingual.for_language`, which touches comments
and docstrings only). The choice is kept in the workspace's ``.minisgl/language``, which :func:`minisgl.i18n.lang` reads
when ``MINISGL_LANG`` is not set.

Switching keeps the learner's code: the file is aligned line by line with the skeleton it started from (bilingual,
Chinese or English, whichever is closest); the comment blocks and docstrings the learner left as they were become the
new language's, every other line stays as it is (:func:`switch`).
"""

from __future__ import annotations

from difflib import SequenceMatcher
from pathlib import Path

from minisgl.course import select
from minisgl.course.registry import CHAPTERS, Chapter
from minisgl.i18n import LANGS, LANGUAGE_FILE, forget_saved_language, tr


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def switch(text: str, before: str, after: str) -> str:
    """``text`` 是从 ``before`` 改出来的学员文件；把 ``before`` 到 ``after`` 的改动（换了语言的注释和文档字符串）
    搬到 ``text`` 上，只搬学员一行没动过的那些块，学员写过的行一行不碰。

    en: ``text`` is a learner file edited from ``before``; carry the changes from ``before`` to ``after`` (comments and
    docstrings in another language) over to ``text``, only the blocks the learner left untouched, never a line they wrote.
    """
    b, t, a = _lines(before), _lines(text), _lines(after)
    kept: dict[int, int] = {}  # line of before -> the same, untouched line of text
    for tag, i1, i2, j1, _ in SequenceMatcher(None, b, t, autojunk=False).get_opcodes():
        if tag == "equal":
            kept.update(zip(range(i1, i2), range(j1, j1 + i2 - i1)))
    edits: list[tuple[int, int, list[str]]] = []
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, b, a, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if i2 > i1:
            rows = [kept.get(i) for i in range(i1, i2)]
            if None in rows or rows != list(range(rows[0], rows[0] + len(rows))):
                continue  # 学员动过这块：原样留下 | en: the learner changed this block: leave it
            start, end = rows[0], rows[-1] + 1
        elif i1 in kept:
            start = end = kept[i1]
        elif i1 - 1 in kept:
            start = end = kept[i1 - 1] + 1
        else:
            continue
        edits.append((start, end, a[j1:j2]))
    for start, end, new in reversed(edits):
        t[start:end] = new
    return "".join(t)


def _closest(text: str, candidates: dict[str | None, str]) -> str:
    return max(candidates.values(), key=lambda c: SequenceMatcher(None, _lines(c), _lines(text), autojunk=False).ratio())


def render(ch: Chapter, text: str, language: str | None) -> str:
    """学员文件 ``text`` 换成 ``language``（None：双语）之后的样子。

    en: The learner file ``text`` rendered in ``language`` (None: bilingual)."""
    shapes = select.renderings(ch)
    if text in shapes.values():
        return shapes[language]
    return switch(text, _closest(text, shapes), shapes[language])


def choose(language: str | None, workspace: Path | None = None) -> list[str]:
    """把工作区定为 ``language``（None：回到双语），重写每个已写好的章节的学员文件；返回每个改了的文件一句话。

    en: Set the workspace's language (None: back to bilingual) and rewrite every written chapter's learner file;
    returns one line per file changed."""
    if language is not None and language not in LANGS:
        raise ValueError(tr("Unknown language {language!r}: choose zh or en.", language=language))
    ws = workspace or select.workspace_root()
    path = ws / LANGUAGE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if language is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(language + "\n", encoding="utf-8")
    forget_saved_language()
    done = []
    for ch in CHAPTERS:
        file = ws / ch.relpath
        if not select.is_written(ch) or not file.is_file():
            continue
        text = file.read_text(encoding="utf-8")
        new = render(ch, text, language)
        if new != text:
            file.write_text(new, encoding="utf-8")
            done.append(ch.relpath)
    return done
