"""Checkpoints: an append-mode rollout as it stands at a pause, enough to take it up elsewhere.

Theory of operation
-------------------
An append-mode rollout whose owner gives it a checkpoint hook (the serve
layer does for ``store: true``) hands the hook a :class:`RolloutCheckpoint`
at its start and twice around every pause, and waits for it before the
client hears of the event it precedes:

- at its start, before its first ``response.in_progress``: the Response
  ``in_progress`` with no output, the create's input waiting in the inbox;
- when a turn ends in client tool calls, before ``response.done``
  (``requires_action``): the Response with its waiting calls;
- when every call has its output, before ``response.in_progress``: the
  Response ``in_progress``, the outputs waiting in the inbox.

A checkpoint holds the request, the model's name, the conversation (the
context, then the input not yet taken in), the token counts, the Response as
its lifecycle event carries it and that event's ``sequence_number``. It is
what the client was last told: a turn that was running when the rollout was
lost is run again from it. The hook answers False when another connection
took the response up since (the serve layer's store knows): the rollout then
raises :class:`TakenOver` and stops without another event, leaving the
response to its new holder.

A rollout made from a checkpoint (``Rollout.restore``) starts with
``response.resumed`` at the next number, then waits for the calls still
pending or runs its turn again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from protocol.events import ResponseCreate
from protocol.items import Item
from protocol.response import Response

__all__ = ["Checkpointing", "RolloutCheckpoint", "TakenOver"]


@dataclasses.dataclass(frozen=True, slots=True)
class RolloutCheckpoint:
    """An append-mode rollout at a pause (see the module docstring)."""

    #: The Response as its lifecycle event carries it (``requires_action`` or
    #: ``in_progress``), and that event's ``sequence_number``.
    response: Response
    sequence: int
    request: ResponseCreate
    model: str
    #: The context, then the input waiting to be taken in (``context`` of them
    #: are the context).
    items: list[Item]
    context: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    #: The model has processed the whole context: the next turn reads it as cached.
    model_seen: bool
    #: The conversation's affinity key's source (``Rollout.chain``).
    chain: str


#: The owner's hook: True once the checkpoint is durable, False when the
#: response was taken up elsewhere meanwhile.
Checkpointing = Callable[[RolloutCheckpoint], Awaitable[bool]]


class TakenOver(Exception):
    """The response was taken up from its checkpoint by another connection or
    process: this copy of the rollout stops without another event."""
