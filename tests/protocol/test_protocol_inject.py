"""``response.inject`` in the sans-IO core, a client and a server Connection in memory.

The protocol tests' pair (``tests/support/connection_pair.py``): each rule is
checked from both ends (the sender raises :class:`LocalProtocolError`, the receiver
:class:`RemoteProtocolError` with the same wire code, neither changes). An
inject is checked like an append; its two refusals that the beta answers
itself carry their ``response.inject.failed`` reply, and a schema-invalid one
carries the close code.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol import (
    CLOSE_CODES,
    RULES,
    CloseCode,
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
    ResponseInject,
    ResponseInjectCreated,
    ResponseInjectFailed,
)
from tests.support.connection_pair import RID, ConnectionPair, output, response, snapshot, user


def inject(*items: Any, response_id: str = RID) -> ResponseInject:
    return ResponseInject(response_id=response_id, input=list(items))


def receipt(pair: ConnectionPair, response_id: str = RID) -> ResponseInjectCreated:
    return ResponseInjectCreated(
        sequence_number=pair.next_sequence(response_id), response_id=response_id
    )


@pytest.fixture(params=[Mode.APPEND, Mode.SHIPPED], ids=["append", "multi-agent"])
def pair(request: pytest.FixtureRequest) -> ConnectionPair:
    """Append mode, or the shipped shape opened with the multi-agent beta."""
    pair = ConnectionPair(request.param)
    for conn in (pair.client, pair.server):
        conn.multi_agent = True
    return pair


@pytest.fixture
def waiting(pair: ConnectionPair) -> ConnectionPair:
    """``resp_1`` has streamed two tool calls, ``c1`` and ``c2``, and waits for them."""
    pair.create(input="add things")
    pair.start()
    pair.call("c1")
    pair.call("c2")
    if pair.server.mode is Mode.APPEND:
        pair.pause("c1", "c2")
    return pair


def test_the_rule_table_holds_inject_and_its_receipt() -> None:
    for state in (ResponseState.QUEUED, ResponseState.IN_PROGRESS, ResponseState.REQUIRES_ACTION):
        assert RULES[(Role.CLIENT, state)]["response.inject"] == (Transition.APPEND, state)
        assert RULES[(Role.SERVER, state)]["response.inject.created"] == (Transition.EMIT, state)
    for state in (ResponseState.COMPLETED, ResponseState.FAILED):
        assert "response.inject" not in RULES.get((Role.CLIENT, state), {})
    # response.inject.failed is connection-level, like error: in no state's rules.
    assert all("response.inject.failed" not in moves for moves in RULES.values())


def test_inject_commits_outputs_and_its_receipt_takes_the_next_number(
    waiting: ConnectionPair,
) -> None:
    track = waiting.client.response(RID)
    assert track is not None
    state = track.state
    waiting.send(Role.CLIENT, inject(output("c2")))
    assert track.pending_calls == {"c1": "add"}
    waiting.send(Role.CLIENT, inject(output("c1"), user("and add them")))
    assert (track.pending_calls, track.answered_calls) == ({}, {"c1", "c2"})
    assert track.state is state  # the move is the append's: no change of state
    sequence = track.next_sequence
    waiting.send(Role.SERVER, receipt(waiting))
    assert track.next_sequence == sequence + 1
    assert track.state is state


def test_inject_is_checked_like_an_append(waiting: ConnectionPair) -> None:
    waiting.assert_rejected(
        Role.CLIENT,
        inject(output("nope")),
        code=ErrorCode.UNKNOWN_CALL_ID,
        param="input[0].call_id",
    )
    waiting.assert_rejected(
        Role.CLIENT,
        inject(output("c1"), output("c1")),
        code=ErrorCode.DUPLICATE_CALL_ID,
        param="input[1].call_id",
    )
    waiting.send(Role.CLIENT, inject(output("c1")))
    waiting.assert_rejected(
        Role.CLIENT,
        inject(output("c1")),
        code=ErrorCode.DUPLICATE_CALL_ID,
        param="input[0].call_id",
    )
    small = ConnectionPair(max_items_per_event=1)
    small.start()
    small.assert_rejected(
        Role.CLIENT, inject(user(), user()), code=ErrorCode.TOO_MANY_ITEMS, param="input"
    )


def test_a_finished_response_gets_inject_failed_with_the_input_handed_back(
    pair: ConnectionPair,
) -> None:
    pair.start()
    if pair.server.mode is Mode.APPEND:
        pair.finish("completed")
    else:
        pair.serve(ResponseCompleted, response=response(status="completed"))
    late = inject(output("c1", "too late"))
    pair.assert_rejected(
        Role.CLIENT,
        late,
        code=ErrorCode.RESPONSE_ALREADY_COMPLETED,
        param="response_id",
        status=409,
    )
    with pytest.raises(RemoteProtocolError) as refused:
        pair.server.receive_message(encode_event(late))
    reply = refused.value.reply
    assert isinstance(reply, ResponseInjectFailed)
    # Numbered after the response's last event (its stream is over: not consumed).
    assert (reply.sequence_number, reply.response_id) == (pair.next_sequence(RID), RID)
    assert (reply.error.code, reply.input) == (ErrorCode.RESPONSE_ALREADY_COMPLETED, late.input)
    assert refused.value.close_code is None
    # The reply is sent and touches no state on either end.
    before = snapshot(pair.client), snapshot(pair.server)
    pair.send(Role.SERVER, reply)
    assert (snapshot(pair.client), snapshot(pair.server)) == before
    # A receipt for a finished response is refused like any of its events.
    pair.assert_rejected(
        Role.SERVER,
        receipt(pair),
        code=ErrorCode.RESPONSE_ALREADY_COMPLETED,
        param=None,
    )


def test_an_unknown_response_gets_inject_failed_numbered_zero(pair: ConnectionPair) -> None:
    event = inject(output("c1"), response_id="resp_nope")
    pair.assert_rejected(
        Role.CLIENT, event, code=ErrorCode.RESPONSE_NOT_FOUND, param="response_id", status=404
    )
    with pytest.raises(RemoteProtocolError) as refused:
        pair.server.receive_message(encode_event(event))
    reply = refused.value.reply
    assert isinstance(reply, ResponseInjectFailed)
    assert (reply.sequence_number, reply.response_id) == (0, "resp_nope")
    assert (reply.error.code, reply.input) == (ErrorCode.RESPONSE_NOT_FOUND, event.input)


def test_a_receipt_out_of_order_is_refused(waiting: ConnectionPair) -> None:
    wrong = ResponseInjectCreated(sequence_number=waiting.next_sequence(RID) + 1, response_id=RID)
    waiting.assert_rejected(
        Role.SERVER, wrong, code=ErrorCode.INVALID_VALUE, param="sequence_number"
    )


def test_the_applications_refusal_as_finished_gets_the_reply_too(
    waiting: ConnectionPair,
) -> None:
    """A server whose response's turns are over refuses at admission; the core
    turns that refusal into the beta's answer as well."""

    def finished(event: Any, track: Any) -> Any:
        raise RemoteProtocolError(
            "its turns are over", code=ErrorCode.RESPONSE_ALREADY_COMPLETED, status=409
        )

    before = snapshot(waiting.server)
    event = inject(output("c1"))
    with pytest.raises(RemoteProtocolError) as refused:
        waiting.server.receive_message(encode_event(event), admit=finished)
    assert isinstance(refused.value.reply, ResponseInjectFailed)
    assert refused.value.reply.input == event.input
    assert snapshot(waiting.server) == before

    def secret(event: Any, track: Any) -> Any:
        raise RemoteProtocolError("no", code="secret_detected", param="input[0]")

    with pytest.raises(RemoteProtocolError) as refused:
        waiting.server.receive_message(encode_event(event), admit=secret)
    assert refused.value.reply is None  # any other refusal is an error event


def test_the_shipped_shape_speaks_inject_only_with_the_beta() -> None:
    plain = ConnectionPair(Mode.SHIPPED)
    plain.start()
    plain.assert_rejected(
        Role.CLIENT, inject(user()), code=ErrorCode.UNKNOWN_EVENT_TYPE, param="type"
    )
    # Nor does a schema-invalid one close a connection that does not speak it.
    with pytest.raises(RemoteProtocolError) as refused:
        plain.server.receive_message(b'{"type": "response.inject", "input": []}')
    assert (refused.value.code, refused.value.close_code) == (ErrorCode.UNKNOWN_EVENT_TYPE, None)
    plain.create(input=[user()], previous_response_id=RID)


@pytest.mark.parametrize(
    ("frame", "code", "param"),
    [
        ({"type": "response.inject", "input": []}, "missing_required_parameter", "response_id"),
        ({"type": "response.inject", "response_id": RID}, "missing_required_parameter", "input"),
        ({"type": "response.inject", "response_id": RID, "input": "hi"}, "invalid_type", "input"),
        (
            {"type": "response.inject", "response_id": RID, "input": [{"type": "nope"}]},
            "invalid_value",
            "input[0].type",
        ),
    ],
)
def test_a_schema_invalid_inject_closes_the_connection(
    pair: ConnectionPair, frame: dict[str, Any], code: str, param: str
) -> None:
    pair.start()
    before = snapshot(pair.server)
    with pytest.raises(RemoteProtocolError) as refused:
        pair.server.receive_message(json.dumps(frame))
    assert (refused.value.code, refused.value.param, refused.value.status) == (code, param, 400)
    assert refused.value.close_code == CLOSE_CODES["invalid_event"] == CloseCode.PROTOCOL_ERROR
    assert snapshot(pair.server) == before
    # Only an inject does that: a bad append or create is a request error.
    for other in ({"type": "response.create", "input": 5}, {"type": "response.append"}):
        with pytest.raises(RemoteProtocolError) as refused:
            pair.server.receive_message(json.dumps(other))
        assert refused.value.close_code is None
