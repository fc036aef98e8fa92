"""Admission's costly checks run once per tool list, whoever sends it and however.

The metaschema check of the tools' ``parameters`` and of a ``text.format``
schema runs in a worker thread (``Turns.settle``), and the pipeline keeps its
verdict, a refusal too: the same list sent again over any transport (HTTP
JSON, the Chat Completions endpoint, ``/input_tokens``, the shipped
WebSocket, append mode) is not checked again. Before, the HTTP path checked
every request's tools anew (512 tools held another client's ``/healthz``
about 0.4 s each time). How long one check holds the loop is timed by
``tests/serve/test_hostile_inputs.py``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from websockets.sync.client import connect as ws_connect

from longresponse.client import connect
from protocol.events import ResponseDone
from protocol.response import FormatJSONSchema
from tests.conftest import openai_client


def tools(count: int, salt: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "name": f"{salt}_{i}",
            "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
        }
        for i in range(count)
    ]


def checked(server: Any) -> int:
    return int(server.app.parts.pipeline.counters.tool_schemas_checked)


def over_http_and_the_shipped_websocket(server: Any, listed: list[dict[str, Any]]) -> None:
    """A create with ``listed`` over HTTP JSON (httpx, then the SDK), a count, a shipped create."""
    answer = httpx.post(
        f"{server.http_url}/v1/responses",
        json={"model": "sim", "input": "hi", "tools": listed, "max_output_tokens": 8},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    client = openai_client(server)
    assert client.responses.create(model="sim", input="hi", tools=listed).status == "completed"
    counted = httpx.post(
        f"{server.http_url}/v1/responses/input_tokens",
        json={"model": "sim", "input": "hi", "tools": listed},
        timeout=30,
    )
    assert counted.status_code == 200, counted.text
    with ws_connect(server.url) as socket:
        create = {"type": "response.create", "model": "sim", "input": "hi", "tools": listed}
        socket.send(json.dumps(create))
        while json.loads(socket.recv(timeout=10))["type"] != "response.completed":
            pass


async def test_a_tool_list_is_checked_once_on_every_transport(make_server: Any) -> None:
    server = make_server()
    listed = tools(8, "once")
    before = checked(server)
    over_http_and_the_shipped_websocket(server, listed)
    assert checked(server) == before + 8  # checked by the first request only
    async with connect(server.url) as append:
        await append.create(model="sim", input="hi", tools=listed, tool_choice="none", store=False)
        done = (await append.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "completed"
    assert checked(server) == before + 8


def test_a_refused_list_is_refused_again_from_its_kept_verdict(make_server: Any) -> None:
    server = make_server()
    listed = tools(3, "bad")
    listed[2]["parameters"] = {"type": "object", "properties": {"a": {"type": "strin"}}}
    before = checked(server)
    errors = []
    for _ in range(3):
        answer = httpx.post(
            f"{server.http_url}/v1/responses",
            json={"model": "sim", "input": "hi", "tools": listed},
            timeout=30,
        )
        assert answer.status_code == 400
        errors.append(answer.json()["error"])
    assert errors[0]["code"] == "invalid_value"
    assert errors[0]["param"] == "tools[2].parameters"
    assert errors[1:] == errors[:1] * 2
    assert checked(server) == before + 3  # checked once, its three tools


def test_a_chat_format_is_checked_once(make_server: Any) -> None:
    """A chat ``response_format`` is kept as the Responses ``text.format`` it maps to."""
    server = make_server()
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(50)}}
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    }
    pipeline = server.app.parts.pipeline
    text_format = FormatJSONSchema(name="a", schema=schema)
    assert not pipeline.settled([], text_format)
    answer = httpx.post(f"{server.http_url}/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert pipeline.settled([], text_format)
