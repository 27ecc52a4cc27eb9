"""启动期间的 503（给定）。启动器一开始就占住端口、开始监听（端口被占时几秒内就能报错），可工作进程加载模型、
``--dp`` 的副本起来要好几秒到几分钟；这期间 uvicorn 还没接手，连上来的请求没人答，只会挂着。:class:`Standby`
是监听套接字上的一个小线程：每个请求都回 503 ``{"status": "starting", "error": {...}}``（带 ``Retry-After``），
马上关掉连接。uvicorn 接手之前 :meth:`Standby.stop` 停下它并等它答完手上那一个，之后的连接留在队列里，由 uvicorn 接收。

en: The 503 while starting (given). The launcher takes its port and listens at once (so a busy port is reported within
seconds), but loading the model on the workers, or starting the ``--dp`` replicas, takes seconds to minutes; until
uvicorn takes over, a request that connects gets no answer and just hangs. :class:`Standby` is a small thread on the
listening socket: every request gets 503 ``{"status": "starting", "error": {...}}`` (with ``Retry-After``) and the
connection is closed at once. Before uvicorn takes over, :meth:`Standby.stop` stops it and waits for the one it is
answering; later connections wait in the backlog for uvicorn.
"""

from __future__ import annotations

import json
import select
import socket
import threading

from minisgl.i18n import tr

#: 线程多久（秒）看一眼是否该停下。
#: en: How often (seconds) the thread looks whether it must stop.
POLL_S = 0.1
#: 读一个请求最多等多久（秒）：慢吞吞的客户端不能拖住交接。
#: en: The longest (seconds) reading one request may take: a slow client must not hold up the handover.
READ_TIMEOUT_S = 1.0
#: 最多读多少字节的请求（头和正文）；再多就不读了，直接回答。
#: en: The most bytes of a request (head and body) read; beyond that, answer without reading on.
MAX_READ = 1 << 20


def starting_response() -> bytes:
    """回给每个请求的那一整个 HTTP 回答：503，JSON 里既有 ``status``（给健康检查），也有 OpenAI 样子的 ``error``。

    en: The whole HTTP answer every request gets: 503, with both a ``status`` (for health checks) and an OpenAI-style
    ``error`` in the JSON.
    """
    message = tr("The server is starting (loading the model); try again in a moment")
    body = json.dumps({"status": "starting", "error": {"message": message, "type": "service_unavailable", "param": None,
                                                       "code": "starting"}}, ensure_ascii=False).encode()
    head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
    return head.encode() + body


def content_length(head: bytes) -> int:
    """请求头里的 ``Content-Length``（没有或不是数字时为 0）。

    en: The ``Content-Length`` of a request head (0 when missing or not a number).
    """
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return int(value)
    return 0


class Standby:
    """在 ``sock`` 上回答 503 的后台线程，创建时就开始；:meth:`stop` 之后套接字完全交给别人。

    en: The background thread answering 503 on ``sock``, started on creation; after :meth:`stop` the socket belongs to
    someone else entirely.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.response = starting_response()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="minisgl-standby", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """停下线程，等它答完手上的请求（可以调用多次）。

        en: Stop the thread, waiting for it to finish the request in hand (may be called more than once).
        """
        self.stopping.set()
        self.thread.join()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                readable, _, _ = select.select([self.sock], [], [], POLL_S)
                if not readable:
                    continue
                conn, _ = self.sock.accept()
            except (OSError, ValueError):  # 套接字已经关了 | en: the socket is closed already
                return
            with conn:
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        """读完请求（头，以及 ``Content-Length`` 说的正文：没读的数据留在内核里，关连接时会变成 RST，客户端就读不到回答了），
        回 503，关掉写的一端。

        en: Read the request (the head, and the body ``Content-Length`` announces: unread data left in the kernel turns
        the close into an RST, and the client would not read the answer), answer 503, shut the writing side.
        """
        conn.settimeout(READ_TIMEOUT_S)
        try:
            data = b""
            while b"\r\n\r\n" not in data and len(data) < MAX_READ and (chunk := conn.recv(65536)):
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            while len(body) < min(content_length(head), MAX_READ) and (chunk := conn.recv(65536)):
                body += chunk
            conn.sendall(self.response)
            conn.shutdown(socket.SHUT_WR)
        except OSError:  # 客户端先走了，或者太慢 | en: the client left first, or was too slow
            pass
