"""The one codec: JSON text frames to events and back.

Decoding uses one reused :class:`msgspec.json.Decoder` per union. Every
failure becomes a :class:`RemoteProtocolError` whose ``code`` and ``param`` are
derived from msgspec's error (``$.input[2].call_id`` becomes the shipped
``param`` spelling ``input[2].call_id``), raised ``from`` the original.

One tolerance costs a second pass: the shipped API accepts input messages
without ``"type": "message"`` (``{"role": "user", "content": "hi"}``), and
item references without ``"type": "item_reference"`` (``{"id": "msg_..."}``). The
fast path decodes typed events directly; only when msgspec reports a missing
``type`` on an input item is the frame decoded generically, the tag filled in,
and the result converted.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from ._wire import wire_type
from .errors import ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError
from .events import (
    CLIENT_EVENT_TYPES,
    SERVER_EVENT_TYPES,
    ClientEvent,
    ErrorBody,
    ErrorEvent,
    ResponseCreate,
    ServerEvent,
)

__all__ = [
    "decode_client_event",
    "decode_create_body",
    "decode_server_event",
    "encode_event",
    "error_event",
    "json_path_to_param",
    "validation_refusal",
    "wire_type",
]

_client_decoder: Final = msgspec.json.Decoder(ClientEvent)
_server_decoder: Final = msgspec.json.Decoder(ServerEvent)
_encoder: Final = msgspec.json.Encoder()

_AT = re.compile(
    r"^(?P<what>.*?)(?: - at `(?:key` in `)?(?P<path>\$[^`]*)`)?$", re.DOTALL
)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
_UNKNOWN_FIELD = re.compile(r"^Object contains unknown field `(?P<field>[^`]+)`$")
_INVALID_TAG = re.compile(r"^Invalid value '(?P<value>.*)'$", re.DOTALL)
#: A value of the right type outside its published range (``Meta(ge=..., le=...)``).
_OUT_OF_RANGE = re.compile(r"^Expected `[^`]+` (?:of length )?(?:>=|<=|>|<) ")
_ITEM_PATH = re.compile(r"^\$\.input\[(\d+)\]$")


def json_path_to_param(path: str | None, field: str | None = None) -> str | None:
    """``$.input[0].content`` (+ ``field``) -> ``input[0].content`` (shipped spelling)."""
    if path is None:
        return field
    param = path[2:] if path.startswith("$.") else path.lstrip("$")
    param = param.replace("[...]", "")
    if field is not None:
        param = f"{param}.{field}" if param else field
    return param or None


def _validation_error(
    exc: msgspec.ValidationError, known_types: frozenset[str], unknown: str | None = None
) -> RemoteProtocolError:
    match = _AT.match(str(exc))
    assert match is not None  # the pattern matches every string
    what, path = match["what"], match["path"]
    if path is None and (missing := _MISSING.match(what)) and missing["field"] == "type":
        return RemoteProtocolError(
            "The event has no 'type'.", code=ErrorCode.MISSING_REQUIRED_PARAMETER, param="type"
        )
    if path == "$.type" and (bad := _INVALID_TAG.match(what)):
        return RemoteProtocolError(
            f"Unknown event type {bad['value']!r}; expected one of {sorted(known_types)}.",
            code=ErrorCode.UNKNOWN_EVENT_TYPE,
            param="type",
        )
    return validation_refusal(exc, whole="the event", unknown=unknown)


def validation_refusal(
    exc: msgspec.ValidationError, *, whole: str, unknown: str | None = None
) -> RemoteProtocolError:
    """The shipped error of JSON that is not the Struct it was decoded as: a
    missing field, an unknown one (when the Struct forbids them; ``unknown`` is
    the message, ``{param}`` filled in), a wrong type, a value out of range.
    ``whole`` names what was decoded when the error is at its top."""
    match = _AT.match(str(exc))
    assert match is not None  # the pattern matches every string
    what, path = match["what"], match["path"]
    if missing := _MISSING.match(what):
        param = json_path_to_param(path, missing["field"])
        return RemoteProtocolError(
            f"Missing required parameter: '{param}'.",
            code=ErrorCode.MISSING_REQUIRED_PARAMETER,
            param=param,
        )
    if unknown is not None and (extra := _UNKNOWN_FIELD.match(what)):
        param = json_path_to_param(path, extra["field"])
        return RemoteProtocolError(
            unknown.format(param=param), code=ErrorCode.UNKNOWN_PARAMETER, param=param
        )
    param = json_path_to_param(path)
    where = f"'{param}'" if param else whole
    if what.startswith("Expected `") and not _OUT_OF_RANGE.match(what):
        return RemoteProtocolError(
            f"Invalid type for {where}: {what[0].lower()}{what[1:]}.",
            code=ErrorCode.INVALID_TYPE,
            param=param,
        )
    return RemoteProtocolError(
        f"Invalid value for {where}: {what[0].lower()}{what[1:]}.",
        code=ErrorCode.INVALID_VALUE,
        param=param,
    )


#: What a frame that is not JSON raises while decoding (after ValidationError,
#: a DecodeError subclass, is handled): malformed JSON, nesting deeper than the
#: decoder's recursion limit, a ``str`` holding lone surrogates.
_NOT_JSON: Final = (msgspec.DecodeError, RecursionError, UnicodeError)


def _invalid_json(exc: Exception) -> RemoteProtocolError:
    reason = "nests too deeply" if isinstance(exc, RecursionError) else f"is not valid JSON: {exc}"
    return RemoteProtocolError(f"The frame {reason}.", code=ErrorCode.INVALID_JSON)


def _fill_item_tags(data: bytes | bytearray | str) -> Any:
    raw = msgspec.json.decode(data)
    if isinstance(raw, dict) and isinstance(raw.get("input"), list):
        for item in raw["input"]:
            if isinstance(item, dict) and "type" not in item:
                if "role" in item:
                    item["type"] = "message"
                elif "id" in item:  # the bare {"id": ...}: a reference to a stored item
                    item["type"] = "item_reference"
    return raw


def decode_client_event(data: bytes | str) -> ClientEvent:
    """Decode one client frame. Raises :class:`RemoteProtocolError` on bad input.

    The error of a ``response.create`` that fails to decode still names its
    lane (``stream_id``) when that much of the frame can be read, so the
    error event goes to the lane that asked.
    """
    try:
        return _decode_client(data)
    except RemoteProtocolError as error:
        raise error.with_(stream_id=lane_hint(data)) from error.__cause__


def _decode_client(data: bytes | str) -> ClientEvent:
    try:
        return _client_decoder.decode(data)
    except msgspec.ValidationError as exc:
        match = _AT.match(str(exc))
        if (
            match
            and match["path"]
            and _ITEM_PATH.match(match["path"])
            and (match["what"] == "Object missing required field `type`")
        ):
            return _decode_tolerant(data)
        raise _validation_error(exc, CLIENT_EVENT_TYPES) from exc
    except _NOT_JSON as exc:
        raise _invalid_json(exc) from exc


class _LaneHint(msgspec.Struct):
    type: str = ""
    stream_id: str | None = None


_lane_hint_decoder: Final = msgspec.json.Decoder(_LaneHint)


def lane_hint(data: bytes | str) -> str | None:
    """The ``stream_id`` of a create that did not decode (or was refused), if one can be read."""
    try:
        hint = _lane_hint_decoder.decode(data)
    except (*_NOT_JSON, msgspec.ValidationError):
        return None
    return hint.stream_id if hint.type == "response.create" else None


def type_hint(data: bytes | str) -> str:
    """The ``type`` of a frame that did not decode, if one can be read (``""`` otherwise)."""
    try:
        return _lane_hint_decoder.decode(data).type
    except (*_NOT_JSON, msgspec.ValidationError):
        return ""


class _SteerHint(msgspec.Struct):
    previous_response_id: str
    input: str | list[Any]


_steer_hint_decoder: Final = msgspec.json.Decoder(_SteerHint)


def steer_hint(data: bytes | str) -> tuple[str, str | list[Any]] | None:
    """The target and raw input of a ``response.steer`` that did not decode, if
    both can be read (its ``response.steer.failed`` hands the input back)."""
    try:
        hint = _steer_hint_decoder.decode(data)
    except (*_NOT_JSON, msgspec.ValidationError):
        return None
    return hint.previous_response_id, hint.input


def _decode_tolerant(data: bytes | str) -> ClientEvent:
    # The typed pass stopped at the untyped item, so the rest of the frame is
    # unchecked: the generic pass can still find malformed JSON.
    try:
        event: ClientEvent = msgspec.convert(_fill_item_tags(data), ClientEvent)
        return event
    except msgspec.ValidationError as exc:
        raise _validation_error(exc, CLIENT_EVENT_TYPES) from exc
    except _NOT_JSON as exc:
        raise _invalid_json(exc) from exc


class _ResponseCreateBody(ResponseCreate, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/responses``: a ``response.create`` without ``type``,
    whose unknown top-level parameters are refused (as the shipped HTTP API does)."""


_body_decoder: Final = msgspec.json.Decoder(_ResponseCreateBody)


def decode_create_body(data: bytes | bytearray | str) -> ResponseCreate:
    """Decode an HTTP create body. Raises :class:`RemoteProtocolError` on bad input."""
    try:
        try:
            return _body_decoder.decode(data)
        except msgspec.ValidationError as exc:
            match = _AT.match(str(exc))
            if (
                match
                and match["path"]
                and _ITEM_PATH.match(match["path"])
                and (match["what"] == "Object missing required field `type`")
            ):
                raw = _fill_item_tags(data)
                body: ResponseCreate = msgspec.convert(raw, _ResponseCreateBody)
                return body
            raise
    except msgspec.ValidationError as exc:
        raise _validation_error(exc, frozenset(), unknown="Unknown parameter: '{param}'.") from exc
    except _NOT_JSON as exc:
        raise RemoteProtocolError(
            "We could not parse the JSON body of your request.", code=ErrorCode.INVALID_JSON
        ) from exc


def decode_server_event(data: bytes | str) -> ServerEvent:
    """Decode one server frame. Raises :class:`RemoteProtocolError` on bad input."""
    try:
        return _server_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _validation_error(exc, SERVER_EVENT_TYPES) from exc
    except _NOT_JSON as exc:
        raise _invalid_json(exc) from exc


def encode_event(event: ClientEvent | ServerEvent) -> bytes:
    """Encode one event as a JSON text-frame payload."""
    try:
        return _encoder.encode(event)
    except (TypeError, ValueError) as exc:  # pragma: no cover - our own structs
        raise LocalProtocolError(
            f"Cannot encode {type(event).__name__}: {exc}", code=ErrorCode.SERVER_ERROR, status=500
        ) from exc


def encode_sse(event: ClientEvent | ServerEvent) -> bytes:
    """Encode one event as a Server-Sent Events record (``event:`` line, ``data:`` line)."""
    return b"event: %s\ndata: %s\n\n" % (wire_type(event).encode(), encode_event(event))


def error_event(
    error: ProtocolError,
    *,
    stream_id: str | None = None,
    sequence_number: int | None = None,
    headers: dict[str, str] | None = None,
) -> ErrorEvent:
    """The WebSocket error envelope for ``error``, on ``stream_id`` or the error's
    own lane; ``sequence_number`` and ``error.headers`` when given."""
    if stream_id is None:
        stream_id = error.stream_id
    return ErrorEvent(
        status=error.status,
        error=ErrorBody(
            type=error.error_type,
            code=error.code,
            message=error.message,
            param=error.param,
            headers=headers if headers is not None else msgspec.UNSET,
        ),
        sequence_number=sequence_number if sequence_number is not None else msgspec.UNSET,
        stream_id=stream_id if stream_id is not None else msgspec.UNSET,
        response_id=error.response_id if error.response_id is not None else msgspec.UNSET,
    )
