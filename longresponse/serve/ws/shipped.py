"""The shipped WebSocket shape: lanes, steering and the connection cache, onto rollouts.

Theory of operation
-------------------
A shipped-shape client sends ``response.create`` with the body of
``POST /v1/responses`` and continues with ``previous_response_id``. Each
shipped Response is one segment of a :class:`Rollout`
(``longresponse.engine.segment``). :class:`ShippedShape` composes three
parts, each with its own state in its own module, and runs the segments:

- the connection cache (:class:`~.segment_cache.SegmentCache`): segment id →
  (Rollout, Boundary), within a byte budget; where a continuation's parent
  is found decides whether it continues in place, forks or hydrates from the
  store (``longresponse.serve.continuation``);
- the lanes (:class:`~.lanes.Lanes`): requests run on the lane their
  ``stream_id`` names, FIFO within a lane, lanes in parallel, within the
  connection's limits. A create is checked when it arrives (lane, queue,
  ``background``); the rest of its turn (continuation, model, admission:
  ``longresponse.serve.turns``) runs when its lane reaches it
  (:meth:`ShippedShape._run`);
- steering (:class:`~.steering.Steering`): ``response.steer`` input queued
  for a running segment's successor, which its lane runs at once when the
  segment ends, before anything queued on it.

On a connection opened with the multi-agent beta, a create with
``multi_agent: {"enabled": true}`` gets a segment that waits in place at
client tool calls (``Segment.waits``) instead of ending there; its lane stays
busy until it ends. ``response.inject`` brings the outputs
(``longresponse.serve.ws.live_input``) into the segment it names.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from protocol import ErrorCode, ProtocolError, RemoteProtocolError, ResponseTrack
from protocol.events import ClientEvent, ResponseCreate, ResponseInject, ResponseSteer
from protocol.items import as_items

from ...config import ServerConfig
from ...engine.admission import Admission
from ...engine.segment import Segment
from ...engine.stream import EventSink, ServerClosed
from ..continuation import continue_from
from ..input_budget import InputLedger
from ..transport import Transport
from ..turns import Caller, Turns
from .admitted import Admitted
from .lanes import Lanes, Queued
from .live_input import admit_input, deliver_input, send_receipt
from .segment_cache import SegmentCache
from .steering import Steer, Steering

__all__ = ["ShippedShape"]

log = logging.getLogger(__name__)


class _Sink(EventSink, Protocol):
    """What the shipped shape needs of the session's outbox: a sink that also
    takes error replies."""

    def error(self, error: ProtocolError, stream_id: str | None = None) -> None: ...


class ShippedShape:
    """Serves one shipped-shape connection's client events."""

    def __init__(
        self,
        config: ServerConfig,
        turns: Turns,
        sink: _Sink,
        *,
        ledger: InputLedger,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
        send_timing: bool = False,
        owner: str = "",
        multi_agent: bool = False,
    ) -> None:
        self.turns = turns
        self.sink = sink
        #: The bytes of input this connection's responses hold (injected, steered).
        self.ledger = ledger
        #: The connection was opened with the multi-agent beta.
        self.multi_agent = multi_agent
        self.send_timing = send_timing
        self.owner = owner
        #: The segments running, by response id (what an inject or steer targets).
        self.running: dict[str, Segment] = {}
        self.cache = SegmentCache(config.connection_cache_bytes)
        self.lanes = Lanes(
            max_lanes=config.max_lanes,
            max_queued=config.max_queued,
            max_in_flight=config.max_in_flight,
            run=self._run,
            report=sink.error,
            spawn=spawn,
        )
        self.steering = Steering(
            sink,
            turns.pipeline,
            ledger,
            max_pending=config.max_pending_steers,
            metrics=turns.metrics,
        )
        #: What the connection did, for tests and operators.
        self.segments_run = 0
        self.forks = 0
        self.hydrations = 0

    def admit(self, event: ClientEvent, track: ResponseTrack | None, size: int) -> Admitted:
        """An inject's or a steer's items (a message of ``size`` bytes), admitted
        for the segment it names, with the bytes they hold. (A create is admitted
        when its lane runs it, after its continuation.)

        Raises :class:`RemoteProtocolError` for an inject into a segment that does
        not wait for input (created without ``multi_agent``), whose turns are
        over or that holds too much input already (or its key does), and for a
        steer :meth:`Steering.admit` refuses.
        """
        if isinstance(event, ResponseSteer) and track is not None:
            segment = self.running.get(track.response_id)
            admission, hold = self.steering.admit(event, track.response_id, segment, size)
            return Admitted(event, track, admission, hold)
        if not isinstance(event, ResponseInject) or track is None:
            return Admitted(event, track)
        segment = self.running.get(track.response_id)
        if segment is None or not segment.waits:
            raise RemoteProtocolError(
                f"Response {track.response_id!r} was created without multi_agent, so it takes "
                "no injected input; continue it with response.create and previous_response_id.",
                code=ErrorCode.INVALID_VALUE,
                param="response_id",
            )
        event, admission, hold = admit_input(
            self.turns,
            segment.rollout,
            event,
            track.response_id,
            ledger=self.ledger,
            size=size,
            finished=segment.finishing,
        )
        return Admitted(event, track, admission, hold)

    def handle(self, admitted: Admitted, received_at: float, decode: float) -> None:
        event = admitted.event
        if isinstance(event, ResponseCreate):
            self.submit(event, received_at, decode)
        elif isinstance(event, ResponseSteer):
            segment = self.running[event.previous_response_id]
            self.steering.accept(event, _admission(admitted).items, segment, admitted.hold)
        elif isinstance(event, ResponseInject):
            segment = self.running[event.response_id]
            admission = _admission(admitted)
            deliver_input(
                segment.rollout, admission, admitted.hold, received_at=received_at, decode=decode
            )
            send_receipt(self.sink, self.sink.track(event.response_id))
        # response.processed: tolerated, never answered

    # --- admission (synchronous, in the connection's read loop) -------------

    def submit(self, request: ResponseCreate, received_at: float, decode: float = 0.0) -> None:
        """Queue ``request`` on its lane. Raises :class:`RemoteProtocolError` if refused."""
        stream_id = self.lanes.check_name(request)
        self.turns.check_background(request, transport=Transport.WS)
        self.turns.waits_in_place(request, beta=self.multi_agent, transport=Transport.WS)
        self.lanes.submit(stream_id, Queued(request, received_at, decode))

    # --- execution (a lane's task) ---------------------------------------------

    async def _run(
        self, request: ResponseCreate, lane: str | None, received_at: float, decode: float
    ) -> None:
        """Run a create its lane reached, then the automatic successors its steers
        ask for. Raises the create's :class:`ProtocolError` (its lane answers it)."""
        # Steers held for this create's parent are committed by its response.created.
        held = self.steering.take_held(lane, request.previous_response_id)
        successor = await self._committing(request, lane, received_at, decode, held)
        while successor is not None:  # automatic successors, for steering input
            request, steers = successor
            try:
                successor = await self._committing(request, lane, time.perf_counter(), 0.0, steers)
            except ProtocolError:
                return  # the steers got response.steer.failed; no request to answer

    async def _committing(
        self,
        request: ResponseCreate,
        lane: str | None,
        received_at: float,
        decode: float,
        steers: list[Steer],
    ) -> tuple[ResponseCreate, list[Steer]] | None:
        """Run one segment whose new input starts with the steers' items; the
        steers are handed back if it cannot start."""
        try:
            return await self._run_segment(request, lane, received_at, decode, steers)
        except ProtocolError as error:
            if steers:
                self.steering.successor_failed(steers, error)
            raise

    async def _run_segment(
        self,
        request: ResponseCreate,
        lane: str | None,
        received_at: float,
        decode: float,
        steers: list[Steer],
    ) -> tuple[ResponseCreate, list[Steer]] | None:
        """Run one segment; the automatic successor due for the steers it got, if any."""
        self.turns.check_metadata(request)
        new_items = [item for steer in steers for item in steer.items]
        new_items.extend(as_items(request.input))
        # A conversation's items come from the store, as over HTTP.
        continuation = await self.turns.conversations.continuation(request, self.owner)
        if continuation is None:
            continuation = await continue_from(
                request.previous_response_id,
                new_items,
                lookup=self.cache.lookup,
                evict=self.cache.evict,
                lane=lane,
                persistence=self.turns.persistence,
                owner=self.owner,
            )
        self.hydrations += continuation.hydrated
        self.forks += continuation.forked
        self.turns.reuse_prefix(continuation, new_items, owner=self.owner)
        # The costly checks, off the loop (the history's too when checked again,
        # but for a known prefix).
        unchecked = continuation.unchecked(new_items)
        async with self.turns.settled(request, unchecked, owner=self.owner):
            caller = Caller(
                Transport.WS,
                self.sink,
                self.owner,
                stream_id=lane,
                send_timing=self.send_timing,
                decode=decode,
            )
            waits = self.turns.waits_in_place(
                request, beta=self.multi_agent, transport=Transport.WS
            )
            if steers and self.steering.closed:  # handed back meanwhile: no successor
                raise ServerClosed("closing")
            started = self.turns.start_turn(request, new_items, caller, continuation, waits=waits)
        # The steering input is the segment's now (its inbox, then its context).
        self.steering.committed(steers)
        self.segments_run += 1
        assert started.segment is not None
        segment_id = started.reply.id
        self.running[segment_id] = started.segment
        try:
            boundary = await self.turns.run_segment(
                started,
                owner=self.owner,
                transport=Transport.WS,
                history=continuation.history,
                received_at=received_at,
            )
        finally:
            del self.running[segment_id]
            steered = self.steering.ended(segment_id)
        # A failed segment leaves its Rollout broken: no continuation in place,
        # but its earlier boundaries stay valid to fork from.
        if boundary is not None:
            self.cache.add(started.rollout, boundary)
        else:
            await started.rollout.close()
        await self.release_dropped()
        successor = self.steering.after(request, segment_id, boundary, steered, lane)
        return (successor, steered) if successor is not None else None

    async def release_dropped(self, *, every: bool = False) -> None:
        """Release the samplers of rollouts the cache let go (``every``: all of them,
        the connection is closing, and the lanes let go of this shape); one a
        segment still runs is left to it."""
        if every:
            self.cache.clear()
            self.lanes.release()
        for rollout in self.cache.take_dropped():
            if every or not rollout.busy:
                await rollout.close()

    # --- graceful shutdown ----------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A turn is running: some request past its queue is not a segment waiting,
        paused, for injected tool outputs."""
        waiting = sum(1 for segment in self.running.values() if segment.rollout.awaiting_input)
        return self.lanes.active > waiting

    def stop_intake(self) -> None:
        """Shutdown: drop the requests still waiting in their lanes (they have sent
        nothing; the client resends them on its next connection)."""
        self.lanes.stop_intake()

    def hand_back(self, why: str) -> None:
        """The server closes the connection now (``why``): the steering input not yet
        committed goes back to the client (:meth:`Steering.hand_back`)."""
        self.steering.hand_back(why)


def _admission(admitted: Admitted) -> Admission:
    """The admission :meth:`ShippedShape.admit` made of a steer or inject."""
    if admitted.admission is None:  # pragma: no cover - admit() admits every steer and inject
        raise RuntimeError("a steer or inject reached handle() without its admission")
    return admitted.admission
