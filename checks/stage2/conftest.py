"""第 2 阶段检查共用的工具：模型、Hugging Face 参考输出（见 ``checks/hf_reference.py``）、记录每一步的批次、空闲时的完整性检查。

这里不导入任何章节模块（``minisgl.scheduler`` 等）：每个检查文件用哪套实现由 pytest 插件在导入那个文件时
决定，共用代码若在这里先导入，就会绑定到错误的那一套。需要 ``LLM`` 时由检查文件把类传进来。
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest
import torch
from transformers import AutoTokenizer

from checks.hf_reference import greedy_reference
from checks.common import expect  # noqa: F401 - 各章检查从这里导入 | en: the chapters' checks import it from here
from minisgl.i18n import tr
from minisgl import model_zoo
from minisgl.scheduling import RequestEvent
from minisgl.trace import StepTrace

#: SmolLM2 上逐 token 比对的提示词：长短不一（1 到 40 多个 token），含代码、数字、对话模板、中文，
#: 还有两对共享前缀的（让 radix 缓存真的命中）。
SMOLLM2_PROMPTS = [
    "The capital of France is",
    "Hello",
    "1, 2, 3, 4, 5,",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Once upon a time, in a small village by the sea, there lived a young girl who",
    "今天天气很好，我们",
    "<|im_start|>user\nWhat is the tallest mountain in the world?<|im_end|>\n<|im_start|>assistant\n",
]
SMOLLM2_TOKENS = 24

#: 第 2 阶段里程碑的共享系统提示词实验（用真实的 Qwen3 分词器，token 数可以精确复现）。
SYSTEM_PROMPT = "You are a helpful assistant. Answer concisely and accurately. " * 4
QUESTIONS = ["What is 2 + 2?", "Name a primary color.", "What is the capital of Japan?", "Spell cat."]
LONG_PROMPT = "Explain, step by step, why the sky is blue. " * 25

#: tiny 模型上常用的引擎参数（小而快）。
TINY_KW: dict[str, Any] = dict(dtype=torch.float32, device="auto", max_running_req=8, num_page_override=2048, max_seq_len_override=512)
#: SmolLM2 上常用的引擎参数。
SMOL_KW: dict[str, Any] = dict(dtype=torch.float32, device="auto", max_running_req=8, num_page_override=1024, max_seq_len_override=256)


def built(getter: Callable[[], Any]) -> str:
    """模型目录；没建好就直接失败并提示 ``make setup``（不跳过）。"""
    try:
        return str(getter())
    except FileNotFoundError as e:
        message = str(e)
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def tiny_path() -> str:
    return built(model_zoo.tiny_qwen3)


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    return built(model_zoo.smollm2)


@pytest.fixture(scope="session")
def qwen_tokenizer(tiny_path: str) -> Any:
    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="session")
def smollm2_prompts(smollm2_path: str) -> list[list[int]]:
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    return [tok.encode(p, add_special_tokens=False) for p in SMOLLM2_PROMPTS]


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_path: str, smollm2_prompts: list[list[int]]) -> list[list[int]]:
    """每个提示词单独在 HF 上贪心生成 SMOLLM2_TOKENS 个 token（由 transformers 算，缓存在磁盘上）。"""
    return greedy_reference(smollm2_path, smollm2_prompts, SMOLLM2_TOKENS)


# ----------------------------------------------------------------------------- 观察调度器


@dataclass
class Recorder:
    """用 ``llm.add_step_listener`` 收集每一步的 :class:`~minisgl.trace.StepTrace`（长度是发出前的）。"""

    steps: list[StepTrace] = field(default_factory=list)
    after: Callable[[StepTrace], None] | None = None  # 每收到一步就调用
    close: Callable[[], None] = lambda: None  # 取消监听

    def prefill_tokens(self) -> int:
        return sum(s.tokens for s in self.steps if s.phase == "prefill")

    def prefill_steps(self) -> list[int]:
        return [s.tokens for s in self.steps if s.phase == "prefill"]

    def cache_hits(self) -> int:
        """预填充时从前缀缓存命中的 token 数。

        en: The tokens prefill steps took from the prefix cache.
        """
        return sum(sum(s.cached_lens) for s in self.steps if s.phase == "prefill")

    def reset(self) -> None:
        self.steps.clear()


def tree_state(cache: Any) -> list[tuple[Any, ...]]:
    """radix 树的全部可见状态：每个节点的 token、槽位、引用计数、时间戳，以及两本账和时钟（比较前后有没有改动用）。

    en: Everything visible of a radix tree: each node's tokens, slots, reference count and timestamp, plus both totals
    and the clock (to compare before and after).
    """
    nodes = sorted((n.key.tolist(), n.value.tolist(), n.ref_count, n.timestamp) for n in cache._all_nodes())
    return [*nodes, (cache.evictable_size, cache.protected_size, cache._clock)]


def record(llm: Any, after: Callable[[StepTrace], None] | None = None) -> Recorder:
    rec = Recorder(after=after)

    def listen(trace: StepTrace) -> None:
        rec.steps.append(trace)
        if rec.after is not None:
            rec.after(trace)

    rec.close = llm.add_step_listener(listen)
    return rec


@dataclass
class Results:
    """用 ``llm.add_result_listener`` 收集每个请求的 :class:`~minisgl.scheduling.RequestEvent`。"""

    events: dict[int, list[RequestEvent]] = field(default_factory=dict)
    close: Callable[[], None] = lambda: None  # 取消监听

    def tokens(self, uid: int) -> list[int]:
        return [e.token for e in self.events.get(uid, []) if e.token is not None]

    def ends(self, uid: int) -> list[str | None]:
        """这个请求收到的结束事件的原因（正确时恰好一个）。"""
        return [e.reason for e in self.events.get(uid, []) if e.finished]


def results(llm: Any) -> Results:
    res = Results()
    res.close = llm.add_result_listener(lambda e: res.events.setdefault(e.uid, []).append(e))
    return res


@contextmanager
def integrity_error(what: str) -> Iterator[None]:
    """块里的完整性检查应当抛 RuntimeError；骨架的 NotImplementedError（也是 RuntimeError 的子类）不算数。"""
    with pytest.raises(RuntimeError) as raised:
        yield
        pytest.fail(what)
    assert not isinstance(raised.value, NotImplementedError), tr("The integrity check is not implemented yet: {value}", value=raised.value)


def assert_idle(llm: Any) -> None:
    """空闲时的不变式：页面全部回来（空闲 + 缓存 == 总数）、没有锁、请求槽全部空闲。"""
    llm.cache_manager.check_integrity()
    cm = llm.cache_manager
    if hasattr(cm, "prefix_cache"):  # 第 2.2 章起：不只信学员自己的 check_integrity，直接数一遍
        info = cm.prefix_cache.size_info
        assert info.protected_size == 0, tr("While idle, {protected_size} tokens are still locked (some request was not unlocked)", protected_size=info.protected_size)
        free = cm.free_slots.cpu().tolist()
        assert len(set(free)) == len(free), tr("The free pool contains duplicate pages")
        assert len(free) + info.total_size // cm.page_size == cm.num_pages, (
            tr("Not all pages came back: {n_free} free + {value} cached != {num_pages} pages in total", n_free=len(free), value=info.total_size // cm.page_size, num_pages=cm.num_pages)
        )
    assert llm.table_manager.available_size == llm.max_running_req, (
        tr("Not all request slots were returned: {available_size} / {max_running_req} free", available_size=llm.table_manager.available_size, max_running_req=llm.max_running_req)
    )
    assert not llm.busy, tr("The scheduler still holds requests after generate returned")


@pytest.fixture
def make_llm() -> Any:
    """造 LLM 的工厂；测试结束时统一 shutdown。用法：``llm = make_llm(LLM, path, **kw)``。"""
    made: list[Any] = []

    def factory(cls: Any, path: str, **kw: Any) -> Any:
        llm = cls(path, **kw)
        made.append(llm)
        return llm

    yield factory
    for llm in made:
        llm.shutdown()


# ----------------------------------------------------------------------------- 在后面的章节下跑本章的代码

#: 后面章节的参考解答调用本章代码时用的提示词（token id）：长短不一（3 到 24 个），两对共享前缀（第二轮时 radix 命中），
#: 最长的在块大小 5 下要切 5 块。
LATER_PROMPTS = [
    [1000 + i for i in range(17)] + [5, 6, 7],
    [1000 + i for i in range(9)] + [42, 43],
    [7, 8, 9],
    [1000 + i for i in range(17)] + [5, 6, 7, 8, 9, 10, 11],
    [2000 + 3 * i for i in range(13)],
]
LATER_TOKENS = 6
LATER_CHUNK = 5


class ScratchWrites:
    """用步骤监听者查每一步的 ``write_mapping``：不输出 token 的请求（中途的分块）的采样必须写到 scratch_row。
    写到自己那一行会盖掉下一块的提示词（开着重叠调度时，取决于时机）。``problems`` 是发现的问题，``close()`` 取消监听。

    en: A step listener that checks each step's ``write_mapping``: the sample of a request that outputs no token (a
    chunk midway) must be written to scratch_row. Written into its own row it would overwrite the next chunk of the
    prompt (with overlap scheduling, depending on timing). ``problems`` are those found; ``close()`` stops listening.
    """

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.problems: list[str] = []
        self.close = llm.add_step_listener(self._check)

    def _check(self, trace: Any) -> None:
        rows = trace.write_mapping[0].cpu().tolist()
        for uid, output, cached, extend, row in zip(trace.uids, trace.outputs, trace.cached_lens, trace.extend_lens, rows):
            if not output and row != self.llm.scratch_row:
                self.problems.append(tr(
                    "Request {uid} computes an unfinished chunk ({cached_len} to {device_len} of its prompt): "
                    "the token sampled for it is not an output, so its write_mapping row must be scratch_row "
                    "({scratch_row}), got row {row}. Written into its own row it would overwrite the next prompt "
                    "token (with overlap scheduling the next chunk is already in the token pool by then)",
                    uid=uid, cached_len=cached, device_len=cached + extend, scratch_row=self.llm.scratch_row, row=row,
                ))


@pytest.fixture(scope="module")
def final_llms(tiny_path: str):  # noqa: ANN201
    """最后一章（第 2.5 章）的 ``LLM`` 按 page_size 各建一个，模块内共用：``final_llms(类, page_size)``。
    类由检查文件传进来（conftest 不导入章节）。

    en: One ``LLM`` of the final chapter (2.5) per page_size, shared within the module: ``final_llms(cls, page_size)``.
    The class comes from the check file (a conftest imports no chapter).
    """
    made: dict[int, Any] = {}

    def get(cls: Any, page_size: int) -> Any:
        if page_size not in made:
            made[page_size] = cls(tiny_path, **{**TINY_KW, "page_size": page_size, "num_page_override": 2048 // page_size})
        return made[page_size]

    yield get
    for llm in made.values():
        llm.shutdown()


def run_under_later_chapters(llm: Any, tiny_path: str, *, chunk: int | None, overlap: bool, what: str) -> None:
    """用后面章节的参考解答（它们从本章的类派生、调用本章的代码）跑 LATER_PROMPTS 两轮：每个请求的贪心输出与
    Hugging Face 一致；每一步里不输出的分块都写到 scratch_row；每轮之后页面、锁、请求槽全部归还（``assert_idle``）。"""
    from minisgl.core import SamplingParams  # 这里才导入：本检查文件选定的那一套实现
    from minisgl.env import ENV

    reference = greedy_reference(tiny_path, LATER_PROMPTS, LATER_TOKENS)
    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    llm.prefill_budget = chunk or llm.config.max_extend_tokens
    rec = record(llm)
    scratch = ScratchWrites(llm)
    try:
        for round_ in (1, 2):  # 第二轮：共享前缀都在缓存里
            rec.reset()
            sp = SamplingParams(max_tokens=LATER_TOKENS, ignore_eos=True)
            out = [o["token_ids"] for o in llm.generate(LATER_PROMPTS, sp)]
            assert not scratch.problems, scratch.problems[0]
            for i, (ours, ref) in enumerate(zip(out, reference)):
                assert ours == ref, tr(
                    "{what}, round {round}: request {i} (prompt of {n} tokens) differs from Hugging Face\nours: {ours}\nHF:   {ref}",
                    what=what, round=round_, i=i, n=len(LATER_PROMPTS[i]), ours=ours, ref=ref,
                )  # fmt: skip
            assert_idle(llm)
            if chunk and round_ == 1:
                steps = rec.prefill_steps()
                assert max(steps) <= chunk < max(len(p) for p in LATER_PROMPTS), tr(
                    "{what}: each prefill step is at most the chunk size {chunk}, got {steps}", what=what, chunk=chunk, steps=steps
                )  # fmt: skip
    finally:
        scratch.close()
        rec.close()
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved
        llm.prefill_budget = llm.config.max_extend_tokens


def first_fresh_index(tokens: list[int], start: int = 1) -> int:
    """第一个在前面没出现过的位置（>= start）：把它当成 EOS，请求就恰好在那里停下。"""
    for i in range(start, len(tokens)):
        if tokens[i] not in tokens[:i]:
            return i
    raise AssertionError(tr("Cannot find a token to use as EOS: {tokens}", tokens=tokens))
