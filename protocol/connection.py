"""The sans-IO connection: messages in, events out; events in, messages out.

Theory of operation
-------------------
A :class:`Connection` holds one side's view of a WebSocket conversation at
the level of whole messages (framing is the WebSocket library's job). The
I/O layer feeds every text message it receives to :meth:`receive_message`,
signals the end of input with :meth:`receive_closed`, and drains decoded
events with :meth:`next_event`. To send, it calls :meth:`send`, which checks
the event against the protocol and returns the bytes to put in one frame.

Both peers track the same thing: every response the connection has seen, its
state (``protocol.state``), its next ``sequence_number`` and its client tool
calls (pending / answered). So a client that would send an output for an
unknown call gets :class:`LocalProtocolError` before anything leaves, and a
server gets :class:`RemoteProtocolError` for the same frame; in both cases
nothing changes (request-level errors never damage the connection).

Checks that need the application's knowledge (models, the rollout's items)
live in the server; checks that follow from the events alone live here.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from typing import Final

from .codec import decode_client_event, decode_server_event, encode_event
from .errors import ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError
from .events import (
    ClientEvent,
    ErrorEvent,
    OutputItemDone,
    ResponseAppend,
    ResponseCancel,
    ResponseCompleted,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseQueued,
    ServerEvent,
    TimingEvent,
)
from .items import FunctionCall, FunctionCallOutput, Item, Message
from .state import ResponseState, ResponseStateMachine, Transition

__all__ = [
    "MAX_ITEMS_PER_EVENT",
    "MAX_MESSAGE_BYTES",
    "MAX_TRACKED_RESPONSES",
    "Closed",
    "Connection",
    "Mode",
    "NeedData",
    "ResponseTrack",
    "Role",
    "check_append_items",
]

#: Largest message accepted, in bytes (checked before decoding).
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
#: Most items one ``response.create`` or ``response.append`` may carry.
MAX_ITEMS_PER_EVENT: Final = 4096
#: Finished responses remembered per connection (older ones are forgotten).
MAX_TRACKED_RESPONSES: Final = 1024


class Role(enum.StrEnum):
    CLIENT = "client"
    SERVER = "server"


class Mode(enum.StrEnum):
    """What a connection speaks: the append-event prototype or the shipped shape."""

    APPEND = "append"
    SHIPPED = "shipped"


class NeedData:
    """Returned by :meth:`Connection.next_event` when no event is waiting."""

    def __repr__(self) -> str:
        return "NEED_DATA"


class Closed:
    """Returned by :meth:`Connection.next_event` once input has ended."""

    def __repr__(self) -> str:
        return "CLOSED"


NEED_DATA: Final = NeedData()
CLOSED: Final = Closed()

_DONE_TRANSITIONS: Final = {
    "requires_action": Transition.PAUSE,
    "completed": Transition.COMPLETE,
    "incomplete": Transition.EXPIRE,
    "failed": Transition.FAIL,
    "cancelled": Transition.CANCEL,
}


class ResponseTrack:
    """One response as the connection has seen it."""

    __slots__ = ("answered_calls", "machine", "next_sequence", "pending_calls", "stream_id")

    def __init__(self, response_id: str, state: ResponseState, stream_id: str | None) -> None:
        self.machine = ResponseStateMachine(response_id, state)
        self.next_sequence = 0
        self.pending_calls: dict[str, str] = {}  # call_id -> tool name, no output yet
        self.answered_calls: set[str] = set()
        self.stream_id = stream_id

    @property
    def response_id(self) -> str:
        return self.machine.response_id

    @property
    def state(self) -> ResponseState:
        return self.machine.state


def check_append_items(
    items: list[Item], pending: dict[str, str], answered: set[str], response_id: str
) -> list[str]:
    """Check the items of an append against a response's calls.

    Returns the call ids the append answers. Raises :class:`LocalProtocolError`
    (nothing recorded) for an item type an append cannot carry, or a
    ``function_call_output`` whose ``call_id`` is unknown or already answered.
    """
    seen: list[str] = []
    for index, item in enumerate(items):
        if isinstance(item, FunctionCallOutput):
            call_id = item.call_id
            if call_id in answered or call_id in seen:
                raise LocalProtocolError(
                    f"Tool call {call_id!r} of response {response_id!r} already has an output.",
                    code=ErrorCode.DUPLICATE_CALL_ID,
                    param=f"input[{index}].call_id",
                    response_id=response_id,
                )
            if call_id not in pending:
                raise LocalProtocolError(
                    f"No tool call with call_id {call_id!r} is pending in response "
                    f"{response_id!r}.",
                    code=ErrorCode.UNKNOWN_CALL_ID,
                    param=f"input[{index}].call_id",
                    response_id=response_id,
                )
            seen.append(call_id)
        elif isinstance(item, Message):
            if item.role == "assistant":
                raise LocalProtocolError(
                    "An append cannot carry assistant messages; only the model writes them.",
                    code=ErrorCode.INVALID_VALUE,
                    param=f"input[{index}].role",
                    response_id=response_id,
                )
        else:
            raise LocalProtocolError(
                "An append carries message and function_call_output items, "
                f"not {item_kind(item)!r}.",
                code=ErrorCode.INVALID_VALUE,
                param=f"input[{index}].type",
                response_id=response_id,
            )
    return seen


def item_kind(item: Item | ClientEvent | ServerEvent) -> str:
    """The wire ``type`` of an item or event (a tag field is not an attribute)."""
    return type(item).__struct_config__.tag  # type: ignore[return-value]


class Connection:
    """One side of a longresponse WebSocket conversation, without I/O."""

    def __init__(
        self,
        our_role: Role,
        mode: Mode = Mode.APPEND,
        *,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_items_per_event: int = MAX_ITEMS_PER_EVENT,
        max_tracked_responses: int = MAX_TRACKED_RESPONSES,
    ) -> None:
        self.our_role = our_role
        self.their_role = Role.SERVER if our_role is Role.CLIENT else Role.CLIENT
        self.mode = mode
        self.max_message_bytes = max_message_bytes
        self.max_items_per_event = max_items_per_event
        self.max_tracked_responses = max_tracked_responses
        self._responses: OrderedDict[str, ResponseTrack] = OrderedDict()
        self._lane_latest: dict[str | None, str] = {}
        self._events: list[ClientEvent | ServerEvent] = []
        self._call_names: dict[str, str] = {}  # answered call -> tool name (for reject_append)
        self._closed = False

    # --- queries -----------------------------------------------------------

    def response(self, response_id: str) -> ResponseTrack | None:
        return self._responses.get(response_id)

    def latest_response_id(self, stream_id: str | None = None) -> str | None:
        return self._lane_latest.get(stream_id)

    @property
    def closed(self) -> bool:
        return self._closed

    # --- input -------------------------------------------------------------

    def receive_message(self, data: bytes | str) -> None:
        """Take in one whole message from the peer.

        Raises :class:`RemoteProtocolError` if the message is too large, not an
        event, or breaks the protocol; the connection is then unchanged and
        stays usable.
        """
        if self._closed:
            raise LocalProtocolError("receive_message() after receive_closed()", code="closed")
        size = _byte_size(data, self.max_message_bytes)
        if size > self.max_message_bytes:
            raise RemoteProtocolError(
                f"The message is {size} bytes; the limit is {self.max_message_bytes}.",
                code=ErrorCode.MESSAGE_TOO_LARGE,
                status=413,
            )
        event: ClientEvent | ServerEvent
        if self.their_role is Role.CLIENT:
            event = decode_client_event(data)
        else:
            event = decode_server_event(data)
        try:
            self._process(self.their_role, event)
        except LocalProtocolError as exc:
            raise _as_remote(exc) from exc
        self._events.append(event)

    def receive_closed(self) -> None:
        """The peer's input has ended (the socket closed); no more messages come."""
        self._closed = True

    def next_event(self) -> ClientEvent | ServerEvent | NeedData | Closed:
        if self._events:
            return self._events.pop(0)
        return CLOSED if self._closed else NEED_DATA

    # --- output ------------------------------------------------------------

    def send(self, event: ClientEvent | ServerEvent) -> bytes:
        """Check ``event`` against the protocol, record it, and return its bytes.

        Raises :class:`LocalProtocolError` (nothing recorded) if sending it
        would break the protocol.
        """
        self._process(self.our_role, event)
        return encode_event(event)

    def reject_append(self, event: ResponseAppend) -> None:
        """Undo the bookkeeping of an append the application refused after receiving it.

        The protocol accepted ``event`` (its calls were marked answered); the
        application then refused it (e.g. a policy check), so its outputs are
        pending again and may be sent once more. Does nothing for an append
        this connection does not know.
        """
        track = self._responses.get(event.response_id or self._lane_latest.get(None) or "")
        if track is None or not isinstance(event.input, list):
            return
        for item in event.input:
            if isinstance(item, FunctionCallOutput) and item.call_id in track.answered_calls:
                track.answered_calls.discard(item.call_id)
                track.pending_calls[item.call_id] = self._call_names.get(item.call_id, "")

    # --- the rules ---------------------------------------------------------

    def _process(self, role: Role, event: ClientEvent | ServerEvent) -> None:
        if role is Role.CLIENT:
            self._process_client(event)  # type: ignore[arg-type]
        else:
            self._process_server(event)  # type: ignore[arg-type]

    def _process_client(self, event: ClientEvent) -> None:
        if isinstance(event, ResponseCreate):
            if isinstance(event.input, list) and len(event.input) > self.max_items_per_event:
                raise _too_many_items(len(event.input), self.max_items_per_event)
        elif isinstance(event, ResponseAppend):
            if self.mode is not Mode.APPEND:
                raise LocalProtocolError(
                    "response.append is part of append mode; this connection speaks the "
                    "shipped shape (continue with response.create and previous_response_id).",
                    code=ErrorCode.UNKNOWN_EVENT_TYPE,
                    param="type",
                )
            track = self._target(event.response_id)
            if not track.machine.allows(Transition.APPEND):
                raise _already_completed(track)
            if isinstance(event.input, list):
                if len(event.input) > self.max_items_per_event:
                    raise _too_many_items(len(event.input), self.max_items_per_event)
                answered = check_append_items(
                    event.input, track.pending_calls, track.answered_calls, track.response_id
                )
                for call_id in answered:
                    self._call_names[call_id] = track.pending_calls.pop(call_id)
                    track.answered_calls.add(call_id)
            track.machine.process(Transition.APPEND)
        elif isinstance(event, ResponseCancel):
            if self.mode is not Mode.APPEND:
                raise LocalProtocolError(
                    "response.cancel is part of append mode; the shipped WebSocket shape has "
                    "no cancel event.",
                    code=ErrorCode.UNKNOWN_EVENT_TYPE,
                    param="type",
                )
            track = self._target(event.response_id)
            if not track.machine.allows(Transition.CANCEL):
                raise _already_completed(track)

    def _target(self, response_id: str | None) -> ResponseTrack:
        if response_id is None:
            response_id = self._lane_latest.get(None)
            if response_id is None:
                raise LocalProtocolError(
                    "There is no response on this connection to target; send response.create "
                    "first or name one with response_id.",
                    code=ErrorCode.RESPONSE_NOT_FOUND,
                    param="response_id",
                    status=404,
                )
        track = self._responses.get(response_id)
        if track is None:
            raise LocalProtocolError(
                f"Response {response_id!r} not found on this connection.",
                code=ErrorCode.RESPONSE_NOT_FOUND,
                param="response_id",
                status=404,
                response_id=response_id,
            )
        return track

    def _process_server(self, event: ServerEvent) -> None:
        if isinstance(event, ErrorEvent | TimingEvent):
            return
        stream_id = event.stream_id if isinstance(event.stream_id, str) else None
        if isinstance(event, ResponseCreated | ResponseQueued) and (
            event.response.id not in self._responses
        ):
            state = (
                ResponseState.QUEUED
                if event.response.status == "queued"
                else (ResponseState.IN_PROGRESS)
            )
            self._check_sequence_start(event.sequence_number, event.response.id)
            track = ResponseTrack(event.response.id, state, stream_id)
            self._remember(track)
            track.next_sequence = event.sequence_number + 1
            return
        track = self._track_of(event, stream_id)
        if event.sequence_number != track.next_sequence:
            raise LocalProtocolError(
                f"Event {item_kind(event)!r} of response {track.response_id!r} has sequence_number "
                f"{event.sequence_number}; expected {track.next_sequence}.",
                code=ErrorCode.INVALID_VALUE,
                param="sequence_number",
            )
        if isinstance(event, ResponseInProgress):
            if track.state is ResponseState.REQUIRES_ACTION:
                track.machine.process(Transition.RESUME)
            elif track.state is ResponseState.QUEUED:
                track.machine.process(Transition.START)
            elif track.state is not ResponseState.IN_PROGRESS:
                track.machine.process(Transition.RESUME)  # raises: terminal
        elif isinstance(
            event, ResponseDone | ResponseCompleted | ResponseIncomplete | ResponseFailed
        ):
            transition = _DONE_TRANSITIONS.get(event.response.status)
            if transition is None:
                raise LocalProtocolError(
                    f"{item_kind(event)} cannot carry status {event.response.status!r}.",
                    code=ErrorCode.INVALID_VALUE,
                    param="response.status",
                )
            track.machine.process(transition)
        elif isinstance(event, ResponseCreated | ResponseQueued):
            raise LocalProtocolError(
                f"Response {track.response_id!r} was already created.",
                code=ErrorCode.INVALID_VALUE,
                param="response.id",
            )
        elif track.machine.terminal:
            raise LocalProtocolError(
                f"Response {track.response_id!r} is {track.state.value}; it emits nothing more.",
                code=ErrorCode.RESPONSE_ALREADY_COMPLETED,
            )
        elif isinstance(event, OutputItemDone) and isinstance(event.item, FunctionCall):
            call_id = event.item.call_id
            if call_id not in track.answered_calls:
                track.pending_calls[call_id] = event.item.name
        track.next_sequence += 1

    def _check_sequence_start(self, sequence_number: int, response_id: str) -> None:
        if sequence_number != 0:
            raise LocalProtocolError(
                f"Response {response_id!r} must start at sequence_number 0, not {sequence_number}.",
                code=ErrorCode.INVALID_VALUE,
                param="sequence_number",
            )

    def _track_of(self, event: ServerEvent, stream_id: str | None) -> ResponseTrack:
        response = getattr(event, "response", None)
        response_id: str | None
        if response is not None:
            response_id = response.id
        else:
            rid = getattr(event, "response_id", None)
            response_id = rid if isinstance(rid, str) else self._lane_latest.get(stream_id)
        track = self._responses.get(response_id) if response_id is not None else None
        if track is None:
            raise LocalProtocolError(
                f"Event {item_kind(event)!r} names no response this connection has seen.",
                code=ErrorCode.RESPONSE_NOT_FOUND,
                param="response_id",
            )
        return track

    def _remember(self, track: ResponseTrack) -> None:
        self._responses[track.response_id] = track
        self._lane_latest[track.stream_id] = track.response_id
        while len(self._responses) > self.max_tracked_responses:
            for old_id, old in self._responses.items():
                if old.machine.terminal:
                    del self._responses[old_id]
                    break
            else:
                break


def _byte_size(data: bytes | str, limit: int) -> int:
    """The UTF-8 size of ``data``, computed only when it could exceed ``limit``."""
    if isinstance(data, bytes) or len(data) * 4 <= limit:
        return len(data)  # for str: at most 4 bytes a character, so within the limit
    return len(data.encode("utf-8", "surrogatepass"))


def _as_remote(exc: ProtocolError) -> RemoteProtocolError:
    return RemoteProtocolError(
        exc.message,
        code=exc.code,
        param=exc.param,
        status=exc.status,
        error_type=exc.error_type,
        response_id=exc.response_id,
    )


def _too_many_items(count: int, limit: int) -> LocalProtocolError:
    return LocalProtocolError(
        f"The event carries {count} input items; the limit is {limit}.",
        code=ErrorCode.TOO_MANY_ITEMS,
        param="input",
    )


def _already_completed(track: ResponseTrack) -> LocalProtocolError:
    return LocalProtocolError(
        f"Response {track.response_id!r} is already {track.state.value}.",
        code=ErrorCode.RESPONSE_ALREADY_COMPLETED,
        param="response_id",
        status=409,
        response_id=track.response_id,
    )
