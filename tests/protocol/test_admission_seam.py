"""Admission runs between the protocol's check and its record."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import protocol
from protocol import (
    ErrorCode,
    RemoteProtocolError,
    ResponseState,
    Role,
    encode_event,
)
from protocol.events import (
    ResponseAppend,
)
from tests.support.connection_pair import RID, ConnectionPair, drain, output, response, snapshot

# --- admission runs between the protocol's check and its record --------------


def test_a_refused_admission_records_nothing(paused: ConnectionPair) -> None:
    """The application's admission (validation, a secrets policy) runs after the
    protocol's own checks and before anything is recorded: a refusal needs no undo."""
    seen: list[tuple[Any, Any]] = []

    def refuse(event: Any, track: Any) -> Any:
        seen.append((event, track))
        raise RemoteProtocolError("refused by policy", code="secret_detected", param="input[0]")

    before = snapshot(paused.server)
    frame = encode_event(ResponseAppend(input=[output("c1")]))
    with pytest.raises(RemoteProtocolError) as refused:
        paused.server.receive_message(frame, admit=refuse)
    assert refused.value.code == "secret_detected"
    assert snapshot(paused.server) == before
    ((event, track),) = seen
    assert isinstance(event, ResponseAppend)
    assert track is paused.server.response(RID)
    assert track.pending_calls == {"c1": "add", "c2": "add"}

    def redact(event: Any, track: Any) -> Any:
        return msgspec.structs.replace(event, input=[output("c1", "[REDACTED:jwt]")])

    paused.server.receive_message(frame, admit=redact)
    (admitted,) = drain(paused.server)
    assert admitted.input == [output("c1", "[REDACTED:jwt]")]
    assert track.pending_calls == {"c2": "add"}
    assert track.answered_calls == {"c1"}


def test_admission_is_not_asked_about_an_event_the_protocol_refuses(
    paused: ConnectionPair,
) -> None:
    def never(event: Any, track: Any) -> Any:
        raise AssertionError("admission ran for an event the protocol refused")

    with pytest.raises(RemoteProtocolError) as refused:
        paused.server.receive_message(
            encode_event(ResponseAppend(input=[output("nope")])), admit=never
        )
    assert refused.value.code == ErrorCode.UNKNOWN_CALL_ID


@pytest.mark.parametrize(
    ("cls", "status"),
    [
        (protocol.events.ResponseCompleted, "failed"),
        (protocol.events.ResponseCompleted, "requires_action"),
        (protocol.events.ResponseFailed, "completed"),
        (protocol.events.ResponseIncomplete, "in_progress"),
    ],
)
def test_a_typed_ending_carries_its_own_status(pair: ConnectionPair, cls: Any, status: str) -> None:
    pair.start()
    event = pair.emit(cls, response=response(status=status))
    pair.assert_rejected(Role.SERVER, event, code=ErrorCode.INVALID_VALUE, param="response.status")
    pair.serve(cls, response=response(status=cls.__name__.removeprefix("Response").lower()))
    assert pair.state().value == cls.__name__.removeprefix("Response").lower()


@pytest.mark.parametrize("opened", ["queued", "in_progress"])
def test_a_cancelled_background_response_ends_with_response_failed(
    pair: ConnectionPair, opened: str
) -> None:
    """The shipped stream of a cancelled background response ends with
    ``response.failed`` carrying ``cancelled``: both peers record it cancelled,
    and nothing may follow it."""
    pair.start(status=opened)
    assert pair.state().value == opened
    pair.serve(protocol.events.ResponseFailed, response=response(status="cancelled"))
    assert pair.state() is ResponseState.CANCELLED
    assert pair.server.response(RID).state is ResponseState.CANCELLED  # type: ignore[union-attr]
    late = pair.emit(protocol.events.ResponseFailed, response=response(status="cancelled"))
    pair.assert_rejected(
        Role.SERVER, late, code=ErrorCode.RESPONSE_ALREADY_COMPLETED, param=None
    )
