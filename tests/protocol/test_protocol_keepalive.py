"""``keepalive``: a sign of life while the model is silent, an event of the
running response that changes no state (the shipped API's heartbeat)."""

from __future__ import annotations

import pytest

from protocol import ErrorCode, Mode, ResponseState, Role
from protocol.events import Keepalive
from protocol.state import RULES, Transition
from tests.support.connection_pair import RID, ConnectionPair

LIVE = (ResponseState.QUEUED, ResponseState.IN_PROGRESS, ResponseState.REQUIRES_ACTION)


def test_the_rule_table_holds_it_in_every_live_state_and_no_other() -> None:
    for state in LIVE:
        assert RULES[(Role.SERVER, state)]["keepalive"] == (Transition.EMIT, state)
    for (role, state), moves in RULES.items():
        assert "keepalive" not in moves or (role is Role.SERVER and state in LIVE)


@pytest.mark.parametrize("mode", [Mode.APPEND, Mode.SHIPPED])
def test_it_takes_the_next_number_and_changes_nothing_on_either_end(mode: Mode) -> None:
    pair = ConnectionPair(mode)
    pair.create(input="think long")
    pair.start()
    sequence = pair.next_sequence(RID)
    for _ in range(3):
        pair.serve(Keepalive, **({} if mode is Mode.APPEND else {"response_id": RID}))
    assert pair.next_sequence(RID) == sequence + 3
    assert pair.state() is ResponseState.IN_PROGRESS
    pair.assert_agree()
    pair.call("c1")  # the stream goes on, numbered after the keepalives
    pair.finish()
    assert pair.state() is ResponseState.COMPLETED


def test_after_the_end_it_is_refused_naming_the_event_and_state() -> None:
    pair = ConnectionPair()
    pair.create(input="done soon")
    pair.start()
    pair.finish()
    late = pair.emit(Keepalive)
    pair.assert_rejected(Role.SERVER, late, code=ErrorCode.RESPONSE_ALREADY_COMPLETED, param=None)


def test_a_keepalive_out_of_sequence_is_refused() -> None:
    pair = ConnectionPair()
    pair.create(input="x")
    pair.start()
    wrong = pair.emit(Keepalive, sequence_number=pair.next_sequence(RID) + 1)
    pair.assert_rejected(Role.SERVER, wrong, code=ErrorCode.INVALID_VALUE, param="sequence_number")
