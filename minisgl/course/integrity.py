"""评分时的诚信检查：学员文件不能导入参考解答，也不能去读 solutions/ 目录。

两道关：
1. :func:`scan_source` 在运行前静态扫描学员文件（AST）：``import solutions…``、``from solutions…``、
   导入课程机制（``minisgl.course``、``_minisgl_impl``），以及提到 solutions 目录或模块的字符串
   （``open("…/solutions/…")``、``importlib.import_module("solutions.…")``、``exec`` 一段这样的代码……）；
   文档字符串和注释不算。
2. :func:`install_import_guard` 在评分子进程里挂一个导入钩子：任何对 ``solutions`` 包的导入都直接失败，
   所以把模块名拼出来、倒过来写之类的绕法也导入不了。

拦不住的：用拼出来的路径直接读文件。真有这种代码，静态扫描之外还得靠老师看一眼。
"""

from __future__ import annotations

import ast
import importlib.abc
import re
import sys
from pathlib import Path

from minisgl.i18n import tr

#: 学员代码不该导入的模块（前缀匹配）。
FORBIDDEN_MODULES = ("solutions", "_minisgl_impl", "minisgl.course")
#: 例外：生成的骨架用 ``from minisgl.course.skeleton import TaskNotDone`` 标出没写的任务，学员文件里留着它不算违规。
ALLOWED_IMPORTS = {("minisgl.course.skeleton", "TaskNotDone")}

_FORBIDDEN_TEXT = (
    re.compile(r"(?<![\w-])solutions(?=[/\\.]|$)"),  # solutions/…、../solutions、solutions.stage2…、"solutions"
    re.compile(r"\b(?:import|from)\s+solutions\b"),  # exec("from solutions import …")
    re.compile(r"_minisgl_impl|minisgl\.course"),
)


class RefusedError(ImportError):
    """评分拒绝了这份学员文件（导入或读取参考解答）。``complete``：消息已经写明章节（:func:`refusal_message`）。"""

    def __init__(self, message: str, *, name: str | None = None, complete: bool = False) -> None:
        super().__init__(message, name=name)
        self.complete = complete


def _forbidden_module(name: str) -> str | None:
    for prefix in FORBIDDEN_MODULES:
        if name == prefix or name.startswith(prefix + "."):
            return prefix
    return None


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                ids.add(id(first.value))
    return ids


def _fold(node: ast.AST) -> str | None:
    """字符串常量，以及常量之间的 ``+`` 拼接（``"sol" + "utions"``）。"""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _fold(node.left), _fold(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def scan_source(source: str, filename: str = "<learner file>") -> list[str]:
    """返回发现的问题（每条一句，带行号）；文件没问题返回空列表。语法错误不在这里报。"""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return []
    docstrings = _docstring_nodes(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _forbidden_module(alias.name):
                    found.append((node.lineno, tr("imports {name}", name=alias.name)))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if all((node.module, a.name) in ALLOWED_IMPORTS for a in node.names):
                continue
            names = [f"{node.module}.{a.name}" for a in node.names]
            if _forbidden_module(node.module) or any(_forbidden_module(n) for n in names):
                found.append((node.lineno, tr("imports from {module}", module=node.module)))
        elif isinstance(node, (ast.Constant, ast.BinOp)) and id(node) not in docstrings:
            text = _fold(node)
            if text is not None and any(p.search(text.replace("\\", "/")) for p in _FORBIDDEN_TEXT):
                shown = text if len(text) <= 40 else text[:37] + "..."
                found.append((node.lineno, tr("the string {shown!r} points to the reference solution or the course machinery",
                                              shown=shown)))  # fmt: skip
    unique = sorted(set(found))
    return [tr("line {line}: {what}", line=line, what=what) for line, what in unique]


def scan_file(path: Path) -> list[str]:
    try:
        return scan_source(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError):
        return []


def refusal_message(label: str, chapter_id: str, relpath: str, problems: list[str]) -> str:
    return tr(
        "Chapter {label} {id}: refused for grading — {relpath} refers to the reference solution or the course machinery "
        "({problems}). Grading counts only code you wrote yourself.",
        label=label, id=chapter_id, relpath=relpath, problems=tr("; ").join(problems),
    )  # fmt: skip


class ImportGuard(importlib.abc.MetaPathFinder):
    """评分子进程里的导入钩子：``solutions`` 包一律导入失败。"""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - importlib protocol
        if fullname == "solutions" or fullname.startswith("solutions."):
            raise RefusedError(tr("While grading, the reference solution {name} cannot be imported: grading counts only "
                                  "code you wrote yourself.", name=fullname), name=fullname)  # fmt: skip
        return None


def install_import_guard() -> None:
    if not any(isinstance(f, ImportGuard) for f in sys.meta_path):
        sys.meta_path.insert(0, ImportGuard())
    for name in [n for n in sys.modules if n == "solutions" or n.startswith("solutions.")]:
        del sys.modules[name]
