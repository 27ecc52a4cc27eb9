"""Build the course notebooks from their jupytext sources and execute them.

Sources are percent-format scripts under ``notebooks/src/`` (easy to review and diff); the committed
``.ipynb`` files at the chapter registry's paths are generated from them and saved with the outputs of a real
run, so a learner sees results before running anything and nbval can compare a fresh run against them.

    python tools/build_notebooks.py                 # convert + execute every notebook, write the .ipynb files
    python tools/build_notebooks.py core step0      # only these (chapter ids, step0, milestone1, milestone2)
    python tools/build_notebooks.py --check         # committed .ipynb == what the sources give (no hand edits)
    python tools/build_notebooks.py --list          # source -> notebook pairs

Execution: one fresh kernel per notebook (the current interpreter, like ``pytest --nbval-current-env``),
working directory = the notebook's folder (as nbval does), ``MINISGL_IMPL=solution``, ``PYTHONHASHSEED=0``.
Cells tagged ``skip-execution`` (the last cell, which runs the learner's checks) are not executed here; they
carry ``# NBVAL_SKIP`` so nbval skips them too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from minisgl.course.registry import BUILTIN_CHAPTERS
from minisgl.paths import REPO_ROOT

SRC_DIR = "notebooks/src"
SKIP_TAG = "skip-execution"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


@dataclass(frozen=True)
class Pair:
    key: str  # chapter id, or step0 / milestone1 / milestone2
    source: str  # repo-relative path of the jupytext source
    notebook: str  # repo-relative path of the generated notebook
    chapter: str | None  # chapter id, None for the extras


def pairs() -> list[Pair]:
    """Every notebook of the course: step 0, one per registry chapter, one per stage milestone."""
    out = [Pair("step0", f"{SRC_DIR}/step0.py", "notebooks/step0.ipynb", None)]
    stages = sorted({c.stage for c in BUILTIN_CHAPTERS})
    for stage in stages:
        for ch in (c for c in BUILTIN_CHAPTERS if c.stage == stage):
            rel = ch.notebook.removeprefix("notebooks/").removesuffix(".ipynb")
            out.append(Pair(ch.id, f"{SRC_DIR}/{rel}.py", ch.notebook, ch.id))
        out.append(Pair(f"milestone{stage}", f"{SRC_DIR}/stage{stage}/milestone.py", f"notebooks/stage{stage}/milestone.ipynb", None))
    return out


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def convert(pair: Pair):
    """Source script -> notebook without outputs, with deterministic ids and metadata."""
    import jupytext
    import nbformat

    text = (REPO_ROOT / pair.source).read_text(encoding="utf-8")
    nb = jupytext.reads(text, fmt="py:percent")
    nb.metadata = nbformat.from_dict(
        {
            "kernelspec": KERNELSPEC,
            "language_info": {"name": "python"},
            "minisgl": {"source": pair.source, "source_sha256": _sha(text)},
        }
    )
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"
        tags = cell.metadata.get("tags", [])
        cell.metadata = nbformat.from_dict({"tags": tags} if tags else {})
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.nbformat, nb.nbformat_minor = 4, 5
    nbformat.validate(nb)
    return nb


def _cells(nb) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(c.cell_type, c.source, tuple(c.metadata.get("tags", []))) for c in nb.cells]


def execute(pair: Pair, timeout: int = 900):
    from jupyter_client import KernelManager
    from nbclient import NotebookClient
    from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager

    nb = convert(pair)
    (REPO_ROOT / pair.notebook).parent.mkdir(parents=True, exist_ok=True)
    km = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    client = NotebookClient(
        nb,
        km=km,
        timeout=timeout,
        resources={"metadata": {"path": str((REPO_ROOT / pair.notebook).parent)}},
        skip_cells_with_tag=SKIP_TAG,
        store_widget_state=False,
        record_timing=False,
        allow_errors=False,
    )
    try:
        client.execute()
    finally:  # we own the kernel manager: nbclient leaves its kernel running
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = KERNELSPEC
    lang = nb.metadata.get("language_info", {})
    nb.metadata["language_info"] = {k: lang[k] for k in ("name", "version", "mimetype", "file_extension") if k in lang}
    return nb


def write(pair: Pair, nb) -> None:
    import nbformat

    path = REPO_ROOT / pair.notebook
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(nb, ensure_ascii=False, indent=1, sort_keys=True) + "\n"
    nbformat.validate(nbformat.reads(text, as_version=4))
    path.write_text(text, encoding="utf-8")


def check(selected: list[Pair]) -> list[str]:
    """Problems with the committed notebooks; empty when they are exactly what the sources give."""
    import nbformat

    problems = []
    for pair in selected:
        src, nbpath = REPO_ROOT / pair.source, REPO_ROOT / pair.notebook
        if not src.is_file():
            problems.append(f"{pair.source}: missing source for {pair.notebook}")
            continue
        if not nbpath.is_file():
            problems.append(f"{pair.notebook}: missing; run python tools/build_notebooks.py {pair.key}")
            continue
        want = convert(pair)
        have = nbformat.read(nbpath, as_version=4)
        if _cells(want) != _cells(have):
            problems.append(f"{pair.notebook}: cells differ from {pair.source} (edited by hand, or not rebuilt)")
        elif have.metadata.get("minisgl", {}).get("source_sha256") != want.metadata["minisgl"]["source_sha256"]:
            problems.append(f"{pair.notebook}: built from another version of {pair.source}; rebuild it")
        for i, cell in enumerate(have.cells):
            if cell.cell_type != "code":
                continue
            skipped = SKIP_TAG in cell.metadata.get("tags", [])
            if skipped and (cell.outputs or cell.execution_count is not None):
                problems.append(f"{pair.notebook}: cell {i} is tagged {SKIP_TAG} but has outputs")
            if not skipped and cell.execution_count is None:
                problems.append(f"{pair.notebook}: cell {i} was not executed; rebuild with the tool")
            if skipped and "NBVAL_SKIP" not in cell.source:
                problems.append(f"{pair.notebook}: cell {i} is tagged {SKIP_TAG} but lacks # NBVAL_SKIP")
    known_nb = {p.notebook for p in pairs()}
    known_src = {p.source for p in pairs()}
    for path in sorted((REPO_ROOT / "notebooks").rglob("*.ipynb")):
        rel = path.relative_to(REPO_ROOT).as_posix()
        if ".ipynb_checkpoints" not in rel and rel not in known_nb:
            problems.append(f"{rel}: belongs to no chapter or milestone (stray notebook)")
    for path in sorted((REPO_ROOT / SRC_DIR).rglob("*.py")):
        rel = path.relative_to(REPO_ROOT).as_posix()
        if rel not in known_src:
            problems.append(f"{rel}: source of no notebook")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="chapter ids, step0, milestone1, milestone2 (default: all)")
    parser.add_argument("--check", action="store_true", help="verify the committed notebooks, build nothing")
    parser.add_argument("--list", action="store_true", help="print source -> notebook pairs")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="notebooks executed at once (default 1)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = parser.parse_args(argv)

    everything = pairs()
    by_key = {p.key: p for p in everything}
    unknown = [n for n in args.names if n not in by_key]
    if unknown:
        parser.error(f"unknown notebook(s): {', '.join(unknown)}; known: {', '.join(by_key)}")
    selected = [by_key[n] for n in args.names] if args.names else everything

    if args.list:
        for p in selected:
            print(f"{p.source} -> {p.notebook}")
        return 0
    if args.check:
        problems = check(selected)
        for problem in problems:
            print(problem, file=sys.stderr)
        print(f"{len(selected)} notebooks checked, {len(problems)} problem(s)")
        return 1 if problems else 0

    os.environ["MINISGL_IMPL"] = "solution"
    os.environ["PYTHONHASHSEED"] = "0"
    os.environ["TQDM_DISABLE"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    missing = [p.source for p in selected if not (REPO_ROOT / p.source).is_file()]
    if missing:
        print("missing sources: " + ", ".join(missing), file=sys.stderr)
        return 1

    def build(pair: Pair) -> tuple[Pair, float, str | None]:
        start = time.perf_counter()
        try:
            write(pair, execute(pair, args.timeout))
            return pair, time.perf_counter() - start, None
        except Exception as err:  # report every failing notebook, not only the first
            return pair, time.perf_counter() - start, f"{type(err).__name__}: {err}"

    t0 = time.perf_counter()
    failed = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for pair, secs, err in pool.map(build, selected):
            status = "ok" if err is None else "FAILED"
            print(f"{status:6} {secs:6.1f}s  {pair.notebook}", flush=True)
            if err:
                failed += 1
                print(err[-4000:], file=sys.stderr)
    print(f"built {len(selected) - failed}/{len(selected)} notebooks in {time.perf_counter() - t0:.1f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
