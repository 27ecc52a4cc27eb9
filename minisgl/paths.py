"""仓库根目录：课程里所有的路径（章节文件、笔记本、模型、文档）都从这里算起。

全仓库只在这里计算一次；工具、检查、笔记本一律 ``from minisgl.paths import REPO_ROOT``。
模型目录见 :func:`minisgl.model_zoo.models_dir`（它可以用环境变量 ``MINISGL_MODELS_DIR`` 换到别处）。
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO_ROOT"]

REPO_ROOT = Path(__file__).resolve().parents[1]
