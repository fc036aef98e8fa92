"""What a sampler is: the chunks it yields, the request it reads, a model's spec.

Every model, simulated or real (``longresponse.backends``), is a
:class:`Sampler`: it turns a :class:`SampleRequest` (the whole context, how
much of it is cached, the tools and the budget) into an async stream of
:data:`SampleChunk`: text deltas, tool-call starts, argument deltas, item
ends, whole reasoning items (a real engine's), :class:`Usage` (a real
engine's own counts so far, each replacing the one before) and one
:class:`Stop`. A :class:`ModelSpec` is a
model as the registry holds it: its limits, how to make a sampler for one
rollout, how it checks a request's ``metadata`` (``check_request``) and how
it summarizes a context when it compacts (``summarize``: the engine's own
summary, :func:`~longresponse.engine.summary.summarize`, unless it says
otherwise; :data:`SUMMARY_HEAD_CHARS` is how much of a tool output it keeps,
:data:`READ_OUTPUTS` how it counts the outputs it folds away). A sampler
that says ``summarizes = True`` (a real engine's) is also asked to write the
summary's text itself when its rollout compacts: a summary turn over the
context (``engine/compaction.py``).

This module is the whole interface a backend (``longresponse.backends``,
the simulated model included) may import from the engine: besides the
types, the tokenizer every budget and count is in (:func:`encode`, the
engine's o200k) and :class:`UpstreamError`, what a sampler raises when the
engine behind it fails or refuses.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Literal, Protocol

from protocol.events import ResponseCreate
from protocol.items import Item, McpListTools, McpTool, Tool, ToolChoice
from protocol.response import TextFormat

from .render import encode
from .summary import (
    HANDED_BACK,
    READ_OUTPUTS,
    SUMMARY_HEAD_CHARS,
    SummaryBudget,
    carried_quotes,
    quote,
)
from .summary import summarize as engine_summary

__all__ = [
    "HANDED_BACK",
    "READ_OUTPUTS",
    "SUMMARY_HEAD_CHARS",
    "ArgumentsDelta",
    "CallKind",
    "ItemEnd",
    "ModelSpec",
    "ReasoningDone",
    "SampleChunk",
    "SampleRequest",
    "Sampler",
    "Stop",
    "Summarize",
    "SummaryBudget",
    "TextDelta",
    "ToolCallStart",
    "UpstreamError",
    "Usage",
    "affinity_key",
    "carried_quotes",
    "encode",
    "latest_listings",
    "quote",
    "release",
]


@dataclasses.dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


#: The kinds of client tool call a sampler may start (each its own item shape).
#: ``mcp``: a tool of an MCP server the server calls itself (hosted): ``name``
#: is the listed tool's, ``namespace`` its ``server_label``; the engine turns
#: it into ``mcp_approval`` when the client must approve it first.
CallKind = Literal[
    "function", "custom", "local_shell", "shell", "apply_patch", "computer", "mcp", "mcp_approval"
]


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A tool call begins. Its :class:`ArgumentsDelta` pieces are, by ``kind``:
    a function's JSON arguments, a custom tool's free-text input, or the JSON
    of a built-in call's ``action`` (``local_shell``, ``shell``), ``operation``
    (``apply_patch``) or ``action`` (``computer``). ``name`` is the tool's
    (the kind for a built-in one); ``namespace`` the group a function or
    custom tool was offered in."""

    call_id: str
    name: str
    kind: CallKind = "function"
    namespace: str | None = None


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
    """The turn's end. ``max_output_tokens``: the Response's output budget ran
    out; ``context_length_exceeded``: the model's context window did first (a
    real engine stopped at the room its window left, the budget unspent)."""

    reason: Literal["stop", "tool_calls", "max_output_tokens", "context_length_exceeded"]


@dataclasses.dataclass(frozen=True, slots=True)
class Usage:
    """A real engine's own token counts for the turn so far.

    The rollout bills the latest instead of its own estimate, however the
    turn ends: a sampler that has the engine's running counts sends one
    whenever they change, before the output they count, so a turn cut short
    (a cancel, a client gone, a steer) is billed the engine's count of what
    it streamed; the last, before :class:`Stop`, is the turn's. The
    simulated models never send one (their counts are the server's own).
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
    tools: Sequence[Tool]
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
    #: The conversation's affinity key (:func:`affinity_key`), the same on every
    #: turn of it; empty: the sampler's own.
    affinity: str = ""

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
        chain: str = "",
    ) -> SampleRequest:
        """What a turn of ``request``'s rollout over ``context`` asks of the sampler.

        Its budget is the Response's ``max_output_tokens`` (the server's
        ``cap`` if smaller) less what earlier turns ``spent``; its affinity key
        comes from the request's ``prompt_cache_key``, else from ``chain``
        (the id of the conversation's first response).
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
            affinity=affinity_key(request.prompt_cache_key, chain),
        )


def latest_listings(tools: Sequence[Tool], context: Sequence[Item]) -> dict[str, McpListTools]:
    """The latest ``mcp_list_tools`` item in ``context`` of each ``mcp`` server
    of ``tools``, by ``server_label``: what a model is offered of them."""
    servers = {tool.server_label for tool in tools if isinstance(tool, McpTool)}
    listings: dict[str, McpListTools] = {}
    if servers:
        for item in context:
            if isinstance(item, McpListTools) and item.server_label in servers:
                listings[item.server_label] = item
    return listings


def affinity_key(prompt_cache_key: str | None, chain: str) -> str:
    """The key that keeps a conversation on one engine and its prompt cache
    warm, as 32 hex digits: from the client's ``prompt_cache_key`` when it sends
    one (conversations sharing it share a prefix, by the client's word), else
    from ``chain``, the id of the conversation's first response, which every
    continuation of it shares (a fork, a chain hydrated from the store in
    another request or process). Empty when there is neither."""
    if prompt_cache_key:
        source = f"prompt_cache_key:{prompt_cache_key}"
    elif chain:
        source = f"chain:{chain}"
    else:
        return ""
    return hashlib.sha256(source.encode()).hexdigest()[:32]


class Sampler(Protocol):
    """Writes one turn. A sampler that never reads ``SampleRequest``'s token counts
    before its first chunk may say ``counts_first = False``: its rollout then
    counts the new input after the first output, and ``uncached_tokens`` is an
    upper bound (``longresponse.engine.counting``). Without it, counts are exact.
    A sampler that says ``summarizes = True`` writes its own compaction summary:
    its rollout asks it for one with :meth:`sample` (a summary turn, the
    instruction the last user message, no tool calls); without it, the engine's
    deterministic summary stands (``engine/summary.py``)."""

    def sample(self, request: SampleRequest) -> AsyncGenerator[SampleChunk, None]: ...


async def release(sampler: Sampler) -> None:
    """Its rollout is over: let ``sampler`` close what it holds for it (an upstream
    socket) if it has an ``aclose()``. A sampler used again later reopens it."""
    close = getattr(sampler, "aclose", None)
    if close is not None:
        await close()


#: A model's summary of a context, for a compaction: the items its window keeps,
#: within a budget (``None``: none), around the model's own summary text if it
#: wrote one (``None``: it did not).
Summarize = Callable[[Sequence[Item], SummaryBudget | None, str | None], list[Item]]


@dataclasses.dataclass(frozen=True, slots=True)
class ModelSpec:
    """A resolved model: its limits, how to make a sampler for one rollout, and
    its own checks and summary."""

    name: str
    context_window: int
    max_output_tokens: int
    make_sampler: Callable[[], Sampler]
    #: Who answers: ``longresponse`` (the simulated models) or the backend kind.
    owned_by: str = "longresponse"
    #: The model's own check of a request's ``metadata``, run where the request's
    #: other checks run (the simulated model's ``sim_*`` keys). Raises
    #: :class:`~protocol.RemoteProtocolError`; nothing is accepted then.
    check_request: Callable[[Mapping[str, str]], None] | None = None
    #: How the model summarizes a context it compacts: the engine's summary
    #: (``engine/summary.py``) unless the model has its own.
    summarize: Summarize = engine_summary

    def too_long(self, tokens: int) -> str:
        """The message of ``context_length_exceeded`` for a context of ``tokens``."""
        window = self.context_window
        return f"Your input is {tokens} tokens; the context window of {self.name} is {window}."


class UpstreamError(Exception):
    """The engine behind a model failed or refused a turn.

    ``code`` is the shipped error code (``upstream_unavailable`` with status
    502 when it cannot be reached or broke off; ``rate_limit_exceeded`` 429
    with ``retry_after`` seconds; ``context_length_exceeded`` or
    ``invalid_request_error`` codes 400 with ``param`` when it refused the
    request). ``output_started`` says whether any of the turn's output had
    already been produced when it failed. ``cause`` is what went wrong
    underneath, for the operator's log (:attr:`cause`); ``misconfigured``
    says the server's own settings are wrong for its engine (a server error
    no retry mends). It never carries the upstream's credentials.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "upstream_unavailable",
        status: int = 502,
        param: str | None = None,
        retry_after: float | None = None,
        output_started: bool = False,
        cause: str | None = None,
        misconfigured: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.param = param
        self.retry_after = retry_after
        self.output_started = output_started
        self._cause = cause
        self.misconfigured = misconfigured

    @property
    def cause(self) -> str:
        """What went wrong underneath, in one line: the one given, else the
        exception this one was raised while handling (its type and text; a
        transport's errors carry no request headers), else ``""``."""
        if self._cause is not None:
            return self._cause
        under = self.__context__
        if under is None:
            return ""
        text = " ".join(str(under).split())[:300]
        return f"{type(under).__name__}: {text}" if text else type(under).__name__

    @property
    def transient(self) -> bool:
        """The engine could not serve the turn now (unreachable, failed, rate
        limited), rather than refusing the request: trying again may work.
        A misconfigured server is never transient."""
        return not self.misconfigured and (self.status == 429 or self.status >= 500)

    @property
    def error_type(self) -> str:
        """The envelope's ``type``: who is at fault."""
        if self.status == 429:
            return "rate_limit_error"
        return "invalid_request_error" if 400 <= self.status < 500 else "server_error"
