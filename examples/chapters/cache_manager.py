"""第 2.2 章示例：页面按需分配、请求结束就回收；页面不够时新请求先等着；放不下的请求立刻报错。

    python examples/chapters/cache_manager.py

en: Chapter 2.2 example: pages allocated on demand and reclaimed when a request finishes; a new request waits while
pages are short; a request that can never fit raises at once.

    python examples/chapters/cache_manager.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _trace import describe, trace_steps  # noqa: E402

from minisgl.cache_manager import PARTS  # noqa: E402
from minisgl.scheduler import Scheduler  # noqa: E402
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.i18n import tr  # noqa: E402
from minisgl.model_zoo import smollm2  # noqa: E402

# 10 页 × 每页 4 个 token；三个请求（提示词 + 8 个输出）分别要 4、3、5 页，放不下全部三个
# en: 10 pages × 4 tokens each; three requests (prompt + 8 outputs) need 4, 3 and 5 pages, so all three do not fit
llm = Scheduler(smollm2(), parts=PARTS, max_running_req=4, num_page_override=10, page_size=4, max_seq_len_override=40)
cm = llm.cache_manager
print(tr("KV pool: {num_pages} pages × page_size {page_size}; {max_running_req} request slots",
         num_pages=cm.num_pages, page_size=cm.page_size, max_running_req=llm.max_running_req))


def show(step, trace):  # noqa: ANN001, ANN201
    print(tr("{step}  (after allocating for this step: {free} pages free)",
             step=describe(step, trace), free=cm.num_pages - trace.pages_in_use))


trace_steps(llm, show=show)
prompts = ["The capital of France is", "Water boils at", "1, 2, 3, 4,"]
for i, p in enumerate(prompts):
    n = len(llm.tokenizer.encode(p))
    print(tr("req{i}: {n} prompt tokens + 8 outputs → needs {pages} pages",
             i=i, n=n, pages=cm.tokens_needed(n + 8, 0) // cm.page_size))
outputs = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
for i, out in enumerate(outputs):
    print(tr("req{i}: {text!r}", i=i, text=out["text"]))
print(tr("Afterwards: {n_free_slots} pages free, {total_size} tokens in the prefix cache; integrity check passed",
         n_free_slots=len(cm.free_slots), total_size=cm.prefix_cache.size_info.total_size))

try:
    llm.generate(["one two three four five six seven eight nine ten " * 4], SamplingParams(max_tokens=8))
except ValueError as err:
    print(tr("A request that is too long: {err}", err=err))
llm.shutdown()
