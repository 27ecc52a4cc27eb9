"""组装：最后一层把各章交出的零件装成完整的引擎。``LLM(path)`` 是第 2.1 章的调度器握着 :data:`FULL_PARTS`：
到第 2.5 章为止的零件（按需分页、radix 前缀缓存、分块预填充、重叠调度）配上第 3.6 章的采样器（它带着第 3.5 章的
采样控制）；``LLM(path, tp_size=N)`` 把模型切给 N 个秩，得到 :class:`TPLLM`。各章只往回看，
不认识后面的章；认识全部章节的只有这里（以及服务器的启动器）。

``tp_size > 1`` 时本进程不加入任何进程组，也不改自己的线程数：它 spawn N 个秩进程，每个秩跑第 4.3 章的
``TPScheduler``（切开的引擎、按 uid 解码），每次 ``generate`` 把同一份参数发给每个秩，大家走同样的步，结果从秩 0
拿回来。坏的输入在每个秩上同样地被拒绝，异常原样抛给调用者，秩们留着接着用；一个秩死了就停掉全部秩并报错。

en: The assembly: the top floor fits the parts the chapters deliver into the complete engine. ``LLM(path)`` is chapter
2.1's scheduler holding :data:`FULL_PARTS`: the parts up to chapter 2.5 (pages on demand, the radix prefix cache,
chunked prefill, overlap scheduling) with chapter 3.6's sampler (which carries chapter 3.5's sampling controls);
``LLM(path, tp_size=N)`` splits the model over N ranks and gives a :class:`TPLLM`. Chapters look only backwards and
know no later chapter; only this module (and the server's launcher) knows them all.

With ``tp_size > 1`` this process joins no process group and keeps its thread count: it spawns N rank processes, each
running chapter 4.3's ``TPScheduler`` (the split engine, decoding in uid order); each ``generate`` sends the same
arguments to every rank, they all take the same steps, and the result comes back from rank 0. Bad input is refused the
same way on every rank, the exception is raised to the caller as it was, and the ranks stay for the next call; if a rank
dies, all ranks are stopped and an error is raised.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import signal
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any

from minisgl.architectures import Architecture, is_moe, refuse_ep, register_architecture
from minisgl.i18n import tr
from minisgl.processes.lifeline import die_with_parent
from minisgl import overlap
from minisgl.scheduler import Scheduler
from minisgl.processes.ranks import RANKS_TIMEOUT_S, RankFailed, exit_if_rerunning_main, free_port, rank_died, rank_env, stop_process
from minisgl.scheduling import Sampler

__all__ = ["FULL_PARTS", "LLM", "TPLLM", "check_split", "full_sampler", "full_weights", "moe_architecture"]


def moe_architecture() -> Architecture:
    """混合专家（Qwen3-MoE）：第 4.4 章读配置、搭模型，切给几个秩时第 4.5 章搭本秩那份（``ep_size`` 为 1 时每个专家
    切开，等于秩数时专家分给各秩）。用到时才导入这两章。

    en: Mixtures of experts (Qwen3-MoE): chapter 4.4 reads the config and builds the model; split over ranks, chapter 4.5
    builds this rank's part (with ``ep_size`` 1 each expert is split, with ``ep_size`` equal to the rank count the
    experts are dealt out to the ranks). Both chapters are imported only when needed.
    """
    from minisgl.moe import MoeConfig, create_moe_model

    def create_split_model(config: Any, dtype: Any, device: Any, ep_size: int) -> Any:
        from minisgl.expert_parallel import create_moe_tp_model

        return create_moe_tp_model(config, dtype, device, ep_size)

    return Architecture(MoeConfig.from_dict, create_moe_model, create_split_model, moe=True)  # type: ignore[arg-type]


register_architecture("Qwen3MoeForCausalLM", moe_architecture)


def check_split(config: Any, tp: int, ep: int = 1) -> None:
    """切不开就在起任何进程、加载任何权重之前抛 ValueError（启动器用它）：稠密的问第 4.2 章，混合专家的问第 4.5 章。

    en: Raise ValueError before any process starts or any weight is loaded when the model cannot be split (the launcher
    uses it): chapter 4.2 for dense models, chapter 4.5 for mixtures of experts.
    """
    if is_moe(config):
        from minisgl.expert_parallel import check_moe_split

        check_moe_split(config, tp, ep)
        return
    refuse_ep(config, ep)
    from minisgl.tensor_parallel import check_tp_split

    check_tp_split(config, tp)


def full_sampler(engine: Any, eos_token_id: int | None, tokenizer: Any) -> Sampler:
    """组装好的引擎的采样器：第 3.6 章的（语法），它带着第 3.5 章的采样控制和第 1.6 章的采样器，只在有请求用到控制或
    语法时多做事。离线的 ``LLM``、每个秩和服务器的调度器进程都用它（:data:`~minisgl.scheduling.SamplerFactory`）。

    en: The assembled engine's sampler: chapter 3.6's (grammars), which carries chapter 3.5's sampling controls and
    chapter 1.6's sampler and does more only when a request uses a control or a grammar. The offline ``LLM``, every
    rank and the server's scheduler process all use it (a :data:`~minisgl.scheduling.SamplerFactory`).
    """
    from minisgl.grammar import Sampler as GrammarSampler

    return GrammarSampler(engine.device, engine.model_config.vocab_size, engine.config.seed,
                          rows=engine.page_table.shape[0], eos_token_id=eos_token_id, tokenizer=tokenizer)


def full_loop(scheduler: Scheduler) -> Any:
    """组装好的引擎的主循环：配置了 ``speculative_algorithm`` 就是投机解码的循环（:mod:`minisgl.speculative`，不重叠；
    ``NGRAM`` 用 n-gram 缓存起草，``EARLY_EXIT`` 用目标模型自己的前几层，见 :mod:`minisgl.early_exit`），否则第 2.5 章的
    重叠调度。

    en: The assembled engine's main loop: with ``speculative_algorithm`` configured, the speculative-decoding loop
    (:mod:`minisgl.speculative`, no overlap; ``NGRAM`` drafts with the n-gram cache, ``EARLY_EXIT`` with the target
    model's own first layers, see :mod:`minisgl.early_exit`), otherwise chapter 2.5's overlap scheduling.
    """
    config = scheduler.config
    if config.speculative_algorithm is None:
        return overlap.OverlapLoop(scheduler)
    from minisgl.speculative import SpeculativeLoop

    if config.speculative_algorithm == "EARLY_EXIT":
        # 起草器：目标模型自己的前几层（minisgl.early_exit）；主循环按一次最多猜几个来造它
        # en: the drafter: the target model's own first layers (minisgl.early_exit); the loop makes it with the most
        # en: tokens per guess
        from minisgl.early_exit import EarlyExitDrafter, default_draft_layers

        engine = scheduler.engine
        layers = config.speculative_draft_layers or default_draft_layers(engine.model.config.num_layers)
        return SpeculativeLoop(scheduler, make_drafter=lambda num_draft: EarlyExitDrafter(engine, layers, num_draft))
    return SpeculativeLoop(scheduler)


def full_weights(engine: Any, config: Any) -> None:
    """组装好的引擎加载完权重之后：配置了 ``quantization`` 就按第 5.4 章量化（:mod:`minisgl.quantized`），否则不动。

    en: After the assembled engine loads its weights: with ``quantization`` configured, quantize them by chapter 5.4
    (:mod:`minisgl.quantized`); otherwise leave them.
    """
    if config.quantization is None:
        return
    from minisgl.quantized import quantize_engine

    quantize_engine(engine, config.quantization)


#: 组装好的引擎的零件：到第 2.5 章为止的调度器零件（主循环见 :func:`full_loop`），加上第 3.6 章的采样器和第 5.4 章的
#: 量化（:func:`full_weights`）。离线的 ``LLM``、每个秩和服务器的调度器进程都用它。
#: en: The assembled engine's parts: the scheduler's parts up to chapter 2.5 (the main loop: :func:`full_loop`), plus
#: chapter 3.6's sampler and chapter 5.4's quantization (:func:`full_weights`). The offline ``LLM``, every rank and the
#: server's scheduler process all use them.
FULL_PARTS = dataclasses.replace(overlap.PARTS, sampler=full_sampler, loop=full_loop, weights=full_weights)


class LLM(Scheduler):
    """离线接口：``LLM(path, **配置)`` 是组装好的调度器（``parts`` 缺省为 :data:`FULL_PARTS`）；
    ``LLM(path, tp_size=N)``（N > 1）得到 :class:`TPLLM`。

    en: The offline interface: ``LLM(path, **config)`` is the assembled scheduler (``parts`` defaults to
    :data:`FULL_PARTS`); ``LLM(path, tp_size=N)`` (N > 1) gives a :class:`TPLLM`.
    """

    def __new__(cls, *args: Any, tp_size: int = 1, **kwargs: Any) -> Any:
        if tp_size != 1 and str(kwargs.get("speculative_algorithm")).upper() == "EARLY_EXIT":
            raise ValueError(tr("EARLY_EXIT drafts on one rank only (the model here is split over {tp})", tp=tp_size))
        if tp_size != 1:
            return TPLLM(*args, tp_size=tp_size, **kwargs)
        return super().__new__(cls)

    def __init__(self, *args: Any, tp_size: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, parts=kwargs.pop("parts", None) or FULL_PARTS, **kwargs)


def _plain(params: Any) -> Any:
    """采样参数 → 普通的字典（章节的类按选择规则加载，按名字 pickle 不了）；单个、列表或 None。

    en: Sampling parameters → plain dicts (the chapters' classes are loaded by the selection rules and cannot be pickled
    by name); one, a list or None.
    """
    if params is None:
        return None
    if isinstance(params, (list, tuple)):
        return [_plain(p) for p in params]
    return dataclasses.asdict(params) if dataclasses.is_dataclass(params) else params


def _sampling_params(plain: Any) -> Any:
    """:func:`_plain` 的逆，在秩进程里。

    en: The inverse of :func:`_plain`, in the rank process.
    """
    from minisgl.core import SamplingParams

    if isinstance(plain, list):
        return [_sampling_params(p) for p in plain]
    return SamplingParams(**plain) if isinstance(plain, dict) else plain


def _tp_rank(rank: int, tp_size: int, addr: str, model_path: str, dtype: Any, kwargs: dict[str, Any],
             env: dict[str, str], threads: int, conn: Connection) -> None:
    """一个秩进程：加入进程组、建 ``TPScheduler``，然后按收到的命令一次次 ``generate``，直到 ``None``。

    en: One rank process: join the process group, build a ``TPScheduler``, then ``generate`` for each command received
    until ``None``.
    """
    die_with_parent(signal.SIGKILL)
    os.environ.update(env)
    import torch

    torch.set_num_threads(threads)
    try:
        from minisgl.distributed import DistributedInfo, destroy_distributed, init_distributed
        from minisgl.tp_scheduler import TPScheduler, rank_device

        device = rank_device(kwargs.pop("device", "auto"), rank)
        init_distributed(DistributedInfo(rank, tp_size), addr, device)
        sched = TPScheduler(model_path, dtype, device=str(device), parts=FULL_PARTS, **kwargs)
    except BaseException:  # noqa: BLE001 - 带回父进程 | en: goes back to the parent
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", {"max_seq_len": sched.max_seq_len}))
    try:
        while (command := pickle.loads(conn.recv_bytes())) is not None:
            prompts, params = command
            try:
                result = sched.generate(prompts, _sampling_params(params))
            except (TypeError, ValueError) as err:  # 坏的输入：每个秩都一样地拒绝 | en: bad input: refused alike on every rank
                conn.send(("raised", err))
            else:
                conn.send(("ok", result if rank == 0 else None))
    except EOFError:
        pass
    finally:
        sched.shutdown()
        destroy_distributed()


class TPLLM:
    """``LLM(path, tp_size=N)``：N 个 spawn 出来的秩进程，每个跑整个调度器；本进程只发命令、收秩 0 的结果。
    用完 ``shutdown()``（或 ``with``）。在脚本里要放在 ``if __name__ == "__main__":`` 之下创建（spawn 在每个秩里把脚本
    再执行一遍；见 :mod:`minisgl.processes.ranks`）。

    en: ``LLM(path, tp_size=N)``: N spawned rank processes, each running the whole scheduler; this process only sends
    commands and receives rank 0's results. ``shutdown()`` when done (or use ``with``). In a script, create it under
    ``if __name__ == "__main__":`` (spawn runs the script again in each rank; see :mod:`minisgl.processes.ranks`).
    """

    def __init__(self, model_path: str, dtype: Any = None, *, tp_size: int, timeout: float = RANKS_TIMEOUT_S,
                 **kwargs: Any) -> None:
        if tp_size < 1:
            raise ValueError(tr("tp_size must be at least 1, got {tp}", tp=tp_size))
        exit_if_rerunning_main()
        self.tp_size = tp_size
        self.timeout = timeout
        ctx = multiprocessing.get_context("spawn")
        addr = f"127.0.0.1:{free_port()}"
        threads = max(1, len(os.sched_getaffinity(0)) // tp_size)
        env = rank_env("127.0.0.1", threads)
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.conns: list[Connection] = []
        for rank in range(tp_size):
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_tp_rank, args=(rank, tp_size, addr, str(model_path), dtype, kwargs, env, threads,
                                                      there), name=f"minisgl-rank{rank}", daemon=True)
            proc.start()
            there.close()
            self.procs.append(proc)
            self.conns.append(here)
        self.max_seq_len = self._collect("ready")[0]["max_seq_len"]

    def _collect(self, expected: str) -> list[Any]:
        """每个秩的下一条回答；一个秩出错、死掉或超时就停掉全部秩，抛 :class:`RankFailed`；坏输入的异常原样抛出。

        en: Each rank's next answer; if a rank fails, dies or times out, stop all ranks and raise :class:`RankFailed`;
        the exception of bad input is raised as it was.
        """
        answers: dict[int, tuple[str, Any]] = {}
        waiting = {conn: rank for rank, conn in enumerate(self.conns)}
        try:
            while waiting:
                ready = wait(list(waiting), timeout=self.timeout)
                if not ready:
                    raise RankFailed(tr("Ranks {ranks} did not finish within {seconds:.0f} s",
                                        ranks=sorted(waiting.values()), seconds=self.timeout), sorted(waiting.values()))
                for conn in ready:
                    rank = waiting.pop(conn)  # type: ignore[call-overload]
                    try:
                        answers[rank] = conn.recv()  # type: ignore[union-attr]
                    except EOFError:
                        self.procs[rank].join(1.0)
                        raise rank_died(rank, self.procs[rank].exitcode) from None
                    if answers[rank][0] == "error":
                        raise RankFailed(tr("Rank {rank} failed:\n{error}", rank=rank, error=answers[rank][1]), [rank])
        except BaseException:
            self.shutdown()
            raise
        if answers[0][0] == "raised":
            raise answers[0][1]
        assert all(kind == expected for kind, _ in answers.values())
        return [answers[rank][1] for rank in range(self.tp_size)]

    def generate(self, prompts: Any, sampling_params: Any = None) -> list[dict[str, Any]]:
        """与 ``LLM.generate`` 相同：每个提示词的 ``{"text": ..., "token_ids": [...]}``，按输入顺序。

        en: The same as ``LLM.generate``: ``{"text": ..., "token_ids": [...]}`` for each prompt, in input order.
        """
        if not self.conns:
            raise RuntimeError(tr("This LLM has been shut down"))
        data = pickle.dumps((prompts, _plain(sampling_params)))  # 一次编码，每个秩收到同样的字节 | en: encoded once: every rank gets the same bytes
        for conn in self.conns:
            conn.send_bytes(data)
        return self._collect("ok")[0]

    def shutdown(self) -> None:
        """让每个秩退出（不退的 SIGTERM，再 SIGKILL），一个进程也不留下。

        en: Make every rank exit (SIGTERM if one does not, then SIGKILL), leaving no process behind.
        """
        for conn in self.conns:
            try:
                conn.send_bytes(pickle.dumps(None))
            except OSError:
                pass
        for proc in self.procs:
            stop_process(proc)
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []

    def __enter__(self) -> TPLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
