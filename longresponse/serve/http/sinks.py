"""The sinks of the HTTP path: every event through a server-role protocol Connection.

An HTTP JSON request keeps only the final Response, but its events are still
checked and recorded by the protocol core (:class:`RecordingSink`, framing
none). A streaming request (``stream: true``) gets each event as a
Server-Sent Events record from the same core (:class:`SSESink`, framing
SSE), in a buffer bounded in records and bytes; a reader that leaves it full
for the slow-reader timeout is cut off and its connection dropped.

Every Responses SSE stream that runs to its end ends with :data:`SSE_DONE`
after its last event, as the Open Responses spec ends one (its strict
clients fail without it); the official SDKs and Codex stop at the terminal
event or skip it.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Final

from protocol import Connection, Framing, Mode, ResponseTrack, Role
from protocol.events import ServerEvent

from ...engine.stream import ServerClosed

__all__ = ["SSE_DONE", "SSE_QUEUE_BYTES", "SSE_QUEUE_DEPTH", "RecordingSink", "SSESink"]

#: The record after the last event of a stream (Open Responses: ``data: [DONE]``).
SSE_DONE: Final = b"data: [DONE]\n\n"

#: Events buffered between a streaming rollout and its SSE response, and
#: their most bytes (a record is one whole event; the bound is checked before
#: each event, so one large event may pass it).
SSE_QUEUE_DEPTH: Final = 256
SSE_QUEUE_BYTES: Final = 1024 * 1024


class RecordingSink:
    """The sink of an HTTP JSON request: the protocol core checks and records
    every event, nothing is encoded (only the final Response is sent)."""

    def __init__(self) -> None:
        self.connection = Connection(Role.SERVER, Mode.SHIPPED, framing=Framing.NONE)

    async def room(self) -> None:
        return None

    def push(self, event: ServerEvent) -> None:
        self.connection.send(event)

    def track(self, response_id: str) -> ResponseTrack:
        track = self.connection.response(response_id)
        assert track is not None  # asked only after response.created
        return track


class SSESink(RecordingSink):
    """A bounded buffer of SSE records between a rollout and its streaming response.

    Bounded in records and in bytes. A reader that leaves it full for
    ``slow_reader_timeout`` is cut off: ``drop`` aborts its connection (so
    the server's send buffer is freed too) and the rollout stops.
    """

    def __init__(
        self,
        depth: int,
        *,
        max_bytes: int = SSE_QUEUE_BYTES,
        slow_reader_timeout: float = 30.0,
        drop: Callable[[], object] | None = None,
    ) -> None:
        self.connection = Connection(Role.SERVER, Mode.SHIPPED, framing=Framing.SSE)
        self._records: collections.deque[bytes | None] = collections.deque()
        self._bytes = 0
        self._depth = depth
        self._max_bytes = max_bytes
        self._timeout = slow_reader_timeout
        self._drop = drop
        self._ready = asyncio.Event()
        self._space = asyncio.Event()

    async def room(self) -> None:
        while len(self._records) >= self._depth or self._bytes >= self._max_bytes:
            self._space.clear()
            try:
                async with asyncio.timeout(self._timeout):
                    await self._space.wait()
            except TimeoutError:
                self._records.clear()
                self._bytes = 0
                if self._drop is not None:
                    self._drop()
                raise ServerClosed("slow_reader") from None

    @property
    def queued_bytes(self) -> int:
        """Bytes of the records waiting (the inspector reads each event's size here)."""
        return self._bytes

    def push(self, event: ServerEvent) -> None:
        record = self.connection.send(event)
        self._records.append(record)
        self._bytes += len(record)
        self._ready.set()

    def end(self) -> None:
        self._records.append(None)
        self._ready.set()

    async def next(self) -> bytes | None:
        """The next SSE record, or ``None`` at the end of the stream."""
        while not self._records:
            self._ready.clear()
            await self._ready.wait()
        self._space.set()
        record = self._records.popleft()
        if record is not None:
            self._bytes -= len(record)
        return record
