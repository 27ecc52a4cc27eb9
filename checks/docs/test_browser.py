"""在真的浏览器里看讲义：本地起一个 HTTP 服务，用无头 Chromium 打开首页、一章、第二阶段里程碑页并搜索。

浏览器只访问 127.0.0.1；控制台不能有错误；代码块与录制的输出要真的显示出来；搜索 "Radix" 要有结果。
截图存到 artifacts/screenshots/（git 忽略，CI 当作产物收集）。
需要 Debian 的 chromium 与 chromium-driver（``bash tools/setup_browser.sh``）和 pip 包 selenium。
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import socketserver
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from minisgl.paths import REPO_ROOT as REPO

SHOTS = REPO / "artifacts" / "screenshots"
CHROMIUM = os.environ.get("MINISGL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = os.environ.get("MINISGL_CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--disable-default-apps", "--disable-extensions", "--mute-audio",
    "--window-size=1280,900", "--lang=zh-CN",
)
SETUP_HINT = "请运行 bash tools/setup_browser.sh（root 下用 apt-get 安装 chromium 与 chromium-driver），再 pip install selenium。"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        pass


@pytest.fixture(scope="module")
def site_url(built_site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(built_site))
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def driver():  # noqa: ANN201 - selenium type is optional
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail(f"没有安装 selenium。{SETUP_HINT}", pytrace=False)
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).is_file()]
    if missing:
        pytest.fail(f"找不到无头浏览器：{', '.join(missing)}。{SETUP_HINT}", pytrace=False)
    os.environ.setdefault("SE_AVOID_STATS", "true")  # selenium 不要联网统计
    profile = tempfile.mkdtemp(prefix="minisgl-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        drv = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    except Exception as err:  # noqa: BLE001 - report any start-up failure plainly
        shutil.rmtree(profile, ignore_errors=True)
        pytest.fail(f"启动无头 Chromium 失败：{err}\n{SETUP_HINT}", pytrace=False)
    drv.set_page_load_timeout(60)
    SHOTS.mkdir(parents=True, exist_ok=True)
    yield drv
    drv.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _wait(drv, predicate, what: str, timeout: float = 20.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate(drv)
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"等了 {timeout:.0f} 秒，{what}", pytrace=False)


def _open(drv, url: str) -> None:  # noqa: ANN001
    drv.get(url)
    _wait(drv, lambda d: d.execute_script("return document.readyState") == "complete", f"{url} 还没加载完")
    time.sleep(0.5)  # material 的脚本在 load 之后还要初始化（代码复制按钮、搜索）


def _errors(drv) -> list[str]:  # noqa: ANN001
    return [e["message"] for e in drv.get_log("browser") if e.get("level") == "SEVERE"]


def _screenshot(drv, name: str) -> None:  # noqa: ANN001
    height = drv.execute_script("return Math.min(document.documentElement.scrollHeight, 8000)")
    drv.set_window_size(1280, max(900, int(height)))
    drv.save_screenshot(str(SHOTS / f"{name}.png"))
    drv.set_window_size(1280, 900)


def _count(drv, css: str) -> int:  # noqa: ANN001
    return int(drv.execute_script("return document.querySelectorAll(arguments[0]).length", css))


def test_home_page(driver, site_url: str) -> None:  # noqa: ANN001
    _open(driver, site_url + "/")
    assert "手写 mini-sglang" in driver.title, f"首页标题不对：{driver.title!r}"
    assert _count(driver, "article pre code") >= 1, "首页上没有代码块（两条 setup 命令应该在代码块里）"
    errors = _errors(driver)
    _screenshot(driver, "home")
    assert not errors, "首页的浏览器控制台有错误：\n" + "\n".join(errors)


def test_stage1_chapter_page(driver, site_url: str) -> None:  # noqa: ANN001
    _open(driver, site_url + "/stage1/core/")
    assert _count(driver, "div.included-code") >= 2, "第 1.1 章页面上没有从解答引用的代码块"
    assert _count(driver, "div.recorded-output") >= 1, "第 1.1 章页面上没有录制的运行结果"
    assert _count(driver, "h3.task") >= 1, "第 1.1 章页面上没有任务标题"
    assert _count(driver, "button.md-clipboard, button.md-code__button") >= 1, "代码块上没有复制按钮"
    errors = _errors(driver)
    _screenshot(driver, "stage1_core")
    assert not errors, "第 1.1 章页面的浏览器控制台有错误：\n" + "\n".join(errors)


def test_stage2_milestone_page(driver, site_url: str) -> None:  # noqa: ANN001
    _open(driver, site_url + "/stage2/milestone/")
    assert _count(driver, "div.included-code") >= 1, "第二阶段里程碑页上没有里程碑脚本的代码"
    assert _count(driver, "div.recorded-output") >= 1, "第二阶段里程碑页上没有录制的输出"
    text = driver.execute_script("return document.querySelector('div.recorded-output').innerText")
    for number in ("231", "73", "[96, 96, 96, 14]"):
        assert number in text, f"里程碑页显示的输出里没有 {number}"
    errors = _errors(driver)
    _screenshot(driver, "stage2_milestone")
    assert not errors, "第二阶段里程碑页的浏览器控制台有错误：\n" + "\n".join(errors)


def test_search_finds_radix(driver, site_url: str) -> None:  # noqa: ANN001
    from selenium.webdriver.common.by import By

    _open(driver, site_url + "/")
    toggle = driver.find_element(By.CSS_SELECTOR, "label.md-header__button[for='__search']")
    if toggle.is_displayed():  # 窄屏：先点放大镜；宽屏：搜索框直接在页眉里
        toggle.click()
    box = driver.find_element(By.CSS_SELECTOR, "input.md-search__input")
    _wait(driver, lambda d: box.is_displayed(), "搜索框没有显示出来")
    box.click()
    box.send_keys("Radix")
    _wait(driver, lambda d: _count(d, "li.md-search-result__item") > 0, "搜索 Radix 没有结果")
    results = driver.execute_script(
        "return Array.from(document.querySelectorAll('li.md-search-result__item')).map(e => e.innerText).join('\\n')"
    )
    assert "radix" in results.lower(), f"搜索结果里没有 Radix：{results[:500]}"
    errors = _errors(driver)
    driver.save_screenshot(str(SHOTS / "search_radix.png"))
    assert not errors, "搜索时浏览器控制台有错误：\n" + "\n".join(errors)


def test_english_chapter_page_and_switcher(driver, site_url: str) -> None:  # noqa: ANN001
    """英文版：页眉的语言切换从中文页跳到同一章的英文页；英文页有引用的代码、任务和英文的提示命令。"""
    from selenium.webdriver.common.by import By

    _open(driver, site_url + "/stage1/core/")
    links = driver.find_elements(By.CSS_SELECTOR, "div.md-select a[hreflang='en']")
    assert links, "页眉里没有切换到 English 的链接"
    href = links[0].get_attribute("href")
    assert href.rstrip("/").endswith("/en/stage1/core"), f"语言切换没有指向同一章的英文页：{href}"
    _open(driver, href)
    assert "Handwritten mini-sglang" in driver.title, f"英文页的标题不对：{driver.title!r}"
    assert _count(driver, "div.included-code") >= 2, "英文的第 1.1 章页面上没有从解答引用的代码块"
    assert _count(driver, "h3.task") >= 1, "英文的第 1.1 章页面上没有任务标题"
    text = driver.execute_script("return document.querySelector('article').innerText")
    assert "Goal" in text and "Stuck?" in text and "Hands on" in text, "英文页上的任务（目标、要提示的命令）和“动手”块不是英文"
    assert "Hint 1" not in text, "学员的书里不放提示：提示在终端里按级给出"
    errors = _errors(driver)
    _screenshot(driver, "en_stage1_core")
    assert not errors, "英文的第 1.1 章页面的浏览器控制台有错误：\n" + "\n".join(errors)
