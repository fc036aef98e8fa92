"""Every transition rule of a Response, in one table keyed by (role, state, event type).

Theory of operation
-------------------
A Response moves through a small set of states. In append mode a whole
rollout is one Response, so it can leave ``in_progress`` for
``requires_action`` (the model asked for client tool outputs and the sampling
loop is blocked) and come back many times before it ends in one of the four
terminal states::

    in_progress ──pause──▶ requires_action ──resume──▶ in_progress ...
         │                       │
         └── complete | incomplete | fail | cancel ──▶ (terminal)

:data:`RULES` is the one table: for each (role that sends the event, state of
the response) it maps the event's key (its wire ``type``; for
``response.done``, the type and the status it carries, such as
``response.done:requires_action``; ``response.failed:cancelled`` for the
shipped shape's cancelled ending) to the :class:`Transition` it makes and
the state it leads to. A pair that is absent is illegal. Both peers run the
same table over the events they see, so this module does not know which side
it is on: the server drives it with the events it sends, the client with the
events it receives.

:data:`TRANSITIONS` is the same table seen from the response alone
(``{state: {transition: next_state}}``, whoever sent the event), derived
from :data:`RULES`; :class:`ResponseStateMachine` walks it. An illegal move
raises :class:`LocalProtocolError` naming the move and the state and leaves
the state unchanged; callers that are checking the *peer's* behaviour convert
it to :class:`RemoteProtocolError` at their boundary.

Events that open a response (``response.created``, ``response.queued``) are
not transitions: they create its machine in ``in_progress`` or ``queued``.
Connection-level events (``error``, timing, ``response.inject.failed``,
``response.steer.failed`` and ``.pending``) concern no response's state.

``response.steer`` (the shipped shape's steering) is legal while a response
is live and changes nothing: its input waits for the response's successor,
which the server starts when the response ends. Its receipt,
``response.steer.accepted``, is numbered in the steered response's stream.
"""

from __future__ import annotations

import enum
from typing import Final

from .errors import ErrorCode, LocalProtocolError

__all__ = [
    "RULES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "ResponseState",
    "ResponseStateMachine",
    "Role",
    "Transition",
]


class Role(enum.StrEnum):
    """Which peer sends an event."""

    CLIENT = "client"
    SERVER = "server"


class ResponseState(enum.StrEnum):
    """The ``status`` of a Response (shipped values plus ``requires_action``)."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    REQUIRES_ACTION = "requires_action"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Transition(enum.StrEnum):
    """What an event does to a Response."""

    START = "start"  # leaves the queue and starts sampling
    EMIT = "emit"  # an output event while sampling (no change)
    PAUSE = "pause"  # the turn ended in client tool calls
    RESUME = "resume"  # every pending call has its output; sampling resumes
    APPEND = "append"  # input accepted into the response's inbox
    STEER = "steer"  # input queued for the response's successor (no change)
    ASK_CANCEL = "ask_cancel"  # the client asks; the server's terminal event follows
    COMPLETE = "complete"
    EXPIRE = "expire"  # ends incomplete (pause timeout, token limit)
    FAIL = "fail"
    CANCEL = "cancel"


_S = ResponseState
_T = Transition
_C = Role.CLIENT
_V = Role.SERVER

#: The server events that stream a response's output (legal while sampling).
OUTPUT_EVENTS: Final = (
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.content_part.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.mcp_call_arguments.delta",
    "response.mcp_call_arguments.done",
    "response.mcp_call.in_progress",
    "response.mcp_call.completed",
    "response.mcp_call.failed",
    "response.mcp_list_tools.in_progress",
    "response.mcp_list_tools.completed",
    "response.mcp_list_tools.failed",
    "response.compaction.compacting",
)

#: How a live response can end, from the server: ``response.done`` with a
#: terminal status (append mode) or the shipped shape's own terminal events.
_ENDINGS: Final[dict[str, tuple[Transition, ResponseState]]] = {
    "response.done:completed": (_T.COMPLETE, _S.COMPLETED),
    "response.completed": (_T.COMPLETE, _S.COMPLETED),
    "response.done:incomplete": (_T.EXPIRE, _S.INCOMPLETE),
    "response.incomplete": (_T.EXPIRE, _S.INCOMPLETE),
    "response.done:failed": (_T.FAIL, _S.FAILED),
    "response.failed": (_T.FAIL, _S.FAILED),
    "response.done:cancelled": (_T.CANCEL, _S.CANCELLED),
    "response.failed:cancelled": (_T.CANCEL, _S.CANCELLED),
}


#: Server events of the response they name (numbered in its stream) that change
#: nothing: the multi-agent beta's inject receipt, the receipt of a steer, and
#: ``keepalive`` (a sign of life while the model is silent).
ACKNOWLEDGEMENTS: Final = ("response.inject.created", "response.steer.accepted", "keepalive")


def _client_moves(state: ResponseState) -> dict[str, tuple[Transition, ResponseState]]:
    # Input is legal in every live state (outputs and steering may arrive
    # while sampling); cancelling is only asked for: the server ends it.
    # response.inject is the multi-agent beta's append: the same move.
    # response.steer queues input for the successor: no change either.
    return {
        "response.append": (_T.APPEND, state),
        "response.inject": (_T.APPEND, state),
        "response.steer": (_T.STEER, state),
        "response.cancel": (_T.ASK_CANCEL, state),
    }


def _emits(state: ResponseState) -> dict[str, tuple[Transition, ResponseState]]:
    # Output events change no state; the protocol tolerates them in every live
    # state (the server may finish streaming an item as a pause is decided),
    # and so are the acknowledgements of input (an inject may come at any time).
    return {key: (_T.EMIT, state) for key in (*OUTPUT_EVENTS, *ACKNOWLEDGEMENTS)}


#: ``{(sender, state): {event key: (transition, next state)}}``; absent = illegal.
RULES: Final[dict[tuple[Role, ResponseState], dict[str, tuple[Transition, ResponseState]]]] = {
    (_C, _S.QUEUED): _client_moves(_S.QUEUED),
    (_C, _S.IN_PROGRESS): _client_moves(_S.IN_PROGRESS),
    (_C, _S.REQUIRES_ACTION): _client_moves(_S.REQUIRES_ACTION),
    (_V, _S.QUEUED): {
        "response.in_progress": (_T.START, _S.IN_PROGRESS),
        **_emits(_S.QUEUED),
        "response.done:failed": (_T.FAIL, _S.FAILED),
        "response.failed": (_T.FAIL, _S.FAILED),
        "response.done:cancelled": (_T.CANCEL, _S.CANCELLED),
        "response.failed:cancelled": (_T.CANCEL, _S.CANCELLED),
    },
    (_V, _S.IN_PROGRESS): {
        "response.in_progress": (_T.EMIT, _S.IN_PROGRESS),
        **_emits(_S.IN_PROGRESS),
        "response.done:requires_action": (_T.PAUSE, _S.REQUIRES_ACTION),
        **_ENDINGS,
    },
    (_V, _S.REQUIRES_ACTION): {
        "response.in_progress": (_T.RESUME, _S.IN_PROGRESS),
        **_emits(_S.REQUIRES_ACTION),
        # The rollout may end while it waits (pause timeout, cancel, a
        # finished shipped-shape segment whose rollout is released).
        **_ENDINGS,
    },
}


def _derive() -> dict[ResponseState, dict[Transition, ResponseState]]:
    table: dict[ResponseState, dict[Transition, ResponseState]] = {s: {} for s in ResponseState}
    for (_, state), moves in RULES.items():
        for transition, target in moves.values():
            known = table[state].setdefault(transition, target)
            if known is not target:  # pragma: no cover - a contradiction in RULES
                raise AssertionError(f"{state} --{transition}--> {known} and {target}")
    return table


#: ``{state: {transition: next_state}}``: :data:`RULES` without the senders.
TRANSITIONS: Final[dict[ResponseState, dict[Transition, ResponseState]]] = _derive()

TERMINAL_STATES: Final[frozenset[ResponseState]] = frozenset(
    state for state, moves in TRANSITIONS.items() if not moves
)

#: :data:`RULES` indexed by sender, then state (the same entries, looked up faster).
_BY_SENDER: Final[dict[Role, dict[ResponseState, dict[str, tuple[Transition, ResponseState]]]]] = {
    role: {state: RULES.get((role, state), {}) for state in ResponseState} for role in Role
}


class ResponseStateMachine:
    """The state of one Response, advanced only through the table."""

    __slots__ = ("response_id", "state")

    def __init__(self, response_id: str, state: ResponseState = ResponseState.IN_PROGRESS) -> None:
        self.response_id = response_id
        self.state = state

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def allows(self, transition: Transition) -> bool:
        return transition in TRANSITIONS[self.state]

    def process(self, transition: Transition) -> ResponseState:
        """Apply ``transition`` and return the new state.

        Raises :class:`LocalProtocolError` (state unchanged) when the table has
        no such move from the current state.
        """
        try:
            self.state = TRANSITIONS[self.state][transition]
        except KeyError:
            raise self._illegal(transition.value) from None
        return self.state

    def move(self, sender: Role, key: str) -> tuple[Transition, ResponseState]:
        """The move the event ``key`` sent by ``sender`` makes, without making it.

        Raises :class:`LocalProtocolError` (nothing changes) when it is illegal.
        """
        move = _BY_SENDER[sender][self.state].get(key)
        if move is None:
            raise self._illegal(key)
        return move

    def take(self, sender: Role, key: str) -> ResponseState:
        """Make the move of the event ``key`` sent by ``sender``; return the new state.

        Raises :class:`LocalProtocolError` (state unchanged) when it is illegal.
        """
        self.state = self.move(sender, key)[1]
        return self.state

    def _illegal(self, what: str) -> LocalProtocolError:
        code = ErrorCode.RESPONSE_ALREADY_COMPLETED if self.terminal else ErrorCode.INVALID_VALUE
        return LocalProtocolError(
            f"Cannot {what} response {self.response_id!r}: it is {self.state.value}.",
            code=code,
            response_id=self.response_id,
        )

    def __repr__(self) -> str:
        return f"ResponseStateMachine({self.response_id!r}, {self.state.value})"
