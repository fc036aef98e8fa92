"""The event stream of a response: where its events go, and how they are built.

:class:`EventSink` is the engine's only view of a transport. A sink wraps a
server-role protocol ``Connection`` (a WebSocket's outbox, an SSE stream, or
an HTTP JSON request that keeps only the final Response), so every event the
engine produces is checked and recorded by the protocol core; the protocol's
record of a response (its ``ResponseTrack``: state, pending calls, next
``sequence_number``) is the only one, and the engine reads it from the sink.

:class:`StreamBuilder` turns sampler chunks into one response's ordered
events. It numbers them from the track's ``next_sequence`` (so in append mode
numbering keeps counting across pauses), counts ``output_index`` and keeps
the finished output items. It does no I/O: the rollout sends what it returns.

An item's text is kept as :class:`ItemText`, which counts its tokens as it
grows (in slices cut where the o200k pre-tokenizer starts a new piece
anyway, so the count is the whole text's): ending an item of a million
tokens does not tokenize it all at once on the event loop.

A stream ends early in one of two ways, told apart by type:
:class:`ServerClosed` (we closed it: a slow reader, the connection's
lifetime, shutdown) and :class:`PeerGone` (the peer left or its socket
failed). Both are :class:`StreamClosed`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import msgspec

from protocol import ResponseTrack
from protocol.events import (
    CompactionCompacting,
    ContentPartAdded,
    ContentPartDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    Keepalive,
    McpCallArgumentsDelta,
    McpCallArgumentsDone,
    McpCallCompleted,
    McpCallFailed,
    McpCallInProgress,
    McpListToolsCompleted,
    McpListToolsFailed,
    McpListToolsInProgress,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    ServerEvent,
)
from protocol.items import (
    ApplyPatchCall,
    ClientCall,
    Compaction,
    ComputerCall,
    CustomToolCall,
    FunctionCall,
    Item,
    LocalShellCall,
    LocalShellExec,
    McpApprovalRequest,
    McpCall,
    McpListedTool,
    McpListTools,
    Message,
    OutputText,
    PatchOperation,
    Reasoning,
    ReasoningText,
    ShellAction,
    ShellCall,
)
from protocol.response import Response

from ..ids import new_id
from .render import encode
from .sampling import (
    ArgumentsDelta,
    ItemEnd,
    ReasoningDone,
    SampleChunk,
    Stop,
    TextDelta,
    ToolCallStart,
)

__all__ = [
    "COUNT_SLICE_CHARS",
    "EventSink",
    "ItemText",
    "PeerGone",
    "ServerClosed",
    "StreamBuilder",
    "StreamClosed",
]

#: An item's text is tokenized in slices of about this many characters.
COUNT_SLICE_CHARS: Final = 4096


class ItemText:
    """One output item's text as it streams, with its tokens counted as it goes.

    A slice is cut before a piece that starts with a space followed by a
    non-space, after a non-space: a place where the o200k pre-tokenizer
    starts a new piece, so the slices' tokens add up to the whole text's.
    """

    __slots__ = ("_last", "_pending", "_pending_chars", "_slices", "tokens")

    def __init__(self) -> None:
        self._slices: list[str] = []
        self._pending: list[str] = []
        self._pending_chars = 0
        self._last = ""
        self.tokens = 0  # of the slices cut so far

    def add(self, piece: str) -> None:
        if (
            self._pending_chars >= COUNT_SLICE_CHARS
            and piece[:1] == " "
            and not piece[1:2].isspace()
            and piece[1:2]
            and not self._last.isspace()
        ):
            cut = "".join(self._pending)
            self.tokens += len(encode(cut))
            self._slices.append(cut)
            self._pending, self._pending_chars = [], 0
        self._pending.append(piece)
        self._pending_chars += len(piece)
        self._last = piece[-1:] or self._last

    def finish(self) -> tuple[str, int]:
        """The whole text and its tokens."""
        rest = "".join(self._pending)
        return "".join([*self._slices, rest]), self.tokens + len(encode(rest))


class EventSink(Protocol):
    """Where a response's events go, through a server-role protocol ``Connection``.

    Sending is two steps so that nothing is numbered before it is sure to be
    sent: :meth:`room` waits (cancellably) until a few more events fit;
    :meth:`push` checks, records and queues one event and never waits. A
    rollout calls ``room()``, then builds its next events and pushes them with
    no ``await`` in between, so a cancellation can never leave a gap in
    ``sequence_number`` or half of one chunk's events sent.
    """

    async def room(self) -> None:
        """Wait until the sink takes more events; raise :class:`StreamClosed` if it never will."""

    def push(self, event: ServerEvent) -> None:
        """Check, record and queue ``event`` now (raises ``LocalProtocolError`` on a bug)."""

    def track(self, response_id: str) -> ResponseTrack:
        """The protocol's record of a response this sink has announced."""


class StreamClosed(Exception):
    """The stream's consumer is gone; see :class:`ServerClosed` and :class:`PeerGone`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ServerClosed(StreamClosed):
    """We closed the stream (slow reader, connection lifetime, shutdown)."""


class PeerGone(StreamClosed):
    """The peer went away: it disconnected, or writing to it failed."""


#: The id prefix of each kind of call item.
_ID_PREFIX: Final = {
    "function": "fc",
    "custom": "ctc",
    "local_shell": "lsh",
    "shell": "sh",
    "apply_patch": "apc",
    "computer": "cu",
    "mcp": "mcp",
    "mcp_approval": "mcpr",
}


def _client_call(start: ToolCallStart, item_id: str, text: str) -> ClientCall:
    """The finished call item of a kind other than ``function`` (``text`` is its
    input, or the JSON of its action / operation)."""
    kind, call_id = start.kind, start.call_id
    namespace = start.namespace if start.namespace is not None else msgspec.UNSET
    if kind == "custom":
        return CustomToolCall(
            id=item_id,
            call_id=call_id,
            name=start.name,
            input=text,
            namespace=namespace,
            status="completed",
        )
    if kind == "local_shell":
        action = msgspec.json.decode(text, type=LocalShellExec)
        return LocalShellCall(id=item_id, call_id=call_id, action=action, status="completed")
    if kind == "shell":
        commands = msgspec.json.decode(text, type=ShellAction)
        return ShellCall(id=item_id, call_id=call_id, action=commands, status="completed")
    if kind == "apply_patch":
        operation = msgspec.json.decode(text, type=PatchOperation)
        return ApplyPatchCall(id=item_id, call_id=call_id, operation=operation, status="completed")
    step = msgspec.json.decode(text, type=dict[str, Any])
    return ComputerCall(id=item_id, call_id=call_id, action=step, status="completed")


class StreamBuilder:
    """Turns one response's sampler chunks into its ordered stream events."""

    def __init__(self, response_id: str, *, tag_response_id: bool, stream_id: str | None = None):
        self.response_id = response_id
        #: The protocol's record of the response, once ``response.created`` is out.
        self.track: ResponseTrack | None = None
        self._batch = 0  # events built since the track last counted
        self._first = 0  # the stream's first number (a response taken up goes on)
        self.output: list[Item] = []
        self.output_tokens = 0
        self._extra: dict[str, Any] = {}
        if tag_response_id:
            self._extra["response_id"] = response_id
        if stream_id is not None:
            self._extra["stream_id"] = stream_id
        self._lifecycle_extra = {"stream_id": stream_id} if stream_id is not None else {}
        self._kind: str | None = None  # "message" | "call" while an item is open
        self._item_id = ""
        self._call: ToolCallStart | None = None
        self._hosted: McpCall | None = None  # an MCP call being run
        self._text = ItemText()

    @property
    def item_open(self) -> bool:
        """An output item is being written (its ``done`` events are still to come)."""
        return self._kind is not None

    @property
    def next_sequence(self) -> int:
        """The number the next event takes once every event built so far is pushed
        (as each batch must be before the next is built): the track counts what
        was pushed, so a batch pushed is not counted twice."""
        if self.track is not None:
            return self.track.next_sequence
        return self._first + self._batch

    def _next(self) -> int:
        counted = self.track.next_sequence if self.track is not None else self._first
        sequence = counted + self._batch
        self._batch += 1
        return sequence

    def restore(self, output: Sequence[Item], output_tokens: int, first: int) -> None:
        """Go on from a checkpoint: ``output`` so far, ``output_tokens`` of it, the
        next event (the first of this stream, before the protocol's track opens) ``first``."""
        self.output = list(output)
        self.output_tokens = output_tokens
        self._first = first

    def lifecycle(self, cls: Callable[..., ServerEvent], response: Response) -> ServerEvent:
        """One lifecycle event; push it before building the next."""
        self._batch = 0
        return cls(sequence_number=self._next(), response=response, **self._lifecycle_extra)

    def keepalive(self) -> ServerEvent:
        """A ``keepalive`` event at the response's next number; push it at once."""
        self._batch = 0
        return Keepalive(sequence_number=self._next(), **self._extra)

    def feed(self, chunk: SampleChunk) -> list[ServerEvent]:
        """The events ``chunk`` produces (possibly none); push them all before the next call."""
        self._batch = 0
        index = len(self.output)
        extra = self._extra
        if isinstance(chunk, TextDelta):
            events: list[ServerEvent] = []
            if self._kind is None:
                self._kind, self._item_id, self._text = "message", new_id("msg"), ItemText()
                item = Message(role="assistant", content=[], id=self._item_id, status="in_progress")
                events.append(
                    OutputItemAdded(
                        sequence_number=self._next(), output_index=index, item=item, **extra
                    )
                )
                events.append(
                    ContentPartAdded(
                        sequence_number=self._next(),
                        item_id=self._item_id,
                        output_index=index,
                        content_index=0,
                        part=OutputText(text="", annotations=[], logprobs=[]),
                        **extra,
                    )
                )
            self._text.add(chunk.text)
            events.append(
                OutputTextDelta(
                    sequence_number=self._next(),
                    item_id=self._item_id,
                    output_index=index,
                    content_index=0,
                    delta=chunk.text,
                    **extra,
                )
            )
            return events
        if isinstance(chunk, ToolCallStart):
            self._kind, self._item_id, self._call = "call", new_id(_ID_PREFIX[chunk.kind]), chunk
            self._text = ItemText()
            if chunk.kind == "mcp":
                opened = McpCall(
                    id=self._item_id,
                    server_label=chunk.namespace or "",
                    name=chunk.name,
                    arguments="",
                    status="in_progress",
                )
                return [
                    OutputItemAdded(
                        sequence_number=self._next(), output_index=index, item=opened, **extra
                    )
                ]
            if chunk.kind != "function":
                return []  # added with its whole input when it ends (no delta events)
            call = FunctionCall(
                namespace=chunk.namespace if chunk.namespace is not None else msgspec.UNSET,
                id=self._item_id,
                call_id=chunk.call_id,
                name=chunk.name,
                arguments="",
                status="in_progress",
            )
            return [
                OutputItemAdded(
                    sequence_number=self._next(), output_index=index, item=call, **extra
                )
            ]
        if isinstance(chunk, ArgumentsDelta):
            self._text.add(chunk.delta)
            if self._call is not None and self._call.kind == "mcp":
                return [
                    McpCallArgumentsDelta(
                        sequence_number=self._next(),
                        item_id=self._item_id,
                        output_index=index,
                        delta=chunk.delta,
                        **extra,
                    )
                ]
            if self._call is not None and self._call.kind != "function":
                return []
            return [
                FunctionCallArgumentsDelta(
                    sequence_number=self._next(),
                    item_id=self._item_id,
                    output_index=index,
                    delta=chunk.delta,
                    **extra,
                )
            ]
        if isinstance(chunk, ItemEnd):
            return self._end_item(index, incomplete=chunk.incomplete)
        if isinstance(chunk, Stop):
            return self._end_item(index) if self._kind is not None else []
        if isinstance(chunk, ReasoningDone):
            return self._reasoning(index, chunk.text)
        raise TypeError(f"unknown sampler chunk {chunk!r}")  # pragma: no cover

    def compaction(self, item: Compaction) -> list[ServerEvent]:
        """The events of a compaction item (its ``added`` carries no content yet);
        push them all before building more. The summary is not sampled output:
        it is not charged to ``max_output_tokens`` nor reported as
        ``output_tokens`` (the next turn reads it, as input)."""
        self._batch = 0
        index, extra = len(self.output), self._extra
        assert isinstance(item.id, str)  # the server names the items it makes
        opened = msgspec.structs.replace(item, encrypted_content="")
        self.output.append(item)
        return [
            OutputItemAdded(sequence_number=self._next(), output_index=index, item=opened, **extra),
            CompactionCompacting(
                sequence_number=self._next(), item_id=item.id, output_index=index, **extra
            ),
            OutputItemDone(sequence_number=self._next(), output_index=index, item=item, **extra),
        ]

    def _reasoning(self, index: int, text: str) -> list[ServerEvent]:
        """A real engine's reasoning as one item, added and done (no item is open)."""
        extra, item_id = self._extra, new_id("rs")
        opened = Reasoning(id=item_id, content=[], status="in_progress")
        item = Reasoning(id=item_id, content=[ReasoningText(text=text)], status="completed")
        self.output.append(item)
        self.output_tokens += len(encode(text))
        return [
            OutputItemAdded(sequence_number=self._next(), output_index=index, item=opened, **extra),
            OutputItemDone(sequence_number=self._next(), output_index=index, item=item, **extra),
        ]

    def _end_item(self, index: int, *, incomplete: bool = False) -> list[ServerEvent]:
        extra = self._extra
        text, tokens = self._text.finish()
        self.output_tokens += tokens
        events: list[ServerEvent]
        if self._kind == "message":
            part = OutputText(text=text, annotations=[], logprobs=[])
            item: Item = Message(
                role="assistant",
                content=[part],
                id=self._item_id,
                status="incomplete" if incomplete else "completed",
            )
            events = [
                OutputTextDone(
                    sequence_number=self._next(),
                    item_id=self._item_id,
                    output_index=index,
                    content_index=0,
                    text=text,
                    **extra,
                ),
                ContentPartDone(
                    sequence_number=self._next(),
                    item_id=self._item_id,
                    output_index=index,
                    content_index=0,
                    part=part,
                    **extra,
                ),
            ]
        elif self._kind == "call" and self._call is not None and self._call.kind == "mcp":
            return self._mcp_arguments_done(index, text, incomplete=incomplete)
        elif self._kind == "call" and self._call is not None and self._call.kind == "mcp_approval":
            item = McpApprovalRequest(
                id=self._item_id,
                server_label=self._call.namespace or "",
                name=self._call.name,
                arguments=text,
            )
            events = [
                OutputItemAdded(
                    sequence_number=self._next(), output_index=index, item=item, **extra
                )
            ]
        elif self._kind == "call" and self._call is not None and self._call.kind != "function":
            item = _client_call(self._call, self._item_id, text)
            opened = msgspec.structs.replace(item, status="in_progress")
            events = [
                OutputItemAdded(
                    sequence_number=self._next(), output_index=index, item=opened, **extra
                )
            ]
        elif self._kind == "call" and self._call is not None:
            item = FunctionCall(
                namespace=(
                    self._call.namespace if self._call.namespace is not None else msgspec.UNSET
                ),
                id=self._item_id,
                call_id=self._call.call_id,
                name=self._call.name,
                arguments=text,
                status="incomplete" if incomplete else "completed",
            )
            events = [
                FunctionCallArgumentsDone(
                    sequence_number=self._next(),
                    item_id=self._item_id,
                    output_index=index,
                    name=self._call.name,
                    arguments=text,
                    **extra,
                )
            ]
        else:
            return []
        events.append(
            OutputItemDone(sequence_number=self._next(), output_index=index, item=item, **extra)
        )
        self.output.append(item)
        self._kind, self._call, self._text = None, None, ItemText()
        return events

    # --- hosted items: the server runs them between their events ---------------

    @property
    def hosted_call(self) -> McpCall | None:
        """An MCP call whose arguments are complete, waiting for the server to
        run it (:meth:`mcp_call_done` closes it)."""
        return self._hosted if self._kind == "hosted" else None

    def _mcp_arguments_done(self, index: int, text: str, *, incomplete: bool) -> list[ServerEvent]:
        """An MCP call's arguments are complete: it runs next (still open), or,
        cut by a budget, ends ``incomplete`` without running."""
        assert self._call is not None
        extra, call = self._extra, self._call
        item = McpCall(
            id=self._item_id,
            server_label=call.namespace or "",
            name=call.name,
            arguments=text,
            status="incomplete" if incomplete else "calling",
        )
        events: list[ServerEvent] = [
            McpCallArgumentsDone(
                sequence_number=self._next(),
                item_id=self._item_id,
                output_index=index,
                arguments=text,
                **extra,
            )
        ]
        if incomplete:
            events.append(
                OutputItemDone(sequence_number=self._next(), output_index=index, item=item, **extra)
            )
            self.output.append(item)
            self._kind, self._call, self._text = None, None, ItemText()
            return events
        events.append(
            McpCallInProgress(
                sequence_number=self._next(), item_id=self._item_id, output_index=index, **extra
            )
        )
        self._kind, self._call, self._text, self._hosted = "hosted", None, ItemText(), item
        return events

    def mcp_call_open(self, item: McpCall) -> list[ServerEvent]:
        """An approved MCP call the server runs before the model samples: its
        item is added and in progress (:meth:`mcp_call_done` closes it)."""
        self._batch = 0
        index, extra = len(self.output), self._extra
        assert isinstance(item.id, str)
        self._kind, self._item_id, self._hosted = "hosted", item.id, item
        return [
            OutputItemAdded(sequence_number=self._next(), output_index=index, item=item, **extra),
            McpCallInProgress(
                sequence_number=self._next(), item_id=item.id, output_index=index, **extra
            ),
        ]

    def mcp_call_done(
        self, *, output: str | None, error: dict[str, Any] | None
    ) -> list[ServerEvent]:
        """The running MCP call ended with ``output`` or ``error``: its last events."""
        self._batch = 0
        index, extra, call = len(self.output), self._extra, self._hosted
        assert call is not None
        assert self._kind == "hosted"
        failed = error is not None
        item = msgspec.structs.replace(
            call,
            output=output if output is not None else msgspec.UNSET,
            error=error if error is not None else msgspec.UNSET,
            status="failed" if failed else "completed",
        )
        step = McpCallFailed if failed else McpCallCompleted
        self.output.append(item)
        self._kind, self._hosted = None, None
        return [
            step(sequence_number=self._next(), item_id=call.id or "", output_index=index, **extra),
            OutputItemDone(sequence_number=self._next(), output_index=index, item=item, **extra),
        ]

    def listing_open(self, server_label: str) -> list[ServerEvent]:
        """An MCP server's listing starts: its item's first events."""
        self._batch = 0
        index, extra, item_id = len(self.output), self._extra, new_id("mcpl")
        item = McpListTools(id=item_id, server_label=server_label, tools=[])
        self._kind, self._item_id = "listing", item_id
        return [
            OutputItemAdded(sequence_number=self._next(), output_index=index, item=item, **extra),
            McpListToolsInProgress(
                sequence_number=self._next(), item_id=item_id, output_index=index, **extra
            ),
        ]

    def listing_done(
        self, server_label: str, tools: list[McpListedTool], error: str | None
    ) -> tuple[McpListTools, list[ServerEvent]]:
        """The listing ended with ``tools`` (or ``error``): the item and its last events."""
        self._batch = 0
        index, extra, item_id = len(self.output), self._extra, self._item_id
        item = McpListTools(
            id=item_id,
            server_label=server_label,
            tools=tools,
            error=error if error is not None else msgspec.UNSET,
        )
        step = McpListToolsFailed if error is not None else McpListToolsCompleted
        self.output.append(item)
        self._kind = None
        return item, [
            step(sequence_number=self._next(), item_id=item_id, output_index=index, **extra),
            OutputItemDone(sequence_number=self._next(), output_index=index, item=item, **extra),
        ]
