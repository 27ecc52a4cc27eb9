"""第 1.1 章 core 的检查：采样参数校验、请求的长度记账、批次与全局上下文。"""

from __future__ import annotations

from functools import partial
import pytest
import torch

from minisgl.i18n import tr
from minisgl.core import Batch, Context, InvalidParam, Req, SamplingParams, get_global_ctx, set_global_ctx
from minisgl.engine import Engine, EngineConfig
from minisgl.overlap import PARTS as FINAL_PARTS
from minisgl.scheduler import Scheduler

from .conftest import engine_matches_hf, expect, final_llm_matches_hf


def make_req(prompt_len: int = 5, output_len: int = 3, cached_len: int = 0, table_idx: int = 0) -> Req:
    ids = torch.arange(100, 100 + prompt_len, dtype=torch.int32)
    return Req(ids, table_idx=table_idx, cached_len=cached_len, output_len=output_len, uid=7, sampling_params=SamplingParams())


def test_sampling_params_validate() -> None:
    for ok in [SamplingParams(), SamplingParams(temperature=0.7, top_k=50, top_p=0.9, max_tokens=1)]:
        ok.validate()
    expect(SamplingParams().is_greedy, True, tr("SamplingParams() (temperature 0) is greedy"))
    expect(SamplingParams(temperature=1.0, top_k=1).is_greedy, True, tr("top_k=1 is greedy whatever the temperature"))
    expect(SamplingParams(temperature=0.5).is_greedy, False, tr("temperature=0.5 without top_k=1 is not greedy"))
    bad = [
        (SamplingParams(temperature=-0.1), "temperature"),
        (SamplingParams(top_k=0), "top_k"),
        (SamplingParams(top_k=-2), "top_k"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(max_tokens=0), "max_tokens"),
    ]
    for params, field in bad:
        with pytest.raises(InvalidParam) as info:
            params.validate()
            pytest.fail(tr("validate() must reject {params} (InvalidParam)", params=params))
        expect(info.value.param, field, tr("validate() rejected {params}: InvalidParam.param names the field", params=params))


def test_req_lengths() -> None:
    req = make_req(prompt_len=5, output_len=3)
    assert (req.cached_len, req.device_len, req.max_device_len) == (0, 5, 8), tr("New request: device_len = prompt length, max_device_len = prompt length + output_len")
    assert req.extend_len == 5, tr("Prefill must compute the whole prompt")
    expect(req.remain_len, 3, tr("New request with output_len=3: remain_len"))
    expect(req.can_decode, True, tr("New request with output_len=3: can_decode"))
    prefixed = make_req(prompt_len=6, output_len=2, cached_len=4)
    assert prefixed.extend_len == 2, tr("With 4 tokens cached, only the remaining 2 need to be computed")
    batch = Batch([req, prefixed], "prefill")
    expect((batch.is_prefill, batch.is_decode), (True, False), tr("Batch(..., 'prefill'): (is_prefill, is_decode)"))
    expect(batch.size, 2, tr("Batch of 2 requests: size"))


@pytest.mark.parametrize(
    "prompt_len, output_len, cached_len",
    [(5, 3, 5), (5, 3, 6), (5, 3, -1), (0, 3, 0), (5, -1, 0)],
)
def test_req_invariant_rejected(prompt_len: int, output_len: int, cached_len: int) -> None:
    with pytest.raises(ValueError):
        make_req(prompt_len=prompt_len, output_len=output_len, cached_len=cached_len)
        pytest.fail(tr("A request that violates 0 <= cached_len < device_len <= max_device_len must raise ValueError"))


def test_req_input_ids_must_be_on_cpu() -> None:
    with pytest.raises(ValueError):
        Req(torch.zeros(3, dtype=torch.int32, device="meta"), 0, 0, 2, 0, SamplingParams())
        pytest.fail(tr("input_ids that are not on the CPU must raise ValueError"))


def test_complete_one_produces_exactly_output_len_tokens() -> None:
    """预填充 1 次 + 解码若干次：一共恰好 output_len 次前向，每次之后长度记账都对。"""
    prompt_len, output_len = 4, 5
    req = make_req(prompt_len=prompt_len, output_len=output_len)
    extend_lens, forwards = [], 0
    while True:
        extend_lens.append(req.extend_len)
        req.complete_one()  # 一次前向
        forwards += 1
        req.append_host(torch.tensor([900 + forwards], dtype=torch.int32))
        assert req.cached_len == req.device_len - 1, tr("After a forward pass, everything except the token just sampled is in the cache")
        lens = (req.cached_len, req.device_len, req.max_device_len)
        assert 0 <= lens[0] < lens[1] <= lens[2], tr("After complete_one + append_host, 0 <= cached_len < device_len <= max_device_len must hold, got {lens}", lens=lens)
        assert len(req.input_ids) == req.device_len, tr("input_ids on the host must be as long as device_len")
        if not req.can_decode:
            break
    assert forwards == output_len, tr("Must generate exactly {output_len} tokens, got {forwards}", output_len=output_len, forwards=forwards)
    assert extend_lens == [prompt_len] + [1] * (output_len - 1), tr("The first step computes the whole prompt, then 1 token per step")
    expect(req.remain_len, 0, tr("After output_len forward passes: remain_len"))


def test_append_host() -> None:
    req = make_req(prompt_len=3)
    req.complete_one()
    req.append_host(torch.tensor([42], dtype=torch.int32))
    expect(req.input_ids.tolist(), [100, 101, 102, 42], tr("input_ids after append_host(42) on the prompt [100, 101, 102]"))
    expect((req.input_ids.dtype, req.input_ids.dim(), req.input_ids.is_cpu), (torch.int32, 1, True), tr("input_ids after append_host: (dtype, dim, on the CPU)"))


def test_context_forward_batch() -> None:
    ctx = Context(page_size=4)
    batch = Batch([make_req()], "prefill")
    with ctx.forward_batch(batch):
        expect(ctx.batch is batch, True, tr("Inside ctx.forward_batch(batch), ctx.batch is that batch"))
        with pytest.raises(RuntimeError):
            with ctx.forward_batch(batch):
                pass
            pytest.fail(tr("Nested forward_batch must raise RuntimeError"))
    with pytest.raises(RuntimeError):
        _ = ctx.batch  # 离开 with 之后没有当前批次 | en: no current batch after the with block
    with pytest.raises(KeyError):
        with ctx.forward_batch(batch):
            raise KeyError(tr("Error in the forward pass"))
    with ctx.forward_batch(batch):  # 出错之后批次也要清掉，能再次进入
        pass
    set_global_ctx(ctx)
    expect(get_global_ctx() is ctx, True, tr("get_global_ctx() returns the context given to set_global_ctx"))
    set_global_ctx(None)


def test_nested_entry_keeps_the_outer_batch() -> None:
    ctx = Context(page_size=4)
    with pytest.raises(RuntimeError):
        _ = ctx.batch  # 还没进过 with 块 | en: no with block entered yet
    outer, inner = Batch([make_req()], "prefill"), Batch([make_req()], "decode")
    with ctx.forward_batch(outer):
        with pytest.raises(RuntimeError):
            with ctx.forward_batch(inner):
                pass
        current = ctx.batch
        expect(current is outer, True, tr("After a nested forward_batch was refused, ctx.batch is still the outer batch (got the {phase} batch)", phase=current.phase))


def test_two_contexts_are_independent() -> None:
    """一个进程里可以有两个上下文（两个引擎，或 CUDA 图回放时的替身）：当前批次属于各自的上下文。

    en: A process may hold two contexts (two engines, or the stand-in a CUDA graph replays with): the current batch belongs
    to each context on its own.
    """
    first, second = Context(page_size=4), Context(page_size=4)
    a, b = Batch([make_req()], "prefill"), Batch([make_req()], "decode")
    with first.forward_batch(a):
        try:
            leaked = second.batch
        except RuntimeError:
            leaked = None
        expect(leaked, None, tr("While the first context is inside its block, the second context has no current batch"))
        try:
            with second.forward_batch(b):
                expect((first.batch is a, second.batch is b), (True, True),
                       tr("Inside both blocks each context's batch is its own (first is a, second is b)"))
        except RuntimeError as e:
            pytest.fail(tr("Entering a second context while the first is inside its block raised {e!r}: the current batch must belong to the context, not to the class or the module", e=e))
        expect(first.batch is a, True, tr("Leaving the second context's block leaves the first context's batch current"))


def test_batch_repr_before_fields_are_filled() -> None:
    """报错信息和调试器都会打印批次：input_ids 等字段填好之前，repr 也不能抛 AttributeError。"""
    batch = Batch([make_req(table_idx=3)], "prefill")
    try:
        text = repr(batch)
    except AttributeError as e:
        pytest.fail(tr("repr(Batch) raised {e!r} before the fields were filled: Batch.__repr__ is code given in the skeleton, copy it from the new stage1/core.py", e=e))
    assert "prefill" in text and "table_idx=3" in text, tr("repr must show the phase and the requests, got {text}", text=text)


@pytest.mark.parametrize("token", [torch.tensor(42), torch.tensor([42]), torch.tensor([42], dtype=torch.int32)], ids=["int64-0d", "int64-[1]", "int32-[1]"])
def test_append_host_normalizes_token(token: torch.Tensor) -> None:
    """采样器给的 token 可能是 int64、可能是 0 维：接上之后 input_ids 仍是 1 维 int32。"""
    req = make_req(prompt_len=3)
    req.complete_one()
    req.append_host(token)
    ids = req.input_ids
    assert ids.dtype == torch.int32 and ids.dim() == 1, (
        tr("After append_host({dtype}, shape {value}), input_ids must be 1-D int32, got {dtype2}, shape {value2}", dtype=token.dtype, value=tuple(token.shape), dtype2=ids.dtype, value2=tuple(ids.shape))
    )
    expect(ids.tolist(), [100, 101, 102, 42], tr("input_ids after append_host(42) on the prompt [100, 101, 102]"))


def test_forward_batch_cleared_after_error() -> None:
    ctx = Context(page_size=4)
    with pytest.raises(KeyError):
        with ctx.forward_batch(Batch([make_req()], "prefill")):
            raise KeyError(tr("Error in the forward pass"))
    again = Batch([make_req()], "decode")
    try:
        with ctx.forward_batch(again):
            expect(ctx.batch is again, True, tr("Inside ctx.forward_batch(batch), ctx.batch is that batch"))
    except RuntimeError:
        pytest.fail(tr("After an exception inside the with block the next batch must be able to enter: the current batch is cleared on the way out however the block ends (try/finally)"))


@pytest.mark.parametrize(
    "kw", [dict(top_k=1), dict(top_k=-1), dict(top_p=1.0), dict(temperature=0.0), dict(max_tokens=1)], ids=lambda kw: str(kw)
)
def test_sampling_params_boundaries_are_valid(kw: dict) -> None:
    """边界上的值都合法：top_k=1（贪心）、top_k=-1（不限制）、top_p=1、temperature=0、max_tokens=1。"""
    params = SamplingParams(**kw)
    try:
        params.validate()
    except ValueError as e:
        pytest.fail(tr("{kw} is a valid boundary value, but validate() rejected it: {e}", kw=kw, e=e))


# ----------------------------------------------------------------------------- 在后面章节下跑本章的代码（issue 24）


def test_later_chapters_run_this_core_and_match_hf(tiny_path: str) -> None:
    """引擎（第 1.6 章）和最终的调度器（第 2.5 章，分块加重叠调度）都用本章的 Req / Batch / Context：
    extend_len、complete_one、append_host 错一点，单独测不出来的，在这里会变成与 Hugging Face 不同的 token。"""
    classes = dict(Engine=Engine, EngineConfig=EngineConfig, Req=Req, Batch=Batch, SamplingParams=SamplingParams)
    engine_matches_hf(classes, tiny_path, tr("The engine (chapter 1.6) with your core"), page_size=4)
    final_llm_matches_hf(partial(Scheduler, parts=FINAL_PARTS), SamplingParams, tiny_path, tr("The final scheduler (chapter 2.5, chunk size 5, overlap scheduling on) with your core"))
