"""MCP listings and calls in flight, per key and in all (issue 28, item 5).

A key's slow MCP server cannot hold the server's connections and tasks:
``--mcp-max-in-flight-per-key`` of one key's listings and calls run at once,
``--mcp-max-in-flight`` of everyone's; one more fails at once, before it
connects, with its limit's own error (``mcp_protocol_error`` -32001), the
Response goes on and the model answers, and another key is served. A place
is given back when its call ends (here, cancelled).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import trio

from longresponse.client import connect
from protocol.events import ResponseDone
from tests.conftest import RunningServer, openai_client
from tests.hosted.conftest import LIMITS, mcp_tool
from tests.hosted.test_mcp_faults import only_call, slow_call_running
from tests.support.mcp_server import LoopbackMcp
from tests.support.waiting import wait_until

PER_KEY_FULL = (
    "This API key has 2 MCP listings and calls running, the most allowed "
    "(--mcp-max-in-flight-per-key). Retry later."
)
SERVER_FULL = (
    "This server runs 3 MCP listings and calls, the most it runs at once "
    "(--mcp-max-in-flight). Retry later."
)


def _bearer(key: str) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {key}")]


def _create(server: RunningServer, key: str, tool: dict[str, Any], **fields: Any) -> Any:
    """A create over HTTP with the official SDK, as ``key``; completed, the model's
    answer last (whatever became of its MCP listing and call)."""
    response = openai_client(server, key=key).responses.create(
        model="sim", input="go", tools=[tool], **fields
    )
    assert response.status == "completed"
    assert response.output[-1].type == "message"
    return response


def _listing_error(response: Any) -> str | None:
    listing = response.output[0]
    assert listing.type == "mcp_list_tools"
    return listing.error


async def _cancelled(client: Any) -> None:
    await client.cancel()
    ended = [e for e in await client.until_done() if isinstance(e, ResponseDone)]
    assert [done.response.status for done in ended] == ["cancelled"]


async def test_mcp_calls_in_flight_are_limited_per_key_and_in_all(
    make_server: Any, mcp_server: LoopbackMcp
) -> None:
    limits = dataclasses.replace(
        LIMITS, call_timeout=30.0, max_in_flight_per_key=2, max_in_flight=3
    )
    server = make_server(api_keys=("key-a", "key-b"), mcp=limits)
    in_flight = server.app.parts.turns.mcp_in_flight
    slow = mcp_tool(mcp_server.http_url, allowed_tools=["slow"], require_approval="never")
    add = mcp_tool(mcp_server.http_url, allowed_tools=["add"], require_approval="never")

    def create(key: str, **fields: Any) -> Any:
        return trio.to_thread.run_sync(lambda: _create(server, key, add, **fields))

    with trio.fail_after(30):
        # keyA's earlier Response, whose listing a continuation carries.
        earlier = await create("key-a", store=True)
        assert only_call(earlier).error is None
        async with connect(server.url, headers=_bearer("key-a")) as a1, connect(
            server.url, headers=_bearer("key-a")
        ) as a2:
            await slow_call_running(a1, slow)
            await slow_call_running(a2, slow)
            # keyA's next listing fails at once, precisely; its Response goes on.
            refused = await create("key-a")
            assert _listing_error(refused) == PER_KEY_FULL
            # A continuation that needs no listing: its call fails the same way.
            continued = await create("key-a", previous_response_id=earlier.id)
            assert continued.output[0].type == "mcp_call"
            call = only_call(continued)
            assert call.output is None
            assert call.error.type == "mcp_protocol_error"
            assert call.error.code == -32001
            assert call.error.message == PER_KEY_FULL
            # Another key is listed and its call answered.
            served = only_call(await create("key-b"))
            assert served.output == str(sum(json.loads(served.arguments).values()))
            # keyB's own slow call makes three in all: the server is full, for keyB too.
            async with connect(server.url, headers=_bearer("key-b")) as b1:
                await slow_call_running(b1, slow)
                assert in_flight.running == 3
                assert _listing_error(await create("key-b")) == SERVER_FULL
                await _cancelled(b1)
            # Its place given back, keyB is served again; keyA is still at its own limit.
            await wait_until(lambda: in_flight.running == 2, "keyB's place given back")
            assert only_call(await create("key-b")).error is None
            assert _listing_error(await create("key-a")) == PER_KEY_FULL
            await _cancelled(a1)
            await _cancelled(a2)
        await wait_until(lambda: in_flight.running == 0, "every place given back")
        assert dict(in_flight.by_owner) == {}
        assert only_call(await create("key-a")).error is None
