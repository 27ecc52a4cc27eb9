"""第 1 阶段里程碑：亲手驱动引擎。

第 1 阶段的引擎只会“算一步”：给它一个填好的 Batch，它前向、采样、推进请求。批次里的字段——
页表的行、``input_ids``、``positions``、``out_loc``——这里都由我们自己动手填，第 2 阶段的调度器会把
这些自动化。脚本打印：

1. 1 个请求 × 16 个 token 的速度，旁边是第 0 步的速度；
2. 4 个请求放进同一批的速度（每步毫秒数、总 token/s）；
3. 一共写了多少个 KV 页；
4. 每个请求的 token 是否与 Hugging Face ``generate`` 完全一致。

    python examples/stage1_milestone.py                       # 默认模型
    python examples/stage1_milestone.py --model models/SmolLM2-135M-Instruct --page-size 4

en: Stage 1 milestone: driving the engine by hand.

The stage-1 engine can only "compute one step": given a filled-in Batch, it runs the forward, samples and advances the
requests. The batch's fields (page-table rows, ``input_ids``, ``positions``, ``out_loc``) are all filled in by hand
here; the stage-2 scheduler automates this. The script prints:

1. the speed of 1 request × 16 tokens, next to step 0's speed; 2. the speed of 4 requests in one batch (milliseconds per
step, total token/s); 3. how many KV pages were written in all; 4. whether each request's tokens match Hugging Face
``generate`` exactly.

    python examples/stage1_milestone.py                       # default model
    python examples/stage1_milestone.py --model models/SmolLM2-135M-Instruct --page-size 4
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import step0_tiny_engine as step0
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import Batch, Req, SamplingParams
from minisgl.course import describe_selection
from minisgl.engine import Engine, EngineConfig
from minisgl.i18n import tr
from minisgl.kvcache import pages_to_slots
from minisgl.model_zoo import default_model

SINGLE = "The capital of France is"
BATCH = ["Once upon a time, there was", "The three primary colors are", "def add(a, b):", "Water boils at"]


class HandDriver:
    """手工调度：每个请求固定占页表的一行，并一次性分到能装下 max_seq_len 个 token 的页。

    en: Scheduling by hand: each request owns one row of the page table and gets, once and for all, enough pages for
    max_seq_len tokens.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.pages_per_req = -(-engine.max_seq_len // engine.config.page_size)  # 向上取整 | en: round up
        self.written_slots: set[int] = set()

    def admit(self, prompt_ids: list[int], row: int, max_tokens: int) -> Req:
        e, page_size = self.engine, self.engine.config.page_size
        pages = torch.arange(row * self.pages_per_req, (row + 1) * self.pages_per_req, dtype=torch.int32)
        # 页表这一行
        # en: this row of the page table
        e.page_table[row, :] = pages_to_slots(pages, page_size)[: e.max_seq_len].to(e.device)
        ids = torch.tensor(prompt_ids, dtype=torch.int32)
        return Req(ids, table_idx=row, cached_len=0, output_len=max_tokens, uid=row, sampling_params=SamplingParams())

    def step(self, reqs: list[Req]) -> None:
        """填好一个批次的字段，前向一步，把新 token 接到每个请求后面。

        en: Fill in a batch's fields, run one forward step, and append the new token to each request.
        """
        e = self.engine
        batch = Batch(reqs, "prefill" if reqs[0].cached_len == 0 else "decode")
        batch.input_ids = torch.cat([r.input_ids[r.cached_len : r.device_len] for r in reqs]).to(e.device)
        batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len, dtype=torch.int32) for r in reqs]).to(
            e.device
        )
        batch.out_loc = torch.cat([e.page_table[r.table_idx, r.cached_len : r.device_len] for r in reqs])
        self.written_slots.update(batch.out_loc.tolist())
        e.attn_backend.prepare_metadata(batch)
        out = e.forward_batch(batch, e.sampler.prepare(batch))
        for req in reqs:
            # 发出即推进：引擎只算，记账是我们的事
            # en: advance at launch: the engine only computes, the bookkeeping is ours
            req.complete_one()
        out.copy_done_event.synchronize()
        for req, token in zip(reqs, out.next_tokens_cpu):
            req.append_host(token.reshape(1))

    def generate(self, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], list[float]]:
        """整批一起走：一次预填充，之后每步解码。返回每个请求的新 token 和每步耗时（秒）。

        en: Run the whole batch together: one prefill, then a decode per step. Returns each request's new tokens and
        each step's time (seconds).
        """
        reqs = [self.admit(p, row, max_tokens) for row, p in enumerate(prompts)]
        times = []
        while reqs[0].can_decode:
            start = time.perf_counter()
            self.step(reqs)
            times.append(time.perf_counter() - start)
        return [r.input_ids[len(p) :].tolist() for r, p in zip(reqs, prompts)], times


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=tr("Stage 1 milestone: drive the engine by hand"))
    parser.add_argument("--model", default=None, help=tr("model directory (default: Qwen3-0.6B, or the random-weight model of the same shape if that is missing)"))
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--skip-step0", action="store_true", help=tr("skip the step 0 comparison (saves time)"))
    args = parser.parse_args(argv)
    model = Path(args.model) if args.model else default_model()
    tok = AutoTokenizer.from_pretrained(model)
    single, batch = tok(SINGLE)["input_ids"], [tok(p)["input_ids"] for p in BATCH]
    n = args.max_tokens

    step0_tps = None
    if not args.skip_step0:
        cfg, weights, _ = step0.load(model)
        step0.generate(cfg, weights, single, 2)  # 预热 | en: warm-up
        start = time.perf_counter()
        step0.generate(cfg, weights, single, n)
        step0_tps = n / (time.perf_counter() - start)
        del weights

    engine = Engine(
        EngineConfig(
            str(model), dtype=torch.float32, max_running_req=len(BATCH), max_seq_len_override=512,
            num_page_override=len(BATCH) * 512 // args.page_size, page_size=args.page_size,
            attention_backend=args.attention_backend,
        )
    )  # fmt: skip
    # 预热（第一次调用要准备 oneDNN 的计算原语）
    # en: warm-up (the first call prepares oneDNN's primitives)
    HandDriver(engine).generate([single], 2)
    [single_out], times = HandDriver(engine).generate([single], n)
    single_tps = n / sum(times)
    HandDriver(engine).generate(batch, 2)  # 批量的形状也预热一次 | en: warm up the batched shapes too
    driver = HandDriver(engine)
    batch_out, batch_times = driver.generate(batch, n)
    decode_ms = 1000 * sum(batch_times[1:]) / max(len(batch_times) - 1, 1)
    batch_tps = len(BATCH) * n / sum(batch_times)
    pages = {slot // args.page_size for slot in driver.written_slots}

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    # 第 1 阶段的引擎不看 EOS，HF 也别在 EOS 处停
    # en: the stage-1 engine ignores EOS, so HF must not stop at EOS either
    hf.generation_config.eos_token_id = None
    mismatches = []
    for prompt, ours in zip([single, *batch], [single_out, *batch_out]):
        ids = torch.tensor([prompt])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
        ref = ref[0, len(prompt) :].tolist()
        if ref != ours:
            mismatches.append((tok.decode(prompt), ours, ref))

    print(describe_selection(["core", "layers", "models", "kvcache", "attention", "engine"]))
    print(tr("Model: {name}, page_size={page_size}, attention backend: {backend}",
             name=model.name, page_size=args.page_size, backend=type(engine.attn_backend).__name__))
    random_weights = "random" in model.name
    if random_weights:
        print(tr("Note: this is a random-weight model, so the generated text is meaningless (token counts and compute are the same as the real model); only the first 8 token ids are listed below."))

    def show(out: list[int]) -> str:
        return f"token id {out[:8]} …" if random_weights else repr(tok.decode(out))

    step0_note = tr("step 0: {step0_tps:.1f} token/s", step0_tps=step0_tps) if step0_tps else tr("step 0: not run")
    print(tr("1 request × {n} tokens: {single_tps:.1f} token/s ({step0_note})",
             n=n, single_tps=single_tps, step0_note=step0_note))
    print(f"  {SINGLE!r} → {show(single_out)}")
    print(tr("{n_batch} requests in one batch × {n} tokens: {decode_ms:.0f} ms per decode step, {batch_tps:.1f} token/s in all",
             n_batch=len(BATCH), n=n, decode_ms=decode_ms, batch_tps=batch_tps))
    for prompt, out in zip(BATCH, batch_out):
        print(f"  {prompt!r} → {show(out)}")
    print(tr("This batch wrote {n_pages} KV pages ({n_written_slots} token slots, {page_size} per page)",
             n_pages=len(pages), n_written_slots=len(driver.written_slots), page_size=args.page_size))
    if mismatches:
        for prompt, ours, ref in mismatches:
            print(tr("Mismatch with Hugging Face: {prompt!r}\n  ours: {ours}\n  HF:   {ref}",
                     prompt=prompt, ours=ours, ref=ref))
    else:
        print(tr("The tokens of all {n_reqs} requests match Hugging Face generate exactly", n_reqs=1 + len(BATCH)))
    engine.shutdown()
    return {
        "step0_tps": step0_tps,
        "single_tps": single_tps,
        "batch_tps": batch_tps,
        "decode_ms": decode_ms,
        "pages_written": len(pages),
        "slots_written": len(driver.written_slots),
        "mismatches": mismatches,
        "batch_prompt_lens": [len(p) for p in batch],
    }


if __name__ == "__main__":
    main()
