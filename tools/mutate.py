"""检查的变异测试：往参考解答的任务区段里植入小错误，看本章的检查能不能把它抓出来。

用法::

    python tools/mutate.py                          # 全部章节、全部变异体（很慢，见 --time-budget）
    python tools/mutate.py core cache_manager       # 只跑这几章
    python tools/mutate.py core --sample 3 --seed 0 # 每章随机抽 3 个（CI 用）
    python tools/mutate.py radix_cache --list       # 只列出变异体，不运行
    python tools/mutate.py --report mutants.md      # 另写一份 Markdown 报告（含每个幸存者的 diff）

完整运行（全部 15 章、约 1480 个变异体；两核机器上一个进程约 4～5 小时，可按阶段分两个进程并行，中断后用 --resume 接着跑）::

    OMP_NUM_THREADS=1 python tools/mutate.py --results mutants.json --resume --report mutants.md

变异只发生在 ``# >>> TASK`` 与 ``# <<< TASK`` 之间（学员要写的代码），算子是：

- ``delete``：一条语句换成 ``pass``（``drop_update``：删掉 ``+=`` / ``-=``；``drop_call``：删掉 lock / unlock /
  free / evict 等调用）；不删 ``assert``——参考解答里的断言永远成立，删掉它与原程序等价；
- ``compare``：``<``↔``>=``、``<=``↔``>``、``==``↔``!=``、``in``↔``not in``、``is``↔``is not``；
- ``boolop``：``and``↔``or``；``not_drop``：去掉一个 ``not``；``bool_const``：``True``↔``False``；
- ``off_by_one``：整数常量 ±1、切片的上下界 ±1；``aug_flip``：``+=``↔``-=``；
- ``return_early``：区段第一条语句前插入 ``return``；``swap_args``：调用里两个相邻的位置参数对调；
- ``drop_conjunct`` / ``drop_disjunct``：复合条件（``a and b and c`` / ``a or b``）去掉一项（断言里的不去：只会更宽）；
- ``drop_guard``：删掉守卫子句（分支以 ``continue`` / ``break`` / ``return`` / ``raise`` 结尾的 ``if``），
  有 ``else`` / ``elif`` 时留下那个分支；
- ``drop_loop_update``：删掉循环体里的一条赋值（``x = …`` / ``x += …``；循环外的仍叫 ``delete`` / ``drop_update``）；
- ``replace_arg``：调用的一个位置参数（一个名字）换成同一函数里、调用之前就有的、同一“种类”的另一个名字。
  种类是粗略、确定的推断：参数的注解，或赋值右边一眼看得出的类型（整数常量、``len(…)``、``torch.…(…)``、
  ``range`` 的循环变量、同种类的算术）；每个参数最多换 ``REPLACE_ARG_LIMIT`` 个（定义位置离调用最近的先换）。

成员与身份测试（``in`` / ``is``）的取反由 ``compare`` 负责。

每个变异体像学员工作区那样运行：临时目录里放上 stage1/、stage2/ 的骨架，本章的学员文件换成变异后的解答，
``MINISGL_WORKSPACE=<临时目录> python -m pytest checks/stageN/test_<章>.py --impl learner -x -q``。
退出码非 0 就算“杀死”；超时也算杀死（报告里标出）。``tools/mutants_equivalent.toml`` 里列出已证明与原程序
等价的变异体（章节、任务、编号、理由），它们不计入比例。

选择库的理由：mutmut 与 cosmic-ray 都以整个文件为单位变异，并用自己的执行器（mutmut 3 把函数改写成蹦床，
cosmic-ray 需要会话数据库与自己的 runner），既不认识任务标记，也没法“把变异体当学员文件放进工作区”；
所以这里用 ``ast`` 加任务区段的行号写一个小变异器。
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import difflib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from minisgl.course.registry import CHAPTERS, Chapter, get_chapter  # noqa: E402
from minisgl.course.select import is_written, shipped_solution, skeleton_source  # noqa: E402
from minisgl.course.skeleton import _BEGIN, _END  # noqa: E402

EQUIVALENT_FILE = REPO / "tools" / "mutants_equivalent.toml"

#: 某些章节的完整检查太慢（要与 Hugging Face 比对大模型），变异体只跑它们的快检查：``-k`` 表达式。
#: 没列出的章节跑整个检查文件。报告与表格里会注明。
FAST_TESTS: dict[str, str] = {}


# ----------------------------------------------------------------------------- 变异器


@dataclass(frozen=True)
class Block:
    task: str
    first: int  # 1-based, first line after the BEGIN marker
    last: int  # 1-based, last line before the END marker


@dataclass
class Mutant:
    chapter: str
    task: str
    op: str
    line: int  # 1-based line in the solution file where the change starts
    description: str
    source: str  # the whole mutated file
    id: str = ""

    def diff(self, original: str, relpath: str) -> str:
        return "".join(
            difflib.unified_diff(
                original.splitlines(True), self.source.splitlines(True), f"a/solutions/{relpath}", f"b/solutions/{relpath}", n=2
            )
        )


def task_blocks(source: str) -> list[Block]:
    """每个任务区段的内容行范围（不含两行标记）。"""
    blocks, open_name, start = [], None, 0
    for lineno, line in enumerate(source.splitlines(), start=1):
        begin = _BEGIN.match(line)
        if begin:
            open_name, start = begin["name"], lineno + 1
        elif _END.match(line) and open_name is not None:
            blocks.append(Block(open_name, start, lineno - 1))
            open_name = None
    return blocks


_COMPARE_FLIP = {
    ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.LtE: ast.Gt, ast.Gt: ast.LtE,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}  # fmt: skip
_RESOURCE_WORDS = ("lock", "unlock", "free", "evict", "release", "allocate", "ref_count", "cache_req", "append", "insert")
_ATOMIC = (ast.Name, ast.Constant, ast.Attribute, ast.Call, ast.Subscript, ast.List, ast.Tuple, ast.Dict, ast.Set)


class _Lines:
    """行列坐标（ast 的 col_offset 是 UTF-8 字节偏移）与字符串下标互换。"""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = source.splitlines(True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col_bytes: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode("utf-8")[:col_bytes].decode("utf-8"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.AST) -> str:
        a, b = self.span(node)
        return self.source[a:b]

    def replace(self, node: ast.AST, text: str) -> str:
        a, b = self.span(node)
        return self.source[:a] + text + self.source[b:]


def _expr_text(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if isinstance(node, _ATOMIC) else f"({text})"


def _call_name(node: ast.AST) -> str:
    if isinstance(node, ast.Expr):
        node = node.value
    if isinstance(node, ast.Call):
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return ""


def _inside(node: ast.AST, block: Block) -> bool:
    return hasattr(node, "lineno") and node.lineno >= block.first and node.end_lineno <= block.last


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


def _in_message(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """f 字符串和 ``tr(...)`` 里的东西只影响消息文字，不变异。"""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.JoinedStr) or (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "tr"
        ):
            return True
    return False


_JUMPS = (ast.Continue, ast.Break, ast.Return, ast.Raise)
_LOOPS = (ast.For, ast.While, ast.AsyncFor)
_LOW_PRECEDENCE = (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr)
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
#: 替换位置参数时，每个参数最多换成几个别的名字（按定义位置由近到远）。
REPLACE_ARG_LIMIT = 2


def _is_guard(node: ast.AST) -> bool:
    """守卫子句：``if …:`` 的分支以 continue / break / return / raise 结尾。"""
    return isinstance(node, ast.If) and isinstance(node.body[-1], _JUMPS)


def _in_loop(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """``node`` 在同一个函数里的某个循环体内（不含循环的条件 / 迭代表达式本身）。"""
    child = node
    while child in parents:
        parent = parents[child]
        if isinstance(parent, _FUNCS):
            return False
        if isinstance(parent, _LOOPS) and child in parent.body:
            return True
        child = parent
    return False


def _in_assert(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Assert):
            return True
    return False


def _enclosing_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


_INT_CALLS = {"len", "int", "sum", "round", "abs"}
_KIND_OF_ANNOTATION = {"torch.Tensor": "tensor", "Tensor": "tensor"}


def _value_kind(value: ast.AST, kinds: dict[str, str]) -> str | None:
    """一个表达式的“种类”（int / bool / float / str / tensor / 注解原文），看不出来就是 None。粗略、确定。"""
    if isinstance(value, ast.Constant) and type(value.value) in (int, bool, float, str):
        return type(value.value).__name__
    if isinstance(value, ast.Name):
        return kinds.get(value.id)
    if isinstance(value, ast.Call):
        f = value.func
        if isinstance(f, ast.Name) and f.id in _INT_CALLS:
            return "int"
        if isinstance(f, ast.Name) and f.id in ("min", "max") and value.args:
            found = {_value_kind(a, kinds) for a in value.args}
            return found.pop() if len(found) == 1 else None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "torch":
            return "tensor"
        return None
    if isinstance(value, ast.BinOp):
        left, right = _value_kind(value.left, kinds), _value_kind(value.right, kinds)
        if isinstance(value.op, ast.Div):
            return None
        if left == right or right is None:
            return left
        if left is None:
            return right
        return None
    return None


def _scope_names(func: ast.AST) -> dict[str, tuple[str, int]]:
    """函数里的局部名字 → (种类, 第一次出现的行)：带注解的参数、赋值一次就看得出种类的名字、``range`` 的循环变量。

    同一个名字出现两种种类就不要它。``self`` / ``cls`` 不算。
    """
    out: dict[str, tuple[str, int]] = {}
    bad: set[str] = set()

    def note(name: str, kind: str | None, line: int) -> None:
        if kind is None or name in ("self", "cls") or name in bad:
            return
        if name in out and out[name][0] != kind:
            bad.add(name)
            del out[name]
            return
        out.setdefault(name, (kind, line))

    args = func.args
    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
        if a.annotation is not None:
            text = ast.unparse(a.annotation)
            note(a.arg, _KIND_OF_ANNOTATION.get(text, text), func.lineno)
    for node in sorted((n for n in ast.walk(func) if isinstance(n, ast.stmt)), key=lambda n: (n.lineno, n.col_offset)):
        kinds = {k: v[0] for k, v in out.items()}
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            note(node.targets[0].id, _value_kind(node.value, kinds), node.lineno)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            text = ast.unparse(node.annotation)
            note(node.target.id, _KIND_OF_ANNOTATION.get(text, text), node.lineno)
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and _call_name(node.iter) == "range":
            note(node.target.id, "int", node.lineno)
    return out


def generate_mutants(source: str, chapter: str = "?", relpath: str = "?") -> list[Mutant]:
    """参考解答 ``source`` 的全部变异体（只改任务区段里的代码；结果去重，且都能编译）。"""
    tree = ast.parse(source)
    parents = _parents(tree)
    lines = _Lines(source)
    out: list[Mutant] = []
    seen = {source}
    scopes: dict[ast.AST, dict[str, tuple[str, int]]] = {}

    def add(block: Block, op: str, node: ast.AST, text: str, desc: str, new_source: str | None = None) -> None:
        new = new_source if new_source is not None else lines.replace(node, text)
        if new in seen:
            return
        try:
            compile(new, relpath, "exec")
        except SyntaxError:
            return
        seen.add(new)
        original = lines.segment(node)
        key = f"{chapter}|{block.task}|{op}|{original}|{text}"
        out.append(Mutant(chapter, block.task, op, node.lineno, desc, new, key))

    for block in task_blocks(source):
        nodes = [n for n in ast.walk(tree) if _inside(n, block) and not _in_message(n, parents)]
        nodes.sort(key=lambda n: (n.lineno, n.col_offset, -n.end_lineno, -n.end_col_offset))
        stmts = [n for n in nodes if isinstance(n, ast.stmt)]
        # return early: a bare `return` right before the first statement of the block
        if stmts and not isinstance(stmts[0], ast.Return):
            first = stmts[0]
            a = lines.offset(first.lineno, first.col_offset)
            indent = source[lines.starts[first.lineno - 1] : a]
            new = source[:a] + "return\n" + indent + source[a:]
            add(block, "return_early", first, "return", "区段开头直接 return", new)
        for node in nodes:
            seg = lines.segment(node)
            if isinstance(node, ast.stmt) and not isinstance(node, (ast.Pass, ast.Assert)):
                name = _call_name(node)
                if _is_guard(node):
                    op = "drop_guard"
                elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and _in_loop(node, parents):
                    op = "drop_loop_update"
                elif isinstance(node, ast.AugAssign):
                    op = "drop_update"
                elif name and any(w in name.lower() for w in _RESOURCE_WORDS):
                    op = "drop_call"
                else:
                    op = "delete"
                if op == "drop_guard" and node.orelse:
                    # 去掉守卫、保留 else / elif 分支（整段不删）
                    rest = node.orelse[0]
                    a = lines.offset(node.lineno, node.col_offset)
                    if isinstance(rest, ast.If) and len(node.orelse) == 1 and source[lines.offset(rest.lineno, rest.col_offset):].startswith("elif"):
                        b = lines.offset(rest.lineno, rest.col_offset) + 2  # "elif" -> "if"
                        new = source[:a] + source[b:]
                    else:
                        b = lines.offset(node.end_lineno, node.end_col_offset)
                        body = source[lines.starts[rest.lineno - 1] : b]
                        shift = rest.col_offset - node.col_offset
                        dedented = "".join(line[shift:] if line[:shift].strip() == "" else line for line in body.splitlines(True))
                        new = source[:a] + dedented.lstrip() + source[b:]
                    add(block, op, node, "", f"去掉守卫 `{seg.splitlines()[0][:60]}`，只留 else 分支", new)
                else:
                    add(block, op, node, "pass", f"删掉语句 `{seg.splitlines()[0][:60]}`")
            if isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)):
                new = copy.copy(node)
                new.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
                add(block, "aug_flip", node, ast.unparse(new), f"`{seg}` 的 += / -= 对调")
            if isinstance(node, ast.Compare):
                for i, cmp in enumerate(node.ops):
                    if type(cmp) in _COMPARE_FLIP:
                        new = copy.copy(node)
                        new.ops = [*node.ops[:i], _COMPARE_FLIP[type(cmp)](), *node.ops[i + 1 :]]
                        add(block, "compare", node, _expr_text(new), f"`{seg}` 的比较取反")
            if isinstance(node, ast.BoolOp):
                new = copy.copy(node)
                new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
                add(block, "boolop", node, _expr_text(new), f"`{seg}` 的 and / or 对调")
                if not _in_assert(node, parents):  # 断言里少一项只会更宽：参考解答的断言永远成立，等价
                    op = "drop_conjunct" if isinstance(node.op, ast.And) else "drop_disjunct"
                    joiner = " and " if isinstance(node.op, ast.And) else " or "
                    for i, term in enumerate(node.values):
                        rest = [v for j, v in enumerate(node.values) if j != i]
                        parts = [f"({lines.segment(v)})" if isinstance(v, _LOW_PRECEDENCE) else lines.segment(v) for v in rest]
                        text = parts[0] if len(parts) == 1 else joiner.join(parts)
                        add(block, op, node, text, f"`{seg.splitlines()[0][:60]}` 去掉一项 `{lines.segment(term)[:40]}`")
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                add(block, "not_drop", node, _expr_text(node.operand), f"去掉 `{seg}` 的 not")
            if isinstance(node, ast.Constant) and isinstance(node.value, bool):
                add(block, "bool_const", node, str(not node.value), f"`{seg}` 取反")
            elif isinstance(node, ast.Constant) and type(node.value) is int:
                for d in (1, -1):
                    add(block, "off_by_one", node, str(node.value + d), f"常量 {node.value} → {node.value + d}")
            if isinstance(node, ast.Slice):
                for bound in (node.lower, node.upper):
                    if bound is None or isinstance(bound, ast.Constant):
                        continue  # constants are covered above
                    bseg = lines.segment(bound)
                    for d in ("+ 1", "- 1"):
                        add(block, "off_by_one", bound, f"({ast.unparse(bound)} {d})", f"切片边界 `{bseg}` {d}")
            if isinstance(node, ast.Call) and (func := _enclosing_function(node, parents)) is not None:
                scope = scopes.setdefault(func, _scope_names(func))
                for i, arg in enumerate(node.args):
                    if not isinstance(arg, ast.Name) or arg.id not in scope:
                        continue
                    kind = scope[arg.id][0]
                    others = [(line, name) for name, (k, line) in scope.items() if k == kind and name != arg.id and line < node.lineno]
                    for _, name in sorted(others, key=lambda t: (-t[0], t[1]))[:REPLACE_ARG_LIMIT]:
                        new = copy.copy(node)
                        new.args = [*node.args[:i], ast.Name(name, ast.Load()), *node.args[i + 1 :]]
                        add(block, "replace_arg", node, ast.unparse(new), f"`{seg.splitlines()[0][:50]}` 的第 {i + 1} 个参数 {arg.id} → {name}（同为 {kind}）")
            if isinstance(node, ast.Call):
                args = node.args
                for i in range(len(args) - 1):
                    if any(isinstance(a, ast.Starred) for a in args[i : i + 2]):
                        continue
                    if ast.dump(args[i]) == ast.dump(args[i + 1]):
                        continue
                    new = copy.copy(node)
                    new.args = [*args[:i], args[i + 1], args[i], *args[i + 2 :]]
                    add(block, "swap_args", node, ast.unparse(new), f"`{seg.splitlines()[0][:50]}` 的第 {i + 1}、{i + 2} 个参数对调")
    # stable ids: operator + hash of (chapter, task, op, original text, replacement), numbered on collision
    counts: Counter[str] = Counter()
    for m in out:
        digest = hashlib.sha1(m.id.encode("utf-8")).hexdigest()[:8]
        base = f"{m.op}-{digest}"
        counts[base] += 1
        m.id = base if counts[base] == 1 else f"{base}-{counts[base]}"
    return out


#: 手写的变异体：issue 11 里点名的、单点变异凑不出来的错误实现（每条替换都必须在原文里恰好出现一次）。
NAMED_MUTANTS: list[dict] = [
    {
        "chapter": "cache_manager", "task": "check_integrity", "id": "named-count-only",
        "description": "check_integrity 只比较页数（不查锁、重复、页首、范围）",
        "replace": [(
            """        info = self.prefix_cache.size_info
        if info.protected_size != 0:""",
            """        info = self.prefix_cache.size_info
        if len(self.free_slots) + info.total_size // self.page_size != self.num_pages:
            raise RuntimeError("页面对不上账")
        return
        if info.protected_size != 0:""",
        )],
    },
    {
        "chapter": "cache_manager", "task": "cache_req", "id": "named-never-unlock",
        "description": "请求结束时不解锁旧句柄，同时 check_integrity 不查锁",
        "replace": [
            ("""        if finished:
            self.unlock(old_handle)
""", """        if finished:
"""),
            ("""        if info.protected_size != 0:
            raise""", """        if False:
            raise"""),
        ],
    },
    {
        "chapter": "cache_manager", "task": "allocate_paged", "id": "named-no-clip",
        "description": "不裁掉伸出页表宽度的最后一页",
        "replace": [("        keep = cols < width\n", "        keep = cols >= 0\n")],
    },
]  # fmt: skip


def named_mutants(ch: Chapter, source: str) -> list[Mutant]:
    out = []
    for spec in NAMED_MUTANTS:
        if spec["chapter"] != ch.id:
            continue
        new = source
        for old, repl in spec["replace"]:
            if new.count(old) != 1:
                raise SystemExit(f"手写变异体 {spec['id']}：要替换的原文在 {ch.relpath} 里出现了 {new.count(old)} 次（应为 1）")
            new = new.replace(old, repl)
        line = next(i for i, (a, b) in enumerate(zip(source.splitlines(), new.splitlines()), 1) if a != b)
        out.append(Mutant(ch.id, spec["task"], "named", line, spec["description"], new, spec["id"]))
    return out


def chapter_mutants(ch: Chapter, source: str | None = None) -> list[Mutant]:
    if source is None:
        source = shipped_solution(ch).read_text(encoding="utf-8")
    return generate_mutants(source, ch.id, ch.relpath) + named_mutants(ch, source)


# ----------------------------------------------------------------------------- 等价变异体


def load_equivalent(path: Path = EQUIVALENT_FILE) -> dict[tuple[str, str], str]:
    """``(章节, 变异体编号) → 理由``。"""
    if not path.is_file():
        return {}
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return {(e["chapter"], e["id"]): e["reason"] for e in data.get("equivalent", [])}


# ----------------------------------------------------------------------------- 运行


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed | survived | timeout | equivalent
    seconds: float
    detail: str = ""


def make_workspace(root: Path) -> None:
    """一个“全新学员”的工作区：每章都是未动过的骨架。"""
    for ch in CHAPTERS:
        if not is_written(ch):
            continue
        target = root / ch.relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(skeleton_source(ch), encoding="utf-8")
    for stage in {c.stage for c in CHAPTERS}:
        (root / f"stage{stage}" / "__init__.py").touch()


def pytest_command(ch: Chapter, fast: bool) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", ch.check_file, "--impl", "learner", "-x", "-q", "-p", "no:cacheprovider"]
    cmd += ["-p", "no:randomly", "--no-header", "-W", "ignore"]
    if fast and ch.id in FAST_TESTS:
        cmd += ["-k", FAST_TESTS[ch.id]]
    return cmd


def run_one(ch: Chapter, source: str, workspace: Path, timeout: float, fast: bool) -> tuple[str, float, str]:
    """把 ``source`` 当作学员文件跑本章的检查：返回 (killed|survived|timeout, 秒数, 输出末尾)。"""
    learner = workspace / ch.relpath
    learner.write_text(source, encoding="utf-8")
    shutil.rmtree(workspace / ".minisgl", ignore_errors=True)
    env = {**os.environ, "MINISGL_WORKSPACE": str(workspace), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    for key in ("MINISGL_IMPL", "MINISGL_SOLUTIONS", "MINISGL_COURSE_ROOT"):
        env.pop(key, None)
    cmd = pytest_command(ch, fast)
    start = time.monotonic()
    try:
        if _FORK is not None:
            rc, out = _FORK.run(cmd, env, timeout, workspace / "pytest.log")
        else:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
            try:
                out, _ = proc.communicate(timeout=timeout)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate()
                rc = None
    finally:
        learner.write_text(skeleton_source(ch), encoding="utf-8")
    status = "timeout" if rc is None else "killed" if rc != 0 else "survived"
    return status, time.monotonic() - start, (out or "")[-2000:]


class ForkRunner:
    """同样的 pytest 命令，但在一个预先导入了 torch / transformers / pytest 的进程里 fork 出来跑。

    每个变异体省下几秒的启动时间（两核机器上启动占了大头）。子进程里的 pytest 与命令行上的完全一样：
    同样的参数、同样的 ``MINISGL_WORKSPACE``，检查文件和 conftest 都在子进程里重新导入。
    """

    def __init__(self) -> None:
        os.environ["OMP_NUM_THREADS"] = "1"
        import pytest  # noqa: F401
        import torch  # noqa: F401
        import transformers

        _ = transformers.AutoModelForCausalLM, transformers.AutoTokenizer  # resolve the lazy modules now
        import safetensors.torch  # noqa: F401
        import tqdm  # noqa: F401

    def run(self, cmd: list[str], env: dict[str, str], timeout: float, log: Path) -> tuple[int | None, str]:
        pid = os.fork()
        if pid == 0:  # child
            try:
                os.setsid()
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.environ.clear()
                os.environ.update(env)
                os.chdir(REPO)
                import pytest

                sys.argv = cmd[2:]
                rc = int(pytest.main(cmd[3:]))
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:  # noqa: BLE001
                import traceback

                traceback.print_exc()
                rc = 99
            os._exit(rc)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                rc = None
                break
            time.sleep(0.05)
        return rc, log.read_text(encoding="utf-8", errors="replace")


_FORK: ForkRunner | None = None


def sanity_run(ch: Chapter, workspace: Path, timeout: float, fast: bool) -> None:
    """未变异的解答当学员文件必须全部通过，否则“杀死”毫无意义。"""
    status, secs, out = run_one(ch, shipped_solution(ch).read_text(encoding="utf-8"), workspace, timeout, fast)
    if status != "survived":
        raise SystemExit(f"{ch.id}：参考解答本身没有通过检查（{status}，{secs:.0f} 秒），不能做变异测试：\n{out}")


# ----------------------------------------------------------------------------- 报告


@dataclass
class ChapterResult:
    chapter: Chapter
    original: str  # the solution the mutants were made from (diffs are against it)
    outcomes: list[Outcome] = field(default_factory=list)
    total: int = 0  # mutants generated (before sampling)
    fast: bool = False
    unrun: int = 0  # left out by the time budget

    def count(self, *statuses: str) -> int:
        return sum(o.status in statuses for o in self.outcomes)

    @property
    def killed(self) -> int:
        return self.count("killed", "timeout")

    @property
    def non_equivalent(self) -> int:
        return self.count("killed", "timeout", "survived")

    def percent(self) -> float:
        return 100.0 * self.killed / self.non_equivalent if self.non_equivalent else 100.0


def table(results: list[ChapterResult]) -> str:
    rows = ["| 章节 | 杀死 / 非等价 | 比例 | 幸存 | 超时 | 等价 | 已运行 / 生成 | 检查范围 |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        scope = f"快检查（-k {FAST_TESTS[r.chapter.id]}）" if r.fast else "整个检查文件"
        rows.append(
            f"| {r.chapter.label} {r.chapter.id} | {r.killed} / {r.non_equivalent} | {r.percent():.0f}% | "
            f"{r.count('survived')} | {r.count('timeout')} | {r.count('equivalent')} | {len(r.outcomes)} / {r.total} | {scope} |"
        )
    return "\n".join(rows)


def per_task(r: ChapterResult) -> str:
    by_task: dict[str, Counter] = defaultdict(Counter)
    for o in r.outcomes:
        by_task[o.mutant.task][o.status] += 1
    parts = []
    for task, c in by_task.items():
        parts.append(f"{task} {c['killed'] + c['timeout']}/{c['killed'] + c['timeout'] + c['survived']}" + (f"（等价 {c['equivalent']}）" if c["equivalent"] else ""))
    return "、".join(parts)


def markdown_report(results: list[ChapterResult], command: str, wall: float) -> str:
    out = ["# 检查的变异测试报告", "", f"命令：`{command}`，用时 {wall / 60:.1f} 分钟。", "", table(results), ""]
    for r in results:
        out += [f"## {r.chapter.label} {r.chapter.id}", "", f"按任务（杀死/非等价）：{per_task(r)}", ""]
        original = r.original
        for o in r.outcomes:
            if o.status in ("survived", "timeout"):
                m = o.mutant
                out += [f"### {o.status}：{m.task} / `{m.id}`（第 {m.line} 行，{m.description}）", "", "```diff", m.diff(original, r.chapter.relpath).rstrip(), "```", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- 命令行


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*", help="章节 id（默认全部）")
    parser.add_argument("--sample", type=int, default=None, help="每章随机抽这么多个变异体")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget", type=float, default=None, help="总时间预算（秒）：到时不再启动新的变异体")
    parser.add_argument("--timeout", type=float, default=300.0, help="每个变异体的超时（秒），超时算杀死")
    parser.add_argument("--full", action="store_true", help="慢章节也跑整个检查文件（默认只跑 FAST_TESTS 里的快检查）")
    parser.add_argument("--only", nargs="*", default=None, help="只跑这些编号的变异体")
    parser.add_argument("--list", action="store_true", help="只列出变异体，不运行")
    parser.add_argument("--no-sanity", action="store_true", help="跳过“未变异的解答必须通过”这一步")
    parser.add_argument("--runner", choices=("fork", "subprocess"), default="fork",
                        help="fork（默认）：在预先导入好 torch 的进程里 fork 出 pytest；subprocess：每次新起 python -m pytest")
    parser.add_argument("--results", type=Path, default=None,
                        help="每个变异体的结果写进这个 JSON（已有的条目保留，同编号的覆盖）")
    parser.add_argument("--resume", action="store_true",
                        help="与 --results 连用：JSON 里已经杀死的变异体不再运行（检查只会越加越严），只跑幸存的和没跑过的")
    parser.add_argument("--report", type=Path, default=None, help="另写一份 Markdown 报告")
    args = parser.parse_args(argv)

    chapters = [get_chapter(c) for c in args.chapters] if args.chapters else [c for c in CHAPTERS if is_written(c)]
    equivalent = load_equivalent()
    deadline = time.monotonic() + args.time_budget if args.time_budget is not None else None
    started = time.monotonic()
    results: list[ChapterResult] = []
    fast = not args.full
    saved = json.loads(args.results.read_text(encoding="utf-8")) if args.results and args.results.is_file() else {}
    global _FORK
    if args.runner == "fork" and not args.list and hasattr(os, "fork"):
        _FORK = ForkRunner()
    with tempfile.TemporaryDirectory(prefix="minisgl-mutants-") as tmp:
        workspace = Path(tmp)
        make_workspace(workspace)
        for ch in chapters:
            original = shipped_solution(ch).read_text(encoding="utf-8")
            mutants = chapter_mutants(ch, original)
            result = ChapterResult(ch, original, total=len(mutants), fast=fast and ch.id in FAST_TESTS)
            results.append(result)
            if args.only is not None:
                mutants = [m for m in mutants if m.id in args.only]
            if args.sample is not None and args.sample < len(mutants):
                chosen = set(id(m) for m in random.Random(f"{args.seed}:{ch.id}").sample(mutants, args.sample))
                mutants = [m for m in mutants if id(m) in chosen]
            if args.list:
                for m in mutants:
                    tag = "  [等价]" if (ch.id, m.id) in equivalent else ""
                    print(f"{ch.id:<16} {m.task:<22} {m.id:<24} L{m.line:<4} {m.description}{tag}")
                continue
            if not args.no_sanity:
                sanity_run(ch, workspace, args.timeout, fast)
            for i, m in enumerate(mutants, 1):
                if (ch.id, m.id) in equivalent:
                    result.outcomes.append(Outcome(m, "equivalent", 0.0, equivalent[(ch.id, m.id)]))
                    continue
                prev = saved.get(ch.id, {}).get(m.id)
                if args.resume and prev and prev["status"] in ("killed", "timeout"):
                    result.outcomes.append(Outcome(m, prev["status"], prev["seconds"], "（沿用 --results 里的结果）"))
                    continue
                if deadline is not None and time.monotonic() > deadline:
                    result.unrun += 1
                    continue
                status, secs, out = run_one(ch, m.source, workspace, args.timeout, fast)
                result.outcomes.append(Outcome(m, status, secs, out))
                if args.results:
                    saved.setdefault(ch.id, {})[m.id] = {"task": m.task, "status": status, "seconds": round(secs, 1), "line": m.line, "description": m.description}
                    args.results.write_text(json.dumps(saved, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
                mark = {"killed": "杀死", "survived": "幸存", "timeout": "超时(算杀死)"}[status]
                print(f"[{ch.id} {i}/{len(mutants)}] {mark:<8} {secs:5.1f}s {m.task}/{m.id} L{m.line} {m.description}", flush=True)
            survivors = [o for o in result.outcomes if o.status == "survived"]
            for o in survivors:
                print(f"\n--- 幸存：{ch.id} {o.mutant.task}/{o.mutant.id}（{o.mutant.description}）")
                print(o.mutant.diff(original, ch.relpath))
            print(f"{ch.id}：按任务（杀死/非等价）{per_task(result)}" + (f"；预算用完，{result.unrun} 个没跑" if result.unrun else ""), flush=True)
    if args.list:
        return 0
    wall = time.monotonic() - started
    print()
    print(table(results))
    print(f"\n用时 {wall:.0f} 秒")
    if args.report:
        command = "python tools/mutate.py " + " ".join(argv if argv is not None else sys.argv[1:])
        args.report.write_text(markdown_report(results, command, wall), encoding="utf-8")
    return 0 if all(r.count("survived") == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
