"""第 4 阶段检查共用的夹具：小模型的路径（秩进程按路径加载）。

en: Shared fixtures of the stage 4 checks: the small models' paths (rank processes load them by path).
"""

from __future__ import annotations

import pytest

from minisgl import model_zoo


@pytest.fixture(scope="session")
def tiny_path() -> str:
    return str(model_zoo.tiny_qwen3())


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    return str(model_zoo.smollm2())


@pytest.fixture(scope="session")
def moe_path() -> str:
    return str(model_zoo.tiny_qwen3_moe())
