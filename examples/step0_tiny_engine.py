"""第 0 步：一个文件、四个函数的最小推理引擎。不依赖本课程的任何代码，只用 torch、safetensors 和分词器。

权重是一个 {名字: 张量} 字典；每层的 K/V 用 torch.cat 越拼越长；注意力是 einsum 加一个显式的因果掩码；
下一个 token 取 argmax。支持 Qwen3（有 q/k norm）和 Llama（如 SmolLM2）两种结构。

    python examples/step0_tiny_engine.py                                   # 默认模型（Qwen3-0.6B 或同形状的随机权重）
    python examples/step0_tiny_engine.py --model models/SmolLM2-135M-Instruct

en: Step 0: the smallest inference engine, one file and four functions. It uses none of this course's code, only torch,
safetensors and the tokenizer.

The weights are a {name: tensor} dict; each layer's K/V grow with torch.cat; attention is an einsum with an explicit
causal mask; the next token is the argmax. Supports the Qwen3 (with q/k norm) and Llama (such as SmolLM2) structures.

    python examples/step0_tiny_engine.py                                   # default model (Qwen3-0.6B or random weights of the same shape)
    python examples/step0_tiny_engine.py --model models/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoTokenizer

# 输出的文字随 MINISGL_LANG 切换中英文；把这个文件单独拷走时没有课程的包，就只说英文
# en: printed text follows MINISGL_LANG (Chinese or English); copied away on its own, without the course's package, this
# en: file speaks English only
try:
    from minisgl.i18n import tr
except ImportError:

    def tr(msgid: str, /, **values: object) -> str:
        return msgid.format(**values) if values else msgid


MODELS = Path(__file__).resolve().parents[1] / "models"


def load(model_dir: str | Path) -> tuple[dict, dict[str, torch.Tensor], AutoTokenizer]:
    """读 config.json、全部权重（一个字典）和分词器。

    en: Read config.json, all the weights (one dict) and the tokenizer.
    """
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    weights = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            weights.update({name: f.get_tensor(name).float() for name in f.keys()})
    return cfg, weights, AutoTokenizer.from_pretrained(model_dir)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def forward(cfg: dict, w: dict[str, torch.Tensor], ids: torch.Tensor, kv: list) -> torch.Tensor:
    """把新 token ``ids`` 接在缓存 ``kv`` 之后算一遍，返回最后一个位置的 logits；``kv`` 原地变长。

    en: Compute the new tokens ``ids`` after the cache ``kv`` and return the logits of the last position; ``kv`` grows
    in place.
    """
    n_heads, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
    eps = cfg["rms_norm_eps"]
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta", 10000.0)
    # 已缓存的 token 数 = 新 token 的起始位置
    # en: tokens already cached = position of the first new token
    start = kv[0][0].shape[0] if kv else 0
    pos = torch.arange(start, start + len(ids)).float()
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.cat([torch.outer(pos, inv_freq)] * 2, dim=-1)[:, None, :]  # [T, 1, D]
    cos, sin = angles.cos(), angles.sin()

    # 旋转位置编码：前后两半组成二维点，按位置转角度
    # en: rotary position embedding: the two halves form points in the plane, rotated by an angle that depends on the
    # en: position
    def rope(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    h = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(len(ids), n_heads, head_dim)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(len(ids), n_kv, head_dim)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(len(ids), n_kv, head_dim)
        # Qwen3：对每个头的 q、k 再做一次 RMSNorm
        # en: Qwen3: one more RMSNorm on each head's q and k
        if p + "self_attn.q_norm.weight" in w:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q), rope(k)
        if len(kv) <= i:
            kv.append((k, v))
        else:
            # KV 缓存：越拼越长
            # en: KV cache: grows by concatenation
            kv[i] = (torch.cat([kv[i][0], k]), torch.cat([kv[i][1], v]))
        # GQA：几个 query 头共用一个 KV 头
        # en: GQA: several query heads share one KV head
        keys = kv[i][0].repeat_interleave(n_heads // n_kv, dim=1)
        values = kv[i][1].repeat_interleave(n_heads // n_kv, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, keys) / head_dim**0.5
        # 因果：只看自己及之前
        # en: causal: only itself and earlier positions
        mask = torch.arange(len(keys))[None, :] <= (start + torch.arange(len(ids)))[:, None]
        attn = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        o = torch.einsum("hqk,khd->qhd", attn, values).reshape(len(ids), -1)
        h = h + o @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    h = rms_norm(h[-1], w["model.norm.weight"], eps)
    # 共享权重时 lm_head 就是嵌入矩阵
    # en: with tied weights, lm_head is the embedding matrix
    return h @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


@torch.inference_mode()
def generate(cfg: dict, w: dict[str, torch.Tensor], prompt_ids: list[int], max_tokens: int) -> list[int]:
    """贪心生成：先把整段提示词算一遍（预填充），之后每步只算一个新 token（解码）。

    en: Greedy generation: compute the whole prompt once (prefill), then one new token per step (decode).
    """
    kv: list = []
    out: list[int] = []
    ids = torch.tensor(prompt_ids)
    for _ in range(max_tokens):
        next_id = int(forward(cfg, w, ids, kv).argmax())
        out.append(next_id)
        ids = torch.tensor([next_id])
    return out


def default_model() -> Path:
    real = MODELS / "Qwen3-0.6B"
    return real if (real / "config.json").is_file() else MODELS / "qwen3-0.6b-random"


def main() -> None:
    parser = argparse.ArgumentParser(description=tr("Step 0: a minimal inference engine"))
    parser.add_argument("--model", default=None, help=tr("model directory (default: Qwen3-0.6B, or the random-weight model of the same shape if that is missing)"))
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    model_dir = Path(args.model) if args.model else default_model()
    if not (model_dir / "config.json").is_file():
        raise SystemExit(tr("Model {model_dir} not found: run make setup first", model_dir=model_dir))
    cfg, w, tok = load(model_dir)
    prompt_ids = tok(args.prompt)["input_ids"]
    # 预热：第一次调用要分配内存、准备计算，不算进速度
    # en: warm-up: the first call allocates memory and prepares the computation, so it is left out of the speed
    generate(cfg, w, prompt_ids, 2)
    start = time.perf_counter()
    out = generate(cfg, w, prompt_ids, args.max_tokens)
    elapsed = time.perf_counter() - start
    print(tr("Model: {name}", name=model_dir.name))
    if "random" in model_dir.name:
        print(tr("Note: this is a random-weight model, so the generated text is meaningless (token counts and compute are the same as the real model)."))
    print(tr("Prompt: {prompt!r} ({n_prompt_ids} tokens)", prompt=args.prompt, n_prompt_ids=len(prompt_ids)))
    print(tr("Generated: {text!r}", text=tok.decode(out)))
    print(tr("1 request × {n_out} tokens: {elapsed:.2f} s, {tps:.1f} token/s",
             n_out=len(out), elapsed=elapsed, tps=len(out) / elapsed))


if __name__ == "__main__":
    main()
