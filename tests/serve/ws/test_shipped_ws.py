"""The shipped WebSocket shape, driven by the official ``openai`` SDK, unchanged.

Every frame the server sends in these tests is validated (strictly, with
pydantic) against the SDK's own ``ResponsesServerEvent`` union: a field the
SDK requires, a wrong type, or an event type it does not know fails the test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
import websockets
from openai import AsyncOpenAI
from openai.types.responses.responses_server_event import ResponsesServerEvent

from tests.support.http_clients import openai_client
from tests.support.shipped_ws import TERMINAL, sdk_turn

STRICT = pydantic.TypeAdapter(ResponsesServerEvent)
SHIPPED_TYPES = {
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.content_part.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
}

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CLOCK = {
    "type": "function",
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
}


def recv(conn: Any) -> Any:
    """Receive one frame, validate it strictly against the SDK, return the typed event."""
    raw = conn.recv_bytes()
    event = STRICT.validate_json(raw)
    assert event.type in SHIPPED_TYPES, event.type
    return event


def turn(conn: Any) -> list[Any]:
    """Events of one response, up to and including its terminal event."""
    events = []
    while True:
        event = recv(conn)
        events.append(event)
        if event.type in TERMINAL:
            return events


def function_calls(events: list[Any]) -> list[Any]:
    return [
        e.item
        for e in events
        if e.type == "response.output_item.done" and e.item.type == "function_call"
    ]


def check_turn_shape(events: list[Any]) -> None:
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    rid = events[0].response.id
    assert events[-1].response.id == rid


@pytest.fixture
def conn(server: Any) -> Iterator[Any]:
    client = openai_client(server)
    with client.responses.connect() as connection:
        yield connection


def test_twenty_turn_tool_loop_store_false_sends_only_new_items(server: Any) -> None:
    client = openai_client(server)
    outputs: list[str] = []
    with client.responses.connect() as conn:
        conn.response.create(
            model="sim",
            input="Plan a trip: check the weather and the time in 20 cities.",
            tools=[WEATHER, CLOCK],
            store=False,
            metadata={"sim_tool_calls": "20"},
        )
        previous = None
        for number in range(21):
            events = turn(conn)
            check_turn_shape(events)
            response = events[-1].response
            assert response.previous_response_id == previous
            # Each segment's output holds only its own items.
            assert len(response.output) == 1
            calls = function_calls(events)
            if not calls:
                break
            assert number < 20
            (call,) = calls
            output = f"tool output number {number:02d} for {call.name}"
            outputs.append(output)
            previous = response.id
            conn.response.create(
                model="sim",
                previous_response_id=previous,
                input=[{"type": "function_call_output", "call_id": call.call_id, "output": output}],
                tools=[WEATHER, CLOCK],
                store=False,
                metadata={"sim_tool_calls": "20"},
            )
            if number > 0:
                usage = response.usage
                assert usage.input_tokens_details.cached_tokens > 0
    assert len(outputs) == 20
    text = response.output[0].content[0].text
    request = "Plan a trip: check the weather and the time in 20 cities."
    assert f"«{request[:40]}»" in text
    for output in outputs:
        assert f"«{output[:40]}»" in text


def test_async_connect(server: Any) -> None:
    async def main() -> str:
        client = AsyncOpenAI(base_url=f"{server.http_url}/v1", api_key="k", max_retries=0)
        async with client.responses.connect() as conn:
            await conn.response.create(model="sim", input="hello", tools=[WEATHER], store=False)
            calls = []
            async for event in conn:
                STRICT.validate_python(event.model_dump(mode="json", exclude_unset=True))
                if event.type == "response.output_item.done" and event.item.type == "function_call":
                    calls.append(event.item)
                if event.type == "response.completed":
                    break
            await conn.response.create(
                model="sim",
                previous_response_id=event.response.id,
                input=[
                    {"type": "function_call_output", "call_id": calls[0].call_id, "output": "22C"}
                ],
                tools=[WEATHER],
                store=False,
            )
            async for event in conn:
                if event.type == "response.completed":
                    return str(event.response.output_text)
        raise AssertionError("no response")  # pragma: no cover

    text = asyncio.run(main())
    assert "«hello»" in text
    assert "«22C»" in text


def expect_error(conn: Any, code: str, param: str | None, status: int = 400) -> Any:
    event = recv(conn)
    assert event.type == "error", event
    assert event.error.code == code, event
    assert event.error.param == param, event
    assert event.error.type == "invalid_request_error"
    assert event.status == status
    return event


def test_unknown_previous_response_id(conn: Any) -> None:
    conn.response.create(model="sim", input="hi", previous_response_id="resp_nope", store=False)
    expect_error(conn, "previous_response_not_found", "previous_response_id")
    conn.response.create(model="sim", input="still here?", store=False)
    check_turn_shape(turn(conn))


def test_failed_continuation_evicts_its_parent(conn: Any) -> None:
    conn.response.create(model="sim", input="go", tools=[WEATHER], store=False)
    events = turn(conn)
    parent = events[-1].response.id
    (call,) = function_calls(events)
    bad = [{"type": "function_call_output", "call_id": "call_wrong", "output": "x"}]
    conn.response.create(model="sim", previous_response_id=parent, input=bad, store=False)
    expect_error(conn, "unknown_call_id", "input[0].call_id")
    good = [{"type": "function_call_output", "call_id": call.call_id, "output": "x"}]
    conn.response.create(model="sim", previous_response_id=parent, input=good, store=False)
    expect_error(conn, "previous_response_not_found", "previous_response_id")


def test_missing_tool_output_fails_and_evicts(conn: Any) -> None:
    conn.response.create(model="sim", input="go", tools=[WEATHER], store=False)
    parent = turn(conn)[-1].response.id
    conn.response.create(
        model="sim", previous_response_id=parent, input="never mind the tool", store=False
    )
    expect_error(conn, "missing_tool_output", "input")
    conn.response.create(model="sim", previous_response_id=parent, input="again", store=False)
    expect_error(conn, "previous_response_not_found", "previous_response_id")


def test_id_from_another_connection_is_not_found(server: Any) -> None:
    client = openai_client(server)
    with client.responses.connect() as first:
        first.response.create(model="sim", input="remember this", store=False)
        rid = turn(first)[-1].response.id
        with client.responses.connect() as second:
            second.response.create(
                model="sim", previous_response_id=rid, input="what did I say?", store=False
            )
            expect_error(second, "previous_response_not_found", "previous_response_id")


def test_fork_from_an_older_segment(server: Any, conn: Any) -> None:
    meta = {"sim_tool_calls": "2"}
    conn.response.create(model="sim", input="root", tools=[WEATHER], store=False, metadata=meta)
    first = turn(conn)
    a_id = first[-1].response.id
    (a_call,) = function_calls(first)
    out = {"type": "function_call_output", "call_id": a_call.call_id}
    conn.response.create(
        model="sim",
        previous_response_id=a_id,
        input=[{**out, "output": "branch one"}],
        tools=[WEATHER],
        store=False,
        metadata=meta,
    )
    b = turn(conn)
    (b_call,) = function_calls(b)
    # Fork from A again (no longer the latest segment), with another output.
    conn.response.create(
        model="sim",
        previous_response_id=a_id,
        input=[{**out, "output": "branch two"}],
        tools=[WEATHER],
        store=False,
        metadata=meta,
    )
    fork = turn(conn)
    check_turn_shape(fork)
    (fork_call,) = function_calls(fork)
    conn.response.create(
        model="sim",
        previous_response_id=fork[-1].response.id,
        input=[{"type": "function_call_output", "call_id": fork_call.call_id, "output": "leaf"}],
        tools=[WEATHER],
        store=False,
        metadata=meta,
    )
    final = turn(conn)[-1].response.output_text
    assert "«branch two»" in final
    assert "«leaf»" in final
    assert "branch one" not in final
    # And branch one is still continuable on its own.
    conn.response.create(
        model="sim",
        previous_response_id=b[-1].response.id,
        input=[{"type": "function_call_output", "call_id": b_call.call_id, "output": "end"}],
        tools=[WEATHER],
        store=False,
        metadata=meta,
    )
    other = turn(conn)[-1].response.output_text
    assert "«branch one»" in other
    assert "branch two" not in other
    shipped = server.last_session.shipped
    assert shipped.forks >= 1


def test_changed_instructions_and_tools_mid_chain(server: Any, conn: Any) -> None:
    meta = {"sim_tool_calls": "2"}
    conn.response.create(
        model="sim",
        input="start",
        instructions="Be brief.",
        tools=[WEATHER],
        store=False,
        metadata=meta,
    )
    first = turn(conn)
    (call,) = function_calls(first)
    assert call.name == "get_weather"
    session = server.last_session
    rollout, _ = session.shipped.cache.lookup(first[-1].response.id)
    rendered_before = rollout.tokens.items_rendered
    conn.response.create(
        model="sim",
        previous_response_id=first[-1].response.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        instructions="Be thorough.",
        tools=[CLOCK],
        store=False,
        metadata=meta,
    )
    second = turn(conn)
    response = second[-1].response
    assert response.instructions == "Be thorough."
    assert [t.name for t in response.tools] == ["get_time"]
    (call2,) = function_calls(second)
    assert call2.name == "get_time"
    # The prefix changed: nothing counts as cached, yet the history's items
    # were not rendered again (only the new output and the model's call).
    assert response.usage.input_tokens_details.cached_tokens == 0
    same, _ = session.shipped.cache.lookup(response.id)
    assert same is rollout
    assert rollout.tokens.items_rendered == rendered_before + 2
    conn.response.create(
        model="sim",
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": call2.call_id, "output": "noon"}],
        tools=[CLOCK],
        instructions="Be thorough.",
        store=False,
        metadata=meta,
    )
    final = turn(conn)[-1].response
    assert final.usage.input_tokens_details.cached_tokens > 0
    assert "«sunny»" in final.output_text
    assert "«noon»" in final.output_text


def test_generate_false_warm_up_then_chain(server: Any, conn: Any) -> None:
    conn.send(
        {
            "type": "response.create",
            "model": "sim",
            "input": "warm me up",
            "tools": [WEATHER],
            "store": False,
            "generate": False,
        }
    )
    warm = turn(conn)
    assert [e.type for e in warm] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    response = warm[-1].response
    assert response.status == "completed"
    assert response.output == []
    session = server.last_session
    rollout, _ = session.shipped.cache.lookup(response.id)
    rendered = rollout.tokens.items_rendered
    conn.response.create(
        model="sim",
        previous_response_id=response.id,
        input="now go",
        tools=[WEATHER],
        store=False,
    )
    events = turn(conn)
    check_turn_shape(events)
    assert function_calls(events)
    # The warm state was reused: same rollout, only the new message rendered.
    same, _ = session.shipped.cache.lookup(events[-1].response.id)
    assert same is rollout
    assert rollout.tokens.items_rendered == rendered + 2  # "now go" + the model's call


def test_two_lanes_interleave(conn: Any) -> None:
    slow = {"sim_output_tokens": "60", "sim_tokens_per_second": "600"}
    for lane in ("alpha", "beta"):
        conn.response.create(
            model="sim", input=f"lane {lane}", store=False, stream_id=lane, metadata=slow
        )
    events: list[Any] = []
    done: set[str] = set()
    while len(done) < 2:
        event = recv(conn)
        events.append(event)
        if event.type == "response.completed":
            done.add(event.stream_id)
    assert done == {"alpha", "beta"}
    assert all(e.stream_id in {"alpha", "beta"} for e in events)
    lanes = [e.stream_id for e in events]
    first_done = next(i for i, e in enumerate(events) if e.type == "response.completed")
    assert set(lanes[:first_done]) == {"alpha", "beta"}  # they ran at the same time
    for lane in ("alpha", "beta"):
        own = [e for e in events if e.stream_id == lane]
        assert [e.sequence_number for e in own] == list(range(len(own)))
        assert f"«lane {lane}»" in own[-1].response.output_text


def test_queued_create_on_a_busy_lane_runs_after(conn: Any) -> None:
    slow = {"sim_output_tokens": "40", "sim_tokens_per_second": "800"}
    conn.response.create(model="sim", input="first", store=False, metadata=slow, stream_id="w")
    conn.response.create(model="sim", input="second", store=False, stream_id="w")
    first = turn(conn)
    second = turn(conn)
    assert "«first»" in first[-1].response.output_text
    assert "«second»" in second[-1].response.output_text
    check_turn_shape(second)


def test_stream_true_and_unknown_fields_are_accepted(conn: Any) -> None:
    conn.send(
        {
            "type": "response.create",
            "model": "sim",
            "input": "tolerate me",
            "stream": True,
            "stream_options": {"include_obfuscation": False},
            "store": False,
            "client_metadata": {"x": "y"},
        }
    )
    events = turn(conn)
    check_turn_shape(events)
    conn.send_raw(json.dumps({"type": "response.processed", "response_id": events[-1].response.id}))
    conn.response.create(model="sim", input="next", store=False)
    check_turn_shape(turn(conn))  # nothing came in reply to response.processed


def test_lane_name_rules(make_server: Any) -> None:
    small = make_server(max_lanes=2)
    with openai_client(small).responses.connect() as conn:
        conn.send({"type": "response.create", "model": "sim", "input": "x", "stream_id": ""})
        expect_error(conn, "invalid_stream_id", "stream_id")
        conn.send({"type": "response.create", "model": "sim", "input": "x", "stream_id": "a b"})
        assert expect_error(conn, "invalid_stream_id", "stream_id").stream_id is None
        for lane in ("one", "two"):
            conn.response.create(model="sim", input=lane, store=False, stream_id=lane)
            assert turn(conn)[-1].stream_id == lane
        conn.response.create(model="sim", input="three", store=False, stream_id="three")
        error = expect_error(conn, "websocket_stream_limit_reached", "stream_id")
        assert error.stream_id == "three"
        conn.response.create(model="sim", input="default lane is free", store=False)
        events = turn(conn)
        assert events[-1].stream_id is None


def test_in_flight_limit_queues_across_lanes(make_server: Any) -> None:
    one = make_server(max_in_flight=1)
    slow = {"sim_output_tokens": "40", "sim_tokens_per_second": "800"}
    with openai_client(one).responses.connect() as conn:
        conn.response.create(model="sim", input="a", store=False, stream_id="a", metadata=slow)
        conn.response.create(model="sim", input="b", store=False, stream_id="b", metadata=slow)
        first = turn(conn)
        second = turn(conn)
        assert {first[0].stream_id, second[0].stream_id} == {"a", "b"}
        assert all(e.stream_id == first[0].stream_id for e in first)


def test_queue_limit(make_server: Any) -> None:
    tight = make_server(max_queued=1)
    slow = {"sim_output_tokens": "40", "sim_tokens_per_second": "400"}
    with openai_client(tight).responses.connect() as conn:
        conn.response.create(model="sim", input="run", store=False, metadata=slow)
        # Wait until it runs, so exactly one more can wait behind it.
        assert recv(conn).type == "response.created"
        conn.response.create(model="sim", input="wait", store=False)
        conn.response.create(model="sim", input="refused", store=False)
        events = []
        while not any(e.type == "error" for e in events):
            events.append(recv(conn))
        error = events[-1]
        assert error.error.code == "websocket_queue_limit_reached"
        assert error.status == 429
        done = [e for e in events if e.type == "response.completed"]
        while len(done) < 2:
            done.append(turn(conn)[-1])
        assert "«wait»" in done[-1].response.output_text


def test_background_and_append_are_refused(conn: Any) -> None:
    conn.send({"type": "response.create", "model": "sim", "input": "x", "background": True})
    expect_error(conn, "invalid_value", "background")
    conn.send_raw(json.dumps({"type": "response.append", "input": "more"}))
    expect_error(conn, "unknown_event_type", "type")
    conn.send_raw("{broken")
    expect_error(conn, "invalid_json", None)
    conn.response.create(model="sim", input="still fine", store=False)
    check_turn_shape(turn(conn))


def test_connection_lifetime_limit(make_server: Any) -> None:
    brief = make_server(connection_lifetime=0.5)
    with openai_client(brief).responses.connect() as conn:
        error = recv(conn)
        assert error.type == "error"
        assert error.error.code == "websocket_connection_limit_reached"
        assert error.stream_id is None
        with pytest.raises(websockets.exceptions.ConnectionClosedOK) as closed:
            conn.recv_bytes()
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1000


def test_changed_model_mid_chain(conn: Any) -> None:
    conn.response.create(model="sim", input="start", tools=[WEATHER], store=False)
    first = turn(conn)
    (call,) = function_calls(first)
    conn.response.create(
        model="sim-alt",
        previous_response_id=first[-1].response.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "rainy"}],
        tools=[WEATHER],
        store=False,
    )
    second = turn(conn)[-1].response
    assert second.model == "sim-alt"
    # A new model has processed nothing yet: no cached tokens, full context seen.
    assert second.usage.input_tokens_details.cached_tokens == 0
    assert "«start»" in second.output_text
    assert "«rainy»" in second.output_text


def test_forks_across_lanes(conn: Any) -> None:
    conn.response.create(model="sim", input="shared", tools=[WEATHER], store=False, stream_id="a")
    parent_events = turn(conn)
    parent = parent_events[-1].response.id
    (call,) = function_calls(parent_events)
    output = {"type": "function_call_output", "call_id": call.call_id}
    # A failed continuation on another lane keeps the shared parent.
    conn.response.create(
        model="sim",
        previous_response_id=parent,
        input=[{**output, "call_id": "call_wrong", "output": "x"}],
        store=False,
        stream_id="b",
    )
    error = expect_error(conn, "unknown_call_id", "input[0].call_id")
    assert error.stream_id == "b"
    for lane in ("b", "a"):
        conn.response.create(
            model="sim",
            previous_response_id=parent,
            input=[{**output, "output": f"seen on {lane}"}],
            store=False,
            stream_id=lane,
        )
        events = turn(conn)
        assert {e.stream_id for e in events} == {lane}
        text = events[-1].response.output_text
        assert f"«seen on {lane}»" in text
        assert "«shared»" in text


def test_connection_cache_budget_evicts_oldest_rollouts(make_server: Any) -> None:
    tiny = make_server(connection_cache_bytes=20_000)
    with openai_client(tiny).responses.connect() as conn:
        ids = []
        for index in range(6):
            conn.response.create(model="sim", input=f"conversation {index} " * 300, store=False)
            ids.append(turn(conn)[-1].response.id)
        conn.response.create(model="sim", previous_response_id=ids[-1], input="more", store=False)
        assert "«conversation 5" in turn(conn)[-1].response.output_text
        conn.response.create(model="sim", previous_response_id=ids[0], input="more", store=False)
        expect_error(conn, "previous_response_not_found", "previous_response_id")
        shipped = tiny.last_session.shipped
        assert shipped.cache.evictions > 0
        assert shipped.cache.nbytes <= 20_000


def test_connection_cache_keeps_a_running_total_of_its_size(make_server: Any) -> None:
    tiny = make_server(connection_cache_bytes=60_000)
    with openai_client(tiny).responses.connect() as conn:
        previous = None
        for index in range(8):  # chains and new conversations, some evicted
            conn.response.create(
                model="sim",
                input=f"turn {index} " * 200,
                store=False,
                **({"previous_response_id": previous} if index % 3 else {}),
            )
            previous = turn(conn)[-1].response.id
        cache = tiny.last_session.shipped.cache
        assert cache.evictions > 0
        # Every rollout is idle: the running total is the sum of their sizes.
        assert cache.nbytes == sum(r.nbytes for r in cache.rollouts)
        assert 0 < cache.nbytes <= 60_000


def test_an_oversized_create_on_a_lane_gets_its_error_on_that_lane(make_server: Any) -> None:
    small = make_server(max_message_bytes=4096)
    with openai_client(small).responses.connect() as conn:
        conn.send(
            {"type": "response.create", "model": "sim", "input": "x" * 5000, "stream_id": "big"}
        )
        error = expect_error(conn, "message_too_large", None, status=413)
        assert error.stream_id == "big"
        conn.response.create(model="sim", input="fits", store=False, stream_id="big")
        assert turn(conn)[-1].stream_id == "big"


@pytest.mark.parametrize(
    "beta",
    [
        "responses_websockets=2026-02-04",
        "responses_websockets=2026-02-04,responses_websockets=2026-02-06",
    ],
)
def test_a_responses_websockets_beta_header_selects_nothing(server: Any, beta: str) -> None:
    """Gateways in front of the shipped API send ``OpenAI-Beta:
    responses_websockets=…`` for its WebSocket: the connection speaks the
    shipped shape all the same, and the official SDK's tool loop runs (issue
    29: the header put it in append mode, ``response.done`` came instead of
    ``response.completed``, and the loop stopped)."""
    tool = {"type": "function", "name": "read_file", "parameters": {"type": "object"}}
    client = openai_client(server)
    with client.responses.connect(extra_headers={"OpenAI-Beta": beta}) as conn:
        conn.response.create(model="sim", input="read it", tools=[tool], store=False)
        first = sdk_turn(conn)
        assert first[-1].type == "response.completed"
        (call,) = [item for item in first[-1].response.output if item.type == "function_call"]
        conn.response.create(
            model="sim",
            previous_response_id=first[-1].response.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "42"}],
            tools=[tool],
            store=False,
        )
        second = sdk_turn(conn)
    assert second[-1].type == "response.completed"
    assert second[-1].response.id != first[-1].response.id
