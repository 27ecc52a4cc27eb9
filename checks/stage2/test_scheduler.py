"""第 2.1 章 scheduler 的检查：主循环、预填充优先、准入控制、连续批处理、positions / out_loc、结束判断、
请求校验，以及在 SmolLM2 真实权重上与 Hugging Face 逐 token 一致（单独跑、成批跑都一样）。"""

from __future__ import annotations

import pytest
import torch

from .conftest import LATER_CHUNK, SMOLLM2_TOKENS, SMOL_KW, TINY_KW, assert_idle, expect, first_fresh_index, record, results, run_under_later_chapters
from minisgl.i18n import tr
from minisgl.core import SamplingParams
from minisgl.core import Req
from minisgl.overlap import PARTS as FINAL_PARTS
from minisgl.scheduler import PrefillAdder, PrefillManager, Scheduler, static_cache_manager
from minisgl.scheduling import PendingReq, SchedulerParts, TableManager

#: 本章的引擎：第 2.1 章的调度器，零件都是本章自己的。
LLM = Scheduler

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tiny_path: str):  # noqa: ANN201
    llm = LLM(tiny_path, **TINY_KW)
    yield llm
    llm.shutdown()


def test_generate_returns_one_result_per_prompt_in_order(tiny, qwen_tokenizer) -> None:  # noqa: ANN001
    prompts = ["Hello world", [9707, 1879, 0], "The capital of France is", "x"]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (3, 5, 1, 4)]
    out = tiny.generate(prompts, params)
    assert len(out) == 4, tr("One result per prompt")
    assert [len(o["token_ids"]) for o in out] == [3, 5, 1, 4], tr("With EOS ignored each request generates exactly max_tokens tokens, returned in input order")
    for o in out:
        assert set(o) >= {"text", "token_ids"}, tr("Each result is a dict with 'text' and 'token_ids', got keys {keys}", keys=sorted(o))
        assert o["text"] == qwen_tokenizer.decode(o["token_ids"]), tr("text is the decoded token_ids")
    assert_idle(tiny)


def test_exactly_max_tokens_and_extend_len_before_forward(tiny, qwen_tokenizer) -> None:  # noqa: ANN001
    prompts = ["a b c", "Hello there, how are you today?", "1 2 3 4 5 6 7 8 9", "Why?"]
    lens = [len(qwen_tokenizer.encode(p)) for p in prompts]
    max_tokens = [1, 2, 5, 9]
    rec = record(tiny)
    out = tiny.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens])
    assert [len(o["token_ids"]) for o in out] == max_tokens, tr("Each request gets exactly max_tokens tokens (no more, no fewer)")
    assert rec.prefill_tokens() == sum(lens), tr("extend_len read before _forward: prefill must compute exactly the whole prompt")
    for s in rec.steps:
        if s.phase == "decode":
            assert s.extend_lens == [1] * len(s.uids), tr("During decode each request computes only 1 token")
    computed = sum(s.tokens for s in rec.steps)
    assert computed == sum(lens) + sum(n - 1 for n in max_tokens), tr("The last token finishes the request once it is sampled and is not fed to the model")
    assert_idle(tiny)


def test_prefill_first_and_token_budget(tiny_path: str, make_llm, qwen_tokenizer) -> None:  # noqa: ANN001
    budget = 8
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "max_extend_tokens": budget})
    prompts = ["one two three four five", "six seven eight nine ten", "eleven twelve", "a much longer prompt " * 4]
    lens = [len(qwen_tokenizer.encode(p)) for p in prompts]
    assert lens[0] < budget < lens[0] + lens[1] and lens[3] > budget, tr("Test setup: prompt lengths {lens} do not fit the budget {budget} as intended", lens=lens, budget=budget)
    rec = record(llm)
    llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
    prefills = [s for s in rec.steps if s.phase == "prefill"]
    first_decode = next(i for i, s in enumerate(rec.steps) if s.phase == "decode")
    assert all(s.phase == "prefill" for s in rec.steps[:first_decode]) and first_decode == len(prefills), (
        tr("Prefill first: while requests are waiting, prefill them, and decode only once all are admitted; steps: {value}", value=[s.phase for s in rec.steps])
    )
    for s in prefills:
        assert sum(s.extend_lens[:-1]) < budget, tr("Once the budget {budget} is used up, no new requests are admitted (this step: {extend_lens})", budget=budget, extend_lens=s.extend_lens)
    assert [s.extend_lens for s in prefills] == [lens[:2], lens[2:]], (
        tr("Budget {budget}: step 1 fits the first two (the second uses up the budget), step 2 fits the last two; got {value}", budget=budget, value=[s.extend_lens for s in prefills])
    )
    assert_idle(llm)


def test_continuous_batching_finishes_and_refills_slots(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "max_running_req": 2})
    max_tokens = [2, 12, 3, 3, 10]
    rec = record(llm)
    out = llm.generate(["short", "long request", "third", "fourth", "fifth"], [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens])
    expect([len(o["token_ids"]) for o in out], max_tokens, tr("Tokens generated per request (= max_tokens, EOS ignored)"))
    assert all(len(s.uids) <= 2 for s in rec.steps), tr("No more than max_running_req=2 requests may run at once")
    last_step = {u: max(i for i, s in enumerate(rec.steps) if u in s.uids) for u in {u for s in rec.steps for u in s.uids}}
    first_step = {u: min(i for i, s in enumerate(rec.steps) if u in s.uids) for u in last_step}
    uids = sorted(last_step)
    long_uid, short_uid, third_uid = uids[1], uids[0], uids[2]
    assert last_step[short_uid] < last_step[long_uid], tr("Requests of different lengths finish at different steps")
    assert first_step[third_uid] < last_step[long_uid], tr("As soon as a short request finishes, a waiting request joins at the next step (without waiting for the whole batch)")
    assert first_step[third_uid] == last_step[short_uid] + 1, tr("A new request is admitted the step after a slot frees up")
    rows = {u: s.rows[s.uids.index(u)] for s in rec.steps for u in s.uids}
    assert rows[third_uid] == rows[short_uid], tr("The new request uses the slot returned by the request that just finished")
    assert_idle(llm)


def test_max_running_req_2_completes_8_requests(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "max_running_req": 2})
    rec = record(llm)
    out = llm.generate([f"request number {i}" for i in range(8)], SamplingParams(max_tokens=5, ignore_eos=True))
    assert [len(o["token_ids"]) for o in out] == [5] * 8, tr("Even with only 2 slots all 8 requests complete")
    expect(max(len(s.uids) for s in rec.steps), 2, tr("max_running_req=2: the largest batch of any step"))
    expect(len({u for s in rec.steps for u in s.uids}), 8, tr("Distinct requests that took part in some step"))
    assert_idle(llm)


def test_positions_input_mapping_and_out_loc(tiny, qwen_tokenizer) -> None:  # noqa: ANN001
    checked = []

    def check(trace) -> None:  # noqa: ANN001
        b = trace.batch
        want_pos = torch.cat([torch.arange(c, c + e) for c, e in zip(rec.steps[-1].cached_lens, rec.steps[-1].extend_lens)])
        assert b.positions.cpu().tolist() == want_pos.tolist(), tr("positions = each request's arange(cached_len, device_len), concatenated")
        rows = torch.repeat_interleave(torch.tensor(rec.steps[-1].rows), torch.tensor(rec.steps[-1].extend_lens))
        assert b.out_loc.cpu().tolist() == tiny.page_table[rows, want_pos].cpu().tolist(), tr("out_loc = page_table[row, position]")
        checked.append((b, trace))

    rec = record(tiny, after=check)
    prompts = ["Hello world, this is a test", "Another one", "x y z"]
    out = tiny.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
    assert checked, tr("No step was observed")
    full = [qwen_tokenizer.encode(p) + o["token_ids"] for p, o in zip(prompts, out)]
    by_uid = dict(zip(sorted({u for s in rec.steps for u in s.uids}), full))
    for b, s in checked:
        want = [tok for u, c, e in zip(s.uids, s.cached_lens, s.extend_lens) for tok in by_uid[u][c : c + e]]
        assert b.input_ids.cpu().tolist() == want, tr("Input tokens are read from the token pool by (row, position): the prompt for prefill, the previously sampled token for decode")
    assert_idle(tiny)


def test_static_pages_per_slot(tiny, qwen_tokenizer) -> None:  # noqa: ANN001
    cap = tiny.cache_manager.max_req_tokens
    assert cap == 2048 // 8, tr("2048 pages over 8 slots: 256 tokens per slot")
    rows = tiny.page_table[:8, :cap].cpu()
    assert len(torch.unique(rows)) == 8 * cap, tr("The slots given statically to each request slot do not overlap")
    assert tiny.max_seq_len == min(512, cap), tr("In this chapter a request holds at most one slot's worth of tokens")
    prompt = "word " * 300
    with pytest.raises(ValueError, match=str(cap)):
        tiny.generate(["ok", prompt], SamplingParams(max_tokens=2))
        pytest.fail(tr("A prompt over the per-request limit must be refused at once, stating the limit"))
    out = tiny.generate(["fits"], SamplingParams(max_tokens=3, ignore_eos=True))
    expect(len(out[0]["token_ids"]), 3, tr("Tokens generated (max_tokens=3)"))
    assert_idle(tiny)


def test_finishes_on_eos_unless_ignore_eos(tiny) -> None:  # noqa: ANN001
    prompt = ["The quick brown fox jumps over the lazy dog"]
    full = tiny.generate(prompt, SamplingParams(max_tokens=12, ignore_eos=True))[0]["token_ids"]
    k = first_fresh_index(full)
    saved = tiny.eos_token_id
    tiny.eos_token_id = full[k]
    res = results(tiny)
    try:
        stopped = tiny.generate(prompt, SamplingParams(max_tokens=12))[0]["token_ids"]
        ignored = tiny.generate(prompt, SamplingParams(max_tokens=12, ignore_eos=True))[0]["token_ids"]
    finally:
        tiny.eos_token_id = saved
    assert stopped == full[:k], tr("Finish on EOS; EOS itself is not in the result")
    assert ignored == full, tr("With ignore_eos=True generation continues past EOS")
    first, second = res.events.values()
    expect([(e.token, e.finished, e.reason) for e in first], [(t, False, None) for t in full[:k]] + [(None, True, "stop")],
           tr("Events of the request that meets EOS after {k} tokens (token, finished, reason)", k=k))
    assert (second[-1].token, second[-1].reason) == (full[-1], "length"), tr("With ignore_eos=True the last event keeps its token and ends with \"length\": {event}", event=second[-1])
    assert_idle(tiny)


def test_invalid_requests_refused_before_any_work(tiny, tiny_path: str) -> None:  # noqa: ANN001
    rec = record(tiny)
    too_long = [1] * tiny.max_seq_len
    # 只匹配两种语言的消息里都有的部分：出错的提示词序号 1、参数名、数值
    cases = [
        ((["ok", ""], GREEDY), r"\b1\b"),
        ((["ok", too_long], GREEDY), str(tiny.max_seq_len)),
        ((["a", "b"], [GREEDY]), r"(?=.*sampling_params)(?=.*prompts)"),
        ((["ok", "bad"], [GREEDY, SamplingParams(temperature=-1.0)]), r"(?=.*\b1\b)(?=.*temperature)"),
        ((["ok", [10**9]], GREEDY), r"(?=.*\b1\b)(?=.*1000000000)"),
    ]
    for args, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            tiny.generate(*args)
            pytest.fail(tr("The invalid request {args!r} must be refused", args=args))
    assert rec.steps == [], tr("With an invalid request, not a single token is computed")
    with pytest.raises(ValueError, match="cache_type"):
        LLM(tiny_path, **TINY_KW, cache_type="lru")
        pytest.fail(tr("An unknown cache_type must raise an error"))
    out = tiny.generate(["still works"], SamplingParams(max_tokens=2, ignore_eos=True))
    assert len(out[0]["token_ids"]) == 2, tr("The engine works normally after a refusal")
    assert_idle(tiny)


def test_max_tokens_has_one_rule(tiny) -> None:  # noqa: ANN001
    rec = record(tiny)
    prompt = [11] * (tiny.max_seq_len - 5)
    with pytest.raises(ValueError, match=str(tiny.max_seq_len)) as info:
        tiny.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True))
        pytest.fail(tr("max_tokens past the length limit must be an error (prompt + max_tokens > max_seq_len), not clipped"))
    assert getattr(info.value, "code", None) == "context_length_exceeded", tr(
        "The error of a request that does not fit carries code 'context_length_exceeded', got {code!r}",
        code=getattr(info.value, "code", None))
    assert rec.steps == [], tr("With an invalid request, not a single token is computed")
    out = tiny.generate([prompt, prompt], [SamplingParams(max_tokens=5, ignore_eos=True), SamplingParams(ignore_eos=True)])
    assert [len(o["token_ids"]) for o in out] == [5, 5], tr(
        "max_tokens that fits exactly, and an absent max_tokens (until the context is full), both give prompt + output = max_seq_len: got {got}",
        got=[len(o["token_ids"]) for o in out])
    assert_idle(tiny)


@pytest.mark.parametrize("page_size", [1, 4])
def test_batch_invariance_smollm2(smollm2_path, smollm2_prompts, smollm2_reference, make_llm, page_size: int) -> None:  # noqa: ANN001
    """每个请求的贪心输出与 HF 一致：成批跑、换个顺序、一个一个单独跑都一样。"""
    sp = SamplingParams(max_tokens=SMOLLM2_TOKENS, ignore_eos=True)
    llm = make_llm(LLM, smollm2_path, **{**SMOL_KW, "page_size": page_size})
    batched = [o["token_ids"] for o in llm.generate(smollm2_prompts, sp)]
    for i, (ours, ref) in enumerate(zip(batched, smollm2_reference)):
        assert ours == ref, tr("Batched: request {i} differs from Hugging Face\nours: {ours}\nHF:   {ref}", i=i, ours=ours, ref=ref)
    reversed_out = [o["token_ids"] for o in llm.generate(smollm2_prompts[::-1], sp)][::-1]
    assert reversed_out == smollm2_reference, tr("Running the batch in another order gives the same results")
    assert_idle(llm)
    alone = make_llm(LLM, smollm2_path, **{**SMOL_KW, "page_size": page_size, "max_running_req": 1})
    singles = [o["token_ids"] for o in alone.generate(smollm2_prompts, SamplingParams(max_tokens=12, ignore_eos=True))]
    assert singles == [r[:12] for r in smollm2_reference], tr("max_running_req=1 (each request alone) also matches HF")
    assert_idle(alone)


def test_sampling_seeded_and_per_request(smollm2_path, smollm2_prompts, smollm2_reference, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, smollm2_path, **SMOL_KW)
    p = smollm2_prompts[0]
    seeded = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, max_tokens=12, ignore_eos=True, seed=1234)
    other = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=99)
    greedy = SamplingParams(max_tokens=SMOLLM2_TOKENS, ignore_eos=True)
    out1 = [o["token_ids"] for o in llm.generate([p, p, p, smollm2_prompts[1]], [seeded, seeded, other, greedy])]
    assert out1[0] == out1[1], tr("Same seed, same prompt, same batch: same result")
    assert out1[0] != out1[2], tr("Different seeds give different samples")
    assert out1[3] == smollm2_reference[1], tr("Each request uses its own sampling parameters: a greedy request among sampled ones still matches HF")
    out2 = llm.generate([smollm2_prompts[2], p], [greedy, seeded])
    assert out2[1]["token_ids"] == out1[0], tr("A seeded request reproduces its result in another batch, at another position")
    assert_idle(llm)


# ----------------------------------------------------------------------------- 学员走查补的检查（issue 16）


def test_eos_finished_request_leaves_the_running_batch(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    """只有 1 个请求槽：请求 A 在第 k 个输出处遇到 EOS。它要立刻离开运行队列，请求 B 下一步接过这一行。

    A 若还留在 ``decode_manager`` 里，就会拿着已经还掉的那一行继续解码，往 B 的 token 池里写东西。
    """
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "max_running_req": 1})
    prompt_a, prompt_b = "The quick brown fox jumps over the lazy dog", "Count with me: one two"
    full_a = llm.generate([prompt_a], SamplingParams(max_tokens=12, ignore_eos=True))[0]["token_ids"]
    k = first_fresh_index(full_a)
    saved = llm.eos_token_id
    llm.eos_token_id = full_a[k]
    try:
        alone_b = llm.generate([prompt_b], SamplingParams(max_tokens=6))[0]["token_ids"]
        rec = record(llm)
        out = llm.generate([prompt_a, prompt_b], [SamplingParams(max_tokens=12), SamplingParams(max_tokens=6)])
    finally:
        llm.eos_token_id = saved
    uid_a = rec.steps[0].uids[0]
    steps_a = [i for i, s in enumerate(rec.steps) if uid_a in s.uids]
    assert steps_a == list(range(k + 1)), (
        tr("A samples EOS at step {k} (prefill is step 0) and must not appear in any later step; A appeared in steps {steps_a} (remove it from decode_manager when it finishes on EOS)", k=k, steps_a=steps_a)
    )
    assert out[0]["token_ids"] == full_a[:k], tr("A must output the {k} tokens before EOS: {full_a_item}, got {value}", k=k, full_a_item=full_a[:k], value=out[0]['token_ids'])
    assert out[1]["token_ids"] == alone_b, tr("After B takes over the row A returned, its result must equal running alone: {alone_b}, got {value}", alone_b=alone_b, value=out[1]['token_ids'])
    assert_idle(llm)


def test_input_ids_grow_with_each_sampled_token(tiny) -> None:  # noqa: ANN001
    """结果处理之后，每个请求的 ``input_ids`` = 提示词 + 已采样的 token，长度等于 ``device_len``。

    本章的静态分配用不到它，但第 2.3 章把 ``input_ids[:cached_len]`` 当作前缀插进 radix 缓存。
    """
    prompts = ["alpha beta", "one two three four five six"]
    bad: list[str] = []

    def check(trace) -> None:  # noqa: ANN001
        for req in trace.reqs:
            n, out = len(req.input_ids), res.tokens(req.uid)
            if n != req.device_len or req.input_ids[n - len(out) :].tolist() != out:
                bad.append(tr("step {index} request {uid}: len(input_ids)={n}, device_len={device_len}, {n_out} output so far", index=trace.index, uid=req.uid, n=n, device_len=req.device_len, n_out=len(out)))

    res = results(tiny)
    rec = record(tiny, after=check)
    try:
        tiny.generate(prompts, SamplingParams(max_tokens=5, ignore_eos=True))
    finally:
        rec.close()
    assert not bad, (
        tr("After result processing, input_ids must equal the prompt + the sampled tokens (req.append_host for every token):\n") + "\n".join(bad[:6])
    )


class _StubAdder:
    """按名单接纳：``refuse`` 里的 uid 接纳不了，其余都接纳（整段提示词，不分块）。"""

    def __init__(self, refuse: set[int]) -> None:
        self.refuse, self.tried = refuse, []

    def try_add_one(self, pending: PendingReq) -> Req | None:
        self.tried.append(pending.uid)
        if pending.uid in self.refuse:
            return None
        return Req(pending.input_ids, pending.uid, 0, pending.output_len, pending.uid, pending.sampling_params)


def test_prefill_stops_at_first_request_not_admitted() -> None:
    """先来先服务：队列 [0, 1, 2]，请求 1 接纳不了（第 2.2 章：页面不够）——请求 2 再小也不能插队。

    本章的准入只看请求槽和预算，接纳不了时后面的也都接纳不了，所以只有用一个按名单接纳的准入员才看得出来。
    """
    pm = PrefillManager()
    pendings = [PendingReq(i, torch.arange(1, 4 + i, dtype=torch.int32), SamplingParams(max_tokens=3)) for i in range(3)]
    for p in pendings:
        pm.add_one_req(p)
    adder = _StubAdder(refuse={1})
    batch = pm.schedule_next_batch(adder)
    got = [r.uid for r in batch.reqs] if batch is not None else None
    assert got == [0], tr("Request 1 cannot be admitted, so stop there: this step should have only [0], got {got} (the adder tried {tried} in turn)", got=got, tried=adder.tried)
    left = [p.uid for p in pm.pending_list]
    assert left == [1, 2], tr("Admitted requests leave the queue and the rest stay in their original order: expected [1, 2], got {left}", left=left)
    assert pm.schedule_next_batch(_StubAdder(refuse={1})) is None, tr("When the head of the queue cannot be admitted, admit none and return None")


def test_add_one_req_takes_exactly_the_segment() -> None:
    """``_add_one_req`` 接纳提示词的 ``[cached_len, end)``：token 池里只写这一段、预算只扣这一段、请求的
    ``input_ids`` 只到 ``end``。本章总是整段接纳，第 2.4 章分块时就靠 ``end`` 切出一块。"""
    pool = torch.full((2, 12), -1, dtype=torch.int32)
    adder = PrefillAdder(token_budget=100, reserved_size=0, table_manager=TableManager(2), cache_manager=None, token_pool=pool)
    pending = PendingReq(7, torch.arange(10, 20, dtype=torch.int32), SamplingParams(max_tokens=3))
    req = adder._add_one_req(pending, None, 1, 2, end=6)
    assert pool[1].tolist() == [-1, -1, 12, 13, 14, 15] + [-1] * 6, tr("Write only the segment [2, 6): {value}", value=pool[1].tolist())
    assert pool[0].tolist() == [-1] * 12, tr("Other rows must not change")
    assert adder.token_budget == 96, tr("Only this segment's 4 tokens are charged to the budget, {token_budget} left", token_budget=adder.token_budget)
    expect(req.input_ids.tolist(), list(range(10, 16)), tr("The new Req's input_ids: the prompt up to end"))
    expect((req.cached_len, req.table_idx, req.uid), (2, 1, 7), tr("The new Req's (cached_len, table_idx, uid)"))
    whole = adder._add_one_req(pending, None, 0, 0)
    assert pool[0, :10].tolist() == list(range(10, 20)) and pool[0, 10:].tolist() == [-1, -1], tr("end defaults to the whole prompt")
    expect(adder.token_budget, 86, tr("Budget left after admitting the whole 10-token prompt"))
    expect(len(whole.input_ids), 10, tr("Without end the Req gets the whole prompt"))


def test_prefilled_requests_handed_to_cache_manager(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    """预填充完、还没结束的请求要交给 cache_manager.cache_req(finished=False)（第 2.3 章靠它把提示词插进前缀树）；
    结束的请求只在归还时 cache_req(finished=True) 一次。静态分配的 cache_req 什么也不做，所以这里直接数调用。"""

    def recording(engine, config, table_manager):  # noqa: ANN001, ANN202
        cm = static_cache_manager(engine, config, table_manager)
        cm.calls = calls = []
        inner = cm.cache_req

        def cache_req(req, *, finished: bool) -> None:  # noqa: ANN001
            calls.append((req.uid, finished))
            inner(req, finished=finished)

        cm.cache_req = cache_req
        return cm

    llm = make_llm(LLM, tiny_path, parts=SchedulerParts(cache_manager=recording), **TINY_KW)
    uids = [llm.add_request([5, 6, 7, i + 1], SamplingParams(max_tokens=n, ignore_eos=True)) for i, n in enumerate([3, 1, 4])]
    llm.run_until_idle()
    for uid, n in zip(uids, [3, 1, 4]):
        got = [f for u, f in llm.cache_manager.calls if u == uid]
        want = [True] if n == 1 else [False, True]
        assert got == want, (
            tr("Request with max_tokens={n}: the finished arguments of cache_req must be {want} in turn, got {got} (after prefill an unfinished request goes to cache_req(finished=False); on finishing, finished=True)", n=n, want=want, got=got)
        )


def test_finish_events_and_abort_after_finish_is_a_no_op(tiny) -> None:  # noqa: ANN001
    res = results(tiny)
    uid = tiny.add_request([5, 6, 7, 8], SamplingParams(max_tokens=2, ignore_eos=True))
    tiny.run_until_idle()
    events = res.events[uid]
    expect([(e.finished, e.reason) for e in events], [(False, None), (True, "length")],
           tr("Events of a request with max_tokens=2: one token kept, then one that finishes it (finished, reason)"))
    assert all(e.token is not None for e in events), tr("Both steps keep their token: {events}", events=events)
    assert tiny.status == {}, tr("A finished request leaves scheduler.status once its resources are back: left {uids}", uids=sorted(tiny.status))
    tiny.abort(uid)
    expect(len(res.events[uid]), 2, tr("Aborting a finished request does nothing (no new event)"))
    assert_idle(tiny)



def test_step_when_idle_returns_false(tiny) -> None:  # noqa: ANN001
    """没有请求时 step() 什么也不做、返回 False（调度不出批次就不前向）。"""
    expect(tiny.busy, False, tr("Test setup: the scheduler is idle"))
    assert tiny.step() is False, tr("step() must return False when idle")
    res = results(tiny)
    uid = tiny.add_request([5, 6, 7], SamplingParams(max_tokens=1, ignore_eos=True))
    assert tiny.step() is True, tr("With requests, step() does one step and returns True")
    tiny.run_until_idle()
    expect(len(res.tokens(uid)), 1, tr("Tokens generated (max_tokens=1)"))
    assert_idle(tiny)


# ----------------------------------------------------------------------------- 在第 2.4、2.5 章下跑本章的代码（issue 24）


@pytest.fixture(scope="module")
def final_llm(tiny_path: str):  # noqa: ANN201
    """本章的调度器握着第 2.2 到 2.5 章参考解答的零件：本章的准入、队列、prepare_batch、结果处理都是学员写的那份。"""
    llm = Scheduler(tiny_path, parts=FINAL_PARTS, **TINY_KW)
    yield llm
    llm.shutdown()


@pytest.mark.parametrize("overlap", [False, True], ids=["chunked", "chunked+overlap"])
def test_later_chapters_run_this_scheduler_and_match_hf(final_llm, tiny_path: str, overlap: bool) -> None:  # noqa: ANN001
    """分块预填充（第 2.4 章）和重叠调度（第 2.5 章）会走到本章里单独跑时用不到的路径：没算完提示词的请求留在队首、
    中途分块的采样写到 scratch_row。这里用它们的参考解答跑本章的代码，与 Hugging Face 逐 token 比较。"""
    mode = tr("overlap scheduling on") if overlap else tr("overlap scheduling off")
    what = tr("Your scheduler under chapters 2.4 and 2.5 (chunk size {chunk}, {mode})", chunk=LATER_CHUNK, mode=mode)
    run_under_later_chapters(final_llm, tiny_path, chunk=LATER_CHUNK, overlap=overlap, what=what)
