"""负载生成器要发什么、什么时候发：请求集（``random``、``shared-prefix``、``repeat``，提示词直接是 token id）、泊松
到达的时刻、每次运行的负载形状。全都只由种子决定，所以每家服务器拿到的请求一模一样。

en: What the load generator sends and when: the request sets (``random``, ``shared-prefix``, ``repeat``, prompts as token
ids), the Poisson arrival times and each run's load shape. All of it follows the seed alone, so every server gets the
very same requests.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from minisgl.i18n import tr

REQUEST_SETS = ("random", "shared-prefix", "repeat")


@dataclass(frozen=True)
class RequestSpec:
    """一个要发的请求：提示词（token id）和要的输出 token 数。

    en: One request to send: the prompt (token ids) and the number of output tokens asked for.
    """

    prompt: list[int]
    max_tokens: int


def random_requests(n: int, ids: Sequence[int], prompt_len: tuple[int, int], output_len: tuple[int, int],
                    seed: int | str) -> list[RequestSpec]:
    """``n`` 个请求：提示词长度在 ``prompt_len`` 之间、输出长度在 ``output_len`` 之间（两端都含），token 从 ``ids`` 里挑；
    同一个种子总是同一组。

    en: ``n`` requests: prompt lengths within ``prompt_len``, output lengths within ``output_len`` (both ends included),
    tokens drawn from ``ids``; the same seed always gives the same set.
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length, new = rng.randint(*prompt_len), rng.randint(*output_len)
        out.append(RequestSpec(rng.choices(ids, k=length), new))
    return out


def shared_prefix_requests(n: int, ids: Sequence[int], prefix_len: int, tail_len: tuple[int, int],
                           output_len: tuple[int, int], seed: int, groups: int = 1) -> list[RequestSpec]:
    """``n`` 个请求共用开头的 ``prefix_len`` 个 token（“系统提示词”），后面各接一段长度在 ``tail_len`` 之间的尾巴。
    ``groups`` 段不同的系统提示词时，第 ``i`` 个请求用第 ``i % groups`` 段（各组轮流着来，像几个应用共用一个服务）。

    en: ``n`` requests that share their first ``prefix_len`` tokens (the "system prompt"), each followed by a tail of a
    length within ``tail_len``. With ``groups`` different system prompts, request ``i`` uses prompt ``i % groups`` (the
    groups take turns, like several applications sharing one service).
    """
    rng = random.Random(seed)
    prefixes = [rng.choices(ids, k=prefix_len) for _ in range(groups)]
    out = []
    for i in range(n):
        length, new = rng.randint(*tail_len), rng.randint(*output_len)
        out.append(RequestSpec(prefixes[i % groups] + rng.choices(ids, k=length), new))
    return out


def repeat_requests(n: int, ids: Sequence[int], prompt_len: tuple[int, int], passage_len: tuple[int, int],
                    output_len: tuple[int, int], seed: int) -> list[RequestSpec]:
    """``n`` 个“照着输入写”的请求：每个提示词是一段随机的文字（长度在 ``passage_len`` 之间）一遍遍重复，长度在
    ``prompt_len`` 之间、至少两遍。模型接着照抄下去（归纳头就是这样做的），输出大段重复提示词：n-gram 投机解码
    从提示词里猜得中，是它占便宜的一类负载（另一头是 ``random``，几乎没有可猜的）。

    en: ``n`` input-grounded requests: each prompt is a random passage (its length within ``passage_len``) repeated, the
    whole within ``prompt_len`` and at least two copies. A model goes on copying it (induction heads do just that), so
    the output repeats the prompt at length: n-gram speculative decoding guesses it from the prompt, the kind of load it
    gains on (``random`` is the other end, with next to nothing to guess).
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        passage = rng.choices(ids, k=rng.randint(*passage_len))
        length, new = max(rng.randint(*prompt_len), 2 * len(passage)), rng.randint(*output_len)
        out.append(RequestSpec((passage * (length // len(passage) + 1))[:length], new))
    return out


def warmup_requests(n: int, ids: Sequence[int], seed: int) -> list[RequestSpec]:
    """预热用的 ``n`` 个短请求。种子是一个字符串，不会和任何一次运行的整数种子相同（``Random(-1)`` 和
    ``Random(1)`` 是同一串数：曾经让预热的提示词成了一次运行里某个请求的前缀，白送它一次前缀缓存命中）。

    en: ``n`` short warm-up requests. Their seed is a string, never equal to any run's integer seed (``Random(-1)`` and
    ``Random(1)`` give the same numbers: that once made a warm-up prompt the prefix of a request in a run, a free
    prefix-cache hit for it).
    """
    return random_requests(n, ids, (16, 16), (4, 4), f"warm-up {seed}")


def poisson_schedule(n: int, rate: float, seed: int) -> list[float]:
    """泊松到达：``n`` 个请求相对开始的发出时刻（秒），第一个在 0，相邻两个的间隔服从均值 ``1/rate`` 的指数分布；
    ``rate`` 为无穷时全部在 0。

    en: Poisson arrivals: the send times (seconds after the start) of ``n`` requests, the first at 0, the gaps
    exponential with mean ``1/rate``; an infinite ``rate`` puts them all at 0.
    """
    rng = random.Random(seed)
    times, t = [], 0.0
    for _ in range(n):
        times.append(t)
        t += 0.0 if math.isinf(rate) else rng.expovariate(rate)
    return times


@dataclass(frozen=True)
class Vocab:
    """分词器里用得着的东西：不是特殊 token 的全部 id（从中挑提示词）、特殊 token 的 id，和把 id 解码成文字的函数
    （给只收文字的服务器）。

    en: What the tokenizer provides: every id that is not a special token (prompts are drawn from them), the special
    tokens' ids, and a function decoding ids to text (for servers that take text only).
    """

    ids: list[int]
    special: list[int]
    decode: Callable[[Sequence[int]], str]


def load_vocab(tokenizer_dir: str | Path) -> Vocab:
    """从本地的分词器目录（离线）读出 :class:`Vocab`。

    en: The :class:`Vocab` of a local tokenizer folder (offline).
    """
    from transformers import AutoTokenizer  # 导入要几秒：只在真要发请求时才导入 | en: a few seconds to import: only when requests are really sent

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    special = sorted(set(tok.all_special_ids))
    skip = set(special)

    def decode(ids: Sequence[int]) -> str:
        return str(tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False))

    return Vocab([i for i in range(tok.vocab_size) if i not in skip], special, decode)


@dataclass(frozen=True)
class Run:
    """一次运行的负载形状：``"poisson"``（``value`` 是每秒几个请求）或 ``"closed"``（``value`` 是并发数）。

    en: The load shape of one run: ``"poisson"`` (``value`` is requests per second) or ``"closed"`` (``value`` is the
    concurrency).
    """

    shape: str
    value: float

    @property
    def name(self) -> str:
        return run_label(self.shape, self.value)

    @property
    def key(self) -> str:
        """与语言无关的名字，讲义引用它：``poisson:2``、``closed:8``。

        en: A language-independent name the book cites: ``poisson:2``, ``closed:8``.
        """
        return f"{self.shape}:{self.value:g}"


def run_label(shape: str, value: float, language: str | None = None) -> str:
    """一次运行的名字（当前语言，或 ``language``）。

    en: A run's name (in the current language, or ``language``).
    """
    if shape == "poisson":
        return tr("Poisson {rate:g} req/s", rate=value, language=language)
    return tr("concurrency {n}", n=int(value), language=language)
