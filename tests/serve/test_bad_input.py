"""Bad input over real frames: a precise error, nothing changed, socket usable."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from longresponse.client import ConnectionClosedError, connect
from protocol import ResponseState
from protocol.events import ErrorEvent, OutputItemDone, ResponseDone
from protocol.items import FunctionCall

TOOL = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}


async def paused_rollout(client: Any) -> tuple[str, str]:
    """Start a rollout that pauses on one call; return (response id, call id)."""
    await client.create(model="sim", input="go", tools=[TOOL])
    events = await client.until_done()
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "requires_action"
    (call,) = [
        e.item for e in events if isinstance(e, OutputItemDone) and isinstance(e.item, FunctionCall)
    ]
    return done.response.id, call.call_id


async def expect_error(client: Any, frame: str | bytes, code: str, param: str | None) -> ErrorEvent:
    await client.send_raw(frame)
    event = await client.next_event()
    assert isinstance(event, ErrorEvent), event
    assert event.error.code == code, event
    assert event.error.param == param, event
    assert event.error.type == "invalid_request_error"
    assert isinstance(event.status, int)
    assert 400 <= event.status < 500
    assert event.error.message
    return event


def append(input_: Any, **extra: Any) -> str:
    return json.dumps({"type": "response.append", "input": input_, **extra})


BAD_FRAMES = [
    pytest.param("{not json", "invalid_json", None, id="malformed-json"),
    pytest.param(b"\xff\x00binary junk", "invalid_json", None, id="binary-junk"),
    pytest.param("[1, 2]", "invalid_type", None, id="not-an-object"),
    pytest.param('{"input": []}', "missing_required_parameter", "type", id="no-type"),
    pytest.param(
        '{"type": "response.frobnicate"}', "unknown_event_type", "type", id="unknown-type"
    ),
    pytest.param(
        append([{"type": "function_call_output", "output": "x"}]),
        "missing_required_parameter",
        "input[0].call_id",
        id="missing-call-id",
    ),
    pytest.param(
        append([{"type": "function_call_output", "call_id": "call_unknown", "output": "x"}]),
        "unknown_call_id",
        "input[0].call_id",
        id="unknown-call-id",
    ),
    pytest.param(
        append([{"type": "message", "role": "user", "content": 42}]),
        "invalid_type",
        "input[0].content",
        id="content-wrong-type",
    ),
    pytest.param(
        append([{"type": "message", "role": "robot", "content": "hi"}]),
        "invalid_value",
        "input[0].role",
        id="bad-role",
    ),
    pytest.param(
        append([{"type": "message", "role": "assistant", "content": "I said so"}]),
        "invalid_value",
        "input[0].role",
        id="assistant-message",
    ),
    pytest.param(
        append([{"type": "function_call", "call_id": "c", "name": "n", "arguments": "{}"}]),
        "invalid_value",
        "input[0].type",
        id="append-function-call",
    ),
    pytest.param(
        append([{"type": "telepathy"}]),
        "invalid_value",
        "input[0].type",
        id="unknown-item-type",
    ),
    pytest.param(
        append("hi", response_id="resp_unknown"),
        "response_not_found",
        "response_id",
        id="unknown-response",
    ),
    pytest.param(
        json.dumps({"type": "response.create", "model": "gpt-nonexistent", "input": "hi"}),
        "model_not_found",
        "model",
        id="unknown-model",
    ),
    pytest.param(
        json.dumps({"type": "response.create", "input": "hi", "tools": [{"type": "teleport"}]}),
        "invalid_value",
        "tools[0].type",
        id="unknown-tool-type",
    ),
    pytest.param(
        json.dumps({"type": "response.create", "input": "hi", "background": True}),
        "invalid_value",
        "background",
        id="background",
    ),
    pytest.param(
        json.dumps({"type": "response.create", "input": "hi", "metadata": {"sim_tool_calls": "x"}}),
        "invalid_value",
        "metadata.sim_tool_calls",
        id="bad-sim-metadata",
    ),
    pytest.param(
        json.dumps({"type": "response.create", "input": "hi", "temperature": "hot"}),
        "invalid_type",
        "temperature",
        id="wrong-field-type",
    ),
]


@pytest.mark.parametrize(("frame", "code", "param"), BAD_FRAMES)
async def test_bad_frame_leaves_rollout_and_socket_intact(
    server: Any, frame: str | bytes, code: str, param: str | None
) -> None:
    async with connect(server.url) as client:
        rid, call_id = await paused_rollout(client)
        await expect_error(client, frame, code, param)
        # Nothing changed: still paused on the same call, and it still works.
        track = client.connection.response(rid)
        assert track is not None
        assert track.state is ResponseState.REQUIRES_ACTION
        await client.append([{"type": "function_call_output", "call_id": call_id, "output": "ok"}])
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "completed"
        assert f"[{call_id}] «ok»" in done.response.output[-1].content[0].text  # type: ignore[union-attr]


async def test_duplicate_call_id(server: Any) -> None:
    async with connect(server.url) as client:
        await client.create(
            model="sim",
            input="go",
            tools=[TOOL],
            metadata={"sim_tool_calls": "2", "sim_parallel_calls": "2"},
        )
        events = await client.until_done()
        calls = [
            e.item.call_id
            for e in events
            if isinstance(e, OutputItemDone) and isinstance(e.item, FunctionCall)
        ]
        output = {"type": "function_call_output", "call_id": calls[0], "output": "first"}
        await client.append([output])
        await expect_error(client, append([output]), "duplicate_call_id", "input[0].call_id")
        # Twice in one append is refused whole: neither output is taken.
        second = {"type": "function_call_output", "call_id": calls[1], "output": "second"}
        await expect_error(
            client, append([second, second]), "duplicate_call_id", "input[1].call_id"
        )
        await client.append([second])
        done = (await client.until_done())[-1]
        text = done.response.output[-1].content[0].text  # type: ignore[union-attr]
        assert f"[{calls[0]}] «first»" in text
        assert text.count("«second»") == 1


async def test_append_to_finished_rollout(server: Any) -> None:
    async with connect(server.url) as client:
        await client.create(model="sim", input="hello")
        done = (await client.until_done())[-1]
        rid = done.response.id  # type: ignore[union-attr]
        await expect_error(
            client, append("more", response_id=rid), "response_already_completed", "response_id"
        )
        await expect_error(client, append("more"), "response_already_completed", "response_id")


async def test_append_before_any_response(server: Any) -> None:
    async with connect(server.url) as client:
        await expect_error(client, append("hello?"), "response_not_found", "response_id")
        await client.create(model="sim", input="hello")
        assert (await client.until_done())[-1].response.status == "completed"  # type: ignore[union-attr]


async def test_message_too_large_gets_an_error(make_server: Any) -> None:
    small = make_server(max_message_bytes=4096)
    async with connect(small.url) as client:
        _, call_id = await paused_rollout(client)
        big = append([{"type": "function_call_output", "call_id": call_id, "output": "x" * 5000}])
        event = await expect_error(client, big, "message_too_large", None)
        assert event.status == 413
        await client.append([{"type": "function_call_output", "call_id": call_id, "output": "ok"}])
        assert (await client.until_done())[-1].response.status == "completed"  # type: ignore[union-attr]


async def test_frame_far_too_large_closes_1009(make_server: Any) -> None:
    small = make_server(max_message_bytes=4096)
    async with connect(small.url) as client:
        await client.send_raw("x" * 20000)
        with pytest.raises(ConnectionClosedError) as raised:
            await client.next_event(timeout=5)
        assert raised.value.code == 1009


async def test_too_many_items(make_server: Any) -> None:
    small = make_server(max_items_per_event=3)
    async with connect(small.url) as client:
        frame = json.dumps(
            {"type": "response.create", "input": [{"role": "user", "content": "x"}] * 4}
        )
        await expect_error(client, frame, "too_many_items", "input")
        await client.create(model="sim", input=[{"role": "user", "content": "fine"}] * 3)
        assert (await client.until_done())[-1].response.status == "completed"  # type: ignore[union-attr]


async def test_too_many_rollouts(make_server: Any) -> None:
    small = make_server(max_rollouts_per_connection=2)
    async with connect(small.url) as client:
        for _ in range(2):
            await client.create(model="sim", input="go", tools=[TOOL])
        paused = 0
        while paused < 2:
            if isinstance(await client.next_event(), ResponseDone):
                paused += 1
        frame = json.dumps({"type": "response.create", "input": "third"})
        event = await expect_error(client, frame, "too_many_rollouts", None)
        assert event.status == 429


async def test_input_message_without_type_is_accepted(server: Any) -> None:
    async with connect(server.url) as client:
        await client.send_raw(
            json.dumps(
                {
                    "type": "response.create",
                    "model": "sim",
                    "input": [{"role": "user", "content": "typeless"}],
                    "stream": True,
                    "stream_options": {"include_obfuscation": False},
                    "some_future_field": {"x": 1},
                }
            )
        )
        done = (await client.until_done())[-1]
        assert "«typeless»" in done.response.output[-1].content[0].text  # type: ignore[union-attr]


async def test_response_processed_is_tolerated_silently(server: Any) -> None:
    async with connect(server.url) as client:
        await client.create(model="sim", input="hello")
        done = (await client.until_done())[-1]
        await client.send_raw(
            json.dumps({"type": "response.processed", "response_id": done.response.id})  # type: ignore[union-attr]
        )
        await client.send_raw("{}")
        event = await client.next_event()
        assert isinstance(event, ErrorEvent)  # the reply to "{}", not to the processed event
        assert event.error.code == "missing_required_parameter"


# --- the order of checks: which error a request with several faults gets -----


async def test_background_is_named_before_the_rollout_limit(make_server: Any) -> None:
    small = make_server(max_rollouts_per_connection=1)
    async with connect(small.url) as client:
        await client.create(model="sim", input="go", tools=[TOOL])
        assert isinstance((await client.until_done())[-1], ResponseDone)  # paused: still live
        frame = json.dumps({"type": "response.create", "input": "x", "background": True})
        await expect_error(client, frame, "invalid_value", "background")
        frame = json.dumps({"type": "response.create", "input": "x"})
        await expect_error(client, frame, "too_many_rollouts", None)


async def test_an_unknown_model_is_named_before_bad_sim_metadata(server: Any) -> None:
    frame = json.dumps(
        {
            "type": "response.create",
            "model": "no-such-model",
            "input": "x",
            "metadata": {"sim_tool_calls": "many"},
        }
    )
    async with connect(server.url) as client:
        event = await expect_error(client, frame, "model_not_found", "model")
        assert event.status == 404
        frame = json.dumps(
            {"type": "response.create", "input": "x", "metadata": {"sim_tool_calls": "many"}}
        )
        await expect_error(client, frame, "invalid_value", "metadata.sim_tool_calls")
    body = {"model": "no-such-model", "input": "x", "metadata": {"sim_tool_calls": "many"}}
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(f"{server.http_url}/v1/responses", json=body)
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "model_not_found"


async def test_an_append_create_with_an_output_for_no_call_is_refused(server: Any) -> None:
    """As in the shipped shape: an output must answer a call of the same input."""
    orphan = [{"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}]
    frame = json.dumps({"type": "response.create", "input": orphan})
    async with connect(server.url) as client:
        await expect_error(client, frame, "unknown_call_id", "input[0].call_id")
        paired = [
            {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "contents"},
        ]
        await client.create(model="sim", input=paired)
        assert (await client.until_done())[-1].response.status == "completed"  # type: ignore[union-attr]


async def test_http_caps_input_items_like_the_websocket(make_server: Any) -> None:
    small = make_server(max_items_per_event=3)
    items = [{"role": "user", "content": "x"}] * 4
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(f"{small.http_url}/v1/responses", json={"input": items})
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert (error["code"], error["param"]) == ("too_many_items", "input")
        reply = await http.post(f"{small.http_url}/v1/responses", json={"input": items[:3]})
        assert reply.status_code == 200
        # /v1/responses/compact applies the same limit, before reading anything else.
        compact = f"{small.http_url}/v1/responses/compact"
        reply = await http.post(compact, json={"model": "sim", "input": items})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (error["code"], error["param"]) == ("too_many_items", "input")
        reply = await http.post(compact, json={"model": "sim", "input": items[:3]})
        assert reply.status_code == 200, reply.text


async def test_counts_beyond_any_sane_size_are_refused(server: Any) -> None:
    async with connect(server.url) as client:
        for field in ("max_output_tokens", "max_tool_calls"):
            for value in (-1, 0, 2**31, 2**70):
                frame = json.dumps({"type": "response.create", "input": "x", field: value})
                await expect_error(client, frame, "invalid_value", field)
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(
            f"{server.http_url}/v1/responses", json={"input": "x", "max_output_tokens": 2**70}
        )
        assert reply.status_code == 400
        assert reply.json()["error"]["param"] == "max_output_tokens"
