"""从 solutions/ 生成学员骨架 stage1/、stage2/；``--check`` 只检查已提交的骨架是否与解答一致。"""

from __future__ import annotations

import argparse
import sys

from minisgl.course.registry import CHAPTERS, COURSE_ROOT
from minisgl.course.select import is_written, skeleton_source
from minisgl.i18n import tr


def main() -> int:
    parser = argparse.ArgumentParser(
        description=tr("Generate the learner skeletons stage1/, stage2/ from solutions/; with --check, only check that "
                       "the committed skeletons match the solutions.")
    )  # fmt: skip
    parser.add_argument("--check", action="store_true", help=tr("only check, write nothing; exit code 1 on a difference"))
    args = parser.parse_args()
    stale: list[str] = []
    for ch in CHAPTERS:
        if not is_written(ch):
            continue
        target = COURSE_ROOT / ch.relpath
        wanted = skeleton_source(ch)
        if target.is_file() and target.read_text(encoding="utf-8") == wanted:
            continue
        if args.check:
            stale.append(ch.relpath)
        else:
            target.write_text(wanted, encoding="utf-8")
            print(tr("Generated {relpath}", relpath=ch.relpath))
    if stale:
        print(tr("These skeletons do not match the reference solutions, run python tools/make_skeletons.py: {files}",
                 files=", ".join(stale)))  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
