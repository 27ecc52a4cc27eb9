"""第 1.3 章 models 的检查：读配置、流式加载权重（合并投影、清楚的报错）、随机权重，
以及 Qwen3（tiny 与 0.6B 形状）和 Llama（SmolLM2）的 logits 与 transformers 在同一份权重上一致：
预填充、带缓存前缀的续算、解码。"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from checks.hf_reference import check_device
from minisgl.i18n import tr
from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.models import ModelConfig, create_model, load_dummy_weights, load_weights

from .conftest import expect


def test_model_config_from_hf(tiny_path: str, smollm2_path: str) -> None:
    qwen = ModelConfig.from_hf(tiny_path)
    assert qwen.architecture == "Qwen3ForCausalLM" and qwen.qk_norm, tr("Qwen3 has q/k norm")
    expect((qwen.num_layers, qwen.num_qo_heads, qwen.num_kv_heads, qwen.head_dim), (2, 4, 2, 32), tr("tiny Qwen3: (num_layers, num_qo_heads, num_kv_heads, head_dim)"))
    expect((qwen.rope_theta, qwen.tie_word_embeddings, qwen.vocab_size), (1_000_000, True, 151936), tr("tiny Qwen3: (rope_theta, tie_word_embeddings, vocab_size)"))
    llama = ModelConfig.from_hf(smollm2_path)
    assert llama.architecture == "LlamaForCausalLM" and not llama.qk_norm, tr("Llama has no q/k norm")
    expect((llama.num_layers, llama.num_qo_heads, llama.num_kv_heads, llama.head_dim), (30, 9, 3, 64), tr("SmolLM2 (Llama): (num_layers, num_qo_heads, num_kv_heads, head_dim)"))
    assert llama.rope_theta == 100_000, tr("transformers v5 puts rope_theta in rope_parameters")
    assert llama.rms_norm_eps == pytest.approx(1e-5), tr("SmolLM2 (Llama): rms_norm_eps must be 1e-5 (from config.json), got {eps}", eps=llama.rms_norm_eps)


def test_model_config_errors(tiny_path: str, tmp_path: Path) -> None:
    hf = json.loads((Path(tiny_path) / "config.json").read_text())
    with pytest.raises(ValueError, match="MambaForCausalLM"):
        ModelConfig.from_dict({**hf, "architectures": ["MambaForCausalLM"]})
        pytest.fail(tr("An unknown architecture must raise ValueError naming the architecture"))
    for missing in ({k: v for k, v in hf.items() if k != "architectures"}, {**hf, "architectures": []}):
        with pytest.raises(ValueError):
            ModelConfig.from_dict(missing)
            pytest.fail(tr("A config.json without architectures must raise the same clear ValueError (not a TypeError or IndexError)"))
    with pytest.raises(NotImplementedError):
        ModelConfig.from_dict({**hf, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
        pytest.fail(tr("An unimplemented RoPE scaling must fail loudly instead of silently computing wrong results"))
    no_kv = {k: v for k, v in hf.items() if k not in ("num_key_value_heads", "head_dim")}
    cfg = ModelConfig.from_dict(no_kv)
    expect(cfg.num_kv_heads, hf["num_attention_heads"], tr("Without num_key_value_heads in config.json, num_kv_heads defaults to num_attention_heads"))
    expect(cfg.head_dim, hf["hidden_size"] // hf["num_attention_heads"], tr("Without head_dim in config.json, head_dim defaults to hidden_size // num_attention_heads"))
    with pytest.raises(FileNotFoundError, match="make setup"):
        ModelConfig.from_hf(tmp_path)


def test_model_config_defaults_and_first_architecture(tiny_path: str) -> None:
    """缺省值按任务里写的来（不是“碰巧和我们的模型一样”）；``architectures`` 有多个时看第一个，和 transformers 一样。"""
    hf = json.loads((Path(tiny_path) / "config.json").read_text())
    untied = ModelConfig.from_dict({**hf, "tie_word_embeddings": False})
    assert untied.tie_word_embeddings is False, tr("With tie_word_embeddings=False the LM head has its own weight")
    bare = ModelConfig.from_dict({k: v for k, v in hf.items() if k not in ("tie_word_embeddings", "attention_bias", "mlp_bias")})
    assert (bare.tie_word_embeddings, bare.attention_bias, bare.mlp_bias) == (False, False, False), tr("All three default to False")
    two = ModelConfig.from_dict({**hf, "architectures": ["Qwen3ForCausalLM", "SomethingElse"]})
    assert two.architecture == "Qwen3ForCausalLM" and two.qk_norm, tr("When architectures lists several, use the first")


def load_tiny(path: str | Path) -> torch.nn.Module:
    model = create_model(ModelConfig.from_hf(path), torch.float32, "cpu")
    load_weights(model, path)
    return model


def test_merged_projections_equal_hf(tiny_path: str, hand) -> None:  # noqa: ANN001
    model = load_tiny(tiny_path)
    hf = {name: t.cpu() for name, t in hand.load_hf(tiny_path).state_dict().items()}  # HF 在检查的设备上，本模型在 CPU 上
    for i in range(2):
        p = f"model.layers.{i}."
        qkv = model.model.layers[i].self_attn.qkv_proj.weight
        want = torch.cat([hf[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        assert torch.equal(qkv, want), tr("qkv_proj must concatenate HF's three projections in the order q, k, v")
        gate_up = model.model.layers[i].mlp.gate_up_proj.weight
        assert torch.equal(gate_up, torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]])), tr("Layer {i}: gate_up_proj must be gate_proj stacked on top of up_proj (in that order)", i=i)
        assert torch.equal(model.model.layers[i].self_attn.q_norm.weight, hf[p + "self_attn.q_norm.weight"]), tr("Layer {i}: q_norm.weight must be loaded from the checkpoint", i=i)
    assert torch.equal(model.model.embed_tokens.weight, hf["model.embed_tokens.weight"]), tr("embed_tokens.weight must be loaded from the checkpoint")
    assert model.lm_head.weight is model.model.embed_tokens.weight, tr("With tied weights the LM head and the embedding must be the same tensor")


def rewrite_checkpoint(src: str, dst: Path, edit) -> Path:  # noqa: ANN001
    """把检查点拷一份，用 ``edit(dict)`` 改动其中的张量。"""
    dst.mkdir()
    shutil.copy(Path(src) / "config.json", dst / "config.json")
    with safe_open(Path(src) / "model.safetensors", framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    edit(tensors)
    save_file(tensors, dst / "model.safetensors")
    return dst


def test_missing_tensor_is_named(tiny_path: str, tmp_path: Path) -> None:
    path = rewrite_checkpoint(tiny_path, tmp_path / "m", lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight"):
        load_tiny(path)
        pytest.fail(tr("A missing tensor must be reported by name"))


def test_misshaped_tensor_is_named(tiny_path: str, tmp_path: Path) -> None:
    def edit(t: dict) -> None:
        t["model.layers.0.mlp.up_proj.weight"] = torch.zeros(127, 64)

    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.up_proj\.weight.*\(127, 64\)"):
        load_tiny(rewrite_checkpoint(tiny_path, tmp_path / "m", edit))
        pytest.fail(tr("A wrong shape must be reported with the tensor name and both shapes"))


def test_unexpected_tensor_and_missing_file(tiny_path: str, tmp_path: Path) -> None:
    def edit(t: dict) -> None:
        t["model.layers.0.self_attn.extra.weight"] = torch.zeros(3)

    with pytest.raises(ValueError, match="extra"):
        load_tiny(rewrite_checkpoint(tiny_path, tmp_path / "m", edit))
        pytest.fail(tr("A tensor that has no place in the model must be an error (usually the architecture or the config is wrong)"))
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(Path(tiny_path) / "config.json", empty / "config.json")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_tiny(empty)


def test_tolerated_extras_load_cleanly(tiny_path: str, tmp_path: Path) -> None:
    """共享权重的检查点多存一份 ``lm_head.weight``、旧版 Llama 检查点存着 RoPE 的 ``inv_freq``：这两种都该跳过，不报错。"""

    def edit(t: dict) -> None:
        t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(16)

    extra = load_tiny(rewrite_checkpoint(tiny_path, tmp_path / "m", edit)).state_dict()
    plain = load_tiny(tiny_path).state_dict()
    assert extra.keys() == plain.keys() and all(torch.equal(extra[k], plain[k]) for k in plain), tr("After skipping the extra tensors the weights must be identical")


def test_dummy_weights(tiny_path: str, tmp_path: Path, hand) -> None:  # noqa: ANN001
    only_config = tmp_path / "cfg"
    only_config.mkdir()
    shutil.copy(Path(tiny_path) / "config.json", only_config / "config.json")
    model = create_model(ModelConfig.from_hf(only_config), torch.float32, "cpu")
    load_dummy_weights(model, seed=1)
    assert torch.all(model.model.norm.weight == 1), tr("Dummy weights: RMSNorm weights must be 1 (as a fresh model), got values in [{lo}, {hi}]", lo=model.model.norm.weight.min().item(), hi=model.model.norm.weight.max().item())
    engine = Engine(EngineConfig(str(only_config), dtype=torch.float32, device="auto", use_dummy_weight=True, num_page_override=64, max_seq_len_override=32))
    hand.assign_pages(engine, 0)
    req = Req(torch.tensor([1, 2, 3], dtype=torch.int32), 0, 0, 2, 0, SamplingParams())
    tokens = hand.run_to_completion(engine, Batch, [req])
    expect(len(tokens[0]), 2, tr("Dummy weights: the engine still generates output_len=2 tokens"))
    engine.shutdown()


# ----------------------------------------------------------------------------- 与 transformers 比 logits


def engine_logits(engine: Engine, hand, reqs: list[Req], phase: str) -> torch.Tensor:  # noqa: ANN001
    """前向一次取 logits（不采样），然后像引擎那样推进请求。"""
    batch = Batch(reqs, phase)
    hand.fill_batch(engine, batch)
    with torch.inference_mode(), engine.ctx.forward_batch(batch):
        logits = engine.model.forward()
    for req in reqs:
        req.complete_one()
    return logits.float().cpu()


@torch.inference_mode()
def hf_last_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    return hf(torch.tensor([ids], device=hf.device)).logits[0, -1].float().cpu()


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    tol = 1e-4 * max(1.0, ref.abs().max().item())
    err = (ours - ref).abs().max().item()
    assert err <= tol, tr("{what}: the logits differ from transformers by {err:.2e}, more than the tolerance {tol:.2e}", what=what, err=err, tol=tol)


def compare_with_hf(path: str, hand, prompts: list[list[int]], split: int | None, page_size: int = 1) -> None:  # noqa: ANN001
    """批量预填充（可选：先算前 split 个 token，再带缓存前缀续算其余）→ 接一个固定 token 解码，每一步都比 logits。"""
    hf = hand.load_hf(path)
    engine = Engine(EngineConfig(path, dtype=torch.float32, device=check_device(), max_running_req=len(prompts),
                                 num_page_override=256 // page_size, max_seq_len_override=64, page_size=page_size,
                                 attention_backend="sdpa"))  # fmt: skip
    reqs = []
    for row, prompt in enumerate(prompts):
        hand.assign_pages(engine, row)
        ids = torch.tensor(prompt, dtype=torch.int32)
        reqs.append(Req(ids, row, 0, 4, row, SamplingParams()))
    if split is not None:  # 先只把前 split 个 token 当成“提示词”算进缓存
        for req in reqs:
            req.device_len = split
        engine_logits(engine, hand, reqs, "prefill")
        for req in reqs:  # 续算其余的提示词：cached_len = split > 0，extend_len > 1
            req.device_len = len(req.input_ids)
            expect(req.cached_len, split, tr("After the first prefill of {split} tokens: cached_len", split=split))
    logits = engine_logits(engine, hand, reqs, "prefill")
    for b, prompt in enumerate(prompts):
        assert_logits_close(logits[b], hf_last_logits(hf, prompt), tr("prefill continued after a cached prefix") if split else tr("prefill step"))
    next_tokens = [1234 + 7 * b for b in range(len(prompts))]  # 固定的下一个 token，两边喂同样的输入
    for req, t in zip(reqs, next_tokens):
        req.append_host(torch.tensor([t], dtype=torch.int32))
    for _ in range(2):
        logits = engine_logits(engine, hand, reqs, "decode")
        for b, req in enumerate(reqs):
            assert_logits_close(logits[b], hf_last_logits(hf, req.input_ids.tolist()), tr("decode step"))
            req.append_host(torch.tensor([99 + b], dtype=torch.int32))
    engine.shutdown()


TINY_PROMPTS = [[151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30], [9707, 11, 1879], [785, 3974, 13876, 38835, 34208, 916]]


@pytest.mark.parametrize("page_size", [1, 4])
def test_tiny_qwen3_logits_match_hf(tiny_path: str, hand, page_size: int) -> None:  # noqa: ANN001
    compare_with_hf(tiny_path, hand, TINY_PROMPTS, split=None, page_size=page_size)


def test_tiny_qwen3_cached_prefix_logits_match_hf(tiny_path: str, hand) -> None:  # noqa: ANN001
    compare_with_hf(tiny_path, hand, TINY_PROMPTS, split=2, page_size=4)


def test_smollm2_llama_logits_match_hf(smollm2_path: str, hand) -> None:  # noqa: ANN001
    compare_with_hf(smollm2_path, hand, [[504, 3575, 282, 4649, 314], [19556]], split=None)


def test_qwen3_06b_logits_match_hf(qwen06b_path: str, hand) -> None:  # noqa: ANN001
    """0.6B 形状：一个短提示词的预填充和解码。"""
    compare_with_hf(qwen06b_path, hand, [[151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30]], split=None)


def test_model_config_rope_theta_and_activation(tiny_path: str) -> None:
    """rope_theta 两处都可能出现：新版 transformers 只写在 rope_parameters 里，老的 config.json 只写在顶层。
    仓库里的模型两处都有，所以这里各造一份只有一处的配置。"""
    hf = json.loads((Path(tiny_path) / "config.json").read_text())
    base = {k: v for k, v in hf.items() if k not in ("rope_theta", "rope_parameters", "rope_scaling")}
    cfg = ModelConfig.from_dict({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})
    assert cfg.rope_theta == 500000.0, tr("With rope_theta=500000 given only in rope_parameters, it must be read, got {rope_theta}", rope_theta=cfg.rope_theta)
    cfg = ModelConfig.from_dict({**base, "rope_theta": 250000.0})
    assert cfg.rope_theta == 250000.0, tr("With rope_theta=250000 given only at the top level, it must be read, got {rope_theta}", rope_theta=cfg.rope_theta)
    with pytest.raises(NotImplementedError):
        ModelConfig.from_dict({**base, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}})
        pytest.fail(tr("A rope_type in rope_parameters other than default (e.g. yarn) must also raise NotImplementedError"))
    with pytest.raises(NotImplementedError):
        ModelConfig.from_dict({**hf, "hidden_act": "gelu"})
        pytest.fail(tr("The MLP only implements silu: any other hidden_act must raise NotImplementedError"))
