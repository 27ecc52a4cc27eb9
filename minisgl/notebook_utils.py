"""笔记本的共用工具：准备环境、列出本章任务、交互控件、画图、跑本章检查。

笔记本只从 ``minisgl.*`` 导入，所以这里也一样：章节实现全部经由公共命名空间取得，
``MINISGL_IMPL`` 和 ``python -m minisgl.course use`` 的选择对笔记本同样有效。

这个模块本身导入很快（不导入 torch、matplotlib、ipywidgets），重的库在函数里按需导入。
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import random
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]

__all__ = [
    "REPO_ROOT",
    "setup_notebook",
    "show_tasks",
    "Explorer",
    "run_chapter_checks",
    "run_milestone_checks",
    "fmt_ms",
    "StepRecorder",
    "draw_req_lengths",
    "draw_page_table",
    "draw_mask",
    "draw_steps",
    "draw_page_usage",
    "draw_tree",
    "draw_kv_pool",
    "radix_nodes",
    "draw_radix_steps",
    "format_radix",
    "page_usage",
    "Timeline",
    "draw_timeline",
]


# ---------------------------------------------------------------------------- 环境


def setup_notebook(seed: int = 0) -> None:
    """每个笔记本的第一格调用：关掉进度条和无关的警告、固定随机种子、配好画图（含中文字体）。"""
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    _disable_tqdm()
    random.seed(seed)
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed(seed)
    import torch

    torch.manual_seed(seed)
    _setup_matplotlib()
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def _disable_tqdm() -> None:
    """权重加载等处的进度条在笔记本里只是噪音（每次运行都不一样），全部关掉。"""
    import tqdm.std

    cls = tqdm.std.tqdm
    if getattr(cls, "_minisgl_quiet", False):
        return
    original = cls.__init__

    def quiet_init(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003 - same signature as tqdm
        kwargs["disable"] = True
        original(self, *args, **kwargs)

    cls.__init__ = quiet_init
    cls._minisgl_quiet = True
    if "transformers" in sys.modules:  # 已经导入的 transformers 不再读环境变量
        with contextlib.suppress(Exception):
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()


_CJK_FONTS = (
    "Noto Sans CJK SC",
    "Noto Sans SC",
    "Source Han Sans SC",
    "WenQuanYi Micro Hei",
    "WenQuanYi Zen Hei",
    "SimHei",
    "PingFang SC",
    "Microsoft YaHei",
    "Heiti SC",
)


def _setup_matplotlib() -> None:
    import matplotlib
    from matplotlib import font_manager

    names = {f.name for f in font_manager.fontManager.ttflist}
    found = next((n for n in _CJK_FONTS if n in names), None)
    if found is None:
        with contextlib.suppress(ImportError, OSError, RuntimeError):
            import mplfonts  # pip 包，自带 Noto Sans CJK SC

            path = Path(mplfonts.__file__).parent / "fonts" / "NotoSansCJKsc-Regular.otf"
            font_manager.fontManager.addfont(str(path))
            found = font_manager.FontProperties(fname=str(path)).get_name()
    if found is not None:
        matplotlib.rcParams["font.sans-serif"] = [found, "DejaVu Sans"]
        matplotlib.rcParams["font.family"] = "sans-serif"
    # 没有中文字体时图里的汉字会显示成方框，但不要让每张图都打一串警告
    warnings.filterwarnings("ignore", message=r"Glyph .* missing from")
    warnings.filterwarnings("ignore", message=r"Matplotlib currently does not support")
    matplotlib.rcParams["axes.unicode_minus"] = False
    matplotlib.rcParams["figure.dpi"] = 90
    matplotlib.rcParams["savefig.dpi"] = 90
    matplotlib.rcParams["svg.hashsalt"] = "minisgl"


def fmt_ms(seconds: float) -> str:
    """时间统一写成 ``12.3 ms``：CI 比较笔记本输出时，notebooks/sanitize.cfg 把这种写法换成占位符。"""
    return f"{seconds * 1000:.1f} ms"


# ---------------------------------------------------------------------------- 本章任务


def _chapter(chapter_id: str):
    from minisgl.course.registry import get_chapter

    return get_chapter(chapter_id)


def _enclosing(tree: ast.Module, line: int) -> str:
    """标记所在的函数，写成 ``类.方法`` 或 ``函数``。"""
    best = ""

    def visit(node: ast.AST, prefix: str) -> None:
        nonlocal best
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if child.lineno <= line <= (child.end_lineno or child.lineno):
                    if not isinstance(child, ast.ClassDef):
                        best = name
                    visit(child, name + ".")

    visit(tree, "")
    return best


def show_tasks(chapter_id: str) -> None:
    """列出本章要写的任务（与骨架里的 TODO 一一对应），以及笔记本现在用的是哪份实现。"""
    from minisgl.course import select
    from minisgl.course.pytest_plugin import IMPL_NAMES
    from minisgl.course.skeleton import parse_tasks

    ch = _chapter(chapter_id)
    if not select.is_written(ch):
        print(f"第 {ch.label} 章 {ch.id} 的参考解答还没写好。")
        return
    source = select.shipped_solution(ch).read_text(encoding="utf-8")
    tree = ast.parse(source)
    tasks = parse_tasks(source, ch.relpath)
    print(f"第 {ch.label} 章「{ch.title}」：在 {ch.relpath} 里完成 {len(tasks)} 个任务")
    for i, t in enumerate(tasks, 1):
        where = _enclosing(tree, t.line)
        print(f"  {i:>2}. {t.name}（{where}）：{t.hint}")
    choice = select.choose(ch)
    print(f"本笔记本里 {ch.public_module} 用的是：{IMPL_NAMES[choice.impl]}（{choice.reason}）")


# ---------------------------------------------------------------------------- 交互控件


_WIDGET_NOTE = "（交互控件：在 Jupyter 里运行本格即可调节；下一格用同一个处理函数画出一组参数的结果）"


class Explorer:
    """一组控件加一块输出区：任何控件变了，就用新参数重跑 ``fn`` 并把文字和图重画在控件下面。

    ``fn(**参数)`` 用 ``print`` 输出文字、用 matplotlib 画图（不要调用 ``plt.show()``）。
    输出不经过单元格（写进控件自己的状态），所以在没有浏览器的 CI 里也不会产生多余的输出。

    ``explorer.run(参数=值, ...)`` 像拖动控件一样改参数并调用控件触发的同一个处理函数，
    再把结果显示在当前单元格里——CI 用它检验回调确实能跑通，输出逐字比较。
    """

    def __init__(self, fn: Callable[..., Any], title: str = "", **controls: Any) -> None:
        import ipywidgets as w

        self.fn = fn
        self.controls = controls
        self.last_text = ""
        self.last_images: list[bytes] = []
        self._quiet = False
        self._text = w.HTML()
        self._images = w.VBox()
        for control in controls.values():
            control.observe(self.on_change, names="value")
        header = [w.HTML(f"<b>{title}</b>")] if title else []
        self.widget = w.VBox([*header, w.VBox(list(controls.values())), self._text, self._images])
        self.on_change(None)

    def values(self) -> dict[str, Any]:
        return {name: control.value for name, control in self.controls.items()}

    def on_change(self, change: Any) -> None:
        """控件的回调：用当前参数重跑实验，重画输出区。"""
        if self._quiet:
            return
        import html

        import ipywidgets as w

        self.last_text, self.last_images = capture(self.fn, **self.values())
        self._text.value = f"<pre style='line-height:1.3'>{html.escape(self.last_text)}</pre>"
        self._images.children = [w.Image(value=png, format="png", layout={"max_width": "100%"}) for png in self.last_images]

    def run(self, **values: Any) -> None:
        """设置控件的值（与在界面上调节一样），调用一次回调，并把结果输出到当前单元格。"""
        from IPython.display import Image, display

        unknown = set(values) - set(self.controls)
        if unknown:
            raise KeyError(f"没有这些控件：{', '.join(sorted(unknown))}；可用：{', '.join(self.controls)}")
        self._quiet = True
        try:
            for name, value in values.items():
                self.controls[name].value = value
        finally:
            self._quiet = False
        self.on_change({"name": "value", "owner": None, "new": None})
        print(self.last_text, end="")
        for png in self.last_images:
            display(Image(data=png, format="png"))

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        bundle = dict(self.widget._repr_mimebundle_(**kwargs))
        bundle["text/plain"] = _WIDGET_NOTE
        return bundle


def capture(fn: Callable[..., Any], **kwargs: Any) -> tuple[str, list[bytes]]:
    """调用 ``fn``，收集它打印的文字和新画的图（PNG），图随即关闭，不会再出现在单元格里。"""
    import matplotlib.pyplot as plt

    before = set(plt.get_fignums())
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            fn(**kwargs)
    except Exception as err:  # 控件里出错时把错误写进输出区，而不是悄悄吞掉
        buf.write(f"\n出错了：{type(err).__name__}: {err}\n")
    images = []
    for num in [n for n in plt.get_fignums() if n not in before]:
        fig = plt.figure(num)
        out = io.BytesIO()
        fig.savefig(out, format="png", bbox_inches="tight")
        images.append(out.getvalue())
        plt.close(fig)
    return buf.getvalue(), images


# ---------------------------------------------------------------------------- 跑检查


def _run(cmd: list[str], tail: int) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "MINISGL_IMPL"}
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    out = (proc.stdout + proc.stderr).rstrip().splitlines()
    if len(out) > tail:
        out = ["……（前面省略）", *out[-tail:]]
    return proc.returncode, "\n".join(out)


def run_chapter_checks(chapter_id: str, tail: int = 40) -> bool:
    """对你自己的代码跑本章的检查（``python -m minisgl.course check <章>``），打印结果并总结。"""
    ch = _chapter(chapter_id)
    print(f"$ python -m minisgl.course check {ch.id}")
    code, text = _run([sys.executable, "-m", "minisgl.course", "check", ch.id], tail)
    print(text)
    row = next((line for line in text.splitlines() if re.match(rf"^{re.escape(ch.label)}\s+{ch.id}\s", line)), "")
    print()
    if "未开始" in row:
        print(f"本章还没开始：{ch.relpath} 仍是骨架。写下第一个任务后再运行这一格。")
        return False
    if code == 0:
        print(f"第 {ch.label} 章 {ch.id}：全部通过 ✔")
        return True
    print(f"第 {ch.label} 章 {ch.id}：还有检查没通过 ✘ —— 看上面的失败信息，对照 {ch.docs_page}。")
    return False


def run_milestone_checks(stage: int, tail: int = 40) -> bool:
    """对当前工作区跑第 ``stage`` 阶段的里程碑检查。"""
    path = f"checks/stage{stage}/test_milestone.py"
    print(f"$ python -m pytest {path} -q")
    code, text = _run([sys.executable, "-m", "pytest", path, "--impl", "learner", "-q"], tail)
    print(text)
    print()
    print(f"第 {stage} 阶段里程碑：{'全部通过 ✔' if code == 0 else '还有检查没通过 ✘'}")
    return code == 0


# ---------------------------------------------------------------------------- 记录调度器的每一步


class StepRecorder:
    """包住 ``llm._forward``，在调用原函数 *之前* 记下每一步的批次组成（引擎发出时就会推进长度）。

    每一步记一个 dict：``phase``（prefill / decode）、``reqs``：``[(uid, extend_len, cached_len)]``，
    以及 ``after`` 回调（如果给了）在这一步之后返回的东西（例如页面占用）。
    """

    def __init__(self, llm: Any, after: Callable[[Any], Any] | None = None) -> None:
        self.llm = llm
        self.steps: list[dict[str, Any]] = []
        self._after = after
        self._orig = llm._forward

        def wrapped(fi: Any) -> Any:
            batch = fi.batch
            step = {
                "phase": "prefill" if batch.is_prefill else "decode",
                "reqs": [(r.uid, r.extend_len, r.cached_len) for r in batch.reqs],
            }
            self.steps.append(step)
            out = self._orig(fi)
            if self._after is not None:
                step["after"] = self._after(llm)
            return out

        llm._forward = wrapped

    def restore(self) -> None:
        self.llm._forward = self._orig

    def clear(self) -> None:
        self.steps.clear()

    @property
    def prefill_tokens(self) -> int:
        return sum(e for s in self.steps if s["phase"] == "prefill" for _, e, _ in s["reqs"])

    def summary(self) -> str:
        pre = sum(s["phase"] == "prefill" for s in self.steps)
        return f"{len(self.steps)} 步（预填充 {pre} 步、解码 {len(self.steps) - pre} 步），预填充共计算 {self.prefill_tokens} 个 token"


# ---------------------------------------------------------------------------- 画图


def _plt():
    import matplotlib.pyplot as plt

    return plt


_COLORS = {
    "cached": "#8fbc8f",
    "extend": "#f4a261",
    "remain": "#e9ecef",
    "prefill": "#f4a261",
    "decode": "#6fa8dc",
    "free": "#e9ecef",
    "locked": "#e76f51",
    "evictable": "#8fbc8f",
    "used": "#6fa8dc",
}


def draw_req_lengths(snapshots: Sequence[tuple[str, Sequence[Any]]], title: str = "") -> None:
    """画请求的三个长度：每个快照的每个请求一根横条，``[0, cached_len)`` 已缓存、``[cached_len, device_len)``
    本轮要算、``[device_len, max_device_len)`` 还能生成。``snapshots``：``[(标题, [Req 或 (uid, cached, device, max)])]``。"""
    from matplotlib.patches import Patch

    plt = _plt()
    rows = [(label, _lengths(r)) for label, reqs in snapshots for r in reqs]
    many = any(len(reqs) > 1 for _, reqs in snapshots)
    longest = max(r[3] for _, r in rows)
    fig, ax = plt.subplots(figsize=(8, 0.42 * len(rows) + 1.3))
    for y, (label, (uid, cached, device, maxlen)) in enumerate(rows):
        ax.barh(y, cached, color=_COLORS["cached"], edgecolor="k")
        ax.barh(y, device - cached, left=cached, color=_COLORS["extend"], edgecolor="k")
        ax.barh(y, maxlen - device, left=device, color=_COLORS["remain"], edgecolor="k", hatch="//")
        ax.text(longest * 1.02 + 0.2, y, f"cached={cached}  device={device}  max={maxlen}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [f"{label} · 请求 {r[0]}" if many else label for label, r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, longest * 1.45 + 1)
    ax.set_xlabel("token 位置")
    fig.tight_layout()
    fig.legend(
        handles=[
            Patch(color=_COLORS["cached"], label="已缓存 cached_len"),
            Patch(color=_COLORS["extend"], label="本轮要算 extend_len"),
            Patch(facecolor=_COLORS["remain"], hatch="//", label="还能生成 remain_len"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    if title:
        ax.set_title(title)


def _lengths(r: Any) -> tuple[int, int, int, int]:
    if isinstance(r, tuple):
        return r
    return (r.uid, r.cached_len, r.device_len, r.max_device_len)


def draw_page_table(
    table: Any,
    rows: Sequence[int],
    width: int,
    page_size: int,
    highlight: Iterable[tuple[int, int]] = (),
    lengths: Sequence[int] | None = None,
    title: str = "",
) -> None:
    """页表的几行：每格写槽位号，同一页的槽位同色；``highlight`` 里的 ``(行, 列)`` 加粗框出（本批要写的位置）。"""
    import numpy as np

    plt = _plt()
    data = np.asarray(table[list(rows), :width].cpu() if hasattr(table, "cpu") else table)
    marks = set(highlight)
    fig, ax = plt.subplots(figsize=(min(0.55 * width + 1.5, 14), 0.5 * len(rows) + 1.2))
    cmap = plt.get_cmap("tab20")
    for i, row in enumerate(rows):
        valid = lengths[i] if lengths is not None else width
        for j in range(width):
            slot = int(data[i, j])
            used = j < valid
            color = cmap((slot // page_size) % 20) if used else "#f8f9fa"
            ax.add_patch(plt.Rectangle((j, i), 1, 1, facecolor=color, edgecolor="white", alpha=0.85 if used else 1))
            if used:
                ax.text(j + 0.5, i + 0.5, str(slot), ha="center", va="center", fontsize=7)
            if (row, j) in marks:
                ax.add_patch(plt.Rectangle((j + 0.05, i + 0.05), 0.9, 0.9, fill=False, edgecolor="black", linewidth=2))
    ax.set_xlim(0, width)
    ax.set_ylim(len(rows), 0)
    ax.set_yticks([i + 0.5 for i in range(len(rows))], [f"第 {r} 行" for r in rows])
    ax.set_xticks([j + 0.5 for j in range(width)], [str(j) for j in range(width)], fontsize=7)
    note = "；粗框 = 本批写入的位置（out_loc）" if marks else ""
    ax.set_xlabel(f"token 位置（列）；格子里是 KV 槽位，颜色 = 页号{note}")
    if title:
        ax.set_title(title)
    fig.tight_layout()


def draw_mask(mask: Any, cached_len: int, title: str = "") -> None:
    """布尔注意力掩码：行是 query（绝对位置 cached_len + i），列是 key；左边 cached_len 列是缓存的前缀。"""
    import numpy as np

    plt = _plt()
    m = np.asarray(mask.cpu() if hasattr(mask, "cpu") else mask).astype(float)
    q, k = m.shape
    fig, ax = plt.subplots(figsize=(0.35 * k + 1.8, 0.35 * q + 1.4))
    ax.imshow(m, cmap="Blues", vmin=0, vmax=1.3)
    if cached_len:
        ax.axvline(cached_len - 0.5, color="#e76f51", linewidth=2)
        ax.text(cached_len / 2 - 0.5, -0.8, "缓存的前缀", ha="center", color="#e76f51", fontsize=9)
    ax.set_xticks(range(k))
    ax.set_yticks(range(q), [str(cached_len + i) for i in range(q)])
    ax.set_xlabel("key 位置")
    ax.set_ylabel("query 的绝对位置")
    if title:
        ax.set_title(title, pad=18)
    fig.tight_layout()


def draw_steps(steps: Sequence[dict[str, Any]], title: str = "", budget: int | None = None) -> None:
    """每一步的批次组成：横轴是步，纵轴是请求；格子里的数字是这一步为它计算的 token 数
    （橙色预填充、蓝色解码、空白表示不在这一步的批次里）。最上面一行是这一步的合计。"""
    plt = _plt()
    uids = sorted({u for s in steps for u, _, _ in s["reqs"]})
    row = {u: i + 1 for i, u in enumerate(uids)}
    n = len(steps)
    fig, ax = plt.subplots(figsize=(min(0.42 * n + 2.2, 15), 0.34 * (len(uids) + 1) + 1.3))
    for x, step in enumerate(steps):
        color = _COLORS["prefill"] if step["phase"] == "prefill" else _COLORS["decode"]
        total = 0
        for uid, extend, _ in step["reqs"]:
            ax.add_patch(plt.Rectangle((x, row[uid]), 1, 1, facecolor=color, edgecolor="white"))
            ax.text(x + 0.5, row[uid] + 0.5, str(extend), ha="center", va="center", fontsize=7)
            total += extend
        over = budget is not None and step["phase"] == "prefill" and total > budget
        ax.add_patch(plt.Rectangle((x, 0), 1, 1, facecolor="#ffd6d6" if over else "#f1f3f5", edgecolor="white"))
        ax.text(x + 0.5, 0.5, str(total), ha="center", va="center", fontsize=7)
    ax.set_xlim(0, n)
    ax.set_ylim(len(uids) + 1, 0)
    ax.set_yticks([0.5] + [row[u] + 0.5 for u in uids], ["合计"] + [f"请求 {u}" for u in uids], fontsize=8)
    ax.set_xticks([x + 0.5 for x in range(n)], [str(x) for x in range(n)], fontsize=7)
    ax.set_xlabel("步（橙：预填充，蓝：解码；数字：这一步为它计算的 token 数）")
    if budget is not None:
        title = (title + "  " if title else "") + f"（预填充预算 {budget}）"
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()


def draw_page_usage(history: Sequence[dict[str, int]], total: int, title: str = "") -> None:
    """页面占用随步数的变化：每步一根堆叠的柱子，键为 ``used``（运行中请求独占、还没进缓存的）、
    ``locked``（缓存里被请求锁住的）、``evictable``（缓存里可驱逐的）、``free``（空闲）。"""
    plt = _plt()
    keys = [k for k in ("used", "locked", "evictable", "free") if any(k in h for h in history)]
    names = {"used": "请求独占", "locked": "缓存·锁住", "evictable": "缓存·可驱逐", "free": "空闲"}
    xs = list(range(len(history)))
    fig, ax = plt.subplots(figsize=(min(0.35 * len(history) + 3, 12), 3))
    bottom = [0] * len(history)
    for k in keys:
        vals = [h.get(k, 0) for h in history]
        ax.bar(xs, vals, bottom=bottom, width=0.85, color=_COLORS[k], label=names[k])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylim(0, total)
    ax.set_xlim(-0.6, len(history) - 0.4)
    ax.set_xlabel("步（每一步之后）")
    ax.set_ylabel("页数")
    ax.legend(loc="upper left", bbox_to_anchor=(1, 1), fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()


def draw_tree(
    nodes: Sequence[dict[str, Any]], title: str = "", ax: Any = None
) -> None:
    """画一棵树。``nodes``：``[{"id", "parent", "label", "color"}]``（根的 parent 为 None），按先序排列。"""
    plt = _plt()
    children: dict[Any, list[Any]] = {}
    by_id = {n["id"]: n for n in nodes}
    for n in nodes:
        if n["parent"] is not None:
            children.setdefault(n["parent"], []).append(n["id"])
    root = next(n["id"] for n in nodes if n["parent"] is None)
    pos: dict[Any, tuple[float, float]] = {}
    counter = [0]

    def place(nid: Any, depth: int) -> float:
        kids = children.get(nid, [])
        if not kids:
            x = float(counter[0])
            counter[0] += 1
        else:
            xs = [place(k, depth + 1) for k in kids]
            x = (xs[0] + xs[-1]) / 2
        pos[nid] = (x, -depth)
        return x

    place(root, 0)
    depth = max(-y for _, y in pos.values())
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(2.6 * counter[0], 4), 1.3 * depth + 1.4))
    for nid, kids in children.items():
        for k in kids:
            (x0, y0), (x1, y1) = pos[nid], pos[k]
            ax.plot([x0, x1], [y0, y1], color="#999", zorder=1)
    for nid, (x, y) in pos.items():
        n = by_id[nid]
        ax.text(
            x, y, n["label"], ha="center", va="center", fontsize=8, zorder=2,
            bbox={"boxstyle": "round,pad=0.35", "facecolor": n.get("color", "white"), "edgecolor": "#555"},
        )
    ax.set_xlim(-0.8, max(counter[0] - 0.2, 0.8))
    ax.set_ylim(-depth - 0.6, 0.6)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)


def draw_kv_pool(owners: Sequence[int | None], page_size: int, title: str = "", labels: dict[int, str] | None = None) -> None:
    """KV 池的槽位条：每格一个 token 槽位，颜色 = 占用它的请求（None 为空闲），粗线分隔页。"""
    plt = _plt()
    n = len(owners)
    per_row = min(n, max(page_size, (64 // page_size) * page_size))
    rows = -(-n // per_row)
    fig, ax = plt.subplots(figsize=(min(0.2 * per_row + 1.5, 14), 0.35 * rows + 1.0))
    cmap = plt.get_cmap("tab10")
    for slot, owner in enumerate(owners):
        r, c = divmod(slot, per_row)
        color = "#f1f3f5" if owner is None else cmap(owner % 10)
        ax.add_patch(plt.Rectangle((c, r), 1, 1, facecolor=color, edgecolor="white", linewidth=0.5))
    for r in range(rows):
        width = min(per_row, n - r * per_row)
        for c in range(0, width + 1, page_size):
            ax.plot([c, c], [r, r + 1], color="#333", linewidth=1.2)
    ax.set_xlim(0, per_row)
    ax.set_ylim(rows, 0)
    ax.set_yticks([r + 0.5 for r in range(rows)], [f"槽位 {r * per_row}" for r in range(rows)], fontsize=7)
    ax.set_xticks([])
    from matplotlib.patches import Patch

    used = sorted({o for o in owners if o is not None})
    handles = [Patch(color=cmap(o % 10), label=(labels or {}).get(o, f"请求 {o}")) for o in used]
    handles.append(Patch(color="#f1f3f5", label="空闲"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1, 1), fontsize=8)
    ax.set_title(title or f"KV 池：{n} 个槽位，每页 {page_size} 个（粗线分页）", fontsize=10)
    fig.tight_layout()


def radix_nodes(cache: Any, decode: Callable[[list[int]], str] | None = None, width: int = 16) -> list[dict[str, Any]]:
    """把基数树前缀缓存（``cache.root``）转成 :func:`draw_tree` 的节点列表。

    每个节点写它那段 token（给了 ``decode`` 就解码成文字）、长度和引用计数；红色 = 被锁住（ref > 0），
    绿色 = 可驱逐，灰色 = 根。
    """
    nodes: list[dict[str, Any]] = []
    stack = [(cache.root, None)]
    counter = 0
    while stack:
        node, parent = stack.pop()
        nid = counter
        counter += 1
        if parent is None:
            label, color = "根", "#dee2e6"
        else:
            ids = node.key.tolist()
            text = decode(ids) if decode else " ".join(map(str, ids))
            text = text.replace("\n", "⏎")
            if len(text) > width:
                text = text[: width - 1] + "…"
            label = f"{text!r}\n{len(ids)} 个 token · ref={node.ref_count}"
            color = "#f4a6a6" if node.ref_count > 0 else "#b7e4c7"
        nodes.append({"id": nid, "parent": parent, "label": label, "color": color})
        kids = sorted(node.children.values(), key=lambda c: c.key.tolist())
        stack.extend((c, nid) for c in reversed(kids))
    return nodes


def draw_radix_steps(snapshots: Sequence[tuple[str, list[dict[str, Any]]]], cols: int = 2) -> None:
    """几棵树排成网格：``snapshots`` 是 ``[(标题, radix_nodes(...))]``。"""
    plt = _plt()
    rows = -(-len(snapshots) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 2.9 * rows), squeeze=False)
    for ax, (title, nodes) in zip(axes.flat, snapshots):
        draw_tree(nodes, title=title, ax=ax)
    for ax in list(axes.flat)[len(snapshots):]:
        ax.axis("off")
    fig.tight_layout()


def page_usage(llm: Any) -> dict[str, int]:
    """调度器此刻的页面账：运行中请求独占的、前缀缓存里锁住的 / 可驱逐的、空闲的（单位：页）。"""
    cm = llm.cache_manager
    ps = cm.page_size
    free = len(cm.free_slots)
    info = cm.prefix_cache.size_info
    locked, evictable = info.protected_size // ps, info.evictable_size // ps
    return {"used": cm.num_pages - free - locked - evictable, "locked": locked, "evictable": evictable, "free": free}


class Timeline:
    """记录调度器每一步的三段时间：调度与准备（主线程）、前向计算（可能在后台线程）、处理结果（主线程）。

    包住实例上的 ``_schedule_next_batch``、``_run_batch`` 和 ``_process_last_data``，
    每段记 ``(种类, 线程名, 开始, 结束)``，时间相对于 :meth:`start` 的时刻（秒）。
    """

    KINDS = {"_schedule_next_batch": "调度与准备", "_run_batch": "前向计算", "_process_last_data": "处理结果"}
    ORDER = ("调度与准备", "处理结果", "前向计算", "等待结果")

    def __init__(self, llm: Any) -> None:
        import threading
        import time

        self.records: list[tuple[str, str, float, float]] = []
        self._t0 = time.perf_counter()
        lock = threading.Lock()

        def record(kind: str, start: float, end: float) -> None:
            with lock:
                self.records.append((kind, threading.current_thread().name, start - self._t0, end - self._t0))

        def wrap(name: str) -> None:
            original = getattr(llm, name)

            def timed(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    if name != "_process_last_data" or (args and args[0] is not None):
                        record(self.KINDS[name], start, time.perf_counter())

            setattr(llm, name, timed)

        for name in self.KINDS:
            wrap(name)
        launch = llm._forward

        def timed_forward(fi: Any) -> Any:
            out = launch(fi)
            event = out.copy_done_event
            wait = event.synchronize

            def timed_wait() -> None:
                start = time.perf_counter()
                wait()
                record("等待结果", start, time.perf_counter())

            with contextlib.suppress(AttributeError):
                event.synchronize = timed_wait
            return out

        llm._forward = timed_forward

    def start(self) -> None:
        import time

        self.records.clear()
        self._t0 = time.perf_counter()


def draw_timeline(runs: Sequence[tuple[str, Sequence[tuple[str, str, float, float]]]], title: str = "") -> None:
    """几次运行的时间线，上下排列：每次运行两行（主线程、后台线程），色块是调度 / 计算 / 处理结果。"""
    plt = _plt()
    colors = {"调度与准备": "#f4a261", "前向计算": "#6fa8dc", "处理结果": "#8fbc8f", "等待结果": "#ced4da"}
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.5 * len(runs) + 0.6), squeeze=False)
    end = max((r[3] for _, recs in runs for r in recs), default=1.0)
    for ax, (label, recs) in zip(axes[:, 0], runs):
        threads = sorted({r[1] for r in recs}, key=lambda t: (t != "MainThread", t))
        for kind, thread, s, e in sorted(recs, key=lambda r: Timeline.ORDER.index(r[0])):
            y = threads.index(thread)
            ax.barh(y, (e - s) * 1000, left=s * 1000, color=colors[kind], edgecolor="white", linewidth=0.3)
        ax.set_yticks(range(len(threads)), ["主线程" if t == "MainThread" else "后台线程" for t in threads], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, end * 1000 * 1.02)
        ax.set_title(label, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("时间（毫秒）")
    from matplotlib.patches import Patch

    fig.legend(handles=[Patch(color=c, label=k) for k, c in colors.items()], loc="upper right", ncol=3, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.93))


def format_radix(cache: Any, decode: Callable[[list[int]], str] | None = None, width: int = 24) -> str:
    """基数树的文字版（与 :func:`radix_nodes` 画的图一致）：每行一个节点，缩进表示深度。"""
    lines: list[str] = []

    def walk(node: Any, depth: int) -> None:
        for child in sorted(node.children.values(), key=lambda c: c.key.tolist()):
            ids = child.key.tolist()
            text = (decode(ids) if decode else " ".join(map(str, ids))).replace("\n", "⏎")
            if len(text) > width:
                text = text[: width - 1] + "…"
            lines.append(f"{'  ' * depth}└ {text!r}  {len(ids)} 个 token，ref={child.ref_count}")
            walk(child, depth + 1)

    lines.append("根")
    walk(cache.root, 1)
    return "\n".join(lines)
