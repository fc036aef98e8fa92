"""What a sampler is: the chunks it yields, the request it reads, a model's spec.

Every model, simulated or real (``longresponse.backends``), is a
:class:`Sampler`: it turns a :class:`SampleRequest` (the whole context, how
much of it is cached, the tools and the budget) into an async stream of
:data:`SampleChunk`: text deltas, tool-call starts, argument deltas, item
ends, whole reasoning items (a real engine's), at most one :class:`Usage` (a
real engine's own counts) and one :class:`Stop`. A :class:`ModelSpec` is a
model as the registry holds it: its limits and how to make a sampler for one
rollout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Literal, Protocol

from protocol.events import ResponseCreate
from protocol.items import FunctionTool, Item, ToolChoice
from protocol.response import TextFormat

__all__ = [
    "ArgumentsDelta",
    "ItemEnd",
    "ModelSpec",
    "ReasoningDone",
    "SampleChunk",
    "SampleRequest",
    "Sampler",
    "Stop",
    "TextDelta",
    "ToolCallStart",
    "Usage",
    "release",
]


@dataclasses.dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCallStart:
    call_id: str
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class ArgumentsDelta:
    delta: str


@dataclasses.dataclass(frozen=True, slots=True)
class ItemEnd:
    """The current output item is finished (``incomplete``: cut off by a budget)."""

    incomplete: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class ReasoningDone:
    """A real engine's reasoning (``reasoning_content``), whole: one reasoning
    item, sent when no other item is open."""

    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class Stop:
    reason: Literal["stop", "tool_calls", "max_output_tokens"]


@dataclasses.dataclass(frozen=True, slots=True)
class Usage:
    """A real engine's own token counts for the turn (sent once, before :class:`Stop`).

    The rollout bills these instead of its own estimate; the simulated
    models never send one (their counts are the server's own).
    """

    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int = 0


SampleChunk = TextDelta | ToolCallStart | ArgumentsDelta | ItemEnd | ReasoningDone | Usage | Stop


@dataclasses.dataclass(frozen=True, slots=True)
class SampleRequest:
    """What one sampling turn sees: the whole context and how much is cached."""

    context: Sequence[Item]
    tools: Sequence[FunctionTool]
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    metadata: Mapping[str, str]
    cached_tokens: int
    #: Exact, or an upper bound for a sampler with ``counts_first = False``.
    uncached_tokens: int
    #: Output tokens this turn may still write (the Response's budget left).
    max_output_tokens: int | None = None
    #: ``text.format``: plain text, or JSON.
    text_format: TextFormat | None = None
    #: The request's instructions and sampling parameters (a real engine's
    #: system message and its own temperature / top_p; the sim ignores them).
    instructions: str | None = None
    temperature: float | None = None
    top_p: float | None = None

    @classmethod
    def for_turn(
        cls,
        request: ResponseCreate,
        context: Sequence[Item],
        *,
        cached_tokens: int,
        uncached_tokens: int,
        cap: int,
        spent: int,
    ) -> SampleRequest:
        """What a turn of ``request``'s rollout over ``context`` asks of the sampler.

        Its budget is the Response's ``max_output_tokens`` (the server's
        ``cap`` if smaller) less what earlier turns ``spent``.
        """
        budget = min(request.max_output_tokens or cap, cap) - spent
        return cls(
            context=context,
            tools=request.tools,
            tool_choice=request.tool_choice,
            parallel_tool_calls=request.parallel_tool_calls,
            metadata=request.metadata,
            cached_tokens=cached_tokens,
            uncached_tokens=uncached_tokens,
            max_output_tokens=max(0, budget),
            text_format=request.text.format if request.text is not None else None,
            instructions=request.instructions,
            temperature=request.temperature,
            top_p=request.top_p,
        )


class Sampler(Protocol):
    """Writes one turn. A sampler that never reads ``SampleRequest``'s token counts
    before its first chunk may say ``counts_first = False``: its rollout then
    counts the new input after the first output, and ``uncached_tokens`` is an
    upper bound (``longresponse.engine.counting``). Without it, counts are exact."""

    def sample(self, request: SampleRequest) -> AsyncGenerator[SampleChunk, None]: ...


async def release(sampler: Sampler) -> None:
    """Its rollout is over: let ``sampler`` close what it holds for it (an upstream
    socket) if it has an ``aclose()``. A sampler used again later reopens it."""
    close = getattr(sampler, "aclose", None)
    if close is not None:
        await close()


@dataclasses.dataclass(frozen=True, slots=True)
class ModelSpec:
    """A resolved model: its limits, and how to make a sampler for one rollout."""

    name: str
    context_window: int
    max_output_tokens: int
    make_sampler: Callable[[], Sampler]
    #: Who answers: ``longresponse`` (the simulated models) or the backend kind.
    owned_by: str = "longresponse"

    def too_long(self, tokens: int) -> str:
        """The message of ``context_length_exceeded`` for a context of ``tokens``."""
        window = self.context_window
        return f"Your input is {tokens} tokens; the context window of {self.name} is {window}."
