"""讲义里引用的速度比值，要和录制的输出（docs/outputs/）对得上；同一个量在不同录制里测了几次，也要彼此一致。

讲义不写绝对速度（它取决于机器），只写比值，并在比值后面紧跟一个 HTML 注释标出它是哪两个量之比::

    第 2 阶段约是第 1 阶段的 **1.7 倍**<!-- ratio stage2 / stage2_stage1 -->

注释在网页上看不见。量的名字见下面的 ``QUANTITIES``：每个量是某份录制输出里某一行上的 token/s。
比值与录制算出的比值相差不超过 ``TOLERANCE``（相对误差）才算对得上。

录制的输出由 ``python tools/record_outputs.py`` 在安静的机器上重新录制；讲义的比值对不上时，要么录制时机器太忙
（重新录制），要么讲义该改了。
"""

from __future__ import annotations

import re

import pytest

from minisgl.paths import REPO_ROOT as REPO

DOCS = REPO / "docs"
OUTPUTS = DOCS / "outputs"

#: 讲义里的比值与录制算出的比值之间允许的相对误差。
TOLERANCE = 0.35

_SPEED = r"(\d+(?:\.\d+)?) token/s"

#: 量的名字 → (录制的输出, 匹配那一行并抓出 token/s 的正则)。
QUANTITIES: dict[str, tuple[str, str]] = {
    # 第 0 步单独运行
    "step0": ("step0", rf"^1 个请求 × \d+ 个 token：.*?{_SPEED}"),
    # 第一阶段里程碑：单请求、同进程里现测的第 0 步、4 个一批
    "stage1_single": ("stage1_milestone", rf"^1 个请求 × \d+ 个 token：{_SPEED}"),
    "stage1_step0": ("stage1_milestone", rf"（第 0 步：{_SPEED}）"),
    "stage1_batch": ("stage1_milestone", rf"^\d+ 个请求一批 × .*?共 {_SPEED}"),
    # 第二阶段里程碑实验 1：LLM.generate，以及同进程里现测的第 1 阶段（4 个一批）和第 0 步
    "stage2": ("stage2_milestone", rf"第 2 阶段 LLM\.generate.*?{_SPEED}"),
    "stage2_stage1": ("stage2_milestone", rf"第 1 阶段（手工成批，4 个一批）：{_SPEED}"),
    "stage2_step0": ("stage2_milestone", rf"第 0 步（朴素引擎，一次 1 个）：{_SPEED}"),
}

#: 同一个量在不同录制里的几次测量：彼此相差不超过 TOLERANCE（最大 / 最小 ≤ 1 + TOLERANCE）。
SAME_QUANTITY = {
    "step0": ("第 0 步（一次 1 个请求）", ["step0", "stage1_step0", "stage2_step0"]),
    "stage1_batch": ("第 1 阶段 4 个一批", ["stage1_batch", "stage2_stage1"]),
}

#: 讲义里的比值：数字、“倍”或“×”（可以加粗），紧跟注释 <!-- ratio 分子 / 分母 -->。
RATIO = re.compile(r"(\d+(?:\.\d+)?)\s*(?:倍|×)\s*(?:\*\*)?\s*<!--\s*ratio\s+(\w+)\s*/\s*(\w+)\s*-->")
MARKER = re.compile(r"<!--\s*ratio\b")


def recorded(name: str) -> float:
    output, pattern = QUANTITIES[name]
    path = OUTPUTS / f"{output}.txt"
    assert path.is_file(), f"没有录制的输出 {path.relative_to(REPO)}：运行 python tools/record_outputs.py {output}"
    m = re.search(pattern, path.read_text(encoding="utf-8"), re.M)
    assert m, f"{path.relative_to(REPO)} 里找不到量 {name}（正则 {pattern!r}）：输出的格式变了？"
    value = float(m.group(1))
    assert value > 0, f"{path.relative_to(REPO)} 里的 {name} 是 {value}"
    return value


def cited_ratios() -> list[tuple[str, float, str, str]]:
    """讲义里标了注释的全部比值：(页面, 比值, 分子, 分母)。同一页里重复引用的同一个比值只查一次。"""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        rel = page.relative_to(DOCS).as_posix()
        for m in RATIO.finditer(text):
            found.append((rel, float(m.group(1)), m.group(2), m.group(3)))
        markers, parsed = len(MARKER.findall(text)), len(RATIO.findall(text))
        assert markers == parsed, (
            f"docs/{rel} 有 {markers} 个 <!-- ratio --> 注释，只认出 {parsed} 个：注释要紧跟在“数字 倍”或“数字×”后面"
        )
    return list(dict.fromkeys(found))


def test_milestone_page_cites_ratios() -> None:
    pages = {page for page, *_ in cited_ratios()}
    assert "stage2/milestone.md" in pages, "第二阶段里程碑页应当用比值（带 <!-- ratio … --> 注释）讲速度"


@pytest.mark.parametrize("page, ratio, numerator, denominator", cited_ratios())
def test_cited_ratio_matches_recordings(page: str, ratio: float, numerator: str, denominator: str) -> None:
    for name in (numerator, denominator):
        assert name in QUANTITIES, f"docs/{page}：不认识的量 {name}；已知：{', '.join(QUANTITIES)}"
    actual = recorded(numerator) / recorded(denominator)
    assert abs(ratio / actual - 1) <= TOLERANCE, (
        f"docs/{page} 说 {numerator} / {denominator} 约 {ratio:g} 倍，录制的输出算出来是 {actual:.2f} 倍"
        f"（相差超过 {TOLERANCE:.0%}）：录制时机器太忙就重新录制，否则改讲义"
    )


@pytest.mark.parametrize("quantity", list(SAME_QUANTITY))
def test_repeated_measurements_agree(quantity: str) -> None:
    label, names = SAME_QUANTITY[quantity]
    values = {name: recorded(name) for name in names}
    low, high = min(values.values()), max(values.values())
    assert high / low <= 1 + TOLERANCE, (
        f"{label} 的速度在不同录制里相差 {high / low:.2f} 倍（超过 {TOLERANCE:.0%}）：{values}。"
        "录制时机器在忙别的事——等它安静了用 python tools/record_outputs.py 重新录制"
    )
