"""A stand-in for a third-party Chat Completions engine, on a raw socket.

Some ways an engine misbehaves cannot be made from a real longresponse
process (a stream cut in the middle of a tool call, an ``error`` record of
vLLM's shape, call pieces without ``index`` as older Ollama sends them, a
reasoning model's ``reasoning_content``), and the engines that do them
cannot run on this machine. :class:`StandIn` speaks just enough HTTP/1.1 for
the gateway's ``httpx`` client: it reads each request (head and
``content-length`` body), records it, and writes the bytes a test scripted
for it; a connection is kept open between requests unless the script says
``CLOSE``. Nothing in it is a double of the gateway: the gateway's real
client, reader and mapping read what it writes.

The gateway asks an engine which models it serves as it starts
(``GET /v1/models``, ``longresponse/backends/served_model.py``). That
question is answered apart from the script and neither counted among the
requests nor its connection among the connections: with the ``models``
given, their list; without, 503 (the gateway then leaves the question to
the engine's answers).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["CLOSE", "StandIn", "answer", "choice", "cut", "record"]

#: A script step: close the connection now (the engine broke off).
CLOSE = "CLOSE"

Step = bytes | float | str
Script = Callable[[int, dict[str, Any]], list[Step]]


def record(payload: Any) -> bytes:
    """One SSE ``data:`` record (``[DONE]`` as given)."""
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {text}\n\n".encode()


def choice(delta: dict[str, Any] | None = None, finish: str | None = None) -> bytes:
    return record({"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]})


def answer(*records: bytes, status: int = 200, headers: dict[str, str] | None = None) -> bytes:
    """A whole answer with its length (the connection can be used again)."""
    body = b"".join(records)
    kind = "text/event-stream" if status == 200 else "application/json"
    head = [f"HTTP/1.1 {status} X", f"content-type: {kind}", f"content-length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def cut(*records: bytes) -> list[Step]:
    """A stream that starts, sends ``records`` and breaks off (no length, then closed)."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
    return [head, *records, 0.05, CLOSE]


class StandIn:
    """The engine: ``script(n, body)`` gives the steps answering the n-th request
    (1-based; bytes are written, a float is a pause in seconds, ``CLOSE`` closes)."""

    def __init__(self, script: Script, models: list[str] | None = None) -> None:
        self.script = script
        self.models = models
        #: The ``GET /v1/models`` questions it was asked (never in ``requests``).
        self.listings = 0
        self.requests: list[dict[str, Any]] = []
        #: Each request's headers (names in lower case), in step with ``requests``.
        self.headers: list[dict[str, str]] = []
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def __enter__(self) -> StandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _listing(self) -> bytes:
        if self.models is None:
            return answer(b'{"error": {"message": "no model list here"}}', status=503)
        data = [{"id": name, "object": "model"} for name in self.models]
        body = json.dumps({"object": "list", "data": data}).encode()
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
        return head.encode() + b"\r\n\r\n" + body

    def _serve(self, conn: socket.socket) -> None:
        buffered = b""
        counted = False
        with conn:
            while True:
                while b"\r\n\r\n" not in buffered:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffered += data
                head, buffered = buffered.split(b"\r\n\r\n", 1)
                if head.startswith(b"GET ") and b"/models " in head.split(b"\r\n", 1)[0]:
                    with self._lock:
                        self.listings += 1
                    conn.sendall(self._listing())
                    continue
                if not counted:
                    counted = True
                    with self._lock:
                        self.connections += 1
                headers = {}
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", 0))
                while len(buffered) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffered += data
                body, buffered = buffered[:length], buffered[length:]
                with self._lock:
                    self.requests.append(json.loads(body) if body else {})
                    self.headers.append(headers)
                    number = len(self.requests)
                try:
                    for step in self.script(number, self.requests[-1]):
                        if step == CLOSE:
                            return
                        if isinstance(step, float):
                            time.sleep(step)
                        elif isinstance(step, bytes):
                            conn.sendall(step)
                except OSError:
                    return
