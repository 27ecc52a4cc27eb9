"""笔记本的共用工具，按用途分成几个模块，这里把它们汇总成一个入口（笔记本都写 ``from minisgl.notebook import ...``）：

- :mod:`~minisgl.notebook.setup`：第一格的 ``setup_notebook``，统一的时间写法 ``fmt_ms``，不带文档字符串的源码 ``show_source``；
- :mod:`~minisgl.notebook.tasks`：本章任务清单 ``show_tasks``，最后一格的 ``run_chapter_checks`` / ``run_milestone_checks``；
- :mod:`~minisgl.notebook.widgets`：交互控件 ``Explorer``；
- :mod:`~minisgl.notebook.recorders`：记录调度器每一步的 ``StepRecorder``、``Timeline``；
- :mod:`~minisgl.notebook.plots`：请求长度、页表、掩码、每步批次、页面占用、KV 池、时间线的图；
- :mod:`~minisgl.notebook.trees`：基数树前缀缓存的图和文字版。

笔记本只从 ``minisgl.*`` 导入，这里也一样：章节实现全部经由公共命名空间取得，
``MINISGL_IMPL`` 和 ``python -m minisgl.course use`` 的选择对笔记本同样有效。
导入本包很快（不导入 torch、matplotlib、ipywidgets），重的库在函数里按需导入。
"""

from minisgl.notebook.plots import (
    draw_kv_pool,
    draw_mask,
    draw_page_table,
    draw_page_usage,
    draw_req_lengths,
    draw_steps,
    draw_timeline,
    page_usage,
)
from minisgl.notebook.recorders import StepRecorder, Timeline
from minisgl.notebook.setup import fmt_ms, setup_notebook, show_source
from minisgl.notebook.tasks import run_chapter_checks, run_milestone_checks, show_tasks
from minisgl.notebook.trees import draw_radix_steps, draw_tree, format_radix, radix_nodes
from minisgl.notebook.widgets import Explorer, capture

__all__ = [
    "setup_notebook",
    "fmt_ms",
    "show_source",
    "show_tasks",
    "run_chapter_checks",
    "run_milestone_checks",
    "Explorer",
    "capture",
    "StepRecorder",
    "Timeline",
    "draw_req_lengths",
    "draw_page_table",
    "draw_mask",
    "draw_steps",
    "draw_page_usage",
    "draw_kv_pool",
    "draw_timeline",
    "page_usage",
    "draw_tree",
    "radix_nodes",
    "draw_radix_steps",
    "format_radix",
]
