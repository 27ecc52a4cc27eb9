"""第 2.4 章 chunked_prefill 的检查：每步预填充不超过 max_extend_tokens；长提示词分块、其他请求穿插；
分块中途采样的 token 既不输出、也不覆盖提示词的下一个 token；整段都缓存过的提示词仍至少算 1 个 token；
分块与否，每个请求的输出都与 Hugging Face 一致。"""

from __future__ import annotations

from functools import partial
import pytest
import torch

from .conftest import LONG_PROMPT, SMOLLM2_TOKENS, SMOL_KW, TINY_KW, assert_idle, expect, record, results, run_under_later_chapters
from minisgl.i18n import tr
from minisgl.cache_manager import CacheManager, NaivePrefixCache
from minisgl.chunked_prefill import PARTS, ChunkInterleave, ChunkedPrefillAdder, ChunkedReq
from minisgl.overlap import PARTS as FINAL_PARTS
from minisgl.scheduler import Scheduler

#: 本章的引擎：第 2.1 章的调度器握着到本章为止的零件。
LLM = partial(Scheduler, parts=PARTS)
from minisgl.core import SamplingParams
from minisgl.scheduling import PendingReq, TableManager


def test_302_token_prompt_in_4_chunks(tiny_path: str, qwen_tokenizer, make_llm) -> None:  # noqa: ANN001
    expect(len(qwen_tokenizer.encode(LONG_PROMPT)), 302, tr("Test setup: tokens in the long prompt with the Qwen3 tokenizer"))
    llm = make_llm(LLM, tiny_path, **TINY_KW, max_extend_tokens=96)
    rec = record(llm)
    out = llm.generate([LONG_PROMPT], SamplingParams(max_tokens=4, ignore_eos=True))
    assert rec.prefill_steps() == [96, 96, 96, 14], tr("302 tokens with at most 96 per step: 4 steps [96, 96, 96, 14], got {value}", value=rec.prefill_steps())
    assert len(out[0]["token_ids"]) == 4, tr("No tokens are output mid-chunk: generation starts after the last chunk")
    phases = [s.phase for s in rec.steps]
    assert phases == ["prefill"] * 4 + ["decode"] * 3, tr("With nothing decoding, the chunks follow one another with no other step in between; steps: {phases}", phases=phases)
    assert_idle(llm)


def test_budget_never_exceeded_and_requests_interleave(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    budget = 7
    llm = make_llm(LLM, tiny_path, **TINY_KW, max_extend_tokens=budget)
    rec = record(llm)
    prompts = [[3] * 4, [4] * 30, [5] * 9, [6] * 2, [7] * 15]
    out = llm.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    expect([len(o["token_ids"]) for o in out], [6] * 5, tr("Tokens generated per request (max_tokens=6, EOS ignored)"))
    prefills = [s for s in rec.steps if s.phase == "prefill"]
    assert all(s.tokens <= budget for s in prefills), tr("Each prefill step computes at most {budget} tokens: {value}", budget=budget, value=[s.extend_lens for s in prefills])
    assert sum(s.tokens for s in prefills) == sum(map(len, prompts)), tr("Each prompt token is computed exactly once")
    long_uid = prefills[0].uids[1]
    long_steps = [i for i, s in enumerate(rec.steps) if s.phase == "prefill" and long_uid in s.uids]
    assert len(long_steps) >= 4, tr("A 30-token prompt must be split into several chunks")
    shared = [rec.steps[i] for i in long_steps if len(rec.steps[i].uids) > 1]
    assert shared, tr("The chunked request shares a step with other requests (admit others while budget remains)")
    between = [s.phase for s in rec.steps[long_steps[0] : long_steps[-1]]]
    assert "decode" in between, tr("Between two chunks, running requests can decode a step (not blocked by the long prompt); steps: {value}", value=[s.phase for s in rec.steps])
    assert_idle(llm)


def test_partial_chunk_token_neither_emitted_nor_written_over_prompt(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **TINY_KW, max_extend_tokens=8)
    prompt = list(range(1000, 1020))
    checked = []

    def check(trace) -> None:  # noqa: ANN001
        for row, cached, extend, is_output in zip(trace.rows, trace.cached_lens, trace.extend_lens, trace.outputs):
            if trace.is_prefill and not is_output:
                end = cached + extend
                assert bool((llm.token_pool[row, end:] == SENTINEL).all()), (
                    tr("The token sampled mid-chunk (after {end} tokens) must not be written into this request's token-pool row: that position holds the next prompt token", end=end)
                )
                checked.append(end)

    SENTINEL = -7
    llm.token_pool.fill_(SENTINEL)  # 还没写过的位置都是哨兵值：谁写了它一眼就能看出来
    record(llm, after=check)
    out = llm.generate([prompt], SamplingParams(max_tokens=5, ignore_eos=True))
    assert checked == [8, 16], tr("20 tokens, 8 per chunk: the first two chunks are partial")
    assert len(out[0]["token_ids"]) == 5, tr("Partial chunks output no tokens")
    assert_idle(llm)


def test_fully_cached_long_prompt_computes_one_token(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **TINY_KW, max_extend_tokens=96)
    rec = record(llm)
    sp = SamplingParams(max_tokens=3, ignore_eos=True)
    llm.generate([LONG_PROMPT], sp)
    expect(rec.prefill_steps(), [96, 96, 96, 14], tr("Tokens prefilled per step for the 302-token prompt with a budget of 96"))
    rec.reset()
    llm.generate([LONG_PROMPT], sp)
    assert rec.prefill_steps() == [1], tr("The whole prompt is cached: compute only the last token, in one step")
    assert_idle(llm)


def test_abort_chunked_request_frees_everything(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **TINY_KW, max_extend_tokens=16)
    res = results(llm)
    uid = llm.add_request(list(range(200, 260)), SamplingParams(max_tokens=4, ignore_eos=True))
    llm.step()
    llm.step()
    assert llm.prefill_manager.pending_list[0].chunked_req is not None, tr("Two chunks computed, still chunking")
    llm.abort(uid)
    llm.run_until_idle()
    assert res.ends(uid) == ["abort"] and res.tokens(uid) == [], tr("An aborted request outputs no tokens")
    llm.check_integrity()
    assert_idle(llm)


@pytest.mark.parametrize("chunk,cache_type,page_size", [(5, "radix", 1), (3, "naive", 4), (16, "radix", 4)])
def test_chunked_matches_hf(smollm2_path, smollm2_prompts, smollm2_reference, make_llm, chunk, cache_type, page_size) -> None:  # noqa: ANN001
    llm = make_llm(
        LLM, smollm2_path, **{**SMOL_KW, "max_extend_tokens": chunk, "cache_type": cache_type, "page_size": page_size,
                              "num_page_override": 1024 // page_size}
    )  # fmt: skip
    rec = record(llm)
    sp = SamplingParams(max_tokens=SMOLLM2_TOKENS, ignore_eos=True)
    out = [o["token_ids"] for o in llm.generate(smollm2_prompts, sp)]
    assert max(rec.prefill_steps()) <= chunk, tr("Each prefill step is at most the chunk size {chunk}, got {steps}", chunk=chunk, steps=rec.prefill_steps())
    for i, (ours, ref) in enumerate(zip(out, smollm2_reference)):
        assert ours == ref, tr("chunk size {chunk}, {cache_type}, page_size={page_size}: request {i} differs from HF\nours: {ours}\nHF:   {ref}", chunk=chunk, cache_type=cache_type, page_size=page_size, i=i, ours=ours, ref=ref)
    alone = SamplingParams(max_tokens=12, ignore_eos=True)
    singles = [llm.generate([p], alone)[0]["token_ids"] for p in smollm2_prompts[4:6]]
    assert singles == [r[:12] for r in smollm2_reference[4:6]], tr("Running alone (chunked) also matches HF")
    assert_idle(llm)


# ----------------------------------------------------------------------------- 学员走查补的检查（issue 16）


@pytest.mark.parametrize("prompt_len", [16, 17])
def test_last_chunk_that_exactly_fits_the_budget_is_a_plain_req(prompt_len: int) -> None:
    """预算每步 8：16 个 token 的提示词第二块剩 8 个，正好等于预算——它是最后一块（普通 Req），不是又一个分块；
    17 个 token 的则要第三块（剩 1 个）。直接驱动准入员，一块一块地看。"""
    page_table = torch.zeros(5, 64, dtype=torch.int32)
    cm = CacheManager(16, 4, page_table, NaivePrefixCache())
    tables, token_pool = TableManager(4), torch.zeros(5, 64, dtype=torch.int32)
    prompt = torch.arange(1, prompt_len + 1, dtype=torch.int32)
    pending = PendingReq(0, prompt, SamplingParams(max_tokens=4))
    kinds, rows = [], []
    for step in range(4):
        adder = ChunkedPrefillAdder(token_budget=8, reserved_size=0, table_manager=tables, cache_manager=cm, token_pool=token_pool)
        try:
            req = adder.try_add_one(pending)
        except ValueError as err:
            pytest.fail(tr("{prompt_len} tokens, budget 8 per step: chunks so far {kinds}, the next chunk failed: {err} (when the remainder <= budget it must be the last chunk)", prompt_len=prompt_len, kinds=kinds, err=err))
        assert req is not None, tr("Chunk {step} was not admitted (chunks admitted: {kinds})", step=step, kinds=kinds)
        kinds.append(f"{type(req).__name__}[{req.cached_len}:{req.device_len}]")
        rows.append(req.table_idx)
        req.complete_one()  # 这一块发出去了
        if not isinstance(req, ChunkedReq):
            break
        assert pending.chunked_req is req, tr("A partial chunk must be recorded in pending.chunked_req so that the next step continues it: {kinds}", kinds=kinds)
    expect = {16: ["ChunkedReq[0:8]", "Req[8:16]"], 17: ["ChunkedReq[0:8]", "ChunkedReq[8:16]", "Req[16:17]"]}[prompt_len]
    assert kinds == expect, (
        tr("{prompt_len} tokens, budget 8 per step: expected chunks {expect}, got {kinds} (when the remainder <= budget it is the last chunk: let the parent class build a plain Req)", prompt_len=prompt_len, expect=expect, kinds=kinds)
    )
    assert len(set(rows)) == 1 and tables.available_size == 3, tr("All chunks reuse the same request slot: rows {rows}, {available_size}/4 slots free", rows=rows, available_size=tables.available_size)
    assert pending.chunked_req is None, tr("After the last chunk is admitted, clear pending.chunked_req (the request no longer has a half-computed chunk)")
    assert token_pool[rows[0], :prompt_len].tolist() == prompt.tolist(), tr("Every chunk writes its part of the prompt into the same token-pool row")


def test_exactly_one_decode_step_between_chunks(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    """A 在解码、B 的 30 个 token 分块算：每算完一块只让解码走一步，再接着算下一块（不是一直解码）。"""
    llm = make_llm(LLM, tiny_path, **TINY_KW, max_extend_tokens=8)
    rec, res = record(llm), results(llm)
    a = llm.add_request([1, 2, 3], SamplingParams(max_tokens=40, ignore_eos=True))
    llm.step()  # A 预填充，之后一直在解码
    b = llm.add_request([4] * 30, SamplingParams(max_tokens=2, ignore_eos=True))
    rec.reset()
    while not any(s.phase == "prefill" and s.uids == [b] and s.tokens == 30 - 24 for s in rec.steps):
        assert llm.step(), tr("step() returned False while requests were still waiting")
        assert len(rec.steps) < 20, tr("B's chunks never finish: {value}", value=[(s.phase, s.uids) for s in rec.steps])
    phases = [s.phase for s in rec.steps]
    assert phases == ["prefill", "decode"] * 3 + ["prefill"], tr("Chunks and decode steps must alternate (4 chunks in all); steps: {phases}", phases=phases)
    llm.run_until_idle()
    expect([len(res.tokens(u)) for u in (a, b)], [40, 2], tr("Tokens generated by the two requests (max_tokens 40 and 2)"))
    assert_idle(llm)


# ----------------------------------------------------------------------------- 在后面章节下跑本章的代码（issue 24）


@pytest.mark.parametrize("page_size,chunk,overlap", [(1, 5, True)], ids=["chunk5-overlap"])
def test_later_chapters_run_this_chunked_prefill_and_match_hf(final_llms, tiny_path: str, page_size: int, chunk, overlap: bool) -> None:  # noqa: ANN001
    """重叠调度（第 2.5 章）在上一块还在算时就调度下一块：用它的参考解答跑本章的分块代码，与 Hugging Face 逐 token 比较。"""
    llm = final_llms(partial(Scheduler, parts=FINAL_PARTS), page_size)
    assert llm.prefill_adder_cls is ChunkedPrefillAdder and isinstance(llm.policy, ChunkInterleave), tr("Test setup: the final engine must hold this chapter's {name}", name="ChunkedPrefillAdder, ChunkInterleave")
    mode = tr("overlap scheduling on") if overlap else tr("overlap scheduling off")
    what = tr("Your chunked prefill under chapter 2.5 (page_size={page_size}, chunk size {chunk}, {mode})", page_size=page_size, chunk=chunk, mode=mode)
    run_under_later_chapters(llm, tiny_path, chunk=chunk, overlap=overlap, what=what)
