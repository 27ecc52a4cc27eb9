"""第 3.6 章 grammar 的检查：位掩码展开得和 xgrammar 自己的一样（符号位、词表不是 32 的倍数）；整理语法行
（输出行才约束、第一次出现才给新匹配器）；随机 logits 下采到的 token 每一步都被语法接受（性质测试），没有语法的行
不受影响，掩码在温度、对数概率和 top-p 之前；结束了的匹配器不再推进。再在 SmolLM2 上端到端：一组 JSON Schema
的输出都能解析并通过校验，重叠调度开关、分块预填充不改变结果；最后经 HTTP 用 ``response_format``，写错的 Schema
是 400。

en: Checks of chapter 3.6 grammar: the bitmask unpacks as xgrammar's own does (the sign bit, a vocabulary that is no
multiple of 32); gathering the grammar rows (only output rows are constrained, only a first appearance gets a new
matcher); with random logits every sampled token is accepted by the grammar (a property test), rows without a grammar
are unaffected, the mask comes before the temperature, the log-probabilities and top-p; a terminated matcher is not
advanced again. Then end to end on SmolLM2: the outputs for a set of JSON Schemas all parse and validate, and neither
overlap scheduling on/off nor chunked prefill changes them; last, ``response_format`` over HTTP, where a broken schema is
a 400.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator

import jsonschema
import pytest
import torch
import xgrammar as xgr
from hypothesis import given, settings, strategies as st
from transformers import AutoTokenizer

from checks.common import expect
from minisgl.core import Batch, Req, SamplingParams
from minisgl.env import ENV
from minisgl.i18n import tr

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
CHOICE = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
          "required": ["answer", "sure"]}


@pytest.fixture(scope="module")
def smol_tok(smollm2_path: str) -> Any:
    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def make_sampler(smol_tok: Any) -> Any:
    from minisgl.grammar import Sampler

    vocab = 49152
    eos = smol_tok.eos_token_id
    shared = Sampler(torch.device("cpu"), vocab, 0, rows=8, eos_token_id=eos, tokenizer=smol_tok)

    def make(seed: int = 0) -> Any:
        # 词表只预处理一次：新的采样器借用第一个的 backend | en: the vocabulary is preprocessed once: new samplers borrow the first one's backend
        s = Sampler(torch.device("cpu"), vocab, seed, rows=8, eos_token_id=eos, tokenizer=smol_tok)
        s._backend = shared.backend
        return s

    return make


@pytest.fixture(scope="module")
def decode(smol_tok: Any) -> Callable[[list[int]], str]:
    """分词器的 ``decode``，包成一个普通函数：Hypothesis 报反例时会打印每个参数，分词器本身要打印好几十行。

    en: The tokenizer's ``decode`` as a plain function: Hypothesis prints every argument of a falsifying example, and the
    tokenizer itself takes dozens of lines.
    """
    def decode(ids: list[int]) -> str:
        return smol_tok.decode(ids)

    return decode


def test_apply_bitmask_matches_xgrammar() -> None:
    from minisgl.grammar import apply_bitmask

    gen = torch.Generator().manual_seed(0)
    for vocab in (64, 100):
        words = -(-vocab // 32)
        bitmask = torch.randint(-2**31, 2**31 - 1, (2, words), generator=gen, dtype=torch.int64).to(torch.int32)
        bitmask[0, 0] = -1  # 符号位也是一个 token 的位 | en: the sign bit is one token's bit too
        bitmask[1, 0] = -2**31
        logits = torch.randn(4, vocab, generator=gen)
        want = logits.clone()
        full = torch.zeros(4, words, dtype=torch.int32)  # xgrammar 的位掩码按 logits 的行号排 | en: xgrammar's bitmask is laid out by logits row
        full[[3, 1]] = bitmask
        xgr.apply_token_bitmask_inplace(want, full, indices=[3, 1])
        got = apply_bitmask(logits.clone(), bitmask, [3, 1])
        expect(torch.isinf(got).tolist(), torch.isinf(want).tolist(),
               tr("vocab {vocab}: the tokens masked in each row are those xgrammar masks (bitmask row k belongs to rows[k])", vocab=vocab))
        expect(torch.equal(got[~torch.isinf(got)], logits[~torch.isinf(got)]), True, tr("Allowed tokens and other rows keep their logits"))


def make_req(prompt_len: int, sp: SamplingParams, table_idx: int, generated: int = 0, chunked: bool = False) -> Req:
    from minisgl.chunked_prefill import ChunkedReq

    ids = torch.arange(100, 100 + prompt_len + generated, dtype=torch.int32)
    req = (ChunkedReq if chunked else Req)(ids[:prompt_len], table_idx, 0, 64, table_idx, sp)
    if generated:
        req.input_ids = ids
        req.cached_len = prompt_len + generated - 1
        req.device_len = prompt_len + generated
    return req


def test_prepare_grammar(make_sampler: Any, smol_tok: Any) -> None:
    """哪些行受约束、谁拿到新的匹配器，只看行为：prepare 不碰任何匹配器；一步之后，第一次出现的行的槽里是一个新的
    匹配器（槽里上一个请求留下的被换掉），接着输出的行仍用它自己的那个，普通请求和提示词的中间块没有匹配器。

    en: Which rows are constrained and who gets a new matcher, judged by behaviour only: prepare touches no matcher;
    after one step, the slot of a row appearing for the first time holds a new matcher (the previous request's is
    replaced), a row that goes on keeps its own, and neither a plain request nor a chunk of a prompt has one.
    """
    sampler = make_sampler()
    js = SamplingParams(json_schema=json.dumps(PERSON))
    rx = SamplingParams(regex="(yes|no)")
    reqs = [make_req(4, SamplingParams(), 0), make_req(5, js, 1), make_req(6, rx, 2, generated=2), make_req(7, js, 3, chunked=True)]
    regex = sampler.backend.compiler.compile_regex("(yes|no)")
    stale, own = xgr.GrammarMatcher(regex), xgr.GrammarMatcher(regex)
    sampler.matchers.update({1: stale, 2: own})
    args = sampler.prepare(Batch(reqs, "prefill"))
    g = args.controls.grammar
    assert g is not None, tr("A batch with grammar rows gets a GrammarStep")
    expect(g.rows, [1, 2], tr("Only output rows with a grammar are constrained (not a plain request, not a chunk of a prompt)"))
    expect(sampler.matchers, {1: stale, 2: own}, tr("prepare runs on the scheduling thread and must not touch the request slots' matchers"))
    yes = smol_tok.encode("yes", add_special_tokens=False)[0]
    logits = torch.zeros(4, 49152)
    logits[:, yes] = 50.0
    sampler.sample(logits, args)
    got = {slot: ("own" if m is own else "stale" if m is stale else "new") for slot, m in sampler.matchers.items()}
    expect(got, {1: "new", 2: "own"}, tr("After one step: slot 1 (first output of its request) holds a new matcher in place "
                                          "of the previous request's, slot 2 (going on) keeps its own, and the plain request "
                                          "(slot 0) and the chunk (slot 3) get none"))
    expect(sampler.prepare_grammar(Batch([make_req(4, SamplingParams(), 0)], "prefill")), None, tr("No grammar row: None"))


def run_steps(sampler: Any, reqs: list[Req], logits_of: Any, steps: int) -> list[list[int]]:
    """跑几步（prepare → sample → 像调度器那样推进），返回每个请求采到的 token。

    en: Run a few steps (prepare → sample → advance as the scheduler does) and return the tokens each request got.
    """
    out: list[list[int]] = [[] for _ in reqs]
    for n in range(steps):
        args = sampler.prepare(Batch(reqs, "decode"))
        tokens = sampler.sample(logits_of(n), args)
        for k, (req, token) in enumerate(zip(reqs, tokens)):
            if req.can_decode:
                req.complete_one()
                req.append_host(token)
                out[k].append(int(token))
    return out


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), temperature=st.sampled_from([0.0, 0.7, 1.5]), top_p=st.sampled_from([1.0, 0.3]))
def test_every_sampled_token_is_accepted(make_sampler: Any, decode: Callable[[list[int]], str], seed: int, temperature: float,
                                         top_p: float) -> None:
    sampler = make_sampler(seed)
    sp = SamplingParams(temperature=temperature, top_p=top_p, seed=seed, max_tokens=60, json_schema=json.dumps(CHOICE))
    plain = SamplingParams(max_tokens=60)
    reqs = [make_req(3, sp, 0), make_req(3, plain, 1)]
    gen = torch.Generator().manual_seed(seed)
    logits = [torch.randn(2, 49152, generator=gen) * 4 for _ in range(24)]
    got = run_steps(sampler, reqs, lambda n: logits[n].clone(), 24)
    reference = xgr.GrammarMatcher(sampler.backend.compiler.compile_json_schema(json.dumps(CHOICE), any_whitespace=False))
    for n, token in enumerate(got[0]):
        if reference.is_terminated():
            break
        assert reference.accept_token(token), tr("Step {n}: the grammar refuses sampled token {token} ({text!r}); output so far {so_far!r}",
                                                  n=n, token=token, text=decode([token]), so_far=decode(got[0][:n]))
    expect(got[1], [int(x[1].argmax()) for x in logits], tr("The row without a grammar is not masked (greedy: plain argmax every step)"))


def test_mask_comes_before_temperature_logprobs_and_top_p(make_sampler: Any) -> None:
    sampler = make_sampler(3)
    sp = SamplingParams(temperature=0.5, top_p=0.2, logprobs=True, top_logprobs=5, regex="(yes|no)")
    req = make_req(3, sp, 0)
    logits = torch.zeros(1, 49152)
    logits[0, :1000] = 30.0  # 很可能、却都不允许的 token | en: very likely tokens, none of them allowed
    args = sampler.prepare(Batch([req], "decode"))
    token = int(sampler.sample(logits.clone(), args)[0])
    allowed = xgr.GrammarMatcher(sampler.backend.compiler.compile_regex("(yes|no)"))
    expect(allowed.accept_token(token), True, tr("Even with top_p 0.2 over very likely forbidden tokens, the sampled token is allowed: the mask comes first"))
    lp = args.controls.logprobs.of(0)
    mass = torch.tensor(lp.top_logprobs).exp().sum().item()
    expect(round(mass, 3) <= 1.0 and all(allowed_token(sampler, t) for t in lp.top_ids), True,
           tr("The top log-probabilities are over allowed tokens only (the distribution drawn from)"))


def allowed_token(sampler: Any, token: int) -> bool:
    m = xgr.GrammarMatcher(sampler.backend.compiler.compile_regex("(yes|no)"))
    return m.accept_token(token)


def test_terminated_matcher_is_left_alone(make_sampler: Any, smol_tok: Any) -> None:
    sampler = make_sampler()
    sp = SamplingParams(regex="(yes|no)")
    req = make_req(3, sp, 5)
    yes = smol_tok.encode("yes", add_special_tokens=False)
    eos = smol_tok.eos_token_id

    def logits_of(n: int) -> torch.Tensor:
        logits = torch.zeros(1, 49152)
        logits[0, (yes + [eos, eos, 7])[min(n, len(yes) + 2)]] = 50.0
        return logits

    got = run_steps(sampler, [req], logits_of, len(yes) + 3)
    expect(got[0][:len(yes) + 1], yes + [eos], tr("The grammar lets 'yes' and then the end token through"))
    expect(sampler.matchers[5].is_terminated(), True, tr("After the end token the matcher has terminated"))
    expect(got[0][len(yes) + 1:], [eos, 7], tr("Steps after the end (in flight under overlap) are not masked and do not advance the terminated matcher"))


def test_a_refused_token_is_an_error(make_sampler: Any, smol_tok: Any) -> None:
    sampler = make_sampler()
    args = sampler.prepare(Batch([make_req(3, SamplingParams(regex="(yes|no)"), 2)], "decode"))
    sampler.mask_grammar(torch.zeros(1, 49152), args.controls)
    bad = smol_tok.encode(" maybe", add_special_tokens=False)[0]
    with pytest.raises(RuntimeError):
        sampler.advance(torch.tensor([bad]), args.controls)


# ----------------------------------------------------------------------------- 端到端 | en: end to end


@pytest.fixture(scope="module")
def smol(smollm2_path: str) -> Iterator[Any]:
    from minisgl.llm import LLM

    llm = LLM(smollm2_path, dtype=torch.float32, device="cpu", max_running_req=8, num_page_override=2048,
              max_seq_len_override=512)
    yield llm
    llm.shutdown()


SCHEMAS = [PERSON, CHOICE,
           {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "facts": {
               "type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 2}}, "required": ["city", "facts"]},
           {"type": "object", "properties": {"x": {"type": "number"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                                                               "maxItems": 3}}, "required": ["x", "tags"]}]
QUESTIONS = ["Describe Ann, who is 31.", "Is the sky blue?", "Tell me about Paris.", "Give me a number and some tags."]


def test_json_schema_outputs_parse_and_validate(smol: Any, smol_tok: Any) -> None:
    prompts = [smol_tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                            return_dict=False) for q in QUESTIONS]
    sps = [SamplingParams(max_tokens=96, json_schema=json.dumps(s)) for s in SCHEMAS]
    sps += [SamplingParams(max_tokens=96, temperature=0.8, seed=i, json_schema=json.dumps(s)) for i, s in enumerate(SCHEMAS)]
    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    runs = {}
    try:
        for name, overlap, chunk in (("overlap", True, None), ("normal", False, None), ("chunked", True, 9)):
            ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
            smol.prefill_budget = chunk or smol.config.max_extend_tokens
            runs[name] = [o["text"] for o in smol.generate(prompts * 2, sps)]
    finally:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved
        smol.prefill_budget = smol.config.max_extend_tokens
    for name, texts in runs.items():
        for text, schema in zip(texts, SCHEMAS * 2):
            try:
                jsonschema.validate(json.loads(text), schema)
            except (ValueError, jsonschema.ValidationError) as e:
                pytest.fail(tr("Run {run!r} (the runs share one engine: from the second on, every prompt is a prefix-cache hit): the output {text!r} does not follow its schema {schema}: {error}",
                               run=name, text=text, schema=schema, error=e), pytrace=False)
    expect(runs["normal"], runs["overlap"], tr("The constrained outputs with overlap scheduling off (got) equal those with it on (expected)"))
    expect(runs["chunked"], runs["overlap"], tr("The constrained outputs with chunked prefill (got) equal those without (expected)"))


@pytest.fixture(scope="module")
def server(serve):  # noqa: ANN001, ANN201
    return serve()


def test_response_format_over_http(server) -> None:  # noqa: ANN001
    chat = {"messages": [{"role": "user", "content": "Is it raining?"}], "max_tokens": 40, "temperature": 0.9, "seed": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "choice", "schema": CHOICE}}}
    status, body = server.post("/v1/chat/completions", chat)
    assert status == 200, body
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), CHOICE)
    expect(body["choices"][0]["finish_reason"], "stop", tr("A complete JSON ends the answer with finish_reason stop"))
    status, body = server.post("/v1/completions", {"prompt": "Answer:", "max_tokens": 10, "regex": "(yes|no)", "n": 2, "temperature": 1.0})
    expect([c["text"] in ("yes", "no") for c in body["choices"]], [True, True], tr("regex (yes|no): each of n=2 choices is yes or no"))
    bad = dict(chat, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
    status, body = server.post("/v1/chat/completions", bad)
    expect((status, body["error"]["param"]), (400, "response_format"), tr("An invalid schema is a 400 naming response_format"))
    status, body = server.post("/v1/chat/completions", dict(chat, response_format={"type": "xml"}))
    expect((status, body["error"]["param"]), (400, "response_format"), tr("An unknown response_format type is a 400"))
    server.wait_metrics(lambda m: m["minisgl_active_requests"] == 0, tr("no active request after the refused ones"))
