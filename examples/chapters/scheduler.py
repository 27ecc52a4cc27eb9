"""第 2.1 章示例：LLM.generate 的每一步——预填充优先、连续批处理（请求一结束，等待的请求就加入）。

每一步做了什么，用 ``llm.add_step_listener`` 来看：每一步的结果处理完，调度器就把这一步的轨迹交给监听者。

    python examples/chapters/scheduler.py
"""

from minisgl.core import SamplingParams
from minisgl.model_zoo import smollm2
from minisgl.scheduler import LLM

# 只有 2 个请求槽：第 3 个请求要等前面有一个结束
llm = LLM(smollm2(), max_running_req=2, num_page_override=256, max_seq_len_override=128)
print(f"请求槽 {llm.max_running_req} 个；静态分页：每个槽固定 {llm.cache_manager.max_req_tokens} 个 token 的位置")

traces = []


def show(trace):  # 轨迹里的长度是这一步发出之前的
    traces.append(trace)
    kind = "预填充" if trace.is_prefill else "解码  "
    work = "，".join(f"请求{uid}×{n}" for uid, n in zip(trace.uids, trace.extend_lens))
    print(f"第 {trace.index + 1:>2} 步 {kind} {work}")


remove = llm.add_step_listener(show)
prompts = ["The capital of France is", "Water boils at", "1, 2, 3, 4,"]
params = [SamplingParams(max_tokens=2), SamplingParams(max_tokens=5), SamplingParams(max_tokens=4)]
outputs = llm.generate(prompts, params)
remove()
for i, (prompt, out) in enumerate(zip(prompts, outputs)):
    print(f"请求{i}：{prompt!r} → {out['text']!r}（{len(out['token_ids'])} 个 token）")

t = traces[3]
print(f"第 4 步的轨迹：请求 {t.uids} 占页表第 {t.rows} 行，发出前已缓存 {t.cached_lens}，KV 池占用 {t.pages_in_use} 页")
ms = {name: 1000 * (end - start) for name, (start, end) in [("准备", t.prepare), ("前向", t.forward), ("处理结果", t.process)]}
print("  主机上的时间：" + "，".join(f"{name} {v:.2f} ms" for name, v in ms.items()) + f"（前向在 {t.forward_thread} 里）")
llm.shutdown()
