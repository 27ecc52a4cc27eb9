"""HF 参考输出的磁盘缓存：第一次真算、之后读盘；模型、提示词、长度一变就重算；手改过的文件不被采信。"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from checks import hf_reference
from minisgl import model_zoo

PROMPTS = [[9707, 11, 1879], [785, 3974, 13876]]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MINISGL_HF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def count_hf_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    loads: list[str] = []
    real = hf_reference.load_hf

    def counting(path):  # noqa: ANN001, ANN202
        loads.append(str(path))
        return real(path)

    monkeypatch.setattr(hf_reference, "load_hf", counting)
    return loads


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.glob("*.json") if p.name != "fingerprints.json")


def test_cold_then_warm_equals_transformers(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = model_zoo.tiny_qwen3()
    loads = count_hf_loads(monkeypatch)
    cold = hf_reference.greedy_reference(path, PROMPTS, 5)
    model = hf_reference.load_hf(path)
    assert cold == [hf_reference.hf_greedy(model, p, 5) for p in PROMPTS]
    assert len(loads) == 2 and len(entries(cache)) == 1
    loads.clear()
    assert hf_reference.greedy_reference(path, PROMPTS, 5) == cold
    assert loads == [], "第二次应当直接读缓存"
    hf_reference.greedy_reference(path, PROMPTS, 6)
    hf_reference.greedy_reference(path, PROMPTS[:1], 5)
    assert len(loads) == 2 and len(entries(cache)) == 3, "长度或提示词变了要重新计算"


def test_edited_file_is_recomputed(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = model_zoo.tiny_qwen3()
    truth = hf_reference.greedy_reference(path, PROMPTS, 4)
    [entry] = entries(cache)
    record = json.loads(entry.read_text(encoding="utf-8"))
    record["tokens"][0][0] += 1
    entry.write_text(json.dumps(record), encoding="utf-8")
    loads = count_hf_loads(monkeypatch)
    assert hf_reference.greedy_reference(path, PROMPTS, 4) == truth
    assert len(loads) == 1, "手改过的缓存不能被采信"


def test_rebuilt_model_changes_the_key(cache: Path, tmp_path: Path) -> None:
    src = model_zoo.tiny_qwen3()
    copy = tmp_path / "model"
    shutil.copytree(src, copy)
    before = hf_reference.model_fingerprint(copy)
    assert hf_reference.model_fingerprint(copy) == before
    config = json.loads((copy / "config.json").read_text())
    config["rms_norm_eps"] = config["rms_norm_eps"] * 2
    (copy / "config.json").write_text(json.dumps(config))
    assert hf_reference.model_fingerprint(copy) != before
