"""CPU 小批量线性层内核（minisgl/kernel）：编得出来、与 F.linear 一致、与线程数无关、编不出来时退回 oneDNN；
内核用到几行、要不要换成 oneDNN 由第一次用到时的测量决定：量一次、存下来、可以用环境变量指定。"""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

from checks.hf_reference import greedy_reference
from minisgl import kernel, model_zoo
from minisgl.core import SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.i18n import tr
from minisgl.layers import Linear
from minisgl.llm import LLM


@pytest.fixture
def fresh_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """另一个缓存目录、清掉已加载的库：这个测试里重新编一次。"""
    monkeypatch.setenv("MINISGL_KERNEL_CACHE", str(tmp_path))
    kernel.forget_choices()
    kernel.library.cache_clear()
    yield tmp_path
    kernel.forget_choices()
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
    engine = Engine(EngineConfig(str(model_zoo.tiny_qwen3()), dtype=torch.float32, device="cpu", num_page_override=64,
                                 max_seq_len_override=32))
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
    # 每种余下的行数（AVX2 每趟 3 行，AVX-512 每趟 6 行）；32 行起换成矩阵乘的分块，也走遍余下的行数
    for m in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 32, 33, 34, 35, 40, 41, 300):
        x = torch.randn(m, k, generator=gen)
        got = kernel.kernel_linear(x, w, b)
        assert got.shape == (m, n)
        torch.testing.assert_close(got, F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    x3 = torch.randn(2, 3, k, generator=gen)
    torch.testing.assert_close(kernel.kernel_linear(x3, w, b), F.linear(x3, w, b), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(kernel.cpu_linear(x3, w, b), F.linear(x3, w, b), atol=1e-4, rtol=1e-4)


def test_result_does_not_depend_on_threads() -> None:
    """每个输出由一个线程按固定顺序求和：换线程数，结果逐位相同（引擎的输出不随机器的核数变）。"""
    w = torch.randn(515, 264)
    threads = torch.get_num_threads()
    for rows in (8, 45):  # 解码的分块与预填充的矩阵乘分块（K 分两段）
        x = torch.randn(rows, 264)
        try:
            outs = []
            for t in (1, 2, 3):
                torch.set_num_threads(t)
                outs.append(kernel.kernel_linear(x, w))
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), rows


@pytest.mark.parametrize("onednn", [False, True])
def test_linear_pack_kinds(onednn: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pack("kernel")`` 走内核；``pack("auto")`` 按量出来的选择走内核或 oneDNN；内核不认的形状（输入维不是
    8 的倍数）一律退回 oneDNN。不论哪条，``weight`` 都还是原来那块、值不变（oneDNN 的布局是另存的副本）。"""
    monkeypatch.setattr(kernel, "choice", lambda w: kernel.Choice(1, 4, onednn=onednn))
    x = torch.randn(3, 16)
    for kind in ("kernel", "auto"):
        op = Linear(16, [4, 6], dtype=torch.float32, device="cpu")
        op.weight.copy_(torch.randn(10, 16))
        want = op.forward(x)
        weight, before = op.weight, op.weight.clone()
        op.pack(kind)
        assert op.weight is weight and torch.equal(op.weight, before)
        if kind == "auto" and onednn:
            assert not op._kernel and op.packed_nbytes() == weight.nbytes
        else:
            assert op._kernel and op.packed_nbytes() == 0
        torch.testing.assert_close(op.forward(x), want, atol=1e-5, rtol=1e-5)
    odd = Linear(12, 5, dtype=torch.float32, device="cpu")
    odd.weight.copy_(torch.randn(5, 12))
    want = odd.forward(x[:, :12])
    odd.pack("kernel")
    assert not odd._kernel and odd.packed_nbytes() == odd.weight.nbytes
    torch.testing.assert_close(odd.forward(x[:, :12]), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
def test_engine_follows_the_measured_choice(fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """每种形状都量出 oneDNN 更快时：缺省的引擎把线性层都打包成 oneDNN，结果仍与 HF 逐 token 相同；开着融合解码时
    一律留原样的权重（C 函数直接读它们）。"""
    monkeypatch.setattr(kernel, "choice", lambda w: kernel.Choice(1, 8, onednn=True))
    path, prompts = model_zoo.tiny_qwen3(), [[100 + 7 * i + j for j in range(3 + 4 * i)] for i in range(3)]
    want = greedy_reference(path, prompts, 6)
    llm = LLM(path, dtype=torch.float32, device="cpu", max_running_req=2, num_page_override=64, max_seq_len_override=32,
              page_size=4, cpu_fused_decode=fused)
    try:
        linears = [op for _, op in llm.engine.model.named_ops() if isinstance(op, Linear)]
        packed = [op._packed is not None for op in linears]
        got = [r["token_ids"] for r in llm.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))]
    finally:
        llm.shutdown()
    assert llm.engine.linear_kind == "kernel" and packed == [not fused] * len(linears), packed
    assert got == want


def test_calibration_rule() -> None:
    """输了的行数重量一遍；解码的批大小（< 8 行）输了也接着量，之后 F.linear 确认赢了就停；内核用到停之前它最后赢的
    行数，从那往下 F.linear 赢过的行数以下都给 F.linear。"""

    def fake(kernel_wins: set[int], second_try_wins: frozenset[int] = frozenset()):  # noqa: ANN202
        asked: list[int] = []

        def measure(m: int) -> kernel.Timing:
            asked.append(m)
            win = m in kernel_wins or (m in second_try_wins and asked.count(m) == 2)
            return (1.0, 2.0, 3.0) if win else (2.0, 1.0, 3.0)  # (内核, F.linear, oneDNN) 的秒数

        return measure, asked

    w = torch.empty(0, 8)
    measure, asked = fake({4, 8, 16, 64})
    assert kernel.calibrate(w, measure) == kernel.Choice(3, 16), "F.linear keeps M ≤ 2, where it won; M = 32 ends it"
    assert asked == [1, 1, 2, 2, 4, 8, 16, 32, 32]
    measure, asked = fake({8, 16}, frozenset({1, 2, 4, 32, 64}))
    assert kernel.calibrate(w, measure) == kernel.Choice(1, 64), "a loss that the second try does not confirm is noise"
    assert asked == [1, 1, 2, 2, 4, 4, 8, 16, 32, 32, 64, 64, 128, 128]
    measure, asked = fake(set())
    assert kernel.calibrate(w, measure) == kernel.Choice(1, 0), "the kernel never won: F.linear everywhere"
    assert asked == [1, 1, 2, 2, 4, 4, 8, 8], "losses below M = 8 must not stop the measuring"
    measure, asked = fake({1, 4}, frozenset({8}))
    assert kernel.calibrate(w, measure) == kernel.Choice(3, 8) and asked == [1, 2, 2, 4, 8, 8, 16, 16]
    measure, asked = fake(set(kernel.ROW_STEPS))
    assert kernel.calibrate(w, measure) == kernel.Choice(1, kernel.ROW_STEPS[-1]) and asked == list(kernel.ROW_STEPS)


@pytest.mark.parametrize(("decode", "more", "onednn"), [
    (0.8, 1.0, True),    # 解码的批大小上快两成，更多行上打平：换
    (0.95, 0.5, False),  # 解码上只快 5%（不到一成）：不换，哪怕更多行上快一倍
    (0.8, 1.2, False),   # 解码上快，更多行上慢两成：不换
    (1.2, 1.0, False),
])
def test_onednn_rule(decode: float, more: float, onednn: bool) -> None:
    """oneDNN 的打包布局要在解码的批大小（≤ 8 行）上平均快过一成、在量过的更多行上平均不慢过一成，才整个换成它；
    比的是原样权重实际会走的那条（M = 1 和 32 起 F.linear，2–16 行内核）。"""

    def measure(m: int) -> kernel.Timing:
        kernel_s, torch_s = (1.0, 2.0) if 2 <= m <= 16 else (2.0, 1.0)
        return kernel_s, torch_s, min(kernel_s, torch_s) * (decode if m <= 8 else more)

    chosen = kernel.calibrate(torch.empty(0, 8), measure)
    assert chosen == kernel.Choice(2, 16, onednn=onednn), chosen
    assert kernel.calibrate(torch.empty(0, 8), lambda m: (*measure(m)[:2], None)) == kernel.Choice(2, 16), (
        "where oneDNN cannot run this dtype, it is never chosen")


def test_rows_measured_once_then_read_back(fresh_build: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """第一次遇到一种形状时量、打印一行、存进库旁边的 JSON；换个进程（清掉内存里的表）直接读文件，不再量。"""
    w, x = torch.randn(24, 16), torch.randn(5, 16)
    torch.testing.assert_close(kernel.cpu_linear(x, w), F.linear(x, w), atol=1e-4, rtol=1e-4)
    err = capsys.readouterr().err
    plan = kernel.plan_path()
    assert "16→24" in err and str(plan) in err, err
    saved = json.loads(plan.read_text())["16x24"]
    assert plan.parent == fresh_build and {k: saved[k] for k in vars(kernel.choice(w))} == vars(kernel.choice(w))
    kernel.forget_choices()
    monkeypatch.setattr(kernel, "calibrate", lambda *a: pytest.fail("a saved choice must be read back, not measured again"))
    plan.write_text(json.dumps({"16x24": {"kernel_from": 2, "kernel_to": 3, "onednn": True}}))
    assert kernel.choice(w) == kernel.Choice(2, 3, onednn=True) and capsys.readouterr().err == ""
    with pytest.raises(pytest.fail.Exception):  # 没量过的形状照样要量
        kernel.cpu_linear(torch.randn(2, 16), torch.randn(8, 16))


@pytest.mark.parametrize("rows", [0, 4])
def test_dispatch_follows_the_row_count(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """不超过那个行数走内核，更多行走 F.linear；``MINISGL_KERNEL_MAX_ROWS`` 给了就不量，也不换 oneDNN。"""
    monkeypatch.setenv("MINISGL_KERNEL_MAX_ROWS", str(rows))
    monkeypatch.setattr(kernel, "calibrate", lambda *a: pytest.fail("a row count given by the setting is not measured"))
    used: list[str] = []
    real_kernel, real_linear = kernel.kernel_linear, F.linear
    monkeypatch.setattr(kernel, "kernel_linear", lambda *a: used.append("kernel") or real_kernel(*a))
    monkeypatch.setattr(kernel.F, "linear", lambda *a: used.append("torch") or real_linear(*a))
    w = torch.randn(8, 16)
    assert kernel.choice(w) == kernel.Choice(1, rows)
    for m in (1, 4, 5, 9):
        kernel.cpu_linear(torch.randn(m, 16), w)
    assert used == ["kernel" if m <= rows else "torch" for m in (1, 4, 5, 9)]
    kernel.cpu_linear(torch.randn(2, 3, 16), w)  # 三维输入按总行数（6）算
    assert used[-1] == "torch"
    used.clear()
    monkeypatch.setattr(kernel, "choice", lambda w: kernel.Choice(3, 5))  # 量出来的：M ≤ 2 时 F.linear 更快
    for m in (1, 2, 3, 5, 6):
        kernel.cpu_linear(torch.randn(m, 16), w)
    assert used == ["torch", "torch", "kernel", "kernel", "torch"]


@pytest.mark.parametrize("value", ["-1", "many", "2.5"])
def test_bad_row_setting_says_what_to_do(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_KERNEL_MAX_ROWS", value)
    with pytest.raises(ValueError, match=re.escape(f"MINISGL_KERNEL_MAX_ROWS={value!r}")):
        kernel.cpu_linear(torch.randn(1, 16), torch.randn(8, 16))


def test_forced_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MINISGL_KERNEL_ONEDNN=1``：不量，每种形状都打包成 oneDNN 的布局，引擎为融合解码要的 ``pack("kernel")`` 也一样；
    与 ``MINISGL_KERNEL_MAX_ROWS`` 同时给、或者给了别的值，都说清楚该怎么设。"""
    monkeypatch.setenv("MINISGL_KERNEL_ONEDNN", "1")
    monkeypatch.setattr(kernel, "calibrate", lambda *a: pytest.fail("a path forced by the setting is not measured"))
    assert kernel.choice(torch.randn(8, 16)) == kernel.Choice(1, 0, onednn=True)
    for kind in ("kernel", "auto"):
        op = Linear(16, 8, dtype=torch.float32, device="cpu")
        op.weight.copy_(torch.randn(8, 16))
        op.pack(kind)
        assert not op._kernel and op.packed_nbytes() == op.weight.nbytes, kind
    monkeypatch.setenv("MINISGL_KERNEL_MAX_ROWS", "8")
    with pytest.raises(ValueError, match="MINISGL_KERNEL_MAX_ROWS .* MINISGL_KERNEL_ONEDNN=1"):
        kernel.forced()
    monkeypatch.delenv("MINISGL_KERNEL_MAX_ROWS")
    monkeypatch.setenv("MINISGL_KERNEL_ONEDNN", "yes")
    with pytest.raises(ValueError, match=re.escape("MINISGL_KERNEL_ONEDNN='yes'")):
        kernel.forced()


def test_choice_measured_on_a_busy_machine_expires(fresh_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """量的时候别的进程占着核：选择照用，但存下的那条带过期时间，过期之后第一个用到它的进程重量；安静时量的一直留着。"""
    w = torch.randn(24, 16)
    measured: list[float] = []

    def watched(fn):  # noqa: ANN001, ANN202 - 别的进程占了多少个核由这个测试定
        measured.append(1)
        return kernel.Choice(1, 4), busy

    monkeypatch.setattr(kernel, "measured_while_watching", watched)
    for busy, expires in ((0.0, False), (1.5, True)):
        kernel.forget_choices()
        kernel.plan_path().unlink(missing_ok=True)
        assert kernel.choice(w) == kernel.Choice(1, 4)
        saved = json.loads(kernel.plan_path().read_text())["16x24"]
        assert ("expires" in saved) == expires, saved
    kernel.forget_choices()
    kernel.choice(w)
    assert len(measured) == 2, "an entry that has not expired yet is read back"
    plan = json.loads(kernel.plan_path().read_text())
    plan["16x24"]["expires"] = 0
    kernel.plan_path().write_text(json.dumps(plan))
    kernel.forget_choices()
    kernel.choice(w)
    assert len(measured) == 3, "an expired entry is measured again"


def test_busy_cores_are_seen() -> None:
    """另一个进程占满一个核的时候，``measured_while_watching`` 看得出来（本进程自己的 CPU 时间不算）。"""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        _, busy = kernel.measured_while_watching(lambda: time.sleep(1.0) or kernel.Choice(1, 0))
    finally:
        hog.kill()
        hog.wait()
    assert busy >= 0.4, busy


@pytest.mark.parametrize(("n", "k"), [(7, 16), (13, 24), (1030, 128)])
def test_bf16_weights(n: int, k: int) -> None:
    """bf16 权重：内核 fp32 累加，结果只差最后一次舍入到 bf16（相对这一行最大值不超过 2⁻⁸）。"""
    gen = torch.Generator().manual_seed(n + k)
    w, b = torch.randn(n, k, generator=gen).bfloat16(), torch.randn(n, generator=gen).bfloat16()
    assert kernel.supports(w)
    for m in (1, 2, 5, 7, 8, 13, 40):
        x = torch.randn(m, k, generator=gen).bfloat16()
        got = kernel.kernel_linear(x, w, b)
        want = F.linear(x.float(), w.float(), b.float())
        assert got.dtype == torch.bfloat16 and got.shape == (m, n)
        torch.testing.assert_close(got.float(), want, atol=want.abs().max().item() * 2**-8, rtol=0)



def _rounding_probe() -> tuple[torch.Tensor, torch.Tensor]:
    """x = (1 + 2⁻⁹, −1, 0, …)，w = (1, 1, 0, …)：x 按 fp32 乘时 y = 2⁻⁹（bf16 也表示得出）；x 先舍入成 bf16 时
    1 + 2⁻⁹ 变成 1（bf16 在 1 附近的间距是 2⁻⁷），y = 0。据此看出内核走的是哪条路。"""
    x, w = torch.zeros(1, 8), torch.zeros(1, 8, dtype=torch.bfloat16)
    x[0, :2] = torch.tensor([1 + 2**-9, -1.0])
    w[0, :2] = 1
    return x, w


@pytest.mark.parametrize(("n", "k"), [(7, 8), (13, 24), (9, 40), (66, 72), (1030, 128), (21, 584)])
def test_bf16_dot_product_path(n: int, k: int) -> None:
    """AVX512_BF16 的点积（vdpbf16ps）：输入舍入成 bf16、bf16 对相乘、fp32 累加，结果舍入成 bf16。

    对照 F.linear 在 fp32 里算舍入成 bf16 的输入：bf16 对的乘积在 fp32 里是精确的，只差求和顺序（fp32，误差远小于
    bf16 的间距）和最后一次舍入到 bf16（不超过结果的 2⁻⁹），所以容差是这一行最大绝对值的 2⁻⁸（留一倍余量）。
    K 取 32 的倍数和不是的（最后一段用掩码读）；行数取 0–13 和 40，走遍每种余下的行数（AVX-512 每趟 6 行）。
    """
    if not kernel.bf16_dot():
        pytest.skip(tr("this CPU lacks the avx512_bf16 flag (no vdpbf16ps): bf16 weights take the 16-bit-shift path, "
                       "checked by test_bf16_weights"))
    gen = torch.Generator().manual_seed(n * k + 1)
    w, b = torch.randn(n, k, generator=gen).bfloat16(), torch.randn(n, generator=gen)
    assert kernel.supports(w) and not kernel.supports(torch.zeros(n, k + 4, dtype=torch.bfloat16)), tr(
        "the kernel takes K a multiple of 8 and refuses the others (they go to oneDNN)")
    for m in (*range(14), 40):
        x = torch.randn(m, k, generator=gen)
        for bias in (None, b):
            got = kernel.kernel_linear(x, w, bias)
            assert got.dtype == torch.bfloat16 and got.shape == (m, n)
            want = F.linear(x.bfloat16().float(), w.float(), bias)
            tol = want.abs().amax(dim=1, keepdim=True) * 2**-8
            bad = (got.float() - want).abs() > tol
            assert not bad.any(), tr("bf16 dot product, M={m}, N={n}, K={k}: {count} outputs off by more than 2^-8 of "
                                     "their row's largest value", m=m, n=n, k=k, count=int(bad.sum()))
    x3 = torch.randn(2, 3, k, generator=gen).bfloat16()
    assert torch.equal(kernel.kernel_linear(x3, w, b), kernel.kernel_linear(x3.view(6, k), w, b).view(2, 3, n))
    x, w = _rounding_probe()
    assert kernel.kernel_linear(x, w).item() == 0, tr("the dot-product path rounds the activations to bf16")


@pytest.mark.parametrize("flag", ["-mno-avx512bf16", "-mno-avx512f"])
def test_builds_without_avx512_bf16(flag: str, fresh_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """编译器不给 AVX512_BF16（或整个 AVX-512）时照样编得出来：bf16 权重走左移 16 位的那条，输入留在 fp32。
    用一个在命令行末尾加上 ``flag`` 的编译器包装脚本模拟没有这些指令的 CPU。"""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(tr("{flag} is an x86-64 compiler flag; this machine is {machine}", flag=flag, machine=platform.machine()))
    wrapper = fresh_build / "cc-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec "{shutil.which("cc")}" "$@" {flag}\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    assert kernel.available(), tr("the kernel must build with {flag}", flag=flag)
    assert not kernel.bf16_dot(), tr("built with {flag}, the library must not claim the AVX512_BF16 dot product", flag=flag)
    gen = torch.Generator().manual_seed(7)
    w, b = torch.randn(13, 40, generator=gen).bfloat16(), torch.randn(13, generator=gen).bfloat16()
    for m in (1, 5, 7, 13):
        x = torch.randn(m, 40, generator=gen)
        want = F.linear(x, w.float(), b.float())  # 这条路的输入不舍入
        torch.testing.assert_close(kernel.kernel_linear(x, w, b).float(), want, atol=want.abs().max().item() * 2**-8, rtol=0)
        wf = torch.randn(13, 40, generator=gen)
        torch.testing.assert_close(kernel.kernel_linear(x, wf), F.linear(x, wf), atol=1e-4, rtol=1e-4)
    x, w = _rounding_probe()
    assert kernel.kernel_linear(x, w).item() == 2**-9, tr("the shift path keeps the activations in fp32")


#: 提示词（SmolLM2 的 token id："The capital of France is"、"1, 2, 3, 4, 5, 6,"、"A B C D E F"）和每个生成几个 token。
BF16_PROMPTS = [[504, 3575, 282, 4649, 314], [33, 28, 216, 34, 28, 216, 35, 28, 216, 36, 28, 216, 37, 28, 216, 38, 28],
                [49, 389, 340, 422, 414, 426]]
BF16_NEW_TOKENS = 8
#: HF 的 logits 里最大的两个相差不到这么多时，两个 bf16 实现选哪个都对：从那个位置起不再比。量过：这几个提示词上
#: HF 的 bf16 与 fp32 的这个差距最多相差 0.45（多数不到 0.2），bf16 实现之间的出入不会比这更大。
BF16_MARGIN = 0.75


def test_bf16_engine_matches_hf_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """引擎用 bf16（线性层全走内核：有 AVX512_BF16 时就是点积那条）与 Hugging Face 用 bf16 跑同一个模型，贪心输出
    逐 token 相同——比到 HF 第一次“犹豫”的位置为止。

    两个 bf16 实现的求和顺序不同，logits 会差零点几（SmolLM2 的 logits 最大在 15–35 之间，bf16 在那里的间距是
    1/16–1/8，再经过 30 层的累积）。所以容差规则是：HF 每一步最大的两个 logits 相差不到 BF16_MARGIN（0.75）时，
    这一步选哪个都算对，从这一步起不再比（之后的上下文已可能不同）；在那之前必须逐 token 相同，并且至少比了
    一半的 token（否则这条检查什么也没证明）。HF 那边对“提示词 + 我们的输出”做一次前向（比逐步生成快）：到第一个
    不同的 token 为止，上下文与 HF 自己贪心生成时相同。
    """
    monkeypatch.setenv("MINISGL_KERNEL_MAX_ROWS", "64")  # 预填充和解码都走内核；不量，也不换 oneDNN
    path = model_zoo.smollm2()
    llm = LLM(str(path), dtype=torch.bfloat16, device="cpu", max_running_req=4, num_page_override=256,
              max_seq_len_override=64)
    try:
        assert llm.engine.linear_kind == "kernel"
        params = SamplingParams(max_tokens=BF16_NEW_TOKENS, ignore_eos=True)
        ours = [r["token_ids"] for r in llm.generate(BF16_PROMPTS, params)]
    finally:
        llm.shutdown()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).eval()
    compared = 0
    for row, (prompt, got) in enumerate(zip(BF16_PROMPTS, ours)):
        with torch.inference_mode():  # 一次前向：第 i 行 logits 决定第 i 个生成的 token（前面都相同时就是 HF 的贪心那一步）
            logits = hf(torch.tensor([prompt + got])).logits[0, len(prompt) - 1 : -1].float()
        for i, scores in enumerate(logits):
            top, best = scores.topk(2)
            if top[0] - top[1] < BF16_MARGIN:
                break
            want = int(best[0])
            assert got[i] == want, tr("prompt {row}, token {i}: ours {got}, Hugging Face (bf16) {want}, whose top-2 "
                                         "logit margin there is {margin:.3f}", row=row, i=i, got=got[i], want=want,
                                         margin=float(top[0] - top[1]))
            compared += 1
    assert compared * 2 >= BF16_NEW_TOKENS * len(BF16_PROMPTS), tr(
        "only {compared} tokens had a top-2 margin of at least {bound}: the check proves too little",
        compared=compared, bound=BF16_MARGIN)


def test_every_prefetch_way_gives_the_same_bits() -> None:
    """预取的做法（按这颗 CPU 量出来选的）只改快慢：每一种下 fp32、int8、int4 内核的结果逐位相同，几行 x 都一样。"""
    lib = kernel.library()
    w, q = torch.randn(37, 64), torch.randint(-127, 128, (37, 64), dtype=torch.int8)
    packed, scale, zs = torch.randint(0, 256, (37, 32), dtype=torch.uint8), torch.rand(37, 2), torch.randn(37, 2)
    outputs: dict[str, list[torch.Tensor]] = {}
    try:
        for name in kernel.PREFETCH:
            lib.cpu_linear_set_prefetch(*kernel._prefetch_args(name))
            outputs[name] = [f(torch.randn(m, 64, generator=torch.Generator().manual_seed(m)))
                             for m in range(1, 10)
                             for f in (lambda x: kernel.kernel_linear(x, w), lambda x: kernel.q8_linear(x, q, scale[:, 0].contiguous()),
                                       lambda x: kernel.q4_linear(x, packed, scale, zs, 32))]
    finally:
        lib.cpu_linear_set_prefetch(*kernel._prefetch_args(lib.prefetch))
    first = next(iter(outputs.values()))
    for name, got in outputs.items():
        assert all(torch.equal(a, b) for a, b in zip(got, first)), tr("prefetch way {name} changed a result", name=name)


def test_a_bad_prefetch_setting_says_what_to_do(fresh_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_KERNEL_PREFETCH", "sideways")
    with pytest.raises(ValueError, match="lockstep-l2"):
        kernel.library()
