"""``python -m minisgl`` 的张量并行参数（给定的 ``minisgl.serving`` 与 ``minisgl.launch``）：说不通的组合在解析时就拒绝，
切不开模型的 ``--tp`` 在起任何进程之前就拒绝，并说出行得通的大小。

en: The tensor-parallel flags of ``python -m minisgl`` (the given ``minisgl.serving`` and ``minisgl.launch``): combinations
that do not add up are refused while parsing, and a ``--tp`` that cannot split the model is refused before any process
starts, naming the sizes that work.
"""

from __future__ import annotations

import os
import subprocess
import sys

from checks.common import expect
from minisgl import model_zoo
from minisgl.course import select
from minisgl.i18n import tr


def test_launch_flags_are_checked_before_anything_starts() -> None:
    from minisgl.serving import tp_problems

    expect(tp_problems(2, 1, 0, None), [], tr("--tp 2 on one node needs nothing else"))
    for args, what in (((3, 2, 0, "127.0.0.1:5000"), "--tp 3 over 2 nodes"), ((2, 2, 0, None), "--nnodes 2 without --dist-init-addr"),
                       ((2, 2, 2, "127.0.0.1:5000"), "--node-rank 2 of 2"), ((2, 1, 0, "localhost"), "--dist-init-addr without a port"),
                       ((0, 1, 0, None), "--tp 0")):
        expect(bool(tp_problems(*args)), True, tr("{what} is refused with a sentence", what=what))
    done = subprocess.run([sys.executable, "-m", "minisgl", "--model", str(model_zoo.smollm2()), "--tp", "2", "--port", "0"],
                          env={**os.environ, **select.impl_env()}, capture_output=True, text=True, timeout=120)
    expect((done.returncode, "1, 3" in done.stderr), (1, True), tr(
        "SmolLM2 at --tp 2 is refused before any process starts, naming the sizes that work (1, 3); got {code}: {err}",
        code=done.returncode, err=done.stderr[-500:]))
