"""诚实的评分与新手碰到的小问题：在两章（alpha、beta）的演示课程上验证

- ``grade`` 只认学员代码：不管保存的选择和 ``MINISGL_IMPL``，拒绝导入或读取参考解答的学员文件；
- ``grade`` 对不是工作区的路径报错；
- 结果记下实际用的实现和学员文件的哈希，``status`` 标出过期结果、不把参考解答的通过算成学员的；
- ``reset`` 清掉结果；章节可以写编号；``MINISGL_IMPL`` 写错时 ``status`` 只给一行；
- 一个学员文件有语法错误，其余章节照常检查，各章结果照常汇总；
- 英文（``MINISGL_LANG=en``）下结果、过期标记和实现说明都是英文，记下的结果与语言无关。
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checks.course.test_machinery import CJK, ALPHA, ALPHA_SOLUTION, BETA, BETA_SOLUTION, course, pytest_run, run  # noqa: F401
from minisgl.course.integrity import scan_source
from minisgl.course.registry import BUILTIN_CHAPTERS
from minisgl.paths import REPO_ROOT

WRONG_ALPHA = "def double(x):\n    return x * 3\n"


def course_cli(course: Path, *args: str, env: dict[str, str] | None = None):  # noqa: ANN201
    return run(course, "-m", "minisgl.course", *args, env=env)


def grade_row(stdout: str, chapter: str) -> str:
    return next(line for line in stdout.splitlines() if f" {chapter} " in f" {line} " and line.startswith("1."))


def results(course: Path) -> dict:
    return json.loads((course / ".minisgl" / "results.json").read_text(encoding="utf-8"))


# --- static scan ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "from solutions.stage1.alpha import *\n",
        "import solutions.stage1.alpha as a\n",
        "from solutions import stage1\n",
        "import importlib\nm = importlib.import_module('solutions.stage1.alpha')\n",
        "m = __import__('solutions.stage1.alpha')\n",
        "exec(open('solutions/stage1/alpha.py').read())\n",
        "from pathlib import Path\nsrc = (Path(__file__).parents[1] / 'solutions' / 'stage1' / 'alpha.py').read_text()\n",
        "src = open(f'{ROOT}/solutions/stage1/alpha.py').read()\n",
        "name = 'sol' + 'utions.stage1.alpha'\n",
        "exec('from solutions.stage1.alpha import double')\n",
        "from minisgl.course import select\n",
        "import sys\nm = sys.modules['_minisgl_impl.solution.stage1.alpha']\n",
        "from minisgl.course.skeleton import TaskNotDone, task_info\n",
    ],
)
def test_scan_flags_references_to_solutions(source: str):
    assert scan_source(source), f"应拒绝：{source!r}"


@pytest.mark.parametrize(
    "source",
    [
        '"""我没看 solutions/ 里的代码。"""\n\ndef double(x):\n    return 2 * x\n',
        "# 参考 solutions/stage1/alpha.py\ndef double(x):\n    return 2 * x\n",
        "from minisgl.core import Req\nmsg = 'solutions are hard'\n",
        "def double(x:\n",  # syntax errors are reported by the import, not by the scan
        "from minisgl.course.skeleton import TaskNotDone\n\ndef double(x):\n    return 2 * x\n",  # left from the skeleton
    ],
)
def test_scan_accepts_honest_code(source: str):
    assert scan_source(source) == []


def test_shipped_skeletons_and_solutions_pass_the_scan():
    for ch in BUILTIN_CHAPTERS:
        for path in (REPO_ROOT / ch.relpath, REPO_ROOT / "solutions" / ch.relpath):
            if path.is_file():
                assert scan_source(path.read_text(encoding="utf-8")) == [], f"{path} 不应被评分拒绝"


# --- grade -------------------------------------------------------------------------------------


def test_grade_refuses_a_learner_file_that_imports_the_solution(course: Path):
    (course / ALPHA.relpath).write_text("from solutions.stage1.alpha import *  # noqa\n", encoding="utf-8")
    out = course_cli(course, "grade", "--quiet")
    assert out.returncode == 0, out.stderr
    row = grade_row(out.stdout, "alpha")
    assert "通过 0/1" in row and "拒绝评分" in row, out.stdout
    assert "stage1/alpha.py" in out.stdout and "solutions" in out.stdout, "应写明拒绝的原因"
    assert "未开始" in grade_row(out.stdout, "beta")


def test_grade_blocks_an_obfuscated_import(course: Path):
    src = "double = getattr(__import__('snoitulos'[::-1] + '.stage1.alpha', fromlist=['x']), 'double')\n"
    (course / ALPHA.relpath).write_text(src, encoding="utf-8")
    assert pytest_run(course, "-q").returncode == 0, "平时（不评分）这样写能导入，这里只验证评分时会被拦下"
    out = course_cli(course, "grade", "--quiet")
    row = grade_row(out.stdout, "alpha")
    assert "通过 0/1" in row and "拒绝评分" in row, out.stdout


def test_grade_ignores_saved_selection_and_env(course: Path):
    learner = course / ALPHA.relpath
    learner.write_text(learner.read_text(encoding="utf-8") + "\n# 动了一下骨架\n", encoding="utf-8")
    (course / ".minisgl").mkdir()
    (course / ".minisgl" / "selection.json").write_text('{"alpha": "solution"}', encoding="utf-8")
    for env in (None, {"MINISGL_IMPL": "solution"}):
        out = course_cli(course, "grade", "--quiet", env=env)
        assert out.returncode == 0, out.stderr
        row = grade_row(out.stdout, "alpha")
        assert "通过 0/1" in row, f"评分应跑学员的骨架（全红），而不是保存的选择或环境变量指定的解答：\n{out.stdout}"


def test_grade_other_workspace_and_bad_paths(course: Path, tmp_path: Path):
    student = tmp_path / "zhang"
    (student / "stage1").mkdir(parents=True)
    (student / ALPHA.relpath).write_text(ALPHA_SOLUTION.replace("x * FACTOR", "x + x"), encoding="utf-8")
    out = course_cli(course, "grade", str(student), "--quiet")
    assert out.returncode == 0 and "通过 1/1" in grade_row(out.stdout, "alpha"), out.stdout + out.stderr
    assert "未开始" in grade_row(out.stdout, "beta"), "工作区里没有的文件按未开始算"
    for bad in (tmp_path / "no" / "such" / "dir", tmp_path):
        out = course_cli(course, "grade", str(student), str(bad), "--quiet")
        assert out.returncode != 0, f"{bad} 不是工作区，grade 应报错"
        assert out.stderr.strip().count("\n") == 0 and "不是学员工作区" in out.stderr, out.stderr
        assert "正在检查" not in out.stdout, "应先检查全部路径，再开始评分"


# --- results: implementation, hash, stale, reset ---------------------------------------------


def test_results_record_impl_and_hash_and_go_stale(course: Path):
    learner = course / ALPHA.relpath
    learner.write_text(ALPHA_SOLUTION.replace("x * FACTOR", "x + x"), encoding="utf-8")
    assert course_cli(course, "check", "1.1").returncode == 0, "check 应接受章节编号"
    entry = results(course)["alpha"]
    assert entry["impl"] == "learner" and len(entry["sha256"]) == 64
    status = course_cli(course, "status").stdout
    assert "通过 1/1" in status and "过期" not in status, status
    learner.write_text(learner.read_text(encoding="utf-8") + "\n# 又改了\n", encoding="utf-8")
    status = course_cli(course, "status").stdout
    assert "通过 1/1（过期）" in status, "文件改过之后，旧结果应标为过期：\n" + status
    forced = course_cli(course, "reset", "alpha", "--force")
    assert forced.returncode == 0 and "alpha" not in results(course), "reset 应清掉这一章的结果"
    assert "通过" not in course_cli(course, "status").stdout


def test_a_solution_pass_is_not_shown_as_the_learners(course: Path):
    learner = course / ALPHA.relpath
    learner.write_text(WRONG_ALPHA, encoding="utf-8")
    assert course_cli(course, "use", "solution", "1.1").returncode == 0, "use 应接受章节编号"
    out = course_cli(course, "check", "alpha")
    assert "通过 1/1（参考解答）" in out.stdout, out.stdout
    assert results(course)["alpha"]["impl"] == "solution"
    assert "通过 1/1（参考解答）" in course_cli(course, "status").stdout


def test_grading_results_do_not_touch_the_workspace(course: Path):
    (course / ALPHA.relpath).write_text(WRONG_ALPHA, encoding="utf-8")
    course_cli(course, "grade", "--quiet")
    assert not (course / ".minisgl" / "results.json").exists(), "评分不应写学员工作区的结果"


# --- small things -------------------------------------------------------------------------------


def test_unstarted_message_names_the_file(course: Path):
    out = pytest_run(course, "-rs")
    assert "stage1/alpha.py 仍是骨架" in out.stdout, out.stdout


def test_labels_work_for_leave_one_out_and_impl(course: Path):
    out = pytest_run(course, "--leave-one-out", "1.1", "-rA")
    assert out.returncode == 0, out.stdout + out.stderr
    code = "import minisgl.alpha as m; print(m.__name__.split('.')[1])"
    assert run(course, "-c", code, env={"MINISGL_IMPL": "1.1=skeleton"}).stdout.strip() == "skeleton"
    bad = pytest_run(course, "--leave-one-out", "9.9")
    assert bad.returncode != 0 and "9.9" in bad.stderr


@pytest.mark.parametrize("spec", ["gamma=solution", "alpha=bogus"])
def test_bad_impl_in_status_is_one_line(course: Path, spec: str):
    out = course_cli(course, "status", env={"MINISGL_IMPL": spec})
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().count("\n") == 0 and "MINISGL_IMPL" in out.stderr, out.stderr
    checks = pytest_run(course, env={"MINISGL_IMPL": spec})
    assert checks.returncode != 0 and "Traceback" not in checks.stdout + checks.stderr, checks.stdout + checks.stderr
    assert "MINISGL_IMPL" in checks.stderr, checks.stderr


def test_broken_selection_file_is_one_line_and_use_rewrites_it(course: Path):
    (course / ".minisgl").mkdir()
    (course / ".minisgl" / "selection.json").write_text("{oops", encoding="utf-8")
    out = course_cli(course, "status")
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "selection.json" in out.stderr, out.stderr
    assert course_cli(course, "use", "auto", "all").returncode == 0
    assert course_cli(course, "status").returncode == 0


def test_syntax_error_in_one_chapter_still_summarises(course: Path):
    (course / ALPHA.relpath).write_text("def double(x:\n    return 2 * x\n", encoding="utf-8")
    (course / BETA.relpath).write_text(BETA_SOLUTION, encoding="utf-8")
    out = pytest_run(course, "-rA")
    assert "Interrupted" not in out.stdout, "一章导入失败不应中断整个检查：\n" + out.stdout
    assert "PASSED checks/stage1/test_beta.py" in out.stdout, out.stdout
    assert "stage1/alpha.py 导入失败" in out.stdout and "SyntaxError" in out.stdout, out.stdout
    assert "各章结果" in out.stdout and "通过 0/1（导入失败）" in out.stdout, out.stdout


def test_summary_says_passed_x_of_y(course: Path):
    (course / ALPHA.relpath).write_text(WRONG_ALPHA, encoding="utf-8")
    out = pytest_run(course)
    assert "通过 0/1" in out.stdout and "失败 " not in out.stdout.split("各章结果")[-1], out.stdout
    assert "通过 0/1" in course_cli(course, "status").stdout


def test_describe_selection(course: Path):
    (course / BETA.relpath).write_text(BETA_SOLUTION + "\n# 我的\n", encoding="utf-8")
    code = "from minisgl.course import describe_selection as d; print(d()); print(d(['1.1']))"
    out = run(course, "-c", code).stdout.splitlines()
    assert out == ["实现：你的代码（beta），其余章节用参考解答", "实现：alpha 用参考解答"], out


def test_every_started_chapter_runs_its_own_code(course: Path):
    """规划第二个检查文件时，不能拿第一个文件换上的那套实现当成选择规则的结果。"""
    (course / ALPHA.relpath).write_text("def double(x):\n    return 2 * x\n", encoding="utf-8")
    (course / BETA.relpath).write_text("def quadruple(x):\n    return 3 * x\n", encoding="utf-8")  # wrong
    out = pytest_run(course, "-rA")
    assert "PASSED checks/stage1/test_alpha.py" in out.stdout, out.stdout
    assert "FAILED checks/stage1/test_beta.py" in out.stdout, "beta 写错了，它的检查必须用学员的 beta：\n" + out.stdout


def test_results_and_status_in_english(course: Path):
    en = {"MINISGL_LANG": "en"}
    learner = course / ALPHA.relpath
    learner.write_text(ALPHA_SOLUTION.replace("x * FACTOR", "x + x"), encoding="utf-8")
    assert course_cli(course, "check", "alpha", env=en).returncode == 0
    learner.write_text(learner.read_text(encoding="utf-8") + "\n# changed\n", encoding="utf-8")
    status = course_cli(course, "status", env=en).stdout
    assert "passed 1/1 (stale)" in status and '"stale": ' in status and not CJK.search(status), status
    assert "通过 1/1（过期）" in course_cli(course, "status").stdout, "记下的结果与语言无关：中文照样标过期"
    graded = course_cli(course, "grade", "--quiet", env=en)
    assert "passed 1/1" in grade_row(graded.stdout, "alpha") and "not started" in grade_row(graded.stdout, "beta"), graded.stdout
    assert not CJK.search(graded.stdout + graded.stderr), graded.stdout + graded.stderr
    (course / BETA.relpath).write_text("from solutions.stage1.beta import *  # noqa\n", encoding="utf-8")
    graded = course_cli(course, "grade", "--quiet", env=en)
    assert "passed 0/1 (refused for grading)" in grade_row(graded.stdout, "beta"), graded.stdout
    assert "Chapters not scored on the learner's code:" in graded.stdout and not CJK.search(graded.stdout), graded.stdout


def test_describe_selection_in_english(course: Path):
    (course / BETA.relpath).write_text(BETA_SOLUTION + "\n# mine\n", encoding="utf-8")
    code = "from minisgl.course import describe_selection as d; print(d()); print(d(['1.1']))"
    out = run(course, "-c", code, env={"MINISGL_LANG": "en"}).stdout.splitlines()
    assert out == [
        "Implementation: your code (beta), reference solution for the other chapters",
        "Implementation: reference solution for alpha",
    ], out
