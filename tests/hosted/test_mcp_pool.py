"""The MCP sessions share one HTTP pool and TLS context (made when the server
starts, not per session), and each session's secrets go on its own requests
only."""

from __future__ import annotations

import ssl
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.conftest import RunningServer, openai_client
from tests.hosted.conftest import mcp_tool
from tests.support.mcp_server import SEEN_HEADERS, LoopbackMcp


def create_as(client: Any, url: str, tenant: str) -> Any:
    tool = mcp_tool(
        url,
        allowed_tools=["add"],
        require_approval="never",
        authorization=f"token-{tenant}",
        headers={"x-tenant": tenant},
    )
    response = client.responses.create(model="sim", input="go", tools=[tool])
    assert [item.type for item in response.output][:2] == ["mcp_list_tools", "mcp_call"]
    return response


def test_sessions_share_one_tls_context_and_keep_their_own_headers(
    hosted_server: RunningServer, mcp_server: LoopbackMcp, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenants = ["alpha", "beta"] * 3
    # the test's own clients (a TLS context each), made before the count starts
    clients = [openai_client(hosted_server) for _ in tenants]
    made: list[ssl.SSLContext] = []
    making = ssl.SSLContext.__new__

    def counted(cls: type[ssl.SSLContext], *args: Any, **kwargs: Any) -> ssl.SSLContext:
        context = making(cls, *args, **kwargs)
        made.append(context)
        return context

    monkeypatch.setattr(ssl.SSLContext, "__new__", counted)
    seen = len(SEEN_HEADERS)
    with ThreadPoolExecutor(len(tenants)) as pool:
        responses = list(
            pool.map(
                lambda client, tenant: create_as(client, mcp_server.http_url, tenant),
                clients,
                tenants,
            )
        )
    monkeypatch.undo()
    for response in responses:
        call = response.output[1]
        assert call.error is None, call.error
    # Six creates, six MCP sessions: no TLS context made (one each before).
    assert made == []
    sent = SEEN_HEADERS[seen:]
    assert len(sent) >= 3 * len(tenants)  # a listing and a call each at least, and more
    # Every request carries its own session's secret and header, never another's
    # (the loopback server is stateless: each request names its tenant itself).
    for headers in sent:
        tenant = headers["x-tenant"]
        assert headers["authorization"] == f"Bearer token-{tenant}", headers
    assert {headers["x-tenant"] for headers in sent} == {"alpha", "beta"}
