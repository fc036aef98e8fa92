"""The transition table: its shape, and an illegal transition that names both
and changes nothing.
"""

from __future__ import annotations

import pytest

from protocol import (
    TERMINAL_STATES,
    TRANSITIONS,
    ErrorCode,
    LocalProtocolError,
    ResponseState,
    ResponseStateMachine,
    Transition,
)
from tests.support.connection_pair import RID

# --- the transition table ----------------------------------------------------


def test_transition_table_shape() -> None:
    assert set(TRANSITIONS) == set(ResponseState)
    for moves in TRANSITIONS.values():
        assert set(moves.values()) <= set(ResponseState)
    assert TERMINAL_STATES == {
        ResponseState.COMPLETED,
        ResponseState.INCOMPLETE,
        ResponseState.FAILED,
        ResponseState.CANCELLED,
    }
    live = set(ResponseState) - TERMINAL_STATES
    for state in live:
        assert TRANSITIONS[state][Transition.APPEND] is state  # append is a self-loop
        assert TRANSITIONS[state][Transition.CANCEL] is ResponseState.CANCELLED
        assert TRANSITIONS[state][Transition.FAIL] is ResponseState.FAILED
    # every live state can still end
    reachable = {ResponseState.QUEUED}
    frontier = [ResponseState.QUEUED]
    while frontier:
        for target in TRANSITIONS[frontier.pop()].values():
            if target not in reachable:
                reachable.add(target)
                frontier.append(target)
    assert reachable == set(ResponseState)


def test_illegal_transition_names_both_and_changes_nothing() -> None:
    machine = ResponseStateMachine(RID, ResponseState.REQUIRES_ACTION)
    with pytest.raises(LocalProtocolError) as info:
        machine.process(Transition.PAUSE)
    assert "pause" in info.value.message
    assert "requires_action" in info.value.message
    assert info.value.code == ErrorCode.INVALID_VALUE
    assert info.value.response_id == RID
    assert machine.state is ResponseState.REQUIRES_ACTION
    machine.process(Transition.CANCEL)
    with pytest.raises(LocalProtocolError) as info:
        machine.process(Transition.RESUME)
    assert info.value.code == ErrorCode.RESPONSE_ALREADY_COMPLETED
    assert repr(machine) == "ResponseStateMachine('resp_1', cancelled)"
