"""The sans-IO connection: messages in, events out; events in, messages out.

Theory of operation
-------------------
A :class:`Connection` holds one side's view of a conversation at the level of
whole messages (framing of a WebSocket is the WebSocket library's job). The
I/O layer feeds every message it receives to :meth:`receive_message`, signals
the end of input with :meth:`receive_closed`, and drains decoded events with
:meth:`next_event`. To send, it calls :meth:`send`, which checks the event
against the protocol and returns the bytes to write: a WebSocket text-frame
payload, a Server-Sent Events record, or nothing at all (:class:`Framing`),
so every transport's events are checked by this same core.

Both peers track the same thing for every response the connection has seen
(a :class:`ResponseTrack`): its state machine (``protocol.state``), its next
``sequence_number`` and its client tool calls (pending / answered, bounded
per live response and dropped when it ends: ``protocol._tracking``). The
rules for which event may do what come from the one table in
``protocol.state``; this module finds the response an event concerns, checks
what the table cannot (sequence numbers, call ids, limits) and records the
result. So a client that would send an output for an unknown call gets
:class:`LocalProtocolError` before anything leaves, and a server gets
:class:`RemoteProtocolError` for the same frame; in both cases nothing
changes (request-level errors never damage the connection).

Receiving is two steps for the server: an event is checked, then handed to
the ``admit`` callback given to :meth:`receive_message` (the application's
own checks, e.g. validation and a secrets policy), and only then recorded. A
refusal by the application therefore needs no undoing.

Checks that need the application's knowledge (models, the rollout's items)
live in the server; checks that follow from the events alone live here.

``response.inject`` (the multi-agent beta, spoken in append mode and on a
shipped-shape connection opened with the beta: ``multi_agent``) is checked
like an append. Two of its refusals are not request errors but answers: a
response that is unknown or finished gets ``response.inject.failed``, handed
back on the error as :attr:`ProtocolError.reply`; and a schema-invalid inject
closes the connection after its ``error`` (:attr:`ProtocolError.close_code`).

``response.steer`` (the shipped shape's steering) names a live response by
``previous_response_id`` and carries user messages only. Every refusal of a
steer is answered by ``response.steer.failed`` (the input handed back, the
code one of the SDK's ``ResponseSteerErrorCode``), never by ``error``: a steer that does
not decode gets one too (``invalid_input``) whenever its
``previous_response_id`` can be read.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

import msgspec

from ._tracking import (
    MAX_ANSWERED_CALLS,
    MAX_PENDING_CALLS,
    ResponseTrack,
    check_append_items,
    event_key,
)
from ._wire import wire_type
from .codec import (
    decode_client_event,
    decode_server_event,
    encode_event,
    encode_sse,
    lane_hint,
    steer_hint,
    type_hint,
)
from .errors import CLOSE_CODES, ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError
from .events import (
    ClientEvent,
    ErrorEvent,
    OutputItemDone,
    ResponseAppend,
    ResponseCancel,
    ResponseCreate,
    ResponseCreated,
    ResponseInject,
    ResponseInjectFailed,
    ResponseQueued,
    ResponseResume,
    ResponseResumed,
    ResponseSteer,
    ResponseSteerFailed,
    ResponseSteerPending,
    ServerEvent,
    SteerError,
    SteerFailure,
    TimingEvent,
)
from .items import (
    ClientCall,
    InputFile,
    InputImage,
    InputText,
    Item,
    McpApprovalRequest,
    Message,
    approval_name,
    call_name,
    is_cut,
)
from .response import RequiredAction, ResponseError
from .state import ResponseState, Role

__all__ = [
    "CLOSED",
    "MAX_ITEMS_PER_EVENT",
    "MAX_MESSAGE_BYTES",
    "NEED_DATA",
    "Connection",
    "Framing",
    "Mode",
    "ResponseTrack",
]

#: Largest message accepted, in bytes (checked before decoding).
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
#: Most items one ``response.create`` or ``response.append`` may carry.
MAX_ITEMS_PER_EVENT: Final = 4096
#: Finished responses remembered per connection (older ones are forgotten).
_MAX_TRACKED_RESPONSES: Final = 1024
#: The refusals of an inject answered by ``response.inject.failed``.
_INJECT_FAILURES: Final = frozenset(
    {ErrorCode.RESPONSE_NOT_FOUND, ErrorCode.RESPONSE_ALREADY_COMPLETED}
)
#: The codes of ``response.steer.failed`` (the SDK's ``ResponseSteerErrorCode``);
#: any other refusal of a steer is reported as ``invalid_input``.
_STEER_ERROR_CODES: Final = frozenset(
    {
        ErrorCode.RESPONSE_NOT_FOUND,
        ErrorCode.INVALID_INPUT,
        ErrorCode.STEERING_NOT_SUPPORTED,
        ErrorCode.TOO_MANY_PENDING_STEERS,
        ErrorCode.RESPONSE_ALREADY_COMPLETED,
        ErrorCode.RESPONSE_NOT_ACTIVE,
        ErrorCode.SUCCESSOR_CREATION_FAILED,
    }
)
#: Server events about the connection or a request, not a response's state.
_CONNECTION_LEVEL: Final = (
    ErrorEvent,
    TimingEvent,
    ResponseInjectFailed,
    ResponseSteerFailed,
    ResponseSteerPending,
)
#: Why each append-mode event is refused on a connection that does not speak it.
_NOT_SPOKEN: Final = {
    "response.append": "response.append is part of append mode; this connection speaks the "
    "shipped shape (continue with response.create and previous_response_id).",
    "response.cancel": "response.cancel is part of append mode; the shipped WebSocket shape "
    "has no cancel event.",
    "response.inject": "response.inject is part of the multi-agent beta; open the connection "
    "with the header 'OpenAI-Beta: responses_multi_agent=v1'.",
    "response.steer": "response.steer is part of the shipped WebSocket shape; in append mode "
    "send response.append while the model samples (it is taken in at the next boundary).",
    "response.resume": "response.resume is part of append mode; the shipped WebSocket shape "
    "continues a stored response with response.create and previous_response_id.",
}


#: The states a response is taken up in (``response.resumed``), by its status.
_RESUMABLE: Final = {
    "requires_action": ResponseState.REQUIRES_ACTION,
    "in_progress": ResponseState.IN_PROGRESS,
}


class Mode(enum.StrEnum):
    """What a connection speaks: the append-event prototype or the shipped shape."""

    APPEND = "append"
    SHIPPED = "shipped"


class Framing(enum.StrEnum):
    """What :meth:`Connection.send` returns for an event."""

    WEBSOCKET = "websocket"  # the JSON payload of one text frame
    SSE = "sse"  # one ``event:``/``data:`` record of a text/event-stream
    NONE = "none"  # nothing: the events are checked and recorded only (HTTP JSON)


class _Sentinel:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: Returned by :meth:`Connection.next_event` when no event is waiting.
NEED_DATA: Final = _Sentinel("NEED_DATA")
#: Returned by :meth:`Connection.next_event` once input has ended.
CLOSED: Final = _Sentinel("CLOSED")

#: The application's admission of a received client event: it returns the
#: event to record (possibly rewritten, e.g. redacted) or raises
#: :class:`ProtocolError` to refuse it. The track is the response an append
#: or cancel targets, ``None`` for other events.
Admit = Callable[[ClientEvent, "ResponseTrack | None"], ClientEvent]

#: What :meth:`Connection._check` returns: how to record an event that passed.
_Commit = Callable[[], None]


def _nothing() -> None:
    return None


class Connection:
    """One side of a longresponse conversation, without I/O."""

    def __init__(
        self,
        our_role: Role,
        mode: Mode = Mode.APPEND,
        *,
        framing: Framing = Framing.WEBSOCKET,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_items_per_event: int = MAX_ITEMS_PER_EVENT,
        max_tracked_responses: int = _MAX_TRACKED_RESPONSES,
        max_pending_calls: int = MAX_PENDING_CALLS,
        max_answered_calls: int = MAX_ANSWERED_CALLS,
        multi_agent: bool = False,
    ) -> None:
        self.our_role = our_role
        self.their_role = Role.SERVER if our_role is Role.CLIENT else Role.CLIENT
        self.mode = mode
        #: The connection speaks the multi-agent beta: ``response.inject`` in
        #: the shipped shape too (append mode always speaks it).
        self.multi_agent = multi_agent
        self.framing = framing
        self.max_message_bytes = max_message_bytes
        self.max_items_per_event = max_items_per_event
        self.max_tracked_responses = max_tracked_responses
        self.max_pending_calls = max_pending_calls
        self.max_answered_calls = max_answered_calls
        self._responses: OrderedDict[str, ResponseTrack] = OrderedDict()
        self._lane_latest: dict[str | None, str] = {}
        self._events: list[ClientEvent | ServerEvent] = []
        self._closed = False

    # --- queries -----------------------------------------------------------

    def response(self, response_id: str) -> ResponseTrack | None:
        return self._responses.get(response_id)

    def latest_response_id(self, stream_id: str | None = None) -> str | None:
        return self._lane_latest.get(stream_id)

    @property
    def responses(self) -> Mapping[str, ResponseTrack]:
        """Every response this connection tracks, by id, in the order first seen (a read-only view).

        Finished responses stay until ``max_tracked_responses`` newer ones push
        them out; live ones are never forgotten.
        """
        return MappingProxyType(self._responses)

    @property
    def lanes(self) -> Mapping[str | None, str]:
        """Each lane's latest response id, by ``stream_id`` (a read-only view).

        ``None`` is the connection's unnamed lane. A lane goes when its latest
        response is forgotten (see :attr:`responses`).
        """
        return MappingProxyType(self._lane_latest)

    @property
    def closed(self) -> bool:
        return self._closed

    # --- input -------------------------------------------------------------

    def receive_message(self, data: bytes | str, *, admit: Admit | None = None) -> None:
        """Take in one whole message from the peer.

        The event is checked against the protocol, then (for client events)
        passed to ``admit``, then recorded and queued for :meth:`next_event`.
        Raises :class:`RemoteProtocolError` if the message is too large, not an
        event, or breaks the protocol, and lets what ``admit`` raises through;
        the connection is then unchanged and stays usable.
        """
        if self.their_role is Role.SERVER:
            self._check_size(data)
            server_event = decode_server_event(data)
            try:
                self._apply_server(server_event)
            except LocalProtocolError as exc:
                raise _as_remote(exc, None) from exc
            self._events.append(server_event)
            return
        self.receive_event(self.decode_message(data), admit=admit)

    def decode_message(self, data: bytes | str) -> ClientEvent:
        """The client event one whole message holds, not yet taken in (the
        server's side): the first step of :meth:`receive_message`, for a
        server that has work to do between the two, such as settling an
        event's costly checks before its admission. Nothing changes here.

        Raises :class:`RemoteProtocolError` if the message is too large or not
        an event (a steer or an inject answered as :meth:`receive_message`
        answers it).
        """
        if self.their_role is not Role.CLIENT:
            raise LocalProtocolError("decode_message() is the server's side", code="role")
        self._check_size(data)
        return self._decode_client(data)

    def receive_event(self, event: ClientEvent, *, admit: Admit | None = None) -> None:
        """Take in a client event :meth:`decode_message` returned: the second
        step of :meth:`receive_message` (check, ``admit``, record and queue),
        checked against the connection's state as it is now."""
        if self._closed:
            raise LocalProtocolError("receive_event() after receive_closed()", code="closed")
        lane = (
            event.stream_id
            if isinstance(event, ResponseCreate) and isinstance(event.stream_id, str)
            else None
        )
        try:
            commit, track = self._check_client(event)
        except LocalProtocolError as exc:
            raise self._answer(event, _as_remote(exc, lane)) from exc
        if admit is not None:
            try:
                event = admit(event, track)
            except ProtocolError as error:
                lane = error.stream_id if error.stream_id is not None else lane
                raise self._answer(event, error.with_(stream_id=lane)) from error.__cause__
        commit()
        self._events.append(event)

    def _check_size(self, data: bytes | str) -> None:
        """A message, checked to be in time and within the size limit (first of
        :meth:`receive_message` and :meth:`decode_message`)."""
        if self._closed:
            raise LocalProtocolError("a message after receive_closed()", code="closed")
        size = _byte_size(data, self.max_message_bytes)
        if size > self.max_message_bytes:
            raise RemoteProtocolError(
                f"The message is {size} bytes; the limit is {self.max_message_bytes}.",
                code=ErrorCode.MESSAGE_TOO_LARGE,
                status=413,
                stream_id=lane_hint(data) if self.their_role is Role.CLIENT else None,
            )

    def receive_closed(self) -> None:
        """The peer's input has ended (the socket closed); no more messages come."""
        self._closed = True

    def check_item_count(self, count: int) -> None:
        """Refuse an event of ``count`` input items past ``max_items_per_event``
        as :meth:`receive_message` would, for a caller that counts them before
        the event is decoded. Raises :class:`RemoteProtocolError`; nothing changes."""
        if count > self.max_items_per_event:
            raise _as_remote(_too_many_items(count, self.max_items_per_event), None)

    def next_event(self) -> ClientEvent | ServerEvent | _Sentinel:
        """The next received event, :data:`NEED_DATA`, or :data:`CLOSED` at the end."""
        if self._events:
            return self._events.pop(0)
        return CLOSED if self._closed else NEED_DATA

    # --- output ------------------------------------------------------------

    def send(self, event: ClientEvent | ServerEvent) -> bytes:
        """Check ``event`` against the protocol, record it, and return its bytes.

        Raises :class:`LocalProtocolError` (nothing recorded) if sending it
        would break the protocol.
        """
        if self.our_role is Role.SERVER:
            self._apply_server(event)  # type: ignore[arg-type]
        else:
            commit, _ = self._check_client(event)  # type: ignore[arg-type]
            commit()
        if self.framing is Framing.WEBSOCKET:
            return encode_event(event)
        if self.framing is Framing.SSE:
            return encode_sse(event)
        return b""

    # --- the rules ---------------------------------------------------------

    def _speaks(self, kind: str) -> bool:
        """Whether this connection speaks the append-mode event type ``kind``."""
        if kind == "response.steer":
            return self.mode is Mode.SHIPPED
        return self.mode is Mode.APPEND or (kind == "response.inject" and self.multi_agent)

    def _decode_client(self, data: bytes | str) -> ClientEvent:
        try:
            return decode_client_event(data)
        except RemoteProtocolError as error:
            kind = type_hint(data)
            if kind == "response.steer":
                raise self._steer_undecoded(data, error) from error.__cause__
            if kind != "response.inject":
                raise
            if not self._speaks("response.inject"):
                raise _as_remote(_not_spoken("response.inject"), None) from error
            # A schema-invalid inject closes the connection, as the beta does.
            raise error.with_(close_code=CLOSE_CODES["invalid_event"]) from error.__cause__

    def _steer_undecoded(self, data: bytes | str, error: RemoteProtocolError) -> ProtocolError:
        """The answer to a steer that did not decode: ``response.steer.failed``
        (``invalid_input``) when its target and input can be read, else ``error``."""
        if not self._speaks("response.steer"):
            return _as_remote(_not_spoken("response.steer"), None)
        hint = steer_hint(data)
        if hint is None:
            return error
        target, raw_input = hint
        return error.with_(reply=self.steer_failed(target, raw_input, error, code="invalid_input"))

    def steer_failed(
        self,
        target: str,
        steer_input: str | list[Any],
        error: ProtocolError,
        *,
        code: str | None = None,
        steer_id: str | None = None,
    ) -> ResponseSteerFailed:
        """``response.steer.failed`` handing ``steer_input`` back, for ``error``: its
        code when it is a steering code (or ``code``), else ``invalid_input``.
        Numbered like ``response.inject.failed``, on the target's lane."""
        if code is None:
            code = error.code if error.code in _STEER_ERROR_CODES else ErrorCode.INVALID_INPUT
        track = self._responses.get(target)
        lane = track.stream_id if track is not None else None
        return ResponseSteerFailed(
            sequence_number=track.next_sequence if track is not None else 0,
            steer=SteerFailure(
                previous_response_id=target,
                input=steer_input,
                id=steer_id if steer_id is not None else msgspec.UNSET,
            ),
            error=SteerError(code=code, message=error.message),
            stream_id=lane if lane is not None else msgspec.UNSET,
        )

    def _answer(self, event: ClientEvent, error: ProtocolError) -> ProtocolError:
        """``error``, or a copy of it with the reply that answers a refused inject
        (``response.inject.failed``) or steer (``response.steer.failed``)."""
        if isinstance(event, ResponseSteer):
            failed = self.steer_failed(event.previous_response_id, event.input, error)
            return error.with_(reply=failed)
        if not (isinstance(event, ResponseInject) and error.code in _INJECT_FAILURES):
            return error
        track = self._responses.get(event.response_id)
        lane = track.stream_id if track is not None else None
        return error.with_(
            reply=ResponseInjectFailed(
                sequence_number=track.next_sequence if track is not None else 0,
                response_id=event.response_id,
                input=event.input,
                error=ResponseError(code=error.code, message=error.message),
                stream_id=lane if lane is not None else msgspec.UNSET,
            )
        )

    def _check_client(self, event: ClientEvent) -> tuple[_Commit, ResponseTrack | None]:
        if isinstance(event, ResponseCreate):
            if isinstance(event.input, list) and len(event.input) > self.max_items_per_event:
                raise _too_many_items(len(event.input), self.max_items_per_event)
            return _nothing, None
        if isinstance(event, ResponseSteer):
            return _nothing, self._check_steer(event)
        if isinstance(event, ResponseResume):
            self._check_resume(event)
            return _nothing, None
        if not isinstance(event, ResponseAppend | ResponseCancel | ResponseInject):
            return _nothing, None  # response.processed: tolerated, never answered
        kind = wire_type(event)
        if not self._speaks(kind):
            raise _not_spoken(kind)
        track = self._target(event.response_id)
        try:
            transition, _ = track.machine.move(Role.CLIENT, kind)
        except LocalProtocolError:
            raise _already_completed(track) from None
        if isinstance(event, ResponseCancel) or not isinstance(event.input, list):
            return _nothing, track
        if len(event.input) > self.max_items_per_event:
            raise _too_many_items(len(event.input), self.max_items_per_event)
        if not event.input and isinstance(event, ResponseAppend) and not _retry_pause(track):
            raise _empty_append(track)
        answered = check_append_items(event.input, track)

        def commit() -> None:
            for call_id in answered:
                del track.pending_calls[call_id]
                track.answered_calls.add(call_id)
            track.machine.process(transition)

        return commit, track

    def _check_steer(self, event: ResponseSteer) -> ResponseTrack:
        """The live response a steer names; its input is user messages only. Raises
        :class:`LocalProtocolError` (nothing changes)."""
        if not self._speaks("response.steer"):
            raise _not_spoken("response.steer")
        track = self._responses.get(event.previous_response_id)
        if track is None:
            raise LocalProtocolError(
                f"Response {event.previous_response_id!r} not found on this connection.",
                code=ErrorCode.RESPONSE_NOT_FOUND,
                param="previous_response_id",
                status=404,
            )
        try:
            track.machine.move(Role.CLIENT, "response.steer")
        except LocalProtocolError:
            raise LocalProtocolError(
                f"Response {track.response_id!r} is already {track.state.value}; it takes no "
                "steering input (continue it with response.create and previous_response_id).",
                code=ErrorCode.RESPONSE_ALREADY_COMPLETED,
                param="previous_response_id",
                status=409,
            ) from None
        if isinstance(event.input, list):
            if not event.input:
                raise LocalProtocolError(
                    "Invalid 'input': empty array. Steering input is a string or at least "
                    "one user message.",
                    code=ErrorCode.INVALID_INPUT,
                    param="input",
                )
            if len(event.input) > self.max_items_per_event:
                raise _too_many_items(len(event.input), self.max_items_per_event)
            for index, item in enumerate(event.input):
                _check_steer_item(item, index)
        return track

    def _check_resume(self, event: ResponseResume) -> None:
        """A resume names a response this connection does not hold live. Raises
        :class:`LocalProtocolError` (nothing changes)."""
        if not self._speaks("response.resume"):
            raise _not_spoken("response.resume")
        track = self._responses.get(event.response_id)
        if track is not None and not track.terminal:
            raise LocalProtocolError(
                f"Response {track.response_id!r} is live on this connection already; "
                "response.resume takes up a response whose connection was lost.",
                code=ErrorCode.INVALID_VALUE,
                param="response_id",
                response_id=track.response_id,
            )

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
                f"Response {LocalProtocolError.clip(response_id)!r} not found on this connection.",
                code=ErrorCode.RESPONSE_NOT_FOUND,
                param="response_id",
                status=404,
                response_id=response_id,
            )
        return track

    def _apply_server(self, event: ServerEvent) -> None:
        """Check a server event and record it; raises (nothing recorded) if illegal."""
        if isinstance(event, _CONNECTION_LEVEL):
            return  # about the connection or a request, not a response's state
        stream_id = event.stream_id if isinstance(event.stream_id, str) else None
        if isinstance(event, ResponseResumed):
            self._open_resumed(event)
            return
        opening = isinstance(event, ResponseCreated | ResponseQueued)
        if opening and event.response.id not in self._responses:  # type: ignore[union-attr]
            self._open(event, stream_id)  # type: ignore[arg-type]
            return
        track = self._track_of(event, stream_id)
        if event.sequence_number != track.next_sequence:
            raise LocalProtocolError(
                f"Event {wire_type(event)!r} of response {track.response_id!r} has "
                f"sequence_number {event.sequence_number}; expected {track.next_sequence}.",
                code=ErrorCode.INVALID_VALUE,
                param="sequence_number",
            )
        if opening:
            raise LocalProtocolError(
                f"Response {track.response_id!r} was already created.",
                code=ErrorCode.INVALID_VALUE,
                param="response.id",
            )
        # A call of any client-executed kind waits for its output, by call_id;
        # an MCP approval request for its approval response, by its id.
        item = event.item if isinstance(event, OutputItemDone) else None
        awaited = _awaited(item) if item is not None else None
        if awaited is not None and awaited[0] in track.answered_calls:
            awaited = None  # already answered
        if (
            awaited is not None
            and awaited[0] not in track.pending_calls
            and len(track.pending_calls) >= self.max_pending_calls
        ):
            raise _too_many_pending_calls(track, self.max_pending_calls)
        track.machine.take(Role.SERVER, event_key(event))  # raises, unchanged, if illegal
        if awaited is not None:
            track.pending_calls[awaited[0]] = awaited[1]
        if track.terminal:
            track.forget_calls()  # nothing can answer a finished response
        track.next_sequence += 1

    def _open(self, event: ResponseCreated | ResponseQueued, stream_id: str | None) -> None:
        if event.sequence_number != 0:
            raise LocalProtocolError(
                f"Response {event.response.id!r} must start at sequence_number 0, "
                f"not {event.sequence_number}.",
                code=ErrorCode.INVALID_VALUE,
                param="sequence_number",
            )
        state = (
            ResponseState.QUEUED if event.response.status == "queued" else ResponseState.IN_PROGRESS
        )
        track = ResponseTrack(
            event.response.id, state, stream_id, max_answered_calls=self.max_answered_calls
        )
        track.next_sequence = 1
        self._remember(track)

    def _open_resumed(self, event: ResponseResumed) -> None:
        """A response taken up from its checkpoint joins this connection where
        the checkpoint left it: its state, its next number, its waiting calls."""
        response = event.response
        old = self._responses.get(response.id)
        if old is not None and not old.terminal:
            raise LocalProtocolError(
                f"Response {response.id!r} is live on this connection already.",
                code=ErrorCode.INVALID_VALUE,
                param="response.id",
            )
        state = _RESUMABLE.get(response.status)
        if state is None:
            raise LocalProtocolError(
                f"A resumed response is requires_action or in_progress, not {response.status!r}.",
                code=ErrorCode.INVALID_VALUE,
                param="response.status",
            )
        track = ResponseTrack(response.id, state, None, max_answered_calls=self.max_answered_calls)
        action = response.required_action
        waiting = set(action.call_ids) if isinstance(action, RequiredAction) else set()
        for item in response.output:
            awaited = _awaited(item)
            if awaited is not None and awaited[0] in waiting:
                track.pending_calls[awaited[0]] = awaited[1]
        track.next_sequence = event.sequence_number + 1
        self._remember(track)

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
                f"Event {wire_type(event)!r} names no response this connection has seen.",
                code=ErrorCode.RESPONSE_NOT_FOUND,
                param="response_id",
            )
        return track

    def _remember(self, track: ResponseTrack) -> None:
        self._responses[track.response_id] = track
        self._lane_latest[track.stream_id] = track.response_id
        while len(self._responses) > self.max_tracked_responses:
            for old_id, old in self._responses.items():
                if old.terminal:
                    del self._responses[old_id]
                    if self._lane_latest.get(old.stream_id) == old_id:
                        del self._lane_latest[old.stream_id]  # the lane's name goes too
                    break
            else:
                break


def _byte_size(data: bytes | str, limit: int) -> int:
    """The UTF-8 size of ``data``, computed only when it could exceed ``limit``."""
    if isinstance(data, bytes) or len(data) * 4 <= limit or data.isascii():
        # For str: at most 4 bytes a character, so within the limit; or ASCII
        # (a flag of the string, read at once), a byte a character.
        return len(data)
    return len(data.encode("utf-8", "surrogatepass"))


def _as_remote(exc: ProtocolError, stream_id: str | None) -> RemoteProtocolError:
    return RemoteProtocolError(
        exc.message,
        code=exc.code,
        param=exc.param,
        status=exc.status,
        error_type=exc.error_type,
        response_id=exc.response_id,
        stream_id=stream_id,
    )


def _not_spoken(kind: str) -> LocalProtocolError:
    return LocalProtocolError(_NOT_SPOKEN[kind], code=ErrorCode.UNKNOWN_EVENT_TYPE, param="type")


def _check_steer_item(item: Item, index: int) -> None:
    """A steering item is a ``user`` message of text, image and file parts."""
    if not isinstance(item, Message):
        raise LocalProtocolError(
            f"Invalid 'input[{index}].type': steering takes user messages only, not "
            f"{wire_type(item)!r} items.",
            code=ErrorCode.INVALID_INPUT,
            param=f"input[{index}].type",
        )
    if item.role != "user":
        raise LocalProtocolError(
            f"Invalid 'input[{index}].role': steering takes user messages only, not {item.role!r}.",
            code=ErrorCode.INVALID_INPUT,
            param=f"input[{index}].role",
        )
    if isinstance(item.content, list):
        for part_index, part in enumerate(item.content):
            if not isinstance(part, InputText | InputImage | InputFile):
                raise LocalProtocolError(
                    f"Invalid 'input[{index}].content[{part_index}].type': a steering message "
                    "holds input_text, input_image and input_file parts only.",
                    code=ErrorCode.INVALID_INPUT,
                    param=f"input[{index}].content[{part_index}].type",
                )


def _awaited(item: Item) -> tuple[str, str] | None:
    """What a finished output item leaves waiting for the client, as (id, name): a
    client call not cut short (by ``call_id``), or an MCP approval request (by ``id``)."""
    if isinstance(item, ClientCall):
        return None if is_cut(item) else (item.call_id, call_name(item))
    if isinstance(item, McpApprovalRequest):
        return item.id, approval_name(item)
    return None


def _too_many_items(count: int, limit: int) -> LocalProtocolError:
    return LocalProtocolError(
        f"The event carries {count} input items; the limit is {limit}.",
        code=ErrorCode.TOO_MANY_ITEMS,
        param="input",
    )


def _too_many_pending_calls(track: ResponseTrack, limit: int) -> LocalProtocolError:
    return LocalProtocolError(
        f"Response {track.response_id!r} already has {limit} tool calls waiting for "
        "their outputs; answer them before it may make more.",
        code=ErrorCode.TOO_MANY_PENDING_CALLS,
        param="item.call_id",
        response_id=track.response_id,
    )


def _already_completed(track: ResponseTrack) -> LocalProtocolError:
    return LocalProtocolError(
        f"Response {track.response_id!r} is already {track.state.value}.",
        code=ErrorCode.RESPONSE_ALREADY_COMPLETED,
        param="response_id",
        status=409,
        response_id=track.response_id,
    )


def _retry_pause(track: ResponseTrack) -> bool:
    """Paused with no call pending: its engine failed a turn, and any append resumes it."""
    return track.state is ResponseState.REQUIRES_ACTION and not track.pending_calls


def _empty_append(track: ResponseTrack) -> LocalProtocolError:
    return LocalProtocolError(
        "Invalid 'input': empty array. An append carries at least one item, except to "
        "resume a response paused with no calls pending.",
        code=ErrorCode.EMPTY_ARRAY,
        param="input",
        response_id=track.response_id,
    )
