"""What only the receiver can see (frames that are not events, sizes, types),
and the input it tolerates.
"""

from __future__ import annotations

import msgspec
import pytest

import protocol
from protocol import (
    NEED_DATA,
    Connection,
    ErrorCode,
    RemoteProtocolError,
    Role,
    encode_event,
)
from protocol.events import (
    ResponseCreate,
    ResponseCreated,
    ResponseProcessed,
)
from protocol.items import Message
from tests.support.connection_pair import (
    RID,
    ConnectionPair,
    drain,
    response,
    snapshot,
)

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
