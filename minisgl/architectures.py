"""检查点的种类 → 谁读它的配置、谁搭它的模型。稠密解码器（第 1.3 章）是默认；后面的章节交出的种类（第 4.4、4.5 章的
混合专家）由组装（:mod:`minisgl.llm`）登记在这里，这样引擎只经过这里读配置、搭模型，却不认识任何后面的章节。

登记的是“用到时才导入那一章”的函数：稠密模型从不导入第 4.4 章（还没做到第 4 阶段的学员不受影响），而
``python -m minisgl --model <MoE 模型>`` 和 ``LLM(<MoE 模型>)`` 不用改一行就能跑。

en: A checkpoint's kind → who reads its config and who builds its model. Dense decoders (chapter 1.3) are the default;
the kinds later chapters deliver (chapters 4.4 and 4.5's mixtures of experts) are registered here by the assembly
(:mod:`minisgl.llm`), so the engine reads configs and builds models only through here yet knows no later chapter.

What is registered is a function that imports the chapter only when it is needed: a dense model never imports chapter
4.4 (a learner not yet at stage 4 is not affected), while ``python -m minisgl --model <an MoE model>`` and
``LLM(<an MoE model>)`` run without a line changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from minisgl.i18n import tr

if TYPE_CHECKING:
    import torch

    from minisgl.models import CausalLM, ModelConfig


class Architecture(NamedTuple):
    """后面的章节交出的一种检查点：读配置、搭整个模型、搭本秩切开的那份（``ep_size`` 是最后一个参数）。

    en: A checkpoint kind a later chapter delivers: read the config, build the whole model, build this rank's split part
    (``ep_size`` is the last argument).
    """

    read_config: Callable[[dict[str, Any]], ModelConfig]
    create_model: Callable[[ModelConfig, torch.dtype, torch.device | str], CausalLM]
    create_split_model: Callable[[ModelConfig, torch.dtype, torch.device | str, int], CausalLM]
    #: 前馈层是路由到专家的（融合解码只会算稠密的 MLP）
    #: en: the feed-forward layers route tokens to experts (fused decode computes dense MLPs only)
    moe: bool = False


_REGISTERED: dict[str, Callable[[], Architecture]] = {}

#: 组装登记之前就知道的名字：只用来在没登记时说清楚是哪一章、怎么办。
#: en: Names known before the assembly registers them: used only to say which chapter and what to do when missing.
LATER_ARCHITECTURES = {"Qwen3MoeForCausalLM": "4.4"}


def register_architecture(name: str, load: Callable[[], Architecture]) -> None:
    """登记 ``config.json`` 里 ``architectures[0]`` 为 ``name`` 的检查点；``load()`` 第一次用到时才调用。

    en: Register checkpoints whose ``architectures[0]`` in ``config.json`` is ``name``; ``load()`` is called only when
    first needed.
    """
    _REGISTERED[name] = load


def registered(name: str) -> Architecture | None:
    load = _REGISTERED.get(name)
    return load() if load is not None else None


def is_moe(config: ModelConfig) -> bool:
    arch = registered(config.architecture)
    return arch is not None and arch.moe


def _architecture_of(hf: dict[str, Any]) -> str:
    return (hf.get("architectures") or ["?"])[0]


def load_model_config(model_path: str | Path) -> ModelConfig:
    """读 ``config.json``：登记过的种类交给它的 ``read_config``，其余交给第 1.3 章的 ``ModelConfig``（它认不出的
    架构由它报错）。

    en: Read ``config.json``: a registered kind goes to its ``read_config``, the rest to chapter 1.3's ``ModelConfig``
    (which reports an architecture it does not know).
    """
    from minisgl.models import ModelConfig

    path = Path(model_path) / "config.json"
    if path.is_file():
        hf = json.loads(path.read_text(encoding="utf-8"))
        name = _architecture_of(hf)
        arch = registered(name)
        if arch is not None:
            return arch.read_config(hf)
        if name in LATER_ARCHITECTURES:
            raise ValueError(tr("{arch} is built in chapter {chapter}; load it through the assembled engine (minisgl.llm.LLM or python -m minisgl), which registers it",
                                arch=name, chapter=LATER_ARCHITECTURES[name]))
    return ModelConfig.from_hf(model_path)


def create_model_for(config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> CausalLM:
    """按配置搭出整个模型（权重只分配）：登记过的种类用它的 ``create_model``，其余用第 1.3 章的 ``create_model``。

    en: Build the whole model from the config (weights allocated only): a registered kind's ``create_model``, chapter
    1.3's ``create_model`` for the rest.
    """
    arch = registered(config.architecture)
    if arch is not None:
        return arch.create_model(config, dtype, device)
    from minisgl.models import create_model

    return create_model(config, dtype, device)


def refuse_ep(config: ModelConfig, ep: int) -> None:
    """稠密模型没有专家可分：``ep`` 不是 1 就报错。

    en: A dense model has no experts to deal out: raise unless ``ep`` is 1.
    """
    if ep != 1:
        raise ValueError(tr("ep_size={ep} applies to mixture-of-experts models; {arch} has no experts", ep=ep,
                            arch=config.architecture))
