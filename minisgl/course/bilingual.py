"""学员读到的代码里，每条中文注释和文档字符串都带英文；讲义按页面语言只显示一种。

约定（任务标记 ``# >>> TASK 名字: 中文`` + ``# en: English`` 的推广）：

- 独占一行的注释：中文注释（可连续几行）之后紧跟同样缩进的 ``# en:`` 行（英文可以写几行，每行都以
  ``# en:`` 开头）；``#:`` 注释同样，英文行写 ``#: en:``；
- 行尾注释：``code  # 中文 | en: English``；
- 文档字符串：先写中文，然后空一行，从以 ``en:`` 开头的那一行起到结尾是英文。

:func:`problems` 找出缺英文的地方（``checks/course/test_english_source.py`` 用它），:func:`for_language`
给出只留一种语言的源码（讲义的代码视图用它）。骨架由解答生成，两种语言原样保留；生成的 TODO 注释和
文件头也是中文一行、英文一行。

en: Every Chinese comment and docstring in the code a learner reads has its English beside it, and the book shows
only the page's language. The convention extends the task markers' (``# >>> TASK name: 中文`` + ``# en: English``):

- a comment on its own line: the Chinese line(s), then line(s) with the same indent starting ``# en:``
  (``#: en:`` after ``#:`` comments);
- a comment at the end of a line: ``code  # 中文 | en: English``;
- a docstring: the Chinese first, then a blank line, and from the line that starts with ``en:`` to the end, English.

:func:`problems` lists what lacks English (used by ``checks/course/test_english_source.py``); :func:`for_language`
gives the source with one language only (used by the book's code views). Skeletons are generated from the solutions
and keep both languages; their generated TODO comments and header are a Chinese line followed by an English one.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

from minisgl.i18n import CJK

#: An English twin line: ``# en: ...`` or ``#: en: ...``.
EN_LINE = re.compile(r"^(?P<indent>[ \t]*)(?P<mark>#:?)[ \t]*en:[ \t]?(?P<text>.*)$")
#: A task's on-request hint line (``# hint1:`` / ``# en1:`` / ``# hint2:`` / ``# en2:``, see minisgl/course/skeleton.py):
#: the ``enN`` lines are the English of the ``hintN`` lines (a walkthrough line may be code only, so they are paired
#: by key, not by the Chinese-run rule; checks/course/test_hints.py checks both languages); code views leave all of
#: them out (the book folds the levels under the task instead).
LEVEL_LINE = re.compile(r"^[ \t]*# (?P<key>hint|en)[12]:")
#: A comment line on its own (group ``mark`` is ``#`` or ``#:``).
COMMENT_LINE = re.compile(r"^(?P<indent>[ \t]*)(?P<mark>#:?)(?P<text>.*)$")
#: A task marker with its Chinese hint (the English one is the ``# en:`` line after it).
TASK_BEGIN = re.compile(r"^(?P<head>[ \t]*# >>> TASK [A-Za-z_][A-Za-z0-9_.]*\s*[:\uff1a]\s*)(?P<hint>\S.*?)\s*$")
#: The English line a generated skeleton writes after its Chinese twin (TODO comments and the file header).
GENERATED_EN = re.compile(r"^[ \t]*# (TODO task |This file is generated |Each TODO states the goal)")
#: The separator of a bilingual comment at the end of a line: ``# 中文 | en: English``.
TRAILING_EN = re.compile(r"[ \t]*\|[ \t]*en:[ \t]*")
#: The first line of a docstring's English part.
DOC_EN = re.compile(r"^(?P<indent>[ \t]*)en:[ \t]?(?P<text>.*)$")
_OPENING = re.compile(r"^(?P<head>[ \t]*[rRuU]?(?P<quote>\"\"\"|'''))")


def _comments(source: str) -> dict[int, tuple[int, str]]:
    """Line number (1-based) -> (column, text) of every comment token."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = (tok.start[1], tok.string)
    return out


def _docstrings(tree: ast.AST) -> list[ast.Constant]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.append(first.value)
    return out


def _is_english_twin(line: str, indent: str) -> bool:
    m = EN_LINE.match(line)
    if m:
        return m["indent"] == indent
    return bool(GENERATED_EN.match(line)) and not CJK.search(line) and COMMENT_LINE.match(line)["indent"] == indent


def _split_doc(value: str) -> tuple[str, str] | None:
    """(Chinese part, English part) of a docstring's text, None without an ``en:`` line after its first line."""
    lines = value.split("\n")
    for i, line in enumerate(lines[1:], start=1):
        m = DOC_EN.match(line)
        if m:
            return "\n".join(lines[:i]), "\n".join([m["text"], *lines[i + 1 :]])
    return None


def _run(lines: list[str], comments: dict[int, tuple[int, str]], i: int, indent: str) -> tuple[int, int]:
    """The run of Chinese own-line comments starting at index ``i``: (index after its last line, index after the
    English lines that follow it)."""
    end = i + 1
    while end < len(lines) and end + 1 in comments and CJK.search(lines[end]) and not EN_LINE.match(lines[end]) \
            and (m := COMMENT_LINE.match(lines[end])) and m["indent"] == indent:
        end += 1
    en_end = end
    while en_end < len(lines) and _is_english_twin(lines[en_end], indent):
        en_end += 1
    return end, en_end


def problems(source: str, origin: str = "<source>") -> list[str]:
    """Where a Chinese comment or docstring of ``source`` has no English counterpart (empty when all do)."""
    found: list[str] = []
    lines = source.splitlines()
    comments = _comments(source)
    for lineno, (col, text) in sorted(comments.items()):
        line = lines[lineno - 1]
        own = not line[:col].strip()
        where = f"{origin}:{lineno}"
        if own and (level := LEVEL_LINE.match(line)):
            if level["key"] == "en" and CJK.search(line):
                found.append(f"{where}: the English hint line has Chinese in it: {line.strip()[:80]!r}")
            continue
        if own and EN_LINE.match(line):
            if CJK.search(line):
                found.append(f"{where}: the English line has Chinese in it: {line.strip()[:80]!r}")
            continue
        if not CJK.search(text):
            continue
        if not own:
            sep = TRAILING_EN.search(text)
            en = text[sep.end():] if sep else ""
            if not en.strip():
                found.append(f"{where}: a Chinese comment at the end of the line needs its English: "
                             f"'# (Chinese) | en: English': {text[:80]!r}")
            elif CJK.search(en) or not CJK.search(text[: sep.start()]):
                found.append(f"{where}: Chinese first, then ' | en: ' and English: {text[:80]!r}")
            continue
        # a Chinese comment on its own line: the run of Chinese comment lines it belongs to is followed by English
        end, en_end = _run(lines, comments, lineno - 1, COMMENT_LINE.match(line)["indent"])
        if en_end == end:
            found.append(f"{where}: a Chinese comment needs an English line after it, same indent: '# en: ...': "
                         f"{line.strip()[:80]!r}")
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return [*found, f"{origin}: {err}"]
    for doc in _docstrings(tree):
        if not CJK.search(doc.value):
            continue
        parts = _split_doc(doc.value)
        where = f"{origin}:{doc.lineno}"
        head = doc.value.strip().splitlines()[0][:60]
        if parts is None:
            found.append(f"{where}: a Chinese docstring needs its English after it, from a line starting 'en:': {head!r}")
        elif CJK.search(parts[1]):
            found.append(f"{where}: the English part of the docstring has Chinese in it: {head!r}")
        elif not parts[1].strip():
            found.append(f"{where}: the English part of the docstring is empty: {head!r}")
    return found


def _doc_lines(lines: list[str], doc: ast.Constant, language: str) -> list[str] | None:
    """The docstring's source lines in one language, None when it is not bilingual (left as it is)."""
    first, last = doc.lineno - 1, doc.end_lineno - 1
    opening = _OPENING.match(lines[first])
    if opening is None:
        return None
    head, quote = opening["head"], opening["quote"]
    body = [lines[first][len(head):], *lines[first + 1 : last + 1]]
    if not body[-1].rstrip().endswith(quote):
        return None
    body[-1] = body[-1].rstrip()[: -len(quote)]
    split = next((i for i, line in enumerate(body) if i > 0 and DOC_EN.match(line)), None)
    if split is None:
        return None
    if language == "en":
        m = DOC_EN.match(body[split])
        part = [m["text"], *body[split + 1 :]]
    else:
        part = body[:split]
    while len(part) > 1 and not part[-1].strip():
        part.pop()
    indent = re.match(r"[ \t]*", lines[first]).group(0)
    if len(part) == 1:
        return [head + part[0].rstrip() + quote]
    return [head + part[0], *part[1:], indent + quote]


def for_language(source: str, language: str) -> str:
    """``source`` with its comments and docstrings in one language (``zh`` or ``en``); code is untouched.

    Bilingual pieces become one language; a task marker keeps its goal in that language and loses its hint levels;
    anything that is not in the convention's shape is left as it is."""
    lines = source.splitlines()
    out: list[str | list[str] | None] = list(lines)
    comments = _comments(source)
    done: set[int] = set()
    for lineno, (col, text) in sorted(comments.items()):
        i = lineno - 1
        line = lines[i]
        if i in done:
            continue
        if LEVEL_LINE.match(line):
            out[i] = None
            continue
        if line[:col].strip():  # at the end of a line of code
            sep = TRAILING_EN.search(text)
            if sep and CJK.search(text[: sep.start()]):
                if language == "en":
                    out[i] = line[:col] + ("#: " if text.startswith("#:") else "# ") + text[sep.end():].strip()
                else:
                    out[i] = line[:col] + text[: sep.start()].rstrip()
            continue
        if EN_LINE.match(line) or not CJK.search(text):
            continue
        m = COMMENT_LINE.match(line)
        end, en_end = _run(lines, comments, i, m["indent"])
        done.update(range(i, en_end))
        if en_end == end:
            continue  # no English twin: leave it
        if language == "en":
            for j in range(i, end):
                out[j] = None
            for j in range(end, en_end):
                en = EN_LINE.match(lines[j])
                if en is None:  # a generated English line
                    continue
                task = TASK_BEGIN.match(lines[i]) if j == end and end == i + 1 else None
                out[j] = task["head"] + en["text"] if task else f"{en['indent']}{en['mark']} {en['text']}"
        else:
            for j in range(end, en_end):
                out[j] = None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    if tree is not None:
        for doc in _docstrings(tree):
            replaced = _doc_lines(lines, doc, language) if CJK.search(doc.value) else None
            if replaced is None:
                continue
            out[doc.lineno - 1] = replaced
            for j in range(doc.lineno, doc.end_lineno):
                out[j] = None
    flat: list[str] = []
    for item in out:
        if isinstance(item, list):
            flat += item
        elif item is not None:
            flat.append(item)
    return "\n".join(flat) + ("\n" if source.endswith("\n") else "")
