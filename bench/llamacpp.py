"""llama.cpp 作对照（可选）：同一份 SmolLM2 权重（F32 或 BF16），一个请求的一步解码。

``models/SmolLM2-135M-Instruct`` 是从 PyPI 上一个 GGUF（Q4_1）反量化成 fp32 的；这里用 ``gguf`` 库把同一个 GGUF
的每个张量反量化成 F32（BF16 时再按最近偶数舍入成 bf16，和 torch 的 ``.to(torch.bfloat16)`` 一样），另写一个 GGUF
给 llama.cpp，所以两边算的是逐元素相同的权重。
llama.cpp 的 Python 绑定 ``llama-cpp-python`` 不在依赖里：没装时 :func:`load` 抛 :class:`LlamaCppMissing`，
消息里写怎样安装（在 PyPI 上是源码包，安装时现编译 llama.cpp）。
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from minisgl.i18n import tr
from minisgl.model_zoo import models_dir

#: 这台 2 核机器上 ``pip install llama-cpp-python``（0.3.36，从源码编译）用了 7 分 25 秒，同时还有别的任务在跑。
BUILD_MINUTES = 7.5


class LlamaCppMissing(RuntimeError):
    """没有安装 llama-cpp-python。"""


def weights_gguf(weights: str = "F32") -> Path:
    """SmolLM2 的 F32 / BF16 GGUF（与 models/SmolLM2-135M-Instruct 同样的权重），第一次调用时生成，之后直接用。"""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
    from gguf.quants import dequantize, quantize

    qtype, file_type = {"F32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
                        "BF16": (GGMLQuantizationType.BF16, LlamaFileType.MOSTLY_BF16)}[weights]
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


def load(threads: int, n_ctx: int = 512, weights: str = "F32", draft_model: object = None):  # noqa: ANN201 - llama_cpp.Llama, an optional dependency
    """llama.cpp 加载 F32 / BF16 GGUF（``threads`` 个线程）；``draft_model`` 是 llama-cpp-python 的草稿（例如
    ``LlamaPromptLookupDecoding``：按提示词查找的投机解码）。"""
    try:
        from llama_cpp import Llama
    except ImportError as err:
        raise LlamaCppMissing(tr(
            "llama.cpp is not installed. Install it with: pip install llama-cpp-python "
            "(a source package: it compiles llama.cpp, about {minutes:.0f} minutes on a 2-core machine)",
            minutes=BUILD_MINUTES,
        )) from err
    return Llama(str(weights_gguf(weights)), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=n_ctx,
                 draft_model=draft_model, verbose=False)


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
