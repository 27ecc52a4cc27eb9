"""离线接口 ``LLM``：最后一章（重叠调度）之后的完整引擎。"""

from minisgl.overlap import LLM

__all__ = ["LLM"]
