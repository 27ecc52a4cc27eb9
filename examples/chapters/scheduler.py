"""第 2.1 章示例：LLM.generate 的每一步——预填充优先、连续批处理（请求一结束，等待的请求就加入）。

    python examples/chapters/scheduler.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _trace import describe, trace_steps  # noqa: E402

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.model_zoo import smollm2  # noqa: E402
from minisgl.scheduler import LLM  # noqa: E402

# 只有 2 个请求槽：第 3 个请求要等前面有一个结束
llm = LLM(smollm2(), max_running_req=2, num_page_override=256, max_seq_len_override=128)
print(f"请求槽 {llm.max_running_req} 个；静态分页：每个槽固定 {llm.cache_manager.max_req_tokens} 个 token 的位置")
trace_steps(llm, show=lambda *step: print(describe(*step)))
prompts = ["The capital of France is", "Water boils at", "1, 2, 3, 4,"]
params = [SamplingParams(max_tokens=2), SamplingParams(max_tokens=5), SamplingParams(max_tokens=4)]
outputs = llm.generate(prompts, params)
for i, (prompt, out) in enumerate(zip(prompts, outputs)):
    print(f"请求{i}：{prompt!r} → {out['text']!r}（{len(out['token_ids'])} 个 token）")
llm.shutdown()
