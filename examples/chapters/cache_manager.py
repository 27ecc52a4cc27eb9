"""第 2.2 章示例：页面按需分配、请求结束就回收；页面不够时新请求先等着；放不下的请求立刻报错。

    python examples/chapters/cache_manager.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _trace import describe, trace_steps  # noqa: E402

from minisgl.cache_manager import LLM  # noqa: E402
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.model_zoo import smollm2  # noqa: E402

# 10 页 × 每页 4 个 token；三个请求（提示词 + 8 个输出）分别要 4、3、5 页，放不下全部三个
llm = LLM(smollm2(), max_running_req=4, num_page_override=10, page_size=4, max_seq_len_override=40)
cm = llm.cache_manager
print(f"KV 池：{cm.num_pages} 页 × page_size {cm.page_size}；请求槽 {llm.max_running_req} 个")


def show(step, trace):  # noqa: ANN001, ANN201
    print(f"{describe(step, trace)}  （为这一步分配之后，空闲 {cm.num_pages - trace.pages_in_use} 页）")


trace_steps(llm, show=show)
prompts = ["The capital of France is", "Water boils at", "1, 2, 3, 4,"]
for i, p in enumerate(prompts):
    n = len(llm.tokenizer.encode(p))
    print(f"请求{i}：提示词 {n} 个 token + 8 个输出 → 需要 {cm.tokens_needed(n + 8, 0) // cm.page_size} 页")
outputs = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
for i, out in enumerate(outputs):
    print(f"请求{i}：{out['text']!r}")
print(f"结束后：空闲 {len(cm.free_slots)} 页，前缀缓存 {cm.prefix_cache.size_info.total_size} 个 token；完整性检查通过")

try:
    llm.generate(["one two three four five six seven eight nine ten " * 4], SamplingParams(max_tokens=8))
except ValueError as err:
    print(f"太长的请求：{err}")
llm.shutdown()
