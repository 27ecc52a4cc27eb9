"""第 3.2 章 tokenizer 的检查：增量反分词（hypothesis：随机 token id——汉字、emoji、拆成单个字节的字符、整个词表——
逐段拼起来等于整段解码，完整文字里没有的 U+FFFD 不会出现在任何一段里，能确定的文字不多扣）；需要上下文的分词器
（SentencePiece 式：开头的空格在单独解码时会丢）；状态在结束时释放、结束后的消息不建状态；停止字符串（跨两个 token、
部分匹配后又分岔、多个取最早）；finish_reason 与 token 计数；三种提示词的分词（和 ``LLM.generate``、分词器自己的
对话模板一致）；以及真正的分词进程：用 ZMQ 扮演 API 服务器和调度器跟它对话，最后 SIGTERM 让它干净退出。

en: Checks of chapter 3.2 tokenizer: incremental detokenization (hypothesis: random token ids — Chinese characters,
emoji, characters split into single bytes, the whole vocabulary — whose pieces join to the full decode, with no U+FFFD
in any piece unless the full text has one, and no settled text held back); a tokenizer that needs context
(SentencePiece style: a leading space is lost when decoded alone); state freed at finish and no state created after it;
stop strings (across two tokens, a partial match that then diverges, the earliest of several); finish_reason and the
token counts; tokenizing the three kinds of prompt (as ``LLM.generate`` and the tokenizer's own chat template do); and
the real tokenizer process: the test plays the API server and the scheduler over ZMQ, then SIGTERM makes it exit
cleanly.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import time
from multiprocessing.connection import Connection
from functools import lru_cache
from typing import Any
from unittest import mock

import psutil
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from minisgl.core import SamplingParams
from minisgl.course import select
from minisgl.i18n import tr
from minisgl.message import (
    AbortBackendMsg,
    AbortMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    RejectMsg,
    TokenizeMsg,
    UserMsg,
    UserReply,
    ZmqPullQueue,
    ZmqPushQueue,
    make_ipc_dir,
    unwrap,
)
from minisgl.server.args import ServerAddrs, ServerArgs
from minisgl.tokenizer import DetokenizeManager, TokenizeManager, process_messages, tokenize_worker
from minisgl.validation import validate_requests

#: 检查里唯一的中文句子（也是第 2 阶段用过的提示词）。
#: en: The one Chinese sentence of the checks (a prompt stage 2 used too).
PROMPT_ZH = "今天天气很好，我们"
FFFD = "\ufffd"


@lru_cache(maxsize=None)
def load(path: str) -> Any:
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def qwen(tiny_path: str) -> Any:
    return load(tiny_path)


# ----------------------------------------------------------------------------- 一个 SentencePiece 式的小分词器
# en: ----------------------------------------------------------------------------- a small SentencePiece-style tokenizer

SP_WORDS = ["▁Hello", "▁world", "▁", "Hello", ",", "▁peace", "▁a", "b", "!", "\n", "▁the"]


def sentencepiece_style() -> Any:
    """和 Llama / Mistral 一样的解码链（``▁`` → 空格、字节回退 ``<0xE4>``、去掉开头的一个空格）的小分词器。
    单独解码一段后缀时，第一个词前面的空格会丢：``decode([▁world]) == "world"``。

    en: A small tokenizer with the decoding chain of Llama / Mistral (``▁`` → space, byte fallback ``<0xE4>``, strip one
    leading space). A suffix decoded alone loses the space before its first word: ``decode([▁world]) == "world"``.
    """
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    vocab.update({w: 259 + i for i, w in enumerate(SP_WORDS)})
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


SP = sentencepiece_style()


def bytes_to_unicode() -> dict[int, str]:
    """字节级 BPE（GPT-2、Qwen、SmolLM2）里每个字节对应的那个字符（它就是这个字节的 token 名）。

    en: The character each byte maps to in byte-level BPE (GPT-2, Qwen, SmolLM2): the name of that byte's token.
    """
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_IDS: dict[int, dict[int, int]] = {}


def byte_ids(tok: Any) -> dict[int, int]:
    """字节 → 它的 token id（分词器有的那些字节；SmolLM2 没有几个控制字符和 UTF-8 里用不到的字节）。

    en: byte → its token id (for the bytes the tokenizer has; SmolLM2 lacks a few control characters and bytes UTF-8
    never uses).
    """
    if tok is SP:
        return {b: 3 + b for b in range(256)}
    if id(tok) not in _BYTE_IDS:
        chars = bytes_to_unicode()
        ids = dict(zip(range(256), tok.convert_tokens_to_ids([chars[b] for b in range(256)])))
        _BYTE_IDS[id(tok)] = {b: i for b, i in ids.items() if i is not None and i != tok.unk_token_id}
    return _BYTE_IDS[id(tok)]


def as_bytes(tok: Any, text: str) -> list[int]:
    """把文字拆成一个字节一个 token。

    en: Split a text into one token per byte.
    """
    table = byte_ids(tok)
    return [table[b] for b in text.encode()]


def words(tok: Any, *chunks: str) -> list[int]:
    """每段恰好一个 token 的 id（先确认分词器确实这样分）。

    en: The ids of chunks that are one token each (checking first that the tokenizer really splits them so).
    """
    if tok is SP:
        return [259 + SP_WORDS.index(c) for c in chunks]
    ids = [tok.encode(c, add_special_tokens=False) for c in chunks]
    assert all(len(i) == 1 for i in ids), tr("Test setup: each chunk should be one token: {ids}", ids=ids)
    return [i[0] for i in ids]


# ----------------------------------------------------------------------------- 驱动反分词
# en: ----------------------------------------------------------------------------- driving the detokenizer


def stream(manager: Any, uid: int, ids: list[int], finish: str = "length") -> list[Any]:
    """把 ``ids`` 一个一个送进 ``manager``（最后一个带 ``finish``；``"stop"`` 时再多送一条，``next_token`` 为 -1，
    像调度器在 EOS 处那样），返回每一步的回复（None 表示没有回复）。

    en: Feed ``ids`` into ``manager`` one by one (the last one with ``finish``; for ``"stop"`` one more message whose
    ``next_token`` is -1, as the scheduler sends at EOS) and return each step's reply (None for no reply).
    """
    msgs = [DetokenizeMsg(uid, t) for t in ids]
    if finish == "length":
        msgs[-1] = DetokenizeMsg(uid, ids[-1], True, "length")
    else:
        msgs.append(DetokenizeMsg(uid, -1, True, finish))
    return [manager.detokenize(m) for m in msgs]


def check_pieces(tok: Any, ids: list[int], replies: list[Any], *, valid_text: bool) -> None:
    """每一段都是新的、完整的文字：拼起来等于整段解码；没结束前的一段不以 U+FFFD 结尾；某一步为止的解码若不以 U+FFFD
    结尾，已发出的就正好是它（不多扣）；``valid_text`` 时任何一段都没有 U+FFFD。

    en: Every piece is new, complete text: they join to the full decode; a piece before the end never ends with U+FFFD;
    when the decode up to some step does not end with U+FFFD, what has been sent is exactly that (nothing held back
    needlessly); with ``valid_text`` no piece holds U+FFFD at all.
    """
    assert all(isinstance(r, UserReply) for r in replies), tr("Every message of a live request gets a UserReply, got {replies}", replies=replies)
    pieces = [r.incremental_output for r in replies]
    full = tok.decode(ids)
    assert "".join(pieces) == full, tr("The pieces {pieces} join to {joined!r}, but the full decode is {full!r}", pieces=pieces,
                                       joined="".join(pieces), full=full)
    for k in range(len(ids) - 1):
        sent = "".join(pieces[:k + 1])
        assert not pieces[k].endswith(FFFD), tr("Piece {k} {piece!r} ends with U+FFFD: an incomplete character must be held back", k=k, piece=pieces[k])
        prefix = tok.decode(ids[:k + 1])
        if not prefix.endswith(FFFD):
            assert sent == prefix, tr("After token {k} the text {prefix!r} is complete, but only {sent!r} was sent (held back too much)",
                                      k=k, prefix=prefix, sent=sent)
    if valid_text:
        bad = [p for p in pieces if FFFD in p]
        assert not bad, tr("Pieces with U+FFFD {bad} although the full text {full!r} has none", bad=bad, full=full)


# ----------------------------------------------------------------------------- hypothesis：随机 token id
# en: ----------------------------------------------------------------------------- hypothesis: random token ids

chars = st.one_of(
    st.sampled_from(list(" \nab,.!?Hello world") + ["\u200d"]),
    st.integers(0x4E00, 0x9FFF).map(chr),  # 汉字 | en: CJK ideographs
    st.integers(0x1F300, 0x1FAFF).map(chr),  # emoji
    st.integers(0xC0, 0x24F).map(chr),  # 带重音的拉丁字母 | en: accented Latin letters
)
#: 一段文字，要么按分词器的正常分法，要么拆成一个字节一个 token。
#: en: A piece of text, either tokenized normally or split into one token per byte.
units = st.tuples(st.sampled_from(["encode", "bytes"]), st.text(chars, min_size=1, max_size=4))
finishes = st.sampled_from(["length", "stop"])
#: 固定种子（CI 每次跑同样的用例）；不做 explain 阶段（失败时它要再跑很多遍）。
#: en: A fixed seed (CI runs the same cases every time); no explain phase (on a failure it reruns many times).
HYPO = settings(max_examples=150, deadline=None, derandomize=True, print_blob=True,
                phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def ids_from_units(tok: Any, parts: list[tuple[str, str]]) -> list[int]:
    out: list[int] = []
    for how, text in parts:
        if how == "bytes" or tok is SP:
            out += as_bytes(tok, text) if not (tok is SP and text in SP_WORDS) else words(tok, text)
        else:
            out += tok.encode(text, add_special_tokens=False)
    return out


def run_valid_text(tok: Any, parts: list[tuple[str, str]], finish: str) -> None:
    ids = ids_from_units(tok, parts)
    manager = DetokenizeManager(tok)
    manager.add(1, 5)
    replies = stream(manager, 1, ids, finish)
    check_pieces(tok, ids, replies, valid_text=True)
    assert manager.decode_map == {}, tr("The state is freed when the request finishes: {left}", left=manager.decode_map)


def run_random_ids(tok: Any, ids: list[int], finish: str) -> None:
    manager = DetokenizeManager(tok)
    manager.add(1, 5)
    replies = stream(manager, 1, ids, finish)
    check_pieces(tok, ids, replies, valid_text=FFFD not in tok.decode(ids))
    assert replies[-1].completion_tokens == len(ids), tr("completion_tokens counts the output tokens ({n}), got {got}", n=len(ids),
                                                          got=replies[-1].completion_tokens)


@HYPO
@given(parts=st.lists(units, min_size=1, max_size=8), finish=finishes)
def test_valid_text_pieces_qwen3(tiny_path: str, parts: list[tuple[str, str]], finish: str) -> None:
    run_valid_text(load(tiny_path), parts, finish)


@HYPO
@given(parts=st.lists(units, min_size=1, max_size=8), finish=finishes)
def test_valid_text_pieces_smollm2(smollm2_path: str, parts: list[tuple[str, str]], finish: str) -> None:
    run_valid_text(load(smollm2_path), parts, finish)


@HYPO
@given(parts=st.lists(st.tuples(st.just("bytes"), st.text(chars, min_size=1, max_size=3)) | st.tuples(st.just("bytes"), st.sampled_from(SP_WORDS)),
                      min_size=1, max_size=8), finish=finishes)
def test_valid_text_pieces_sentencepiece_style(parts: list[tuple[str, str]], finish: str) -> None:
    run_valid_text(SP, parts, finish)


def draw_ids(tok: Any, data: st.DataObject) -> list[int]:
    """1 到 12 个随机 token id：整个词表里任取，或者取单字节的 token（专门凑出不完整的 UTF-8）。

    en: 1 to 12 random token ids: anywhere in the vocabulary, or single-byte tokens (to make incomplete UTF-8 on purpose).
    """
    table = byte_ids(tok)
    return data.draw(st.lists(st.integers(0, len(tok) - 1) | st.sampled_from(sorted(table.values())), min_size=1, max_size=12))


@HYPO
@given(data=st.data(), finish=finishes)
def test_random_ids_join_to_full_decode_qwen3(tiny_path: str, data: st.DataObject, finish: str) -> None:
    qwen = load(tiny_path)
    run_random_ids(qwen, draw_ids(qwen, data), finish)


@HYPO
@given(data=st.data(), finish=finishes)
def test_random_ids_join_to_full_decode_smollm2(smollm2_path: str, data: st.DataObject, finish: str) -> None:
    smollm2 = load(smollm2_path)
    run_random_ids(smollm2, draw_ids(smollm2, data), finish)


def test_held_back_bytes_of_one_character(qwen: Any) -> None:
    """“好”的 3 个字节、一个 emoji 的 4 个字节逐个送来：前几个字节没有回复文字，最后一个字节把整个字符一次给出。

    en: The 3 bytes of one Chinese character and the 4 bytes of an emoji, one at a time: the first bytes give no text,
    the last one gives the whole character at once.
    """
    hao, smile = PROMPT_ZH[4 + 1], "\U0001F600"
    for tok in (qwen, SP):
        manager = DetokenizeManager(tok)
        manager.add(3, 1)
        ids = as_bytes(tok, hao) + as_bytes(tok, smile) + words(tok, "!" if tok is SP else " world")
        pieces = [r.incremental_output for r in stream(manager, 3, ids)]
        tail = "!" if tok is SP else " world"
        assert pieces == ["", "", hao, "", "", "", smile, tail], tr("Byte by byte the pieces should be {want}, got {got}",
                                                                    want=["", "", hao, "", "", "", smile, tail], got=pieces)


def test_context_keeps_the_leading_space() -> None:
    """SentencePiece 式的分词器单独解码 ``▁world`` 得到 ``world``：新 token 要连同前面已确定的 token 一起解码，
    再减去前面那段的文字，才能得到 `` world``。

    en: A SentencePiece-style tokenizer decodes ``▁world`` alone as ``world``: a new token must be decoded together with
    the settled tokens before it, and their text taken off, to get `` world``.
    """
    assert SP.decode(words(SP, "▁world")) == "world"
    ids = words(SP, "▁Hello", "▁world", ",", "▁peace", "▁", "▁a")
    manager = DetokenizeManager(SP)
    manager.add(1, 1)
    pieces = [r.incremental_output for r in stream(manager, 1, ids)]
    assert pieces == ["Hello", " world", ",", " peace", " ", " a"], tr("The pieces should keep their leading spaces: got {pieces}", pieces=pieces)
    assert "".join(pieces) == SP.decode(ids)


# ----------------------------------------------------------------------------- 状态、结束、计数
# en: ----------------------------------------------------------------------------- state, finishing, counts


def test_state_freed_and_stale_messages_create_none(qwen: Any) -> None:
    manager = DetokenizeManager(qwen)
    assert manager.detokenize(DetokenizeMsg(9, 1879)) is None and manager.decode_map == {}, (
        tr("A message for a request that was never tokenized gives no reply and creates no state"))
    manager.add(1, 4)
    manager.add(2, 6)
    ids = words(qwen, " Hello", " world")
    replies = stream(manager, 1, ids)
    assert replies[-1].finished and set(manager.decode_map) == {2}, tr("Request 1 finished: only request 2 keeps state, got {uids}",
                                                                        uids=sorted(manager.decode_map))
    # 重叠调度为已结束的请求多算的一步，以及它之后的消息
    # en: The extra step overlap scheduling computes for a finished request, and messages after it
    for stale in (DetokenizeMsg(1, 11), DetokenizeMsg(1, 11, True, "length"), DetokenizeMsg(1, -1, True, "stop")):
        got = manager.detokenize(stale)
        assert got is None, tr("A message after the finish gives no reply, got {got}", got=got)
        assert set(manager.decode_map) == {2}, tr("A message after the finish creates no state, got {uids}", uids=sorted(manager.decode_map))
    reply = manager.detokenize(DetokenizeMsg(2, ids[0]))
    assert reply.incremental_output == " Hello" and not reply.finished, tr("The other request goes on untouched, got {reply}", reply=reply)


@pytest.mark.parametrize("finish", ["length", "stop"])
def test_finish_reason_and_usage(qwen: Any, finish: str) -> None:
    manager = DetokenizeManager(qwen)
    manager.add(4, 17)
    ids = words(qwen, " Hello", " world", ",", " peace")
    replies = stream(manager, 4, ids, finish)
    for r in replies[:-1]:
        assert not r.finished and r.finish_reason is None and r.uid == 4, tr("Replies before the last are not finished and have no finish_reason: {reply}", reply=r)
    last = replies[-1]
    assert last.finished and last.finish_reason == finish, tr("The last reply is finished with finish_reason {want!r}: {reply}", want=finish, reply=last)
    assert (last.prompt_tokens, last.completion_tokens) == (17, len(ids)), (
        tr("Usage: prompt_tokens {p} and completion_tokens {c} (EOS is not output), got {reply}", p=17, c=len(ids), reply=last))
    text = "".join(r.incremental_output for r in replies)
    assert text == " Hello world, peace", tr("EOS is not decoded: got {text!r}", text=text)
    assert manager.decode_map == {}


# ----------------------------------------------------------------------------- 停止字符串
# en: ----------------------------------------------------------------------------- stop strings


def run_stop(tok: Any, stop: list[str], chunks: list[str]) -> tuple[list[str], Any, DetokenizeManager]:
    manager = DetokenizeManager(tok)
    manager.add(5, 3, stop)
    replies = [manager.detokenize(DetokenizeMsg(5, t, i == len(chunks) - 1, "length" if i == len(chunks) - 1 else None))
               for i, t in enumerate(words(tok, *chunks))]
    live = [r for r in replies if r is not None]
    return [r.incremental_output for r in live], live[-1], manager


STOP_CASES = [
    # (停止字符串, 每步一个 token 的文字, 应得的各段, 是否命中)
    # en: (stop strings, the text of one token per step, the pieces, hit?)
    (["lo wor"], [" Hello", " world", ","], [" Hel", ""], True),  # 跨两个 token | en: across two tokens
    (["world peace"], [" Hello", " world", ",", " peace"], [" Hello", " ", "world,", " peace"], False),  # 部分匹配后分岔 | en: partial, then diverges
    (["peace and"], [" Hello", " peace"], [" Hello", " peace"], False),  # 结束时扣住的放出 | en: released at the finish
    (["wor"], [" Hello", " world", ","], [" Hello", " "], True),  # 匹配后面的文字不发 | en: the text after the match is never sent
    (["ld", "o w"], [" Hello", " world", ","], [" Hell", ""], True),  # 取最早的一处 | en: the earliest occurrence wins
    (["\n\n", ", p"], [" Hello", "\n", " world", ",", " peace"], [" Hello", "", "\n world", "", ""], True),
    (["o w", "lo wor"], [" Hello", " world"], [" Hel", ""], True),  # 扣住最长的部分匹配 | en: hold back the longest partial match
]


@pytest.mark.parametrize("case", range(len(STOP_CASES)))
def test_stop_strings(qwen: Any, case: int) -> None:
    stop, chunks, want, hit = STOP_CASES[case]
    pieces, last, manager = run_stop(qwen, stop, chunks)
    assert pieces == want, tr("Stop strings {stop} over the tokens {chunks}: the pieces should be {want}, got {got}",
                              stop=stop, chunks=chunks, want=want, got=pieces)
    assert last.finished, tr("The request finishes (by the stop string or at its last token)")
    assert last.finish_reason == ("stop" if hit else "length"), tr("finish_reason should be {want!r}, got {got!r}",
                                                                   want="stop" if hit else "length", got=last.finish_reason)
    assert last.completion_tokens == len(want), tr("completion_tokens counts the tokens received ({n}), got {got}", n=len(want), got=last.completion_tokens)
    assert manager.decode_map == {}, tr("The state is freed when a stop string is hit")
    if hit:
        full = qwen.decode(words(qwen, *chunks))
        cut = min(i for i in (full.find(s) for s in stop) if i >= 0)
        assert "".join(pieces) == full[:cut], tr("The text is cut right before the stop string: want {want!r}, got {got!r}",
                                                  want=full[:cut], got="".join(pieces))


def test_stop_string_in_chinese_split_into_bytes(qwen: Any) -> None:
    stop = PROMPT_ZH[4:6]
    for tok in (qwen, SP):
        manager = DetokenizeManager(tok)
        manager.add(6, 2, [stop])
        replies = stream(manager, 6, as_bytes(tok, PROMPT_ZH))
        live = [r for r in replies if r is not None]
        text = "".join(r.incremental_output for r in live)
        assert text == PROMPT_ZH[:4] and live[-1].finish_reason == "stop", (
            tr("Stop string {stop!r} in {text!r} sent byte by byte: the output should be {want!r} with finish_reason 'stop', got {got!r} / {reason!r}",
               stop=stop, text=PROMPT_ZH, want=PROMPT_ZH[:4], got=text, reason=live[-1].finish_reason))
        assert all(FFFD not in r.incremental_output for r in live)
        assert len(live) == len(PROMPT_ZH[:6].encode()), tr("After the stop string no more replies come (got {n})", n=len(live))


# ----------------------------------------------------------------------------- 一轮消息的处理
# en: ----------------------------------------------------------------------------- handling one turn of messages


def test_three_kinds_of_prompt(qwen: Any) -> None:
    tm, dm = TokenizeManager(qwen), DetokenizeManager(qwen)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT_ZH}]
    text = "The capital of France is"
    want = {
        1: validate_requests([text], None, tokenizer=qwen, max_seq_len=10**6)[0][0].tolist(),
        2: list(qwen.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)),
        3: [9707, 1879, 0],
    }
    sp = SamplingParams(max_tokens=3)
    backend, frontend = process_messages([TokenizeMsg(1, text, sp, 512), TokenizeMsg(2, chat, sp, 512), TokenizeMsg(3, [9707, 1879, 0], sp, 512)], tm, dm)
    assert frontend == [] and [type(m) for m in backend] == [UserMsg] * 3, tr("Three prompts give three UserMsg and no reply: {backend} / {frontend}",
                                                                          backend=backend, frontend=frontend)
    for m in backend:
        assert m.input_ids.dtype == torch.int32 and m.input_ids.dim() == 1 and m.sampling_params == sp
        assert m.input_ids.tolist() == want[m.uid], tr("Prompt {uid}: the token ids should be {want}, got {got}", uid=m.uid, want=want[m.uid],
                                                       got=m.input_ids.tolist())
    _, frontend = process_messages([DetokenizeMsg(uid, 11, True, "length") for uid in (1, 2, 3)], tm, dm)
    assert [(r.uid, r.prompt_tokens, r.completion_tokens) for r in frontend] == [(u, len(want[u]), 1) for u in (1, 2, 3)], (
        tr("The finished replies carry prompt_tokens from the tokenizer: got {got}", got=[(r.uid, r.prompt_tokens, r.completion_tokens) for r in frontend]))


def test_stop_hit_aborts_the_request_at_the_scheduler(qwen: Any) -> None:
    tm, dm = TokenizeManager(qwen), DetokenizeManager(qwen)
    hello, world = words(qwen, " Hello", " world")
    backend, _ = process_messages([TokenizeMsg(1, "a", SamplingParams(), 512, ["wor"]), TokenizeMsg(2, "b", SamplingParams(), 512, ["wor"])], tm, dm)
    assert len(backend) == 2
    backend, frontend = process_messages([
        DetokenizeMsg(1, hello), DetokenizeMsg(2, hello),
        DetokenizeMsg(1, world),  # 命中，调度器还在跑它 | en: a hit while the scheduler still runs it
        DetokenizeMsg(2, world, True, "length"),  # 命中，但调度器已经结束了它 | en: a hit, but the scheduler has finished it
        DetokenizeMsg(1, hello),  # 取消到达之前调度器多算的一步 | en: a step the scheduler computed before the abort arrived
    ], tm, dm)
    assert backend == [AbortBackendMsg(1)], tr("A stop-string hit aborts the request at the scheduler, only if the scheduler has not finished it: got {backend}",
                                               backend=backend)
    assert [(r.uid, r.incremental_output, r.finished, r.finish_reason) for r in frontend] == [
        (1, " Hello", False, None), (2, " Hello", False, None), (1, " ", True, "stop"), (2, " ", True, "stop")], (
        tr("Replies: got {frontend}", frontend=frontend))
    assert dm.decode_map == {}


def test_reject_abort_and_bad_prompts_are_answered(qwen: Any) -> None:
    tm, dm = TokenizeManager(qwen), DetokenizeManager(qwen)
    backend, frontend = process_messages([
        TokenizeMsg(1, "hello there", SamplingParams(), 512),
        TokenizeMsg(2, "x", SamplingParams(), 512),
        TokenizeMsg(3, "y", SamplingParams(), 512),
        TokenizeMsg(4, "", SamplingParams(), 512),
        TokenizeMsg(5, [len(qwen) + 5], SamplingParams(), 512),
        TokenizeMsg(6, 3.5, SamplingParams(), 512),  # type: ignore[arg-type]
        TokenizeMsg(7, "hello there", SamplingParams(), 2),  # 达到长度上限 | en: reaches the length limit
        TokenizeMsg(8, "x", SamplingParams(max_tokens=5), 5),  # 1 + 5 > 5
        TokenizeMsg(9, "x", SamplingParams(logit_bias={str(len(qwen) + 1): 1.0}), 512),
    ], tm, dm)
    assert [m.uid for m in backend] == [1, 2, 3], tr("Only the good prompts reach the scheduler: {backend}", backend=backend)
    got = [(r.uid, r.finished, bool(r.error), r.code) for r in frontend]
    length = "context_length_exceeded"
    assert got == [(4, True, True, "invalid_value"), (5, True, True, "invalid_value"), (6, True, True, None),
                   (7, True, True, length), (8, True, True, length), (9, True, True, "invalid_value")], (
        tr("A prompt that cannot be tokenized, or fails the check of its tokens and length, is answered at once with an error and its code: {got}", got=got))
    room = 512 - len(tm.tokenize("x"))
    assert backend[1].sampling_params.max_tokens == room, tr(
        "An absent max_tokens is settled in the tokenizer process to all the room left ({room}), got {got}", room=room,
        got=backend[1].sampling_params.max_tokens)
    assert sorted(dm.decode_map) == [1, 2, 3]
    backend, frontend = process_messages([
        DetokenizeMsg(1, 11), RejectMsg(2, "too long"), AbortMsg(3), DetokenizeMsg(3, 11), RejectMsg(3, "late"),
    ], tm, dm)
    assert backend == [AbortBackendMsg(3)], tr("An abort from the API server is passed on to the scheduler: {backend}", backend=backend)
    got = [(r.uid, r.incremental_output, r.finished, r.finish_reason, r.error, r.prompt_tokens) for r in frontend]
    assert got == [(1, ",", False, None, None, 2), (2, "", True, None, "too long", 1), (3, "", True, "abort", None, 1)], (
        tr("A rejected request gets its error, an aborted one a last reply, and later messages for them nothing: got {got}", got=got))
    assert sorted(dm.decode_map) == [1], tr("Rejected and aborted requests free their state: left {uids}", uids=sorted(dm.decode_map))


# ----------------------------------------------------------------------------- 真正的进程
# en: ----------------------------------------------------------------------------- the real process


def run_tokenizer(args: ServerArgs, addrs: ServerAddrs, ready: Connection) -> None:
    """子进程的入口：按环境变量选好的那套实现跑分词进程（实现模块的名字子进程里导入不了，所以经这里转一下）。

    en: The child's entry point: run the tokenizer process with the implementation the environment selects (the
    implementation module's own name cannot be imported in the child, hence this hop).
    """
    tokenize_worker(args, addrs, ready)


def receive(queue: ZmqPullQueue, proc: Any, want: int, seconds: float = 30) -> list[Any]:
    """收 ``want`` 条消息（批量消息拆开算）；进程死了或超时就失败。

    en: Receive ``want`` messages (batch messages count by what they hold); fail if the process dies or time runs out.
    """
    got: list[Any] = []
    deadline = time.monotonic() + seconds
    while len(got) < want:
        msg = queue.get(timeout=0.2)
        if msg is not None:
            got += unwrap(msg)
            continue
        assert proc.is_alive(), tr("The tokenizer process died (exit code {code}) while {want} messages were expected, got {got}",
                                   code=proc.exitcode, want=want, got=got)
        assert time.monotonic() < deadline, tr("Waited {seconds} s for {want} messages, got {got}", seconds=seconds, want=want, got=got)
    return got


def test_worker_process_end_to_end(tiny_path: str, qwen: Any) -> None:
    ipc_dir = make_ipc_dir()
    addrs = ServerAddrs.in_dir(ipc_dir)
    scheduler = ZmqPullQueue(addrs.backend, create=True)
    api_server = ZmqPullQueue(addrs.frontend, create=True)
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=run_tokenizer, args=(ServerArgs(model_path=tiny_path), addrs, theirs), daemon=True)
    with mock.patch.dict(os.environ, select.impl_env()):
        proc.start()
    theirs.close()
    inbox = None
    try:
        assert ours.poll(120), tr("The tokenizer process did not report ready within {seconds} s", seconds=120)
        status, info = ours.recv()
        assert status == "ready" and isinstance(info, dict), tr("It should report ('ready', {{...}}), got {got}", got=(status, info))
        assert psutil.Process(proc.pid).children() == [], tr("The tokenizer process starts no process of its own")
        inbox = ZmqPushQueue(addrs.tokenizer, create=False)
        chat = [{"role": "user", "content": "Hi"}]
        inbox.put(BatchTokenizerMsg([TokenizeMsg(1, " Hello world", SamplingParams(), 512, ["wor"]), TokenizeMsg(2, chat, SamplingParams(), 512)]))
        users = receive(scheduler, proc, 2)
        assert [(m.uid, m.input_ids.tolist()) for m in users] == [
            (1, qwen.encode(" Hello world", add_special_tokens=False)),
            (2, list(qwen.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)))], (
            tr("The scheduler gets the tokenized requests: {got}", got=users))
        hello, world = words(qwen, " Hello", " world")
        inbox.put(BatchTokenizerMsg([DetokenizeMsg(1, hello), DetokenizeMsg(2, hello)]))
        inbox.put(BatchTokenizerMsg([DetokenizeMsg(1, world), DetokenizeMsg(2, world)]))
        replies = receive(api_server, proc, 4)
        assert [(r.uid, r.incremental_output, r.finished) for r in replies] == [
            (1, " Hello", False), (2, " Hello", False), (1, " ", True), (2, " world", False)], tr("The API server gets the pieces: {got}", got=replies)
        assert receive(scheduler, proc, 1) == [AbortBackendMsg(1)], tr("The stop-string hit aborts request 1 at the scheduler")
        # 已结束的请求 1 的消息没有回音：下一条回复是请求 2 的
        # en: A message for the finished request 1 gets no answer: the next reply is request 2's
        inbox.put(DetokenizeMsg(1, hello))
        inbox.put(DetokenizeMsg(2, hello, True, "length"))
        last = receive(api_server, proc, 1)[0]
        assert (last.uid, last.finished, last.finish_reason, last.completion_tokens) == (2, True, "length", 3), (
            tr("Only request 2 answers, finished: got {got}", got=last))
        inbox.put(TokenizeMsg(3, "x", SamplingParams(), 512))
        receive(scheduler, proc, 1)
        inbox.put(RejectMsg(3, "too long"))
        rejected = receive(api_server, proc, 1)[0]
        assert (rejected.uid, rejected.finished, rejected.error) == (3, True, "too long"), tr("A rejection is answered: {got}", got=rejected)
        os.kill(proc.pid, signal.SIGTERM)
        proc.join(30)
        assert proc.exitcode == 0, tr("After SIGTERM the tokenizer process exits cleanly (exit code 0), got {code}", code=proc.exitcode)
        assert proc not in multiprocessing.active_children() and not psutil.pid_exists(proc.pid), tr("No child process is left")
        # 起不来的时候报告原因、以非零状态退出
        # en: When it cannot start, it reports why and exits non-zero
        ours2, theirs2 = ctx.Pipe()
        bad = ctx.Process(target=run_tokenizer, args=(ServerArgs(model_path=os.path.join(ipc_dir, "no-such-model")), addrs, theirs2), daemon=True)
        with mock.patch.dict(os.environ, select.impl_env()):
            bad.start()
        theirs2.close()
        bad.join(120)
        status = ours2.recv() if ours2.poll(1) else None
        ours2.close()
        assert status is not None and status[0] == "error" and bad.exitcode not in (0, None), (
            tr("A tokenizer process that cannot start reports ('error', reason) and exits non-zero: got {status}, exit code {code}",
               status=status, code=bad.exitcode))
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)
        for q in (inbox, scheduler, api_server):
            if q is not None:
                q.close()
        ours.close()
        shutil.rmtree(ipc_dir, ignore_errors=True)
