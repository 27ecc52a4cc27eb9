"""CPU 小批量线性层内核（minisgl/kernel）：编得出来、与 F.linear 一致、与线程数无关、编不出来时退回 oneDNN。"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from minisgl import kernel, model_zoo
from minisgl.engine import Engine, EngineConfig
from minisgl.layers import Linear


@pytest.fixture
def fresh_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """另一个缓存目录、清掉已加载的库：这个测试里重新编一次。"""
    monkeypatch.setenv("MINISGL_KERNEL_CACHE", str(tmp_path))
    kernel.library.cache_clear()
    yield tmp_path
    kernel.library.cache_clear()


def test_builds_once_and_is_cached(fresh_build: Path) -> None:
    assert kernel.available(), "the CI machine has a C compiler: the kernel must build"
    built = list(fresh_build.glob("cpu_kernels-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    kernel.library.cache_clear()
    assert kernel.available() and built[0].stat().st_mtime_ns == stamp, "a second load must reuse the cached build"


def test_falls_back_without_a_compiler(fresh_build: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CC", "false")  # 一个总是失败的“编译器”
    assert not kernel.available()
    assert "oneDNN" in capsys.readouterr().err
    engine = Engine(EngineConfig(str(model_zoo.tiny_qwen3()), num_page_override=64, max_seq_len_override=32))
    try:
        assert engine.linear_kind == "onednn", "without the kernel the engine must fall back to oneDNN"
    finally:
        engine.shutdown()


@pytest.mark.parametrize(("n", "k"), [(4, 8), (7, 16), (13, 24), (256, 64), (1030, 128)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_f_linear(n: int, k: int, bias: bool) -> None:
    assert kernel.available()
    gen = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    for m in (0, 1, 2, 3, 4, 5, 7, 8, 9, 40, kernel.MAX_ROWS + 1):  # 最后一个走 F.linear
        x = torch.randn(m, k, generator=gen)
        got = kernel.cpu_linear(x, w, b)
        assert got.shape == (m, n)
        torch.testing.assert_close(got, F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    x3 = torch.randn(2, 3, k, generator=gen)
    torch.testing.assert_close(kernel.cpu_linear(x3, w, b), F.linear(x3, w, b), atol=1e-4, rtol=1e-4)


def test_result_does_not_depend_on_threads() -> None:
    """每个输出由一个线程按固定顺序求和：换线程数，结果逐位相同（引擎的输出不随机器的核数变）。"""
    w, x = torch.randn(515, 64), torch.randn(8, 64)
    threads = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(kernel.cpu_linear(x, w))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_linear_pack_kinds() -> None:
    """``pack("kernel")`` 保留原权重；内核不认的形状（输入维不是 8 的倍数）退回 oneDNN。"""
    x = torch.randn(3, 16)
    op = Linear(16, [4, 6], dtype=torch.float32, device="cpu")
    op.weight.copy_(torch.randn(10, 16))
    want = op.forward(x)
    weight = op.weight
    op.pack("kernel")
    assert op.weight is weight and op._kernel and op._packed is None
    torch.testing.assert_close(op.forward(x), want, atol=1e-5, rtol=1e-5)
    odd = Linear(12, 5, dtype=torch.float32, device="cpu")
    odd.weight.copy_(torch.randn(5, 12))
    want = odd.forward(x[:, :12])
    odd.pack("kernel")
    assert not odd._kernel and odd._packed is not None and odd.weight is None
    torch.testing.assert_close(odd.forward(x[:, :12]), want, atol=1e-5, rtol=1e-5)
