"""一个请求里的几个 choice（给定）：OpenAI 的 ``n`` 和 ``/v1/completions`` 的提示词列表。每个 choice 是一个单独的请求，
各自由第 3.4 章学员写的函数作答；这里把它们提交、合并，出错时全部取消。

给定模块不导入章节：学员写的 ``until_disconnect`` / ``stream_chunks`` 作为参数传进来。

en: The several choices of one request (given): OpenAI's ``n`` and the prompt lists of ``/v1/completions``. Each choice
is a request of its own, answered by the functions chapter 3.4's learner writes; here they are submitted, merged, and
all aborted on a failure.

Given modules do not import chapters: the learner's ``until_disconnect`` / ``stream_chunks`` come in as parameters.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from fastapi import Request

from minisgl.server.api_errors import ApiError
from minisgl.message import UserReply
from minisgl.server.openai_reply import DONE, Answerable, response_id, sse, usage_of

R = TypeVar("R", bound="Choices")


class Choices(Answerable, Protocol):
    """合并几个 choice 时从 ``ParsedRequest`` 里读的那几项。

    en: The fields of ``ParsedRequest`` read when merging several choices.
    """

    prompt: Any
    prompts: list[Any]
    n: int
    echo: bool
    include_usage: bool


class Server(Protocol):
    """给定代码用到的 API 服务器状态：登记和回复来自 :class:`~minisgl.server.frontend.Frontend`，``abort`` 来自第 3.4 章。

    en: The API server state given code uses: registering and replies come from :class:`~minisgl.server.frontend.Frontend`,
    ``abort`` from chapter 3.4.
    """

    dead: str | None

    async def submit(self, req: Any) -> tuple[int, asyncio.Queue[UserReply]]: ...

    def replies(self, queue: asyncio.Queue[UserReply], first: UserReply | None = None) -> AsyncIterator[UserReply]: ...

    async def abort(self, uid: int) -> None: ...


#: 学员写的 ``until_disconnect(request, state, uid, work)``。
#: en: The learner's ``until_disconnect(request, state, uid, work)``.
UntilDisconnect = Callable[[Request, Any, int, Awaitable[Any]], Awaitable[Any]]
#: 学员写的 ``stream_chunks(req, uid, replies, index)``。
#: en: The learner's ``stream_chunks(req, uid, replies, index)``.
StreamChunks = Callable[..., AsyncIterator[str]]


def choice_requests(req: R) -> list[R]:
    """一个 choice 一个请求：每个提示词 ``n`` 份，第 ``k`` 份的 choice 序号是 ``提示词序号 * n + k``；给了种子时
    第 ``k`` 份用 ``seed + k``（各有各的随机数）。

    en: One request per choice: each prompt ``n`` times, sample ``k`` of a prompt being choice number ``prompt index * n +
    k``; with a seed, sample ``k`` uses ``seed + k`` (a random stream of its own).
    """
    out = []
    for prompt in req.prompts or [req.prompt]:
        for k in range(req.n):
            sp = req.sampling_params
            if k and sp.seed is not None:
                sp = replace(sp, seed=(sp.seed + k) % 2**64)
            out.append(replace(req, prompt=prompt, prompts=[], n=1, sampling_params=sp))  # type: ignore[type-var]
    return out


async def open_choices(request: Request, state: Server, req: Choices, uids: list[int], until_disconnect: UntilDisconnect,
                       ) -> list[AsyncIterator[UserReply]]:
    """提交每个 choice，等到每个的第一条回复（被拒绝的这时还能回 400），按 choice 的顺序返回它们的回复；提交了的 uid
    记进 ``uids``（出错时调用者全部取消）。

    每个提示词的第一份先提交，其余几份等它的第一条回复到了再提交：那时它的提示词已经进了 Radix 前缀缓存
    （第 2.3 章），其余几份只需预填充最后一个 token——提示词只算一遍。

    en: Submit every choice, wait for each one's first reply (a refused one can still get a 400 then), and return their
    replies in choice order; the uids submitted go into ``uids`` (on an error the caller aborts them all).

    The first sample of each prompt is submitted first, the others once its first reply is there: by then its prompt is
    in the radix prefix cache (chapter 2.3) and the others prefill only the last token: the prompt is computed once.
    """
    subs = choice_requests(req)
    opened: dict[int, AsyncIterator[UserReply]] = {}

    async def open_group(group: list[int]) -> None:
        # 一组一起提交（同一步里预填充），再等每个的第一条回复
        # en: a group is submitted together (prefilled in the same step), then each one's first reply is awaited
        submitted = []
        for k in group:
            uid, queue = await state.submit(subs[k])
            uids.append(uid)
            submitted.append((k, uid, queue))
        for k, uid, queue in submitted:
            first = await until_disconnect(request, state, uid, queue.get())
            if first.error:
                raise ApiError(503 if state.dead else 400, first.error, code=first.code)
            opened[k] = state.replies(queue, first)

    leaders = list(range(0, len(subs), req.n))
    await open_group(leaders)
    await open_group([k for k in range(len(subs)) if k not in leaders])
    return [opened[k] for k in range(len(subs))]


def merge_answers(req: Choices, answers: list[dict[str, Any]]) -> dict[str, Any]:
    """几个 choice 的非流式回答合成一个：``choices`` 按序号排好，``usage`` 相加（提示词每个只算一次）；``echo`` 时
    文字前面带上提示词。

    en: Merge the non-streamed answers of several choices into one: ``choices`` in order, ``usage`` summed (each prompt
    counted once); with ``echo`` the text starts with the prompt.
    """
    merged = dict(answers[0], choices=[])
    for k, answer in enumerate(answers):
        choice = dict(answer["choices"][0], index=k)
        if req.echo:
            choice["text"] = (req.prompts or [req.prompt])[k // req.n] + choice["text"]
        merged["choices"].append(choice)
    merged["usage"] = summed_usage(req, [a["usage"] for a in answers])
    return merged


def summed_usage(req: Choices, usages: list[dict[str, int]]) -> dict[str, int]:
    """几个 choice 的 ``usage`` 相加：生成的 token 全部相加，提示词每个只算一次（每个提示词的第一份）。

    en: Sum the ``usage`` of several choices: every choice's completion tokens, each prompt's tokens once (from its first
    sample).
    """
    prompt_tokens = sum(u["prompt_tokens"] for u in usages[::req.n])
    completion_tokens = sum(u["completion_tokens"] for u in usages)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


async def merge_streams(req: Choices, uid: int, streams: list[AsyncIterator[UserReply]], stream_chunks: StreamChunks,
                        ) -> AsyncIterator[str]:
    """几个 choice 的流合成一个（返回合好的 SSE 事件流）：每个 choice 的事件（``stream_chunks``，``index`` 是它的
    序号）来了就发，只在最后发一次（相加的）``usage`` 和 ``DONE``；``echo`` 时每个 choice 先发提示词。一个 choice 的
    流出错只结束它自己。只有一个 choice 时就是它自己的流。

    en: Merge the streams of several choices into one (returns the merged stream of SSE events): each choice's events
    (``stream_chunks``, ``index`` being its number) go out as they come, and the (summed) ``usage`` and ``DONE`` only
    once at the end; with ``echo`` each choice sends its prompt first. A choice whose stream fails ends only itself.
    With a single choice it is that choice's own stream.
    """
    single = len(streams) == 1 and not req.echo
    last: dict[int, UserReply] = {}

    async def tapped(k: int, replies: AsyncIterator[UserReply]) -> AsyncIterator[UserReply]:
        async for reply in replies:
            last[k] = reply
            yield reply

    sub = req if single else replace(req, include_usage=False)  # type: ignore[type-var]
    chunks = [stream_chunks(sub, uid, tapped(k, r), index=k) for k, r in enumerate(streams)]
    for c in chunks:
        if asyncio.iscoroutine(c):  # 骨架：还没写成生成器，这里就抛出它的 TaskNotDone | en: skeleton: not a generator yet, this raises its TaskNotDone
            await c
    if single:
        return chunks[0]
    return _merged(req, uid, chunks, last)


async def _merged(req: Choices, uid: int, chunks: list[AsyncIterator[str]], last: dict[int, UserReply],
                  ) -> AsyncIterator[str]:
    events: asyncio.Queue[str | None] = asyncio.Queue()
    prompts = req.prompts or [req.prompt]

    async def pump(k: int) -> None:
        try:
            if req.echo:
                await events.put(sse({"id": response_id(req, uid), "object": "text_completion", "created": req.created,
                                      "model": req.model, "choices": [{"index": k, "text": prompts[k // req.n],
                                                                       "finish_reason": None, "logprobs": None}]}))
            async for event in chunks[k]:
                if event != DONE:
                    await events.put(event)
        finally:
            await events.put(None)

    pumps = [asyncio.create_task(pump(k)) for k in range(len(chunks))]
    try:
        open_pumps = len(pumps)
        while open_pumps:
            event = await events.get()
            if event is None:
                open_pumps -= 1
            else:
                yield event
        for task in pumps:
            task.result()  # 流自己出的错在这里抛出 | en: a stream's own failure is raised here
    finally:
        for task in pumps:
            task.cancel()
    if req.include_usage and len(last) == len(chunks):
        usage = summed_usage(req, [usage_of(last[k]) for k in range(len(chunks))])
        yield sse({"id": response_id(req, uid), "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
                   "created": req.created, "model": req.model, "choices": [], "usage": usage})
    yield DONE


async def guarded(chunks: AsyncIterator[str], state: Server, uids: list[int]) -> AsyncIterator[str]:
    """包住流：生成器自己出了错，就取消请求，别让它们在后台白白跑下去。

    en: Wraps the stream: if the generator itself fails, abort the requests so they do not run on for nothing.
    """
    try:
        async for chunk in chunks:
            yield chunk
    except Exception:
        await abort_all(state, uids)
        raise


async def abort_all(state: Server, uids: list[int]) -> None:
    """取消 ``uids`` 里的每个请求（``state.abort``：答完了的什么也不做）。

    en: Abort every request in ``uids`` (``state.abort``: an answered one does nothing).
    """
    for uid in uids:
        await state.abort(uid)
