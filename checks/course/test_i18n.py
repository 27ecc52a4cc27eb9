"""两种语言没有漂移：每条 ``tr()`` 消息都有中文译文、译文没有多余、占位符一致；学员看到的文件里
没有绕过目录的中文字符串；``MINISGL_LANG=en`` 时检查和命令只输出英文。

No drift between the languages: every ``tr()`` message id has a Chinese entry with the same placeholders, no entry
is unused, learner-facing files hold no Chinese string outside ``tr`` (docstrings and comments aside), and English
runs print no Chinese.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from minisgl.course.registry import CHAPTERS
from minisgl.course.skeleton import parse_tasks
from minisgl.i18n import CJK, LANGS, catalogue, lang, placeholders, tr
from minisgl.paths import REPO_ROOT as REPO


#: Every Python source that may call ``tr``.
SOURCES = ["minisgl", "checks", "examples", "solutions", "stage1", "stage2", "stage3", "stage4", "stage5", "tools", "bench", "docs/hooks", "notebooks/src"]

#: Files whose strings a learner sees at runtime: a Chinese string literal there must go through ``tr``.
LEARNER_FACING = [
    "checks/stage1", "checks/stage2", "checks/stage3", "checks/stage5", "checks/hf_reference.py", "minisgl/course", "minisgl/notebook", "minisgl/i18n.py",
    "minisgl/validation.py", "minisgl/llm.py", "minisgl/model_zoo.py", "minisgl/trace.py", "minisgl/scheduling.py",
    "minisgl/env.py", "minisgl/graph.py", "minisgl/fused.py", "minisgl/kernel", "minisgl/server/args.py", "minisgl/processes/harness.py",
    "minisgl/processes/tree.py", "minisgl/server/app.py",
    "minisgl/server/launch.py", "minisgl/server/api_errors.py", "minisgl/server/gate.py", "minisgl/server/chat_page.py", "minisgl/server/metrics.py",
    "minisgl/processes/by_name.py", "examples", "solutions",
    "stage1", "stage2", "stage3", "stage5",
    "tools/make_diagrams.py",
]


#: Chinese string literals that are data, not messages (each with the reason).
DATA = {
    "minisgl/course/registry.py": "chapter titles: the Chinese and the English title side by side",
    "minisgl/i18n.py": "the error for an unknown MINISGL_LANG is written in both languages at once",
}
CHINESE_PROMPTS = {"今天天气很好，我们"}  # a Chinese prompt the checks feed the tokenizer and the model


def _files(roots: list[str]) -> list[Path]:
    out: list[Path] = []
    for root in roots:
        path = REPO / root
        out += [path] if path.is_file() else sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
    return out


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _tr_calls() -> list[tuple[str, ast.Call]]:
    calls = []
    for path in _files(SOURCES):
        if path == Path(__file__):
            continue  # this file calls tr() with variables on purpose
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "tr":
                calls.append((f"{path.relative_to(REPO)}:{node.lineno}", node))
    return calls


def test_every_message_is_translated() -> None:
    zh = catalogue()
    problems = []
    for where, call in _tr_calls():
        if not call.args or not (isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
            problems.append(f"{where}: tr() needs a literal English message as its first argument")
            continue
        msgid = call.args[0].value
        names = {k.arg for k in call.keywords if k.arg not in (None, "language")}
        if CJK.search(msgid):
            problems.append(f"{where}: the message id must be English: {msgid!r}")
        elif msgid not in zh:
            problems.append(f"{where}: no Chinese translation in minisgl/locale/*.toml for {msgid!r}")
        elif placeholders(msgid) != placeholders(zh[msgid]):
            problems.append(f"{where}: placeholders differ between {msgid!r} and {zh[msgid]!r}")
        if names and names != placeholders(msgid):
            problems.append(f"{where}: arguments {sorted(names)} do not match the placeholders of {msgid!r}")
    assert not problems, "\n".join(problems)


def test_no_unused_translation() -> None:
    used = {c.args[0].value for _, c in _tr_calls() if c.args and isinstance(c.args[0], ast.Constant)}
    unused = sorted(set(catalogue()) - used)
    assert not unused, "minisgl/locale/*.toml has entries no tr() call uses:\n" + "\n".join(map(repr, unused))


def _docstrings(tree: ast.Module) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def test_learner_facing_strings_go_through_tr() -> None:
    problems = []
    for path in _files(LEARNER_FACING):
        if path.relative_to(REPO).as_posix() in DATA:
            continue
        tree = _tree(path)
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "tr":
                skip |= {id(n) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip \
                    and CJK.search(node.value) and node.value not in CHINESE_PROMPTS:
                problems.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value[:60]!r}")
    assert not problems, "Chinese strings outside tr() (write tr(\"English\") + a catalogue entry):\n" + "\n".join(problems)


@pytest.mark.parametrize("chapter_id", [c.id for c in CHAPTERS])
def test_task_hints_in_both_languages(chapter_id: str) -> None:
    ch = next(c for c in CHAPTERS if c.id == chapter_id)
    path = REPO / "solutions" / ch.relpath
    for task in parse_tasks(path.read_text(encoding="utf-8"), str(path)):
        assert CJK.search(task.hint), f"{ch.relpath} {task.name}: the Chinese hint has no Chinese"
        assert task.hint_en and not CJK.search(task.hint_en), f"{ch.relpath} {task.name}: the English hint is missing or not English"


def test_language_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    msgid = "Hands on: this chapter's files, notebook and checks"
    monkeypatch.delenv("MINISGL_LANG", raising=False)
    assert lang() == "zh" and tr(msgid) == catalogue()[msgid]
    monkeypatch.setenv("MINISGL_LANG", "en")
    assert tr(msgid) == msgid and tr(msgid, language="zh") == catalogue()[msgid]
    monkeypatch.setenv("MINISGL_LANG", "fr")
    with pytest.raises(ValueError, match="zh|en"):
        lang()
    assert LANGS == ("zh", "en")


def _run_en(*args: str, timeout: int = 600) -> str:
    env = {**os.environ, "MINISGL_LANG": "en"}
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.stdout + proc.stderr


def _assert_english(output: str, what: str) -> None:
    lines = [line for line in output.splitlines() if CJK.search(line)]
    assert not lines, f"{what} printed Chinese with MINISGL_LANG=en:\n" + "\n".join(lines[:20])


def test_english_skeleton_checks() -> None:
    """A learner who reads no Chinese: untouched chapters, their failing checks and the summary, all in English."""
    out = _run_en("-m", "pytest", "checks/stage1/test_core.py", "checks/stage2/test_scheduler.py", "--impl", "skeleton",
                  "--expect-red", "-p", "no:cacheprovider")
    assert "passed" in out, out[-2000:]
    _assert_english(out, "pytest --impl skeleton")


def test_english_course_cli() -> None:
    for args in (["status"], ["--help"], ["check", "--help"]):
        _assert_english(_run_en("-m", "minisgl.course", *args), f"python -m minisgl.course {' '.join(args)}")


def test_english_milestone() -> None:
    """The stage-2 milestone (tiny model, every experiment, step trace) prints English only; text generated by the
    random-weight model is quoted (repr) and may hold any token, so quoted strings are left out of the check."""
    from minisgl.model_zoo import tiny_qwen3

    out = _run_en("examples/stage2_milestone.py", "--model", str(tiny_qwen3()), "--trace")
    assert "Experiment 3" in out and "[96, 96, 96, 14]" in out, out[-2000:]
    _assert_english(re.sub(r"'(?:[^'\\]|\\.)*'", "''", out), "examples/stage2_milestone.py")


def test_english_build_models() -> None:
    """``make setup`` with MINISGL_LANG=en: the model build (everything already built: the skip lines and the summary)
    prints English only."""
    out = _run_en("tools/build_models.py", timeout=300)
    assert "[skip]" in out and "All ready" in out, out[-2000:]
    _assert_english(out, "tools/build_models.py")
    out = _run_en("tools/build_models.py", "--help", timeout=120)
    _assert_english(out, "tools/build_models.py --help")


_SAY = re.compile(r'say "(?P<zh>[^"]*)"\s+"(?P<en>[^"]*)"')


@pytest.mark.parametrize("script", ["tools/setup.sh", "tools/setup_browser.sh"])
def test_setup_scripts_speak_both(script: str) -> None:
    """Every Chinese line a setup script prints goes through ``say "中文" "English"`` (MINISGL_LANG picks one)."""
    text = (REPO / script).read_text(encoding="utf-8").replace("\\\n", " ")
    problems = []
    for line in text.splitlines():
        code = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        if not CJK.search(code) or code.lstrip().startswith("say()"):
            continue
        said = _SAY.search(code[code.find("say "):] if "say " in code else code)
        if not said or CJK.search(said["en"]) or not said["en"].strip():
            problems.append(line.strip()[:100])
    assert not problems, f"{script}: Chinese output without its English (write say \"中文\" \"English\"):\n" + "\n".join(problems)
    env = {**os.environ, "MINISGL_LANG": "en"}
    said = subprocess.run(["bash", "-c", f'eval "$(grep "^say()" {script})"; say "中文" "English"'], cwd=REPO, env=env,
                          capture_output=True, text=True)
    assert said.stdout == "English\n", said.stdout + said.stderr
