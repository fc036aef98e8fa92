"""longresponse's wire protocol, sans-IO.

The core (what this package exports): :class:`Connection`, which turns whole
messages into checked events and events into bytes; the one transition table
of a Response (``protocol.state``); the codec; and the errors, each carrying
the wire error it becomes. Nothing here does I/O: the server (``longresponse``)
and the trio client drive it.

The wire vocabulary, as frozen msgspec Structs tagged on ``type``, lives in
three namespaces: :mod:`protocol.events` (every client and server event and
the unions ``ClientEvent`` / ``ServerEvent``), :mod:`protocol.items` (items,
content parts, tools) and :mod:`protocol.response` (the Response object).
:mod:`protocol.schema` generates their JSON Schemas.
"""

from . import events, items, response
from .codec import (
    decode_client_event,
    decode_create_body,
    decode_server_event,
    encode_event,
    error_event,
    json_path_to_param,
    validation_refusal,
    wire_type,
)
from .connection import (
    CLOSED,
    MAX_ITEMS_PER_EVENT,
    MAX_MESSAGE_BYTES,
    NEED_DATA,
    Connection,
    Framing,
    Mode,
    ResponseTrack,
)
from .errors import (
    CLOSE_CODES,
    CloseCode,
    ErrorCode,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)
from .state import (
    RULES,
    TERMINAL_STATES,
    TRANSITIONS,
    ResponseState,
    ResponseStateMachine,
    Role,
    Transition,
)

#: Subprotocol that opts a WebSocket connection into append mode.
APPEND_SUBPROTOCOL = "longresponse.append.v1"
#: Upgrade header (value ``true``) asking for ``responsesapi.websocket_timing`` events.
TIMING_HEADER = "x-responsesapi-include-timing-metrics"

__all__ = [
    "APPEND_SUBPROTOCOL",
    "CLOSED",
    "CLOSE_CODES",
    "MAX_ITEMS_PER_EVENT",
    "MAX_MESSAGE_BYTES",
    "NEED_DATA",
    "RULES",
    "TERMINAL_STATES",
    "TIMING_HEADER",
    "TRANSITIONS",
    "CloseCode",
    "Connection",
    "ErrorCode",
    "Framing",
    "LocalProtocolError",
    "Mode",
    "ProtocolError",
    "RemoteProtocolError",
    "ResponseState",
    "ResponseStateMachine",
    "ResponseTrack",
    "Role",
    "Transition",
    "decode_client_event",
    "decode_create_body",
    "decode_server_event",
    "encode_event",
    "error_event",
    "events",
    "items",
    "json_path_to_param",
    "response",
    "validation_refusal",
    "wire_type",
]
