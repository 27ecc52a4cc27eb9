"""第 3.4 章示例：在空闲端口上启动服务（小 Qwen3），看一次流式请求的原始 SSE、一次非流式回答里的 usage 和
finish_reason、一个坏请求的错误正文，最后关掉服务。

    python examples/chapters/api_server.py

en: Chapter 3.4 example: start the service on a free port (the tiny Qwen3), look at the raw SSE of a streamed request,
the usage and finish_reason of a non-streamed answer and the error body of a bad request, then stop the service.

    python examples/chapters/api_server.py
"""

import json
import re
import urllib.error
import urllib.request

from minisgl.processes.harness import ServerProcess
from minisgl.i18n import tr
from minisgl.model_zoo import tiny_qwen3


def post(url: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def stable(line: str) -> str:
    """遮住每次都不同的字段（时间戳）。

    en: Mask the fields that differ every run (the timestamp).
    """
    return re.sub(r'"created": ?\d+', '"created": …', line)


with ServerProcess(tiny_qwen3(), "--dtype", "float32", "--num-pages", "512", "--max-seq-len", "256") as server:
    body = {"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    print(tr("POST /v1/completions with \"stream\": true — the raw server-sent events:"))
    status, text = post(f"{server.url}/v1/completions", body)
    for line in text.splitlines():
        if line:
            print("  " + stable(line))
    status, text = post(f"{server.url}/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0})
    answer = json.loads(text)
    print(tr("\nPOST /v1/chat/completions, not streamed: status {status}, finish_reason {reason!r}, usage {usage}",
             status=status, reason=answer["choices"][0]["finish_reason"], usage=answer["usage"]))
    status, text = post(f"{server.url}/v1/completions", {"prompt": "Hi", "max_tokens": 4, "suffix": " world"})
    print(tr("\nA parameter that would change the result but is not supported: status {status}", status=status))
    print("  " + text)
print(tr("\nstopped: exit code {code}, processes left behind: {n}", code=server.proc.returncode, n=len(server.left_behind)))
