"""第 4.4 章示例：tiny Qwen3-MoE 的哪些层有专家；6 个隐藏状态各选了哪两个专家、权重多少；把 (token, 选择) 对按专家
排好序的样子；参考实现与分组实现的差；贪心生成的 token 与 Hugging Face 比较；每个专家收到了多少 token；存了多少参数、
每个 token 用到多少。

    python examples/chapters/moe.py

en: Chapter 4.4 example: which layers of the tiny Qwen3-MoE have experts; which two experts each of 6 hidden states
chose, with which weights; the (token, choice) pairs sorted by expert; the difference between the reference and the
grouped path; the greedy tokens against Hugging Face's; how many tokens each expert received; how many parameters are
stored and how many one token uses.

    python examples/chapters/moe.py
"""

from __future__ import annotations

import torch

from minisgl import model_zoo

MODEL = str(model_zoo.tiny_qwen3_moe())
PROMPTS = [[9707, 11, 1879, 0], [785, 3974, 13876, 38835, 34208, 916]]
NEW_TOKENS = 8


def hf_greedy(prompts: list[list[int]]) -> list[list[int]]:
    """Hugging Face 对每个提示词贪心生成 ``NEW_TOKENS`` 个 token（不在 EOS 停）。

    en: Hugging Face's greedy ``NEW_TOKENS`` tokens for each prompt (not stopping at EOS).
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 eos_token_id=None)  # fmt: skip
            out.append(gen[0, len(p):].tolist())
    return out


def main() -> None:
    from minisgl.core import SamplingParams
    from minisgl.i18n import tr
    from minisgl.llm import LLM
    from minisgl.moe import experts_reference, fused_experts, select_experts

    llm = LLM(MODEL, dtype=torch.float32, device="cpu", max_running_req=2, num_page_override=256,
              max_seq_len_override=64)  # fmt: skip
    c, layers = llm.engine.model_config, llm.engine.model.model.layers
    kinds = [tr("layer {i}: experts", i=i) if c.is_sparse(i) else tr("layer {i}: dense", i=i) for i in range(c.num_layers)]
    print(tr("{n} layers: {kinds}", n=c.num_layers, kinds=tr("; ").join(kinds)))
    print(tr("each MoE layer: {e} experts, {k} chosen per token, weights renormalised: {norm}", e=c.num_experts,
             k=c.num_experts_per_tok, norm=c.norm_topk_prob))

    block = layers[1].mlp
    x = torch.randn(6, c.hidden_size, generator=torch.Generator().manual_seed(0))
    weights, ids = select_experts(block.gate.forward(x), c.num_experts_per_tok, c.norm_topk_prob)
    print(tr("routing of 6 hidden states in layer 1:"))
    for t in range(6):
        print(tr("  token {t}: experts {ids}, weights {w}", t=t, ids=ids[t].tolist(),
                 w=[round(v, 3) for v in weights[t].tolist()]))
    order = torch.argsort(ids.reshape(-1), stable=True)
    pairs = [(int(i) // c.num_experts_per_tok, int(ids.reshape(-1)[i])) for i in order]
    print(tr("(token, expert) pairs sorted by expert: {pairs}", pairs=pairs))
    counts = torch.bincount(ids.reshape(-1), minlength=c.num_experts).tolist()
    ref = experts_reference(x, block.experts.w13, block.experts.w2, weights, ids)
    grouped = fused_experts(x, block.experts.w13, block.experts.w2, weights, ids, counts)
    print(tr("rows per expert {counts}; reference vs grouped, largest difference: {diff:.1e}", counts=counts,
             diff=float((ref - grouped).abs().max())))

    for e in (layer.mlp.experts for layer in layers if hasattr(layer.mlp, "experts")):
        e.tokens_per_expert = [0] * c.num_experts
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True))
    ours = [o["token_ids"] for o in outs]
    print(tr("greedy tokens: {tokens}", tokens=ours))
    print(tr("Hugging Face:  {tokens} (the same: {same})", tokens=(ref_tokens := hf_greedy(PROMPTS)),
             same=ours == ref_tokens))
    for i, layer in enumerate(layers):
        if hasattr(layer.mlp, "experts"):
            seen = layer.mlp.experts.tokens_per_expert
            print(tr("layer {i}, tokens per expert: {seen} (sum {total} = tokens x {k})", i=i, seen=seen, total=sum(seen),
                     k=c.num_experts_per_tok))
            print("  " + " ".join(f"{e}:{'#' * n}" for e, n in enumerate(seen)))
    llm.shutdown()

    sparse = sum(c.is_sparse(i) for i in range(c.num_layers))
    per_expert = 3 * c.hidden_size * c.moe_intermediate_size
    print(tr("expert parameters stored: {stored:,}; used by one token: {used:,} ({k} of {e} per layer)",
             stored=sparse * c.num_experts * per_expert, used=sparse * c.num_experts_per_tok * per_expert,
             k=c.num_experts_per_tok, e=c.num_experts))


if __name__ == "__main__":
    main()
