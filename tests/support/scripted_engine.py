"""A raw HTTP peer that answers every request with a fixed script of bytes.

It stands in for a third-party engine that misbehaves in a way no real
longresponse can be made to (an event that is not JSON, a request read and
then dropped, an error body that stalls): the engines that do such things
cannot run on this machine. It speaks only what the script says; the tests
that use it name what it stands in for.

A script is a list of steps: ``bytes`` are written, a ``float`` is a pause
in seconds, :data:`CLOSE` drops the connection and :data:`STALL` holds it
open without a word until the peer stops. The gateway's question at start,
``GET /v1/models`` (``longresponse/backends/served_model.py``), is answered
503 apart from the script and not counted: the gateway then leaves it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

CLOSE: Final = "close"
STALL: Final = "stall"
Step = bytes | float | str


def sse(*events: dict[str, Any] | bytes) -> bytes:
    """A ``200`` event-stream head (the connection closes after it) and ``events``."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
    body = b"".join(
        b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n"
        for e in events
    )
    return head + body


class ScriptedEngine:
    """The peer on 127.0.0.1, in a thread; ``bodies`` holds the requests' bodies."""

    def __init__(self, script: Sequence[Step]) -> None:
        self.script = list(script)
        self.bodies: list[bytes] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),))

    @property
    def requests(self) -> int:
        return len(self.bodies)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._stop is not None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"GET ") and b"/models " in head.split(b"\r\n", 1)[0]:
                writer.write(b"HTTP/1.1 503 X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                await writer.drain()
                return
            length = 0
            for line in head.decode("latin-1").split("\r\n"):
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            self.bodies.append(await reader.readexactly(length))
            for step in self.script:
                if step == CLOSE:
                    break
                if step == STALL:
                    await self._stop.wait()
                elif isinstance(step, float):
                    await asyncio.sleep(step)
                elif isinstance(step, bytes):
                    writer.write(step)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @contextmanager
    def running(self) -> Iterator[ScriptedEngine]:
        self._thread.start()
        self._ready.wait(10)
        try:
            yield self
        finally:
            assert self._stop is not None
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
            self._loop.close()
