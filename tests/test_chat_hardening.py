"""The chat endpoint under hostile and unusual input: bounded work, tenants
kept apart, slow readers dropped, the SDK's own objects accepted.

Each test drives the real server with the official ``openai`` SDK where the
point is interoperability, and with ``httpx`` or a raw socket where it sends
what the SDK will not (bad input, a reader that never reads).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncGenerator
from typing import Any

import httpx
import openai
import pytest

from longresponse.engine.models import ModelSpec, SampleChunk, SampleRequest, TextDelta
from longresponse.engine.structured import MAX_SCHEMA_COUNT, MAX_SCHEMA_DEPTH, value_for_schema
from tests.conftest import openai_client

GOOD = {"model": "sim", "messages": [{"role": "user", "content": "Hi"}]}
TOOL_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def nested(depth: int) -> dict[str, Any]:
    """An object schema ``depth`` levels of ``properties`` deep (two JSON levels each)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def json_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def wait_for(condition: Any, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def refused(answer: httpx.Response, code: str, param: str) -> None:
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert (error["code"], error["param"]) == (code, param)
    assert error["message"]


# --- bounded work ---------------------------------------------------------------

HUGE = [
    {"type": "object", "properties": {"a": {"type": "array", "minItems": 1_000_000}}},
    {"type": "object", "properties": {"a": {"type": "string", "minLength": 10**12}}},
    {"type": "object", "minProperties": MAX_SCHEMA_COUNT + 1},
    nested(MAX_SCHEMA_DEPTH),  # 128 levels of JSON: past the cap
    nested(200),  # past what the metaschema check itself can recurse
]


@pytest.mark.parametrize("schema", HUGE)
def test_a_schema_asking_for_unbounded_work_is_refused_on_both_endpoints(
    server: Any, schema: dict[str, Any]
) -> None:
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        chat_body = {**GOOD, "response_format": json_format(schema)}
        chat = http.post("/v1/chat/completions", json=chat_body)
        refused(chat, "invalid_value", "response_format.json_schema.schema")
        text = {"format": {"type": "json_schema", "name": "answer", "schema": schema}}
        responses = http.post("/v1/responses", json={"model": "sim", "input": "Hi", "text": text})
        refused(responses, "invalid_value", "text.format.schema")
        # The connection stays usable.
        assert http.post("/v1/chat/completions", json=GOOD).status_code == 200


@pytest.mark.parametrize("depth", [MAX_SCHEMA_DEPTH, 200])
def test_tool_parameters_nested_too_deep_are_refused_on_both_endpoints(
    server: Any, depth: int
) -> None:
    parameters = {"type": "object", "properties": {"a": nested(depth)}}
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        tool = {"type": "function", "function": {"name": "deep", "parameters": parameters}}
        chat = http.post("/v1/chat/completions", json={**GOOD, "tools": [tool]})
        refused(chat, "invalid_value", "tools[0].function.parameters")
        flat = {"type": "function", "name": "deep", "parameters": parameters}
        responses = http.post("/v1/responses", json={"model": "sim", "input": "x", "tools": [flat]})
        refused(responses, "invalid_value", "tools[0].parameters")


def test_nested_arrays_stop_at_the_token_budget(server: Any) -> None:
    # Each level is within the cap, but together 10^12 strings: the budget ends it.
    inner = {"type": "array", "minItems": MAX_SCHEMA_COUNT, "items": {"type": "string"}}
    outer = {"type": "array", "minItems": MAX_SCHEMA_COUNT, "items": inner}
    schema = {"type": "object", "properties": {"grid": outer}}
    completion = openai_client(server).chat.completions.create(
        model="sim",
        messages=[user("Fill the grid.")],
        response_format=json_format(schema),  # type: ignore[arg-type]
        max_tokens=200,
        timeout=30,
    )
    [choice] = completion.choices
    assert choice.finish_reason == "length"
    assert completion.usage is not None
    assert 0 < completion.usage.completion_tokens <= 200


def test_the_generator_charges_every_value_to_the_budget() -> None:
    big = value_for_schema({"type": "array", "minItems": 10**9}, "x", budget=100)
    assert 0 < len(big) <= 100
    padded = value_for_schema({"type": "string", "minLength": 10**9}, "x", budget=10)
    assert 1 <= len(padded) <= 10 * 64


def test_a_recursive_ref_gets_an_answer_not_a_crash(server: Any) -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
    client = openai_client(server)
    completion = client.chat.completions.create(
        model="sim",
        messages=[user("Recurse.")],
        response_format=json_format(schema),  # type: ignore[arg-type]
    )
    [choice] = completion.choices
    assert choice.finish_reason == "length"  # no finite value exists: cut, not crashed
    assert choice.message.content is not None
    assert choice.message.content.startswith('{"a":{"a":')
    stream = client.chat.completions.create(
        model="sim",
        messages=[user("Recurse.")],
        response_format=json_format(schema),  # type: ignore[arg-type]
        stream=True,
    )
    finishes = [c.choices[0].finish_reason for c in stream if c.choices]
    assert finishes[-1] == "length"
    # And on the Responses API, which shares the generator.
    text = {"format": {"type": "json_schema", "name": "answer", "schema": schema}}
    response = httpx.post(
        f"{server.http_url}/v1/responses", json={"model": "sim", "input": "x", "text": text}
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "incomplete"


# --- a model that fails ------------------------------------------------------------


class _Failing:
    """A sampler that says one word, then raises."""

    async def sample(self, request: SampleRequest) -> AsyncGenerator[SampleChunk, None]:
        yield TextDelta("Hello")
        raise RuntimeError("the accelerator caught fire")


def test_a_model_that_raises_gets_the_envelope_not_a_reset(server: Any) -> None:
    server.app.state.chat.models.add(
        ModelSpec(
            name="sim-broken",
            context_window=100_000,
            max_output_tokens=1000,
            make_sampler=_Failing,
        )
    )
    body = {**GOOD, "model": "sim-broken"}
    with httpx.Client(base_url=server.http_url) as http:
        answer = http.post("/v1/chat/completions", json=body)
        assert answer.status_code == 500
        assert answer.json()["error"]["type"] == "server_error"
        assert answer.json()["error"]["code"] == "server_error"
        streamed = http.post("/v1/chat/completions", json={**body, "stream": True})
        assert streamed.status_code == 200
        records = [r for r in streamed.text.split("\n\n") if r]
        assert records[-1] == "data: [DONE]"
        assert json.loads(records[-2][6:])["error"]["code"] == "server_error"
        assert json.loads(records[0][6:])["choices"][0]["delta"]["content"] == "Hello"
        assert http.post("/v1/chat/completions", json=GOOD).status_code == 200
    with pytest.raises(openai.APIError) as failed:
        for _ in openai_client(server).chat.completions.create(**body, stream=True):  # type: ignore[call-overload]
            pass
    assert "model failed" in failed.value.message


# --- tenants ----------------------------------------------------------------------


def test_one_key_cannot_see_anothers_prompt_in_the_cache(make_server: Any) -> None:
    running = make_server(api_keys=("key-alice", "key-bob"))
    secret = [
        {"role": "system", "content": "Alice's confidential plan: " + "merger terms. " * 40},
        user("summarize"),
    ]
    alice = openai_client(running, key="key-alice")
    bob = openai_client(running, key="key-bob")
    cached = [
        cached_tokens(client.chat.completions.create(model="sim", messages=secret))
        for client in (alice, alice, bob)
    ]
    assert cached[0] == 0
    assert cached[1] > 0  # the owner's own cache works
    assert cached[2] == 0  # but nobody else's


def cached_tokens(completion: Any) -> int:
    assert completion.usage is not None
    assert completion.usage.prompt_tokens_details is not None
    count: int = completion.usage.prompt_tokens_details.cached_tokens
    return count


# --- slow readers -----------------------------------------------------------------


def test_a_stalled_reader_of_a_stream_that_fits_the_queue_is_dropped(
    make_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rest of the stream fits the queue whenever it is shorter than the
    # socket buffers plus the queue; a queue deeper than the whole stream
    # makes that so on any machine (the server runs in this process).
    monkeypatch.setattr("longresponse.serve.chat.SSE_QUEUE_DEPTH", 1 << 20)
    running = make_server(slow_reader_timeout=0.5)
    chat = running.app.state.chat
    body = json.dumps({**GOOD, "stream": True, "metadata": {"sim_output_tokens": "50000"}}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    with sock:
        sock.connect(("127.0.0.1", running.port))
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        wait_for(lambda: chat.requests == 1, "the request")
        # Never reading: the whole answer is generated, but its reader never
        # takes it, so the connection is dropped within the timeout.
        wait_for(lambda: chat.running == 0 and chat.stopped == 1, "the reader's drop", 20)
        received = b""
        try:
            while chunk := sock.recv(1 << 20):
                received += chunk
        except ConnectionResetError:
            pass
    assert received.startswith(b"HTTP/1.1 200")
    assert b"data: [DONE]" not in received


# --- params ---------------------------------------------------------------------------


def test_a_bad_json_schema_name_names_the_chat_param(server: Any) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "no spaces", "schema": TOOL_PARAMS}}
    answer = httpx.post(
        f"{server.http_url}/v1/chat/completions", json={**GOOD, "response_format": bad}
    )
    refused(answer, "invalid_value", "response_format.json_schema.name")
    assert "response_format.json_schema.name" in answer.json()["error"]["message"]
