"""文档检查共用的夹具：整本书只构建一次（mkdocs build --strict），两份检查都用它。"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minisgl.paths import REPO_ROOT as REPO



@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mkdocs build --strict`` 到临时目录：断链、找不到的文件或符号、缺失的输出都会让它失败。"""
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env.pop("MINISGL_DOCS_SOLUTIONS", None)  # the learner's book: no reference solutions
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "-d", str(site)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0:
        problems = [l for l in (proc.stdout + proc.stderr).splitlines() if "ERROR" in l or "WARNING" in l]
        detail = "\n".join(problems) or (proc.stdout + proc.stderr)[-3000:]
        pytest.fail(f"mkdocs build --strict 失败（退出码 {proc.returncode}）：\n{detail}", pytrace=False)
    assert (site / "index.html").is_file(), "mkdocs 构建结束了，但没有生成 index.html"
    return site
