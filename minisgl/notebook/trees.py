"""基数树前缀缓存的图和文字版：:func:`radix_nodes` 把缓存转成节点列表，:func:`draw_tree` 画一棵，
:func:`draw_radix_steps` 把几棵排成网格，:func:`format_radix` 给出同样内容的文字。"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from minisgl.i18n import tr
from minisgl.notebook.plots import _plt

__all__ = ["draw_tree", "radix_nodes", "draw_radix_steps", "format_radix"]


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
            label, color = tr("root"), "#dee2e6"
        else:
            ids = node.key.tolist()
            text = decode(ids) if decode else " ".join(map(str, ids))
            text = text.replace("\n", "⏎")
            if len(text) > width:
                text = text[: width - 1] + "…"
            label = tr("{text!r}\n{n_ids} tokens · ref={ref_count}", text=text, n_ids=len(ids), ref_count=node.ref_count)
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


def format_radix(cache: Any, decode: Callable[[list[int]], str] | None = None, width: int = 24) -> str:
    """基数树的文字版（与 :func:`radix_nodes` 画的图一致）：每行一个节点，缩进表示深度。"""
    lines: list[str] = []

    def walk(node: Any, depth: int) -> None:
        for child in sorted(node.children.values(), key=lambda c: c.key.tolist()):
            ids = child.key.tolist()
            text = (decode(ids) if decode else " ".join(map(str, ids))).replace("\n", "⏎")
            if len(text) > width:
                text = text[: width - 1] + "…"
            line = tr("└ {text!r}  {n_ids} tokens, ref={ref_count}", text=text, n_ids=len(ids), ref_count=child.ref_count)
            lines.append("  " * depth + line)
            walk(child, depth + 1)

    lines.append(tr("root"))
    walk(cache.root, 1)
    return "\n".join(lines)
