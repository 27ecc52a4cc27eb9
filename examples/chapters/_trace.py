"""各章示例共用：包住调度器的 ``_forward``，记下每一步算了哪些请求、各算几个 token。

要在调用原来的 ``_forward`` 之前读 ``extend_len``：前向一发出，``complete_one()`` 就把它推进了。
"""

from __future__ import annotations


def trace_steps(llm, show=None):  # noqa: ANN001, ANN201 - 示例代码，保持简短
    """返回一个列表，之后每一步追加 ``(phase, [(uid, extend_len), ...])``；给了 ``show`` 就每步打印一行。"""
    steps = []
    original = llm._forward

    def forward(fi):  # noqa: ANN001, ANN202
        batch = fi.batch
        steps.append((batch.phase, [(r.uid, r.extend_len) for r in batch.reqs]))
        if show is not None:
            show(len(steps), *steps[-1])
        return original(fi)

    llm._forward = forward
    return steps


def describe(step: int, phase: str, work: list[tuple[int, int]]) -> str:
    kind = "预填充" if phase == "prefill" else "解码  "
    parts = "，".join(f"请求{uid}×{n}" for uid, n in work)
    return f"第 {step:>2} 步 {kind} {parts}"
