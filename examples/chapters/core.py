"""第 1.1 章示例：一个请求从预填充到解码，长度记账怎样变化。

    python examples/chapters/core.py

en: Chapter 1.1 example: how a request's length bookkeeping changes from prefill to decode.

    python examples/chapters/core.py
"""

import torch

from minisgl.core import Batch, Context, Req, SamplingParams
from minisgl.i18n import tr

params = SamplingParams(max_tokens=3)
params.validate()
prompt = torch.tensor([9707, 11, 1879, 0], dtype=torch.int32)  # 4 个 token 的提示词 | en: a 4-token prompt
req = Req(input_ids=prompt, table_idx=0, cached_len=0, output_len=params.max_tokens, uid=0, sampling_params=params)


def show(when: str) -> None:
    print(
        f"{when:<10} cached_len={req.cached_len} device_len={req.device_len} "
        f"extend_len={req.extend_len} remain_len={req.remain_len} can_decode={req.can_decode} "
        f"input_ids={req.input_ids.tolist()}"
    )


show(tr("created"))
for step, new_token in enumerate([100, 101, 102]):
    phase = tr("prefill") if step == 0 else tr("decode")
    print(tr("-- step {step} ({phase}): compute {extend_len} token(s)",
             step=step + 1, phase=phase, extend_len=req.extend_len))
    req.complete_one()  # 前向发出时推进 | en: advanced when the forward is launched
    show(tr("issued"))
    req.append_host(torch.tensor([new_token]))  # 采样结果回到主机 | en: the sampled token is back on the host
    show(tr("got result"))

for bad in (SamplingParams(temperature=-1.0), SamplingParams(top_k=0), SamplingParams(top_p=0.0), SamplingParams(max_tokens=0)):
    try:
        bad.validate()
    except ValueError as err:
        print(tr("Rejected: {err}", err=err))

ctx = Context(page_size=1)
batch = Batch(reqs=[req], phase="decode")
with ctx.forward_batch(batch):
    print(tr("Inside the with block: ctx.batch is a {phase} batch of {size} request(s)",
             phase=ctx.batch.phase, size=ctx.batch.size))
    try:
        with ctx.forward_batch(batch):
            pass
    except RuntimeError as err:
        print(tr("Nested: {err}", err=err))
try:
    ctx.batch
except RuntimeError as err:
    print(tr("Outside the with block: {err}", err=err))
