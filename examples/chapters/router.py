"""第 4.6 章示例：数据并行的路由器。先手动搭一棵前缀树（共用的系统提示词、边在中途拆开、匹配的长度、LRU 删叶子），
再让三种策略对同一串提示词和负载做决定（包括一次负载不均），最后起 ``--dp 2`` 的两个副本：同样形状的共享前缀负载，
轮流与缓存感知各走一遍，按副本数路由了几个请求、预填充算了多少 token、前缀缓存命中多少，以及回答是否相同。

    python examples/chapters/router.py

en: Chapter 4.6 example: the data-parallel router. First a prefix tree by hand (a shared system prompt, an edge split
midway, match lengths, LRU eviction), then the three policies deciding on one sequence of prompts and loads (one of them
imbalanced), and finally the two replicas of ``--dp 2``: the same shape of shared-prefix workload, once in turn and once
cache-aware, with the requests routed, the prefill tokens computed and the prefix-cache hits per replica, and whether the
answers are the same.

    python examples/chapters/router.py
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from minisgl.processes.harness import ServerProcess, per_replica, shared_prefix_prompts
from minisgl.i18n import tr
from minisgl.model_zoo import tiny_qwen3
from minisgl.router import BALANCE_ABS_THRESHOLD, BALANCE_REL_THRESHOLD, CacheAware, PrefixTree, RoundRobin, \
    ShortestQueue, is_imbalanced

SYSTEM = "You are a careful assistant. "
TRANSLATE = "Translate into French: "
FLAGS = ("--dtype", "float32", "--num-pages", "2048", "--max-seq-len", "512")
#: 3 段前缀对 2 个副本：轮流时同一段前缀会落到两边。
#: en: 3 prefixes on 2 replicas: in turn, one prefix lands on both.
GROUPS = 3
NEW_TOKENS = 6


def show_tree(tree: PrefixTree) -> None:
    """一行一条边：缩进表示深度，后面是这条边上的文字和它最近一次用到的时刻。

    en: One line per edge: the indent is the depth, then the text on the edge and when it was last used.
    """
    def walk(node: Any, depth: int) -> None:
        for child in sorted(node.children.values(), key=lambda n: n.text):
            print(tr("    {indent}{text!r} (last used {t})", indent="  " * depth, text=child.text, t=child.last_used))
            walk(child, depth + 1)

    walk(tree.root, 0)


def tree_demo() -> PrefixTree:
    """一棵树：插入、看结构和大小、匹配、按 LRU 删。

    en: One tree: insert, look at its shape and size, match, evict by LRU.
    """
    tree = PrefixTree()
    for text in (SYSTEM + "What is a cat?", SYSTEM + "What is a dog?", TRANSLATE + "good morning"):
        tree.insert(text)
        print(tr("insert {text!r}: the tree holds {size} characters", text=text, size=tree.size))
    print(tr("  the tree (the first two share one edge, split where they fork):"))
    show_tree(tree)
    for query in (SYSTEM + "What is a cow?", SYSTEM + "Tell me a joke.", TRANSLATE + "good night", "Hello there"):
        n = tree.match(query)
        print(tr("match {text!r}: {n} of {total} characters ({share:.2f}; above 0.5: {above})", text=query, n=n,
                 total=len(query), share=n / len(query), above=n / len(query) > 0.5))
    tree.insert(SYSTEM + "What is a cat?")
    print(tr("insert the cat question again (time {t}): its path is now the most recently used", t=tree.clock))
    limit = tree.size - 10
    removed = tree.evict(limit)
    print(tr("evict down to {limit} characters: removed {removed}, {size} left", limit=limit, removed=removed,
             size=tree.size))
    show_tree(tree)
    return tree


#: 一串提示词和当时两个副本手上的请求数（A、B 是两段不同的开头）。
#: en: A sequence of prompts with the requests the two replicas have in hand at the time (A and B two different starts).
SCRIPT = [
    ("A + cat", SYSTEM + "What is a cat?", {0: 0, 1: 0}),
    ("B + morning", TRANSLATE + "good morning", {0: 1, 1: 0}),
    ("A + dog", SYSTEM + "What is a dog?", {0: 1, 1: 1}),
    ("B + night", TRANSLATE + "good night", {0: 2, 1: 1}),
    ("A + cow", SYSTEM + "What is a cow?", {0: 3, 1: 1}),
    ("Hello there", "Hello there", {0: 3, 1: 1}),
    ("A + owl", SYSTEM + "What is an owl?", {0: 20, 1: 0}),
    ("A + fox", SYSTEM + "What is a fox?", {0: 40, 1: 3}),
]


def policy_demo() -> list[tuple[str, int, int, int]]:
    """三种策略对 :data:`SCRIPT` 的每一步各挑一个副本；缓存感知那一列说明它为什么这样挑。

    en: The three policies each pick a replica for every step of :data:`SCRIPT`; the cache-aware column says why.
    """
    rr, sq, ca = RoundRobin(2), ShortestQueue(2), CacheAware(2)
    picks = []
    for label, text, loads in SCRIPT:
        matched = {r: ca.trees[r].match(text) for r in loads}
        best = max(matched.values()) / len(text)
        unbalanced = is_imbalanced(loads.values(), BALANCE_ABS_THRESHOLD, BALANCE_REL_THRESHOLD)
        a, b, c = rr.choose(text, loads), sq.choose(text, loads), ca.choose(text, loads)
        if unbalanced:
            why = tr("imbalanced: the shortest queue wins")
        elif best > ca.cache_threshold:
            why = tr("matched {share:.2f} > {threshold}: the longest match", share=best, threshold=ca.cache_threshold)
        else:
            why = tr("matched {share:.2f} <= {threshold}: the fewest in hand", share=best, threshold=ca.cache_threshold)
        print(tr("{label:<12} loads {loads}: round_robin -> {rr}, shortest_queue -> {sq}, cache_aware -> {ca} ({why})",
                 label=label, loads=loads, rr=a, sq=b, ca=c, why=why))
        picks.append((label, a, b, c))
    return picks


# ----------------------------------------------------------------------------- 端到端
# en: end to end


def complete(url: str, prompt: str) -> str:
    body = {"prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0}
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)["choices"][0]["text"]


def send_workload(server: ServerProcess, prompts: list[str]) -> dict[str, Any]:
    """一个接一个地发 ``prompts``；记下每个请求去了哪个副本（路由器的计数器哪个动了），前后各读一次副本的计数。

    en: Send ``prompts`` one after another; note which replica each went to (whose router counter moved), and read the
    replicas' counters before and after.
    """
    before = server.settled_metrics()
    routed = per_replica(before, "minisgl_router_requests_routed_total")
    went, answers = [], []
    for prompt in prompts:
        answers.append(complete(server.url, prompt))
        now = per_replica(server.metrics(), "minisgl_router_requests_routed_total")
        went.append(next(r for r in now if now[r] > routed.get(r, 0)))
        routed = now
    after = server.settled_metrics()
    delta = {name: {r: after_v - per_replica(before, name).get(r, 0)
                    for r, after_v in per_replica(after, name).items()}
             for name in ("minisgl_prefill_tokens_total", "minisgl_prefix_cache_hit_tokens_total")}
    return {"went": went, "answers": answers, "prefill": delta["minisgl_prefill_tokens_total"],
            "hits": delta["minisgl_prefix_cache_hit_tokens_total"]}


def report(policy: str, tag: str, run: dict[str, Any]) -> None:
    print(tr("{policy}, {n} prompts {tag!r} ({groups} prefixes x 3 tails, one after another):", policy=policy,
             n=len(run["went"]), tag=tag, groups=GROUPS))
    for g in range(GROUPS):
        print(tr("  prefix {g} went to replicas {replicas}", g=g, replicas=run["went"][g::GROUPS]))
    for r in sorted(run["prefill"]):
        print(tr("  replica {r}: {n} requests, {prefill:.0f} prefill tokens computed, {hits:.0f} prefix-cache hit tokens",
                 r=r, n=run["went"].count(r), prefill=run["prefill"][r], hits=run["hits"].get(r, 0)))
    print(tr("  in all: {prefill:.0f} prefill tokens computed, {hits:.0f} cache hits", prefill=sum(run["prefill"].values()),
             hits=sum(run["hits"].values())))


def end_to_end() -> dict[str, dict[str, Any]]:
    """``--dp 2``（缓存感知）和同样两个副本前面单独起的轮流路由器，各发一组形状相同的共享前缀负载。

    en: ``--dp 2`` (cache-aware) and a round-robin router started alone in front of the same two replicas, each sent one
    shared-prefix workload of the same shape.
    """
    print(tr("Starting python -m minisgl --dp 2 (tiny Qwen3) ..."))
    runs: dict[str, dict[str, Any]] = {}
    with ServerProcess(tiny_qwen3(), *FLAGS, "--dp", "2") as dp:
        with urllib.request.urlopen(f"{dp.url}/list_workers", timeout=10) as r:
            workers = json.load(r)
        print(tr("/list_workers: policy {policy}, {n} replicas, alive {alive}", policy=workers["policy"],
                 n=len(workers["urls"]), alive=workers["alive"]))
        with ServerProcess.router(workers["urls"], "--router-policy", "round_robin") as rr:
            runs["round_robin"] = send_workload(rr, shared_prefix_prompts("alpha", GROUPS))
        report("round_robin", "alpha", runs["round_robin"])
        runs["cache_aware"] = send_workload(dp, shared_prefix_prompts("beta", GROUPS))
        report("cache_aware", "beta", runs["cache_aware"])
        again = send_workload(dp, shared_prefix_prompts("alpha", GROUPS))
        print(tr("the 'alpha' prompts again through cache_aware: the same answers as round_robin gave: {same}",
                 same=again["answers"] == runs["round_robin"]["answers"]))
        print(tr("a few lines of the router's /metrics (its own counters, and the replicas' with a replica label):"))
        names = ("minisgl_router_replica_up", "minisgl_router_requests_routed_total", "minisgl_prefill_tokens_total")
        for key, value in sorted(dp.settled_metrics().items()):
            if key.split("{")[0] in names:
                print(f"  {key} {value:.0f}")
    ca, rr_total = sum(runs["cache_aware"]["prefill"].values()), sum(runs["round_robin"]["prefill"].values())
    print(tr("prefill tokens computed: cache_aware {ca:.0f}, round_robin {rr:.0f}; saved {saved:.0f}", ca=ca, rr=rr_total,
             saved=rr_total - ca))
    return runs


def main() -> None:
    print(tr("== 1. A prefix tree by hand =="))
    tree_demo()
    print(tr("\n== 2. Three policies, one sequence of prompts and loads =="))
    policy_demo()
    print(tr("\n== 3. End to end: two replicas, round_robin against cache_aware =="))
    end_to_end()


if __name__ == "__main__":
    main()
