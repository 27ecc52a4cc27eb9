"""第 1.6 章 engine 的检查：批量采样器（贪心、温度、top-k、top-p、种子、一批里各自的参数），
forward_batch 的约定（只算不记账：不推进请求、不写 token 池；主机副本不共享内存），KV 页数的决定，
以及 SmolLM2 上与 Hugging Face generate 逐 token 一致：每个请求单独跑、全部放一批，page_size 1 和 4，torch 和 SDPA 后端。"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import minisgl.engine as engine_module
from checks.hf_reference import check_device
from minisgl.i18n import tr
from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig, Sampler, resolve_device, resolve_dtype, top_k_top_p_filter

from .conftest import assert_close_zh, expect

VOCAB = 50


def fake_batch(params: list[SamplingParams], device_len: int = 5) -> Batch:
    reqs = [Req(torch.arange(device_len, dtype=torch.int32), i, 0, 8, i, p) for i, p in enumerate(params)]
    return Batch(reqs, "decode")


def sample(params: list[SamplingParams], logits: torch.Tensor, seed: int = 0, device_len: int = 5) -> torch.Tensor:
    sampler = Sampler(torch.device("cpu"), logits.shape[-1], seed)
    return sampler.sample(logits, sampler.prepare(fake_batch(params, device_len)))


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_and_temperature_to_zero() -> None:
    logits = random_logits(6)
    argmax = logits.argmax(-1)
    assert torch.equal(sample([SamplingParams()] * 6, logits), argmax), tr("temperature=0 must be exactly argmax")
    tiny = [SamplingParams(temperature=1e-4) for _ in range(6)]
    for seed in range(5):
        assert torch.equal(sample(tiny, logits, seed), argmax), tr("As the temperature goes to 0, sampling must become greedy")
    assert torch.equal(sample([SamplingParams(temperature=2.0, top_k=1)] * 6, logits), argmax), tr("top_k=1 is greedy")


def test_top_k_never_outside() -> None:
    logits = random_logits(4, seed=1)
    for k in (1, 3, 10):
        allowed = logits.topk(k, dim=-1).indices
        for seed in range(40):
            got = sample([SamplingParams(temperature=5.0, top_k=k)] * 4, logits, seed)
            assert all(got[i] in allowed[i] for i in range(4)), tr("With top_k={k}, a token outside the top {k} was sampled", k=k)


def test_top_p_never_outside_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.05, 0.8, 0.1]])
    logits = probs.log()
    nucleus = {0.6: [{0, 1}, {2}], 0.85: [{0, 1, 2}, {2, 3}], 0.3: [{0}, {2}]}
    for top_p, allowed in nucleus.items():
        seen: list[set] = [set(), set()]
        for seed in range(60):
            got = sample([SamplingParams(temperature=1.0, top_p=top_p)] * 2, logits, seed)
            for i in range(2):
                assert got[i].item() in allowed[i], tr("With top_p={top_p}, token {value} outside the nucleus was sampled", top_p=top_p, value=got[i].item())
                seen[i].add(got[i].item())
        assert seen == allowed, tr("With top_p={top_p}, every token in the nucleus must have a chance to be sampled", top_p=top_p)
    filtered = top_k_top_p_filter(probs, torch.tensor([2, 4]), torch.tensor([0.7, 0.85]))
    kept = filtered > 0
    assert kept.tolist() == [[True, True, False, False], [False, False, True, True]], tr("First keep the top k, then take the smallest nucleus among them (after renormalizing)")
    assert_close_zh(filtered[0, 0] / filtered[0, 1], torch.tensor(0.5 / 0.3), tr("The ratios between the kept tokens must not change"))


def test_sampling_follows_distribution() -> None:
    probs = torch.tensor([0.6, 0.3, 0.1] + [0.0] * 7)
    logits = probs.log().expand(2000, -1).contiguous()
    got = sample([SamplingParams(temperature=1.0)] * 2000, logits, seed=3)
    freq = torch.bincount(got, minlength=10).float() / 2000
    assert_close_zh(freq, probs, tr("With temperature=1, the sampling frequencies must approach the softmax probabilities"), atol=0.04, rtol=0)


def test_seed_reproducible() -> None:
    logits = random_logits(4, seed=2)
    params = [SamplingParams(temperature=1.5)] * 4
    runs = [tuple(sample(params, logits, seed=11).tolist()) for _ in range(2)]
    assert runs[0] == runs[1], tr("The same engine seed must give the same result")
    others = {tuple(sample(params, logits, seed=s).tolist()) for s in range(12, 20)}
    assert len(others | {runs[0]}) > 1, tr("Different seeds should (almost always) give different results")
    seeded = SamplingParams(temperature=1.5, seed=123)
    alone = sample([seeded], logits[2:3], seed=0)
    together = sample([SamplingParams(temperature=1.5), SamplingParams(), seeded, seeded], logits, seed=99)
    assert together[2] == alone[0], tr("A seeded request's result must not depend on the other requests in the batch or on the engine seed")
    by_position = {sample([seeded], logits[2:3], seed=0, device_len=n).item() for n in range(5, 15)}
    assert len(by_position) > 1, tr("A seeded request must get different random numbers at different positions")


def test_per_request_params_in_one_batch() -> None:
    logits = random_logits(4, seed=4)
    order = logits.argsort(dim=-1, descending=True)
    params = [
        SamplingParams(),  # 贪心
        SamplingParams(temperature=3.0, top_k=2),
        SamplingParams(temperature=3.0, top_p=0.05),  # 核里只有第一名
        SamplingParams(temperature=3.0),
    ]
    seen_row3 = set()
    for seed in range(30):
        got = sample(params, logits, seed)
        assert got[0] == order[0, 0], tr("The greedy row must take the argmax")
        assert got[1] in order[1, :2], tr("The top_k=2 row may only sample the top two")
        assert got[2] == order[2, 0], tr("With a very small top_p only the top token remains")
        seen_row3.add(got[3].item())
    assert len(seen_row3) > 3, tr("The unrestricted high-temperature row should sample many different tokens")


def test_top_p_tie_keeps_exactly_the_tokens_that_reach_p() -> None:
    """累计概率恰好等于 top_p：刚好达到 p 的那个留下，后面的都不要（与 Hugging Face 的 TopPLogitsWarper 一样：
    它去掉升序累计 <= 1 - p 的）。概率都是 2 的负幂，浮点运算没有误差，边界就是边界。"""
    probs = torch.tensor([[0.125, 0.5, 0.125, 0.25]] * 3)
    top_p = torch.tensor([0.5, 0.75, 0.875])
    kept = (top_k_top_p_filter(probs.clone(), None, top_p) > 0).tolist()
    want = [[False, True, False, False], [False, True, False, True], [True, True, False, True]]
    for row in range(3):
        expect(kept[row], want[row],
               tr("probabilities {probs}, top_p={top_p}: the sorted cumulative sums are 0.5, 0.75, 0.875, 1; keep the tokens until the sum reaches top_p, including the one that reaches it exactly, and no more (kept mask)", probs=probs[row].tolist(), top_p=top_p[row].item()))  # fmt: skip


def test_top_k_equal_to_the_vocabulary_is_no_limit() -> None:
    """top_k 等于词表大小：什么都不过滤（与不设 top_k 完全一样），也不能越界。"""
    probs = random_logits(2, seed=5).softmax(-1)
    filtered = top_k_top_p_filter(probs.clone(), torch.tensor([VOCAB, VOCAB]), None)
    assert_close_zh(filtered, probs, tr("top_k_top_p_filter with top_k = vocabulary size ({vocab}) must leave the probabilities unchanged", vocab=VOCAB), atol=0, rtol=0)
    logits = random_logits(2, seed=6)
    for seed in range(8):
        with_k = sample([SamplingParams(temperature=1.3, top_k=VOCAB), SamplingParams(temperature=1.3, top_k=2)], logits, seed)
        without = sample([SamplingParams(temperature=1.3), SamplingParams(temperature=1.3, top_k=2)], logits, seed)
        expect(with_k[0].item(), without[0].item(), tr("Engine seed {seed}: a row with top_k = vocabulary size ({vocab}) must sample exactly like a row without top_k (same seed, same batch shape)", seed=seed, vocab=VOCAB))


def _hf_warped_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Hugging Face 的 logits 处理器（generate 的顺序：温度，然后 top-k，然后 top-p）给出的分布。"""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = [TemperatureLogitsWarper(temperature)]
    if top_k > 0:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    scores = logits.clone()[None]
    dummy_ids = torch.zeros(1, 1, dtype=torch.long)
    for warper in warpers:
        scores = warper(dummy_ids, scores)
    return scores.softmax(-1)[0]


HF_CASES = [(2.5, -1, 0.6), (0.5, -1, 0.9), (2.0, 5, 0.8), (0.6, 8, 1.0), (3.0, 12, 0.5)]


@pytest.mark.parametrize("temperature,top_k,top_p", HF_CASES)
def test_temperature_with_top_k_top_p_matches_hf(temperature: float, top_k: int, top_p: float) -> None:
    """温度 ≠ 1 与 top-k / top-p 一起用：Hugging Face 先除以温度，再在这个分布上做 top-k、top-p。
    比较：过滤后的分布（top_k_top_p_filter 归一化后），以及 4000 次采样——只出现 HF 留下的 token，频率接近 HF 的概率。"""
    logits = random_logits(1, seed=7)[0]
    hf = _hf_warped_probs(logits, temperature, top_k, top_p)
    hf_kept = sorted(torch.nonzero(hf > 0).flatten().tolist())
    what = tr("temperature={temperature}, top_k={top_k}, top_p={top_p}", temperature=temperature, top_k=top_k, top_p=top_p)
    ours = top_k_top_p_filter(
        (logits / temperature).softmax(-1)[None], torch.tensor([top_k if top_k > 0 else VOCAB]), torch.tensor([top_p])
    )[0]  # fmt: skip
    expect(sorted(torch.nonzero(ours > 0).flatten().tolist()), hf_kept,
           tr("{what}: tokens kept by top_k_top_p_filter on softmax(logits / temperature), compared with Hugging Face's TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper", what=what))  # fmt: skip
    n = 4000
    got = sample([SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)] * n, logits.expand(n, -1).contiguous(), seed=1)
    outside = sorted(set(got.tolist()) - set(hf_kept))
    expect(outside, [],
           tr("{what}: Sampler.sample drew tokens that Hugging Face filters out. Hugging Face divides by the temperature first and applies top-k/top-p to that distribution", what=what))  # fmt: skip
    freq = torch.bincount(got, minlength=VOCAB).float() / n
    assert_close_zh(freq, hf, tr("{what}: sampling frequencies vs Hugging Face's probabilities (temperature first, then top-k, then top-p)", what=what), atol=0.04, rtol=0)


# ----------------------------------------------------------------------------- 引擎


def tiny_engine(path: str, **kw) -> Engine:  # noqa: ANN003
    cfg = {"num_page_override": 320, "max_seq_len_override": 64, "max_running_req": 4, **kw}
    return Engine(EngineConfig(path, **cfg))  # engine defaults on purpose: callers that need a dtype or device pass it


def test_forward_batch_contract(tiny_path: str, hand) -> None:  # noqa: ANN001
    engine = tiny_engine(tiny_path)
    expect(engine.device, resolve_device("auto"), tr("Engine with the default device: engine.device"))
    expect(engine.dtype, resolve_dtype(None, engine.device), tr("Engine with the default dtype: engine.dtype"))
    expect(tuple(engine.page_table.shape), (5, 64), tr("page_table shape for max_running_req=4 (+1 scratch row) and max_seq_len=64"))
    expect(tuple(engine.token_pool.shape), (5, 64), tr("token_pool shape for max_running_req=4 (+1 scratch row) and max_seq_len=64"))
    expect(engine.num_pages, 320, tr("num_pages with num_page_override=320"))
    reqs = []
    for row, prompt in [(1, [5, 6, 7]), (3, [8, 9])]:
        hand.assign_pages(engine, row)
        reqs.append(Req(torch.tensor(prompt, dtype=torch.int32), row, 0, 3, row, SamplingParams()))
    batch = Batch(reqs, "prefill")
    hand.fill_batch(engine, batch)
    pool = engine.token_pool.clone()
    out = engine.forward_batch(batch, engine.sampler.prepare(batch))
    assert [(r.cached_len, r.device_len) for r in reqs] == [(0, 3), (0, 2)], (
        tr("forward_batch only computes and does no bookkeeping: advancing the requests (complete_one) is the caller's job when it launches the batch")
    )
    assert torch.equal(engine.token_pool, pool), tr("forward_batch does not write the token pool: the caller decides where new tokens go")
    expect((out.next_tokens_gpu.dtype, tuple(out.next_tokens_gpu.shape)), (torch.int32, (2,)), tr("next_tokens_gpu of a batch of 2: (dtype, shape)"))
    out.copy_done_event.synchronize()
    host = out.next_tokens_cpu.clone()
    expect(out.next_tokens_cpu.device.type, "cpu", tr("next_tokens_cpu lives on the host"))
    assert out.next_tokens_gpu.device == engine.device, tr("next_tokens_gpu is the result on the device (swapping the two only shows when running on a GPU)")
    assert out.next_tokens_cpu.data_ptr() != out.next_tokens_gpu.data_ptr(), tr("The host copy must not share memory with the result on the device")
    out.next_tokens_gpu.fill_(-1)
    assert torch.equal(out.next_tokens_cpu, host), tr("Changing the result on the device must not affect the host copy")
    # 调用者推进请求、接上新 token 之后，解码一步算出的正是下一个 token
    for req, token in zip(reqs, host):
        req.complete_one()
        req.append_host(token.reshape(1))
    batch = Batch(reqs, "decode")
    hand.fill_batch(engine, batch)
    out = engine.forward_batch(batch, engine.sampler.prepare(batch))
    assert [(r.cached_len, r.device_len) for r in reqs] == [(3, 4), (2, 3)], tr("forward_batch must not advance the requests")
    assert torch.equal(engine.token_pool, pool), tr("forward_batch must not write the token pool")
    engine.shutdown()


def _pages(engine: Engine, free_before: int, model_bytes: int, device: str = "cpu", **kw) -> int:  # noqa: ANN003
    """直接调用 ``_determine_num_pages``，换掉配置里的几项（和设备类型：它只看 ``device.type``）。"""
    engine.config = dataclasses.replace(engine.config, **kw)
    engine.device = torch.device(device)
    return engine._determine_num_pages(free_before, model_bytes)


def test_num_pages(tiny_path: str) -> None:
    engine = tiny_engine(tiny_path, dtype=torch.float32, device="cpu")
    expect((engine.num_pages, engine.max_seq_len), (320, 64), tr("(num_pages, max_seq_len) with num_page_override=320, max_seq_len_override=64"))
    per_page = engine.kv_cache.bytes_per_page(2, 2, 32, 1, torch.float32)
    expect(per_page, 1024, tr("bytes_per_page(2 kv heads, 2 layers, head_dim 32, page_size 1, fp32) = 2 (K and V) x 2 x 2 x 32 x 4 bytes"))
    base = dict(num_page_override=None, memory_ratio=0.5, page_size=1)
    # CPU：按需要——4 个请求 × 64 个 token，再加 50% 给前缀缓存；内存足够，上限不起作用
    expect(_pages(engine, 10**9, 10**8, max_running_req=4, max_seq_len_override=64, **base), 384,
           tr("CPU pages = ceil(1.5 × max_running_req × ceil(max_seq_len / page_size)) when memory is plentiful: 4 requests × 64 tokens + 50% for the prefix cache"))
    expect(_pages(engine, 10**9, 10**8, max_running_req=3, max_seq_len_override=64, **base), 288,
           tr("CPU pages with max_running_req=3, max_seq_len_override=64: 1.5 × 3 × 64"))
    expect(_pages(engine, 10**9, 10**8, max_running_req=2, max_seq_len_override=None, **base), 3 * 4096,
           tr("CPU pages without max_seq_len_override: the model's max_position_embeddings (4096) × 2 requests × 1.5"))
    # page_size=4：每个请求 ceil(61 / 4) = 16 页；1.5 × 3 × 16 = 72；每页 4096 字节
    expect(_pages(engine, 10**9, 10**8, max_running_req=3, max_seq_len_override=61, **{**base, "page_size": 4}), 72,
           tr("CPU pages with page_size=4, max_seq_len_override=61, max_running_req=3: 1.5 × 3 × ceil(61 / 4) = 72"))
    # 1.5 × 3 × 15 = 67.5 → 向上取整
    expect(_pages(engine, 10**9, 10**8, max_running_req=3, max_seq_len_override=60, **{**base, "page_size": 4}), 68,
           tr("CPU pages: 1.5 × 3 × ceil(60 / 4) = 67.5 is rounded up to 68"))
    # 内存不够时由上限决定：（可用 × 比例 − 模型）÷ 每页字节数
    expect(_pages(engine, 2_000_000, 800_000, max_running_req=4, max_seq_len_override=64, **base), (1_000_000 - 800_000) // 1024,
           tr("CPU pages are capped by (available × memory_ratio − model bytes) ÷ bytes per page"))
    expect(_pages(engine, 2_000_000, 400_000, max_running_req=4, max_seq_len_override=64, **{**base, "memory_ratio": None}), (600_000 - 400_000) // 1024,
           tr("On CPU memory_ratio defaults to 0.3 (0.9 is for CUDA only)"))
    # CUDA：不按需要，只按比例（缺省 0.9）
    expect(_pages(engine, 10**9, 10**8, "cuda", max_running_req=4, max_seq_len_override=64, **base), (5 * 10**8 - 10**8) // 1024,
           tr("On CUDA pages = (available × memory_ratio − model bytes) ÷ bytes per page, without the CPU's need-based limit"))
    expect(_pages(engine, 10**9, 10**8, "cuda", max_running_req=4, max_seq_len_override=64, **{**base, "memory_ratio": None}), (9 * 10**8 - 10**8) // 1024,
           tr("On CUDA memory_ratio defaults to 0.9"))
    for kw in ({"page_size": 4}, {"page_size": 1}):
        expect(_pages(engine, 10**9, 10**8, max_running_req=4, max_seq_len_override=64, **{**base, "num_page_override": 7, **kw}), 7,
               tr("num_page_override wins over every rule"))
    with pytest.raises(RuntimeError) as raised:
        _pages(engine, 10**6, 6 * 10**5, max_running_req=4, max_seq_len_override=64, **base)  # 模型占掉的比 1 MB × 0.5 还多
        pytest.fail(tr("Must raise RuntimeError when memory cannot hold the KV cache"))
    assert not isinstance(raised.value, NotImplementedError), tr("_determine_num_pages is not implemented yet: {value}", value=raised.value)
    for name in ("memory_ratio", "num_page_override", "--mem-fraction-static", "--max-total-tokens"):
        assert name in str(raised.value), tr("The error must name {name} (the Python parameters and the server's flags), got: {value}", name=name, value=raised.value)
    engine.shutdown()


def test_num_pages_ignores_memory_others_take_while_loading(tiny_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """加载模型期间别的进程占了 900 MB：模型的大小按它的张量算，不按前后的差值；页数照样是需要的 384 页。"""
    free = iter([10**9, 10**8, 10**8, 10**8])
    monkeypatch.setattr(engine_module, "get_free_memory", lambda device: next(free))
    engine = Engine(EngineConfig(tiny_path, dtype=torch.float32, memory_ratio=0.5, max_running_req=4, max_seq_len_override=64, device="cpu"))
    assert engine.num_pages == 384, tr("Memory other processes take while the model loads is not the model's: expected 384 pages, got {num_pages}", num_pages=engine.num_pages)
    engine.shutdown()


@pytest.mark.parametrize("model_bytes,pages", [(102_398_976, 1), (102_398_977, 0)])
def test_exactly_one_page_is_enough_and_zero_is_refused(tiny_path: str, model_bytes: int, pages: int) -> None:
    """可用 102,400,000 字节（2.048 亿 × 0.5），每页 1024 字节：模型占掉后刚好剩 1 页就建得起来，剩 0 页必须报错。"""
    engine = tiny_engine(tiny_path, dtype=torch.float32, device="cpu")
    kw = dict(num_page_override=None, memory_ratio=0.5, max_seq_len_override=64, page_size=1)
    if pages == 0:
        with pytest.raises(RuntimeError, match="memory_ratio|num_page_override") as raised:
            _pages(engine, 204_800_000, model_bytes, **kw)
            pytest.fail(tr("Must raise RuntimeError when not even one KV cache page fits"))
        assert not isinstance(raised.value, NotImplementedError), tr("_determine_num_pages is not implemented yet: {value}", value=raised.value)
        return
    got = _pages(engine, 204_800_000, model_bytes, **kw)
    assert got == 1, tr("Exactly one page left: num_pages must be 1, got {num_pages}", num_pages=got)
    engine.shutdown()


@pytest.mark.every_path
def test_fast_linear_agrees_with_reference(tiny_path: str, hand) -> None:  # noqa: ANN001
    """CPU 的两条快速路径（小批量内核、oneDNN 重排的权重）与参考路径 F.linear 的 logits 一致。"""
    logits = {}
    for fast, use_kernel, kind in ((True, True, "kernel"), (True, False, "onednn"), (False, True, "torch")):
        engine = tiny_engine(tiny_path, cpu_fast_linear=fast, cpu_kernel=use_kernel, dtype=torch.float32, device="cpu")
        assert (engine.fast_linear, engine.linear_kind) == (fast, kind), tr(
            "cpu_fast_linear={fast}, cpu_kernel={use_kernel}: expected linear_kind {kind!r}, got {got!r}",
            fast=fast, use_kernel=use_kernel, kind=kind, got=engine.linear_kind,
        )
        hand.assign_pages(engine, 0)
        req = Req(torch.tensor([3, 1, 4, 1, 5], dtype=torch.int32), 0, 0, 2, 0, SamplingParams())
        batch = Batch([req], "prefill")
        hand.fill_batch(engine, batch)
        with torch.inference_mode(), engine.ctx.forward_batch(batch):
            logits[kind] = engine.model.forward()
        engine.forward_batch(batch, engine.sampler.prepare(batch))
        engine.shutdown()
    for kind in ("kernel", "onednn"):
        assert_close_zh(logits[kind], logits["torch"], tr("The {kind} path and the F.linear path disagree", kind=kind),
                        atol=1e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def smollm2_engines(smollm2_path: str) -> dict:
    """(后端, page_size) → 引擎；模块内共用。"""
    engines = {}
    for backend in ("sdpa", "torch"):
        for page_size in (1, 4):
            engines[backend, page_size] = Engine(
                EngineConfig(smollm2_path, dtype=torch.float32, device=check_device(), max_running_req=8, num_page_override=8 * 128 // page_size,
                             max_seq_len_override=128, page_size=page_size, attention_backend=backend)
            )  # fmt: skip
    return engines


def make_reqs(engine: Engine, hand, prompts: list[list[int]], n: int, rows: list[int]) -> list[Req]:  # noqa: ANN001
    reqs = []
    for row, prompt in zip(rows, prompts):
        hand.assign_pages(engine, row)
        reqs.append(Req(torch.tensor(prompt, dtype=torch.int32), row, 0, n, row, SamplingParams()))
    return reqs


def describe_mismatch(ours: list[list[int]], ref: list[list[int]]) -> str:
    bad = [(i, next(j for j, (a, b) in enumerate(zip(o, r)) if a != b)) for i, (o, r) in enumerate(zip(ours, ref)) if o != r]
    return tr("Prompts that differ from HF generate (index, token position): ") + ", ".join(f"({i}, {j})" for i, j in bad)


@pytest.mark.parametrize("backend, page_size", [("sdpa", 1), ("torch", 4)])
def test_smollm2_each_alone_equals_hf(smollm2_engines, smollm2_prompts, smollm2_reference, hand, backend, page_size) -> None:  # noqa: ANN001
    engine = smollm2_engines[backend, page_size]
    ours = []
    for i, prompt in enumerate(smollm2_prompts):
        [req] = make_reqs(engine, hand, [prompt], len(smollm2_reference[i]), [i])
        ours += hand.run_to_completion(engine, Batch, [req])
    assert ours == smollm2_reference, describe_mismatch(ours, smollm2_reference)


@pytest.mark.every_path
@pytest.mark.parametrize("backend", ["sdpa", "torch"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_smollm2_batched_equals_hf(smollm2_engines, smollm2_prompts, smollm2_reference, hand, backend, page_size) -> None:  # noqa: ANN001
    engine = smollm2_engines[backend, page_size]
    rows = list(range(len(smollm2_prompts)))[::-1]  # 行号倒过来，不与序号相同
    reqs = make_reqs(engine, hand, smollm2_prompts, len(smollm2_reference[0]), rows)
    ours = hand.run_to_completion(engine, Batch, reqs)
    assert ours == smollm2_reference, describe_mismatch(ours, smollm2_reference)


def test_top_p_renormalizes_after_top_k() -> None:
    """先 top_k 再 top_p：核要在 top_k 留下的概率重新归一化之后再算（文档：“在剩下的里（重新归一化后）”）。"""
    probs = torch.tensor([[0.5, 0.3, 0.2]])
    got = top_k_top_p_filter(probs, torch.tensor([2]), torch.tensor([0.6]))
    kept = (got[0] > 0).tolist()
    assert kept == [True, False, False], (
        tr("After top_k=2 the renormalized probabilities are [0.625, 0.375] and the top token already reaches top_p=0.6, so only it should remain; kept {kept}", kept=kept)
    )
    got = top_k_top_p_filter(probs, torch.tensor([3]), torch.tensor([0.6]))
    assert (got[0] > 0).tolist() == [True, True, False], tr("Without a top_k cut, only the top two (0.5 + 0.3) reach 0.6")



# ----------------------------------------------------------------------------- 学员走查补的检查（issue 16）


@pytest.mark.parametrize("page_size,dtype", [(4, torch.float32), (1, torch.bfloat16)])
def test_num_pages_counts_page_size_and_dtype(tiny_path: str, page_size: int, dtype: torch.dtype) -> None:
    """每页字节数随 page_size 和 dtype 变：page_size=4 一页是 4 个 token，bf16 每个元素 2 字节（内存不够、由上限决定页数时）。"""
    per_page = engine_module.MHAKVCache.bytes_per_page(2, 2, 32, page_size, dtype)
    engine = tiny_engine(tiny_path, dtype=dtype, page_size=page_size, num_page_override=80 // page_size, device="cpu")
    got = _pages(engine, 2_000_000, 800_000, num_page_override=None, memory_ratio=0.5, max_running_req=8)
    expect = (1_000_000 - 800_000) // per_page
    assert got == expect, (
        tr("page_size={page_size}, dtype={dtype}: {per_page} bytes per page (2 × layers × page_size × KV heads × head_dim × bytes per element), so the number of pages must be (2e6 × 0.5 − 8e5) ÷ {per_page} = {expect}, got {num_pages}", page_size=page_size, dtype=dtype, per_page=per_page, expect=expect, num_pages=got)
    )
    engine.shutdown()
