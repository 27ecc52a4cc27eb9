"""第 1.6 章示例：用 Engine 手工跑一个请求（预填充一次、再逐个解码），以及批量采样器的几种设置。

    python examples/chapters/engine.py

en: Chapter 1.6 example: run one request through the Engine by hand (one prefill, then one decode at a time), and a few
settings of the batched sampler.

    python examples/chapters/engine.py
"""

import torch
from transformers import AutoTokenizer

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig, Sampler
from minisgl.i18n import tr
from minisgl.model_zoo import smollm2

path = smollm2()
engine = Engine(EngineConfig(model_path=str(path), max_running_req=1, num_page_override=64, max_seq_len_override=64))
tok = AutoTokenizer.from_pretrained(path)
print(tr("Engine: {device}, {dtype}, KV pool of {num_pages} pages, attention backend {backend}",
         device=engine.device, dtype=engine.dtype, num_pages=engine.num_pages,
         backend=type(engine.attn_backend).__name__))

prompt = torch.tensor(tok.encode("The capital of France is"), dtype=torch.int32)
req = Req(prompt, table_idx=0, cached_len=0, output_len=6, uid=0, sampling_params=SamplingParams(max_tokens=6))
# 这个请求用槽位 0, 1, 2, ...
# en: this request uses slots 0, 1, 2, ...
engine.page_table[0, : req.max_device_len] = torch.arange(req.max_device_len)
while req.can_decode:
    batch = Batch(reqs=[req], phase="prefill" if req.cached_len == 0 else "decode")
    batch.input_ids = req.input_ids[req.cached_len : req.device_len].to(engine.device)
    batch.positions = torch.arange(req.cached_len, req.device_len, dtype=torch.int32)
    batch.out_loc = engine.page_table[0, req.cached_len : req.device_len]
    engine.attn_backend.prepare_metadata(batch)
    n = req.extend_len
    out = engine.forward_batch(batch, engine.sampler.prepare(batch))
    # 发出这一步的人推进记账：引擎只算
    # en: whoever launches the step advances the bookkeeping: the engine only computes
    req.complete_one()
    out.copy_done_event.synchronize()
    req.append_host(out.next_tokens_cpu)
    print(tr("{phase:<7} computed {n} token(s) → {token!r}",
             phase=batch.phase, n=n, token=tok.decode(out.next_tokens_cpu)))
print(tr("Result: {text!r}", text=tok.decode(req.input_ids)))
engine.shutdown()

# 批量采样器：同一批里每行用自己的参数
# en: the batched sampler: each row of a batch uses its own parameters
sampler = Sampler(torch.device("cpu"), vocab_size=6, seed=0)
logits = torch.tensor([[2.0, 1.0, 0.5, 0.1, 0.0, -1.0]] * 4)
rows = [
    (tr("greedy"), SamplingParams()),
    ("top_k=1", SamplingParams(temperature=1.0, top_k=1)),
    (tr("temperature 1, seed 7"), SamplingParams(temperature=1.0, seed=7)),
    (tr("temperature 1, top_p=0.8"), SamplingParams(temperature=1.0, top_p=0.8)),
]
reqs = [Req(torch.zeros(3, dtype=torch.int32), i, 0, 1, i, sp) for i, (_, sp) in enumerate(rows)]
batch = Batch(reqs=reqs, phase="prefill")
args = sampler.prepare(batch)
draws = torch.stack([sampler.sample(logits, args) for _ in range(200)])
for i, (name, _) in enumerate(rows):
    counts = torch.bincount(draws[:, i], minlength=6).tolist()
    print(tr("{name}: in 200 draws, tokens 0..5 came up {counts} times", name=name, counts=counts))
alone = Batch(reqs=[reqs[2]], phase="prefill")
other = Sampler(torch.device("cpu"), vocab_size=6, seed=123)  # 换一个引擎种子 | en: a different engine seed
alone_args = other.prepare(alone)
alone_draws = [other.sample(logits[:1], alone_args).item() for _ in range(10)]
print(tr("The seeded request, first 10 draws in the batch: {draws}", draws=draws[:10, 2].tolist()))
print(tr("Another engine seed, the request alone, first 10 draws: {alone_draws}", alone_draws=alone_draws))
