"""The shipped WebSocket shape: lanes and the connection cache, onto rollouts.

Theory of operation
-------------------
A shipped-shape client sends ``response.create`` with the body of
``POST /v1/responses`` and continues with ``previous_response_id``. Each
shipped Response is one segment of a :class:`Rollout`
(``longresponse.engine.segment``). The connection keeps a
:class:`SegmentCache`: segment id → (Rollout, Boundary), within a byte budget;
where a continuation's parent is found decides whether it continues in place,
forks or hydrates from the store (``longresponse.serve.continuation``).

Requests run on **lanes** named by ``stream_id`` (absent = the default lane):
FIFO within a lane, lanes in parallel, at most ``max_in_flight`` responses
running at once across lanes (the rest wait, queued), at most ``max_lanes``
named lanes and ``max_queued`` waiting requests per connection. Every event of
a named lane carries its ``stream_id``. A create is checked when it arrives
(lane, queue, ``background``); the rest of its turn (continuation, model,
admission: ``longresponse.serve.turns``) runs when its lane reaches it.

On a connection opened with the multi-agent beta, a create with
``multi_agent: {"enabled": true}`` gets a segment that waits in place at
client tool calls (``Segment.waits``) instead of ending there; its lane stays
busy until it ends. ``response.inject`` brings the outputs
(``longresponse.serve.ws.live_input``) into the segment it names.

``response.steer`` queues user input for a running segment's **successor**
(at most ``max_pending_steers`` per segment; the protocol core has checked
the shape and that the segment is live, and answers every refusal with
``response.steer.failed``). The segment's rollout stops at its next safe
point (:meth:`Rollout.steer`); when the segment ends:

- with no client call pending: its lane runs the successor at once, before
  anything queued on it, as a continuation in place whose new input is the
  steering input, with the steered request's settings (``response.created``
  of the successor commits the input);
- with calls pending (``completed``, the calls in its output): each steer
  gets ``response.steer.pending`` and is held for the lane; the client's next
  ``response.create`` on that lane naming that segment gets the steering
  input prepended to its own;
- ``failed``, or a successor that could not start: ``response.steer.failed``
  hands each input back (``response_not_active``, ``successor_creation_failed``).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import re
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final, Protocol

import msgspec

from protocol import ErrorCode, ProtocolError, RemoteProtocolError, ResponseTrack
from protocol.events import (
    ClientEvent,
    ResponseCreate,
    ResponseInject,
    ResponseSteer,
    ResponseSteerAccepted,
    ResponseSteerFailed,
    ResponseSteerPending,
    SteerError,
    SteerFailure,
    SteerReceipt,
    SteerRequiredInput,
)
from protocol.items import Item, as_items

from ...config import ServerConfig
from ...engine.admission import Admission
from ...engine.rollout import Boundary, Rollout
from ...engine.segment import Segment
from ...engine.stream import EventSink, StreamClosed
from ...engine.transport import Transport
from ...ids import new_id
from ..continuation import continue_from
from ..turns import Caller, Turns
from .admitted import Admitted
from .live_input import admit_input, deliver_input, send_receipt

__all__ = ["STREAM_ID_PATTERN", "Lane", "SegmentCache", "ShippedShape"]

log = logging.getLogger(__name__)

#: What a ``stream_id`` may be: 1-256 characters of ``[A-Za-z0-9_.-]``.
STREAM_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_.\-]{1,256}")


class _Sink(EventSink, Protocol):
    """What the shipped shape needs of the session's outbox: a sink that also
    takes error replies."""

    def error(self, error: ProtocolError, stream_id: str | None = None) -> None: ...


class SegmentCache:
    """Segment id → (Rollout, Boundary), within a byte budget (LRU by Rollout).

    The size is a running total: each Rollout counts as large as it was when
    it last added a boundary (it grows only by running a turn, which adds one).
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._segments: dict[str, tuple[Rollout, Boundary]] = {}
        self._rollouts: collections.OrderedDict[int, tuple[Rollout, list[str]]] = (
            collections.OrderedDict()
        )
        self._sizes: dict[int, int] = {}  # id(Rollout) → its nbytes at its last add
        self.nbytes = 0
        self.evictions = 0
        #: Rollouts no longer cached, whose samplers are yet to be released.
        self.dropped: list[Rollout] = []

    def __len__(self) -> int:
        return len(self._segments)

    @property
    def rollouts(self) -> list[Rollout]:
        """The Rollouts cached, least recently used first (a new list)."""
        return [rollout for rollout, _ in self._rollouts.values()]

    def lookup(self, segment_id: str) -> tuple[Rollout, Boundary] | None:
        found = self._segments.get(segment_id)
        if found is not None:
            self._rollouts.move_to_end(id(found[0]))
        return found

    def add(self, rollout: Rollout, boundary: Boundary) -> None:
        self._segments[boundary.segment_id] = (rollout, boundary)
        entry = self._rollouts.get(id(rollout))
        if entry is None:
            self._rollouts[id(rollout)] = (rollout, [boundary.segment_id])
        else:
            entry[1].append(boundary.segment_id)
            self._rollouts.move_to_end(id(rollout))
        size = rollout.nbytes
        self.nbytes += size - self._sizes.get(id(rollout), 0)
        self._sizes[id(rollout)] = size
        self._enforce_budget(keep=rollout)

    def evict(self, segment_id: str) -> None:
        """Forget one segment id (its Rollout stays while other ids name it)."""
        found = self._segments.pop(segment_id, None)
        if found is None:
            return
        rollout = found[0]
        entry = self._rollouts.get(id(rollout))
        if entry is not None:
            entry[1].remove(segment_id)
            if not entry[1]:
                self.drop_rollout(rollout)

    def drop_rollout(self, rollout: Rollout) -> None:
        entry = self._rollouts.pop(id(rollout), None)
        if entry is not None:
            self.nbytes -= self._sizes.pop(id(rollout), 0)
            for segment_id in entry[1]:
                self._segments.pop(segment_id, None)
            self.dropped.append(rollout)

    def clear(self) -> None:
        """Forget every segment (the connection is closing)."""
        for rollout, _ in list(self._rollouts.values()):
            self.drop_rollout(rollout)

    def _enforce_budget(self, keep: Rollout) -> None:
        while self.nbytes > self.budget_bytes and len(self._rollouts) > 1:
            oldest_key = next(iter(self._rollouts))
            rollout, _ = self._rollouts[oldest_key]
            if rollout is keep:
                break
            self.drop_rollout(rollout)
            self.evictions += 1


@dataclasses.dataclass(frozen=True, slots=True)
class _Steer:
    """One accepted ``response.steer``: its id, the segment it steers, its admitted
    items, and the input as sent (handed back if it is never committed)."""

    id: str
    target: str
    items: list[Item]
    sent: str | list[Any]


@dataclasses.dataclass(slots=True)
class _Queued:
    request: ResponseCreate
    received_at: float
    decode: float = 0.0


class Lane:
    """One ``stream_id``: its FIFO of requests and the task serving it."""

    __slots__ = ("name", "queue", "task")

    def __init__(self, name: str | None) -> None:
        self.name = name
        self.queue: collections.deque[_Queued] = collections.deque()
        self.task: asyncio.Task[None] | None = None


class ShippedShape:
    """Serves one shipped-shape connection's ``response.create`` events."""

    def __init__(
        self,
        config: ServerConfig,
        turns: Turns,
        sink: _Sink,
        *,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
        send_timing: bool = False,
        owner: str = "",
        multi_agent: bool = False,
    ) -> None:
        self.config = config
        self.turns = turns
        self.sink = sink
        #: The connection was opened with the multi-agent beta.
        self.multi_agent = multi_agent
        #: Requests past their lane's queue and not yet finished, and the
        #: segments among them, by response id (what an inject targets).
        self.active = 0
        self.running: dict[str, Segment] = {}
        #: Accepted steers by the running segment they steer, in arrival order;
        #: steers held for a lane's next create on their parent (after
        #: ``response.steer.pending``).
        self.steers: dict[str, list[_Steer]] = {}
        self.held: dict[str | None, list[_Steer]] = {}
        self.cache = SegmentCache(config.connection_cache_bytes)
        self.lanes: dict[str | None, Lane] = {}
        self._spawn = spawn
        self.send_timing = send_timing
        self._in_flight = asyncio.Semaphore(config.max_in_flight)
        self.owner = owner
        self.queued = 0
        self.segments_run = 0
        self.forks = 0
        self.hydrations = 0

    def admit(self, event: ClientEvent, track: ResponseTrack | None) -> Admitted:
        """An inject's items, admitted for the segment it names. (A create is
        admitted when its lane runs it, after its continuation.)

        Raises :class:`RemoteProtocolError` for a segment that does not wait
        for input (created without ``multi_agent``) or whose turns are over.
        """
        if isinstance(event, ResponseSteer) and track is not None:
            return Admitted(event, track, self._admit_steer(event, track))
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
        event, admission = admit_input(
            self.turns, segment.rollout, event, finished=segment.finishing
        )
        return Admitted(event, track, admission)

    def handle(self, admitted: Admitted, received_at: float, decode: float) -> None:
        event = admitted.event
        if isinstance(event, ResponseCreate):
            self.submit(event, received_at, decode)
        elif isinstance(event, ResponseSteer):
            self._accept_steer(event, _admission(admitted).items)
        elif isinstance(event, ResponseInject):
            segment = self.running[event.response_id]
            admission = _admission(admitted)
            deliver_input(segment.rollout, admission, received_at=received_at, decode=decode)
            send_receipt(self.sink, self.sink.track(event.response_id))
        # response.processed: tolerated, never answered

    # --- steering (synchronous, in the connection's read loop) ---------------

    def _admit_steer(self, event: ResponseSteer, track: ResponseTrack) -> Admission:
        """A steer's items, admitted for the segment it names. Raises
        :class:`RemoteProtocolError` (the core answers ``response.steer.failed``)."""
        segment = self.running.get(track.response_id)
        if segment is None:  # pragma: no cover - a live response is a running segment
            raise RemoteProtocolError(
                f"Response {track.response_id!r} is no longer accepting steering input.",
                code=ErrorCode.RESPONSE_NOT_ACTIVE,
                param="previous_response_id",
            )
        if segment.waits:
            raise RemoteProtocolError(
                f"Response {track.response_id!r} waits in place for injected input "
                "(multi_agent); steering is for single-agent responses.",
                code=ErrorCode.STEERING_NOT_SUPPORTED,
                param="previous_response_id",
            )
        queued = self.steers.get(track.response_id, [])
        if len(queued) >= self.config.max_pending_steers:
            raise RemoteProtocolError(
                f"Response {track.response_id!r} already has {len(queued)} steering "
                f"submissions queued; the limit is {self.config.max_pending_steers}.",
                code=ErrorCode.TOO_MANY_PENDING_STEERS,
                param="previous_response_id",
                status=429,
            )
        return self.turns.pipeline.admit(
            as_items(event.input),
            history=segment.rollout.history(),
            tools=segment.rollout.request.tools,
            compactor=segment.rollout.compactor,
        )

    def _accept_steer(self, event: ResponseSteer, items: list[Item]) -> None:
        """Queue an admitted steer (``items``) for its segment's successor;
        ``response.steer.accepted``."""
        target = event.previous_response_id
        steer = _Steer(new_id("steer"), target, items, event.input)
        self.steers.setdefault(target, []).append(steer)
        track = self.sink.track(target)
        self.sink.push(
            ResponseSteerAccepted(
                sequence_number=track.next_sequence,
                steer=SteerReceipt(id=steer.id, previous_response_id=target),
                stream_id=_lane(track.stream_id),
            )
        )
        self.running[target].rollout.steer()

    def _steer_failed(self, steers: list[_Steer], error: ProtocolError, lane: str | None) -> None:
        """Hand back accepted steering input that will not be committed."""
        for steer in steers:
            track = self.sink.track(steer.target)
            self.sink.push(
                ResponseSteerFailed(
                    sequence_number=track.next_sequence,
                    steer=SteerFailure(
                        previous_response_id=steer.target, input=steer.sent, id=steer.id
                    ),
                    error=SteerError(code=error.code, message=error.message),
                    stream_id=_lane(lane),
                )
            )

    def _steers_pending(
        self, steers: list[_Steer], pending: dict[str, str], lane: str | None
    ) -> None:
        """The steered segment stopped for client tool output: ``response.steer.pending``
        for each steer, held for the lane's next create on that segment (steers held
        there before for another segment are handed back)."""
        for steer in steers:
            track = self.sink.track(steer.target)
            self.sink.push(
                ResponseSteerPending(
                    sequence_number=track.next_sequence,
                    steer=SteerReceipt(id=steer.id, previous_response_id=steer.target),
                    reason="waiting_for_required_input",
                    required_input=[
                        SteerRequiredInput(type="function_call_output", call_id=call_id, name=name)
                        for call_id, name in pending.items()
                    ],
                    stream_id=_lane(lane),
                )
            )
        replaced = self.held.pop(lane, [])
        if replaced:
            self._steer_failed(replaced, _superseded(replaced[0].target, steers[0].target), lane)
        self.held[lane] = steers

    # --- admission (synchronous, in the connection's read loop) -------------

    def submit(self, request: ResponseCreate, received_at: float, decode: float = 0.0) -> None:
        """Queue ``request`` on its lane. Raises :class:`RemoteProtocolError` if refused."""
        stream_id = request.stream_id if isinstance(request.stream_id, str) else None
        if stream_id is not None and not STREAM_ID_PATTERN.fullmatch(stream_id):
            raise RemoteProtocolError(
                "Invalid 'stream_id': use 1-256 characters from [A-Za-z0-9_.-].",
                code=ErrorCode.INVALID_STREAM_ID,
                param="stream_id",
            )
        lane = self.lanes.get(stream_id)
        if lane is None:
            named = sum(1 for name in self.lanes if name is not None)
            if stream_id is not None and named >= self.config.max_lanes:
                raise RemoteProtocolError(
                    f"This connection already uses {named} named streams; the limit is "
                    f"{self.config.max_lanes}.",
                    code=ErrorCode.WEBSOCKET_STREAM_LIMIT_REACHED,
                    param="stream_id",
                )
        self.turns.check_background(request, transport=Transport.WS)
        self.turns.waits_in_place(request, beta=self.multi_agent, transport=Transport.WS)
        if self.queued >= self.config.max_queued:
            raise RemoteProtocolError(
                f"{self.queued} requests are already waiting on this connection; the limit is "
                f"{self.config.max_queued}.",
                code=ErrorCode.WEBSOCKET_QUEUE_LIMIT_REACHED,
                status=429,
            )
        if lane is None:
            lane = self.lanes[stream_id] = Lane(stream_id)
        lane.queue.append(_Queued(request, received_at, decode))
        self.queued += 1
        if lane.task is None or lane.task.done():
            lane.task = self._spawn(self._serve_lane(lane))

    # --- execution -----------------------------------------------------------

    async def _serve_lane(self, lane: Lane) -> None:
        while lane.queue:
            async with self._in_flight:
                if not lane.queue:  # dropped by a graceful shutdown while waiting
                    return
                queued = lane.queue.popleft()
                self.queued -= 1
                try:
                    await self._run(queued.request, lane.name, queued.received_at, queued.decode)
                except StreamClosed:
                    return
                except ProtocolError as error:
                    self.sink.error(error, lane.name)
                except Exception:  # a bug in one request must not end the connection
                    log.exception("request on lane %r failed", lane.name)
                    self.sink.error(
                        RemoteProtocolError(
                            "The server had an error while processing your request.",
                            code=ErrorCode.SERVER_ERROR,
                            status=500,
                            error_type="server_error",
                        ),
                        lane.name,
                    )

    async def _run(
        self, request: ResponseCreate, lane: str | None, received_at: float, decode: float
    ) -> None:
        self.active += 1
        try:
            held = self.held.get(lane, [])
            if held and held[0].target == request.previous_response_id:
                del self.held[lane]  # committed by this create's response.created
            else:
                held = []
            successor = await self._committing(request, lane, received_at, decode, held)
            while successor is not None:  # automatic successors, for steering input
                request, steers = successor
                try:
                    successor = await self._committing(
                        request, lane, time.perf_counter(), 0.0, steers
                    )
                except ProtocolError:
                    return  # the steers got response.steer.failed; no request to answer
        finally:
            self.active -= 1

    async def _committing(
        self,
        request: ResponseCreate,
        lane: str | None,
        received_at: float,
        decode: float,
        steers: list[_Steer],
    ) -> tuple[ResponseCreate, list[_Steer]] | None:
        """Run one segment whose new input starts with the steers' items; the
        steers are handed back if it cannot start."""
        try:
            return await self._run_segment(request, lane, received_at, decode, steers)
        except ProtocolError as error:
            if steers:
                failed = RemoteProtocolError(
                    f"The successor of response {steers[0].target!r} could not be created: "
                    f"{error.message}",
                    code=ErrorCode.SUCCESSOR_CREATION_FAILED,
                )
                self._steer_failed(steers, failed, lane)
            raise

    async def _run_segment(
        self,
        request: ResponseCreate,
        lane: str | None,
        received_at: float,
        decode: float,
        steers: list[_Steer],
    ) -> tuple[ResponseCreate, list[_Steer]] | None:
        """Run one segment; the automatic successor due for the steers it got, if any."""
        self.turns.check_metadata(request)
        new_items = [item for steer in steers for item in steer.items]
        new_items.extend(as_items(request.input))
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
        # The costly checks, off the loop (the history's too when checked again).
        checked = continuation.checked if not continuation.cached else []
        async with self.turns.settled(request, [*checked, *new_items]):
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
            started = self.turns.start_turn(
                request, new_items, caller, continuation, waits=waits
            )
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
            steered = self.steers.pop(segment_id, [])
        # A failed segment leaves its Rollout broken: no continuation in place,
        # but its earlier boundaries stay valid to fork from.
        if boundary is not None:
            self.cache.add(started.rollout, boundary)
        else:
            await started.rollout.close()
        await self.release_dropped()
        if not steered:
            return None
        if boundary is None:
            ended = RemoteProtocolError(
                f"Response {segment_id!r} failed; its steering input was not committed.",
                code=ErrorCode.RESPONSE_NOT_ACTIVE,
            )
            self._steer_failed(steered, ended, lane)
            return None
        if boundary.pending:
            self._steers_pending(steered, boundary.pending, lane)
            return None
        # The successor inherits the steered request's settings (SPEC §10.15).
        successor = msgspec.structs.replace(
            request,
            input=[],
            previous_response_id=segment_id,
            generate=None,
            prompt_cache_options=None,
        )
        return successor, steered

    async def release_dropped(self, *, every: bool = False) -> None:
        """Release the samplers of rollouts the cache let go (``every``: all of them,
        the connection is closing); one a segment still runs is left to it."""
        if every:
            self.cache.clear()
        dropped, self.cache.dropped = self.cache.dropped, []
        for rollout in dropped:
            if every or not rollout.busy:
                await rollout.close()

    # --- graceful shutdown ----------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A turn is running: some request past its queue is not a segment waiting,
        paused, for injected tool outputs."""
        waiting = sum(1 for segment in self.running.values() if segment.rollout.awaiting_input)
        return self.active > waiting

    def stop_intake(self) -> None:
        """Shutdown: drop the requests still waiting in their lanes (they have sent
        nothing; the client resends them on its next connection)."""
        for lane in self.lanes.values():
            self.queued -= len(lane.queue)
            lane.queue.clear()


def _admission(admitted: Admitted) -> Admission:
    """The admission :meth:`ShippedShape.admit` made of a steer or inject."""
    if admitted.admission is None:  # pragma: no cover - admit() admits every steer and inject
        raise RuntimeError("a steer or inject reached handle() without its admission")
    return admitted.admission


def _lane(stream_id: str | None) -> str | msgspec.UnsetType:
    return stream_id if stream_id is not None else msgspec.UNSET


def _superseded(old: str, new: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"Steering input held for response {old!r} was superseded: response {new!r} on the "
        "same lane now waits for required input.",
        code=ErrorCode.RESPONSE_NOT_ACTIVE,
    )
