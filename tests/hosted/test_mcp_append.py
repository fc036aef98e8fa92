"""The hosted mcp tool in append mode: the trio client, one long Response; a
hosted call does not pause it, an approval request does."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from longresponse.client import connect
from protocol import LocalProtocolError
from protocol.events import (
    ErrorEvent,
    McpCallArgumentsDelta,
    McpCallArgumentsDone,
    McpCallCompleted,
    McpCallInProgress,
    McpListToolsCompleted,
    McpListToolsInProgress,
    OutputItemDone,
    ResponseDone,
)
from protocol.items import McpApprovalRequest, McpCall, McpListTools, Message, item_text
from tests.conftest import RunningServer
from tests.hosted.conftest import mcp_tool
from tests.support.mcp_server import LoopbackMcp


def done_items(events: list[Any]) -> list[Any]:
    return [event.item for event in events if isinstance(event, OutputItemDone)]


async def test_hosted_calls_run_without_a_pause(
    hosted_server: RunningServer, mcp_server: LoopbackMcp
) -> None:
    tool = mcp_tool(mcp_server.http_url, allowed_tools=["add"], require_approval="never")
    async with connect(hosted_server.url) as client:
        await client.create(
            model="sim", input="add", tools=[tool], metadata={"sim_tool_calls": "3"}
        )
        events = await client.until_done()
    dones = [event for event in events if isinstance(event, ResponseDone)]
    assert [done.response.status for done in dones] == ["completed"]  # never paused
    items = done_items(events)
    assert [type(item) for item in items] == [McpListTools, McpCall, McpCall, McpCall, Message]
    for call in items[1:4]:
        args = json.loads(call.arguments)
        assert call.output == str(args["a"] + args["b"])
        assert call.status == "completed"
    kinds = [type(event) for event in events]
    assert kinds.index(McpListToolsInProgress) < kinds.index(McpListToolsCompleted)
    first_call = kinds.index(McpCallArgumentsDelta)
    assert first_call < kinds.index(McpCallArgumentsDone) < kinds.index(McpCallInProgress)
    assert kinds.index(McpCallInProgress) < kinds.index(McpCallCompleted)
    assert [event.sequence_number for event in events] == list(range(len(events)))
    answer = item_text(items[-1].content)
    assert all(f"«{call.output}»" in answer for call in items[1:4])
    assert dones[0].response.output == items


async def test_approval_pauses_and_an_append_answers_it(
    hosted_server: RunningServer, mcp_server: LoopbackMcp
) -> None:
    tool = mcp_tool(
        mcp_server.sse_url,
        allowed_tools=["shout"],
        require_approval={"always": {"tool_names": ["shout"]}},
    )
    async with connect(hosted_server.url) as client:
        await client.create(model="sim", input="shout", tools=[tool])
        first = await client.until_done()
        paused = [event for event in first if isinstance(event, ResponseDone)][-1]
        assert paused.response.status == "requires_action"
        request = done_items(first)[-1]
        assert isinstance(request, McpApprovalRequest)
        assert paused.response.required_action.call_ids == [request.id]  # type: ignore[union-attr]
        with pytest.raises(LocalProtocolError) as unknown:  # the core refuses it before sending
            await client.append(
                [
                    {
                        "type": "mcp_approval_response",
                        "approval_request_id": "mcpr_x",
                        "approve": True,
                    }
                ]
            )
        assert unknown.value.code == "unknown_call_id"
        assert unknown.value.param == "input[0].approval_request_id"
        await client.send_raw(
            json.dumps(
                {
                    "type": "response.append",
                    "input": [
                        {
                            "type": "mcp_approval_response",
                            "approval_request_id": "mcpr_x",
                            "approve": True,
                        }
                    ],
                }
            )
        )
        refused = await client.next_event()
        assert isinstance(refused, ErrorEvent)
        assert refused.error.code == "unknown_call_id"
        assert refused.error.param == "input[0].approval_request_id"
        await client.append(
            [{"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}]
        )
        rest = await client.until_done()
    ended = [event for event in rest if isinstance(event, ResponseDone)]
    assert [done.response.status for done in ended] == ["completed"]
    call, answer = done_items(rest)  # listed once, before the pause: not again
    assert isinstance(call, McpCall)
    assert call.approval_request_id == request.id
    assert call.output == json.loads(request.arguments)["text"].upper()
    assert f"«{call.output}»" in item_text(answer.content)


async def test_append_mode_echoes_no_secret(
    hosted_server: RunningServer, mcp_server: LoopbackMcp
) -> None:
    token, header = "tok-append-71c0-secret", "hdr-append-2be9-secret"
    tool = mcp_tool(
        mcp_server.http_url,
        allowed_tools=["add"],
        require_approval="never",
        authorization=token,
        headers={"X-Tenant-Key": header},
    )
    async with connect(hosted_server.url) as client:
        await client.create(model="sim", input="add", tools=[tool])
        events = await client.until_done()
    wire = b"".join(msgspec.json.encode(event) for event in events)
    assert b'"type":"mcp_call"' in wire
    assert token.encode() not in wire
    assert header.encode() not in wire
    (done,) = [event for event in events if isinstance(event, ResponseDone)]
    assert done.response.status == "completed"
    echoed = msgspec.to_builtins(done.response.tools[0])
    assert "authorization" not in echoed
    assert "headers" not in echoed


async def test_a_refused_approval_is_not_run(
    hosted_server: RunningServer, mcp_server: LoopbackMcp
) -> None:
    tool = mcp_tool(mcp_server.http_url, allowed_tools=["shout"])  # always, by default
    async with connect(hosted_server.url) as client:
        await client.create(model="sim", input="shout", tools=[tool])
        request = done_items(await client.until_done())[-1]
        assert isinstance(request, McpApprovalRequest)
        await client.append(
            [
                {
                    "type": "mcp_approval_response",
                    "approval_request_id": request.id,
                    "approve": False,
                    "reason": "not now",
                }
            ]
        )
        rest = await client.until_done()
    (answer,) = done_items(rest)  # no mcp_call: the model answers
    assert isinstance(answer, Message)
    assert f"[{request.id}] «not approved»" in item_text(answer.content)
    ended = [event for event in rest if isinstance(event, ResponseDone)]
    assert [done.response.status for done in ended] == ["completed"]
