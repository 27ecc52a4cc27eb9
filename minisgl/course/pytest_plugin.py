"""pytest 插件：每章的检查只用这一章的实现，其余章节一律用参考解答。

选项：
- ``--impl learner``（默认）：检查学员已开始的章节；没开始的章节跳过并标为「未开始」；
- ``--impl solution``：检查参考解答；``--impl skeleton``：检查未动过的骨架；
- ``--expect-red``：与 ``--impl skeleton`` 连用，骨架上每个检查都必须失败，通过的就是空检查；
- ``--leave-one-out 章``：只把这一章换回骨架，它的检查必须全红，其余章节必须全绿（章节写 id 或编号，如 ``2.2``）；
- ``--strict``（pytest 自带的选项，这里加严）：出现任何跳过、xfail 或一个检查都没收集到，都算失败；
- ``--results-json 路径``：把每章的结果写成 JSON（``course status`` 和 ``course grade`` 读它），
  每章记下实际用的实现和学员文件的哈希（文件改了，status 就把结果标为过期）。

``--nbval`` 跑笔记本时，比对输出之前先去掉 CPU 内核量一次时打印的几行（:mod:`minisgl.course.calibration_lines`）。

输出按 ``MINISGL_LANG`` 用中文或英文；英文时没给 ``--tb`` 就用 ``--tb=short``
（长调用栈会把骨架里的中文 TODO 注释也打印出来）。

学员文件导入失败（语法错误、导入时出错，或评分时引用了参考解答）不会中断整个收集：
这一章的检查照常收集（本章临时用参考解答），但每个都在准备阶段失败并给出原因，其余章节照常运行。
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from minisgl.course import integrity, select
from minisgl.course.registry import CHAPTERS, COURSE_ROOT, Chapter, chapter_for_check_file, get_chapter, milestone_stage
from minisgl.i18n import lang, tr

IMPL_NAMES = select.IMPL_NAMES
_PLAN = pytest.StashKey["Plan"]()
_HIDDEN = pytest.StashKey[bool]()  # a failure's traceback lost reference frames


@dataclass
class FilePlan:
    """一个检查文件用哪套实现、是否期望失败、是否因“未开始”而跳过。"""

    selection: dict[str, str]
    chapter: Chapter | None = None
    expect_red: str | None = None  # None | "each" (every test red) | "file" (at least one red)
    skip_reason: str | None = None
    skip_kind: str | None = None  # "not_written" | "not_started"
    failure: str | None = None  # every test fails in setup with this message (learner file could not be used)
    failure_kind: str | None = None  # "refused" | "error"
    record: dict = field(default_factory=dict)  # written to results.json next to the counts

    def fail_with(self, kind: str, message: str, chapters: list[str]) -> None:
        """这些章的学员文件用不了：改用参考解答收集检查，每个检查在准备阶段以 message 失败。"""
        self.failure = message if self.failure is None else f"{self.failure}\n{message}"
        self.failure_kind = "refused" if "refused" in (kind, self.failure_kind) else kind
        self.selection = {**self.selection, **dict.fromkeys(chapters, "solution")}
        self.record = {**self.record, self.failure_kind: self.failure}


@dataclass
class Plan:
    impl: str
    expect_red: bool
    leave_one_out: str | None
    strict: bool
    results: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    records: dict[str, dict] = field(default_factory=dict)  # per key: impl really used, learner file hash, failure
    red_files: dict[str, bool] = field(default_factory=dict)  # milestone files under expect-red: saw a red?
    not_started: set[str] = field(default_factory=set)  # skip reasons of chapters skipped as "not started"
    _files: dict[Path, FilePlan] = field(default_factory=dict)

    def shared(self) -> dict:
        """xdist 的 worker 交给主进程的结果（只用 execnet 能传的类型）。

        en: What an xdist worker hands to the controller (only types execnet can send).
        """
        return {"results": {k: dict(v) for k, v in self.results.items()}, "records": self.records,
                "red_files": self.red_files, "not_started": sorted(self.not_started)}

    def merge(self, shared: dict) -> None:
        """主进程把一个 worker 的结果加进来：计数相加；里程碑文件只要有一个 worker 见过红就算红。

        en: The controller adds one worker's results: counts add up; a milestone file is red if any worker saw it red.
        """
        for key, counts in shared["results"].items():
            for name, n in counts.items():
                self.results[key][name] += n
        self.records.update(shared["records"])
        for path, red in shared["red_files"].items():
            self.red_files[path] = self.red_files.get(path, False) or red
        self.not_started.update(shared["not_started"])

    def impl_for(self, ch: Chapter) -> str:
        if self.leave_one_out:
            return "skeleton" if ch.id == self.leave_one_out else "solution"
        if self.impl == "learner":
            return select.choose(ch, isolated=False).impl
        return self.impl

    def for_file(self, path: Path) -> FilePlan:
        if path not in self._files:
            self._files[path] = self._plan_file(path)
        return self._files[path]

    def _plan_file(self, path: Path) -> FilePlan:
        ch = chapter_for_check_file(path)
        everything = {c.id: "solution" for c in CHAPTERS}
        if ch is not None:
            impl = self.impl_for(ch)
            plan = FilePlan({**everything, ch.id: impl}, chapter=ch)
            plan.record = {"impl": impl, "sha256": select.learner_hash(ch)}
            if not select.is_written(ch):
                plan.skip_kind = "not_written"
                plan.skip_reason = tr("not written: chapter {label} {id} has no reference solution yet", label=ch.label, id=ch.id)
            elif self.impl == "learner" and not self.leave_one_out and not select.is_started(ch) and impl != "skeleton":
                plan.skip_kind = "not_started"
                plan.skip_reason = tr("not started: chapter {label} {id} ({relpath} is still the skeleton)",
                                      label=ch.label, id=ch.id, relpath=ch.relpath)  # fmt: skip
            elif impl == "learner" and select.grading():
                problems = integrity.scan_file(select.impl_path(ch, "learner"))
                if problems:
                    plan.fail_with("refused", integrity.refusal_message(ch.label, ch.id, ch.relpath, problems), [ch.id])
            if impl == "skeleton" and (self.expect_red or self.leave_one_out):
                plan.expect_red = "each"
            return plan
        stage = milestone_stage(path)
        if stage is None:
            return FilePlan({})  # course machinery and other checks: the normal per-process rule
        if self.leave_one_out:
            reverted = next(c for c in CHAPTERS if c.id == self.leave_one_out)
            red = "file" if reverted.stage <= stage else None
            return FilePlan({**everything, reverted.id: "skeleton"}, expect_red=red)
        in_stage = [c for c in CHAPTERS if c.stage == stage and select.is_written(c)]
        if self.impl == "skeleton":
            return FilePlan({**everything, **{c.id: "skeleton" for c in in_stage}}, expect_red="file" if self.expect_red else None)
        return FilePlan({c.id: self.impl_for(c) for c in CHAPTERS})


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("minisgl", tr("mini-sglang by hand: course checks"))
    group.addoption("--impl", choices=tuple(IMPL_NAMES), default="learner",
                    help=tr("which implementation to check (default: learner)"))
    group.addoption("--expect-red", action="store_true", help=tr("every check must fail on the skeleton"))
    group.addoption("--leave-one-out", metavar="CHAPTER", default=None, help=tr("revert only this chapter to the skeleton"))
    group.addoption("--results-json", metavar="PATH", default=None, help=tr("write each chapter's result to this JSON file"))
    group.addoption("--device", choices=("cpu", "cuda"), default="cpu",
                    help=tr("device for the engine and the HF reference (default: cpu)"))
    group.addoption(
        "--without-smollm2", action="store_true",
        help=tr("deselect every check that uses SmolLM2 (for offline GPU machines that cannot bring this model along)"),
    )  # fmt: skip


def use_device(device: str) -> None:
    """检查里 ``device="auto"`` 的引擎和 HF 参考都用这个设备。CUDA 上关掉 TF32：fp32 要逐 token 对上 HF。"""
    os.environ["MINISGL_DEVICE"] = device
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError(tr("--device cuda: this machine has no usable CUDA GPU"))
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def pytest_configure(config: pytest.Config) -> None:
    if lang() == "en" and config.option.tbstyle == "auto":  # no --tb given: long tracebacks print Chinese comments
        config.option.tbstyle = "short"
    use_device(config.getoption("--device"))
    loo = config.getoption("--leave-one-out")
    if loo is not None:
        try:
            loo = get_chapter(loo).id
        except KeyError as err:
            raise pytest.UsageError(tr("--leave-one-out: {problem}", problem=err.args[0])) from None
    if select.grading():
        integrity.install_import_guard()
    else:
        try:  # a mistyped MINISGL_IMPL or selection file: one line, not an internal error
            select.parse_impl_spec(os.environ.get(select.ENV_IMPL, ""))
            select.saved_selection()
        except select.ImplSpecError as err:
            raise pytest.UsageError(str(err)) from None
    if getattr(config.option, "nbval", False):
        _compare_notebooks_without_calibration()
    config.stash[_PLAN] = Plan(
        impl=config.getoption("--impl"),
        expect_red=config.getoption("--expect-red"),
        leave_one_out=loo,
        strict=_strict(config),
    )


def _compare_notebooks_without_calibration() -> None:
    """nbval 比对一格重跑的输出之前，先去掉 CPU 内核量一次时打印的几行：记下的输出里本来就没有它们。

    en: Before nbval compares a cell's new outputs, take out the lines the CPU kernel prints when it measures: the
    recorded outputs never hold them.
    """
    from nbval.plugin import IPyNbCell

    from minisgl.course.calibration_lines import without_calibration

    compare = IPyNbCell.compare_outputs
    if getattr(compare, "without_calibration", False):
        return

    def compare_outputs(self: IPyNbCell, test: list, ref: list, skip_compare: tuple | None = None) -> bool:
        return compare(self, without_calibration(test), ref, skip_compare)

    compare_outputs.without_calibration = True  # type: ignore[attr-defined]
    IPyNbCell.compare_outputs = compare_outputs


def _strict(config: pytest.Config) -> bool:
    """``--strict`` 是 pytest 自带的选项（pytest 9 打开全部严格模式，更早的版本等于 --strict-markers）；
    课程在它之上再加一条：不允许跳过、xfail 或空收集。"""
    try:
        return bool(config.getini("strict"))
    except ValueError:
        return bool(config.getoption("strict_markers", False))


def pytest_report_header(config: pytest.Config) -> list[str]:
    plan = config.stash[_PLAN]
    mode = f"--impl {plan.impl}" + (" --expect-red" if plan.expect_red else "")
    if plan.leave_one_out:
        mode = f"--leave-one-out {plan.leave_one_out}"
    lines = [tr("mini-sglang by hand checks ({mode}): each chapter's checks use only that chapter's implementation, "
                "the reference solution for all other chapters", mode=mode)]  # fmt: skip
    for ch in CHAPTERS:
        if not select.is_written(ch):
            lines.append(f"  {ch.label:>4} {ch.id:<16} " + tr("not written"))
            continue
        impl = plan.impl_for(ch)
        if select.is_started(ch):
            note = tr("{impl} (learner file: started)", impl=IMPL_NAMES[impl])
        else:
            note = tr("{impl} (learner file: not started)", impl=IMPL_NAMES[impl])
        lines.append(f"  {ch.label:>4} {ch.id:<16} {note}")
    return lines


class _ChapterModule(pytest.Module):
    """导入检查文件之前先换上它的那套实现，这样文件顶部的 ``from minisgl.x import ...`` 拿到对的对象。

    学员文件导入失败时不让整个收集中断：记下原因，改用参考解答重新收集，这些检查在准备阶段失败。
    """

    def _getobj(self):  # noqa: ANN202 - pytest internal hook
        select.use_selection(self.config.stash[_PLAN].for_file(self.path).selection)
        return super()._getobj()

    def collect(self):  # noqa: ANN201 - pytest hook
        fplan = self.config.stash[_PLAN].for_file(self.path)
        select.load_errors.clear()
        try:
            return super().collect()
        except Exception:
            broken = {cid: err for cid, err in select.load_errors.items() if fplan.selection.get(cid) == "learner"}
            if not broken:
                raise
        for cid, (kind, message) in broken.items():
            fplan.fail_with(kind, message, [cid])
        return super().collect()


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if module_path.name.startswith("test_"):
        return _ChapterModule.from_parent(parent, path=module_path)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--without-smollm2"):  # 明着取消选中（pytest 报告里计作 deselected），不是悄悄跳过
        dropped = [i for i in items if "smollm2_path" in getattr(i, "fixturenames", ())]
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i not in dropped]
    plan = config.stash[_PLAN]
    for item in items:
        reason = plan.for_file(item.path).skip_reason
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
        if plan.impl != "solution":
            _hide_reference_frames(item)


def _is_reference(path: str) -> bool:
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(root) for root in {select.solutions_root(), COURSE_ROOT / "solutions"})


def _hide_reference_frames(item: pytest.Item) -> None:
    """学员跑检查时，失败的调用栈里不印参考解答（``solutions/``）的源码：那是别的章的答案。学员的代码调用了参考解答、
    错在那里时，仍看得到自己那一行和异常本身；``--impl solution``（教师、CI）照常全印。

    en: When a learner runs the checks, a failure's traceback prints no reference solution source (``solutions/``): it
    is other chapters' answers. When the learner's code called a reference solution and the error surfaced there, their
    own line and the exception itself still show; ``--impl solution`` (instructors, CI) prints everything as usual.
    """
    original = getattr(item, "_traceback_filter", None)
    if original is None:  # pytest's private hook moved: print as pytest does
        return

    def without_reference(excinfo: pytest.ExceptionInfo) -> object:
        traceback = original(excinfo)
        kept = traceback.filter(lambda entry: not _is_reference(str(entry.path)))
        if len(kept) < len(traceback):
            item.stash[_HIDDEN] = True
        return kept

    item._traceback_filter = without_reference  # type: ignore[method-assign]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    fplan = item.config.stash[_PLAN].for_file(item.path)
    if fplan.failure:
        pytest.fail(fplan.failure, pytrace=False)
    select.use_selection(fplan.selection)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201 - hookwrapper
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    plan: Plan = item.config.stash[_PLAN]
    fplan = plan.for_file(item.path)
    if report.skipped and fplan.skip_kind == "not_started":
        plan.not_started.add(fplan.skip_reason or "")
    if fplan.expect_red == "file" and not report.skipped:
        if report.failed:
            plan.red_files[str(item.path)] = True
            report.outcome = "passed"
        else:
            plan.red_files.setdefault(str(item.path), False)
    elif fplan.expect_red == "each" and not report.skipped:
        # a failure in the call, or a setup failure caused by the skeleton, counts as red
        if report.failed and (report.when == "call" or _not_implemented(call, report)):
            report.outcome = "passed"
            report.sections.append(("expect-red", tr("fails on the skeleton, as expected")))
        elif report.when == "call" and report.passed:
            report.outcome = "failed"
            report.longrepr = tr(
                "This check passed on the untouched skeleton: it does not test this chapter's code (a vacuous check); "
                "make it call this chapter's tasks."
            )  # fmt: skip
    if report.failed and item.stash.get(_HIDDEN, False):
        report.sections.append(("minisgl", tr(
            "The traceback above leaves out the frames in the reference solutions (solutions/, other chapters' "
            "answers); what it shows is your code, the checks and the given modules.")))  # fmt: skip
    _record(plan, item.path, report)


def _not_implemented(call: pytest.CallInfo, report: pytest.TestReport) -> bool:
    """这次失败是不是骨架引起的：``NotImplementedError``（骨架的 ``TaskNotDone`` 是它的子类），也看链上的原因。"""
    if call.excinfo is not None and call.excinfo.errisinstance(NotImplementedError):
        return True
    text = str(report.longrepr)
    return "NotImplementedError" in text or "TaskNotDone" in text


def _record(plan: Plan, path: Path, report: pytest.TestReport) -> None:
    """按章（或里程碑）累计结果：每个检查只计一次（调用阶段，或失败的准备阶段）。"""
    if report.when != "call" and not (report.when == "setup" and not report.passed):
        return
    ch = chapter_for_check_file(path)
    stage = milestone_stage(path)
    key = ch.id if ch else (f"milestone{stage}" if stage else None)
    if key is not None:
        plan.results[key][report.outcome] += 1
        plan.records[key] = plan.for_file(path).record


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # noqa: ANN001 - xdist's WorkerController
    """pytest-xdist（``-n``）：一个 worker 结束了，把它的结果并进主进程的计划，由主进程统一判断和汇总。

    en: pytest-xdist (``-n``): a worker finished; merge its results into the controller's plan, which judges and
    summarises for all of them.
    """
    shared = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
    if shared is not None:
        node.config.stash[_PLAN].merge(shared)


_WORKER_KEY = "minisgl_plan"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    plan: Plan = session.config.stash[_PLAN]
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller judges --strict / --expect-red and writes results
        workeroutput[_WORKER_KEY] = plan.shared()
        return
    problems: list[str] = []
    not_red = [p for p, red in plan.red_files.items() if not red]
    if not_red:
        problems.append(tr("These milestone checks had not a single failure on the skeleton: {files}", files=", ".join(not_red)))
    if plan.strict:
        stats = session.config.pluginmanager.get_plugin("terminalreporter").stats
        loose = {k: len(stats.get(k, [])) for k in ("skipped", "xfailed", "xpassed")}
        if session.testscollected == 0:
            problems.append(tr("--strict: not a single check was collected"))
        for kind, n in loose.items():
            if n:
                problems.append(tr("--strict: {n} {kind}", n=n, kind=kind))
    if problems:
        session.config.stash[_PROBLEMS] = problems
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _write_results(session.config, plan)


_PROBLEMS = pytest.StashKey[list]()


def _write_results(config: pytest.Config, plan: Plan) -> None:
    path = config.getoption("--results-json")
    target = Path(path) if path else select.workspace_root() / ".minisgl" / "results.json"
    if not plan.results or (path is None and (plan.impl != "learner" or plan.leave_one_out)):
        return  # the workspace file records the learner's own runs only
    old = json.loads(target.read_text(encoding="utf-8")) if target.is_file() else {}
    stamp = time.strftime("%Y-%m-%d %H:%M")
    for key, counts in plan.results.items():
        old[key] = {**counts, "impl": plan.impl, **plan.records.get(key, {}), "time": stamp}
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(old, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    plan: Plan = config.stash[_PLAN]
    reporter = terminalreporter
    if plan.results:
        reporter.section(tr("Results per chapter"))
        for key, counts in plan.results.items():
            reporter.write_line(f"  {_key_label(key)}  {summary(counts, plan.records.get(key))}")
    if plan.not_started:
        reporter.section(tr("Chapters not started (checks skipped)"), red=True, bold=True)
        for reason in sorted(plan.not_started):
            reporter.write_line(f"  {reason}", yellow=True, bold=True)
        reporter.write_line("  " + tr("Once you start writing a chapter (edit the file listed above), its checks will run."))
    for problem in config.stash.get(_PROBLEMS, []):
        reporter.write_line(problem, red=True, bold=True)


@dataclass(frozen=True)
class Outcome:
    """一章结果的结构化形式（``status``、``grade`` 比较和标注它，不解析显示的文字）。

    ``kind``：``none``（没有结果）、``not_started``（全部跳过）或 ``counts``（通过 passed/total）；
    ``notes``：备注的种类：``refused``、``error``、``impl:<实现>``、``skipped:<个数>``、``stale``。
    """

    kind: str
    passed: int = 0
    total: int = 0
    notes: tuple[str, ...] = ()

    def with_note(self, note: str) -> Outcome:
        return Outcome(self.kind, self.passed, self.total, (*self.notes, note))

    @property
    def stale(self) -> bool:
        return "stale" in self.notes

    def text(self) -> str:
        """按当前语言：``通过 16/16``、``通过 3/16（导入失败）``、``未开始``、``—``（英文 ``passed 16/16`` ……）。"""
        if self.kind == "none":
            return "—"
        if self.kind == "not_started":
            head = tr("not started")
        else:
            head = tr("passed {passed}/{total}", passed=self.passed, total=self.total)
        notes = [_note_text(n) for n in self.notes]
        return tr("{result} ({notes})", result=head, notes=tr(", ").join(notes)) if notes else head


def _note_text(note: str) -> str:
    kind, _, value = note.partition(":")
    if kind == "refused":
        return tr("refused for grading")
    if kind == "error":
        return tr("import failed")
    if kind == "impl":
        return select.SHORT_NAMES.get(value, value)
    if kind == "skipped":
        return tr("{n} skipped", n=value)
    if kind == "stale":
        return tr("stale")
    return note


def outcome(counts: dict, record: dict | None = None) -> Outcome:
    """一章的结果（见 :class:`Outcome`）：任何情况下都是「通过 x/y」加备注；全部跳过的是「未开始」。"""
    passed, failed, skipped = (int(counts.get(k, 0)) for k in ("passed", "failed", "skipped"))
    record = record or {}
    if passed + failed == 0:
        return Outcome("not_started" if skipped else "none")
    notes = [k for k in ("refused", "error") if record.get(k)]
    impl = record.get("impl", "learner")
    if impl != "learner":
        notes.append(f"impl:{impl}")
    if skipped:
        notes.append(f"skipped:{skipped}")
    return Outcome("counts", passed, passed + failed, tuple(notes))


def summary(counts: dict, record: dict | None = None) -> str:
    """一章结果的一句话，任何情况下都是「通过 x/y」，再加备注：
    ``通过 16/16``、``通过 3/16（导入失败）``、``通过 16/16（参考解答）``；全部跳过的是 ``未开始``。"""
    return outcome(counts, record).text()


def _key_label(key: str) -> str:
    ch = next((c for c in CHAPTERS if c.id == key), None)
    if ch is not None:
        return f"{ch.label:>4} {ch.id:<16}"
    return tr("milestone (stage {stage})", stage=key.removeprefix("milestone"))
