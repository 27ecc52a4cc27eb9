"""CPU 上的 C 内核：小批量的线性层（``cpu_linear.c``，引擎选项 ``EngineConfig.cpu_kernel``）和一整步解码的
全部解码层（``cpu_decode.c``，引擎选项 ``EngineConfig.cpu_fused_decode``，见 ``minisgl/fused.py``）。都不是某一章的内容。

小批次解码每步要把全部权重从内存读一遍，线性层几乎只是在搬数据。PyTorch 在 CPU 上现成的两条路在这里都吃亏
（数字见 ``bench/README.md``）：MKL 的 ``F.linear`` 在 M = 1 时只用一个线程、在 AMD 处理器上 M = 8 时更慢；
oneDNN 打包后的线性层只用到读带宽的六七成。这个几十行的 C 内核把 4 行权重读进来一次、同时乘 3 行输入，
M = 1 时接近读带宽，M = 8 时接近乘加的峰值。它不给输入分块：输入超过 :data:`MAX_ROWS` 行（长提示词的预填充）
时每块权重都要把整个输入重读一遍，这时交给 ``F.linear``（MKL 分块的矩阵乘）更快。

第一次用到时用系统的 C 编译器（``cc``，可以用环境变量 ``CC`` 换）现编一次，结果按源码、编译选项和机器缓存在
``~/.cache/minisgl/kernels``（``MINISGL_KERNEL_CACHE`` 可以换位置），之后直接加载。没有编译器、编译失败或不是
x86-64 / ARM64 时 :func:`available` 返回 False，引擎退回 oneDNN——慢一些，结果一样对。
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from minisgl.i18n import tr

__all__ = ["SOURCES", "available", "cpu_linear", "library", "supports"]

SOURCES = [Path(__file__).with_name(name) for name in ("cpu_linear.c", "cpu_decode.c")]
FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC"]
MAX_ROWS = 256  # 更多行时 F.linear 更快（0.6B 的各层形状，M = 1024 时内核约慢三成）
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
    lib.cpu_decode.argtypes = [_PTR] * 8 + [_I64, _PTR, _PTR, _I64, _PTR]  # 各参数见 cpu_decode.c
    lib.cpu_decode.restype = None
    lib.cpu_decode_work_floats.argtypes = [_PTR, _I64]
    lib.cpu_decode_work_floats.restype = _I64
    return lib


def available() -> bool:
    """内核能用吗（第一次调用时编译，可能要一两秒）。"""
    return library() is not None


def supports(weight: torch.Tensor) -> bool:
    """这块权重能走内核吗：CPU 上连续的 fp32，输入维是 8 的倍数。"""
    return (
        weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2
        and weight.is_contiguous() and weight.shape[1] % 8 == 0
    )


def cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` 的同义实现（``weight`` 要满足 :func:`supports`，先确认 :func:`available`）。

    每步要调用上百次，所以只做必要的事：二维、连续的输入（引擎里的常态）不做任何变形。
    """
    n, k = weight.shape
    x2 = x if x.dim() == 2 else x.reshape(-1, k)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    m = x2.shape[0]
    if m > MAX_ROWS:
        return F.linear(x, weight, bias)
    y = torch.empty((m, n), dtype=torch.float32)
    if m:
        library().cpu_linear(x2.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(),
                              y.data_ptr(), m, k, n)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n)
