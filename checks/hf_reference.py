"""Hugging Face 参考输出的磁盘缓存：第一次由 transformers 真算，之后直接读盘。

检查要和 Hugging Face 逐 token 对上，但每跑一次都重新加载 HF 模型、贪心生成，光这一步就要十几秒。
参考输出只取决于模型文件、提示词、生成设置和 transformers / torch 的版本，所以把它们一起做成键：
模型一重建（文件内容变了）、换了提示词或版本，键就变了，缓存自然失效，重新由 transformers 计算。
缓存文件里连同键和校验和一起存，读的时候键或校验和对不上就当作没有、重新计算——手改过的“参考答案”不会被当真。

缓存目录默认是 ``<仓库>/.cache/hf-reference``（不进 git），可用环境变量 ``MINISGL_HF_CACHE`` 换地方；
删掉这个目录就是强制重算。这里不导入任何章节模块。
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
import transformers

from minisgl.paths import REPO_ROOT

__all__ = ["cache_dir", "check_device", "model_fingerprint", "load_hf", "hf_greedy", "greedy_reference"]

#: 决定模型输出的文件（分词器不影响 token id 到 token id 的计算）。
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors")


def cache_dir() -> Path:
    env = os.environ.get("MINISGL_HF_CACHE")
    return Path(env) if env else REPO_ROOT / ".cache" / "hf-reference"


def _write_json(path: Path, data: Any) -> None:
    """先写临时文件再改名：两个进程同时写（比如并行打分）也不会读到半个文件。"""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def model_fingerprint(model_path: str | Path) -> str:
    """模型文件内容的 sha256。整份哈希 500 MB 要零点几秒，所以按（文件名、大小、修改时间）记住上次的结果。"""
    model_path = Path(model_path).resolve()
    stats = {name: [st.st_size, st.st_mtime_ns] for name in MODEL_FILES if (st := _stat(model_path / name))}
    memo_path = cache_dir() / "fingerprints.json"
    memo = _read_json(memo_path) or {}
    entry = memo.get(str(model_path))
    if entry and entry.get("stats") == stats:
        return entry["sha256"]
    digest = hashlib.sha256()
    for name in sorted(stats):
        digest.update(name.encode())
        with open(model_path / name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                digest.update(chunk)
    sha = digest.hexdigest()
    memo[str(model_path)] = {"stats": stats, "sha256": sha}
    _write_json(memo_path, memo)
    return sha


def check_device() -> str:
    """检查在哪个设备上跑（``pytest --device``，默认 cpu）：HF 参考和引擎在同一个设备上算。"""
    return os.environ.get("MINISGL_DEVICE") or "cpu"


def load_hf(model_path: str | Path) -> torch.nn.Module:
    """fp32 的 HF 模型。引擎在检查里不看 EOS，所以让 HF 的 generate 也不在 EOS 处停下。"""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    model = model.to(check_device()).eval()
    model.generation_config.eos_token_id = None
    return model


@torch.inference_mode()
def hf_greedy(model: torch.nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    """Hugging Face ``generate`` 的贪心输出（只返回新 token）。"""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False)
    return out[0, len(prompt) :].tolist()


def greedy_reference(model_path: str | Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """每个提示词单独在 HF 上（fp32）贪心生成 ``max_tokens`` 个 token；有缓存就读缓存。"""
    key = {
        "kind": "greedy-generate",
        "model_sha256": model_fingerprint(model_path),
        "prompts": [list(map(int, p)) for p in prompts],
        "max_tokens": int(max_tokens),
        "dtype": "float32",
        "device": torch.device(check_device()).type,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    path = cache_dir() / f"{name}.json"
    with _one_at_a_time(path):  # parallel check processes (pytest -n): one computes, the others then read its file
        cached = _read_json(path)
        if isinstance(cached, dict) and cached.get("key") == key and cached.get("sha256") == _digest(key, cached.get("tokens")):
            return cached["tokens"]
        model = load_hf(model_path)
        tokens = [hf_greedy(model, p, max_tokens) for p in key["prompts"]]
        record = {"key": key, "tokens": tokens, "sha256": _digest(key, tokens), "computed_by": "transformers generate (generated automatically, do not edit)"}
        _write_json(path, record)
        return tokens


@contextmanager
def _one_at_a_time(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<entry>.lock`` (where the OS has ``fcntl``; elsewhere two processes may both compute
    the same entry, which costs only time: the file is written atomically)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _digest(key: dict[str, Any], tokens: Any) -> str:
    """键和结果一起的校验和：文件被改过（哪怕只改一个 token）就对不上，当作没有缓存、重新计算。"""
    return hashlib.sha256(json.dumps([key, tokens], sort_keys=True).encode()).hexdigest()
