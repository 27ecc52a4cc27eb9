"""第 3.2 章 tokenizer：分词进程与增量反分词。

在线服务里，文字和 token 之间的转换都在一个单独的进程里做（调度器只认 token id）：

    API 服务器 --TokenizeMsg--> [分词] --UserMsg--> 调度器
    调度器 --DetokenizeMsg--> [反分词] --UserReply--> API 服务器

- **分词**（给定）：纯文本用分词器编码（不额外加特殊 token，和 ``LLM.generate`` 对字符串提示词的做法一样），对话消息
  套用分词器自带的对话模板，现成的 token id 原样使用；
- **增量反分词**（你来写）：调度器每一步给每个请求一个新 token，API 服务器要的是一段段新文字。一个汉字或 emoji 在
  字节级分词器里常常跨好几个 token，只解码到一半时是乱码 U+FFFD（``�``）：这样的尾巴先扣住，等字符完整了再发。
  每段都是新的、完整的文字，所有段拼起来正好等于整段 token 的 ``tokenizer.decode``；
- **停止字符串**（你来写）：文字里一出现 ``stop`` 里的某个字符串，就在它前面截断、以 ``finish_reason="stop"`` 结束，
  并让调度器取消这个请求（页面马上归还）；末尾只匹配了一半的先扣住，后文不匹配了再放出来。

每个请求的状态在分词时建立、结束时释放。请求结束之后还可能收到它的消息（重叠调度会多算一步；停止字符串命中后，
调度器收到取消之前也还在算）：这样的消息不建状态、不产生回复。

en: Chapter 3.2 tokenizer: the tokenizer process and incremental detokenization.

In the online service, turning text into tokens and back happens in a process of its own (the scheduler only knows
token ids):

    API server --TokenizeMsg--> [tokenize] --UserMsg--> scheduler
    scheduler --DetokenizeMsg--> [detokenize] --UserReply--> API server

- **Tokenizing** (given): plain text is encoded by the tokenizer (adding no special tokens, as ``LLM.generate`` does for
  a string prompt), chat messages go through the tokenizer's own chat template, and ready token ids are used as given;
- **Incremental detokenization** (you write it): each step the scheduler sends one new token per request, and the API
  server wants pieces of new text. In a byte-level tokenizer a Chinese character or an emoji often spans several
  tokens, and decoded halfway it is garbage, U+FFFD (``�``): such a tail is held back until the character is complete.
  Every piece is new, complete text, and all pieces joined are exactly ``tokenizer.decode`` of all the tokens;
- **Stop strings** (you write them): as soon as one of the strings in ``stop`` appears in the text, the text is cut
  before it, the request finishes with ``finish_reason="stop"``, and the scheduler is told to abort the request (its
  pages come back at once); a partial match at the end is held back and released if what follows does not match.

A request's state is created when it is tokenized and freed when it finishes. Messages for a request can still arrive
after it finished (overlap scheduling computes one step more; after a stop-string hit the scheduler keeps computing
until the abort arrives): such a message creates no state and produces no reply.
"""

from __future__ import annotations

import signal
import sys
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import torch
import zmq
from transformers import AutoTokenizer

from minisgl.i18n import tr
from minisgl.message import (
    AbortBackendMsg,
    AbortMsg,
    BaseBackendMsg,
    BaseFrontendMsg,
    BatchBackendMsg,
    BatchFrontendMsg,
    DetokenizeMsg,
    Message,
    RejectMsg,
    TokenizeMsg,
    UserMsg,
    UserReply,
    ZmqPullQueue,
    ZmqPushQueue,
    unwrap,
)
from minisgl.server.args import ServerAddrs, ServerArgs, set_process_name
from minisgl.validation import check_prompt

#: 解码到一半的字符变成的替换字符。
#: en: The replacement character a half-decoded character turns into.
REPLACEMENT = "\ufffd"
#: 一轮最多收多少条消息再处理（不让源源不断的消息把回复一直压着）。
#: en: The most messages taken in one loop turn before processing (so a steady inflow cannot hold replies back forever).
MAX_DRAIN = 1024
#: 空闲时最多等多久（秒）就回到 Python 一次：SIGTERM 若恰好落在 ZMQ 处理内部命令（对端连上、断开）的间隙里，阻塞的接收
#: 不会被打断，Python 的信号处理函数要等下一条消息才跑——可能永远等不来。
#: en: The longest (seconds) an idle wait lasts before coming back to Python: a SIGTERM that lands while ZMQ processes its
#: en: internal commands (a peer connecting or leaving) does not interrupt the blocking receive, and the Python signal
#: en: handler would wait for the next message — which may never come.
IDLE_WAKE_S = 0.5

# ----------------------------------------------------------------------------- 分词（给定）
# en: ----------------------------------------------------------------------------- tokenizing (given)


class TokenizeManager:
    """把 :class:`TokenizeMsg` 的提示词变成 token id（给定，不是任务）。

    en: Turns the prompt of a :class:`TokenizeMsg` into token ids (given, not a task).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)

    def tokenize(self, prompt: Any) -> list[int]:
        """文本 → ``encode(..., add_special_tokens=False)``；对话消息 → 分词器的对话模板（加上让模型开始回答的提示）；
        token id 列表 → 原样。看不懂的类型抛 TypeError（说明原因，回给客户端）；token 由
        :func:`~minisgl.validation.check_prompt` 检查。

        en: text → ``encode(..., add_special_tokens=False)``; chat messages → the tokenizer's chat template (with the
        prompt that makes the model start its answer); a list of token ids → as it is. A type it cannot read raises
        TypeError (saying why; it goes back to the client); the tokens are checked by
        :func:`~minisgl.validation.check_prompt`.
        """
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
            ids = list(self.tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True,
                                                          return_dict=False))
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = [int(t) for t in prompt]
        else:
            raise TypeError(tr("The prompt must be a string, a list of chat messages or a list of token ids, got {type}",
                               type=type(prompt).__name__))
        return ids


# ----------------------------------------------------------------------------- 增量反分词
# en: ----------------------------------------------------------------------------- incremental detokenization


@dataclass
class DecodeStatus:
    """一个请求的反分词状态。

    ``ids`` 是到目前为止收到的输出 token。``ids[:read_offset]`` 的文字已经确定（都在 ``text`` 里）；解码新 token 时，
    从 ``prefix_offset`` 起多解码几个已确定的 token 当上下文（有的分词器单独解码一段后缀时，开头的空格会变样），
    再减去这段上下文自己的文字。``text[:sent]`` 已经发给 API 服务器；``text[sent:]`` 是因停止字符串而扣住的部分。

    en: One request's detokenization state.

    ``ids`` are the output tokens received so far. The text of ``ids[:read_offset]`` is settled (all of it is in
    ``text``); to decode new tokens, a few settled tokens from ``prefix_offset`` on are decoded along with them as
    context (some tokenizers change a leading space when a suffix is decoded alone), and the text of that context is
    then taken off. ``text[:sent]`` has been sent to the API server; ``text[sent:]`` is held back for the stop strings.
    """

    prompt_tokens: int
    stop: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    text: str = ""
    sent: int = 0
    #: 第 3.5 章：还没随文字发出去的对数概率（给定的 :func:`process_messages` 管它）
    #: en: chapter 3.5: log-probabilities not yet sent with a piece of text (the given :func:`process_messages` keeps it)
    logprobs: list[dict[str, Any]] = field(default_factory=list)


class DetokenizeManager:
    """所有请求的增量反分词：``uid → DecodeStatus``。

    en: Incremental detokenization of every request: ``uid → DecodeStatus``.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.decode_map: dict[int, DecodeStatus] = {}

    def add(self, uid: int, prompt_tokens: int, stop: list[str] | None = None) -> None:
        """分词时为请求建立状态（只在这里建）。空的停止字符串没有意义，去掉。

        en: Create a request's state when it is tokenized (the only place state is created). Empty stop strings mean
        nothing and are dropped.
        """
        self.decode_map[uid] = DecodeStatus(prompt_tokens=prompt_tokens, stop=[s for s in stop or [] if s])

    def pop(self, uid: int) -> DecodeStatus | None:
        """释放一个请求的状态（取消、被拒绝时）；没有就返回 None。

        en: Free a request's state (on abort or rejection); None if it has none.
        """
        return self.decode_map.pop(uid, None)

    def decode_new(self, s: DecodeStatus, finished: bool) -> None:
        """把 ``ids[read_offset:]`` 里能确定的新文字接到 ``s.text`` 后面。

        解码 ``ids[prefix_offset:]`` 和 ``ids[prefix_offset:read_offset]``，前者去掉后者的长度就是新文字。
        新文字以 U+FFFD 结尾（字符还没完整），就先不确定（什么也不改），下次连同新 token 一起再解码；
        否则确定它：``prefix_offset`` 移到 ``read_offset``，``read_offset`` 移到末尾。请求结束时（``finished``）
        没有下次了，剩下的无论如何都确定下来。

        en: Append the new text that ``ids[read_offset:]`` settles to ``s.text``.

        Decode ``ids[prefix_offset:]`` and ``ids[prefix_offset:read_offset]``; the first minus the length of the second
        is the new text. If it ends with U+FFFD (a character not complete yet), settle nothing (change nothing):
        next time it is decoded again together with the new tokens. Otherwise settle it:
        ``prefix_offset`` moves to ``read_offset`` and ``read_offset`` to the end. When the request finishes
        (``finished``) there is no next time, and whatever is left is settled regardless.
        """
        # >>> TASK incremental_decode: 把新到的 token 里已经能确定的文字接到 s.text 后面，并推进两个偏移。约定：这段新文字还以替换字符 U+FFFD 结尾（字符没完整）就什么也不改，等下一个 token 来了再说——请求已经结束时除外，那时剩下的无论如何都确定下来；解码新 token 时要带上前面几个已确定的 token 作上下文（SentencePiece 式的分词器单独解码一段后缀会丢掉开头的空格）；所有发出的段拼起来正好等于整段解码。给定：REPLACEMENT（U+FFFD）。
        # en: Append to s.text the settled part of the string of the newly arrived tokens, and advance both offsets. Contract: if that fresh part still ends with U+FFFD (a character not complete yet), change nothing and wait for the next token, unless the request has ended, when whatever is left is settled regardless; fresh tokens are decoded together with a few settled tokens before them (SentencePiece-style vocabularies lose a leading space when a suffix is decoded alone); all pieces sent, joined, equal decoding all tokens at once. Given: REPLACEMENT (U+FFFD).
        # hint1: 两个偏移：read_offset 之前的都已确定；从 prefix_offset 起的那几个已确定的 token 只当上下文，和新 token 一起解码之后，再把它们自己的文字去掉。扣住时一个偏移也不能动。
        # en1: Two offsets: everything before read_offset is settled;
        # en1: the settled tokens from prefix_offset on serve only as context, decoded along with the new ones, after which their own text is cut off.
        # en1: While holding back, neither offset moves.
        # hint2: 上下文 = self.tokenizer.decode(s.ids[s.prefix_offset:s.read_offset])；新文字 = decode(s.ids[s.prefix_offset:])[len(上下文):]；
        # hint2: not finished 且新文字以 REPLACEMENT 结尾 → 直接 return（什么也不改）；
        # hint2: 否则 s.text += 新文字，s.prefix_offset 移到 s.read_offset，s.read_offset 移到 len(s.ids)。
        # en2: context = self.tokenizer.decode(s.ids[s.prefix_offset:s.read_offset]); new = decode(s.ids[s.prefix_offset:])[len(context):];
        # en2: not finished and new ends with REPLACEMENT → just return (change nothing);
        # en2: otherwise s.text += new, s.prefix_offset moves to s.read_offset and s.read_offset to len(s.ids).
        context = self.tokenizer.decode(s.ids[s.prefix_offset:s.read_offset])
        new = self.tokenizer.decode(s.ids[s.prefix_offset:])[len(context):]
        if not finished and new.endswith(REPLACEMENT):
            return
        s.text += new
        s.prefix_offset, s.read_offset = s.read_offset, len(s.ids)
        # <<< TASK

    def apply_stop(self, s: DecodeStatus, finished: bool) -> tuple[str, bool]:
        """从还没发出的文字 ``s.text[s.sent:]`` 里取出这次能发的一段，返回 ``(这一段, 是否命中停止字符串)``。

        - 其中出现了某个停止字符串：取最早的那一处，只发它前面的部分，命中；
        - 否则，末尾若是某个停止字符串的开头（可能正要匹配上），扣住末尾这一段（取最长的），其余发出；
          请求已经结束（``finished``）就不再扣，全部发出。

        en: Take the piece that can be sent now out of the text not sent yet, ``s.text[s.sent:]``, and return
        ``(the piece, whether a stop string was hit)``.

        - if a stop string occurs in it: take the earliest occurrence, send only what comes before it, a hit;
        - otherwise, if its end is the beginning of a stop string (it may be about to match), hold back that end (the
          longest such), send the rest; if the request has finished (``finished``) hold nothing back and send it all.
        """
        # >>> TASK stop_strings: 从还没发出的文字里取出这次能发的一段，返回 (这一段, 是否命中停止字符串)。约定：其中出现了停止字符串就取最早的一处，只返回它前面的部分，算命中（请求就此结束）；否则末尾若可能是某个停止字符串的开头，就扣住最长的那一截，其余发出，s.sent 跟着记下发出了多少；请求已结束（finished）时什么也不扣。停止字符串可能跨好几个 token 才凑齐。给定：s.sent、s.stop（已去掉空串）。
        # en: Return (what can be sent now, whether a stop string matched), taken from the string not sent yet. Contract: if a stop string occurs in it, take the earliest occurrence and return only what comes before it, a match (the request ends there); otherwise, if its end could be the start of some stop string, hold back the longest such end and send the rest, with s.sent counting what went out; once finished, hold nothing back. A stop string may take several tokens to complete. Given: s.sent, s.stop (empty strings already dropped).
        # hint1: 先找完整的匹配，再找部分匹配：两者可能同时存在，完整的优先；部分匹配从最长的末尾试起，第一个对得上的就是要扣住的。
        # en1: Look for full matches before partial ones: both may be present, and a full one wins;
        # en1: try partial matches from the longest end down, and the first that fits is what to hold back.
        # hint2: pending = s.text[s.sent:]；对每个停止字符串 pending.find(它)，取 ≥ 0 里最小的 i → 返回 (pending[:i], True)；
        # hint2: 否则 keep = 0；没结束时 k 从 len(pending) 往下到 1，第一个使某个 stop.startswith(pending[-k:]) 的 k 就是 keep；
        # hint2: piece = pending[:len(pending) - keep]；s.sent += len(piece)；返回 (piece, False)。
        # en2: pending = s.text[s.sent:]; pending.find(each stop string), the smallest i ≥ 0 → return (pending[:i], True);
        # en2: otherwise keep = 0; unless finished, k from len(pending) down to 1: the first k for which some stop.startswith(pending[-k:]) is keep;
        # en2: piece = pending[:len(pending) - keep]; s.sent += len(piece); return (piece, False).
        pending = s.text[s.sent:]
        hits = [i for i in (pending.find(stop) for stop in s.stop) if i >= 0]
        if hits:
            return pending[:min(hits)], True
        keep = 0
        if not finished:
            for k in range(len(pending), 0, -1):
                if any(stop.startswith(pending[-k:]) for stop in s.stop):
                    keep = k
                    break
        piece = pending[:len(pending) - keep]
        s.sent += len(piece)
        return piece, False
        # <<< TASK

    def detokenize(self, msg: DetokenizeMsg) -> UserReply | None:
        """处理调度器的一条 :class:`DetokenizeMsg`，返回给 API 服务器的回复；没有状态的请求返回 None。

        ``next_token`` 是一个输出 token；请求因 EOS 结束（``finish_reason`` 为 ``"stop"``）的那条消息里它是 -1，不是 EOS 的 id
        （EOS 不是输出）：不解码、不计数。结束（调度器说结束了，或命中了停止字符串）时回复带上 ``finished``、
        ``finish_reason`` 和 token 计数，并释放状态；``completion_tokens`` 是收到的输出 token 数。

        en: Handle one :class:`DetokenizeMsg` from the scheduler and return the reply for the API server; None for a
        request with no state.

        ``next_token`` is an output token; in the message of a request that ends on EOS (``finish_reason`` ``"stop"``) it is
        -1, not the id of EOS (EOS is not output): it is neither decoded nor counted. When the request finishes (the
        scheduler says so, or a stop string is hit) the reply carries ``finished``, ``finish_reason`` and the token counts,
        and the state is freed; ``completion_tokens`` is the number of output tokens received.
        """
        # >>> TASK detokenize: 处理调度器的一条消息，返回给 API 服务器的回复；没有状态的请求（已经结束的、从没建过的）返回 None，也不许为它建状态。约定：next_token 是一个输出 token，但因 EOS 结束（finish_reason 为 "stop"）的那条里它是 -1，不解码、不计数；调度器说结束了、或命中了停止字符串，请求就结束了——回复标明结束，带上 finish_reason（命中时为 "stop"，没结束时为 None）、提示词 token 数和收到的输出 token 数，并释放状态。给定：decode_new、apply_stop、self.decode_map。
        # en: Handle one message from the scheduler and return the reply for the API server; a request with no state (ended already, or never created) gives None, and no state may be created for it. Contract: next_token is an output token, except that the message of a request ending on EOS (finish_reason "stop") carries -1, which is neither decoded nor counted; the request ends when the scheduler says so or a stop string matches: then the reply says it is over and carries the finish_reason ("stop" on a match, None while not over), the prompt token count and the number of output tokens received, and the state is freed. Given: decode_new, apply_stop, self.decode_map.
        # hint1: 两个坑：EOS 那条的 -1 不能进 ids；命中停止字符串时调度器并没有说结束，也要当作结束（释放状态、finish_reason 写 "stop"）。
        # en1: Two pitfalls: the -1 of the EOS message must not go into ids;
        # en1: and a stop-string match ends the request although the scheduler did not say so (free the state, finish_reason "stop").
        # hint2: s = self.decode_map.get(msg.uid)，None → 返回 None；msg.finish_reason 不是 "stop" → s.ids.append(msg.next_token)；
        # hint2: self.decode_new(s, msg.finished)；piece, hit = self.apply_stop(s, msg.finished)；
        # hint2: finished = msg.finished or hit；reason = "stop" if hit else msg.finish_reason；finished 就 del self.decode_map[msg.uid]；
        # hint2: 返回 UserReply(msg.uid, piece, finished, 结束时是 reason、否则 None, s.prompt_tokens, len(s.ids))。
        # en2: s = self.decode_map.get(msg.uid), None → return None; msg.finish_reason is not "stop" → s.ids.append(msg.next_token);
        # en2: self.decode_new(s, msg.finished); piece, hit = self.apply_stop(s, msg.finished);
        # en2: finished = msg.finished or hit; reason = "stop" if hit else msg.finish_reason; if finished, del self.decode_map[msg.uid];
        # en2: return UserReply(msg.uid, piece, finished, reason when finished else None, s.prompt_tokens, len(s.ids)).
        s = self.decode_map.get(msg.uid)
        if s is None:
            return None
        if msg.finish_reason != "stop":
            s.ids.append(msg.next_token)
        self.decode_new(s, msg.finished)
        piece, hit = self.apply_stop(s, msg.finished)
        finished = msg.finished or hit
        reason = "stop" if hit else msg.finish_reason
        if finished:
            del self.decode_map[msg.uid]
        return UserReply(msg.uid, piece, finished, reason if finished else None, s.prompt_tokens, len(s.ids))
        # <<< TASK


# ----------------------------------------------------------------------------- 分词进程（给定）
# en: ----------------------------------------------------------------------------- the tokenizer process (given)


#: 报给客户端的最小对数概率：-inf（被屏蔽的 token）写不进 JSON。
#: en: The smallest log-probability reported to a client: -inf (a masked token) cannot be written in JSON.
LOGPROB_FLOOR = -9999.0


def logprob_entry(tokenizer: Any, token: int, logprobs: list[Any], text_offset: int) -> dict[str, Any]:
    """一个 token 的对数概率（:class:`~minisgl.sampling.TokenLogprob` 的线上形式）→ OpenAI 对话接口里的一项：
    token 的文字、UTF-8 字节、对数概率和 ``top_logprobs``，外加补全接口要的 ``text_offset``（它在输出文字里的位置，
    按已经确定的文字算；给定）。

    en: One token's log-probabilities (the wire form of :class:`~minisgl.sampling.TokenLogprob`) → one entry of OpenAI's
    chat API: the token's text, its UTF-8 bytes, its log-probability and ``top_logprobs``, plus the ``text_offset`` the
    completions API wants (its place in the output text, counted over the text settled so far; given).
    """
    def one(tid: int, lp: float) -> dict[str, Any]:
        text = tokenizer.decode([tid])
        return {"token": text, "logprob": max(float(lp), LOGPROB_FLOOR), "bytes": list(text.encode("utf-8"))}

    chosen, top_ids, top_logprobs = logprobs
    return {**one(token, chosen), "top_logprobs": [one(t, lp) for t, lp in zip(top_ids, top_logprobs)],
            "text_offset": text_offset}


def process_messages(msgs: list[Message], tokenize_manager: TokenizeManager, detokenize_manager: DetokenizeManager,
                     ) -> tuple[list[BaseBackendMsg], list[BaseFrontendMsg]]:
    """处理一轮收到的消息（按到达顺序），返回 ``(给调度器的, 给 API 服务器的)``（给定，不是任务）。

    - :class:`TokenizeMsg` → 分词，按 :func:`~minisgl.validation.check_prompt` 检查 token 和长度（没给的
      ``max_tokens`` 在这里定下），建状态，:class:`UserMsg` 给调度器（调度器不再查）；分不了词或通不过检查（类型不对、
      空提示词、太长……）直接回复错误；
    - :class:`AbortMsg` → 释放状态，:class:`AbortBackendMsg` 给调度器，回复 ``finish_reason="abort"``；
    - :class:`DetokenizeMsg` → :meth:`DetokenizeManager.detokenize`；命中停止字符串而调度器还没结束它，
      就给调度器发 :class:`AbortBackendMsg`，页面马上归还；
    - :class:`RejectMsg` → 释放状态，回复错误（被拒绝的请求一定有回音）。

    en: Handle one turn's messages (in arrival order) and return ``(for the scheduler, for the API server)`` (given,
    not a task).

    - :class:`TokenizeMsg` → tokenize, check the tokens and the length with :func:`~minisgl.validation.check_prompt`
      (an absent ``max_tokens`` is settled here), create the state, a :class:`UserMsg` for the scheduler (which checks
      nothing again); if it cannot be tokenized or fails the check (a wrong type, an empty prompt, too long, ...) reply
      with the error at once;
    - :class:`AbortMsg` → free the state, an :class:`AbortBackendMsg` for the scheduler, a reply with
      ``finish_reason="abort"``;
    - :class:`DetokenizeMsg` → :meth:`DetokenizeManager.detokenize`; if a stop string was hit while the scheduler has
      not finished the request, send the scheduler an :class:`AbortBackendMsg` so the pages come back at once;
    - :class:`RejectMsg` → free the state, reply with the error (a refused request always gets an answer).
    """
    backend: list[BaseBackendMsg] = []
    frontend: list[BaseFrontendMsg] = []
    for msg in msgs:
        if isinstance(msg, DetokenizeMsg):
            s = detokenize_manager.decode_map.get(msg.uid)
            if s is not None and msg.logprobs is not None:
                s.logprobs.append(logprob_entry(detokenize_manager.tokenizer, msg.next_token, msg.logprobs, len(s.text)))
            reply = detokenize_manager.detokenize(msg)
            if reply is None:
                continue
            if s is not None and s.logprobs:
                reply.logprobs, s.logprobs = s.logprobs, []
            frontend.append(reply)
            if reply.finished and not msg.finished:
                backend.append(AbortBackendMsg(msg.uid))
        elif isinstance(msg, TokenizeMsg):
            try:
                ids = tokenize_manager.tokenize(msg.prompt)
                sp = check_prompt(ids, msg.sampling_params, tokenize_manager.vocab_size, msg.max_seq_len)
            except (TypeError, ValueError) as e:
                frontend.append(UserReply(msg.uid, "", finished=True, error=str(e), code=getattr(e, "code", None)))
                continue
            detokenize_manager.add(msg.uid, len(ids), msg.stop)
            backend.append(UserMsg(msg.uid, torch.tensor(ids, dtype=torch.int32), sp))
        elif isinstance(msg, AbortMsg):
            s = detokenize_manager.pop(msg.uid)
            backend.append(AbortBackendMsg(msg.uid))
            if s is not None:
                frontend.append(UserReply(msg.uid, "", finished=True, finish_reason="abort", prompt_tokens=s.prompt_tokens,
                                          completion_tokens=len(s.ids)))
        elif isinstance(msg, RejectMsg):
            s = detokenize_manager.pop(msg.uid)
            if s is not None:
                frontend.append(UserReply(msg.uid, "", finished=True, prompt_tokens=s.prompt_tokens, error=msg.error,
                                          code=msg.code))
        else:
            raise TypeError(tr("The tokenizer process got a message it does not handle: {type}", type=type(msg).__name__))
    return backend, frontend


#: 收到过 SIGTERM / SIGINT
#: en: a SIGTERM / SIGINT came
_stop_requested = threading.Event()
#: 正在收尾：信号不再打断它
#: en: winding down: signals no longer interrupt it
_winding_down = threading.Event()


class _Stop(Exception):
    """SIGTERM / SIGINT：离开主循环。

    en: SIGTERM / SIGINT: leave the main loop.
    """


def _raise_stop(signum: int, frame: Any) -> None:
    """SIGTERM / SIGINT：记下来，并抛 :class:`_Stop`（收尾开始之后不再抛）。信号可能正好落在一个 ``__del__`` 里
    （例如加载分词器时的垃圾回收），那里抛出的异常被 Python 吞掉；所以主循环每一轮还看一眼记下的标志。

    en: SIGTERM / SIGINT: note it and raise :class:`_Stop` (not once winding down has begun). A signal may land inside a
    ``__del__`` (say, garbage collection while the tokenizer loads), where Python swallows the exception; so the main
    loop also looks at the noted flag every turn.
    """
    _stop_requested.set()
    if not _winding_down.is_set():
        raise _Stop


def tokenize_worker(args: ServerArgs, addrs: ServerAddrs, ready: Connection) -> None:
    """分词 / 反分词进程的入口（给定，不是任务）。

    绑定自己的 PULL 套接字、连上调度器和 API 服务器，经 ``ready`` 报告 ``("ready", {})``（起不来就报
    ``("error", 原因)`` 并以非零状态退出）。之后每一轮：等到至少一条消息，再把已经到了的都收下，一起处理，
    给调度器和 API 服务器各发一条（批量）消息。启动之后，SIGTERM / SIGINT 让它干净地退出（启动期间 SIGTERM 立刻结束它，
    SIGINT 留给启动器）：套接字以 linger 0 关闭；空闲时每
    :data:`IDLE_WAKE_S` 秒回到 Python 一次，信号不会丢。

    en: The entry point of the tokenizer / detokenizer process (given, not a task).

    It binds its PULL socket, connects to the scheduler and the API server, and reports ``("ready", {})`` through
    ``ready`` (or ``("error", reason)`` and a non-zero exit when it cannot start). Then each turn: wait for at least one
    message, take all that have arrived, handle them together, and send one (batch) message to the scheduler and one
    to the API server. Once started, SIGTERM / SIGINT make it exit cleanly (while starting, SIGTERM ends it at once
    and SIGINT is left to the launcher): the sockets close with linger 0; an idle wait comes back to
    Python every :data:`IDLE_WAKE_S` seconds, so no signal is lost.
    """
    set_process_name("msgl-tokenizer")
    # 启动期间（加载分词器、连套接字）没什么要收尾：SIGTERM 照默认立刻结束进程，终端的 Ctrl-C 交给启动器（它随后发
    # SIGTERM）。这段时间里垃圾回收很多，信号抛出的异常常落在 __del__ 里被吞掉。
    # en: While starting (loading the tokenizer, connecting sockets) there is nothing to wind down: SIGTERM ends the
    # en: process at once by default, and the terminal's Ctrl-C is left to the launcher (which sends SIGTERM next).
    # en: Garbage collection is busy then, and an exception raised by a signal often lands in a __del__ and is swallowed.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    queues: list[ZmqPullQueue | ZmqPushQueue] = []
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(args.model_path)
            recv = ZmqPullQueue(addrs.tokenizer, create=True)
            queues.append(recv)
            send_backend = ZmqPushQueue(addrs.backend, create=False)
            queues.append(send_backend)
            send_frontend = ZmqPushQueue(addrs.frontend, create=False)
            queues.append(send_frontend)
        except Exception as e:  # noqa: BLE001 - 任何原因都报给启动器 | en: any cause is reported to the launcher
            ready.send(("error", tr("The tokenizer process cannot start: {error}", error=f"{type(e).__name__}: {e}")))
            sys.exit(1)
        tokenize_manager = TokenizeManager(tokenizer)
        detokenize_manager = DetokenizeManager(tokenizer)
        signal.signal(signal.SIGTERM, _raise_stop)
        signal.signal(signal.SIGINT, _raise_stop)
        ready.send(("ready", {}))
        while not _stop_requested.is_set():
            if (first := recv.get(timeout=IDLE_WAKE_S)) is None:
                continue
            msgs = unwrap(first)
            while len(msgs) < MAX_DRAIN and (more := recv.get_nowait()) is not None:
                msgs += unwrap(more)
            backend, frontend = process_messages(msgs, tokenize_manager, detokenize_manager)
            if backend:
                send_backend.put(backend[0] if len(backend) == 1 else BatchBackendMsg(backend))
            if frontend:
                send_frontend.put(frontend[0] if len(frontend) == 1 else BatchFrontendMsg(frontend))
    except _Stop:
        pass
    finally:
        _winding_down.set()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for queue in queues:
            queue.close()
        zmq.Context.instance().term()  # 套接字都关了，term 立刻返回 | en: every socket is closed, so term returns at once
