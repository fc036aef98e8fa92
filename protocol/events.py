"""Every client and server event, as frozen msgspec Structs tagged on ``type``.

The tag string of each class is its wire ``type``. :data:`ClientEvent` and
:data:`ServerEvent` are the two unions the codec decodes into; a ``type``
outside the union is an ``unknown_event_type`` error (see ``codec``).

Server events carry ``sequence_number`` (counted per response: from 0 at
``response.created``, never reset across pauses in append mode) and, on a
named lane, ``stream_id``.

``response.inject`` is the multi-agent beta's form of ``response.append``
(input committed into a live response); its two replies,
``response.inject.created`` and ``response.inject.failed``, are the only
server events that answer a client event one to one.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from ._wire import wire_type
from .items import ContentPart, Item, OutputText, Refusal, Tool, ToolChoice
from .response import ReasoningConfig, Response, ResponseError, TextConfig

__all__ = [
    "CLIENT_EVENT_TYPES",
    "SERVER_EVENT_TYPES",
    "ClientEvent",
    "CompactionCompacting",
    "ContentPartAdded",
    "ContentPartDone",
    "ContextManagement",
    "ErrorBody",
    "ErrorEvent",
    "FunctionCallArgumentsDelta",
    "FunctionCallArgumentsDone",
    "MultiAgent",
    "OutputItemAdded",
    "OutputItemDone",
    "OutputTextDelta",
    "OutputTextDone",
    "PromptCacheOptions",
    "ResponseAppend",
    "ResponseCancel",
    "ResponseCompleted",
    "ResponseCreate",
    "ResponseCreated",
    "ResponseDone",
    "ResponseFailed",
    "ResponseInProgress",
    "ResponseIncomplete",
    "ResponseInject",
    "ResponseInjectCreated",
    "ResponseInjectFailed",
    "ResponseProcessed",
    "ResponseQueued",
    "ServerEvent",
    "TimingEvent",
]


class _Event(Struct, frozen=True, kw_only=True, tag_field="type"):
    pass


# --- client events ---------------------------------------------------------

#: The published ranges of the sampling parameters (out of range: ``invalid_value``).
Temperature = Annotated[float, Meta(ge=0, le=2)]
TopP = Annotated[float, Meta(ge=0, le=1)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]
TopLogprobs = Annotated[int, Meta(ge=0, le=20)]
#: A count of at least 1 and at most what a 32-bit signed integer holds (the
#: bound keeps a 2**70 from reaching any arithmetic).
AtLeastOne = Annotated[int, Meta(ge=1, le=2**31 - 1)]
#: Request ``metadata``, as published: at most 16 pairs, keys of at most 64
#: characters, values of at most 512.
Metadata = Annotated[
    dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]],
    Meta(max_length=16),
]


class PromptCacheOptions(Struct, frozen=True, kw_only=True):
    """``prompt_cache_options``: ``prewarm: true`` fills the cache and generates
    nothing (it forces ``generate`` to false); the rest is accepted and ignored."""

    prewarm: bool | None = None
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m", "12h"] | None = None
    comparison_response_id: str | None = None


class ContextManagement(Struct, frozen=True, kw_only=True):
    """One ``context_management`` entry of a create: ``type`` ``"compaction"``
    compacts the context once it crosses ``compact_threshold`` rendered tokens."""

    type: str
    compact_threshold: int | None = None


class MultiAgent(Struct, frozen=True, kw_only=True):
    """``multi_agent`` of a create (the multi-agent beta, ``responses_multi_agent=v1``):
    ``enabled`` makes a shipped-shape Response wait in place at client tool
    calls until ``response.inject`` brings their outputs."""

    enabled: bool
    max_concurrent_subagents: int | UnsetType = UNSET


class ResponseCreate(_Event, frozen=True, kw_only=True, tag="response.create"):
    """Starts a response; the body of ``POST /v1/responses`` at the top level.

    ``stream``, ``stream_options`` and unknown top-level keys are accepted and
    ignored (real clients send them). ``generate: false``, or
    ``prompt_cache_options.prewarm: true``, prepares state without sampling
    (:attr:`warm_up`).
    """

    model: str | UnsetType = UNSET
    input: str | list[Item] = msgspec.field(default_factory=list)
    instructions: str | None = None
    tools: list[Tool] = msgspec.field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    metadata: Metadata = msgspec.field(default_factory=dict)
    store: bool = True
    previous_response_id: str | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    max_output_tokens: AtLeastOne | None = None
    max_tool_calls: AtLeastOne | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    include: list[str] | None = None
    top_logprobs: TopLogprobs | None = None
    background: bool | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    stream_id: str | UnsetType = UNSET
    generate: bool | None = None
    context_management: list[ContextManagement] | None = None
    prompt_cache_options: PromptCacheOptions | None = None

    @property
    def warm_up(self) -> bool:
        """Take the input in without sampling: ``generate: false``, or a prewarm
        (``prompt_cache_options.prewarm: true`` forces ``generate`` to false)."""
        options = self.prompt_cache_options
        return self.generate is False or (options is not None and options.prewarm is True)
    multi_agent: MultiAgent | None = None


class ResponseAppend(_Event, frozen=True, kw_only=True, tag="response.append"):
    """Adds input to a live response: tool outputs that unblock it, or steering.

    Without ``response_id`` it targets the connection's latest response.
    """

    input: str | list[Item]
    response_id: str | None = None


class ResponseCancel(_Event, frozen=True, kw_only=True, tag="response.cancel"):
    response_id: str | None = None


class ResponseProcessed(_Event, frozen=True, kw_only=True, tag="response.processed"):
    """Sent by some clients after consuming a response; tolerated, never answered."""

    response_id: str | None = None


class ResponseInject(_Event, frozen=True, kw_only=True, tag="response.inject"):
    """Commits input into a live response (the multi-agent beta): client tool
    outputs that resume it. Checked like ``response.append``; the reply is
    ``response.inject.created`` or ``response.inject.failed``."""

    response_id: str
    input: list[Item]


ClientEvent = ResponseCreate | ResponseAppend | ResponseCancel | ResponseProcessed | ResponseInject

# --- server events ---------------------------------------------------------


class _ServerEvent(_Event, frozen=True):
    sequence_number: int
    stream_id: str | UnsetType = UNSET


class _ItemEvent(_ServerEvent, frozen=True, kw_only=True):
    #: Append mode names the response on every event, because one connection
    #: may run several rollouts at once; the shipped shape leaves it out.
    response_id: str | UnsetType = UNSET


class _Lifecycle(_ServerEvent, frozen=True, kw_only=True):
    response: Response


class ResponseCreated(_Lifecycle, frozen=True, kw_only=True, tag="response.created"):
    pass


class ResponseQueued(_Lifecycle, frozen=True, kw_only=True, tag="response.queued"):
    pass


class ResponseInProgress(_Lifecycle, frozen=True, kw_only=True, tag="response.in_progress"):
    pass


class ResponseDone(_Lifecycle, frozen=True, kw_only=True, tag="response.done"):
    """Append mode: the loop paused (``requires_action``) or the rollout ended."""


class ResponseCompleted(_Lifecycle, frozen=True, kw_only=True, tag="response.completed"):
    pass


class ResponseIncomplete(_Lifecycle, frozen=True, kw_only=True, tag="response.incomplete"):
    pass


class ResponseFailed(_Lifecycle, frozen=True, kw_only=True, tag="response.failed"):
    pass


class OutputItemAdded(_ItemEvent, frozen=True, kw_only=True, tag="response.output_item.added"):
    output_index: int
    item: Item


class OutputItemDone(_ItemEvent, frozen=True, kw_only=True, tag="response.output_item.done"):
    output_index: int
    item: Item


class ContentPartAdded(_ItemEvent, frozen=True, kw_only=True, tag="response.content_part.added"):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | Refusal | ContentPart


class ContentPartDone(_ItemEvent, frozen=True, kw_only=True, tag="response.content_part.done"):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | Refusal | ContentPart


class OutputTextDelta(_ItemEvent, frozen=True, kw_only=True, tag="response.output_text.delta"):
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class OutputTextDone(_ItemEvent, frozen=True, kw_only=True, tag="response.output_text.done"):
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class FunctionCallArgumentsDelta(
    _ItemEvent, frozen=True, kw_only=True, tag="response.function_call_arguments.delta"
):
    item_id: str
    output_index: int
    delta: str


class FunctionCallArgumentsDone(
    _ItemEvent, frozen=True, kw_only=True, tag="response.function_call_arguments.done"
):
    item_id: str
    output_index: int
    name: str
    arguments: str


class CompactionCompacting(
    _ItemEvent, frozen=True, kw_only=True, tag="response.compaction.compacting"
):
    """The server is compacting the context into the compaction item at
    ``output_index``; carries no summary (the item's ``output_item.done`` does)."""

    item_id: str
    output_index: int


class ErrorBody(Struct, frozen=True, kw_only=True):
    type: str
    code: str | None
    message: str
    param: str | None = None


class ErrorEvent(_Event, frozen=True, kw_only=True, tag="error"):
    """The WebSocket error envelope. ``response_id`` is an append-mode extra
    naming the response a request error concerns, when there is one;
    ``retry_after`` (seconds) the hint of a rate-limited upstream engine."""

    error: ErrorBody
    status: int | UnsetType = UNSET
    sequence_number: int | UnsetType = UNSET
    stream_id: str | UnsetType = UNSET
    response_id: str | UnsetType = UNSET
    retry_after: float | UnsetType = UNSET


class ResponseInjectCreated(_ServerEvent, frozen=True, kw_only=True, tag="response.inject.created"):
    """The injected input is committed to the response. Its ``sequence_number``
    is the response's next one: the reply is an event of that response."""

    response_id: str


class ResponseInjectFailed(_ServerEvent, frozen=True, kw_only=True, tag="response.inject.failed"):
    """The injected input was not committed (``response_not_found``,
    ``response_already_completed``); ``input`` hands it back. Its
    ``sequence_number`` is the one after the response's last event (0 for an
    unknown response): it belongs to no response's stream."""

    response_id: str
    input: list[Item]
    error: ResponseError


class TimingEvent(_Event, frozen=True, kw_only=True, tag="responsesapi.websocket_timing"):
    """Per-turn phase timings, sent only to clients that asked by header."""

    timing_metrics: dict[str, float]
    response_id: str | UnsetType = UNSET
    stream_id: str | UnsetType = UNSET


ServerEvent = (
    ResponseCreated
    | ResponseQueued
    | ResponseInProgress
    | ResponseDone
    | ResponseCompleted
    | ResponseIncomplete
    | ResponseFailed
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | CompactionCompacting
    | ErrorEvent
    | TimingEvent
    | ResponseInjectCreated
    | ResponseInjectFailed
)

CLIENT_EVENT_TYPES: frozenset[str] = frozenset(wire_type(cls) for cls in ClientEvent.__args__)

SERVER_EVENT_TYPES: frozenset[str] = frozenset(wire_type(cls) for cls in ServerEvent.__args__)
