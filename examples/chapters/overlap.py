"""第 2.5 章示例：重叠调度开与关，输出逐 token 相同；看一看一步里主机和设备各在做什么。

    python examples/chapters/overlap.py
"""

import time

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.model_zoo import smollm2
from minisgl.overlap import LLM

llm = LLM(smollm2(), max_running_req=4, num_page_override=512, max_seq_len_override=128)
prompts = ["The capital of France is", "Water boils at", "1, 2, 3, 4,", "My favourite colour is"]
params = SamplingParams(max_tokens=12)

llm.generate(prompts, SamplingParams(max_tokens=2))  # 预热：第一次遇到某个批大小时，oneDNN 要准备计算原语
results = {}
for overlap in (False, True):
    ENV.DISABLE_OVERLAP_SCHEDULING = not overlap
    t0 = time.perf_counter()
    results[overlap] = llm.generate(prompts, params)
    took = time.perf_counter() - t0
    print(f"重叠调度{'开' if overlap else '关'}：{took:.2f} s")
ENV.DISABLE_OVERLAP_SCHEDULING = False

same = [r["token_ids"] for r in results[True]] == [r["token_ids"] for r in results[False]]
print(f"两种主循环的输出逐 token 相同：{same}")
for prompt, out in zip(prompts, results[True]):
    print(f"{prompt!r} → {out['text']!r}")

# 看一步里的先后：发出第 N 步之后，才处理第 N-1 步的结果
events = []
launch, process = llm._forward, llm._process_last_data
llm._forward = lambda fi: (events.append(f"发出 {fi.batch.phase}×{fi.batch.size}"), launch(fi))[1]
llm._process_last_data = lambda last: (events.append("处理上一步的结果" if last else "（没有上一步）"), process(last))[1]
llm.generate(prompts[:2], SamplingParams(max_tokens=3, ignore_eos=True))
print("重叠调度的前几件事：" + " → ".join(events[:7]))
llm.shutdown()
