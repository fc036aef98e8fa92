"""The hosted mcp tool over HTTP (JSON and SSE), driven by the official SDK
against a real MCP server on loopback."""

from __future__ import annotations

import json

import openai
import pytest

from tests.conftest import RunningServer, openai_client
from tests.hosted.conftest import mcp_tool
from tests.support.mcp_server import LoopbackMcp


def test_listing_and_a_call_in_one_response(
    hosted_server: RunningServer, mcp_server: LoopbackMcp
) -> None:
    client = openai_client(hosted_server)
    tool = mcp_tool(mcp_server.http_url, allowed_tools=["add"], require_approval="never")
    response = client.responses.create(model="sim", input="add two numbers", tools=[tool])
    kinds = [item.type for item in response.output]
    assert kinds == ["mcp_list_tools", "mcp_call", "message"], kinds
    listing, call, answer = response.output
    assert [t.name for t in listing.tools] == ["add"]
    assert call.error is None
    args = json.loads(call.arguments)
    assert call.output == str(args["a"] + args["b"])
    assert call.output in answer.content[0].text


def test_approval_both_ways_over_http(
    hosted_server: RunningServer, mcp_server: LoopbackMcp
) -> None:
    client = openai_client(hosted_server)
    tool = mcp_tool(mcp_server.http_url, allowed_tools=["shout"])  # approval by default
    first = client.responses.create(model="sim", input="shout", tools=[tool])
    assert [item.type for item in first.output] == ["mcp_list_tools", "mcp_approval_request"]
    request = first.output[1]
    assert request.name == "shout"
    approved = client.responses.create(
        model="sim",
        previous_response_id=first.id,
        tools=[tool],
        input=[
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
        ],
    )
    kinds = [item.type for item in approved.output]
    assert kinds == ["mcp_call", "message"], kinds
    call = approved.output[0]
    assert call.approval_request_id == request.id
    text = json.loads(request.arguments)["text"]
    assert call.output == text.upper()
    with pytest.raises(openai.BadRequestError) as refused:  # no such request waits
        client.responses.create(
            model="sim",
            previous_response_id=first.id,
            tools=[tool],
            input=[
                {"type": "mcp_approval_response", "approval_request_id": "mcpr_x", "approve": True}
            ],
        )
    assert refused.value.body["code"] == "unknown_call_id"
    assert refused.value.body["param"] == "input[0].approval_request_id"
    denied = client.responses.create(
        model="sim",
        previous_response_id=first.id,
        tools=[tool],
        input=[
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": False}
        ],
    )
    assert [item.type for item in denied.output] == ["message"]
    assert "not approved" in denied.output[0].content[0].text


def test_tool_choice_names_an_mcp_tool(
    hosted_server: RunningServer, mcp_server: LoopbackMcp
) -> None:
    client = openai_client(hosted_server)
    tool = mcp_tool(mcp_server.http_url, allowed_tools=["add", "shout"], require_approval="never")
    for name in ("shout", "add"):
        response = client.responses.create(
            model="sim",
            input="go",
            tools=[tool],
            tool_choice={"type": "mcp", "server_label": "loop", "name": name},
        )
        calls = [item for item in response.output if item.type == "mcp_call"]
        assert calls
        assert calls[0].name == name


def test_require_approval_filters_by_name_and_read_only(
    hosted_server: RunningServer, mcp_server: LoopbackMcp
) -> None:
    client = openai_client(hosted_server)
    policies: list[tuple[object, dict[str, str]]] = [
        ({"never": {"read_only": True}}, {"shout": "mcp_call", "add": "mcp_approval_request"}),
        ({"never": {"tool_names": ["add"]}}, {"shout": "mcp_approval_request", "add": "mcp_call"}),
        (
            {"always": {"tool_names": ["add"]}, "never": {"tool_names": ["shout"]}},
            {"shout": "mcp_call", "add": "mcp_approval_request"},
        ),
    ]
    for policy, expected in policies:
        for name, kind in expected.items():
            tool = mcp_tool(mcp_server.http_url, allowed_tools=[name], require_approval=policy)
            response = client.responses.create(model="sim", input="go", tools=[tool])
            listing = response.output[0]
            if name == "shout":
                assert listing.tools[0].annotations == {"readOnlyHint": True}
            assert response.output[1].type == kind, (policy, name)


def test_tools_beside_an_mcp_tool_with_secrets_are_checked_once(
    hosted_server: RunningServer, mcp_server: LoopbackMcp
) -> None:
    """The off-loop check settles the tools admission checks (the ``mcp`` tool
    without its secrets): admission finds their verdict and checks nothing again."""
    pipeline = hosted_server.app.parts.pipeline
    tools = [
        mcp_tool(mcp_server.http_url, allowed_tools=["add"], authorization="token-xyz"),
        {"type": "function", "name": "checked_once", "parameters": {"type": "object"}},
    ]
    before = pipeline.counters.tool_schemas_checked
    response = openai_client(hosted_server).responses.create(
        model="sim", input="add two numbers", tools=tools, tool_choice="auto"
    )
    assert response.status == "completed"
    assert pipeline.counters.tool_schemas_checked - before == 1  # the function tool, once
