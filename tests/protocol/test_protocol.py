"""The sans-IO protocol core, a client and a server Connection driven in memory.

Modelled on h11's ``tests/helpers.py``: a :class:`ConnectionPair` sends every
event through one side's ``send`` and the other side's ``receive_message``, so
each rule is checked from both ends: the sender raises
:class:`LocalProtocolError` before anything leaves, the receiver raises
:class:`RemoteProtocolError` with the same wire code, and neither side changes.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from copy import deepcopy
from typing import Any

import msgspec
import pytest

import protocol
from protocol import (
    CLOSED,
    NEED_DATA,
    TERMINAL_STATES,
    TRANSITIONS,
    Connection,
    ErrorCode,
    LocalProtocolError,
    Mode,
    RemoteProtocolError,
    ResponseState,
    ResponseStateMachine,
    Role,
    Transition,
    decode_client_event,
    decode_server_event,
    encode_event,
    error_event,
    json_path_to_param,
)
from protocol.events import (
    ErrorEvent,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    ResponseAppend,
    ResponseCancel,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseInProgress,
    ResponseProcessed,
    ResponseQueued,
    TimingEvent,
)
from protocol.items import FunctionCall, FunctionCallOutput, Message
from protocol.response import RequiredAction, Response
from tests.support.paths import ROOT

PROTOCOL_DIR = pathlib.Path(protocol.__file__).parent
RID = "resp_1"

# --- helpers ---------------------------------------------------------------


def response(response_id: str = RID, status: str = "in_progress", **fields: Any) -> Response:
    return Response(id=response_id, created_at=1_700_000_000, status=status, model="sim", **fields)  # type: ignore[arg-type]


def function_call(call_id: str, name: str = "add") -> FunctionCall:
    return FunctionCall(call_id=call_id, name=name, arguments='{"a": 1}', id=f"fc_{call_id}")


def output(call_id: str, text: str = "2") -> FunctionCallOutput:
    return FunctionCallOutput(call_id=call_id, output=text)


def user(text: str = "and then?") -> Message:
    return Message(role="user", content=text)


def queued_events(conn: Connection) -> list[Any]:
    """The events ``conn.next_event()`` would hand out now, leaving ``conn`` as it is."""
    copy = deepcopy(conn)
    events = []
    while (event := copy.next_event()) is not NEED_DATA and event is not CLOSED:
        events.append(event)
    return events


def snapshot(conn: Connection) -> Any:
    """Everything a Connection tracks, as plain comparable values."""
    tracks = {
        rid: (t.state, t.next_sequence, dict(t.pending_calls), set(t.answered_calls), t.stream_id)
        for rid, t in conn.responses.items()
    }
    return tracks, dict(conn.lanes), queued_events(conn), conn.closed


def drain(conn: Connection) -> list[Any]:
    events = []
    while (event := conn.next_event()) is not NEED_DATA:
        assert event is not CLOSED
        events.append(event)
    return events


class ConnectionPair:
    """A client and a server :class:`Connection` talking to each other in memory.

    ``send`` carries one event across and returns what the peer received;
    ``emit`` builds a server event with the response's next
    ``sequence_number``. ``as_text`` feeds messages as ``str`` (what an ASGI
    server hands over) instead of ``bytes``.
    """

    def __init__(self, mode: Mode = Mode.APPEND, *, as_text: bool = False, **limits: int) -> None:
        self.client = Connection(Role.CLIENT, mode, **limits)
        self.server = Connection(Role.SERVER, mode, **limits)
        self.as_text = as_text
        self._ids = iter(range(1, 1_000_000))

    def ends(self, role: Role) -> tuple[Connection, Connection]:
        """(sender, receiver) for events sent by ``role``."""
        return (self.client, self.server) if role is Role.CLIENT else (self.server, self.client)

    def send(self, role: Role, event: Any) -> list[Any]:
        sender, receiver = self.ends(role)
        data = sender.send(event)
        receiver.receive_message(data.decode() if self.as_text else data)
        received = drain(receiver)
        assert received == [event]
        self.assert_agree()
        return received

    def assert_agree(self) -> None:
        """Both peers hold the same view of every response."""
        assert snapshot(self.client)[:2] == snapshot(self.server)[:2]

    # client side

    def create(self, **fields: Any) -> None:
        self.send(Role.CLIENT, ResponseCreate(model="sim", **fields))

    def append(self, *items: Any, response_id: str | None = None) -> None:
        self.send(Role.CLIENT, ResponseAppend(input=list(items), response_id=response_id))

    # server side

    def next_sequence(self, response_id: str) -> int:
        track = self.server.response(response_id)
        return 0 if track is None else track.next_sequence

    def emit(self, cls: type[msgspec.Struct], response_id: str = RID, **fields: Any) -> Any:
        """Build a server event of ``cls`` for ``response_id`` with the next sequence number."""
        fields.setdefault("sequence_number", self.next_sequence(response_id))
        if "response" in cls.__struct_fields__:
            fields.setdefault("response", response(response_id))
        else:
            fields.setdefault("response_id", response_id)
        return cls(**fields)

    def serve(self, cls: type[msgspec.Struct], response_id: str = RID, **fields: Any) -> None:
        self.send(Role.SERVER, self.emit(cls, response_id, **fields))

    def start(self, response_id: str = RID, status: str = "in_progress") -> None:
        self.serve(ResponseCreated, response_id, response=response(response_id, status))
        if status == "in_progress":
            self.serve(ResponseInProgress, response_id)

    def call(self, call_id: str, response_id: str = RID) -> None:
        """The model's tool call, streamed the shipped way."""
        index = next(self._ids)
        item = function_call(call_id)
        item_id = f"fc_{call_id}"
        self.serve(OutputItemAdded, response_id, output_index=index, item=item)
        self.serve(
            FunctionCallArgumentsDelta, response_id, item_id=item_id, output_index=index, delta="{"
        )
        self.serve(
            FunctionCallArgumentsDone,
            response_id,
            item_id=item_id,
            output_index=index,
            name="add",
            arguments='{"a": 1}',
        )
        self.serve(OutputItemDone, response_id, output_index=index, item=item)

    def pause(self, *call_ids: str, response_id: str = RID) -> None:
        action = RequiredAction(call_ids=list(call_ids))
        done = response(response_id, "requires_action", required_action=action)
        self.serve(ResponseDone, response_id, response=done)

    def resume(self, response_id: str = RID) -> None:
        self.serve(ResponseInProgress, response_id)

    def finish(self, status: str = "completed", response_id: str = RID) -> None:
        self.serve(ResponseDone, response_id, response=response(response_id, status))

    def state(self, response_id: str = RID) -> ResponseState:
        track = self.client.response(response_id)
        assert track is not None
        return track.state

    def assert_rejected(
        self, role: Role, event: Any, *, code: str, param: str | None, status: int = 400
    ) -> None:
        """``event`` is refused by ``role``'s send and by the peer's receive, alike."""
        sender, receiver = self.ends(role)
        before = snapshot(sender), snapshot(receiver)
        with pytest.raises(LocalProtocolError) as local:
            sender.send(event)
        with pytest.raises(RemoteProtocolError) as remote:
            receiver.receive_message(encode_event(event))
        for exc in (local.value, remote.value):
            assert (exc.code, exc.param, exc.status) == (code, param, status), repr(exc)
        assert remote.value.message == local.value.message
        assert (snapshot(sender), snapshot(receiver)) == before


@pytest.fixture(params=[False, True], ids=["bytes", "str"])
def pair(request: pytest.FixtureRequest) -> ConnectionPair:
    return ConnectionPair(as_text=request.param)


@pytest.fixture
def paused(pair: ConnectionPair) -> ConnectionPair:
    """``resp_1`` paused on two tool calls, ``c1`` and ``c2``."""
    pair.create(input="add things")
    pair.start()
    pair.call("c1")
    pair.call("c2")
    pair.pause("c1", "c2")
    return pair


# --- a whole rollout, both directions --------------------------------------


def test_rollout_pauses_and_resumes_as_one_response(pair: ConnectionPair) -> None:
    pair.create(input=[user("what is 1+1?")], tools=[])
    assert pair.client.latest_response_id() is None  # nothing exists until the server says so
    pair.start()
    assert pair.state() is ResponseState.IN_PROGRESS
    assert pair.client.latest_response_id() == RID

    pair.call("c1")
    track = pair.client.response(RID)
    assert track is not None
    assert track.pending_calls == {"c1": "add"}
    pair.pause("c1")
    assert pair.state() is ResponseState.REQUIRES_ACTION

    pair.append(output("c1"))
    assert track.pending_calls == {}
    assert track.answered_calls == {"c1"}
    assert pair.state() is ResponseState.REQUIRES_ACTION  # until the server resumes
    pair.resume()
    assert pair.state() is ResponseState.IN_PROGRESS

    # sequence numbers keep counting across the pause
    sequence = pair.next_sequence(RID)
    pair.serve(
        OutputTextDelta,
        item_id="msg_1",
        output_index=9,
        content_index=0,
        delta="2",
        sequence_number=sequence,
    )
    pair.finish("completed")
    assert pair.state() is ResponseState.COMPLETED
    assert pair.next_sequence(RID) == sequence + 2


def test_outputs_may_arrive_one_call_at_a_time(paused: ConnectionPair) -> None:
    paused.append(output("c2"))
    track = paused.server.response(RID)
    assert track is not None
    assert track.pending_calls == {"c1": "add"}
    paused.append(output("c1"), response_id=RID)
    assert track.pending_calls == {}
    assert track.answered_calls == {"c1", "c2"}
    paused.resume()
    paused.finish()


@pytest.mark.parametrize("status", ["completed", "incomplete", "failed", "cancelled"])
def test_every_terminal_status_ends_the_response(pair: ConnectionPair, status: str) -> None:
    pair.start()
    pair.finish(status)
    assert pair.state() in TERMINAL_STATES
    assert pair.state().value == status


def test_steering_input_is_accepted_while_sampling_and_queued(pair: ConnectionPair) -> None:
    pair.start("resp_q", status="queued")
    assert pair.state("resp_q") is ResponseState.QUEUED
    pair.append(user("also this"), response_id="resp_q")
    pair.serve(ResponseInProgress, "resp_q")
    assert pair.state("resp_q") is ResponseState.IN_PROGRESS
    pair.append(user("and this"))
    pair.send(Role.CLIENT, ResponseAppend(input="a plain string is a user message"))
    assert pair.state("resp_q") is ResponseState.IN_PROGRESS


def test_queued_response_announced_by_response_queued(pair: ConnectionPair) -> None:
    pair.serve(ResponseQueued, response=response(status="queued"))
    assert pair.state() is ResponseState.QUEUED
    pair.resume()
    assert pair.state() is ResponseState.IN_PROGRESS


def test_cancel_is_checked_but_the_server_decides(pair: ConnectionPair) -> None:
    pair.start()
    pair.send(Role.CLIENT, ResponseCancel())
    assert pair.state() is ResponseState.IN_PROGRESS
    pair.finish("cancelled")
    assert pair.state() is ResponseState.CANCELLED


def test_error_timing_and_processed_events_touch_no_state(pair: ConnectionPair) -> None:
    pair.start()
    before = snapshot(pair.client)
    error = ErrorEvent(
        error=protocol.events.ErrorBody(type="invalid_request_error", code="x", message="m")
    )
    pair.send(Role.SERVER, error)
    pair.send(Role.SERVER, TimingEvent(timing_metrics={"inference_ms": 1.5}, response_id=RID))
    pair.send(Role.CLIENT, ResponseProcessed(response_id=RID))
    assert snapshot(pair.client) == before


def test_lanes_track_their_latest_response(pair: ConnectionPair) -> None:
    pair.serve(ResponseCreated, "resp_a", response=response("resp_a"), stream_id="lane_a")
    pair.start("resp_main")
    assert pair.client.latest_response_id("lane_a") == "resp_a"
    assert pair.client.latest_response_id() == "resp_main"
    # an item event without response_id resolves through its lane
    sequence = pair.next_sequence("resp_a")
    event = OutputTextDelta(
        sequence_number=sequence,
        stream_id="lane_a",
        item_id="m",
        output_index=0,
        content_index=0,
        delta="x",
    )
    pair.send(Role.SERVER, event)
    assert pair.next_sequence("resp_a") == sequence + 1


def test_finished_responses_are_forgotten_beyond_the_limit() -> None:
    pair = ConnectionPair(max_tracked_responses=2)
    pair.start("resp_a")
    pair.finish(response_id="resp_a")
    pair.start("resp_b")
    pair.start("resp_c")  # three tracked: the finished one goes
    assert pair.client.response("resp_a") is None
    assert pair.server.response("resp_a") is None
    pair.start("resp_d")  # nothing finished to forget: live responses are kept
    assert all(pair.client.response(rid) for rid in ("resp_b", "resp_c", "resp_d"))


def test_next_event_queues_in_order_then_reports_closed() -> None:
    conn = Connection(Role.SERVER)
    assert conn.next_event() is NEED_DATA
    first, second = ResponseCreate(model="a"), ResponseCreate(model="b")
    conn.receive_message(encode_event(first))
    conn.receive_message(encode_event(second))
    conn.receive_closed()
    assert conn.closed
    assert [conn.next_event(), conn.next_event(), conn.next_event()] == [first, second, CLOSED]
    with pytest.raises(LocalProtocolError) as info:
        conn.receive_message(encode_event(first))
    assert info.value.code == "closed"


# --- request errors: refused by the sender, rejected by the receiver --------


def test_unknown_call_id(paused: ConnectionPair) -> None:
    event = ResponseAppend(input=[user(), output("nope")])
    paused.assert_rejected(
        Role.CLIENT, event, code=ErrorCode.UNKNOWN_CALL_ID, param="input[1].call_id"
    )
    paused.append(output("c1"))  # still usable


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


# --- what only the receiver can see ------------------------------------------


@pytest.mark.parametrize("role", [Role.CLIENT, Role.SERVER])
@pytest.mark.parametrize(
    ("frame", "code", "param"),
    [
        (b"{not json", ErrorCode.INVALID_JSON, None),
        (b"", ErrorCode.INVALID_JSON, None),
        (b'"a string"', ErrorCode.INVALID_TYPE, None),
        (b"{}", ErrorCode.MISSING_REQUIRED_PARAMETER, "type"),
        (b'{"type": "response.bogus"}', ErrorCode.UNKNOWN_EVENT_TYPE, "type"),
        (b'{"type": 7}', ErrorCode.INVALID_TYPE, "type"),
    ],
)
def test_frames_that_are_not_events(role: Role, frame: bytes, code: str, param: str | None) -> None:
    conn = Connection(role)
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_message(frame)
    assert (info.value.code, info.value.param) == (code, param)
    assert conn.next_event() is NEED_DATA


def test_each_side_refuses_the_other_sides_event_types() -> None:
    server_event = encode_event(ResponseCreated(sequence_number=0, response=response()))
    with pytest.raises(RemoteProtocolError) as info:
        Connection(Role.SERVER).receive_message(server_event)
    assert (info.value.code, info.value.param) == (ErrorCode.UNKNOWN_EVENT_TYPE, "type")
    with pytest.raises(RemoteProtocolError) as info:
        Connection(Role.CLIENT).receive_message(encode_event(ResponseCreate()))
    assert (info.value.code, info.value.param) == (ErrorCode.UNKNOWN_EVENT_TYPE, "type")


@pytest.mark.parametrize(
    ("frame", "code", "param"),
    [
        (b'{"type": "response.append"}', ErrorCode.MISSING_REQUIRED_PARAMETER, "input"),
        (b'{"type": "response.append", "input": 5}', ErrorCode.INVALID_TYPE, "input"),
        (
            b'{"type": "response.append", "input": [{"type": "function_call_output", '
            b'"output": "x"}]}',
            ErrorCode.MISSING_REQUIRED_PARAMETER,
            "input[0].call_id",
        ),
        (
            b'{"type": "response.create", "input": [{"type": "message", "role": "robot", '
            b'"content": "x"}]}',
            ErrorCode.INVALID_VALUE,
            "input[0].role",
        ),
        (
            b'{"type": "response.create", "input": [{"content": "no role, no type"}]}',
            ErrorCode.MISSING_REQUIRED_PARAMETER,
            "input[0].type",
        ),
        (
            b'{"type": "response.create", "temperature": "hot"}',
            ErrorCode.INVALID_TYPE,
            "temperature",
        ),
    ],
)
def test_bad_fields_are_named_by_param(frame: bytes, code: str, param: str) -> None:
    conn = Connection(Role.SERVER)
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_message(frame)
    assert (info.value.code, info.value.param, info.value.status) == (code, param, 400)
    assert isinstance(info.value.__cause__, msgspec.ValidationError)


@pytest.mark.parametrize("role", [Role.CLIENT, Role.SERVER])
@pytest.mark.parametrize("as_text", [False, True])
def test_message_too_large(role: Role, as_text: bool) -> None:
    conn = Connection(role, max_message_bytes=64)
    frame = '{"type": "response.create", "model": "' + "x" * 64 + '"}'
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_message(frame if as_text else frame.encode())
    assert (info.value.code, info.value.status) == (ErrorCode.MESSAGE_TOO_LARGE, 413)
    assert snapshot(conn) == snapshot(Connection(role))
    if role is Role.SERVER:
        conn.receive_message(b'{"type": "response.create"}')
        assert isinstance(conn.next_event(), ResponseCreate)


@pytest.mark.parametrize(
    "frame",
    [
        b'{"type": "response.append", "input": [{"role": "user", "content": "hi"}], oops',
        b'{"type": "response.append", "input": [{"role": "user", "content": "hi"}]',
        b'{"type": "response.create", "input": [{"role": "user", "content": "hi"}], "x": '
        + b"[" * 5000
        + b"]" * 5000
        + b"}",
        b'{"type": "response.create", "reasoning": {"a": ' + b"[" * 5000 + b"]" * 5000 + b"}}",
        b'{"type": "response.create", "surplus": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"type": "response.create", "input": [{"role": "user", "content": "hi"}], '
        b'"reasoning": {"a": 1e999}}',
        '{"type": "response.create", "input": "\ud800"}',
    ],
    ids=[
        "garbage-after-untyped-item",
        "truncated-after-untyped-item",
        "deep-after-untyped-item",
        "deep-in-any-field",
        "deep-in-unknown-field",
        "huge-number-after-untyped-item",
        "lone-surrogate",
    ],
)
def test_regressions_frames_that_escaped_as_other_errors(frame: bytes | str) -> None:
    # Each of these once raised msgspec.DecodeError, ValidationError,
    # RecursionError or UnicodeEncodeError out of receive_message.
    with pytest.raises(RemoteProtocolError) as info:
        Connection(Role.SERVER).receive_message(frame)
    assert info.value.code in (ErrorCode.INVALID_JSON, ErrorCode.INVALID_VALUE)


def test_regression_deep_nesting_from_the_server() -> None:
    deep = b"[" * 5000 + b"]" * 5000
    frame = (
        b'{"type": "response.output_text.delta", "sequence_number": 1, "item_id": "m", '
        b'"output_index": 0, "content_index": 0, "delta": "x", "logprobs": ' + deep + b"}"
    )
    with pytest.raises(RemoteProtocolError) as info:
        Connection(Role.CLIENT).receive_message(frame)
    assert info.value.code == ErrorCode.INVALID_JSON


# --- tolerated input ---------------------------------------------------------


def test_input_messages_without_type_are_tolerated(pair: ConnectionPair) -> None:
    frame = b'{"type": "response.create", "input": [{"role": "user", "content": "hi"}]}'
    pair.server.receive_message(frame)
    (create,) = drain(pair.server)
    assert create.input == [Message(role="user", content="hi")]
    assert b'"type":"message"' in encode_event(create)
    pair.start()
    pair.call("c1")
    pair.pause("c1")
    append = (
        b'{"type": "response.append", "input": ['
        b'{"role": "user", "content": [{"type": "input_text", "text": "steer"}]}, '
        b'{"type": "function_call_output", "call_id": "c1", "output": "2"}]}'
    )
    pair.server.receive_message(append)
    (event,) = drain(pair.server)
    assert event.input[0] == Message(role="user", content=[protocol.items.InputText(text="steer")])
    track = pair.server.response(RID)
    assert track is not None
    assert track.answered_calls == {"c1"}


def test_what_real_clients_send_is_tolerated() -> None:
    conn = Connection(Role.SERVER)
    conn.receive_message(
        b'{"type": "response.create", "model": "m", "stream": true, '
        b'"stream_options": {"include_usage": true}, "made_up_field": [1, 2]}'
    )
    event = conn.next_event()
    assert isinstance(event, ResponseCreate)
    assert event.stream is True
    conn.receive_message(b'{"type": "response.processed", "response_id": "r"}')
    assert conn.next_event() == ResponseProcessed(response_id="r")


# --- the codec's helpers -----------------------------------------------------


@pytest.mark.parametrize(
    ("path", "field", "param"),
    [
        ("$.input[2].call_id", None, "input[2].call_id"),
        ("$.input[0]", "type", "input[0].type"),
        ("$", "model", "model"),
        (None, "type", "type"),
        (None, None, None),
        ("$", None, None),
        ("$.metadata[...]", None, "metadata"),
    ],
)
def test_json_path_to_param(path: str | None, field: str | None, param: str | None) -> None:
    assert json_path_to_param(path, field) == param


def test_error_event_carries_the_wire_error() -> None:
    error = RemoteProtocolError(
        "No tool call with call_id 'x'.",
        code=ErrorCode.UNKNOWN_CALL_ID,
        param="input[0].call_id",
        response_id=RID,
    )
    event = error_event(error, stream_id="lane_a")
    wire = msgspec.json.decode(encode_event(event))
    assert wire == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "code": "unknown_call_id",
            "message": "No tool call with call_id 'x'.",
            "param": "input[0].call_id",
        },
        "status": 400,
        "stream_id": "lane_a",
        "response_id": RID,
    }
    assert decode_server_event(encode_event(event)) == event
    bare = msgspec.json.decode(encode_event(error_event(LocalProtocolError("m", code="c"))))
    assert set(bare) == {"type", "error", "status"}


def test_protocol_errors_repr_names_the_wire_error() -> None:
    error = LocalProtocolError("bad", code=ErrorCode.INVALID_VALUE, param="x", status=422)
    assert repr(error) == (
        "LocalProtocolError('bad', code=<ErrorCode.INVALID_VALUE: 'invalid_value'>, "
        "param='x', status=422)"
    )
    assert str(error) == "bad"


def test_decoders_accept_str_and_bytes() -> None:
    frame = '{"type": "response.cancel", "response_id": "r"}'
    assert (
        decode_client_event(frame)
        == decode_client_event(frame.encode())
        == ResponseCancel(response_id="r")
    )


def test_item_text_joins_the_readable_parts() -> None:
    assert protocol.items.item_text("plain") == "plain"
    parts: list[protocol.items.ContentPart] = [
        protocol.items.InputText(text="a"),
        protocol.items.OutputText(text="b"),
        protocol.items.Refusal(refusal="c"),
        protocol.items.ReasoningText(text="d"),
        protocol.items.InputImage(image_url="https://example.com/x.png"),
    ]
    assert protocol.items.item_text(parts) == "abcd"


def test_sentinels_name_themselves() -> None:
    assert (repr(NEED_DATA), repr(CLOSED)) == ("NEED_DATA", "CLOSED")


# --- the transition table ----------------------------------------------------


def test_transition_table_shape() -> None:
    assert set(TRANSITIONS) == set(ResponseState)
    for moves in TRANSITIONS.values():
        assert set(moves.values()) <= set(ResponseState)
    assert TERMINAL_STATES == {
        ResponseState.COMPLETED,
        ResponseState.INCOMPLETE,
        ResponseState.FAILED,
        ResponseState.CANCELLED,
    }
    live = set(ResponseState) - TERMINAL_STATES
    for state in live:
        assert TRANSITIONS[state][Transition.APPEND] is state  # append is a self-loop
        assert TRANSITIONS[state][Transition.CANCEL] is ResponseState.CANCELLED
        assert TRANSITIONS[state][Transition.FAIL] is ResponseState.FAILED
    # every live state can still end
    reachable = {ResponseState.QUEUED}
    frontier = [ResponseState.QUEUED]
    while frontier:
        for target in TRANSITIONS[frontier.pop()].values():
            if target not in reachable:
                reachable.add(target)
                frontier.append(target)
    assert reachable == set(ResponseState)


def test_illegal_transition_names_both_and_changes_nothing() -> None:
    machine = ResponseStateMachine(RID, ResponseState.REQUIRES_ACTION)
    with pytest.raises(LocalProtocolError) as info:
        machine.process(Transition.PAUSE)
    assert "pause" in info.value.message
    assert "requires_action" in info.value.message
    assert info.value.code == ErrorCode.INVALID_VALUE
    assert info.value.response_id == RID
    assert machine.state is ResponseState.REQUIRES_ACTION
    machine.process(Transition.CANCEL)
    with pytest.raises(LocalProtocolError) as info:
        machine.process(Transition.RESUME)
    assert info.value.code == ErrorCode.RESPONSE_ALREADY_COMPLETED
    assert repr(machine) == "ResponseStateMachine('resp_1', cancelled)"


# --- the package: sans-IO and its exports ------------------------------------

FORBIDDEN_IMPORTS = frozenset(
    {"asyncio", "trio", "anyio", "starlette", "uvicorn", "socket", "wsproto", "longresponse"}
)


def forbidden_imports(source: str) -> list[str]:
    """Top-level modules named in ``source``'s imports that the sans-IO rule forbids."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        else:
            continue
        found += [name for name in names if name.split(".")[0] in FORBIDDEN_IMPORTS]
    return found


def protocol_sources() -> Iterator[pathlib.Path]:
    yield from sorted(PROTOCOL_DIR.rglob("*.py"))


@pytest.mark.parametrize(
    "source",
    [
        "import trio",
        "import os, socket",
        "from asyncio import Queue",
        "from wsproto.events import Ping",
        "if TYPE_CHECKING:\n    import starlette.types",
        "def f():\n    import uvicorn",
        "importlib.import_module('anyio')",
        "__import__('longresponse.client')",
    ],
)
def test_the_import_walker_catches_forbidden_imports(source: str) -> None:
    assert forbidden_imports(source)


def test_the_import_walker_allows_the_rest() -> None:
    assert forbidden_imports("import msgspec\nfrom .codec import x\nfrom typing import Any") == []


def test_protocol_is_sans_io() -> None:
    sources = list(protocol_sources())
    assert PROTOCOL_DIR / "connection.py" in sources
    offenders = {
        path.name: names
        for path in sources
        if (names := forbidden_imports(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}


def test_importing_protocol_loads_no_io_library() -> None:
    code = (
        "import sys, protocol; "
        f"bad = {sorted(FORBIDDEN_IMPORTS)!r}; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert result.stdout.strip() == "[]"


def public_modules() -> list[str]:
    return [
        f"protocol.{path.stem}"
        for path in sorted(PROTOCOL_DIR.glob("*.py"))
        if not path.stem.startswith("_")
    ]


def test_package_exports_exist_once() -> None:
    assert len(protocol.__all__) == len(set(protocol.__all__))
    missing = [name for name in protocol.__all__ if not hasattr(protocol, name)]
    assert missing == []


#: The wire vocabulary: exported as namespaces (``protocol.events.ResponseDone``),
#: not name by name, so the package's own API stays small.
VOCABULARY = ("protocol.events", "protocol.items", "protocol.response")
#: Run as a command (``python -m protocol.schema``), not imported by the package.
TOOLS = ("protocol.schema",)


@pytest.mark.parametrize("module_name", public_modules())
def test_every_public_module_is_reexported(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert hasattr(module, "__all__"), f"{module_name} has no __all__"
    short = module_name.removeprefix("protocol.")
    if module_name in VOCABULARY:
        assert short in protocol.__all__
        assert getattr(protocol, short) is module
        return
    if module_name in TOOLS:
        assert short not in protocol.__all__
        return
    for name in module.__all__:
        assert name in protocol.__all__, f"{module_name}.{name} is not re-exported"
        assert getattr(protocol, name) is getattr(module, name)


def test_the_public_api_is_small_and_internals_are_private() -> None:
    assert len(protocol.__all__) <= 35
    for internal in ("ResponseCreateBody", "check_append_items", "NeedData", "Closed"):
        assert internal not in protocol.__all__
    assert set(VOCABULARY) | set(TOOLS) | {
        "protocol.codec",
        "protocol.connection",
        "protocol.errors",
        "protocol.state",
    } == set(public_modules())


def test_public_modules_are_found() -> None:
    assert {"protocol.codec", "protocol.connection", "protocol.state"} <= set(public_modules())


def test_package_ships_type_information() -> None:
    assert (PROTOCOL_DIR / "py.typed").exists()


def test_message_limit_counts_utf8_bytes_not_characters() -> None:
    from protocol import Connection, ErrorCode, RemoteProtocolError, Role

    server = Connection(Role.SERVER, max_message_bytes=100)
    text = '{"type":"response.create","input":"' + "é" * 40 + '"}'  # 77 chars, 117 bytes
    assert len(text) <= 100 < len(text.encode())
    with pytest.raises(RemoteProtocolError) as raised:
        server.receive_message(text)
    assert raised.value.code == ErrorCode.MESSAGE_TOO_LARGE
    server.receive_message('{"type":"response.create","input":"' + "é" * 20 + '"}')


def test_longresponse_exports_exist_and_are_complete() -> None:
    import importlib

    import longresponse

    for name in longresponse.__all__:
        assert hasattr(longresponse, name), name
    # every public name a server module lists is reachable from its module
    for module_name in (
        "serve.app",
        "serve.ws.shipped",
        "engine.admission",
        "engine.rollout",
        "storage.backends",
        "engine.classifier",
    ):
        module = importlib.import_module(f"longresponse.{module_name}")
        for name in module.__all__:
            assert hasattr(module, name), (module_name, name)


def test_committed_json_schema_matches_the_structs() -> None:
    import json

    import jsonschema

    from protocol.schema import event_schemas

    committed = json.loads((ROOT / "protocol" / "schema.json").read_text())
    assert committed == event_schemas(), (
        "regenerate: python -m protocol.schema > protocol/schema.json"
    )
    jsonschema.Draft202012Validator.check_schema(committed)
    # A real event validates against it.
    from protocol import encode_event
    from protocol.events import ResponseAppend

    frame = json.loads(encode_event(ResponseAppend(input="hi")))
    validator = jsonschema.Draft202012Validator(
        {"$ref": "#/$defs/ClientEvent", "$defs": committed["$defs"]}
    )
    validator.validate(frame)
    assert list(validator.iter_errors({"type": "response.append"}))  # input is required


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
