"""第 1.1 章 core：引擎里到处传递的几样数据——采样参数、请求、批次，以及全局上下文。

这些类本身不做计算，但它们的长度记账决定了后面每一章读写 KV 缓存的位置：
``cached_len`` 个 token 的 K/V 已经在缓存里，``device_len`` 个 token 已知（提示词加已生成的），
本轮要算的就是中间这 ``extend_len`` 个。

en: Chapter 1.1 core: the data passed around everywhere in the engine: sampling parameters, requests, batches, and the
global context.

These classes compute nothing themselves, but their length bookkeeping decides where every later chapter reads and
writes the KV cache: the K/V of ``cached_len`` tokens are already in the cache, ``device_len`` tokens are known (the
prompt plus those generated so far), and this step computes the ``extend_len`` tokens in between.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Literal

import torch

from minisgl.i18n import tr

# 只为类型标注；运行时 core 不依赖后面的章节
# en: for type annotations only; at run time core does not depend on later chapters
if TYPE_CHECKING:
    from minisgl.attention import BaseAttnBackend, BaseAttnMetadata
    from minisgl.kvcache import MHAKVCache


class InvalidParam(ValueError):
    """一个不合法的采样参数：``param`` 是字段名，消息说为什么。服务器把它变成点名这个参数的 400。

    en: An invalid sampling parameter: ``param`` is the field's name, the message says why. The server turns it into a
    400 that names the parameter.
    """

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class SamplingParams:
    """一个请求怎么采样。temperature <= 0 或 top_k == 1 时就是贪心（取 argmax）。

    en: How a request samples. With temperature <= 0 or top_k == 1 it is greedy (argmax).
    """

    temperature: float = 0.0
    top_k: int = -1  # -1：不限制 | en: -1: no limit
    top_p: float = 1.0
    ignore_eos: bool = False
    # 最多输出多少个 token；None：直到上下文用完（提示词 + 输出 = 单个请求的长度上限）
    # en: the most tokens to output; None: until the context is full (prompt + output = one request's length limit)
    max_tokens: int | None = None
    # 给了种子，这个请求的随机数只由（种子，位置）决定，与同批的其他请求无关
    # en: with a seed, this request's random numbers depend only on (seed, position), not on the other requests in the
    # en: batch
    seed: int | None = None
    # 第 3.5 章的采样控制（按 OpenAI / Hugging Face 的定义）；缺省值都是“不起作用”。范围在 minisgl.validation 里查
    # en: chapter 3.5's sampling controls (as OpenAI / Hugging Face define them); every default means "off". Their
    # en: ranges are checked in minisgl.validation
    repetition_penalty: float = 1.0  # 提示词和输出里出现过的 token | en: tokens seen in the prompt or the output
    presence_penalty: float = 0.0  # 输出里出现过的 token | en: tokens seen in the output
    frequency_penalty: float = 0.0  # 按输出里出现的次数 | en: by how often they occur in the output
    min_p: float = 0.0
    min_tokens: int = 0  # 输出够这么多之前不许 EOS | en: no EOS until this many tokens are output
    # token id（像 JSON 那样写成字符串）→ 加到它 logit 上的值
    # en: token id (a string, as JSON writes it) → the value added to its logit
    logit_bias: dict[str, float] | None = None
    logprobs: bool = False  # 回报采到的 token 的对数概率 | en: report the log-probability of each sampled token
    top_logprobs: int = 0  # 再回报概率最大的几个 | en: and of this many most likely tokens
    # 第 3.6 章的结构化输出：输出必须符合的语法，至多给一种（JSON Schema 的文本、正则表达式、EBNF 文法）
    # en: chapter 3.6's structured output: the grammar the output must follow, at most one kind (the text of a JSON
    # en: Schema, a regular expression, an EBNF grammar)
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1

    def validate(self) -> None:
        """把不可能的参数挡在门外，免得到采样时才出现 NaN 或越界。参数的取值范围只写在这里：离线接口、调度器和服务器
        都经过它（:func:`minisgl.validation.check_sampling`），服务器按 ``InvalidParam.param`` 点名参数。

        en: Reject impossible parameters here, rather than getting NaN or an out-of-range index at sampling time. The
        parameters' ranges are written here only: the offline API, the scheduler and the server all pass through it
        (:func:`minisgl.validation.check_sampling`), and the server names the parameter from ``InvalidParam.param``.
        """
        # >>> TASK validate_sampling_params: 把不可能的采样参数挡在门外，边界值都合法：温度不能为负；top-k 要么是 -1（不限制），要么至少为 1；top-p 落在 (0, 1] 里；给了最多生成的 token 数就至少为 1（None 表示直到上下文用完，是合法的）。不合法就抛 InvalidParam，带上出错字段的名字，消息里写出收到的值
        # en: reject impossible sampling parameters, boundary values being valid: temperature not negative; top-k either -1 (no limit) or at least 1; top-p within (0, 1]; max_tokens, when given, at least 1 (None, meaning until the context is full, is valid). On a bad value raise InvalidParam carrying the offending field's name, with a message that states the value received
        # hint1: 四个条件互不相干：各查各的，各抛各的。留意两个特殊的边界：top_k 的 -1 表示“不限制”，不是错误；top_p 的区间左开右闭（0 不行，1 可以）。
        # en1: The four conditions are unrelated: check each on its own and raise for it.
        # en1: Mind two special boundaries: -1 for top_k means "no limit", not an error,
        # en1: and top_p's interval is open on the left and closed on the right (0 is out, 1 is in).
        # hint2: 1. self.temperature < 0 → raise InvalidParam("temperature", 说明)；
        # hint2: 2. self.top_k != -1 且 self.top_k < 1 → raise InvalidParam("top_k", …)；
        # hint2: 3. not 0.0 < self.top_p <= 1.0 → raise InvalidParam("top_p", …)；
        # hint2: 4. self.max_tokens 不是 None 且 < 1 → raise InvalidParam("max_tokens", …)。说明像文件里别处一样用 tr(...) 包起来，写出收到的值。
        # en2: 1. self.temperature < 0 → raise InvalidParam("temperature", message);
        # en2: 2. self.top_k != -1 and self.top_k < 1 → raise InvalidParam("top_k", ...);
        # en2: 3. not 0.0 < self.top_p <= 1.0 → raise InvalidParam("top_p", ...);
        # en2: 4. self.max_tokens is not None and < 1 → raise InvalidParam("max_tokens", ...).
        # en2:    Wrap the message in tr(...) like the rest of the file, and state the value received.
        if self.temperature < 0:
            raise InvalidParam("temperature", tr("temperature must not be negative, got {temperature}", temperature=self.temperature))
        if self.top_k != -1 and self.top_k < 1:
            raise InvalidParam("top_k", tr("top_k must be either -1 (no limit) or >= 1, got {top_k}", top_k=self.top_k))
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidParam("top_p", tr("top_p must be in (0, 1], got {top_p}", top_p=self.top_p))
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidParam("max_tokens", tr("max_tokens must be at least 1, got {max_tokens}", max_tokens=self.max_tokens))
        # <<< TASK


# 请求按身份比较：两个内容相同的请求也是两个请求
# en: requests compare by identity: two requests with the same content are still two requests
@dataclass(eq=False)
class Req:
    """一个正在生成的请求。

    ``input_ids`` 是 CPU 上的 1 维 int32 张量：提示词，之后每生成一个 token 就追加在末尾。
    ``table_idx`` 是它在页表 / token 池里占的那一行。长度记账：

    - ``cached_len``：K/V 已经写进缓存的 token 数；
    - ``device_len``：已知的 token 数（提示词 + 已采样的），初值是提示词长度；
    - ``max_device_len``：提示词长度 + ``output_len``，请求最多走到这里。

    始终满足 ``0 <= cached_len < device_len <= max_device_len``。

    en: A request being generated.

    ``input_ids`` is a 1-D int32 tensor on the CPU: the prompt, with each generated token appended at the end.
    ``table_idx`` is the row it occupies in the page table / token pool. Length bookkeeping:

    - ``cached_len``: tokens whose K/V are already written into the cache;
    - ``device_len``: tokens known (prompt + sampled so far), starting at the prompt's length;
    - ``max_device_len``: prompt length + ``output_len``, the furthest the request goes.

    Always ``0 <= cached_len < device_len <= max_device_len``.
    """

    input_ids: torch.Tensor
    table_idx: int
    cached_len: int
    output_len: int
    uid: int
    sampling_params: SamplingParams
    # 第 2 阶段的缓存管理器挂在这里的句柄（前缀缓存命中的节点等）
    # en: the handle stage 2's cache manager keeps here (the prefix-cache node that was hit, and so on)
    cache_handle: Any = None

    def __post_init__(self) -> None:
        # >>> TASK req_init: 算出类文档里那两个由提示词推出的长度；input_ids 不在 CPU 上，或者长度违反类文档里的不变式（空提示词、缓存盖住了全部已知 token、长度为负都算），就抛 ValueError
        # en: derive the two lengths the class docstring defines from the prompt; raise ValueError when input_ids is not on the CPU or when the lengths break the docstring's invariant (an empty prompt, a cache covering every known token and negative lengths all do)
        # hint1: 两个长度只取决于提示词有多长和 output_len；不变式的几个比较可以写成一条链式比较，一次查完（它要用到刚算出的长度）。张量自己有个属性说明它在不在 CPU 上。
        # en1: Both lengths depend only on the prompt's length and output_len;
        # en1: the invariant's comparisons can be one chained comparison, checked in one go (it needs the lengths you just derived).
        # en1: A tensor has an attribute of its own that says whether it is on the CPU.
        # hint2: 1. not self.input_ids.is_cpu → raise ValueError(…)；
        # hint2: 2. self.device_len = len(self.input_ids)；self.max_device_len = len(self.input_ids) + self.output_len；
        # hint2: 3. not 0 <= self.cached_len < self.device_len <= self.max_device_len → raise ValueError，消息里写出三个长度。
        # en2: 1. not self.input_ids.is_cpu → raise ValueError(...);
        # en2: 2. self.device_len = len(self.input_ids); self.max_device_len = len(self.input_ids) + self.output_len;
        # en2: 3. not 0 <= self.cached_len < self.device_len <= self.max_device_len → raise ValueError, with the three lengths in the message.
        if not self.input_ids.is_cpu:
            raise ValueError(tr(
                "Req.input_ids must be a CPU tensor: it is only used for bookkeeping and for assembling the output, "
                "not for computation",
            ))
        self.device_len = len(self.input_ids)
        self.max_device_len = len(self.input_ids) + self.output_len
        if not 0 <= self.cached_len < self.device_len <= self.max_device_len:
            raise ValueError(
                tr(
                    "The request lengths violate 0 <= cached_len < device_len <= max_device_len: "
                    "cached_len={cached_len}, device_len={device_len}, max_device_len={max_device_len}",
                    cached_len=self.cached_len, device_len=self.device_len, max_device_len=self.max_device_len,
                )
            )
        # <<< TASK

    @property
    def extend_len(self) -> int:
        """本轮要送进模型计算的 token 数（预填充时是整段未缓存的提示词，解码时是 1）。

        en: Tokens to send through the model this step (the whole uncached prompt for a prefill, 1 for a decode).
        """
        # >>> TASK extend_len: 返回这一步要送进模型的 token 数：已知、但 K/V 还没进缓存的那些（预填充时是整段未缓存的提示词，解码时是 1）
        # en: return how many tokens this step feeds to the model: those already known whose K/V is not in the cache yet (the whole uncached prompt in a prefill, 1 in a decode)
        # hint1: 看类文档里三个长度怎样把 input_ids 切成几段：要的是其中一段的长度。
        # en1: Look at how the class docstring's three lengths cut input_ids into segments: you want the length of one of them.
        # hint2: return self.device_len - self.cached_len（已知的减去已缓存的）
        # en2: return self.device_len - self.cached_len (known minus cached)
        return self.device_len - self.cached_len
        # <<< TASK

    @property
    def remain_len(self) -> int:
        """还能再生成几个 token。

        en: How many more tokens can be generated.
        """
        # >>> TASK remain_len: 返回这个请求还能再生成几个 token（走到上限时是 0）
        # en: return how many more tokens this request may still generate (0 once it has reached its limit)
        # hint1: 上限和当前已知的 token 数都是请求里现成的长度。
        # en1: Both the limit and the number of known tokens are lengths the request already keeps.
        # hint2: return self.max_device_len - self.device_len（上限减去已知的）
        # en2: return self.max_device_len - self.device_len (the limit minus what is known)
        return self.max_device_len - self.device_len
        # <<< TASK

    @property
    def can_decode(self) -> bool:
        return self.remain_len > 0

    def complete_one(self) -> None:
        """一次前向发出之后调用：这轮的 token 都进了缓存，并且多了一个（刚采样的）已知 token。

        它在前向发出时就推进，而不是等采样结果拷回 CPU，这样调度器可以马上准备下一步。

        en: Call after a forward is launched: this step's tokens are now in the cache, and there is one more known token
        (the one just sampled).

        It advances at launch rather than when the sampled token is copied back to the CPU, so the scheduler can prepare
        the next step at once.
        """
        # >>> TASK complete_one: 推进长度记账：这一步送进模型的 token 都算进缓存，另外多了一个已知 token（刚采样的那个，值还没回来，所以 input_ids 不动）
        # en: advance the length bookkeeping: every token this step fed to the model now counts as cached, and there is one more known token (the one just sampled; its value is not back yet, so input_ids stays as it is)
        # hint1: 只有两行，难点全在顺序：缓存追上的是加一之前的那个已知长度。
        # en1: Only two lines, and the whole difficulty is their order: the cache catches up with the known length as it was before the increment.
        # hint2: self.cached_len = self.device_len，然后 self.device_len += 1（顺序反了，缓存就多算了一个 K/V 还没算出来的 token）。
        # en2: self.cached_len = self.device_len, then self.device_len += 1 (the other way round,
        # en2: the cache would count a token whose K/V has not been computed).
        self.cached_len = self.device_len
        self.device_len += 1
        # <<< TASK

    def append_host(self, next_token: torch.Tensor) -> None:
        """把拷回 CPU 的新 token（含 1 个元素的张量）接到 ``input_ids`` 末尾。

        en: Append the new token copied back to the CPU (a one-element tensor) to ``input_ids``.
        """
        # >>> TASK append_host: 把新 token 的值接到 input_ids 末尾；next_token 可能是 0 维或形状 [1]，也可能是 int64，接上之后 input_ids 仍是 CPU 上 1 维的 int32
        # en: append the new token's value at the end of input_ids; next_token may be 0-D or of shape [1], and may be int64: afterwards input_ids is still 1-D int32 on the CPU
        # hint1: 张量不能原地变长，只能拼出一个新的再赋回去；拼之前先把新 token 整理成和 input_ids 一样的 dtype 和维数。
        # en1: A tensor cannot grow in place: concatenate into a new one and assign it back;
        # en1: before that, bring the new token to the dtype and number of dimensions of input_ids.
        # hint2: self.input_ids = torch.cat([self.input_ids, next_token.reshape(1).to(self.input_ids.dtype)])（reshape(1) 把 0 维和 [1] 都变成 [1]）
        # en2: self.input_ids = torch.cat([self.input_ids, next_token.reshape(1).to(self.input_ids.dtype)]) (reshape(1) turns both 0-D and [1] into [1])
        self.input_ids = torch.cat([self.input_ids, next_token.reshape(1).to(self.input_ids.dtype)])
        # <<< TASK

    def __repr__(self) -> str:
        return (
            f"Req(uid={self.uid}, table_idx={self.table_idx}, cached_len={self.cached_len}, "
            f"device_len={getattr(self, 'device_len', tr('not computed'))}, "
            f"max_device_len={getattr(self, 'max_device_len', tr('not computed'))})"
        )


@dataclass
class Batch:
    """一次前向要算的一批请求。``phase`` 为 ``"prefill"``（预填充）或 ``"decode"``（解码）。

    下面这些字段由调用者（第 1 阶段是你自己，第 2 阶段是调度器）在前向之前填好：

    - ``input_ids``：设备上的 int32，``[sum(extend_len)]``，按请求顺序拼接；
    - ``positions``：同形状，每个 token 在自己序列里的位置（从 ``cached_len`` 到 ``device_len - 1``）；
    - ``out_loc``：同形状，每个 token 的 K/V 要写进 KV 池的哪个槽位；
    - ``attn_metadata``：由 ``attn_backend.prepare_metadata(batch)`` 填写。

    en: A batch of requests computed in one forward. ``phase`` is ``"prefill"`` or ``"decode"``.

    The caller (you in stage 1, the scheduler in stage 2) fills in these fields before the forward:

    - ``input_ids``: int32 on the device, ``[sum(extend_len)]``, the requests concatenated in order;
    - ``positions``: same shape, each token's position in its own sequence (from ``cached_len`` to ``device_len - 1``);
    - ``out_loc``: same shape, the KV-pool slot each token's K/V is written to;
    - ``attn_metadata``: filled in by ``attn_backend.prepare_metadata(batch)``.
    """

    reqs: list[Req]
    phase: Literal["prefill", "decode"]
    input_ids: torch.Tensor = field(init=False)
    positions: torch.Tensor = field(init=False)
    out_loc: torch.Tensor = field(init=False)
    attn_metadata: BaseAttnMetadata = field(init=False)

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"

    @property
    def size(self) -> int:
        return len(self.reqs)

    def __repr__(self) -> str:
        # 前向之前才填的字段可能还没有：repr 不能因此出错（报错信息、调试器里都会打印批次）
        # en: fields filled in just before the forward may be missing yet: repr must not fail because of that (error
        # en: messages and debuggers print batches)
        def show(name: str) -> str:
            value = getattr(self, name, None)
            if value is None:
                return tr("not set")
            return f"{tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__

        fields = ", ".join(f"{name}={show(name)}" for name in ("input_ids", "positions", "out_loc", "attn_metadata"))
        reqs = ", ".join(map(repr, self.reqs[:4])) + (tr(
            ", … {n} in all",
            n=len(self.reqs),
        ) if len(self.reqs) > 4 else "")
        return f"Batch(phase={self.phase!r}, reqs=[{reqs}], {fields})"


@dataclass
class Context:
    """引擎的全局上下文：模型的各层在前向里从这里拿到当前批次、注意力后端和 KV 缓存。

    ``page_table`` 的每个元素是 token 级的 KV 槽位（页号 * page_size + 页内偏移），
    所以无论 ``page_size`` 多大，查表时都按“每页一个 token”来读。

    en: The engine's global context: during the forward, the model's layers get the current batch, the attention backend
    and the KV cache from here.

    Each element of ``page_table`` is a token-level KV slot (page number * page_size + offset in the page), so whatever
    ``page_size`` is, lookups read it as "one token per page".
    """

    page_size: int
    page_table: torch.Tensor = field(init=False)
    attn_backend: BaseAttnBackend = field(init=False)
    kv_cache: MHAKVCache = field(init=False)

    @property
    def batch(self) -> Batch:
        """当前批次：只在 ``with ctx.forward_batch(batch):`` 块里有；块外读它是调用方的错误。

        en: The current batch: there is one only inside a ``with ctx.forward_batch(batch):`` block; reading it outside is
        the caller's mistake.
        """
        # >>> TASK ctx_batch: 返回当前批次；没有当前批次时（从没进过 with 块，或已经离开）抛 RuntimeError，告诉调用方要在 with ctx.forward_batch(batch): 里调用模型。当前批次存在哪里、怎么存，由你和 ctx_forward_batch 一起决定
        # en: return the current batch; with none current (no with block entered yet, or already left) raise RuntimeError telling the caller to call the model inside with ctx.forward_batch(batch):. Where and how the current batch is kept is yours to decide, together with ctx_forward_batch
        # hint1: 存在实例上（不是类上，也不是模块里：两个上下文互不相干）；一个属性、初值“没有”就够了。这个数据类的字段是给定的，你可以在 forward_batch 里第一次设它，读的时候允许它还不存在。
        # en1: Keep it on the instance (not on the class, nor in the module: two contexts are independent); one attribute whose initial value is "none" is enough.
        # en1: The dataclass's fields are given: you may set it for the first time in forward_batch, and read it allowing that it does not exist yet.
        # hint2: 1. current = getattr(self, "_batch", None)；
        # hint2: 2. current is None → raise RuntimeError(tr("No batch is being forwarded right now: …"))；
        # hint2: 3. return current。
        # en2: 1. current = getattr(self, "_batch", None);
        # en2: 2. current is None → raise RuntimeError(tr("No batch is being forwarded right now: ..."));
        # en2: 3. return current.
        current = getattr(self, "_batch", None)
        if current is None:
            raise RuntimeError(tr(
                "No batch is being forwarded right now: call the model inside `with ctx.forward_batch(batch):`",
            ))
        return current
        # <<< TASK

    @contextmanager
    def forward_batch(self, batch: Batch) -> Iterator[None]:
        """在 with 块里把 ``batch`` 设为当前批次；离开（包括出错）时一定清掉。

        en: Make ``batch`` the current batch inside the with block; it is always cleared on the way out (errors
        included).
        """
        # >>> TASK ctx_forward_batch: 在 with 块里，参数给的批次就是当前批次；离开时（块里抛了异常也一样）一定清掉，之后同一个上下文能再进入。已经有当前批次时再进入（嵌套）就抛 RuntimeError，外面那个批次仍是当前批次。两个上下文互不相干：一个在块里，另一个照样没有当前批次、照样能进入
        # en: inside the with block the given batch is the current one; on the way out (also when the block raises) it is always cleared, and the same context can be entered again. Entering while a batch is already current (nesting) raises RuntimeError and the outer batch stays current. Two contexts are independent: while one is inside a block the other still has no current batch and can still be entered
        # hint1: 这是用生成器写的上下文管理器：yield 之前是进入 with，之后是离开。“出错也要清掉”只有 try/finally 做得到；嵌套的检查要放在 try 之前，否则 finally 会把外面那个批次也清掉。
        # en1: This is a context manager written as a generator: the code before the yield runs on entering the with block, the code after it on leaving.
        # en1: "Cleared even on an error" takes try/finally; the nesting check goes before the try, or the finally would clear the outer batch too.
        # hint2: 1. getattr(self, "_batch", None) is not None → raise RuntimeError(…)；
        # hint2: 2. self._batch = batch；
        # hint2: 3. try: yield；finally: self._batch = None。
        # en2: 1. getattr(self, "_batch", None) is not None → raise RuntimeError(...);
        # en2: 2. self._batch = batch;
        # en2: 3. try: yield; finally: self._batch = None.
        if getattr(self, "_batch", None) is not None:
            raise RuntimeError(tr("forward_batch cannot be nested: the previous batch has not finished"))
        self._batch = batch
        try:
            yield
        finally:
            self._batch = None
        # <<< TASK


_GLOBAL_CTX: Context | None = None


def set_global_ctx(ctx: Context | None) -> None:
    """设置（或用 None 清除）全局上下文。一个进程里可以先后创建多个引擎，后设置的生效。

    en: Set (or clear, with None) the global context. A process may create several engines one after another; the last
    one set wins.
    """
    global _GLOBAL_CTX
    _GLOBAL_CTX = ctx


def get_global_ctx() -> Context:
    if _GLOBAL_CTX is None:
        raise RuntimeError(tr("The global context is not set yet: create an Engine first (or call set_global_ctx)"))
    return _GLOBAL_CTX
