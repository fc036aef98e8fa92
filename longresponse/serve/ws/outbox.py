"""The connection's outbox: its protocol core and a bounded queue of encoded events.

:class:`Outbox` is a WebSocket connection's
:class:`~longresponse.engine.stream.EventSink`. Every event pushed is checked
and recorded in the server-role protocol ``Connection`` it owns, then encoded
and queued; the queue is bounded in events (``send_queue_depth``) and bytes
(``send_queue_bytes``). A sampling loop that finds it full waits in
:meth:`Outbox.room` (a slow reader slows the stream); if it stays full for
``slow_reader_timeout`` the reader is disconnected (close 1008) and the
socket dropped outright, since a graceful close would wait on a reader that
never reads. Error replies may go past the bound (one per client message).
The session's writer task drains the queue (:meth:`Outbox.write_to`); events
queued together leave in one transport write where the server offers it
(``serve.seam.SEND_TEXTS_KEY``), and a long drain gives the loop a turn every
``WRITE_SLICE_SECONDS``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable

from protocol import CLOSE_CODES, Connection, Mode, ProtocolError, ResponseTrack, Role
from protocol.events import ServerEvent

from ...config import WRITE_BATCH_BYTES, WRITE_SLICE_SECONDS, ServerConfig
from ...engine.stream import PeerGone, ServerClosed
from ..errors import error_frame
from ..types import Send

__all__ = ["WS_PATH", "Outbox"]

#: The path of the WebSocket endpoint, as the refusals' log lines name it.
WS_PATH = "/v1/responses"


class Outbox:
    """The connection's protocol core and its bounded queue of encoded events."""

    def __init__(
        self,
        config: ServerConfig,
        mode: Mode,
        *,
        multi_agent: bool = False,
        drop: Callable[[], object] | None = None,
        send_texts: Callable[[list[bytes]], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self.connection = Connection(
            Role.SERVER,
            mode,
            max_message_bytes=config.max_message_bytes,
            max_items_per_event=config.max_items_per_event,
            multi_agent=multi_agent,
        )
        self._queue: collections.deque[bytes] = collections.deque()
        #: Bytes of the events in the queue.
        self.queued_bytes = 0
        self._ready = asyncio.Event()
        self._space = asyncio.Event()
        self.closing: tuple[int, str] | None = None
        #: Most encoded events ever waiting (never above the depth except for
        #: error replies, one per client message).
        self.high_water = 0
        #: Most bytes ever waiting (above the budget by at most one event, and
        #: by the error replies).
        self.high_water_bytes = 0
        #: The task in :meth:`write_to`, cancelled when a slow reader is abandoned
        #: (it is stuck in a send).
        self._writer: asyncio.Task[None] | None = None
        #: Drops the connection outright (``serve.seam.abort``), given by the endpoint.
        self.drop = drop
        #: Sends several texts in one transport write (``serve.seam.SEND_TEXTS_KEY``).
        self.send_texts = send_texts

    def __len__(self) -> int:
        return len(self._queue)

    # --- the EventSink --------------------------------------------------------

    async def room(self) -> None:
        """Wait while the queue is full. Raises :class:`ServerClosed` if the
        reader stays too slow or the session is closing."""
        await self.below(self.config.send_queue_depth, self.config.send_queue_bytes)

    def push(self, event: ServerEvent) -> None:
        """Check and record ``event`` in the protocol core, queue its bytes (never waits)."""
        self._enqueue(self.connection.send(event))
        self.high_water = max(self.high_water, len(self._queue))

    def track(self, response_id: str) -> ResponseTrack:
        track = self.connection.response(response_id)
        if track is None:  # pragma: no cover - only asked after response.created
            raise KeyError(response_id)
        return track

    def error(self, error: ProtocolError, stream_id: str | None = None) -> None:
        """Queue an ``error`` event, even past the bound (``serve.errors`` builds and
        logs it). Its ``sequence_number`` is the next one of the response it
        names, 0 when it names none."""
        track = self.connection.response(error.response_id) if error.response_id else None
        sequence = track.next_sequence if track is not None else 0
        event = error_frame(error, path=WS_PATH, stream_id=stream_id, sequence_number=sequence)
        self._enqueue(self.connection.send(event))

    def _enqueue(self, data: bytes) -> None:
        self._queue.append(data)
        self.queued_bytes += len(data)
        self.high_water_bytes = max(self.high_water_bytes, self.queued_bytes)
        self._ready.set()

    # --- flow ----------------------------------------------------------------

    async def below(self, limit: int, byte_limit: int) -> None:
        """Wait while the queue holds ``limit`` events or ``byte_limit`` bytes."""
        while len(self._queue) >= limit or self.queued_bytes >= byte_limit:
            if self.closing is not None:
                raise ServerClosed("closing")
            self._space.clear()
            try:
                async with asyncio.timeout(self.config.slow_reader_timeout):
                    await self._space.wait()
            except TimeoutError:
                # The writer is stuck in a send the reader does not drain, so
                # it cannot flush a close frame: abandon the socket instead.
                self.close(CLOSE_CODES["slow_reader"], "slow_reader")
                if self._writer is not None:
                    self._writer.cancel()
                self._queue.clear()
                self.queued_bytes = 0
                if self.drop is not None:
                    self.drop()  # a graceful close would wait to flush what it never reads
                raise ServerClosed("slow_reader") from None

    def close(self, code: int, reason: str) -> None:
        """Ask the writer to flush and close the socket with ``code``."""
        if self.closing is None:
            self.closing = (code, reason)
            self._ready.set()
            self._space.set()

    async def write_to(self, send: Send) -> None:
        """Drain the queue to the socket until the session closes it or the peer is gone."""
        self._writer = asyncio.current_task()
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                turn = time.monotonic()
                while self._queue:
                    texts = self._take_batch()
                    self._space.set()
                    try:
                        if len(texts) > 1 and self.send_texts is not None:
                            await self.send_texts(texts)
                        else:
                            await send({"type": "websocket.send", "text": texts[0].decode()})
                    except Exception as exc:  # the server side of the socket is gone
                        raise PeerGone("send failed") from exc
                    # Not held while the writer waits for the next event: a traceback
                    # that keeps this frame would keep the batch's bytes with it.
                    del texts
                    if time.monotonic() - turn >= WRITE_SLICE_SECONDS:  # others' turn
                        await asyncio.sleep(0)
                        turn = time.monotonic()
                if self.closing is not None:
                    code, reason = self.closing
                    with contextlib.suppress(Exception):
                        await send({"type": "websocket.close", "code": code, "reason": reason})
                    raise ServerClosed("closed by server")
        finally:
            # A cancelled task keeps its error, whose traceback holds this
            # frame: the outbox must not keep the task (a cycle with it, its
            # socket and its connection's state, freed only by a full collection).
            self._writer = None

    def _take_batch(self) -> list[bytes]:
        """The oldest queued event, and with ``send_texts`` those after it that fit a batch."""
        limit = WRITE_BATCH_BYTES if self.send_texts is not None else 0
        texts: list[bytes] = []
        size = 0
        while self._queue and (not texts or size + len(self._queue[0]) <= limit):
            data = self._queue.popleft()
            self.queued_bytes -= len(data)
            size += len(data)
            texts.append(data)
        return texts
