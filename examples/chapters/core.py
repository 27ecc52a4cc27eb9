"""第 1.1 章示例：一个请求从预填充到解码，长度记账怎样变化。

    python examples/chapters/core.py
"""

import torch

from minisgl.core import Batch, Context, Req, SamplingParams

params = SamplingParams(max_tokens=3)
params.validate()
prompt = torch.tensor([9707, 11, 1879, 0], dtype=torch.int32)  # 4 个 token 的提示词
req = Req(input_ids=prompt, table_idx=0, cached_len=0, output_len=params.max_tokens, uid=0, sampling_params=params)


def show(when: str) -> None:
    print(
        f"{when:<10} cached_len={req.cached_len} device_len={req.device_len} "
        f"extend_len={req.extend_len} remain_len={req.remain_len} can_decode={req.can_decode} "
        f"input_ids={req.input_ids.tolist()}"
    )


show("新建")
for step, new_token in enumerate([100, 101, 102]):
    phase = "预填充" if step == 0 else "解码"
    print(f"-- 第 {step + 1} 步（{phase}）：算 {req.extend_len} 个 token")
    req.complete_one()  # 前向发出时推进
    show("发出之后")
    req.append_host(torch.tensor([new_token]))  # 采样结果回到主机
    show("拿到结果")

for bad in (SamplingParams(temperature=-1.0), SamplingParams(top_k=0), SamplingParams(top_p=0.0), SamplingParams(max_tokens=0)):
    try:
        bad.validate()
    except ValueError as err:
        print(f"拒绝：{err}")

ctx = Context(page_size=1)
batch = Batch(reqs=[req], phase="decode")
with ctx.forward_batch(batch):
    print(f"with 块里：ctx.batch 是 {ctx.batch.phase} 批次，{ctx.batch.size} 个请求")
    try:
        with ctx.forward_batch(batch):
            pass
    except RuntimeError as err:
        print(f"嵌套：{err}")
try:
    ctx.batch
except RuntimeError as err:
    print(f"with 块外：{err}")
