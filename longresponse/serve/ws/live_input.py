"""``response.inject`` on the server: input committed into a live Response.

Theory of operation
-------------------
``response.inject`` is the multi-agent beta's form of ``response.append``,
spoken in append mode and on a shipped-shape connection opened with the beta
header. The protocol core checks it like an append (the response is live;
every output answers a pending call, once) and answers itself the two
refusals the beta names (``response.inject.failed``: the response is unknown,
or finished). What is left is the server's, the same in both shapes:

- :func:`admit_input`: the items are admitted like an append's (validation,
  the secrets classifier) before the core records anything; input for a
  response whose turns are over is refused ``response_already_completed``
  (the core then answers ``response.inject.failed``, the input handed back);
- :func:`deliver_input`: the admitted items are delivered into the rollout's
  inbox; a paused rollout resumes once every pending call has its output;
- :func:`send_receipt`: ``response.inject.created``, numbered as the
  response's next event. The three run in one step of the read loop, so the
  receipt goes out before anything the resumed turn sends.
"""

from __future__ import annotations

import msgspec

from protocol import ErrorCode, RemoteProtocolError, ResponseTrack
from protocol.events import ResponseAppend, ResponseInject, ResponseInjectCreated
from protocol.items import as_items

from ...engine.admission import Admission
from ...engine.rollout import Rollout
from ...engine.stream import EventSink
from ..turns import Turns

__all__ = ["admit_input", "deliver_input", "send_receipt"]

Input = ResponseAppend | ResponseInject


def admit_input(
    turns: Turns, rollout: Rollout, event: Input, *, finished: bool = False
) -> tuple[Input, Admission]:
    """Admit the items of an append or inject for ``rollout``: the event with the
    admitted (possibly redacted) items, and the admission.

    ``finished``: the response's turns are over, so nothing can be delivered.
    Raises :class:`RemoteProtocolError` to refuse (nothing is recorded).
    """
    if finished:
        raise RemoteProtocolError(
            f"Response {event.response_id!r} has finished its turns; it takes no more input.",
            code=ErrorCode.RESPONSE_ALREADY_COMPLETED,
            param="response_id",
            status=409,
        )
    admission = turns.pipeline.admit(
        as_items(event.input),
        history=rollout.history(),
        tools=rollout.request.tools,
        compactor=rollout.compactor,
    )
    return msgspec.structs.replace(event, input=admission.items), admission


def deliver_input(
    rollout: Rollout, admission: Admission, *, received_at: float, decode: float
) -> None:
    """Deliver admitted items into the rollout's inbox (recorded by the core already)."""
    rollout.note_admission(
        admission.verdicts,
        decode=decode,
        validate=admission.validate_seconds,
        classify=admission.classify_seconds,
    )
    rollout.deliver(admission.items, received_at)


def send_receipt(sink: EventSink, track: ResponseTrack) -> None:
    """Send ``response.inject.created``: the input is committed to ``track``'s response."""
    sink.push(
        ResponseInjectCreated(
            sequence_number=track.next_sequence,
            response_id=track.response_id,
            stream_id=track.stream_id if track.stream_id is not None else msgspec.UNSET,
        )
    )
