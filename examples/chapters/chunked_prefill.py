"""第 2.4 章示例：max_extend_tokens=8 时，一个 21 个 token 的提示词分块预填充，另一个请求的解码穿插在各块之间。

    python examples/chapters/chunked_prefill.py

en: Chapter 2.4 example: with max_extend_tokens=8, a 21-token prompt is prefilled in chunks, and another request's
decode steps come between the chunks.

    python examples/chapters/chunked_prefill.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _trace import describe, trace_steps  # noqa: E402

from minisgl.chunked_prefill import PARTS  # noqa: E402
from minisgl.scheduler import Scheduler  # noqa: E402
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.i18n import tr  # noqa: E402
from minisgl.model_zoo import smollm2  # noqa: E402

llm = Scheduler(smollm2(), parts=PARTS, max_running_req=4, num_page_override=256, max_seq_len_override=64, max_extend_tokens=8)
steps = trace_steps(llm, show=lambda i, trace: print(describe(i, trace)))
long_prompt = "Count with me: one, two, three, four, five, six, seven, eight, nine"
prompts = ["Water boils at", long_prompt]
print(tr("Prompt lengths: {lens}; at most {max_extend_tokens} tokens prefilled per step",
         lens=[len(llm.tokenizer.encode(p)) for p in prompts], max_extend_tokens=llm.config.max_extend_tokens))
params = SamplingParams(max_tokens=6, ignore_eos=True)
chunked = llm.generate(prompts, params)
prefill = [sum(n for _, n in work) for phase, work in steps if phase == "prefill"]
print(tr("Tokens computed by each prefill step: {prefill}", prefill=prefill))
for i, out in enumerate(chunked):
    print(tr("req{i}: {text!r}", i=i, text=out["text"]))
llm.shutdown()

whole = Scheduler(smollm2(), parts=PARTS, max_running_req=4, num_page_override=256, max_seq_len_override=64).generate(prompts, params)
print(tr("Same output without chunking: {same}",
         same=[o["token_ids"] for o in whole] == [o["token_ids"] for o in chunked]))
