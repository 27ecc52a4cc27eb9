"""CUDA 路径的“合同”在 CPU 上就能查：用 ``checks/fake_cuda.py`` 的假 ``torch.cuda``（张量仍在 CPU 上）走一遍
引擎、重叠调度和 CUDA 图的 CUDA 分支，检查传给 CUDA 的参数、流与事件的先后、步内有没有同步拷贝；
再用一条静态规则要求每个与 Hugging Face 比对的检查写明引擎的 dtype 和设备。"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from checks.fake_cuda import FakeCuda, fake_cuda
from minisgl import model_zoo
from minisgl.core import SamplingParams
from minisgl.engine import Engine, EngineConfig, resolve_device
from minisgl.env import ENV
from minisgl.i18n import tr
from minisgl.llm import LLM
from minisgl.paths import REPO_ROOT

PROMPTS = ["The capital of France is", "a b c", "1, 2, 3,", "今天天气很好"]
MAX_TOKENS = [6, 9, 3, 7]
KW = dict(dtype=torch.float32, max_running_req=4, num_page_override=256, max_seq_len_override=64)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    monkeypatch.delenv("MINISGL_DEVICE", raising=False)
    saved = ENV.DISABLE_OVERLAP_SCHEDULING.value, ENV.DISABLE_CUDA_GRAPH.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value, ENV.DISABLE_CUDA_GRAPH.value = False, False
    try:
        with fake_cuda(monkeypatch) as fake:
            yield fake
    finally:
        ENV.DISABLE_OVERLAP_SCHEDULING.value, ENV.DISABLE_CUDA_GRAPH.value = saved


def no_violations(cuda: FakeCuda) -> None:
    assert not cuda.violations, tr("On a GPU these calls would stall the host or break a CUDA graph:\n{violations}",
                                   violations="\n".join(dict.fromkeys(cuda.violations)))


def generate(llm: LLM) -> list[list[int]]:
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    return [o["token_ids"] for o in llm.generate(PROMPTS, params)]


# ----------------------------------------------------------------------------- 设备解析


@pytest.mark.parametrize("name,env", [("auto", None), ("cuda", None), ("auto", "cuda"), ("cuda:0", None)])
def test_cuda_device_always_has_an_index(cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch, name: str, env: str | None) -> None:
    if env:
        monkeypatch.setenv("MINISGL_DEVICE", env)
    device = resolve_device(name)
    assert device == torch.device("cuda", 0), tr(
        "resolve_device({name!r}) on a CUDA machine must give an indexed device cuda:0 (torch.cuda.set_device refuses "
        "a bare 'cuda', and a tensor's .device always has an index), got {device!r}", name=name, device=device)


def test_engine_starts_on_cuda(cuda: FakeCuda) -> None:
    """缺省设置（设备、dtype、页数、CUDA 图都是 auto）在 CUDA 上能建起来，并把每张图按规矩录好。"""
    # engine defaults on purpose: what auto chooses on CUDA is the point
    engine = Engine(EngineConfig(str(model_zoo.tiny_qwen3()), max_running_req=4, max_seq_len_override=64))
    try:
        assert cuda.set_device_calls == [torch.device("cuda", 0)], tr(
            "The engine must call torch.cuda.set_device once with the indexed device, got {calls}", calls=cuda.set_device_calls)
        assert (engine.device, engine.dtype, engine.graph_mode) == (torch.device("cuda", 0), torch.bfloat16, "cuda"), tr(
            "On CUDA the defaults are the GPU, bf16 and CUDA graphs; got {got}", got=(engine.device, engine.dtype, engine.graph_mode))
        captures = [e for e in cuda.log if e[0] == "capture_begin"]
        runner = engine.graph_runner
        assert runner is not None and len(captures) == len(runner.graphs) > 1
        assert captures[0][2] == "new-pool" and all(c[2] == "pool" for c in captures[1:]), tr(
            "Every graph after the first must share the first graph's memory pool")
        log = cuda.log[: cuda.log.index(captures[0]) + 1]
        side = next(e[1] for e in log if e[0] == "enter")
        order = [("wait_stream", side, "default"), ("enter", side), ("exit", side), ("wait_stream", "default", side), captures[0]]
        assert all(e in log for e in order) and sorted(order, key=log.index) == order, tr(
            "Graph warm-up runs on a side stream that first waits for the current stream, and the current stream waits "
            "for it before the capture; got {log}", log=log)
        no_violations(cuda)
    finally:
        engine.shutdown()


# ----------------------------------------------------------------------------- 重叠调度：流与事件


def launches(cuda: FakeCuda, engine_stream: str) -> list[list[tuple[str, ...]]]:
    """日志按每次进入引擎流切开：每段是一次发出，到下一次发出之前。"""
    starts = [i for i, e in enumerate(cuda.log) if e == ("enter", engine_stream)]
    return [cuda.log[a:b] for a, b in zip(starts, [*starts[1:], len(cuda.log)])]


@pytest.mark.parametrize("graphs", ["off", "cuda"])
def test_overlap_on_cuda_orders_streams(cuda: FakeCuda, graphs: str) -> None:
    """每一步都在引擎流上发出，发出前引擎流等调度器的流；计时事件记在引擎流上，主机在用之前等过它；
    步内（引擎流上、录图时）没有从可分页内存的同步拷贝。开图时解码批次真的回放了图。"""
    llm = LLM(str(model_zoo.tiny_qwen3()), device="auto", cuda_graph=graphs, cuda_graph_max_bs=4, **KW)
    try:
        cuda.log.clear()
        tokens = generate(llm)
        assert [len(t) for t in tokens] == MAX_TOKENS, tr("Every request must get exactly max_tokens tokens")
        engine_stream = llm.loop.engine_stream.name
        steps = launches(cuda, engine_stream)
        assert len(steps) >= max(MAX_TOKENS), tr("Every step must be launched on the engine's own stream")
        for step in steps:
            assert step[1] == ("wait_stream", engine_stream, "default"), tr(
                "On entering the engine stream, it must first wait for the stream the scheduler prepared the step on; got {got}",
                got=step[:3])
        records = {e[1]: e[2] for e in cuda.log if e[0] == "record"}
        synced = {e[1] for e in cuda.log if e[0] == "event_sync"}
        assert records and set(records.values()) == {engine_stream}, tr(
            "Events that time or signal a step must be recorded on the engine stream, got {streams}", streams=set(records.values()))
        assert len(synced) >= len(steps), tr("The host must wait for an event of every step before it reads the step's results")
        if graphs == "cuda":
            replays = [e for e in cuda.log if e[0] == "replay"]
            assert replays and {e[2] for e in replays} == {engine_stream}, tr("Decode graphs must be replayed on the engine stream")
        no_violations(cuda)
    finally:
        llm.shutdown()


def test_cuda_branch_gives_the_cpu_tokens(cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA 分支（引擎流、锁页拷贝）只改变“在哪里、何时”，不改变结果：与 CPU 上同样的计算逐 token 相同。"""
    llm = LLM(str(model_zoo.tiny_qwen3()), device="auto", cuda_graph="off", **KW)
    try:
        on_cuda = generate(llm)
    finally:
        llm.shutdown()
    monkeypatch.undo()  # 其余的在 CPU 上算：同样走 F.linear（CUDA 上没有 CPU 的快速线性层）
    cpu = LLM(str(model_zoo.tiny_qwen3()), device="cpu", cpu_fast_linear=False, **KW)
    try:
        assert on_cuda == generate(cpu), tr("The CUDA branch of overlap scheduling changed the tokens")
    finally:
        cpu.shutdown()


# ----------------------------------------------------------------------------- 规则：与 HF 比对的检查写明 dtype 和设备

HF_NAMES = {"load_hf", "greedy_reference", "hf_greedy", "smollm2_reference", "AutoModelForCausalLM"}
ENGINE_CALLS = {"EngineConfig", "LLM", "make_llm"}
EXEMPT = "# engine defaults on purpose"


def _dict_keys(node: ast.AST, module: dict[str, ast.AST]) -> set[str] | None:
    """一个 ``**x`` 展开能提供的关键字（能静态读出时）；读不出就返回 None。"""
    if isinstance(node, ast.Name) and node.id in module:
        return _dict_keys(module[node.id], module)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        keys = {k.arg for k in node.keywords if k.arg}
        for k in node.keywords:
            if k.arg is None and (inner := _dict_keys(k.value, module)) is not None:
                keys |= inner
        return keys
    if isinstance(node, ast.Dict):
        keys: set[str] = set()
        for k, v in zip(node.keys, node.values):
            if k is None:
                keys |= _dict_keys(v, module) or set()
            elif isinstance(k, ast.Constant) and isinstance(k.value, str):
                keys.add(k.value)
        return keys
    return None


def _module_dicts(path: Path) -> dict[str, ast.AST]:
    """模块级的 ``NAME = dict(...)`` / ``NAME: ... = {...}``，连同同目录 conftest 里的。"""
    found: dict[str, ast.AST] = {}
    for source in (path.parent / "conftest.py", path):
        if not source.exists():
            continue
        for node in ast.parse(source.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                found[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                found[node.target.id] = node.value
    return found


def unstated_engines(path: Path) -> list[str]:
    """这个检查文件里造引擎却没写明 dtype / device 的地方（只看与 HF 比对的文件）。"""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    used |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) for a in n.args.args}
    if not HF_NAMES & used:
        return []
    lines, module, bad = text.splitlines(), _module_dicts(path), []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in ENGINE_CALLS):
            continue
        if any(EXEMPT in lines[i] for i in (call.lineno - 2, call.lineno - 1) if i >= 0):
            continue
        keys = {k.arg for k in call.keywords if k.arg}
        for k in call.keywords:
            if k.arg is None:
                keys |= _dict_keys(k.value, module) or set()
        missing = {"dtype", "device"} - keys
        if missing:
            bad.append(f"{path.relative_to(REPO_ROOT)}:{call.lineno} {call.func.id}(…) " + tr("does not state") + f" {sorted(missing)}")
    return bad


def test_checks_that_compare_with_hf_state_dtype_and_device() -> None:
    """引擎的缺省随设备变（CUDA 上 bf16），HF 参考总是 fp32、在检查的设备上：不写明就会在 GPU 上拿 bf16 比 fp32。"""
    files = sorted((REPO_ROOT / "checks").rglob("test_*.py"))
    bad = [line for f in files for line in unstated_engines(f)]
    assert not bad, tr(
        "A check that compares with Hugging Face must build its engine with an explicit dtype= and device= "
        "(device='auto' follows pytest --device, like the HF reference; mark a deliberate default with '{exempt}'):\n{bad}",
        exempt=EXEMPT, bad="\n".join(bad))


def test_rule_finds_an_unstated_engine(tmp_path: Path) -> None:
    """规则自己不是摆设：少写 device 的造法会被找出来，写全了的不会。"""
    sample = REPO_ROOT / "checks" / "stage1" / "_rule_sample_test.py"
    try:
        sample.write_text(
            "KW = dict(dtype=1, max_running_req=2)\n"
            "def test_x(smollm2_reference):\n"
            "    a = LLM(p, **KW)\n"
            "    b = LLM(p, device='auto', **KW)\n"
            "    c = Engine(EngineConfig(p, dtype=1))\n", encoding="utf-8")
        found = unstated_engines(sample)
    finally:
        sample.unlink()
    assert [line.split(":")[1].split()[0] for line in found] == ["3", "5"], found
