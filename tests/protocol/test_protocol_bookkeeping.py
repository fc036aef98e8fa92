"""What a connection keeps of its responses' tool calls stays bounded (issue 12).

A finished response keeps no call bookkeeping at all; a live one keeps at most
``max_pending_calls`` calls waiting for outputs (one more is refused, by the
sender and by the receiver alike, with ``too_many_pending_calls``) and the
latest ``max_answered_calls`` answered ids; a forgotten finished response
takes its lane's name with it.
"""

from __future__ import annotations

import pytest

from protocol import MAX_ITEMS_PER_EVENT, Connection, ErrorCode, Role
from protocol.events import OutputItemDone, ResponseAppend, ResponseCreated
from tests.support.connection_pair import RID, ConnectionPair, function_call, output, response


@pytest.mark.parametrize("status", ["completed", "incomplete", "failed", "cancelled"])
def test_a_finished_response_keeps_no_calls(status: str) -> None:
    pair = ConnectionPair()
    pair.create(input="add things")
    pair.start()
    pair.call("c1")
    pair.call("c2")
    pair.pause("c1", "c2")
    pair.append(output("c1"))
    pair.resume()
    pair.call("c3")  # still pending when the response ends
    for conn in (pair.client, pair.server):
        track = conn.response(RID)
        assert track is not None
        assert (dict(track.pending_calls), set(track.answered_calls)) == (
            {"c2": "add", "c3": "add"},
            {"c1"},
        )
    pair.finish(status)
    for conn in (pair.client, pair.server):
        track = conn.response(RID)
        assert track is not None
        assert track.pending_calls == {}
        assert len(track.answered_calls) == 0
    # and an output for one of its calls is refused as it always was
    pair.assert_rejected(
        Role.CLIENT,
        ResponseAppend(input=[output("c2")], response_id=RID),
        code=ErrorCode.RESPONSE_ALREADY_COMPLETED,
        param="response_id",
        status=409,
    )


def test_a_live_response_remembers_its_latest_answered_calls_only() -> None:
    pair = ConnectionPair(max_answered_calls=2)
    pair.create(input="add things")
    pair.start()
    for call_id in ("c1", "c2", "c3"):
        pair.call(call_id)
    pair.pause("c1", "c2", "c3")
    for call_id in ("c1", "c2", "c3"):
        pair.append(output(call_id))
    track = pair.server.response(RID)
    assert track is not None
    assert set(track.answered_calls) == {"c2", "c3"}
    assert "c1" not in track.answered_calls
    # a recent one is still a duplicate; a forgotten one is no pending call
    pair.assert_rejected(
        Role.CLIENT,
        ResponseAppend(input=[output("c3")]),
        code=ErrorCode.DUPLICATE_CALL_ID,
        param="input[0].call_id",
    )
    pair.assert_rejected(
        Role.CLIENT,
        ResponseAppend(input=[output("c1")]),
        code=ErrorCode.UNKNOWN_CALL_ID,
        param="input[0].call_id",
    )


def test_a_live_response_has_at_most_max_pending_calls() -> None:
    pair = ConnectionPair(max_pending_calls=2)
    pair.create(input="add things")
    pair.start()
    pair.call("c1")
    pair.call("c2")
    third = pair.emit(OutputItemDone, output_index=50, item=function_call("c3"))
    pair.assert_rejected(
        Role.SERVER, third, code=ErrorCode.TOO_MANY_PENDING_CALLS, param="item.call_id"
    )
    # the same call again is no new one, and once answered there is room again
    pair.send(Role.SERVER, pair.emit(OutputItemDone, output_index=51, item=function_call("c2")))
    pair.pause("c1", "c2")
    pair.append(output("c1"))
    pair.resume()
    pair.call("c3")
    track = pair.client.response(RID)
    assert track is not None
    assert track.pending_calls == {"c2": "add", "c3": "add"}


def test_the_default_bounds_equal_one_append() -> None:
    defaults = Connection(Role.CLIENT)  # the named constants, as a connection applies them
    assert defaults.max_pending_calls == MAX_ITEMS_PER_EVENT  # all answerable in one append
    assert defaults.max_answered_calls >= defaults.max_pending_calls


def test_a_forgotten_response_takes_its_lane_name_along() -> None:
    pair = ConnectionPair(max_tracked_responses=1)
    pair.serve(ResponseCreated, "resp_a", response=response("resp_a"), stream_id="lane_a")
    pair.finish(response_id="resp_a")
    assert pair.client.latest_response_id("lane_a") == "resp_a"
    pair.start("resp_b")  # two tracked: the finished one goes, and its lane's name
    for conn in (pair.client, pair.server):
        assert conn.response("resp_a") is None
        assert conn.latest_response_id("lane_a") is None
        assert conn.latest_response_id() == "resp_b"
