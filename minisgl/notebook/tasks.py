"""本章的任务清单，以及在笔记本里对学员自己的代码跑本章（或里程碑）的检查。"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

from minisgl.paths import REPO_ROOT

__all__ = ["show_tasks", "run_chapter_checks", "run_milestone_checks"]


def _chapter(chapter_id: str):
    from minisgl.course.registry import get_chapter

    return get_chapter(chapter_id)


def _enclosing(tree: ast.Module, line: int) -> str:
    """标记所在的函数，写成 ``类.方法`` 或 ``函数``。"""
    best = ""

    def visit(node: ast.AST, prefix: str) -> None:
        nonlocal best
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if child.lineno <= line <= (child.end_lineno or child.lineno):
                    if not isinstance(child, ast.ClassDef):
                        best = name
                    visit(child, name + ".")

    visit(tree, "")
    return best


def show_tasks(chapter_id: str) -> None:
    """列出本章要写的任务（与骨架里的 TODO 一一对应），以及笔记本现在用的是哪份实现。"""
    from minisgl.course import select
    from minisgl.course.pytest_plugin import IMPL_NAMES
    from minisgl.course.skeleton import parse_tasks

    ch = _chapter(chapter_id)
    if not select.is_written(ch):
        print(f"第 {ch.label} 章 {ch.id} 的参考解答还没写好。")
        return
    source = select.shipped_solution(ch).read_text(encoding="utf-8")
    tree = ast.parse(source)
    tasks = parse_tasks(source, ch.relpath)
    print(f"第 {ch.label} 章「{ch.title}」：在 {ch.relpath} 里完成 {len(tasks)} 个任务")
    for i, t in enumerate(tasks, 1):
        where = _enclosing(tree, t.line)
        print(f"  {i:>2}. {t.name}（{where}）：{t.hint}")
    choice = select.choose(ch)
    print(f"本笔记本里 {ch.public_module} 用的是：{IMPL_NAMES[choice.impl]}（{choice.reason}）")


def _run(cmd: list[str], tail: int) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "MINISGL_IMPL"}
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    out = (proc.stdout + proc.stderr).rstrip().splitlines()
    if len(out) > tail:
        out = ["……（前面省略）", *out[-tail:]]
    return proc.returncode, "\n".join(out)


def run_chapter_checks(chapter_id: str, tail: int = 40) -> bool:
    """对你自己的代码跑本章的检查（``python -m minisgl.course check <章>``），打印结果并总结。"""
    ch = _chapter(chapter_id)
    print(f"$ python -m minisgl.course check {ch.id}")
    code, text = _run([sys.executable, "-m", "minisgl.course", "check", ch.id], tail)
    print(text)
    row = next((line for line in text.splitlines() if re.match(rf"^{re.escape(ch.label)}\s+{ch.id}\s", line)), "")
    print()
    if "未开始" in row:
        print(f"本章还没开始：{ch.relpath} 仍是骨架。写下第一个任务后再运行这一格。")
        return False
    if code == 0:
        print(f"第 {ch.label} 章 {ch.id}：全部通过 ✔")
        return True
    print(f"第 {ch.label} 章 {ch.id}：还有检查没通过 ✘ —— 看上面的失败信息，对照 {ch.docs_page}。")
    return False


def run_milestone_checks(stage: int, tail: int = 40) -> bool:
    """对当前工作区跑第 ``stage`` 阶段的里程碑检查。"""
    path = f"checks/stage{stage}/test_milestone.py"
    print(f"$ python -m pytest {path} -q")
    code, text = _run([sys.executable, "-m", "pytest", path, "--impl", "learner", "-q"], tail)
    print(text)
    print()
    print(f"第 {stage} 阶段里程碑：{'全部通过 ✔' if code == 0 else '还有检查没通过 ✘'}")
    return code == 0
