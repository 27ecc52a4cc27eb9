"""课程的两种语言：中文（默认）和英文，用 ``MINISGL_LANG=zh|en`` 选择；没设时用工作区里选定的
（``python -m minisgl.course lang en`` 记在 ``.minisgl/language``）。

学员看到的每一句话（检查的失败消息、任务提示、course 命令、pytest 汇总、示例的输出）都写成
``tr("English text {n}", n=...)``：源码里是英文原文，中文译文在 ``minisgl/locale/*.toml``
（英文原文 → 中文，多个文件按领域分开，加载时合并）。这样只有一份消息来源，
``checks/course/test_i18n.py`` 保证每条消息都有译文、没有多余的译文、占位符两边一致。

The course speaks Chinese by default and English with ``MINISGL_LANG=en``, or the language chosen for the workspace
(``python -m minisgl.course lang en``, kept in ``.minisgl/language``) when the variable is not set. Messages are written in English
in the source (``tr``) and translated to Chinese in the TOML catalogue, gettext style.
"""

from __future__ import annotations

import os
import re
import string
import sys
from functools import lru_cache
from pathlib import Path

from minisgl.paths import workspace_root

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

LANGS = ("zh", "en")
#: 中日韩文字和全角标点：检查“英文输出里没有中文”、提示是不是中文，都用这一个。
CJK = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]")
LOCALE_DIR = Path(__file__).with_name("locale")
#: 工作区里选定的语言（相对工作区根目录）。 | en: The language chosen for a workspace (relative to its root).
LANGUAGE_FILE = Path(".minisgl") / "language"


def saved_language(workspace: Path | None = None) -> str | None:
    """工作区（默认 :func:`minisgl.paths.workspace_root`）选定的语言，没选过或写坏了是 None。每个进程每个工作区只读
    一次文件（``tr`` 每次都问）；``course lang`` 改了选择之后调 :func:`forget_saved_language`。

    en: The language chosen for the workspace (default :func:`minisgl.paths.workspace_root`); None when none was chosen
    or the file is garbled. The file is read once per process and workspace (``tr`` asks every time); ``course lang``
    calls :func:`forget_saved_language` after changing the choice."""
    return _language_in(workspace or os.environ.get("MINISGL_WORKSPACE"))


@lru_cache(maxsize=8)
def _language_in(workspace: Path | str | None) -> str | None:
    """``workspace`` as given (None: the environment's), so a cached answer costs no path resolution."""
    root = Path(workspace) if workspace else workspace_root()
    try:
        value = (root / LANGUAGE_FILE).read_text(encoding="utf-8").strip().lower()
    except (OSError, UnicodeDecodeError):
        return None
    return value if value in LANGS else None


def forget_saved_language() -> None:
    """选择刚改过：下次再读文件。 | en: The choice just changed: read the file again next time."""
    _language_in.cache_clear()


def lang() -> str:
    """当前语言：环境变量 ``MINISGL_LANG``；没设时是工作区选定的语言；都没有就是 ``zh``。

    en: The current language: ``MINISGL_LANG``; when unset, the workspace's chosen one; else ``zh``."""
    value = os.environ.get("MINISGL_LANG", "").strip().lower() or saved_language() or "zh"
    if value not in LANGS:
        raise ValueError(
            f"MINISGL_LANG={value!r}：只支持 zh（中文）或 en（English） / only zh (Chinese) or en (English)"
        )
    return value


@lru_cache(maxsize=1)
def catalogue() -> dict[str, str]:
    """英文原文 → 中文译文，合并 ``minisgl/locale/*.toml``；同一条原文出现在两个文件里就报错。"""
    merged: dict[str, str] = {}
    for path in sorted(LOCALE_DIR.glob("*.toml")):
        with path.open("rb") as f:
            entries = tomllib.load(f)
        for msgid, text in entries.items():
            if msgid in merged and merged[msgid] != text:
                raise ValueError(f"{path.name}: message {msgid!r} is translated twice, differently")
            merged[msgid] = text
    return merged


def placeholders(template: str) -> set[str]:
    """``str.format`` 模板里的字段名（检查译文与原文的占位符是否一致）。"""
    return {field.split(".")[0].split("[")[0] for _, field, _, _ in string.Formatter().parse(template) if field}


def tr(msgid: str, /, *, language: str | None = None, **values: object) -> str:
    """按当前语言（或 ``language``）给出一条消息；有 ``values`` 时用 ``str.format`` 填进去。

    没有译文时退回英文原文（``test_i18n`` 会让这种漏译在 CI 里失败），绝不因翻译让真正的错误被掩盖。
    """
    text = msgid if (language or lang()) == "en" else catalogue().get(msgid, msgid)
    return text.format(**values) if values else text
