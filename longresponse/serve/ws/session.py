"""The WebSocket seam: one pure-ASGI endpoint, a bounded outbox, a session of tasks.

Theory of operation
-------------------
``GET /v1/responses`` upgraded to a WebSocket reaches :class:`ResponsesEndpoint`,
which checks the API key (401 before any state is created), picks the
connection's transport from the handshake (append mode when asked for by
subprotocol or beta header, the shipped shape, ``ws``, otherwise; the multi-agent beta,
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
:class:`~longresponse.serve.ws.append.AppendShape` or
:class:`~longresponse.serve.ws.shipped.ShippedShape`. Request errors become
one ``error`` event (or the reply the protocol core attached, such as
``response.inject.failed``); nothing changes and the connection stays usable,
unless the core says it must close (a schema-invalid ``response.inject``).

Graceful shutdown (:meth:`ResponsesEndpoint.drain`, called before uvicorn
shuts its connections: ``longresponse.serve.shutdown``): every session stops
taking client messages and drops the requests still queued, lets its running
turns finish (a paused rollout is not running: it waits for its client), then
closes with 1012 (Service Restart: clients reconnect and resend). A session
still busy when the drain timeout runs out is closed 1012 at once, its turns
cut off (given up to ``DRAIN_FLUSH_TIMEOUT`` to send what it queued).

Whenever the server closes a connection itself (1012, the lifetime limit, a
bad inject), the shape first hands back the input it accepted and will not
deliver (the shipped shape's steers, ``response.steer.failed``), so it leaves
before the close frame; a connection that ends otherwise (the client closed
it, or it was lost) leaves nobody to tell, and its steers are logged and
counted as dropped (``longresponse.serve.ws.steering``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, Protocol

from protocol import (
    APPEND_SUBPROTOCOL,
    CLOSE_CODES,
    TIMING_HEADER,
    Connection,
    ErrorCode,
    ProtocolError,
    RemoteProtocolError,
    ResponseTrack,
)
from protocol.events import (
    ClientEvent,
    ResponseAppend,
    ResponseCreate,
    ResponseInject,
    ResponseSteer,
)
from protocol.items import as_items

from ...config import ServerConfig
from ...engine.stream import StreamClosed
from ...storage.keys import ApiKeys, Unauthorized
from ..continuation import Continuation
from ..errors import error_body, log_refusal
from ..inspector.records import ConnectionRecord
from ..references import resolve_references
from ..request_ids import request_id
from ..seam import SEND_TEXTS_KEY, abort
from ..skeleton import check_create_skeleton
from ..transport import Transport
from ..turns import Turns
from ..types import Receive, Scope, Send
from .admitted import Admitted
from .append import AppendShape
from .outbox import Outbox
from .shipped import ShippedShape

__all__ = [
    "DRAIN_FLUSH_TIMEOUT",
    "DRAIN_POLL_INTERVAL",
    "MULTI_AGENT_BETA",
    "TOO_MANY_CONNECTIONS",
    "Outbox",
    "ResponsesEndpoint",
    "Session",
]

log = logging.getLogger(__name__)

#: The ``OpenAI-Beta`` value that opens a connection to the multi-agent beta
#: (``response.inject`` and ``multi_agent`` creates in the shipped shape).
MULTI_AGENT_BETA: Final = "responses_multi_agent=v1"
#: The error code of a handshake beyond ``--max-connections-per-key`` (HTTP 429).
TOO_MANY_CONNECTIONS: Final = "too_many_connections"
#: How often a graceful shutdown looks which sessions' turns are done (it
#: polls, as uvicorn's own shutdown does: a turn ends in many places).
DRAIN_POLL_INTERVAL: Final = 0.02
#: How long, at most, sessions closed 1012 when the drain timeout ran out get to
#: send what they queued (their steers handed back, the close frame) before
#: uvicorn shuts their sockets.
DRAIN_FLUSH_TIMEOUT: Final = 1.0


class Shape(Protocol):
    """What a connection speaks, given decoded, checked and admitted client events."""

    def admit(self, event: ClientEvent, track: ResponseTrack | None, size: int) -> Admitted:
        """Admit ``event`` (a message of ``size`` bytes) for the response ``track``
        (the protocol core's ``admit`` hook). Raises :class:`ProtocolError` to
        refuse it: nothing is recorded."""

    def handle(self, admitted: Admitted, received_at: float, decode: float) -> None:
        """Act on an event recorded by the protocol core, as :meth:`admit` admitted it."""

    @property
    def busy(self) -> bool:
        """A turn is running (graceful shutdown waits for it)."""

    def stop_intake(self) -> None: ...

    def hand_back(self, why: str) -> None:
        """The server closes the connection now (``why``, said to the client): hand
        back the input accepted and not yet delivered."""


class _Tasks:
    """A session's running tasks, in its task group while it serves; called
    with a coroutine, starts it there."""

    __slots__ = ("group", "running")

    def __init__(self) -> None:
        self.group: asyncio.TaskGroup | None = None
        #: The group's tasks not yet done (the group keeps no public list).
        self.running: set[asyncio.Task[None]] = set()

    def __call__(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        if self.group is None:  # as the group refuses once it is shutting down
            coroutine.close()
            raise RuntimeError("the session is not serving")
        task = self.group.create_task(coroutine)
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        return task

    def open(self, group: asyncio.TaskGroup) -> None:
        """Start tasks in ``group`` from now on."""
        self.group = group

    def close(self) -> None:
        """Start no more tasks (the group has ended)."""
        self.group = None

    def cancel(self) -> None:
        """Cancel every task, and start no more."""
        self.close()
        for task in list(self.running):
            task.cancel()


class Session:
    """One connection's tasks; its protocol state is in the outbox, its rollouts in the shape."""

    def __init__(
        self,
        config: ServerConfig,
        turns: Turns,
        *,
        transport: Transport = Transport.APPEND,
        send_timing: bool = False,
        owner: str = "",
        multi_agent: bool = False,
        drop: Callable[[], object] | None = None,
        send_texts: Callable[[list[bytes]], Awaitable[None]] | None = None,
    ) -> None:
        """``drop`` drops the connection outright (a slow reader); ``send_texts``
        sends several texts in one transport write, where the server can."""
        self.config = config
        self.turns = turns
        #: The API key's owner (``""`` with keys off): whose turn its checks take.
        self.owner = owner
        self.outbox = Outbox(
            config, transport.mode, multi_agent=multi_agent, drop=drop, send_texts=send_texts
        )
        #: The bytes of input this connection's responses hold (their key's budget's).
        self.live_input = turns.input_budget.open(owner)
        #: The session's tasks; the shapes start theirs there too (not through a
        #: method of the session, which would make a reference cycle with it).
        self._tasks = _Tasks()
        #: The shipped shape's lanes and segment cache (shipped mode only).
        self.shipped: ShippedShape | None = None
        #: Append mode's rollouts (append mode only).
        self.append: AppendShape | None = None
        self.shape: Shape
        if transport is Transport.WS:
            self.shape = self.shipped = ShippedShape(
                config,
                turns,
                self.outbox,
                ledger=self.live_input,
                spawn=self._tasks,
                send_timing=send_timing,
                owner=owner,
                multi_agent=multi_agent,
            )
        else:
            self.shape = self.append = AppendShape(
                config,
                turns,
                self.outbox,
                ledger=self.live_input,
                spawn=self._tasks,
                report=self.outbox.error,
                send_timing=send_timing,
                owner=owner,
            )
        #: This connection's record in the inspector (None with the inspector off).
        self.seen: ConnectionRecord | None = turns.inspector.open_connection(self, transport, owner)
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
    def outbox_high_water(self) -> int:
        return self.outbox.high_water

    @property
    def close_reason(self) -> str | None:
        """Why the server closed this session, if it did."""
        return self.outbox.closing[1] if self.outbox.closing is not None else None

    async def serve(self, receive: Receive, send: Send) -> None:
        """Run the session until the peer leaves or we close it."""
        try:
            async with asyncio.TaskGroup() as group:
                self._tasks.open(group)
                writer = self._tasks(self.outbox.write_to(send))
                reader = self._tasks(self._read_loop(receive))
                self._tasks(self._expire())
                await asyncio.wait({writer, reader}, return_when=asyncio.FIRST_COMPLETED)
                # Every task the group still holds is cancelled, and the group
                # ends without an exception: one raised through it would stay
                # in a reference cycle (the group's exception group, its
                # traceback, its frame) with this session until a full collection.
                self._tasks.cancel()
        except* StreamClosed:
            pass
        finally:
            self._tasks.close()
            if self.append is not None:
                self.append.release()
            if self.shipped is not None:  # its rollouts end with the connection
                # Steers not handed back before a close of ours: nobody to tell.
                lost = self.close_reason == "slow_reader"
                self.shipped.steering.drop("slow_reader" if lost else "connection_closed")
                await self.shipped.release_dropped(every=True)
            self.live_input.close()  # whatever input is still held, the key's budget gets back

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
        self.close(
            int(CLOSE_CODES["connection_limit_reached"]),
            "connection limit reached",
            why=f"The connection reached its {minutes:g}-minute limit",
        )

    async def _read_loop(self, receive: Receive) -> None:
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
            await self.handle_message(data, received_at)
            # Not held while the next one is awaited: a large message would
            # live as long as the connection waits for the next (issue 20).
            del message, data

    async def handle_message(self, data: str | bytes, received_at: float) -> None:
        """Decode, check, admit and act on one client message; errors become error events.

        A ``response.create``'s item, tool and schema limits are checked on its
        skeleton first, before it is decoded (``longresponse/serve/skeleton.py``);
        the item references of a create or an append are resolved once it is
        (``longresponse/serve/references.py``).

        An append-mode create's costly checks run in a worker thread first
        (:meth:`Turns.settled`). Once the session is closing (draining, or
        closed for a bad inject), messages are dropped unread; on a 1012 the
        client resends them on its next connection.
        """
        if self.draining or self.outbox.closing is not None:
            return
        event: object = None
        try:
            if len(data) <= self.connection.max_message_bytes:  # else refused unread
                limits, count = self.turns.pipeline.limits, self.connection.check_item_count
                await check_create_skeleton(data, limits, count, frame=True)
            event = self.connection.decode_message(data)
            if isinstance(event, ResponseCreate | ResponseAppend):
                # Item references become the stored items before anything reads them.
                event = await resolve_references(event, self.turns.persistence, owner=self.owner)
            if isinstance(event, ResponseAppend | ResponseInject | ResponseSteer):
                # Input into a live response: its costly checks first, off the
                # loop (the secrets classifier on long texts), then admission.
                async with self.turns.settled_checks(
                    (), None, as_items(event.input), owner=self.owner
                ):
                    if self.outbox.closing is not None:  # closed meanwhile: dropped
                        return
                    admitted, admitted_at = self._receive(event, len(data))
            else:
                admitted, admitted_at = self._receive(event, len(data))
            event = admitted.event
            if self.seen is not None:
                self.seen.client(admitted.event, len(data))
            decode = admitted_at - received_at
            if self.append is None or not isinstance(event, ResponseCreate):
                self.shape.handle(admitted, received_at, decode)
                return
            # An append-mode create is admitted now: its costly checks first, off
            # the loop (the shipped shape's lanes do so when they run a create),
            # but for the known prefix its input begins with.
            items = as_items(event.input)
            start = Continuation()
            self.turns.reuse_prefix(start, items, owner=self.owner)
            async with self.turns.settled(event, start.unchecked(items), owner=self.owner):
                if self.outbox.closing is None:  # else closed meanwhile: nothing is sent
                    admitted = dataclasses.replace(admitted, continuation=start)
                    self.shape.handle(admitted, received_at, decode)
        except ProtocolError as error:
            lane = error.stream_id
            if error.code == ErrorCode.INVALID_STREAM_ID:
                lane = None  # the refused name is not a lane
            elif isinstance(event, ResponseCreate) and isinstance(event.stream_id, str):
                lane = event.stream_id
            if error.reply is not None:
                self.outbox.push(error.reply)  # e.g. response.inject.failed
            else:
                self.outbox.error(error.with_(stream_id=lane))
            if error.close_code is not None:
                self.close(
                    error.close_code, error.code, why=f"The connection is closing ({error.code})"
                )

    def _receive(self, event: ClientEvent, size: int) -> tuple[Admitted, float]:
        """Check, admit and record ``event`` (``Connection.receive_event``, the
        shape's ``admit`` as its hook): what admission found, to hand to the
        shape's ``handle``, and when admission began (decoding and the core's
        checks ended). Raises :class:`ProtocolError`; nothing is recorded then."""
        taken: list[tuple[Admitted, float]] = []

        def admit(event: ClientEvent, track: ResponseTrack | None) -> ClientEvent:
            began = time.perf_counter()
            admitted = self.shape.admit(event, track, size)
            taken.append((admitted, began))
            return admitted.event

        self.connection.receive_event(event, admit=admit)
        self.connection.next_event()  # the event just recorded: admitted.event
        (found,) = taken  # the core admits every client event it records, once
        return found

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
        self.close(
            int(CLOSE_CODES["server_shutdown"]),
            "service restart",
            why="The server is restarting (WebSocket close 1012)",
        )

    def close(self, code: int, reason: str, *, why: str) -> None:
        """Close with ``code`` and ``reason`` once the events already queued are out,
        the input accepted and not delivered handed back first (``why`` says to the
        client why it was not); a no-op if the session is already closing."""
        if self.outbox.closing is None:
            self.shape.hand_back(why)
            self.outbox.close(code, reason)


class ResponsesEndpoint:
    """The WebSocket endpoint of ``/v1/responses`` (pure ASGI)."""

    def __init__(
        self,
        config: ServerConfig,
        turns: Turns,
        keys: ApiKeys | None = None,
        *,
        on_session: Callable[[Session], object] | None = None,
    ) -> None:
        self.config = config
        self.turns = turns
        self.keys = keys or ApiKeys()
        self.live_sessions = 0  # for tests and metrics
        self._on_session = on_session
        #: The sessions being served, for a graceful shutdown.
        self.sessions: set[Session] = set()
        #: Set each time a session ends (a shutdown waits for the last ones).
        self._session_ended = asyncio.Event()
        #: Connections open (or being opened) by the owner of their API key
        #: (keys on; ``""``, keys off, has no limit of its own).
        self.open_per_key: collections.Counter[str] = collections.Counter()
        self.draining = False

    @staticmethod
    def wants_append(scope: Scope) -> bool:
        """Append mode is asked for by its subprotocol, and by nothing else: the
        ``OpenAI-Beta: responses_websockets=…`` values gateways in front of the
        shipped API send are for the shipped shape (``protocol/SPEC.md`` §2)."""
        return APPEND_SUBPROTOCOL in scope.get("subprotocols", [])

    async def drain(self, *, abandon: Callable[[], bool] = lambda: False) -> None:
        """Graceful shutdown: every session stops reading, and closes 1012 as soon as
        no turn of it is running; returns when every session has ended.

        If ``abandon()`` turns true, or the drain is cancelled (the caller's
        timeout), every session still open is closed 1012 at once, its turns
        cut off, and gets up to ``DRAIN_FLUSH_TIMEOUT`` to send what it queued.
        Before its 1012 each session hands back what it accepted and will not
        deliver (:meth:`Session.close`).
        """
        self.draining = True
        self.turns.inspector.stop()  # the inspector's feeds end too
        try:
            for session in list(self.sessions):
                session.stop_intake()
            while self.sessions and not abandon():
                for session in list(self.sessions):
                    if not session.busy:
                        session.restart()
                await asyncio.sleep(DRAIN_POLL_INTERVAL)
        finally:
            busy = list(self.sessions)
            if busy:
                log.warning("shutdown: closing %d busy sessions now", len(busy))
            for session in busy:
                session.restart()
            if busy:  # what they queued (steers handed back, the close) goes out first
                await self._flushed(busy)

    async def _flushed(self, sessions: list[Session]) -> None:
        """Wait up to ``DRAIN_FLUSH_TIMEOUT`` for ``sessions``, closing, to end."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_FLUSH_TIMEOUT):
                while any(session in self.sessions for session in sessions):
                    self._session_ended.clear()
                    await self._session_ended.wait()

    async def _refuse(self, scope: Scope, send: Send, refusal: RemoteProtocolError) -> None:
        """Answer the handshake with ``refusal`` (the shipped error envelope, its
        status) instead of accepting it; nothing of a session exists yet."""
        log_refusal(f"WebSocket {scope['path']}", refusal, request_id(scope))
        body = json.dumps(error_body(refusal)).encode()
        if "websocket.http.response" in scope.get("extensions", {}):
            headers = [(b"content-type", b"application/json")]
            if refusal.status == 429:
                headers.append((b"retry-after", b"1"))
            await send(
                {
                    "type": "websocket.http.response.start",
                    "status": refusal.status,
                    "headers": headers,
                }
            )
            await send({"type": "websocket.http.response.body", "body": body})
        else:  # pragma: no cover - servers without the denial extension answer 403
            await send({"type": "websocket.close", "code": 1008})

    def _room_for(self, owner: str) -> RemoteProtocolError | None:
        """The refusal of one more connection of ``owner``'s beyond
        ``--max-connections-per-key``, or ``None`` if it has room."""
        limit = self.config.max_connections_per_key
        if not owner or self.open_per_key[owner] < limit:
            return None
        return RemoteProtocolError(
            f"This API key has {limit} WebSocket connections open, the most allowed "
            "(--max-connections-per-key). Close one and try again.",
            code=TOO_MANY_CONNECTIONS,
            status=429,
            error_type="rate_limit_error",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":  # pragma: no cover - ASGI contract
            return
        headers = _headers(scope)
        try:
            authorization = headers.get("authorization", [])
            owner = self.keys.owner(authorization[0] if authorization else None)
        except Unauthorized as exc:
            await self._refuse(
                scope, send, RemoteProtocolError(str(exc), code="invalid_api_key", status=401)
            )
            return
        if (refusal := self._room_for(owner)) is not None:
            await self._refuse(scope, send, refusal)
            return
        self.open_per_key[owner] += 1
        try:
            await self._serve(scope, receive, send, headers, owner)
        finally:
            self.open_per_key[owner] -= 1
            if not self.open_per_key[owner]:
                del self.open_per_key[owner]

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, list[str]], owner: str
    ) -> None:
        """Accept the handshake and serve its session to the end."""
        subprotocol = (
            APPEND_SUBPROTOCOL if APPEND_SUBPROTOCOL in scope.get("subprotocols", []) else None
        )
        timing = any(v.strip().lower() == "true" for v in headers.get(TIMING_HEADER, []))
        transport = Transport.APPEND if self.wants_append(scope) else Transport.WS
        session = Session(
            self.config,
            self.turns,
            transport=transport,
            send_timing=timing,
            owner=owner,
            multi_agent=MULTI_AGENT_BETA in _betas(headers),
            drop=lambda: abort(scope, "slow WebSocket reader"),
            send_texts=scope.get(SEND_TEXTS_KEY),
        )
        if self.draining:  # accepted as the server began to stop: it will not serve
            session.restart()
        # Counted before the handshake completes, so a client that sees the
        # 101 also sees its session counted.
        self.live_sessions += 1
        if self._on_session is not None:
            self._on_session(session)
        self.sessions.add(session)
        try:
            await send({"type": "websocket.accept", "subprotocol": subprotocol})
            await session.serve(receive, send)
        finally:
            self.live_sessions -= 1
            self.sessions.discard(session)
            self._session_ended.set()
            self.turns.inspector.close_connection(session.seen)


def _betas(headers: dict[str, list[str]]) -> set[str]:
    """The ``OpenAI-Beta`` values: each header may be a comma-separated list."""
    return {b.strip() for value in headers.get("openai-beta", []) for b in value.split(",")}


def _headers(scope: Scope) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in scope.get("headers", []):
        out.setdefault(key.decode("latin-1").lower(), []).append(value.decode("latin-1"))
    return out
