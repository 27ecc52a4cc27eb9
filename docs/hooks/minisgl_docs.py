"""mkdocs hook: include code by symbol, recorded outputs and chapter tasks.

A directive is a whole line (it may be indented, e.g. inside an admonition) of the form ``[[kind arg]]``:

    [[code solutions/stage1/core.py::Req.complete_one]]   source of a function / class / method / assignment, its
                                                           comments and docstrings in the page's language; from a
                                                           reference solution the learner's book shows the skeleton
                                                           (a task's goal in place of its body)
    [[code examples/step0_tiny_engine.py]]                 a whole file
    [[sig solutions/stage1/core.py::Req]]                  signatures and docstrings only (reference page)
    [[output stage2_milestone]]                            docs/outputs/stage2_milestone.txt, recorded by
                                                           tools/record_outputs.py
    [[task complete_one]]                                  a task of this page's chapter: heading with the
                                                           anchor used in the skeleton's NotImplementedError,
                                                           the goal, the skeleton's code and the hint command
                                                           (asking in the terminal is counted); the hint levels
                                                           folded and the reference solution only when the
                                                           instructor builds with MINISGL_DOCS_SOLUTIONS=1
    [[practice]]                                           this chapter's files, notebook and check commands
    [[chapters]]                                           the chapter graph read from the sources (teacher page)
    [[serve serve results]]                                a table of the recorded serving benchmark
                                                           docs/outputs/serve.json (bench/serve.py --record)

Directives inside fenced code blocks are left alone. Any problem (unknown file, symbol, task, output or
directive) is logged as an error, which fails ``mkdocs build --strict``, and shows as a red box on the page.
The syntax does not overlap with pymdownx.snippets (``--8<--``).

It also drops the line breaks inside Chinese paragraphs, which HTML would otherwise render as spaces.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import textwrap
from functools import lru_cache
from pathlib import Path

from bench.report import BOOK_TABLES, book_table
from minisgl.course.bilingual import for_language
from minisgl.course.chapter_graph import ChapterGraph
from minisgl.course.hints import enclosing
from minisgl.course.registry import CHAPTERS, Chapter, notebook_edition
from minisgl.course.skeleton import make_skeleton, parse_tasks, todo_message
from minisgl.i18n import tr
from minisgl.paths import REPO_ROOT as REPO

log = logging.getLogger("mkdocs.plugins.minisgl_docs")

DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)\[\[(?P<kind>[a-z]+)(?: (?P<arg>[^\]]+?))?\]\]\s*$")
FENCE = re.compile(r"^[ \t]*(```|~~~)")


class DocsError(Exception):
    """A directive that cannot be resolved."""


# ---------------------------------------------------------------- source files and symbols


@lru_cache(maxsize=None)
def _parse(path: str, mtime: float) -> tuple[list[str], ast.Module]:
    source = (REPO / path).read_text(encoding="utf-8")
    return source.splitlines(), ast.parse(source, filename=path)


def load(path: str) -> tuple[list[str], ast.Module]:
    full = (REPO / path).resolve()
    if REPO not in full.parents or not full.is_file():
        raise DocsError(f"找不到文件 {path}（路径相对于仓库根目录）")
    return _parse(path, full.stat().st_mtime)


def _name(node: ast.AST) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def find_symbol(tree: ast.Module, dotted: str, path: str) -> ast.AST:
    scope: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in dotted.split("."):
        node = next((n for n in scope if _name(n) == part), None)
        if node is None:
            raise DocsError(f"{path} 里没有符号 {dotted}")
        scope = getattr(node, "body", [])
    return node


def _start(node: ast.AST) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def _end(lines: list[str], node: ast.AST) -> int:
    """Last line of ``node``, including comments that close its body (ast drops them, e.g. ``# <<< TASK``)."""
    end = node.end_lineno
    indent = len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())
    probe = end
    while probe < len(lines):
        text = lines[probe]
        if text.strip() and not (text.lstrip().startswith("#") and len(text) - len(text.lstrip()) > indent):
            break
        probe += 1
        if text.strip():
            end = probe
    return end


def _docstring_end(node: ast.AST) -> int | None:
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0].end_lineno
    return None


def _signature_lines(lines: list[str], node: ast.AST) -> list[str]:
    """Decorators, ``def``/``class`` line(s) and docstring; bodies become ``...``."""
    first_body = node.body[0].lineno
    head_end = max(first_body - 1, node.lineno)
    while head_end > node.lineno and (not lines[head_end - 1].strip() or lines[head_end - 1].lstrip().startswith("#")):
        head_end -= 1
    out = lines[_start(node) - 1 : head_end]
    doc_end = _docstring_end(node)
    if doc_end:
        out += lines[first_body - 1 : doc_end]
    if isinstance(node, ast.ClassDef):
        for child in node.body:
            if isinstance(child, (ast.AnnAssign, ast.Assign)):
                out += lines[child.lineno - 1 : child.end_lineno]
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                not child.name.startswith("_") or child.name in ("__init__", "__post_init__")
            ):
                out += [""] + _signature_lines(lines, child)
    else:
        indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)
        out.append(indent + "    ...")
    return out


def instructor_build() -> bool:
    """``MINISGL_DOCS_SOLUTIONS=1``: the instructor's book, which shows the reference solutions."""
    return os.environ.get("MINISGL_DOCS_SOLUTIONS") == "1"


def solution_chapter(path: str) -> Chapter | None:
    """The chapter whose reference solution ``path`` is (``solutions/stage1/core.py`` → 1.1), or None."""
    return next((ch for ch in CHAPTERS if path == f"solutions/{ch.relpath}"), None)


def code_block(path: str, symbol: str | None, *, signature: bool = False, title: str | None = None,
               source: str | None = None, language: str = "zh") -> list[str]:
    """A fenced python block with the symbol's source, its comments and docstrings in the page's language. From a
    chapter's reference solution the learner's book shows the skeleton (each task's goal in place of its body), so no
    page shows an answer before the learner writes it; the instructor's build shows the reference.

    Learner code carries both languages (:mod:`minisgl.course.bilingual`); the book shows one, so the block has fewer
    lines than the file and shows no line numbers (they would not match the file)."""
    if source is None:
        lines, _ = load(path)
        source = "\n".join(lines) + "\n"
        if (chapter := solution_chapter(path)) is not None and not instructor_build():
            source = make_skeleton(source, chapter)  # the learner's book: a task's goal stands in place of its body
            path = chapter.relpath  # and names the file the learner has
    source = for_language(source, language)
    lines, tree = source.splitlines(), ast.parse(source)
    if symbol is None:
        body = lines
    else:
        node = find_symbol(tree, symbol, path)
        body = _signature_lines(lines, node) if signature else lines[_start(node) - 1 : _end(lines, node)]
    body = textwrap.dedent("\n".join(body)).splitlines()
    caption = title or (f"{path} · {symbol}" if symbol else path)
    return [f'```` {{ .python .included-code title="{caption}" }}', *body, "````"]  # 4: source may hold ```


# ---------------------------------------------------------------- recorded outputs


def output_block(name: str, language: str) -> list[str]:
    """录制的输出：中文页用 docs/outputs/<名字>.txt，英文页用 docs/outputs/en/<名字>.txt（同一批示例在英文下的输出）。"""
    rel = f"outputs/{name}.txt" if language == "zh" else f"outputs/{language}/{name}.txt"
    path = REPO / "docs" / rel
    if not path.is_file():
        raise DocsError(f"没有录制的输出 docs/{rel}：运行 python tools/record_outputs.py {name} --lang {language}")
    text = path.read_text(encoding="utf-8").rstrip("\n").splitlines()
    title = tr("Output (docs/{path}, recorded by tools/record_outputs.py)", language=language, path=rel)
    return [f'```` {{ .text .recorded-output title="{title}" }}', *text, "````"]


def serve_block(arg: str, language: str) -> list[str]:
    """A table of a recorded serving benchmark: ``[[serve RECORDING TABLE]]`` reads docs/outputs/RECORDING.json
    (written by ``bench/serve.py --record --json``) and renders TABLE with :func:`bench.report.book_table`."""
    recording, _, table = arg.partition(" ")
    path = REPO / "docs" / "outputs" / f"{recording}.json"
    if not path.is_file():
        raise DocsError(f"没有录制的服务基准 docs/outputs/{recording}.json：用 bench/serve.py --record --json 录制")
    if table.strip() not in BOOK_TABLES:
        raise DocsError(f"[[serve {arg}]]：表名是 {', '.join(BOOK_TABLES)} 之一")
    return book_table(json.loads(path.read_text(encoding="utf-8")), table.strip(), language)


# ---------------------------------------------------------------- chapter tasks


def _escape(text: str) -> str:
    """Show a hint literally: Markdown must not read ``index_copy_`` or ``x * y`` as emphasis.

    ``&`` and ``<`` become HTML entities (Markdown has no backslash escape for ``<``: ``\\<`` would show
    the backslash); every other character Markdown could act on gets a backslash, and so does a list marker at
    the start of a line (``1.``, ``-``, ``+``: a walkthrough's numbered steps must not become a list).
    """
    text = text.replace("&", "&amp;").replace("<", "&lt;")
    text = re.sub(r"([\\`*_{}\[\]>#|])", r"\\\1", text)
    return re.sub(r"^(\s*)(\d+)\.(?=\s)|^(\s*)([-+])(?=\s)", lambda m: (f"{m[1]}{m[2]}\\." if m[2] else f"{m[3]}\\{m[4]}"), text)


def chapter_of(src_uri: str) -> Chapter:
    page = src_uri.removesuffix(".en.md") + ".md" if src_uri.endswith(".en.md") else src_uri
    for ch in CHAPTERS:
        if Path(ch.docs_page).relative_to("docs").as_posix() == page:
            return ch
    raise DocsError(f"页面 {src_uri} 不是某一章的页面，不能用 [[task ...]]")


def task_block(chapter: Chapter, name: str, language: str) -> list[str]:
    sol_path = f"solutions/{chapter.relpath}"
    lines, tree = load(sol_path)
    source = "\n".join(lines) + "\n"
    tasks = {t.name: t for t in parse_tasks(source, sol_path)}
    if name not in tasks:
        raise DocsError(f"第 {chapter.label} 章 {chapter.id} 没有任务 {name}；有：{', '.join(tasks)}")
    task = tasks[name]
    symbol = enclosing(tree, task.line)
    if not symbol:
        raise DocsError(f"{sol_path}:{task.line}: 任务 {name} 不在任何函数里")
    goal = task.hint_for(language)
    message = todo_message(chapter, name, goal, language=language)
    skeleton = make_skeleton(source, chapter)
    out = [
        f"### `{name}` {{ #{name} .task }}",
        "",
        tr("**Where**: `{symbol}` in `{path}` · **Goal**: {hint}", language=language, symbol=symbol,
           path=chapter.relpath, hint=_escape(goal)),
        "",
        *code_block(chapter.relpath, symbol, source=skeleton, language=language,
                    title=tr("{path} · {symbol} (your skeleton)", language=language, path=chapter.relpath, symbol=symbol)),
        "",
        "??? quote " + json.dumps(tr("The error you see while it is not written yet", language=language), ensure_ascii=False),
        "",
        f"    `` TaskNotDone: {message} ``",
    ]
    if not instructor_build():  # the hints live in the terminal, where asking for one is counted
        return out + ["", tr("Stuck? `python -m minisgl.course hint {id} {task}` gives the next hint (1 a nudge, 2 the "
                             "walkthrough, 3 where the reference is); it remembers what you asked for.",
                             language=language, id=chapter.id, task=name)]  # fmt: skip
    for level in (1, 2):  # the instructor's book: every level folded under the task
        title = tr("Hint {level}: {name}", language=language, level=level,
                   name=tr("a nudge", language=language) if level == 1 else tr("the walkthrough", language=language))
        out += ["", "??? tip " + json.dumps(title, ensure_ascii=False), "",
                *[f"    {_escape(line)}  " if line else "" for line in task.level_for(level, language).splitlines()]]
    out += ["", "??? note " + json.dumps(tr("Hint 3: the reference", language=language), ensure_ascii=False), "",
            "    " + tr("`solutions/{path}`, lines {start}–{end} (`{symbol}`); in the terminal: `python -m minisgl.course hint "
                        "{id} {task}`", language=language, path=chapter.relpath, start=task.code, end=task.end - 1,
                        symbol=symbol, id=chapter.id, task=name)]  # fmt: skip
    out += ["", "??? success " + json.dumps(tr("Reference solution (write yours first, then expand to compare)",
                                               language=language), ensure_ascii=False), "",
            *["    " + line if line else "" for line in code_block(sol_path, symbol, language=language)]]
    return out


def practice_block(ch: Chapter, language: str) -> list[str]:
    notebook = notebook_edition(ch.notebook, language)
    items = [
        tr("Your file: `{path}` (the skeleton, start here); reference solution: `solutions/{path}`", language=language,
           path=ch.relpath) if instructor_build() else
        tr("Your file: `{path}` (the skeleton, start here)", language=language, path=ch.relpath),
        tr("Notebook: `{notebook}`, open it with `jupyter lab {notebook}`", language=language, notebook=notebook),
        tr("Run this chapter's checks: `pytest {checks}`, or `python -m minisgl.course check {id}`",
           language=language, checks=ch.check_file, id=ch.id),
        tr("Stuck? `python -m minisgl.course use solution {id}` switches to the reference solution, "
           "`python -m minisgl.course use auto {id}` back to your code", language=language, id=ch.id),
    ]
    title = tr("Hands on: this chapter's files, notebook and checks", language=language)
    return [f"!!! abstract {json.dumps(title, ensure_ascii=False)}", "", *[f"    - {item}" for item in items]]


def chapters_block(language: str) -> list[str]:
    """``[[chapters]]``: each chapter and the earlier chapters its file imports, read from the sources; a chapter that
    looks forward fails the build."""
    graph = ChapterGraph()
    forward = graph.forward_imports()
    if forward:
        raise DocsError("；".join(str(f) for f in forward))
    head = [tr("Chapter", language=language), tr("Imports these earlier chapters itself", language=language)]
    rows = [f"| {head[0]} | {head[1]} |", "|---|---|"]
    for ch in graph.chapters:
        uses = ", ".join(f"{d.label} `{d.id}`" for d in graph.direct(ch)) or "—"
        rows.append(f"| {ch.label} `{ch.id}` | {uses} |")
    return rows


# ---------------------------------------------------------------- the hook


def page_language(src_uri: str) -> str:
    """``X.en.md`` is the English page of ``X.md`` (mkdocs-static-i18n, suffix structure)."""
    return "en" if src_uri.endswith(".en.md") else "zh"


def expand(markdown: str, src_uri: str) -> str:
    language = page_language(src_uri)
    out: list[str] = []
    in_fence = False
    for lineno, line in enumerate(markdown.splitlines(), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
        m = None if in_fence else DIRECTIVE.match(line)
        if not m:
            out.append(line)
            continue
        indent, kind, arg = m["indent"], m["kind"], (m["arg"] or "").strip()
        try:
            if kind in ("code", "sig"):
                path, _, symbol = arg.partition("::")
                if kind == "sig" and not symbol:
                    raise DocsError("[[sig ...]] 需要写出符号：路径::符号")
                block = code_block(path.strip(), symbol.strip() or None, signature=kind == "sig", language=language)
            elif kind == "output":
                block = output_block(arg, language)
            elif kind == "serve":
                block = serve_block(arg, language)
            elif kind == "task":
                block = task_block(chapter_of(src_uri), arg, language)
            elif kind == "practice":
                block = practice_block(chapter_of(src_uri), language)
            elif kind == "chapters":
                block = chapters_block(language)
            else:
                raise DocsError(f"不认识的指令 [[{kind} ...]]；可用：code、sig、output、serve、task、practice、chapters")
        except (DocsError, SyntaxError) as err:
            log.error(f"docs/{src_uri}:{lineno}: {err}")
            block = ["!!! failure \"文档引用出错\"", "", f"    {err}"]
        out += ["", *[(indent + b) if b else "" for b in block], ""]
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - mkdocs hook signature
    return expand(markdown, page.file.src_uri)


# A line break inside a Chinese paragraph would show as a space between two characters: drop it (outside <pre>).
_CJK = "\u2e80-\u9fff\u3000-\u303f\uff00-\uffef"
_CJK_BREAK = re.compile(rf"([{_CJK}])\n[ \t]*([{_CJK}])")
_PRE = re.compile(r"(<pre\b.*?</pre>)", re.S)


def on_page_content(html: str, page, config, files) -> str:  # noqa: ANN001 - mkdocs hook signature
    parts = _PRE.split(html)
    return "".join(p if i % 2 else _CJK_BREAK.sub(r"\1\2", p) for i, p in enumerate(parts))


# The i18n plugin links each page to its other-language twin with <link rel="alternate" hreflang>; Material reads such
# links as language roots and fetches "<link>/sitemap.xml" for every page, a 404 each time (console errors, wasted
# requests in an offline book). The language switcher in the header has its own per-page links, so drop these.
_ALTERNATE = re.compile(r'<link rel="alternate" href="[^"]*" hreflang="[a-z]+">\s*')


def on_post_page(html: str, page, config) -> str:  # noqa: ANN001 - mkdocs hook signature
    return _ALTERNATE.sub("", html)
