"""``make setup`` 离线构建的模型是否可用：SmolLM2 说真话，0.6B 随机模型形状与官方一致，tiny 模型能跑。

模型没建好时这些检查会失败（而不是跳过），并提示先运行 ``make setup``。
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from minisgl import model_zoo
from minisgl.paths import REPO_ROOT

QWEN3_06B_SPEC = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "hidden_act": "silu",
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "float32",
}
QWEN3_06B_PARAMS = 596_049_920


def built(getter) -> Path:
    """The model's folder, or a plain failure saying to run `make setup` (never a skip)."""
    try:
        return getter()
    except FileNotFoundError as e:
        message = str(e)
    pytest.fail(message, pytrace=False)  # outside `except`: no chained traceback in the report


# ---------------------------------------------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smollm2():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = built(model_zoo.smollm2)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(path))


def test_smollm2_config(smollm2) -> None:
    from transformers import LlamaForCausalLM

    model, tok = smollm2
    c = model.config
    assert isinstance(model, LlamaForCausalLM), f"SmolLM2 应加载为 LlamaForCausalLM，实际 {type(model).__name__}"
    got = (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.tie_word_embeddings)
    assert got == (30, 576, 9, 3, True), f"SmolLM2 配置应为 30 层/576/9 头/3 KV 头/共享词嵌入，实际 {got}"
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "lm_head 应与词嵌入共享"
    assert tok.eos_token == "<|im_end|>" and tok.chat_template, "SmolLM2 分词器应以 <|im_end|> 为 eos 并带对话模板"


def test_smollm2_says_paris(smollm2) -> None:
    import torch

    model, tok = smollm2
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    text = tok.decode(out[0, ids.shape[1] :])
    assert text.startswith(" Paris."), f"SmolLM2 贪心续写“The capital of France is”应以 ' Paris.' 开头，实际 {text!r}"


# ----------------------------------------------------------------------------------------- Qwen3-0.6B random


def test_qwen3_06b_config() -> None:
    path = built(model_zoo.qwen3_06b_random)
    cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    wrong = {k: (cfg.get(k), v) for k, v in QWEN3_06B_SPEC.items() if cfg.get(k) != v}
    assert not wrong, f"0.6B 随机模型的配置与官方 Qwen3-0.6B 不一致（实际, 应为）：{wrong}"
    assert "随机" in (path / "README.txt").read_text(encoding="utf-8"), "README.txt 应说明权重是随机的"
    tok_dir = built(model_zoo.tokenizer_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (path / name).read_bytes() == (tok_dir / name).read_bytes(), f"{name} 应与 qwen3-tokenizer 里的完全相同"


def test_qwen3_06b_param_count() -> None:
    """Counted from the safetensors header only: no need to read 2.4 GB of weights."""
    from safetensors import safe_open

    path = built(model_zoo.qwen3_06b_random)
    total = 0
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            if name == "lm_head.weight":  # tied: the embedding is counted once
                continue
            sl = f.get_slice(name)
            assert sl.get_dtype() == "F32", f"{name} 应为 float32，实际 {sl.get_dtype()}"
            n = 1
            for d in sl.get_shape():
                n *= d
            total += n
    assert total == QWEN3_06B_PARAMS, f"参数量应为 {QWEN3_06B_PARAMS:,}（与官方 Qwen3-0.6B 相同），实际 {total:,}"


# ------------------------------------------------------------------------------------------------ tiny Qwen3


@pytest.fixture(scope="module")
def tiny():
    from transformers import Qwen3ForCausalLM

    path = built(model_zoo.tiny_qwen3)
    model, info = Qwen3ForCausalLM.from_pretrained(str(path), output_loading_info=True)
    return model.eval(), info


def test_tiny_qwen3_loads(tiny) -> None:
    import torch

    model, info = tiny
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not bad, f"tiny 模型加载时权重对不上：{bad}"
    c = model.config
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.tie_word_embeddings) == (151936, 64, 2, True), (
        "tiny 模型的配置不对"
    )
    with torch.no_grad():
        logits = model(torch.tensor([[785, 6722, 315, 9625, 374]])).logits
    assert logits.shape == (1, 5, 151936), f"logits 形状应为 (1, 5, 151936)，实际 {tuple(logits.shape)}"
    assert torch.isfinite(logits).all(), "tiny 模型的 logits 含 inf/nan"
    assert logits.std(-1).min() > 0.3, "tiny 模型的 logits 太平：初始化 std 应足够大，测试才能按容差比较"


# -------------------------------------------------------------------------------------------------- model_zoo


def fake_model(root: Path, name: str, files: tuple[str, ...] = (".complete",)) -> Path:
    path = root / name
    path.mkdir(parents=True)
    for f in files:
        (path / f).write_text("{}\n" if f.endswith(".json") else "x\n")
    return path


def test_default_model_prefers_real(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MINISGL_MODELS_DIR", str(tmp_path))
    random_dir = fake_model(tmp_path, "qwen3-0.6b-random")
    assert model_zoo.default_model() == random_dir, "没有真模型时应使用随机权重的 0.6B 模型"
    out = capsys.readouterr().out
    assert "随机" in out and "没有意义" in out, f"使用随机模型时应说明输出没有意义，实际输出：{out!r}"

    real_dir = fake_model(tmp_path, "Qwen3-0.6B", ("config.json", "model.safetensors"))
    assert model_zoo.default_model() == real_dir, "有真正的 Qwen3-0.6B 时应优先使用它"
    assert "真正的" in capsys.readouterr().out
    assert model_zoo.real_qwen3() == real_dir
    assert model_zoo.default_model(verbose=False) == real_dir and capsys.readouterr().out == ""


def test_missing_model_says_make_setup(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MINISGL_MODELS_DIR", str(tmp_path))
    fake_model(tmp_path, "qwen3-tiny-random", files=())  # a half-built folder has no stamp
    for getter in (model_zoo.tokenizer_dir, model_zoo.tiny_qwen3, model_zoo.smollm2, model_zoo.qwen3_06b_random,
                   model_zoo.real_qwen3, model_zoo.default_model):  # fmt: skip
        with pytest.raises(FileNotFoundError, match="make setup"):
            getter()
    assert model_zoo.MODELS_DIR == tmp_path, "MODELS_DIR 应跟随 MINISGL_MODELS_DIR"


def test_model_zoo_does_not_import_torch() -> None:
    # Only model_zoo's own imports are judged: the package __init__ may legitimately change.
    code = (
        "import sys, minisgl; t = 'torch' in sys.modules; "
        "import minisgl.model_zoo; assert t or 'torch' not in sys.modules"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"导入 minisgl.model_zoo 不应加载 torch：{proc.stderr[-500:]}"
