"""解码的 CUDA 图（``minisgl/graph.py``）：开与不开，token 一模一样；补齐的行不碰任何真实的 KV 槽位。

默认在 CPU 上用 ``eager`` 模式检查：同样的固定缓冲区、同样的补齐，只是不录制、直接调用；
``pytest --device cuda`` 时录制真正的 CUDA 图（``make gpu-check`` 就是这样跑的）。
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from checks.hf_reference import greedy_reference
from minisgl import model_zoo
from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.graph import batch_size_buckets, kv_len_buckets
from minisgl.llm import LLM

MODE = "cuda" if os.environ.get("MINISGL_DEVICE") == "cuda" else "eager"
KW: dict[str, Any] = dict(dtype=torch.float32, device="auto", max_running_req=8, num_page_override=1024, max_seq_len_override=512)

#: 长短不一的提示词和输出长度：解码批从 6 个请求一路减到 1 个，经过每个批大小档位和补齐；
#: 最长的那个超过 256 个 key，用上第二个 key 数档位。
PROMPTS = [[5, 6, 7, 8, 9], [1, 2, 3], [100, 200, 300, 400, 500, 600, 700], [42] * 20, [7, 7], list(range(1000, 1300))]
MAX_TOKENS = [40, 25, 10, 33, 5, 12]


def built(getter: Any) -> str:
    try:
        return str(getter())
    except FileNotFoundError as e:
        pytest.fail(str(e), pytrace=False)


def run(path: str, mode: str, page_size: int = 1, overlap: bool = True, max_bs: int = 4) -> tuple[list[list[int]], LLM]:
    llm = LLM(path, page_size=page_size, cuda_graph=mode, cuda_graph_max_bs=max_bs, **KW)
    # 池子用 torch.empty 分配：清零后，两边没写过的槽位才可比
    # en: the pool is allocated with torch.empty: zeroed, the slots neither run writes compare equal
    llm.engine.kv_cache.zero_()
    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    try:
        params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
        out = [o["token_ids"] for o in llm.generate(PROMPTS, params)]
    finally:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved
    llm.check_integrity()
    return out, llm


def test_buckets() -> None:
    assert batch_size_buckets(4) == [1, 2, 4]
    assert batch_size_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert batch_size_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert kv_len_buckets(512) == [256, 512]
    assert kv_len_buckets(300) == [256, 300]
    assert kv_len_buckets(100) == [100]


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_graph_on_off_identical(page_size: int, overlap: bool) -> None:
    path = built(model_zoo.tiny_qwen3)
    plain, llm_off = run(path, "off", page_size, overlap)
    graphed, llm_on = run(path, MODE, page_size, overlap)
    try:
        assert graphed == plain, f"开图（{MODE}）与不开图的输出不同"
        runner = llm_on.engine.graph_runner
        used = set(runner.replays)
        assert any(n < bs for n, bs, _ in used), f"应当有补齐过的批次走了图：{sorted(used)}"
        assert any(kv == 512 for *_, kv in used), f"最长的请求应当用上 512 的 key 档位：{sorted(used)}"
        assert max(n for n, _, _ in used) <= 4, "超过最大档位的批次不该走图"
        # 补齐的行只能写进多出来的那一页：真实页面上的 K/V 与不开图时一致
        pages = llm_off.engine.num_pages
        assert llm_on.engine.num_pages == pages and llm_on.engine.kv_cache.num_pages == pages + 1
        on, off = llm_on.engine.kv_cache, llm_off.engine.kv_cache
        slots = pages * off.page_size
        for layer in range(off.num_layers):
            for view in ("k_cache", "v_cache"):
                real = getattr(on, view)(layer)[:slots].cpu()
                torch.testing.assert_close(real, getattr(off, view)(layer).cpu(), atol=1e-4, rtol=1e-4)
    finally:
        llm_off.shutdown()
        llm_on.shutdown()


def test_prefill_and_large_batches_run_normally() -> None:
    path = built(model_zoo.tiny_qwen3)
    out, llm = run(path, MODE, max_bs=2)
    try:
        assert all(n <= 2 and bs <= 2 for n, bs, _ in llm.engine.graph_runner.replays), "只有不超过 2 的解码批次走图"
        plain, llm_off = run(path, "off")
        llm_off.shutdown()
        assert out == plain
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def smollm2_path() -> str:
    return built(model_zoo.smollm2)


def test_smollm2_matches_hf(smollm2_path: str) -> None:
    path = smollm2_path
    prompts = PROMPTS[:5]
    ref = greedy_reference(path, prompts, 16)
    llm = LLM(path, cuda_graph=MODE, cuda_graph_max_bs=8, **KW)
    try:
        out = [o["token_ids"] for o in llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))]
        assert out == ref, "开图后与 Hugging Face 的贪心输出不一致"
        assert llm.engine.graph_runner.replays, "解码应当走图"
    finally:
        llm.shutdown()


@pytest.mark.parametrize(
    "kw,words",
    [
        (dict(cuda_graph="sometimes"), "可选"),
        (dict(cuda_graph_max_bs=0), "cuda_graph_max_bs"),
    ],
)
def test_bad_graph_config_is_refused(kw: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        LLM(built(model_zoo.tiny_qwen3), **{**KW, **kw})


def test_cuda_mode_refused_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.fail("这一条只在没有 CUDA 的机器上有意义；gpu_check 不跑它", pytrace=False)
    with pytest.raises(ValueError, match="eager"):
        LLM(built(model_zoo.tiny_qwen3), cuda_graph="cuda", **KW)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
@pytest.mark.parametrize("chunk", [None, 5], ids=["nochunk", "chunk5"])
@pytest.mark.parametrize("cache_type,page_size", [("radix", 1), ("naive", 1), ("radix", 4), ("naive", 4)])
def test_every_combination_matches_hf_with_graphs(cache_type: str, page_size: int, chunk: int | None, overlap: bool) -> None:
    """每种缓存 × 页大小 × 分块 × 重叠的组合，开着图，与同一设备上的 Hugging Face 逐 token 一致（tiny 模型，
    GPU 机器上也有它；SmolLM2 上的同一组合在第 2.5 章的检查里）。"""
    path = built(model_zoo.tiny_qwen3)
    prompts = PROMPTS[:5]
    ref = greedy_reference(path, prompts, 12)
    chunking = {"max_extend_tokens": chunk} if chunk else {}
    llm = LLM(path, cache_type=cache_type, page_size=page_size, cuda_graph=MODE, **KW, **chunking)
    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    try:
        out = [o["token_ids"] for o in llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))]
        again = [o["token_ids"] for o in llm.generate(prompts[::-1], SamplingParams(max_tokens=12, ignore_eos=True))]
        llm.check_integrity()
    finally:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved
        llm.shutdown()
    assert out == ref, f"{cache_type}, page_size={page_size}, 块 {chunk}, 重叠 {overlap}：与 HF 不一致"
    assert again == ref[::-1], "第二遍（前缀已在缓存里、顺序反过来）也要一致"
