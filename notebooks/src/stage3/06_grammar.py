# %% [markdown] tags=["lang-zh"]
# # 第 3.6 章 grammar：结构化输出——语法约束与 token 位掩码
#
# 客户端要的常常不是一段话，而是一个能直接 `json.loads` 的对象、一个日期、`yes` 或 `no`。光靠提示词求模型“只回 JSON”，
# 小模型十次里总有几次多写一句。这一章让输出**一定**符合一个 JSON Schema、正则表达式或 EBNF 文法：每一步只让
# “接下来合法”的 token 参加抽样。
#
# - **语法匹配器**（xgrammar 的 `GrammarMatcher`，每个请求一个）记着输出走到了语法的哪里，每采到一个 token 推进一步；
# - **token 位掩码**：词表里每个 token 一位，1 = 下一步允许，一个 int32 装 32 个；匹配器填一行，采样器把 0 位的 logit
#   设成 -inf；
# - **词表只预处理一次**：哪些 token 能接在语法的哪里，要把每个 token 的字节和语法比一遍，xgrammar 把这件事做一次、
#   编译过的语法按文本缓存。
#
# 这个笔记本先手算一行位掩码、把你写的 `apply_bitmask` 和 xgrammar 自己的 `apply_token_bitmask_inplace` 对照，再让一个
# 匹配器走过一段 JSON、看每一步允许几个 token，最后在 SmolLM2 上用 `LLM.generate` 生成 JSON 和日期，并用 `jsonschema`
# 校验。

# %% [markdown] tags=["lang-en"]
# # Chapter 3.6 grammar: structured output — grammars and token bitmasks
#
# What a client wants is often not prose but an object that `json.loads` takes as it is, a date, `yes` or `no`. Asking a
# small model in the prompt to "reply with JSON only" fails a few times in ten: it adds a sentence. This chapter makes the
# output **certain** to follow a JSON Schema, a regular expression or an EBNF grammar: at each step only the tokens that
# are "valid next" take part in the draw.
#
# - a **grammar matcher** (xgrammar's `GrammarMatcher`, one per request) knows where in the grammar the output is, and
#   moves on one step for every sampled token;
# - a **token bitmask**: one bit per token of the vocabulary, 1 = allowed next, 32 tokens to an int32; the matcher fills
#   one row, and the sampler sets the logits of the 0 bits to -inf;
# - **the vocabulary is preprocessed once**: which tokens can follow where in a grammar needs every token's bytes
#   compared with the grammar; xgrammar does it once and caches compiled grammars by their text.
#
# This notebook first builds one row of a bitmask by hand and compares your `apply_bitmask` with xgrammar's own
# `apply_token_bitmask_inplace`, then walks a matcher through a piece of JSON to see how many tokens each step allows,
# and last generates JSON and a date with `LLM.generate` on SmolLM2, validated with `jsonschema`.

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
# 本章的任务（和 stage3/grammar.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage3/grammar.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("grammar")

# %% [markdown] tags=["lang-zh"]
# ## 1. 手算一行位掩码
#
# token `t` 的那一位是第 `t // 32` 个 int32 的第 `t % 32` 位（从最低位数起）。一个 40 个 token 的小词表要 2 个 int32，
# 第二个只用得上低 8 位。允许 token 0、3、31、32、39：
#
# - 第 0 个数：位 0、3、31 → `1 + 8 + 2³¹`。第 31 位是 int32 的**符号位**，所以这个数存下来是负的；
# - 第 1 个数：token 32 → 位 0，token 39 → 位 7 → `1 + 128 = 129`。
#
# 展开时右移 `t % 32` 位再和 1 按位与。负数的右移是**算术**右移，左边补的是 1，但和 1 与过之后只剩最低位，不受影响。

# %% [markdown] tags=["lang-en"]
# ## 1. One row of a bitmask by hand
#
# Token `t`'s bit is bit `t % 32` (counted from the lowest) of int32 number `t // 32`. A tiny vocabulary of 40 tokens
# takes 2 int32s, and only the low 8 bits of the second are used. Allow tokens 0, 3, 31, 32 and 39:
#
# - number 0: bits 0, 3, 31 → `1 + 8 + 2³¹`. Bit 31 is the int32's **sign bit**, so the number is stored as a negative;
# - number 1: token 32 → bit 0, token 39 → bit 7 → `1 + 128 = 129`.
#
# To unpack, shift right by `t % 32` and AND with 1. Shifting a negative number is an **arithmetic** shift that fills
# the left with ones, but after the AND with 1 only the lowest bit is left, so it does no harm.

# %%
import torch
import xgrammar as xgr

from minisgl.grammar import BITS, apply_bitmask

VOCAB = 40
ALLOWED = [0, 3, 31, 32, 39]
words = [0] * -(-VOCAB // BITS)
for t in ALLOWED:
    words[t // BITS] |= 1 << (t % BITS)
row = [w - 2**32 if w >= 2**31 else w for w in words]  # 无符号 → int32 | en: unsigned → int32
print(tr("allowed tokens {allowed}: as unsigned numbers {words}, as int32 {row}", allowed=ALLOWED, words=words, row=row))
word0 = torch.tensor(row[0], dtype=torch.int32)
print(tr("number 0 >> 31 = {shifted} (arithmetic shift: the sign fills the left); (number 0 >> 31) & 1 = {bit}",
         shifted=int(word0 >> 31), bit=int((word0 >> 31) & 1)))

# 两行位掩码：第 0 行给 logits 的第 2 行，第 1 行（只允许 token 5）给第 0 行；logits 的第 1 行不加掩码
# en: Two bitmask rows: row 0 belongs to row 2 of the logits, row 1 (token 5 only) to row 0; row 1 of the logits is not masked
bitmask = torch.tensor([row, [1 << 5, 0]], dtype=torch.int32)
logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
ours = apply_bitmask(logits.clone(), bitmask, [2, 0])
left = [torch.isfinite(r).nonzero().flatten().tolist() for r in ours]
print(tr("apply_bitmask: row 2 keeps tokens {a}, row 0 keeps {b}, row 1 (no mask) keeps {n} of {v}",
         a=left[2], b=left[0], n=len(left[1]), v=VOCAB))

# xgrammar 的位掩码按 logits 的行排（indices 说加哪几行）；本章的只为要加的行分配，第 k 行给 rows[k]
# en: xgrammar's bitmask is laid out by the rows of the logits (indices says which rows); this chapter's holds the masked rows only
full = torch.zeros(3, bitmask.shape[1], dtype=torch.int32)
full[[2, 0]] = bitmask
theirs = logits.clone()
xgr.apply_token_bitmask_inplace(theirs, full, indices=[2, 0])
print(tr("same -inf positions as xgrammar.apply_token_bitmask_inplace: {same}; the other logits untouched: {kept}",
         same=torch.equal(ours.isinf(), theirs.isinf()), kept=torch.equal(ours[~ours.isinf()], logits[~ours.isinf()])))

# %% [markdown] tags=["lang-zh"]
# ## 2. 匹配器一步步允许什么
#
# SmolLM2 的词表有 49152 个 token，一行位掩码是 1536 个 int32（6 KiB），而一行 float32 的 logits 有 192 KiB。下面先做
# 一次词表预处理（`TokenizerInfo`：把每个 token 还原成字节串）和语法编译（`GrammarCompiler`），再让匹配器走过一段
# 符合 Schema 的 JSON：每一步之前用 `fill_next_token_bitmask` 填一行，用你的 `apply_bitmask` 数一数还剩几个 token。
#
# JSON 按紧凑格式：逗号和冒号后面正好一个空格，别处没有空白（`any_whitespace=False`）。

# %% [markdown] tags=["lang-en"]
# ## 2. What a matcher allows, step by step
#
# SmolLM2's vocabulary has 49152 tokens, so one bitmask row is 1536 int32s (6 KiB), while one float32 row of logits is
# 192 KiB. Below, the vocabulary is preprocessed once (`TokenizerInfo`: every token back to its bytes) and the grammar
# compiled (`GrammarCompiler`); then a matcher walks through a piece of JSON that follows the schema: before each step
# `fill_next_token_bitmask` fills a row, and your `apply_bitmask` counts the tokens left.
#
# The JSON is compact: exactly one space after a comma or a colon, no whitespace elsewhere (`any_whitespace=False`).

# %%
import json
import time

from transformers import AutoTokenizer

from minisgl.model_zoo import smollm2
from minisgl.notebook import fmt_ms

tok = AutoTokenizer.from_pretrained(smollm2())
V = 49152
start = time.perf_counter()
info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=V, stop_token_ids=[tok.eos_token_id])
compiler = xgr.GrammarCompiler(info, max_threads=1)
prepared = time.perf_counter() - start

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
start = time.perf_counter()
compiled = compiler.compile_json_schema(json.dumps(PERSON), any_whitespace=False)
first = time.perf_counter() - start
start = time.perf_counter()
compiler.compile_json_schema(json.dumps(PERSON), any_whitespace=False)
again = time.perf_counter() - start
print(tr("vocabulary preprocessed in {a}; the schema compiled in {b}, and again (from the cache) in {c}",
         a=fmt_ms(prepared), b=fmt_ms(first), c=fmt_ms(again)))


def allowed_count(matcher: xgr.GrammarMatcher) -> tuple[int, torch.Tensor]:
    """匹配器下一步允许几个 token，和它们的 id（用 apply_bitmask 数）。

    en: How many tokens the matcher allows next, and their ids (counted with apply_bitmask).
    """
    bm = xgr.allocate_token_bitmask(1, V)
    matcher.fill_next_token_bitmask(bm, 0)
    ok = torch.isfinite(apply_bitmask(torch.zeros(1, V), bm, [0]))[0]
    return int(ok.sum()), ok.nonzero().flatten()


TEXT = '{"name": "Ann", "age": 31}'
matcher = xgr.GrammarMatcher(compiled)
steps = []
print(tr("each token of the text, how many tokens were allowed just before it, and the first few of those:"))
for token in tok.encode(TEXT, add_special_tokens=False) + [tok.eos_token_id]:
    n, ids = allowed_count(matcher)
    steps.append((tok.decode([token]), n))
    examples = ", ".join(repr(tok.decode([i])) for i in ids[:4].tolist())
    print(f"  {tok.decode([token])!r:<14} {n:>6}   {examples}{', …' if n > 4 else ''}")
    assert matcher.accept_token(token)
print(tr("terminated after the end token: {done}", done=matcher.is_terminated()))

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7.5, 2.8))
ax.bar(range(len(steps)), [n for _, n in steps], color="#4c72b0")
ax.set_yscale("log")
ax.set_xticks(range(len(steps)), [t for t, _ in steps], rotation=60, fontsize=8)
ax.set_ylabel(tr("tokens allowed (log scale)"))
ax.set_title(tr("allowed tokens before each step of {text}", text=TEXT), fontsize=9)
plt.tight_layout()
plt.show()

# %% [markdown] tags=["lang-zh"]
# 结构的地方（键名、引号、冒号、逗号）只剩一两个 token：语法几乎替模型写好了；字符串里面几乎什么都行（四万多个，
# 连 `<|im_start|>` 也在内：SmolLM2 的分词器信息里没有标出特殊 token，xgrammar 就把它们当普通文字），整数里是十个数字
# 和结束它的 `}`；JSON 完整之后只剩结束 token。
#
# **为什么要紧凑格式**：如果允许任意空白，`{` 后面就多了一百多个纯空白的 token（空格、换行、制表符的各种组合）。
# 小模型一旦写起空白，往往就一直写到 `max_tokens`，JSON 永远不完整。

# %% [markdown] tags=["lang-en"]
# At the structural places (key names, quotes, colons, commas) one or two tokens are left: the grammar all but writes
# them for the model; inside a string almost anything goes (over forty thousand, `<|im_start|>` included: the tokenizer
# information xgrammar gets for SmolLM2 marks no special tokens, so it treats them as plain text), inside an integer the
# ten digits and the `}` that ends it; once the JSON is complete, only the end token.
#
# **Why compact**: with any whitespace allowed, `{` is followed by over a hundred more tokens that are pure whitespace
# (spaces, newlines and tabs in every combination). Once a small model starts writing whitespace it often goes on until
# `max_tokens`, and the JSON never completes.

# %%
for any_ws in (False, True):
    m = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(PERSON), any_whitespace=any_ws))
    m.accept_string("{")
    print(tr("any_whitespace={ws}: tokens allowed after '{{': {n}", ws=any_ws, n=allowed_count(m)[0]))

# %% [markdown] tags=["lang-zh"]
# ## 3. 在真实模型上：JSON Schema、正则，和不加约束的对照
#
# 同一个问题先不加约束、再加上 Schema，贪心解码。不加约束时，哪怕提示词里说了“用 JSON 回答”，小模型也会套上代码块、
# 换行缩进、多编一个字段，再被 `max_tokens` 截断；加了约束的输出用 `json.loads` 解析、用 `jsonschema` 校验。
# 正则的例子要一个日期：`\d{4}-\d{2}-\d{2}` 只管形状，模型照样能写出 19 月；把月份和日子写进正则，它就只能写出像样的
# 日期——但语法保证的是形式，不是事实。
#
# 引擎用 `max_extend_tokens=16`：提示词分块预填充（第 2.4 章），中间块采到的不是输出，不碰匹配器。

# %% [markdown] tags=["lang-en"]
# ## 3. On a real model: a JSON Schema, a regex, and the output without one
#
# The same question without a constraint and then with the schema, greedy. Without one, even with "reply in JSON" in
# the prompt, the small model wraps a code fence around it, breaks and indents lines, makes up another field and is cut
# off by `max_tokens`; the constrained output is parsed with `json.loads` and validated with `jsonschema`. The regex example asks for a date: `\d{4}-\d{2}-\d{2}` only fixes the
# shape, and the model can still write month 19; with months and days spelled out in the regex it can only write a
# plausible date — but a grammar guarantees form, not facts.
#
# The engine uses `max_extend_tokens=16`: prompts are prefilled in chunks (chapter 2.4), and what a chunk samples is no
# output and does not touch the matcher.

# %%
import jsonschema

from minisgl.core import SamplingParams
from minisgl.llm import LLM

llm = LLM(smollm2(), dtype=torch.float32, max_running_req=4, num_page_override=256, max_seq_len_override=160,
          max_extend_tokens=16)


def chat(question: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)


CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                         "country": {"type": "string", "maxLength": 16},
                                         "population_millions": {"type": "number"}},
        "required": ["city", "country", "population_millions"]}
JOBS = [
    (chat("Describe Ann, who is 31. Reply in JSON."), SamplingParams(max_tokens=24)),
    (chat("Describe Ann, who is 31. Reply in JSON."), SamplingParams(max_tokens=48, json_schema=json.dumps(PERSON))),
    (chat("Tell me about Paris."), SamplingParams(max_tokens=48, json_schema=json.dumps(CITY))),
    (chat("When did people first land on the Moon? Give the date."), SamplingParams(max_tokens=16, regex=r"\d{4}-\d{2}-\d{2}")),
    (chat("When did people first land on the Moon? Give the date."),
     SamplingParams(max_tokens=16, regex=r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])")),
]
outs = llm.generate([p for p, _ in JOBS], [sp for _, sp in JOBS])
print(tr("no grammar: {text!r}", text=outs[0]["text"]))
try:
    json.loads(outs[0]["text"])
except json.JSONDecodeError as e:
    print(tr("  json.loads fails: {error}", error=e))
for out, schema in ((outs[1], PERSON), (outs[2], CITY)):
    value = json.loads(out["text"])
    jsonschema.validate(value, schema)
    print(tr("json_schema: {text!r} → parsed and valid: {value}", text=out["text"], value=value))
for out, (_, sp) in zip(outs[3:], JOBS[3:]):
    print(tr("regex {regex}: {text!r}", regex=sp.regex, text=out["text"]))

# %% [markdown] tags=["lang-zh"]
# ## 4. 重叠调度不改变结果
#
# 第 N+1 步的掩码取决于第 N 步采到的 token。匹配器只在算的线程里、`sample` 采完就推进，按步的顺序，所以第 N+1 步填
# 掩码时第 N 步的 token 已经进了匹配器——哪怕它还没回到调度线程。一个请求在第 N 步采到结束 token 时，调度器还不知道，
# 第 N+1 步里还有它：那时它的匹配器已经结束，这一行既不加掩码、也不推进（那个 token 反正会被丢掉）。
# 把重叠调度关掉，输出一个 token 都不变。

# %% [markdown] tags=["lang-en"]
# ## 4. Overlap scheduling does not change the result
#
# Step N+1's mask depends on the token step N samples. The matchers advance only on the computing thread, right after
# the draw in `sample`, in step order, so when step N+1 fills its mask, step N's token is already in the matcher — even
# though it has not reached the scheduling thread yet. When a request samples the end token at step N the scheduler does
# not know yet, and step N+1 still holds it: by then its matcher has terminated, so that row gets no mask and no advance
# (that token is dropped anyway). With overlap scheduling off, the output does not change by a token.

# %%
from minisgl.env import ENV

ENV.DISABLE_OVERLAP_SCHEDULING.value = True
again = llm.generate([p for p, _ in JOBS[1:]], [sp for _, sp in JOBS[1:]])
ENV.DISABLE_OVERLAP_SCHEDULING.value = False
llm.shutdown()
print(tr("overlap on and off, same constrained outputs: {same}",
         same=[o["token_ids"] for o in again] == [o["token_ids"] for o in outs[1:]]))

# %% [markdown] tags=["lang-zh"]
# ## 试一试：写一段开头，看下一步允许什么
#
# 选一种语法，在文本框里写输出的开头：匹配器先吃下这段文字（不合法就说不接受），再看下一步允许几个 token、是哪些。

# %% [markdown] tags=["lang-en"]
# ## Try it: write a beginning, see what may come next
#
# Pick a grammar and type the beginning of an output: the matcher first takes that text (or says it refuses it), then
# shows how many tokens, and which, may come next.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

GRAMMARS = {
    "json_schema PERSON": lambda: compiler.compile_json_schema(json.dumps(PERSON), any_whitespace=False),
    r"regex \d{4}-\d{2}-\d{2}": lambda: compiler.compile_regex(r"\d{4}-\d{2}-\d{2}"),
    'ebnf root ::= ("yes" | "no")': lambda: compiler.compile_grammar('root ::= ("yes" | "no")'),
}


def next_tokens(grammar: str, prefix: str) -> None:
    m = xgr.GrammarMatcher(GRAMMARS[grammar]())
    if prefix and not m.accept_string(prefix):
        print(tr("the grammar refuses {prefix!r}", prefix=prefix))
        return
    n, ids = allowed_count(m)
    shown = ", ".join(repr(tok.decode([i])) for i in ids[:12].tolist())
    print(tr("after {prefix!r}: {n} tokens allowed, e.g. {shown}", prefix=prefix, n=n, shown=shown))


explorer = Explorer(
    next_tokens,
    title=tr("the next tokens a grammar allows"),
    grammar=widgets.Dropdown(options=list(GRAMMARS), value="json_schema PERSON", description="grammar"),
    prefix=widgets.Text(value='{"name": "A', description="prefix"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (checks it without a browser)
explorer.run(grammar=r"regex \d{4}-\d{2}-\d{2}", prefix="1969-0")

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 词表有 100 个 token，一行位掩码几个 int32？token 63 在第几个数的第几位？只允许 token 63 时那个数是多少？
#
# <details><summary>答案</summary>
#
# `ceil(100 / 32) = 4` 个。token 63 在第 1 个数（从 0 数）的第 31 位，即符号位：那个数是 `-2³¹ = -2147483648`。
# 第 3 个数只用得上低 4 位（token 96–99）。
# </details>
#
# 2. 掩码加在 top-p 之后会怎样？
#
# <details><summary>答案</summary>
#
# top-p 在所有 token 上找核，核可能全是不允许的 token；之后再把它们设成 -inf，这一行就一个能采的都没有了。
# 掩码要在一切归一化（温度之后的对数概率、min-p、top-k / top-p）之前；它和惩罚、偏置谁先谁后倒无所谓，都只是改 logits。
# </details>
#
# 3. 重叠调度下，第 N 步采到了结束 token。第 N+1 步里这个请求的行要不要加掩码？
#
# <details><summary>答案</summary>
#
# 不加，也不推进：它的匹配器在第 N 步的 `sample` 里就已经结束了。调度器还不知道它结束，所以它还在第 N+1 步里；那一步
# 采到的 token 会被丢掉。结束了的匹配器填掩码会抛错，`accept_token` 则什么都不接受（采样器会当成位掩码放过了不合法的 token）。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. With a vocabulary of 100 tokens, how many int32s is one bitmask row? Which bit of which number is token 63? What is
#    that number when only token 63 is allowed?
#
# <details><summary>Answer</summary>
#
# `ceil(100 / 32) = 4`. Token 63 is bit 31 of number 1 (counting from 0), the sign bit: the number is
# `-2³¹ = -2147483648`. Number 3 uses only its low 4 bits (tokens 96–99).
# </details>
#
# 2. What goes wrong if the mask comes after top-p?
#
# <details><summary>Answer</summary>
#
# top-p looks for its nucleus among all tokens, and the nucleus may hold forbidden tokens only; set them to -inf
# afterwards and the row has nothing left to draw. The mask must come before everything that normalises (the
# log-probabilities after the temperature, min-p, top-k / top-p); before or after the penalties and bias makes no
# difference, since all of them only change logits.
# </details>
#
# 3. Under overlap scheduling a request samples the end token at step N. Is its row in step N+1 masked?
#
# <details><summary>Answer</summary>
#
# No mask and no advance: its matcher already terminated in step N's `sample`. The scheduler does not know yet that the
# request is done, so it is still in step N+1, whose token is dropped. A terminated matcher raises when asked to fill a
# mask, and its `accept_token` refuses every token (which the sampler would take for an invalid token let through).
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage3/grammar.py` 里的任务后运行下面这一格（`python -m minisgl.course check grammar`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage3/grammar.py`, run the cell below (`python -m minisgl.course check grammar`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("grammar")
