"""服务器的启动（给定的机制，不属于哪一章）：命令行参数定出的 KV 池大小，端口被占、模型路径不对时几秒内给出一行
清楚的错误、非零退出。

en: Starting the server (given machinery, no chapter's): the KV pool size the flags give, and a busy port or a wrong
model path answered within seconds by one clear line and a non-zero exit.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checks.stage3.conftest import START_TIMEOUT_S, Server, stop_server, tiny_model
from minisgl.course import select
from minisgl.i18n import tr




def _pages_total(server: Server) -> int:
    # 调度器的现状随步骤发来：先答一个请求，再等 /metrics 里有了总页数
    # en: the scheduler's state comes with its steps: answer one request first, then wait for the total in /metrics
    server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 1})
    m = server.wait_metrics(lambda m: m.get("minisgl_kv_pages_total", 0) > 0, "minisgl_kv_pages_total > 0")
    return int(m["minisgl_kv_pages_total"])


@pytest.mark.parametrize("flags,pages", [
    # 缺省（CPU）：1.5 × 4 个请求 × 模型的 max_position_embeddings（4096）；--gpu-memory-utilization 是 --mem-fraction-static 的别名
    # en: default (CPU): 1.5 × 4 requests × the model's max_position_embeddings (4096); --gpu-memory-utilization is an
    # en: alias of --mem-fraction-static
    (["--gpu-memory-utilization", "0.3"], 24576),
    (["--max-seq-len", "256", "--mem-fraction-static", "0.3"], 1536),  # 1.5 × 4 × 256
    (["--max-total-tokens", "1000", "--page-size", "4"], 250),  # 1000 个 token ÷ 每页 4 个 | en: 1000 tokens ÷ 4 per page
])
def test_kv_pool_size_from_flags(flags: list[str], pages: int) -> None:
    server = Server(tiny_model(), "--dtype", "float32", "--device", "cpu", "--max-running-req", "4", *flags,
                    env=select.impl_env(), timeout=START_TIMEOUT_S)
    try:
        server.start()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        got = _pages_total(server)
        assert got == pages, tr("python -m minisgl {flags}: expected {pages} KV pages, got {got}", flags=" ".join(flags), pages=pages, got=got)
    finally:
        stop_server(server)


@pytest.mark.parametrize("aliases,value", [
    # SGLang 的 --context-length、vLLM 的 --max-model-len | en: SGLang's --context-length, vLLM's --max-model-len
    (["--max-seq-len", "--context-length", "--max-model-len", "--max-seq-len-override"], "512"),
    (["--mem-fraction-static", "--gpu-memory-utilization", "--memory-ratio"], "0.5"),
    (["--max-running-req", "--max-running-requests"], "3"),
    (["--tp", "--tp-size", "--tensor-parallel-size"], "2"),
    (["--dp", "--dp-size", "--data-parallel-size"], "2"),
])
def test_flag_aliases_parse_the_same(aliases: list[str], value: str) -> None:
    from minisgl.server.args import parse_args

    default = parse_args(["--model", "m"])
    want = parse_args(["--model", "m", aliases[0], value])
    assert want != default, tr("{flag} {value} must change the settings", flag=aliases[0], value=value)
    for flag in aliases[1:]:
        got = parse_args(["--model", "m", flag, value])
        assert got == want, tr("{flag} is an alias of {name}: both must give the same settings, got {got}, expected {want}",
                               flag=flag, name=aliases[0], got=got, want=want)


def _fails_fast(argv: list[str], what: str) -> str:
    """跑 ``python -m minisgl ...``：必须在 5 秒内以非零状态退出，stderr 只有一行、没有调用栈；返回那一行。

    en: Run ``python -m minisgl ...``: it must exit non-zero within 5 s with a single line on stderr and no traceback;
    return that line.
    """
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "minisgl", *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **select.impl_env()}, stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - start
    assert proc.returncode != 0, tr("{what}: the server must exit with a non-zero status, got {code}", what=what, code=proc.returncode)
    assert seconds < 5, tr("{what}: the server must fail within 5 s, before loading the model; it took {seconds:.1f} s", what=what, seconds=seconds)
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and len(lines) == 1, tr("{what}: expected one clear line on stderr and no traceback, got:\n{stderr}", what=what, stderr=proc.stderr)
    return lines[0]


def test_busy_port_fails_fast(tiny_path: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        line = _fails_fast(["--model", tiny_path, "--host", "127.0.0.1", "--port", str(port)], tr("a busy port"))
    assert str(port) in line and "--port" in line, tr("The error must name the port {port} and --port, got: {line}", port=port, line=line)


def test_wrong_model_path_fails_fast(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    for path in (missing, tmp_path):  # 不存在；存在但没有 config.json | en: missing; present but without a config.json
        line = _fails_fast(["--model", str(path), "--host", "127.0.0.1", "--port", "0"], tr("a wrong --model path"))
        assert str(path) in line, tr("The error must name the path {path}, got: {line}", path=path, line=line)
