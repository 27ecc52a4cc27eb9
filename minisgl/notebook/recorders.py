"""记录调度器的每一步：每步的批次组成（:class:`StepRecorder`）和每步三段时间（:class:`Timeline`）。

两者都只是 ``llm.add_step_listener`` 的监听者（见 :mod:`minisgl.trace`），不碰调度器的私有方法。
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from minisgl.i18n import tr

__all__ = ["StepRecorder", "Timeline"]


class StepRecorder:
    """记下每一步的批次组成（长度取自发出之前）。

    每一步记一个 dict：``phase``（prefill / decode）、``reqs``：``[(uid, extend_len, cached_len)]``、
    ``pages_in_use``（准备好这一步之后 KV 池占用的页数）、``trace``（完整的 :class:`~minisgl.trace.StepTrace`），
    以及 ``after`` 回调（如果给了）在这一步的结果处理完之后返回的东西（例如 ``page_usage``）。
    """

    def __init__(self, llm: Any, after: Callable[[Any], Any] | None = None) -> None:
        self.llm = llm
        self.steps: list[dict[str, Any]] = []
        self._after = after
        self._remove = llm.add_step_listener(self._record)

    def _record(self, trace: Any) -> None:
        step = {
            "phase": trace.phase,
            "reqs": list(zip(trace.uids, trace.extend_lens, trace.cached_lens)),
            "pages_in_use": trace.pages_in_use,
            "trace": trace,
        }
        if self._after is not None:
            step["after"] = self._after(self.llm)
        self.steps.append(step)

    def restore(self) -> None:
        """不再记录。"""
        self._remove()

    def clear(self) -> None:
        self.steps.clear()

    @property
    def prefill_tokens(self) -> int:
        return sum(e for s in self.steps if s["phase"] == "prefill" for _, e, _ in s["reqs"])

    def summary(self) -> str:
        pre = sum(s["phase"] == "prefill" for s in self.steps)
        return tr(
            "{n_steps} steps ({pre} prefill, {decode} decode), {prefill_tokens} tokens computed in prefill",
            n_steps=len(self.steps),
            pre=pre,
            decode=len(self.steps) - pre,
            prefill_tokens=self.prefill_tokens,
        )


class Timeline:
    """记录调度器每一步的三段时间：准备（主线程）、前向计算（可能在后台线程）、处理结果（主线程）。

    取自每一步轨迹的 ``prepare`` / ``forward`` / ``process``，每段记 ``(种类, 线程名, 开始, 结束)``（种类就是这三个词），
    时间相对于 :meth:`start` 的时刻（秒）。主线程上两段之间的空白，就是主线程在等结果。
    """

    KINDS = ("prepare", "forward", "process")  #: 三段的种类（记录里的键，画图时由 ``draw_timeline`` 翻译）
    ORDER = ("prepare", "process", "forward")  #: 画图时的叠放顺序（``draw_timeline`` 用）

    def __init__(self, llm: Any) -> None:
        self.records: list[tuple[str, str, float, float]] = []
        self.steps = 0
        self._t0 = time.perf_counter()
        self._remove = llm.add_step_listener(self._record)

    def _record(self, trace: Any) -> None:
        if trace.prepare[0] < self._t0:  # start() 之前发出的一步
            return
        self.steps += 1
        main = threading.current_thread().name  # 监听者在调度器的线程里被调用
        spans = [("prepare", main, trace.prepare)]
        if trace.forward is not None:
            spans.append(("forward", trace.forward_thread or main, trace.forward))
        if trace.process is not None:
            spans.append(("process", main, trace.process))
        for kind, thread, (start, end) in spans:
            self.records.append((kind, thread, start - self._t0, end - self._t0))

    def start(self) -> None:
        """从现在起重新记录。"""
        self.records.clear()
        self.steps = 0
        self._t0 = time.perf_counter()

    def restore(self) -> None:
        """不再记录。"""
        self._remove()
