"""Faults of the hosted mcp tool: each fails its own listing or call, precisely,
and the rollout (and everyone else) goes on; the limits are flags."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import pytest
import trio

from longresponse.client import connect
from protocol.events import McpCallInProgress, OutputItemDone, ResponseDone
from tests.conftest import RunningServer, openai_client
from tests.hosted.conftest import LIMITS, mcp_tool
from tests.support.mcp_server import SLOW_CALLS, LoopbackMcp
from tests.support.waiting import wait_for, wait_until


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/mcp"  # nothing listens there now


def only_call(response: Any) -> Any:
    (call,) = [item for item in response.output if item.type == "mcp_call"]
    return call


@pytest.mark.slow  # waits out a listing timeout
@pytest.mark.parametrize("which", ["down", "garbage", "hanging"])
def test_a_server_that_cannot_list_fails_the_listing(
    hosted_server: RunningServer, mcp_server: LoopbackMcp, which: str
) -> None:
    url = {
        "down": closed_port_url(),
        "garbage": mcp_server.garbage_url,
        "hanging": mcp_server.hanging_url,
    }[which]
    client = openai_client(hosted_server)
    with client.responses.stream(model="sim", input="list", tools=[mcp_tool(url)]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.mcp_list_tools.failed" in kinds
    assert "response.mcp_list_tools.completed" not in kinds
    listing, answer = final.output
    assert listing.type == "mcp_list_tools"
    assert listing.tools == []
    assert "'loop'" in listing.error
    expected = {
        "down": "could not be reached",
        "garbage": "answered error -32700",
        "hanging": "--mcp-connect-timeout",
    }[which]
    assert expected in listing.error, listing.error
    assert final.status == "completed"
    assert answer.type == "message"


def call_of(hosted_server: RunningServer, url: str, tool_name: str, **meta: str) -> Any:
    client = openai_client(hosted_server)
    tool = mcp_tool(url, allowed_tools=[tool_name], require_approval="never")
    response = client.responses.create(model="sim", input="go", tools=[tool], metadata=meta)
    assert response.status == "completed"
    assert response.output[-1].type == "message"  # the model went on after the failure
    return only_call(response)


def test_a_tool_error_is_the_calls_error(
    hosted_server: RunningServer, mcp_server: LoopbackMcp
) -> None:
    call = call_of(hosted_server, mcp_server.http_url, "broken")
    assert call.output is None
    assert call.error.type == "mcp_tool_execution_error"
    assert call.status == "failed"


@pytest.mark.slow  # waits out an MCP timeout
def test_a_hanging_call_times_out(hosted_server: RunningServer, mcp_server: LoopbackMcp) -> None:
    call = call_of(hosted_server, mcp_server.sse_url, "slow")
    assert call.error.type == "http_error"
    assert call.error.code == 504
    assert "--mcp-call-timeout" in call.error.message


def test_an_output_too_large_fails_the_call(
    hosted_server: RunningServer, mcp_server: LoopbackMcp
) -> None:
    call = call_of(hosted_server, mcp_server.http_url, "huge")
    assert call.error.type == "mcp_protocol_error"
    assert "--mcp-max-output-bytes" in call.error.message


def test_listing_size_and_calls_per_response(make_server: Any, mcp_server: LoopbackMcp) -> None:
    import dataclasses

    small = make_server(mcp=dataclasses.replace(LIMITS, max_listing_bytes=200))
    client = openai_client(small)
    response = client.responses.create(
        model="sim", input="go", tools=[mcp_tool(mcp_server.http_url)]
    )
    assert "--mcp-max-listing-bytes" in response.output[0].error
    capped = make_server(mcp=dataclasses.replace(LIMITS, max_calls=2))
    client = openai_client(capped)
    tool = mcp_tool(mcp_server.http_url, allowed_tools=["add"], require_approval="never")
    response = client.responses.create(  # three calls in one sampling: one too many
        model="sim",
        input="go",
        tools=[tool],
        metadata={"sim_tool_calls": "5", "sim_parallel_calls": "3"},
    )
    calls = [item for item in response.output if item.type == "mcp_call"]
    assert [call.status for call in calls] == ["completed", "completed", "failed"]
    assert "--mcp-max-calls" in calls[2].error.message
    # No call can be made any more: the model answers (tool_choice none), the
    # two sim_tool_calls it still had in mind are not attempted.
    assert response.output[-1].type == "message"
    assert response.status == "completed"


@pytest.mark.slow  # waits out an MCP timeout
def test_a_hanging_call_stalls_no_one_else(make_server: Any, mcp_server: LoopbackMcp) -> None:
    import dataclasses

    # The hanging call is cut at 4 s: time enough for the other request, even
    # on a loaded machine, to be over while it still hangs.
    server = make_server(mcp=dataclasses.replace(LIMITS, call_timeout=4.0))
    slow: list[Any] = []
    waiting = threading.Thread(
        target=lambda: slow.append(call_of(server, mcp_server.http_url, "slow"))
    )
    started = len(SLOW_CALLS)
    waiting.start()
    while len(SLOW_CALLS) == started:  # the slow call is in flight
        threading.Event().wait(0.01)
    quick = call_of(server, mcp_server.http_url, "add")
    assert waiting.is_alive()  # the other call still hangs
    assert quick.output == str(sum(json.loads(quick.arguments).values()))
    waiting.join()
    assert slow[0].error.code == 504


async def slow_call_running(client: Any, tool: dict[str, Any]) -> int:
    """Create a response that calls the ``slow`` MCP tool and return once the
    MCP server runs it (``SLOW_CALLS[started:]``: that call's records)."""
    started = len(SLOW_CALLS)
    await client.create(model="sim", input="wait", tools=[tool])
    while not isinstance(await client.next_event(), McpCallInProgress):
        pass
    await wait_until(lambda: "started" in SLOW_CALLS[started:], "the MCP call to start")
    return started


async def test_cancel_and_disconnect_cancel_the_call_in_flight(
    make_server: Any, mcp_server: LoopbackMcp
) -> None:
    import dataclasses

    patient = make_server(mcp=dataclasses.replace(LIMITS, call_timeout=30.0))
    tool = mcp_tool(mcp_server.http_url, allowed_tools=["slow"], require_approval="never")
    with trio.fail_after(10):
        async with connect(patient.url) as client:
            started = await slow_call_running(client, tool)
            await client.cancel()
            events = await client.until_done()
        ended = [event for event in events if isinstance(event, ResponseDone)]
        assert [done.response.status for done in ended] == ["cancelled"]
        assert not any(isinstance(event, OutputItemDone) for event in events)
        # the MCP server saw its call cancelled
        await wait_until(lambda: "cancelled" in SLOW_CALLS[started:], "the MCP call's cancel")
        async with connect(patient.url) as client:
            started = await slow_call_running(client, tool)
        # the socket is gone: so is the call, and the session
        await wait_until(lambda: "cancelled" in SLOW_CALLS[started:], "the MCP call's cancel")
        await wait_until(lambda: not patient.live_sessions, "the session to end")


def test_an_http_client_that_hangs_up_or_cancels_ends_the_call_in_flight(
    make_server: Any, mcp_server: LoopbackMcp
) -> None:
    """Over HTTP too: an SSE reader that hangs up during a hosted call, and a
    background response cancelled by ``POST /v1/responses/{id}/cancel``
    during one, end the call at the MCP server."""
    import dataclasses

    import httpx

    patient = make_server(mcp=dataclasses.replace(LIMITS, call_timeout=30.0))
    tool = mcp_tool(mcp_server.http_url, allowed_tools=["slow"], require_approval="never")
    body = {"model": "sim", "input": "wait", "tools": [tool]}
    with httpx.Client(base_url=patient.http_url, timeout=10) as client:
        started = len(SLOW_CALLS)
        with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as stream:
            for line in stream.iter_lines():
                if "response.mcp_call.in_progress" in line:
                    break
            wait_for(lambda: "started" in SLOW_CALLS[started:], "the MCP call to start")
        # hung up: cancelled
        wait_for(lambda: "cancelled" in SLOW_CALLS[started:], "the MCP call's cancel")

        started = len(SLOW_CALLS)
        created = client.post("/v1/responses", json={**body, "background": True, "store": True})
        assert created.status_code == 200, created.text
        wait_for(lambda: "started" in SLOW_CALLS[started:], "the MCP call to start")
        cancelled = client.post(f"/v1/responses/{created.json()['id']}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        wait_for(lambda: "cancelled" in SLOW_CALLS[started:], "the MCP call's cancel")
