"""笔记本的配对与卫生检查（不执行笔记本；执行并逐格比较输出的是 nbval，见 README 的测试命令）。

- 登记表里的每一章都有笔记本和它的源文件，第 0 步和两个里程碑也有；没有不属于任何一章的笔记本；
- 两种语言：中文版在登记表的路径，英文版在 ``notebooks/en/`` 下的同样路径，由同一个源文件生成；
  源文件里每个文字（markdown）格都是相邻的一对 ``lang-zh`` / ``lang-en``，英文版里没有中文（文字和输出）；
- 笔记本只经由 ``minisgl.*`` 导入，从不直接导入 ``solutions.*`` 或 ``stageN.*``（否则实现选择对它无效）；
- 每个笔记本用同一个处理函数演示一次控件回调，最后一格跑本章（或里程碑）的检查，且 CI 跳过这一格；
- 提交的 .ipynb 正是 ``tools/build_notebooks.py`` 从源文件生成并执行的结果，没有手改。
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

from minisgl.course.registry import BUILTIN_CHAPTERS
from minisgl.paths import REPO_ROOT, load_script

build = load_script("tools/build_notebooks.py", "build_notebooks")

PAIRS = build.pairs()  # 中文版（默认）
EN_PAIRS = build.pairs("en")
ALL_PAIRS = build.all_pairs()
SOURCES = sorted({p.source for p in PAIRS})
EXTRAS = {"step0": "notebooks/step0.ipynb", "milestone1": "notebooks/stage1/milestone.ipynb", "milestone2": "notebooks/stage2/milestone.ipynb",
          "milestone3": "notebooks/stage3/milestone.ipynb", "milestone4": "notebooks/stage4/milestone.ipynb",
          "milestone5": "notebooks/stage5/milestone.ipynb"}
FORBIDDEN_MODULE = re.compile(r"^(solutions|stage\d+)(\.|$)")


def _code_cells(pair) -> list[str]:
    nb = nbformat.read(REPO_ROOT / pair.notebook, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def test_every_chapter_has_its_notebook():
    by_chapter = {p.chapter: p for p in PAIRS if p.chapter}
    for ch in BUILTIN_CHAPTERS:
        assert ch.id in by_chapter, f"第 {ch.label} 章 {ch.id} 没有笔记本"
        pair = by_chapter[ch.id]
        assert pair.notebook == ch.notebook, f"第 {ch.label} 章的笔记本应在 {ch.notebook}，却是 {pair.notebook}"
        assert (REPO_ROOT / pair.source).is_file(), f"第 {ch.label} 章 {ch.id} 缺少笔记本源文件 {pair.source}"
        assert (REPO_ROOT / ch.notebook).is_file(), f"第 {ch.label} 章 {ch.id} 缺少笔记本 {ch.notebook}（运行 python tools/build_notebooks.py {ch.id}）"


def test_step0_and_milestone_notebooks_exist():
    keys = {p.key: p for p in PAIRS}
    for key, path in EXTRAS.items():
        assert key in keys and keys[key].notebook == path, f"缺少 {key} 的笔记本 {path}"
        assert (REPO_ROOT / path).is_file(), f"缺少笔记本 {path}（运行 python tools/build_notebooks.py {key}）"
        assert (REPO_ROOT / keys[key].source).is_file(), f"缺少笔记本源文件 {keys[key].source}"


def test_english_edition_mirrors_the_chinese_one():
    """英文版：每个中文笔记本在 notebooks/en/ 下有同样相对路径的英文版，由同一个源文件生成。"""
    assert [p.key for p in EN_PAIRS] == [p.key for p in PAIRS]
    for zh, en in zip(PAIRS, EN_PAIRS):
        assert en.source == zh.source and en.lang == "en" and zh.lang == "zh"
        assert en.notebook == "notebooks/en/" + zh.notebook.removeprefix("notebooks/"), en.notebook
        assert (REPO_ROOT / en.notebook).is_file(), f"缺少英文笔记本 {en.notebook}（运行 python tools/build_notebooks.py --lang en {en.key}）"


@pytest.mark.parametrize("source", SOURCES)
def test_every_prose_cell_has_its_twin(source):
    """每个 markdown 格都标了语言，而且中文格后面紧跟它的英文孪生格（英文格里没有中文）。"""
    problems = build.source_problems(source)
    assert not problems, "源文件的双语结构有问题：\n" + "\n".join(problems)


@pytest.mark.parametrize("pair", EN_PAIRS, ids=[p.key for p in EN_PAIRS])
def test_english_notebook_has_no_chinese(pair):
    """英文笔记本的文字和输出里没有中文（代码格里双语的注释不算）。"""
    nb = nbformat.read(REPO_ROOT / pair.notebook, as_version=4)
    assert nb.metadata.get("minisgl", {}).get("lang") == "en", f"{pair.notebook} 不是用英文（MINISGL_LANG=en）生成的"
    found = build.chinese_in(nb)
    assert not found, f"{pair.notebook} 里有中文（文字或输出）：\n" + "\n".join(found)


def test_every_notebook_belongs_to_a_chapter():
    known = {p.notebook for p in ALL_PAIRS}
    sources = {p.source for p in ALL_PAIRS}
    stray = [
        p.relative_to(REPO_ROOT).as_posix()
        for p in (REPO_ROOT / "notebooks").rglob("*.ipynb")
        if ".ipynb_checkpoints" not in p.parts and p.relative_to(REPO_ROOT).as_posix() not in known
    ]
    assert not stray, f"这些笔记本不属于任何一章或里程碑：{stray}"
    stray_src = [
        p.relative_to(REPO_ROOT).as_posix()
        for p in (REPO_ROOT / build.SRC_DIR).rglob("*.py")
        if p.relative_to(REPO_ROOT).as_posix() not in sources
    ]
    assert not stray_src, f"这些源文件不对应任何笔记本：{stray_src}"
    assert len(known) == len(build.LANGS) * (len(BUILTIN_CHAPTERS) + len(EXTRAS))


def _bad_imports(source: str) -> list[str]:
    """直接导入 solutions.* / stageN.*，或把这样的模块名写成字符串（importlib）。"""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if FORBIDDEN_MODULE.match(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and FORBIDDEN_MODULE.match(node.module):
            bad.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"(solutions|stage\d+)\.[\w.]+", node.value):
            bad.append(node.value)
    return bad


@pytest.mark.parametrize("pair", ALL_PAIRS, ids=[f"{p.key}-{p.lang}" for p in ALL_PAIRS])
def test_notebook_imports_only_public_namespace(pair):
    source = (REPO_ROOT / pair.source).read_text(encoding="utf-8")
    bad = _bad_imports(source)
    assert not bad, f"{pair.source} 直接导入了 {bad}：笔记本只能从 minisgl.* 导入，实现选择才对它有效"
    for cell in _code_cells(pair):
        text = "\n".join(line for line in cell.splitlines() if not line.lstrip().startswith(("%", "!")))
        bad = _bad_imports(text)
        assert not bad, f"{pair.notebook} 直接导入了 {bad}：笔记本只能从 minisgl.* 导入"


@pytest.mark.parametrize("pair", ALL_PAIRS, ids=[f"{p.key}-{p.lang}" for p in ALL_PAIRS])
def test_notebook_shape(pair):
    """交互控件的回调至少被调用一次；最后一格跑本章检查，CI 跳过它；0.6B 模型只在里程碑里用。"""
    cells = _code_cells(pair)
    source = "\n".join(cells)
    assert "Explorer(" in source and re.search(r"\.run\(", source), f"{pair.notebook} 没有交互控件，或没有调用一次控件的处理函数"
    assert "setup_notebook()" in cells[0], f"{pair.notebook} 的第一个代码格应调用 setup_notebook()"
    last = cells[-1]
    if pair.chapter:
        want = f'run_chapter_checks("{pair.chapter}")'
    elif pair.key.startswith("milestone"):
        want = f"run_milestone_checks({pair.key.removeprefix('milestone')})"
    else:
        want = None
    if want:
        assert want in last, f"{pair.notebook} 的最后一格应调用 {want}"
        assert "# NBVAL_SKIP" in last, f"{pair.notebook} 的最后一格（跑学员检查）要标 # NBVAL_SKIP，CI 由 checks/ 覆盖"
    if not pair.key.startswith("milestone"):
        assert "qwen3_06b_random" not in source, f"{pair.notebook}：0.6B 形状的模型只在里程碑笔记本里用，章节用 tiny_qwen3 / smollm2"


def test_committed_notebooks_are_built_by_the_tool():
    problems = build.check(ALL_PAIRS)
    assert not problems, "笔记本与源文件不一致（请运行 python tools/build_notebooks.py 重新生成，不要手改 .ipynb）：\n" + "\n".join(problems)


def calibration_lines(language: str) -> list[str]:
    """The lines the CPU kernel prints when it measures, in one language: a shape's path, the machine being busy
    meanwhile, the prefetch chosen."""
    from minisgl.i18n import tr

    return [tr("Linear layer {k}→{n} ({dtype}): {how} (measured once on this CPU with {threads} threads, saved in {path})",
               language=language, k=64, n=96, dtype="torch.float32", how="F.linear", threads=2, path="/tmp/plan.json"),
            tr("  other processes kept {busy:.1f} cores busy while measuring: this choice is measured again after {hours:g} h",
               language=language, busy=1.5, hours=1),
            tr("CPU kernels prefetch the next weights {how} (fastest of {n} ways on this CPU, saved in {path})",
               language=language, how="lockstep-l2", n=4, path="/tmp/plan.json")]


def test_the_calibration_lines_are_the_kernels_messages() -> None:
    """The messages dropped from notebook outputs are word for word ones the kernel prints (a reworded message would
    otherwise slip through and fail notebooks on whichever machine measures during a run)."""
    from minisgl import kernel
    from minisgl.course.calibration_lines import MESSAGES

    tree = ast.parse(Path(kernel.__file__).read_text(encoding="utf-8"))
    printed = {node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
               and getattr(node.func, "id", None) == "tr" and node.args and isinstance(node.args[0], ast.Constant)}
    assert set(MESSAGES) <= printed, set(MESSAGES) - printed


@pytest.mark.parametrize("language", ["zh", "en"])
def test_recorded_outputs_drop_the_kernels_calibration_lines(language: str) -> None:
    """The CPU kernel's measuring lines depend on this machine's cache and load, not on the lesson: a recorded notebook
    drops them and keeps everything else."""
    first, busy, prefetch = calibration_lines(language)
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("pass")
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text=f"{prefetch}\n{first}\n{busy}\nkept\n"),
                    nbformat.v4.new_output("stream", name="stderr", text=f"{busy}\n")]
    nb.cells = [cell]
    build.drop_calibration(nb)
    assert [out["text"] for out in nb.cells[0].outputs] == ["kept\n"], nb.cells[0].outputs


@pytest.mark.parametrize("extra, passes", [("calibration", True), ("other", False)])
def test_a_notebook_run_ignores_a_measurement_made_meanwhile(tmp_path, extra: str, passes: bool) -> None:
    """A notebook recorded without stderr, run again while the kernel measures (its lines on stderr): still equal under
    ``--nbval`` with the course's plugin. Any other line on stderr is still a difference."""
    import subprocess
    import sys

    lines = calibration_lines("zh") + calibration_lines("en") if extra == "calibration" else ["something else"]
    nb = nbformat.v4.new_notebook()
    printed = "\n".join(lines)
    cell = nbformat.v4.new_code_cell(f"import sys\nprint('out')\nprint({printed!r}, file=sys.stderr)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="out\n")]
    cell.execution_count = 1
    nb.cells = [cell]
    nbformat.write(nb, tmp_path / "run.ipynb")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "minisgl.course.pytest_plugin", "--nbval",
                           "--nbval-current-env", "-q", "-p", "no:cacheprovider", "run.ipynb"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert (done.returncode == 0) == passes, done.stdout[-3000:] + done.stderr[-2000:]
