"""第 3.6 章 grammar：结构化输出——让输出一定符合一个 JSON Schema、正则表达式或 EBNF 文法。

办法是每一步只让“接下来合法”的 token 参加抽样：

- **语法匹配器**（xgrammar 的 ``GrammarMatcher``，每个请求一个）记着输出走到了语法的哪里；每采到一个 token 就
  ``accept_token`` 推进一步，采到结束 token 时 ``is_terminated()``；
- **token 位掩码**：词表里每个 token 一位，1 = 下一步允许。一个 int32 装 32 个 token，``vocab`` 个 token 要
  ``ceil(vocab / 32)`` 个 int32。匹配器 ``fill_next_token_bitmask`` 填好一行，采样器把为 0 的位置的 logit 设成 -inf；
- **词表只预处理一次**：哪些 token 能接在语法的哪个位置，要把每个 token 的字节串和语法比一遍；xgrammar 把这件事
  在 ``TokenizerInfo`` / ``GrammarCompiler`` 里做一次、编译过的语法按文本缓存，之后每一步只是查表填位。

位掩码加在哪里要想清楚：它只是把一些 logit 变成 -inf，和惩罚、偏置谁先谁后都一样；但它必须在任何“归一化”之前——
除以温度后的对数概率、min-p、top-k / top-p 都要只看允许的 token，否则 top-p 选出的“核”可能全是不允许的。
所以本章的采样器在第 3.5 章调整 logits 的那一步里、最先加上掩码。

**重叠调度的坑**：下一步的掩码取决于这一步采到的 token。匹配器只在算的线程里、按步的顺序推进（``sample`` 里，
采完就推进），所以第 N+1 步填掩码时，第 N 步的 token 已经进了匹配器，哪怕它还没回到调度线程。一个请求在第 N 步
采到结束 token 时，调度器还不知道，第 N+1 步里还有它：这时匹配器已经结束，这一行既不加掩码、也不推进（这一步的
token 反正会被丢掉）。提示词的中间块不是输出，同样不碰匹配器。

en: Chapter 3.6 grammar: structured output — the output is sure to follow a JSON Schema, a regular expression or an
EBNF grammar.

The way: at each step only the tokens that are "valid next" take part in the draw:

- a **grammar matcher** (xgrammar's ``GrammarMatcher``, one per request) knows where in the grammar the output is;
  every sampled token moves it on with ``accept_token``, and once it has accepted the end token ``is_terminated()``;
- a **token bitmask**: one bit per token of the vocabulary, 1 = allowed next. One int32 holds 32 tokens, so ``vocab``
  tokens take ``ceil(vocab / 32)`` int32s. The matcher fills one row with ``fill_next_token_bitmask``, and the sampler
  sets the logits where the bit is 0 to -inf;
- **the vocabulary is preprocessed once**: which tokens can follow at which place of a grammar needs every token's
  bytes compared with the grammar; xgrammar does that once in ``TokenizerInfo`` / ``GrammarCompiler`` and caches
  compiled grammars by their text, so each step only looks things up and fills bits.

Where the mask goes needs thought: it only turns some logits into -inf, so before or after penalties and bias makes no
difference; but it must come before anything that normalises — the log-probabilities after the temperature, min-p,
top-k / top-p must all see only the allowed tokens, or top-p's "nucleus" could consist of forbidden tokens only. So this
chapter's sampler applies the mask first, in chapter 3.5's step that adjusts the logits.

**The overlap trap**: the next step's mask depends on the token this step samples. The matchers are advanced only on
the computing thread, in step order (in ``sample``, right after the draw), so when step N+1 fills its mask, step N's
token is already in the matcher, even though it has not reached the scheduling thread yet. When a request samples the
end token at step N the scheduler does not know yet, and step N+1 still holds it: its matcher has terminated, so that
row gets no mask and no advance (its token is dropped anyway). Chunks of a prompt are no output and do not touch the
matcher either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import xgrammar as xgr

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import BatchSamplingArgs
from minisgl.i18n import tr
from minisgl.sampling import BatchControls, prompt_len
from minisgl.sampling import Sampler as ControlSampler
from minisgl.validation import grammar_of

#: 一个 int32 装几个 token 的位。
#: en: How many tokens' bits one int32 holds.
BITS = 32
class GrammarBackend:
    """分词器的词表只预处理一次（``TokenizerInfo``），编译过的语法按文本缓存（``GrammarCompiler``）；每个请求从
    编译好的语法得到自己的匹配器。第一个用到语法的请求来了才建（几分之一秒：SmolLM2 约 0.1 s，Qwen3 的词表约 0.5 s），
    不用语法的服务器不花这个时间。

    en: The tokenizer's vocabulary is preprocessed once (``TokenizerInfo``) and compiled grammars are cached by their
    text (``GrammarCompiler``); each request gets its own matcher from a compiled grammar. Built when the first request
    with a grammar arrives (a fraction of a second: about 0.1 s for SmolLM2, 0.5 s for Qwen3's vocabulary), so a server
    that uses no grammar never spends that time.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_id: int | None) -> None:
        stop = None if eos_token_id is None else [eos_token_id]
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)

    def matcher(self, sp: SamplingParams) -> xgr.GrammarMatcher:
        found = grammar_of(sp)
        assert found is not None
        kind, text = found
        # 按文本编译：编译器按文本缓存，同一个语法只编译一次（它已经由 check_grammar 查过能解析）
        # en: compiled from the text: the compiler caches by text, so one grammar is compiled once (check_grammar has
        # en: already made sure it parses)
        if kind == "json_schema":
            compiled = self.compiler.compile_json_schema(text, any_whitespace=False)
        elif kind == "regex":
            compiled = self.compiler.compile_regex(text)
        else:
            compiled = self.compiler.compile_grammar(text)
        return xgr.GrammarMatcher(compiled)


@dataclass
class GrammarStep:
    """一步的语法约束：调度线程里建好，算的线程里使用。``rows`` 是接口（``prepare_controls`` 读它）；算的线程还要从
    调度线程带过去什么，放进 ``carry``，由你设计。

    en: One step's grammar constraints: built on the scheduling thread, used on the computing thread. ``rows`` is the
    interface (``prepare_controls`` reads it); whatever else the computing thread needs from the scheduling thread goes
    into ``carry``, of your design.
    """

    rows: list[int]  # 批次里要加掩码、要推进的行（用语法的输出行） | en: rows of the batch to mask and advance (output rows with a grammar)
    carry: Any = None  # 你的设计 | en: your design


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``bitmask``：``[len(rows), ceil(vocab / 32)]`` int32，第 ``k`` 行（对应 logits 的第 ``rows[k]`` 行）的
    第 ``t`` 位（第 ``t // 32`` 个数的第 ``t % 32`` 位，从最低位数起）为 1 表示 token ``t`` 允许。把 ``logits`` 里
    ``rows`` 那几行不允许的位置设成 -inf，返回 ``logits``（原地改）。位掩码可能在主机上，``logits`` 在设备上。

    en: ``bitmask``: ``[len(rows), ceil(vocab / 32)]`` int32; bit ``t`` of row ``k`` (for the logits row ``rows[k]``;
    bit ``t % 32`` of number ``t // 32``, counted from the lowest) is 1 when token ``t`` is allowed. Set the forbidden
    positions of the ``rows`` of ``logits`` to -inf and return ``logits`` (changed in place). The bitmask may be on the
    host while ``logits`` is on the device.
    """
    # >>> TASK apply_bitmask: 把 logits 里 rows 那几行（位掩码的第 k 行对应 rows[k]）中位为 0 的 token 设成 -inf，原地改并返回 logits；别的行不动；词表大小不是 32 的倍数时，多出来的位不管；位掩码可能在主机内存里、logits 在 GPU 上。int32 的最高位是符号位，移位时要当心
    # en: set to -inf the tokens whose bit is 0 in the listed rows of logits (row k of the bitmask belongs to rows[k]), in place, and return logits; other rows stay as they are; when the vocabulary size is no multiple of 32, the extra bits are ignored; the bitmask may be in host memory and logits on the GPU. The top bit of an int32 is its sign bit: mind it when shifting
    # hint1: 先把每个 int32 拆成 32 个 0/1：右移 0..31 位再和 1 按位与，得到 [R, words, 32]，展平成 [R, words * 32] 再截到词表大小。算术右移会把符号位带进来，但和 1 与过之后只剩最低位，不受影响。
    # en1: First split each int32 into 32 zeros and ones: shift right by 0..31 and AND with 1, giving [R, words, 32];
    # en1: flatten to [R, words * 32] and cut at the vocabulary size. An arithmetic shift drags the sign bit along, but after the AND with 1 only the lowest bit is left.
    # hint2: 1. vocab = logits.shape[-1]；shifts = torch.arange(BITS, device=bitmask.device, dtype=torch.int32)；
    # hint2: 2. bits = (bitmask[:, :, None] >> shifts) & 1，reshape(len(rows), -1)[:, :vocab]；
    # hint2: 3. allowed = bits.to(device=logits.device, dtype=torch.bool)；
    # hint2: 4. index = torch.tensor(rows, device=logits.device)；logits[index] = logits[index].masked_fill(~allowed, float("-inf"))；return logits。
    # en2: 1. vocab = logits.shape[-1]; shifts = torch.arange(BITS, device=bitmask.device, dtype=torch.int32);
    # en2: 2. bits = (bitmask[:, :, None] >> shifts) & 1, reshape(len(rows), -1)[:, :vocab];
    # en2: 3. allowed = bits.to(device=logits.device, dtype=torch.bool);
    # en2: 4. index = torch.tensor(rows, device=logits.device); logits[index] = logits[index].masked_fill(~allowed, float("-inf")); return logits.
    vocab = logits.shape[-1]
    shifts = torch.arange(BITS, device=bitmask.device, dtype=torch.int32)
    bits = ((bitmask[:, :, None] >> shifts) & 1).reshape(len(rows), -1)[:, :vocab]
    allowed = bits.to(device=logits.device, dtype=torch.bool)
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
    return logits
    # <<< TASK


class Sampler(ControlSampler):
    """第 3.5 章的采样器，加上语法约束。``tokenizer`` 给 xgrammar 预处理词表用（第一个用语法的请求来了才做）。

    en: Chapter 3.5's sampler plus grammar constraints. ``tokenizer`` is for xgrammar to preprocess the vocabulary
    (done when the first request with a grammar arrives).
    """

    def __init__(self, device: torch.device, vocab_size: int, seed: int, rows: int, eos_token_id: int | None,
                 tokenizer: Any = None) -> None:
        super().__init__(device, vocab_size, seed, rows, eos_token_id)
        self.tokenizer = tokenizer
        self._backend: GrammarBackend | None = None
        # 每个请求槽（table_idx）当前请求的匹配器，只在 sample 里读写
        # en: the matcher of each request slot's (table_idx's) current request, read and written only in sample
        self.matchers: dict[int, xgr.GrammarMatcher] = {}

    @property
    def backend(self) -> GrammarBackend:
        if self._backend is None:
            if self.tokenizer is None:
                raise RuntimeError(tr("This sampler has no tokenizer, so it cannot constrain the output to a grammar"))
            self._backend = GrammarBackend(self.tokenizer, self.vocab_size, self.eos_token_id)
        return self._backend

    def uses_controls(self, req: Req) -> bool:
        return super().uses_controls(req) or grammar_of(req.sampling_params) is not None

    def prepare_controls(self, batch: Batch) -> BatchControls:
        c = super().prepare_controls(batch)
        c.grammar = self.prepare_grammar(batch)
        if c.grammar is not None:
            # 语法决定输出在哪里结束：min_tokens 不屏蔽它的结束 token（否则一个已经完整的 JSON 之后无路可走）
            # en: the grammar decides where the output ends: min_tokens does not mask its end token (or a complete
            # en: JSON would leave nowhere to go)
            c.no_eos = [i for i in c.no_eos if i not in c.grammar.rows]
        return c

    def prepare_grammar(self, batch: Batch) -> GrammarStep | None:
        """在调度线程里、前向之前调用：这一步哪些行要语法约束，哪些行是第一次出现、要一个新的匹配器。

        en: Called on the scheduling thread before the forward: which rows of this step are constrained by a grammar,
        and which appear for the first time and need a new matcher.
        """
        # >>> TASK prepare_grammar: 返回这一步的 GrammarStep；没有一行要语法约束时返回 None。rows 是要约束的行：采到的 token 是输出、又带语法的行（提示词的中间块不算）。其中一个 token 都还没输出的是第一次出现：它要一个新的匹配器（语法后端按请求的参数给），而它的请求槽里可能还留着上一个请求的匹配器。算的线程凭什么知道这些，由你放进 carry。这里不能碰各请求槽现有的匹配器：上一步可能还在另一个线程里推进它们
        # en: return this step's GrammarStep, or None when nothing in this step needs a grammar. rows are the constrained rows: those whose sampled token is output and that carry a grammar (a chunk of a prompt is not). Among them, one with no output yet appears for the first time: it needs a new matcher made for its own parameters, while its request slot may still hold the previous request's. What the computing thread needs to know about that is yours to put into carry. Do not touch the slots' current matchers here: the previous step may still be advancing them on another thread
        # hint1: 和第 3.5 章的 prepare_controls 一样，“是不是输出”看 can_decode，“输出过几个”用长度记账算（prompt_len 给了提示词长度）。新的匹配器可以在这里就建好（编译语法的时间不落在算的线程上），交给算的线程去装。
        # en1: As in chapter 3.5's prepare_controls, "is it output" is can_decode and "how many so far" comes from the length bookkeeping (prompt_len gives the prompt's length).
        # en1: The new matchers can be made right here (compiling a grammar then costs the computing thread nothing) and handed over for the computing thread to install.
        # hint2: rows = [i for i, r in enumerate(batch.reqs) if r.can_decode and grammar_of(r.sampling_params) is not None]；没有就 return None；
        # hint2: fresh = [(i, self.backend.matcher(batch.reqs[i].sampling_params)) for i in rows if batch.reqs[i].device_len == prompt_len(batch.reqs[i])]；
        # hint2: return GrammarStep(rows, fresh)（carry 就是这份 (行, 新匹配器) 的列表）。
        # en2: rows = [i for i, r in enumerate(batch.reqs) if r.can_decode and grammar_of(r.sampling_params) is not None]; None if empty;
        # en2: fresh = [(i, self.backend.matcher(batch.reqs[i].sampling_params)) for i in rows if batch.reqs[i].device_len == prompt_len(batch.reqs[i])];
        # en2: return GrammarStep(rows, fresh) (carry is that list of (row, new matcher)).
        rows = [i for i, r in enumerate(batch.reqs) if r.can_decode and grammar_of(r.sampling_params) is not None]
        if not rows:
            return None
        fresh = [(i, self.backend.matcher(batch.reqs[i].sampling_params)) for i in rows
                 if batch.reqs[i].device_len == prompt_len(batch.reqs[i])]
        return GrammarStep(rows, fresh)
        # <<< TASK

    def adjust(self, logits: torch.Tensor, c: BatchControls) -> torch.Tensor:
        if c.grammar is not None:
            logits = self.mask_grammar(logits, c)
        return super().adjust(logits, c)

    def mask_grammar(self, logits: torch.Tensor, c: BatchControls) -> torch.Tensor:
        """在算的线程里：装上新的匹配器，再给每个还没结束的语法行加上它的位掩码。返回 ``logits``（原地改）。

        en: On the computing thread: install the new matchers, then mask every grammar row whose matcher has not
        terminated. Returns ``logits`` (changed in place).
        """
        g: GrammarStep = c.grammar
        # >>> TASK mask_grammar: 先让第一次出现的行各用上它的新匹配器（凭 prepare_grammar 放进记录里的东西；匹配器按请求槽存放，槽里上一个请求留下的要换掉），再给这一步的语法行里、匹配器还没结束的那些加上位掩码（每行一份，由它自己的匹配器填），返回加过掩码的 logits；匹配器已经结束的行（结束之后还在途的那一步）不加，也不报错。给定：xgrammar 分配位掩码的函数、apply_bitmask
        # en: first give every row appearing for the first time its new matcher (from what prepare_grammar put into the record; matchers are kept by request slot, and what the slot's previous request left there is replaced), then mask the grammar rows of this step whose matcher has not terminated (one mask row each, filled by its own matcher) and return the scores so masked; a row whose matcher has terminated (the step still in flight after its end) gets no mask and raises nothing. Given: xgrammar's function that allocates a token mask, apply_bitmask
        # hint1: 装匹配器必须在这里（算的线程），不能在 prepare_grammar：上一步的 sample 可能还在用这个槽。掩码只给还在走的行：位掩码的第 k 行对应这些行里的第 k 个。
        # en1: Installing belongs here (the computing thread), not in prepare_grammar: the previous step's sample may still be using that slot.
        # en1: Mask only the rows still going: row k of the bitmask belongs to the k-th of those rows.
        # hint2: 1. for i, matcher in g.carry: self.matchers[int(c.state_rows[i])] = matcher；
        # hint2: 2. live = [i for i in g.rows if not self.matchers[int(c.state_rows[i])].is_terminated()]；没有就 return logits；
        # hint2: 3. bitmask = xgr.allocate_token_bitmask(len(live), self.vocab_size)；对 enumerate(live) 里的 k, i：self.matchers[...].fill_next_token_bitmask(bitmask, k)；
        # hint2: 4. return apply_bitmask(logits, bitmask, live)。
        # en2: 1. for i, matcher in g.carry: self.matchers[int(c.state_rows[i])] = matcher;
        # en2: 2. live = [i for i in g.rows if not self.matchers[int(c.state_rows[i])].is_terminated()]; return logits if empty;
        # en2: 3. bitmask = xgr.allocate_token_bitmask(len(live), self.vocab_size); for k, i in enumerate(live): self.matchers[...].fill_next_token_bitmask(bitmask, k);
        # en2: 4. return apply_bitmask(logits, bitmask, live).
        for i, matcher in g.carry:
            self.matchers[int(c.state_rows[i])] = matcher
        live = [i for i in g.rows if not self.matchers[int(c.state_rows[i])].is_terminated()]
        if not live:
            return logits
        bitmask = xgr.allocate_token_bitmask(len(live), self.vocab_size)
        for k, i in enumerate(live):
            self.matchers[int(c.state_rows[i])].fill_next_token_bitmask(bitmask, k)
        return apply_bitmask(logits, bitmask, live)
        # <<< TASK

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        tokens = super().sample(logits, args)
        c: BatchControls | None = args.controls
        if c is not None and c.grammar is not None:
            self.advance(tokens, c)
        return tokens

    def advance(self, tokens: torch.Tensor, c: BatchControls) -> None:
        """采完之后、在算的线程里：把每个语法行采到的 token 交给它的匹配器。

        en: After the draw, on the computing thread: hand each grammar row's sampled token to its matcher.
        """
        g: GrammarStep = c.grammar
        # >>> TASK advance_matchers: 把 g.rows 里每行采到的 token 交给它的匹配器推进一步；匹配器已经结束的行跳过（那一步的 token 会被丢掉）；匹配器不接受一个 token 说明位掩码放过了不合法的 token，抛 RuntimeError，消息里写出行号和 token
        # en: hand each sampled token of the rows in g.rows to its matcher to advance it one step; skip rows whose matcher has terminated (that step's token is dropped); a matcher refusing a token means the bitmask let an invalid token through: raise RuntimeError naming the row and the token
        # hint1: token 要拿到主机上（一次 tolist）才能交给匹配器；判断“已经结束”要在推进之前。
        # en1: The tokens must reach the host (one tolist) before a matcher can take them; check "terminated" before advancing.
        # hint2: picked = tokens[g.rows].tolist()；for i, tok in zip(g.rows, picked)：m = self.matchers[int(c.state_rows[i])]；
        # hint2: m.is_terminated() 时 continue；not m.accept_token(tok) 时 raise RuntimeError(tr(..., row=i, token=tok))。
        # en2: picked = tokens[g.rows].tolist(); for i, tok in zip(g.rows, picked): m = self.matchers[int(c.state_rows[i])];
        # en2: continue if m.is_terminated(); raise RuntimeError(tr(..., row=i, token=tok)) if not m.accept_token(tok).
        picked = tokens[g.rows].tolist()
        for i, tok in zip(g.rows, picked):
            m = self.matchers[int(c.state_rows[i])]
            if m.is_terminated():
                continue
            if not m.accept_token(tok):
                raise RuntimeError(tr("Row {row}: the grammar refused the sampled token {token} (the bitmask let it through)",
                                      row=i, token=tok))
        # <<< TASK

