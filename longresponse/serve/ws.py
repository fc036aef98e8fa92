"""Session: one WebSocket connection's state and tasks.

The Session owns the sans-IO :class:`protocol.Connection`, the connection's
Rollouts and every task that serves them, in one :class:`asyncio.TaskGroup`:
the writer (drains the bounded outbox to the socket) and one sampling loop per
Rollout. The ASGI endpoint calls :meth:`Session.serve` with its receive and
send callables and returns when the Session is over.

Back-pressure: events go into a bounded outbox. A sampling loop that finds it
full waits (a slow reader slows the stream); if it stays full for
``slow_reader_timeout`` the reader is disconnected (close 1008). The outbox
never holds more than ``send_queue_depth`` encoded events.

Request errors (bad JSON, unknown type, bad items, unknown call ids…) become
one ``error`` event; nothing changes and the connection stays usable.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import msgspec

from protocol import (
    CLOSE_CODES,
    Connection,
    ErrorCode,
    Mode,
    ProtocolError,
    RemoteProtocolError,
    ResponseTrack,
    Role,
    error_event,
)
from protocol.events import (
    ClientEvent,
    ResponseAppend,
    ResponseCancel,
    ResponseCreate,
    ResponseProcessed,
    ServerEvent,
)
from protocol.items import as_items
from protocol.response import Response

from ..config import ServerConfig, Switches
from ..engine.admission import Pipeline
from ..engine.models import ModelRegistry, check_sim_metadata
from ..engine.rollout import Rollout
from ..engine.stream import StreamClosed
from ..ids import new_id
from ..storage.persistence import Persistence
from .metrics import ServerMetrics
from .shipped import ShippedShape

__all__ = ["Session"]


class _SessionOver(Exception):
    """Raised inside the session's task group to end every task it holds."""


log = logging.getLogger(__name__)

ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]


class Session:
    """One connection: its protocol state, its Rollouts, its tasks."""

    def __init__(
        self,
        config: ServerConfig,
        models: ModelRegistry,
        *,
        mode: Mode = Mode.APPEND,
        send_timing: bool = False,
        owner: str = "",
        persistence: Callable[[], Persistence] | None = None,
        pipeline: Pipeline | None = None,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.config = config
        self.models = models
        self.send_timing = send_timing
        self.owner = owner
        self.pipeline = pipeline or Pipeline(Switches())
        self.metrics = metrics
        self._persistence = persistence
        self.connection = Connection(
            Role.SERVER,
            mode,
            max_message_bytes=config.max_message_bytes,
            max_items_per_event=config.max_items_per_event,
        )
        self.rollouts: dict[str, Rollout] = {}
        self._billed: set[str] = set()  # rollouts whose usage record is written
        self._outbox: collections.deque[bytes] = collections.deque()
        self._ready = asyncio.Event()
        self._space = asyncio.Event()
        self._closing: tuple[int, str] | None = None
        #: Most encoded events ever waiting in the outbox (never above the depth
        #: except for error replies, one per client message).
        self.outbox_high_water = 0
        #: Why the server closed this session, if it did.
        self.close_reason: str | None = None
        self._tasks: asyncio.TaskGroup | None = None
        self._writer: asyncio.Task[None] | None = None
        #: The shipped shape's lanes and segment cache (shipped mode only).
        self.shipped: ShippedShape | None = None
        if mode is Mode.SHIPPED:
            self.shipped = ShippedShape(
                config,
                models,
                spawn=self._spawn,
                sink=self,
                emit_error=self._emit_error,
                send_timing=send_timing,
                owner=owner,
                persistence=persistence,
                pipeline=self.pipeline,
                metrics=metrics,
            )

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Start a task owned by this session (it ends when the session does)."""
        if self._tasks is None:  # pragma: no cover - only called while serving
            raise RuntimeError("the session is not serving")
        return self._tasks.create_task(coroutine)

    # --- output --------------------------------------------------------------

    async def room(self) -> None:
        """Wait while the outbox is full (the :class:`EventSink` half that may wait).

        Raises :class:`StreamClosed` if the reader stays too slow or the
        session ends.
        """
        await self._below(self.config.send_queue_depth)

    async def _below(self, limit: int) -> None:
        while len(self._outbox) >= limit:
            if self._closing is not None:
                raise StreamClosed("closing")
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
                raise StreamClosed("slow_reader") from None

    def push(self, event: ServerEvent) -> None:
        """Record ``event`` in the protocol state and queue its bytes (never waits)."""
        self._outbox.append(self.connection.send(event))
        self.outbox_high_water = max(self.outbox_high_water, len(self._outbox))
        self._ready.set()

    def _emit_error(self, error: ProtocolError, stream_id: str | None = None) -> None:
        # Error events go out even past the bound: at most one per client
        # message, and the reader is what limits client messages.
        self._outbox.append(self.connection.send(error_event(error, stream_id=stream_id)))
        self._ready.set()

    def close(self, code: int, reason: str) -> None:
        """Ask the writer to flush and close the socket with ``code``."""
        if self._closing is None:
            self._closing = (code, reason)
            self.close_reason = reason
            self._ready.set()
            self._space.set()

    async def _write_loop(self, send: ASGISend) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._outbox:
                data = self._outbox.popleft()
                self._space.set()
                try:
                    await send({"type": "websocket.send", "text": data.decode()})
                except Exception as exc:  # the server side of the socket is gone
                    raise StreamClosed("send failed") from exc
            if self._closing is not None:
                code, reason = self._closing
                with contextlib.suppress(Exception):
                    await send({"type": "websocket.close", "code": code, "reason": reason})
                raise StreamClosed("closed by server")

    # --- input ---------------------------------------------------------------

    async def serve(self, receive: ASGIReceive, send: ASGISend) -> None:
        """Run the session until the peer leaves or we close it."""
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                writer = self._writer = tasks.create_task(self._write_loop(send))
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
        self._emit_error(
            RemoteProtocolError(
                f"The connection reached its {minutes:g}-minute limit; open a new one to go on.",
                code=ErrorCode.WEBSOCKET_CONNECTION_LIMIT_REACHED,
            )
        )
        self.close(int(CLOSE_CODES["connection_limit_reached"]), "connection limit reached")

    async def _read_loop(self, receive: ASGIReceive) -> None:
        while True:
            message = await receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                self.connection.receive_closed()
                return
            if kind != "websocket.receive":
                continue
            # Stop reading while the outbox is over twice its depth: TCP then
            # pushes back on a client that writes without reading (only error
            # replies can take it there; sampling stops at the depth, so a
            # paced stream never starves the reader of its turn).
            await self._below(2 * self.config.send_queue_depth)
            received_at = time.perf_counter()
            data = message.get("text")
            if data is None:
                data = message.get("bytes") or b""
            self.handle_message(data, received_at)

    def handle_message(self, data: str | bytes, received_at: float) -> None:
        """Decode, check, admit and act on one client message; errors become error events."""
        self._decoded_at = received_at
        event: object = None
        try:
            self.connection.receive_message(data, admit=self._admit)
            decode = self._decoded_at - received_at
            event = self.connection.next_event()
            if isinstance(event, ResponseCreate) and self.shipped is not None:
                self.shipped.submit(event, received_at, decode)
            elif isinstance(event, ResponseCreate):
                self._create(event, decode)
            elif isinstance(event, ResponseAppend):
                self._append(event, received_at, decode)
            elif isinstance(event, ResponseCancel):
                self._cancel(event)
            elif isinstance(event, ResponseProcessed):
                pass  # tolerated, never answered
        except ProtocolError as error:
            if error.code == ErrorCode.INVALID_STREAM_ID:
                error.stream_id = None  # the refused name is not a lane
            elif isinstance(event, ResponseCreate) and isinstance(event.stream_id, str):
                error.stream_id = event.stream_id
            self._emit_error(error)

    def _admit(self, event: ClientEvent, track: ResponseTrack | None) -> ClientEvent:
        """Validate and classify an append's items before the protocol records it."""
        self._decoded_at = time.perf_counter()
        if not isinstance(event, ResponseAppend) or track is None:
            return event
        rollout = self.rollouts[track.response_id]
        admission = self.pipeline.admit(
            as_items(event.input), history=rollout.history(), tools=rollout.request.tools
        )
        self._admitted = admission
        return msgspec.structs.replace(event, input=admission.items)

    def _create(self, event: ResponseCreate, decode: float = 0.0) -> None:
        if event.background:
            raise RemoteProtocolError(
                "background responses are not supported over WebSocket.",
                code=ErrorCode.INVALID_VALUE,
                param="background",
            )
        live = sum(1 for r in self.rollouts.values() if not r.terminal)
        if live >= self.config.max_rollouts_per_connection:
            raise RemoteProtocolError(
                f"This connection already runs {live} rollouts; the limit is "
                f"{self.config.max_rollouts_per_connection}.",
                code=ErrorCode.TOO_MANY_ROLLOUTS,
                status=429,
            )
        model = self.models.resolve(event.model if isinstance(event.model, str) else None)
        check_sim_metadata(event.metadata)
        items = as_items(event.input)
        admission = self.pipeline.admit(items, tools=event.tools)
        rollout = Rollout(
            response_id=new_id("resp"),
            request=event,
            model=model,
            sink=self,
            pause_timeout=self.config.pause_timeout,
            send_timing=self.send_timing,
            pipeline=self.pipeline,
            resolve=self.models.resolve,
            input_items=admission.items,
        )
        rollout.note_admission(
            admission.verdicts,
            decode=decode,
            validate=admission.validate_seconds,
            classify=admission.classify_seconds,
        )
        rollout.on_terminal = self._post_inference
        if self.metrics is not None:
            metrics = self.metrics
            rollout.on_timing = lambda timing: metrics.observe_turn("append", timing)
        self._forget_finished()
        self.rollouts[rollout.id] = rollout
        rollout.announce_created()
        assert self._tasks is not None
        rollout.task = self._tasks.create_task(self._run_rollout(rollout))

    async def _run_rollout(self, rollout: Rollout) -> None:
        try:
            await rollout.run()
        except StreamClosed:
            pass
        except Exception:  # one rollout's bug must not end the connection
            log.exception("rollout %s crashed", rollout.id)
        finally:
            if rollout.id not in self._billed:
                # Cut off (the connection went away): the tokens it used are
                # still billed. Nothing may wait here, so the record is queued
                # without waiting for room.
                self._billed.add(rollout.id)
                if self._persistence is not None:
                    self._persistence().usage_nowait(
                        rollout.snapshot(), owner=self.owner, transport="append"
                    )

    def _forget_finished(self) -> None:
        for rollout_id in [rid for rid, r in self.rollouts.items() if r.terminal]:
            del self.rollouts[rollout_id]

    def _target(self, response_id: str | None) -> Rollout:
        rid = response_id or self.connection.latest_response_id()
        rollout = self.rollouts.get(rid) if rid else None
        if rollout is None:  # pragma: no cover - the protocol core checked it
            raise RemoteProtocolError(
                f"Response {rid!r} not found.", code=ErrorCode.RESPONSE_NOT_FOUND, status=404
            )
        return rollout

    async def _post_inference(self, response: Response) -> None:
        """An append-mode rollout finished: its usage record (and metrics)."""
        self._billed.add(response.id)
        if self.metrics is not None:
            self.metrics.response_finished("append", response.status)
        if self._persistence is not None:
            await self._persistence().post_inference(response, owner=self.owner, transport="append")

    def _append(self, event: ResponseAppend, received_at: float, decode: float = 0.0) -> None:
        rollout = self._target(event.response_id)
        admission = self._admitted
        rollout.note_admission(
            admission.verdicts,
            decode=decode,
            validate=admission.validate_seconds,
            classify=admission.classify_seconds,
        )
        rollout.accept(admission.items, received_at)

    def _cancel(self, event: ResponseCancel) -> None:
        self._target(event.response_id).request_cancel()
