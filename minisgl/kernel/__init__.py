"""CPU 上的 C 内核：小批量的线性层（``cpu_linear.c``，引擎选项 ``EngineConfig.cpu_kernel``）和一整步解码的
全部解码层（``cpu_decode.c``，引擎选项 ``EngineConfig.cpu_fused_decode``，见 ``minisgl/fused.py``）。都不是某一章的内容。

小批次解码每步要把全部权重从内存读一遍，线性层几乎只是在搬数据。PyTorch 在 CPU 上现成的两条路在这里都吃亏
（数字见 ``bench/README.md``）：MKL 的 ``F.linear`` 在 M = 8 时比内核慢一倍（Zen 1 上 M = 1 时还只用一个线程）；
oneDNN 要另打包一份权重，在 Zen 1 上只用到读带宽的六七成。这个几十行的 C 内核把几行权重读进来一次、同时乘
好几行输入，M = 1 时接近读带宽。它不给输入分块，所以输入行数多了（长提示词的预填充）MKL 的分块矩阵乘更快。在哪儿换因机器而异（AVX2 的
Zen 1 上约 256 行，AVX-512 的至强上 16–32 行），所以每种权重形状第一次用到时现量一次（:func:`max_rows`），
结果按 CPU 和线程数缓存，打印一行 ``线性层 …``；环境变量 ``MINISGL_KERNEL_MAX_ROWS=N`` 跳过测量、一律用 N。

第一次用到时用系统的 C 编译器（``cc``，可以用环境变量 ``CC`` 换）按这颗 CPU 最宽的向量指令集现编一次
（``-march=native``：AVX-512、AVX2 或 NEON），结果按源码、编译选项和机器缓存在 ``~/.cache/minisgl/kernels``
（``MINISGL_KERNEL_CACHE`` 可以换位置），之后直接加载。没有编译器、编译失败或不是 x86-64 / ARM64 时
:func:`available` 返回 False，引擎退回 oneDNN——慢一些，结果一样对。
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from minisgl.i18n import tr

__all__ = ["SOURCES", "available", "calibrate", "cpu_linear", "kernel_linear", "library", "max_rows", "supports"]

SOURCES = [Path(__file__).with_name(name) for name in ("cpu_linear.c", "cpu_decode.c")]
FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC"]
ROW_STEPS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # 测量时试的行数
MARGIN = 1.1  # F.linear 要快过一成才算赢：只差一点时留给内核（它的结果与线程数无关）
COLD_BYTES = 512 << 20  # 测量时轮流用这么多字节的权重副本：比常见的最后一级缓存大，每次调用都从内存读权重
_PTR, _I64 = ctypes.c_void_p, ctypes.c_int64


def cache_dir() -> Path:
    if path := os.environ.get("MINISGL_KERNEL_CACHE"):
        return Path(path)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minisgl" / "kernels"


def _cpu_id() -> str:
    """这颗 CPU 的型号和指令集：``-march=native`` 编出来的库只能在同样的 CPU 上用（家目录可能被几台机器共用）。"""
    info = Path("/proc/cpuinfo")
    if info.is_file():
        lines = info.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags", "Features", "CPU part"))}))
    return platform.processor()


def _build(compiler: str) -> Path:
    """编译（已有同一份就直接用）。先写到临时文件再改名：几个进程同时编也不会读到半个文件。"""
    sources = [src.read_text(encoding="utf-8") for src in SOURCES]
    key = "\n".join([*sources, compiler, *FLAGS, platform.machine(), _cpu_id()])
    target = cache_dir() / f"cpu_kernels-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, *map(str, SOURCES), "-o", tmp, "-lm"], check=True, capture_output=True, text=True)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """编好的库（第一次调用时编译）；编不出来时返回 None。"""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None or platform.machine().lower() not in ("x86_64", "amd64", "aarch64", "arm64"):
        return None
    try:
        lib = ctypes.CDLL(str(_build(compiler)))  # torch 已经加载了 libgomp：内核与 PyTorch 共用一个线程池
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", None) or err
        print(tr("The CPU linear kernel could not be compiled; falling back to oneDNN: {detail}", detail=str(detail).strip()[:300]),
              file=sys.stderr)
        return None
    lib.cpu_linear.argtypes = [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64]
    lib.cpu_linear.restype = None
    lib.cpu_linear_bf16w.argtypes = [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64]
    lib.cpu_linear_bf16w.restype = None
    lib.cpu_decode.argtypes = [_PTR] * 8 + [_I64, _PTR, _PTR, _I64, _PTR]  # 各参数见 cpu_decode.c
    lib.cpu_decode.restype = None
    lib.cpu_decode_work_floats.argtypes = [_PTR, _I64]
    lib.cpu_decode_work_floats.restype = _I64
    return lib


def available() -> bool:
    """内核能用吗（第一次调用时编译，可能要一两秒）。"""
    return library() is not None


def supports(weight: torch.Tensor) -> bool:
    """这块权重能走内核吗：CPU 上连续的 fp32 或 bf16，输入维是 8 的倍数。"""
    return (
        weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16) and weight.dim() == 2
        and weight.is_contiguous() and weight.shape[1] % 8 == 0
    )


def isa() -> str:
    """内核编成了哪种向量指令（``-march=native`` 按这颗 CPU 选最宽的）。"""
    flags = _cpu_id().split()
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "NEON" if "asimd" in flags else "SSE"


def kernel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``，不论几行都用 C 内核（``weight`` 要满足 :func:`supports`，先确认 :func:`available`）。

    每步要调用上百次，所以只做必要的事：二维、连续的 fp32 输入（引擎里的常态）不做任何变形。bf16 权重时
    输入和偏置先转成 fp32（几行而已），内核读 bf16 权重、fp32 累加，结果再舍入回 bf16——读的字节减半。
    """
    n, k = weight.shape
    x2 = x if x.dim() == 2 else x.reshape(-1, k)
    x2 = x2.float().contiguous()  # 已是连续的 fp32 时两步都不复制
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=torch.float32)
    if m:
        fn = library().cpu_linear_bf16w if weight.dtype == torch.bfloat16 else library().cpu_linear
        b = None if bias is None else bias.float()
        fn(x2.data_ptr(), weight.data_ptr(), None if b is None else b.data_ptr(), y.data_ptr(), m, k, n)
    y = y.to(weight.dtype)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n)


def cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``：不超过 :func:`max_rows` 行时用 C 内核，更多行交给 ``F.linear``（MKL）。"""
    rows = x.numel() // weight.shape[1]
    if rows > max_rows(weight):
        return F.linear(x, weight, bias)
    return kernel_linear(x, weight, bias)


_chosen: dict[tuple[int, int, torch.dtype, int], int] = {}  # (K, N, 类型, 线程数) → 这个进程里已定的行数


def max_rows(weight: torch.Tensor) -> int:
    """这种形状的权重，内核用到几行为止（含）。

    第一次遇到一种形状（这颗 CPU、这个线程数、这个 PyTorch）时现量一次（:func:`calibrate`，大权重要几秒），
    结果存进编好的库旁边的 JSON，打印一行；之后直接查表。``MINISGL_KERNEL_MAX_ROWS=N`` 时一律是 N，不量。
    """
    if (forced := os.environ.get("MINISGL_KERNEL_MAX_ROWS")) is not None:
        if not forced.strip().isdigit():
            raise ValueError(tr("MINISGL_KERNEL_MAX_ROWS={value!r} is not a row count: set a whole number ≥ 0 "
                                "(0: always F.linear), or unset it to measure on this CPU", value=forced))
        return int(forced)
    n, k = weight.shape
    key = (k, n, weight.dtype, torch.get_num_threads())
    if key not in _chosen:
        path, dtype = plan_path(), str(weight.dtype).removeprefix("torch.")
        name = f"{k}x{n}" + ("" if weight.dtype == torch.float32 else f"-{dtype}")
        if (rows := _read_plan(path).get(name)) is None:
            rows = calibrate(weight)
            _write_plan(path, {**_read_plan(path), name: rows})  # 几个进程同时量也不丢别人量的形状
            print(tr("Linear layer {k}→{n} ({dtype}): the C kernel ({isa}) up to {rows} rows, F.linear (MKL) beyond "
                     "(measured once on this CPU with {threads} threads, saved in {path})",
                     k=k, n=n, dtype=dtype, isa=isa(), rows=rows, threads=key[3], path=path), file=sys.stderr)
        _chosen[key] = rows
    return _chosen[key]


def plan_path() -> Path:
    """量出来的表存在哪儿：编好的库旁边，按库（源码 + CPU）、PyTorch 版本和线程数各存一份。"""
    lib = Path(library()._name)  # noqa: SLF001
    return lib.with_name(f"{lib.stem}.rows-torch{torch.__version__}-t{torch.get_num_threads()}.json")


def _read_plan(path: Path) -> dict[str, int]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write_plan(path: Path, plan: dict[str, int]) -> None:
    """先写临时文件再改名：别的进程不会读到半个文件。"""
    fd, tmp = tempfile.mkstemp(suffix=".json", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(plan, f, indent=0, sort_keys=True)
    os.replace(tmp, path)


def _race(fns: list[Callable[[], object]], rounds: int = 7, batch_s: float = 1e-3) -> list[float]:
    """每个函数一次调用的秒数。各自先定每批调用几次（一批至少 ``batch_s`` 秒，计时器的误差才可以忽略），然后
    轮流各跑一批、跑 ``rounds`` 轮，取各自最快一批的平均：轮流跑，机器忽快忽慢时两边吃到的一样；取最快，偶尔被
    打断的那批不算。"""
    calls = []
    for fn in fns:
        start = time.perf_counter()
        fn()
        calls.append(max(1, int(batch_s / max(time.perf_counter() - start, 1e-7))))
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, (fn, n) in enumerate(zip(fns, calls)):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            best[i] = min(best[i], (time.perf_counter() - start) / n)
    return best


def calibrate(weight: torch.Tensor, measure: Callable[[int], tuple[float, float]] | None = None) -> int:
    """内核用到几行：依次试 :data:`ROW_STEPS`，``measure(m)`` 给出 m 行时 (内核的秒数, ``F.linear`` 的秒数)，
    缺省用这块权重的几份副本现量。F.linear 要快过 :data:`MARGIN` 才算赢。

    结果是第一次确认 F.linear 赢之前、内核最后赢的行数（0：一次都没赢）。M ≥ 8 时输一次要重量一遍，两遍都输才算数：
    一次偶然的慢就把解码的批大小让给 F.linear，代价是每一步都慢。M < 8 的输不停：M = 1、2 时两边都卡在读带宽，
    输赢常常只是噪声。
    """
    if measure is None:
        # 解码时权重从内存来，不在缓存里：轮流用几份副本（合计约 COLD_BYTES，最多 256 份）量，才量得到这一点
        copies = max(1, min(256, COLD_BYTES // (weight.numel() * weight.element_size())))
        ws = list(weight.unsqueeze(0).expand(copies, -1, -1).contiguous().unbind(0))

        def measure(m: int) -> tuple[float, float]:
            x = torch.randn(m, weight.shape[1], dtype=weight.dtype)
            for_kernel, for_torch = itertools.cycle(ws), itertools.cycle(ws)
            kernel_s, torch_s = _race([lambda: kernel_linear(x, next(for_kernel)), lambda: F.linear(x, next(for_torch))])
            return kernel_s, torch_s  # 两个都是秒

    def kernel_wins(m: int) -> bool:
        kernel_s, torch_s = measure(m)
        return kernel_s <= torch_s * MARGIN

    rows = 0
    for m in ROW_STEPS:
        if kernel_wins(m) or (m >= 8 and kernel_wins(m)):
            rows = m
        elif m >= 8:
            break
    return rows
