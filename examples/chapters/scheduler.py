"""第 2.1 章示例：LLM.generate 的每一步——预填充优先、连续批处理（请求一结束，等待的请求就加入）。

每一步做了什么，用 ``llm.add_step_listener`` 来看：每一步的结果处理完，调度器就把这一步的轨迹交给监听者。

    python examples/chapters/scheduler.py

en: Chapter 2.1 example: each step of LLM.generate: prefill first, continuous batching (as soon as a request finishes, a
waiting one joins).

To see what each step did, use ``llm.add_step_listener``: after each step's results are processed, the scheduler hands
the step's trace to the listeners.

    python examples/chapters/scheduler.py
"""

from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.model_zoo import smollm2
from minisgl.scheduler import Scheduler

# 只有 2 个请求槽：第 3 个请求要等前面有一个结束
# en: only 2 request slots: the third request waits until one of the first two finishes
llm = Scheduler(smollm2(), max_running_req=2, num_page_override=256, max_seq_len_override=128)
print(tr("{max_running_req} request slots; static paging: each slot has a fixed room of {max_req_tokens} tokens",
         max_running_req=llm.max_running_req, max_req_tokens=llm.cache_manager.max_req_tokens))

traces = []


def show(trace):  # 轨迹里的长度是这一步发出之前的 | en: the lengths in the trace are those before this step was launched
    traces.append(trace)
    kind = tr("prefill") if trace.is_prefill else tr("decode ")
    work = tr(", ").join(tr("req{uid}×{n}", uid=uid, n=n) for uid, n in zip(trace.uids, trace.extend_lens))
    print(tr("step {step:>2} {kind} {work}", step=trace.index + 1, kind=kind, work=work))


remove = llm.add_step_listener(show)
prompts = ["The capital of France is", "Water boils at", "1, 2, 3, 4,"]
params = [SamplingParams(max_tokens=2), SamplingParams(max_tokens=5), SamplingParams(max_tokens=4)]
outputs = llm.generate(prompts, params)
remove()
for i, (prompt, out) in enumerate(zip(prompts, outputs)):
    print(tr("req{i}: {prompt!r} → {text!r} ({n_tokens} tokens)",
             i=i, prompt=prompt, text=out["text"], n_tokens=len(out["token_ids"])))

t = traces[3]
print(tr("Trace of step 4: requests {uids} in page-table rows {rows}, cached before issue {cached_lens}, {pages_in_use} pages of the KV pool in use",
         uids=t.uids, rows=t.rows, cached_lens=t.cached_lens, pages_in_use=t.pages_in_use))
prepare, forward, process = (1000 * (end - start) for start, end in (t.prepare, t.forward, t.process))
print(tr("  host time: prepare {prepare:.2f} ms, forward {forward:.2f} ms, process results {process:.2f} ms (forward ran in {forward_thread})",
         prepare=prepare, forward=forward, process=process, forward_thread=t.forward_thread))
llm.shutdown()
