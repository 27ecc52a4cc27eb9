"""课程用到的本地模型在哪里。

所有模型都由 ``make setup``（即 ``python tools/build_models.py``）离线构建到 ``<仓库>/models/``；
设置环境变量 ``MINISGL_MODELS_DIR`` 可以换一个目录。每个模型目录里有 ``.complete`` 标记文件，
只有构建完整的模型才会被返回，半成品会报错而不是让后面的代码莫名其妙地失败。

本模块不在导入时加载 torch，导入它几乎不花时间。
"""

from __future__ import annotations

import os
from pathlib import Path

from minisgl.i18n import tr
from minisgl.paths import REPO_ROOT

__all__ = [
    "MODELS_DIR",
    "STAMP",
    "TOKENIZER",
    "TINY_QWEN3",
    "TINY_QWEN3_MOE",
    "SMOLLM2",
    "QWEN3_06B_RANDOM",
    "REAL_QWEN3",
    "models_dir",
    "tokenizer_dir",
    "tiny_qwen3",
    "tiny_qwen3_moe",
    "smollm2",
    "qwen3_06b_random",
    "real_qwen3",
    "has_real_qwen3",
    "default_model",
]

#: 构建完成的标记文件：构建脚本最后才写它（内容是构建步骤的版本号）。
STAMP = ".complete"

# 模型的名字就是它在模型目录下的文件夹名；tools/build_models.py 也从这里取，两边不会对不上。
TOKENIZER = "qwen3-tokenizer"
TINY_QWEN3 = "qwen3-tiny-random"
TINY_QWEN3_MOE = "qwen3-moe-tiny-random"
SMOLLM2 = "SmolLM2-135M-Instruct"
QWEN3_06B_RANDOM = "qwen3-0.6b-random"
REAL_QWEN3 = "Qwen3-0.6B"


def models_dir() -> Path:
    """当前的模型目录：每次调用都重新读环境变量，测试里用 monkeypatch 换目录也能生效。"""
    env = os.environ.get("MINISGL_MODELS_DIR")
    return Path(env) if env else REPO_ROOT / "models"


def __getattr__(name: str) -> Path:
    """``model_zoo.MODELS_DIR`` 总是当前值（环境变量可能在导入之后才设置）。"""
    if name == "MODELS_DIR":
        return models_dir()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _built(name: str) -> Path:
    """返回 ``models/<name>``；没有 ``.complete`` 标记就说明没建好，直接报错并说明怎么办。"""
    path = models_dir() / name
    if not (path / STAMP).is_file():
        raise FileNotFoundError(tr("Model not built: run make setup first ({missing} is missing).",
                                   missing=path / STAMP))
    return path


def tokenizer_dir() -> Path:
    """精确还原的 Qwen3 分词器（tokenizer.json + tokenizer_config.json）。"""
    return _built(TOKENIZER)


def tiny_qwen3() -> Path:
    """2 层、hidden 64 的随机 Qwen3，配真实分词器，给快速测试用；输出文字无意义。"""
    return _built(TINY_QWEN3)


def tiny_qwen3_moe() -> Path:
    """3 层、hidden 64 的随机 Qwen3-MoE（第 0 层是稠密 MLP，其余每层 8 个专家、每个 token 选 2 个），配真实分词器。"""
    return _built(TINY_QWEN3_MOE)


def smollm2() -> Path:
    """SmolLM2-135M-Instruct（Llama 结构，真实权重，fp32）：能说出真正的句子。"""
    return _built(SMOLLM2)


def qwen3_06b_random() -> Path:
    """Qwen3-0.6B 形状的随机权重模型：token 数和计算量与真模型相同，但生成的文字没有意义。"""
    return _built(QWEN3_06B_RANDOM)


def has_real_qwen3() -> bool:
    """真正的 Qwen3-0.6B 是否已就位（有 config.json 和 safetensors 权重即可，手动拷进来的也算）。

    下载脚本先下到临时目录、完整后才改名，所以这个目录存在就不会是下载了一半的。
    """
    path = models_dir() / REAL_QWEN3
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def real_qwen3() -> Path:
    """真正的 Qwen3-0.6B；需要联网下载，默认构建不包含它。"""
    path = models_dir() / REAL_QWEN3
    if not has_real_qwen3():
        raise FileNotFoundError(
            tr("Model not built: run make setup first, then, with access to Hugging Face, run `python tools/build_models.py --real-qwen3` to download the real Qwen3-0.6B ({path} has no config.json and safetensors).",
               path=path)
        )
    return path


def default_model(verbose: bool = True) -> Path:
    """示例默认使用的 Qwen3：有真正的 Qwen3-0.6B 就用它，否则用同形状的随机权重模型。"""
    if has_real_qwen3():
        path = models_dir() / REAL_QWEN3
        if verbose:
            print(tr("Using the real Qwen3-0.6B: {path}", path=path))
        return path
    path = qwen3_06b_random()
    if verbose:
        print(
            tr("Using the random-weight model of the Qwen3-0.6B shape: {path}\n  Note: the weights are random, so the generated text is meaningless; token counts and compute are the same as the real model.\n  For real output: run `python tools/build_models.py --real-qwen3` with network access.",
               path=path)
        )
    return path
