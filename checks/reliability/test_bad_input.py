"""每一种错误输入都被清楚地拒绝（中文消息说出是哪个值、允许的范围），拒绝之后引擎照样能用、什么也没丢。

``REFUSED_INPUTS`` 就是参考页里“会被拒绝的输入”那张表：表和这里的用例由 ``test_reference_table_matches`` 对齐。
"""

from __future__ import annotations

import re

from typing import Any, Callable

import pytest

from .conftest import TINY_KW, assert_idle
from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.paths import REPO_ROOT
from minisgl.i18n import tr

SP = SamplingParams


def _gen(prompts: Any, sp: Any = None) -> Callable[[Any], Any]:
    return lambda llm: llm.generate(prompts, sp)


def _make(**kw: Any) -> Callable[[Any], Any]:
    return lambda llm: LLM(llm.config.model_path, **{**TINY_KW, **kw})


#: (表里的写法, 怎样触发, 异常类型, 消息里必须出现的片段)
REFUSED_INPUTS: list[tuple[str, Callable[[Any], Any], type[Exception], str]] = [
    ('`generate("hello")`（不是列表）', _gen("hello"), TypeError, "prompts 应该是列表"),
    ('`generate([""])`（空提示词）', _gen([""]), ValueError, "是空的"),
    ("`generate([[]])`", _gen([[]]), ValueError, "是空的"),
    ("`generate([[1.5, 2.7]])`", _gen([[1.5, 2.7]]), TypeError, "不是整数的 token id"),
    ("`generate([[True, False]])`", _gen([[True, False]]), TypeError, "不是整数的 token id"),
    ("`generate([[-1]])`、`generate([[10**9]])`", _gen([[10**9]]), ValueError, "词表"),
    ("`generate([123])`（提示词不是字符串也不是列表）", _gen([123]), TypeError, "既不是字符串也不是 token id 列表"),
    ("提示词达到长度上限", _gen([[1] * 512]), ValueError, "长度上限"),
    ("`max_tokens` 与提示词加起来超出长度上限", _gen([[1] * 500], SP(max_tokens=100)), ValueError, "最多只能输出 12 个"),
    ("`sampling_params` 个数与提示词不一致", _gen(["a", "b"], [SP(), SP(), SP()]), ValueError, "个数"),
    ("`sampling_params` 不是 `SamplingParams`", _gen(["a"], [{"temperature": 1.0}]), TypeError, "不是 SamplingParams"),
    ('`SamplingParams(temperature=float("nan"))`', _gen(["a"], SP(temperature=float("nan"))), ValueError, "temperature"),
    ('`SamplingParams(temperature=float("inf"))`', _gen(["a"], SP(temperature=float("inf"))), ValueError, "temperature"),
    ("`SamplingParams(temperature=-1)`", _gen(["a"], SP(temperature=-1.0)), ValueError, "temperature"),
    ('`SamplingParams(top_p=float("nan"))`、`top_p=0`、`top_p=1.5`', _gen(["a"], SP(top_p=float("nan"))), ValueError, "top_p"),
    ("`SamplingParams(top_p=0)`", _gen(["a"], SP(top_p=0.0)), ValueError, "top_p"),
    ("`SamplingParams(top_k=0)`", _gen(["a"], SP(top_k=0)), ValueError, "top_k"),
    ("`SamplingParams(top_k=2.5)`", _gen(["a"], SP(top_k=2.5)), ValueError, "top_k"),  # type: ignore[arg-type]
    ("`SamplingParams(max_tokens=0)`", _gen(["a"], SP(max_tokens=0)), ValueError, "max_tokens"),
    ("`SamplingParams(max_tokens=1.5)`", _gen(["a"], SP(max_tokens=1.5)), ValueError, "max_tokens"),  # type: ignore[arg-type]
    ('`SamplingParams(seed="x")`', _gen(["a"], SP(seed="x")), ValueError, "seed"),  # type: ignore[arg-type]
    ("`SamplingParams(seed=2**64)`", _gen(["a"], SP(seed=2**64)), ValueError, "seed"),
    ('`SamplingParams(ignore_eos="yes")`', _gen(["a"], SP(ignore_eos="yes")), ValueError, "ignore_eos"),  # type: ignore[arg-type]
    ("`LLM(..., max_running_req=0)`", _make(max_running_req=0), ValueError, "max_running_req"),
    ("`LLM(..., num_page_override=0)`", _make(num_page_override=0), ValueError, "num_page_override"),
    ("`LLM(..., page_size=0)`", _make(page_size=0), ValueError, "page_size"),
    ("`LLM(..., max_seq_len_override=1)`", _make(max_seq_len_override=1), ValueError, "max_seq_len_override"),
    ("`LLM(..., max_extend_tokens=0)`", _make(max_extend_tokens=0), ValueError, "max_extend_tokens"),
    ('`LLM(..., dtype="float128")`', _make(dtype="float128"), ValueError, "dtype"),
    ('`LLM(..., device="tpu")`', _make(device="tpu"), ValueError, "device"),
    ("`LLM(..., memory_ratio=2)`", _make(memory_ratio=2.0), ValueError, "memory_ratio"),
    ('`LLM(..., cache_type="lru")`', _make(cache_type="lru"), ValueError, "cache_type"),
    ("提示词比整个 KV 池还长（KV 池太小）", _gen([[1] * 200]), ValueError, "长度上限"),
]


@pytest.fixture(scope="module")
def llm(tiny_path: str):  # noqa: ANN201
    llm = LLM(tiny_path, **TINY_KW)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def small_pool(tiny_path: str):  # noqa: ANN201
    llm = LLM(tiny_path, **{**TINY_KW, "num_page_override": 150})
    yield llm
    llm.shutdown()


@pytest.mark.parametrize("case", REFUSED_INPUTS, ids=[c[0] for c in REFUSED_INPUTS])
def test_bad_input_refused_clearly_and_engine_still_works(llm, small_pool, case) -> None:  # noqa: ANN001
    text, trigger, exc, fragment = case
    target = small_pool if "KV 池" in text else llm
    with pytest.raises(exc) as info:
        trigger(target)
    message = str(info.value)
    assert fragment in message, f"{text}：错误消息应当提到「{fragment}」，实际：{message}"
    assert re.search(r"[\u4e00-\u9fff]", message), f"{text}：错误消息应当是中文，实际：{message}"
    assert not target.status, f"{text}：被拒绝的请求不能留在调度器里"
    assert_idle(target)
    out = target.generate(["still alive"], SP(max_tokens=3, ignore_eos=True))
    assert len(out[0]["token_ids"]) == 3, f"{text}：拒绝之后引擎应当照常可用"


def test_every_64_bit_seed_samples(llm) -> None:  # noqa: ANN001
    """种子取范围两端（消息能带、发生器收得下的 64 位）也能采样，同一个种子两次结果相同。"""
    for seed in (-(2**63), 2**64 - 1):
        params = SP(temperature=1.0, max_tokens=4, ignore_eos=True, seed=seed)
        first, again = (llm.generate(["a"], params)[0]["token_ids"] for _ in range(2))
        assert len(first) == 4 and first == again, tr("seed={seed}: expected the same 4 tokens twice, got {first} and {again}",
                                                      seed=seed, first=first, again=again)
    assert_idle(llm)


def test_max_tokens_past_the_sequence_limit_is_refused(llm) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="512"):
        llm.generate([[1] * 500], SP(max_tokens=100, ignore_eos=True))
        pytest.fail("max_tokens 超出长度上限（500 + 100 > 512）必须报错，不能悄悄截短")
    out = llm.generate([[1] * 500], SP(ignore_eos=True))
    assert len(out[0]["token_ids"]) == 512 - 500, "不给 max_tokens 就生成到上下文用完：提示词 500 + 输出 12 = 512"
    assert_idle(llm)


def test_reference_table_matches() -> None:
    """参考页的“会被拒绝的输入”表逐行对应上面的用例，消息片段也一致。"""
    page = (REPO_ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    section = page.split("## 会被拒绝的输入", 1)
    assert len(section) == 2, "docs/reference.md 缺少「## 会被拒绝的输入」一节"
    rows = [line for line in section[1].split("\n## ", 1)[0].splitlines() if line.startswith("| ") and "---" not in line]
    table = [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows[1:]]
    assert [r[0] for r in table] == [c[0] for c in REFUSED_INPUTS], "表的第一列应与 REFUSED_INPUTS 逐行一致"
    for row, (text, _, exc, fragment) in zip(table, REFUSED_INPUTS):
        assert row[1] == f"`{exc.__name__}`" and fragment in row[2], f"表里「{text}」这一行与用例不一致：{row}"


def reference_table() -> str:
    """生成参考页的表（改了用例后用它更新文档）：``python -c "from checks.reliability.test_bad_input import reference_table as t; print(t())"``。"""
    lines = ["| 输入 | 异常 | 消息里会说 |", "| --- | --- | --- |"]
    lines += [f"| {text} | `{exc.__name__}` | {fragment} |" for text, _, exc, fragment in REFUSED_INPUTS]
    return "\n".join(lines)



