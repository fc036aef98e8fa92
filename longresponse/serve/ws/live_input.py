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
  (the core then answers ``response.inject.failed``, the input handed back),
  and input the response or its key has no budget left for is refused
  ``input_budget_exceeded`` (``longresponse.serve.input_budget``);
- :func:`deliver_input`: the admitted items are delivered into the rollout's
  inbox, their bytes held until the turn that reads them drains it; a
  paused rollout resumes once every pending call has its output;
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
from ..input_budget import Hold, InputLedger
from ..turns import Turns

__all__ = ["admit_input", "deliver_input", "send_receipt"]

Input = ResponseAppend | ResponseInject


def admit_input(
    turns: Turns,
    rollout: Rollout,
    event: Input,
    target: str,
    *,
    ledger: InputLedger,
    size: int,
    finished: bool = False,
) -> tuple[Input, Admission, Hold]:
    """Admit the items of an append or inject (a message of ``size`` bytes) for
    ``rollout``, the response ``target``: the event with the admitted (possibly
    redacted) items, the admission, and the bytes they hold in ``ledger``.

    ``finished``: the response's turns are over, so nothing can be delivered.
    Raises :class:`RemoteProtocolError` to refuse (nothing is recorded or held).
    """
    if finished:
        raise RemoteProtocolError(
            f"Response {event.response_id!r} has finished its turns; it takes no more input.",
            code=ErrorCode.RESPONSE_ALREADY_COMPLETED,
            param="response_id",
            status=409,
        )
    hold = ledger.hold(target, size)  # before the costly admission
    try:
        admission = turns.pipeline.admit(
            as_items(event.input),
            history=rollout.history(),
            tools=rollout.request.tools,
            compactor=rollout.compactor,
        )
    except BaseException:
        hold.release()
        raise
    return msgspec.structs.replace(event, input=admission.items), admission, hold


def deliver_input(
    rollout: Rollout,
    admission: Admission,
    hold: Hold | None,
    *,
    received_at: float,
    decode: float,
) -> None:
    """Deliver admitted items into the rollout's inbox (recorded by the core
    already); ``hold`` is released as the inbox drains."""
    rollout.note_admission(
        admission.verdicts,
        decode=decode,
        validate=admission.validate_seconds,
        classify=admission.classify_seconds,
    )
    rollout.deliver(admission.items, received_at, hold)


def send_receipt(sink: EventSink, track: ResponseTrack) -> None:
    """Send ``response.inject.created``: the input is committed to ``track``'s response."""
    sink.push(
        ResponseInjectCreated(
            sequence_number=track.next_sequence,
            response_id=track.response_id,
            stream_id=track.stream_id if track.stream_id is not None else msgspec.UNSET,
        )
    )
