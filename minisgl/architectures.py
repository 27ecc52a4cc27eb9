"""哪一章搭这个检查点的模型：稠密解码器是第 1.3 章，混合专家（Qwen3-MoE）是第 4.4 章；切给几个秩时，稠密的是第 4.2 章，
混合专家的是第 4.5 章。

引擎只经过这里读配置、搭模型，所以 ``python -m minisgl --model <MoE 模型>`` 和 ``LLM(<MoE 模型>)`` 不用改一行就能跑；
稠密模型从不导入第 4.4 章（还没做到第 4 阶段的学员不受影响）。

en: Which chapter builds a checkpoint's model: dense decoders are chapter 1.3's, mixtures of experts (Qwen3-MoE) chapter
4.4's; split over several ranks, dense ones are chapter 4.2's and mixtures of experts chapter 4.5's. The engine reads
the config and builds the model only through here, so ``python -m minisgl --model <an MoE model>`` and ``LLM(<an MoE
model>)`` run without a line changed; a dense model never imports chapter 4.4 (a learner not yet at stage 4 is not
affected).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from minisgl.i18n import tr

if TYPE_CHECKING:
    import torch

    from minisgl.models import CausalLM, ModelConfig

#: 第 4.4 章搭的架构（``config.json`` 里的 ``architectures[0]``）。
#: en: The architectures chapter 4.4 builds (``architectures[0]`` in ``config.json``).
MOE_ARCHITECTURES = ("Qwen3MoeForCausalLM",)


def is_moe(config: ModelConfig) -> bool:
    return config.architecture in MOE_ARCHITECTURES


def load_model_config(model_path: str | Path) -> ModelConfig:
    """读 ``config.json``：MoE 架构交给第 4.4 章的 ``MoeConfig``，其余交给第 1.3 章的 ``ModelConfig``（它认不出的
    架构由它报错）。

    en: Read ``config.json``: MoE architectures go to chapter 4.4's ``MoeConfig``, the rest to chapter 1.3's
    ``ModelConfig`` (which reports an architecture it does not know).
    """
    from minisgl.models import ModelConfig

    path = Path(model_path) / "config.json"
    if path.is_file():
        hf = json.loads(path.read_text(encoding="utf-8"))
        if (hf.get("architectures") or ["?"])[0] in MOE_ARCHITECTURES:
            from minisgl.moe import MoeConfig

            return MoeConfig.from_dict(hf)
    return ModelConfig.from_hf(model_path)


def create_model_for(config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> CausalLM:
    """按配置搭出整个模型（权重只分配）：MoE 用第 4.4 章的 ``create_moe_model``，其余用第 1.3 章的 ``create_model``。

    en: Build the whole model from the config (weights allocated only): chapter 4.4's ``create_moe_model`` for MoE,
    chapter 1.3's ``create_model`` for the rest.
    """
    if is_moe(config):
        from minisgl.moe import create_moe_model

        return create_moe_model(config, dtype, device)  # type: ignore[arg-type]
    from minisgl.models import create_model

    return create_model(config, dtype, device)


def create_split_model_for(config: ModelConfig, dtype: torch.dtype, device: torch.device | str,
                           ep_size: int = 1) -> CausalLM:
    """本秩那份切开的模型（先加入进程组）：稠密的用第 4.2 章的 ``create_tp_model``，混合专家用第 4.5 章的
    ``create_moe_tp_model``（``ep_size`` 为 1 时每个专家切开，等于秩数时专家分给各秩）。

    en: This rank's part of the split model (join the process group first): chapter 4.2's ``create_tp_model`` for dense
    models, chapter 4.5's ``create_moe_tp_model`` for mixtures of experts (with ``ep_size`` 1 each expert is split, with
    ``ep_size`` equal to the rank count the experts are dealt out to the ranks).
    """
    if is_moe(config):
        from minisgl.expert_parallel import create_moe_tp_model

        return create_moe_tp_model(config, dtype, device, ep_size)  # type: ignore[arg-type]
    _refuse_ep(config, ep_size)
    from minisgl.tensor_parallel import create_tp_model

    return create_tp_model(config, dtype, device)


def check_split(config: ModelConfig, tp: int, ep: int = 1) -> None:
    """切不开就在起任何进程、加载任何权重之前抛 ValueError（启动器用它）：稠密的问第 4.2 章，混合专家的问第 4.5 章。

    en: Raise ValueError before any process starts or any weight is loaded when the model cannot be split (the launcher
    uses it): chapter 4.2 for dense models, chapter 4.5 for mixtures of experts.
    """
    if is_moe(config):
        from minisgl.expert_parallel import check_moe_split

        check_moe_split(config, tp, ep)  # type: ignore[arg-type]
        return
    _refuse_ep(config, ep)
    from minisgl.tensor_parallel import check_tp_split

    check_tp_split(config, tp)


def _refuse_ep(config: ModelConfig, ep: int) -> None:
    """稠密模型没有专家可分：``ep`` 不是 1 就报错。

    en: A dense model has no experts to deal out: raise unless ``ep`` is 1.
    """
    if ep != 1:
        raise ValueError(tr("ep_size={ep} applies to mixture-of-experts models; {arch} has no experts", ep=ep,
                            arch=config.architecture))
