#!/usr/bin/env bash
# 一键安装：Python 依赖 + 离线模型（models/）。可重复运行：已装好、已构建的部分会直接跳过。
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python || command -v python3)}"
# 说一种语言：say "中文" "English"，按 MINISGL_LANG，没设时按工作区选定的（python -m minisgl.course lang）。
# en: Speak one language: say "中文" "English", by MINISGL_LANG, else the workspace's choice (python -m minisgl.course lang).
say() { if [ "${MINISGL_LANG:-$(cat .minisgl/language 2>/dev/null || echo zh)}" = en ]; then echo "$2"; else echo "$1"; fi; }

mkdir -p .minisgl
stamp=.minisgl/setup.stamp
want="$(cat pyproject.toml tools/setup.sh | sha256sum | cut -c1-16) $("$PY" -c 'import sys; print(sys.prefix)')"
# 在仓库外检查导入：在仓库里 ``python -c`` 总能从当前目录导入 minisgl，即使可编辑安装指向的是别处（搬过的旧克隆）。
repo="$(pwd -P)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! (cd / && "$PY" -c "import minisgl, torch, transformers, gguf, pathlib, sys; sys.exit(str(pathlib.Path(minisgl.__file__).resolve().parents[1]) != sys.argv[1])" "$repo") 2>/dev/null; then
    if ! "$PY" -c "import torch" 2>/dev/null; then
        # 这里给出一个确切版本：在课程的机器上它是本地磁盘上的 CPU 版；别处则是 PyPI 上的普通 torch。
        "$PY" -m pip install "torch==${MINISGL_TORCH_VERSION:-2.13.0}" || {
            say "安装 torch 失败：请检查能否访问 PyPI，或先自行安装 torch 再运行 make setup。" \
                "Installing torch failed: check that PyPI can be reached, or install torch yourself, then run make setup." >&2
            exit 1
        }
    fi
    # 可编辑安装对这个 Python 只有一份：别的克隆装过时，这里一装，那个克隆里 ``import minisgl`` 也会导入这一份。
    # en: an editable install is one per Python: if another clone installed it, installing here makes ``import minisgl``
    # en: in that clone load this one too.
    other="$(cd / && "$PY" -c "import minisgl, pathlib; print(pathlib.Path(minisgl.__file__).resolve().parents[1])" 2>/dev/null || true)"
    if [ -n "$other" ] && [ "$other" != "$repo" ] && [ -d "$other" ]; then
        say "注意：这个 Python 的 minisgl 原来装的是另一个克隆 $other；现在改成这一个（$repo）。在那边导入 minisgl 也会得到这一份，那边再运行 make setup 会改回去；两个克隆要同时用，请各建一个虚拟环境（python -m venv .venv）。" \
            "Note: this Python's minisgl was installed from another clone, $other; it now points to this one ($repo). Importing minisgl there gets this one too, and make setup there points it back; to use both clones at once, give each its own virtual environment (python -m venv .venv)." >&2
    fi
    "$PY" -m pip install -e ".[all]" || {
        say "安装依赖失败：请检查能否访问 PyPI，然后重新运行 make setup。" \
            "Installing the dependencies failed: check that PyPI can be reached, then run make setup again." >&2
        exit 1
    }
    echo "$want" > "$stamp"
fi
say "import minisgl → $repo（$PY）" "import minisgl → $repo ($PY)"
"$PY" tools/build_models.py
# 文档的浏览器检查要用 Debian 的无头 Chromium；不是 root 时只提示怎么装，不中断安装。
bash tools/setup_browser.sh || say "（跳过了浏览器安装：文档的浏览器检查会失败，其余不受影响。）" \
    "(Browser installation skipped: the book's browser checks will fail, nothing else is affected.)"
if [ ! -f .minisgl/language ]; then
    say "只用一种语言学？python -m minisgl.course lang zh（或 en）：你的文件、提示和检查消息就只用这一种。" \
        "Learning in one language? python -m minisgl.course lang en (or zh): your files, hints and check messages use only it."
fi
