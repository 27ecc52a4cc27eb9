"""第 2.5 章示例：重叠调度开与关，输出逐 token 相同；看一看一步里主机和设备各在做什么。

    python examples/chapters/overlap.py

en: Chapter 2.5 example: overlap scheduling on and off gives the same output, token for token; a look at what the host
and the device are each doing within a step.

    python examples/chapters/overlap.py
"""

import time

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.i18n import tr
from minisgl.model_zoo import smollm2
from minisgl.overlap import PARTS
from minisgl.scheduler import Scheduler

llm = Scheduler(smollm2(), parts=PARTS, max_running_req=4, num_page_override=512, max_seq_len_override=128)
prompts = ["The capital of France is", "Water boils at", "1, 2, 3, 4,", "My favourite colour is"]
params = SamplingParams(max_tokens=12)

# 预热：第一次遇到某个批大小时，oneDNN 要准备计算原语
# en: warm-up: the first time oneDNN meets a batch size, it prepares its primitives
llm.generate(prompts, SamplingParams(max_tokens=2))
results = {}
for overlap in (False, True):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    t0 = time.perf_counter()
    results[overlap] = llm.generate(prompts, params)
    took = time.perf_counter() - t0
    if overlap:
        print(tr("Overlap scheduling on: {took:.2f} s", took=took))
    else:
        print(tr("Overlap scheduling off: {took:.2f} s", took=took))
ENV.DISABLE_OVERLAP_SCHEDULING.value = False

same = [r["token_ids"] for r in results[True]] == [r["token_ids"] for r in results[False]]
print(tr("Both main loops give the same output token by token: {same}", same=same))
for prompt, out in zip(prompts, results[True]):
    print(f"{prompt!r} → {out['text']!r}")

# 看一步里的先后：每一步的轨迹记着它什么时候发出（准备完）、什么时候开始处理结果，按时间排一排
# en: the order of events within a step: each step's trace records when it was launched (prepared) and when processing
# en: its results began; sort them by time
traces = []
remove = llm.add_step_listener(traces.append)
llm.generate(prompts[:2], SamplingParams(max_tokens=3, ignore_eos=True))
remove()
first = traces[0].index
events = [(t.prepare[1], tr("issue step {step} ({phase}×{n_uids})",
                            step=t.index - first, phase=t.phase, n_uids=len(t.uids))) for t in traces]
events += [(t.process[0], tr("process the results of step {step}", step=t.index - first)) for t in traces]
print(tr("Order of events with overlap scheduling: ") + " → ".join(name for _, name in sorted(events)))
print(tr("Thread the forward runs in: {threads}", threads=sorted({t.forward_thread for t in traces})))
llm.shutdown()
