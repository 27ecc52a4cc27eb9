"""给定的 ``minisgl.architectures``：稠密模型交给第 1.3 章、Qwen3-MoE（组装登记的）交给第 4.4 章读配置和搭模型；没有
组装时 MoE 检查点被拒绝并说清楚；MoE 模型不录 CUDA 图、不走融合的 C 解码，并说出原因。

en: The given ``minisgl.architectures``: dense models go to chapter 1.3, Qwen3-MoE (registered by the assembly) to
chapter 4.4 for the config and the model; without the assembly an MoE checkpoint is refused with a clear message; an
MoE model is not captured as a CUDA graph and does not take the fused C decode, and says why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checks.common import expect
from minisgl import model_zoo
import minisgl.llm  # noqa: F401 - 组装：登记混合专家 | en: the assembly: registers mixtures of experts
from minisgl.i18n import tr


def test_config_goes_to_the_right_chapter(tmp_path: Path) -> None:
    from minisgl.architectures import load_model_config
    from minisgl.models import ModelConfig
    from minisgl.moe import MoeConfig

    moe_path = model_zoo.tiny_qwen3_moe()
    dense, moe = load_model_config(model_zoo.tiny_qwen3()), load_model_config(moe_path)
    expect((type(dense), type(moe)), (ModelConfig, MoeConfig), tr("qwen3-tiny is read by chapter 1.3, the tiny MoE by 4.4"))
    got = (moe.architecture, moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size, moe.norm_topk_prob,
           moe.mlp_only_layers, moe.intermediate_size, moe.qk_norm, moe.num_layers)
    expect(got, ("Qwen3MoeForCausalLM", 8, 2, 32, True, (0,), 128, True, 3),
           tr("the tiny MoE's config (architecture, experts, top-k, expert size, renormalise, dense layers, dense size, "
              "q/k norm, layers)"))
    hf = json.loads((Path(moe_path) / "config.json").read_text())
    hf["num_local_experts"] = hf.pop("num_experts")  # how recent transformers save it
    (tmp_path / "config.json").write_text(json.dumps(hf))
    expect(load_model_config(tmp_path).num_experts, 8, tr("num_local_experts is read as num_experts"))
    (tmp_path / "config.json").write_text(json.dumps({**hf, "num_experts_per_tok": 9}))
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        load_model_config(tmp_path)



def test_moe_without_the_assembly_is_refused_clearly() -> None:
    """引擎本身不认识后面的章节：没导入组装（``minisgl.llm``）时读 MoE 检查点，错误点名第 4.4 章和该走的路。

    en: The engine itself knows no later chapter: reading an MoE checkpoint without the assembly (``minisgl.llm``)
    names chapter 4.4 and the way to take.
    """
    code = ("from minisgl.architectures import load_model_config\n"
            f"load_model_config({str(model_zoo.tiny_qwen3_moe())!r})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    expect(out.returncode != 0 and "4.4" in out.stderr and "minisgl.llm" in out.stderr, True,
           tr("without the assembly an MoE checkpoint is refused, naming chapter 4.4 and minisgl.llm"))


def test_moe_models_take_no_graph_and_no_fused_decode() -> None:
    from minisgl.engine import Engine, EngineConfig
    from minisgl.graph import resolve_graph_mode

    expect(resolve_graph_mode("auto", torch.device("cuda"), capturable=False), "off",
           tr("cuda_graph='auto' is off for a model whose step shapes depend on the routing"))
    with pytest.raises(ValueError, match="cuda_graph='cuda'"):
        resolve_graph_mode("cuda", torch.device("cuda"), capturable=False)
    engine = Engine(EngineConfig(str(model_zoo.tiny_qwen3_moe()), dtype=torch.float32, device="cpu", num_page_override=64, max_running_req=2))
    try:
        expect((engine.fused_decode, engine.model.capturable), (False, False),
               tr("the tiny MoE: no fused C decode, not capturable"))
        reason = tr("cpu_fused_decode computes dense MLPs; this model routes tokens to experts")
        assert reason in engine.decode_path, tr("the decode path names the reason: {path}", path=engine.decode_path)
    finally:
        engine.shutdown()
