"""A turn's MCP sessions with several servers: at most ``--mcp-max-servers`` of
them, opened as needed, ended last-opened first (their anyio task groups are
nested in the turn's task)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.conftest import RunningServer, openai_client
from tests.hosted.conftest import mcp_tool
from tests.support.http_clients import post
from tests.support.mcp_server import SEEN_HEADERS, LoopbackMcp


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


def test_more_mcp_tools_than_allowed_are_refused_before_any_connection(
    hosted_server: RunningServer, mcp_server: LoopbackMcp
) -> None:
    """500 ``mcp`` tools naming one allowed server (distinct labels) are refused at
    the first one past ``--mcp-max-servers`` (16), naming it, before any MCP
    session is opened; 16 are answered (each server listed)."""
    seen = len(SEEN_HEADERS)
    tools = [
        {**mcp_tool(mcp_server.http_url, allowed_tools=["add"]), "server_label": f"s{index}"}
        for index in range(500)
    ]
    answer = post(hosted_server, {"model": "sim", "input": "go", "tools": tools})
    assert answer.status_code == 400, answer.text[:500]
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_value", "tools[16]")
    assert error["message"] == (
        "Invalid value for 'tools[16]': a request may name at most 16 mcp tools "
        "(--mcp-max-servers)."
    )
    assert len(SEEN_HEADERS) == seen  # nothing was connected to
    answer = post(hosted_server, {"model": "sim", "input": "go", "tools": tools[:16]})
    assert answer.status_code == 200, answer.text[:500]
    listings = [item for item in answer.json()["output"] if item["type"] == "mcp_list_tools"]
    assert [item.get("error") for item in listings] == [None] * 16


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"authorization": "sk-secret\r\nX-Injected: 1"}, "tools[0].authorization"),
        ({"headers": {"X-Key": "sk-secret\nX-Injected: 1"}}, "tools[0].headers"),
        ({"headers": {"X-Key": "sk-secret\x00"}}, "tools[0].headers"),
        ({"headers": {"X Key: 1\r\nX-Injected": "v"}}, "tools[0].headers"),
    ],
    ids=["authorization CR/LF", "header value LF", "header value NUL", "header name"],
)
def test_a_header_field_that_would_break_a_line_is_refused_unquoted(
    hosted_server: RunningServer, mcp_server: LoopbackMcp, fields: dict[str, Any], param: str
) -> None:
    """An ``mcp`` tool's ``authorization`` or header holding a line break would
    end its header and start one of the client's making (issue 28 found such a
    secret written whole into a dependency's debug line): refused before
    anything is connected to, the secret quoted nowhere."""
    seen = len(SEEN_HEADERS)
    tool = mcp_tool(mcp_server.http_url, allowed_tools=["add"], **fields)
    answer = post(hosted_server, {"model": "sim", "input": "go", "tools": [tool]})
    assert answer.status_code == 400, answer.text[:500]
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_value", param)
    assert "secret" not in answer.text
    assert "Injected" not in answer.text
    assert len(SEEN_HEADERS) == seen


@pytest.mark.slow  # waits out the MCP connect timeout
def test_a_tenants_server_writes_nothing_of_its_own_into_the_log(
    hosted_server: RunningServer, mcp_server: LoopbackMcp, caplog: pytest.LogCaptureFixture
) -> None:
    """An SSE server whose ``endpoint`` event names another origin: the MCP SDK
    refuses it and logs the URL (the tenant's text) at ERROR with a traceback.
    The listing fails, saying so in the server's own words, and the log has
    nothing of the tenant's text."""
    caplog.set_level(logging.INFO)
    tool = {**mcp_tool(mcp_server.elsewhere_url), "server_label": "elsewhere"}
    answer = post(hosted_server, {"model": "sim", "input": "go", "tools": [tool]})
    assert answer.status_code == 200, answer.text[:500]
    (listing,) = [item for item in answer.json()["output"] if item["type"] == "mcp_list_tools"]
    assert listing["error"].startswith("MCP server 'elsewhere' ")
    assert "ELSEWHERE" not in listing["error"]
    assert not [r for r in caplog.records if "ELSEWHERE" in r.getMessage() or r.exc_info]
    assert "ELSEWHERE" not in caplog.text
