# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint engine <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint engine <task>` gives the next hint.
"""第 1.6 章 engine：把前五章拼成一个引擎，再加上批量采样器。

``Engine`` 按顺序初始化：设备与 dtype → 全局上下文 → 模型与权重 → 由剩余内存定出 KV 页数 →
KV 池 → 页表与 token 池 → 注意力后端 → 采样器 →（CUDA 上）录制解码的 CUDA 图（``minisgl/graph.py``），或（CPU 上，
第 1.2–1.5 章都是参考解答时）装上融合解码（``minisgl/fused.py``）；这两样都不在本章的任务里。``forward_batch`` 跑一次前向、为每个请求采样一个 token 并拷回主机；推进请求的长度记账（``complete_one``）由发出这一步的调用者来做。

与 CUDA 有关的东西（设备、空闲显存、异步拷回主机）都收在几个小函数里，CPU 上有对应的做法。

en: Chapter 1.6 engine: the first five chapters put together into an engine, plus a batched sampler.

``Engine`` initialises in order: device and dtype -> global context -> model and weights -> the number of KV pages, from
the free memory -> KV pool -> page table and token pool -> attention backend -> sampler -> (on CUDA) capturing the
decode CUDA graphs (``minisgl/graph.py``), or (on the CPU, when chapters 1.2–1.5 are the reference solution) installing
the fused decode (``minisgl/fused.py``);
neither of these two is part of this chapter's tasks. ``forward_batch`` runs one forward, samples one token per request
and copies them back to the host; advancing the requests' length bookkeeping (``complete_one``) is up to whoever
launches the step.

Everything CUDA-specific (the device, free GPU memory, the asynchronous copy back to the host) is kept in a few small
functions, each with a CPU counterpart.
"""

from __future__ import annotations

from minisgl.course.skeleton import TaskNotDone

import os
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from minisgl import kernel
from minisgl.i18n import tr
from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, SamplingParams, set_global_ctx
from minisgl.fused import FusedDecoder, plan_decode
from minisgl.graph import GraphRunner, resolve_graph_mode
from minisgl.kvcache import MHAKVCache, create_page_table
from minisgl.layers import fast_linear_supported, pack_linear_weights
from minisgl.architectures import create_model_for, load_model_config
from minisgl.models import CausalLM, load_dummy_weights, load_weights

# ----------------------------------------------------------------------------- 设备接缝
# en: ----------------------------------------------------------------------------- device seams


def resolve_device(name: str | torch.device) -> torch.device:
    """``auto``：环境变量 ``MINISGL_DEVICE`` 设了就用它（检查的 ``--device`` 选项设的就是它），
    否则有 CUDA 就用当前 GPU，没有就用 CPU。CUDA 设备总是带上编号（``cuda`` → ``cuda:0``）：
    ``torch.cuda.set_device`` 不收没编号的设备，张量的 ``.device`` 也总带编号，比较时才相等。

    en: ``auto``: the ``MINISGL_DEVICE`` environment variable if set (the checks' ``--device`` option sets it), else the
    current GPU when CUDA is available, else the CPU. A CUDA device always gets its index (``cuda`` → ``cuda:0``):
    ``torch.cuda.set_device`` refuses a device without one, and a tensor's ``.device`` always has one, so only then
    do they compare equal."""
    if str(name) == "auto":
        name = os.environ.get("MINISGL_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """没指定时：CUDA 上 bf16，CPU 上 fp32。也接受 ``"bfloat16"`` 这样的字符串。

    en: When not given: bf16 on CUDA, fp32 on the CPU. Strings such as ``"bfloat16"`` are accepted too.
    """
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def get_free_memory(device: torch.device) -> int:
    """空闲内存（字节）：CUDA 上问驱动，CPU 上读 /proc/meminfo 的 MemAvailable。

    en: Free memory (bytes): asks the driver on CUDA, reads MemAvailable from /proc/meminfo on the CPU.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def model_nbytes(model: object) -> int:
    """模型的权重占的字节数：各算子的权重张量（名字不以 ``_`` 开头的属性），每块存储只算一次（共享的嵌入算一次）。
    CPU 快速路径另存的副本不算在内（见 :func:`packed_nbytes`）：有没有副本因机器而异，页数不该跟着变。

    en: The bytes of the model's weights: each operator's weight tensors (attributes whose names do not start with
    ``_``), each storage counted once (a tied embedding once). The copies a fast CPU path keeps are not included (see
    :func:`packed_nbytes`): whether there are any depends on the machine, and the page count must not follow it.
    """
    seen: set[int] = set()
    total = 0
    for _, op in model.named_ops():
        for name, value in vars(op).items():
            if isinstance(value, torch.Tensor) and not name.startswith("_"):
                storage = value.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    total += storage.nbytes()
    return total


def packed_nbytes(model: object) -> int:
    """CPU 快速路径在权重之外另存的副本（oneDNN 的布局）一共几个字节；没打包时是 0。

    en: The bytes of the copies (oneDNN's layout) that fast CPU paths keep beside the weights; 0 when nothing is packed.
    """
    return sum(op.packed_nbytes() for _, op in model.named_ops() if hasattr(op, "packed_nbytes"))


class HostCopyDone:
    """CPU 上的“拷贝完成事件”：拷贝是同步的，``synchronize()`` 什么也不用等。

    en: The "copy done" event on the CPU: the copy is synchronous, so ``synchronize()`` has nothing to wait for.
    """

    def synchronize(self) -> None:
        return None


def copy_to_host(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | HostCopyDone]:
    """把设备上的结果拷回主机，返回（主机张量，完成事件）。

    CUDA 上异步拷进锁页内存，用事件告诉调用者何时拷完；CPU 上 ``.to("cpu")`` 不拷贝、返回同一块内存，
    之后设备那份一改主机这份也变，所以要 ``clone``。

    en: Copy a result from the device back to the host; returns (host tensor, done event).

    On CUDA the copy goes asynchronously into pinned memory, and the event tells the caller when it is done; on the CPU
    ``.to("cpu")`` copies nothing and returns the same memory, which would change whenever the device copy changes,
    hence the ``clone``.
    """
    if tokens.device.type == "cuda":
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, event
    return tokens.clone(), HostCopyDone()


# ----------------------------------------------------------------------------- 采样器
# en: ----------------------------------------------------------------------------- the sampler


@dataclass
class BatchSamplingArgs:
    """一批请求的采样参数，已整理成张量。``temperatures is None`` 表示整批都是贪心。

    en: A batch's sampling parameters, gathered into tensors. ``temperatures is None`` means the whole batch is greedy.
    """

    # [B] float32；贪心的行填 1（结果会换成 argmax）
    # en: [B] float32; greedy rows hold 1 (their result is replaced by the argmax)
    temperatures: torch.Tensor | None
    greedy: torch.Tensor | None = None  # [B] bool
    top_k: torch.Tensor | None = None  # [B] int64；None：没有一行要 top-k | en: [B] int64; None: no row uses top-k
    top_p: torch.Tensor | None = None  # [B] float32；None：没有一行要 top-p | en: [B] float32; None: no row uses top-p
    # 带种子的行用自己的随机数发生器
    # en: rows with a seed use their own random generator
    generators: list[torch.Generator | None] | None = None
    # 第 3.5 章的采样控制（惩罚、偏置、对数概率……）；None：这一批没有请求用到
    # en: chapter 3.5's sampling controls (penalties, bias, log-probabilities, ...); None: no request of the batch uses any
    controls: Any = None


def top_k_top_p_filter(probs: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """按行过滤概率：先只留概率最大的 k 个；再在剩下的里（重新归一化后）只留最小的“核”——
    从大到小累加、刚好达到 p 的那几个（第一个总是留下）。被过滤的概率置 0；结果不必加起来等于 1，
    采样用的指数竞赛只看各行内的比例。

    en: Filter probabilities row by row: first keep only the k largest; then, among those (renormalised), keep only the
    smallest "nucleus": the largest ones, in decreasing order, whose sum just reaches p (the first is always kept).
    Filtered probabilities become 0; the result need not sum to 1, since the exponential race used for sampling only
    looks at the ratios within a row.
    """
    # TODO 任务 top_k_top_p：返回按行过滤后的概率（与 probs 同形状，规则见函数文档）：被过滤的置 0，留下的彼此比例不变；top-p 的核在 top-k 留下、重新归一化之后的概率上算，累计恰好达到 p 的那个也留下、它之后的都不留，第一个总是留下；top_k 或 top_p 为 None 表示整批都不做这一种过滤；top-k 等于词表大小就是不过滤
    # TODO task top_k_top_p: return the probabilities filtered row by row (same dimensions as probs, rules in the docstring): filtered entries become 0 and the kept ones keep their ratios; the top-p nucleus is taken over what top-k kept, renormalised; the entry whose cumulative sum reaches p exactly is kept and none after it, and the first is always kept; None for top_k or top_p means the whole batch skips that filter; a top-k equal to the vocabulary size filters nothing
    raise TaskNotDone("engine", "top_k_top_p")


class Sampler:
    """一批请求、每个请求各自的采样参数，一次批量调用采完。

    随机性来自“指数竞赛”：``argmax(p / E)``（E 独立服从指数分布）恰好以概率 p 选中每个 token，
    这样整批只要一次 argmax。没有种子的行用采样器自己的发生器（引擎种子决定，可复现）；
    带种子的行用（种子，位置）生成的发生器，结果与同批的其他请求无关。

    en: Sample a batch of requests, each with its own sampling parameters, in one batched call.

    The randomness comes from an "exponential race": ``argmax(p / E)`` (E independent exponential variables) picks each
    token with exactly probability p, so the whole batch needs one argmax. Rows without a seed use the sampler's own
    generator (set by the engine's seed, reproducible); a row with a seed uses a generator made from (seed, position),
    so its result does not depend on the other requests of the batch.
    """

    def __init__(self, device: torch.device, vocab_size: int, seed: int = 0) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def prepare(self, batch: Batch) -> BatchSamplingArgs:
        """在前向之前调用（此时 ``req.device_len`` 就是要采样的 token 的位置）。

        en: Call before the forward (at that point ``req.device_len`` is the position of the token to sample).
        """
        params: list[SamplingParams] = [r.sampling_params for r in batch.reqs]
        if all(p.is_greedy for p in params):
            return BatchSamplingArgs(temperatures=None)
        # TODO 任务 sampler_prepare：返回这一批（不全是贪心）的 BatchSamplingArgs，字段见它的定义，每个请求一行，都放在 self.device 上：贪心的行温度填 1 并标成贪心；不限制的行在 top-k 上等于不过滤、在 top-p 上是 1，整批没有一行要某种过滤时那个字段为 None；带种子的行各有一个只由（种子，这一步的位置）决定的发生器，整批都没有种子时为 None
        # TODO task sampler_prepare: return this (not all greedy) batch's BatchSamplingArgs, fields as in its definition, one row per request, all on self.device: greedy rows get temperature 1 and are flagged as greedy; an unrestricted row means no cut for top-k and 1 for top-p, and a field is None when no row of the batch uses that filter; each seeded row has its own generator determined only by (seed, this step's position), and the field is None when no row has a seed
        raise TaskNotDone("engine", "sampler_prepare")

    def logprob_of(self, args: BatchSamplingArgs, row: int) -> Any:
        """结果处理问采样器：批次第 ``row`` 行这一步采到的 token 的对数概率。这个采样器不算对数概率，总是 None；
        会算的采样器（第 3.5 章）改写它。

        en: Result processing asks the sampler for the log-probabilities of the token row ``row`` of the batch drew this
        step. This sampler computes none and always answers None; a sampler that does (chapter 3.5) overrides it.
        """
        return None

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """``logits``: [B, vocab] → 每行一个 token id（int64）。

        en: ``logits``: [B, vocab] -> one token id per row (int64).
        """
        if args.temperatures is None:
            return logits.argmax(dim=-1)
        # TODO 任务 sample：返回每行采样出的 token id（[B]，int64）。分布与 HF 一致（top-k/top-p 作用在除以温度之后的概率上）；抽样用类文档里的指数竞赛，没有种子的行用采样器自己的发生器，带种子的行只用它自己的；贪心的行取原始 logits 的 argmax。给定：top_k_top_p_filter
        # TODO task sample: return one drawn token id per request ([B], int64). The distribution matches HF (top-k/top-p act on the probabilities after dividing by the temperature); draw with the class docstring's exponential race, requests without a seed using the sampler's own generator and seeded ones only their own; greedy requests take the argmax of the original logits. Given: top_k_top_p_filter
        raise TaskNotDone("engine", "sample")


# ----------------------------------------------------------------------------- 引擎
# en: ----------------------------------------------------------------------------- the engine


@dataclass
class EngineConfig:
    model_path: str
    dtype: torch.dtype | str | None = None  # None：CUDA 上 bf16，CPU 上 fp32 | en: None: bf16 on CUDA, fp32 on the CPU
    max_running_req: int = 8
    # None：由内存推出（CPU 上按需要，见 Engine._determine_num_pages）；服务器里是 --num-pages / --max-total-tokens
    # en: None: worked out from the memory (on the CPU from what is needed, see Engine._determine_num_pages); the
    # en: server's --num-pages / --max-total-tokens
    num_page_override: int | None = None
    # None：模型的 max_position_embeddings（再受 KV 池容量限制）
    # en: None: the model's max_position_embeddings (also limited by the KV pool's capacity)
    max_seq_len_override: int | None = None
    page_size: int = 1
    attention_backend: str = "auto"  # auto | torch | sdpa | fi | fa
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # 加载前的可用内存里最多给模型 + KV 的比例；None：CUDA 0.9，CPU 0.3（CPU 内存还要留给别的进程）；
    # 服务器里是 --mem-fraction-static
    # en: the most of the memory available before loading that model + KV may take; None: 0.9 on CUDA, 0.3 on the CPU
    # en: (CPU memory is also needed by other processes); the server's --mem-fraction-static
    memory_ratio: float | None = None
    seed: int = 0
    # 专家并行（第 4.5 章）：混合专家模型的专家分给几个秩；1：每个秩都有全部专家（张量并行时每个专家切开）。
    # 大于 1 时要等于张量并行的秩数（专家分在同一组秩上）
    # en: expert parallelism (chapter 4.5): how many ranks a mixture of experts' experts are spread over; 1: every rank
    # en: has every expert (each expert split under tensor parallelism). Above 1 it must equal the tensor-parallel
    # en: rank count (the experts are spread over the same ranks)
    ep_size: int = 1
    # 不读权重文件，填随机数（只测速度）
    # en: random numbers instead of reading the weight files (speed tests only)
    use_dummy_weight: bool = False
    # CPU 上线性层走快速路径（见 cpu_kernel）；False 则一律走参考路径 F.linear
    # en: linear layers take a fast path on the CPU (see cpu_kernel); False: always the reference path F.linear
    cpu_fast_linear: bool = True
    # 快速路径用 minisgl.kernel 的小批量内核（fp32 或 bf16，要有 C 编译器），每种权重形状量过 oneDNN 更快时换成它；
    # False 或编不出来时一律 oneDNN
    # en: the fast path uses minisgl.kernel's small-batch kernel (fp32 or bf16, needs a C compiler), or oneDNN for a
    # en: weight shape where that measured faster; always oneDNN when False or when the kernel cannot be built
    cpu_kernel: bool = True
    # 解码的 CUDA 图（见 minisgl/graph.py）：auto（CUDA 上开）| off | eager（CPU 上检查图路径）| cuda
    # en: CUDA graphs for decoding (see minisgl/graph.py): auto (on for CUDA) / off / eager (checks the graph path on
    # en: the CPU) / cuda
    cuda_graph: str = "auto"
    # 录制到多大的批；更大的解码批次照常前向
    # en: the largest batch captured; larger decode batches run the normal forward
    cuda_graph_max_bs: int = 64
    # CPU 上解码批次的全部解码层交给一个 C 函数（见 minisgl/fused.py）。None：第 1.2–1.5 章都是参考解答时才开
    # （自己写的章节总会真正跑起来）；True：强制开；False：关
    # en: on the CPU, every decoder layer of a decode batch goes to one C function (see minisgl/fused.py). None: on only
    # en: when chapters 1.2–1.5 are all the reference solution (a chapter you wrote always runs); True: force it; False: off
    cpu_fused_decode: bool | None = None


class ForwardOutput(NamedTuple):
    # 设备上 int32 [B]（在 CPU 上运行时也叫这个名字）
    # en: int32 [B] on the device (same name when running on the CPU)
    next_tokens_gpu: torch.Tensor
    next_tokens_cpu: torch.Tensor  # 主机上的副本，与上面不共享内存 | en: a copy on the host, sharing no memory with the one above
    copy_done_event: torch.cuda.Event | HostCopyDone
    # 投机解码（第 5.3 章，minisgl.speculative）：每个请求在同一步里、接在 next_tokens 后面又验证出的 token（主机上）；None：没有
    # en: speculative decoding (chapter 5.3, minisgl.speculative): per request, the tokens verified after next_tokens in the same
    # en: step (on the host); None: none
    more_tokens: list[list[int]] | None = None


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        # 稠密模型由第 1.3 章读、搭，混合专家由第 4.4 章（见 minisgl/architectures.py）
        # en: dense models are read and built by chapter 1.3, mixtures of experts by chapter 4.4 (see minisgl/architectures.py)
        self.model_config = load_model_config(config.model_path)
        self.ctx = Context(config.page_size)
        set_global_ctx(self.ctx)

        # 模型：先记下加载前的可用内存（KV 池的上限按它算）；模型的大小之后按它的张量算，
        # 不用加载前后的差值（加载期间别的进程占的内存会被算成模型的）
        # en: the model: note the memory available before loading (the KV pool's cap is worked out from it); the model's
        # en: size is counted from its tensors afterwards, not as a difference before/after loading (memory other
        # en: processes take during the load would be counted as the model's)
        free_before = get_free_memory(self.device)
        self.model = self.build_model()
        if config.use_dummy_weight:
            load_dummy_weights(self.model, config.seed)
        else:
            load_weights(self.model, config.model_path)
        self.graph_mode = resolve_graph_mode(config.cuda_graph, self.device, getattr(self.model, "capturable", True))
        self.fast_linear = config.cpu_fast_linear and fast_linear_supported(self.device, self.dtype)
        # 线性层实际走哪条路径：torch（F.linear）| onednn | kernel（量过 oneDNN 更快的形状用 oneDNN）
        # en: the path linear layers actually take: torch (F.linear) / onednn / kernel (oneDNN for the shapes where it
        # en: measured faster)
        self.linear_kind = "torch"
        if self.fast_linear:
            use_kernel = config.cpu_kernel and self.dtype in (torch.float32, torch.bfloat16) and kernel.available()
            self.linear_kind = "kernel" if use_kernel else "onednn"
        # 解码走哪条路（见 minisgl/fused.py）：融合的 C 函数，还是逐层走各章的代码
        # en: which path decoding takes (see minisgl/fused.py): the fused C function, or layer by layer through the
        # en: chapters' code
        self.fused_decode, self.decode_path = plan_decode(self, config.cpu_fused_decode)
        if self.fast_linear:
            # 融合解码自己读原样的权重，线性层只管预填充：走内核，不另存 oneDNN 的副本；否则每种形状量一下内核和
            # oneDNN 哪条快。环境变量指定了路时（minisgl.kernel.forced）两种情形都走指定的那条
            # en: the fused decode reads the plain weights itself and the linear layers only serve prefill: the kernel,
            # en: with no extra oneDNN copy; otherwise each shape measures whether the kernel or oneDNN is faster. A path
            # en: forced by an environment variable (minisgl.kernel.forced) is taken in both cases
            pack = "onednn" if self.linear_kind == "onednn" else "kernel" if self.fused_decode else "auto"
            pack_linear_weights(self.model, pack)

        # KV 池、页表、token 池（开 CUDA 图时 KV 池多一页，给补齐批次的假请求写 K/V，不分给任何请求）
        # en: KV pool, page table, token pool (with CUDA graphs the KV pool has one extra page, where the dummy requests
        # en: that pad a batch write their K/V; it belongs to no request)
        self.num_pages = self._determine_num_pages(free_before, model_nbytes(self.model))
        c = self.model.config
        pool_pages = self.num_pages + (self.graph_mode != "off")
        self.ctx.kv_cache = self.kv_cache = MHAKVCache(
            c.num_kv_heads, c.num_layers, c.head_dim, pool_pages, config.page_size, self.dtype, self.device
        )
        # 池子用 torch.empty 分配（见 MHAKVCache）。CUDA 上清零：CUDA 图路径和 FlashAttention 会读到请求长度之外、
        # 被掩掉的槽位，而显存上清零很快、不占主机内存；CPU 上开着 CUDA 图的检查路径（eager）也一样
        # en: the pool is allocated with torch.empty (see MHAKVCache). Zeroed on CUDA: the CUDA-graph path and
        # en: FlashAttention read masked slots past a request's length, and zeroing GPU memory is fast and takes no host
        # en: memory; likewise for the CUDA-graph check path (eager) on the CPU
        if self.device.type == "cuda" or self.graph_mode != "off":
            self.kv_cache.zero_()
        max_seq_len = config.max_seq_len_override or c.max_position_embeddings
        self.max_seq_len = min(max_seq_len, self.num_pages * config.page_size)
        self.ctx.page_table = self.page_table = create_page_table(config.max_running_req, self.max_seq_len, self.device)
        self.token_pool = torch.zeros_like(self.page_table)

        self.ctx.attn_backend = self.attn_backend = create_attention_backend(
            config.attention_backend, self.kv_cache, self.page_table, c.num_qo_heads
        )
        self.sampler = Sampler(self.device, self.model_config.vocab_size, config.seed)
        self.graph_runner = None if self.graph_mode == "off" else GraphRunner(self, self.graph_mode, config.cuda_graph_max_bs)
        self.fused_decoder = FusedDecoder(self) if self.fused_decode else None

    def build_model(self) -> CausalLM:
        """搭出这个进程的模型（权重只分配）。``self.model.config`` 描述这个进程上的每一层有多少头，KV 池和注意力后端
        按它分配；模型被切给几个进程时它和 ``self.model_config``（检查点里的整个模型）不同。

        en: Build this process's model (weights allocated only). ``self.model.config`` says how many heads each layer
        has in this process, and the KV pool and attention backend are sized from it; when the model is split over
        several processes it differs from ``self.model_config`` (the checkpoint's whole model).
        """
        if self.config.ep_size != 1:
            raise ValueError(tr("ep_size={ep} spreads the experts over tensor-parallel ranks: give tp_size={ep} too",
                                ep=self.config.ep_size))
        return create_model_for(self.model_config, self.dtype, self.device)

    def _determine_num_pages(self, free_before: int, model_bytes: int) -> int:
        """``num_page_override`` 优先；否则先算上限：（加载前的可用内存 × 比例 − 模型大小）÷ 每页字节数。
        CUDA 上就用这个上限（显存本来就是留给推理的）；CPU 上只分配需要的：``max_running_req`` 个请求各占满
        ``max_seq_len``（``max_seq_len_override``，缺省为模型的 ``max_position_embeddings``）所需的页数，再加 50%
        给前缀缓存——请求结束后它留着这些 KV 等下一个同前缀的请求复用；不加这份，满负荷时缓存一点也留不住，
        再多则只是占着内存。两者取小。

        en: ``num_page_override`` first; otherwise first the cap: (memory available before loading × ratio − model size)
        ÷ bytes per page. On CUDA that cap is the answer (the GPU's memory is there for inference anyway); on the CPU
        only what is needed is allocated: the pages for ``max_running_req`` requests each filling ``max_seq_len``
        (``max_seq_len_override``, default the model's ``max_position_embeddings``), plus 50% for the prefix cache,
        which keeps finished requests' KV for the next request with the same prefix; without that share the cache
        could keep nothing at full load, and more would only hold memory. The smaller of the two.
        """
        c, config = self.model.config, self.config
        # TODO 任务 determine_num_pages：返回 KV 池的页数，规则见方法文档（内存上限向下取整，CPU 上按需要算的页数向上取整）；memory_ratio 没给时 CUDA 用 0.9、CPU 用 0.3；每页字节数按这个引擎的页大小和元素类型算；连 1 页都放不下就抛 RuntimeError，消息要同时写出 memory_ratio、num_page_override 和服务器的 --mem-fraction-static、--max-total-tokens。给定：MHAKVCache.bytes_per_page，self.model.config
        # TODO task determine_num_pages: return the number of KV pages by the rules in the method's docstring (the memory cap rounds down, the CPU's need rounds up); memory_ratio defaults to 0.9 on CUDA and 0.3 on the CPU; bytes per page follow this engine's page size and element type; if not even one page fits, raise RuntimeError naming memory_ratio, num_page_override and the server's --mem-fraction-static and --max-total-tokens. Given: MHAKVCache.bytes_per_page, self.model.config
        raise TaskNotDone("engine", "determine_num_pages")

    # 不用 inference_mode：它产出的张量之后在模式外不能原地修改，调度器会踩坑
    # en: not inference_mode: tensors it produces cannot be modified in place outside the mode later, which would trip
    # en: up the scheduler
    @torch.no_grad()
    def forward_batch(self, batch: Batch, args: BatchSamplingArgs) -> ForwardOutput:
        """前向 → 为每个请求采样一个 token → 开始拷回主机。只算，不动请求的记账，也不写 token 池。

        调用前要填好 ``batch.input_ids / positions / out_loc`` 并调用过 ``attn_backend.prepare_metadata(batch)``。
        推进请求（``complete_one``）是调用者在“发出”这一步时做的事：第 2.5 章的重叠调度在结果回来之前、
        甚至计算还在另一个线程里跑的时候，就要用推进后的长度调度下一步。新 token 写到哪里也由调用者决定
        （第 2 阶段写进 token 池；分块预填充的中间块不能覆盖下一个提示词 token）。

        en: Forward -> sample one token per request -> start copying back to the host. It only computes: it touches
        neither the requests' bookkeeping nor the token pool.

        Before calling, fill in ``batch.input_ids / positions / out_loc`` and call
        ``attn_backend.prepare_metadata(batch)``. Advancing the requests (``complete_one``) is done by the caller when
        it launches the step: chapter 2.5's overlap scheduling schedules the next step with the advanced lengths before
        the results are back, even while the computation is still running on another thread. Where the new tokens are
        written is up to the caller too (in stage 2, into the token pool; an intermediate chunk of a chunked prefill
        must not overwrite the prompt's next token).
        """
        if not hasattr(batch, "attn_metadata"):
            raise RuntimeError(tr(
                "batch.attn_metadata is not prepared yet: call engine.attn_backend.prepare_metadata(batch) first",
            ))
        # 同一进程里可能有多个引擎，各层读的是全局上下文
        # en: a process may hold several engines, and the layers read the global context
        set_global_ctx(self.ctx)
        # TODO 任务 forward_batch：返回这一步的 ForwardOutput：每个请求采样出一个 token，设备上一份 int32，主机上一份与它不共享内存的副本，外加拷贝完成的事件。模型的前向要在设好当前批次的上下文里跑。只算、不记账：不推进请求，也不写 token 池。给定：copy_to_host，以及引擎上现成的上下文、模型和采样器
        # TODO task forward_batch: return this step's ForwardOutput: one new token per request, an int32 copy on the device, a CPU copy sharing no memory with it, and the event that signals when that copy has finished. The network must run while the context holds this batch as the current one. It only computes and does no bookkeeping: it neither advances the requests nor writes the token pool. Given: copy_to_host, plus the context, network and sampling component the engine already holds
        raise TaskNotDone("engine", "forward_batch")

    def shutdown(self) -> None:
        """放掉全局上下文对本引擎的引用（同一进程里接着建新引擎时不留旧的）。

        en: Drop the global context's reference to this engine (so that a new engine built next in the same process does
        not keep the old one alive).
        """
        set_global_ctx(None)
