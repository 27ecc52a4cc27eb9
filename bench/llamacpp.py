"""llama.cpp 作对照（可选）：同一份 SmolLM2 权重（F32、BF16，或 llama.cpp 自己量化的 Q8_0、Q4_0），一个请求的一步解码。

``models/SmolLM2-135M-Instruct`` 是从 PyPI 上一个 GGUF（Q4_1）反量化成 fp32 的；这里用 ``gguf`` 库把同一个 GGUF
的每个张量反量化成 F32（BF16 时再按最近偶数舍入成 bf16，和 torch 的 ``.to(torch.bfloat16)`` 一样），另写一个 GGUF
给 llama.cpp，所以两边算的是逐元素相同的权重。
llama.cpp 的 Python 绑定 ``llama-cpp-python`` 不在依赖里：没装时 :func:`load` 抛 :class:`LlamaCppMissing`，
消息里写怎样安装（在 PyPI 上是源码包，安装时现编译 llama.cpp）。
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import statistics
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from minisgl.i18n import tr
from minisgl.model_zoo import models_dir

#: 这台 2 核机器上 ``pip install llama-cpp-python``（0.3.36，从源码编译）用了 7 分 25 秒，同时还有别的任务在跑。
BUILD_MINUTES = 7.5


class LlamaCppMissing(RuntimeError):
    """没有安装 llama-cpp-python。"""


def weights_gguf(weights: str = "F32") -> Path:
    """SmolLM2 的 F32 / BF16 GGUF（与 models/SmolLM2-135M-Instruct 同样的权重），或把这份权重量化成 Q8_0 / Q4_0
    （每 32 个一块、一个 fp16 的 scale；二维的张量都量化，与 LM head 共用的词嵌入在 Q4_0 里也是 Q8_0）；第一次调用时
    生成，之后直接用。"""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
    from gguf.quants import dequantize, quantize

    qtype, file_type = {"F32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
                        "BF16": (GGMLQuantizationType.BF16, LlamaFileType.MOSTLY_BF16),
                        "Q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
                        "Q4_0": (GGMLQuantizationType.Q4_0, LlamaFileType.MOSTLY_Q4_0)}[weights]
    cache = models_dir() / ".cache" / "gguf"
    out = cache / f"SmolLM2-135M-Instruct.{weights}.gguf"
    if out.is_file():
        return out
    source = cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not source.is_file():
        raise FileNotFoundError(tr("{path} is missing: run make setup first", path=source))
    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    part = out.with_suffix(".part")
    writer = GGUFWriter(part, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue  # the writer adds these itself
        sub_type = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_file_type(file_type)
    for tensor in reader.tensors:
        data = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if qtype == GGMLQuantizationType.Q4_0 and tensor.name == "token_embd.weight":
            # 与 LM head 共用的词嵌入留在 8 位（Q8_0）：我们的 int4wo 也把 LM head 留在 int8，llama.cpp 自己量化时也把输出层留得更高
            # en: the word embedding shared with the LM head stays at 8 bits (Q8_0): our int4wo keeps the LM head at
            # en: int8 too, and llama.cpp's own quantizer keeps the output layer higher as well
            writer.add_tensor(tensor.name, quantize(data, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
            continue
        # 1 维的（各层的 norm）llama.cpp 只认 F32
        if qtype != GGMLQuantizationType.F32 and data.ndim > 1:
            writer.add_tensor(tensor.name, quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(tensor.name, data, raw_dtype=GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    part.rename(out)
    return out


def load(threads: int, n_ctx: int = 512, weights: str = "F32", draft_model: object = None,  # noqa: ANN201 - llama_cpp.Llama, an optional dependency
         logits_all: bool = False):
    """llama.cpp 加载 F32 / BF16 / Q8_0 / Q4_0 GGUF（``threads`` 个线程）；``draft_model`` 是 llama-cpp-python 的草稿（例如
    ``LlamaPromptLookupDecoding``：按提示词查找的投机解码）；``logits_all`` 时每个位置的 logits 都留着（算困惑度用）。"""
    try:
        from llama_cpp import Llama
    except ImportError as err:
        raise LlamaCppMissing(tr(
            "llama.cpp is not installed. Install it with: pip install llama-cpp-python "
            "(a source package: it compiles llama.cpp, about {minutes:.0f} minutes on a 2-core machine)",
            minutes=BUILD_MINUTES,
        )) from err
    path = str(weights_gguf(weights))
    repack = weights in ("F32", "BF16") or repacked_kernels_run(path, threads)
    if not repack:
        print(tr("llama.cpp's repacked kernels for {weights} crash on this CPU (a child process running them died): "
                 "its plain {weights} kernels are measured instead", weights=weights))
    with _extra_buffer_types(repack):
        return Llama(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=n_ctx,
                     draft_model=draft_model, logits_all=logits_all, verbose=False)


@contextlib.contextmanager
def _extra_buffer_types(enabled: bool) -> Iterator[None]:
    """llama.cpp 的 ``use_extra_bufts``（量化的权重换成按 CPU 重排的布局，例如 AMX、AVX-512 的分块）在这段里是
    ``enabled``：llama-cpp-python 不把这个参数交出来，只好在加载期间换掉它取缺省参数的那个函数。"""
    from llama_cpp import llama_cpp as binding  # 高层的 Llama 从这个 ctypes 模块取缺省参数

    original = binding.llama_model_default_params

    def params():  # noqa: ANN202
        p = original()
        p.use_extra_bufts = enabled
        return p

    binding.llama_model_default_params = params
    try:
        yield
    finally:
        binding.llama_model_default_params = original


def _probe(path: str, threads: int) -> None:
    """子进程里：用缺省的（重排的）内核加载并前向几个 token。"""
    from llama_cpp import Llama

    Llama(path, n_ctx=64, n_threads=threads, verbose=False).eval([1, 2, 3])


@functools.lru_cache(maxsize=None)
def repacked_kernels_run(path: str, threads: int) -> bool:
    """llama.cpp 的重排内核在这颗 CPU 上跑得了吗：在一个 spawn 出来的子进程里试（有的虚拟机上 AMX 那条路会让进程
    崩掉，崩在子进程里就不连累这里）。"""
    child = multiprocessing.get_context("spawn").Process(target=_probe, args=(path, threads), daemon=True)
    child.start()
    child.join(120)
    if child.is_alive():
        child.kill()
        child.join()
    return child.exitcode == 0


def perplexity(llama, ids: list[int], window: int) -> float:  # noqa: ANN001
    """llama.cpp 在 ``ids`` 上的困惑度：每 ``window`` 个 token 一段、互不重叠（``llama`` 要用 ``logits_all=True`` 加载，
    ``n_ctx`` 至少 ``window``）。

    en: llama.cpp's perplexity on ``ids``, in non-overlapping windows of ``window`` tokens (``llama`` loaded with
    ``logits_all=True`` and ``n_ctx`` at least ``window``).
    """
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start : start + window + 1]
        llama.reset()
        llama.eval(chunk[:-1])
        logits = np.asarray(llama.scores[: len(chunk) - 1], dtype=np.float64)
        top = logits.max(axis=1, keepdims=True)
        logz = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
        nll += float((logz - logits[np.arange(len(chunk) - 1), chunk[1:]]).sum())
        count += len(chunk) - 1
    return float(np.exp(nll / count))


def _next_token(llama) -> int:  # noqa: ANN001
    """贪心：最后一个位置的 logits 取 argmax（高层 API 不再把 logits 拷进 ``scores``，直接读 llama.cpp 的缓冲区）。"""
    import llama_cpp

    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama.ctx, -1), shape=(llama.n_vocab(),))
    return int(np.argmax(logits))


def step_ms(llama, prompt: list[int], steps: int) -> float:  # noqa: ANN001
    """llama.cpp 一个请求的一步解码（贪心，逐 token ``eval``）的时间，毫秒，各步的中位数。"""
    llama.reset()
    llama.eval(prompt)
    times = []
    for _ in range(steps):
        token = _next_token(llama)
        start = time.perf_counter()
        llama.eval([token])
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def greedy(llama, prompt: list[int], steps: int) -> list[int]:  # noqa: ANN001
    """llama.cpp 的贪心输出（用来确认两边的权重真是同一份）。"""
    llama.reset()
    llama.eval(prompt)
    out = []
    for _ in range(steps):
        out.append(_next_token(llama))
        llama.eval([out[-1]])
    return out
