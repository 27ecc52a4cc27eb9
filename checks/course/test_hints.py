"""按需的提示（``python -m minisgl.course hint``）和“目标不说穿解答”的尺子。

- 课程里每个任务：骨架里的目标（中、英各一行）加上两级按需提示，语言各归各位；
- 每个任务的目标点到解答里的标识符不超过一半、每章平均不超过三成（:func:`minisgl.course.hints.restated`）——
  目标要说做成什么样、有哪些现成部件，这些名字免不了（参数、要设的字段、可用的函数），
  一旦把每一步用到的名字都列出来，比例就过了界；
- 尺子本身：照抄解答的目标量出来是 1，只说结果的是 0；
- 在两章的演示课程上：``hint`` 一级一级地给、记在工作区里、第 3 级指向参考解答的行，``status`` 和 ``grade``
  显示一章用了几级，英文下没有中文。
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checks.course.test_machinery import ALPHA, ALPHA_SOLUTION, CJK, course, run  # noqa: F401
from minisgl.course import select
from minisgl.course.hints import restated
from minisgl.course.registry import CHAPTERS
from minisgl.course.skeleton import parse_tasks

TASK_BOUND, CHAPTER_BOUND = 0.5, 0.3
WRITTEN = [ch for ch in CHAPTERS if select.is_written(ch)]


def _tasks(ch):  # noqa: ANN001, ANN202
    source = select.shipped_solution(ch).read_text(encoding="utf-8")
    return source, parse_tasks(source, ch.relpath)


@pytest.mark.parametrize("ch", WRITTEN, ids=lambda ch: ch.id)
def test_every_task_has_a_goal_and_two_levels(ch) -> None:  # noqa: ANN001
    _, tasks = _tasks(ch)
    missing = [t.name for t in tasks if len(t.levels) != 2]
    assert not missing, f"{ch.relpath}: tasks without hint1/en1/hint2/en2 lines: {missing}"
    for t in tasks:
        for level, (zh, en) in enumerate(t.levels, 1):
            assert CJK.search(zh) or zh == en, f"{ch.relpath} {t.name}: hint{level} has no Chinese (and is not code " \
                                               f"shared by both languages): {zh!r}"
            assert not CJK.search(en), f"{ch.relpath} {t.name}: en{level} contains Chinese: {en!r}"


@pytest.mark.parametrize("ch", WRITTEN, ids=lambda ch: ch.id)
def test_goals_do_not_restate_the_solution(ch) -> None:  # noqa: ANN001
    source, tasks = _tasks(ch)
    shares = {t.name: restated(source, t) for t in tasks}
    over = {name: round(v, 2) for name, v in shares.items() if v > TASK_BOUND}
    assert not over, f"{ch.relpath}: these goals name more than {TASK_BOUND:.0%} of their solution's identifiers: {over}"
    mean = sum(shares.values()) / len(shares)
    assert mean <= CHAPTER_BOUND, f"{ch.relpath}: the goals name {mean:.0%} of the solutions' identifiers on average " \
                                  f"(bound {CHAPTER_BOUND:.0%}): {shares}"


def test_the_measure_tells_a_restatement_from_a_goal() -> None:
    code = "def f(self):\n    # >>> TASK t: {zh}\n    # en: {en}\n    return self.device_len - self.cached_len\n    # <<< TASK\n"
    copy = code.format(zh="device_len - cached_len", en="device_len - cached_len")
    goal = code.format(zh="返回这一步要算多少个 token", en="return how many tokens this step computes")
    assert restated(copy, parse_tasks(copy)[0]) == 1.0
    assert restated(goal, parse_tasks(goal)[0]) == 0.0
    half = code.format(zh="用 device_len", en="uses device_len")
    assert restated(half, parse_tasks(half)[0]) == 0.5


def _hint(course: Path, *args: str, env: dict[str, str] | None = None):  # noqa: ANN202
    return run(course, "-m", "minisgl.course", "hint", *args, env=env)


def test_hint_levels_one_at_a_time_and_remembered(course: Path) -> None:  # noqa: F811
    first = _hint(course, "alpha", "double")
    assert first.returncode == 0 and "模块里已经有这个系数" in first.stdout and "目标：返回 x 乘以 FACTOR" in first.stdout, first.stdout
    assert "用 * 乘起来" not in first.stdout, "第 1 级不该带出第 2 级"
    second = _hint(course, "1.1", "double")
    assert "用 * 乘起来\n然后返回" in second.stdout, second.stdout
    line = ALPHA_SOLUTION.splitlines().index("    return x * FACTOR") + 1
    for _ in range(2):  # 第 3 级之后停在第 3 级
        third = _hint(course, "alpha", "double")
        assert f"solutions/stage1/alpha.py 第 {line}–{line} 行（double）" in third.stdout, third.stdout
    saved = json.loads((course / ".minisgl" / "hints.json").read_text(encoding="utf-8"))
    assert saved == {"alpha": {"double": 3}}
    listing = _hint(course, "alpha")
    assert listing.returncode == 0 and "double" in listing.stdout and "3" in listing.stdout, listing.stdout
    status = run(course, "-m", "minisgl.course", "status")
    alpha_row = next(r for r in status.stdout.splitlines() if r.startswith("1.1"))
    assert "提示" in status.stdout.splitlines()[1] and " 3 " in f" {alpha_row} ", status.stdout
    (course / ALPHA.relpath).write_text("def double(x):\n    return 2 * x\n", encoding="utf-8")
    graded = run(course, "-m", "minisgl.course", "grade", "--quiet")
    row = next(r for r in graded.stdout.splitlines() if r.startswith("1.1"))
    assert graded.returncode == 0 and row.split()[-1] == "3" and "通过 1/1" in row, graded.stdout


def test_hint_errors_and_english(course: Path) -> None:  # noqa: F811
    en = {"MINISGL_LANG": "en"}
    bad = _hint(course, "alpha", "triple", env=en)
    assert bad.returncode == 2 and "has no task 'triple'; its tasks: double" in bad.stderr, bad.stderr
    out = _hint(course, "alpha", "double", "--level", "2", env=en)
    assert out.returncode == 0 and "multiply with *" in out.stdout and not CJK.search(out.stdout), out.stdout
    out = _hint(course, "alpha", "double", env=en)  # the next one after the level asked for
    assert "hint 3 (the reference)" in out.stdout and not CJK.search(out.stdout), out.stdout
