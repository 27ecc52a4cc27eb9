"""第 2.1 章 scheduler 的检查：主循环、预填充优先、准入控制、连续批处理、positions / out_loc、结束判断、
请求校验，以及在 SmolLM2 真实权重上与 Hugging Face 逐 token 一致（单独跑、成批跑都一样）。"""

from __future__ import annotations

import pytest
import torch

from .conftest import SMOL_KW, SMOLLM2_TOKENS, TINY_KW, assert_idle, first_fresh_index, record
from minisgl.core import SamplingParams
from minisgl.core import Req
from minisgl.scheduler import LLM, PrefillAdder, PrefillManager
from minisgl.scheduling import PendingReq, TableManager

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
    assert len(out) == 4, "每个提示词返回一个结果"
    assert [len(o["token_ids"]) for o in out] == [3, 5, 1, 4], "忽略 EOS 时每个请求恰好生成 max_tokens 个 token，按输入顺序返回"
    for o in out:
        assert set(o) >= {"text", "token_ids"}
        assert o["text"] == qwen_tokenizer.decode(o["token_ids"]), "text 是 token_ids 解码出来的文字"
    assert_idle(tiny)


def test_exactly_max_tokens_and_extend_len_before_forward(tiny, qwen_tokenizer) -> None:  # noqa: ANN001
    prompts = ["a b c", "Hello there, how are you today?", "1 2 3 4 5 6 7 8 9", "Why?"]
    lens = [len(qwen_tokenizer.encode(p)) for p in prompts]
    max_tokens = [1, 2, 5, 9]
    rec = record(tiny)
    out = tiny.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens])
    assert [len(o["token_ids"]) for o in out] == max_tokens, "每个请求恰好 max_tokens 个 token（不多不少）"
    assert rec.prefill_tokens() == sum(lens), "在 _forward 之前读到的 extend_len：预填充要算的正是整段提示词"
    for s in rec.steps:
        if s.phase == "decode":
            assert s.extend_lens == [1] * len(s.uids), "解码时每个请求只算 1 个 token"
    computed = sum(s.tokens for s in rec.steps)
    assert computed == sum(lens) + sum(n - 1 for n in max_tokens), "最后一个 token 采样出来就结束，不再送进模型"
    assert_idle(tiny)


def test_prefill_first_and_token_budget(tiny_path: str, make_llm, qwen_tokenizer) -> None:  # noqa: ANN001
    budget = 8
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "max_extend_tokens": budget})
    prompts = ["one two three four five", "six seven eight nine ten", "eleven twelve", "a much longer prompt " * 4]
    lens = [len(qwen_tokenizer.encode(p)) for p in prompts]
    assert lens[0] < budget < lens[0] + lens[1] and lens[3] > budget
    rec = record(llm)
    llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
    prefills = [s for s in rec.steps if s.phase == "prefill"]
    first_decode = next(i for i, s in enumerate(rec.steps) if s.phase == "decode")
    assert all(s.phase == "prefill" for s in rec.steps[:first_decode]) and first_decode == len(prefills), (
        f"预填充优先：有等待的请求就先预填充，全部接纳后才解码；实际各步：{[s.phase for s in rec.steps]}"
    )
    for s in prefills:
        assert sum(s.extend_lens[:-1]) < budget, f"预算 {budget} 用完就不再接纳新请求（这一步：{s.extend_lens}）"
    assert [s.extend_lens for s in prefills] == [lens[:2], lens[2:]], (
        f"预算 {budget}：第一步装下前两个（第二个用完预算），第二步装下后两个；实际：{[s.extend_lens for s in prefills]}"
    )
    assert_idle(llm)


def test_continuous_batching_finishes_and_refills_slots(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "max_running_req": 2})
    max_tokens = [2, 12, 3, 3, 10]
    rec = record(llm)
    out = llm.generate(["short", "long request", "third", "fourth", "fifth"], [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens])
    assert [len(o["token_ids"]) for o in out] == max_tokens
    assert all(len(s.uids) <= 2 for s in rec.steps), "同时运行的请求不能超过 max_running_req=2"
    last_step = {u: max(i for i, s in enumerate(rec.steps) if u in s.uids) for u in {u for s in rec.steps for u in s.uids}}
    first_step = {u: min(i for i, s in enumerate(rec.steps) if u in s.uids) for u in last_step}
    uids = sorted(last_step)
    long_uid, short_uid, third_uid = uids[1], uids[0], uids[2]
    assert last_step[short_uid] < last_step[long_uid], "长短不一的请求在不同的步结束"
    assert first_step[third_uid] < last_step[long_uid], "短请求一结束，等待的请求下一步就加入（不等整批结束）"
    assert first_step[third_uid] == last_step[short_uid] + 1, "槽位空出来的下一步就接纳新请求"
    rows = {u: s.rows[s.uids.index(u)] for s in rec.steps for u in s.uids}
    assert rows[third_uid] == rows[short_uid], "新请求用的是刚结束的请求归还的那个槽位"
    assert_idle(llm)


def test_max_running_req_2_completes_8_requests(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "max_running_req": 2})
    rec = record(llm)
    out = llm.generate([f"request number {i}" for i in range(8)], SamplingParams(max_tokens=5, ignore_eos=True))
    assert [len(o["token_ids"]) for o in out] == [5] * 8, "只有 2 个槽位也能把 8 个请求全部跑完"
    assert max(len(s.uids) for s in rec.steps) == 2
    assert len({u for s in rec.steps for u in s.uids}) == 8
    assert_idle(llm)


def test_positions_input_mapping_and_out_loc(tiny, qwen_tokenizer) -> None:  # noqa: ANN001
    checked = []

    def check(trace) -> None:  # noqa: ANN001
        b = trace.batch
        want_pos = torch.cat([torch.arange(c, c + e) for c, e in zip(rec.steps[-1].cached_lens, rec.steps[-1].extend_lens)])
        assert b.positions.cpu().tolist() == want_pos.tolist(), "positions = 各请求 arange(cached_len, device_len) 拼起来"
        rows = torch.repeat_interleave(torch.tensor(rec.steps[-1].rows), torch.tensor(rec.steps[-1].extend_lens))
        assert b.out_loc.cpu().tolist() == tiny.page_table[rows, want_pos].cpu().tolist(), "out_loc = 页表[行, 位置]"
        checked.append((b, trace))

    rec = record(tiny, after=check)
    prompts = ["Hello world, this is a test", "Another one", "x y z"]
    out = tiny.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
    assert checked, "没有观察到任何一步"
    full = [qwen_tokenizer.encode(p) + o["token_ids"] for p, o in zip(prompts, out)]
    by_uid = dict(zip(sorted({u for s in rec.steps for u in s.uids}), full))
    for b, s in checked:
        want = [tok for u, c, e in zip(s.uids, s.cached_lens, s.extend_lens) for tok in by_uid[u][c : c + e]]
        assert b.input_ids.cpu().tolist() == want, "输入 token 从 token 池按（行，位置）取出：预填充是提示词，解码是上一步采样的 token"
    assert_idle(tiny)


def test_static_pages_per_slot(tiny, qwen_tokenizer) -> None:  # noqa: ANN001
    cap = tiny.cache_manager.max_req_tokens
    assert cap == 2048 // 8, "2048 页分给 8 个槽位，每个槽位 256 个 token"
    rows = tiny.page_table[:8, :cap].cpu()
    assert len(torch.unique(rows)) == 8 * cap, "每个槽位静态分到的槽位互不重叠"
    assert tiny.max_seq_len == min(512, cap), "本章一个请求最多放下一个槽位的 token"
    prompt = "word " * 300
    with pytest.raises(ValueError, match=str(cap)):
        tiny.generate(["ok", prompt], SamplingParams(max_tokens=2))
        pytest.fail("提示词超过单个请求的上限时要立刻报错，并说出上限")
    out = tiny.generate(["fits"], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(out[0]["token_ids"]) == 3
    assert_idle(tiny)


def test_finishes_on_eos_unless_ignore_eos(tiny) -> None:  # noqa: ANN001
    prompt = ["The quick brown fox jumps over the lazy dog"]
    full = tiny.generate(prompt, SamplingParams(max_tokens=12, ignore_eos=True))[0]["token_ids"]
    k = first_fresh_index(full)
    saved = tiny.eos_token_id
    tiny.eos_token_id = full[k]
    try:
        stopped = tiny.generate(prompt, SamplingParams(max_tokens=12))[0]["token_ids"]
        ignored = tiny.generate(prompt, SamplingParams(max_tokens=12, ignore_eos=True))[0]["token_ids"]
    finally:
        tiny.eos_token_id = saved
    assert stopped == full[:k], "遇到 EOS 就结束，EOS 本身不进结果"
    assert ignored == full, "ignore_eos=True 时遇到 EOS 也继续生成"
    assert_idle(tiny)


def test_invalid_requests_refused_before_any_work(tiny, tiny_path: str) -> None:  # noqa: ANN001
    rec = record(tiny)
    too_long = [1] * tiny.max_seq_len
    cases = [
        ((["ok", ""], GREEDY), "第 1 个"),
        ((["ok", too_long], GREEDY), str(tiny.max_seq_len)),
        ((["a", "b"], [GREEDY]), "个数"),
        ((["ok", "bad"], [GREEDY, SamplingParams(temperature=-1.0)]), "第 1 个"),
        ((["ok", [10**9]], GREEDY), "第 1 个"),
    ]
    for args, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            tiny.generate(*args)
            pytest.fail(f"非法请求 {args!r} 应当被拒绝")
    assert rec.steps == [], "有非法请求时一个 token 也不算"
    with pytest.raises(ValueError, match="cache_type"):
        LLM(tiny_path, **TINY_KW, cache_type="lru")
        pytest.fail("未知的 cache_type 应当报错")
    out = tiny.generate(["still works"], SamplingParams(max_tokens=2, ignore_eos=True))
    assert len(out[0]["token_ids"]) == 2, "被拒绝之后引擎照常工作"
    assert_idle(tiny)


def test_max_tokens_clipped_with_warning(tiny) -> None:  # noqa: ANN001
    prompt = [11] * (tiny.max_seq_len - 5)
    with pytest.warns(UserWarning, match="max_tokens"):
        out = tiny.generate([prompt], SamplingParams(max_tokens=100, ignore_eos=True))
    assert len(out[0]["token_ids"]) == 5, "max_tokens 截到长度上限：提示词 + 输出 = max_seq_len"
    assert_idle(tiny)


@pytest.mark.parametrize("page_size", [1, 4])
def test_batch_invariance_smollm2(smollm2_path, smollm2_prompts, smollm2_reference, make_llm, page_size: int) -> None:  # noqa: ANN001
    """每个请求的贪心输出与 HF 一致：成批跑、换个顺序、一个一个单独跑都一样。"""
    sp = SamplingParams(max_tokens=SMOLLM2_TOKENS, ignore_eos=True)
    llm = make_llm(LLM, smollm2_path, **{**SMOL_KW, "page_size": page_size})
    batched = [o["token_ids"] for o in llm.generate(smollm2_prompts, sp)]
    for i, (ours, ref) in enumerate(zip(batched, smollm2_reference)):
        assert ours == ref, f"成批：第 {i} 个请求与 Hugging Face 不一致\n我们：{ours}\nHF：  {ref}"
    reversed_out = [o["token_ids"] for o in llm.generate(smollm2_prompts[::-1], sp)][::-1]
    assert reversed_out == smollm2_reference, "换个顺序成批跑，结果不变"
    assert_idle(llm)
    alone = make_llm(LLM, smollm2_path, **{**SMOL_KW, "page_size": page_size, "max_running_req": 1})
    singles = [o["token_ids"] for o in alone.generate(smollm2_prompts, SamplingParams(max_tokens=12, ignore_eos=True))]
    assert singles == [r[:12] for r in smollm2_reference], "max_running_req=1（每个请求单独跑）也与 HF 一致"
    assert_idle(alone)


def test_sampling_seeded_and_per_request(smollm2_path, smollm2_prompts, smollm2_reference, make_llm) -> None:  # noqa: ANN001
    llm = make_llm(LLM, smollm2_path, **SMOL_KW)
    p = smollm2_prompts[0]
    seeded = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, max_tokens=12, ignore_eos=True, seed=1234)
    other = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=99)
    greedy = SamplingParams(max_tokens=SMOLLM2_TOKENS, ignore_eos=True)
    out1 = [o["token_ids"] for o in llm.generate([p, p, p, smollm2_prompts[1]], [seeded, seeded, other, greedy])]
    assert out1[0] == out1[1], "同样的种子、同样的提示词，同一批里结果相同"
    assert out1[0] != out1[2], "不同的种子给出不同的采样结果"
    assert out1[3] == smollm2_reference[1], "每个请求用自己的采样参数：混在采样请求里的贪心请求仍与 HF 一致"
    out2 = llm.generate([smollm2_prompts[2], p], [greedy, seeded])
    assert out2[1]["token_ids"] == out1[0], "带种子的请求换一批、换个位置，结果可以复现"
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
        f"A 在第 {k} 步采样出 EOS（预填充是第 0 步），之后不该再出现在任何一步里；实际 A 出现在第 {steps_a} 步"
        "（遇到 EOS 结束时要把它从 decode_manager 里移除）"
    )
    assert out[0]["token_ids"] == full_a[:k], f"A 应输出 EOS 之前的 {k} 个 token：{full_a[:k]}，实际 {out[0]['token_ids']}"
    assert out[1]["token_ids"] == alone_b, f"B 接过 A 还回来的那一行后，结果要和单独跑一样：{alone_b}，实际 {out[1]['token_ids']}"
    assert_idle(llm)


def test_input_ids_grow_with_each_sampled_token(tiny) -> None:  # noqa: ANN001
    """结果处理之后，每个请求的 ``input_ids`` = 提示词 + 已采样的 token，长度等于 ``device_len``。

    本章的静态分配用不到它，但第 2.3 章把 ``input_ids[:cached_len]`` 当作前缀插进 radix 缓存。
    """
    prompts = ["alpha beta", "one two three four five six"]
    bad: list[str] = []

    def check(trace) -> None:  # noqa: ANN001
        for req in trace.reqs:
            n, out = len(req.input_ids), tiny.status[req.uid].output_ids
            if n != req.device_len or req.input_ids[n - len(out) :].tolist() != out:
                bad.append(f"第 {trace.index} 步 请求 {req.uid}：len(input_ids)={n}，device_len={req.device_len}，已输出 {len(out)} 个")

    rec = record(tiny, after=check)
    try:
        tiny.generate(prompts, SamplingParams(max_tokens=5, ignore_eos=True))
    finally:
        rec.close()
    assert not bad, (
        "结果处理之后，input_ids 要等于提示词 + 已采样的 token（每个 token 都要 req.append_host）：\n" + "\n".join(bad[:6])
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
    assert got == [0], f"请求 1 接纳不了就该停下：这一步只应有 [0]，实际 {got}（准入员依次试了 {adder.tried}）"
    left = [p.uid for p in pm.pending_list]
    assert left == [1, 2], f"接纳了的离开队列、其余按原顺序留下：应为 [1, 2]，实际 {left}"
    assert pm.schedule_next_batch(_StubAdder(refuse={1})) is None, "队首接纳不了时一个也不接纳，返回 None"


def test_add_one_req_takes_exactly_the_segment() -> None:
    """``_add_one_req`` 接纳提示词的 ``[cached_len, end)``：token 池里只写这一段、预算只扣这一段、请求的
    ``input_ids`` 只到 ``end``。本章总是整段接纳，第 2.4 章分块时就靠 ``end`` 切出一块。"""
    pool = torch.full((2, 12), -1, dtype=torch.int32)
    adder = PrefillAdder(token_budget=100, reserved_size=0, table_manager=TableManager(2), cache_manager=None, token_pool=pool)
    pending = PendingReq(7, torch.arange(10, 20, dtype=torch.int32), SamplingParams(max_tokens=3))
    req = adder._add_one_req(pending, None, 1, 2, end=6)
    assert pool[1].tolist() == [-1, -1, 12, 13, 14, 15] + [-1] * 6, f"只写 [2, 6) 这一段：{pool[1].tolist()}"
    assert pool[0].tolist() == [-1] * 12, "别的行不能动"
    assert adder.token_budget == 96, f"预算只扣这一段的 4 个 token，剩 {adder.token_budget}"
    assert req.input_ids.tolist() == list(range(10, 16)) and req.cached_len == 2 and req.table_idx == 1 and req.uid == 7
    whole = adder._add_one_req(pending, None, 0, 0)
    assert pool[0, :10].tolist() == list(range(10, 20)) and pool[0, 10:].tolist() == [-1, -1], "end 缺省就是整段"
    assert adder.token_budget == 86 and len(whole.input_ids) == 10


def test_prefilled_requests_handed_to_cache_manager(tiny_path: str, make_llm) -> None:  # noqa: ANN001
    """预填充完、还没结束的请求要交给 cache_manager.cache_req(finished=False)（第 2.3 章靠它把提示词插进前缀树）；
    结束的请求只在归还时 cache_req(finished=True) 一次。静态分配的 cache_req 什么也不做，所以这里直接数调用。"""

    class Recording(LLM):
        def _make_cache_manager(self):  # noqa: ANN202
            cm = super()._make_cache_manager()
            self.cache_calls = calls = []
            inner = cm.cache_req

            def cache_req(req, *, finished: bool) -> None:  # noqa: ANN001
                calls.append((req.uid, finished))
                inner(req, finished=finished)

            cm.cache_req = cache_req
            return cm

    llm = make_llm(Recording, tiny_path, **TINY_KW)
    uids = [llm.add_request([5, 6, 7, i + 1], SamplingParams(max_tokens=n, ignore_eos=True)) for i, n in enumerate([3, 1, 4])]
    llm.run_until_idle()
    for uid, n in zip(uids, [3, 1, 4]):
        got = [f for u, f in llm.cache_calls if u == uid]
        want = [True] if n == 1 else [False, True]
        assert got == want, (
            f"max_tokens={n} 的请求：cache_req 的 finished 参数依次应为 {want}，实际 {got}"
            "（预填充后没结束的交给 cache_req(finished=False)，结束时 finished=True）"
        )


def test_status_finished_and_abort_after_finish_is_a_no_op(tiny) -> None:  # noqa: ANN001
    uid = tiny.add_request([5, 6, 7, 8], SamplingParams(max_tokens=2, ignore_eos=True))
    tiny.run_until_idle()
    status = tiny.status[uid]
    assert status.finished and not status.aborted, f"生成够 max_tokens 后应标记 finished：{status}"
    tiny.abort(uid)
    assert status.finished and not status.aborted, f"已经结束的请求再 abort 什么也不做：{status}"
    assert len(tiny.status.pop(uid).output_ids) == 2
    assert_idle(tiny)


def test_step_when_idle_returns_false(tiny) -> None:  # noqa: ANN001
    """没有请求时 step() 什么也不做、返回 False（调度不出批次就不前向）。"""
    assert not tiny.busy
    assert tiny.step() is False, "空闲时 step() 应返回 False"
    uid = tiny.add_request([5, 6, 7], SamplingParams(max_tokens=1, ignore_eos=True))
    assert tiny.step() is True, "有请求时 step() 做一步、返回 True"
    tiny.run_until_idle()
    assert len(tiny.status.pop(uid).output_ids) == 1
    assert_idle(tiny)
