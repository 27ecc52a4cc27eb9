"""快速上手：用完整引擎的离线接口 ``LLM.generate`` 和真实权重的 SmolLM2 聊几句。

运行：python examples/quickstart.py
（先 ``make setup`` 构建离线模型；新克隆下来每章都用参考解答，你写了哪章就换成你的代码。）

en: Quick start: a few lines of chat with SmolLM2 (real weights) through the full engine's offline interface
``LLM.generate``.

Run: python examples/quickstart.py (first ``make setup`` builds the offline models; a fresh clone uses the reference
solution for every chapter, and each chapter you write switches to your code.)
"""

from __future__ import annotations

import time

import torch

from minisgl.core import SamplingParams
from minisgl.course import describe_selection
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.model_zoo import smollm2

QUESTIONS = [
    "What is the capital of France?",
    "Give me one tip for writing clean Python code.",
    "Why is the sky blue? Answer in one sentence.",
]


def main() -> None:
    print(describe_selection())
    llm = LLM(smollm2(), dtype=torch.float32, max_running_req=4, num_page_override=1024, max_seq_len_override=512)
    chats = [
        llm.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in QUESTIONS
    ]
    settings = [
        (tr("Greedy decoding (temperature=0)"), SamplingParams(temperature=0.0, max_tokens=40)),
        (tr("Sampling (temperature=0.7, top_p=0.9, seed=0)"), SamplingParams(temperature=0.7, top_p=0.9, max_tokens=40, seed=0)),
    ]
    for title, params in settings:
        print(f"== {title} ==")
        start = time.perf_counter()
        outputs = llm.generate(chats, params)
        elapsed = time.perf_counter() - start
        for question, out in zip(QUESTIONS, outputs):
            print(tr("Q: {question}", question=question))
            print(tr("A: {answer}", answer=out["text"].strip()))
        tokens = sum(len(o["token_ids"]) for o in outputs)
        print(tr("({n_outputs} requests generated {tokens} tokens together in {elapsed:.2f} s)\n",
                 n_outputs=len(outputs), tokens=tokens, elapsed=elapsed))
    llm.shutdown()


if __name__ == "__main__":
    main()
