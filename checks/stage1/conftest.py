"""第 1 阶段检查共用的工具：模型路径、Hugging Face 参考输出、手工填批次。

这里不导入任何章节模块（``minisgl.core`` 等）：每个检查文件用哪套实现由 pytest 插件在导入那个文件时决定，
共用代码若在这里先导入，就会绑定到错误的那一套。需要章节里的类时，由检查文件把类传进来。
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from transformers import AutoTokenizer

from checks.hf_reference import greedy_reference, load_hf
from checks.common import expect  # noqa: F401 - 各章检查从这里导入 | en: the chapters' checks import it from here
from minisgl.i18n import tr
from minisgl import model_zoo

#: SmolLM2 上做逐 token 比对的提示词：长短不一（1 到 60 多个 token）、代码、数字、对话模板、中文。
SMOLLM2_PROMPTS = [
    "The capital of France is",
    "Hello",
    "1, 2, 3, 4, 5,",
    "def fibonacci(n):\n",
    "Translate to French: Good morning, how are you?",
    "今天天气很好，我们",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who went out every "
    "morning before sunrise. One day, while pulling in his nets, he found something strange:",
    "<|im_start|>user\nWhat is the tallest mountain in the world?<|im_end|>\n<|im_start|>assistant\n",
]
SMOLLM2_TOKENS = 32


@pytest.fixture(scope="session")
def tiny_path() -> str:
    return str(model_zoo.tiny_qwen3())


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    return str(model_zoo.smollm2())


@pytest.fixture(scope="session")
def qwen06b_path() -> str:
    return str(model_zoo.qwen3_06b_random())


@pytest.fixture(scope="session")
def smollm2_prompts(smollm2_path: str) -> list[list[int]]:
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    return [tok(p)["input_ids"] for p in SMOLLM2_PROMPTS]


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_path: str, smollm2_prompts: list[list[int]]) -> list[list[int]]:
    """每个提示词单独在 HF 上贪心生成 32 个 token（由 transformers 算，缓存在磁盘上）。"""
    return greedy_reference(smollm2_path, smollm2_prompts, SMOLLM2_TOKENS)


# ----------------------------------------------------------------------------- 共用工具


def assert_close_zh(actual: object, expected: object, sentence: str, **tol: object) -> None:
    """``torch.testing.assert_close``，失败时在 torch 自己的统计（不一致的元素个数、最大绝对/相对误差）前面
    加上一句中文说明。直接传 ``msg="…"`` 会把那些数字整个换掉，学员只看到“不一致”却不知道差多少。

    检查文件用 ``from .conftest import assert_close_zh`` 导入（它不依赖任何章节模块）。
    """
    torch.testing.assert_close(actual, expected, msg=lambda detail: f"{sentence}\n{detail}", **tol)


class Hand:
    """检查里共用的小工具（HF 参考、手工驱动引擎），经 ``hand`` fixture 拿到（检查文件不能 import conftest）。"""

    load_hf = staticmethod(load_hf)

    @staticmethod
    def assign_pages(engine, row: int) -> None:  # noqa: ANN001 - engine from whichever implementation
        """给页表第 ``row`` 行静态分配能装下 max_seq_len 个 token 的页（各行互不重叠）。页号用固定的种子打乱，
        这样只有真正按页表读写的实现才能通过。"""
        page_size = engine.config.page_size
        per_row = -(-engine.max_seq_len // page_size)
        perm = torch.randperm(engine.num_pages, generator=torch.Generator().manual_seed(0))
        pages = perm[row * per_row : (row + 1) * per_row]
        assert len(pages) == per_row, tr("The test setup does not have enough pages to give every row its own static pages")
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[: engine.max_seq_len]
        engine.page_table[row] = slots.to(torch.int32).to(engine.page_table.device)

    @staticmethod
    def fill_batch(engine, batch) -> None:  # noqa: ANN001
        """像第 1 阶段里程碑那样手工填好批次字段，并让注意力后端准备元数据。"""
        reqs, device = batch.reqs, engine.device
        batch.input_ids = torch.cat([r.input_ids[r.cached_len : r.device_len] for r in reqs]).to(device)
        batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len, dtype=torch.int32) for r in reqs]).to(device)
        batch.out_loc = torch.cat([engine.page_table[r.table_idx, r.cached_len : r.device_len] for r in reqs])
        engine.attn_backend.prepare_metadata(batch)

    @staticmethod
    def step(engine, batch):  # noqa: ANN001, ANN201
        """前向一步（发出时推进每个请求），把新 token 接到每个请求后面；返回 ForwardOutput。"""
        Hand.fill_batch(engine, batch)
        out = engine.forward_batch(batch, engine.sampler.prepare(batch))
        for req in batch.reqs:
            req.complete_one()
        out.copy_done_event.synchronize()
        for req, token in zip(batch.reqs, out.next_tokens_cpu):
            req.append_host(token.reshape(1))
        return out

    @staticmethod
    def run_to_completion(engine, batch_cls: Callable, reqs: list) -> list[list[int]]:  # noqa: ANN001
        """整批一起：一次预填充，然后解码到所有请求都生成完（各请求的 output_len 相同）。返回新 token。"""
        prompt_lens = [len(r.input_ids) for r in reqs]
        Hand.step(engine, batch_cls(reqs, "prefill"))
        while reqs[0].can_decode:
            Hand.step(engine, batch_cls(reqs, "decode"))
        return [r.input_ids[n:].tolist() for r, n in zip(reqs, prompt_lens)]


@pytest.fixture(scope="session")
def hand() -> type[Hand]:
    return Hand


# ----------------------------------------------------------------------------- 在后面的章节下跑本章的代码

#: tiny 模型上、后面章节的参考解答调用本章代码时用的提示词（token id，长短不一）。
LATER_PROMPTS = [[151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30], [9707, 11, 1879], [785, 3974, 13876, 38835, 34208, 916], [42]]
LATER_TOKENS = 8


def engine_matches_hf(classes: dict, tiny_path: str, what: str, *, page_size: int = 1, backend: str = "auto") -> None:
    """第 1.6 章的引擎（参考解答）用本章的代码，整批贪心生成 LATER_TOKENS 个 token，逐个请求与 Hugging Face 比较。

    ``classes``：检查文件传进来的 ``Engine``、``EngineConfig``、``Req``、``Batch``、``SamplingParams``（这里不导入章节）。
    请求放在页表的第 3、0、2、1 行（不是 0、1、2、3），页号打乱。
    """
    Engine, EngineConfig, Req, Batch, SamplingParams = (classes[k] for k in ("Engine", "EngineConfig", "Req", "Batch", "SamplingParams"))
    reference = greedy_reference(tiny_path, LATER_PROMPTS, LATER_TOKENS)
    engine = Engine(EngineConfig(tiny_path, dtype=torch.float32, max_running_req=len(LATER_PROMPTS), num_page_override=512 // page_size,
                                 max_seq_len_override=64, page_size=page_size, attention_backend=backend))  # fmt: skip
    try:
        rows = [3, 0, 2, 1]
        reqs = []
        for uid, (row, prompt) in enumerate(zip(rows, LATER_PROMPTS)):
            Hand.assign_pages(engine, row)
            reqs.append(Req(torch.tensor(prompt, dtype=torch.int32), row, 0, LATER_TOKENS, uid, SamplingParams()))
        out = Hand.run_to_completion(engine, Batch, reqs)
    finally:
        engine.shutdown()
    for i, (ours, ref) in enumerate(zip(out, reference)):
        assert ours == ref, tr(
            "{what}: request {i} (prompt of {n} tokens, page-table row {row}) differs from Hugging Face\nours: {ours}\nHF:   {ref}",
            what=what, i=i, n=len(LATER_PROMPTS[i]), row=rows[i], ours=ours, ref=ref,
        )  # fmt: skip


def final_llm_matches_hf(llm_cls: type, sampling_params_cls: type, tiny_path: str, what: str) -> None:
    """第 2.5 章的 LLM（参考解答，分块 5、开着重叠调度）用本章的代码生成，逐个请求与 Hugging Face 比较；
    ``generate`` 结束时它自己查完整性（页面、请求槽全部归还）。"""
    from minisgl.env import ENV

    reference = greedy_reference(tiny_path, LATER_PROMPTS, LATER_TOKENS)
    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = False
    llm = llm_cls(tiny_path, dtype=torch.float32, max_running_req=4, num_page_override=512, max_seq_len_override=64, max_extend_tokens=5)
    try:
        sp = sampling_params_cls(max_tokens=LATER_TOKENS, ignore_eos=True)
        out = [o["token_ids"] for o in llm.generate(LATER_PROMPTS, sp)]
    finally:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved
        llm.shutdown()
    for i, (ours, ref) in enumerate(zip(out, reference)):
        assert ours == ref, tr(
            "{what}: request {i} (prompt of {n} tokens) differs from Hugging Face\nours: {ours}\nHF:   {ref}",
            what=what, i=i, n=len(LATER_PROMPTS[i]), ours=ours, ref=ref,
        )  # fmt: skip
