# 本文件由 tools/make_skeletons.py 从参考解答生成。请在每个 TODO 处写出你的实现。
# This file is generated from the reference solution by tools/make_skeletons.py. Write your implementation at each TODO.
# 每个 TODO 写的是目标；卡住了？`python -m minisgl.course hint sampling <任务>` 给出下一级提示。
# Each TODO states the goal; stuck? `python -m minisgl.course hint sampling <task>` gives the next hint.
"""第 3.5 章 sampling：客户端能调的采样——重复 / 出现 / 频率惩罚、logit 偏置、最少 token 数、min-p，以及对数概率。

第 1.6 章的采样器只看这一步的 logits。OpenAI 的客户端每天都会多发几样：``presence_penalty``、
``frequency_penalty``（Hugging Face 叫 ``repetition_penalty`` 的是另一种）、``logit_bias``、``min_tokens``、``min_p``，
还要 ``logprobs`` / ``top_logprobs``。它们有一个共同点：**要记住这个请求之前采过什么**（惩罚、最少 token 数），
或者**要把采样用的分布交回去**（对数概率）。

本章的 :class:`Sampler` 继承第 1.6 章的采样器，在它前后各加一段：

    logits → 惩罚（用到这一步之前的输出）→ 偏置 → 没到 min_tokens 时屏蔽 EOS → ÷ 温度
           → 对数概率（就从这里取）→ min-p → 第 1.6 章的 top-k / top-p / 抽样 → 把采到的 token 记进状态

惩罚要每个请求的历史：输出里每个 token 出现了几次、提示词和输出里出现过哪些 token。它怎么存、新请求接手一个
旧请求的槽位时怎么清、每步怎么记，是本章要你设计的（``token_stats`` 和 ``record`` 的文档字符串写明了要什么）。

**重叠调度的坑**：``prepare`` 在调度线程里、上一步还没算完时就调用，``sample`` 在算的线程里按步的顺序执行。
所以 ``prepare`` 只能看调度线程知道的东西（长度记账），状态只在 ``sample`` 里读写——这样第 N+1 步的惩罚一定
看得到第 N 步采到的 token，哪怕那个 token 还没回到主机。

en: Chapter 3.5 sampling: the sampling a client can steer — repetition / presence / frequency penalties, logit bias,
a minimum number of tokens, min-p, and log-probabilities.

Chapter 1.6's sampler looks only at this step's logits. What OpenAI clients send every day goes further:
``presence_penalty``, ``frequency_penalty`` (what Hugging Face calls ``repetition_penalty`` is yet another one),
``logit_bias``, ``min_tokens``, ``min_p``, and they ask for ``logprobs`` / ``top_logprobs``. What these share: they
**remember what the request sampled before** (penalties, the minimum number of tokens), or they **hand back the
distribution the token was drawn from** (log-probabilities).

This chapter's :class:`Sampler` extends chapter 1.6's with a stage before and after it:

    logits → penalties (over the output before this step) → bias → EOS masked until min_tokens → ÷ temperature
           → log-probabilities (taken right here) → min-p → chapter 1.6's top-k / top-p / draw → record the token

The penalties need each request's history: how often each token occurred in its output, which tokens occurred in its
prompt or output. How it is kept, how it is cleared when a new request takes over an old one's slot, and how each step
is noted is this chapter's design for you (the docstrings of ``token_stats`` and ``record`` say what is required).

**The overlap trap**: ``prepare`` runs on the scheduling thread, while the previous step may still be computing;
``sample`` runs on the computing thread, in step order. So ``prepare`` may only use what the scheduling thread knows
(the length bookkeeping), and the state is read and written only in ``sample``: step N+1's penalties then always see
the token of step N, even before that token reaches the host.
"""

from __future__ import annotations

from minisgl.course.skeleton import TaskNotDone

from dataclasses import dataclass, field
from typing import Any

import torch

from minisgl.core import Batch, Req
from minisgl.engine import BatchSamplingArgs, copy_to_host
from minisgl.engine import Sampler as BaseSampler
from minisgl.scheduling import TokenLogprob

@dataclass
class StepLogprobs:
    """一步的对数概率，在主机上：``rows`` 是要了对数概率的那几行（批次里的行号），其余张量与它一一对应。

    en: One step's log-probabilities, on the host: ``rows`` are the rows of the batch that asked for them, the tensors
    follow them one to one.
    """

    rows: list[int]
    chosen: torch.Tensor  # [R] float32：采到的 token 的 | en: of the sampled token
    top_ids: torch.Tensor  # [R, k] int64
    top_logprobs: torch.Tensor  # [R, k] float32
    top_n: list[int]  # 每行要几个（<= k） | en: how many each row asked for (<= k)

    def of(self, row: int) -> TokenLogprob | None:
        """批次第 ``row`` 行的结果；这一行没要就是 None。

        en: The result of row ``row`` of the batch; None if that row did not ask.
        """
        if row not in self.rows:
            return None
        i = self.rows.index(row)
        n = self.top_n[i]
        return TokenLogprob(float(self.chosen[i]), self.top_ids[i, :n].tolist(), self.top_logprobs[i, :n].tolist())


@dataclass
class BatchControls:
    """一批请求的采样控制：调度线程里由 ``prepare`` 建好，算的线程里由 ``sample`` 使用（结果也填在这里）。

    “没人用”的一项是 None（或空列表），``sample`` 就跳过它。

    en: A batch's sampling controls: built by ``prepare`` on the scheduling thread, used by ``sample`` on the computing
    thread (which also fills in the results here).

    An item no request uses is None (or an empty list), and ``sample`` skips it.
    """

    # [B] int64：每个请求的状态在第几行（它的 table_idx）
    # en: [B] int64: the row of each request's state (its table_idx)
    state_rows: torch.Tensor
    # 惩罚要记住的历史里，prepare 交给 sample 的那一份（哪些行的输出要记、哪些行是新请求……）：内容由你设计，
    # 给定的代码从不看它里面
    # en: the part of the penalties' history that prepare hands to sample (which rows' outputs to note, which rows are
    # en: new requests, ...): its content is your design, and the given code never looks inside
    history: Any = None
    repetition: torch.Tensor | None = None  # [B] float32，1 = 不罚 | en: [B] float32, 1 = none
    presence: torch.Tensor | None = None  # [B] float32，0 = 不罚 | en: [B] float32, 0 = none
    frequency: torch.Tensor | None = None  # [B] float32，0 = 不罚 | en: [B] float32, 0 = none
    # logit 偏置，稀疏地：（批次里的行号，token id，加上的值）三个一维张量
    # en: the logit bias, sparse: (row of the batch, token id, value added), three 1-D tensors
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    no_eos: list[int] = field(default_factory=list)  # 还没到 min_tokens 的行 | en: rows short of their min_tokens
    min_p: torch.Tensor | None = None  # [B] float32，0 = 不过滤 | en: [B] float32, 0 = no filter
    logprob_rows: list[int] = field(default_factory=list)  # 要对数概率的行 | en: rows asking for log-probabilities
    top_n: list[int] = field(default_factory=list)  # 与 logprob_rows 对应：各要几个 | en: per logprob_rows: how many
    #: ``sample`` 填：这一步的对数概率（主机上）
    #: en: filled in by ``sample``: this step's log-probabilities (on the host)
    logprobs: StepLogprobs | None = None
    #: 第 3.6 章：这一步的语法约束；None：没有请求用到
    #: en: chapter 3.6: this step's grammar constraints; None: no request uses one
    grammar: Any = None

    @property
    def penalized(self) -> bool:
        return self.repetition is not None or self.presence is not None or self.frequency is not None


def prompt_len(req: Req) -> int:
    """请求提示词的长度：``max_device_len`` 是提示词加最多输出的长度（第 1.1 章）。

    en: The length of the request's prompt: ``max_device_len`` is the prompt plus the most it may output (chapter 1.1).
    """
    return req.max_device_len - req.output_len


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, seen: torch.Tensor, repetition: torch.Tensor | None,
                    presence: torch.Tensor | None, frequency: torch.Tensor | None) -> torch.Tensor:
    """三种惩罚，按行：

    - 重复惩罚（Hugging Face 的 ``repetition_penalty``，r > 0）：``seen`` 里的 token（提示词或输出里出现过），
      logit 为正就除以 r，否则乘以 r——r > 1 时两种情况都让它更不可能；
    - 出现惩罚（OpenAI 的 ``presence_penalty``）：输出里出现过（``counts > 0``）就减去它；
    - 频率惩罚（OpenAI 的 ``frequency_penalty``）：减去它乘以在输出里出现的次数 ``counts``。

    ``logits``、``counts``、``seen`` 都是 ``[B, vocab]``；每种惩罚是 ``[B]`` 或 None（整批都不用）。返回罚过的 logits，
    参数一个也不原地改（三种都是 None 时原样返回 ``logits`` 也行）。

    en: The three penalties, row by row:

    - repetition (Hugging Face's ``repetition_penalty``, r > 0): for a token in ``seen`` (it occurred in the prompt or
      the output), a positive logit is divided by r, any other multiplied by r; with r > 1 both make it less likely;
    - presence (OpenAI's ``presence_penalty``): subtracted once the token occurred in the output (``counts > 0``);
    - frequency (OpenAI's ``frequency_penalty``): subtracted times the number of occurrences in the output, ``counts``.

    ``logits``, ``counts`` and ``seen`` are ``[B, vocab]``; each penalty is ``[B]`` or None (unused by the whole batch).
    Returns the penalized logits and changes no argument in place (with all three None, returning ``logits`` as it is
    will do).
    """
    # TODO 任务 apply_penalties：返回按文档字符串罚过的 logits（参数一个也不原地改）：第一种惩罚只作用在提示词或输出里出现过的 token 上，正的除、负的乘；另两种只看输出里出现的次数，不看提示词；没给的那种整批跳过；三种都取中性值的行不变
    # TODO task apply_penalties: return the logits penalised as the docstring says (no argument changed in place): the first penalty acts only on tokens that occurred in the prompt or the output, dividing positive logits and multiplying the others; the other two look only at how often a token occurred in the output, never at the prompt; a kind that is not given is skipped for the whole batch; a row holding the neutral value of all three is unchanged
    raise TaskNotDone("sampling", "apply_penalties")


def min_p_filter(logits: torch.Tensor, min_p: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """min-p：按行只留概率至少是最大概率 ``min_p`` 倍的 token（概率按 ``logits / 温度`` 算），其余的 logit 置 -inf。
    ``min_p`` 为 0 的行不变。

    和 vLLM 一样放在 top-k / top-p 之前；Hugging Face 放在它们之后，两者只在同时用 top-p 时才有差别。

    en: min-p: per row, keep only the tokens whose probability is at least ``min_p`` times the largest one (the
    probabilities of ``logits / temperature``); the other logits become -inf. A row with ``min_p`` 0 is unchanged.

    Like vLLM, this comes before top-k / top-p; Hugging Face puts it after them, which differs only together with top-p.
    """
    # TODO 任务 min_p_filter：返回按 min-p 过滤后的 logits（新张量）：每行概率（按 logits/温度）低于该行最大概率 min_p 倍的置 -inf，其余不变；min_p 为 0 的行一个也不去掉；最大的那个总是留下。不必算 softmax
    # TODO task min_p_filter: return the logits filtered by min-p (a new tensor): in each row, entries whose probability (from logits/temperature) is below min_p times the row's largest probability become -inf, the others stay; a row whose min_p is 0 loses nothing; the largest always stays. No softmax is needed
    raise TaskNotDone("sampling", "min_p_filter")


def token_logprobs(logprobs: torch.Tensor, tokens: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``logprobs``：``[R, vocab]`` 的对数概率；``tokens``：``[R]`` 采到的 token。返回（采到的 token 的对数概率 ``[R]``，
    概率最大的 ``k`` 个 token 的 id ``[R, k]`` 和对数概率 ``[R, k]``，从大到小）。

    en: ``logprobs``: ``[R, vocab]`` log-probabilities; ``tokens``: ``[R]`` the sampled tokens. Returns (the sampled
    token's log-probability ``[R]``, the ids ``[R, k]`` and log-probabilities ``[R, k]`` of the ``k`` most likely tokens,
    largest first).
    """
    # TODO 任务 token_logprobs：返回三样：每行采到的那个 token 的对数概率（[R]），以及每行对数概率最大的 k 个的 id（[R, k]，int64）和值（[R, k]），从大到小；k 为 0 时后两样的形状是 [R, 0]
    # TODO task token_logprobs: return three things: each row's log-probability of its sampled token ([R]), and per row the ids ([R, k], int64) and values ([R, k]) of the k largest log-probabilities, largest first; with k = 0 the last two have shape [R, 0]
    raise TaskNotDone("sampling", "token_logprobs")


class Sampler(BaseSampler):
    """第 1.6 章的采样器，加上本章的控制。调度器建好引擎后换上它（:func:`minisgl.scheduling.install_sampler`）。

    ``rows`` 是页表的行数（状态每个请求槽一行），``eos_token_id`` 是 ``min_tokens`` 要屏蔽的 token。

    en: Chapter 1.6's sampler plus this chapter's controls. The scheduler puts it in once the engine is built
    (:func:`minisgl.scheduling.install_sampler`).

    ``rows`` is the number of rows of the page table (the state has one row per request slot), ``eos_token_id`` the
    token ``min_tokens`` masks.
    """

    def __init__(self, device: torch.device, vocab_size: int, seed: int, rows: int, eos_token_id: int | None) -> None:
        super().__init__(device, vocab_size, seed)
        self.rows = rows
        self.eos_token_id = eos_token_id
        # TODO 任务 history_init：准备好惩罚要的历史（token_stats 和 record 要什么，见它们的文档字符串）。槽位有 rows 个，一个槽位会先后服务好几个请求；词表很大（十几万），没有请求用到惩罚之前，不要分配随槽位数乘词表长大的内存
        # TODO task history_init: set up the history the penalties need (what token_stats and record require is in their docstrings). There are rows slots, and one slot serves several requests in turn; the vocabulary is large (over a hundred thousand), so before some request uses a penalty allocate nothing that grows with slots times vocabulary
        raise TaskNotDone("sampling", "history_init")

    def uses_controls(self, req: Req) -> bool:
        """这个请求用到本章的任何一项没有（都没用的批次走第 1.6 章的原路，一点不多花）。

        en: Whether the request uses anything of this chapter (a batch where none does takes chapter 1.6's path and
        costs nothing more).
        """
        p = req.sampling_params
        return (p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or p.min_p > 0.0
                or p.min_tokens > 0 or bool(p.logit_bias) or p.logprobs)

    def prepare(self, batch: Batch) -> BatchSamplingArgs:
        args = super().prepare(batch)
        if any(self.uses_controls(r) for r in batch.reqs):
            args.controls = self.prepare_controls(batch)
        return args

    def prepare_controls(self, batch: Batch) -> BatchControls:
        """在调度线程里、前向之前调用（``req.device_len`` 是这一步要采的 token 的位置）：按行整理出
        :class:`BatchControls`。

        en: Called on the scheduling thread before the forward (``req.device_len`` is the position of the token this
        step samples): gather the :class:`BatchControls`, row by row.
        """
        reqs = batch.reqs
        params = [r.sampling_params for r in reqs]
        # TODO 任务 prepare_controls：返回这一批的 BatchControls（字段见它的定义，张量放在 self.device 上，没有一行用到的项留 None 或空列表），history 放 sample 那边的 token_stats 和 record 需要、又只有这里知道的东西。要点：采到的 token 是不是输出只看 req.can_decode（提示词的中间块不能解码）；已经输出了几个要用调度线程知道的长度算（提示词长度见 prompt_len），不能读历史（重叠调度时上一步还没算完）；min_tokens 只屏蔽还差几个没输出够的行；要对数概率的行记下各要几个 top_logprobs（提示词中间块的行采到的 token 反正丢掉，屏蔽不屏蔽、要不要对数概率都无妨）
        # TODO task prepare_controls: return this batch's BatchControls (fields as in its definition, tensors on self.device, an item no row uses left None or empty), with in history what sample's token_stats and record need and only this side knows. Points: whether the sampled token is output depends only on req.can_decode (a chunk of a prompt cannot decode); how many tokens a request has output so far must come from lengths the scheduling thread knows (prompt_len gives the prompt's), never from the history (with overlap the previous step is still computing); min_tokens masks only rows still short of it; rows asking for log-probabilities note how many top_logprobs each wants (what a chunk's row draws is thrown away, so whether it is masked or gets log-probabilities makes no difference)
        raise TaskNotDone("sampling", "prepare_controls")

    def token_stats(self, c: BatchControls) -> tuple[torch.Tensor, torch.Tensor]:
        """在算的线程里、每步采样之前调用一次（只在有行用到惩罚时）：这一批每行的请求在**这一步之前**的历史。

        返回 ``(counts, seen)``，都是 ``[B, vocab]``、在 ``self.device`` 上：``counts`` 是每个 token 在这个请求的输出里
        出现的次数（整数），``seen`` 是它在提示词或输出里出现过没有（bool）。不用惩罚的行随便是什么（那一行的惩罚是
        中性的）。第一次出现的请求只有它的提示词，哪怕它的槽位之前服务过别的请求。

        en: Called once per step on the computing thread, before sampling (only when some row uses a penalty): the history
        of each row's request **before this step**.

        Returns ``(counts, seen)``, both ``[B, vocab]`` on ``self.device``: ``counts`` how often each token occurred in
        the request's output (integers), ``seen`` whether it occurred in the prompt or the output (bool). Rows using no
        penalty may hold anything (their penalties are neutral). A request seen for the first time has its prompt only,
        even when its slot served another request before.
        """
        # TODO 任务 token_stats：返回这一批每行的请求在这一步之前的 (counts, seen)，都是 [B, vocab]：输出里每个 token 的次数，提示词或输出里出现过没有。新请求只有它的提示词（它的槽位可能刚服务过别的请求）；不用惩罚的行不论；每步调用一次，这时这一步的 token 还不知道
        # TODO task token_stats: return (counts, seen) of each row's request before this step, both [B, vocab]: how often each token occurred in the output, and whether it occurred in the prompt or the output. A new request has its prompt only (its slot may just have served another request); rows using no penalty do not matter; called once per step, when this step's token is not known yet
        raise TaskNotDone("sampling", "token_stats")

    def record(self, c: BatchControls, tokens: torch.Tensor) -> None:
        """在算的线程里、每步采样之后调用一次（只在有行用到惩罚时）：``tokens``（``[B]``，设备上）是这一步采到的。

        en: Called once per step on the computing thread, after sampling (only when some row uses a penalty): ``tokens``
        (``[B]``, on the device) are what this step drew.
        """
        # TODO 任务 record：把这一步采到的 token 记进历史，让下一步的 token_stats 看得到：只记用到惩罚、而且采到的是输出的行（提示词的中间块采到的不是输出）。不要把 token 拷回主机：GPU 上那会让算的线程停下来等
        # TODO task record: note this step's sampled tokens in the history so that the next step's token_stats sees them: only rows that use a penalty and whose sampled token is output (what a chunk of a prompt draws is not). Do not copy the tokens to the host: on a GPU that makes the computing thread stop and wait
        raise TaskNotDone("sampling", "record")

    def adjust(self, logits: torch.Tensor, c: BatchControls) -> torch.Tensor:
        """惩罚 → 偏置 → 没到 ``min_tokens`` 的行屏蔽 EOS（给定）。``logits`` 是这一步的 fp32 张量，可以原地改。

        en: Penalties → bias → EOS masked in the rows short of ``min_tokens`` (given). ``logits`` is this step's fp32
        tensor and may be changed in place.
        """
        if c.penalized:
            counts, seen = self.token_stats(c)
            logits = apply_penalties(logits, counts, seen, c.repetition, c.presence, c.frequency)
        if c.bias is not None:
            rows, ids, values = c.bias
            logits = logits.index_put((rows, ids), values, accumulate=True)
        if c.no_eos and self.eos_token_id is not None:
            logits[c.no_eos, self.eos_token_id] = float("-inf")
        return logits

    def logprob_of(self, args: BatchSamplingArgs, row: int) -> TokenLogprob | None:
        """结果处理用：批次第 ``row`` 行这一步的对数概率；没要就是 None。

        en: For result processing: this step's log-probabilities of row ``row`` of the batch; None if it did not ask.
        """
        c: BatchControls | None = args.controls
        if c is None or c.logprobs is None:
            return None
        return c.logprobs.of(row)

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """``logits``: [B, vocab] → 每行一个 token id（int64），按模块文档里的顺序用上本章的控制。

        en: ``logits``: [B, vocab] -> one token id per row (int64), applying this chapter's controls in the order the
        module docstring gives.
        """
        c: BatchControls | None = args.controls
        if c is None:
            return super().sample(logits, args)
        # TODO 任务 sample_with_controls：返回从这些控制定义的分布里抽出的 token（[B]，int64）：logits 先调整（adjust，在 fp32 里调：模型给的可能是 bf16），再除以温度（贪心的行按 1 算），再按 min-p 截掉尾巴，交给第 1.6 章的采样器；c.logprobs 报的是截尾之前的那个分布（拷到主机，各行按要的个数取 top，k 取这批里最大的）；有行用到惩罚时，采到的 token 交给 record 记下——每步恰好一次。给定：adjust、record、min_p_filter、token_logprobs、copy_to_host、super().sample
        # TODO task sample_with_controls: return the tokens ([B], int64) drawn from the distribution these controls define: the logits adjusted (adjust, in fp32: the model may hand bf16), divided by the temperature (greedy rows count as 1), cut by min-p, and handed to chapter 1.6's sampler; c.logprobs reports the distribution before the cut (copied to the host, top entries as many as each row asked, k being the batch's largest); when some row uses a penalty, the drawn tokens go to record, exactly once per step. Given: adjust, record, min_p_filter, token_logprobs, copy_to_host, super().sample
        raise TaskNotDone("sampling", "sample_with_controls")
