"""Every client and server event, as frozen msgspec Structs tagged on ``type``.

The tag string of each class is its wire ``type``. :data:`ClientEvent` and
:data:`ServerEvent` are the two unions the codec decodes into; a ``type``
outside the union is an ``unknown_event_type`` error (see ``codec``).

Server events carry ``sequence_number`` (counted per response: from 0 at
``response.created``, never reset across pauses in append mode) and, on a
named lane, ``stream_id``.

``response.inject`` is the multi-agent beta's form of ``response.append``
(input committed into a live response); its two replies,
``response.inject.created`` and ``response.inject.failed``, answer it one to
one. ``response.steer`` (the shipped shape's steering) queues user input for
a live response's successor; ``response.steer.accepted`` and
``response.steer.failed`` answer it one to one, and
``response.steer.pending`` follows the terminal event of a response that
stopped for client tool output with steering input still queued.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from ._wire import wire_type
from .items import ContentPart, InputItem, Item, OutputText, Refusal, Tool, ToolChoice
from .response import (
    ConversationRef,
    PromptCacheMode,
    PromptCacheTTL,
    PromptRef,
    ReasoningConfig,
    Response,
    ResponseError,
    TextConfig,
)

__all__ = [
    "CLIENT_EVENT_TYPES",
    "INCLUDABLE",
    "SERVER_EVENT_TYPES",
    "SERVICE_TIERS",
    "AccessPrograms",
    "BackgroundOptions",
    "ClientEvent",
    "CompactionCompacting",
    "ContentPartAdded",
    "ContentPartDone",
    "ContextManagement",
    "ErrorBody",
    "ErrorEvent",
    "FunctionCallArgumentsDelta",
    "FunctionCallArgumentsDone",
    "ImageOptions",
    "Keepalive",
    "McpCallArgumentsDelta",
    "McpCallArgumentsDone",
    "McpCallCompleted",
    "McpCallFailed",
    "McpCallInProgress",
    "McpListToolsCompleted",
    "McpListToolsFailed",
    "McpListToolsInProgress",
    "Moderation",
    "ModerationPolicy",
    "ModerationRule",
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
    "ResponseResume",
    "ResponseResumed",
    "ResponseSteer",
    "ResponseSteerAccepted",
    "ResponseSteerFailed",
    "ResponseSteerPending",
    "ServerEvent",
    "SteerError",
    "SteerFailure",
    "SteerReceipt",
    "SteerRequiredInput",
    "StreamOptions",
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


#: Every ``service_tier`` the published request takes. The Response names the
#: tier that served it: always ``default`` here (SPEC §12.1).
ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"]
SERVICE_TIERS: frozenset[str] = frozenset(get_args(ServiceTier))

#: Every ``include`` value the published request takes.
Includable = Literal[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
]
INCLUDABLE: frozenset[str] = frozenset(get_args(Includable))


class PromptCacheOptions(Struct, frozen=True, kw_only=True):
    """``prompt_cache_options``: ``prewarm: true`` fills the cache and generates
    nothing (it forces ``generate`` to false); ``mode``, ``ttl`` and
    ``comparison_response_id`` are echoed on the Response, with no other effect."""

    prewarm: bool | None = None
    mode: PromptCacheMode | None = None
    ttl: PromptCacheTTL | None = None
    comparison_response_id: str | None = None


class StreamOptions(Struct, frozen=True, kw_only=True):
    """``stream_options`` (HTTP streaming): accepted and ignored everywhere."""

    include_obfuscation: bool | None = None


class ModerationRule(Struct, frozen=True, kw_only=True):
    mode: Literal["score", "block"]


class ModerationPolicy(Struct, frozen=True, kw_only=True):
    input: ModerationRule | None = None
    output: ModerationRule | None = None


class Moderation(Struct, frozen=True, kw_only=True):
    """``moderation``: a moderation model and policy for the input and output.
    Accepted; this server runs no moderation (SPEC §12.1)."""

    model: str
    policy: ModerationPolicy | None = None


class AccessPrograms(Struct, frozen=True, kw_only=True):
    """``access_programs``: accepted and ignored."""

    cyber: Literal["standard", "daybreak_blue", "daybreak_red"] | None = None


class BackgroundOptions(Struct, frozen=True, kw_only=True):
    """``background_options``: accepted and ignored (a background response runs at once)."""

    completion_window: Literal["soonest", "2h", "8h"] | None = None
    continuation_id: str | None = None


class ImageOptions(Struct, frozen=True, kw_only=True):
    """``image``: accepted and ignored (images in the input are not looked at)."""

    context_compression: Literal["auto", "enabled", "disabled"] | None = None


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

    The one request schema of every transport: HTTP decodes its body into
    this Struct (refusing unknown keys, as shipped), both WebSocket shapes
    their ``response.create`` (ignoring unknown keys, as shipped). Every field
    of the published request is declared and type-checked here, with
    ``client_metadata`` (Codex) and the WebSocket's ``stream_id`` and
    ``generate``. ``generate: false``, or ``prompt_cache_options.prewarm:
    true``, prepares state without sampling (:attr:`warm_up`).
    """

    model: str | UnsetType = UNSET
    #: Items or references to stored ones (``item_reference``), resolved by the
    #: server before anything reads them (``as_items`` refuses one left).
    input: str | list[InputItem] = msgspec.field(default_factory=list)
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
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    service_tier: ServiceTier | None = None
    include: list[Includable] | None = None
    top_logprobs: TopLogprobs | None = None
    background: bool | None = None
    background_options: BackgroundOptions | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stream_id: str | UnsetType = UNSET
    generate: bool | None = None
    context_management: list[ContextManagement] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    conversation: str | ConversationRef | None = None
    prompt: PromptRef | None = None
    moderation: Moderation | None = None
    access_programs: AccessPrograms | None = None
    image: ImageOptions | None = None
    #: Codex sends it on every request (not in the SDK's types): accepted and ignored.
    client_metadata: dict[str, str] | None = None

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

    input: str | list[InputItem]
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


class ResponseSteer(
    _Event, frozen=True, kw_only=True, tag="response.steer", forbid_unknown_fields=True
):
    """Queues user input to steer the live response ``previous_response_id`` (the
    shipped shape). Only ``type``, ``previous_response_id`` and ``input`` are
    allowed (no ``stream_id``: the target's lane is used). ``input`` is a string
    or a non-empty list of ``user`` messages; the core checks the items."""

    previous_response_id: str
    input: str | list[Item]


class ResponseResume(_Event, frozen=True, kw_only=True, tag="response.resume"):
    """Takes up, on a new connection, an append-mode response whose connection
    (or process) was lost: one created with ``store: true``, from its last
    checkpoint. The server answers ``response.resumed``."""

    response_id: str


ClientEvent = (
    ResponseCreate
    | ResponseAppend
    | ResponseCancel
    | ResponseProcessed
    | ResponseInject
    | ResponseSteer
    | ResponseResume
)

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


class ResponseResumed(_Lifecycle, frozen=True, kw_only=True, tag="response.resumed"):
    """The answer to ``response.resume``: the Response as its last checkpoint
    holds it (``requires_action`` with the calls still waiting for outputs, or
    ``in_progress`` when its turn runs again). Its ``sequence_number`` follows
    the checkpoint's last event; events the client saw after that are void."""


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


class McpCallArgumentsDelta(
    _ItemEvent, frozen=True, kw_only=True, tag="response.mcp_call_arguments.delta"
):
    item_id: str
    output_index: int
    delta: str


class McpCallArgumentsDone(
    _ItemEvent, frozen=True, kw_only=True, tag="response.mcp_call_arguments.done"
):
    item_id: str
    output_index: int
    arguments: str


class _HostedStep(_ItemEvent, frozen=True, kw_only=True):
    """A step of a hosted item (an MCP listing or call) the server is running."""

    item_id: str
    output_index: int


class McpCallInProgress(
    _HostedStep, frozen=True, kw_only=True, tag="response.mcp_call.in_progress"
):
    pass


class McpCallCompleted(_HostedStep, frozen=True, kw_only=True, tag="response.mcp_call.completed"):
    pass


class McpCallFailed(_HostedStep, frozen=True, kw_only=True, tag="response.mcp_call.failed"):
    pass


class McpListToolsInProgress(
    _HostedStep, frozen=True, kw_only=True, tag="response.mcp_list_tools.in_progress"
):
    pass


class McpListToolsCompleted(
    _HostedStep, frozen=True, kw_only=True, tag="response.mcp_list_tools.completed"
):
    pass


class McpListToolsFailed(
    _HostedStep, frozen=True, kw_only=True, tag="response.mcp_list_tools.failed"
):
    pass


class CompactionCompacting(
    _ItemEvent, frozen=True, kw_only=True, tag="response.compaction.compacting"
):
    """The server is compacting the context into the compaction item at
    ``output_index``; carries no summary (the item's ``output_item.done`` does)."""

    item_id: str
    output_index: int


class ErrorBody(Struct, frozen=True, kw_only=True):
    """``error`` of the WebSocket error envelope; ``headers`` are the response
    headers the error would have had over HTTP (``x-request-id``)."""

    type: str
    code: str | None
    message: str
    param: str | None = None
    headers: dict[str, str] | UnsetType = UNSET


class ErrorEvent(_Event, frozen=True, kw_only=True, tag="error"):
    """The WebSocket error envelope. ``sequence_number`` is the next one of the
    response the error concerns (not used up: the error is outside its
    stream), 0 when it concerns none. ``response_id`` is an append-mode
    extra naming the response a request error concerns, when there is one;
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


class SteerReceipt(Struct, frozen=True, kw_only=True):
    """``steer`` of ``response.steer.accepted`` and ``.pending``: the id the
    server gave the submission and the response it steers."""

    id: str
    previous_response_id: str


class SteerFailure(Struct, frozen=True, kw_only=True):
    """``steer`` of ``response.steer.failed``: the input handed back (as sent
    when it did not decode), and the id when one was given (after acceptance)."""

    previous_response_id: str
    input: str | list[Any]
    id: str | UnsetType = UNSET


class SteerError(Struct, frozen=True, kw_only=True):
    """``error`` of ``response.steer.failed``; ``code`` one of the SDK's
    ``ResponseSteerErrorCode``."""

    code: str
    message: str
    type: str = "invalid_request_error"


class SteerRequiredInput(Struct, frozen=True, kw_only=True):
    """A stub of ``response.steer.pending``: a client tool output still owed
    (``type`` ``function_call_output``, its ``call_id`` and ``name``)."""

    type: str
    call_id: str
    name: str


class ResponseSteerAccepted(_ServerEvent, frozen=True, kw_only=True, tag="response.steer.accepted"):
    """The steering input is queued (not yet applied: the successor's
    ``response.created`` commits it). An event of the steered response: its
    ``sequence_number`` is that response's next one."""

    steer: SteerReceipt


class ResponseSteerPending(_ServerEvent, frozen=True, kw_only=True, tag="response.steer.pending"):
    """Accepted input is still queued after the response completed waiting for
    client tool output (``reason`` ``waiting_for_required_input``): the client's
    next ``response.create`` on that parent and lane gets it prepended. Follows
    the terminal event; numbered like ``response.inject.failed`` (the number
    the response would have had next), in no response's stream."""

    steer: SteerReceipt
    reason: str
    required_input: list[SteerRequiredInput]


class ResponseSteerFailed(_ServerEvent, frozen=True, kw_only=True, tag="response.steer.failed"):
    """The steering input was refused, or accepted and then not committed; the
    input is handed back. In no response's stream (numbered like
    ``response.inject.failed``)."""

    steer: SteerFailure
    error: SteerError


class Keepalive(_ServerEvent, frozen=True, kw_only=True, tag="keepalive"):
    """Nothing but a sign of life while the model is silent (a long prefill, a slow
    engine), as the shipped API sends on long streams: an event of the running
    response (numbered in its stream) that changes nothing. Clients' stream
    watchdogs count it (Codex's resets only on JSON events, not on pings), and
    proxies see bytes. ``response_id`` names the response in append mode."""

    response_id: str | UnsetType = UNSET


class TimingEvent(_Event, frozen=True, kw_only=True, tag="responsesapi.websocket_timing"):
    """Per-turn phase timings, sent only to clients that asked by header."""

    timing_metrics: dict[str, float]
    response_id: str | UnsetType = UNSET
    stream_id: str | UnsetType = UNSET


ServerEvent = (
    ResponseCreated
    | ResponseQueued
    | ResponseResumed
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
    | McpCallArgumentsDelta
    | McpCallArgumentsDone
    | McpCallInProgress
    | McpCallCompleted
    | McpCallFailed
    | McpListToolsInProgress
    | McpListToolsCompleted
    | McpListToolsFailed
    | CompactionCompacting
    | Keepalive
    | ErrorEvent
    | TimingEvent
    | ResponseInjectCreated
    | ResponseInjectFailed
    | ResponseSteerAccepted
    | ResponseSteerPending
    | ResponseSteerFailed
)

CLIENT_EVENT_TYPES: frozenset[str] = frozenset(wire_type(cls) for cls in ClientEvent.__args__)

SERVER_EVENT_TYPES: frozenset[str] = frozenset(wire_type(cls) for cls in ServerEvent.__args__)
