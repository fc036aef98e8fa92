"""The WebSocket seam: one pure-ASGI endpoint, a bounded outbox, a session of tasks.

Theory of operation
-------------------
``GET /v1/responses`` upgraded to a WebSocket reaches :class:`ResponsesEndpoint`,
which checks the API key (401 before any state is created), picks the
connection's mode from the handshake (append mode when asked for by
subprotocol or beta header, the shipped shape otherwise; the multi-agent beta,
``response.inject``, by its own beta header) and runs a :class:`Session`.

The :class:`Outbox` is the connection's :class:`EventSink`: it owns the
server-role protocol ``Connection`` (every event is checked and recorded
there, then encoded) and a queue of encoded events bounded in events
(``send_queue_depth``) and in bytes (``send_queue_bytes``). A sampling loop
that finds it full waits (a slow reader slows the stream); if it stays full
for ``slow_reader_timeout`` the reader is disconnected (close 1008) and the
socket abandoned. Error replies may go past the bound: at most one per client
message, and the reader is what limits client messages (it stops reading
while the queue is over twice either bound). Events queued together go out
in one transport write where the server can (``serve.seam.SEND_TEXTS_KEY``).

The :class:`Session` owns tasks only, in one :class:`asyncio.TaskGroup`: the
reader (messages into the protocol core, then to the shape), the writer (the
outbox to the socket), the lifetime timer, and whatever the shape spawns
(one sampling loop per rollout, one task per lane). The shape is
:class:`~longresponse.serve.append.AppendShape` or
:class:`~longresponse.serve.shipped.ShippedShape`. Request errors become
one ``error`` event (or the reply the protocol core attached, such as
``response.inject.failed``); nothing changes and the connection stays usable,
unless the core says it must close (a schema-invalid ``response.inject``).

Graceful shutdown (:meth:`ResponsesEndpoint.drain`, called before uvicorn
shuts its connections: ``longresponse.serve.shutdown``): every session stops
taking client messages and drops the requests still queued, lets its running
turns finish (a paused rollout is not running: it waits for its client), then
closes with 1012 (Service Restart: clients reconnect and resend). A session
still busy when the drain timeout runs out is closed 1012 at once, its turns
cut off.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, Protocol

from protocol import (
    APPEND_BETA_HEADER,
    APPEND_SUBPROTOCOL,
    CLOSE_CODES,
    TIMING_HEADER,
    Connection,
    ErrorCode,
    Mode,
    ProtocolError,
    RemoteProtocolError,
    ResponseTrack,
    Role,
    error_event,
)
from protocol.events import ClientEvent, ResponseCreate, ServerEvent

from ..config import WRITE_BATCH_BYTES, WRITE_SLICE_SECONDS, ServerConfig
from ..engine.stream import PeerGone, ServerClosed, StreamClosed
from ..storage.keys import ApiKeys, Unauthorized
from .append import AppendShape
from .seam import SEND_TEXTS_KEY, abort
from .shipped import ShippedShape
from .turns import Turns

__all__ = [
    "DRAIN_POLL_INTERVAL",
    "MULTI_AGENT_BETA",
    "ASGIReceive",
    "ASGISend",
    "Outbox",
    "ResponsesEndpoint",
    "Session",
]

log = logging.getLogger(__name__)

#: The ``OpenAI-Beta`` value that opens a connection to the multi-agent beta
#: (``response.inject`` and ``multi_agent`` creates in the shipped shape).
MULTI_AGENT_BETA: Final = "responses_multi_agent=v1"
#: How often a graceful shutdown looks which sessions' turns are done (it
#: polls, as uvicorn's own shutdown does: a turn ends in many places).
DRAIN_POLL_INTERVAL: Final = 0.02

ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]


class Shape(Protocol):
    """What a connection speaks, given decoded, checked and admitted client events."""

    def admit(self, event: ClientEvent, track: ResponseTrack | None) -> ClientEvent: ...

    def handle(self, event: ClientEvent, received_at: float, decode: float) -> None: ...

    @property
    def busy(self) -> bool:
        """A turn is running (graceful shutdown waits for it)."""

    def stop_intake(self) -> None: ...


class _SessionOver(Exception):
    """Raised inside the session's task group to end every task it holds."""


class Outbox:
    """The connection's protocol core and its bounded queue of encoded events."""

    def __init__(self, config: ServerConfig, mode: Mode, *, multi_agent: bool = False) -> None:
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
        #: Cancelled when a slow reader is abandoned (it is stuck in a send).
        self.writer: asyncio.Task[None] | None = None
        #: Drops the connection outright (``serve.seam.abort``), set by the endpoint.
        self.drop: Callable[[], object] | None = None
        self.send_texts: Callable[[list[str]], Awaitable[None]] | None = None  # seam

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
        """Queue an ``error`` event, even past the bound."""
        self._enqueue(self.connection.send(error_event(error, stream_id=stream_id)))

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
                if self.writer is not None:
                    self.writer.cancel()
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

    async def write_to(self, send: ASGISend) -> None:
        """Drain the queue to the socket until the session closes it or the peer is gone."""
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
                        await send({"type": "websocket.send", "text": texts[0]})
                except Exception as exc:  # the server side of the socket is gone
                    raise PeerGone("send failed") from exc
                if time.monotonic() - turn >= WRITE_SLICE_SECONDS:  # others' turn
                    await asyncio.sleep(0)
                    turn = time.monotonic()
            if self.closing is not None:
                code, reason = self.closing
                with contextlib.suppress(Exception):
                    await send({"type": "websocket.close", "code": code, "reason": reason})
                raise ServerClosed("closed by server")

    def _take_batch(self) -> list[str]:
        """The oldest queued event, and with ``send_texts`` those after it that fit a batch."""
        limit = WRITE_BATCH_BYTES if self.send_texts is not None else 0
        texts: list[str] = []
        size = 0
        while self._queue and (not texts or size + len(self._queue[0]) <= limit):
            data = self._queue.popleft()
            self.queued_bytes -= len(data)
            size += len(data)
            texts.append(data.decode())
        return texts


class Session:
    """One connection's tasks; its protocol state is in the outbox, its rollouts in the shape."""

    def __init__(
        self,
        config: ServerConfig,
        turns: Turns,
        *,
        mode: Mode = Mode.APPEND,
        send_timing: bool = False,
        owner: str = "",
        multi_agent: bool = False,
    ) -> None:
        self.config = config
        self.outbox = Outbox(config, mode, multi_agent=multi_agent)
        self._tasks: asyncio.TaskGroup | None = None
        #: The shipped shape's lanes and segment cache (shipped mode only).
        self.shipped: ShippedShape | None = None
        #: Append mode's rollouts (append mode only).
        self.append: AppendShape | None = None
        self.shape: Shape
        if mode is Mode.SHIPPED:
            self.shape = self.shipped = ShippedShape(
                config,
                turns,
                self.outbox,
                spawn=self.spawn,
                send_timing=send_timing,
                owner=owner,
                multi_agent=multi_agent,
            )
        else:
            self.shape = self.append = AppendShape(
                config, turns, self.outbox, spawn=self.spawn, send_timing=send_timing, owner=owner
            )
        self._decoded_at = 0.0
        #: Graceful shutdown has begun: client messages are no longer read.
        self.draining = False

    # what tests and operators look at
    @property
    def connection(self) -> Connection:
        return self.outbox.connection

    @property
    def rollouts(self) -> dict[str, Any]:
        return self.append.rollouts if self.append is not None else {}

    @property
    def _outbox(self) -> Outbox:
        return self.outbox

    @property
    def outbox_high_water(self) -> int:
        return self.outbox.high_water

    @property
    def close_reason(self) -> str | None:
        """Why the server closed this session, if it did."""
        return self.outbox.closing[1] if self.outbox.closing is not None else None

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Start a task owned by this session (it ends when the session does)."""
        if self._tasks is None:  # pragma: no cover - only called while serving
            raise RuntimeError("the session is not serving")
        return self._tasks.create_task(coroutine)

    async def serve(self, receive: ASGIReceive, send: ASGISend) -> None:
        """Run the session until the peer leaves or we close it."""
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                writer = self.outbox.writer = tasks.create_task(self.outbox.write_to(send))
                reader = tasks.create_task(self._read_loop(receive))
                tasks.create_task(self._expire())
                await asyncio.wait({writer, reader}, return_when=asyncio.FIRST_COMPLETED)
                raise _SessionOver  # cancels every task the group still holds
        except* (StreamClosed, _SessionOver):
            pass

    async def _expire(self) -> None:
        """The connection lifetime limit: an error event, then a normal close."""
        await asyncio.sleep(self.config.connection_lifetime)
        minutes = self.config.connection_lifetime / 60
        self.outbox.error(
            RemoteProtocolError(
                f"The connection reached its {minutes:g}-minute limit; open a new one to go on.",
                code=ErrorCode.WEBSOCKET_CONNECTION_LIMIT_REACHED,
            )
        )
        self.outbox.close(int(CLOSE_CODES["connection_limit_reached"]), "connection limit reached")

    async def _read_loop(self, receive: ASGIReceive) -> None:
        while True:
            message = await receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                self.connection.receive_closed()
                return
            if kind != "websocket.receive":
                continue
            # Stop reading while the outbox is over twice its bounds: TCP then
            # pushes back on a client that writes without reading (only error
            # replies can take it there; sampling stops at the bounds, so a
            # paced stream never starves the reader of its turn).
            await self.outbox.below(
                2 * self.config.send_queue_depth, 2 * self.config.send_queue_bytes
            )
            received_at = time.perf_counter()
            data = message.get("text")
            if data is None:
                data = message.get("bytes") or b""
            self.handle_message(data, received_at)

    def handle_message(self, data: str | bytes, received_at: float) -> None:
        """Decode, check, admit and act on one client message; errors become error events.

        Once the session is closing (draining, or closed for a bad inject),
        messages are dropped unread; on a 1012 the client resends them on its
        next connection.
        """
        if self.draining or self.outbox.closing is not None:
            return
        self._decoded_at = received_at
        event: object = None
        try:
            self.connection.receive_message(data, admit=self._admit)
            event = self.connection.next_event()
            decode = self._decoded_at - received_at
            self.shape.handle(event, received_at, decode)  # type: ignore[arg-type]
        except ProtocolError as error:
            if error.code == ErrorCode.INVALID_STREAM_ID:
                error.stream_id = None  # the refused name is not a lane
            elif isinstance(event, ResponseCreate) and isinstance(event.stream_id, str):
                error.stream_id = event.stream_id
            if error.reply is not None:
                self.outbox.push(error.reply)  # e.g. response.inject.failed
            else:
                self.outbox.error(error)
            if error.close_code is not None:
                self.outbox.close(error.close_code, error.code)

    def _admit(self, event: ClientEvent, track: ResponseTrack | None) -> ClientEvent:
        self._decoded_at = time.perf_counter()  # decoded and checked: admission starts
        return self.shape.admit(event, track)

    # --- graceful shutdown ----------------------------------------------------

    def stop_intake(self) -> None:
        """Drop client messages from now on, and the requests still queued."""
        self.draining = True
        self.shape.stop_intake()

    @property
    def busy(self) -> bool:
        """A turn is running on this connection."""
        return self.shape.busy

    def restart(self) -> None:
        """Close with 1012, Service Restart, once the events already queued are out
        (a no-op if the session is already closing)."""
        self.stop_intake()
        self.outbox.close(int(CLOSE_CODES["server_shutdown"]), "service restart")


class ResponsesEndpoint:
    """The WebSocket endpoint of ``/v1/responses`` (pure ASGI)."""

    def __init__(self, config: ServerConfig, turns: Turns, keys: ApiKeys | None = None) -> None:
        self.config = config
        self.turns = turns
        self.keys = keys or ApiKeys()
        self.live_sessions = 0  # for tests and metrics
        self.last_session: Session | None = None
        #: The sessions being served, for a graceful shutdown.
        self.sessions: set[Session] = set()
        self.draining = False

    def wants_append(self, scope: dict[str, Any], headers: dict[str, list[str]]) -> bool:
        if APPEND_SUBPROTOCOL in scope.get("subprotocols", []):
            return True
        return APPEND_BETA_HEADER in _betas(headers)

    async def drain(self, *, abandon: Callable[[], bool] = lambda: False) -> None:
        """Graceful shutdown: every session stops reading, and closes 1012 as soon as
        no turn of it is running; returns when every session has ended.

        If ``abandon()`` turns true, or the drain is cancelled (the caller's
        timeout), every session still open is closed 1012 at once, its turns
        cut off.
        """
        self.draining = True
        try:
            for session in list(self.sessions):
                session.stop_intake()
            while self.sessions and not abandon():
                for session in list(self.sessions):
                    if not session.busy:
                        session.restart()
                await asyncio.sleep(DRAIN_POLL_INTERVAL)
        finally:
            if self.sessions:
                log.warning("shutdown: closing %d busy sessions now", len(self.sessions))
            for session in list(self.sessions):
                session.restart()

    async def _refuse(self, scope: dict[str, Any], send: ASGISend, message: str) -> None:
        body = json.dumps(
            {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            }
        ).encode()
        if "websocket.http.response" in scope.get("extensions", {}):
            headers = [(b"content-type", b"application/json")]
            await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:  # pragma: no cover - servers without the denial extension answer 403
            await send({"type": "websocket.close", "code": 1008})

    async def __call__(self, scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":  # pragma: no cover - ASGI contract
            return
        headers = _headers(scope)
        try:
            authorization = headers.get("authorization", [])
            owner = self.keys.owner(authorization[0] if authorization else None)
        except Unauthorized as exc:
            await self._refuse(scope, send, str(exc))
            return
        subprotocol = (
            APPEND_SUBPROTOCOL if APPEND_SUBPROTOCOL in scope.get("subprotocols", []) else None
        )
        timing = any(v.strip().lower() == "true" for v in headers.get(TIMING_HEADER, []))
        mode = Mode.APPEND if self.wants_append(scope, headers) else Mode.SHIPPED
        session = Session(
            self.config,
            self.turns,
            mode=mode,
            send_timing=timing,
            owner=owner,
            multi_agent=MULTI_AGENT_BETA in _betas(headers),
        )
        if self.draining:  # accepted as the server began to stop: it will not serve
            session.restart()
        session.outbox.drop = lambda: abort(scope, "slow WebSocket reader")
        session.outbox.send_texts = scope.get(SEND_TEXTS_KEY)
        # Counted before the handshake completes, so a client that sees the
        # 101 also sees its session counted.
        self.live_sessions += 1
        self.last_session = session
        self.sessions.add(session)
        try:
            await send({"type": "websocket.accept", "subprotocol": subprotocol})
            await session.serve(receive, send)
        finally:
            self.live_sessions -= 1
            self.sessions.discard(session)


def _betas(headers: dict[str, list[str]]) -> set[str]:
    """The ``OpenAI-Beta`` values: each header may be a comma-separated list."""
    return {b.strip() for value in headers.get("openai-beta", []) for b in value.split(",")}


def _headers(scope: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in scope.get("headers", []):
        out.setdefault(key.decode("latin-1").lower(), []).append(value.decode("latin-1"))
    return out
