"""检查的变异测试（tools/mutate.py）：变异器本身的单元测试，外加 CI 大小的一次抽样运行。

完整运行见 tools/mutate.py 的说明（很慢，按章节、按时间预算跑）。
"""

from __future__ import annotations

import ast
import difflib
import subprocess
import sys
import textwrap
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
        lock(xs)
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
        "aug_flip", "return_early", "swap_args",
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


def test_ids_are_stable_when_code_outside_the_block_moves() -> None:
    before = {m.id for m in mutate.generate_mutants(SAMPLE, "demo", "demo.py")}
    shifted = "import os\n\n\n" + SAMPLE.replace("head = xs[0]", "head = xs[0]  # moved\n    _ = 0")
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
