"""第 2.5 章 overlap 的检查：第 N 步的结果在第 N+1 步发出之后才处理；CPU 上前向在后台线程、进程里只有一个 OpenMP 线程池；结束标志不提前；
EOS 之后多算的 token 丢掉；槽位在用到它的批次算完之前不复用；预填充在途时取消；前缀插入晚一个迭代；
开关（也能用环境变量）；以及完整的组合——缓存种类 × 块大小 × 重叠开 / 关 × page_size——都与 HF 逐 token 一致。"""

from __future__ import annotations

from functools import partial
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from .conftest import SMOLLM2_TOKENS, SMOL_KW, TINY_KW, assert_idle, expect, first_fresh_index, record, results
from minisgl.i18n import tr
from minisgl.core import SamplingParams
from minisgl.course import select
from minisgl.env import ENV
from minisgl.paths import REPO_ROOT
from minisgl.overlap import PARTS
from minisgl.scheduler import Scheduler

#: 本章的引擎：第 2.1 章的调度器握着到本章为止的零件。
LLM = partial(Scheduler, parts=PARTS)



@pytest.fixture
def overlap_on():  # noqa: ANN201
    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = False
    yield
    ENV.DISABLE_OVERLAP_SCHEDULING.value = saved


@pytest.fixture(scope="module")
def tiny(tiny_path: str):  # noqa: ANN201
    llm = LLM(tiny_path, **TINY_KW)
    yield llm
    llm.shutdown()


def launched_before_processed(steps) -> list[bool]:  # noqa: ANN001
    """对每对相邻的步 (N, N+1)：第 N+1 步是否在第 N 步的结果处理之前就发出了（准备完即发出）。"""
    return [nxt.prepare[1] < cur.process[0] for cur, nxt in zip(steps, steps[1:])]


def test_next_step_launched_before_last_results_processed(tiny, overlap_on) -> None:  # noqa: ANN001
    rec = record(tiny)
    try:
        out = tiny.generate(["a b c", "hello"], SamplingParams(max_tokens=4, ignore_eos=True))
        expect([len(o["token_ids"]) for o in out], [4, 4], tr("Tokens generated per request (max_tokens=4, EOS ignored)"))
        assert len(rec.steps) == 4 and all(launched_before_processed(rec.steps)), (
            tr("Overlap scheduling: the results of step N are processed only after step N+1 is launched; adjacent pairs: {value}", value=launched_before_processed(rec.steps))
        )
        threads = {s.forward_thread for s in rec.steps}
        if tiny.device.type == "cpu":  # 在 CUDA 上，前向由主线程排进引擎自己的流，不用后台线程
            assert threading.main_thread().name not in threads, tr("On CPU the forward pass runs in a background thread; it ran in {threads}", threads=threads)
        rec.reset()
        ENV.DISABLE_OVERLAP_SCHEDULING.value = True
        tiny.generate(["a b c"], SamplingParams(max_tokens=3, ignore_eos=True))
        assert len(rec.steps) == 3 and not any(launched_before_processed(rec.steps)), (
            tr("With overlap off, back to the plain loop: the next step is launched only after the previous one is processed")
        )
    finally:
        rec.close()
    assert_idle(tiny)


def test_exact_max_tokens_not_one_early(tiny, overlap_on) -> None:  # noqa: ANN001
    max_tokens = [1, 2, 3, 7, 11]
    rec = record(tiny)
    out = tiny.generate([f"prompt {i}" for i in range(5)], [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens])
    assert [len(o["token_ids"]) for o in out] == max_tokens, tr("With overlap scheduling, a request must not finish one token early (nor late)")
    per_uid = {}
    for s in rec.steps:
        for u in s.uids:
            per_uid[u] = per_uid.get(u, 0) + 1
    assert sorted(per_uid.values()) == sorted(max_tokens), tr("Requests that finish on max_tokens must not compute an extra step")
    assert_idle(tiny)


def test_token_after_eos_is_dropped(tiny, overlap_on) -> None:  # noqa: ANN001
    prompt = ["The quick brown fox jumps over the lazy dog"]
    full = tiny.generate(prompt, SamplingParams(max_tokens=12, ignore_eos=True))[0]["token_ids"]
    k = first_fresh_index(full)
    rec = record(tiny)
    saved = tiny.eos_token_id
    tiny.eos_token_id = full[k]
    try:
        out = tiny.generate(prompt, SamplingParams(max_tokens=12))[0]["token_ids"]
    finally:
        tiny.eos_token_id = saved
        rec.close()
    assert out == full[:k], tr("Every token before EOS is kept; EOS and the extra tokens computed after it are not in the result")
    assert len(rec.steps) == k + 2, tr("When EOS arrives the next step is already launched (overlap): one extra step is computed and its token must be dropped")
    assert_idle(tiny)


def test_slot_not_reused_while_batch_in_flight(tiny_path: str, make_llm, overlap_on) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "max_running_req": 2})
    prompts = [f"story number {i} begins" for i in range(6)]
    full = llm.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    k = first_fresh_index(full[0]["token_ids"])
    eos = full[0]["token_ids"][k]
    rec = record(llm)
    llm.eos_token_id = eos
    out = llm.generate(prompts, SamplingParams(max_tokens=10))
    early = [i for i, o in enumerate(out) if len(o["token_ids"]) < 10]
    assert 0 in early, tr("Request 0 must finish early at EOS")
    for prev, cur in zip(rec.steps, rec.steps[1:]):
        for uid, row in zip(cur.uids, cur.rows):
            for puid, prow in zip(prev.uids, prev.rows):
                assert not (row == prow and uid != puid), (
                    tr("Request {uid} used slot {row} while request {puid} in the previous, still in-flight step was using it: the slot was reused before its batch finished", uid=uid, row=row, puid=puid)
                )
    assert_idle(llm)


def test_abort_while_prefill_in_flight(tiny, overlap_on) -> None:  # noqa: ANN001
    sp = SamplingParams(max_tokens=5, ignore_eos=True)
    res = results(tiny)
    a = tiny.add_request([5, 6, 7, 8, 9], sp)
    b = tiny.add_request([15, 16, 17], sp)
    assert tiny.step(), tr("step() must launch the prefill")
    assert tiny.loop.busy, tr("The prefill is still in flight (results not processed)")
    tiny.abort(a)
    tiny.run_until_idle()
    assert res.ends(a) == ["abort"] and res.tokens(a) == [], tr("A request aborted in flight outputs nothing")
    assert len(res.tokens(b)) == 5, tr("The other requests in the batch are not affected")
    assert tiny.status == {}, tr("Settled requests leave scheduler.status")
    assert_idle(tiny)


def test_drain_processes_the_step_in_flight_and_holds_nothing(tiny, overlap_on) -> None:  # noqa: ANN001
    """``drain``（关掉重叠、服务停下时）：在途的一步等它算完、结果照样处理，之后什么也不留。

    en: ``drain`` (when overlap is switched off, when the server stops): the step in flight is waited for and its results
    processed as usual, and nothing is held afterwards.
    """
    sp = SamplingParams(max_tokens=1, ignore_eos=True)
    res = results(tiny)
    a = tiny.add_request([5, 6, 7, 8, 9], sp)
    assert tiny.step() and tiny.loop.busy, tr("step() must launch the prefill")
    tiny.loop.drain()
    assert not tiny.loop.busy, tr("After drain no step is in flight (busy is False)")
    assert res.tokens(a) and len(res.tokens(a)) == 1 and res.ends(a) == ["length"], (
        tr("drain processes the results of the step in flight: the request's one token arrives and it ends, got tokens "
           "{tokens} and ends {ends}", tokens=res.tokens(a), ends=res.ends(a)))  # fmt: skip
    assert tiny.status == {}, tr("Settled requests leave scheduler.status")
    assert_idle(tiny)
    # 一个请求在在途的那一步里被取消：它的资源留到那一步算完；drain 之后也要归还
    # en: a request cancelled while in the step in flight: its resources wait until that step is computed; after drain
    # en: they must be back too
    b = tiny.add_request([5, 6, 7, 8, 9], SamplingParams(max_tokens=5, ignore_eos=True))
    assert tiny.step() and tiny.step() and tiny.loop.busy, tr("step() must launch the prefill")
    tiny.abort(b)
    tiny.loop.drain()
    assert res.ends(b) == ["abort"] and not tiny.loop.busy, tr("A request aborted in flight outputs nothing")
    assert tiny.status == {}, tr("Settled requests leave scheduler.status")
    assert_idle(tiny)


ABORT_POINTS = ["waiting", "mid_chunk", "prefill_in_flight", "final_step_in_flight", "last_decode_in_flight", "finished"]


@pytest.mark.parametrize("when", ABORT_POINTS)
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_abort_at_every_point_releases_everything_once(tiny_path: str, make_llm, when: str, overlap: bool, page_size: int) -> None:  # noqa: ANN001
    """在请求一生的每个时刻取消它：槽位、页面、锁都恰好归还一次，同批的其他请求不受影响。"""
    llm = make_llm(LLM, tiny_path, **{**TINY_KW, "page_size": page_size, "num_page_override": 2048 // page_size, "max_extend_tokens": 8})
    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    try:
        sp = lambda n: SamplingParams(max_tokens=n, ignore_eos=True)  # noqa: E731
        prompt, steps_before_abort, max_tokens = {
            "waiting": (list(range(100, 106)), 0, 3),
            "mid_chunk": (list(range(100, 120)), 1, 3),  # 20 个 token、每块 8 个：一步之后还在分块
            "prefill_in_flight": (list(range(100, 106)), 1, 3),
            "final_step_in_flight": (list(range(100, 106)), 1, 1),  # 唯一的一步（预填充）就是最后一步
            "last_decode_in_flight": (list(range(100, 106)), 3, 3),  # 预填充 + 2 次解码：最后一次解码已发出
            "finished": (list(range(100, 106)), 6, 2),
        }[when]
        res = results(llm)
        uid = llm.add_request(prompt, sp(max_tokens))
        for _ in range(steps_before_abort):
            llm.step()
        llm.abort(uid)
        other = llm.add_request(list(range(200, 212)), sp(3))
        llm.run_until_idle()
        # 不重叠时“最后一步在途”其实已经算完：请求先正常结束了，取消什么也不做
        # en: without overlap the "final step in flight" is already computed: the request ended first, the abort does nothing
        ended_first = when == "finished" or (not overlap and when.endswith("_in_flight") and steps_before_abort >= max_tokens)
        want = ["length"] if ended_first else ["abort"]
        assert res.ends(uid) == want, tr("{when}: the request must end exactly once, with {want}; its end events: {got}", when=when, want=want, got=res.ends(uid))
        assert len(res.tokens(uid)) <= max_tokens, tr("{when}: {n} tokens were recorded, more than max_tokens={max_tokens}", when=when, n=len(res.tokens(uid)), max_tokens=max_tokens)
        assert len(res.tokens(other)) == 3, tr("{when}: aborting one request must not affect the others", when=when)
        assert llm.status == {}, tr("{when}: settled requests leave scheduler.status, left {uids}", when=when, uids=sorted(llm.status))
        assert_idle(llm)
    finally:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved


def test_prefix_insert_lands_one_iteration_later(tiny_path: str, make_llm, overlap_on) -> None:  # noqa: ANN001
    llm = make_llm(LLM, tiny_path, **TINY_KW)
    rec, res = record(llm), results(llm)
    shared = list(range(300, 330))
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    a = llm.add_request(shared + [1, 2], sp)
    llm.step()  # A 的预填充发出；它的结果（以及前缀插入）下一次迭代才处理
    b = llm.add_request(shared + [3, 4], sp)
    llm.step()  # B 的预填充发出时 A 的前缀还没插进树
    llm.run_until_idle()
    c = llm.add_request(shared + [5, 6], sp)
    llm.run_until_idle()
    prefill = {s.uids[0]: s.tokens for s in rec.steps if s.phase == "prefill"}
    assert prefill[a] == 32 and prefill[b] == 32, tr("When B is launched, A's prefix is not inserted yet (one iteration later), so B computes its whole prompt")
    assert prefill[c] == 2, tr("After A and B are processed, C hits the 30-token shared prefix")
    expect([len(res.tokens(u)) for u in (a, b, c)], [4, 4, 4], tr("Tokens generated by A, B and C (max_tokens=4)"))
    llm.check_integrity()


def test_switch_from_environment_variable(tiny_path: str) -> None:
    # 子进程里的失败消息在这里按当前语言译好，再以字面量写进脚本
    env_ignored = tr("The environment variable had no effect")
    still_overlapping = tr("Overlap scheduling was not turned off")
    script = textwrap.dedent(
        f"""
        import torch
        from minisgl.env import ENV
        from minisgl.llm import LLM
        from minisgl.core import SamplingParams
        assert ENV.DISABLE_OVERLAP_SCHEDULING.value, {env_ignored!r}
        llm = LLM({tiny_path!r}, dtype=torch.float32, max_running_req=4, num_page_override=256, max_seq_len_override=128)
        steps = []
        llm.add_step_listener(steps.append)
        out = llm.generate(["hello"], SamplingParams(max_tokens=3, ignore_eos=True))
        assert len(out[0]["token_ids"]) == 3
        assert len(steps) == 3 and all(b.prepare[0] > a.process[1] for a, b in zip(steps, steps[1:])), {still_overlapping!r}
        llm.shutdown()
        print("OK")
        """
    )
    # 子进程用和本进程相同的实现（学员代码 / 参考解答 / 骨架）
    impl = ",".join(f"{chapter}={choice.impl}" for chapter, choice in select.active.items())
    env = {**os.environ, "MINISGL_DISABLE_OVERLAP_SCHEDULING": "1", "MINISGL_IMPL": impl}
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "OK" in res.stdout, tr("MINISGL_DISABLE_OVERLAP_SCHEDULING=1 must turn overlap scheduling off:\n{value}", value=res.stderr[-3000:])


def test_one_openmp_pool_on_cpu(tiny_path: str) -> None:
    """CPU 上前向在后台线程时，主线程不能再留一个 OpenMP 线程池：两个池挤在两个核上，前向慢到一半左右。
    数进程的线程：主线程算过东西就有一个池（n 个计算线程多出 n - 1 个）；开着重叠调度时，多出来的只能是后台线程
    和它的池——主线程在这期间做并行计算也不能再建池；一批请求算完后后台线程的池也要退场，把核还给主线程上的代码。"""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip(tr("Counting a process's threads needs /proc (Linux)"))
    two_pools = tr("While the forward runs in the background thread the process has {during} threads, {baseline} before "
                   "the run (the main thread and its OpenMP pool): the main thread must hand the cores over before the "
                   "launch (its OpenMP pool let go, none built again while the requests run), or two pools share the cores")
    left_behind = tr("After generate() the process still has {after} threads (at most {limit} expected): the background "
                     "thread's OpenMP pool must be let go once the requests are done")
    script = textwrap.dedent(
        f"""
        import os, torch
        from minisgl.env import ENV
        from minisgl.llm import LLM
        from minisgl.core import SamplingParams
        def threads():
            return len(os.listdir("/proc/self/task"))
        ENV.DISABLE_OVERLAP_SCHEDULING.value = True
        llm = LLM({tiny_path!r}, dtype=torch.float32, max_running_req=4, num_page_override=256, max_seq_len_override=128)
        sp = SamplingParams(max_tokens=6, ignore_eos=True)
        llm.generate(["warm up the main thread"], sp)
        n = torch.get_num_threads()
        baseline = threads()  # the main thread + its pool
        ENV.DISABLE_OVERLAP_SCHEDULING.value = False
        seen = []
        def host_work(trace):
            torch.ones(1 << 20).sum()  # a parallel computation on the main thread, as scheduling may do
            seen.append(threads())
        llm.add_step_listener(host_work)
        llm.generate(["hello there", "a b c"], sp)
        during, after = max(seen), threads()
        assert n >= 2, n
        assert during <= baseline + 1, {two_pools!r}.format(during=during, baseline=baseline)
        assert after <= baseline + 1 - (n - 1), {left_behind!r}.format(after=after, limit=baseline + 1 - (n - 1))
        llm.shutdown()
        print("OK")
        """
    )
    impl = ",".join(f"{chapter}={choice.impl}" for chapter, choice in select.active.items())
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MINISGL_IMPL": impl}
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]


_CACHE: dict[tuple, object] = {}


def _llm_for(path: str, cache_type: str, page_size: int):  # noqa: ANN202
    key = (cache_type, page_size)
    if key not in _CACHE:
        for old in _CACHE.values():
            old.shutdown()
        _CACHE.clear()
        _CACHE[key] = LLM(path, **{**SMOL_KW, "cache_type": cache_type, "page_size": page_size, "num_page_override": 1024 // page_size})
    return _CACHE[key]


@pytest.fixture(scope="module", autouse=True)
def _close_cached():  # noqa: ANN202
    yield
    for llm in _CACHE.values():
        llm.shutdown()
    _CACHE.clear()


ALONE_TOKENS = 12
#: 单独跑哪几个提示词（一短一长、后者与另一个共享前缀）：每种组合都单独跑全部 8 个太慢，学员的检查要在一分钟左右跑完。
ALONE = (1, 5)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
@pytest.mark.parametrize("chunk", [None, 5], ids=["nochunk", "chunk5"])
@pytest.mark.parametrize("cache_type,page_size", [("radix", 1), ("naive", 1), ("radix", 4), ("naive", 4)])
def test_matches_hf_every_combination(smollm2_path, smollm2_prompts, smollm2_reference, cache_type, page_size, chunk, overlap) -> None:  # noqa: ANN001
    """成批（8 个请求）和单独跑（其中两个），每个请求的贪心输出都与 Hugging Face 一致。"""
    llm = _llm_for(smollm2_path, cache_type, page_size)
    llm.prefill_budget = chunk or llm.config.max_extend_tokens
    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    try:
        rec = record(llm)
        batched = [o["token_ids"] for o in llm.generate(smollm2_prompts, SamplingParams(max_tokens=SMOLLM2_TOKENS, ignore_eos=True))]
        assert_idle(llm)
        alone = {i: llm.generate([smollm2_prompts[i]], SamplingParams(max_tokens=ALONE_TOKENS, ignore_eos=True))[0]["token_ids"] for i in ALONE}
        assert_idle(llm)
    finally:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved
        llm.prefill_budget = llm.config.max_extend_tokens
        rec.close()
    if chunk:
        steps = rec.prefill_steps()
        assert max(steps) <= chunk and sum(steps) > chunk, tr("Each prefill step is at most the chunk size {chunk}, and the prompt really is chunked: {steps}", chunk=chunk, steps=steps)
    what = tr("{cache_type}, page_size={page_size}, chunk size {chunk}, {mode}", cache_type=cache_type, page_size=page_size, chunk=chunk, mode=tr("overlap scheduling on") if overlap else tr("overlap scheduling off"))
    for i, ref in enumerate(smollm2_reference):
        assert batched[i] == ref, tr("{what}: batched, request {i} differs from HF\nours: {batched_item}\nHF:   {ref}", what=what, i=i, batched_item=batched[i], ref=ref)
        if i in alone:
            assert alone[i] == ref[:ALONE_TOKENS], tr("{what}: alone, request {i} differs from HF\nours: {alone_item}\nHF:   {ref_item}", what=what, i=i, alone_item=alone[i], ref_item=ref[:ALONE_TOKENS])
