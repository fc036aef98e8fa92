"""Hosted tools the server runs itself: the ``mcp`` tool's client (``servers``)."""

from .servers import McpLimits, McpServers, check_mcp_tools, load_sdk, redact_mcp_tools

__all__ = ["McpLimits", "McpServers", "check_mcp_tools", "load_sdk", "redact_mcp_tools"]
