"""只量化权重（第 5.4 章）接进服务器之后的检查：``python -m minisgl --quantization int8wo --tp 2 --ep 2``（混合专家，
两个秩，专家分给各秩，重叠调度照常）的补全与一个进程里量化的离线引擎逐字相同，启动时报出量化后的权重字节；
坏的 ``--quantization`` 在加载任何东西之前被拒绝。第 5.4 章本身（量化、还原、打包、参考矩阵乘、内核、引擎对
Hugging Face）的检查在 ``checks/stage5/test_quantization.py``。

en: Checks of weight-only quantization (chapter 5.4) once it is part of the server: completions of ``python -m minisgl
--quantization int8wo --tp 2 --ep 2`` (a mixture of experts on two ranks, the experts dealt out to them, overlap
scheduling as usual) read exactly as those of the quantized offline engine in one process, the server reports the
quantized weight bytes at start, and a bad ``--quantization`` is refused before anything loads. Chapter 5.4 itself
(quantize, restore, pack, reference matmuls, the kernels, the engine against Hugging Face) is checked in
``checks/stage5/test_quantization.py``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from checks.common import expect
from checks.stage2.conftest import TINY_KW, built
from minisgl import model_zoo
from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.llm import LLM

pytestmark = pytest.mark.timeout(300)

#: tiny 模型的引擎参数，dtype 和 device 写明（与 Hugging Face 比对的检查都这样）。
#: en: the tiny model's engine settings, dtype and device stated (as every check comparing with Hugging Face does).
KW: dict[str, Any] = {**TINY_KW, "dtype": torch.float32, "device": "auto"}
MAX_TOKENS = 24
TEXTS = ["one two three four", "The capital of France is", "a b c d e f g"]


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    from checks.stage3.conftest import Server

    with Server(built(model_zoo.tiny_qwen3_moe), "--quantization", "int8wo", "--tp", "2", "--ep", "2", "--dtype",
                "float32", "--num-pages", "2048", "--max-seq-len", "512") as served:
        yield served


def test_served_int8_experts_on_two_ranks_equal_the_offline_engine(server: Any) -> None:
    """两个秩各量化自己的专家（--ep 2），注意力按头切开（--tp 2）：贪心补全与一个进程里的 int8 引擎相同。

    en: Each of two ranks quantizes its own experts (--ep 2) and attention is split by heads (--tp 2): greedy completions
    equal those of the int8 engine in one process.
    """
    llm = LLM(built(model_zoo.tiny_qwen3_moe), quantization="int8wo", **KW)
    try:
        want = [o["text"] for o in llm.generate(TEXTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))]
    finally:
        llm.shutdown()
    got = []
    for text in TEXTS:
        status, body = server.post("/v1/completions", {"prompt": text, "max_tokens": MAX_TOKENS, "temperature": 0,
                                                       "ignore_eos": True})
        assert status == 200, tr("POST /v1/completions answered {status}: {body}", status=status, body=body)
        got.append(body["choices"][0]["text"])
    expect(got, want, tr("completions of the int8wo server (--tp 2 --ep 2) against the int8wo offline engine"))
    assert "int8wo" in server.output and "MB" in server.output, tr(
        "the server's start-up output names the quantization and the weight bytes:\n{output}", output=server.output)


@pytest.mark.parametrize("value", ["int3", "int4wo-48", "int4wo-0"])
def test_a_bad_quantization_flag_is_refused_before_loading(value: str) -> None:
    """不认得的名字、不是 32 倍数的组：命令行就拒绝（退出码 2），说出认得的写法，不加载模型。

    en: An unknown name or a group that is not a multiple of 32: refused on the command line (exit code 2), naming the
    forms known, with no model loaded.
    """
    model = built(model_zoo.tiny_qwen3)
    done = subprocess.run([sys.executable, "-m", "minisgl", "--model", model, "--quantization", value],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "int4wo-G" in done.stderr, tr(
        "--quantization {value}: exit code {code}, output:\n{output}", value=value, code=done.returncode, output=done.stderr)


def test_quantization_needs_the_assembled_engine() -> None:
    """第 2.1 章的调度器自己不量化：给了 ``quantization`` 却没有组装的 ``weights`` 零件，在加载之前就拒绝，不悄悄不管。

    en: Chapter 2.1's scheduler does not quantize by itself: ``quantization`` given without the assembly's ``weights``
    part is refused before loading, not silently ignored.
    """
    from minisgl.scheduler import Scheduler

    with pytest.raises(ValueError, match="minisgl.llm.LLM"):
        Scheduler(built(model_zoo.tiny_qwen3), quantization="int8wo", **KW)
