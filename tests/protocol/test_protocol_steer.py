"""``response.steer`` in the sans-IO core, a client and a server Connection in memory.

The pair of ``tests/protocol/test_protocol.py``, on the shipped shape. A
steer names a live response and carries user messages; it changes nothing
(its input waits for the successor); its receipt is numbered in the steered
response's stream; every refusal carries the ``response.steer.failed`` that
answers it, the input handed back, and the receiver's refusals match the
sender's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol import (
    RULES,
    ErrorCode,
    Mode,
    RemoteProtocolError,
    ResponseState,
    Role,
    Transition,
    encode_event,
)
from protocol.events import (
    ResponseCompleted,
    ResponseSteer,
    ResponseSteerAccepted,
    ResponseSteerFailed,
    ResponseSteerPending,
    SteerReceipt,
    SteerRequiredInput,
)
from protocol.items import InputText, Message, OutputText
from tests.support.connection_pair import RID, ConnectionPair, output, response, snapshot, user


def steer(text: Any = "go left", target: str = RID) -> ResponseSteer:
    return ResponseSteer(previous_response_id=target, input=text)


@pytest.fixture
def running() -> ConnectionPair:
    """The shipped shape; ``resp_1`` is streaming."""
    pair = ConnectionPair(Mode.SHIPPED)
    pair.create(input="add things")
    pair.start()
    return pair


def test_the_rule_table_holds_steer_and_its_receipt() -> None:
    for state in (ResponseState.QUEUED, ResponseState.IN_PROGRESS, ResponseState.REQUIRES_ACTION):
        assert RULES[(Role.CLIENT, state)]["response.steer"] == (Transition.STEER, state)
        assert RULES[(Role.SERVER, state)]["response.steer.accepted"] == (Transition.EMIT, state)
    for state in (ResponseState.COMPLETED, ResponseState.INCOMPLETE):
        assert "response.steer" not in RULES.get((Role.CLIENT, state), {})
    # .failed and .pending are connection-level, like error: in no state's rules.
    for key in ("response.steer.failed", "response.steer.pending"):
        assert all(key not in moves for moves in RULES.values())


def test_a_steer_changes_nothing_and_its_receipt_takes_the_next_number(
    running: ConnectionPair,
) -> None:
    before = snapshot(running.server)
    running.send(Role.CLIENT, steer())
    running.send(
        Role.CLIENT, steer([user("one"), Message(role="user", content=[InputText(text="two")])])
    )
    assert snapshot(running.server) == before
    track = running.server.response(RID)
    assert track is not None
    sequence = track.next_sequence
    running.send(
        Role.SERVER,
        ResponseSteerAccepted(
            sequence_number=sequence, steer=SteerReceipt(id="steer_1", previous_response_id=RID)
        ),
    )
    assert track.next_sequence == sequence + 1
    running.serve(ResponseCompleted, response=response(status="completed"))
    # After the end: pending and failed carry the number nothing will use.
    pending = ResponseSteerPending(
        sequence_number=track.next_sequence,
        steer=SteerReceipt(id="steer_1", previous_response_id=RID),
        reason="waiting_for_required_input",
        required_input=[SteerRequiredInput(type="function_call_output", call_id="c1", name="add")],
    )
    running.send(Role.SERVER, pending)
    running.send(Role.SERVER, pending)  # no state: any number of them
    assert track.next_sequence == sequence + 2


def failed_reply(pair: ConnectionPair, event: ResponseSteer | bytes) -> RemoteProtocolError:
    """The server's refusal of ``event``; it carries a ``response.steer.failed``."""
    before = snapshot(pair.server)
    data = event if isinstance(event, bytes) else encode_event(event)
    with pytest.raises(RemoteProtocolError) as refused:
        pair.server.receive_message(data)
    assert snapshot(pair.server) == before
    assert isinstance(refused.value.reply, ResponseSteerFailed)
    return refused.value


@pytest.mark.parametrize(
    ("steering", "code", "param"),
    [
        (steer(target="resp_nope"), ErrorCode.RESPONSE_NOT_FOUND, "previous_response_id"),
        (steer([]), ErrorCode.INVALID_INPUT, "input"),
        (steer([output("c1")]), ErrorCode.INVALID_INPUT, "input[0].type"),
        (
            steer([user(), Message(role="developer", content="x")]),
            ErrorCode.INVALID_INPUT,
            "input[1].role",
        ),
        (
            steer([Message(role="user", content=[OutputText(text="x", annotations=[])])]),
            ErrorCode.INVALID_INPUT,
            "input[0].content[0].type",
        ),
    ],
)
def test_refusals_match_on_both_ends_and_hand_the_input_back(
    running: ConnectionPair, steering: ResponseSteer, code: str, param: str
) -> None:
    status = 404 if code == ErrorCode.RESPONSE_NOT_FOUND else 400
    running.assert_rejected(Role.CLIENT, steering, code=code, param=param, status=status)
    error = failed_reply(running, steering)
    reply = error.reply
    assert isinstance(reply, ResponseSteerFailed)
    assert (reply.error.code, reply.error.type) == (code, "invalid_request_error")
    assert reply.steer.input == steering.input
    assert reply.steer.previous_response_id == steering.previous_response_id
    known = steering.previous_response_id == RID
    assert reply.sequence_number == (2 if known else 0)


def test_a_finished_response_takes_no_steer(running: ConnectionPair) -> None:
    running.serve(ResponseCompleted, response=response(status="completed"))
    running.assert_rejected(
        Role.CLIENT,
        steer(),
        code=ErrorCode.RESPONSE_ALREADY_COMPLETED,
        param="previous_response_id",
        status=409,
    )
    reply = failed_reply(running, steer()).reply
    assert isinstance(reply, ResponseSteerFailed)
    assert reply.error.code == ErrorCode.RESPONSE_ALREADY_COMPLETED
    assert reply.sequence_number == 3  # what resp_1 would have had next


def test_a_steer_that_does_not_decode_is_failed_when_its_target_can_be_read(
    running: ConnectionPair,
) -> None:
    bad = {"type": "response.steer", "previous_response_id": RID, "input": "x", "stream_id": "a"}
    reply = failed_reply(running, json.dumps(bad).encode()).reply
    assert isinstance(reply, ResponseSteerFailed)
    assert (reply.error.code, reply.steer.input) == (ErrorCode.INVALID_INPUT, "x")
    assert "stream_id" in reply.error.message
    raw = [{"role": "user", "content": 5}]
    data = {"type": "response.steer", "previous_response_id": RID, "input": raw}
    reply = failed_reply(running, json.dumps(data).encode()).reply
    assert isinstance(reply, ResponseSteerFailed)
    assert reply.steer.input == raw  # handed back as sent
    # Without a readable target there is nothing to answer: a plain error.
    with pytest.raises(RemoteProtocolError) as refused:
        running.server.receive_message(b'{"type":"response.steer","input":"x"}')
    assert refused.value.reply is None
    assert (refused.value.code, refused.value.param) == (
        ErrorCode.MISSING_REQUIRED_PARAMETER,
        "previous_response_id",
    )


def test_append_mode_does_not_speak_steer() -> None:
    pair = ConnectionPair(Mode.APPEND)
    pair.create(input="add things")
    pair.start()
    pair.assert_rejected(Role.CLIENT, steer(), code=ErrorCode.UNKNOWN_EVENT_TYPE, param="type")
    with pytest.raises(RemoteProtocolError) as refused:
        pair.server.receive_message(b'{"type":"response.steer"}')
    assert refused.value.code == ErrorCode.UNKNOWN_EVENT_TYPE
    assert refused.value.reply is None
