"""第 4 阶段里程碑（examples/stage4_milestone.py）在小 Qwen3 上从头跑到尾：切得开的大小、每个秩存的和每步的集合通信、
离线 TP=1 与 TP=2 的 token 相同、``--tp 2`` 的服务器回答与一个进程相同、断开的流释放了页、关掉之后没有留下进程，
小 MoE 在 ep_size=2 时的 token 与一个秩相同；``--dp 2`` 时缓存感知的路由器预填充的 token 明显少于轮流，回答相同。

en: The stage 4 milestone (examples/stage4_milestone.py) end to end on the tiny Qwen3: the sizes that split, what each
rank stores and the collectives per step, the same tokens offline at TP=1 and TP=2, a ``--tp 2`` server answering like
one process, a dropped stream freeing its pages, no process left after stopping, the tiny MoE's tokens at ep_size=2
equal to one rank's, and with ``--dp 2`` the cache-aware router prefilling clearly fewer tokens than round robin with
the same answers.
"""

from __future__ import annotations

import sys

import pytest

from checks.common import expect
from minisgl.course import select
from minisgl.i18n import tr
from minisgl.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples"))

import stage4_milestone  # noqa: E402


def test_milestone_end_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in select.impl_env().items():  # 秩和服务器进程用与本检查相同的那套实现 | en: ranks and server use this check's implementations
        monkeypatch.setenv(key, value)
    results = stage4_milestone.main([])
    expect(results["splits"], {"qwen3-tiny": [1, 2, 4], "SmolLM2": [1, 3]}, tr("The sizes that split qwen3-tiny and SmolLM2"))
    layers, steps = results["layers"], results["steps"]
    expect(results["built"], {"agree_min": 1}, tr("Building the engine agrees on the KV page count once"))
    expect(results["calls"], {"all_reduce": steps * (2 * layers + 1), "all_gather": steps},
           tr("Per step 2 all_reduce per layer + 1 for the embedding, and 1 all_gather"))
    expect(results["offline_equal"], True, tr("LLM(path) and LLM(path, tp_size=2) generate the same greedy tokens"))
    expect(results["online_equal"], True, tr("The --tp 2 server answers with one process's text"))
    idle, back = results["pages"]
    expect(back, idle, tr("After the dropped stream every KV page is back"))
    expect(results["left_behind"], [], tr("No process is left after Ctrl-C"))
    expect(results["moe_equal"], True, tr("The tiny MoE generates the same greedy tokens on one rank and at ep_size=2"))
    dp = results["dp_prefill"]
    expect(dp["cache_aware"] < 0.75 * dp["round_robin"], True,
           tr("Behind --dp 2, the cache-aware router prefills clearly fewer tokens than round robin: {dp}", dp=dp))
    expect(results["dp_equal"], True, tr("The same requests get the same answers through either router"))
    expect(results["dp_left_behind"], [], tr("No process is left after stopping the --dp 2 server"))
