"""Every Chinese comment and docstring a learner reads has its English beside it, in the one convention of
:mod:`minisgl.course.bilingual`, and the book's one-language views of that code keep the code and lose nothing.

Learner code: the solutions (the book shows them), the skeletons generated from them, the examples, every file the book
embeds with ``[[code ...]]`` / ``[[sig ...]]``, and the code cells of the notebook sources (same convention; each
notebook edition shows its own language). A learner who chose a language (``python -m minisgl.course lang``) gets their
files in it, and switching keeps every line they wrote.
"""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from pathlib import Path

import pytest

from minisgl.course.bilingual import EN_LINE, for_language, problems
from minisgl.course.registry import CHAPTERS
from minisgl.i18n import CJK
from minisgl.paths import REPO_ROOT as REPO

#: Besides every chapter of the registry (its solution and its skeleton).
ROOTS = ["solutions/stage1", "solutions/stage2", "stage1", "stage2", "examples"]
DIRECTIVE = re.compile(r"^[ \t]*\[\[(?:code|sig) (?P<path>[^\]:\s]+)(?:::(?P<symbol>[^\]\s]+))?", re.M)


def _book_embeds() -> set[tuple[str, str]]:
    """Every (file, symbol) a book page embeds with ``[[code ...]]`` or ``[[sig ...]]`` (symbol "" for a whole file)."""
    pages = [p for p in (REPO / "docs").rglob("*.md")]
    return {(m["path"], m["symbol"] or "") for page in pages for m in DIRECTIVE.finditer(page.read_text(encoding="utf-8"))}


def learner_files() -> list[str]:
    """Whole files: the solutions, skeletons and examples, and any other file the book embeds whole."""
    files = {p.relative_to(REPO).as_posix() for root in ROOTS for p in (REPO / root).rglob("*.py")
             if "__pycache__" not in p.parts}
    files |= {path for ch in CHAPTERS for path in (f"solutions/{ch.relpath}", ch.relpath) if (REPO / path).is_file()}
    files |= {path for path, symbol in _book_embeds() if path.endswith(".py") and not symbol}
    return sorted(files)


def embedded_symbols() -> list[tuple[str, str]]:
    """Symbols the book shows from files that are not learner files as a whole (e.g. ``minisgl/trace.py::StepTrace``)."""
    whole = set(learner_files())
    return sorted((path, symbol) for path, symbol in _book_embeds() if symbol and path not in whole)


def _symbol_lines(source: str, dotted: str) -> tuple[int, int]:
    scope, node = ast.parse(source).body, None
    for part in dotted.split("."):
        node = next(n for n in scope if getattr(n, "name", None) == part
                    or (isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == part)
                    or (isinstance(n, ast.AnnAssign) and getattr(n.target, "id", None) == part))
        scope = getattr(node, "body", [])
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return start, node.end_lineno


def _source(path: str) -> str:
    return (REPO / path).read_text(encoding="utf-8")


def test_the_set_is_not_empty() -> None:
    files = learner_files()
    for must in ("solutions/stage2/radix_cache.py", "stage2/cache_manager.py", "examples/stage2_milestone.py"):
        assert must in files, f"{must} is learner code but is not checked"
    assert ("minisgl/trace.py", "StepTrace") in embedded_symbols(), "the book's embedded symbols are not checked"


@pytest.mark.parametrize(("path", "symbol"), embedded_symbols())
def test_embedded_symbols_have_english(path: str, symbol: str) -> None:
    """What the book shows of a file that is not learner code as a whole: that symbol, with its comments and docstrings."""
    source = _source(path)
    start, end = _symbol_lines(source, symbol)
    found = [p for p in problems(source, path) if start <= int(p.split(":")[1]) <= end]
    assert not found, f"{path}::{symbol}: Chinese without English:\n" + "\n".join(found)
    english = for_language(source, "en")
    start, end = _symbol_lines(english, symbol)
    segment = textwrap.dedent("\n".join(english.splitlines()[start - 1 : end]))
    leftover = [text[:80] for text in _prose(segment) if CJK.search(text)]
    assert not leftover, f"{path}::{symbol}: the English view still shows Chinese:\n" + "\n".join(map(repr, leftover))


@pytest.mark.parametrize("path", learner_files())
def test_chinese_has_english(path: str) -> None:
    found = problems(_source(path), path)
    assert not found, (f"{len(found)} Chinese comment(s) / docstring(s) without English (convention: "
                       "minisgl/course/bilingual.py):\n" + "\n".join(found))


def _code_only(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                first.value.value = ""
    return ast.dump(tree)


def _comments(source: str) -> list[str]:
    return [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT]


def _prose(source: str) -> list[str]:
    """Comments and docstrings of ``source``."""
    out = _comments(source)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.append(first.value.value)
    return out


@pytest.mark.parametrize("path", learner_files())
def test_one_language_views(path: str) -> None:
    """What the book shows: the same code, the English view without Chinese, the Chinese view without the en: lines."""
    source = _source(path)
    english, chinese = for_language(source, "en"), for_language(source, "zh")
    assert _code_only(english) == _code_only(source), f"{path}: the English view changed the code"
    assert _code_only(chinese) == _code_only(source), f"{path}: the Chinese view changed the code"
    leftover = [text[:80] for text in _prose(english) if CJK.search(text)]
    assert not leftover, f"{path}: the English view still shows Chinese:\n" + "\n".join(map(repr, leftover))
    twins = [line.strip()[:80] for line in chinese.splitlines() if EN_LINE.match(line)]
    twins += [text[:80] for text in _prose(chinese) if re.search(r"^\s*en:", text, re.M)]
    assert not twins, f"{path}: the Chinese view still shows English twins:\n" + "\n".join(map(repr, twins))


def test_spec_docstrings_in_english() -> None:
    """The docstrings that carry a task's spec read in English in the English view."""
    radix = for_language(_source("stage2/radix_cache.py"), "en")
    cache = for_language(_source("stage2/cache_manager.py"), "en")
    for text, where in (
        ("Returns the length that was already cached before the insert", "RadixPrefixCache.insert_prefix"),
        ("Returns the last fully matched node and the matched length", "RadixPrefixCache._tree_walk"),
    ):
        assert text in radix, f"stage2/radix_cache.py {where}: the English docstring is missing {text!r}"
    fields = cache[cache.index("class InsertResult") : cache.index("class BasePrefixCache")]
    for text in ("the length already cached before the insert", "a handle covering the whole prefix after the insert"):
        assert text in fields, f"stage2/cache_manager.py InsertResult: no English comment saying {text!r}:\n{fields}"


def test_convention_round_trip() -> None:
    source = '''def f(x):
    """中文说明。

    en: English text.
    """
    # 中文注释
    # en: an English comment
    y = x  # 行尾 | en: at the end
    # >>> TASK t: 中文提示
    # en: English hint
    return y
    # <<< TASK
'''
    assert problems(source) == []
    english = for_language(source, "en")
    assert '"""English text."""' in english and "# an English comment" in english and "y = x  # at the end" in english
    assert "# >>> TASK t: English hint" in english and not CJK.search(english)
    chinese = for_language(source, "zh")
    assert '"""中文说明。"""' in chinese and "# 中文注释\n    y = x  # 行尾\n" in chinese and "en:" not in chinese
    broken = source.replace("    # en: an English comment\n", "").replace(" | en: at the end", "")
    broken = broken.replace("\n    en: English text.\n", "\n")
    assert len(problems(broken)) == 3, problems(broken)


# ---------------------------------------------------------------- notebook sources

_CELL = re.compile(r"^# %%(?P<head>.*)$", re.M)


def _notebook_code_cells(path: Path) -> list[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    marks = list(_CELL.finditer(text))
    cells = []
    for i, m in enumerate(marks):
        if "[markdown]" in m["head"]:
            continue
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        cells.append((text.count("\n", 0, m.start()) + 2, text[m.end() + 1 : end]))
    return cells


@pytest.mark.parametrize("path", sorted(p.relative_to(REPO).as_posix() for p in (REPO / "notebooks" / "src").rglob("*.py")))
def test_notebook_code_comments_in_both_languages(path: str) -> None:
    """Notebook code cells follow the code's convention; each edition shows its own language only (the build renders
    every code cell with ``for_language``), so an English learner meets no Chinese comment and the other way round."""
    found = []
    for first, source in _notebook_code_cells(REPO / path):
        found += [f"{path} (cell at line {first}): {p}" for p in problems(source, "cell")]
        english = for_language(source, "en")
        found += [f"{path} (cell at line {first}): the English edition shows {c!r}" for c in _comments(english) if CJK.search(c)]
    assert not found, "\n".join(found)


# ---------------------------------------------------------------- one language in the learner's files


def _learner_edit(skeleton: str) -> tuple[str, list[str]]:
    """A learner's file: every ``raise TaskNotDone`` replaced by two lines of their own (one a comment of theirs in
    Chinese, which no switch may touch), and a helper of theirs at the end. Returns the file and the lines they wrote."""
    mine: list[str] = []

    def body(m: re.Match) -> str:
        lines = [f"{m['indent']}# 我的做法 {len(mine)}", f"{m['indent']}result_{len(mine)} = None  # mine"]
        mine.extend(lines)
        return "\n".join(lines)

    text = re.sub(r"^(?P<indent>[ \t]*)raise TaskNotDone\(.*\)$", body, skeleton, flags=re.M)
    mine.append("def my_helper():  # 学员自己的")
    return text + "\n\n" + mine[-1] + "\n    return 1\n", mine


@pytest.mark.parametrize("chapter", [ch.id for ch in CHAPTERS if (REPO / "solutions" / ch.relpath).is_file()])
def test_switching_language_keeps_the_learners_code(chapter: str) -> None:
    """``course lang``: a started file goes bilingual -> en -> zh -> bilingual; every line the learner wrote survives
    each step, the skeleton's prose follows the language, and the way back gives the file as it was."""
    from minisgl.course.language import render
    from minisgl.course.registry import get_chapter
    from minisgl.course.select import renderings

    ch = get_chapter(chapter)
    shapes = renderings(ch)
    text, mine = _learner_edit(shapes[None])
    steps = [("en", render(ch, text, "en"))]
    steps.append(("zh", render(ch, steps[-1][1], "zh")))
    steps.append((None, render(ch, steps[-1][1], None)))
    for language, view in steps:
        lines = view.splitlines()
        lost = [line for line in mine if line not in lines]
        assert not lost, f"{ch.relpath} -> {language}: the learner's lines are gone: {lost}"
        theirs = {line.strip() for line in mine}
        prose = [c for c in _comments(view) if c.strip() not in theirs and not any(c in t for t in theirs)]
        if language == "en":
            assert not [c for c in prose if CJK.search(c)], f"{ch.relpath}: the English view keeps Chinese comments"
        if language == "zh":
            assert not [c for c in prose if EN_LINE.match(c)], f"{ch.relpath}: the Chinese view keeps en: lines"
    assert steps[-1][1] == text, f"{ch.relpath}: bilingual -> en -> zh -> bilingual does not give the file back"
