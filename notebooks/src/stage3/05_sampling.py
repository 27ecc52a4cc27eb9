# %% [markdown] tags=["lang-zh"]
# # 第 3.5 章 sampling：惩罚、偏置、最少 token 与对数概率
#
# 第 1.6 章的采样器只看这一步的 logits。OpenAI 的客户端还会发来 `repetition_penalty`（Hugging Face 的那种）、
# `presence_penalty`、`frequency_penalty`、`logit_bias`、`min_tokens`、`min_p`，还要 `logprobs` / `top_logprobs`。
# 本章的 `Sampler` 继承第 1.6 章的采样器，在它前后各加一段：
#
#     logits → 惩罚 → 偏置 → 没到 min_tokens 时屏蔽 EOS → ÷ 温度 → 取对数概率 → min-p → 第 1.6 章的 top-k / top-p / 抽样 → 记进状态
#
# 惩罚要记住每个请求之前采过什么；这份历史怎么存由你设计。难点在重叠调度：`prepare` 在调度线程里、上一步还没算完
# 时就调用，它手里可靠的只有长度记账。
#
# 这个笔记本先把你写的两个纯函数和 Hugging Face 的 logits 处理器对照，再在真实权重的 SmolLM2 上跑 `LLM.generate`，
# 和 Hugging Face 的 `generate(repetition_penalty=...)` 逐 token 对照，最后看对数概率。

# %% [markdown] tags=["lang-en"]
# # Chapter 3.5 sampling: penalties, bias, min tokens and log-probabilities
#
# Chapter 1.6's sampler looks only at this step's logits. OpenAI clients also send `repetition_penalty` (Hugging Face's
# kind), `presence_penalty`, `frequency_penalty`, `logit_bias`, `min_tokens` and `min_p`, and they ask for `logprobs` /
# `top_logprobs`. This chapter's `Sampler` extends chapter 1.6's with a stage before it and one after:
#
#     logits → penalties → bias → EOS masked until min_tokens → ÷ temperature → log-probabilities → min-p → chapter 1.6's top-k / top-p / draw → record
#
# The penalties must remember what each request sampled before; how that history is kept is your design. The hard part
# is overlap scheduling: `prepare` runs on the scheduling thread while the previous step may still be computing, and all
# it can rely on is the length bookkeeping.
#
# This notebook first compares the two pure functions you write with Hugging Face's logits processors, then runs
# `LLM.generate` on the real-weight SmolLM2 and matches Hugging Face's `generate(repetition_penalty=...)` token by token,
# and finally looks at the log-probabilities.

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
# 本章的任务（和 stage3/sampling.py 里的 TODO 一一对应），以及这个笔记本现在用的是哪份实现
# en: This chapter's tasks (one per TODO in stage3/sampling.py) and which implementation this notebook uses
from minisgl.notebook import show_tasks

show_tasks("sampling")

# %% [markdown] tags=["lang-zh"]
# ## 1. 三种惩罚
#
# - **重复惩罚**（Hugging Face 的 `repetition_penalty`，r > 0）：提示词**或**输出里出现过的 token，logit 为正就除以 r，
#   否则乘以 r。r > 1 时两种情况都让它更不可能；只看“出现过没有”，不看次数。
# - **出现惩罚**（OpenAI 的 `presence_penalty`）：`logit − presence · [count > 0]`，只看**输出**。
# - **频率惩罚**（OpenAI 的 `frequency_penalty`）：`logit − frequency · count`，也只看输出，出现越多罚得越多。
#
# 随机的 logits、随机的“提示词”和“输出”：每行用 Hugging Face 的 `RepetitionPenaltyLogitsProcessor`（它看的是整段
# `input_ids`，即提示词加输出）算一遍，和 `apply_penalties` 比；出现 / 频率惩罚 Hugging Face 没有，直接按上面的公式比。

# %% [markdown] tags=["lang-en"]
# ## 1. The three penalties
#
# - **repetition** (Hugging Face's `repetition_penalty`, r > 0): for a token seen in the prompt **or** the output, a
#   positive logit is divided by r, any other multiplied by r. With r > 1 both make it less likely; only "seen or not"
#   matters, not how often.
# - **presence** (OpenAI's `presence_penalty`): `logit − presence · [count > 0]`, over the **output** only.
# - **frequency** (OpenAI's `frequency_penalty`): `logit − frequency · count`, over the output too, more for every
#   occurrence.
#
# Random logits, a random "prompt" and "output": each row goes through Hugging Face's `RepetitionPenaltyLogitsProcessor`
# (which looks at the whole `input_ids`, prompt plus output) and is compared with `apply_penalties`; Hugging Face has no
# presence / frequency penalty, so those are compared with the formulas above.

# %%
import torch
from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor

from minisgl.sampling import apply_penalties, min_p_filter

VOCAB = 50
gen = torch.Generator().manual_seed(0)
logits = torch.randn(3, VOCAB, generator=gen) * 3
prompts = [torch.randint(0, VOCAB, (8,), generator=gen) for _ in range(3)]
outputs = [torch.randint(0, VOCAB, (6,), generator=gen) for _ in range(3)]
counts = torch.stack([torch.bincount(o, minlength=VOCAB) for o in outputs]).int()
seen = torch.stack([torch.bincount(torch.cat([p, o]), minlength=VOCAB) > 0 for p, o in zip(prompts, outputs)])

REPETITION = [1.0, 1.3, 0.8]
ours = apply_penalties(logits, counts, seen, torch.tensor(REPETITION), None, None)
hf = torch.cat([RepetitionPenaltyLogitsProcessor(r)(torch.cat([p, o])[None], logits[i:i + 1].clone())
                for i, (r, p, o) in enumerate(zip(REPETITION, prompts, outputs))])
print(tr("repetition_penalty {r}: equal to Hugging Face: {same}", r=REPETITION, same=torch.allclose(ours, hf)))
print(tr("the row with r = 1 is unchanged: {same}", same=torch.equal(ours[0], logits[0])))

presence, frequency = torch.tensor([0.0, 0.5, 1.5]), torch.tensor([0.0, 0.25, -0.5])
ours = apply_penalties(logits, counts, seen, None, presence, frequency)
formula = logits - presence[:, None] * (counts > 0).float() - frequency[:, None] * counts.float()
print(tr("presence / frequency penalties equal to the formula: {same}", same=torch.allclose(ours, formula)))
only_prompt = (seen & (counts == 0))[1].nonzero().flatten().tolist()
print(tr("tokens of row 1 seen only in the prompt: {ids}; presence / frequency leave them alone: {same}",
         ids=only_prompt, same=torch.equal(ours[1, only_prompt], logits[1, only_prompt])))

# %% [markdown] tags=["lang-zh"]
# ## 2. min-p
#
# min-p 只留概率至少是最大概率 `min_p` 倍的 token。概率之比是 logit 之差的指数，所以不用算 softmax：
#
#     p_i ≥ min_p · p_max  ⇔  logit_i / T ≥ max / T + log(min_p)
#
# 和 Hugging Face 的 `MinPLogitsWarper`（它作用在已经除过温度的 logits 上）对照；下面的图画出一行的概率，虚线是门槛
# `min_p · p_max`，灰色的是被去掉的。

# %% [markdown] tags=["lang-en"]
# ## 2. min-p
#
# min-p keeps only the tokens whose probability is at least `min_p` times the largest one. A ratio of probabilities is
# the exponential of a difference of logits, so no softmax is needed:
#
#     p_i ≥ min_p · p_max  ⇔  logit_i / T ≥ max / T + log(min_p)
#
# Compared with Hugging Face's `MinPLogitsWarper` (which acts on logits already divided by the temperature); the plot
# shows one row's probabilities, the dashed line is the threshold `min_p · p_max`, and grey bars are removed.

# %%
import matplotlib.pyplot as plt

for min_p, t in ((0.1, 1.0), (0.05, 0.7), (0.3, 1.5)):
    ours = min_p_filter(logits, torch.full((3,), min_p), torch.full((3,), t))
    hf = MinPLogitsWarper(min_p)(None, logits / t)
    print(tr("min_p={min_p}, temperature={t}: same tokens removed as Hugging Face: {same}; kept per row: {kept}",
             min_p=min_p, t=t, same=torch.equal(ours.isinf(), hf.isinf()), kept=(~ours.isinf()).sum(-1).tolist()))
print(tr("min_p = 0 removes nothing: {same}", same=torch.equal(min_p_filter(logits, torch.zeros(3), torch.ones(3)), logits)))


def draw_min_p(min_p: float, temperature: float) -> None:
    row = logits[0]
    probs = (row / temperature).softmax(-1)
    kept = ~min_p_filter(row[None], torch.tensor([min_p]), torch.tensor([temperature]))[0].isinf()
    order = probs.argsort(descending=True)[:20]
    print(tr("min_p={min_p}, temperature={t}: {n} of {v} tokens kept, holding {mass:.0%} of the probability",
             min_p=min_p, t=temperature, n=int(kept.sum()), v=VOCAB, mass=float(probs[kept].sum())))
    fig, ax = plt.subplots(figsize=(6.4, 2.6))
    xs = range(len(order))
    ax.bar(xs, probs[order], color=["#4c72b0" if k else "#c8c8c8" for k in kept[order]])
    ax.axhline(min_p * float(probs.max()), color="#dd8452", linestyle="--", label=tr("min_p · p_max"))
    ax.set_xlabel(tr("the 20 most likely tokens, largest first"))
    ax.set_ylabel(tr("probability"))
    ax.legend(fontsize=8)


draw_min_p(0.1, 1.0)
plt.show()

# %% [markdown] tags=["lang-zh"]
# 温度高时分布更平，最大概率变小，门槛 `min_p · p_max` 也跟着降低，留下的 token 更多；温度低时正相反。这就是 min-p
# 比固定的 top-p 更“会看情况”的地方：模型有把握时只留一两个，没把握时留一大片。
#
# **顺序**：这里和 vLLM 一样，min-p 在 top-k / top-p 之前；Hugging Face 把它放在它们之后。两种顺序只在同时用 top-p 时才
# 可能不同：top-p 在 min-p 去掉尾巴之后重新归一化，核会更小。

# %% [markdown] tags=["lang-en"]
# A higher temperature flattens the distribution, the largest probability shrinks, the threshold `min_p · p_max` drops
# with it and more tokens stay; a lower temperature does the opposite. This is where min-p is more "adaptive" than a
# fixed top-p: when the model is sure only one or two tokens stay, when it is unsure a wide set does.
#
# **Order**: here, as in vLLM, min-p comes before top-k / top-p; Hugging Face puts it after them. The two orders can
# differ only together with top-p: top-p renormalises after min-p has cut the tail, so its nucleus gets smaller.

# %% [markdown] tags=["lang-zh"]
# ## 3. 在真实模型上：和 Hugging Face 的 `generate` 逐 token 对照
#
# 一个很容易让小模型绕圈子的提示词。贪心解码，不带惩罚时它把一周七天数完又从头数；`repetition_penalty=1.3` 让出现过的
# token 都更不可能，它就换了话题。两种都和 Hugging Face 的 `generate(do_sample=False, repetition_penalty=...)`
# 逐 token 相同。

# %% [markdown] tags=["lang-en"]
# ## 3. On a real model: token by token against Hugging Face's `generate`
#
# A prompt that easily sends a small model round in circles. Greedy, without a penalty it counts the seven days and starts
# over; `repetition_penalty=1.3` makes every token seen before less likely, and it changes the subject. Both are equal,
# token by token, to Hugging Face's `generate(do_sample=False, repetition_penalty=...)`.

# %%
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.model_zoo import smollm2

tok = AutoTokenizer.from_pretrained(smollm2())
# max_extend_tokens=4：提示词分成 4 个 token 一块预填充（第 2.4 章），中间块采到的不是输出，不能记进状态
# en: max_extend_tokens=4: the prompt is prefilled in chunks of 4 tokens (chapter 2.4); what a chunk samples is not output
llm = LLM(smollm2(), dtype=torch.float32, max_running_req=4, num_page_override=256, max_seq_len_override=128,
          max_extend_tokens=4)
hf_model = AutoModelForCausalLM.from_pretrained(smollm2(), dtype=torch.float32)
PROMPT = "List the days of the week: Monday, Tuesday,"
ids = torch.tensor([tok(PROMPT)["input_ids"]])
N = 16

hf_runs = {}
for r in (1.0, 1.3):
    ours = llm.generate([PROMPT], SamplingParams(max_tokens=N, repetition_penalty=r, logprobs=True, top_logprobs=5))[0]
    ref = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, do_sample=False,
                            repetition_penalty=r, output_scores=True, return_dict_in_generate=True,
                            pad_token_id=tok.eos_token_id)
    hf_runs[r] = (ours, ref)
    print(tr("repetition_penalty={r}: {text!r}", r=r, text=ours["text"]))
    print(tr("  same tokens as Hugging Face: {same}", same=ours["token_ids"] == ref.sequences[0, ids.shape[1]:].tolist()))

# %% [markdown] tags=["lang-zh"]
# ## 4. 对数概率
#
# `logprobs=True` 时 `LLM.generate` 的结果多一个 `"logprobs"`：每个输出 token 一个 `TokenLogprob`（采到的 token 的对数
# 概率，和概率最大的 `top_logprobs` 个）。它报告的是**抽样用的那个分布**：惩罚、偏置、屏蔽和温度之后（贪心按温度 1），
# top-k / top-p / min-p 截尾之前。Hugging Face 的 `output_scores` 正是处理过（这里是罚过）的 logits，
# 对它取 `log_softmax` 就应该得到同样的数。

# %% [markdown] tags=["lang-en"]
# ## 4. Log-probabilities
#
# With `logprobs=True` the result of `LLM.generate` has one more key, `"logprobs"`: one `TokenLogprob` per output token
# (the sampled token's log-probability and those of the `top_logprobs` most likely ones). It reports **the distribution
# the token was drawn from**: after the penalties, bias, masks and temperature (greedy counts as temperature 1), before the
# top-k / top-p / min-p truncation. Hugging Face's `output_scores` are exactly the processed (here: penalised) logits,
# so their `log_softmax` should give the same numbers.

# %%
for r, (ours, ref) in hf_runs.items():
    hf_lp = torch.stack(ref.scores)[:, 0].float().log_softmax(-1)
    chosen = torch.tensor([e.logprob for e in ours["logprobs"]])
    want = hf_lp.gather(-1, torch.tensor(ours["token_ids"])[:, None])[:, 0]
    top_same = all(e.top_ids == hf_lp[i].topk(5).indices.tolist() for i, e in enumerate(ours["logprobs"]))
    print(tr("repetition_penalty={r}: sampled token's logprob vs Hugging Face, largest difference < 1e-3: {close}; "
             "same top-5 ids: {same}", r=r, close=bool((chosen - want).abs().max() < 1e-3), same=top_same))

ours = hf_runs[1.3][0]
print(tr("\nrepetition_penalty=1.3, the first four tokens:"))
for t, e in list(zip(ours["token_ids"], ours["logprobs"]))[:4]:
    alts = ", ".join(f"{tok.decode([i])!r} {p:.1f}" for i, p in zip(e.top_ids[:3], e.top_logprobs[:3]))
    print(f"  {tok.decode([t])!r:<14} {e.logprob:5.1f}   top-3: {alts}")

# %% [markdown] tags=["lang-zh"]
# ## 5. 重叠调度与分块预填充都不改变结果
#
# 第 N+1 步的惩罚要看得到第 N 步采到的 token——哪怕那个 token 在 `prepare` 的时候还没回到主机。提示词的中间块
# （`can_decode` 为假）采到的不是输出，不进历史：上面的引擎一直是
# 4 个 token 一块地预填充 11 个 token 的提示词，结果仍和 Hugging Face 一样。下面再把重叠调度关掉，带惩罚的输出一个
# token 都不变。

# %% [markdown] tags=["lang-en"]
# ## 5. Neither overlap scheduling nor chunked prefill changes the result
#
# Step N+1's penalties must see the token of step N, even when that token has not reached the host at `prepare` time.
# What a chunk of a prompt samples (`can_decode` false) is not output and does not enter the history: the engine above prefilled the 11-token prompt in chunks of 4 tokens all along, and
# still matched Hugging Face. Below, overlap scheduling is switched off as well, and the penalised output does not
# change by a token.

# %%
from minisgl.env import ENV

params = SamplingParams(max_tokens=N, repetition_penalty=1.3, frequency_penalty=0.3)
base = llm.generate([PROMPT], params)[0]["token_ids"]
ENV.DISABLE_OVERLAP_SCHEDULING.value = True
no_overlap = llm.generate([PROMPT], params)[0]["token_ids"]
ENV.DISABLE_OVERLAP_SCHEDULING.value = False
llm.shutdown()
print(tr("overlap on and off, same tokens: {same}", same=no_overlap == base))

# %% [markdown] tags=["lang-zh"]
# ## 试一试：min-p 和温度
#
# 拖动滑块，看同一行 logits 在不同的 `min_p` 和温度下留下几个 token。

# %% [markdown] tags=["lang-en"]
# ## Try it: min-p and the temperature
#
# Move the sliders to see how many tokens of the same row of logits stay under other values of `min_p` and the
# temperature.

# %%
import ipywidgets as widgets

from minisgl.notebook import Explorer

explorer = Explorer(
    draw_min_p,
    title=tr("min-p"),
    min_p=widgets.FloatSlider(value=0.1, min=0.0, max=1.0, step=0.05, description="min_p"),
    temperature=widgets.FloatSlider(value=1.0, min=0.1, max=3.0, step=0.1, description="temperature"),
)
explorer

# %%
# 用一组参数调用控件触发的同一个处理函数（没有浏览器时也能检验它）
# en: Call the widget's handler with one set of values (checks it without a browser)
explorer.run(min_p=0.1, temperature=2.0)

# %% [markdown] tags=["lang-zh"]
# ## 自测
#
# 1. 提示词里有 “Monday”，输出里还没有。`repetition_penalty=1.3` 和 `presence_penalty=1.0` 各对它的 logit 做什么？
#
# <details><summary>答案</summary>
#
# 重复惩罚看提示词和输出：它的 logit 为正就除以 1.3，否则乘以 1.3。出现惩罚只看输出：它没出现过，logit 不变。
# </details>
#
# 2. 为什么对数概率要在 min-p 之前取？
#
# <details><summary>答案</summary>
#
# 客户端想知道的是“模型（加上我要的惩罚、偏置和温度）觉得每个 token 有多可能”。截尾之后，被去掉的备选都成了 -inf
# （报出去是 -9999），`top_logprobs` 看不出它们差多少；采到的那个的数也要随 top-k / top-p / min-p 的设置变。
# </details>
#
# 3. `prepare` 里能不能读历史来判断请求已经输出了几个 token？
#
# <details><summary>答案</summary>
#
# 不能。重叠调度下 `prepare` 在调度线程里运行，上一步可能还在算，它采到的 token 还没进历史。已经输出的个数
# 要用长度算：`device_len - prompt_len`，`device_len` 已经把还在路上的那一步算进去了。
# </details>

# %% [markdown] tags=["lang-en"]
# ## Self-check
#
# 1. "Monday" is in the prompt but not yet in the output. What do `repetition_penalty=1.3` and `presence_penalty=1.0`
#    each do to its logit?
#
# <details><summary>Answer</summary>
#
# The repetition penalty looks at the prompt and the output: a positive logit is divided by 1.3, any other multiplied by
# 1.3. The presence penalty looks only at the output: the token has not occurred there, so the logit stays.
# </details>
#
# 2. Why are the log-probabilities taken before min-p?
#
# <details><summary>Answer</summary>
#
# A client wants to know "how likely the model (with the penalties, bias and temperature I asked for) thought each token
# was". After the cut, the removed alternatives would all be -inf (reported as -9999), so `top_logprobs` could no longer
# tell how far behind they were, and the sampled token's value would move with the top-k / top-p / min-p settings.
# </details>
#
# 3. May `prepare` read the history to learn how many tokens a request has output?
#
# <details><summary>Answer</summary>
#
# No. With overlap scheduling `prepare` runs on the scheduling thread while the previous step may still be computing, and
# the token it samples is not in the history yet. The number output so far comes from lengths: `device_len - prompt_len`,
# where `device_len` already counts the step still on its way.
# </details>

# %% [markdown] tags=["lang-zh"]
# ## 检查你的代码
#
# 写完 `stage3/sampling.py` 里的任务后运行下面这一格（`python -m minisgl.course check sampling`）。

# %% [markdown] tags=["lang-en"]
# ## Check your code
#
# When you have written the tasks in `stage3/sampling.py`, run the cell below (`python -m minisgl.course check sampling`).

# %% tags=["skip-execution"]
# NBVAL_SKIP
from minisgl.notebook import run_chapter_checks

run_chapter_checks("sampling")
