"""浏览器里的对话页面（``GET /``）：一个 HTML + JavaScript 文件，不用构建、不连外网；文字按当前语言填进去。

en: The chat page in the browser (``GET /``): one HTML + JavaScript file, no build step, no network; its text is filled
in for the current language.
"""

from __future__ import annotations

import json

from minisgl.i18n import lang, tr
from minisgl.paths import REPO_ROOT

#: 页面模板；``{{key}}`` 处填文字。
#: en: The page template; text goes where ``{{key}}`` stands.
CHAT_PAGE = REPO_ROOT / "minisgl" / "server" / "static" / "chat.html"


def page_text() -> dict[str, str]:
    """对话页面上的文字（按当前语言）。

    en: The text on the chat page (in the current language).
    """
    return {
        "lang": "zh-CN" if lang() == "zh" else "en", "title": tr("mini-sglang chat"), "send": tr("Send"), "stop": tr("Stop"),
        "clear": tr("New chat"), "max_tokens": tr("Max tokens"), "temperature": tr("Temperature"),
        "api_key": tr("API key"), "placeholder": tr("Type a message; Enter sends, Shift+Enter starts a new line"),
        "ready": tr("Ready."), "streaming": tr("Streaming…"), "stopped": tr("Stopped."), "done": tr("Done."),
        "error": tr("Error:"), "tokens": tr("tokens"),
    }


def chat_page(model_name: str) -> str:
    """填好文字和模型名的页面。

    en: The page with its text and the model's name filled in.
    """
    page = CHAT_PAGE.read_text(encoding="utf-8")
    for key, text in {**page_text(), "model": model_name}.items():
        page = page.replace("{{" + key + "}}", json.dumps(text, ensure_ascii=False)[1:-1])
    return page
