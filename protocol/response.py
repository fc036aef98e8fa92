"""The Response object, its usage and its error, in the shipped field order.

Append mode adds one field: ``required_action`` (present only while the
response is ``requires_action``; omitted otherwise, so shipped-shape clients
never see it).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

from .items import FunctionTool, Item, ToolChoice

__all__ = [
    "IncompleteDetails",
    "InputTokensDetails",
    "OutputTokensDetails",
    "RequiredAction",
    "Response",
    "ResponseCompaction",
    "ResponseError",
    "ResponseStatus",
    "TextConfig",
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
    #: ``pause_timeout`` (no tool output arrived in time).
    reason: str


class RequiredAction(Struct, frozen=True, kw_only=True):
    call_ids: list[str]
    type: Literal["submit_tool_outputs"] = "submit_tool_outputs"


class InputTokensDetails(Struct, frozen=True, kw_only=True):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(Struct, frozen=True, kw_only=True):
    reasoning_tokens: int = 0


class Usage(Struct, frozen=True, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class TextFormat(Struct, frozen=True, kw_only=True):
    type: str = "text"


class TextConfig(Struct, frozen=True, kw_only=True):
    format: TextFormat = msgspec.field(default_factory=TextFormat)
    verbosity: str | UnsetType = UNSET


class Response(Struct, frozen=True, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    background: bool = False
    completed_at: int | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    model: str
    output: list[Item] = msgspec.field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None
    reasoning: dict[str, Any] | None = None
    safety_identifier: str | None = None
    service_tier: str = "default"
    store: bool = True
    temperature: float | None = 1.0
    text: TextConfig = msgspec.field(default_factory=TextConfig)
    tool_choice: ToolChoice = "auto"
    tools: list[FunctionTool] = msgspec.field(default_factory=list)
    top_logprobs: int = 0
    top_p: float | None = 1.0
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
