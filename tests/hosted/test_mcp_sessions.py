"""A turn's MCP sessions with several servers: opened as needed, ended
last-opened first (their anyio task groups are nested in the turn's task)."""

from __future__ import annotations

import pytest

from tests.conftest import RunningServer, openai_client
from tests.hosted.conftest import mcp_tool
from tests.support.mcp_server import LoopbackMcp


@pytest.mark.parametrize("first", ["http", "sse"])
def test_two_mcp_servers_in_one_request(
    hosted_server: RunningServer, mcp_server: LoopbackMcp, first: str
) -> None:
    """Both are listed, the call is answered and the response completes (ending
    the first-opened session first cancelled the turn itself: a 499)."""
    url = mcp_server.http_url if first == "http" else mcp_server.sse_url
    tools = [
        {**mcp_tool(url, allowed_tools=["add"], require_approval="never"), "server_label": "one"},
        {**mcp_tool(mcp_server.http_url, allowed_tools=["add"]), "server_label": "two"},
    ]
    client = openai_client(hosted_server)
    response = client.responses.create(model="sim", input="go", tools=tools)
    assert response.status == "completed"
    listings = [item for item in response.output if item.type == "mcp_list_tools"]
    assert [(item.server_label, item.error) for item in listings] == [("one", None), ("two", None)]
    calls = [item for item in response.output if item.type == "mcp_call"]
    assert [(call.server_label, call.error) for call in calls] == [("one", None)]
    assert response.output[-1].type == "message"
