"""画图：请求的长度、页表、注意力掩码、每步的批次、页面占用、KV 池、时间线。

matplotlib 在函数里才导入；每个函数只画图，不调用 ``plt.show()``（笔记本自己显示，控件用 ``capture`` 收走）。
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from minisgl.i18n import tr
from minisgl.notebook.recorders import Timeline

__all__ = [
    "draw_req_lengths",
    "draw_page_table",
    "draw_mask",
    "draw_steps",
    "draw_page_usage",
    "draw_kv_pool",
    "page_usage",
    "draw_timeline",
]


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
    names = [tr("{label} · request {uid}", label=label, uid=r[0]) if many else label for label, r in rows]
    ax.set_yticks(range(len(rows)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, longest * 1.45 + 1)
    ax.set_xlabel(tr("token position"))
    fig.tight_layout()
    fig.legend(
        handles=[
            Patch(color=_COLORS["cached"], label=tr("cached cached_len")),
            Patch(color=_COLORS["extend"], label=tr("to compute this round extend_len")),
            Patch(facecolor=_COLORS["remain"], hatch="//", label=tr("can still generate remain_len")),
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
    ax.set_yticks([i + 0.5 for i in range(len(rows))], [tr("row {r}", r=r) for r in rows])
    ax.set_xticks([j + 0.5 for j in range(width)], [str(j) for j in range(width)], fontsize=7)
    note = tr("; bold box = slots written by this batch (out_loc)") if marks else ""
    ax.set_xlabel(tr("token position (column); each cell holds a KV slot, color = page{note}", note=note))
    if title:
        ax.set_title(title)
    fig.tight_layout()


def draw_mask(mask: Any, cached_len: int, title: str = "") -> None:
    """布尔注意力掩码：行是 query（绝对位置 cached_len + i），列是 key；红线左边 cached_len 列是缓存的前缀。"""
    import numpy as np

    plt = _plt()
    m = np.asarray(mask.cpu() if hasattr(mask, "cpu") else mask).astype(float)
    q, k = m.shape
    # 纵轴标签是竖着写的：行很少（例如解码时只有 1 个 query）时把格子拉高，标签才不会伸到标题上
    height = max(0.35 * q, 1.3)
    fig, ax = plt.subplots(figsize=(max(0.35 * k + 1.8, 3.4), height + 1.3), layout="constrained")
    ax.imshow(m, cmap="Blues", vmin=0, vmax=1.3, aspect="auto")
    note = ""
    if cached_len:
        ax.axvline(cached_len - 0.5, color="#e76f51", linewidth=2)
        note = "\n" + tr("the {cached_len} columns left of the red line are the cached prefix", cached_len=cached_len)
    ax.set_xticks(range(k))
    ax.set_yticks(range(q), [str(cached_len + i) for i in range(q)])
    ax.set_xlabel(tr("key position") + note)
    ax.set_ylabel(tr("absolute query position"))
    if title:
        ax.set_title(title, fontsize=10)


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
    ax.set_yticks([0.5] + [row[u] + 0.5 for u in uids], [tr("total")] + [tr("request {uid}", uid=u) for u in uids], fontsize=8)
    ax.set_xticks([x + 0.5 for x in range(n)], [str(x) for x in range(n)], fontsize=7)
    ax.set_xlabel(tr("step (orange: prefill, blue: decode; number: tokens computed for it in this step)"))
    if budget is not None:
        title = (title + "  " if title else "") + tr(" (prefill budget {budget})", budget=budget)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()


def draw_page_usage(history: Sequence[dict[str, int]], total: int, title: str = "") -> None:
    """页面占用随步数的变化：每步一根堆叠的柱子，键为 ``used``（运行中请求独占、还没进缓存的）、
    ``locked``（缓存里被请求锁住的）、``evictable``（缓存里可驱逐的）、``free``（空闲）。"""
    plt = _plt()
    keys = [k for k in ("used", "locked", "evictable", "free") if any(k in h for h in history)]
    names = {"used": tr("held by requests"), "locked": tr("cache · locked"), "evictable": tr("cache · evictable"), "free": tr("free")}
    xs = list(range(len(history)))
    fig, ax = plt.subplots(figsize=(min(0.35 * len(history) + 3, 12), 3))
    bottom = [0] * len(history)
    for k in keys:
        vals = [h.get(k, 0) for h in history]
        ax.bar(xs, vals, bottom=bottom, width=0.85, color=_COLORS[k], label=names[k])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylim(0, total)
    ax.set_xlim(-0.6, len(history) - 0.4)
    ax.set_xlabel(tr("step (after each step)"))
    ax.set_ylabel(tr("pages"))
    ax.legend(loc="upper left", bbox_to_anchor=(1, 1), fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()


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
    ax.set_yticks([r + 0.5 for r in range(rows)], [tr("slot {slot}", slot=r * per_row) for r in range(rows)], fontsize=7)
    ax.set_xticks([])
    from matplotlib.patches import Patch

    used = sorted({o for o in owners if o is not None})
    handles = [Patch(color=cmap(o % 10), label=(labels or {}).get(o, tr("request {uid}", uid=o))) for o in used]
    handles.append(Patch(color="#f1f3f5", label=tr("free")))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1, 1), fontsize=8)
    default = tr("KV pool: {n} slots, {page_size} per page (bold lines between pages)", n=n, page_size=page_size)
    ax.set_title(title or default, fontsize=10)
    fig.tight_layout()


def page_usage(llm: Any) -> dict[str, int]:
    """调度器此刻的页面账：运行中请求独占的、前缀缓存里锁住的 / 可驱逐的、空闲的（单位：页）。"""
    cm = llm.cache_manager
    ps = cm.page_size
    free = len(cm.free_slots)
    info = cm.prefix_cache.size_info
    locked, evictable = info.protected_size // ps, info.evictable_size // ps
    return {"used": cm.num_pages - free - locked - evictable, "locked": locked, "evictable": evictable, "free": free}


def draw_timeline(runs: Sequence[tuple[str, Sequence[tuple[str, str, float, float]]]], title: str = "") -> None:
    """几次运行的时间线，上下排列：每次运行两行（主线程、后台线程），色块是准备 / 前向计算 / 处理结果
    （``Timeline`` 记录里的 ``prepare`` / ``forward`` / ``process``），
    主线程上的空白是在等结果。``runs``：``[(标题, Timeline.records)]``。"""
    plt = _plt()
    colors = {"prepare": "#f4a261", "forward": "#6fa8dc", "process": "#8fbc8f"}
    names = {"prepare": tr("prepare"), "forward": tr("forward"), "process": tr("process results")}
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.5 * len(runs) + 0.6), squeeze=False)
    end = max((r[3] for _, recs in runs for r in recs), default=1.0)
    for ax, (label, recs) in zip(axes[:, 0], runs):
        threads = sorted({r[1] for r in recs}, key=lambda t: (t != "MainThread", t))
        for kind, thread, s, e in sorted(recs, key=lambda r: Timeline.ORDER.index(r[0])):
            y = threads.index(thread)
            ax.barh(y, (e - s) * 1000, left=s * 1000, color=colors[kind], edgecolor="white", linewidth=0.3)
        names_y = [tr("main thread") if t == "MainThread" else tr("background thread") for t in threads]
        ax.set_yticks(range(len(threads)), names_y, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, end * 1000 * 1.02)
        ax.set_title(label, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel(tr("time (ms)"))
    from matplotlib.patches import Patch

    fig.legend(handles=[Patch(color=c, label=names[k]) for k, c in colors.items()], loc="upper right", ncol=3, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
