"""第 3.5 章 sampling 的检查：三种惩罚、min-p、对数概率逐个对照 Hugging Face 的 logits 处理器（或 OpenAI 的公式）；
整理控制、按步记状态（每步恰好一次、提示词的中间块不记、新请求先清零）；再在 SmolLM2 上端到端：带重复惩罚的贪心
输出与 HF ``generate`` 逐 token 一致（与不用惩罚的请求同批），对数概率与 HF 的 ``log_softmax`` 相差不到 1e-4，
重叠调度开关、分块预填充都不改变带控制的采样结果。

en: Checks of chapter 3.5 sampling: the three penalties, min-p and the log-probabilities one by one against Hugging
Face's logits processors (or OpenAI's formula); gathering the controls and recording the state step by step (exactly
once per step, chunks of a prompt not recorded, a new request cleared first); then end to end on SmolLM2: greedy output
with a repetition penalty equals HF ``generate`` token by token (batched with requests that use none), the
log-probabilities are within 1e-4 of HF's ``log_softmax``, and neither overlap scheduling on/off nor chunked prefill
changes a sampled output that uses the controls.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, AutoTokenizer, MinPLogitsWarper, RepetitionPenaltyLogitsProcessor

from checks.common import expect
from minisgl.core import Batch, Req, SamplingParams
from minisgl.env import ENV
from minisgl.i18n import tr

from .conftest import read_events, send_request, tiny_model

VOCAB = 40
EOS = 3


def rand_logits(rows: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def close(got: torch.Tensor, want: torch.Tensor, what: str, atol: float = 1e-5) -> None:
    assert got.shape == want.shape and torch.allclose(got, want, atol=atol, rtol=0, equal_nan=True), \
        tr("{what}\nours: {got}\nwant: {want}", what=what, got=got, want=want)


# ----------------------------------------------------------------------------- 纯函数 | en: pure functions


def test_apply_penalties_match_hf_and_openai() -> None:
    from minisgl.sampling import apply_penalties

    logits = rand_logits(4)
    before = logits.clone()
    gen = torch.Generator().manual_seed(1)
    counts = torch.randint(0, 3, (4, VOCAB), generator=gen, dtype=torch.int32)
    counts[:, ::2] = 0
    prompt = torch.rand(4, VOCAB, generator=gen) < 0.3
    seen = prompt | (counts > 0)
    rep = torch.tensor([1.0, 1.3, 0.7, 2.0])
    pres = torch.tensor([0.0, 0.5, -0.4, 1.5])
    freq = torch.tensor([0.0, 0.25, 0.6, -1.0])
    got = apply_penalties(logits, counts, seen, rep, None, None)
    expect(torch.equal(logits, before), True, tr("apply_penalties must not change the logits it is given"))
    for row in range(4):
        ids = seen[row].nonzero().flatten()[None, :]
        want = RepetitionPenaltyLogitsProcessor(float(rep[row]))(ids, logits[row:row + 1].clone())
        close(got[row:row + 1], want, tr("Row {row}: the repetition penalty equals HF's RepetitionPenaltyLogitsProcessor over the tokens seen (prompt and output)", row=row))
    got = apply_penalties(logits, counts, seen, None, pres, freq)
    want = logits - freq[:, None] * counts.float() - pres[:, None] * (counts > 0).float()
    close(got, want, tr("Presence and frequency penalties follow OpenAI: logit - frequency * count - presence * (count > 0), counted over the output only"))
    got = apply_penalties(logits, counts, seen, rep, pres, freq)
    expect(torch.equal(got[0], logits[0]), True, tr("A row at the neutral values (1, 0, 0) is unchanged"))
    expect(torch.equal(apply_penalties(logits, counts, seen, None, None, None), logits), True,
           tr("With no penalty given the logits come back unchanged"))


def test_min_p_filter_matches_hf() -> None:
    from minisgl.sampling import min_p_filter

    logits = rand_logits(4, seed=2)
    min_p = torch.tensor([0.0, 0.05, 0.3, 0.9])
    temps = torch.tensor([1.0, 0.5, 1.0, 2.0])
    got = min_p_filter(logits, min_p, temps)
    for row in range(4):
        scaled = logits[row:row + 1] / temps[row]
        want = scaled if min_p[row] == 0 else MinPLogitsWarper(float(min_p[row]))(None, scaled.clone())
        expect(torch.isinf(got[row]).tolist(), torch.isinf(want[0]).tolist(),
               tr("Row {row} (min_p {p}, temperature {t}): the tokens min-p removes are those HF's MinPLogitsWarper removes after the temperature", row=row, p=float(min_p[row]), t=float(temps[row])))
        kept = ~torch.isinf(got[row])
        expect(torch.equal(got[row][kept], logits[row][kept]), True, tr("The tokens min-p keeps keep their logits (not divided by the temperature)"))


def test_token_logprobs() -> None:
    from minisgl.sampling import token_logprobs

    lp = rand_logits(3, seed=3).log_softmax(-1)
    tokens = torch.tensor([5, 0, 39])
    chosen, ids, values = token_logprobs(lp, tokens, 4)
    close(chosen, lp[torch.arange(3), tokens], tr("The log-probability of each row's sampled token"))
    top = lp.topk(4, dim=-1)
    expect((ids.tolist(), ids.dtype), (top.indices.tolist(), torch.int64), tr("The ids of the 4 most likely tokens, largest first (int64)"))
    close(values, top.values, tr("Their log-probabilities, largest first"))
    expect(token_logprobs(lp, tokens, 0)[1].shape, torch.Size([3, 0]), tr("With k = 0 the top entries have shape [R, 0]"))


# ----------------------------------------------------------------------------- 整理控制与状态 | en: controls and state


def make_req(prompt_len: int, sp: SamplingParams, table_idx: int, generated: int = 0, chunked: bool = False) -> Req:
    """一个请求：提示词 ``prompt_len`` 个 token，已经输出了 ``generated`` 个（长度记账像调度器推进过那样）。

    en: A request with a prompt of ``prompt_len`` tokens that has output ``generated`` (the lengths as the scheduler
    would have advanced them).
    """
    from minisgl.chunked_prefill import ChunkedReq

    ids = torch.arange(10, 10 + prompt_len + generated, dtype=torch.int32) % VOCAB
    cls = ChunkedReq if chunked else Req
    req = cls(ids[:prompt_len], table_idx, 0, 8, table_idx, sp)
    if generated:
        req.input_ids = ids
        req.cached_len = prompt_len + generated - 1
        req.device_len = prompt_len + generated
    return req


def make_sampler(seed: int = 0) -> Any:
    from minisgl.sampling import Sampler

    return Sampler(torch.device("cpu"), VOCAB, seed, rows=8, eos_token_id=EOS)


def test_prepare_controls() -> None:
    plain = SamplingParams()
    rep = SamplingParams(repetition_penalty=1.25, logprobs=True, top_logprobs=3, min_tokens=2)
    pres = SamplingParams(temperature=0.7, presence_penalty=0.5, logit_bias={"7": -5.0, "9": 2.0}, min_p=0.1)
    reqs = [make_req(4, plain, 0), make_req(5, rep, 1), make_req(6, pres, 2, generated=3),
            make_req(3, rep, 3, generated=2), make_req(7, pres, 4, chunked=True)]
    sampler = make_sampler()
    c = sampler.prepare(Batch(reqs, "prefill")).controls
    assert c is not None, tr("A batch where some request uses a control gets BatchControls")
    expect(c.state_rows.tolist(), [0, 1, 2, 3, 4], tr("state_rows holds each request's table_idx"))
    expect(c.no_eos, [1], tr("min_tokens masks EOS only in rows still short of it (the request with 2 outputs already has its 2)"))
    expect((c.logprob_rows, c.top_n), ([1, 3], [3, 3]), tr("Rows asking for log-probabilities, with how many top entries each"))
    expect((c.repetition.tolist(), c.presence.tolist(), c.frequency),
           ([1.0, 1.25, 1.0, 1.25, 1.0], [0.0, 0.0, 0.5, 0.0, 0.5], None),
           tr("One value per row for each penalty in use; None for a penalty no row uses"))
    rows, ids, values = c.bias
    expect(sorted(zip(rows.tolist(), ids.tolist(), values.tolist())), [(2, 7, -5.0), (2, 9, 2.0), (4, 7, -5.0), (4, 9, 2.0)],
           tr("The logit bias as (row, token id, value) triples"))
    expect(c.min_p.tolist(), pytest.approx([0.0, 0.0, 0.1, 0.0, 0.1]), tr("min_p per row"))
    expect(sampler.prepare(Batch([make_req(4, plain, 0)], "prefill")).controls, None,
           tr("A batch without any control gets no BatchControls (chapter 1.6's path, at no extra cost)"))
    only = sampler.prepare(Batch([make_req(4, plain, 0), make_req(4, SamplingParams(logprobs=True), 1)], "prefill")).controls
    expect((only.repetition, only.presence, only.frequency, only.bias, only.min_p, only.no_eos),
           (None, None, None, None, None, []), tr("A batch that only asks for log-probabilities: every other item is None or empty"))


def step(sampler: Any, reqs: list[Req], logits: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """一步：prepare → sample → 像调度器那样推进长度、把 token 接到请求上。

    en: One step: prepare → sample → advance the lengths and append the token, as the scheduler does.
    """
    args = sampler.prepare(Batch(reqs, "decode"))
    tokens = sampler.sample(logits.clone(), args)
    for req, token in zip(reqs, tokens):
        if req.can_decode:
            req.complete_one()
            req.append_host(token)
    return tokens, args.controls


def observed(sampler: Any, reqs: list[Req], logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """一步（像 :func:`step`），再从对数概率里读回每行在采样前看到的分布（请求要的 top_logprobs 是整个词表）。

    en: One step (as :func:`step`), then read back from the log-probabilities the distribution each row saw before the
    draw (the requests ask for the whole vocabulary as top_logprobs).
    """
    tokens, c = step(sampler, reqs, logits)
    rows = []
    for i in range(len(reqs)):
        lp = c.logprobs.of(i)
        row = torch.full((VOCAB,), float("nan"))
        row[torch.tensor(lp.top_ids)] = torch.tensor(lp.top_logprobs)
        rows.append(row)
    return tokens, torch.stack(rows)


def watched(**penalty: float) -> SamplingParams:
    return SamplingParams(logprobs=True, top_logprobs=VOCAB, **penalty)


def test_history_is_noted_once_per_step_and_penalises_the_next() -> None:
    sampler = make_sampler()
    req = make_req(2, watched(frequency_penalty=2.0), 5)
    logits = torch.zeros(1, VOCAB)
    logits[0, 20] = 5.0
    logits[0, 21] = 4.0
    drawn = [int(step(sampler, [req], logits)[0][0]) for _ in range(4)]
    expect(drawn, [20, 21, 20, 21], tr("Frequency penalty 2 over the counts from before each step: 20 (5 > 4), 21 (4 > 5-2), 20 (5-2 > 4-2), 21 (4-2 > 5-4)"))
    _, seen = observed(sampler, [req], logits)
    want = logits.clone()
    want[0, 20] -= 2.0 * 2
    want[0, 21] -= 2.0 * 2
    close(seen, want.log_softmax(-1), tr("After 4 steps (20, 21, 20, 21) the 5th step's logits carry frequency penalty 2 × 2 occurrences on tokens 20 and 21: each step is noted exactly once"))


def test_a_new_request_starts_from_its_prompt_alone() -> None:
    sampler = make_sampler()
    logits = torch.ones(1, VOCAB)
    logits[0, 30] = 3.0
    step(sampler, [make_req(3, watched(presence_penalty=1.0), 2)], logits)  # 在槽位 2 输出 30 | en: outputs 30 in slot 2
    chunk = make_req(6, watched(repetition_penalty=2.0), 2, chunked=True)
    step(sampler, [chunk], logits)  # 提示词的中间块也抽到 30，但那不是输出 | en: a chunk of a prompt draws 30 too, not an output
    again = make_req(4, watched(repetition_penalty=2.0), 2)
    tokens, seen = observed(sampler, [again], logits)
    want = logits.clone()
    want[0, 10:14] = 0.5  # 它的提示词 10..13：1 / 2 | en: its prompt 10..13: 1 / 2
    close(seen, want.log_softmax(-1), tr("A new request in a reused slot sees only its own prompt (tokens 10..13 penalised): not the previous request's output 30, not what a chunk of a prompt drew"))
    expect(int(tokens[0]), 30, tr("Token 30 (logit 3) is drawn"))
    _, seen = observed(sampler, [again], logits)
    want[0, 30] = 1.5
    close(seen, want.log_softmax(-1), tr("Its next step sees its prompt and its own first token 30 (3 / 2)"))


def test_history_follows_the_overlap_order() -> None:
    """重叠调度：第 N+1 步在调度线程里准备时，第 N 步还没采样；它的惩罚照样要看到第 N 步的 token。

    en: Overlap scheduling: step N+1 is prepared on the scheduling thread before step N has sampled; its penalties must
    still see step N's token.
    """
    sampler = make_sampler()
    req = make_req(2, SamplingParams(frequency_penalty=2.0), 5)
    logits = torch.zeros(1, VOCAB)
    logits[0, 20] = 5.0
    logits[0, 21] = 4.0
    first = sampler.prepare(Batch([req], "decode"))
    req.complete_one()
    second = sampler.prepare(Batch([req], "decode"))
    a = int(sampler.sample(logits.clone(), first)[0])
    req.append_host(torch.tensor(a))
    b = int(sampler.sample(logits.clone(), second)[0])
    expect((a, b), (20, 21), tr("Step 2 was prepared before step 1 drew 20; its penalty must still count that 20 (5 - 2 < 4): read the history on the computing side, not in prepare"))


class _HostCopy(torch.Tensor):
    """设备上的 token：拷回主机（tolist、item、int、numpy、cpu）就报错。

    en: Tokens on the device: copying them to the host (tolist, item, int, numpy, cpu) raises.
    """

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        name = getattr(func, "__name__", "")
        if name in ("tolist", "item", "numpy", "cpu", "__int__", "__index__", "__float__", "__bool__"):
            raise AssertionError(tr("record copied the sampled tokens to the host ({name}): on a GPU the computing thread would stop and wait", name=name))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_record_keeps_the_tokens_on_the_device() -> None:
    sampler = make_sampler()
    reqs = [make_req(3, watched(frequency_penalty=1.0), 1), make_req(3, watched(presence_penalty=1.0), 4)]
    c = sampler.prepare(Batch(reqs, "decode")).controls
    sampler.token_stats(c)
    sampler.record(c, torch.tensor([25, 26]).as_subclass(_HostCopy))
    for r in reqs:
        r.complete_one()
        r.append_host(torch.tensor(0))
    _, seen = observed(sampler, reqs, torch.zeros(2, VOCAB))
    want = torch.zeros(2, VOCAB)
    want[0, 25] = want[1, 26] = -1.0
    close(seen, want.log_softmax(-1), tr("The tokens handed to record (25 and 26) are penalised in the next step"))


class _Sizes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN201
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_history_memory_before_a_penalty() -> None:
    from minisgl.sampling import Sampler

    rows = 64
    with _Sizes() as sizes:
        sampler = Sampler(torch.device("cpu"), VOCAB, 0, rows=rows, eos_token_id=EOS)
        step(sampler, [make_req(3, SamplingParams(logprobs=True, min_tokens=2), 0)], torch.zeros(1, VOCAB))
    expect(sizes.largest < rows * VOCAB, True, tr("Before any request uses a penalty nothing of slots × vocabulary ({n} elements) is allocated; the largest tensor had {m}", n=rows * VOCAB, m=sizes.largest))


def test_sample_order_logprobs_min_tokens_and_bias() -> None:
    sampler = make_sampler(seed=4)
    logits = rand_logits(3, seed=5)
    logits[[0, 2], EOS] = 20.0
    sps = [SamplingParams(min_tokens=2, logprobs=True, top_logprobs=2),
           SamplingParams(temperature=0.5, repetition_penalty=1.5, logprobs=True, top_logprobs=5, min_p=0.2, seed=9),
           SamplingParams(logit_bias={str(EOS): -100.0, "6": 100.0}, logprobs=True)]
    reqs = [make_req(4, sp, i) for i, sp in enumerate(sps)]
    tokens, c = step(sampler, reqs, logits)
    expect(int(tokens[0]) != EOS, True, tr("min_tokens: EOS is masked before the request has output enough"))
    expect(int(tokens[2]), 6, tr("logit_bias +100 makes token 6 win and -100 removes EOS"))
    adjusted = logits.clone()
    adjusted[0, EOS] = float("-inf")
    seen = torch.zeros(VOCAB, dtype=torch.bool)
    seen[reqs[1].input_ids[:4].long()] = True
    row = adjusted[1]
    adjusted[1] = torch.where(seen, torch.where(row > 0, row / 1.5, row * 1.5), row)
    adjusted[2, EOS] -= 100.0
    adjusted[2, 6] += 100.0
    adjusted[1] /= 0.5
    want = adjusted.log_softmax(-1)
    got = torch.stack([torch.tensor(c.logprobs.of(i).logprob) for i in range(3)])
    close(got, want[torch.arange(3), tokens], tr("Log-probabilities come from the logits after penalties, bias and masks, divided by the temperature (greedy rows by 1), before min-p"), atol=1e-4)
    top = c.logprobs.of(0)
    expect(len(top.top_ids), 2, tr("top_logprobs 2 gives 2 entries"))
    values, ids = want[1].topk(5)
    expect(c.logprobs.of(1).top_ids, ids.tolist(), tr("The 5 most likely tokens of the row at temperature 0.5"))
    close(torch.tensor(c.logprobs.of(1).top_logprobs), values, tr("The top log-probabilities of the row at temperature 0.5 with min_p 0.2: divided by the temperature, taken before min-p removes the tail"), atol=1e-4)
    tokens, _ = step(sampler, reqs, logits)
    expect(int(tokens[0]) != EOS, True, tr("One output so far, min_tokens 2: EOS still masked"))
    tokens, _ = step(sampler, reqs, logits)
    expect(int(tokens[0]), EOS, tr("Two outputs: min_tokens reached, EOS (logit 20) wins again"))
    biased = [make_req(4, SamplingParams(logit_bias={"6": 100.0}, logprobs=True), 0)]
    tokens, _ = step(make_sampler(), biased, logits[1:2].bfloat16())
    expect(int(tokens[0]), 6, tr("bf16 logits (the model's dtype on CUDA) with a logit_bias: the controls work in fp32"))


def test_min_p_in_sampling() -> None:
    logits = torch.full((1, VOCAB), 5.0)
    logits[0, 7] = 10.0
    logits[0, 8] = 9.0
    got = set()
    for seed in range(12):
        sampler = make_sampler(seed)
        sp = SamplingParams(temperature=2.0, min_p=0.3, seed=seed)
        got.add(int(sampler.sample(logits.clone(), sampler.prepare(Batch([make_req(3, sp, 0)], "decode")))[0]))
    expect(got, {7, 8}, tr("min_p 0.3 at temperature 2 keeps tokens 7 and 8 (probability ratio e^-0.5 to the top) and drops those at e^-2.5: over 12 seeds both kept ones, and only they, are drawn"))
    sampler = make_sampler()
    greedy = [make_req(3, SamplingParams(min_p=0.5, logprobs=True), 0), make_req(3, SamplingParams(min_p=0.1), 1)]
    tokens = sampler.sample(logits.repeat(2, 1), sampler.prepare(Batch(greedy, "decode")))
    expect(tokens.tolist(), [7, 7], tr("An all-greedy batch with min_p: the argmax, temperature counted as 1"))


# ----------------------------------------------------------------------------- 端到端 | en: end to end


@pytest.fixture(scope="module")
def smol(smollm2_path: str) -> Iterator[tuple[Any, Any, Any]]:
    from minisgl.llm import LLM

    llm = LLM(smollm2_path, dtype=torch.float32, device="cpu", max_running_req=8, num_page_override=1024,
              max_seq_len_override=256)
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    hf = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    yield llm, tok, hf
    llm.shutdown()


PROMPTS = ["The capital of France is", "Once upon a time, there was a little", "def fibonacci(n):"]
TOKENS = 16


def test_greedy_with_repetition_penalty_equals_hf_generate(smol: tuple[Any, Any, Any]) -> None:
    llm, tok, hf = smol
    sps = [SamplingParams(max_tokens=TOKENS, ignore_eos=True, repetition_penalty=1.3),
           SamplingParams(max_tokens=TOKENS, ignore_eos=True),
           SamplingParams(max_tokens=TOKENS, ignore_eos=True, repetition_penalty=1.8)]
    outs = llm.generate(PROMPTS, sps)
    for prompt, sp, out in zip(PROMPTS, sps, outs):
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = hf.generate(ids, max_new_tokens=TOKENS, do_sample=False, repetition_penalty=sp.repetition_penalty,
                              attention_mask=torch.ones_like(ids))[0, ids.shape[1]:].tolist()
        expect(out["token_ids"], ref, tr("Greedy with repetition_penalty={rp} on {prompt!r}, batched with requests using other values, equals HF generate", rp=sp.repetition_penalty, prompt=prompt))


def test_logprobs_equal_hf_log_softmax(smol: tuple[Any, Any, Any]) -> None:
    llm, tok, hf = smol
    sp = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=True, top_logprobs=5)
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, [sp, SamplingParams(max_tokens=8), sp])):
        if "logprobs" not in out:
            continue
        ids = tok(prompt).input_ids
        with torch.no_grad():
            logits = hf(torch.tensor([ids + out["token_ids"]])).logits[0, len(ids) - 1:-1].float()
        want = logits.log_softmax(-1)
        got = torch.tensor([lp.logprob for lp in out["logprobs"]])
        close(got, want[torch.arange(len(got)), torch.tensor(out["token_ids"])], tr("Greedy log-probabilities equal HF's log_softmax within 1e-4 ({prompt!r})", prompt=prompt), atol=1e-4)
        tops = torch.tensor([lp.top_logprobs for lp in out["logprobs"]])
        close(tops, want.topk(5, dim=-1).values, tr("top_logprobs equal HF's 5 largest within 1e-4"), atol=1e-4)
    expect("logprobs" in llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2))[0], False,
           tr("A request that did not ask gets no logprobs"))


def test_controls_survive_overlap_and_chunked_prefill(smol: tuple[Any, Any, Any]) -> None:
    llm, _, _ = smol
    sps = [SamplingParams(temperature=0.8, seed=11, max_tokens=TOKENS, ignore_eos=True, presence_penalty=1.2,
                          frequency_penalty=0.7, min_p=0.05, logprobs=True),
           SamplingParams(max_tokens=TOKENS, ignore_eos=True, repetition_penalty=1.4, logit_bias={"28": -100}),
           SamplingParams(temperature=0.9, seed=12, max_tokens=TOKENS, min_tokens=TOKENS - 2)]
    prompts = [p * 6 for p in PROMPTS]
    runs = {}
    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    try:
        for name, overlap, chunk in (("overlap", True, None), ("normal", False, None), ("chunked", True, 7)):
            ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
            llm.prefill_budget = chunk or llm.config.max_extend_tokens
            runs[name] = llm.generate(prompts, sps)
    finally:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved
        llm.prefill_budget = llm.config.max_extend_tokens
    for name in ("normal", "chunked"):
        expect([o["token_ids"] for o in runs[name]], [o["token_ids"] for o in runs["overlap"]],
               tr("With the controls in use, {name} gives the same tokens as overlap scheduling", name=name))
        close(torch.tensor([lp.logprob for lp in runs[name][0]["logprobs"]]),
              torch.tensor([lp.logprob for lp in runs["overlap"][0]["logprobs"]]), tr("... and the same log-probabilities ({name})", name=name), atol=1e-5)
    expect(28 in runs["overlap"][1]["token_ids"], False, tr("logit_bias -100 keeps token 28 out"))
    expect(len(runs["overlap"][2]["token_ids"]) >= TOKENS - 2, True, tr("min_tokens: no EOS before {n} tokens", n=TOKENS - 2))


# ----------------------------------------------------------------------------- 服务器 | en: the server


@pytest.fixture(scope="module")
def server(serve):  # noqa: ANN001, ANN201
    """模块共用的服务器：小 Qwen3，带 Radix 前缀缓存（n > 1 共享预填充要用到它）。

    en: The module's server: the tiny Qwen3 with the radix prefix cache (n > 1 shares its prefill through it).
    """
    return serve("--cache-type", "radix", "--page-size", "1")


@pytest.fixture(scope="module")
def tiny_hf(tiny_path: str) -> Any:
    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)


def hf_logprobs(hf: Any, prompt: list[int], output: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + output])).logits[0, len(prompt) - 1:-1].float()
    return logits.log_softmax(-1)


PROMPT_IDS = [785, 6722, 315, 9625, 374, 12095, 13, 576, 6722, 315, 9856, 374]


def test_server_logprobs_match_hf(server, tiny_hf: Any) -> None:  # noqa: ANN001
    status, body = server.post("/v1/completions", {"prompt": PROMPT_IDS, "max_tokens": 5, "temperature": 0, "ignore_eos": True,
                                                   "logprobs": 3})
    assert status == 200, body
    lp = body["choices"][0]["logprobs"]
    expect((len(lp["tokens"]), len(lp["token_logprobs"]), [len(t) for t in lp["top_logprobs"]], len(lp["text_offset"])),
           (5, 5, [3] * 5, 5), tr("Completions logprobs: four parallel lists, one entry per output token, 3 top entries each"))
    status, chat = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                                        "temperature": 0, "ignore_eos": True, "logprobs": True, "top_logprobs": 2})
    assert status == 200, chat
    content = chat["choices"][0]["logprobs"]["content"]
    expect((len(content), [len(c["top_logprobs"]) for c in content], sorted(content[0])),
           (4, [2] * 4, ["bytes", "logprob", "token", "top_logprobs"]), tr("Chat logprobs: one entry per token with token, logprob, bytes, top_logprobs"))
    # 数值对照 HF：HF 自己贪心生成的 token，和它在这些位置的 log_softmax | en: values against HF: HF's own greedy tokens and its log_softmax there
    with torch.no_grad():
        ref = tiny_hf.generate(torch.tensor([PROMPT_IDS]), max_new_tokens=5, do_sample=False,
                               attention_mask=torch.ones(1, len(PROMPT_IDS), dtype=torch.long))[0, len(PROMPT_IDS):].tolist()
    tok = AutoTokenizer.from_pretrained(tiny_model())
    expect(lp["tokens"], [tok.decode([t]) for t in ref], tr("The tokens of the logprobs are HF's greedy tokens, as text"))
    want = hf_logprobs(tiny_hf, PROMPT_IDS, ref)
    close(torch.tensor(lp["token_logprobs"]), want[torch.arange(5), torch.tensor(ref)],
          tr("Log-probabilities over HTTP equal HF's log_softmax within 1e-4"), atol=1e-4)
    top = want.topk(3, dim=-1)
    close(torch.tensor([sorted(t.values(), reverse=True) for t in lp["top_logprobs"]]), top.values,
          tr("top_logprobs over HTTP equal HF's 3 largest within 1e-4"), atol=1e-4)


def test_server_n_samples_share_one_prefill(server) -> None:  # noqa: ANN001
    prompt = list(range(2000, 2057))  # 前面的请求没用过的 token：缓存里没有 | en: tokens no earlier request used: not cached
    before = server.metrics()["minisgl_prefill_tokens_total"]
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 1.0, "seed": 5, "n": 4, "ignore_eos": True, "logprobs": 1}
    status, out = server.post("/v1/completions", body)
    assert status == 200, out
    computed = server.metrics()["minisgl_prefill_tokens_total"] - before
    expect(computed, len(prompt) + 3, tr("n=4 on a {n}-token prompt: the prompt is computed once, the other 3 samples prefill only their last token (prefill tokens counted by /metrics)", n=len(prompt)))
    expect([c["index"] for c in out["choices"]], [0, 1, 2, 3], tr("n=4 gives choices 0..3"))
    expect([len(c["logprobs"]["tokens"]) for c in out["choices"]], [6] * 4, tr("Every choice has its own log-probabilities"))
    expect(out["usage"], {"prompt_tokens": len(prompt), "completion_tokens": 24, "total_tokens": len(prompt) + 24},
           tr("usage counts the prompt once and every choice's tokens"))
    texts = [c["text"] for c in out["choices"]]
    expect(len(set(texts)) > 1, True, tr("The samples differ: each has a seed stream of its own"))
    status, again = server.post("/v1/completions", body)
    expect([c["text"] for c in again["choices"]], texts, tr("The same seed gives the same n samples again"))


def test_server_streams_several_choices(server) -> None:  # noqa: ANN001
    body = {"prompt": ["Once upon a time", "The sky is"], "max_tokens": 5, "temperature": 0, "n": 2, "echo": True,
            "presence_penalty": 1.5, "stream": True, "stream_options": {"include_usage": True}}
    resp = send_request(server, "/v1/completions", body).getresponse()
    events = read_events(resp, 200)
    expect(events[-1], "[DONE]", tr("One stream, ending in [DONE]"))
    expect(events.count("[DONE]"), 1, tr("Exactly one [DONE] for all choices"))
    chunks = [json.loads(e) for e in events[:-1]]
    texts: dict[int, str] = {}
    for c in chunks:
        for choice in c["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    expect(sorted(texts), [0, 1, 2, 3], tr("Two prompts × n=2: choices 0..3 in one stream"))
    expect([texts[k].startswith(p) for k, p in enumerate(["Once upon a time"] * 2 + ["The sky is"] * 2)], [True] * 4,
           tr("echo: each choice starts with its own prompt"))
    expect((texts[0] == texts[1], texts[2] == texts[3]), (True, True), tr("Greedy samples of one prompt are equal"))
    usage = [c for c in chunks if c.get("usage")]
    expect((len(usage), usage[-1]["usage"]["completion_tokens"] if usage else None), (1, 20),
           tr("One usage chunk at the end, summing the 4 choices' tokens"))


def test_server_refuses_bad_controls_then_serves(server) -> None:  # noqa: ANN001
    base = {"prompt": PROMPT_IDS, "max_tokens": 3}
    bad = [({"logprobs": 21}, "logprobs"), ({"logit_bias": {"5": 101}}, "logit_bias"), ({"logit_bias": {"999999": 1}}, None),
           ({"n": 0}, "n"), ({"n": 10_000}, "n"), ({"presence_penalty": 2.5}, "presence_penalty"),
           ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_tokens": 4}, "min_tokens"), ({"min_p": 1.5}, "min_p"),
           ({"echo": True, "logprobs": 1}, "echo")]
    for extra, param in bad:
        status, body = server.post("/v1/completions", {**base, **extra})
        expect((status, body.get("error", {}).get("param") if param else None), (400, param),
               tr("{extra} is a 400 naming {param}", extra=extra, param=param))
        expect(body["error"].get("code") is not None, True, tr("{extra}: the error has a code", extra=extra))
    status, body = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})
    expect((status, body["error"]["param"]), (400, "top_logprobs"), tr("top_logprobs without logprobs: true is a 400"))
    server.wait_metrics(lambda m: m["minisgl_active_requests"] == 0, tr("no active request after the refused ones"))
    status, body = server.post("/v1/completions", {**base, "logprobs": 2, "frequency_penalty": 1.0})
    expect((status, len(body["choices"][0]["logprobs"]["tokens"])), (200, 3), tr("After the refusals the server still serves a request with controls"))
