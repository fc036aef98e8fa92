"""The hosted mcp tool over HTTP (JSON and SSE), driven by the official SDK
against a real MCP server on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import openai_client
from tests.support.mcp_server import LoopbackMcp, loopback_mcp


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[LoopbackMcp]:
    with loopback_mcp() as running:
        yield running


def mcp_tool(url: str, **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "loop", "server_url": url, **fields}


def test_listing_and_a_call_in_one_response(make_server: Any, mcp_server: LoopbackMcp) -> None:
    server = make_server(mcp=_limits())
    client = openai_client(server)
    tool = mcp_tool(mcp_server.http_url, allowed_tools=["add"], require_approval="never")
    response = client.responses.create(model="sim", input="add two numbers", tools=[tool])
    kinds = [item.type for item in response.output]
    assert kinds == ["mcp_list_tools", "mcp_call", "message"], kinds
    listing, call, answer = response.output
    assert [t.name for t in listing.tools] == ["add"]
    assert call.error is None
    args = __import__("json").loads(call.arguments)
    assert call.output == str(args["a"] + args["b"])
    assert call.output in answer.content[0].text


def _limits(**fields: Any) -> Any:
    from longresponse.config import McpLimits

    return McpLimits(allowed_hosts=frozenset({"127.0.0.1"}), **fields)
