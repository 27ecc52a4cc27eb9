"""各章示例共用：用 ``llm.add_step_listener`` 记下每一步算了哪些请求、各算几个 token。

每一步的结果处理完，调度器就把这一步的轨迹（:class:`minisgl.trace.StepTrace`）交给监听者；
轨迹里的 ``extend_lens`` 是发出 **之前** 的长度（前向一发出，``complete_one()`` 就把请求推进了）。

en: Shared by the chapter examples: record with ``llm.add_step_listener`` which requests each step computed and how many
tokens each.

After each step's results are processed, the scheduler hands the step's trace (:class:`minisgl.trace.StepTrace`) to the
listeners; the trace's ``extend_lens`` are the lengths **before** launch (as soon as the forward is launched,
``complete_one()`` advances the requests).
"""

from __future__ import annotations

from minisgl.i18n import tr


def trace_steps(llm, show=None):  # noqa: ANN001, ANN201 - example code, kept short
    """返回一个列表，之后每一步追加 ``(phase, [(uid, extend_len), ...])``；给了 ``show`` 就每步调用 ``show(第几步, trace)``。

    en: Returns a list to which each later step appends ``(phase, [(uid, extend_len), ...])``; with ``show``, each step
    calls ``show(step number, trace)``.
    """
    steps = []

    def record(trace):  # noqa: ANN001, ANN202
        steps.append((trace.phase, list(zip(trace.uids, trace.extend_lens))))
        if show is not None:
            show(len(steps), trace)

    llm.add_step_listener(record)
    return steps


def describe(step: int, trace) -> str:  # noqa: ANN001
    kind = tr("prefill") if trace.is_prefill else tr("decode ")
    parts = tr(", ").join(tr("req{uid}×{n}", uid=uid, n=n) for uid, n in zip(trace.uids, trace.extend_lens))
    return tr("step {step:>2} {kind} {work}", step=step, kind=kind, work=parts)
