"""The codec's helpers: JSON paths to params, error events, decoders, item text."""

from __future__ import annotations

import msgspec
import pytest

import protocol
from protocol import (
    CLOSED,
    NEED_DATA,
    ErrorCode,
    LocalProtocolError,
    RemoteProtocolError,
    decode_client_event,
    decode_create_body,
    decode_server_event,
    encode_event,
    error_event,
    json_path_to_param,
)
from protocol.events import (
    ResponseCancel,
)
from protocol.items import ItemReference, Message, as_items
from tests.support.connection_pair import RID

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


# --- item references -------------------------------------------------------------


@pytest.mark.parametrize(
    "reference", [{"type": "item_reference", "id": "msg_1"}, {"id": "msg_1"}], ids=["typed", "bare"]
)
def test_item_references_decode_on_every_decoder(reference: dict[str, str]) -> None:
    items = [{"role": "user", "content": "hi"}, reference]
    frames = [
        msgspec.json.encode({"type": "response.create", "input": items}),
        msgspec.json.encode({"type": "response.append", "input": items}),
    ]
    for frame in frames:
        event = decode_client_event(frame)
        assert not isinstance(event, ResponseCancel)
        assert event.input[1] == ItemReference(id="msg_1")  # type: ignore[index]
    body = decode_create_body(msgspec.json.encode({"input": items}))
    assert body.input[1] == ItemReference(id="msg_1")  # type: ignore[index]
    # An item with neither a type, a role nor an id is still refused on its type.
    with pytest.raises(RemoteProtocolError) as refused:
        decode_create_body(msgspec.json.encode({"input": [{"content": "hi"}]}))
    assert (refused.value.code, refused.value.param) == (
        ErrorCode.MISSING_REQUIRED_PARAMETER,
        "input[0].type",
    )


def test_an_unresolved_reference_is_no_item() -> None:
    with pytest.raises(ValueError, match="'msg_1' was not resolved"):
        as_items([Message(role="user", content="hi"), ItemReference(id="msg_1")])
