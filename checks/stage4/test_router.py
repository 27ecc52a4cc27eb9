"""第 4.6 章 router 的检查：前缀树的匹配和大小与逐条比对的结果相同（随机的文字集）；LRU 删的是最久没用的叶子，
叶子删光的父节点也删；负载不均的两条门槛（都是严格大于，两条都要）；缓存感知把重复的前缀送回同一个副本、把不同的
前缀分开、负载不均时让位给最短队列；轮流与最短队列；副本死了之后不再被选。端到端：``--dp 2`` 的两个副本，
共享前缀的负载走缓存感知时预填充的 token 明显少于轮流（副本自己的计数器），回答一字不差；断开的流在算它的那个副本
上被取消；杀掉一个副本之后请求都去另一个，它在 ``/metrics`` 里记为下线。

en: Checks of chapter 4.6 router: the prefix tree's matches and size equal a one-by-one comparison (random sets of
texts); LRU removes the least recently used leaf first, and a parent left without leaves too; the two imbalance
thresholds (both strictly greater, both required); cache-aware sends a repeated prefix back to the same replica, spreads
different prefixes, and gives way to the shortest queue when the load is imbalanced; in turn and shortest queue; a dead
replica is never chosen again. End to end: the two replicas of ``--dp 2`` compute clearly fewer prefill tokens on a
shared-prefix workload with cache-aware than in turn (the replicas' own counters), with identical answers; a stream
that disconnects is aborted on the replica computing it; after one replica is killed requests go to the other, and
``/metrics`` marks it down.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checks.common import expect
from minisgl.processes.harness import ServerProcess, child_pids, per_replica, shared_prefix_prompts
from minisgl.i18n import tr

TEXTS = st.lists(st.text(alphabet="abc", max_size=8), max_size=12)


def brute_match(texts: list[str], query: str) -> int:
    best = 0
    for t in texts:
        n = 0
        while n < min(len(t), len(query)) and t[n] == query[n]:
            n += 1
        best = max(best, n)
    return best


@settings(max_examples=150, deadline=None)
@given(texts=TEXTS, queries=st.lists(st.text(alphabet="abcd", max_size=9), max_size=6))
def test_tree_matches_like_one_by_one(texts: list[str], queries: list[str]) -> None:
    from minisgl.router import PrefixTree

    tree = PrefixTree()
    for t in texts:
        tree.insert(t)
    for q in [*texts, *queries]:
        expect(tree.match(q) == brute_match(texts, q), True,
               tr("match({q!r}) after inserting {texts} is {got}, expected {want}", q=q, texts=texts, got=tree.match(q),
                  want=brute_match(texts, q)))
    distinct = {t[:i] for t in texts for i in range(1, len(t) + 1)}
    expect(tree.size == len(distinct), True,
           tr("After inserting {texts} the tree holds {got} characters; a radix tree shares common prefixes and holds "
              "{want}", texts=texts, got=tree.size, want=len(distinct)))


@pytest.mark.parametrize(("texts", "query", "want"), [
    (["abc", "abd"], "ac", 1),  # 在边的中途分岔：不能再往下找孩子 | en: forks midway along an edge: no looking further down
    (["abc", "abd"], "abdd", 3),
    (["abcd"], "abx", 2),
    (["a", "ab", "abc"], "abcabc", 3),
])
def test_match_stops_where_it_forks(texts: list[str], query: str, want: int) -> None:
    from minisgl.router import PrefixTree

    tree = PrefixTree()
    for t in texts:
        tree.insert(t)
    expect(tree.match(query), want, tr("match({q!r}) after inserting {texts}", q=query, texts=texts))


def test_evict_removes_least_recently_used_leaves() -> None:
    from minisgl.router import PrefixTree

    tree = PrefixTree()
    system = "You are a careful assistant. "
    tree.insert(system + "Question one")
    tree.insert(system + "Question two")
    tree.insert("Translate: hello")
    tree.insert(system + "Question one, again")  # 最近用过：系统提示词和第一个问题 | en: used last: the system prompt and question one
    before = tree.size
    removed = tree.evict(before - 1)
    expect(removed == before - tree.size and tree.size <= before - 1, True,
           tr("evict returned {removed} but the tree went from {before} to {after} characters", removed=removed,
              before=before, after=tree.size))
    expect(tree.match(system + "Question two") == len(system + "Question "), True,
           tr("The least recently used leaf is the second question's tail, so it goes first"))
    expect(tree.match("Translate: hello") == len("Translate: hello") and tree.match(system + "Question one, again") ==
           len(system + "Question one, again"), True, tr("Evicting one leaf removed more than the least recently used one"))
    left = tree.size
    expect(tree.evict(0) == left and tree.size == 0 and tree.match(system) == 0, True,
           tr("evict(0) must empty the tree: a parent left without children becomes a leaf and goes too"))


def test_insert_again_refreshes_the_path() -> None:
    from minisgl.router import PrefixTree

    tree = PrefixTree()
    for text in ("first question", "second question", "first question"):  # 第一句又用到了 | en: the first used again
        tree.insert(text)
    tree.evict(tree.size - 1)
    expect((tree.match("first question"), tree.match("second question")), (len("first question"), 0),
           tr("Inserting a text that is already there marks its whole path as used now, so the other one goes first"))


@settings(max_examples=100, deadline=None)
@given(texts=TEXTS)
def test_evict_to_zero_empties_any_tree(texts: list[str]) -> None:
    from minisgl.router import PrefixTree

    tree = PrefixTree()
    for t in texts:
        tree.insert(t)
    size = tree.size
    removed = tree.evict(0)
    expect((removed, tree.size, tree.root.children), (size, 0, {}),
           tr("evict(0) after inserting {texts} must remove each node once and leave an empty root", texts=texts))


@pytest.mark.parametrize(("loads", "abs_t", "rel_t", "want"), [
    ([40, 0], 32, 1.0001, True),
    ([32, 0], 32, 1.0001, False),  # 差正好是门槛：不算 | en: a difference exactly at the threshold: no
    ([33, 0], 32, 1.0001, True),
    ([10, 10], 0, 1.0001, False),
    ([40, 30], 5, 1.5, False),  # 差够了，倍数不够 | en: the difference suffices, the ratio does not
    ([46, 30], 5, 1.5, True),
    ([3, 1, 0], 2, 1.0001, True),
    ([], 0, 1.0, False),
])
def test_imbalance_needs_both_thresholds(loads: list[int], abs_t: int, rel_t: float, want: bool) -> None:
    from minisgl.router import is_imbalanced

    got = is_imbalanced(loads, abs_t, rel_t)
    expect(got is want, True, tr("is_imbalanced({loads}, {abs_t}, {rel_t}) is {got}, expected {want}", loads=loads,
                           abs_t=abs_t, rel_t=rel_t, got=got, want=want))


PREFIX_A = "You are a helpful assistant who answers in one short sentence. "
PREFIX_B = "Translate the following English text into French, keeping names as they are. "


def test_cache_aware_keeps_prefixes_and_spreads() -> None:
    from minisgl.router import CacheAware

    policy = CacheAware(2)
    idle = {0: 0, 1: 0}
    a, b = policy.choose(PREFIX_A + "What is a cat?", idle), policy.choose(PREFIX_B + "Good morning.", idle)
    expect(a != b, True, tr("Two different prompts on two idle replicas went to the same replica {r}: the second should go "
                      "where the tree is smaller", r=a))
    for tail in ("What is a dog?", "Why is the sky blue?"):
        got = policy.choose(PREFIX_A + tail, idle)
        expect(got == a, True, tr("A prompt sharing most of its text with one sent to replica {want} went to {got}", want=a,
                            got=got))
    got = policy.choose(PREFIX_B + "See you tomorrow.", {0: 2, 1: 2})
    expect(got == b, True, tr("A prompt sharing most of its text with one sent to replica {want} went to {got}", want=b, got=got))
    expect(policy.choose("", idle) in (0, 1), True,
           tr("An empty text (a body the replica will refuse) still gets a replica: it matches nothing"))
    busy_a = {a: 3, b: 1}
    got = policy.choose("Completely unrelated words here.", busy_a)
    expect(got == b, True, tr("A prompt matching nothing should go to the replica with fewer requests in hand ({loads}), got "
                        "{got}", loads=busy_a, got=got))


def test_cache_aware_gives_way_to_shortest_queue() -> None:
    from minisgl.router import CacheAware

    policy = CacheAware(2)
    a = policy.choose(PREFIX_A + "What is a cat?", {0: 0, 1: 0})
    other = 1 - a
    balanced = {a: 20, other: 0}  # 差 20 ≤ 32：还算均衡，缓存说了算 | en: a difference of 20 <= 32: balanced, the cache decides
    got = policy.choose(PREFIX_A + "What is a dog?", balanced)
    expect(got == a, True, tr("With loads {loads} (not imbalanced) the cached prefix should win, got replica {got}",
                        loads=balanced, got=got))
    imbalanced = {a: 40, other: 0}
    got = policy.choose(PREFIX_A + "What is a cow?", imbalanced)
    expect(got == other, True, tr("With loads {loads} (imbalanced) the shortest queue should win over the cache, got replica "
                            "{got}", loads=imbalanced, got=got))
    custom = CacheAware(2, balance_abs_threshold=2, balance_rel_threshold=1.5)
    a = custom.choose(PREFIX_B, {0: 0, 1: 0})
    got = custom.choose(PREFIX_B + "Hello.", {a: 3, 1 - a: 0})
    expect(got == 1 - a, True, tr("The thresholds given to CacheAware must be used (abs 2, rel 1.5; loads 3 and 0)"))


def test_cache_aware_trims_its_trees() -> None:
    from minisgl.router import CacheAware

    policy = CacheAware(2, max_tree_chars=100)
    for i in range(6):
        policy.choose(f"{i} " + PREFIX_A + "What is a cat?", {0: 0, 1: 0})
    sizes = [tree.size for tree in policy.trees]
    expect(max(sizes) <= 100 and min(sizes) > 0, True,
           tr("With max_tree_chars=100 each tree must be trimmed to at most 100 characters after a choice, got {sizes}",
              sizes=sizes))


def test_round_robin_shortest_queue_and_dead_replicas() -> None:
    from minisgl.router import CacheAware, RoundRobin, ShortestQueue, make_policy

    rr = RoundRobin(3)
    order = [rr.choose("x", {0: 0, 1: 0, 2: 0}) for _ in range(4)]
    expect(order == [0, 1, 2, 0], True, tr("Round robin over three replicas gave {order}", order=order))
    order = [rr.choose("x", {0: 5, 2: 0}) for _ in range(3)]
    expect(order == [2, 0, 2], True, tr("Round robin with replica 1 dead gave {order}", order=order))
    sq = ShortestQueue(3)
    picks = [sq.choose("x", {0: 2, 1: 1, 2: 1}), sq.choose("x", {0: 0, 2: 0}), sq.choose("x", {1: 4, 2: 3})]
    expect(picks == [1, 0, 2], True, tr("Shortest queue gave {picks}", picks=picks))
    ca = CacheAware(2)
    first = ca.choose(PREFIX_A, {0: 0, 1: 0})
    ca.forget(first)
    got = ca.choose(PREFIX_A + "again", {1 - first: 0})
    expect(got == 1 - first, True, tr("A dead replica must never be chosen (it is not among the live loads)"))
    with pytest.raises(ValueError):
        make_policy("random", 2)


# ----------------------------------------------------------------------------- 端到端 | en: end to end

FLAGS = ("--dtype", "float32", "--num-pages", "2048", "--max-seq-len", "512")
GROUPS = 3  # 3 组对 2 个副本：轮流时同一组会落到两边 | en: 3 groups on 2 replicas: in turn, one group lands on both


def run(url: str, prompts: list[str]) -> list[str]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    name = client.models.list().data[0].id
    return [client.completions.create(model=name, prompt=p, max_tokens=6, temperature=0).choices[0].text for p in prompts]


@pytest.fixture(scope="module")
def dp_server(tiny_path: str) -> Iterator[ServerProcess]:
    from minisgl.course import select

    with pytest.MonkeyPatch.context() as mp:
        for key, value in select.impl_env().items():  # 服务器和单独的路由器用本检查的那套实现 | en: the servers and the lone router use this check's implementations
            mp.setenv(key, value)
        server = ServerProcess(tiny_path, *FLAGS, "--dp", "2")
        with server:
            yield server
    expect(server.proc is not None and server.proc.returncode == 0, True,
           tr("The --dp 2 server exited with {code}; its output:\n{output}", code=server.proc.returncode if server.proc else None,
              output=server.output))
    expect(not server.left_behind, True, tr("Processes left behind after the server stopped: {pids}", pids=server.left_behind))


def prefill(server: ServerProcess) -> float:
    return sum(per_replica(server.settled_metrics(), "minisgl_prefill_tokens_total").values())


def test_cache_aware_computes_fewer_prefill_tokens(dp_server: ServerProcess) -> None:
    with urllib.request.urlopen(f"{dp_server.url}/list_workers", timeout=10) as r:
        workers = json.load(r)
    expect(workers["policy"] == "cache_aware" and len(workers["urls"]) == 2, True,
           tr("--dp 2 should route with cache_aware over two replicas, /list_workers says {workers}", workers=workers))
    with ServerProcess.router(workers["urls"], "--router-policy", "round_robin") as rr:
        start = prefill(rr)
        rr_answers = run(rr.url, shared_prefix_prompts("alpha", GROUPS))
        rr_prefill = prefill(rr) - start
        routed = per_replica(rr.metrics(), "minisgl_router_requests_routed_total")
    expect(sorted(routed.values()) == [len(rr_answers) // 2, len(rr_answers) - len(rr_answers) // 2], True,
           tr("Round robin should split the requests evenly, routed {routed}", routed=routed))
    start = prefill(dp_server)
    run(dp_server.url, shared_prefix_prompts("beta", GROUPS))
    ca_prefill = prefill(dp_server) - start
    expect(ca_prefill < 0.75 * rr_prefill, True,
           tr("The same shape of workload computed {ca:.0f} prefill tokens with cache_aware and {rr:.0f} with "
              "round_robin: cache-aware routing should keep each shared prefix on one replica", ca=ca_prefill, rr=rr_prefill))
    expect(run(dp_server.url, shared_prefix_prompts("alpha", GROUPS)) == rr_answers, True,
           tr("The same requests must get the same answers whichever replica computes them"))
    hits = per_replica(dp_server.metrics(), "minisgl_prefix_cache_hit_tokens_total")
    expect(sorted(hits) == [0, 1], True, tr("/metrics should list each replica's counters with a replica label, got {hits}",
                                          hits=hits))


def test_abort_reaches_the_replica_computing_it(dp_server: ServerProcess) -> None:
    import httpx

    before = per_replica(dp_server.metrics(), "minisgl_aborted_requests_total")
    routed_before = per_replica(dp_server.metrics(), "minisgl_router_requests_routed_total")
    body = {"prompt": "Count slowly: one two three", "max_tokens": 400, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=60) as client, client.stream("POST", f"{dp_server.url}/v1/completions", json=body) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 6:
                break
    routed = per_replica(dp_server.metrics(), "minisgl_router_requests_routed_total")
    target = next(k for k in routed if routed[k] > routed_before.get(k, 0))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        after = per_replica(dp_server.metrics(), "minisgl_aborted_requests_total")
        if after.get(target, 0) > before.get(target, 0):
            break
        time.sleep(0.1)
    expect(after.get(target, 0) == before.get(target, 0) + 1 and
           all(after.get(k, 0) == before.get(k, 0) for k in after if k != target), True,
           tr("The disconnected stream went to replica {target}; its aborted requests went from {before} to {after}",
              target=target, before=before, after=after))


def test_dead_replica_is_taken_out(dp_server: ServerProcess) -> None:
    assert dp_server.proc is not None
    replicas = [p for p in child_pids(dp_server.proc.pid) if _is_replica(p)]
    expect(len(replicas) == 2, True, tr("Expected two replica processes under the --dp 2 server, found {n}", n=len(replicas)))
    os.killpg(replicas[0], signal.SIGKILL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        up = per_replica(dp_server.metrics(), "minisgl_router_replica_up")
        if sorted(up.values()) == [0.0, 1.0]:
            break
        time.sleep(0.1)
    expect(sorted(up.values()) == [0.0, 1.0], True, tr("/metrics should mark the killed replica down, got {up}", up=up))
    answers = run(dp_server.url, [PREFIX_A + "Still there?", PREFIX_B + "Still there?", "Third request."])
    expect(len(answers) == 3, True, tr("Requests after a replica died should go to the live one"))
    with urllib.request.urlopen(f"{dp_server.url}/health", timeout=10) as r:
        expect(r.status == 200, True, tr("/health should stay 200 while one replica is alive"))


def _is_replica(pid: int) -> bool:
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return False
    return b"minisgl" in cmd and b"--model" in cmd and b"--dp" not in cmd
