"""The hosted mcp tool over the shipped shapes with the official SDK: HTTP SSE
(the events as streamed), the shipped WebSocket with previous_response_id; the
allow-list, connectors, and the secrets that go to the MCP server only."""

from __future__ import annotations

import json
import logging
import pathlib
from typing import Any

import openai
import pytest

from tests.conftest import RunningServer, openai_client
from tests.hosted.conftest import mcp_tool
from tests.support.mcp_server import SEEN_HEADERS, LoopbackMcp


def test_streamed_events_over_sse(hosted_server: RunningServer, mcp_server: LoopbackMcp) -> None:
    client = openai_client(hosted_server)
    tool = mcp_tool(mcp_server.http_url, allowed_tools=["add"], require_approval="never")
    with client.responses.stream(model="sim", input="add", tools=[tool]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    expected = [
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
    ]
    positions = [kinds.index(kind) for kind in expected]
    assert positions == sorted(positions), kinds
    done = next(event for event in events if event.type == "response.mcp_call_arguments.done")
    call = final.output[1]
    assert call.type == "mcp_call"
    assert done.arguments == call.arguments
    deltas = "".join(e.delta for e in events if e.type == "response.mcp_call_arguments.delta")
    assert deltas == call.arguments
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_shipped_websocket_approval_and_no_second_listing(
    hosted_server: RunningServer, mcp_server: LoopbackMcp
) -> None:
    client = openai_client(hosted_server)
    tool = mcp_tool(mcp_server.sse_url, allowed_tools=["shout"], require_approval="always")
    with client.responses.connect() as conn:
        conn.response.create(model="sim", input="shout", tools=[tool])
        while (event := conn.recv()).type != "response.completed":
            assert event.type != "error", event
        first = event.response
        assert [item.type for item in first.output] == ["mcp_list_tools", "mcp_approval_request"]
        request = first.output[1]
        conn.response.create(
            model="sim",
            previous_response_id=first.id,
            tools=[tool],
            input=[
                {
                    "type": "mcp_approval_response",
                    "approval_request_id": request.id,
                    "approve": True,
                }
            ],
        )
        kinds: list[str] = []
        while (event := conn.recv()).type != "response.completed":
            assert event.type != "error", event
            kinds.append(event.type)
    second = event.response
    # The continuation carries the listing: it is not listed again.
    assert "response.mcp_list_tools.in_progress" not in kinds
    assert [item.type for item in second.output] == ["mcp_call", "message"]
    assert second.output[0].output == json.loads(request.arguments)["text"].upper()


def test_a_host_not_allowed_is_refused(hosted_server: RunningServer) -> None:
    client = openai_client(hosted_server)
    for url in ("http://10.0.0.1/mcp", "http://localhost:1/mcp"):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="sim", input="x", tools=[mcp_tool(url)])
        error = refused.value.body
        assert error["code"] == "invalid_value", error
        assert error["param"] == "tools[0].server_url"
        assert "--mcp-allow-host" in error["message"]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model="sim",
            input="x",
            tools=[{"type": "mcp", "server_label": "gmail", "connector_id": "connector_gmail"}],
        )
    assert refused.value.body["code"] == "unsupported_parameter"
    assert refused.value.body["param"] == "tools[0].connector_id"


def test_the_default_allows_no_host(make_server: Any, mcp_server: LoopbackMcp) -> None:
    client = openai_client(make_server())
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="sim", input="x", tools=[mcp_tool(mcp_server.http_url)])
    assert refused.value.body["param"] == "tools[0].server_url"


def test_secrets_reach_the_mcp_server_only(
    hosted_server: RunningServer, mcp_server: LoopbackMcp, caplog: pytest.LogCaptureFixture
) -> None:
    token, header = "tok-4f1c9e7a-secret", "hdr-8d2b5a11-secret"
    tool = mcp_tool(
        mcp_server.http_url,
        allowed_tools=["add"],
        require_approval="never",
        authorization=token,
        headers={"X-Tenant-Key": header},
    )
    client = openai_client(hosted_server)
    SEEN_HEADERS.clear()
    with caplog.at_level(logging.DEBUG):
        response = client.responses.create(model="sim", input="add", tools=[tool], store=True)
        with client.responses.stream(model="sim", input="add", tools=[tool]) as stream:
            streamed = [event.model_dump_json(warnings=False) for event in stream]
        with client.responses.connect() as conn:
            conn.response.create(model="sim", input="add", tools=[tool])
            frames = []
            while (event := conn.recv()).type != "response.completed":
                frames.append(event.model_dump_json(warnings=False))
            frames.append(event.model_dump_json(warnings=False))
        stored = client.responses.retrieve(response.id)
        listed = client.responses.input_items.list(response.id)
    assert [item.type for item in response.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert any(seen.get("authorization") == f"Bearer {token}" for seen in SEEN_HEADERS)
    assert any(seen.get("x-tenant-key") == header for seen in SEEN_HEADERS)
    seen_by_client = [
        response.model_dump_json(warnings=False),
        stored.model_dump_json(warnings=False),
        listed.model_dump_json(warnings=False),
        *streamed,
        *frames,
    ]
    for secret in (token, header):
        assert not any(secret in text for text in seen_by_client)
        assert not any(secret in record.getMessage() for record in caplog.records)
        assert not any(secret in (record.exc_text or "") for record in caplog.records)
    echoed = response.tools[0]
    assert echoed.authorization is None
    assert echoed.headers is None
    store = pathlib.Path(hosted_server.config.store.removeprefix("sqlite:///"))
    for path in store.parent.iterdir():  # the database and its journal
        data = path.read_bytes()
        assert token.encode() not in data
        assert header.encode() not in data
