"""仓库根目录：课程里所有的路径（章节文件、笔记本、模型、文档）都从这里算起。

全仓库只在这里计算一次；工具、检查、笔记本一律 ``from minisgl.paths import REPO_ROOT``。
模型目录见 :func:`minisgl.model_zoo.models_dir`（它可以用环境变量 ``MINISGL_MODELS_DIR`` 换到别处）。
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["REPO_ROOT", "load_script"]

REPO_ROOT = Path(__file__).resolve().parents[1]


def load_script(relpath: str, name: str) -> ModuleType:
    """把仓库里的一个脚本（``tools/`` 下的，不是包）按路径加载成模块 ``name``：先登记进 ``sys.modules``
    （数据类要用；再次加载直接返回它），脚本所在的目录放进 ``sys.path``（它导入旁边的模块，像直接运行时一样）。

    en: Load a script of the repo (under ``tools/``, not a package) by path as module ``name``: registered
    in ``sys.modules`` first (dataclasses need it; loading again returns it), with the script's folder on ``sys.path``
    (it imports its neighbours, as when run directly).
    """
    if name in sys.modules:
        return sys.modules[name]
    path = REPO_ROOT / relpath
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
