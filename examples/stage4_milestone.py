"""第 4 阶段里程碑（张量并行、专家并行与数据并行）：同一个模型切给两个秩，离线和在线都得到一个进程时的 token；两个副本
前面的路由器让共享的前缀只算一遍。

1. 哪些 ``tp`` 切得开：小 Qwen3 和 SmolLM2（9 个头），切不开时在加载之前就拒绝；
2. 秩里面：每个秩上第 0 层各个权重的形状、存了多少、生成时每步的集合通信次数；
3. 离线：``LLM(path)`` 与 ``LLM(path, tp_size=2)`` 贪心生成的 token 逐个相同；
4. 在线：``python -m minisgl --tp 2``：官方 ``openai`` 客户端得到与一个进程相同的文字，流到一半断开的请求在每个
   秩上都释放了页，服务的进程（每个秩一个调度器进程），关掉之后一个进程也不留下；
5. 混合专家：小 Qwen3-MoE 在一个秩上和专家分给两个秩（``ep_size=2``）时贪心生成的 token 相同；
6. 数据并行：``python -m minisgl --dp 2`` 的两个副本，共享前缀的负载走缓存感知的路由器时预填充的 token 明显少于轮流，
   同样的请求回答相同，关掉之后不留下进程。

    python examples/stage4_milestone.py
    python examples/stage4_milestone.py --model models/SmolLM2-135M-Instruct --tp 3

en: Stage 4 milestone (tensor, expert and data parallelism): one model split over two ranks gives one process's tokens,
offline and online; the router in front of two replicas computes a shared prefix once.

1. which ``tp`` split: the tiny Qwen3 and SmolLM2 (9 heads); one that does not is refused before loading;
2. inside the ranks: the shape of each layer-0 weight on each rank, how much each stores, the collectives per step while
   generating;
3. offline: ``LLM(path)`` and ``LLM(path, tp_size=2)`` generate exactly the same greedy tokens;
4. online: ``python -m minisgl --tp 2``: the official ``openai`` client gets the same text as from one process, a stream
   dropped halfway frees its pages on every rank, the service's processes (one scheduler process per rank), and after
   stopping it no process is left;
5. mixture of experts: the tiny Qwen3-MoE generates the same greedy tokens on one rank and with its experts dealt out
   to two ranks (``ep_size=2``);
6. data parallelism: the two replicas of ``python -m minisgl --dp 2`` prefill clearly fewer tokens of a shared-prefix
   workload behind the cache-aware router than in turn, the same requests get the same answers, and no process is left
   after stopping.

    python examples/stage4_milestone.py
    python examples/stage4_milestone.py --model models/SmolLM2-135M-Instruct --tp 3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch
from openai import OpenAI

from minisgl import model_zoo
from minisgl.processes.harness import ServerProcess, per_replica, shared_prefix_prompts
from minisgl.i18n import tr
from minisgl.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples"))
from stage3_milestone import process_lines  # noqa: E402 - 同样的进程清单 | en: the same process list

PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "def add(a, b):"]
NEW_TOKENS = 12
ENGINE = {"num_page_override": 512, "max_seq_len_override": 128}
FLAGS = ("--dtype", "float32", "--num-pages", "512", "--max-seq-len", "512", "--cache-type", "naive")
PREFILL = "minisgl_prefill_tokens_total"  # 每个副本自己数的预填充 token | en: the prefill tokens each replica counted itself
DP_FLAGS = ("--dtype", "float32", "--num-pages", "2048", "--max-seq-len", "512")


def milestone_rank(rank: int, world_size: int, addr: str, model_path: str, device_name: str) -> dict[str, Any]:
    """每个秩上：加入进程组，建第 4.3 章的 ``TPScheduler``（不接套接字，离线地 ``generate``），记下第 0 层的权重形状、
    存的字节数、生成时的集合通信次数。

    en: On each rank: join the process group, build chapter 4.3's ``TPScheduler`` (no sockets: ``generate`` offline),
    and note the layer-0 weight shapes, the bytes stored and the collectives while generating.
    """
    from minisgl.core import SamplingParams
    from minisgl.distributed import DistributedInfo, destroy_distributed, get_tp_comm, init_distributed
    from minisgl.engine import model_nbytes
    from minisgl.tp_scheduler import TPScheduler, rank_device

    device = rank_device(device_name, rank)
    init_distributed(DistributedInfo(rank, world_size), addr, device)
    sched = TPScheduler(model_path, torch.float32, device=str(device), **ENGINE)
    model = sched.engine.model
    layer = model.model.layers[0]
    shapes = {"qkv_proj": layer.self_attn.qkv_proj.weight, "o_proj": layer.self_attn.o_proj.weight,
              "gate_up_proj": layer.mlp.gate_up_proj.weight, "down_proj": layer.mlp.down_proj.weight,
              "embed_tokens": model.model.embed_tokens.weight, "lm_head": model.lm_head.weight}
    built = dict(get_tp_comm().calls)
    get_tp_comm().calls.clear()
    steps: list[int] = []
    sched.add_step_listener(lambda t: steps.append(1))
    out = sched.generate(PROMPTS, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    seen = {"shapes": {k: list(w.shape) for k, w in shapes.items()}, "stored_mb": round(model_nbytes(model) / 2**20, 1),
            "built": built, "calls": dict(get_tp_comm().calls), "steps": len(steps), "layers": sched.engine.model_config.num_layers,
            "tokens": [o["token_ids"] for o in out]}
    sched.shutdown()
    destroy_distributed()
    return seen


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM
    from minisgl.models import ModelConfig
    from minisgl.processes.ranks import run_ranks
    from minisgl.tensor_parallel import check_tp_split, split_problems

    parser = argparse.ArgumentParser(description=tr("Stage 4 milestone: one model over several ranks, offline and online"))
    parser.add_argument("--model", default=str(model_zoo.tiny_qwen3()), help=tr("model directory (default: the tiny Qwen3)"))
    parser.add_argument("--tp", type=int, default=2, help=tr("number of ranks (default 2)"))
    parser.add_argument("--device", default="cpu", help=tr("cpu (default; gloo) or cuda (one GPU per rank; NCCL)"))
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    greedy = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)

    print(tr("1. Which tp split"))
    for name, path in (("qwen3-tiny", model_zoo.tiny_qwen3()), ("SmolLM2", model_zoo.smollm2())):
        config = ModelConfig.from_hf(path)
        works = [tp for tp in range(1, config.num_qo_heads + 1) if not split_problems(config, tp)]
        results.setdefault("splits", {})[name] = works
        print(tr("   {name}: {heads} query heads, {kv} KV heads; tp that work: {works}", name=name,
                 heads=config.num_qo_heads, kv=config.num_kv_heads, works=works))
    try:
        check_tp_split(ModelConfig.from_hf(model_zoo.smollm2()), 2)
    except ValueError as e:
        print(tr("   SmolLM2 at tp 2 is refused before loading: {error}", error=e))

    print(tr("\n2. Inside the ranks ({tp} ranks, {n} prompts, {new} new tokens each)", tp=args.tp, n=len(PROMPTS),
             new=NEW_TOKENS))
    ranks = run_ranks(milestone_rank, args.tp, args.model, args.device)
    for rank, seen in enumerate(ranks):
        print(tr("   rank {rank}: stores {mb} MiB", rank=rank, mb=seen["stored_mb"]))
        for name, shape in seen["shapes"].items():
            print(f"     {name:<13} {shape}")
    first = ranks[0]
    results["built"], results["calls"] = first["built"], first["calls"]
    results["steps"], results["layers"] = first["steps"], first["layers"]
    print(tr("   collectives on each rank while building the engine: {built} (the KV page count)", built=first["built"]))
    print(tr("   collectives on each rank in {steps} steps of {layers} layers: {calls}", steps=first["steps"],
             layers=first["layers"], calls=first["calls"]))
    print(tr("   = per step 2 all_reduce per layer + 1 for the embedding, 1 all_gather for the LM head"))

    print(tr("\n3. Offline: LLM(path) and LLM(path, tp_size={tp})", tp=args.tp))
    one = LLM(args.model, torch.float32, device=args.device, **ENGINE)
    single = one.generate(PROMPTS, greedy)
    one.shutdown()
    with LLM(args.model, torch.float32, tp_size=args.tp, device=args.device, **ENGINE) as split:
        several = split.generate(PROMPTS, greedy)
    results["offline_equal"] = [o["token_ids"] for o in single] == [o["token_ids"] for o in several] == first["tokens"]
    for prompt, a, b in zip(PROMPTS, single, several):
        print(tr("   {prompt!r}: tp 1 {one}", prompt=prompt, one=a["token_ids"]))
        print(tr("   {pad}  tp {tp} {other}", pad=" " * len(repr(prompt)), tp=args.tp, other=b["token_ids"]))
    print(tr("   the same tokens: {same}", same=results["offline_equal"]))

    print(tr("\n4. Online: python -m minisgl --tp {tp}", tp=args.tp))
    with ServerProcess(args.model, *FLAGS, "--tp", str(args.tp), "--device", args.device) as server:
        assert server.proc is not None
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        name = client.models.list().data[0].id
        done = client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=NEW_TOKENS, temperature=0,
                                         extra_body={"ignore_eos": True})
        results["online_equal"] = done.choices[0].text == single[0]["text"]
        note = tr(" (random weights, meaningless)") if "random" in Path(args.model).name else ""
        print(tr("   {prompt!r} → {text!r}{note}; the same as one process offline: {same}",
                 prompt=PROMPTS[0], text=done.choices[0].text, note=note, same=results["online_equal"]))
        idle = server.metrics()["minisgl_kv_pages_used"]
        stream = client.completions.create(model=name, prompt=PROMPTS[1], max_tokens=400, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        for i, _ in enumerate(stream):
            if i == 8:
                break
        stream.close()
        deadline, back = time.monotonic() + 30, None
        while time.monotonic() < deadline and (back := server.metrics()["minisgl_kv_pages_used"]) > idle:
            time.sleep(0.1)
        results["pages"] = (idle, back)
        print(tr("   a stream dropped after 8 pieces: KV pages in use {idle:.0f} before, {back:.0f} after",
                 idle=idle, back=back))
        print(tr("   the processes of the service:"))
        print("\n".join(process_lines(server.proc.pid, show_pids=False)))
    results["left_behind"] = server.left_behind
    print(tr("   stopped with Ctrl-C (SIGINT): exit code {code}, processes left behind: {n}",
             code=server.proc.returncode, n=len(server.left_behind)))

    moe = str(model_zoo.tiny_qwen3_moe())
    print(tr("\n5. Mixture of experts: LLM(moe) and LLM(moe, tp_size={tp}, ep_size={tp}) (experts dealt out to the ranks)",
             tp=args.tp))
    one = LLM(moe, torch.float32, device=args.device, **ENGINE)
    single = one.generate(PROMPTS, greedy)
    one.shutdown()
    with LLM(moe, torch.float32, tp_size=args.tp, ep_size=args.tp, device=args.device, **ENGINE) as split:
        several = split.generate(PROMPTS, greedy)
    results["moe_equal"] = [o["token_ids"] for o in single] == [o["token_ids"] for o in several]
    for prompt, a, b in zip(PROMPTS, single, several):
        print(tr("   {prompt!r}: ep 1 {one}", prompt=prompt, one=a["token_ids"]))
        print(tr("   {pad}  ep {tp} {other}", pad=" " * len(repr(prompt)), tp=args.tp, other=b["token_ids"]))
    print(tr("   the same tokens: {same}", same=results["moe_equal"]))

    data_parallel(args, results)
    return results


def answer_all(server: ServerProcess, prompts: list[str]) -> tuple[list[str], dict[str, int]]:
    """一个接一个地发 ``prompts``（贪心），返回回答和这期间每个副本预填充了多少 token。

    en: Send ``prompts`` one after another (greedy); return the answers and how many tokens each replica prefilled
    meanwhile.
    """
    client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
    name = client.models.list().data[0].id
    before = per_replica(server.settled_metrics(), PREFILL)
    answers = [client.completions.create(model=name, prompt=p, max_tokens=6, temperature=0).choices[0].text
               for p in prompts]
    after = per_replica(server.settled_metrics(), PREFILL)
    return answers, {k: int(after[k] - before.get(k, 0)) for k in sorted(after)}


def data_parallel(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """第 6 步：``--dp 2`` 的两个副本，同样形状的共享前缀负载，缓存感知的路由器对轮流（同一对副本前面单独起的
    第二个路由器）：各预填充了多少 token，同样的请求回答是否相同。

    en: Step 6: the two replicas of ``--dp 2``, a shared-prefix workload of the same shape, the cache-aware router against
    round robin (a second router started alone in front of the same replicas): how many tokens each prefilled, and
    whether the same requests get the same answers.
    """
    print(tr("\n6. Data parallelism: python -m minisgl --dp 2, the cache-aware router against round robin"))
    prompts = shared_prefix_prompts("alpha")
    print(tr("   {n} prompts, 3 long system prompts taking turns, sent one after another", n=len(prompts)))
    with ServerProcess(args.model, *DP_FLAGS, "--device", args.device, "--dp", "2") as server:
        with urllib.request.urlopen(f"{server.url}/list_workers", timeout=10) as r:
            urls = json.load(r)["urls"]
        with ServerProcess.router(urls, "--router-policy", "round_robin") as rr:
            rr_answers, rr_prefill = answer_all(rr, prompts)
        _, ca_prefill = answer_all(server, shared_prefix_prompts("beta"))
        ca_answers, _ = answer_all(server, prompts)
    rr_total, ca_total = sum(rr_prefill.values()), sum(ca_prefill.values())
    print(tr("   round_robin: prefill tokens per replica {per}, {total} in all", per=rr_prefill, total=rr_total))
    print(tr("   cache_aware (the same shape, other system prompts): per replica {per}, {total} in all = "
             "{share:.0%} of round robin's", per=ca_prefill, total=ca_total, share=ca_total / max(rr_total, 1)))
    results["dp_prefill"] = {"round_robin": rr_total, "cache_aware": ca_total}
    results["dp_equal"] = ca_answers == rr_answers
    results["dp_left_behind"] = server.left_behind
    print(tr("   the same answers through either router: {same}", same=results["dp_equal"]))
    print(tr("   stopped with Ctrl-C (SIGINT): exit code {code}, processes left behind: {n}",
             code=server.proc.returncode if server.proc else None, n=len(server.left_behind)))


if __name__ == "__main__":
    main()
