"""Hosted tools the server runs itself: the ``mcp`` tool's client (``servers``)."""

from .servers import (
    McpInFlight,
    McpLimits,
    McpServers,
    check_mcp_tools,
    load_sdk,
    redact_mcp_tools,
)

__all__ = [
    "McpInFlight",
    "McpLimits",
    "McpServers",
    "check_mcp_tools",
    "load_sdk",
    "redact_mcp_tools",
]
