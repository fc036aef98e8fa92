"""The shipped shape's steering: ``response.steer`` input queued for a segment's successor.

Theory of operation
-------------------
``response.steer`` queues user input for a running segment's **successor**
(at most ``max_pending_steers`` per segment; the protocol core has checked
the shape and that the segment is live, and answers every refusal with
``response.steer.failed``). :meth:`Steering.admit` admits its items for the
segment and holds their bytes in the connection's live-input ledger
(``longresponse.serve.input_budget``: a steer past the response's or the
key's budget is refused ``too_many_pending_steers``, the nearest code the
shipped API has, the message naming the budget); :meth:`Steering.accept`
queues them, answers
``response.steer.accepted`` and stops the segment's rollout at its next safe
point (:meth:`Rollout.steer`). When the segment ends (:meth:`Steering.after`):

- with no client call pending: the successor is due at once, before anything
  queued on the lane, as a continuation in place whose new input is the
  steering input, with the steered request's settings (``response.created``
  of the successor commits the input);
- with calls pending (``completed``, the calls in its output): each steer
  gets ``response.steer.pending`` and is held for the lane; the client's next
  ``response.create`` on that lane naming that segment gets the steering
  input prepended to its own (:meth:`Steering.take_held`);
- ``failed``, or a successor that could not start: ``response.steer.failed``
  hands each input back (``response_not_active``, ``successor_creation_failed``).

Every accepted steer is **open** until it is answered once: committed by a
segment (:meth:`Steering.committed`), or handed back with
``response.steer.failed`` (:meth:`Steering.failed`); its bytes are released
then. When the server closes the connection (a restart's 1012, the lifetime
limit), :meth:`Steering.hand_back` answers every open steer
``successor_creation_failed`` before the close frame, and no successor starts
after it. A connection that ends with steers still open (the client closed
it or was lost) had nobody left to tell: :meth:`Steering.drop` logs them at
INFO (ids and input sizes, never the text) and counts them on ``/metrics``
(``longresponse_steers_dropped_total{reason}``).
The steers queued, held and open are this class's alone.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import msgspec

from protocol import ErrorCode, ProtocolError, RemoteProtocolError
from protocol.events import (
    ResponseCreate,
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

from ...engine.admission import Admission, Pipeline
from ...engine.rollout import Boundary
from ...engine.segment import Segment
from ...engine.stream import EventSink
from ...ids import new_id
from ..input_budget import Hold, InputLedger
from ..metrics import ServerMetrics

__all__ = ["Steer", "Steering"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Steer:
    """One accepted ``response.steer``: its id, the segment it steers, its admitted
    items, the input as sent (handed back if it is never committed), the
    bytes it holds until then, and its target's lane (where its replies go)."""

    id: str
    target: str
    items: list[Item]
    sent: str | list[Any]
    hold: Hold | None = None
    lane: str | None = None


class Steering:
    """One shipped-shape connection's steers (see the module docstring)."""

    def __init__(
        self,
        sink: EventSink,
        pipeline: Pipeline,
        ledger: InputLedger,
        *,
        max_pending: int,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self._sink = sink
        self._pipeline = pipeline
        self._ledger = ledger
        self._metrics = metrics
        self.max_pending = max_pending
        #: Accepted steers by the running segment they steer, in arrival order.
        self._queued: dict[str, list[Steer]] = {}
        #: Steers held for a lane's next create on their parent (after
        #: ``response.steer.pending``).
        self._held: dict[str | None, list[Steer]] = {}
        #: Every accepted steer not yet committed nor handed back, by id, in
        #: arrival order (queued, held, or on its way into a successor).
        self._open: dict[str, Steer] = {}
        #: The connection is closing: its open steers were handed back, and no
        #: successor starts.
        self.closed = False

    def admit(
        self, event: ResponseSteer, target: str, segment: Segment | None, size: int
    ) -> tuple[Admission, Hold]:
        """A steer's items (a message of ``size`` bytes), admitted for the running
        ``segment`` of response ``target``, and the bytes they hold. Raises
        :class:`RemoteProtocolError` (the core answers ``response.steer.failed``);
        nothing changes."""
        if segment is None:  # pragma: no cover - a live response is a running segment
            raise RemoteProtocolError(
                f"Response {target!r} is no longer accepting steering input.",
                code=ErrorCode.RESPONSE_NOT_ACTIVE,
                param="previous_response_id",
            )
        if segment.waits:
            raise RemoteProtocolError(
                f"Response {target!r} waits in place for injected input "
                "(multi_agent); steering is for single-agent responses.",
                code=ErrorCode.STEERING_NOT_SUPPORTED,
                param="previous_response_id",
            )
        if segment.rollout.request.conversation is not None:
            raise RemoteProtocolError(
                f"Response {target!r} belongs to a conversation; steering is not "
                "supported for conversation-bound responses.",
                code=ErrorCode.STEERING_NOT_SUPPORTED,
                param="previous_response_id",
            )
        queued = self._queued.get(target, [])
        if len(queued) >= self.max_pending:
            raise RemoteProtocolError(
                f"Response {target!r} already has {len(queued)} steering "
                f"submissions queued; the limit is {self.max_pending}.",
                code=ErrorCode.TOO_MANY_PENDING_STEERS,
                param="previous_response_id",
                status=429,
            )
        try:
            hold = self._ledger.hold(target, size)
        except RemoteProtocolError as refused:
            raise RemoteProtocolError(
                refused.message,
                code=ErrorCode.TOO_MANY_PENDING_STEERS,
                param="previous_response_id",
                status=429,
            ) from None
        try:
            admission = self._pipeline.admit(
                as_items(event.input),
                history=segment.rollout.history(),
                tools=segment.rollout.request.tools,
                compactor=segment.rollout.compactor,
            )
        except BaseException:
            hold.release()
            raise
        return admission, hold

    def accept(
        self, event: ResponseSteer, items: list[Item], segment: Segment, hold: Hold | None
    ) -> None:
        """Queue an admitted steer (``items``, holding ``hold``) for its ``segment``'s
        successor; ``response.steer.accepted``; the segment's rollout stops at its
        next safe point."""
        target = event.previous_response_id
        track = self._sink.track(target)
        steer = Steer(new_id("steer"), target, items, event.input, hold, track.stream_id)
        self._queued.setdefault(target, []).append(steer)
        self._open[steer.id] = steer
        self._sink.push(
            ResponseSteerAccepted(
                sequence_number=track.next_sequence,
                steer=SteerReceipt(id=steer.id, previous_response_id=target),
                stream_id=_lane(track.stream_id),
            )
        )
        segment.rollout.steer()

    def take_held(self, lane: str | None, parent_id: str | None) -> list[Steer]:
        """The steers held on ``lane`` for response ``parent_id``, now to be
        committed by a create continuing it (none if held for another)."""
        held = self._held.get(lane, [])
        if not held or held[0].target != parent_id:
            return []
        del self._held[lane]
        return held

    def committed(self, steers: list[Steer]) -> None:
        """A segment took ``steers``' items as its input: their bytes are its now."""
        self._settle(steers)

    def _settle(self, steers: list[Steer]) -> list[Steer]:
        """``steers`` are answered now: those still open (answered by the caller),
        their bytes given back; the others were answered already."""
        settled = [steer for steer in steers if self._open.pop(steer.id, None) is not None]
        for steer in settled:
            if steer.hold is not None:
                steer.hold.release()
        return settled

    def ended(self, segment_id: str) -> list[Steer]:
        """The steers queued for a segment that just ended (forgotten here)."""
        return self._queued.pop(segment_id, [])

    def after(
        self,
        request: ResponseCreate,
        segment_id: str,
        boundary: Boundary | None,
        steered: list[Steer],
        lane: str | None,
    ) -> ResponseCreate | None:
        """What becomes of the steers of segment ``segment_id`` (run for
        ``request``), which ended at ``boundary`` (``None``: failed): the
        successor's request when it is due, else ``None`` (the steers handed
        back or held, as the module docstring says)."""
        if not steered or self.closed:  # closed: handed back already
            return None
        if boundary is None:
            ended = RemoteProtocolError(
                f"Response {segment_id!r} failed; its steering input was not committed.",
                code=ErrorCode.RESPONSE_NOT_ACTIVE,
            )
            self.failed(steered, ended)
            return None
        if boundary.pending:
            self._pending(steered, boundary.pending, lane)
            return None
        # The successor inherits the steered request's settings (SPEC §10.15).
        return msgspec.structs.replace(
            request,
            input=[],
            previous_response_id=segment_id,
            generate=None,
            prompt_cache_options=None,
        )

    def successor_failed(self, steers: list[Steer], error: ProtocolError) -> None:
        """The segment meant to commit ``steers`` could not start: hand them back."""
        failed = RemoteProtocolError(
            f"The successor of response {steers[0].target!r} could not be created: "
            f"{error.message}",
            code=ErrorCode.SUCCESSOR_CREATION_FAILED,
        )
        self.failed(steers, failed)

    def failed(self, steers: list[Steer], error: ProtocolError) -> None:
        """Hand back accepted steering input that will not be committed (each steer
        once: one answered already is left alone)."""
        for steer in self._settle(steers):  # their bytes are given back too
            track = self._sink.track(steer.target)
            self._sink.push(
                ResponseSteerFailed(
                    sequence_number=track.next_sequence,
                    steer=SteerFailure(
                        previous_response_id=steer.target, input=steer.sent, id=steer.id
                    ),
                    error=SteerError(code=error.code, message=error.message),
                    stream_id=_lane(steer.lane),
                )
            )

    def hand_back(self, why: str) -> None:
        """The server closes the connection now (``why``: the server is restarting,
        the connection reached its limit): every open steer gets
        ``response.steer.failed`` with its input, ``successor_creation_failed``,
        before the close frame; no successor starts from now on (SPEC §10.15)."""
        self.closed = True
        self._queued.clear()
        self._held.clear()
        for steer in list(self._open.values()):
            self.failed(
                [steer],
                RemoteProtocolError(
                    f"{why}; this steering input for response {steer.target!r} was not "
                    "delivered. Send it again on a new connection.",
                    code=ErrorCode.SUCCESSOR_CREATION_FAILED,
                ),
            )

    def drop(self, reason: str) -> None:
        """The connection is over (``reason``: ``connection_closed``, the client
        closed it or was lost; ``slow_reader``, the server dropped it): the steers
        still open cannot be handed back to anyone. Logged at INFO (their ids and
        input sizes, never the input) and counted on ``/metrics``."""
        self.closed = True
        self._queued.clear()
        self._held.clear()
        dropped = self._settle(list(self._open.values()))
        if not dropped:
            return
        log.info(
            "dropped %d accepted steers with the connection (%s), never delivered nor "
            "handed back: %s",
            len(dropped),
            reason,
            ", ".join(
                f"{steer.id} for {steer.target} ({len(msgspec.json.encode(steer.sent))} bytes)"
                for steer in dropped
            ),
        )
        if self._metrics is not None:
            self._metrics.steers_dropped(reason, len(dropped))

    def _pending(self, steers: list[Steer], pending: dict[str, str], lane: str | None) -> None:
        """The steered segment stopped for client tool output: ``response.steer.pending``
        for each steer, held for the lane's next create on that segment (steers held
        there before for another segment are handed back)."""
        for steer in steers:
            track = self._sink.track(steer.target)
            self._sink.push(
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
        replaced = self._held.pop(lane, [])
        if replaced:
            self.failed(replaced, _superseded(replaced[0].target, steers[0].target))
        self._held[lane] = steers


def _lane(stream_id: str | None) -> str | msgspec.UnsetType:
    return stream_id if stream_id is not None else msgspec.UNSET


def _superseded(old: str, new: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"Steering input held for response {old!r} was superseded: response {new!r} on the "
        "same lane now waits for required input.",
        code=ErrorCode.RESPONSE_NOT_ACTIVE,
    )
