"""自推测（early exit）起草器（:mod:`minisgl.early_exit`）的检查：``speculative_algorithm="EARLY_EXIT"`` 的输出和不投机的
贪心解码逐 token 相同（验证保证它；先确认真的猜过、有的猜中了，免得“从来没猜”也能过）；起草器猜的链和稠密地用前 k 层
（Hugging Face 的 ``output_hidden_states``，接最后的归一化和 LM head）一步步算出的相同，包括分几次 ``put``、猜过之后
再 ``put`` 的情形；不合理的层数在加载模型之前就被拒绝，消息里有参数名。

en: Checks of the self-speculative (early-exit) drafter (:mod:`minisgl.early_exit`): the output of
``speculative_algorithm="EARLY_EXIT"`` equals plain greedy decoding token for token (verification guarantees it; each
check first makes sure drafts were made and some accepted, so that "never guessing" cannot pass); the chain the drafter
guesses equals the one computed densely step by step with the first k layers (Hugging Face's ``output_hidden_states``,
then the final norm and the LM head), also when the tokens come in several ``put`` calls and after a guess; an
unreasonable layer count is refused before any model loads, with the option's name in the message.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from checks.stage2.conftest import TINY_KW, built
from minisgl import model_zoo
from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.llm import LLM

pytestmark = pytest.mark.timeout(300)

#: tiny 模型的引擎参数，dtype 和 device 写明（与 Hugging Face 比对的检查都这样）。
#: en: the tiny model's engine settings, dtype and device stated (as every check comparing with Hugging Face does).
KW: dict[str, Any] = {**TINY_KW, "dtype": torch.float32, "device": "auto"}


def generate(path: str, prompts: list[list[int]], sp: SamplingParams, **kw: Any) -> tuple[list[list[int]], Any]:
    llm = LLM(path, **{**KW, **kw})
    try:
        return [o["token_ids"] for o in llm.generate(prompts, sp)], llm.loop.spec_stats
    finally:
        llm.shutdown()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "layer-by-layer"])
def test_tiny_model_token_equal_to_plain_greedy(fused: bool) -> None:
    """随机权重的 tiny 模型（2 层，用 1 层起草）：几乎猜不中，但输出必须和不投机时一样，而且确实猜过。

    en: The random tiny model (2 layers, drafting with 1): it hardly ever guesses right, but the output must equal
    plain decoding, and drafts must really have been made.
    """
    path, kw = built(model_zoo.tiny_qwen3), {"cpu_fused_decode": fused}
    prompts = [[1000 + 37 * i + j for j in range(9)] * 2 for i in range(3)]
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    want, _ = generate(path, prompts, sp, **kw)
    got, stats = generate(path, prompts, sp, speculative_algorithm="EARLY_EXIT", speculative_draft_layers=1, **kw)
    assert stats.proposed > 0, tr("no draft was ever proposed ({stats}), so this check proves nothing", stats=stats)
    assert got == want, tr("EARLY_EXIT output {got} against plain greedy decoding {want}", got=got, want=want)


def test_smollm2_token_equal_and_drafts_accepted() -> None:
    """SmolLM2（30 层，用 28 层起草，每次最多猜 3 个）照抄一段文字：没训练过的出口要很深才猜得中一些，输出和不投机时一样。

    en: SmolLM2 (30 layers, drafting with 28, at most 3 per guess) copying a passage: an untrained exit has to be deep to
    guess some right, and the output equals plain decoding.
    """
    path = built(model_zoo.smollm2)
    kw = dict(max_seq_len_override=256, num_page_override=512)
    llm = LLM(path, dtype=torch.float32, device="auto", **kw)
    try:
        text = "Copy this text exactly: the radix cache keeps the keys and values of every prefix it has seen."
        prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                   return_dict=False)
        sp = SamplingParams(max_tokens=16, ignore_eos=True)
        want = llm.generate([prompt], sp)[0]["token_ids"]
    finally:
        llm.shutdown()
    got, stats = generate(path, [prompt], sp, speculative_algorithm="EARLY_EXIT", speculative_draft_layers=28,
                          speculative_num_draft_tokens=4, **kw)
    assert stats.accepted > 0, tr("no draft token was ever accepted ({stats}), so this check proves nothing",
                                  stats=stats)
    assert got == [want], tr("EARLY_EXIT output {got} against plain greedy decoding {want}", got=got, want=[want])


@torch.inference_mode()
def dense_chain(hf: Any, tokens: list[int], layers: int, n: int) -> list[int]:
    """稠密的参考：整段序列过 Hugging Face 模型，取第 ``layers`` 层之后的隐藏状态，接最后的归一化和 LM head，贪心地
    一个一个往后猜 ``n`` 个。

    en: The dense reference: the whole sequence through the Hugging Face model, the hidden state after layer
    ``layers``, then the final norm and the LM head, guessing ``n`` tokens greedily one by one.
    """
    seq = list(tokens)
    for _ in range(n):
        out = hf(torch.tensor([seq], device=hf.device), output_hidden_states=True)
        h = out.hidden_states[layers][0, -1]
        seq.append(int(hf.lm_head(hf.model.norm(h)).argmax()))
    return seq[len(tokens):]


def test_the_chain_equals_a_dense_forward_of_the_first_layers() -> None:
    from checks.hf_reference import load_hf
    from minisgl.early_exit import EarlyExitDrafter

    path = built(model_zoo.tiny_qwen3)
    llm = LLM(path, **KW)
    try:
        drafter = EarlyExitDrafter(llm.engine, 1, 4)
        hf = load_hf(path)
        tokens = [1000 + 53 * j % 3000 for j in range(14)]
        # 一次写进整段，再猜
        # en: the whole sequence written at once, then a guess
        drafter.put(tokens[:10], 0, uid=7)
        got = list(drafter.propose(tokens[:10], uid=7).tokens)
        assert got == dense_chain(hf, tokens[:10], 1, 4), tr("the chain after {n} tokens put at once", n=10)
        # 猜过之后又来了别的 token（猜的 K/V 写在已知长度之后，要被盖掉）
        # en: after a guess other tokens arrive (the guess's K/V lie past the known length and must be overwritten)
        drafter.put(tokens, 10, uid=7)
        got = list(drafter.propose(tokens, uid=7).tokens)
        assert got == dense_chain(hf, tokens, 1, 4), tr("the chain after a guess and {n} more tokens put", n=4)
        # 另一个请求分开记
        # en: another request is kept apart
        other = tokens[::-1]
        drafter.put(other, 0, uid=8)
        assert list(drafter.propose(other, uid=8).tokens) == dense_chain(hf, other, 1, 4), tr(
            "the chain of a second request")
        drafter.drop(7)
        drafter.drop(8)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("bad", [
    dict(speculative_algorithm="EARLY_EXIT", speculative_draft_layers=0),
    dict(speculative_algorithm="EARLY_EXIT", speculative_draft_layers=2),  # the tiny model has 2 layers
    dict(speculative_algorithm="EARLY_EXIT", speculative_draft_layers="1"),
    dict(speculative_algorithm="NGRAM", speculative_draft_layers=1),
    dict(speculative_draft_layers=1),
])
def test_bad_draft_layers_are_refused_before_loading(bad: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import minisgl.engine

    def no_engine(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(tr("an engine was built before the settings were refused"))

    monkeypatch.setattr(minisgl.engine.Engine, "__init__", no_engine)
    with pytest.raises(ValueError, match="--speculative-draft-layers"):
        LLM(built(model_zoo.tiny_qwen3), **KW, **bad)


@pytest.mark.parametrize(("flags", "says"), [
    (["--speculative-draft-layers", "1"], "--speculative-draft-layers"),
    (["--speculative-algorithm", "NGRAM", "--speculative-draft-layers", "1"], "--speculative-draft-layers"),
    (["--speculative-algorithm", "EARLY_EXIT", "--speculative-draft-layers", "2"], "--speculative-draft-layers"),
    (["--speculative-algorithm", "EARLY_EXIT", "--speculative-ngram-capacity", "10"], "--speculative-ngram-capacity"),
    (["--speculative-algorithm", "EARLY_EXIT", "--tp", "2"], "EARLY_EXIT"),
])
def test_the_server_refuses_bad_draft_layer_flags(flags: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    from minisgl.server.args import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--model", built(model_zoo.tiny_qwen3), *flags])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert says in last, tr("the refusal of {flags} should name {says}: {last}", flags=flags, says=says, last=last)


def test_early_exit_on_several_ranks_is_refused_before_any_rank_starts() -> None:
    """起草器在每个秩上会猜得不一样（每个秩只有一部分注意力头和词表），所以 ``tp_size > 1`` 在起任何秩之前就拒绝。

    en: The drafter would guess differently on each rank (each holds part of the heads and vocabulary), so
    ``tp_size > 1`` is refused before any rank starts."""
    with pytest.raises(ValueError, match="EARLY_EXIT"):
        LLM(built(model_zoo.tiny_qwen3), **KW, tp_size=2, speculative_algorithm="EARLY_EXIT")


def test_the_server_takes_early_exit() -> None:
    from minisgl.server.args import parse_args

    kw = parse_args(["--model", built(model_zoo.tiny_qwen3), "--speculative-algorithm", "early_exit",
                     "--speculative-draft-layers", "1"]).scheduler_kwargs()
    assert (kw.get("speculative_algorithm"), kw.get("speculative_draft_layers")) == ("EARLY_EXIT", 1), tr(
        "scheduler settings {kw}", kw=kw)
