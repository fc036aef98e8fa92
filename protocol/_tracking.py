"""What the connection records of each response: its track, its calls, its events' keys.

:class:`ResponseTrack` is the one record of a response's state (its state
machine), its next ``sequence_number`` and its client tool calls, pending and
answered. What it keeps is bounded for the life of a connection: a live
response holds at most :data:`MAX_PENDING_CALLS` calls waiting for outputs
(one more is refused with ``too_many_pending_calls``) and remembers only its
latest :data:`MAX_ANSWERED_CALLS` answered call ids (an output for a call
answered longer ago is refused as ``unknown_call_id`` rather than
``duplicate_call_id``); a finished response keeps neither
(:meth:`ResponseTrack.forget_calls`: nothing can answer it any more).
:func:`check_append_items` checks an append's items against them;
:func:`event_key` names a server event for the rule table of
``protocol.state``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Set
from typing import Final

from ._wire import wire_type
from .errors import ErrorCode, LocalProtocolError
from .events import (
    ResponseCompleted,
    ResponseDone,
    ResponseFailed,
    ResponseIncomplete,
    ServerEvent,
)
from .items import (
    CallOutput,
    InputItem,
    ItemReference,
    McpApprovalResponse,
    Message,
    answered_call_id,
)
from .state import ResponseState, ResponseStateMachine

__all__ = [
    "MAX_ANSWERED_CALLS",
    "MAX_PENDING_CALLS",
    "AnsweredCalls",
    "ResponseTrack",
    "check_append_items",
    "event_key",
]

#: Most client tool calls one live response may have waiting for outputs (as
#: many as one append may answer: ``MAX_ITEMS_PER_EVENT``).
MAX_PENDING_CALLS: Final = 4096
#: Answered call ids a live response remembers to refuse a second output as
#: ``duplicate_call_id``; older ones are forgotten, oldest first.
MAX_ANSWERED_CALLS: Final = 4096

_DONE_STATUSES: Final = frozenset(
    {"requires_action", "completed", "incomplete", "failed", "cancelled"}
)


class AnsweredCalls(Set[str]):
    """The latest answered call ids of a response, at most ``limit`` (oldest go first)."""

    __slots__ = ("_ids", "limit")

    def __init__(self, limit: int = MAX_ANSWERED_CALLS) -> None:
        self._ids: dict[str, None] = {}  # insertion-ordered: the oldest first
        self.limit = limit

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._ids

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __repr__(self) -> str:
        return f"AnsweredCalls({set(self._ids)!r}, limit={self.limit})"

    def add(self, call_id: str) -> None:
        self._ids[call_id] = None
        if len(self._ids) > self.limit:
            del self._ids[next(iter(self._ids))]

    def clear(self) -> None:
        self._ids.clear()


class ResponseTrack:
    """One response as the connection has seen it: the one record of its state."""

    __slots__ = ("answered_calls", "machine", "next_sequence", "pending_calls", "stream_id")

    def __init__(
        self,
        response_id: str,
        state: ResponseState,
        stream_id: str | None,
        *,
        max_answered_calls: int = MAX_ANSWERED_CALLS,
    ) -> None:
        self.machine = ResponseStateMachine(response_id, state)
        self.next_sequence = 0
        self.pending_calls: dict[str, str] = {}  # call_id -> tool name, no output yet
        self.answered_calls = AnsweredCalls(max_answered_calls)
        self.stream_id = stream_id

    def forget_calls(self) -> None:
        """Drop the call bookkeeping of a finished response (nothing can answer it now)."""
        self.pending_calls.clear()
        self.answered_calls.clear()

    @property
    def response_id(self) -> str:
        return self.machine.response_id

    @property
    def state(self) -> ResponseState:
        return self.machine.state

    @property
    def terminal(self) -> bool:
        return self.machine.terminal

    def __repr__(self) -> str:
        return f"ResponseTrack({self.response_id!r}, {self.state.value}, seq={self.next_sequence})"


def check_append_items(items: Sequence[InputItem], track: ResponseTrack) -> list[str]:
    """The call ids an append's items answer; raises :class:`LocalProtocolError`
    (nothing recorded) for an item an append cannot carry, or an output whose
    ``call_id`` is unknown or already answered. An item reference passes: the
    server replaces it with the stored item before its core checks the append
    (a client's core cannot know what it names)."""
    response_id = track.response_id
    seen: list[str] = []
    for index, item in enumerate(items):
        if isinstance(item, CallOutput | McpApprovalResponse):
            if isinstance(item, McpApprovalResponse):
                call_id, named_by = item.approval_request_id, "approval_request_id"
            else:
                call_id, named_by = answered_call_id(item), "call_id"
                _check_names_call(item, index, response_id)
            if call_id in track.answered_calls or call_id in seen:
                raise LocalProtocolError(
                    f"Tool call {LocalProtocolError.clip(call_id)!r} of response "
                    f"{response_id!r} already has an output.",
                    code=ErrorCode.DUPLICATE_CALL_ID,
                    param=f"input[{index}].{named_by}",
                    response_id=response_id,
                )
            if call_id not in track.pending_calls:
                raise LocalProtocolError(
                    f"No tool call with call_id {LocalProtocolError.clip(call_id)!r} is pending "
                    f"in response {response_id!r}.",
                    code=ErrorCode.UNKNOWN_CALL_ID,
                    param=f"input[{index}].{named_by}",
                    response_id=response_id,
                )
            seen.append(call_id)
        elif isinstance(item, ItemReference):
            continue
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
                "An append carries messages, tool outputs (function_call_output, "
                "custom_tool_call_output, shell_call_output, ...) and mcp_approval_response, "
                f"not {wire_type(item)!r}.",
                code=ErrorCode.INVALID_VALUE,
                param=f"input[{index}].type",
                response_id=response_id,
            )
    return seen


def _check_names_call(item: CallOutput, index: int, response_id: str | None) -> None:
    """An output must name the call it answers (a ``local_shell_call_output`` by
    ``call_id`` or ``id``); raises ``missing_required_parameter``."""
    if not answered_call_id(item):
        raise LocalProtocolError(
            f"A {wire_type(item)} needs the call_id of the call it answers.",
            code=ErrorCode.MISSING_REQUIRED_PARAMETER,
            param=f"input[{index}].call_id",
            response_id=response_id,
        )


#: The statuses each typed terminal event of the shipped shape may carry: its
#: own, and for ``response.failed`` also ``cancelled`` (the shipped stream of a
#: cancelled background response ends with ``response.failed``).
_TYPED_ENDINGS: Final[dict[type, tuple[str, ...]]] = {
    ResponseCompleted: ("completed",),
    ResponseIncomplete: ("incomplete",),
    ResponseFailed: ("failed", "cancelled"),
}


def event_key(event: ServerEvent) -> str:
    """The key of ``event`` in ``protocol.state.RULES``.

    Raises :class:`LocalProtocolError` (``response.status``) when a terminal
    event carries a status it cannot: ``response.done`` a live one, a typed
    ending (``response.completed``…) any but its own (``response.failed``
    also ``cancelled``, keyed ``response.failed:cancelled``).
    """
    kind = type(event)
    if kind is ResponseDone:
        status = event.response.status  # type: ignore[union-attr]
        if status not in _DONE_STATUSES:
            raise LocalProtocolError(
                f"response.done cannot carry status {status!r}.",
                code=ErrorCode.INVALID_VALUE,
                param="response.status",
            )
        return f"response.done:{status}"
    allowed = _TYPED_ENDINGS.get(kind)
    if allowed is not None:
        status = event.response.status  # type: ignore[union-attr]
        if status not in allowed:
            raise LocalProtocolError(
                f"{wire_type(event)} cannot carry status {status!r}.",
                code=ErrorCode.INVALID_VALUE,
                param="response.status",
            )
        if status != allowed[0]:
            return f"{wire_type(event)}:{status}"
    return wire_type(event)
