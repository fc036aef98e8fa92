"""Protocol errors, each carrying the wire error it becomes.

A :class:`ProtocolError` knows everything needed to build the shipped error
envelope: the HTTP-like ``status``, the error ``type`` and ``code`` clients
branch on, a human ``message`` and the ``param`` naming the bad field
(``input[2].call_id``). :class:`RemoteProtocolError` means the peer broke the
rules; :class:`LocalProtocolError` means we were about to.

Connection-level failures close the socket instead; :data:`CLOSE_CODES` maps
them to the IANA WebSocket close codes. A few request errors are answered
otherwise than by an ``error`` event: a ``response.inject`` whose response is
unknown or finished gets its own reply (:attr:`ProtocolError.reply`), and a
schema-invalid one closes the socket after its ``error``
(:attr:`ProtocolError.close_code`), as the multi-agent beta does.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Final, Self

if TYPE_CHECKING:
    from .events import ServerEvent

__all__ = [
    "CLOSE_CODES",
    "CloseCode",
    "ErrorCode",
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
]


class ErrorCode(enum.StrEnum):
    """Every ``error.code`` this protocol defines (see SPEC.md §7)."""

    INVALID_JSON = "invalid_json"
    UNKNOWN_EVENT_TYPE = "unknown_event_type"
    INVALID_TYPE = "invalid_type"
    MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
    INVALID_VALUE = "invalid_value"
    EMPTY_ARRAY = "empty_array"
    UNKNOWN_PARAMETER = "unknown_parameter"
    MESSAGE_TOO_LARGE = "message_too_large"
    TOO_MANY_ITEMS = "too_many_items"
    MODEL_NOT_FOUND = "model_not_found"
    RESPONSE_NOT_FOUND = "response_not_found"
    RESPONSE_ALREADY_COMPLETED = "response_already_completed"
    UNKNOWN_CALL_ID = "unknown_call_id"
    DUPLICATE_CALL_ID = "duplicate_call_id"
    TOO_MANY_PENDING_CALLS = "too_many_pending_calls"
    TOO_MANY_ROLLOUTS = "too_many_rollouts"
    # Input into a live response beyond the bytes it (or its key) may hold.
    INPUT_BUDGET_EXCEEDED = "input_budget_exceeded"
    INVALID_ENCRYPTED_CONTENT = "invalid_encrypted_content"
    SERVER_ERROR = "server_error"
    # A real model behind the server (longresponse.backends) failed.
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    # The shipped shape (compat layer).
    PREVIOUS_RESPONSE_NOT_FOUND = "previous_response_not_found"
    MISSING_TOOL_OUTPUT = "missing_tool_output"
    INVALID_STREAM_ID = "invalid_stream_id"
    WEBSOCKET_STREAM_LIMIT_REACHED = "websocket_stream_limit_reached"
    WEBSOCKET_QUEUE_LIMIT_REACHED = "websocket_queue_limit_reached"
    WEBSOCKET_CONNECTION_LIMIT_REACHED = "websocket_connection_limit_reached"
    # response.steer.failed (the shipped shape's steering; with the two above,
    # response_not_found and response_already_completed).
    INVALID_INPUT = "invalid_input"
    STEERING_NOT_SUPPORTED = "steering_not_supported"
    TOO_MANY_PENDING_STEERS = "too_many_pending_steers"
    RESPONSE_NOT_ACTIVE = "response_not_active"
    SUCCESSOR_CREATION_FAILED = "successor_creation_failed"


class CloseCode(enum.IntEnum):
    """WebSocket close codes, named as in the IANA registry."""

    NORMAL_CLOSURE = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    INVALID_FRAME_PAYLOAD_DATA = 1007
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    SERVICE_RESTART = 1012


#: Which close code a connection-level failure gets. The reason text sent with
#: 1011 never includes exception text (it could leak server internals).
CLOSE_CODES: Final[dict[str, CloseCode]] = {
    "client_closed": CloseCode.NORMAL_CLOSURE,
    # Graceful shutdown, after in-flight turns: clients reconnect and resend.
    "server_shutdown": CloseCode.SERVICE_RESTART,
    # A schema-invalid response.inject: its error event, then this close.
    "invalid_event": CloseCode.PROTOCOL_ERROR,
    "connection_limit_reached": CloseCode.NORMAL_CLOSURE,
    "slow_reader": CloseCode.POLICY_VIOLATION,
    "frame_too_big": CloseCode.MESSAGE_TOO_BIG,
    "internal_error": CloseCode.INTERNAL_ERROR,
}


class _Keep(enum.Enum):
    """The default of :meth:`ProtocolError.with_`: the field stays as it is."""

    KEEP = enum.auto()


_KEEP: Final = _Keep.KEEP


class ProtocolError(Exception):
    """A rule of the protocol was broken; carries the wire error it becomes.

    ``status`` is the HTTP-like status of the shipped envelope, ``error_type``
    its ``error.type`` (``invalid_request_error`` unless a server fault),
    ``code`` its ``error.code`` and ``param`` the path of the offending field
    or ``None``. ``response_id`` names the response the error concerns, when
    there is one; ``stream_id`` the lane of the request that caused it.

    Two more, ``None`` unless the one who raises gives them: ``reply``, the
    server event that answers the failure instead of an ``error`` event (a
    ``response.inject.failed``), and ``close_code``, the code the connection
    closes with once the answer is sent.

    An error is complete when raised and never changed after: a caller that
    knows more (the lane, the reply) raises a copy made by :meth:`with_`. A
    message quotes a peer's string (an id, a name) through :meth:`clip`.
    """

    #: Characters of a peer's string that a message quotes.
    MAX_QUOTED: Final = 128

    @classmethod
    def clip(cls, value: str) -> str:
        """``value`` as a message may quote it: whole up to :attr:`MAX_QUOTED`
        characters, else cut there with its length said (a refused id of
        megabytes is not sent back whole)."""
        if len(value) <= cls.MAX_QUOTED:
            return value
        return f"{value[: cls.MAX_QUOTED]}... ({len(value)} characters)"

    def __init__(
        self,
        message: str,
        *,
        code: str,
        param: str | None = None,
        status: int = 400,
        error_type: str = "invalid_request_error",
        response_id: str | None = None,
        stream_id: str | None = None,
        reply: ServerEvent | None = None,
        close_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.status = status
        self.error_type = error_type
        self.response_id = response_id
        self.stream_id = stream_id
        self.reply = reply
        self.close_code = close_code

    def with_(
        self,
        *,
        stream_id: str | _Keep | None = _KEEP,
        reply: ServerEvent | _Keep | None = _KEEP,
        close_code: int | _Keep | None = _KEEP,
    ) -> Self:
        """A copy of this error (same class) with the fields given replaced.

        Raise it ``from`` this error's ``__cause__``: the copy stands in for
        this error, so the chain stays what it was."""
        return type(self)(
            self.message,
            code=self.code,
            param=self.param,
            status=self.status,
            error_type=self.error_type,
            response_id=self.response_id,
            stream_id=self.stream_id if isinstance(stream_id, _Keep) else stream_id,
            reply=self.reply if isinstance(reply, _Keep) else reply,
            close_code=self.close_code if isinstance(close_code, _Keep) else close_code,
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, code={self.code!r}, "
            f"param={self.param!r}, status={self.status})"
        )


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow."""


class LocalProtocolError(ProtocolError):
    """We were about to send something the protocol does not allow."""
