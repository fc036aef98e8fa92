"""The default compaction summary: what a window keeps of the context it replaces.

A compaction (``engine/compaction.py``) replaces a rollout's context with its
compaction item and the summary it stands for. A model may summarize in its
own way (its :class:`~longresponse.engine.sampling.ModelSpec`'s
``summarize``); every model served here, simulated or real, uses this one,
which the engine owns: deterministic, written by no model, and keeping what a
later turn needs to answer the same request. Every user, system and developer
message, every client tool call and the head (:data:`SUMMARY_HEAD_CHARS`
characters) of every tool output; assistant messages, reasoning and earlier
compaction items are dropped. So a conversation compacted any number of
times still holds the request and the tool outputs' heads (what the
simulated model's answer quotes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from protocol.items import (
    CallOutput,
    ClientCall,
    CustomToolCallOutput,
    FunctionCallOutput,
    Item,
    Message,
    item_text,
)

__all__ = ["SUMMARY_HEAD_CHARS", "summarize"]

#: How much of each tool output's text a summary keeps.
SUMMARY_HEAD_CHARS: Final = 40


def summarize(context: Sequence[Item]) -> list[Item]:
    """The default summary of ``context`` for a compaction (see the module docstring):
    the items the window keeps, in order."""
    kept: list[Item] = []
    for item in context:
        if isinstance(item, ClientCall) or (isinstance(item, Message) and item.role != "assistant"):
            kept.append(item)
        elif isinstance(item, FunctionCallOutput | CustomToolCallOutput):
            head = item_text(item.output)[:SUMMARY_HEAD_CHARS]
            kept.append(msgspec.structs.replace(item, output=head))
        elif isinstance(item, CallOutput):
            kept.append(item)
    return kept
