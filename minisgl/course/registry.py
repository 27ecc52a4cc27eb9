"""章节登记表：所有工具（选择规则、骨架生成、CLI、pytest 插件、文档、笔记本）都从这里读章节信息。"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from minisgl.i18n import lang, tr
from minisgl.paths import COURSE_ROOT, REPO_ROOT


@dataclass(frozen=True)
class Chapter:
    """一章：学员模块、参考解答、文档页、笔记本和检查文件都由 id 与阶段推出。"""

    id: str
    stage: int
    number: int
    title: str  # 中文标题
    title_en: str = ""  # English title

    @property
    def display_title(self) -> str:
        """按当前语言的标题（英文标题缺省时退回中文）。"""
        return self.title_en or self.title if lang() == "en" else self.title

    @property
    def label(self) -> str:
        return f"{self.stage}.{self.number}"

    @property
    def relpath(self) -> str:
        """学员文件与解答文件共用的相对路径，如 ``stage1/core.py``。"""
        return f"stage{self.stage}/{self.id}.py"

    @property
    def public_module(self) -> str:
        return f"minisgl.{self.id}"

    @property
    def learner_module(self) -> str:
        return f"stage{self.stage}.{self.id}"

    @property
    def solution_module(self) -> str:
        return f"solutions.stage{self.stage}.{self.id}"

    @property
    def docs_page(self) -> str:
        return f"docs/stage{self.stage}/{self.id}.md"

    @property
    def notebook(self) -> str:
        return f"notebooks/stage{self.stage}/{self.number:02d}_{self.id}.ipynb"

    @property
    def check_file(self) -> str:
        return f"checks/stage{self.stage}/test_{self.id}.py"


def notebook_edition(path: str, language: str) -> str:
    """笔记本 ``notebooks/...`` 在某种语言下的路径：中文就是它本身，英文在 ``notebooks/en/`` 下的同样相对路径。"""
    return path if language == "zh" else f"notebooks/{language}/{path.removeprefix('notebooks/')}"


#: 内置章节：中文标题和英文标题并排写在这里（双语数据，不走 tr 的目录）。
BUILTIN_CHAPTERS: tuple[Chapter, ...] = (
    Chapter("core", 1, 1, "核心数据结构：SamplingParams、Req、Batch、Context", "Core data structures: SamplingParams, Req, Batch, Context"),
    Chapter("layers", 1, 2, "算子层：线性、嵌入、RMSNorm、RoPE、注意力层", "Layers: linear, embedding, RMSNorm, RoPE, attention layer"),
    Chapter("models", 1, 3, "模型：Qwen3 / Llama 解码器与流式权重加载", "Models: Qwen3 / Llama decoders and streaming weight loading"),
    Chapter("kvcache", 1, 4, "KV 缓存：分页 KV 池、页表、token 池", "KV cache: paged KV pool, page table, token pool"),
    Chapter("attention", 1, 5, "注意力后端：变长批次与分页 KV", "Attention backends: variable-length batches and paged KV"),
    Chapter("engine", 1, 6, "引擎：Engine 与批量采样器", "Engine: the Engine and the batched sampler"),
    Chapter("scheduler", 2, 1, "调度器骨架与 LLM.generate", "The scheduler skeleton and LLM.generate"),
    Chapter("cache_manager", 2, 2, "CacheManager：按需分配页面", "CacheManager: pages on demand"),
    Chapter("radix_cache", 2, 3, "Radix 前缀缓存", "Radix prefix cache"),
    Chapter("chunked_prefill", 2, 4, "分块预填充", "Chunked prefill"),
    Chapter("overlap", 2, 5, "重叠调度", "Overlap scheduling"),
    Chapter("message", 3, 1, "消息：进程间的消息、序列化与 ZMQ 队列", "Messages: what processes send, serialization and ZMQ queues"),
    Chapter("tokenizer", 3, 2, "分词进程与增量反分词", "The tokenizer process and incremental detokenization"),
    Chapter("scheduler_io", 3, 3, "调度器的输入输出：由消息驱动的调度循环", "Scheduler I/O: the scheduler loop driven by messages"),
    Chapter("api_server", 3, 4, "API 服务器：OpenAI 兼容的 HTTP 接口与流式输出", "The API server: an OpenAI-compatible HTTP API with streaming"),
    Chapter("sampling", 3, 5, "采样控制：惩罚、偏置、最少 token 与对数概率", "Sampling controls: penalties, bias, min tokens and log-probabilities"),
    Chapter("grammar", 3, 6, "结构化输出：语法约束与 token 位掩码", "Structured output: grammars and token bitmasks"),
    Chapter("distributed", 4, 1, "分布式基础：进程组、通信器与集合通信", "Distributed basics: process groups, the communicator and collectives"),
    Chapter("tensor_parallel", 4, 2, "张量并行：切开的层与模型", "Tensor parallelism: split layers and a split model"),
    Chapter("tp_scheduler", 4, 3, "多秩调度：步调一致的秩", "Multi-rank scheduling: ranks that agree"),
    Chapter("moe", 4, 4, "混合专家：路由、参考实现与分组实现", "Mixture of experts: routing, the reference and the grouped path"),
    Chapter("expert_parallel", 4, 5, "专家并行：切开的专家与分给各秩的专家", "Expert parallelism: split experts and experts dealt out to ranks"),
    Chapter("router", 4, 6, "数据并行与缓存感知的路由器", "Data parallelism and a cache-aware router"),
    Chapter("ngram_cache", 5, 1, "起草：n-gram 缓存与起草器接口", "Drafting: the n-gram cache and the drafter interface"),
    Chapter("spec_tree", 5, 2, "验证：树掩码、按深度的位置与接受", "Verification: the tree mask, positions by depth and acceptance"),
    Chapter("speculative", 5, 3, "引擎里的投机解码：一次前向验证，KV 收拾干净", "Speculative decoding in the engine: verify in one forward, keep the KV honest"),
    Chapter("quantization", 5, 4, "只量化权重：int8 每通道、int4 按组", "Weight-only quantization: int8 per channel, int4 in groups"),
)



def _course_chapters() -> tuple[Chapter, ...]:
    custom = COURSE_ROOT / "chapters.json"
    if COURSE_ROOT != REPO_ROOT and custom.is_file():
        return tuple(Chapter(**c) for c in json.loads(custom.read_text(encoding="utf-8")))
    return BUILTIN_CHAPTERS


def chapters_json(chapters: tuple[Chapter, ...]) -> str:
    """写演示课程的 ``chapters.json`` 用。"""
    return json.dumps([asdict(c) for c in chapters], ensure_ascii=False, indent=2)


CHAPTERS: tuple[Chapter, ...] = _course_chapters()
STAGES: tuple[int, ...] = tuple(sorted({c.stage for c in CHAPTERS}))

#: 不属于某一章、但依赖各章实现的公共模块；切换实现时与各章模块一起换掉。
DERIVED_PUBLIC_MODULES: tuple[str, ...] = ("minisgl.llm", "minisgl.validation", "minisgl.scheduling", "minisgl.graph")


def find_chapter(name: str, chapters: tuple[Chapter, ...] = CHAPTERS) -> Chapter | None:
    """按 id（``cache_manager``）或编号（``2.2``）找章节；找不到返回 None。"""
    name = name.strip()
    for ch in chapters:
        if name in (ch.id, ch.label):
            return ch
    return None


def known_chapters(chapters: tuple[Chapter, ...] = CHAPTERS) -> str:
    """错误消息里列出已知章节：``core (1.1), layers (1.2), …``。"""
    return ", ".join(tr("{id} ({label})", id=c.id, label=c.label) for c in chapters)


def get_chapter(chapter_id: str, chapters: tuple[Chapter, ...] = CHAPTERS) -> Chapter:
    """同 :func:`find_chapter`，找不到时抛 KeyError，消息列出已知章节。"""
    ch = find_chapter(chapter_id, chapters)
    if ch is None:
        raise KeyError(tr("No chapter named {name!r}; known chapters: {known}", name=chapter_id,
                          known=known_chapters(chapters)))  # fmt: skip
    return ch


def chapter_for_check_file(path: str | Path, chapters: tuple[Chapter, ...] = CHAPTERS) -> Chapter | None:
    """``checks/stageN/test_<id>.py`` → 对应章节；其他文件（里程碑、课程机制）→ None。"""
    p = Path(path)
    for ch in chapters:
        if p.name == f"test_{ch.id}.py" and p.parent.name == f"stage{ch.stage}":
            return ch
    return None


def milestone_stage(path: str | Path) -> int | None:
    """``checks/stageN/test_milestone.py`` → N。"""
    p = Path(path)
    if p.name == "test_milestone.py" and p.parent.name.startswith("stage"):
        return int(p.parent.name.removeprefix("stage"))
    return None
