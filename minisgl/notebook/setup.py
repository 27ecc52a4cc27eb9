"""笔记本的第一格：准备环境（关掉进度条和无关的警告、固定随机种子、配好画图：中文版配中文字体），以及统一的时间写法。"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import warnings
from pathlib import Path

__all__ = ["setup_notebook", "fmt_ms", "show_source"]


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
    setup_matplotlib()
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


def setup_matplotlib(chinese: bool | None = None) -> None:
    """画图的统一设置。中文（默认跟随当前语言）时找一个中文字体；英文时图里没有汉字，用 matplotlib 自带的字体。"""
    import matplotlib
    from matplotlib import font_manager

    from minisgl.i18n import lang

    chinese = lang() == "zh" if chinese is None else chinese
    names = {f.name for f in font_manager.fontManager.ttflist} if chinese else set()
    found = next((n for n in _CJK_FONTS if n in names), None)
    if found is None and chinese:
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


def show_source(obj: object) -> None:
    """打印一个函数 / 类的源码，去掉它的文档字符串（正文已经讲了它做什么；这样两种语言的笔记本都只显示代码），
    注释只留笔记本那种语言的。"""
    import ast
    import inspect
    import textwrap

    from minisgl.course.bilingual import for_language
    from minisgl.i18n import lang

    source = for_language(textwrap.dedent(inspect.getsource(obj)), lang())
    lines = source.splitlines()
    tree = ast.parse(source)
    node = tree.body[0]
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        first, last = body[0].lineno, body[0].end_lineno or body[0].lineno
        del lines[first - 1 : last]
    print("\n".join(lines))
