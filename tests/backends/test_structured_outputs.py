"""Structured outputs from the simulated model, and ``max_output_tokens`` counted in tokens.

A ``json_schema`` format gets JSON valid against the schema whose strings
still quote the context; a strict schema that is not usable is refused at
admission (``text.format.schema``). The budget of ``max_output_tokens`` is
counted in tokens, per Response, and ``usage`` never exceeds it.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
import jsonschema
import pydantic
import pytest
from websockets.sync.client import connect as ws_connect

from longresponse.engine.render import encode
from protocol import APPEND_SUBPROTOCOL
from tests.conftest import openai_client
from tests.serve.http.test_response_resource import conforms, shipped_turn
from tests.serve.ws.test_shipped_ws import STRICT, WEATHER

ANSWER = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "description": "What the user asked"},
        "mood": {"enum": ["calm", "stormy"]},
        "confidence": {"type": "number", "minimum": 0.5, "maximum": 1},
        "steps": {"type": "integer", "minimum": 3, "multipleOf": 2},
        "city": {"anyOf": [{"$ref": "#/$defs/place"}, {"type": "null"}]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "when": {"type": "string", "format": "date-time"},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "note": {"type": ["string", "null"]},
    },
    "required": ["summary", "mood", "confidence", "steps", "city", "tags", "when", "code", "note"],
    "additionalProperties": False,
    "$defs": {
        "place": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "country": {"const": "FR"}},
            "required": ["name", "country"],
            "additionalProperties": False,
        }
    },
}
FORMAT = {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}
QUESTION = "Is it raining in Paris right now?"


def test_http_json_schema_answer(server: Any) -> None:
    client = openai_client(server)
    raw = client.responses.with_raw_response.create(
        model="sim", input=QUESTION, text={"format": FORMAT}
    ).http_response.json()
    conforms(raw)
    assert raw["text"]["format"] == {**FORMAT, "description": None}
    text = raw["output"][0]["content"][0]["text"]
    value = json.loads(text)
    jsonschema.validate(value, ANSWER)
    assert f"«{QUESTION}»" in value["summary"]
    assert f"«{QUESTION}»" in value["tags"][0]
    assert value["code"] == "AAA"  # built from the pattern, which the answer does not meet
    assert value["when"] == "2026-01-01T00:00:00Z"
    assert raw["usage"]["output_tokens"] == len(encode(text))


class Forecast(pydantic.BaseModel):
    city: str
    outlook: Literal["sun", "rain"]
    degrees: int


def test_sdk_parse_helper_after_a_tool_call(server: Any) -> None:
    """The SDK's own structured-output helper: a strict schema from a pydantic model."""
    client = openai_client(server)
    first = client.responses.create(model="sim", input="Forecast for Nice", tools=[WEATHER])
    call = first.output[0]
    assert call.type == "function_call"
    parsed = client.responses.parse(
        model="sim",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "light rain"}],
        tools=[WEATHER],
        text_format=Forecast,
    )
    forecast = parsed.output_parsed
    assert isinstance(forecast, Forecast)
    assert "«Forecast for Nice»" in forecast.city
    assert "«light rain»" in forecast.city  # the tool output is quoted too
    assert forecast.outlook == "sun"


def test_websocket_json_object_and_schema(server: Any) -> None:
    client = openai_client(server)
    with client.responses.connect() as conn:
        conn.response.create(
            model="sim", input=QUESTION, store=False, text={"format": {"type": "json_object"}}
        )
        frames = shipped_turn(conn)
        done = next(f for f in frames if f["type"] == "response.output_text.done")
        assert json.loads(done["text"]) == {"answer": f"You asked: «{QUESTION}»."}
        conn.response.create(model="sim", input=QUESTION, store=False, text={"format": FORMAT})
        frames = shipped_turn(conn)
        done = next(f for f in frames if f["type"] == "response.output_text.done")
        jsonschema.validate(json.loads(done["text"]), ANSWER)
        deltas = "".join(f["delta"] for f in frames if f["type"] == "response.output_text.delta")
        assert deltas == done["text"]
        conforms(frames[-1]["response"])


def test_append_mode_json_schema(server: Any) -> None:
    with ws_connect(server.url, subprotocols=[APPEND_SUBPROTOCOL]) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "sim", "input": QUESTION,
                            "text": {"format": FORMAT}}))  # fmt: skip
        while (frame := json.loads(ws.recv(timeout=30)))["type"] != "response.done":
            assert frame["type"] != "error", frame
    text = frame["response"]["output"][0]["content"][0]["text"]
    jsonschema.validate(json.loads(text), ANSWER)


def schema_format(schema: Any, **extra: Any) -> dict[str, Any]:
    return {"format": {"type": "json_schema", "name": "out", "strict": True, "schema": schema,
                       **extra}}  # fmt: skip


OBJ = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
       "additionalProperties": False}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "code", "param", "words"),
    [
        pytest.param(schema_format({"type": "array", "items": {"type": "string"}}),
                     "invalid_value", "text.format.schema", "root", id="root-not-object"),
        pytest.param(schema_format({**OBJ, "additionalProperties": True}),
                     "invalid_value", "text.format.schema", "additionalProperties", id="open"),
        pytest.param(schema_format({**OBJ, "required": []}),
                     "invalid_value", "text.format.schema", "required", id="not-all-required"),
        pytest.param(schema_format({**OBJ, "allOf": [{"type": "object"}]}),
                     "invalid_value", "text.format.schema", "allOf", id="unsupported-keyword"),
        pytest.param(schema_format({**OBJ, "properties": {"a": {"description": "?"}}}),
                     "invalid_value", "text.format.schema", "'type'", id="untyped"),
        pytest.param(schema_format({**OBJ, "properties": {"a": {"$ref": "#/$defs/gone"}}}),
                     "invalid_value", "text.format.schema", "#/$defs/gone", id="dangling-ref"),
        pytest.param(schema_format({"type": "strng"}),
                     "invalid_value", "text.format.schema", "strng", id="not-a-json-schema"),
        pytest.param(schema_format(OBJ, name="has space"),
                     "invalid_value", "text.format.name", "name", id="bad-name"),
        pytest.param({"format": {"type": "json_schema", "name": "x"}},
                     "missing_required_parameter", "text.format.schema", "schema", id="no-schema"),
        pytest.param({"format": {"type": "json_schema", "name": "x", "schema": []}},
                     "invalid_type", "text.format.schema", "schema", id="schema-not-object"),
    ],
)  # fmt: skip
def test_unusable_schemas_are_refused(
    server: Any, text: dict[str, Any], code: str, param: str, words: str
) -> None:
    reply = httpx.post(
        f"{server.http_url}/v1/responses", json={"input": "x", "text": text}, timeout=10
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
    assert words in error["message"]
    client = openai_client(server)
    with client.responses.connect() as conn:
        conn.send({"type": "response.create", "model": "sim", "input": "x", "text": text})
        event = STRICT.validate_json(conn.recv_bytes())
        assert event.type == "error"
        assert (event.error.code, event.error.param) == (code, param)
        conn.response.create(model="sim", input="still here", text={"format": FORMAT})
        assert shipped_turn(conn)[-1]["type"] == "response.completed"


def test_a_loose_schema_is_accepted_without_strict(server: Any) -> None:
    loose = {"type": "object", "properties": {"a": {"type": "string"}}}
    client = openai_client(server)
    response = client.responses.create(
        model="sim", input="loose", text=schema_format(loose, strict=False)
    )
    jsonschema.validate(json.loads(response.output_text), loose)


# --- max_output_tokens, in tokens ----------------------------------------------------


def test_max_output_tokens_counts_tokens(server: Any) -> None:
    client = openai_client(server)
    for budget in (1, 7, 40):
        response = client.responses.create(
            model="sim", input="talk «a lot» please", max_output_tokens=budget,
            metadata={"sim_output_tokens": "200"},
        )  # fmt: skip
        assert response.status == "incomplete"
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
        assert response.usage is not None
        text = response.output_text
        assert response.usage.output_tokens == len(encode(text)) <= budget
        assert response.usage.output_tokens >= budget - 4  # cut at the last word that fits
    whole = client.responses.create(model="sim", input="short", max_output_tokens=200)
    assert whole.status == "completed"


def test_a_json_answer_cut_by_the_budget(server: Any) -> None:
    client = openai_client(server)
    full = client.responses.create(model="sim", input=QUESTION, text={"format": FORMAT})
    cut = client.responses.create(
        model="sim", input=QUESTION, text={"format": FORMAT}, max_output_tokens=12
    )
    assert cut.status == "incomplete"
    assert cut.usage is not None
    assert cut.usage.output_tokens <= 12
    assert full.output_text.startswith(cut.output_text)
    assert len(cut.output_text) < len(full.output_text)


def test_the_budget_spans_the_whole_append_response(server: Any) -> None:
    """Append mode: one Response over every turn, so one budget over every turn."""
    with ws_connect(server.url, subprotocols=[APPEND_SUBPROTOCOL]) as ws:
        ws.send(json.dumps({
            "type": "response.create", "model": "sim", "input": "go", "tools": [WEATHER],
            "max_output_tokens": 30, "metadata": {"sim_tool_calls": "3", "sim_output_tokens": "90"},
        }))  # fmt: skip
        paused = 0
        while True:
            frame = json.loads(ws.recv(timeout=30))
            assert frame["type"] != "error", frame
            if frame["type"] != "response.done":
                continue
            response = frame["response"]
            if response["status"] != "requires_action":
                break
            paused += 1
            ws.send(json.dumps({"type": "response.append", "input": [
                {"type": "function_call_output", "call_id": call_id, "output": "ok"}
                for call_id in response["required_action"]["call_ids"]
            ]}))  # fmt: skip
    assert paused >= 1
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    spent = sum(
        len(encode(item["arguments"] if item["type"] == "function_call"
                   else item["content"][0]["text"]))
        for item in response["output"]
    )  # fmt: skip
    assert response["usage"]["output_tokens"] == spent <= 30


def test_a_call_that_does_not_fit_is_not_started(server: Any) -> None:
    client = openai_client(server)
    response = client.responses.create(
        model="sim", input="weather?", tools=[WEATHER], max_output_tokens=2
    )
    assert response.status == "incomplete"
    assert response.output == []
    assert response.usage is not None
    assert response.usage.output_tokens == 0
