"""Continuation rules, shared by the shipped WebSocket shape and HTTP.

Theory of operation
-------------------
A ``response.create`` (or ``POST /v1/responses``) with
``previous_response_id`` continues a conversation. Where its parent is found
decides what the turn costs:

- on this connection, the latest segment of an idle rollout: the new input
  is appended and the rollout continues in place, O(new input);
- on this connection, an older segment, or one whose rollout is busy on
  another lane or broken: a fork, a new rollout sharing the context and
  tokens up to that boundary;
- not on this connection (or over HTTP, which keeps nothing): hydrated from
  the store when it was stored (``store=true``, same owner), the whole chain
  read back and rendered again; otherwise ``previous_response_not_found``.

In every case the new input must answer each pending call of the parent, and
only those (:func:`check_continuation`). A failed continuation evicts its
parent when both are on the same lane, as shipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from protocol import ErrorCode, ProtocolError, RemoteProtocolError
from protocol.codec import wire_type
from protocol.items import (
    CallOutput,
    ClientCall,
    Item,
    McpApprovalResponse,
    answered_call_id,
    call_name,
    is_approval_name,
)

from ..engine.rollout import Boundary, Rollout
from ..storage.persistence import Persistence
from ..storage.records import is_running
from .prefix_reuse import Found

__all__ = [
    "Continuation",
    "check_continuation",
    "continue_from",
    "not_finished",
    "stored_history",
]


@dataclasses.dataclass(slots=True)
class Continuation:
    """Where a turn continues from."""

    #: The rollout to run the turn on (in place or a fork); ``None``: a new one.
    rollout: Rollout | None = None
    #: The parent's rollout, whose model resolution may be reused.
    parent: Rollout | None = None
    #: What a hydrated rollout must take in before the new input.
    history: list[Item] = dataclasses.field(default_factory=list)
    #: What admission checks again when nothing is kept (the whole history).
    checked: list[Item] = dataclasses.field(default_factory=list)
    #: Whether the history's checks are kept from earlier turns.
    cached: bool = True
    forked: bool = False
    hydrated: bool = False
    #: A hydrated chain's first response id (``Rollout.join_chain``).
    chain: str = ""
    #: A new rollout's history then input begin with a conversation seen
    #: recently: what it takes in without rendering (``serve.prefix_reuse``).
    known: Found | None = None

    def begin_with(self, known: Found | None) -> None:
        """The new rollout begins with ``known`` (or with nothing known)."""
        self.known = known

    def unchecked(self, new_items: Sequence[Item]) -> list[Item]:
        """What a turn on this continuation checks (validates and classifies):
        the history when nothing is kept of it, then ``new_items``, less the
        known prefix (unless the classifier found something in it: its items
        are read again)."""
        items = [*(self.checked if not self.cached else ()), *new_items]
        known = self.known.known if self.known is not None else None
        return items[known.items :] if known is not None and known.classified else items


def check_continuation(new_items: list[Item], pending: dict[str, str]) -> None:
    """Check tool outputs against the parent's pending calls (and the new input's own calls);
    an MCP approval request (named ``mcp:...``) need not be answered.

    Raises :class:`RemoteProtocolError` (400, param ``input``/``input[i].call_id``).
    """
    open_calls = dict(pending)
    answered: set[str] = set()
    for index, item in enumerate(new_items):
        if isinstance(item, ClientCall):
            open_calls[item.call_id] = call_name(item)
        elif isinstance(item, McpApprovalResponse):
            request_id = item.approval_request_id
            named = open_calls.get(request_id, "")
            if not is_approval_name(named) or request_id in answered:
                raise RemoteProtocolError(
                    f"No MCP approval request {request_id!r} waits for an answer.",
                    code=ErrorCode.UNKNOWN_CALL_ID,
                    param=f"input[{index}].approval_request_id",
                )
            answered.add(request_id)
        elif isinstance(item, CallOutput):
            call_id = answered_call_id(item)
            if call_id not in open_calls or call_id in answered:
                raise RemoteProtocolError(
                    f"No tool call found for {wire_type(item)} with call_id "
                    f"{RemoteProtocolError.clip(call_id)!r}.",
                    code=ErrorCode.UNKNOWN_CALL_ID,
                    param=f"input[{index}].call_id",
                )
            answered.add(call_id)
    # An MCP approval request may stay unanswered (as shipped): it is no call.
    missing = [
        call_id
        for call_id, name in pending.items()
        if call_id not in answered and not is_approval_name(name)
    ]
    if missing:
        raise RemoteProtocolError(
            f"No tool output found for function call {missing[0]!r}.",
            code=ErrorCode.MISSING_TOOL_OUTPUT,
            param="input",
        )


def not_finished(parent_id: str, status: str) -> RemoteProtocolError:
    """The refusal to continue from a background response that has not ended
    (it has no output to continue from yet)."""
    return RemoteProtocolError(
        f"Previous response with id {RemoteProtocolError.clip(parent_id)!r} has not "
        f"finished (status {status}); continue from it once it has.",
        code=ErrorCode.INVALID_VALUE,
        param="previous_response_id",
    )


async def stored_history(
    persistence: Persistence | None, parent_id: str, *, owner: str, new_items: list[Item]
) -> Continuation:
    """The hydrated continuation of a stored response (the slow path).

    The chain is read back from the store; ``new_items`` must answer its last
    response's pending calls. Raises :class:`RemoteProtocolError`
    ``previous_response_not_found`` (param ``previous_response_id``),
    :func:`not_finished` for a background response that has not ended, or the
    errors of :func:`check_continuation`.
    """
    conversation = None
    if persistence is not None:
        conversation = await persistence.conversation(parent_id, owner=owner)
    if conversation is None:
        raise RemoteProtocolError(
            f"Previous response with id {RemoteProtocolError.clip(parent_id)!r} not found.",
            code=ErrorCode.PREVIOUS_RESPONSE_NOT_FOUND,
            param="previous_response_id",
        )
    if is_running(conversation.last):
        raise not_finished(parent_id, conversation.last.response.status)
    check_continuation(new_items, conversation.pending)
    history = conversation.items
    return Continuation(
        history=history, checked=history, cached=False, hydrated=True, chain=conversation.root_id
    )


async def continue_from(
    parent_id: str | None,
    new_items: list[Item],
    *,
    lookup: Callable[[str], tuple[Rollout, Boundary] | None],
    evict: Callable[[str], None],
    lane: str | None,
    persistence: Persistence | None,
    owner: str,
) -> Continuation:
    """Find where a turn with ``previous_response_id=parent_id`` continues from.

    ``lookup``/``evict`` are the connection's segment cache (HTTP has none).
    Raises :class:`RemoteProtocolError` (the rules above).
    """
    found = lookup(parent_id) if parent_id is not None else None
    if parent_id is None:
        check_continuation(new_items, {})
        return Continuation()
    if found is None:
        # Not on this connection: a stored response hydrates (the slow path:
        # the whole chain is read and rendered again).
        return await stored_history(persistence, parent_id, owner=owner, new_items=new_items)
    parent, boundary = found
    if not any(kept is boundary for kept in parent.boundaries):
        # The rollout compacted since: the context this segment ended in is
        # gone from memory, so the segment continues from the store.
        return await stored_history(persistence, parent_id, owner=owner, new_items=new_items)
    try:
        check_continuation(new_items, boundary.pending)
    except ProtocolError:
        # A failed continuation evicts its parent; a failed fork from another
        # lane leaves the shared parent alone.
        if boundary.stream_id == lane:
            evict(parent_id)
        raise
    latest = bool(parent.boundaries) and parent.boundaries[-1] is boundary
    if latest and not parent.busy and not parent.broken:
        return Continuation(rollout=parent, parent=parent, checked=parent.context)
    child = parent.fork(boundary)
    return Continuation(rollout=child, parent=parent, checked=child.context, forked=True)
