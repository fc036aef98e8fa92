"""Conversation items, content parts and tool definitions (the shipped shapes).

All are frozen msgspec Structs tagged on ``type`` with the wire tag string.
Optional fields that the shipped API leaves out when absent are typed
``... | UnsetType = UNSET`` so that they are omitted on encode rather than
written as ``null``. Unknown fields are ignored on decode: real clients replay
output items with fields this project does not model.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

__all__ = [
    "Compaction",
    "CompactionTrigger",
    "ContentPart",
    "FunctionCall",
    "FunctionCallOutput",
    "FunctionTool",
    "InputFile",
    "InputImage",
    "InputText",
    "Item",
    "Message",
    "OutputText",
    "PromptCacheBreakpoint",
    "Reasoning",
    "ReasoningText",
    "Refusal",
    "SummaryText",
    "Tool",
    "ToolChoice",
    "ToolChoiceFunction",
    "as_items",
    "item_text",
]


class _Tagged(Struct, frozen=True, kw_only=True, tag_field="type"):
    pass


# --- content parts ---------------------------------------------------------


class PromptCacheBreakpoint(Struct, frozen=True, kw_only=True):
    """``prompt_cache_breakpoint`` of an input content part: the end of a prefix
    to cache explicitly. Accepted and kept with the part; this server caches
    every prefix of a rollout anyway (SPEC §8)."""

    mode: Literal["explicit"]
    ttl: Literal["30m", "12h"] | UnsetType = UNSET


class InputText(_Tagged, frozen=True, tag="input_text"):
    text: str
    prompt_cache_breakpoint: PromptCacheBreakpoint | UnsetType = UNSET


class OutputText(_Tagged, frozen=True, tag="output_text"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] | UnsetType = UNSET


class Refusal(_Tagged, frozen=True, tag="refusal"):
    refusal: str


class InputImage(_Tagged, frozen=True, tag="input_image"):
    detail: str = "auto"
    image_url: str | UnsetType | None = UNSET
    file_id: str | UnsetType | None = UNSET
    prompt_cache_breakpoint: PromptCacheBreakpoint | UnsetType = UNSET


class InputFile(_Tagged, frozen=True, tag="input_file"):
    file_id: str | UnsetType | None = UNSET
    file_data: str | UnsetType = UNSET
    file_url: str | UnsetType = UNSET
    filename: str | UnsetType = UNSET
    prompt_cache_breakpoint: PromptCacheBreakpoint | UnsetType = UNSET


class SummaryText(_Tagged, frozen=True, tag="summary_text"):
    text: str


class ReasoningText(_Tagged, frozen=True, tag="reasoning_text"):
    text: str


ContentPart = InputText | OutputText | Refusal | InputImage | InputFile | ReasoningText

ItemStatus = Literal["in_progress", "completed", "incomplete"]

# --- items -----------------------------------------------------------------


class Message(_Tagged, frozen=True, tag="message"):
    """An input message (user/system/developer) or an assistant output message."""

    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | UnsetType = UNSET
    status: ItemStatus | UnsetType = UNSET
    phase: Literal["commentary", "final_answer"] | UnsetType | None = UNSET


class FunctionCall(_Tagged, frozen=True, tag="function_call"):
    call_id: str
    name: str
    arguments: str
    id: str | UnsetType = UNSET
    status: ItemStatus | UnsetType = UNSET
    namespace: str | UnsetType | None = UNSET


class FunctionCallOutput(_Tagged, frozen=True, tag="function_call_output"):
    call_id: str
    output: str | list[ContentPart]
    id: str | UnsetType = UNSET
    status: ItemStatus | UnsetType = UNSET


class Reasoning(_Tagged, frozen=True, tag="reasoning"):
    """Passed through: kept in context and replayed, never interpreted."""

    id: str | UnsetType = UNSET
    summary: list[SummaryText] = msgspec.field(default_factory=list)
    content: list[ReasoningText] | UnsetType = UNSET
    encrypted_content: str | UnsetType | None = UNSET
    status: ItemStatus | UnsetType = UNSET


# --- compaction ------------------------------------------------------------


class Compaction(_Tagged, frozen=True, tag="compaction"):
    """A compacted conversation: the window it stands for, sealed by the server.

    ``encrypted_content`` is opaque to the client (authenticated encryption
    with the server's key, bound to the API key that made it); the server
    opens it when the item comes back as input (SPEC §11).
    """

    encrypted_content: str
    id: str | UnsetType = UNSET
    created_by: str | UnsetType = UNSET


class CompactionTrigger(_Tagged, frozen=True, tag="compaction_trigger"):
    """Input only, and only as the last item: asks for a compaction turn."""

    id: str | UnsetType = UNSET


Item = Message | FunctionCall | FunctionCallOutput | Reasoning | Compaction | CompactionTrigger


def as_items(value: str | list[Item]) -> list[Item]:
    """An ``input`` as items: a bare string is one user message (shipped rule)."""
    if isinstance(value, str):
        return [Message(role="user", content=value)]
    return list(value)


def item_text(content: str | list[ContentPart]) -> str:
    """The plain text of a message or tool-output ``content``."""
    if isinstance(content, str):
        return content
    pieces: list[str] = []
    for part in content:
        if isinstance(part, InputText | OutputText | ReasoningText):
            pieces.append(part.text)
        elif isinstance(part, Refusal):
            pieces.append(part.refusal)
    return "".join(pieces)


# --- tools -----------------------------------------------------------------


class FunctionTool(_Tagged, frozen=True, tag="function"):
    """A client-side function tool: the client runs it and appends the output."""

    name: str
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


Tool = FunctionTool


class ToolChoiceFunction(Struct, frozen=True, kw_only=True):
    type: Literal["function"]
    name: str


ToolChoice = Literal["auto", "none", "required"] | ToolChoiceFunction
