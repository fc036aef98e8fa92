"""Request errors, refused by the sender and rejected by the receiver; server
errors the client rejects.
"""

from __future__ import annotations

from typing import Any

import pytest

import protocol
from protocol import (
    ErrorCode,
    LocalProtocolError,
    Mode,
    ProtocolError,
    Role,
)
from protocol.events import (
    OutputTextDelta,
    ResponseAppend,
    ResponseCancel,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseInProgress,
)
from protocol.items import Message
from tests.support.connection_pair import RID, ConnectionPair, function_call, output, response, user

# --- request errors: refused by the sender, rejected by the receiver --------


def test_unknown_call_id(paused: ConnectionPair) -> None:
    event = ResponseAppend(input=[user(), output("nope")])
    paused.assert_rejected(
        Role.CLIENT, event, code=ErrorCode.UNKNOWN_CALL_ID, param="input[1].call_id"
    )
    paused.append(output("c1"))  # still usable


def test_a_refused_id_is_quoted_clipped(paused: ConnectionPair) -> None:
    """An error quotes at most MAX_QUOTED characters of a peer's id, and says its length."""
    call_id = "c" * 1_000_000
    event = ResponseAppend(input=[output(call_id)])
    paused.assert_rejected(
        Role.CLIENT, event, code=ErrorCode.UNKNOWN_CALL_ID, param="input[0].call_id"
    )
    with pytest.raises(LocalProtocolError) as refused:
        paused.client.send(event)
    assert len(refused.value.message) < ProtocolError.MAX_QUOTED + 200
    assert "c" * ProtocolError.MAX_QUOTED + "... (1000000 characters)" in refused.value.message
    assert ProtocolError.clip("c" * ProtocolError.MAX_QUOTED) == "c" * ProtocolError.MAX_QUOTED


def test_duplicate_call_id_across_appends(paused: ConnectionPair) -> None:
    paused.append(output("c1"))
    event = ResponseAppend(input=[output("c1")])
    paused.assert_rejected(
        Role.CLIENT, event, code=ErrorCode.DUPLICATE_CALL_ID, param="input[0].call_id"
    )
    paused.append(output("c2"))


def test_duplicate_call_id_within_one_append(paused: ConnectionPair) -> None:
    event = ResponseAppend(input=[output("c1"), output("c1")])
    paused.assert_rejected(
        Role.CLIENT, event, code=ErrorCode.DUPLICATE_CALL_ID, param="input[1].call_id"
    )
    track = paused.client.response(RID)
    assert track is not None
    assert track.answered_calls == set()
    paused.append(output("c1"), output("c2"))


@pytest.mark.parametrize("status", ["completed", "incomplete", "failed", "cancelled"])
def test_append_or_cancel_to_a_finished_response(pair: ConnectionPair, status: str) -> None:
    pair.start()
    pair.finish(status)
    for event in (ResponseAppend(input=[user()]), ResponseCancel(response_id=RID)):
        pair.assert_rejected(
            Role.CLIENT,
            event,
            code=ErrorCode.RESPONSE_ALREADY_COMPLETED,
            param="response_id",
            status=409,
        )
    pair.start("resp_2")
    pair.append(user(), response_id="resp_2")


@pytest.mark.parametrize(
    "event",
    [
        ResponseAppend(input=[user()]),
        ResponseAppend(input=[user()], response_id="resp_nope"),
        ResponseCancel(),
        ResponseCancel(response_id="resp_nope"),
    ],
    ids=["append-latest", "append-named", "cancel-latest", "cancel-named"],
)
def test_append_or_cancel_without_such_a_response(pair: ConnectionPair, event: Any) -> None:
    pair.assert_rejected(
        Role.CLIENT, event, code=ErrorCode.RESPONSE_NOT_FOUND, param="response_id", status=404
    )
    pair.start()
    pair.send(Role.CLIENT, event if event.response_id is None else ResponseCancel())


@pytest.mark.parametrize(
    ("item", "param"),
    [
        (Message(role="assistant", content="I said so"), "input[0].role"),
        (function_call("c9"), "input[0].type"),
        (protocol.items.Reasoning(summary=[]), "input[0].type"),
    ],
    ids=["assistant-message", "function-call", "reasoning"],
)
def test_append_carries_only_user_input_and_outputs(
    paused: ConnectionPair, item: Any, param: str
) -> None:
    paused.assert_rejected(
        Role.CLIENT, ResponseAppend(input=[item]), code=ErrorCode.INVALID_VALUE, param=param
    )
    paused.append(Message(role="developer", content="be brief"), output("c1"))


def test_too_many_items() -> None:
    pair = ConnectionPair(max_items_per_event=2)
    create = ResponseCreate(model="sim", input=[user(), user(), user()])
    pair.assert_rejected(Role.CLIENT, create, code=ErrorCode.TOO_MANY_ITEMS, param="input")
    pair.create(input=[user(), user()])
    pair.start()
    append = ResponseAppend(input=[user(), user(), user()])
    pair.assert_rejected(Role.CLIENT, append, code=ErrorCode.TOO_MANY_ITEMS, param="input")
    pair.append(user(), user())


def test_append_is_not_part_of_the_shipped_shape() -> None:
    pair = ConnectionPair(Mode.SHIPPED)
    pair.start()
    pair.assert_rejected(
        Role.CLIENT,
        ResponseAppend(input=[user()]),
        code=ErrorCode.UNKNOWN_EVENT_TYPE,
        param="type",
    )
    pair.create(input=[user()], previous_response_id=RID)


# --- server errors: the client rejects what the server must not send -------


def test_wrong_sequence_number(pair: ConnectionPair) -> None:
    pair.start()
    expected = pair.next_sequence(RID)
    for wrong in (expected + 1, expected - 1):
        event = pair.emit(
            ResponseDone, sequence_number=wrong, response=response(status="completed")
        )
        pair.assert_rejected(
            Role.SERVER, event, code=ErrorCode.INVALID_VALUE, param="sequence_number"
        )
    pair.finish()


def test_a_response_starts_at_sequence_number_zero(pair: ConnectionPair) -> None:
    event = ResponseCreated(sequence_number=3, response=response())
    pair.assert_rejected(Role.SERVER, event, code=ErrorCode.INVALID_VALUE, param="sequence_number")
    pair.start()


def test_a_response_is_created_once(pair: ConnectionPair) -> None:
    pair.start()
    event = pair.emit(ResponseCreated)
    pair.assert_rejected(Role.SERVER, event, code=ErrorCode.INVALID_VALUE, param="response.id")
    pair.finish()


def test_events_for_an_unknown_response(pair: ConnectionPair) -> None:
    pair.start()
    for event in (
        OutputTextDelta(
            sequence_number=0,
            response_id="resp_nope",
            item_id="m",
            output_index=0,
            content_index=0,
            delta="x",
        ),
        ResponseDone(sequence_number=0, response=response("resp_nope", "completed")),
    ):
        pair.assert_rejected(
            Role.SERVER, event, code=ErrorCode.RESPONSE_NOT_FOUND, param="response_id"
        )
    pair.finish()


def test_a_finished_response_emits_nothing_more(pair: ConnectionPair) -> None:
    pair.start()
    pair.finish()
    delta = pair.emit(OutputTextDelta, item_id="m", output_index=0, content_index=0, delta="x")
    done = pair.emit(ResponseDone, response=response(status="completed"))
    for event in (delta, pair.emit(ResponseInProgress), done):
        pair.assert_rejected(
            Role.SERVER, event, code=ErrorCode.RESPONSE_ALREADY_COMPLETED, param=None
        )


def test_response_done_needs_a_done_status(pair: ConnectionPair) -> None:
    pair.start()
    for status in ("in_progress", "queued"):
        event = pair.emit(ResponseDone, response=response(status=status))
        pair.assert_rejected(
            Role.SERVER, event, code=ErrorCode.INVALID_VALUE, param="response.status"
        )
    pair.pause()
    again = pair.emit(ResponseDone, response=response(status="requires_action"))
    pair.assert_rejected(Role.SERVER, again, code=ErrorCode.INVALID_VALUE, param=None)
    pair.resume()
