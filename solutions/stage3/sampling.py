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
    # >>> TASK apply_penalties: 返回按文档字符串罚过的 logits（参数一个也不原地改）：第一种惩罚只作用在提示词或输出里出现过的 token 上，正的除、负的乘；另两种只看输出里出现的次数，不看提示词；没给的那种整批跳过；三种都取中性值的行不变
    # en: return the logits penalised as the docstring says (no argument changed in place): the first penalty acts only on tokens that occurred in the prompt or the output, dividing positive logits and multiplying the others; the other two look only at how often a token occurred in the output, never at the prompt; a kind that is not given is skipped for the whole batch; a row holding the neutral value of all three is unchanged
    # hint1: 每种惩罚是每行一个数，要和 [B, vocab] 的张量逐元素运算，先把它变成 [B, 1]。“正的除、负的乘”可以用 torch.where 一次写完；counts 是整数，参与运算前换成 logits 的 dtype。
    # en1: Each penalty is one number per row; to combine it with a [B, vocab] tensor element by element, make it [B, 1] first.
    # en1: "Divide the positive, multiply the others" is one torch.where; counts are integers, convert them to the logits' dtype before the arithmetic.
    # hint2: 1. out = logits；
    # hint2: 2. repetition 不是 None：r = repetition[:, None]；out = torch.where(seen, torch.where(out > 0, out / r, out * r), out)；
    # hint2: 3. frequency 不是 None：out = out - frequency[:, None] * counts.to(out.dtype)；
    # hint2: 4. presence 不是 None：out = out - presence[:, None] * (counts > 0).to(out.dtype)；return out。
    # en2: 1. out = logits;
    # en2: 2. repetition not None: r = repetition[:, None]; out = torch.where(seen, torch.where(out > 0, out / r, out * r), out);
    # en2: 3. frequency not None: out = out - frequency[:, None] * counts.to(out.dtype);
    # en2: 4. presence not None: out = out - presence[:, None] * (counts > 0).to(out.dtype); return out.
    out = logits
    if repetition is not None:
        r = repetition[:, None]
        out = torch.where(seen, torch.where(out > 0, out / r, out * r), out)
    if frequency is not None:
        out = out - frequency[:, None] * counts.to(out.dtype)
    if presence is not None:
        out = out - presence[:, None] * (counts > 0).to(out.dtype)
    return out
    # <<< TASK


def min_p_filter(logits: torch.Tensor, min_p: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """min-p：按行只留概率至少是最大概率 ``min_p`` 倍的 token（概率按 ``logits / 温度`` 算），其余的 logit 置 -inf。
    ``min_p`` 为 0 的行不变。

    和 vLLM 一样放在 top-k / top-p 之前；Hugging Face 放在它们之后，两者只在同时用 top-p 时才有差别。

    en: min-p: per row, keep only the tokens whose probability is at least ``min_p`` times the largest one (the
    probabilities of ``logits / temperature``); the other logits become -inf. A row with ``min_p`` 0 is unchanged.

    Like vLLM, this comes before top-k / top-p; Hugging Face puts it after them, which differs only together with top-p.
    """
    # >>> TASK min_p_filter: 返回按 min-p 过滤后的 logits（新张量）：每行概率（按 logits/温度）低于该行最大概率 min_p 倍的置 -inf，其余不变；min_p 为 0 的行一个也不去掉；最大的那个总是留下。不必算 softmax
    # en: return the logits filtered by min-p (a new tensor): in each row, entries whose probability (from logits/temperature) is below min_p times the row's largest probability become -inf, the others stay; a row whose min_p is 0 loses nothing; the largest always stays. No softmax is needed
    # hint1: 概率之比就是 logit 之差的指数：p_i >= min_p · p_max 等价于 logits_i / T >= max / T + log(min_p)。log(0) 是 -inf，正好让 min_p 为 0 的行全部留下。
    # en1: A ratio of probabilities is the exponential of a difference of logits: p_i >= min_p · p_max is the same as logits_i / T >= max / T + log(min_p).
    # en1: log(0) is -inf, which keeps a whole row whose min_p is 0.
    # hint2: scaled = logits / temperatures[:, None]；
    # hint2: cut = scaled.max(dim=-1, keepdim=True).values + torch.log(min_p)[:, None]；
    # hint2: return logits.masked_fill(scaled < cut, float("-inf"))。
    # en2: scaled = logits / temperatures[:, None];
    # en2: cut = scaled.max(dim=-1, keepdim=True).values + torch.log(min_p)[:, None];
    # en2: return logits.masked_fill(scaled < cut, float("-inf")).
    scaled = logits / temperatures[:, None]
    cut = scaled.max(dim=-1, keepdim=True).values + torch.log(min_p)[:, None]
    return logits.masked_fill(scaled < cut, float("-inf"))
    # <<< TASK


def token_logprobs(logprobs: torch.Tensor, tokens: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``logprobs``：``[R, vocab]`` 的对数概率；``tokens``：``[R]`` 采到的 token。返回（采到的 token 的对数概率 ``[R]``，
    概率最大的 ``k`` 个 token 的 id ``[R, k]`` 和对数概率 ``[R, k]``，从大到小）。

    en: ``logprobs``: ``[R, vocab]`` log-probabilities; ``tokens``: ``[R]`` the sampled tokens. Returns (the sampled
    token's log-probability ``[R]``, the ids ``[R, k]`` and log-probabilities ``[R, k]`` of the ``k`` most likely tokens,
    largest first).
    """
    # >>> TASK token_logprobs: 返回三样：每行采到的那个 token 的对数概率（[R]），以及每行对数概率最大的 k 个的 id（[R, k]，int64）和值（[R, k]），从大到小；k 为 0 时后两样的形状是 [R, 0]
    # en: return three things: each row's log-probability of its sampled token ([R]), and per row the ids ([R, k], int64) and values ([R, k]) of the k largest log-probabilities, largest first; with k = 0 the last two have shape [R, 0]
    # hint1: 每行按一个下标取一个元素，是 gather 的事（下标要和结果一样是二维的）；最大的 k 个，torch 有现成的函数，它本来就从大到小给。
    # en1: Taking one element per row by an index is what gather does (the index must be 2-D, like the result);
    # en1: for the k largest torch has a function, and it already returns them largest first.
    # hint2: chosen = logprobs.gather(-1, tokens.long()[:, None]).squeeze(-1)；
    # hint2: values, ids = logprobs.topk(k, dim=-1)；return chosen, ids, values。
    # en2: chosen = logprobs.gather(-1, tokens.long()[:, None]).squeeze(-1);
    # en2: values, ids = logprobs.topk(k, dim=-1); return chosen, ids, values.
    chosen = logprobs.gather(-1, tokens.long()[:, None]).squeeze(-1)
    values, ids = logprobs.topk(k, dim=-1)
    return chosen, ids, values
    # <<< TASK


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
        # >>> TASK history_init: 准备好惩罚要的历史（token_stats 和 record 要什么，见它们的文档字符串）。槽位有 rows 个，一个槽位会先后服务好几个请求；词表很大（十几万），没有请求用到惩罚之前，不要分配随槽位数乘词表长大的内存
        # en: set up the history the penalties need (what token_stats and record require is in their docstrings). There are rows slots, and one slot serves several requests in turn; the vocabulary is large (over a hundred thousand), so before some request uses a penalty allocate nothing that grows with slots times vocabulary
        # hint1: 参考实现用两张 [rows, vocab] 的表（次数、出现过没有），行号就是请求的 table_idx，像 token 池那样；这里先只记下“还没有”，第一次要用时再分配。
        # en1: The reference keeps two [rows, vocab] tables (counts, and whether seen), indexed by the request's table_idx like the token pool;
        # en1: here it only notes "none yet" and allocates on first use.
        # hint2: self.history = None（之后换成一对表：int32 的次数表和 bool 的出现表）。
        # en2: self.history = None (later a pair of tables: an int32 table of counts and a bool table of seen).
        self.history: tuple[torch.Tensor, torch.Tensor] | None = None
        # <<< TASK

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
        # >>> TASK prepare_controls: 返回这一批的 BatchControls（字段见它的定义，张量放在 self.device 上，没有一行用到的项留 None 或空列表），history 放 sample 那边的 token_stats 和 record 需要、又只有这里知道的东西。要点：采到的 token 是不是输出只看 req.can_decode（提示词的中间块不能解码）；已经输出了几个要用调度线程知道的长度算（提示词长度见 prompt_len），不能读历史（重叠调度时上一步还没算完）；min_tokens 只屏蔽还差几个没输出够的行；要对数概率的行记下各要几个 top_logprobs（提示词中间块的行采到的 token 反正丢掉，屏蔽不屏蔽、要不要对数概率都无妨）
        # en: return this batch's BatchControls (fields as in its definition, tensors on self.device, an item no row uses left None or empty), with in history what sample's token_stats and record need and only this side knows. Points: whether the sampled token is output depends only on req.can_decode (a chunk of a prompt cannot decode); how many tokens a request has output so far must come from lengths the scheduling thread knows (prompt_len gives the prompt's), never from the history (with overlap the previous step is still computing); min_tokens masks only rows still short of it; rows asking for log-probabilities note how many top_logprobs each wants (what a chunk's row draws is thrown away, so whether it is masked or gets log-probabilities makes no difference)
        # hint1: 这一步之前已经输出的 token 数是 req.device_len - prompt_len(req)：device_len 已经把还在路上的那一步算进去了。三种惩罚各自一个 [B] 张量，整批都是“不罚”的值时留 None。
        # en1: The tokens output before this step are req.device_len - prompt_len(req): device_len already counts the step still on its way.
        # en1: Each penalty is one [B] tensor, left None when every row holds the "no penalty" value.
        # hint2: 1. c = BatchControls(state_rows=torch.tensor([r.table_idx for r in reqs], dtype=torch.int64, device=self.device))；
        # hint2: 2. 三种惩罚：值的列表里有一个不是 1.0（重复）/ 0.0（另两种）时，就建成 float32 张量放进 c.repetition / c.presence / c.frequency；
        # hint2: 3. recorded, fresh = [], []；对每行 i, (r, p)：done = r.device_len - prompt_len(r)；r.can_decode 且这一行自己用到某种惩罚时 recorded.append(i)，
        # hint2:    done == 0 时再 fresh.append((i, r.input_ids))（还没有输出，input_ids 就是提示词）；
        # hint2:    done < p.min_tokens 时 c.no_eos.append(i)（提示词的中间块采到的 token 反正丢掉，屏蔽它也无妨）；p.logprobs 时 c.logprob_rows.append(i)、c.top_n.append(p.top_logprobs)；
        # hint2:    p.logit_bias（没给时是 None）里每个 (tok, v) 记下 (i, int(tok), float(v))；
        # hint2: 4. c.history = (recorded, fresh)；有偏置时 c.bias = 三个张量（int64、int64、float32）；有一行 min_p > 0 时 c.min_p = float32 张量；return c。
        # en2: 1. c = BatchControls(state_rows=torch.tensor([r.table_idx for r in reqs], dtype=torch.int64, device=self.device));
        # en2: 2. the three penalties: when a value in the list is not 1.0 (repetition) / 0.0 (the other two), build a float32 tensor for c.repetition / c.presence / c.frequency;
        # en2: 3. recorded, fresh = [], []; for each row i, (r, p): done = r.device_len - prompt_len(r); if r.can_decode and the row itself uses some penalty, recorded.append(i),
        # en2:    and when done == 0 also fresh.append((i, r.input_ids)) (nothing output yet: input_ids is the prompt);
        # en2:    if done < p.min_tokens, c.no_eos.append(i) (a chunk's token is dropped anyway, masking it does no harm); if p.logprobs, c.logprob_rows.append(i) and c.top_n.append(p.top_logprobs);
        # en2:    note (i, int(tok), float(v)) for each (tok, v) in p.logit_bias (None when not given);
        # en2: 4. c.history = (recorded, fresh); with some bias, c.bias = three tensors (int64, int64, float32); with some row's min_p > 0, c.min_p = a float32 tensor; return c.
        c = BatchControls(state_rows=torch.tensor([r.table_idx for r in reqs], dtype=torch.int64, device=self.device))
        rep = [p.repetition_penalty for p in params]
        pres = [p.presence_penalty for p in params]
        freq = [p.frequency_penalty for p in params]
        if any(v != 1.0 for v in rep):
            c.repetition = torch.tensor(rep, dtype=torch.float32, device=self.device)
        if any(v != 0.0 for v in pres):
            c.presence = torch.tensor(pres, dtype=torch.float32, device=self.device)
        if any(v != 0.0 for v in freq):
            c.frequency = torch.tensor(freq, dtype=torch.float32, device=self.device)
        bias: list[tuple[int, int, float]] = []
        recorded: list[int] = []
        fresh: list[tuple[int, torch.Tensor]] = []
        for i, (r, p) in enumerate(zip(reqs, params)):
            done = r.device_len - prompt_len(r)
            penalized = p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
            if r.can_decode and penalized:
                recorded.append(i)
                if done == 0:
                    fresh.append((i, r.input_ids))
            if done < p.min_tokens:
                c.no_eos.append(i)
            if p.logprobs:
                c.logprob_rows.append(i)
                c.top_n.append(p.top_logprobs)
            bias.extend((i, int(tok), float(v)) for tok, v in (p.logit_bias or {}).items())
        c.history = (recorded, fresh)
        if bias:
            rows, ids, values = zip(*bias)
            c.bias = (torch.tensor(rows, dtype=torch.int64, device=self.device),
                      torch.tensor(ids, dtype=torch.int64, device=self.device),
                      torch.tensor(values, dtype=torch.float32, device=self.device))
        if any(p.min_p > 0.0 for p in params):
            c.min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32, device=self.device)
        return c
        # <<< TASK

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
        # >>> TASK token_stats: 返回这一批每行的请求在这一步之前的 (counts, seen)，都是 [B, vocab]：输出里每个 token 的次数，提示词或输出里出现过没有。新请求只有它的提示词（它的槽位可能刚服务过别的请求）；不用惩罚的行不论；每步调用一次，这时这一步的 token 还不知道
        # en: return (counts, seen) of each row's request before this step, both [B, vocab]: how often each token occurred in the output, and whether it occurred in the prompt or the output. A new request has its prompt only (its slot may just have served another request); rows using no penalty do not matter; called once per step, when this step's token is not known yet
        # hint1: 新请求是 prepare 在 history 里标出来的（它知道长度）：先把它的槽位清掉、标上提示词，再按 state_rows 取出这一批的行。第一次用到时才分配两张表。
        # en1: New requests are the ones prepare marked in history (it knows the lengths): clear their slots and mark their prompts first,
        # en1: then take this batch's rows by state_rows. Allocate the two tables on first use.
        # hint2: 1. self.history 是 None 时：self.history = (torch.zeros(self.rows, self.vocab_size, dtype=torch.int32, device=self.device), 同形状的 bool 零表)；counts, seen = self.history；
        # hint2: 2. for i, prompt in c.history[1]：row = c.state_rows[i]；counts[row] = 0；seen[row] = False；seen[row, prompt.to(self.device, dtype=torch.int64)] = True；
        # hint2: 3. return counts[c.state_rows], seen[c.state_rows]。
        # en2: 1. if self.history is None: self.history = (torch.zeros(self.rows, self.vocab_size, dtype=torch.int32, device=self.device), a bool zero table of the same shape); counts, seen = self.history;
        # en2: 2. for i, prompt in c.history[1]: row = c.state_rows[i]; counts[row] = 0; seen[row] = False; seen[row, prompt.to(self.device, dtype=torch.int64)] = True;
        # en2: 3. return counts[c.state_rows], seen[c.state_rows].
        if self.history is None:
            shape = (self.rows, self.vocab_size)
            self.history = (torch.zeros(shape, dtype=torch.int32, device=self.device),
                            torch.zeros(shape, dtype=torch.bool, device=self.device))
        counts, seen = self.history
        for i, prompt in c.history[1]:
            row = c.state_rows[i]
            counts[row] = 0
            seen[row] = False
            seen[row, prompt.to(self.device, dtype=torch.int64)] = True
        return counts[c.state_rows], seen[c.state_rows]
        # <<< TASK

    def record(self, c: BatchControls, tokens: torch.Tensor) -> None:
        """在算的线程里、每步采样之后调用一次（只在有行用到惩罚时）：``tokens``（``[B]``，设备上）是这一步采到的。

        en: Called once per step on the computing thread, after sampling (only when some row uses a penalty): ``tokens``
        (``[B]``, on the device) are what this step drew.
        """
        # >>> TASK record: 把这一步采到的 token 记进历史，让下一步的 token_stats 看得到：只记用到惩罚、而且采到的是输出的行（提示词的中间块采到的不是输出）。不要把 token 拷回主机：GPU 上那会让算的线程停下来等
        # en: note this step's sampled tokens in the history so that the next step's token_stats sees them: only rows that use a penalty and whose sampled token is output (what a chunk of a prompt draws is not). Do not copy the tokens to the host: on a GPU that makes the computing thread stop and wait
        # hint1: 要记的行是 prepare 放在 history 里的那份；用张量下标一次写完（高级索引），不要逐行取 int。
        # en1: The rows to note are the ones prepare put in history; write them in one go with tensor indexing, not row by row through int.
        # hint2: recorded = c.history[0]；非空时 counts, seen = self.history；rows = c.state_rows[recorded]；toks = tokens[recorded]；counts[rows, toks] += 1；seen[rows, toks] = True。
        # en2: recorded = c.history[0]; when non-empty counts, seen = self.history; rows = c.state_rows[recorded]; toks = tokens[recorded]; counts[rows, toks] += 1; seen[rows, toks] = True.
        recorded = c.history[0]
        if recorded:
            counts, seen = self.history
            rows, toks = c.state_rows[recorded], tokens[recorded]
            counts[rows, toks] += 1
            seen[rows, toks] = True
        # <<< TASK

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
        # >>> TASK sample_with_controls: 返回从这些控制定义的分布里抽出的 token（[B]，int64）：logits 先调整（adjust，在 fp32 里调：模型给的可能是 bf16），再除以温度（贪心的行按 1 算），再按 min-p 截掉尾巴，交给第 1.6 章的采样器；c.logprobs 报的是截尾之前的那个分布（拷到主机，各行按要的个数取 top，k 取这批里最大的）；有行用到惩罚时，采到的 token 交给 record 记下——每步恰好一次。给定：adjust、record、min_p_filter、token_logprobs、copy_to_host、super().sample
        # en: return the tokens ([B], int64) drawn from the distribution these controls define: the logits adjusted (adjust, in fp32: the model may hand bf16), divided by the temperature (greedy rows count as 1), cut by min-p, and handed to chapter 1.6's sampler; c.logprobs reports the distribution before the cut (copied to the host, top entries as many as each row asked, k being the batch's largest); when some row uses a penalty, the drawn tokens go to record, exactly once per step. Given: adjust, record, min_p_filter, token_logprobs, copy_to_host, super().sample
        # hint1: 温度在 args.temperatures 里，整批贪心时它是 None（这时都按 1 算）。对数概率要在 min-p 之前取：它报告的是抽样用的分布，而不是截掉尾巴之后的；采到的是哪个要等抽完才知道。
        # en1: The temperatures are in args.temperatures, which is None when the whole batch is greedy (then they all count as 1).
        # en1: Take the log-probabilities before min-p: they report the distribution drawn from, not what is left after cutting the tail.
        # en1: Which token was drawn is known only after the draw.
        # hint2: 1. logits = self.adjust(logits.float(), c)；
        # hint2: 2. temps = args.temperatures，None 时换成 torch.ones(logits.shape[0], device=logits.device)；
        # hint2: 3. c.logprob_rows 非空：lp = (logits[c.logprob_rows] / temps[c.logprob_rows, None]).log_softmax(-1)，先留着；
        # hint2: 4. c.min_p 不是 None：logits = min_p_filter(logits, c.min_p, temps)；tokens = super().sample(logits, args)；
        # hint2: 5. 有 lp 时：chosen, ids, values = token_logprobs(lp, tokens[c.logprob_rows], max(c.top_n))，
        # hint2:    c.logprobs = StepLogprobs(c.logprob_rows, copy_to_host(chosen)[0], copy_to_host(ids)[0], copy_to_host(values)[0], c.top_n)；
        # hint2: 6. c.penalized 时 self.record(c, tokens)；return tokens。
        # en2: 1. logits = self.adjust(logits.float(), c);
        # en2: 2. temps = args.temperatures, replaced by torch.ones(logits.shape[0], device=logits.device) when None;
        # en2: 3. with c.logprob_rows non-empty: lp = (logits[c.logprob_rows] / temps[c.logprob_rows, None]).log_softmax(-1), kept for later;
        # en2: 4. if c.min_p is not None: logits = min_p_filter(logits, c.min_p, temps); tokens = super().sample(logits, args);
        # en2: 5. with lp: chosen, ids, values = token_logprobs(lp, tokens[c.logprob_rows], max(c.top_n)),
        # en2:    c.logprobs = StepLogprobs(c.logprob_rows, copy_to_host(chosen)[0], copy_to_host(ids)[0], copy_to_host(values)[0], c.top_n);
        # en2: 6. if c.penalized: self.record(c, tokens); return tokens.
        logits = self.adjust(logits.float(), c)
        temps = args.temperatures if args.temperatures is not None else torch.ones(logits.shape[0], device=logits.device)
        lp = None
        if c.logprob_rows:
            lp = (logits[c.logprob_rows] / temps[c.logprob_rows, None]).log_softmax(-1)
        if c.min_p is not None:
            logits = min_p_filter(logits, c.min_p, temps)
        tokens = super().sample(logits, args)
        if lp is not None:
            chosen, ids, values = token_logprobs(lp, tokens[c.logprob_rows], max(c.top_n))
            c.logprobs = StepLogprobs(c.logprob_rows, copy_to_host(chosen)[0], copy_to_host(ids)[0],
                                      copy_to_host(values)[0], c.top_n)
        if c.penalized:
            self.record(c, tokens)
        return tokens
        # <<< TASK
