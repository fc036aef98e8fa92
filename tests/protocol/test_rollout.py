"""A whole rollout through both cores: pauses, resumes, lanes, terminal states."""

from __future__ import annotations

import pytest

import protocol
from protocol import (
    CLOSED,
    NEED_DATA,
    TERMINAL_STATES,
    Connection,
    LocalProtocolError,
    ResponseState,
    Role,
    encode_event,
)
from protocol.events import (
    ErrorEvent,
    OutputTextDelta,
    ResponseAppend,
    ResponseCancel,
    ResponseCreate,
    ResponseCreated,
    ResponseInProgress,
    ResponseProcessed,
    ResponseQueued,
    TimingEvent,
)
from tests.support.connection_pair import RID, ConnectionPair, output, response, snapshot, user

# --- a whole rollout, both directions --------------------------------------


def test_rollout_pauses_and_resumes_as_one_response(pair: ConnectionPair) -> None:
    pair.create(input=[user("what is 1+1?")], tools=[])
    assert pair.client.latest_response_id() is None  # nothing exists until the server says so
    pair.start()
    assert pair.state() is ResponseState.IN_PROGRESS
    assert pair.client.latest_response_id() == RID

    pair.call("c1")
    track = pair.client.response(RID)
    assert track is not None
    assert track.pending_calls == {"c1": "add"}
    pair.pause("c1")
    assert pair.state() is ResponseState.REQUIRES_ACTION

    pair.append(output("c1"))
    assert track.pending_calls == {}
    assert track.answered_calls == {"c1"}
    assert pair.state() is ResponseState.REQUIRES_ACTION  # until the server resumes
    pair.resume()
    assert pair.state() is ResponseState.IN_PROGRESS

    # sequence numbers keep counting across the pause
    sequence = pair.next_sequence(RID)
    pair.serve(
        OutputTextDelta,
        item_id="msg_1",
        output_index=9,
        content_index=0,
        delta="2",
        sequence_number=sequence,
    )
    pair.finish("completed")
    assert pair.state() is ResponseState.COMPLETED
    assert pair.next_sequence(RID) == sequence + 2


def test_outputs_may_arrive_one_call_at_a_time(paused: ConnectionPair) -> None:
    paused.append(output("c2"))
    track = paused.server.response(RID)
    assert track is not None
    assert track.pending_calls == {"c1": "add"}
    paused.append(output("c1"), response_id=RID)
    assert track.pending_calls == {}
    assert track.answered_calls == {"c1", "c2"}
    paused.resume()
    paused.finish()


@pytest.mark.parametrize("status", ["completed", "incomplete", "failed", "cancelled"])
def test_every_terminal_status_ends_the_response(pair: ConnectionPair, status: str) -> None:
    pair.start()
    pair.finish(status)
    assert pair.state() in TERMINAL_STATES
    assert pair.state().value == status


def test_steering_input_is_accepted_while_sampling_and_queued(pair: ConnectionPair) -> None:
    pair.start("resp_q", status="queued")
    assert pair.state("resp_q") is ResponseState.QUEUED
    pair.append(user("also this"), response_id="resp_q")
    pair.serve(ResponseInProgress, "resp_q")
    assert pair.state("resp_q") is ResponseState.IN_PROGRESS
    pair.append(user("and this"))
    pair.send(Role.CLIENT, ResponseAppend(input="a plain string is a user message"))
    assert pair.state("resp_q") is ResponseState.IN_PROGRESS


def test_queued_response_announced_by_response_queued(pair: ConnectionPair) -> None:
    pair.serve(ResponseQueued, response=response(status="queued"))
    assert pair.state() is ResponseState.QUEUED
    pair.resume()
    assert pair.state() is ResponseState.IN_PROGRESS


def test_cancel_is_checked_but_the_server_decides(pair: ConnectionPair) -> None:
    pair.start()
    pair.send(Role.CLIENT, ResponseCancel())
    assert pair.state() is ResponseState.IN_PROGRESS
    pair.finish("cancelled")
    assert pair.state() is ResponseState.CANCELLED


def test_error_timing_and_processed_events_touch_no_state(pair: ConnectionPair) -> None:
    pair.start()
    before = snapshot(pair.client)
    error = ErrorEvent(
        error=protocol.events.ErrorBody(type="invalid_request_error", code="x", message="m")
    )
    pair.send(Role.SERVER, error)
    pair.send(Role.SERVER, TimingEvent(timing_metrics={"inference_ms": 1.5}, response_id=RID))
    pair.send(Role.CLIENT, ResponseProcessed(response_id=RID))
    assert snapshot(pair.client) == before


def test_lanes_track_their_latest_response(pair: ConnectionPair) -> None:
    pair.serve(ResponseCreated, "resp_a", response=response("resp_a"), stream_id="lane_a")
    pair.start("resp_main")
    assert pair.client.latest_response_id("lane_a") == "resp_a"
    assert pair.client.latest_response_id() == "resp_main"
    # an item event without response_id resolves through its lane
    sequence = pair.next_sequence("resp_a")
    event = OutputTextDelta(
        sequence_number=sequence,
        stream_id="lane_a",
        item_id="m",
        output_index=0,
        content_index=0,
        delta="x",
    )
    pair.send(Role.SERVER, event)
    assert pair.next_sequence("resp_a") == sequence + 1


def test_finished_responses_are_forgotten_beyond_the_limit() -> None:
    pair = ConnectionPair(max_tracked_responses=2)
    pair.start("resp_a")
    pair.finish(response_id="resp_a")
    pair.start("resp_b")
    pair.start("resp_c")  # three tracked: the finished one goes
    assert pair.client.response("resp_a") is None
    assert pair.server.response("resp_a") is None
    pair.start("resp_d")  # nothing finished to forget: live responses are kept
    assert all(pair.client.response(rid) for rid in ("resp_b", "resp_c", "resp_d"))


def test_next_event_queues_in_order_then_reports_closed() -> None:
    conn = Connection(Role.SERVER)
    assert conn.next_event() is NEED_DATA
    first, second = ResponseCreate(model="a"), ResponseCreate(model="b")
    conn.receive_message(encode_event(first))
    conn.receive_message(encode_event(second))
    conn.receive_closed()
    assert conn.closed
    assert [conn.next_event(), conn.next_event(), conn.next_event()] == [first, second, CLOSED]
    with pytest.raises(LocalProtocolError) as info:
        conn.receive_message(encode_event(first))
    assert info.value.code == "closed"
