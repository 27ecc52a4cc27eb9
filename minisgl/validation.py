"""请求的入口检查：请求从哪里进来（离线的 ``generate``；服务器的 API 和分词进程）就在哪里校验一次，之后谁都不再查；
不合法的一个 token 也不算，并说清楚怎么改。

这部分不属于哪一章：每一章的调度器都靠它，所以你写错了某章，错误输入照样会被拦下。

en: The entry checks for requests: a request is validated once, where it enters (the offline ``generate``; the
server's API and tokenizer process), and trusted after; an invalid one computes not a single token, and the error says
how to fix it.

This part belongs to no chapter: every chapter's scheduler relies on it, so a mistake in some chapter still lets no bad
input through.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import replace
from typing import Any, Sequence, TypeVar

import torch

from minisgl.core import InvalidParam, SamplingParams
from minisgl.graph import GRAPH_MODES
from minisgl.i18n import tr
from minisgl.schedule_policy import check_schedule_policy

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
    if not _is_int(sp.top_k):
        raise InvalidParam("top_k", tr("{name} must be an integer, got {value!r}", name="top_k", value=sp.top_k))
    if sp.max_tokens is not None and not _is_int(sp.max_tokens):
        raise InvalidParam("max_tokens", tr("max_tokens must be None (until the context is full) or an integer, got {value!r}",
                                            value=sp.max_tokens))
    if not isinstance(sp.ignore_eos, bool):
        raise InvalidParam("ignore_eos", tr("ignore_eos must be true or false, got {value!r}", value=sp.ignore_eos))
    if sp.seed is not None and not _is_int(sp.seed):
        raise InvalidParam("seed", tr("seed must be None or an integer, got {seed!r}", seed=sp.seed))
    if sp.seed is not None and sp.seed not in SEED_RANGE:
        raise InvalidParam("seed", tr("seed must be in [-2**63, 2**64), got {seed}", seed=sp.seed))


# ---------------------------------------------------------------- 第 3.5、3.6 章的字段
# en: ---------------------------------------------------------------- the fields of chapters 3.5 and 3.6
# 采样控制和语法的字段早在第 1.1 章的 SamplingParams 里；它们的规则写在这道门里，而不是写在那两章里：这样
# 第 2 阶段的 generate 也挡得住坏值，而不必认识后面的章节。
# en: The control and grammar fields are in chapter 1.1's SamplingParams already; their rules live in this gate,
# en: not in those two chapters, so stage 2's generate refuses bad values too without knowing later chapters.

#: OpenAI 允许的 ``top_logprobs`` 上限。
#: en: The largest ``top_logprobs`` OpenAI allows.
MAX_TOP_LOGPROBS = 20


#: logit 偏置的取值范围（OpenAI 的）。
#: en: The range of a logit bias value (OpenAI's).
BIAS_RANGE = (-100.0, 100.0)


def _real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_controls(sp: SamplingParams) -> None:
    """第 3.5 章各字段的类型和范围（:func:`check_sampling` 调用它）：重复惩罚 > 0、出现 / 频率惩罚在
    [-2, 2]、min_p 在 [0, 1]、min_tokens 在 [0, max_tokens]、偏置的键是 token id、值在 :data:`BIAS_RANGE`、
    top_logprobs 在 [0, :data:`MAX_TOP_LOGPROBS`]。不合法就抛 :class:`~minisgl.core.InvalidParam`，点名字段。
    偏置的键是否在词表里由 :func:`check_prompt` 查（它知道词表）。

    en: The types and ranges of chapter 3.5's fields (:func:`check_sampling` calls it):
    repetition penalty > 0, presence / frequency penalties in [-2, 2], min_p in [0, 1], min_tokens in [0, max_tokens],
    bias keys that are token ids with values in :data:`BIAS_RANGE`, top_logprobs in [0, :data:`MAX_TOP_LOGPROBS`]. An
    invalid value raises :class:`~minisgl.core.InvalidParam` naming the field. Whether a bias key is in the vocabulary
    is checked by :func:`check_prompt` (which knows the vocabulary).
    """
    ranges = {"repetition_penalty": (0.0, math.inf, False), "presence_penalty": (-2.0, 2.0, True),
              "frequency_penalty": (-2.0, 2.0, True), "min_p": (0.0, 1.0, True)}
    for name, (low, high, closed) in ranges.items():
        value = getattr(sp, name)
        if not _real(value) or not (low <= value <= high if closed else low < value <= high):
            raise InvalidParam(name, tr("{name} must be a real number in {range}, got {value!r}", name=name,
                                        range=f"[{low}, {high}]" if closed else f"({low}, {high}]", value=value))
    for name, high in (("min_tokens", math.inf if sp.max_tokens is None else sp.max_tokens),
                       ("top_logprobs", MAX_TOP_LOGPROBS)):
        value = getattr(sp, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            raise InvalidParam(name, tr("{name} must be an integer in [0, {high}], got {value!r}", name=name, high=high,
                                        value=value))
    if not isinstance(sp.logprobs, bool):
        raise InvalidParam("logprobs", tr("logprobs must be true or false, got {value!r}", value=sp.logprobs))
    if sp.logit_bias is None:
        return
    if not isinstance(sp.logit_bias, dict):
        raise InvalidParam("logit_bias", tr("logit_bias must map token ids to numbers, got {value!r}", value=sp.logit_bias))
    for key, value in sp.logit_bias.items():
        if not str(key).isdigit() or isinstance(key, bool) or not _real(value) or not BIAS_RANGE[0] <= value <= BIAS_RANGE[1]:
            raise InvalidParam("logit_bias", tr(
                "logit_bias maps token ids to numbers in [-100, 100], got {key!r}: {value!r}", key=key, value=value))


#: 语法的三种写法：``SamplingParams`` 的字段名。
#: en: The three ways to give a grammar: the ``SamplingParams`` field names.
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf")


def grammar_of(sp: SamplingParams) -> tuple[str, str] | None:
    """请求的语法：``(字段名, 文本)``；没有就是 None。

    en: The request's grammar: ``(field name, text)``; None if it has none.
    """
    for name in GRAMMAR_FIELDS:
        text = getattr(sp, name)
        if text is not None:
            return name, text
    return None


def parse_grammar(kind: str, text: str) -> Any:
    """把一种写法的语法解析成 xgrammar 的 ``Grammar``（不需要分词器）；写错了抛 ``ValueError``，消息里有 xgrammar 的说明。

    JSON 按紧凑格式（不许多余的空白）：小模型被允许随便写空白时，常常一直写空白写到 max_tokens。

    en: Parse a grammar given one way into xgrammar's ``Grammar`` (no tokenizer needed); a mistake raises
    ``ValueError`` with xgrammar's explanation.

    JSON is compact (no extra whitespace): a small model allowed any whitespace often writes whitespace until
    max_tokens.
    """
    import xgrammar as xgr  # 只在真有语法时才导入（要零点几秒） | en: imported only when there is a grammar (it takes a fraction of a second)

    try:
        if kind == "json_schema":
            return xgr.Grammar.from_json_schema(text, any_whitespace=False)
        if kind == "regex":
            return xgr.Grammar.from_regex(text)
        return xgr.Grammar.from_ebnf(text)
    except (RuntimeError, ValueError, TypeError) as e:
        # xgrammar 的消息前面是时间和 C++ 源文件的位置，去掉
        # en: xgrammar's message starts with a time and a C++ source location: drop them
        lines = str(e).strip().splitlines() or [type(e).__name__]
        raise ValueError(re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", lines[0])) from None


def check_grammar(sp: SamplingParams) -> None:
    """第 3.6 章的语法字段（:func:`check_sampling` 调用它）：至多一种，是字符串，能解析，不和 ``ignore_eos``
    一起用（语法走完时只剩结束 token 可选，忽略它就只能在语法之外接着写）。不合法就抛
    :class:`~minisgl.core.InvalidParam`，点名字段。

    en: Chapter 3.6's grammar fields (:func:`check_sampling` calls it): at most one, a string that
    parses, not together with ``ignore_eos`` (once the grammar is complete only the end token is left, and ignoring it
    could only go on writing outside the grammar). An invalid one raises :class:`~minisgl.core.InvalidParam` naming the
    field.
    """
    given = [name for name in GRAMMAR_FIELDS if getattr(sp, name) is not None]
    if len(given) > 1:
        raise InvalidParam(given[1], tr("Give at most one grammar, got {names}", names=", ".join(given)))
    if not given:
        return
    name = given[0]
    if sp.ignore_eos:
        raise InvalidParam("ignore_eos", tr("ignore_eos cannot go with a grammar: the grammar decides where the output ends"))
    text = getattr(sp, name)
    if not isinstance(text, str):
        raise InvalidParam(name, tr("{name} must be a string, got {value!r}", name=name, value=text))
    try:
        parse_grammar(name, text)
    except ValueError as e:
        raise InvalidParam(name, tr("{name} is not a valid grammar: {error}", name=name, error=e)) from None


def check_sampling(sp: SamplingParams) -> None:
    """采样参数的那一道门：先查类型（:func:`check_sampling_types`），再查取值范围（第 1.1 章的
    ``SamplingParams.validate``，范围只写在那里），再查第 3.5、3.6 章的控制和语法。请求从哪里进来就在哪里查一次
    （离线的 ``generate``、API 服务器），之后谁都不再查；不合法时抛 :class:`~minisgl.core.InvalidParam`，服务器把它
    变成点名参数的 400。

    en: The one gate for sampling parameters: types first (:func:`check_sampling_types`), then ranges (chapter 1.1's
    ``SamplingParams.validate``, the only place that knows them), then chapters 3.5 and 3.6's controls and grammar.
    It runs once, where a request enters (the offline ``generate``, the API server), and nothing after checks again;
    an invalid value raises :class:`~minisgl.core.InvalidParam`, which the server turns into a 400 naming the
    parameter.
    """
    check_sampling_types(sp)
    sp.validate()
    check_controls(sp)
    check_grammar(sp)


def check_prompt(ids: Sequence[int], sp: SamplingParams, vocab: int, max_seq_len: int) -> SamplingParams:
    """token 的那一道门，离线的 ``generate`` 和服务器的分词进程都用它（只有它们手里有 token）：提示词不能是空的，
    id 和 ``logit_bias`` 的键都要在词表里，长度守 :func:`fit_context` 的规则。返回 ``max_tokens`` 定下来的采样
    参数；出错抛带 ``code`` 的 ValueError。

    en: The gate for tokens, used by the offline ``generate`` and by the server's tokenizer process (the only places
    holding tokens): the prompt must not be empty, its ids and the keys of ``logit_bias`` must lie in the vocabulary,
    and its length keeps :func:`fit_context`'s rule. Returns the sampling parameters with ``max_tokens`` settled; a
    violation raises a ValueError carrying a ``code``.
    """
    if len(ids) == 0:
        raise coded(ValueError(tr("The prompt is empty: it needs at least 1 token")), INVALID_VALUE)
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise coded(ValueError(tr("The prompt has token ids outside the vocabulary (size {vocab}): {bad}", vocab=vocab,
                                  bad=bad[:5])), INVALID_VALUE)
    outside = [k for k in sp.logit_bias or {} if int(k) >= vocab]
    if outside:
        raise coded(ValueError(tr("logit_bias names token ids outside the vocabulary [0, {vocab}): {ids}", vocab=vocab,
                                  ids=outside[:5])), INVALID_VALUE)
    return fit_context(len(ids), sp, max_seq_len)


def fit_context(prompt_len: int, sp: SamplingParams, max_seq_len: int) -> SamplingParams:
    """单个请求长度的那一条规则，离线的 ``generate`` 和服务器的分词进程都用它：提示词之后至少要放得下一个输出
    token；给了 ``max_tokens``，它和提示词加起来不能超出上限 ``max_seq_len``——超出是错，不悄悄截短；没给（None）
    就是上限剩下的全部。返回 ``max_tokens`` 定下来的采样参数；出错时抛带 :data:`CONTEXT_LENGTH_EXCEEDED` 的
    ValueError。``max_seq_len`` 已经考虑了 KV 池的总容量，所以通过的请求总有放得下的一天，不会永远等下去。

    en: The one rule for a request's length, used by the offline ``generate`` and by the server's tokenizer process:
    at least one output token must fit after the prompt; a given ``max_tokens`` must fit with the prompt within the
    limit ``max_seq_len`` (past it is an error, never a silent clip); an absent one (None) is all the room left.
    Returns the sampling parameters with ``max_tokens`` settled; on a violation raises a ValueError carrying
    :data:`CONTEXT_LENGTH_EXCEEDED`. ``max_seq_len`` already accounts for the KV pool's capacity, so a request that
    passes can always run some day and never waits forever.
    """
    room = max_seq_len - prompt_len
    if room < 1:
        raise coded(ValueError(tr(
            "The prompt has {n_ids} tokens, reaching the length limit of a single request, {max_seq_len} (at least 1 output token must fit after it; the limit is the smaller of the configured maximum sequence length and the KV pool's capacity): shorten the prompt",
            n_ids=prompt_len, max_seq_len=max_seq_len)), CONTEXT_LENGTH_EXCEEDED)
    if sp.max_tokens is None:
        return replace(sp, max_tokens=room)
    if sp.max_tokens > room:
        raise coded(ValueError(tr(
            "max_tokens={max_tokens} does not fit: the prompt has {n_ids} tokens and a request holds at most {max_seq_len} (prompt included), so at most {room} can be output; lower max_tokens, or leave it out to generate until the context is full",
            max_tokens=sp.max_tokens, n_ids=prompt_len, max_seq_len=max_seq_len, room=room)), CONTEXT_LENGTH_EXCEEDED)
    return sp


def validate_requests(
    prompts: Sequence[str] | Sequence[Sequence[int]],
    sampling_params: SamplingParams | Sequence[SamplingParams] | None,
    *,
    tokenizer: Any,
    max_seq_len: int,
) -> list[tuple[torch.Tensor, SamplingParams]]:
    """离线请求的那一道门：把提示词变成 token id，逐个检查采样参数（:func:`check_sampling`）、token 和长度
    （:func:`check_prompt`），返回 ``(token id, max_tokens 已定下的采样参数)``。抛出的 TypeError / ValueError 都带
    ``code``（见 :func:`coded`）；通过的请求调度器不再查。

    en: The one gate for offline requests: turn the prompts into token ids, check each one's sampling parameters
    (:func:`check_sampling`), tokens and length (:func:`check_prompt`), and return ``(token ids, sampling parameters
    with max_tokens settled)``. Every TypeError / ValueError raised carries a ``code`` (see :func:`coded`); the
    scheduler trusts what passes.
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
        try:
            sp = check_prompt(ids, sp, vocab, max_seq_len)
        except ValueError as e:
            raise coded(ValueError(tr("Prompt {i}: {e}", i=i, e=e)), getattr(e, "code", INVALID_VALUE)) from None
        out.append((torch.tensor(ids, dtype=torch.int32), sp))
    return out


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


#: 认得的投机解码算法（``--speculative-algorithm``）。
#: en: The speculative algorithms known (``--speculative-algorithm``).
SPECULATIVE_ALGORITHMS = ("NGRAM", "EARLY_EXIT")


def check_speculative(config: Any) -> None:
    """``speculative_*`` 配置在建引擎之前检查（ValueError），参数名是 SGLang 的服务器参数。``EARLY_EXIT`` 的层数
    读得到模型目录的 ``config.json`` 时就按模型的层数检查（只读配置，不加载权重）。

    en: Check the ``speculative_*`` configuration before the engine is built (ValueError), naming SGLang's server flags.
    ``EARLY_EXIT``'s layer count is checked against the model's layers whenever the model directory's ``config.json``
    can be read (the configuration only, no weights loaded).
    """
    algorithm = config.speculative_algorithm
    layers = getattr(config, "speculative_draft_layers", None)
    name = None if algorithm is None else str(algorithm).upper()
    if layers is not None and name != "EARLY_EXIT":
        raise ValueError(tr("speculative_draft_layers (--speculative-draft-layers) is the draft depth of "
                            "EARLY_EXIT: set speculative_algorithm to EARLY_EXIT or leave it out"))
    if algorithm is None:
        return
    if name not in SPECULATIVE_ALGORITHMS:
        raise ValueError(tr("Unknown speculative algorithm {name!r} (--speculative-algorithm): this engine knows {known}",
                            name=algorithm, known=", ".join(SPECULATIVE_ALGORITHMS)))
    config.speculative_algorithm = name
    if config.speculative_num_draft_tokens < 2:
        raise ValueError(tr("--speculative-num-draft-tokens counts the last verified token too, so it must be at least "
                            "2, got {value}", value=config.speculative_num_draft_tokens))
    if name == "EARLY_EXIT":
        if layers is not None:  # None：起草器按模型的层数挑（minisgl.early_exit） | en: None: the drafter picks by the model's layers (minisgl.early_exit)
            check_draft_layers(layers, _num_layers(config.model_path))
        return
    check_ngram_args(config.speculative_ngram_min_match_window_size, config.speculative_ngram_max_match_window_size,
                     config.speculative_ngram_min_bfs_breadth, config.speculative_ngram_max_bfs_breadth,
                     config.speculative_ngram_branch_length, config.speculative_ngram_capacity,
                     config.speculative_num_draft_tokens - 1)


def _num_layers(model_path: Any) -> int | None:
    """模型目录的 ``config.json`` 里的层数；读不到（目录不存在、没有配置）就是 None，留给加载模型时去报。"""
    from pathlib import Path

    if model_path is None or not (Path(str(model_path)) / "config.json").is_file():
        return None
    from minisgl.architectures import load_model_config

    return load_model_config(model_path).num_layers


def check_draft_layers(layers: Any, num_layers: int | None) -> None:
    """early exit 起草用前几层：一个整数，至少 1，少于模型的层数（全部层就是目标模型自己，没有可省的）；
    ``num_layers`` 为 None（模型还不知道）时只查下限。

    en: Early-exit drafting uses the first few layers: an integer, at least 1, fewer than the model's layers (all of
    them would be the target model itself, with nothing saved); with ``num_layers`` None (the model not known yet) only
    the lower bound is checked.
    """
    if not _is_int(layers) or layers < 1:
        raise ValueError(tr("speculative_draft_layers (--speculative-draft-layers) must be an integer >= 1 with "
                            "EARLY_EXIT, got {value!r}", value=layers))
    if num_layers is not None and layers >= num_layers:
        raise ValueError(tr("speculative_draft_layers (--speculative-draft-layers) must be from 1 to {top}: this model "
                            "has {n} layers, and drafting with all of them saves nothing; got {value}",
                            top=num_layers - 1, n=num_layers, value=layers))


#: 认得的量化（``--quantization``，也叫 ``--torchao-config``）：名字照 torchao / SGLang 的只量化权重的写法。
#: en: The quantizations known (``--quantization``, also ``--torchao-config``): named as torchao / SGLang write
#: en: weight-only quantization.
QUANTIZATIONS = ("int8wo", "int4wo-<group>")


def parse_quantization(name: Any) -> tuple[str, int | None]:
    """``int8wo`` → ``("int8", None)``（每个输出通道一个 scale）；``int4wo-G`` → ``("int4", G)``（每 G 列一组，G 是 32
    的正倍数）。别的名字抛 ValueError，说出认得的写法。

    en: ``int8wo`` → ``("int8", None)`` (one scale per output channel); ``int4wo-G`` → ``("int4", G)`` (groups of G
    columns, G a positive multiple of 32). Any other name raises ValueError naming the forms known.
    """
    text = str(name).strip().lower()
    if text == "int8wo":
        return "int8", None
    method, _, group = text.partition("-")
    if method == "int4wo" and group.isdigit() and int(group) > 0 and int(group) % 32 == 0:
        return "int4", int(group)
    raise ValueError(tr("Unknown quantization {name!r} (--quantization): choose int8wo (int8, one scale per output "
                        "channel) or int4wo-G (int4 in groups of G input columns, G a multiple of 32, e.g. int4wo-128)",
                        name=name))


def check_quantization(config: Any) -> None:
    """``quantization`` 在建引擎之前检查（ValueError），写法统一成小写。组的大小能不能整除每个线性层的输入维，要等
    模型切好才知道（张量并行时每个秩只有一段），加载后由 :mod:`minisgl.quantized` 查。

    en: Check ``quantization`` before the engine is built (ValueError) and normalise it to lower case. Whether the group
    size divides every linear layer's input dimension is known only once the model is split (under tensor parallelism
    each rank holds a slice), so :mod:`minisgl.quantized` checks it after loading.
    """
    if config.quantization is None:
        return
    parse_quantization(config.quantization)
    config.quantization = str(config.quantization).strip().lower()


def validate_config(config: Any, cache_types: tuple[str, ...] = ("naive",)) -> None:
    """引擎 / 调度器配置在建引擎之前检查一遍：错的值立刻报清楚，而不是到很后面才以奇怪的方式出错。调度器的
    ``cache_type`` 要在 ``cache_types``（零件认得的前缀缓存种类）里；``None`` 换成其中第一个。

    en: Check an engine / scheduler configuration before the engine is built: a wrong value is reported clearly at once
    rather than failing oddly much later. A scheduler's ``cache_type`` must be in ``cache_types`` (the prefix-cache
    kinds its parts know); ``None`` becomes the first of them.
    """

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
    if hasattr(config, "cache_type"):
        config.cache_type = config.cache_type or cache_types[0]
        if config.cache_type not in cache_types:
            raise ValueError(tr("Unknown cache_type={cache_type!r}, or not supported in this chapter: this chapter's "
                                "engine supports {known} (the radix prefix cache comes in chapter 2.3)",
                                cache_type=config.cache_type, known=", ".join(repr(t) for t in cache_types)))
    if hasattr(config, "schedule_policy"):
        check_schedule_policy(config.schedule_policy)
    if hasattr(config, "speculative_algorithm"):
        check_speculative(config)
    if hasattr(config, "quantization"):
        check_quantization(config)
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


def check_ngram_args(min_window: int, max_window: int, min_breadth: int, max_breadth: int, branch_length: int,
                     capacity: int, num_draft: int) -> None:
    """不合理的参数在启动之前就拒绝（ValueError），消息说出是哪一个、要什么。

    en: Refuse unreasonable parameters before anything starts (ValueError), saying which one and what it needs.
    """
    if not 1 <= min_window <= max_window:
        raise ValueError(tr("The n-gram match windows need 1 <= min <= max, got min={lo} and max={hi} "
                            "(--speculative-ngram-min-match-window-size / --speculative-ngram-max-match-window-size)",
                            lo=min_window, hi=max_window))
    if not 1 <= min_breadth <= max_breadth:
        raise ValueError(tr("The n-gram BFS breadths need 1 <= min <= max, got min={lo} and max={hi} "
                            "(--speculative-ngram-min-bfs-breadth / --speculative-ngram-max-bfs-breadth)",
                            lo=min_breadth, hi=max_breadth))
    for name, value in (("--speculative-ngram-branch-length", branch_length), ("--speculative-ngram-capacity", capacity),
                        ("--speculative-num-draft-tokens", num_draft)):
        if value < 1:
            raise ValueError(tr("{name} must be at least 1, got {value}", name=name, value=value))
