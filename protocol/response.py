"""The Response object, its usage and its error, in the shipped field order.

Every field of the published Response resource is present on every Response
this project sends, ``null`` where unset (``tests/schemas/response.schema.json``
holds them to it). Append mode adds one field: ``required_action`` (present
only while the response is ``requires_action``; omitted otherwise, so
shipped-shape clients never see it).

The request parameters that the Response echoes with a shape of their own
live here too: ``text`` (:class:`TextConfig`, whose ``format`` asks for plain
text, a JSON object or JSON matching a schema), ``reasoning``
(:class:`ReasoningConfig`), ``conversation`` (:class:`ConversationRef`),
``prompt`` (:class:`PromptRef`) and the prompt cache's settings
(:class:`PromptCacheSettings`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

from .items import Item, Tool, ToolChoice

__all__ = [
    "ConversationRef",
    "FormatJSONObject",
    "FormatJSONSchema",
    "FormatText",
    "IncompleteDetails",
    "InputTokensDetails",
    "OutputTokensDetails",
    "PromptCacheSettings",
    "PromptRef",
    "ReasoningConfig",
    "RequiredAction",
    "Response",
    "ResponseCompaction",
    "ResponseError",
    "ResponseStatus",
    "TextConfig",
    "TextFormat",
    "Usage",
]

ResponseStatus = Literal[
    "queued", "in_progress", "requires_action", "completed", "incomplete", "failed", "cancelled"
]


class ResponseError(Struct, frozen=True, kw_only=True):
    code: str
    message: str


class IncompleteDetails(Struct, frozen=True, kw_only=True):
    #: shipped: ``max_output_tokens``, ``content_filter``; append mode adds
    #: ``pause_timeout`` (no tool output arrived in time); a real engine's
    #: turn may end ``context_length_exceeded`` (its window's room, not the
    #: output budget, ran out).
    reason: str


class RequiredAction(Struct, frozen=True, kw_only=True):
    call_ids: list[str]
    type: Literal["submit_tool_outputs"] = "submit_tool_outputs"


class InputTokensDetails(Struct, frozen=True, kw_only=True):
    #: Tokens the model had already processed (read from its cache).
    cached_tokens: int = 0
    #: Tokens this response wrote to the rollout's cache: the input the model
    #: had not processed before, which a later turn reads as cached (SPEC §8).
    cache_write_tokens: int = 0


class OutputTokensDetails(Struct, frozen=True, kw_only=True):
    reasoning_tokens: int = 0


class Usage(Struct, frozen=True, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class _Format(Struct, frozen=True, kw_only=True, tag_field="type"):
    pass


class FormatText(_Format, frozen=True, kw_only=True, tag="text"):
    """Plain text (the default)."""


class FormatJSONObject(_Format, frozen=True, kw_only=True, tag="json_object"):
    """Any JSON object (the older JSON mode)."""


class FormatJSONSchema(_Format, frozen=True, kw_only=True, tag="json_schema"):
    """JSON matching ``schema`` (structured outputs); ``strict`` holds the model to it."""

    name: str
    schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = False


TextFormat = FormatText | FormatJSONObject | FormatJSONSchema

Verbosity = Literal["low", "medium", "high"]


class TextConfig(Struct, frozen=True, kw_only=True):
    """``text``: the output format, and how verbose the model should be.

    A request may send ``format: null`` or ``verbosity: null``; the Response
    echoes a format always (plain text by default) and a verbosity only when
    one was asked for.
    """

    format: TextFormat | None = msgspec.field(default_factory=FormatText)
    verbosity: Verbosity | UnsetType | None = UNSET


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
ReasoningSummary = Literal["auto", "concise", "detailed"]


class ReasoningConfig(Struct, frozen=True, kw_only=True):
    """``reasoning``: the effort asked for and whether to summarize.

    ``generate_summary`` is the older spelling of ``summary``; the Response
    echoes ``summary`` only.
    """

    effort: ReasoningEffort | None = None
    summary: ReasoningSummary | None = None
    generate_summary: ReasoningSummary | UnsetType | None = UNSET


class ConversationRef(Struct, frozen=True, kw_only=True):
    """``conversation`` as the Response echoes it (a request may also send the bare id)."""

    id: str


class PromptRef(Struct, frozen=True, kw_only=True):
    """``prompt``: a stored prompt template by id, its version and variables.
    Accepted and echoed; this server keeps no templates (SPEC §12.1)."""

    id: str
    version: str | None = None
    variables: dict[str, Any] | None = None


PromptCacheMode = Literal["implicit", "explicit"]
PromptCacheTTL = Literal["30m", "12h"]


class PromptCacheSettings(Struct, frozen=True, kw_only=True):
    """``prompt_cache_options`` as the Response echoes them: the mode and the
    minimum lifetime in effect (``implicit`` and ``30m`` unless asked)."""

    mode: PromptCacheMode = "implicit"
    ttl: PromptCacheTTL = "30m"
    comparison_response_id: str | None = None


class Response(Struct, frozen=True, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    background: bool = False
    completed_at: int | None = None
    conversation: ConversationRef | None = None
    error: ResponseError | None = None
    frequency_penalty: float = 0.0
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    model: str
    output: list[Item] = msgspec.field(default_factory=list)
    parallel_tool_calls: bool = True
    presence_penalty: float = 0.0
    previous_response_id: str | None = None
    prompt: PromptRef | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: PromptCacheSettings | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    reasoning: ReasoningConfig | None = None
    safety_identifier: str | None = None
    service_tier: str = "default"
    store: bool = True
    temperature: float = 1.0
    text: TextConfig = msgspec.field(default_factory=TextConfig)
    tool_choice: ToolChoice = "auto"
    tools: list[Tool] = msgspec.field(default_factory=list)
    top_logprobs: int = 0
    top_p: float = 1.0
    truncation: Literal["auto", "disabled"] = "disabled"
    usage: Usage | None = None
    user: str | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    required_action: RequiredAction | UnsetType = UNSET


class ResponseCompaction(Struct, frozen=True, kw_only=True):
    """What ``POST /v1/responses/compact`` returns: the window to continue from.

    ``output`` is the conversation's user messages, then one ``compaction``
    item; passed unchanged as the next ``input`` it continues the conversation.
    """

    id: str
    object: Literal["response.compaction"] = "response.compaction"
    created_at: int
    output: list[Item]
    usage: Usage
