"""The per-response state machine, as one transition table.

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

Both peers run the same machine over the events they see, so this module does
not know which side it is on: the server drives it with the events it sends,
the client with the events it receives. ``append`` is a self-loop, legal in
every live state (outputs and steering input may arrive while sampling) and
illegal once the response is terminal.

An illegal (state, transition) pair raises :class:`LocalProtocolError` naming
both and leaves the state unchanged; callers that are checking the *peer's*
behaviour convert it to :class:`RemoteProtocolError` at their boundary.
"""

from __future__ import annotations

import enum
from typing import Final

from .errors import ErrorCode, LocalProtocolError

__all__ = [
    "TERMINAL_STATES",
    "TRANSITIONS",
    "ResponseState",
    "ResponseStateMachine",
    "Transition",
]


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
    """What can happen to a Response."""

    START = "start"  # leaves the queue and starts sampling
    PAUSE = "pause"  # the turn ended in client tool calls
    RESUME = "resume"  # every pending call has its output; sampling resumes
    APPEND = "append"  # input accepted into the response's inbox
    COMPLETE = "complete"
    EXPIRE = "expire"  # ends incomplete (pause timeout, token limit)
    FAIL = "fail"
    CANCEL = "cancel"


_S = ResponseState
_T = Transition

#: ``{state: {transition: next_state}}``; a pair that is absent is illegal.
TRANSITIONS: Final[dict[ResponseState, dict[Transition, ResponseState]]] = {
    _S.QUEUED: {
        _T.START: _S.IN_PROGRESS,
        _T.APPEND: _S.QUEUED,
        _T.FAIL: _S.FAILED,
        _T.CANCEL: _S.CANCELLED,
    },
    _S.IN_PROGRESS: {
        _T.APPEND: _S.IN_PROGRESS,
        _T.PAUSE: _S.REQUIRES_ACTION,
        _T.COMPLETE: _S.COMPLETED,
        _T.EXPIRE: _S.INCOMPLETE,
        _T.FAIL: _S.FAILED,
        _T.CANCEL: _S.CANCELLED,
    },
    _S.REQUIRES_ACTION: {
        _T.APPEND: _S.REQUIRES_ACTION,
        _T.RESUME: _S.IN_PROGRESS,
        # A finished shipped-shape segment whose rollout is released.
        _T.COMPLETE: _S.COMPLETED,
        _T.EXPIRE: _S.INCOMPLETE,
        _T.FAIL: _S.FAILED,
        _T.CANCEL: _S.CANCELLED,
    },
    _S.COMPLETED: {},
    _S.INCOMPLETE: {},
    _S.FAILED: {},
    _S.CANCELLED: {},
}

TERMINAL_STATES: Final[frozenset[ResponseState]] = frozenset(
    state for state, moves in TRANSITIONS.items() if not moves
)


class ResponseStateMachine:
    """The state of one Response, advanced only through :data:`TRANSITIONS`."""

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
            code = (
                ErrorCode.RESPONSE_ALREADY_COMPLETED if self.terminal else ErrorCode.INVALID_VALUE
            )
            raise LocalProtocolError(
                f"Cannot {transition.value} response {self.response_id!r}: "
                f"it is {self.state.value}.",
                code=code,
                response_id=self.response_id,
            ) from None
        return self.state

    def __repr__(self) -> str:
        return f"ResponseStateMachine({self.response_id!r}, {self.state.value})"
