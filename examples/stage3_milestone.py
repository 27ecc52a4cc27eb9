"""第 3 阶段里程碑：引擎成了服务，用官方的 ``openai`` 客户端和它说话。

脚本在一个空闲端口上启动 ``python -m minisgl``（缺省是 0.6B 形状的模型），然后：

1. 一次非流式的补全：文本、``usage``、``finish_reason``；
2. 一次流式的对话：第一段到达的时间、总时间、一共多少段；
3. 8 个线程同时各发一个请求：调度器把它们放进同一个批次（从 ``/metrics`` 读最大的解码批）；
4. 一个客户端流到一半断开：它占的 KV 页回到池子里（从 ``/metrics`` 读）；
5. 列出服务的进程，给一行可以自己试的 ``curl``；最后关掉服务，确认没有留下任何子进程。

    python examples/stage3_milestone.py                   # 缺省模型：Qwen3-0.6B，没有就用同形状的随机权重模型
    python examples/stage3_milestone.py --model models/qwen3-tiny-random

en: Stage 3 milestone: the engine is a service now, and the official ``openai`` client talks to it.

The script starts ``python -m minisgl`` on a free port (the 0.6B-shaped model by default), then:

1. one non-streamed completion: the text, ``usage``, ``finish_reason``;
2. one streamed chat: when the first piece arrived, the total time, how many pieces;
3. 8 threads each send a request at once: the scheduler puts them into one batch (the largest decode batch, read from
   ``/metrics``);
4. a client disconnects halfway through a stream: the KV pages it held go back to the pool (read from ``/metrics``);
5. lists the service's processes and gives a ``curl`` line to try; finally stops the service and makes sure no child
   process is left.
"""

from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from openai import OpenAI

from minisgl.processes.harness import ServerProcess, child_pids
from minisgl.i18n import tr
from minisgl.model_zoo import default_model

CONCURRENT = 8
FLAGS = ("--dtype", "float32", "--num-pages", "2048", "--max-seq-len", "2048")


def held_by_requests(server: ServerProcess) -> float:
    """请求占着的 KV 页：占用的页减去只被前缀缓存占着的页（请求结束后，它的前缀留在缓存里，之后可以被驱逐）。

    en: KV pages held by requests: the pages in use minus those held only by the prefix cache (after a request ends its
    prefix stays in the cache, to be evicted later).
    """
    m = server.metrics()
    return m["minisgl_kv_pages_used"] - m["minisgl_kv_pages_cached"]


def send_at_once(client: OpenAI, model: str, n: int, max_tokens: int, prompt: str = "Request {i}: count to ten.") -> list[int]:
    """``n`` 个线程各发一个补全请求；线程都建好以后才一起发（线程是一个一个建的，先建好的不等就会先发、先做完），
    返回每个请求生成的 token 数。

    en: ``n`` threads each send one completion, all together as soon as every thread exists (threads are created one
    by one, and without waiting the first would send, and finish, first); returns how many tokens each request
    generated.
    """
    start = threading.Barrier(n)

    def one(i: int) -> int:
        start.wait(timeout=60)
        r = client.completions.create(model=model, prompt=prompt.format(i=i), max_tokens=max_tokens, temperature=0,
                                      extra_body={"ignore_eos": True})
        return r.usage.completion_tokens

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def process_lines(pid: int, show_pids: bool = True) -> list[str]:
    """服务的进程：启动器（也是 API 服务器）和它的子进程。工作进程启动时给自己起了名字（``msgl-…``），
    另一个是 multiprocessing 用 spawn 时自带的资源跟踪进程。``show_pids`` 为假时只列名字（每次运行都一样）。

    en: The service's processes: the launcher (which is also the API server) and its children. The workers name
    themselves when they start (``msgl-…``); the other one is the resource tracker that multiprocessing's spawn brings.
    With ``show_pids`` false only the names are listed (the same on every run).
    """
    lines = []
    for p in [pid, *sorted(child_pids(pid))]:
        try:
            comm = Path(f"/proc/{p}/comm").read_text().strip()
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        role = tr("multiprocessing's resource tracker") if b"resource_tracker" in cmd else ""
        lines.append((f"    pid {p:>7}  " if show_pids else "    ") + f"{comm:<16} {role}".rstrip())
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=tr("Stage 3 milestone: talk to the engine as a service with the openai client"))
    parser.add_argument("--model", default=None, help=tr("model directory (default: Qwen3-0.6B, or the random-weight model of the same shape if that is missing)"))
    parser.add_argument("--max-running-req", type=int, default=8, help=tr("number of request slots: the most requests running at once (default 8)"))
    parser.add_argument("--batch-tokens", type=int, default=24, help=tr("tokens each of the concurrent requests asks for; a fast model needs more, so that the requests still overlap however the threads are scheduled (default 24)"))
    args = parser.parse_args(argv)
    model = Path(args.model) if args.model else default_model(verbose=False)
    results: dict[str, Any] = {"random_weights": "random" in model.name}
    note = tr(" (random weights, meaningless)") if results["random_weights"] else ""
    print(tr("Starting python -m minisgl --model {model} on a free port …", model=model.name))
    with ServerProcess(model, *FLAGS, "--max-running-req", str(args.max_running_req)) as server:
        assert server.proc is not None
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        name = client.models.list().data[0].id
        print(tr("Listening at {url}; the model is called {name!r}", url="http://127.0.0.1:<port>", name=name))

        print(tr("\n1. A completion, not streamed"))
        done = client.completions.create(model=name, prompt="The capital of France is", max_tokens=16, temperature=0,
                                         extra_body={"ignore_eos": True})
        results["usage"] = (done.usage.prompt_tokens, done.usage.completion_tokens)
        print(tr("   text: {text!r}{note}", text=done.choices[0].text, note=note))
        print(tr("   usage: {prompt} prompt tokens, {completion} completion tokens; finish_reason={reason!r}",
                 prompt=done.usage.prompt_tokens, completion=done.usage.completion_tokens, reason=done.choices[0].finish_reason))

        print(tr("\n2. A chat, streamed"))
        start, first, pieces = time.perf_counter(), None, []
        stream = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Tell me about the sea."}],
                                                max_tokens=32, temperature=0, stream=True, extra_body={"ignore_eos": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter()
                pieces.append(chunk.choices[0].delta.content)
        total = time.perf_counter() - start
        results["pieces"] = len(pieces)
        print(tr("   first piece after {ttft:.0f} ms, all of it after {total:.2f} s, {n} pieces",
                 ttft=1000 * ((first or start) - start), total=total, n=len(pieces)))

        print(tr("\n3. {n} requests at once, from {n} threads", n=CONCURRENT))

        before = server.metrics()
        counts = send_at_once(client, name, CONCURRENT, args.batch_tokens)
        after = server.metrics()
        results["largest_batch"] = int(after["minisgl_max_decode_batch"])
        print(tr("   every request got its {n} tokens: {ok}", n=args.batch_tokens, ok=all(c == args.batch_tokens for c in counts)))
        results["steps"] = int(after["minisgl_steps_total"] - before["minisgl_steps_total"])  # 随到达的先后略有不同 | en: varies a little with the order of arrival
        print(tr("   largest decode batch: {batch} requests", batch=results["largest_batch"]))

        print(tr("\n4. A client leaves halfway through a stream"))
        idle_pages = held_by_requests(server)
        # 要得够长：客户端读到第 8 段、再问 /metrics 时，请求必须还在跑——忙的机器上客户端可能慢上一两秒，小模型这时早已写完 400 个 token
        # en: long enough that the request is still running when the client has read 8 pieces and asks /metrics: on a busy
        # en: machine the client can lag a second or two, by which time the tiny model has long written 400 tokens
        stream = client.completions.create(model=name, prompt="Write a very long story.", max_tokens=1800, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        # 读到第 8 段以后，等 /metrics 数到这个请求占着的页再断开（忙的机器上调度器的统计会晚一点到）
        # en: from the 8th piece on, disconnect once /metrics counts the pages this request holds (on a busy machine the
        # en: scheduler's statistics arrive a little later)
        for i, _ in enumerate(stream):
            if i >= 8 and ((held := held_by_requests(server)) > idle_pages or i >= 200):
                break
        stream.close()
        deadline, back = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            back = held_by_requests(server)
            if back <= idle_pages + 1e-9:
                break
            time.sleep(0.1)
        results["pages"] = (idle_pages, held, back)
        print(tr("   KV pages held by requests: {idle:.0f} before the stream, {back:.0f} after the disconnect",
                 idle=idle_pages, back=back))
        # 流式输出时占着多少页，取决于读的那一刻已经生成了几个 token：每次运行都不一样
        # en: how many pages are held while streaming depends on how many tokens exist at the moment of reading: it varies
        print(tr("   while streaming: {held:.0f} pages", held=held))

        print(tr("\n5. The processes of the service"))
        print("\n".join(process_lines(server.proc.pid)))
        print(tr("   Try it yourself (with the port it printed):"))
        print("   curl http://127.0.0.1:1919/v1/completions -H 'Content-Type: application/json' "
              "-d '{\"prompt\": \"Hello\", \"max_tokens\": 8}'")
    results["left_behind"] = server.left_behind
    print(tr("\nStopped with Ctrl-C (SIGINT): exit code {code}, processes left behind: {n}",
             code=server.proc.returncode, n=len(server.left_behind)))
    return results


if __name__ == "__main__":
    main()
