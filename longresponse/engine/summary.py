"""The compaction summary: what a window keeps of the context it replaces, within a budget.

A compaction (``engine/compaction.py``) replaces a rollout's context with its
compaction item and the summary items it stands for. This module builds those
items. It is deterministic and pure; the model's own summary text, when the
model wrote one (a summary turn, ``compaction.summary_turn``), comes in as a
string.

**What is kept.** Without a budget, or while they fit it, the items are what
compaction always kept: every user, system and developer message, every
client tool call and the head (:data:`SUMMARY_HEAD_CHARS` characters) of
every tool output; assistant messages, reasoning and earlier compaction
items are dropped. So a short conversation compacted any number of times
still holds the request and the tool outputs' heads (what the simulated
model's answer quotes).

**The budget** (:func:`budget`) comes from the compaction threshold: the
window (the prefix of instructions and tools, the compaction item and its
summary items) takes at most :data:`WINDOW_SHARE` of the threshold, so at
least as much is left for turns before the next compaction, and the window
does not grow with the rollout however long it runs. Of the summary items'
budget, :data:`SUMMARY_SHARE` goes to the summary message's text.

**Past the budget**, or whenever the model wrote a summary, the window keeps
(:func:`summarize`): the request (the messages up to the first user
message, each cut to its head if they take more than half of what the
summary message leaves), one **summary message** (a user message), and the
newest calls and outputs that fit (never an output without its call). The
summary message holds the model's own text, cut to its budget, or else the
engine's deterministic one: how many tool outputs the folded part read and
the heads of the newest of them, in the words of the simulated model's
answer (:data:`READ_OUTPUTS`: ``I read N tool outputs: «…» …``), which
the simulated model counts as a summary handed back (SPEC §9). Either way it
says that the outputs after it are cut to their heads.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Sequence
from typing import Final

import msgspec

from protocol.items import (
    CallOutput,
    ClientCall,
    Compaction,
    CustomToolCallOutput,
    FunctionCallOutput,
    Item,
    Message,
    answered_call_id,
    item_text,
    output_text,
)

from .render import encode, render_item

__all__ = [
    "HANDED_BACK",
    "READ_OUTPUTS",
    "SUMMARY_HEAD_CHARS",
    "SUMMARY_INTRO",
    "SUMMARY_PROMPT",
    "SUMMARY_SHARE",
    "WINDOW_SHARE",
    "SummaryBudget",
    "budget",
    "carried_quotes",
    "fit_text",
    "quote",
    "summarize",
    "summary_prompt",
]

#: How much of each tool output's text a summary keeps.
SUMMARY_HEAD_CHARS: Final = 40
#: The share of the threshold a compacted window may take (prefix included).
WINDOW_SHARE: Final = 0.5
#: The share of the summary items' budget that the summary message's text may take.
SUMMARY_SHARE: Final = 0.5
#: How the tool outputs a summary covers are listed: the simulated model's answer's
#: words (``longresponse.backends.sim``), which it reads back as a count.
READ_OUTPUTS: Final = "I read {count} tool outputs: "
#: :data:`READ_OUTPUTS` in a text, its count as group 1.
HANDED_BACK: Final = re.compile(re.escape(READ_OUTPUTS).replace(r"\{count\}", r"(\d+)"))
#: One quoted tool output after :data:`READ_OUTPUTS` (``[call_id] «head»`` or ``«head»``).
_QUOTED: Final = re.compile(r"(?:\[[^\]\s]*\] )?«[^»]*»")
#: The summary message opens with this.
SUMMARY_INTRO: Final = "Summary of the conversation so far, written when it was compacted:"
#: The summary message ends with this when calls and outputs follow it.
_TAIL_NOTE: Final = (
    f"The calls and tool outputs after this message are the latest ones, each output cut "
    f"to its first {SUMMARY_HEAD_CHARS} characters."
)
#: What a summary turn asks the model (the last user message of its context).
SUMMARY_PROMPT: Final = (
    "Stop here and write a summary of the conversation so far, for yourself, to go on "
    "with the task from the summary alone: what the user asked, the tools you called and "
    "what they returned, what you found, and what is left to do. Keep names, numbers and "
    "results exact. Write plain text, no tool calls, at most {words} words."
)


@dataclasses.dataclass(frozen=True, slots=True)
class SummaryBudget:
    """Tokens (the server's o200k count, rendered) a window's summary may take."""

    #: The summary items together: the request, the summary message, the newest
    #: calls and outputs.
    items: int
    #: The summary message (its text and its segment).
    text: int


def budget(threshold: int, prefix: int, scale: float = 1.0) -> SummaryBudget:
    """The budget of a window compacted under ``threshold`` tokens, whose prefix
    (instructions and tools) takes ``prefix`` of ours. ``scale`` is how many
    tokens the model counts for each of ours (a real engine's own count of the
    context over ours, at least 1), so that the model's count of the window
    stays within :data:`WINDOW_SHARE` of the threshold too."""
    window = math.floor(threshold * WINDOW_SHARE / max(1.0, scale))
    items = max(0, window - prefix - _compaction_tokens())
    return SummaryBudget(items=items, text=math.floor(items * SUMMARY_SHARE))


@functools.cache
def _compaction_tokens() -> int:
    """The tokens of a compaction item's own segment (it renders no content)."""
    return len(render_item(Compaction(encrypted_content="")))


def summary_prompt(limit: SummaryBudget) -> str:
    """The instruction of a summary turn whose text may take ``limit.text`` tokens
    (in words: three words to four tokens)."""
    return SUMMARY_PROMPT.format(words=max(1, limit.text * 3 // 4))


def quote(text: str) -> str:
    """The head of a tool output as a summary and the simulated model quote it."""
    return text[:SUMMARY_HEAD_CHARS].replace("\n", " ")


def carried_quotes(text: str) -> list[str]:
    """The quoted outputs a handed-back summary lists after :data:`READ_OUTPUTS`."""
    found = HANDED_BACK.search(text)
    return _QUOTED.findall(text, found.end()) if found else []


def summarize(
    context: Sequence[Item], limit: SummaryBudget | None = None, text: str | None = None
) -> list[Item]:
    """The summary items of ``context`` for a compaction: what is kept (module
    docstring) when there is no ``limit`` or when it fits and the model wrote
    no ``text``; else the request, a summary message (``text`` cut to its
    budget, or the deterministic one) and the newest calls and outputs."""
    kept = _kept(context)
    if limit is None or (text is None and _fits(kept, limit.items)):
        return kept
    return _Folding(kept, limit).items(text)


def _kept(context: Sequence[Item]) -> list[Item]:
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


def _tokens(item: Item) -> int:
    return len(render_item(item))


def _fits(items: Sequence[Item], limit: int) -> bool:
    """``items`` render to at most ``limit`` tokens (counted until they do not)."""
    total = 0
    for item in items:
        total += _tokens(item)
        if total > limit:
            return False
    return True


def fit_text(text: str, limit: int) -> str:
    """``text`` cut after its last word that keeps it within ``limit`` tokens."""
    if len(encode(text)) <= limit:
        return text
    words = re.findall(r"\s*\S+", text)
    fits, too_many = 0, len(words)
    while too_many - fits > 1:
        middle = (fits + too_many) // 2
        if len(encode("".join(words[:middle]))) <= limit:
            fits = middle
        else:
            too_many = middle
    return "".join(words[:fits])


class _Folding:
    """The window past its budget: the request, a summary message, the newest items."""

    def __init__(self, kept: list[Item], limit: SummaryBudget) -> None:
        self.limit = limit
        first_user = next(
            (
                i
                for i, item in enumerate(kept)
                if not isinstance(item, Message) or item.role == "user"
            ),
            len(kept),
        )
        if first_user < len(kept) and isinstance(kept[first_user], Message):
            first_user += 1  # the request itself
        head, rest = kept[:first_user], kept[first_user:]
        room = max(0, limit.items - limit.text)
        if not _fits(head, room // 2):  # cut to their heads (a fixed number of them)
            head = [_cut_message(item) for item in head]
        self.head = head
        room = max(0, room - sum(map(_tokens, head)))
        self.cut = _tail_start(rest, room)
        self.folded, self.tail = rest[: self.cut], rest[self.cut :]

    def items(self, text: str | None) -> list[Item]:
        if text is None and not self.folded:
            return [*self.head, *self.tail]
        message = self._message(text)
        return [*self.head, message, *self.tail]

    def _message(self, text: str | None) -> Message:
        note = f"\n{_TAIL_NOTE}" if self.tail else ""
        overhead = _tokens(Message(role="user", content=f"{SUMMARY_INTRO}\n{note}"))
        room = max(0, self.limit.text - overhead)
        if text is not None:
            body = f"{SUMMARY_INTRO}\n{fit_text(text.strip(), room)}{note}"
        else:
            body = f"{SUMMARY_INTRO} {_listing(self.folded, room)}{note}"
        return Message(role="user", content=body)


def _cut_message(item: Item) -> Item:
    if not isinstance(item, Message):
        return item
    text = item_text(item.content)
    if len(text) <= SUMMARY_HEAD_CHARS:
        return item
    return msgspec.structs.replace(item, content=text[:SUMMARY_HEAD_CHARS] + " …")


def _tail_start(rest: Sequence[Item], room: int) -> int:
    """Where the newest items that fit ``room`` tokens start, at a point where
    every output after it has its call after it too (an engine refuses an
    output whose call it was not shown)."""
    start, total = len(rest), 0
    unanswered: set[str] = set()  # outputs seen whose call is not seen yet
    for index in range(len(rest) - 1, -1, -1):
        item = rest[index]
        total += _tokens(item)
        if total > room:
            break
        if isinstance(item, CallOutput):
            unanswered.add(answered_call_id(item))
        elif isinstance(item, ClientCall):
            unanswered.discard(str(getattr(item, "call_id", "")))
        if not unanswered:
            start = index
    return start


def _listing(folded: Sequence[Item], room: int) -> str:
    """The deterministic summary of the folded items: how many tool outputs they
    read (a summary handed back among them sets the count, as the simulated
    model counts it) and the heads of the newest that fit ``room`` tokens."""
    read = 0
    quoted: list[str] = []
    for item in folded:
        if isinstance(item, Message) and item.role == "user":
            text = item_text(item.content)
            if handed := HANDED_BACK.search(text):
                read = int(handed.group(1))
                quoted = carried_quotes(text)
        elif isinstance(item, CallOutput):
            read += 1
            quoted.append(f"«{quote(output_text(item))}»")
    head = READ_OUTPUTS.format(count=read)
    room -= len(encode(head)) + 2  # the "… " and the closing "."
    listed: list[str] = []
    for entry in reversed(quoted):
        room -= len(encode(" " + entry))
        if room < 0:
            break
        listed.append(entry)
    listed.reverse()
    skipped = "… " if len(listed) < len(quoted) else ""
    return f"{head}{skipped}{' '.join(listed)}."
