"""长时间运行（soak）：一个 ``LLM`` 实例分波服务上万个短请求，检查内存和 KV 页面每一波之后都回到原位。

    python tools/soak.py                           # 20 波 × 500 个请求（tiny 模型，约几分钟）
    python tools/soak.py --waves 3 --per-wave 50   # 快速看一眼
    python tools/soak.py --plot docs/assets/soak.png --json docs/outputs/soak.json

每一波：长短不一的提示词（一部分共享前缀、一部分完全重复）、贪心和带种子的采样、一部分请求中途取消。
每波结束后记录：进程常驻内存（RSS）、空闲页数、Python 分配的内存（tracemalloc）、存活的张量个数。
前几波是预热（前缀缓存第一次被写满、分配器和 oneDNN 的原语缓存长到稳定大小），之后每一波都要回到预热后的水平，否则退出码非 0。
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import random
import sys
import time
import tracemalloc
from pathlib import Path

# oneDNN 为每种输入形状编译并缓存一个计算原语（默认最多 1024 个）。预填充每步的 token 数都不同，
# 这个缓存会慢慢长到上限，RSS 随之缓慢上涨几十 MB——有界，但会掩盖我们自己代码里的泄漏。
# 所以 soak 把它限制得小一些（必须在导入 torch 之前设置；已经设置了就尊重你的值）。
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")

import torch  # noqa: E402

from minisgl import model_zoo  # noqa: E402
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402


def rss_mb() -> float:
    """常驻内存。先请 glibc 把已释放的堆页还给系统（它默认留着备用），这样 RSS 反映的是真正还在用的内存。"""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def live_tensors(llm: LLM) -> int:
    """存活的张量个数，不算 radix 树节点里的键和值（树受 KV 池大小限制，满了就驱逐）。"""
    cache = llm.cache_manager.prefix_cache
    in_tree = 2 * len(cache._all_nodes()) if hasattr(cache, "_all_nodes") else 0
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor)) - in_tree


def one_wave(llm: LLM, rng: random.Random, n: int, shared: list[int]) -> tuple[int, int]:
    """提交 n 个请求，随机取消约 10%，跑到空闲。返回（完成数，取消数）。"""
    uids, pending_aborts = [], []
    for _ in range(n):
        kind = rng.random()
        tail = [rng.randrange(1000) for _ in range(rng.randint(1, 40))]
        prompt = shared + tail if kind < 0.5 else tail
        greedy = rng.random() < 0.5
        sp = SamplingParams(
            max_tokens=rng.randint(1, 8),
            temperature=0.0 if greedy else 0.8,
            seed=None if greedy else rng.randrange(2**20),
            ignore_eos=True,
        )
        uid = llm.add_request(prompt, sp)
        uids.append(uid)
        if rng.random() < 0.1:
            pending_aborts.append((uid, rng.randint(0, 30)))
    steps = 0
    while llm.busy:
        for uid, at in pending_aborts:
            if at == steps:
                llm.abort(uid)
        llm.step()
        steps += 1
    llm.run_until_idle()
    llm.check_integrity()
    aborted = sum(llm.status[u].aborted for u in uids)
    for u in uids:
        del llm.status[u]
    return len(uids) - aborted, aborted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="soak：分波服务大量短请求，检查内存和页面是否回到原位")
    parser.add_argument("--waves", type=int, default=20)
    parser.add_argument("--per-wave", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=5, help="前几波算预热（KV 池、分配器在这时长到稳定大小）")
    parser.add_argument("--rss-tolerance-mb", type=float, default=48.0, help="预热之后 RSS 允许的增长（MB）")
    parser.add_argument("--json", type=Path, default=None, help="把每一波的数字写成 JSON")
    parser.add_argument("--plot", type=Path, default=None, help="把内存曲线画成 PNG")
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    llm = LLM(str(model_zoo.tiny_qwen3()), dtype=torch.float32, max_running_req=16, num_page_override=4096, max_seq_len_override=128)
    total_pages = llm.cache_manager.num_pages
    # CPU 上 torch.zeros 拿到的内存，操作系统要等第一次写入才真正分配：先把整个 KV 池写一遍，
    # 否则 RSS 会随着用到的页越来越多而上涨，看起来像泄漏，其实只是池子被逐渐“摸到”。
    kv = llm.engine.kv_cache
    for layer in range(llm.engine.model_config.num_layers):
        kv.k_cache(layer).fill_(0)
        kv.v_cache(layer).fill_(0)
    shared = [rng.randrange(1000) for _ in range(30)]
    tracemalloc.start()
    rows = []
    start = time.perf_counter()
    with torch.inference_mode():
        for wave in range(args.waves):
            done, aborted = one_wave(llm, rng, args.per_wave, shared)
            gc.collect()
            cm = llm.cache_manager
            row = {
                "wave": wave + 1,
                "served": done,
                "aborted": aborted,
                "rss_mb": round(rss_mb(), 1),
                "py_alloc_mb": round(tracemalloc.get_traced_memory()[0] / 2**20, 2),
                "live_tensors": live_tensors(llm),
                "free_pages": len(cm.free_slots),
                "cached_pages": cm.prefix_cache.size_info.total_size // cm.page_size,
                "status_entries": len(llm.status),
                "tree_nodes": len(cm.prefix_cache._all_nodes()) if hasattr(cm.prefix_cache, "_all_nodes") else 0,
            }
            rows.append(row)
            print(
                f"第 {row['wave']:>2} 波：完成 {done}，取消 {aborted}；RSS {row['rss_mb']} MB，Python 分配 {row['py_alloc_mb']} MB，"
                f"树外的张量 {row['live_tensors']} 个，radix 树 {row['tree_nodes']} 个节点，空闲 {row['free_pages']} 页 + 缓存 {row['cached_pages']} 页 = {total_pages}",
                flush=True,
            )
    llm.shutdown()
    seconds = time.perf_counter() - start
    served = sum(r["served"] + r["aborted"] for r in rows)
    print(f"共 {served} 个请求（{sum(r['aborted'] for r in rows)} 个中途取消），{seconds:.0f} s")

    problems = []
    warm = rows[: max(args.warmup, 1)]
    base_rss = max(r["rss_mb"] for r in warm)
    base_tensors = warm[-1]["live_tensors"]
    for r in rows:
        if r["free_pages"] + r["cached_pages"] != total_pages:
            problems.append(f"第 {r['wave']} 波之后页面对不上账")
        if r["status_entries"]:
            problems.append(f"第 {r['wave']} 波之后还留着 {r['status_entries']} 个请求状态")
    for r in rows[len(warm) :]:
        if r["rss_mb"] - base_rss > args.rss_tolerance_mb:
            problems.append(f"第 {r['wave']} 波之后 RSS 比预热后多了 {r['rss_mb'] - base_rss:.0f} MB")
        if r["live_tensors"] > base_tensors + 50:
            problems.append(f"第 {r['wave']} 波之后树外的张量在增长（{r['live_tensors']} 个）")
    later = rows[len(warm) :]
    if len(later) >= 4:  # Python 分配的内存：后一半的平均不比前一半多出 1 MB 以上（没有无界增长）
        half = len(later) // 2
        first = sum(r["py_alloc_mb"] for r in later[:half]) / half
        second = sum(r["py_alloc_mb"] for r in later[half:]) / (len(later) - half)
        if second - first > 1.0:
            problems.append(f"Python 分配的内存在增长：前半段平均 {first:.2f} MB，后半段 {second:.2f} MB")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "seconds": round(seconds), "total_pages": total_pages}, indent=1) + "\n")
    if args.plot:
        plot(rows, args.plot, args.warmup)
    for p in problems:
        print("问题：" + p)
    print("结论：" + ("内存和页面每一波之后都回到原位" if not problems else "有问题，见上"))
    return 1 if problems else 0


def plot(rows: list[dict], path: Path, warmup: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from minisgl.notebook.setup import setup_matplotlib

    setup_matplotlib()
    waves = [r["wave"] for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4), constrained_layout=True)
    ax[0].plot(waves, [r["rss_mb"] for r in rows], marker="o", label="进程常驻内存 RSS")
    ax[0].axvspan(0.5, warmup + 0.5, color="0.9", label="预热")
    ax[0].set_xlabel("波次")
    ax[0].set_ylabel("MB")
    ax[0].set_ylim(0, max(r["rss_mb"] for r in rows) * 1.15)
    ax[0].set_title("每一波之后的内存")
    ax[0].legend(loc="lower right")
    ax[1].plot(waves, [r["free_pages"] for r in rows], marker="o", label="空闲页")
    ax[1].plot(waves, [r["cached_pages"] for r in rows], marker="s", label="前缀缓存占的页")
    ax[1].set_xlabel("波次")
    ax[1].set_title("每一波之后的 KV 页面")
    ax[1].legend(loc="center right")
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
