# %% [markdown] tags=["lang-zh"]
# # 第 3.2 章 tokenizer：分词进程与增量反分词
#
# 调度器只认 token id；文字和 token 之间的转换在一个单独的进程里做：
#
# - **分词**（给定）：纯文本、对话消息（套用分词器自带的对话模板）或现成的 token id；
# - **增量反分词**（本章的任务）：调度器每一步给每个请求一个新 token，API 服务器要的是一段段**新的、完整的**文字；
#   一个字符跨好几个 token 时，解码到一半是乱码 `�`，要先扣住；
# - **停止字符串**（本章的任务）：文字里出现 `stop` 里的字符串就在它前面截断、结束请求，并让调度器马上取消它。

# %% [markdown] tags=["lang-en"]
# # Chapter 3.2 tokenizer: the tokenizer process and incremental detokenization
#
# The scheduler only knows token ids; turning text into tokens and back happens in a process of its own:
#
# - **tokenizing** (given): plain text, chat messages (through the tokenizer's own chat template) or ready token ids;
# - **incremental detokenization** (this chapter's task): each step the scheduler sends one new token per request, and
#   the API server wants pieces of **new, complete** text; when a character spans several tokens, decoding it halfway
#   gives the garbage `�`, which must be held back;
# - **stop strings** (this chapter's task): when a string from `stop` shows up in the text, cut the text before it,
#   finish the request and have the scheduler abort it at once.

# %%
# 准备：找到仓库根目录（保证导入的是这个仓库里的 minisgl）、关掉进度条、固定随机种子、配好画图
# en: Setup: import this repository's minisgl, no progress bars, fixed random seeds, plotting
import sys
from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "minisgl" / "course").is_dir())
sys.path.insert(0, str(ROOT))
from minisgl.i18n import tr
from minisgl.notebook import setup_notebook

setup_notebook()

# %%
# NBVAL_IGNORE_OUTPUT
# 本章的任务（和 stage3/tokenizer.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage3/tokenizer.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("tokenizer")

# %% [markdown] tags=["lang-zh"]
# ## 1. 三种提示词
#
# 用小 Qwen3 的分词器（真实的 Qwen3 分词器）。纯文本不额外加特殊 token（和 `LLM.generate` 一样）；对话消息套用
# 分词器自带的对话模板，并加上让模型开始回答的那一行；token id 原样使用。

# %% [markdown] tags=["lang-en"]
# ## 1. Three kinds of prompt
#
# We use the tiny Qwen3's tokenizer (the real Qwen3 tokenizer). Plain text gets no extra special tokens (as in
# `LLM.generate`); chat messages go through the tokenizer's own chat template, plus the line that makes the model start
# its answer; token ids are used as they are.

# %%
from transformers import AutoTokenizer

from minisgl.model_zoo import tiny_qwen3
from minisgl.tokenizer import TokenizeManager

tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3())
tm = TokenizeManager(tokenizer)
for prompt in ("The capital of France is", [{"role": "user", "content": "Hi"}], [9707, 1879]):
    ids = tm.tokenize(prompt)
    print(tr("{n} tokens: {ids} → {text!r}", n=len(ids), ids=ids, text=tokenizer.decode(ids)))

# %% [markdown] tags=["lang-zh"]
# ## 2. 一个 token 一个 token 地反分词
#
# 字节级的分词器里，常用的字和词各是一个 token，少见的字符（比如很多 emoji）拆成好几个字节 token。
# 单独解码其中一个字节，得到的是 `�`。`DetokenizeManager` 把这样的尾巴扣住，字符完整了才一次发出：

# %% [markdown] tags=["lang-en"]
# ## 2. Detokenizing one token at a time
#
# In a byte-level tokenizer, common words are a token each, while rarer characters (many emoji, say) are split into
# several byte tokens. Decoding one of those bytes alone gives `�`. `DetokenizeManager` holds such a tail back and sends
# the character in one go once it is complete:

# %%
from minisgl.i18n import lang
from minisgl.message import DetokenizeMsg
from minisgl.tokenizer import DetokenizeManager

SENTENCE = "今天天气很好，我们去公园散步 🦜" if lang() == "zh" else "Nice weather today, let's go for a walk 🦜"


def detokenize_table(text: str, stop: str = "") -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    manager = DetokenizeManager(tokenizer)
    manager.add(uid=0, prompt_tokens=0, stop=[stop] if stop else [])
    print(f"{'#':>4} {'token':>8}  {tr('alone'):<14} {tr('piece sent')}")
    pieces = []
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        reply = manager.detokenize(DetokenizeMsg(0, token, last, "length" if last else None))
        if reply is None:
            print(tr("{i:>4} {token:>8}  {alone:<14} (no reply: the request has finished)", i=i, token=token, alone=repr(tokenizer.decode([token]))))
            continue
        pieces.append(reply.incremental_output)
        end = tr("  ← finished: {reason}", reason=reply.finish_reason) if reply.finished else ""
        print(f"{i:>4} {token:>8}  {tokenizer.decode([token])!r:<14} {reply.incremental_output!r}{end}")
    print(tr("joined: {joined!r}", joined="".join(pieces)))
    full = tokenizer.decode(ids)
    if stop and stop in full:
        print(tr("the same as the full decode cut before the stop string: {same}", same="".join(pieces) == full[:full.find(stop)]))
    else:
        print(tr("the same as decoding every token at once: {same}", same="".join(pieces) == full))


detokenize_table(SENTENCE)

# %% [markdown] tags=["lang-zh"]
# emoji 🦜 的 3 个字节 token 单独解码都是 `�`：前两个没有发出任何文字，第三个到了才把整个 🦜 发出去。
# 所有段拼起来正好是整段解码，任何一段里都没有 `�`。
#
# 为什么不直接解码新 token、而要从 `prefix_offset` 起连同前面几个 token 一起解码再减去前面的文字？有的分词器
# （Llama、Mistral 这类 SentencePiece 式的）单独解码一段时会去掉开头的空格：`decode([▁world])` 是 `world`，
# 可它在句子中间其实是 ` world`。带上前文一起解码就不会丢。

# %% [markdown] tags=["lang-en"]
# Each of the 3 byte tokens of the emoji 🦜 decodes alone to `�`: the first two send no text at all, and only the third
# sends the whole 🦜. All the pieces joined are exactly the full decode, and no piece holds a `�`.
#
# Why not simply decode the new token, rather than decoding from `prefix_offset` on, together with a few tokens before
# it, and taking off their text? Some tokenizers (SentencePiece-style ones such as Llama's and Mistral's) drop the
# leading space when a piece is decoded alone: `decode([▁world])` is `world`, yet in the middle of a sentence it is
# ` world`. Decoding it together with what came before keeps the space.

# %% [markdown] tags=["lang-zh"]
# ## 3. 停止字符串
#
# 停止字符串可能跨好几个 token 才凑齐，所以末尾**可能正要匹配上**的那一段先扣住；后文对不上再放出来，
# 匹配上了就在它前面截断，以 `finish_reason="stop"` 结束（分词进程同时让调度器取消这个请求，之后那个请求的消息
# 不再有回复）：

# %% [markdown] tags=["lang-en"]
# ## 3. Stop strings
#
# A stop string may take several tokens to complete, so the end of the text that **may be about to match** is held
# back first; if what follows does not match it is released, and if it matches the text is cut right before it and the
# request finishes with `finish_reason="stop"` (the tokenizer process also has the scheduler abort the request; later
# messages for that request get no reply):

# %%
detokenize_table("Nice weather today, let's go for a walk, lets see.", stop=", lets")

# %% [markdown] tags=["lang-zh"]
# 第一个 `,` 可能是 `, lets` 的开头，先扣住；下一个 token 是 ` let`，仍然可能，继续扣；`'s` 对不上了，
# 扣住的 `, let's` 一起放出。第二次 `, lets` 凑齐了：在它前面截断，请求结束，后面的 token 不再有回复。

# %% [markdown] tags=["lang-en"]
# The first `,` may begin `, lets`, so it is held back; the next token, ` let`, still may, so it stays held; `'s` does
# not match, and the held `, let's` is released at once. The second time, `, lets` is complete: the text is cut before
# it, the request finishes, and later tokens get no reply.

# %% [markdown] tags=["lang-zh"]
# ## 4. 动手调：你自己的句子和停止字符串
#
# 试试汉字、emoji、带重音的字母，或者一个要跨好几个 token 才凑齐的停止字符串。

# %% [markdown] tags=["lang-en"]
# ## 4. Try it: your own sentence and stop string
#
# Try Chinese, emoji, accented letters, or a stop string that takes several tokens to complete.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

explorer = Explorer(
    detokenize_table,
    title=tr("Detokenizing token by token"),
    text=widgets.Text(value=SENTENCE, description=tr("text")),
    stop=widgets.Text(value="", description="stop"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (checks it without a browser)
explorer.run(text="naïve café ☕ 🫠 ok", stop="ok")

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 重叠调度下，一个请求遇到 EOS 之后，调度器还会为它多发一条 `DetokenizeMsg`。反分词进程应该怎么处理？
#
# <details><summary>答案</summary>
#
# 什么也不做：状态在结束时已经释放，这条消息既不新建状态，也不产生回复。若是见到没见过的 uid 就新建状态，
# 每个请求都会漏下一份永远不释放的状态。
# </details>
#
# 2. 停止字符串命中后，为什么还要给调度器发 `AbortBackendMsg`？
#
# <details><summary>答案</summary>
#
# 调度器不知道停止字符串（它只看 token），会一直生成到 `max_tokens`，白占着请求槽和 KV 页。
# 取消让这些资源马上回来，给别的请求用。
# </details>
#
# 3. 请求以 `"length"` 结束时，末尾还扣着半个字符或半个停止字符串，怎么办？
#
# <details><summary>答案</summary>
#
# 全部放出：不会再有后文了。所以所有段拼起来总是等于整段解码（停止字符串命中时则等于截断后的文字）。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. With overlap scheduling, after a request hits EOS the scheduler still sends one more `DetokenizeMsg` for it. What
#    should the detokenizer do with it?
#
# <details><summary>Answer</summary>
#
# Nothing: the state was freed at the finish, and this message neither creates state nor produces a reply. Creating
# state for any uid it has not seen would leak one state per request that is never freed.
# </details>
#
# 2. After a stop string is hit, why send the scheduler an `AbortBackendMsg` as well?
#
# <details><summary>Answer</summary>
#
# The scheduler knows nothing of stop strings (it only sees tokens) and would keep generating up to `max_tokens`,
# holding a request slot and KV pages for nothing. The abort brings them back at once for other requests.
# </details>
#
# 3. A request finishes with `"length"` while half a character or half a stop string is still held back. What then?
#
# <details><summary>Answer</summary>
#
# Release it all: no more text will follow. That is why the pieces always join to the full decode (or, when a stop
# string is hit, to the text cut before it).
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage3/tokenizer.py` 里的任务后运行下面这一格（`python -m minisgl.course check tokenizer`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage3/tokenizer.py`, run the cell below (`python -m minisgl.course check tokenizer`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("tokenizer")
