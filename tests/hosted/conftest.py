"""Fixtures of the hosted-tool tests: a real MCP server on loopback (both
transports) and one longresponse server allowed to call it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from longresponse.config import McpLimits, ServerConfig
from tests.conftest import RunningServer
from tests.support.mcp_server import LoopbackMcp, loopback_mcp

#: The limits the shared server runs with: loopback allowed, short timeouts.
LIMITS = McpLimits(
    allowed_hosts=frozenset({"127.0.0.1"}),
    connect_timeout=2.0,
    call_timeout=1.0,
    max_output_bytes=100_000,
)


@pytest.fixture(scope="session")
def mcp_server() -> Iterator[LoopbackMcp]:
    with loopback_mcp() as running:
        yield running


@pytest.fixture(scope="session")
def hosted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    store = tmp_path_factory.mktemp("hosted") / "responses.db"
    config = dataclasses.replace(ServerConfig(port=0), store=f"sqlite:///{store}", mcp=LIMITS)
    running = RunningServer(config).start()
    yield running
    running.stop()


def mcp_tool(url: str, **fields: Any) -> dict[str, Any]:
    """An ``mcp`` tool naming the loopback server as ``loop``."""
    return {"type": "mcp", "server_label": "loop", "server_url": url, **fields}
