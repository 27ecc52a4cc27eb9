"""从 solutions/ 生成学员骨架 stage1/、stage2/；``--check`` 只检查已提交的骨架是否与解答一致。"""

from __future__ import annotations

import argparse
import sys

from minisgl.course.registry import CHAPTERS, COURSE_ROOT
from minisgl.course.select import is_written, skeleton_source


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="只检查，不写文件；有差异时退出码为 1")
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
            print(f"已生成 {ch.relpath}")
    if stale:
        print("这些骨架与参考解答不一致，请运行 python tools/make_skeletons.py：" + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
