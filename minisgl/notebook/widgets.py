"""交互控件：一组控件加一块输出区，参数一变就重跑实验，把打印的文字和画的图写进控件自己。"""

from __future__ import annotations

import contextlib
import io
from typing import Any, Callable

from minisgl.i18n import tr

__all__ = ["Explorer", "capture"]


def _widget_note() -> str:
    """控件在纯文本里的样子（nbval 比较的就是它），按当前语言。"""
    return tr("(interactive widget: run this cell in Jupyter to adjust it; the next cell calls the same handler with one set of values)")


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
            names = ", ".join(sorted(unknown))
            raise KeyError(tr("No such controls: {unknown}; available: {available}", unknown=names, available=", ".join(self.controls)))
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
        bundle["text/plain"] = _widget_note()
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
        buf.write("\n" + tr("Error: {kind}: {err}", kind=type(err).__name__, err=err) + "\n")
    images = []
    for num in [n for n in plt.get_fignums() if n not in before]:
        fig = plt.figure(num)
        out = io.BytesIO()
        fig.savefig(out, format="png", bbox_inches="tight")
        images.append(out.getvalue())
        plt.close(fig)
    return buf.getvalue(), images
