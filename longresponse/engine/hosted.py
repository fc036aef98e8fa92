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

:class:`HostedCalls` is the hosted-call loop of a rollout's turn, made by
the rollout for each turn's host: before the model samples it lists every
server whose listing the context does not carry yet (:func:`unlisted`), and
runs the calls an ``mcp_approval_response`` approves
(:func:`approved_requests`); while the model samples, a call of an MCP tool
runs when its arguments are complete, unless :meth:`McpHost.needs_approval`
says the client must approve it first (an ``mcp_approval_request`` item, a
pause in append mode), and the model samples again with its output in the
same turn. Its items go out on the turn's Reply and are returned to the
rollout, which alone adds them to its context. A host that fails raises
:class:`McpFailure`, whose ``error`` is the item's ``error`` as shipped; it
never stalls the rollout beyond the host's own timeouts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from protocol.items import (
    Item,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpListedTool,
    McpListTools,
    ToolChoice,
)

from ..ids import new_id
from .reply import Reply
from .sampling import ToolCallStart
from .timing import TurnTiming

__all__ = [
    "HostedCalls",
    "McpFailure",
    "McpHost",
    "approved_requests",
    "listed_read_only",
    "unlisted",
]


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


class HostedCalls:
    """The hosted-call loop of one turn over ``host`` (see the module docstring).

    It never changes the rollout: it reads the context it is given, writes the
    calls' events to the turn's Reply, and returns the items it made.
    """

    __slots__ = ("_clock", "host", "ran")

    def __init__(self, host: McpHost, clock: Callable[[], float]) -> None:
        self.host = host
        self._clock = clock
        #: The model's last sampling ran a hosted call: it samples again at once.
        self.ran = False

    async def before_sampling(
        self, reply: Reply, context: Sequence[Item], taken: Sequence[Item]
    ) -> list[Item]:
        """Before the model samples: list the servers ``context`` has no listing of,
        and run the calls ``taken``'s approval responses approve. Their items (in
        the Response's output) are the turn's new input too; returned in order."""
        self.ran = False
        builder, sink = reply.builder, reply.sink
        items: list[Item] = []
        for label in unlisted(self.host, context):
            await sink.room()
            for event in builder.listing_open(label):
                sink.push(event)
            error: str | None = None
            try:
                tools = await self.host.list_tools(label)
            except McpFailure as exc:
                tools, error = [], exc.message
            await sink.room()
            listing, events = builder.listing_done(label, tools, error)
            for event in events:
                sink.push(event)
            items.append(listing)
        for request, answer in approved_requests(context, taken):
            call = McpCall(
                id=new_id("mcp"),
                server_label=request.server_label,
                name=request.name,
                arguments=request.arguments,
                approval_request_id=answer.approval_request_id,
                status="in_progress",
            )
            await sink.room()
            for event in builder.mcp_call_open(call):
                sink.push(event)
            items.append(await self._finish(reply, call))
        return items

    def tool_choice_again(self, choice: ToolChoice) -> ToolChoice:
        """The ``tool_choice`` of a sampling after a hosted call: ``choice``, or
        ``none`` once no more calls may be made (the model answers)."""
        return choice if self.host.can_call() else "none"

    def approval_kind(self, chunk: ToolCallStart, context: Sequence[Item]) -> ToolCallStart:
        """``chunk``, written as an approval request when it starts a call of an MCP
        tool the client must approve first (its listing in ``context`` may say it
        is read-only)."""
        if chunk.kind != "mcp":
            return chunk
        label = chunk.namespace or ""
        read_only = listed_read_only(context, label, chunk.name)
        if not self.host.needs_approval(label, chunk.name, read_only=read_only):
            return chunk
        return dataclasses.replace(chunk, kind="mcp_approval")

    async def run_written(self, reply: Reply, timing: TurnTiming) -> None:
        """Run the MCP call the model just finished writing (``reply``'s open hosted
        call); the model samples again with its output. Its time is ``timing``'s
        ``hosted``."""
        call = reply.builder.hosted_call
        assert call is not None
        started = self._clock()
        await self._finish(reply, call)
        timing.hosted += self._clock() - started
        self.ran = True

    async def _finish(self, reply: Reply, call: McpCall) -> Item:
        """Run ``call`` (its item is open) and close it with its output or error."""
        output: str | None = None
        error: dict[str, object] | None = None
        try:
            output = await self.host.call(call.server_label, call.name, call.arguments)
        except McpFailure as exc:
            error = exc.error
        await reply.sink.room()
        for event in reply.builder.mcp_call_done(output=output, error=error):
            reply.sink.push(event)
        return reply.builder.output[-1]

    async def aclose(self) -> None:
        """The turn is over: no MCP session outlives it."""
        await self.host.aclose()


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
