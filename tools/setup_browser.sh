#!/usr/bin/env bash
# 安装文档浏览器检查（checks/docs/test_browser.py）用的无头浏览器：Debian 的 chromium 与 chromium-driver，
# 外加一套中文字体（fonts-wqy-microhei，否则截图里的汉字都是方块）。
# 可重复运行：已经装好就什么也不做。只有 root 才会调用 apt-get；否则打印该怎么做。
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }
# 按 MINISGL_LANG 说一种语言：say "中文" "English"。
say() { if [ "${MINISGL_LANG:-zh}" = en ]; then echo "$2"; else echo "$1"; fi; }

has_cjk_font() { command -v fc-list >/dev/null 2>&1 && fc-list :lang=zh family | grep -q .; }

if have chromium && have chromedriver && has_cjk_font; then
    exit 0
fi

pkgs="chromium chromium-driver fonts-wqy-microhei"
if [ "$(id -u)" != 0 ]; then
    say "缺少无头浏览器（文档的浏览器检查要用）。请用 root 运行：" \
        "The headless browser (used by the book's browser checks) is missing. As root, run:" >&2
    echo "    apt-get update && apt-get install -y --no-install-recommends $pkgs" >&2
    say "或者用 sudo 重新运行 bash tools/setup_browser.sh。" "or run bash tools/setup_browser.sh again with sudo." >&2
    exit 1
fi
if ! have apt-get; then
    say "这台机器没有 apt-get：请自行安装 Chromium 与对应版本的 chromedriver，" \
        "This machine has no apt-get: install Chromium and the matching chromedriver yourself," >&2
    say "并保证 chromium 与 chromedriver 在 PATH 上（或设置 MINISGL_CHROMIUM / MINISGL_CHROMEDRIVER）。" \
        "and make sure chromium and chromedriver are on PATH (or set MINISGL_CHROMIUM / MINISGL_CHROMEDRIVER)." >&2
    exit 1
fi
say "正在安装 $pkgs（apt-get）……" "Installing $pkgs (apt-get)…"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends $pkgs
have chromium && have chromedriver || {
    say "安装后仍找不到 chromium / chromedriver。" "chromium / chromedriver still not found after the installation." >&2
    exit 1
}
say "已安装：$(chromium --version 2>/dev/null | head -1)" "Installed: $(chromium --version 2>/dev/null | head -1)"
