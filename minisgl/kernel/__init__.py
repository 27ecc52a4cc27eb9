"""CPU 上的 C 内核：小批量的线性层（``cpu_linear.c``，引擎选项 ``EngineConfig.cpu_kernel``）和一整步解码的
全部解码层（``cpu_decode.c``，引擎选项 ``EngineConfig.cpu_fused_decode``，见 ``minisgl/fused.py``）。都不是某一章的内容。

小批次解码每步要把全部权重从内存读一遍，线性层几乎只是在搬数据。PyTorch 在 CPU 上现成的两条路在这里各有长短
（数字见 ``bench/README.md``）：MKL 的 ``F.linear`` 在 M = 8 时可能比内核慢一倍（Zen 1 上 M = 1 时还只用一个线程）；
oneDNN 要另打包一份权重，在 Zen 1 上只用到读带宽的六七成，在别的 CPU 上却可能更快。这个几十行的 C 内核把几行权重
读进来一次、同时乘好几行输入，M = 1 时接近读带宽。它不给输入分块，所以输入行数多了（长提示词的预填充）MKL 的分块
矩阵乘更快。哪条路在哪儿赢因机器而异，所以每种权重形状第一次用到时现量一次（:func:`choice`）：原样的权重用内核
到几行为止、再往上交给 ``F.linear``，还是整个换成 oneDNN 的打包布局。结果按 CPU、PyTorch 和线程数缓存，打印一行
``线性层 …``。机器正忙时量出的结果只算一小时（:data:`LOADED_PLAN_S`），之后重量：别的进程抢走的核会让哪条都显得慢。
两个环境变量跳过测量：``MINISGL_KERNEL_MAX_ROWS=N`` 一律用内核到 N 行、其余 ``F.linear``（0：一律 ``F.linear``），
``MINISGL_KERNEL_ONEDNN=1`` 一律打包成 oneDNN 的布局。选哪条只影响快慢：线性层的 ``weight`` 总是检查点里的那块权重，
打包的副本另存，结果与 ``F.linear`` 只差求和顺序。

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
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, TypeVar

import torch
import torch.nn.functional as F

from minisgl.i18n import tr

__all__ = ["SOURCES", "Choice", "available", "bf16_dot", "calibrate", "choice", "cpu_linear", "forced", "kernel_linear", "library",
           "onednn_linear", "onednn_pack", "onednn_supports", "q4_linear", "q8_linear", "supports"]

SOURCES = [Path(__file__).with_name(name) for name in ("cpu_linear.c", "cpu_decode.c")]
FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC"]
ROW_STEPS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # 测量时试的行数
MARGIN = 1.1  # 别的路要快过一成才算赢：只差一点时留给内核（它的结果与线程数无关）
COLD_BYTES = 512 << 20  # 测量时轮流用这么多字节的权重副本：比常见的最后一级缓存大，每次调用都从内存读权重
BUSY_SHARE = 0.25  # 量的时候别的进程平均占了超过这么多个核：算“机器正忙”
LOADED_PLAN_S = 3600.0  # 机器正忙时量出的选择存多久（秒）：之后第一个用到它的进程重量
_PTR, _I64 = ctypes.c_void_p, ctypes.c_int64
T = TypeVar("T")


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
    lib.cpu_linear_bf16_dot.restype = ctypes.c_int
    lib.bf16_dot = bool(lib.cpu_linear_bf16_dot())  # 编成了 AVX512_BF16 的点积（cpu_linear_bf16）吗
    if lib.bf16_dot:
        lib.cpu_linear_bf16.argtypes = [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64]
        lib.cpu_linear_bf16.restype = None
    lib.cpu_linear_set_prefetch.argtypes = [ctypes.c_int] * 4
    lib.cpu_linear_set_prefetch.restype = None
    lib.cpu_linear_q8.argtypes = [_PTR] * 5 + [_I64] * 3
    lib.cpu_linear_q8.restype = None
    lib.cpu_linear_q4.argtypes = [_PTR] * 6 + [_I64] * 4
    lib.cpu_linear_q4.restype = None
    lib.cpu_decode.argtypes = [_PTR] * 8 + [_I64, _PTR, _PTR, _I64, _PTR]  # 各参数见 cpu_decode.c
    lib.cpu_decode.restype = None
    lib.cpu_decode_work_floats.argtypes = [_PTR, _I64]
    lib.cpu_decode_work_floats.restype = _I64
    lib.prefetch = use_prefetch(lib)
    return lib


#: 预取的几种做法（``cpu_linear.c`` 的 ``cpu_linear_set_prefetch`` 的参数：分几趟、x 至少几行、是否同步、是否进 L2）。
#: ``later-passes-l1`` 的行数是“多于一趟”：AVX-512 上一趟 6 行，别处 3 行（运行时按指令集换）。
#: en: the ways to prefetch (the arguments of ``cpu_linear.c``'s ``cpu_linear_set_prefetch``: over how many passes, from
#: en: how many x rows, in lockstep or not, into L2 or not). ``later-passes-l1`` starts "beyond one pass": 6 rows on AVX-512,
#: en: 3 elsewhere (filled in by the instruction set at run time).
PREFETCH = {
    "lockstep-l2": (1, 1, 1, 1),
    "lockstep-l1": (1, 1, 1, 0),
    "later-passes-l1": (2, -1, 0, 0),
    "off": (1, 1 << 30, 1, 1),
}
PREFETCH_SHAPE = (3072, 1024)  # 量预取时用的权重形状（0.6B 形状模型的 gate_up 的一半）


def _prefetch_args(name: str) -> tuple[int, int, int, int]:
    split, rows, lockstep, l2 = PREFETCH[name]
    return split, (7 if isa() == "AVX-512" else 4) if rows < 0 else rows, lockstep, l2


def use_prefetch(lib: ctypes.CDLL) -> str:
    """这颗 CPU 上预取下一块权重的做法：``MINISGL_KERNEL_PREFETCH`` 指定了就用它；否则查编好的库旁边的计划文件，没有就在
    冷的权重上把 :data:`PREFETCH` 里的几种轮流量一遍（M = 1 和 8，约一两秒），取最快的存下。只改快慢，结果逐位相同。

    en: How this CPU prefetches the next weight block: ``MINISGL_KERNEL_PREFETCH`` when set; otherwise the plan file beside
    the built library, or, the first time, the ways in :data:`PREFETCH` raced on cold weights (M = 1 and 8, a second or
    two) and the fastest saved. Changes the speed only; results are identical bit for bit.
    """
    name = os.environ.get("MINISGL_KERNEL_PREFETCH", "").strip()
    if name and name not in PREFETCH:
        raise ValueError(tr("MINISGL_KERNEL_PREFETCH={value!r}: choose one of {names}, or unset it to measure on this CPU",
                            value=name, names=", ".join(PREFETCH)))
    path = _plan_file(lib)
    saved = _saved(path, "prefetch")
    if not name and saved is not None and saved.get("name") in PREFETCH:
        name = saved["name"]
    if not name:
        timings, busy = _measure_prefetch(lib)
        name = min(timings, key=timings.get)
        _save(path, "prefetch", {"name": name, "ms": {k: round(v * 1e3, 3) for k, v in timings.items()}}, busy)
        print(tr("CPU kernels prefetch the next weights {how} (fastest of {n} ways on this CPU, saved in {path})",
                 how=name, n=len(PREFETCH), path=path), file=sys.stderr)
    lib.cpu_linear_set_prefetch(*_prefetch_args(name))
    return name


def _measure_prefetch(lib: ctypes.CDLL) -> tuple[dict[str, float], float]:
    """每种预取一步的秒数（M = 1 和 M = 8 两次调用之和，冷的权重：轮流用约 COLD_BYTES / 2 的副本），和量的时候别的进程
    占的核数。"""
    n, k = PREFETCH_SHAPE
    copies = max(2, (COLD_BYTES // 2) // (n * k * 4))
    weights = [torch.randn(n, k) for _ in range(copies)]
    xs = [torch.randn(m, k) for m in (1, 8)]
    ys = [torch.empty(m, n) for m in (1, 8)]
    turn = itertools.cycle(weights)

    def step() -> None:
        w = next(turn)
        for x, y in zip(xs, ys):
            lib.cpu_linear(x.data_ptr(), w.data_ptr(), None, y.data_ptr(), x.shape[0], k, n)

    def way(name: str) -> Callable[[], None]:
        args = _prefetch_args(name)
        return lambda: (lib.cpu_linear_set_prefetch(*args), step())

    timings, busy = _watch(lambda: _race([way(name) for name in PREFETCH]))
    del weights
    trim_heap()
    return dict(zip(PREFETCH, timings)), busy


def available() -> bool:
    """内核能用吗（第一次调用时编译，可能要一两秒）。"""
    return library() is not None


def bf16_dot() -> bool:
    """bf16 权重走不走 AVX512_BF16 的点积指令（vdpbf16ps）：编这个库的 CPU 有这条指令才走，否则读进来左移 16 位
    变成 fp32 再 FMA。点积这条把输入也舍入成 bf16（与 Hugging Face 用 bf16 跑模型时一样），fp32 累加。"""
    lib = library()
    return lib is not None and lib.bf16_dot


def supports(weight: torch.Tensor) -> bool:
    """这块权重能走内核吗：CPU 上连续的 fp32 或 bf16，输入维是 8 的倍数。"""
    return (
        weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16) and weight.dim() == 2
        and weight.is_contiguous() and weight.shape[1] % 8 == 0
    )


def onednn_supports(dtype: torch.dtype) -> bool:
    """oneDNN 的打包布局在这颗 CPU 上能算这种类型吗：fp32 总可以，bf16 要 CPU 支持。"""
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def onednn_pack(weight: torch.Tensor) -> torch.Tensor:
    """把权重重排成 oneDNN 的布局（不透明张量，不能切片）。批大小提示传 ``None``：传 1 会得到批大于 1 时很慢的布局。"""
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``，权重是 :func:`onednn_pack` 打包过的。"""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def isa() -> str:
    """内核编成了哪种向量指令（``-march=native`` 按这颗 CPU 选最宽的）。"""
    flags = _cpu_id().split()
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "NEON" if "asimd" in flags else "SSE"


def kernel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``，不论几行都用 C 内核（``weight`` 要满足 :func:`supports`，先确认 :func:`available`）。

    每步要调用上百次，所以只做必要的事：二维、连续的 fp32 输入（引擎里的常态）不做任何变形。bf16 权重时
    输入和偏置先转成 fp32（几行而已），内核读 bf16 权重、fp32 累加，结果再舍入回 bf16——读的字节减半。
    CPU 有 AVX512_BF16 时（:func:`bf16_dot`）输入改为舍入成 bf16（引擎里本来就是 bf16，不用转），vdpbf16ps 直接乘
    bf16 对、fp32 累加，内核自己把结果舍入成 bf16。
    """
    n, k = weight.shape
    lib = library()
    if weight.dtype == torch.bfloat16 and lib.bf16_dot:
        xb = (x if x.dim() == 2 else x.reshape(-1, k)).to(torch.bfloat16).contiguous()  # 已是连续的 bf16 时不复制
        m = xb.shape[0]
        y = torch.empty((m, n), dtype=torch.bfloat16)
        if m:
            b = None if bias is None else bias.float()
            lib.cpu_linear_bf16(xb.data_ptr(), weight.data_ptr(), None if b is None else b.data_ptr(), y.data_ptr(), m, k, n)
        return y if x.dim() == 2 else y.view(*x.shape[:-1], n)
    fn = lib.cpu_linear_bf16w if weight.dtype == torch.bfloat16 else lib.cpu_linear
    return _fp32_call(fn, x, n, k, bias, weight.dtype, weight.data_ptr())


def _fp32_call(fn: Callable[..., None], x: torch.Tensor, n: int, k: int, bias: torch.Tensor | None,
               out_dtype: torch.dtype, *weights: int) -> torch.Tensor:
    """fp32 激活的内核（``cpu_linear``、读 bf16 或量化权重的几种）共用的部分：``x`` 变成二维、连续的 fp32 行（已经是时
    不复制），偏置 fp32，调用 ``fn(x, *weights, b, y, M, K, N)``，结果变成 ``out_dtype``、回到 ``x`` 的形状。"""
    x2 = (x if x.dim() == 2 else x.reshape(-1, k)).float().contiguous()
    y = torch.empty((x2.shape[0], n), dtype=torch.float32)
    if x2.shape[0]:
        b = None if bias is None else bias.float().contiguous()
        fn(x2.data_ptr(), *weights, None if b is None else b.data_ptr(), y.data_ptr(), x2.shape[0], k, n)
    y = y.to(out_dtype)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n)


def q8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x · (q · scale[:, None])ᵀ + bias``：``q`` 是 ``[N, K]`` 的 int8（K 是 8 的倍数），``scale`` 是 ``[N]`` 的
    fp32，都在 CPU 上、连续（第 5.4 章的 int8 权重）。权重读进寄存器才变成 fp32，累加完整行再乘 scale。
    只给解码的几行用：每个输出由一个线程按固定顺序求和，行数多时重读权重的次数也多。

    en: ``x · (q · scale[:, None])ᵀ + bias``: ``q`` a ``[N, K]`` int8 (K a multiple of 8), ``scale`` an fp32 ``[N]``,
    both contiguous on the CPU (chapter 5.4's int8 weights). Weights become fp32 only in registers, and a row's sum is
    scaled once at the end. For the few rows of a decode step.
    """
    n, k = q.shape
    return _fp32_call(library().cpu_linear_q8, x, n, k, bias, x.dtype, q.data_ptr(), scale.data_ptr())


def q4_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group_size: int,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x · Wᵀ + bias``，``W = q · scale + offset`` 按组：``packed`` 是 ``[N, K / 2]`` 的字节（Q4_0 的排法，见第 5.4 章），
    ``scale``、``offset`` 是 ``[N, K / group_size]`` 的 fp32；``group_size`` 是 32 的倍数。

    en: ``x · Wᵀ + bias`` with ``W = q · scale + offset`` per group: ``packed`` is ``[N, K / 2]`` bytes (Q4_0's layout,
    see chapter 5.4), ``scale`` and ``offset`` are fp32 ``[N, K / group_size]``; ``group_size`` is a multiple of 32.
    """
    n, k = packed.shape[0], 2 * packed.shape[1]
    lib = library()

    def call(xp: int, w: int, s: int, z: int, b: int | None, y: int, m: int, kk: int, nn: int) -> None:
        lib.cpu_linear_q4(xp, w, s, z, b, y, m, kk, nn, group_size)

    return _fp32_call(call, x, n, k, bias, x.dtype, packed.data_ptr(), scale.data_ptr(), offset.data_ptr())


def cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``：行数在 :func:`choice` 给的范围里时用 C 内核，否则交给 ``F.linear``（MKL）。"""
    rows, chosen = x.numel() // weight.shape[1], choice(weight)
    if chosen.kernel_from <= rows <= chosen.kernel_to:
        return kernel_linear(x, weight, bias)
    return F.linear(x, weight, bias)


@dataclass(frozen=True)
class Choice:
    """一种权重形状在这颗 CPU 上怎么算。"""

    kernel_from: int  # 原样的权重：从这么多行到 kernel_to 行（含）用 C 内核，其余交给 F.linear
    kernel_to: int  # 0：一律 F.linear
    onednn: bool = False  # 不用上面那条：权重打包成 oneDNN 的布局，什么行数都交给 oneDNN

    def describe(self, dtype: torch.dtype = torch.float32) -> str:
        """一句话：什么行数走哪条路（``dtype``：权重类型；bf16 权重走点积指令时内核写作 AVX512_BF16）。"""
        if self.onednn:
            return tr("oneDNN's packed layout for every row count")
        if not (rows := self.rows()):
            return tr("F.linear (MKL) for every row count")
        kind = "AVX512_BF16" if dtype == torch.bfloat16 and bf16_dot() else isa()
        return tr("the C kernel ({isa}) for {rows} rows, F.linear (MKL) for the others", isa=kind, rows=rows)

    def rows(self) -> str:
        """内核管的行数，例如 ``3–16``（只有一个时就是那一个，一个也没有时是空串）。"""
        if self.kernel_to < self.kernel_from:
            return ""
        return str(self.kernel_to) if self.kernel_from == self.kernel_to else f"{self.kernel_from}–{self.kernel_to}"


_chosen: dict[tuple[int, int, torch.dtype, int], Choice] = {}  # (K, N, 类型, 线程数) → 这个进程里已定的选择


def forget_choices() -> None:
    """忘掉这个进程里已定的选择：下一次 :func:`choice` 重新读计划文件（计划文件换了地方、或被改过之后用）。

    en: Forget the choices made in this process: the next :func:`choice` reads the plan file again (use it after the plan
    file moved or was edited).
    """
    _chosen.clear()


def choice(weight: torch.Tensor) -> Choice:
    """这种形状的权重在这颗 CPU 上怎么算。

    第一次遇到一种形状（这颗 CPU、这个线程数、这个 PyTorch）时现量一次（:func:`calibrate`，大权重要几秒），
    结果存进编好的库旁边的 JSON，打印一行；之后直接查表。量的时候别的进程占着核（超过 :data:`BUSY_SHARE` 个），
    存下的结果 :data:`LOADED_PLAN_S` 秒后过期。环境变量指定了路（:func:`forced`）就不量。
    """
    if (given := forced()) is not None:
        return given
    n, k = weight.shape
    key = (k, n, weight.dtype, torch.get_num_threads())
    if key not in _chosen:
        path, dtype = plan_path(), str(weight.dtype).removeprefix("torch.")
        name = f"{k}x{n}" + ("" if weight.dtype == torch.float32 else f"-{dtype}")
        saved = _saved(path, name)
        try:
            if saved is None:
                raise KeyError(name)
            chosen = Choice(**{f: saved[f] for f in ("kernel_from", "kernel_to", "onednn")})
        except (KeyError, TypeError):  # 没量过、量的时候机器正忙而且已过期、或者文件里是别的写法：现量
            chosen, busy = measured_while_watching(lambda: calibrate(weight))
            trim_heap()
            _save(path, name, vars(chosen), busy)
            print(tr("Linear layer {k}→{n} ({dtype}): {how} (measured once on this CPU with {threads} threads, saved in "
                     "{path})", k=k, n=n, dtype=dtype, how=chosen.describe(weight.dtype), threads=key[3], path=path), file=sys.stderr)
            if busy > BUSY_SHARE:
                print(tr("  other processes kept {busy:.1f} cores busy while measuring: this choice is measured again after "
                         "{hours:g} h", busy=busy, hours=LOADED_PLAN_S / 3600), file=sys.stderr)
        _chosen[key] = chosen
    return _chosen[key]


def forced() -> Choice | None:
    """环境变量指定的选择（不量），没指定时是 None：``MINISGL_KERNEL_MAX_ROWS=N`` 内核用到 N 行、其余 ``F.linear``；
    ``MINISGL_KERNEL_ONEDNN=1`` 一律 oneDNN 的打包布局（内核和 oneDNN 不能同时指定）。检查在每条路上都要通过，
    CI 就用它们把每条路各跑一遍。"""
    rows, onednn = os.environ.get("MINISGL_KERNEL_MAX_ROWS"), os.environ.get("MINISGL_KERNEL_ONEDNN", "").strip()
    if onednn not in ("", "0", "1"):
        raise ValueError(tr("MINISGL_KERNEL_ONEDNN={value!r}: set 1 (always oneDNN's packed layout) or 0, or unset it to "
                            "measure on this CPU", value=onednn))
    if onednn == "1":
        if rows is not None:
            raise ValueError(tr("MINISGL_KERNEL_MAX_ROWS and MINISGL_KERNEL_ONEDNN=1 each force one path: set only one"))
        return Choice(1, 0, onednn=True)
    if rows is None:
        return None
    if not rows.strip().isdigit():
        raise ValueError(tr("MINISGL_KERNEL_MAX_ROWS={value!r} is not a row count: set a whole number ≥ 0 "
                            "(0: always F.linear), or unset it to measure on this CPU", value=rows))
    return Choice(1, int(rows))


def _busy_jiffies() -> tuple[int, int] | None:
    """整台机器到此刻忙了多少个时钟滴答（/proc/stat 第一行里除 idle、iowait 以外的），和每秒几个滴答；读不到时 None。"""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields[:8]) - fields[3] - fields[4], os.sysconf("SC_CLK_TCK")


def measured_while_watching(fn: Callable[[], T]) -> tuple[T, float]:
    """跑 ``fn``，同时看别的进程平均占了几个核（整机的忙时减去本进程的 CPU 时间，除以经过的时间）。读不到整机的
    忙时（不是 Linux）就按系统负载减去本进程估。形状的测量用这个名字、预取的测量用 :func:`_watch`：检查可以只替换前者。"""
    return _watch(fn)


def _watch(fn: Callable[[], T]) -> tuple[T, float]:
    before, own, start = _busy_jiffies(), os.times(), time.monotonic()
    chosen = fn()
    after, own_after, wall = _busy_jiffies(), os.times(), max(time.monotonic() - start, 1e-3)
    own_s = own_after.user + own_after.system - own.user - own.system
    if before is None or after is None:
        return chosen, max(0.0, os.getloadavg()[0] - own_s / wall)
    return chosen, max(0.0, ((after[0] - before[0]) / after[1] - own_s) / wall)


def trim_heap() -> None:
    """量的时候用了几百 MB 的权重副本；释放后 glibc 仍把这些页留在进程里（常驻内存一直多出这么多），还给系统。"""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # 不是 glibc（macOS、musl）：没有 malloc_trim，也就不必
        pass


def plan_path() -> Path:
    """量出来的表存在哪儿：编好的库旁边，按库（源码 + CPU）、PyTorch 版本和线程数各存一份。"""
    return _plan_file(library())


def _plan_file(lib: ctypes.CDLL) -> Path:
    built = Path(lib._name)  # noqa: SLF001
    return built.with_name(f"{built.stem}.linear-torch{torch.__version__}-t{torch.get_num_threads()}.json")


def _read_plan(path: Path) -> dict[str, dict]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _saved(path: Path, name: str) -> dict | None:
    """计划文件里的 ``name`` 这一条；没有、不是一条记录、或者是机器正忙时量的而且已过期，都是 None。"""
    entry = _read_plan(path).get(name)
    return entry if isinstance(entry, dict) and time.time() <= entry.get("expires", math.inf) else None


def _save(path: Path, name: str, entry: dict, busy: float) -> None:
    """把一次测量存成计划文件里的 ``name`` 这一条（别的进程同时量的条目照样留着）；量的时候别的进程占着超过
    :data:`BUSY_SHARE` 个核，这一条记下占了多少、:data:`LOADED_PLAN_S` 秒后过期。"""
    if busy > BUSY_SHARE:
        entry = {**entry, "busy_cores": round(busy, 2), "expires": time.time() + LOADED_PLAN_S}
    _write_plan(path, {**_read_plan(path), name: entry})


def _write_plan(path: Path, plan: dict[str, dict]) -> None:
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


Timing = tuple[float, float, float | None]  # 一个行数上 (内核, F.linear, oneDNN 打包) 各要几秒；oneDNN 算不了时是 None


def calibrate(weight: torch.Tensor, measure: Callable[[int], Timing] | None = None) -> Choice:
    """这种形状怎么算：依次试 :data:`ROW_STEPS`，``measure(m)`` 给出 m 行时三条路的秒数，缺省用这块权重的几份
    副本现量。别的路要快过 :data:`MARGIN` 才算赢内核，输了的行数重量一遍、两遍都输才算数（偶然的一次慢不该让
    每一步都慢）。

    先定原样权重的那条路。内核用到第一次确认 F.linear 赢之前、内核最后赢的行数；M < 8 的输不停（M = 1、2 时两边都卡在
    读带宽上，谁赢因机器而异）。从那往下，F.linear 赢过的最大行数以下（含）都给它。

    再和 oneDNN 的打包布局比：解码的批大小（不超过 8 行）上平均（几何平均）要快过 :data:`MARGIN`、量过的更多行上
    平均又不慢过 :data:`MARGIN`，才整个换成它（打包的副本取代原权重，两种布局只能留一种）。更多的行（长提示词的
    预填充）两边都是分块矩阵乘，不再量。
    """
    if measure is None:
        measure = _measure_cold(weight)
    timings: dict[int, Timing] = {}

    def kernel_wins(m: int) -> bool:
        kernel_s, torch_s, _ = timings[m]
        return kernel_s <= torch_s * MARGIN

    high = 0
    for m in ROW_STEPS:
        timings[m] = measure(m)
        if not kernel_wins(m):
            timings[m] = measure(m)
        if kernel_wins(m):
            high = m
        elif m >= 8:
            break
    low = 1 + max((m for m in timings if m < high and not kernel_wins(m)), default=0)
    chosen = Choice(low, high)
    if any(onednn is None for *_, onednn in timings.values()):
        return chosen

    def mean_ratio(ms: list[int]) -> float:  # oneDNN ÷ 原样权重实际走的那条，几何平均
        plain = {m: timings[m][0] if low <= m <= high else timings[m][1] for m in ms}
        return math.exp(sum(math.log(timings[m][2] / plain[m]) for m in ms) / len(ms)) if ms else 1.0

    decode, more = [m for m in timings if m <= 8], [m for m in timings if m > 8]
    return Choice(low, high, onednn=mean_ratio(decode) * MARGIN <= 1 and mean_ratio(more) <= MARGIN)


def _measure_cold(weight: torch.Tensor) -> Callable[[int], Timing]:
    """解码时权重从内存来，不在缓存里：轮流用几份副本（合计约 COLD_BYTES，最多 256 份）量，才量得到这一点。"""
    copies = max(1, min(256, COLD_BYTES // (weight.numel() * weight.element_size())))
    plain = list(weight.unsqueeze(0).expand(copies, -1, -1).contiguous().unbind(0))
    packed = [onednn_pack(w) for w in plain] if onednn_supports(weight.dtype) else []

    def measure(m: int) -> Timing:
        x = torch.randn(m, weight.shape[1], dtype=weight.dtype)
        ws, ts, ps = itertools.cycle(plain), itertools.cycle(plain), itertools.cycle(packed)
        fns = [lambda: kernel_linear(x, next(ws)), lambda: F.linear(x, next(ts))]
        if packed:
            fns.append(lambda: onednn_linear(x, next(ps)))
        seconds = _race(fns)
        return seconds[0], seconds[1], seconds[2] if packed else None

    return measure
