"""``generate`` 的入口检查：请求在进调度器之前就校验完，不合法的一个 token 也不算，并说清楚怎么改。

这部分不属于哪一章：每一章的调度器都用它，所以你写错了某章，错误输入照样会被拦下。
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import replace
from typing import Any, Sequence

import torch

from minisgl.core import SamplingParams
from minisgl.graph import GRAPH_MODES


def _token_ids(i: int, prompt: Any) -> list[int]:
    """token id 必须是真正的整数：1.5、True 这样的值不能悄悄变成别的 token。"""
    if isinstance(prompt, torch.Tensor):
        if prompt.is_floating_point() or prompt.is_complex() or prompt.dtype == torch.bool:
            raise TypeError(f"第 {i} 个提示词的 token id 张量是 {prompt.dtype}：请用整数类型（如 torch.int64）")
        return [int(t) for t in prompt.reshape(-1).tolist()]
    ids = list(prompt)
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
    if bad:
        raise TypeError(f"第 {i} 个提示词含有不是整数的 token id：{bad[:5]}（token id 只能是 int，布尔值和小数都不行）")
    return [int(t) for t in ids]


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_sampling_types(sp: SamplingParams) -> None:
    """类型和 NaN / inf：这些值连比较都不可靠（NaN 和谁比都是 False），先于 ``SamplingParams.validate`` 挡掉。"""
    for name in ("temperature", "top_p"):
        value = getattr(sp, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"{name} 必须是有限的实数，收到 {value!r}")
    for name in ("top_k", "max_tokens"):
        if not _is_int(getattr(sp, name)):
            raise ValueError(f"{name} 必须是整数，收到 {getattr(sp, name)!r}")
    if sp.seed is not None and not _is_int(sp.seed):
        raise ValueError(f"seed 要么是 None，要么是整数，收到 {sp.seed!r}")


def validate_requests(
    prompts: Sequence[str] | Sequence[Sequence[int]],
    sampling_params: SamplingParams | Sequence[SamplingParams] | None,
    *,
    tokenizer: Any,
    max_seq_len: int,
) -> list[tuple[torch.Tensor, SamplingParams]]:
    """把提示词变成 token id 并逐个检查；``max_tokens`` 超出长度上限时截短并给出警告。

    ``max_seq_len`` 已经考虑了 KV 池的总容量（引擎把它限制在总页数 × page_size 之内），
    所以通过检查的请求总有放得下的一天：不会永远等下去。
    """
    if isinstance(prompts, (str, torch.Tensor)) or not isinstance(prompts, Sequence):
        raise TypeError("prompts 应该是列表：每个元素是一个字符串，或一个 token id 列表")
    if sampling_params is None:
        sampling_params = SamplingParams()
    if isinstance(sampling_params, SamplingParams):
        params = [sampling_params] * len(prompts)
    else:
        params = list(sampling_params)
        if len(params) != len(prompts):
            raise ValueError(
                f"sampling_params 的个数（{len(params)}）与 prompts 的个数（{len(prompts)}）不一致；"
                "要么给一个 SamplingParams 让所有提示词共用，要么每个提示词给一个"
            )
    vocab = len(tokenizer)
    out: list[tuple[torch.Tensor, SamplingParams]] = []
    for i, (prompt, sp) in enumerate(zip(prompts, params)):
        if not isinstance(sp, SamplingParams):
            raise TypeError(f"第 {i} 个提示词的采样参数不是 SamplingParams，而是 {type(sp).__name__}")
        try:
            _check_sampling_types(sp)
            sp.validate()
        except ValueError as e:
            raise ValueError(f"第 {i} 个提示词的采样参数不合法：{e}") from None
        if isinstance(prompt, str):
            ids = tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, (Sequence, torch.Tensor)):
            ids = _token_ids(i, prompt)
        else:
            raise TypeError(f"第 {i} 个提示词既不是字符串也不是 token id 列表：{type(prompt).__name__}")
        if len(ids) == 0:
            raise ValueError(f"第 {i} 个提示词是空的：至少要有 1 个 token")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"第 {i} 个提示词含有词表（大小 {vocab}）之外的 token id：{bad[:5]}")
        if len(ids) >= max_seq_len:
            raise ValueError(
                f"第 {i} 个提示词有 {len(ids)} 个 token，达到了单个请求的长度上限 {max_seq_len}"
                "（提示词之后至少还要放 1 个输出 token；上限取 max_seq_len_override 与 KV 池容量中较小的那个）："
                "请缩短提示词，或加大 max_seq_len_override / num_page_override"
            )
        if sp.max_tokens > max_seq_len - len(ids):
            warnings.warn(
                f"第 {i} 个提示词：max_tokens={sp.max_tokens} 超出长度上限 {max_seq_len}，"
                f"截成 {max_seq_len - len(ids)}（提示词 {len(ids)} 个 token）",
                stacklevel=3,
            )
            sp = replace(sp, max_tokens=max_seq_len - len(ids))
        out.append((torch.tensor(ids, dtype=torch.int32), sp))
    return out


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def validate_config(config: Any) -> None:
    """引擎 / 调度器配置在建引擎之前检查一遍：错的值立刻报清楚，而不是到很后面才以奇怪的方式出错。"""

    def positive_int(name: str, *, optional: bool = False, minimum: int = 1) -> None:
        value = getattr(config, name)
        if optional and value is None:
            return
        if not _is_int(value) or value < minimum:
            what = f"不小于 {minimum} 的整数" + ("，或 None（自动决定）" if optional else "")
            raise ValueError(f"{name} 必须是{what}，收到 {value!r}")

    positive_int("max_running_req")
    positive_int("page_size")
    positive_int("num_page_override", optional=True)
    positive_int("max_seq_len_override", optional=True, minimum=2)
    if hasattr(config, "max_extend_tokens"):
        positive_int("max_extend_tokens")
    dtype = config.dtype
    if dtype is not None and not isinstance(dtype, torch.dtype) and dtype not in _DTYPES:
        raise ValueError(f"不支持的 dtype={dtype!r}：可选 None（自动）、{', '.join(_DTYPES)}，或对应的 torch.dtype")
    if isinstance(dtype, torch.dtype) and dtype not in _DTYPES.values():
        raise ValueError(f"不支持的 dtype={dtype}：可选 {', '.join(_DTYPES)}")
    device = str(config.device)
    if device != "auto":
        try:
            parsed = torch.device(device)
        except RuntimeError:
            raise ValueError(f"不认识的 device={device!r}：可选 'auto'、'cpu'、'cuda' 或 'cuda:N'") from None
        if parsed.type not in ("cpu", "cuda"):
            raise ValueError(f"不支持的 device={device!r}：可选 'auto'、'cpu'、'cuda' 或 'cuda:N'")
        if parsed.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device!r}，但这台机器上没有可用的 CUDA GPU：请用 'cpu' 或 'auto'")
    if getattr(config, "cuda_graph", "auto") not in GRAPH_MODES:
        raise ValueError(f"cuda_graph={config.cuda_graph!r} 不认识：可选 {', '.join(GRAPH_MODES)}")
    if hasattr(config, "cuda_graph_max_bs"):
        positive_int("cuda_graph_max_bs")
    ratio = config.memory_ratio
    if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not 0 < ratio <= 1):
        raise ValueError(f"memory_ratio 必须在 (0, 1] 之间，或为 None（自动），收到 {ratio!r}")
