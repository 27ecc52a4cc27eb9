"""CPU 内核量一次时打印的几行（:mod:`minisgl.kernel`：某个形状走哪条路、预取怎么做、量的时候机器忙不忙）：出不出现取决于
这台机器的内核缓存里已经有什么、机器正忙不忙，与课程内容无关。记下的笔记本输出去掉它们（``tools/build_notebooks.py``），
比对重跑的笔记本时也去掉（课程的 pytest 插件在 ``--nbval`` 下用 :func:`without_calibration`）：笔记本跑到一半恰好
重量了一次，不算输出变了。

en: The lines the CPU kernel prints when it measures (:mod:`minisgl.kernel`: which path a shape takes, how to prefetch,
whether the machine was busy meanwhile): whether they show depends on what this machine's kernel cache already holds and
on its load, not on the lesson. Recorded notebook outputs drop them (``tools/build_notebooks.py``), and so does the
comparison of a notebook run again (the course's pytest plugin under ``--nbval`` uses :func:`without_calibration`): a
measurement that happens to be made again halfway through a notebook is no change of its output.
"""

from __future__ import annotations

import re
from typing import Any

from minisgl.i18n import catalogue

#: 内核量一次时打印的消息（原文，与 :mod:`minisgl.kernel` 里的一字不差）。
#: en: The messages the kernel prints when it measures (as written in :mod:`minisgl.kernel`, word for word).
MESSAGES = ("Linear layer {k}→{n} ({dtype}): {how} (measured once on this CPU with {threads} threads, saved in {path})",
            "  other processes kept {busy:.1f} cores busy while measuring: this choice is measured again after {hours:g} h",
            "CPU kernels prefetch the next weights {how} (fastest of {n} ways on this CPU, saved in {path})")


def _pattern(template: str) -> str:
    """一条消息模板的正则：字面照抄，每个占位符可以是任何文字。"""
    return ".*".join(re.escape(part) for part in re.split(r"\{[^{}]*\}", template))


#: 这些消息两种语言的任何一行。
#: en: Any line of these messages, in either language.
CALIBRATION_LINE = re.compile("^(?:" + "|".join(_pattern(text) for msgid in MESSAGES
                                                for text in (msgid, catalogue().get(msgid, msgid))) + ")$")


def without_calibration(outputs: list[Any]) -> list[Any]:
    """一格的输出，stderr 里去掉量内核的行（去完什么都不剩的那段输出整个去掉）；别的输出原样。不改传进来的对象。

    en: A cell's outputs with the kernel's measuring lines taken out of stderr (an output left empty is dropped as a
    whole); other outputs unchanged. The objects passed in are not modified.
    """
    kept = []
    for out in outputs:
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            lines = [ln for ln in out["text"].splitlines(keepends=True) if not CALIBRATION_LINE.match(ln.rstrip("\n"))]
            if not "".join(lines).strip():
                continue
            out = type(out)({**out, "text": "".join(lines)})  # 同一个类：nbval 按属性读输出 | en: the same class: nbval reads outputs by attribute
        kept.append(out)
    return kept
