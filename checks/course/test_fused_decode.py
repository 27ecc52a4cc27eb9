"""融合解码（minisgl/fused.py + minisgl/kernel/cpu_decode.c）：fp32 时与 Hugging Face 逐 token 相同，bf16 时与逐层的
bf16 引擎逐 token 相同（与 HF bf16 的对照见 checks/reliability/test_bf16.py），用错了给出清楚的错误；
缺省只在第 1.2–1.5 章都是参考解答时打开，学员自己写的章节总会真正跑起来。"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from checks.hf_reference import greedy_reference
from minisgl import kernel, model_zoo
from minisgl.core import SamplingParams
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.paths import REPO_ROOT

#: 长短不一的提示词，请求槽比提示词少：批大小在 1 到 4 之间变化，新请求在别的请求解码到一半时加入。
PROMPTS = [[100 + 7 * i + j for j in range(3 + 5 * i)] for i in range(5)]
MAX_TOKENS = 10
KW = dict(dtype=torch.float32, device="cpu", max_running_req=4, num_page_override=128, max_seq_len_override=64, page_size=4)
#: bf16：一次一个请求。批里有别的请求时，PyTorch 的注意力（SDPA）把 K/V 补齐，求和顺序随之变化，逐层的 bf16 引擎自己
#: 一批一批的输出都会在几乎并列的候选上分岔；一个请求时两条路只差注意力里的求和顺序。
#: en: bf16: one request at a time. With other requests in the batch PyTorch's attention (SDPA) pads the K/V and its
#: en: summation order changes, so even the layer-by-layer bf16 engine's own output forks at near-ties from one batch
#: en: composition to another; with one request the two paths differ only in the summation order inside attention.
BF16_KW = {**KW, "dtype": torch.bfloat16, "max_running_req": 1}
#: bf16 的提示词：SmolLM2 在 [1, 22, 1353, ...] 上第 10 个 token 处 HF bf16 的两个候选 logit 完全相同，不放进来。
#: 这几条在 tiny Qwen3 上能抓住漏掉的舍入（残差、RoPE）。
#: en: bf16 prompts: on [1, 22, 1353, ...] SmolLM2's 10th token has two candidates with exactly equal HF bf16 logits,
#: en: so it is left out. These catch missing roundings (residual, RoPE) on the tiny Qwen3.
BF16_PROMPTS = [[1, 504, 3458, 282, 4649, 314], [1, 3303, 1435, 2443, 28], PROMPTS[2], PROMPTS[4]]
BF16_TOKENS = 16
#: 逐层引擎在某一步最大的两个对数概率相差不到这么多（nat）时，两条 bf16 的路选哪个都对（SmolLM2 的 logits 在 bf16 里
#: 的间距是 1/16–1/8，这台机器的注意力怎样求和也会挪动它们）：只许在这样的一步分岔，从那里起不再比。
#: en: When the layer-by-layer engine's two largest log-probabilities at a step are closer than this (nats), either
#: en: choice is right for two bf16 paths (SmolLM2's logits are 1/16–1/8 apart in bf16, and how this machine's attention
#: en: sums shifts them): a fork is allowed only at such a step, and nothing after it is compared.
BF16_TIE = 0.25


def _bf16_tokens(path: Path, fused: bool) -> tuple[list[list[int]], list[list[float]], str, int]:
    """bf16 贪心生成 BF16_TOKENS 个 token：(输出, 每一步最大的两个对数概率之差, Engine.decode_path, 融合解码走了几步)。"""
    llm = LLM(path, cpu_fused_decode=fused, **BF16_KW)
    try:
        params = SamplingParams(max_tokens=BF16_TOKENS, ignore_eos=True, logprobs=True, top_logprobs=2)
        out = llm.generate(BF16_PROMPTS, params)
        margins = [[lp.top_logprobs[0] - lp.top_logprobs[1] for lp in r["logprobs"]] for r in out]
        return [r["token_ids"] for r in out], margins, llm.engine.decode_path, (
            llm.engine.fused_decoder.decode_steps if fused else 0)
    finally:
        llm.shutdown()


def _assert_bf16_paths_agree(path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """两条路的线性层（预填充、LM head）都走同一个内核：否则两边的差别还包括这台机器量出的路（哪些行数交给 F.linear），
    近乎并列的候选会随之分岔——要比的只是融合解码本身。

    en: Both paths take the same kernel for their linear layers (prefill, the LM head): otherwise they would also differ
    by the path this machine measured (which row counts go to F.linear), and near-ties would fork with it — only the
    fused decode itself is compared.
    """
    monkeypatch.delenv("MINISGL_KERNEL_ONEDNN", raising=False)
    monkeypatch.setenv("MINISGL_KERNEL_MAX_ROWS", "64")
    fused, _, said, steps = _bf16_tokens(path, True)
    layered, margins, _, _ = _bf16_tokens(path, False)
    assert steps >= len(BF16_PROMPTS) * (BF16_TOKENS - 1), f"解码批次没有走融合解码（只走了 {steps} 步）"
    compared = 0
    for i, (f, w, margin) in enumerate(zip(fused, layered, margins)):
        fork = next((j for j, (a, b) in enumerate(zip(f, w)) if a != b), len(w))
        assert fork == len(w) or margin[fork] < BF16_TIE, (
            f"第 {i} 个提示词：bf16 融合解码 {f}，逐层 {w}：第 {fork} 个 token 分岔，逐层那边最大的两个对数概率相差 "
            f"{margin[fork]:.3f}，不是并列")
        compared += fork
    assert compared >= len(BF16_PROMPTS) * BF16_TOKENS // 2, f"只比上了 {compared} 个 token：分岔太早，这条检查什么也没证明"
    return said


@pytest.mark.parametrize("model", ["tiny_qwen3", "smollm2"])
def test_bf16_matches_layer_by_layer(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16：融合解码（bf16 权重和 KV 缓存，激活在逐层引擎舍入的地方同样舍入）与逐层的 bf16 引擎逐 token 相同。"""
    said = _assert_bf16_paths_agree(getattr(model_zoo, model)(), monkeypatch)
    assert "bfloat16" in said and ("vdpbf16ps" in said) == kernel.bf16_dot(), said


def test_bf16_without_the_bf16_dot_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU 没有 AVX512_BF16 时（这里假装没有）：融合解码读 bf16 权重、扩成 fp32 再乘（cpu_linear_bf16w），逐层的引擎
    也这样，两条路仍逐 token 相同；这句话说出点积怎么算。"""
    monkeypatch.setattr(kernel.library(), "bf16_dot", False)
    said = _assert_bf16_paths_agree(model_zoo.tiny_qwen3(), monkeypatch)
    assert "vdpbf16ps" not in said and "AVX512_BF16" in said, said


@pytest.mark.parametrize("model", ["tiny_qwen3", "smollm2"])  # Qwen3 有 q/k 归一化，Llama 没有
def test_matches_hf(model: str) -> None:
    path = getattr(model_zoo, model)()
    want = greedy_reference(path, PROMPTS, MAX_TOKENS)
    llm = LLM(path, cpu_fused_decode=True, **KW)
    try:
        got = [r["token_ids"] for r in llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))]
        steps = llm.engine.fused_decoder.decode_steps
    finally:
        llm.shutdown()
    assert steps >= MAX_TOKENS - 1, f"解码批次没有走融合解码（只走了 {steps} 步）"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"第 {i} 个提示词：融合解码 {g}，HF {w}"


@pytest.mark.parametrize(("kw", "words"), [
    ({"cpu_kernel": False}, "cpu_kernel"),
    ({"cuda_graph": "eager"}, "cuda_graph"),
    ({"dtype": torch.float16}, "bfloat16"),
])
def test_unsupported_settings_fail_clearly(kw: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        LLM(model_zoo.tiny_qwen3(), cpu_fused_decode=True, **{**KW, **kw})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_by_default_with_the_reference_solutions(dtype: torch.dtype) -> None:
    """CPU、fp32 或 bf16、内核线性层，第 1.2–1.5 章都是参考解答（这个检查进程就是）：不给 cpu_fused_decode 时走融合
    解码，给 False 时逐层走；两条路的输出相同，引擎用一句话说出走的是哪条（融合时还说出权重类型）。"""
    path = model_zoo.tiny_qwen3()
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    out = {}
    for requested in (None, False):
        kw = {**(KW if dtype == torch.float32 else BF16_KW), "dtype": dtype, "device": "cpu"}
        llm = LLM(path, dtype=kw.pop("dtype"), device=kw.pop("device"), cpu_fused_decode=requested, **kw)
        try:
            out[requested] = [r["token_ids"] for r in llm.generate(PROMPTS, params)]
            fused, said = llm.engine.fused_decoder is not None, llm.engine.decode_path
        finally:
            llm.shutdown()
        assert fused == (requested is None), tr("cpu_fused_decode={requested}: fused decode installed: {fused} ({said})",
                                                requested=requested, fused=fused, said=said)
        assert ("1.2" in said) == (requested is None) and "cpu_fused_decode=False" in said, said
        assert (str(dtype).removeprefix("torch.") in said) == (requested is None), said
    assert out[None] == out[False], tr("Fused and layer-by-layer decoding must give the same tokens")


def test_a_learner_chapter_always_runs(tmp_path: Path) -> None:
    """学员写了第 1.5 章（这里是参考解答的一份拷贝，照样算学员代码）：缺省不走融合解码，解码批次真的调用学员的
    注意力后端，引擎的那句话点出第 1.5 章。在子进程里跑：章节的选择在进程启动时定下。"""
    learner = tmp_path / "stage1" / "attention.py"
    learner.parent.mkdir()
    shutil.copy(REPO_ROOT / "solutions" / "stage1" / "attention.py", learner)
    script = textwrap.dedent(f"""
        import torch
        from minisgl.core import SamplingParams
        from minisgl.llm import LLM
        llm = LLM({str(model_zoo.tiny_qwen3())!r}, dtype=torch.float32, device="cpu", max_running_req=4,
                  num_page_override=128, max_seq_len_override=64, page_size=4)
        backend = llm.engine.attn_backend
        calls = []
        forward = backend.forward
        backend.forward = lambda q, k, v, layer_id, batch: calls.append(batch.is_decode) or forward(q, k, v, layer_id, batch)
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))
        print(type(backend).__module__, llm.engine.fused_decoder is None, sum(calls), sep="\\n")
        print(llm.engine.decode_path)
        llm.shutdown()
    """)
    env = {**os.environ, "MINISGL_WORKSPACE": str(tmp_path), "MINISGL_IMPL": "attention=learner", "MINISGL_LANG": "en"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    module, unfused, decode_calls, said = proc.stdout.strip().splitlines()[-4:]
    assert module.startswith("_minisgl_impl.learner."), module
    assert unfused == "True", tr("With chapter 1.5 your code, the fused decode must stay off by default: {said}", said=said)
    assert int(decode_calls) > 0, tr("Decode batches must call your attention backend")
    assert "1.5" in said, said
