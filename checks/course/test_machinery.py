"""课程机制的检查：在一个只有两章（alpha、beta）的演示课程上验证选择规则、骨架生成、
漂移检测，以及 pytest 插件的各种模式（含 --expect-red 真能抓住空检查），中文（默认）和英文（MINISGL_LANG=en）。"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from minisgl.course.registry import Chapter, chapters_json
from minisgl.course.skeleton import MarkerError, TaskNotDone, make_skeleton, parse_tasks
from minisgl.i18n import CJK
from minisgl.paths import REPO_ROOT

ALPHA = Chapter("alpha", 1, 1, "演示章节一", "Demo chapter one")
BETA = Chapter("beta", 1, 2, "演示章节二", "Demo chapter two")

ALPHA_SOLUTION = textwrap.dedent('''
    """演示：一个要学员写的函数。

    en: Demo: a function the learner writes.
    """

    FACTOR = 2


    def double(x: int) -> int:
        """返回 2x。

        en: Returns 2x.
        """
        # >>> TASK double: 返回 x 乘以 FACTOR
        # en: return x times FACTOR
        # hint1: 模块里已经有这个系数
        # en1: the module defines the factor already
        # hint2: 用 * 乘起来
        # hint2: 然后返回
        # en2: multiply with *
        # en2: then return it
        return x * FACTOR
        # <<< TASK
''').lstrip()

BETA_SOLUTION = textwrap.dedent('''
    """演示：依赖上一章，只经由公共命名空间导入。

    en: Demo: uses the chapter before, imported through the public namespace only.
    """

    from minisgl.alpha import double


    def quadruple(x: int) -> int:
        # >>> TASK quadruple: 调用两次 double
        # en: call double twice
        return double(double(x))
        # <<< TASK
''').lstrip()

CHECKS = {
    "test_alpha.py": "from minisgl.alpha import double\n\n\ndef test_double():\n    assert double(3) == 6, 'double(3) should be 6'\n",
    "test_beta.py": "from minisgl.beta import quadruple\n\n\ndef test_quadruple():\n    assert quadruple(3) == 12\n",
}
VACUOUS = "\n\ndef test_vacuous():\n    assert 1 + 1 == 2\n"


@pytest.fixture()
def course(tmp_path: Path) -> Path:
    """一个完整的小课程：章节表、解答、生成的骨架、检查和启用插件的 conftest。"""
    root = tmp_path / "course"
    (root / "solutions" / "stage1").mkdir(parents=True)
    (root / "stage1").mkdir()
    (root / "checks" / "stage1").mkdir(parents=True)
    (root / "chapters.json").write_text(chapters_json((ALPHA, BETA)), encoding="utf-8")
    for ch, src in ((ALPHA, ALPHA_SOLUTION), (BETA, BETA_SOLUTION)):
        (root / "solutions" / ch.relpath).write_text(src, encoding="utf-8")
        (root / ch.relpath).write_text(make_skeleton(src, ch), encoding="utf-8")
    for name, src in CHECKS.items():
        (root / "checks" / "stage1" / name).write_text(src, encoding="utf-8")
    (root / "conftest.py").write_text('pytest_plugins = ["minisgl.course.pytest_plugin"]\n', encoding="utf-8")
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n", encoding="utf-8")
    return root


def run(course: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MINISGL_")}
    # the demo course needs only the course plugin (its conftest loads it); skipping the other installed
    # plugins makes each pytest start in about a second instead of ten
    full_env.update({"MINISGL_COURSE_ROOT": str(course), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **(env or {})})
    return subprocess.run([sys.executable, *args], cwd=course, env=full_env, capture_output=True, text=True, timeout=120)


def chosen(course: Path, chapter: str = "alpha", env: dict[str, str] | None = None) -> str:
    code = f"import minisgl.{chapter} as m; print(m.__name__.split('.')[1])"
    out = run(course, "-c", code, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def pytest_run(course: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run(course, "-m", "pytest", "checks", *args, env=env)


# --- skeleton generator -------------------------------------------------------------------


def test_skeleton_replaces_only_the_task_region():
    skel = make_skeleton(ALPHA_SOLUTION, ALPHA)
    assert "return x * FACTOR" not in skel, "任务区段里的解答代码不应留在骨架里"
    assert "FACTOR = 2" in skel and 'def double(x: int) -> int:\n    """返回 2x。\n' in skel, "任务外的代码应原样保留"
    todo = (
        "    # TODO 任务 double：返回 x 乘以 FACTOR\n"
        "    # TODO task double: return x times FACTOR\n"
        '    raise TaskNotDone("alpha", "double")\n'
    )
    assert todo in skel, "应保持缩进，写出中英两行 TODO 和 raise TaskNotDone(章, 任务)"
    assert "from minisgl.course.skeleton import TaskNotDone\n" in skel, "骨架应导入 TaskNotDone"
    assert "模块里已经有这个系数" not in skel and "multiply" not in skel, "按需的两级提示不进骨架"
    assert make_skeleton(ALPHA_SOLUTION, ALPHA) == skel, "骨架与语言无关、可重复生成"
    namespace: dict = {}
    exec(compile(skel, "<skeleton>", "exec"), namespace)
    with pytest.raises(NotImplementedError) as err:
        namespace["double"](1)
    assert isinstance(err.value, TaskNotDone) and "double" in str(err.value)


@pytest.mark.parametrize(
    ("lang", "parts"),
    [
        (None, ("第 1.1 章", "alpha", "「double」", "docs/stage1/alpha.md#double", "目标：返回 x 乘以 FACTOR",
                "python -m minisgl.course hint alpha double")),
        ("en", ("Chapter 1.1 alpha", "'double'", "docs/stage1/alpha.md#double", "Goal: return x times FACTOR",
                "python -m minisgl.course hint alpha double")),
    ],
)
def test_task_not_done_message_follows_the_language(course: Path, lang: str | None, parts: tuple[str, ...]):
    """骨架的 TaskNotDone 在抛出时按当前语言写消息：章节、任务、文档锚点和提示（从解答的标记里查）。"""
    env = {"MINISGL_IMPL": "skeleton", **({"MINISGL_LANG": lang} if lang else {})}
    code = "import minisgl.alpha as m\ntry:\n    m.double(1)\nexcept NotImplementedError as e:\n    print(type(e).__name__, e)"
    out = run(course, "-c", code, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("TaskNotDone "), out.stdout
    for part in parts:
        assert part in out.stdout, f"TaskNotDone 的消息应包含 {part!r}：{out.stdout}"
    if lang == "en":
        assert not CJK.search(out.stdout), out.stdout


def _markers(name: str = "a", hint: str = "x", en: str | None = "# en: x") -> str:
    return f"# >>> TASK {name}: {hint}\n" + (f"{en}\n" if en is not None else "")


@pytest.mark.parametrize(
    "source",
    [
        _markers("a") + _markers("b") + "# <<< TASK\n# <<< TASK\n",  # nested
        _markers("a") + "pass\n",  # not closed
        "pass\n# <<< TASK\n",  # stray end
        _markers("a") + "# <<< TASK\n" + _markers("a") + "# <<< TASK\n",  # duplicate name
        "# >>> TASK a\n# en: x\n# <<< TASK\n",  # no hint
        _markers(en=None) + "pass\n# <<< TASK\n",  # no English hint
        _markers(en="# en:") + "# <<< TASK\n",  # empty English hint
        _markers(en="# en: 返回 x") + "# <<< TASK\n",  # the English hint is Chinese
        "def f():\n    # >>> TASK a: x\n# en: x\n    pass\n    # <<< TASK\n",  # English hint not indented like the marker
    ],
)
def test_bad_markers_are_rejected(source: str):
    with pytest.raises(MarkerError):
        parse_tasks(source)


def test_tasks_are_listed_in_order():
    tasks = parse_tasks(ALPHA_SOLUTION + BETA_SOLUTION)
    assert [t.name for t in tasks] == ["double", "quadruple"]
    assert [(t.hint, t.hint_en) for t in tasks] == [("返回 x 乘以 FACTOR", "return x times FACTOR"), ("调用两次 double", "call double twice")]
    assert tasks[0].levels == (("模块里已经有这个系数", "the module defines the factor already"),
                               ("用 * 乘起来\n然后返回", "multiply with *\nthen return it")), "连写的同一个键接成几行"
    assert tasks[1].levels == () and tasks[1].level_for(1) == "", "没写两级提示的任务没有提示（由检查报出来）"


# --- selection rule ---------------------------------------------------------------------------


def test_selection_rule(course: Path):
    assert chosen(course) == "solution", "新克隆：学员文件等于骨架，应使用参考解答"
    learner = course / ALPHA.relpath
    learner.write_text(learner.read_text(encoding="utf-8") + "\n# 我开始写了\n", encoding="utf-8")
    assert chosen(course) == "learner", "学员改过文件后应使用学员代码"
    assert chosen(course, env={"MINISGL_IMPL": "alpha=solution"}) == "solution", "环境变量可强制用解答"
    assert chosen(course, env={"MINISGL_IMPL": "skeleton"}) == "skeleton"
    assert run(course, "-m", "minisgl.course", "use", "solution", "alpha").returncode == 0
    assert chosen(course) == "solution", "course use 保存的选择应生效"
    assert chosen(course, env={"MINISGL_IMPL": "alpha=learner"}) == "learner", "环境变量优先于保存的选择"
    assert run(course, "-m", "minisgl.course", "use", "auto", "all").returncode == 0
    assert chosen(course) == "learner"
    assert chosen(course, "beta") == "solution", "没动过的章节仍用解答"


def test_alternative_solutions_directory(course: Path, tmp_path: Path):
    alt = tmp_path / "teacher" / "stage1"
    alt.mkdir(parents=True)
    (alt / "alpha.py").write_text("def double(x):\n    return x + x  # 教师版\n", encoding="utf-8")
    code = "import inspect, minisgl.alpha as m; print('教师版' in inspect.getsource(m))"
    out = run(course, "-c", code, env={"MINISGL_SOLUTIONS": str(tmp_path / "teacher")})
    assert out.stdout.strip() == "True", "MINISGL_SOLUTIONS 应指向教师自己的解答目录：" + out.stderr


def test_bad_impl_spec_is_a_clear_error(course: Path):
    out = run(course, "-c", "import minisgl.alpha", env={"MINISGL_IMPL": "gamma=solution"})
    assert out.returncode != 0 and "gamma" in out.stderr and "已知章节" in out.stderr


# --- drift detection ----------------------------------------------------------------------------


def test_drift_detection(course: Path):
    tool = str(REPO_ROOT / "tools" / "make_skeletons.py")
    assert run(course, tool, "--check").returncode == 0, "骨架与解答一致时不应报漂移"
    sol = course / "solutions" / ALPHA.relpath
    sol.write_text(sol.read_text(encoding="utf-8").replace("返回 x 乘以 FACTOR", "新的提示"), encoding="utf-8")
    out = run(course, tool, "--check")
    assert out.returncode == 1 and ALPHA.relpath in out.stdout, "改了解答而没重新生成骨架，应报漂移"
    assert run(course, tool).returncode == 0
    assert run(course, tool, "--check").returncode == 0, "重新生成后应一致"
    assert "新的提示" in (course / ALPHA.relpath).read_text(encoding="utf-8")


# --- pytest plugin modes --------------------------------------------------------------------


def test_solution_strict_passes_and_header_names_impls(course: Path):
    out = pytest_run(course, "--impl", "solution", "--strict")
    assert out.returncode == 0, out.stdout
    assert "alpha" in out.stdout and "参考解答" in out.stdout, "表头应写明每章用的实现"


def test_expect_red_accepts_real_checks(course: Path):
    out = pytest_run(course, "--impl", "skeleton", "--expect-red")
    assert out.returncode == 0, "两个检查都在骨架上失败，--expect-red 应通过：\n" + out.stdout


def test_expect_red_catches_a_vacuous_check(course: Path):
    check = course / "checks" / "stage1" / "test_beta.py"
    check.write_text(check.read_text(encoding="utf-8") + VACUOUS, encoding="utf-8")
    out = pytest_run(course, "--impl", "skeleton", "--expect-red")
    assert out.returncode != 0, "空检查在骨架上通过了，--expect-red 必须失败"
    assert "test_vacuous" in out.stdout and "空检查" in out.stdout


def test_unstarted_chapters_are_skipped_loudly_and_strict_refuses(course: Path):
    out = pytest_run(course)
    assert out.returncode == 0 and "未开始" in out.stdout and "2 skipped" in out.stdout, out.stdout
    assert pytest_run(course, "--strict").returncode != 0, "--strict 下跳过应算失败"


def test_one_broken_chapter_does_not_break_the_next(course: Path):
    (course / ALPHA.relpath).write_text("def double(x):\n    return x * 3\n", encoding="utf-8")  # wrong
    (course / BETA.relpath).write_text(BETA_SOLUTION, encoding="utf-8")  # right
    out = pytest_run(course, "-rA")
    assert out.returncode != 0
    assert "FAILED checks/stage1/test_alpha.py" in out.stdout, "学员写错的 alpha 应失败"
    assert "PASSED checks/stage1/test_beta.py" in out.stdout, "beta 的检查应使用 alpha 的参考解答，不受影响"


def test_leave_one_out(course: Path):
    out = pytest_run(course, "--leave-one-out", "alpha", "-rA")
    assert out.returncode == 0, "只把 alpha 换回骨架：alpha 应红（按预期），beta 应绿\n" + out.stdout
    assert "PASSED checks/stage1/test_beta.py" in out.stdout


def test_plugin_speaks_english(course: Path):
    """MINISGL_LANG=en：表头、各章结果、未开始的章节、骨架的提示都是英文，整个输出没有中文。"""
    en = {"MINISGL_LANG": "en"}
    out = pytest_run(course, "--impl", "skeleton", "--expect-red", env=en)
    assert out.returncode == 0, out.stdout
    assert "mini-sglang by hand checks (--impl skeleton --expect-red)" in out.stdout, out.stdout
    assert "Results per chapter" in out.stdout and "passed 1/1 (skeleton)" in out.stdout, out.stdout
    assert not CJK.search(out.stdout + out.stderr), out.stdout
    out = pytest_run(course, env=en)
    assert "Chapters not started (checks skipped)" in out.stdout and "stage1/alpha.py is still the skeleton" in out.stdout
    assert "reference solution (learner file: not started)" in out.stdout and not CJK.search(out.stdout), out.stdout
    # a red skeleton without --tb: short tracebacks (a long one would print the Chinese TODO comment), English hint
    out = pytest_run(course, "--impl", "skeleton", env=en)
    assert out.returncode == 1 and "Goal: return x times FACTOR" in out.stdout, out.stdout
    assert 'raise TaskNotDone("alpha", "double")' in out.stdout and not CJK.search(out.stdout), out.stdout
    out = pytest_run(course, "--help", env=en)
    assert "every check must fail on the skeleton" in out.stdout, out.stdout


XDIST = ("-p", "xdist", "-n", "2")  # the demo runs with plugin autoload off
MILESTONE = "from minisgl.beta import quadruple\n\n\ndef test_red():\n    assert quadruple(3) == 12\n\n\ndef test_green():\n    pass\n"


def test_modes_hold_under_xdist(course: Path):
    """``make test`` runs the checks with pytest-xdist: the workers' counts reach the controller, which judges
    --expect-red (each chapter check, a milestone file red on at least one worker) and --strict, and prints the summary."""
    (course / "checks" / "stage1" / "test_milestone.py").write_text(MILESTONE, encoding="utf-8")
    out = pytest_run(course, *XDIST, "--impl", "skeleton", "--expect-red")
    assert out.returncode == 0 and "通过 1/1" in out.stdout and "通过 2/2" in out.stdout, out.stdout
    out = pytest_run(course, *XDIST, "--impl", "solution", "--strict")
    assert out.returncode == 0 and "各章结果" in out.stdout, out.stdout
    assert pytest_run(course, *XDIST, "--strict").returncode != 0, "--strict under -n: skipped checks must fail the run"
    (course / "checks" / "stage1" / "test_milestone.py").write_text("def test_green():\n    pass\n", encoding="utf-8")
    check = course / "checks" / "stage1" / "test_beta.py"
    check.write_text(check.read_text(encoding="utf-8") + VACUOUS, encoding="utf-8")
    out = pytest_run(course, *XDIST, "--impl", "skeleton", "--expect-red")
    assert out.returncode != 0 and "test_vacuous" in out.stdout, out.stdout
    assert "这些里程碑检查在骨架上没有一个失败" in out.stdout, "a milestone green on every worker must be reported\n" + out.stdout


def test_worker_results_merge():
    """The controller adds the workers' counts; a milestone file is red when any worker saw it red."""
    from minisgl.course.pytest_plugin import Plan

    plan = Plan(impl="skeleton", expect_red=True, leave_one_out=None, strict=False)
    plan.merge({"results": {"alpha": {"passed": 2}}, "records": {"alpha": {"impl": "skeleton"}},
                "red_files": {"m.py": False, "n.py": False}, "not_started": []})
    plan.merge({"results": {"alpha": {"passed": 1, "failed": 1}}, "records": {},
                "red_files": {"m.py": True}, "not_started": ["x"]})
    assert plan.results["alpha"] == {"passed": 3, "failed": 1} and plan.records["alpha"] == {"impl": "skeleton"}
    assert plan.red_files == {"m.py": True, "n.py": False} and plan.not_started == {"x"}
    worker = Plan(impl="skeleton", expect_red=True, leave_one_out=None, strict=False)
    worker.merge(plan.shared())
    assert worker.shared() == plan.shared(), "what a worker shares must merge back unchanged"


# --- command line -----------------------------------------------------------------------------


def test_cli_status_reset_and_grade(course: Path):
    out = run(course, "-m", "minisgl.course", "status")
    assert out.returncode == 0 and "alpha" in out.stdout and "参考解答" in out.stdout, out.stderr
    learner = course / ALPHA.relpath
    learner.write_text("def double(x):\n    return 2 * x\n", encoding="utf-8")
    refused = run(course, "-m", "minisgl.course", "reset", "alpha")
    assert refused.returncode == 1 and "--force" in refused.stdout, "有改动时重置应拒绝"
    assert "return 2 * x" in learner.read_text(encoding="utf-8"), "拒绝重置时不能动学员文件"
    graded = run(course, "-m", "minisgl.course", "grade", "--quiet")
    assert graded.returncode == 0 and "通过 1/1" in graded.stdout and "未开始" in graded.stdout, graded.stdout
    status = run(course, "-m", "minisgl.course", "status")
    assert "学员代码" in status.stdout
    forced = run(course, "-m", "minisgl.course", "reset", "alpha", "--force")
    assert forced.returncode == 0 and learner.read_text(encoding="utf-8") == make_skeleton(ALPHA_SOLUTION, ALPHA)


def test_cli_speaks_english(course: Path):
    en = {"MINISGL_LANG": "en"}
    out = run(course, "-m", "minisgl.course", "status", env=en)
    assert out.returncode == 0 and "Demo chapter one" in out.stdout, out.stdout + out.stderr
    assert "reference solution (not started, using the reference solution)" in out.stdout, out.stdout
    lines = out.stdout.splitlines()
    header, rule = lines[1], lines[2]
    assert header.startswith("chapter  id") and rule.startswith("-------  "), "英文表头也要按列对齐：\n" + out.stdout
    for args in (["--help"], ["grade", "--help"], ["use", "solution", "alpha"], ["reset", "beta"], ["use", "auto", "all"]):
        out = run(course, "-m", "minisgl.course", *args, env=en)
        assert out.returncode == 0 and not CJK.search(out.stdout + out.stderr), out.stdout + out.stderr
    bad = run(course, "-m", "minisgl.course", "use", "solution", "gamma", env=en)
    assert bad.returncode == 2 and "known chapters: alpha (1.1), beta (1.2)" in bad.stderr, bad.stderr


def test_one_language_in_the_learners_files(course: Path):
    """``course lang en`` 把学员文件换成只有英文、检查消息和命令随之说英文；学员写的代码换来换去一字不丢；
    没动过的文件还算没开始，reset 给出这种语言的骨架，``lang both`` 还原成发布的样子。"""
    shipped = {ch.id: (course / ch.relpath).read_text(encoding="utf-8") for ch in (ALPHA, BETA)}
    beta = course / BETA.relpath
    mine = "    return double(x) * 2  # my own way\n"
    beta.write_text(shipped["beta"].replace('    raise TaskNotDone("beta", "quadruple")\n', mine), encoding="utf-8")
    out = run(course, "-m", "minisgl.course", "lang", "en")
    assert out.returncode == 0 and not CJK.search(out.stdout), out.stdout + out.stderr
    for ch in (ALPHA, BETA):
        text = (course / ch.relpath).read_text(encoding="utf-8")
        assert not CJK.search(text) and "# en:" not in text, f"{ch.relpath} 里仍有中文或双语行：\n{text}"
    assert mine in beta.read_text(encoding="utf-8"), "换语言丢了学员写的代码"
    status = run(course, "-m", "minisgl.course", "status")
    assert "not started" in status.stdout and "learner code" in status.stdout, status.stdout
    failed = pytest_run(course, "checks/stage1/test_alpha.py", "--impl", "skeleton", "--tb=short")
    assert "Goal: return x times FACTOR" in failed.stdout and not CJK.search(failed.stdout), failed.stdout
    assert run(course, "-m", "minisgl.course", "lang", "zh").returncode == 0
    text = beta.read_text(encoding="utf-8")
    assert mine in text and "调用两次 double" in text and "call double twice" not in text, text
    zh_alpha = (course / ALPHA.relpath).read_text(encoding="utf-8")
    (course / ALPHA.relpath).write_text("changed\n", encoding="utf-8")
    assert run(course, "-m", "minisgl.course", "reset", "alpha", "--force").returncode == 0
    assert (course / ALPHA.relpath).read_text(encoding="utf-8") == zh_alpha, "reset 应给出所选语言的骨架"
    assert run(course, "-m", "minisgl.course", "lang", "both").returncode == 0
    assert (course / ALPHA.relpath).read_text(encoding="utf-8") == shipped["alpha"]
    assert beta.read_text(encoding="utf-8") == shipped["beta"].replace('    raise TaskNotDone("beta", "quadruple")\n', mine)


def test_a_learners_failure_prints_no_reference_source(course: Path):
    """学员的代码调用参考解答、错在参考解答里时，调用栈不印 solutions/ 里的源码（那是别的章的答案），只说略去了。"""
    beta = course / BETA.relpath
    beta.write_text(beta.read_text(encoding="utf-8").replace('    raise TaskNotDone("beta", "quadruple")\n',
                                                             '    return double(None)\n'), encoding="utf-8")
    out = pytest_run(course, "checks/stage1/test_beta.py", env={"MINISGL_LANG": "en"})
    assert out.returncode == 1 and "TypeError" in out.stdout, out.stdout
    assert "return x * FACTOR" not in out.stdout and "solutions/stage1/alpha.py" not in out.stdout, out.stdout
    assert "leaves out the frames in the reference solutions" in out.stdout, out.stdout
    assert "return double(None)" in out.stdout, "the learner's own line must still show:\n" + out.stdout
