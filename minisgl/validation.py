"""``generate`` 的入口检查：请求在进调度器之前就校验完，不合法的一个 token 也不算，并说清楚怎么改。

这部分不属于哪一章：每一章的调度器都用它，所以你写错了某章，错误输入照样会被拦下。
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import replace
from typing import Any, Sequence, TypeVar

import torch

from minisgl.core import InvalidParam, SamplingParams
from minisgl.graph import GRAPH_MODES
from minisgl.i18n import tr
from minisgl.grammar import check_grammar
from minisgl.sampling import check_controls

E = TypeVar("E", bound=Exception)

#: 拒绝的种类 → OpenAI 错误体的 ``code``（服务器的 400 里客户端读到的就是它）。
#: en: the kind of refusal → the ``code`` of the OpenAI error body (what a client reads in the server's 400).
INVALID_TYPE = "invalid_type"
INVALID_VALUE = "invalid_value"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


def coded(err: E, code: str) -> E:
    """给异常加上 ``code`` 属性并返回它：类型不变（调用方照样按 TypeError / ValueError 捕获），调度器拒绝请求时
    把它带进 ``RejectMsg``，成为 OpenAI 错误体的 ``code``（:data:`INVALID_TYPE`、:data:`INVALID_VALUE`、
    :data:`CONTEXT_LENGTH_EXCEEDED`）。

    en: Give the exception a ``code`` attribute and return it: its type stays (callers still catch TypeError /
    ValueError); when the scheduler refuses a request it carries it in the ``RejectMsg``, where it becomes the ``code``
    of the OpenAI error body (:data:`INVALID_TYPE`, :data:`INVALID_VALUE`, :data:`CONTEXT_LENGTH_EXCEEDED`).
    """
    setattr(err, "code", code)
    return err


def _token_ids(i: int, prompt: Any) -> list[int]:
    """token id 必须是真正的整数：1.5、True 这样的值不能悄悄变成别的 token。"""
    if isinstance(prompt, torch.Tensor):
        if prompt.is_floating_point() or prompt.is_complex() or prompt.dtype == torch.bool:
            raise coded(TypeError(tr("Prompt {i}: the token id tensor is {dtype}; use an integer type (such as torch.int64)",
                                     i=i, dtype=prompt.dtype)), INVALID_TYPE)
        return [int(t) for t in prompt.reshape(-1).tolist()]
    ids = list(prompt)
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
    if bad:
        raise coded(TypeError(tr("Prompt {i} has token ids that are not integers: {bad} (token ids must be int; neither booleans nor floats will do)",
                                 i=i, bad=bad[:5])), INVALID_TYPE)
    return [int(t) for t in ids]


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


#: 种子的范围：消息（msgpack）能带的整数，也是 ``torch.Generator.manual_seed`` 收的 64 位。
#: en: the seed's range: the integers a message (msgpack) can carry, and the 64 bits ``torch.Generator.manual_seed`` takes.
SEED_RANGE = range(-(2**63), 2**64)


def check_sampling_types(sp: SamplingParams) -> None:
    """类型和 NaN / inf：这些值连比较都不可靠（NaN 和谁比都是 False），先于 ``SamplingParams.validate`` 挡掉；
    种子还要在 :data:`SEED_RANGE` 里。抛 :class:`~minisgl.core.InvalidParam`（点名字段）。

    en: Types and NaN / inf: such values cannot even be compared reliably, so they are stopped before
    ``SamplingParams.validate``; the seed must also lie in :data:`SEED_RANGE`. Raises
    :class:`~minisgl.core.InvalidParam` (naming the field).
    """
    for name in ("temperature", "top_p"):
        value = getattr(sp, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise InvalidParam(name, tr("{name} must be a finite real number, got {value!r}", name=name, value=value))
    for name in ("top_k", "max_tokens"):
        if not _is_int(getattr(sp, name)):
            raise InvalidParam(name, tr("{name} must be an integer, got {value!r}", name=name, value=getattr(sp, name)))
    if not isinstance(sp.ignore_eos, bool):
        raise InvalidParam("ignore_eos", tr("ignore_eos must be true or false, got {value!r}", value=sp.ignore_eos))
    if sp.seed is not None and not _is_int(sp.seed):
        raise InvalidParam("seed", tr("seed must be None or an integer, got {seed!r}", seed=sp.seed))
    if sp.seed is not None and sp.seed not in SEED_RANGE:
        raise InvalidParam("seed", tr("seed must be in [-2**63, 2**64), got {seed}", seed=sp.seed))


def check_sampling(sp: SamplingParams) -> None:
    """采样参数的那一道门：先查类型（:func:`check_sampling_types`），再查取值范围（第 1.1 章的
    ``SamplingParams.validate``，范围只写在那里）。离线接口、调度器和服务器都调用它；不合法时抛
    :class:`~minisgl.core.InvalidParam`，服务器把它变成点名参数的 400。

    en: The one gate for sampling parameters: types first (:func:`check_sampling_types`), then ranges (chapter 1.1's
    ``SamplingParams.validate``, the only place that knows them). The offline API, the scheduler and the server all
    call it; an invalid value raises :class:`~minisgl.core.InvalidParam`, which the server turns into a 400 naming the
    parameter.
    """
    check_sampling_types(sp)
    sp.validate()
    check_controls(sp)
    check_grammar(sp)


def check_token_ids(ids: Sequence[int], vocab: int) -> None:
    """词表的那一道门：每个 id 都要在 [0, vocab) 里。离线接口和分词进程都调用它。

    en: The one vocabulary check: every id must lie in [0, vocab). The offline API and the tokenizer process both call
    it.
    """
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise coded(ValueError(tr("The prompt has token ids outside the vocabulary (size {vocab}): {bad}", vocab=vocab,
                                  bad=bad[:5])), INVALID_VALUE)


def validate_requests(
    prompts: Sequence[str] | Sequence[Sequence[int]],
    sampling_params: SamplingParams | Sequence[SamplingParams] | None,
    *,
    tokenizer: Any,
    max_seq_len: int,
) -> list[tuple[torch.Tensor, SamplingParams]]:
    """把提示词变成 token id 并逐个检查；``max_tokens`` 超出长度上限时截短并给出警告。
    抛出的 TypeError / ValueError 都带 ``code``（见 :func:`coded`）。

    ``max_seq_len`` 已经考虑了 KV 池的总容量（引擎把它限制在总页数 × page_size 之内），
    所以通过检查的请求总有放得下的一天：不会永远等下去。
    """
    if isinstance(prompts, (str, torch.Tensor)) or not isinstance(prompts, Sequence):
        raise coded(TypeError(tr("prompts should be a list whose items are each a string or a list of token ids")),
                    INVALID_TYPE)
    if sampling_params is None:
        sampling_params = SamplingParams()
    if isinstance(sampling_params, SamplingParams):
        params = [sampling_params] * len(prompts)
    else:
        params = list(sampling_params)
        if len(params) != len(prompts):
            raise coded(ValueError(
                tr("The number of sampling_params ({n_params}) does not match the number of prompts ({n_prompts}): give either one SamplingParams shared by all prompts, or one per prompt",
                   n_params=len(params), n_prompts=len(prompts))
            ), INVALID_VALUE)
    vocab = len(tokenizer)
    out: list[tuple[torch.Tensor, SamplingParams]] = []
    for i, (prompt, sp) in enumerate(zip(prompts, params)):
        if not isinstance(sp, SamplingParams):
            raise coded(TypeError(tr("The sampling parameters of prompt {i} are not a SamplingParams but a {type_name}",
                                     i=i, type_name=type(sp).__name__)), INVALID_TYPE)
        try:
            check_sampling(sp)
        except ValueError as e:
            raise coded(ValueError(tr("Invalid sampling parameters for prompt {i}: {e}", i=i, e=e)), INVALID_VALUE) from None
        if isinstance(prompt, str):
            ids = tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, (Sequence, torch.Tensor)):
            ids = _token_ids(i, prompt)
        else:
            raise coded(TypeError(tr("Prompt {i} is neither a string nor a list of token ids: {type_name}",
                                     i=i, type_name=type(prompt).__name__)), INVALID_TYPE)
        if len(ids) == 0:
            raise coded(ValueError(tr("Prompt {i} is empty: it needs at least 1 token", i=i)), INVALID_VALUE)
        try:
            check_token_ids(ids, vocab)
        except ValueError as e:
            raise coded(ValueError(tr("Prompt {i}: {e}", i=i, e=e)), INVALID_VALUE) from None
        outside = [k for k in sp.logit_bias or {} if int(k) >= vocab]
        if outside:
            raise coded(ValueError(tr("Prompt {i}: logit_bias names token ids outside the vocabulary [0, {vocab}): {ids}",
                                      i=i, vocab=vocab, ids=outside[:5])), INVALID_VALUE)
        if len(ids) >= max_seq_len:
            raise coded(ValueError(
                tr("Prompt {i} has {n_ids} tokens, reaching the length limit of a single request, {max_seq_len} (at least 1 output token must fit after the prompt; the limit is the smaller of max_seq_len_override and the KV pool capacity): shorten the prompt, or raise max_seq_len_override / num_page_override",
                   i=i, n_ids=len(ids), max_seq_len=max_seq_len)
            ), CONTEXT_LENGTH_EXCEEDED)
        if sp.max_tokens > max_seq_len - len(ids):
            warnings.warn(
                tr("Prompt {i}: max_tokens={max_tokens} goes past the length limit {max_seq_len}; clipped to {clipped} (the prompt has {n_ids} tokens)",
                   i=i, max_tokens=sp.max_tokens, max_seq_len=max_seq_len, clipped=max_seq_len - len(ids),
                   n_ids=len(ids)),
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
            what = tr("an integer >= {minimum}", minimum=minimum)
            what += tr(", or None (decided automatically)") if optional else ""
            raise ValueError(tr("{name} must be {what}, got {value!r}", name=name, what=what, value=value))

    positive_int("max_running_req")
    positive_int("page_size")
    positive_int("num_page_override", optional=True)
    positive_int("max_seq_len_override", optional=True, minimum=2)
    if hasattr(config, "max_extend_tokens"):
        positive_int("max_extend_tokens")
    dtype = config.dtype
    if dtype is not None and not isinstance(dtype, torch.dtype) and dtype not in _DTYPES:
        raise ValueError(tr("Unsupported dtype={dtype!r}: choose None (automatic), {names}, or the matching torch.dtype",
                            dtype=dtype, names=", ".join(_DTYPES)))
    if isinstance(dtype, torch.dtype) and dtype not in _DTYPES.values():
        raise ValueError(tr("Unsupported dtype={dtype}: choose from {names}", dtype=dtype, names=", ".join(_DTYPES)))
    device = str(config.device)
    if device != "auto":
        try:
            parsed = torch.device(device)
        except RuntimeError:
            raise ValueError(tr("Unrecognised device={device!r}: choose 'auto', 'cpu', 'cuda' or 'cuda:N'",
                                device=device)) from None
        if parsed.type not in ("cpu", "cuda"):
            raise ValueError(tr("Unsupported device={device!r}: choose 'auto', 'cpu', 'cuda' or 'cuda:N'",
                                device=device))
        if parsed.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(tr("device={device!r}, but this machine has no usable CUDA GPU: use 'cpu' or 'auto'",
                                device=device))
    if getattr(config, "cuda_graph", "auto") not in GRAPH_MODES:
        raise ValueError(tr("cuda_graph={cuda_graph!r} is not recognised: choose from {modes}",
                            cuda_graph=config.cuda_graph, modes=", ".join(GRAPH_MODES)))
    if hasattr(config, "cuda_graph_max_bs"):
        positive_int("cuda_graph_max_bs")
    ratio = config.memory_ratio
    if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not 0 < ratio <= 1):
        raise ValueError(tr("memory_ratio (server: --mem-fraction-static) must be in (0, 1] or None (automatic), got {ratio!r}", ratio=ratio))
