"""What the engine asks of the hosted ``mcp`` tool: the interface, not the client.

Theory of operation
-------------------
A Response's ``mcp`` tools name MCP servers the *server* calls, in the middle
of a model turn, so the rollout does not pause for them. The engine knows
only :class:`McpHost`, given to a rollout for its turn by the serve layer
(``Rollout.attach``), which holds the tools' connection details (and their
secrets: ``authorization`` and ``headers`` never reach the engine, a
Response, a log line or the store). The client that speaks MCP is
``longresponse.hosted``.

The rollout (``engine/rollout.py``) drives it: before the model samples it
lists every server whose listing the context does not carry yet
(:func:`unlisted`), and runs the calls an ``mcp_approval_response`` approves
(:func:`approved_requests`); while the model samples, a call of an MCP tool
runs when its arguments are complete, unless :meth:`McpHost.needs_approval`
says the client must approve it first (an ``mcp_approval_request`` item, a
pause in append mode). A host that fails raises :class:`McpFailure`, whose
``error`` is the item's ``error`` as shipped; it never stalls the rollout
beyond the host's own timeouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from protocol.items import (
    Item,
    McpApprovalRequest,
    McpApprovalResponse,
    McpListedTool,
    McpListTools,
)

__all__ = ["McpFailure", "McpHost", "approved_requests", "listed_read_only", "unlisted"]


class McpFailure(Exception):
    """A listing or a call failed. ``error`` is what an ``mcp_call`` item carries
    (``{"type": "mcp_protocol_error" | "http_error", "code", "message"}`` or
    ``{"type": "mcp_tool_execution_error", "content"}``); ``str()`` is the
    message an ``mcp_list_tools`` item carries. Neither holds a secret."""

    def __init__(self, message: str, *, kind: str = "mcp_protocol_error", code: int = -32000):
        super().__init__(message)
        self.message = message
        self.error: dict[str, Any] = (
            {"type": kind, "content": [{"type": "text", "text": message}]}
            if kind == "mcp_tool_execution_error"
            else {"type": kind, "code": code, "message": message}
        )


class McpHost(Protocol):
    """The MCP servers of one Response's ``mcp`` tools, as the engine uses them."""

    def labels(self) -> Sequence[str]:
        """The ``server_label`` of every ``mcp`` tool of the request, in order."""
        ...

    def needs_approval(self, server_label: str, name: str, *, read_only: bool = False) -> bool:
        """Whether a call of ``name`` waits for the client's approval
        (``require_approval``); ``read_only``: its listing says ``readOnlyHint``."""
        ...

    def can_call(self) -> bool:
        """Whether another call may be made in this Response (``--mcp-max-calls``);
        when not, the model samples on with ``tool_choice: none`` and answers."""
        ...

    async def list_tools(self, server_label: str) -> list[McpListedTool]:
        """The server's tools, ``allowed_tools`` applied. Raises :class:`McpFailure`."""
        ...

    async def call(self, server_label: str, name: str, arguments: str) -> str:
        """Run one call; its output as text. Raises :class:`McpFailure`."""
        ...

    async def aclose(self) -> None:
        """The turn is over: end what the listings and calls kept open for it."""
        ...


def unlisted(host: McpHost, context: Sequence[Item]) -> list[str]:
    """The servers to list before the model samples: those with no successful
    ``mcp_list_tools`` item in ``context`` (a continuation that carries the
    earlier listing does not list again)."""
    listed = {
        item.server_label
        for item in context
        if isinstance(item, McpListTools) and not isinstance(item.error, str)
    }
    return [label for label in host.labels() if label not in listed]


def approved_requests(
    context: Sequence[Item], answers: Sequence[Item]
) -> list[tuple[McpApprovalRequest, McpApprovalResponse]]:
    """The approval requests in ``context`` that ``answers`` approve, in order."""
    requests = {item.id: item for item in context if isinstance(item, McpApprovalRequest)}
    approved: list[tuple[McpApprovalRequest, McpApprovalResponse]] = []
    for item in answers:
        if isinstance(item, McpApprovalResponse) and item.approve:
            request = requests.get(item.approval_request_id)
            if request is not None:
                approved.append((request, item))
    return approved


def listed_read_only(context: Sequence[Item], server_label: str, name: str) -> bool:
    """Whether the latest listing of ``server_label`` in ``context`` marks the tool
    ``name`` read-only (its MCP ``readOnlyHint`` annotation)."""
    for item in reversed(context):
        if isinstance(item, McpListTools) and item.server_label == server_label:
            for tool in item.tools:
                if tool.name == name and isinstance(tool.annotations, dict):
                    return tool.annotations.get("readOnlyHint") is True
            return False
    return False
