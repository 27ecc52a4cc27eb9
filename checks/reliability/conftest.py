"""可靠性检查共用的东西：tiny 模型上的 LLM 工厂，以及空闲时的不变式。"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from minisgl import model_zoo

TINY_KW: dict[str, Any] = dict(dtype=torch.float32, device="auto", max_running_req=8, num_page_override=2048, max_seq_len_override=512)


@pytest.fixture(scope="session")
def tiny_path() -> str:
    try:
        return str(model_zoo.tiny_qwen3())
    except FileNotFoundError as e:
        pytest.fail(str(e), pytrace=False)


def assert_idle(llm: Any) -> None:
    """空闲时：没有请求在排队或在途，请求槽全部空闲，页面全部回来（空闲 + 缓存 == 总数），没有锁。"""
    assert not llm.busy, "调度器里还有请求"
    assert llm.table_manager.available_size == llm.max_running_req, "请求槽没有全部归还"
    cm = llm.cache_manager
    info = cm.prefix_cache.size_info
    assert info.protected_size == 0, f"还有 {info.protected_size} 个 token 被锁着"
    assert len(cm.free_slots) + info.total_size // cm.page_size == cm.num_pages, "页面没有全部回来"
    llm.check_integrity()
