"""第 4.2 章 tensor_parallel 的检查：先在本进程里看哪些 ``tp`` 切得开（切不开时在加载之前报错，并说出行得通的大小）；
再起两个真的秩（gloo，整个模块一次）：每种切开的层都等于没切的那层（KV 头切开和复制的 q/k/v、
按行切的层只加一次偏置、词表切开的嵌入），整个模型在 TP=2 上贪心生成的 token 与 Hugging Face 逐个相同，每步正好
``2 × 层数 + 1`` 次 all_reduce 和 1 次 all_gather，每个秩只存大约一半的权重，各秩看到的内存不同时 KV 页数取最小值；
最后 SmolLM2（9 个头）在 TP=3 上也与 Hugging Face 相同。

en: Checks of chapter 4.2 tensor_parallel: first, in this process, which ``tp`` split (refused before loading when one
does not, naming the sizes that work); then two real ranks (gloo, once for the module): every split layer equals the
unsplit one (q/k/v with KV heads split and copied, the row-parallel layer adding its
bias once, the vocabulary-split embedding), the whole model at TP=2 generates greedily exactly Hugging Face's tokens,
each step makes exactly ``2 × layers + 1`` all_reduce and 1 all_gather, each rank stores about half of the weights,
ranks that see different memory take the smallest KV page count; last, SmolLM2 (9 heads) at TP=3 matches Hugging Face
too.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from checks.common import expect
from checks.hf_reference import greedy_reference
from checks.stage1.conftest import LATER_PROMPTS, LATER_TOKENS, SMOLLM2_PROMPTS, Hand, assert_close_zh
from checks.stage4.common import run_step, step
from minisgl.i18n import tr

WORLD = 2
#: 切开的矩阵乘法换了求和顺序，最后几位可以不同
#: en: a split matrix multiplication sums in another order, so the last bits may differ
TOL = {"atol": 1e-5, "rtol": 1e-5}
#: 小层的尺寸：输入 8，两段输出 6 和 4，词表 10。
#: en: Sizes of the small layers: input 8, two output parts of 6 and 4, a vocabulary of 10.
IN, OUT_A, OUT_B, VOCAB = 8, 6, 4, 10
IDS = [0, 4, 5, 9, 7, 2]


def full(seed: int, *shape: int) -> torch.Tensor:
    """没切的权重：每个秩和父进程用同一个种子，拿到同一份。

    en: An unsplit weight: every rank and the parent use the same seed and get the same one.
    """
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def small_config(num_kv_heads: int) -> Any:
    """一个很小的 Qwen3 形状：4 个头、每头 2 维、隐藏维 8。

    en: A very small Qwen3 shape: 4 heads of 2 dimensions, hidden size 8.
    """
    from minisgl.models import ModelConfig

    return ModelConfig("Qwen3ForCausalLM", VOCAB, IN, 12, 1, 4, num_kv_heads, 2, 1e-6, 10000.0, 64, True, True,
                       attention_bias=True)


def layer_steps(rank: int, out: dict[str, Any], world: int = WORLD) -> None:
    from minisgl.tensor_parallel import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear, VocabParallelEmbedding

    kw = {"dtype": torch.float32, "device": "cpu"}
    x = full(1, 5, IN)

    def column() -> list[Any]:
        layer = ColumnParallelLinear(IN, [OUT_A, OUT_B], bias=True, shard_names=["a", "b"], **kw)
        for shard, (rows, seed) in enumerate(((OUT_A, 10), (OUT_B, 20))):
            layer.load_weight("weight", full(seed, rows, IN), shard)
            layer.load_weight("bias", full(seed + 1, rows), shard)
        return layer.forward(x).tolist()

    def qkv(num_kv_heads: int) -> list[Any]:
        config = small_config(num_kv_heads)
        layer = QKVParallelLinear(config, **kw)
        for shard, rows in enumerate((8, 2 * num_kv_heads, 2 * num_kv_heads)):
            layer.load_weight("weight", full(30 + shard, rows, IN), shard)
            layer.load_weight("bias", full(40 + shard, rows), shard)
        return layer.forward(x).tolist()

    def row() -> list[Any]:
        layer = RowParallelLinear(IN, OUT_A, bias=True, **kw)
        layer.load_weight("weight", full(50, OUT_A, IN))
        layer.load_weight("bias", full(51, OUT_A))
        part = IN // world
        return layer.forward(x[:, rank * part:(rank + 1) * part]).tolist()

    def embedding() -> list[Any]:
        layer = VocabParallelEmbedding(VOCAB, 3, **kw)
        layer.load_weight("weight", full(60, VOCAB, 3))
        return layer.forward(torch.tensor(IDS)).tolist()

    run_step(out, "column", column)
    run_step(out, "qkv_split", lambda: qkv(2))
    run_step(out, "qkv_split_more", lambda: qkv(4))
    run_step(out, "qkv_copied", lambda: qkv(1))
    run_step(out, "row", row)
    run_step(out, "embedding", embedding)


def engine_steps(model_path: str, prompts: list[list[int]], out: dict[str, Any]) -> None:
    from minisgl.core import Batch, Req, SamplingParams
    from minisgl.distributed import get_tp_comm
    from minisgl.engine import EngineConfig, model_nbytes, packed_nbytes
    from minisgl.tensor_parallel import TPEngine

    def generate() -> dict[str, Any]:
        get_tp_comm().calls.clear()
        # 这些检查在 CPU 上用 gloo 跑（每个秩一个 CUDA 设备、NCCL 的情形交给 GPU 检查）
        # en: these checks run on the CPU with gloo (one CUDA device per rank with NCCL is for the GPU checks)
        engine = TPEngine(EngineConfig(model_path, dtype=torch.float32, device="cpu", max_running_req=len(prompts),
                                       num_page_override=512, max_seq_len_override=64))
        try:
            reqs = []
            for uid, (row, prompt) in enumerate(zip([3, 0, 2, 1], prompts)):
                Hand.assign_pages(engine, row)
                reqs.append(Req(torch.tensor(prompt, dtype=torch.int32), row, 0, LATER_TOKENS, uid, SamplingParams()))
            tokens = Hand.run_to_completion(engine, Batch, reqs)
            layer = engine.model.model.layers[0]
            return {"tokens": tokens, "calls": dict(get_tp_comm().calls), "stored": model_nbytes(engine.model),
                    "packed": packed_nbytes(engine.model), "layers": engine.model_config.num_layers,
                    "shapes": [list(op.weight.shape) for op in (layer.self_attn.qkv_proj, layer.mlp.down_proj,
                                                                engine.model.lm_head)]}
        finally:
            engine.shutdown()

    run_step(out, "generate", generate)


def refuse_steps(model_path: str, out: dict[str, Any]) -> None:
    from minisgl.engine import EngineConfig
    from minisgl.tensor_parallel import TPEngine

    def refuse() -> str:
        try:
            TPEngine(EngineConfig(model_path, dtype=torch.float32, device="cpu", num_page_override=64))
        except ValueError as e:
            return str(e)
        return ""

    run_step(out, "refuse", refuse)


def pages_steps(rank: int, tiny: str, out: dict[str, Any]) -> None:
    from minisgl.engine import Engine, EngineConfig
    from minisgl.tensor_parallel import TPEngine

    class Skewed(TPEngine):
        """秩 1 看到的空闲内存只有秩 0 的万分之一：各秩自己算出的页数不同。

        en: Rank 1 sees a ten-thousandth of rank 0's free memory: the ranks work out different page counts themselves.
        """

        def _determine_num_pages(self, free_before: int, model_bytes: int) -> int:
            seen = free_before if rank == 0 else model_bytes + (free_before - model_bytes) // 10_000
            self.own = Engine._determine_num_pages(self, seen, model_bytes)
            return super()._determine_num_pages(seen, model_bytes)

    def agree() -> dict[str, int]:
        engine = Skewed(EngineConfig(tiny, dtype=torch.float32, device="cpu", max_running_req=64, memory_ratio=1.0,
                                     max_seq_len_override=4096))
        try:
            return {"own": engine.own, "agreed": engine.num_pages}
        finally:
            engine.shutdown()

    run_step(out, "pages", agree)


def two_rank_scenario(rank: int, world_size: int, addr: str, tiny: str, smol: str) -> dict[str, Any]:
    from minisgl.distributed import DistributedInfo, destroy_distributed, init_distributed

    out: dict[str, Any] = {}
    run_step(out, "init", lambda: init_distributed(DistributedInfo(rank, world_size), addr) and None)
    if out["init"][0] == "ok":
        layer_steps(rank, out)
        engine_steps(tiny, LATER_PROMPTS, out)
        refuse_steps(smol, out)
        pages_steps(rank, tiny, out)
        destroy_distributed()
    return out


def three_rank_generate(rank: int, world_size: int, addr: str, smol: str, prompts: list[list[int]]) -> dict[str, Any]:
    from minisgl.distributed import DistributedInfo, destroy_distributed, init_distributed

    out: dict[str, Any] = {}
    run_step(out, "init", lambda: init_distributed(DistributedInfo(rank, world_size), addr) and None)
    if out["init"][0] == "ok":
        engine_steps(smol, prompts, out)
        destroy_distributed()
    return out


@pytest.fixture(scope="module")
def ranks(tiny_path: str, smollm2_path: str) -> list[dict[str, Any]]:
    """两个秩跑完全部步骤的结果（本模块只起一次）。

    en: The two ranks' results of all steps (started once for this module).
    """
    from minisgl.processes.ranks import run_ranks

    return run_ranks(two_rank_scenario, WORLD, tiny_path, smollm2_path, timeout=300)


# ----------------------------------------------------------------------------- 切得开吗 | en: can it be split


def test_which_sizes_split(tiny_path: str, smollm2_path: str) -> None:
    from minisgl.models import ModelConfig
    from minisgl.tensor_parallel import check_tp_split, split_problems

    tiny = ModelConfig.from_hf(tiny_path)
    smol = ModelConfig.from_hf(smollm2_path)
    expect([bool(split_problems(tiny, tp)) for tp in (1, 2, 3, 4, 8)], [False, False, True, False, True],
           tr("qwen3-tiny (4 heads, 2 KV heads, vocabulary 151936) splits at tp 1, 2 and 4 (KV heads copied), not 3 or 8"))
    expect([bool(split_problems(smol, tp)) for tp in (1, 2, 3, 9)], [False, True, False, True],
           tr("SmolLM2 (9 heads, 3 KV heads, intermediate 1536) splits at tp 1 and 3, not 2 or 9 (1536 is not a multiple of 9)"))
    expect(bool(split_problems(tiny, 0)), True, tr("tp 0 is refused with a sentence, not a ZeroDivisionError"))
    expect(bool(split_problems(dataclasses.replace(tiny, intermediate_size=130), 4)), True,
           tr("An intermediate size of 130 does not split over 4 ranks"))
    expect(bool(split_problems(dataclasses.replace(tiny, vocab_size=151937), 2)), True,
           tr("An odd vocabulary does not split over 2 ranks"))
    expect(bool(split_problems(dataclasses.replace(tiny, num_kv_heads=3, num_qo_heads=6), 2)), True,
           tr("3 KV heads neither split over 2 ranks nor divide 2"))
    with pytest.raises(ValueError) as err:
        check_tp_split(smol, 2)
    expect("1, 3" in str(err.value) and "9" in str(err.value), True,
           tr("The refusal names the 9 heads and the sizes that work (1, 3), got: {message}", message=err.value))


class _Allocations(TorchDispatchMode):
    """记下每一次新分配的张量（工厂函数），不算视图和计算的结果。

    en: Records every newly allocated tensor (factory functions), not views or the results of computations.
    """

    FACTORIES = {"empty", "empty_strided", "zeros", "ones", "full", "rand", "randn", "empty_like", "zeros_like"}

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in self.FACTORIES and isinstance(out, torch.Tensor) and out.numel() > 0:
            self.shapes.append(tuple(out.shape))
        return out


def test_the_refusal_comes_before_any_weight_is_allocated(smollm2_path: str) -> None:
    """SmolLM2 在 2 个秩上切不开：create_tp_model 要在分配任何权重之前就抛 ValueError（本进程假装是 2 个秩里的秩 0，
    报错之前不通信）。

    en: SmolLM2 does not split over 2 ranks: create_tp_model must raise ValueError before allocating any weight (this
    process pretends to be rank 0 of 2; nothing is communicated before the refusal).
    """
    from minisgl.distributed import Communicator, DistributedInfo, get_tp_comm, set_tp_comm
    from minisgl.models import ModelConfig
    from minisgl.tensor_parallel import create_tp_model

    config = ModelConfig.from_hf(smollm2_path)
    before = get_tp_comm()
    set_tp_comm(Communicator(DistributedInfo(0, 2)))
    try:
        with _Allocations() as allocated, pytest.raises(ValueError):
            create_tp_model(config, torch.float32, "cpu")
    finally:
        set_tp_comm(before)
    expect(allocated.shapes[:6], [], tr("SmolLM2 at tp 2: create_tp_model must refuse before allocating anything, but it "
                                    "allocated tensors of these shapes first: {shapes}", shapes=allocated.shapes[:6]))


def test_a_model_that_does_not_split_is_refused_on_every_rank(ranks: list[dict[str, Any]]) -> None:
    for rank, message in enumerate(step(ranks, "refuse")):
        expect("1, 3" in message, True,
               tr("Rank {rank}: TPEngine on SmolLM2 at tp 2 raises ValueError naming the sizes that work, got: {message!r}",
                  rank=rank, message=message))


# ----------------------------------------------------------------------------- 切开的层 | en: the split layers


@pytest.mark.parametrize(("kv", "name"), [(4, "qkv_split_more"), (2, "qkv_split"), (1, "qkv_copied")],
                         ids=["kv-split-2-each", "kv-split-1-each", "kv-copied"])
def test_qkv_splits_heads_and_copies_kv_heads_when_too_few(ranks: list[dict[str, Any]], kv: int, name: str) -> None:
    x = full(1, 5, IN)
    q, k, v = (F.linear(x, full(30 + s, rows, IN), full(40 + s, rows)) for s, rows in enumerate((8, 2 * kv, 2 * kv)))
    for rank, got in enumerate(step(ranks, name)):
        head = rank * kv // WORLD
        local = (lambda t: t.chunk(WORLD, dim=-1)[rank]) if kv >= WORLD else (lambda t: t[:, head * 2:(head + 1) * 2])
        want = torch.cat([q.chunk(WORLD, dim=-1)[rank], local(k), local(v)], dim=-1)
        assert_close_zh(torch.tensor(got), want, tr("Rank {rank}: q/k/v with {kv} KV heads over {world} ranks (query heads split, KV heads {how})",
                                                    rank=rank, kv=kv, world=WORLD, how=tr("split") if kv >= WORLD else tr("copied")), **TOL)


def test_row_parallel_sums_partials_and_adds_the_bias_once(ranks: list[dict[str, Any]]) -> None:
    want = F.linear(full(1, 5, IN), full(50, OUT_A, IN), full(51, OUT_A))
    for rank, got in enumerate(step(ranks, "row")):
        assert_close_zh(torch.tensor(got), want,
                        tr("Rank {rank}: the row-parallel layer equals the unsplit one (partial sums all-reduced, bias added once)",
                           rank=rank), **TOL)


def test_vocab_parallel_embedding_equals_the_whole_table(ranks: list[dict[str, Any]]) -> None:
    want = F.embedding(torch.tensor(IDS), full(60, VOCAB, 3))
    for rank, got in enumerate(step(ranks, "embedding")):
        got = torch.tensor(got)
        wrong = [i for i, row in zip(IDS, got) if row.shape != want[0].shape or not torch.allclose(row, want[IDS.index(i)], **TOL)]
        assert_close_zh(got, want, tr("Rank {rank}: the vocabulary-split embedding of ids {ids} equals the whole table's; the "
                                      "rows of ids {wrong} differ (after the all_reduce each id's row is the sum over the "
                                      "ranks, so a rank must add nothing for the ids it does not own)",
                                      rank=rank, ids=IDS, wrong=wrong), **TOL)  # fmt: skip


def test_with_one_rank_every_layer_is_the_plain_layer() -> None:
    """一个秩（没有 ``init_distributed``）时，切开的层就是没切的层：整份权重、整份输出，通信是空操作。

    en: With one rank (no ``init_distributed``) a split layer is the unsplit one: whole weights, whole outputs, and the
    communication does nothing.
    """
    from minisgl.distributed import get_tp_info

    expect((get_tp_info().rank, get_tp_info().size), (0, 1), tr("Setup: this process has not joined any ranks"))
    out: dict[str, Any] = {}
    layer_steps(0, out, world=1)
    got = step([out], "column")[0]
    x = full(1, 5, IN)
    whole = torch.cat([F.linear(x, full(seed, rows, IN), full(seed + 1, rows)) for rows, seed in ((OUT_A, 10), (OUT_B, 20))], dim=-1)
    assert_close_zh(torch.tensor(got), whole, tr("One rank: the merged column-parallel layer gives the whole output of every part"), **TOL)
    for kv, name in ((1, "qkv_copied"), (2, "qkv_split"), (4, "qkv_split_more")):
        q, k, v = (F.linear(x, full(30 + s, rows, IN), full(40 + s, rows)) for s, rows in enumerate((8, 2 * kv, 2 * kv)))
        assert_close_zh(torch.tensor(step([out], name)[0]), torch.cat([q, k, v], dim=-1),
                        tr("One rank: q/k/v with {kv} KV heads gives every head", kv=kv), **TOL)
    assert_close_zh(torch.tensor(step([out], "row")[0]), F.linear(x, full(50, OUT_A, IN), full(51, OUT_A)),
                    tr("One rank: the row-parallel layer is the plain linear layer, bias added once"), **TOL)
    expect(step([out], "embedding")[0], F.embedding(torch.tensor(IDS), full(60, VOCAB, 3)).tolist(),
           tr("One rank: the vocabulary-split embedding holds the whole table"))


# ----------------------------------------------------------------------------- 切开的模型 | en: the split model


def test_with_one_rank_the_split_model_is_the_plain_model(tiny_path: str) -> None:
    """一个秩时，切开的模型就是第 1.3 章的模型：同样的 token。

    en: With one rank the split model is chapter 1.3's model: the same tokens.
    """
    from minisgl.models import ModelConfig
    from minisgl.tensor_parallel import create_tp_model

    out: dict[str, Any] = {}
    engine_steps(tiny_path, LATER_PROMPTS, out)
    got = step([out], "generate")[0]
    expect(got["tokens"], greedy_reference(tiny_path, LATER_PROMPTS, LATER_TOKENS),
           tr("One rank: greedy tokens of qwen3-tiny through TPEngine equal Hugging Face's"))
    untied = dataclasses.replace(ModelConfig.from_hf(tiny_path), tie_word_embeddings=False)
    model = create_tp_model(untied, torch.float32, "meta")  # 只看形状，不分配内存 | en: shapes only, nothing allocated
    head, embed = model.lm_head.weight, model.model.embed_tokens.weight
    expect((tuple(head.shape), head is embed), ((untied.vocab_size, untied.hidden_size), False),
           tr("One rank, a model whose LM head is not tied: the LM head has its own [vocabulary, hidden] weight"))


@pytest.mark.every_path
def test_tp2_generates_hugging_faces_tokens(ranks: list[dict[str, Any]], tiny_path: str) -> None:
    reference = greedy_reference(tiny_path, LATER_PROMPTS, LATER_TOKENS)
    for rank, got in enumerate(step(ranks, "generate")):
        expect(got["tokens"], reference, tr("Rank {rank}: greedy tokens of qwen3-tiny at TP=2 equal Hugging Face's", rank=rank))


@pytest.mark.every_path
def test_each_step_communicates_twice_per_layer_plus_embedding_and_head(ranks: list[dict[str, Any]]) -> None:
    for rank, got in enumerate(step(ranks, "generate")):
        steps = LATER_TOKENS  # 一次预填充 + LATER_TOKENS - 1 次解码 | en: one prefill + LATER_TOKENS - 1 decodes
        expect(got["calls"], {"all_reduce": steps * (2 * got["layers"] + 1), "all_gather": steps, "agree_min": 1},
               tr("Rank {rank}: {steps} forward steps of {layers} layers: 2 all_reduce per layer + 1 for the embedding, "
                  "1 all_gather for the LM head, per step; and the KV page count agreed once when the engine is built",
                  rank=rank, steps=steps, layers=got["layers"]))


@pytest.mark.every_path
def test_each_rank_stores_about_half(ranks: list[dict[str, Any]], tiny_path: str) -> None:
    from safetensors import safe_open

    with safe_open(f"{tiny_path}/model.safetensors", framework="pt") as f:
        whole = 4 * sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())  # float32 | en: float32
    for rank, got in enumerate(step(ranks, "generate")):
        expect(0.4 * whole < got["stored"] < 0.55 * whole, True,
               tr("Rank {rank} stores {stored} bytes of weights of the checkpoint's {whole} in float32 (about half, never "
                  "the whole model; a fast CPU path's packed copies, {packed} bytes, are counted apart)",
                  rank=rank, stored=got["stored"], whole=whole, packed=got["packed"]))
        expect(got["shapes"][1][0], got["shapes"][0][1], tr(
            "Rank {rank}: after packing, the split weights are still there with their shapes (qkv_proj, down_proj, "
            "lm_head: {shapes})", rank=rank, shapes=got["shapes"]))


def test_smollm2_at_tp3_generates_hugging_faces_tokens(smollm2_path: str) -> None:
    from transformers import AutoTokenizer

    from minisgl.processes.ranks import run_ranks

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    prompts = [tok(p)["input_ids"] for p in SMOLLM2_PROMPTS[:4]]
    reference = greedy_reference(smollm2_path, prompts, LATER_TOKENS)
    results = run_ranks(three_rank_generate, 3, smollm2_path, prompts, timeout=300)
    for rank, got in enumerate(step(results, "generate")):
        expect(got["tokens"], reference, tr("Rank {rank}: greedy tokens of SmolLM2 at TP=3 equal Hugging Face's", rank=rank))


@pytest.mark.every_path
def test_page_count_is_agreed(ranks: list[dict[str, Any]]) -> None:
    got = step(ranks, "pages")
    own = [g["own"] for g in got]
    assert own[0] != own[1], tr("The check needs the ranks to see different memory, got {own}", own=own)
    expect([g["agreed"] for g in got], [min(own)] * WORLD, tr(
        "Ranks that work out different page counts ({own}) all take the smallest (agree_min)", own=own))
