"""检查的变异测试（tools/mutate.py）：变异器本身的单元测试，外加 CI 大小的一次抽样运行。

完整运行见 tools/mutate.py 的说明（很慢，按章节、按时间预算跑）。
"""

from __future__ import annotations

import ast
import difflib
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from minisgl.course.registry import CHAPTERS
from minisgl.course.select import is_written, shipped_solution
from minisgl.course.skeleton import make_skeleton

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import mutate  # noqa: E402

WRITTEN = [c for c in CHAPTERS if is_written(c)]

SAMPLE = textwrap.dedent(
    """\
    def f(xs, n, flag):
        head = xs[0]
        # >>> TASK demo: 写点东西
        total = 0
        for i in range(1, n):
            if i < n and not flag:
                total += xs[i:n]
            elif i in xs or flag is None:
                g(total, i)
        lock(xs); total -= 1
        ok = True
        # <<< TASK
        return head + 1
    """
)


def _changed_lines(original: str, mutated: str) -> set[int]:
    """原文里被改动（或在其前插入）的行号，从 1 开始。"""
    a, b = original.splitlines(), mutated.splitlines()
    out: set[int] = set()
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            out.update(range(i1 + 1, max(i2, i1 + 1) + 1))
    return out


def test_sample_source_gets_every_operator() -> None:
    mutants = mutate.generate_mutants(SAMPLE, "demo", "demo.py")
    ops = {m.op for m in mutants}
    assert ops >= {
        "delete", "drop_update", "drop_call", "compare", "boolop", "not_drop", "bool_const", "off_by_one",
        "aug_flip", "return_early", "swap_args", "drop_conjunct", "drop_disjunct", "drop_loop_update", "replace_arg",
    }, f"缺少算子：{ops}"  # fmt: skip
    (block,) = mutate.task_blocks(SAMPLE)
    assert (block.first, block.last) == (4, 11)
    for m in mutants:
        assert _changed_lines(SAMPLE, m.source) <= set(range(block.first, block.last + 1)), f"{m.id} 改到了任务区段外面"
    texts = [m.source for m in mutants]
    assert "head = xs[0]" in SAMPLE and all("head = xs[0]\n" in t and "return head + 1\n" in t for t in texts)


@pytest.mark.parametrize("ch", WRITTEN, ids=[c.id for c in WRITTEN])
def test_mutants_stay_inside_task_blocks_and_compile(ch) -> None:  # noqa: ANN001
    source = shipped_solution(ch).read_text(encoding="utf-8")
    mutants = mutate.chapter_mutants(ch)
    assert len(mutants) >= 10, f"{ch.id} 只生成了 {len(mutants)} 个变异体"
    skeleton = make_skeleton(source, ch)
    ranges = set().union(*(range(b.first, b.last + 1) for b in mutate.task_blocks(source)))
    ids = [m.id for m in mutants]
    assert len(set(ids)) == len(ids), "变异体编号重复"
    for m in mutants:
        assert m.source != source, f"{m.id} 与原文相同"
        ast.parse(m.source)  # 语法正确
        assert make_skeleton(m.source, ch) == skeleton, f"{m.id} 改到了任务区段外面（生成的骨架变了）"
        assert _changed_lines(source, m.source) <= ranges, f"{m.id} 改到了任务区段外面"
    assert len({m.source for m in mutants}) == len(mutants), "有重复的变异体"


LEARNER_SLIPS = textwrap.dedent(
    """\
    def walk(xs: torch.Tensor, n: int, seen: set, limit: int) -> int:
        # >>> TASK demo: 写点东西
        assert n >= 0 and limit >= 0
        total = 0
        start = n - 1
        mask = torch.zeros(n)
        for i in range(start):
            if i in seen:
                continue
            if i > limit or xs is None:
                raise ValueError("x")
            elif i < 0:
                total = -1
            total = total + i
            g(xs, total, mask)
        done = h(n, limit)
        # <<< TASK
        return total
    """
)


def _mutated_lines(op: str) -> list[list[str]]:
    """``op`` 的每个变异体相对原文的 (删掉的行, 加上的行)，行首空白去掉。"""
    out = []
    for m in mutate.generate_mutants(LEARNER_SLIPS, "demo", "demo.py"):
        if m.op != op:
            continue
        diff = list(difflib.unified_diff(LEARNER_SLIPS.splitlines(), m.source.splitlines(), n=0, lineterm=""))[2:]
        out.append([d[0] + d[1:].strip() for d in diff if d[:1] in "+-"])
    return out


def test_drop_one_term_of_a_compound_condition() -> None:
    conj, disj = _mutated_lines("drop_conjunct"), _mutated_lines("drop_disjunct")
    assert conj == [], f"断言里的 and 少一项只会更宽（与原程序等价），不该生成：{conj}"
    assert ["-if i > limit or xs is None:", "+if xs is None:"] in disj, disj
    assert ["-if i > limit or xs is None:", "+if i > limit:"] in disj, disj
    assert len(disj) == 2, disj


def test_remove_a_guard_clause_keeps_the_else_branch() -> None:
    guards = _mutated_lines("drop_guard")
    assert ["-if i in seen:", "-continue", "+pass"] in guards, guards
    assert ["-if i > limit or xs is None:", '-raise ValueError("x")', "-elif i < 0:", "+if i < 0:"] in guards, guards
    assert len(guards) == 2, guards


def test_membership_and_identity_tests_are_inverted() -> None:
    flips = _mutated_lines("compare")
    assert ["-if i in seen:", "+if (i not in seen):"] in flips, flips
    assert ["-if i > limit or xs is None:", "+if i > limit or (xs is not None):"] in flips, flips


def test_delete_an_update_inside_a_loop() -> None:
    loop = _mutated_lines("drop_loop_update")
    assert ["-total = total + i", "+pass"] in loop and ["-total = -1", "+pass"] in loop, loop
    assert len(loop) == 2, f"只有循环体里的赋值算 drop_loop_update（循环外的 total = 0 / start = n - 1 不算）：{loop}"
    outside = _mutated_lines("delete")
    assert ["-total = 0", "+pass"] in outside, outside


def test_replace_a_positional_argument_with_a_name_of_the_same_kind() -> None:
    repl = _mutated_lines("replace_arg")
    assert ["-for i in range(start):", "+for i in range(total):"] in repl, repl
    assert ["-done = h(n, limit)", "+done = h(i, limit)"] in repl, repl
    assert ["-done = h(n, limit)", "+done = h(n, start)"] in repl, repl
    for lines in repl:
        new = lines[-1]
        if new.startswith("+g("):
            a, b, c = new[3:-1].split(", ")
            assert {a, c} <= {"xs", "mask"} and b in {"total", "i", "start", "n", "limit"}, f"张量只能换成张量、int 只能换成 int：{lines}"
        assert "range(i)" not in new, f"循环变量在自己的 range(...) 里还没定义：{lines}"
    mutants = [m for m in mutate.generate_mutants(LEARNER_SLIPS, "demo", "demo.py") if m.op == "replace_arg"]
    per_arg = Counter((m.line, m.description.split(" → ")[0]) for m in mutants)
    assert max(per_arg.values()) == mutate.REPLACE_ARG_LIMIT, per_arg


def test_the_evict_slip_a_learner_made_is_a_mutant() -> None:
    """issue 24 里学员走查发现的那个错误（驱逐时父节点只要是叶子就入堆，不看它是否锁着）现在由 drop_conjunct 生成。"""
    radix = next(c for c in WRITTEN if c.id == "radix_cache")
    slip = "            if not parent.is_root() and parent.is_leaf():\n"
    found = [m.id for m in mutate.chapter_mutants(radix) if m.op == "drop_conjunct" and slip in m.source]
    assert len(found) == 1, f"radix_cache 的 evict 应当恰好有一个去掉 parent.ref_count == 0 的变异体，实际 {found}"


def test_ids_are_stable_when_code_outside_the_block_moves() -> None:
    before = {m.id for m in mutate.generate_mutants(SAMPLE, "demo", "demo.py")}
    shifted = "import os\n\n\n" + SAMPLE.replace("head = xs[0]", "head = xs[0]  # moved\n    print()")
    after = {m.id for m in mutate.generate_mutants(shifted, "demo", "demo.py")}
    assert before == after


def test_equivalent_mutants_file_names_real_mutants() -> None:
    known = {(c.id, m.id) for c in WRITTEN for m in mutate.chapter_mutants(c)}
    for key, reason in mutate.load_equivalent().items():
        assert key in known, f"tools/mutants_equivalent.toml 里的 {key} 已经不存在（解答改过？）"
        assert len(reason) >= 10, f"{key} 的理由太短"


def test_ci_sample_is_all_killed() -> None:
    """CI 大小的抽样：core 章随机 3 个变异体（固定种子），每个都要被本章的检查杀死。"""
    proc = subprocess.run(
        [sys.executable, "tools/mutate.py", "core", "--sample", "3", "--seed", "0", "--timeout", "120"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, f"抽样里有变异体没被杀死：\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    assert "3 / 3" in proc.stdout, proc.stdout[-2000:]
