"""仓库根目录：课程里所有的路径（章节文件、笔记本、模型、文档）都从这里算起。

全仓库只在这里计算一次；工具、检查、笔记本一律 ``from minisgl.paths import REPO_ROOT``。
模型目录见 :func:`minisgl.model_zoo.models_dir`（它可以用环境变量 ``MINISGL_MODELS_DIR`` 换到别处）。
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["COURSE_ROOT", "REPO_ROOT", "load_script", "workspace_root"]

REPO_ROOT = Path(__file__).resolve().parents[1]
#: 课程根目录：随课程发布的解答所在处。测试课程机制时可指向一个只有演示章节的小课程，
#: 它的 ``chapters.json`` 代替内置的章节表。
#: en: The course root, where the shipped solutions are. Tests of the course machinery may point it at a small course
#: of demo chapters, whose ``chapters.json`` replaces the built-in chapter table.
COURSE_ROOT = Path(os.environ.get("MINISGL_COURSE_ROOT") or REPO_ROOT).resolve()


def workspace_root() -> Path:
    """学员工作区：含 stage1/、stage2/ 的目录（``MINISGL_WORKSPACE``）；默认就是课程根目录。

    en: The learner's workspace, the folder holding stage1/, stage2/ (``MINISGL_WORKSPACE``); the course root by default."""
    return Path(os.environ.get("MINISGL_WORKSPACE") or COURSE_ROOT).resolve()


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
