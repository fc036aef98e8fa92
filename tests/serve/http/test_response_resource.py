"""Every Response the server sends is the whole published Response resource.

Each Response object, on every transport (HTTP JSON, SSE, the shipped
WebSocket shape, append mode, ``GET /v1/responses/{id}``), is checked against
``tests/support/schemas/response.schema.json`` (written from the published reference)
and against the official SDK's ``Response`` model; every event around it is
validated strictly against the SDK's event unions (an event type the SDK does
not know fails the test).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import jsonschema
import pydantic
import pytest
from openai.types.responses import Response as SDKResponse
from websockets.sync.client import connect as ws_connect

from longresponse.config import SimConfig
from protocol import APPEND_SUBPROTOCOL
from tests.conftest import openai_client
from tests.serve.http.test_http import STREAM_EVENT
from tests.serve.ws.test_shipped_ws import STRICT, WEATHER
from tests.support.paths import SCHEMAS
from tests.support.shipped_ws import TERMINAL

SCHEMA = json.loads((SCHEMAS / "response.schema.json").read_text())
PUBLISHED = jsonschema.Draft202012Validator(SCHEMA)


def _append_schema() -> dict[str, Any]:
    """The published schema plus append mode's one extension (SPEC §5)."""
    schema = copy.deepcopy(SCHEMA)
    schema["properties"]["status"]["enum"].append("requires_action")
    schema["properties"]["required_action"] = {
        "type": "object",
        "required": ["type", "call_ids"],
        "properties": {
            "type": {"const": "submit_tool_outputs"},
            "call_ids": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        },
        "additionalProperties": False,
    }
    return schema


APPEND = jsonschema.Draft202012Validator(_append_schema())
SDK_RESPONSE = pydantic.TypeAdapter(SDKResponse)
LIFECYCLE = {
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.completed",
    "response.incomplete",
    "response.failed",
}

#: Every sampling and echo field a create takes, set away from its default.
RICH = {
    "model": "sim",
    "instructions": "Answer briefly.",
    "tools": [WEATHER],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "temperature": 0.5,
    "top_p": 0.9,
    "presence_penalty": 0.25,
    "frequency_penalty": -0.5,
    "top_logprobs": 3,
    "max_output_tokens": 500,
    "max_tool_calls": 4,
    "reasoning": {"effort": "low", "generate_summary": "concise"},
    "text": {"format": {"type": "text"}, "verbosity": "low"},
    "metadata": {"purpose": "conformance"},
    "safety_identifier": "user-1234",
    "prompt_cache_key": "conformance",
    "service_tier": "auto",
    "truncation": "auto",
    "user": "someone",
}


def conforms(
    response: dict[str, Any], validator: jsonschema.Draft202012Validator = PUBLISHED
) -> None:
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(response)]
    assert not errors, errors
    if validator is PUBLISHED:
        SDK_RESPONSE.validate_python(response)


def echoes_rich(response: dict[str, Any]) -> None:
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "top_logprobs",
                 "max_output_tokens", "max_tool_calls", "metadata", "safety_identifier",
                 "prompt_cache_key", "instructions", "truncation", "user"):  # fmt: skip
        assert response[name] == RICH[name], name
    assert response["reasoning"] == {"effort": "low", "summary": "concise"}
    assert response["text"] == {"format": {"type": "text"}, "verbosity": "low"}
    assert response["tools"] == [{**WEATHER, "strict": None}]
    assert response["parallel_tool_calls"] is False
    assert response["service_tier"] == "default"  # the tier that served it


def test_the_schema_is_the_published_resource() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert "published" in SCHEMA["description"]
    for field in ("presence_penalty", "frequency_penalty", "top_logprobs", "safety_identifier"):
        assert field in SCHEMA["required"]
    # What the server sent before this schema existed fails it.
    before = {
        "id": "resp_1", "object": "response", "created_at": 1, "completed_at": None,
        "status": "in_progress", "incomplete_details": None, "model": "sim",
        "previous_response_id": None, "instructions": None, "output": [], "error": None,
        "tools": [], "tool_choice": "auto", "truncation": "disabled",
        "parallel_tool_calls": True, "text": {"format": {"type": "text"}}, "top_p": 1.0,
        "top_logprobs": 0, "temperature": 1.0, "reasoning": None, "user": None, "usage": None,
        "max_output_tokens": None, "max_tool_calls": None, "store": True, "background": False,
        "service_tier": "default", "metadata": {}, "safety_identifier": None,
        "prompt_cache_key": None,
    }  # fmt: skip
    missing = [e.message for e in PUBLISHED.iter_errors(before)]
    assert any("presence_penalty" in m for m in missing), missing
    assert any("frequency_penalty" in m for m in missing), missing
    conforms({**before, "presence_penalty": 0.0, "frequency_penalty": 0.0})


def sdk_create(client: Any, **body: Any) -> dict[str, Any]:
    """``client.responses.create`` (the penalties, which it does not type, as extra body)."""
    extra = {key: body.pop(key) for key in ("presence_penalty", "frequency_penalty") if key in body}
    raw = client.responses.with_raw_response.create(**body, extra_body=extra or None)
    return raw.http_response.json()  # type: ignore[no-any-return]


def test_http_json_and_retrieve(server: Any) -> None:
    client = openai_client(server)
    first = sdk_create(client, input="Weather in Oslo?", **RICH)
    conforms(first)
    echoes_rich(first)
    assert first["status"] == "completed"
    call = first["output"][0]
    assert call["type"] == "function_call"
    second = sdk_create(
        client,
        input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "12C"}],
        previous_response_id=first["id"],
        **RICH,
    )
    conforms(second)
    assert second["previous_response_id"] == first["id"]
    assert "«12C»" in second["output"][0]["content"][0]["text"]
    for response in (first, second):
        stored = httpx.get(f"{server.http_url}/v1/responses/{response['id']}", timeout=10).json()
        conforms(stored)
        assert stored == response
    plain = sdk_create(client, model="sim", input="hi")
    conforms(plain)
    assert (plain["presence_penalty"], plain["frequency_penalty"]) == (0.0, 0.0)
    assert (plain["temperature"], plain["top_p"], plain["top_logprobs"]) == (1.0, 1.0, 0)
    assert plain["reasoning"] is None
    assert plain["text"] == {"format": {"type": "text"}}


def sse_events(server: Any, body: dict[str, Any], *, strict: bool = True) -> list[dict[str, Any]]:
    """Every event of a streaming create, each validated strictly by the SDK."""
    with httpx.stream(
        "POST", f"{server.http_url}/v1/responses", json={**body, "stream": True}, timeout=30
    ) as streamed:
        assert streamed.status_code == 200
        blocks = [b for b in streamed.read().decode().split("\n\n") if b.strip()]
    assert blocks[-1] == "data: [DONE]"  # the stream's end, after its last event
    events = []
    for block in blocks[:-1]:
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        if strict:
            STREAM_EVENT.validate_json(lines["data"])
        events.append(json.loads(lines["data"]))
    return events


def test_sse_every_lifecycle_response(server: Any) -> None:
    events = sse_events(server, {"input": "Weather in Lima?", **RICH})
    lifecycle = [e for e in events if e["type"] in LIFECYCLE]
    assert [e["type"] for e in lifecycle] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    for event in lifecycle:
        conforms(event["response"])
        echoes_rich(event["response"])


def test_failed_and_incomplete_responses(make_server: Any) -> None:
    small = make_server(sim=SimConfig(context_window=60))
    failed = sse_events(small, {"model": "sim", "input": "word " * 200}, strict=False)
    for event in failed[:-1]:
        STREAM_EVENT.validate_python(event)
    assert failed[-1]["type"] == "response.failed"
    response = failed[-1]["response"]
    # The published resource types error.code as a string; the SDK enumerates
    # codes and has no context_length_exceeded (SPEC §7 uses it), so the SDK
    # model is held to everything else of this one.
    assert response["error"]["code"] == "context_length_exceeded"
    errors = [e.message for e in PUBLISHED.iter_errors(response)]
    assert not errors, errors
    published_code = {**response, "error": {**response["error"], "code": "server_error"}}
    STREAM_EVENT.validate_python({**failed[-1], "response": published_code})
    cut = sse_events(
        small,
        {"model": "sim", "input": "go on", "max_output_tokens": 3,
         "metadata": {"sim_output_tokens": "40"}},
    )  # fmt: skip
    assert cut[-1]["type"] == "response.incomplete"
    conforms(cut[-1]["response"])
    assert cut[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def shipped_turn(conn: Any) -> list[dict[str, Any]]:
    """One response's frames, each validated strictly by the SDK, as JSON."""
    frames = []
    while True:
        raw = conn.recv_bytes()
        event = STRICT.validate_json(raw)
        frames.append(json.loads(raw))
        if event.type in TERMINAL:
            return frames


def test_shipped_websocket_every_response(server: Any) -> None:
    client = openai_client(server)
    with client.responses.connect() as conn:
        conn.send({"type": "response.create", "input": "Weather in Rome?", "store": False,
                   **RICH})  # fmt: skip
        first = shipped_turn(conn)
        call = next(
            f["item"] for f in first
            if f["type"] == "response.output_item.done" and f["item"]["type"] == "function_call"
        )  # fmt: skip
        parent = first[-1]["response"]["id"]
        conn.send({
            "type": "response.create", "store": False, "previous_response_id": parent,
            "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "9C"}],
            **RICH,
        })  # fmt: skip
        second = shipped_turn(conn)
        conn.response.create(model="sim", input="warm", generate=False, store=False)
        warm = shipped_turn(conn)
        conn.response.create(
            model="sim", input="short", max_output_tokens=2, store=False,
            metadata={"sim_output_tokens": "30"},
        )  # fmt: skip
        cut = shipped_turn(conn)
    assert cut[-1]["type"] == "response.incomplete"
    assert [f["type"] for f in warm] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    responses = [f["response"] for f in first + second + warm + cut if f["type"] in LIFECYCLE]
    assert len(responses) == 12
    for response in responses:
        conforms(response)
    for frame in first + second:
        if frame["type"] in LIFECYCLE:
            echoes_rich(frame["response"])


def test_append_mode_every_response(server: Any) -> None:
    responses = []
    with ws_connect(server.url, subprotocols=[APPEND_SUBPROTOCOL]) as ws:
        ws.send(json.dumps({"type": "response.create", "input": "Weather in Kyiv?", **RICH}))
        while True:
            frame = json.loads(ws.recv(timeout=30))
            assert frame["type"] != "error", frame
            if "response" in frame:
                responses.append(frame["response"])
            if frame["type"] != "response.done":
                continue
            response = frame["response"]
            if response["status"] != "requires_action":
                break
            outputs = [
                {"type": "function_call_output", "call_id": call_id, "output": "cloudy"}
                for call_id in response["required_action"]["call_ids"]
            ]
            ws.send(json.dumps({"type": "response.append", "input": outputs}))
    statuses = [r["status"] for r in responses]
    assert statuses == ["in_progress", "in_progress", "requires_action", "in_progress",
                        "completed"]  # fmt: skip
    for response in responses:
        conforms(response, APPEND)
        echoes_rich(response)
        if response["status"] != "requires_action":
            assert "required_action" not in response
            conforms(response)  # the published resource itself


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("temperature", 2.5, "temperature"),
        ("top_p", -0.1, "top_p"),
        ("presence_penalty", 3, "presence_penalty"),
        ("frequency_penalty", -2.5, "frequency_penalty"),
        ("top_logprobs", 21, "top_logprobs"),
        ("max_output_tokens", 0, "max_output_tokens"),
        ("reasoning", {"effort": "extreme"}, "reasoning.effort"),
        ("text", {"format": {"type": "yaml"}}, "text.format.type"),
        ("text", {"verbosity": "chatty"}, "text.verbosity"),
    ],
)
def test_out_of_range_sampling_fields(server: Any, field: str, value: Any, param: str) -> None:
    reply = httpx.post(
        f"{server.http_url}/v1/responses", json={"input": "x", field: value}, timeout=10
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "invalid_value",
        param,
        "invalid_request_error",
    )
    client = openai_client(server)
    with client.responses.connect() as conn:
        conn.send({"type": "response.create", "input": "x", field: value})
        event = STRICT.validate_json(conn.recv_bytes())
        assert event.type == "error"
        assert (event.error.code, event.error.param) == ("invalid_value", param)
        conn.response.create(model="sim", input="still here")
        assert shipped_turn(conn)[-1]["type"] == "response.completed"
