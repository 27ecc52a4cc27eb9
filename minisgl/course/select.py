"""每一章用哪份实现：学员代码、参考解答，还是未动过的骨架。

规则（每个进程各自决定）：
1. 被强制的一章用指定实现——环境变量 ``MINISGL_IMPL``（如 ``solution``、``core=solution,2.2=learner``，
   章节可写 id 或编号），或 ``python -m minisgl.course use`` 写进工作区 ``.minisgl/selection.json`` 的选择；
   环境变量优先。评分时（``MINISGL_GRADING=1``，由 ``course grade`` 设置）这两样都不管；
2. 否则，学员已经动手（文件与生成的骨架不同）就用学员代码；
3. 否则用参考解答。所以新克隆下来就能跑完整引擎，学员写一章、接管一章。

导入 ``minisgl.<章>`` 时，:class:`ChapterFinder` 直接交出选中的实现模块，
因此示例、笔记本、检查和学员代码看到的是同一个选择。
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import linecache
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache, reduce
from pathlib import Path
from types import ModuleType

from minisgl.course import integrity
from minisgl.course.registry import CHAPTERS, COURSE_ROOT, DERIVED_PUBLIC_MODULES, Chapter, find_chapter, get_chapter
from minisgl.course.registry import known_chapters
from minisgl.course.bilingual import for_language
from minisgl.course.skeleton import make_skeleton
from minisgl.i18n import LANGS, tr
from minisgl.paths import workspace_root

IMPLS = ("learner", "solution", "skeleton")


class LocalNames(Mapping[str, str]):
    """键固定、值按当前语言现翻译的映射（实现名之类）：``names["solution"]`` 随 ``MINISGL_LANG`` 变。"""

    def __init__(self, make: Callable[[], dict[str, str]]) -> None:
        self._make = make

    def __getitem__(self, key: str) -> str:
        return self._make()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._make())

    def __len__(self) -> int:
        return len(self._make())


#: 实现名（status、检查的表头、笔记本）。
IMPL_NAMES = LocalNames(lambda: {"learner": tr("learner code"), "solution": tr("reference solution"), "skeleton": tr("skeleton")})
#: 给学员看的实现名（示例打印、status 里的结果备注）。
SHORT_NAMES = LocalNames(lambda: {"learner": tr("your code"), "solution": tr("reference solution"), "skeleton": tr("skeleton")})


def enumerate_names(items: list[str]) -> str:
    """并列的名字：中文用顿号（``core、scheduler``），英文用逗号。"""
    return reduce(lambda a, b: tr("{a}, {b}", a=a, b=b), items) if items else ""


ENV_IMPL = "MINISGL_IMPL"
ENV_WORKSPACE = "MINISGL_WORKSPACE"
ENV_SOLUTIONS = "MINISGL_SOLUTIONS"
ENV_GRADING = "MINISGL_GRADING"
_MODULE_PREFIX = "_minisgl_impl"


class ImplSpecError(ValueError):
    """``MINISGL_IMPL`` 或保存的选择写错了；命令行把它打印成一行，不打印调用栈。

    ``brief``：不带建议的那半句（``course use`` 重写坏掉的选择文件时打印它）。
    """

    def __init__(self, message: str, brief: str | None = None) -> None:
        super().__init__(message)
        self.brief = brief or message


def grading() -> bool:
    """本进程是不是 ``course grade`` 的评分子进程：只认学员代码，拒绝引用参考解答的文件。"""
    return os.environ.get(ENV_GRADING) == "1"


def solutions_root() -> Path:
    """参考解答目录；教师可用 ``MINISGL_SOLUTIONS`` 指向自己的一套。"""
    return Path(os.environ.get(ENV_SOLUTIONS) or COURSE_ROOT / "solutions").resolve()


def shipped_solution(ch: Chapter) -> Path:
    """随课程发布的解答：骨架由它生成，判断“是否开始”也以它为准。"""
    return COURSE_ROOT / "solutions" / ch.relpath


def is_written(ch: Chapter) -> bool:
    """这一章的参考解答是否已经写好（课程尚在编写中的章节没有解答）。"""
    return shipped_solution(ch).is_file()


def skeleton_source(ch: Chapter) -> str:
    return make_skeleton(shipped_solution(ch).read_text(encoding="utf-8"), ch)


def learner_hash(ch: Chapter, workspace: Path | None = None) -> str | None:
    """学员文件内容的 sha256（结果里记下它，文件一改，旧结果就算过期）。"""
    path = (workspace or workspace_root()) / ch.relpath
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def skeleton_in(ch: Chapter, language: str | None) -> str:
    """一章的骨架：``language`` 为 None 时是发布的双语版，否则只留这种语言（学员选了语言时拿到的就是它）。

    en: A chapter's skeleton: the shipped bilingual one for ``language`` None, else that language only (what a learner
    who chose a language gets)."""
    return renderings(ch)[language]


def renderings(ch: Chapter) -> dict[str | None, str]:
    """骨架的三种样子：双语（None）、中文、英文。

    en: The skeleton's three renderings: bilingual (None), Chinese, English."""
    return dict(_renderings(ch, shipped_solution(ch).read_text(encoding="utf-8")))


@lru_cache(maxsize=64)
def _renderings(ch: Chapter, solution: str) -> tuple[tuple[str | None, str], ...]:
    skeleton = make_skeleton(solution, ch)
    return ((None, skeleton), *((language, for_language(skeleton, language)) for language in LANGS))


def is_started(ch: Chapter, workspace: Path | None = None) -> bool:
    """学员文件和随课程发布的骨架（任何一种语言的样子）都不一样，就算开始了这一章。

    en: A chapter is started once the learner's file differs from the shipped skeleton in every rendering."""
    path = (workspace or workspace_root()) / ch.relpath
    if not path.is_file() or not is_written(ch):
        return False
    return path.read_text(encoding="utf-8") not in renderings(ch).values()


def selection_file(workspace: Path | None = None) -> Path:
    return (workspace or workspace_root()) / ".minisgl" / "selection.json"


def parse_impl_spec(spec: str, chapters: tuple[Chapter, ...] = CHAPTERS) -> dict[str, str]:
    """``solution`` → 全部章节；``core=solution,2.2=learner`` → 指定章节（id 或编号）；``all=`` 同全部。"""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, value = part.rpartition("=")
        key = key.strip() or "all"
        value = value.strip()
        if value not in IMPLS + ("auto",):
            raise ImplSpecError(tr("Unknown implementation {value!r} in the environment variable {env}; choose from: {known}",
                                   value=value, env=ENV_IMPL, known=", ".join(IMPLS + ("auto",))))
        if key == "all":
            out.update(dict.fromkeys((c.id for c in chapters), value))
            continue
        ch = find_chapter(key, chapters)
        if ch is None:
            raise ImplSpecError(tr("No chapter {key!r} (in the environment variable {env}); known chapters: {known}",
                                   key=key, env=ENV_IMPL, known=known_chapters(chapters)))
        out[ch.id] = value
    return out


def saved_selection(workspace: Path | None = None) -> dict[str, str]:
    path = selection_file(workspace)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        brief = tr("{path} is not valid JSON ({err})", path=path, err=err)
        raise ImplSpecError(tr("{problem}; delete it or run python -m minisgl.course use auto all", problem=brief), brief) from err
    bad = {k: v for k, v in data.items() if v not in IMPLS} if isinstance(data, dict) else data
    if bad or not isinstance(data, dict):
        brief = tr("{path} holds a choice that makes no sense: {bad!r}", path=path, bad=bad)
        raise ImplSpecError(tr("{problem}; delete it or run python -m minisgl.course use auto all", problem=brief), brief)
    return data


def save_selection(choices: dict[str, str], workspace: Path | None = None) -> None:
    path = selection_file(workspace)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = {k: v for k, v in choices.items() if v != "auto"}
    path.write_text(json.dumps(kept, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class Choice:
    impl: str  # learner | solution | skeleton
    why: str  # isolated | grading | not_started | forced | started
    source: str = ""  # for "forced": MINISGL_IMPL or "course use"

    @property
    def reason(self) -> str:
        """为什么选它，按当前语言（status 表、pytest 表头、笔记本）。"""
        reasons = {
            "isolated": tr("isolated for the checks"),
            "grading": tr("grading"),
            "not_started": tr("not started, using the reference solution"),
            "forced": tr("set by {source}", source=self.source),
            "started": tr("learner has started"),
        }
        return reasons.get(self.why, self.why)


#: 进程内的覆盖（pytest 插件按章节隔离时设置），优先于环境变量和保存的选择。
_override: dict[str, str] = {}


def choose(ch: Chapter, isolated: bool = True) -> Choice:
    """按模块文档里的规则为一章选实现。``isolated=False``：不管 pytest 插件当前换上的那套（规划检查时用）。"""
    if isolated and ch.id in _override:
        return Choice(_override[ch.id], "isolated")
    if grading():
        return Choice("learner", "grading") if is_started(ch) else Choice("solution", "not_started")
    env = parse_impl_spec(os.environ.get(ENV_IMPL, "")).get(ch.id, "auto")
    requested, source = (env, ENV_IMPL) if env != "auto" else (saved_selection().get(ch.id, "auto"), "course use")
    if requested != "auto":
        return Choice(requested, "forced", source)
    if is_started(ch):
        return Choice("learner", "started")
    return Choice("solution", "not_started")


def impl_path(ch: Chapter, impl: str) -> Path:
    if impl == "learner":
        return workspace_root() / ch.relpath
    if impl == "solution":
        return solutions_root() / ch.relpath
    return shipped_solution(ch)  # the skeleton is generated from it


def _load(ch: Chapter, impl: str) -> ModuleType:
    """按文件路径加载一章的实现，模块名互不冲突，方便同一进程里缓存多套选择。"""
    path = impl_path(ch, impl)
    if not path.is_file():
        who = {
            "learner": tr("the learner file"),
            "solution": tr("the reference solution"),
            "skeleton": tr("the reference solution (the skeleton is generated from it)"),
        }[impl]
        raise ImportError(tr("Chapter {label} {id}: cannot find {who} {path}", label=ch.label, id=ch.id, who=who, path=path))
    name = f"{_MODULE_PREFIX}.{impl}.stage{ch.stage}.{ch.id}"
    if impl == "skeleton":
        source, filename = skeleton_source(ch), f"<skeleton {ch.relpath}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        module = ModuleType(name)
        module.__file__ = filename
        sys.modules[name] = module
        try:
            exec(compile(source, filename, "exec"), module.__dict__)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def loaded_impl(module: ModuleType) -> str | None:
    """查找器加载的一章模块是哪份实现（learner / solution / skeleton），从模块名 ``_minisgl_impl.<实现>.…`` 读出；
    别的模块返回 None。引擎据此判断能不能绕过某一章的代码（见 ``minisgl/fused.py``）。

    en: Which implementation (learner / solution / skeleton) a chapter module loaded by the finder is, read from its
    name ``_minisgl_impl.<impl>.…``; None for any other module. The engine uses it to decide whether a chapter's code
    may be bypassed (see ``minisgl/fused.py``).
    """
    prefix, _, rest = module.__name__.partition(".")
    return rest.partition(".")[0] if prefix == _MODULE_PREFIX else None


#: 本进程里各章实际用了哪份实现（pytest 表头、status 读它）。
active: dict[str, Choice] = {}

#: 本进程里导入失败的学员文件：章 id → (种类, 给学员看的说明)；种类是 ``refused``（拒绝评分）或 ``error``。
load_errors: dict[str, tuple[str, str]] = {}


def describe_load_error(ch: Chapter, exc: BaseException) -> tuple[str, str]:
    """学员文件导入失败 → (种类, 说明)。语法错误给出行号和出错的那一行。"""
    if isinstance(exc, integrity.RefusedError):
        text = str(exc)
        if getattr(exc, "complete", False):  # already names the chapter (integrity.refusal_message)
            return "refused", text
        return "refused", tr("Chapter {label} {id}: refused for grading — {relpath}: {text}",
                             label=ch.label, id=ch.id, relpath=ch.relpath, text=text)  # fmt: skip
    if isinstance(exc, SyntaxError):
        detail = "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
    else:
        learner = str(impl_path(ch, "learner"))
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == learner]
        where = tr(" ({relpath} line {lineno})", relpath=ch.relpath, lineno=frames[-1].lineno) if frames else ""
        detail = f"{type(exc).__name__}: {exc}{where}"
    head = tr("Chapter {label} {id}: your file {relpath} failed to import, none of this chapter's checks ran.",
              label=ch.label, id=ch.id, relpath=ch.relpath)  # fmt: skip
    return "error", f"{head}\n{detail}"


def describe_selection(chapters: list[str] | None = None) -> str:
    """一行说明各章用的是哪份实现，如 ``实现：你的代码（core、scheduler），其余章节用参考解答``
    （英文：``Implementation: your code (core, scheduler), reference solution for the other chapters``）。

    示例开头打印它，学员一眼看出跑的是谁的代码。``chapters`` 可只列示例用到的章（id 或编号）。
    已导入的章按实际加载的实现，没导入的按选择规则。
    """
    wanted = [get_chapter(c) for c in chapters] if chapters else list(CHAPTERS)
    impls: dict[str, list[str]] = {}
    for ch in wanted:
        if not is_written(ch):
            continue
        impl = active[ch.id].impl if ch.id in active else choose(ch).impl
        impls.setdefault(impl, []).append(ch.id)
    if not impls:
        return tr("Implementation: —")
    if len(impls) == 1:
        (impl,) = impls
        if not chapters:
            return tr("Implementation: {name} for all chapters", name=SHORT_NAMES[impl])
        return tr("Implementation: {name} for {chapters}", name=SHORT_NAMES[impl], chapters=enumerate_names(impls[impl]))
    common = max(impls, key=lambda k: len(impls[k]))
    parts = [tr("{name} ({chapters})", name=SHORT_NAMES[k], chapters=enumerate_names(v)) for k, v in impls.items() if k != common]
    return tr("Implementation: {parts}, {name} for the other chapters", parts=tr(", ").join(parts), name=SHORT_NAMES[common])


class ChapterFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import minisgl.<章>`` 的查找器：按 :func:`choose` 加载实现，并把它作为该公共模块交出。"""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - importlib protocol
        if any(c.public_module == fullname for c in CHAPTERS):
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        ch = next(c for c in CHAPTERS if c.public_module == spec.name)
        choice = choose(ch)
        try:
            if choice.impl == "learner" and grading():
                problems = integrity.scan_file(impl_path(ch, "learner"))
                if problems:
                    message = integrity.refusal_message(ch.label, ch.id, ch.relpath, problems)
                    raise integrity.RefusedError(message, complete=True)
            module = _load(ch, choice.impl)
        except Exception as exc:
            if choice.impl == "learner":
                load_errors[ch.id] = describe_load_error(ch, exc)
            raise
        active[ch.id] = choice
        load_errors.pop(ch.id, None)
        return module

    def exec_module(self, module: ModuleType) -> None:
        """实现模块在 create_module 里已经执行过。"""


def install_finder() -> None:
    if not any(isinstance(f, ChapterFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, ChapterFinder())


def _managed(name: str) -> bool:
    return (
        name.startswith(_MODULE_PREFIX + ".")
        or name in DERIVED_PUBLIC_MODULES
        or any(name == c.public_module for c in CHAPTERS)
    )


_cache: dict[tuple[tuple[str, str], ...], dict[str, ModuleType]] = {}


def impl_env() -> dict[str, str]:
    """子进程的环境变量：让它用与本进程相同的那套实现（pytest 按章节隔离时换上的那套，或环境变量里的那套）。
    第 3 阶段的检查要启动服务器进程，进程内的覆盖传不过去，只能经环境变量。

    en: Environment variables for a child process, so it uses the same implementations as this one (the set the pytest
    plugin switched in for a chapter, or the one from the environment). Stage 3's checks start server processes, and
    an in-process override does not reach them; only the environment does.
    """
    if not _override:
        return {ENV_IMPL: os.environ[ENV_IMPL]} if ENV_IMPL in os.environ else {}
    return {ENV_IMPL: ",".join(f"{cid}={impl}" for cid, impl in sorted(_override.items()))}


def use_selection(selection: dict[str, str]) -> None:
    """在同一进程里换一套选择（pytest 按章节隔离用）。

    当前这套已导入的章节模块存起来，换上另一套的（没有就在下次导入时现加载），
    这样同一章的检查总是拿到同一套对象，换来换去也不会重复加载。
    """
    global _override
    current = tuple(sorted(_override.items()))
    wanted = tuple(sorted(selection.items()))
    if current == wanted:
        return
    _cache[current] = {n: sys.modules.pop(n) for n in [n for n in sys.modules if _managed(n)]}
    _override = dict(selection)
    active.clear()
    package = sys.modules["minisgl"]
    for name in [c.public_module for c in CHAPTERS] + list(DERIVED_PUBLIC_MODULES):
        package.__dict__.pop(name.removeprefix("minisgl."), None)
    for name, module in _cache.get(wanted, {}).items():
        sys.modules[name] = module
        if name.startswith("minisgl."):
            setattr(package, name.removeprefix("minisgl."), module)
    for ch in CHAPTERS:
        if ch.public_module in sys.modules:
            active[ch.id] = Choice(_override.get(ch.id, "solution"), "isolated")
