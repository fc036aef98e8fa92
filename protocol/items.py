"""Conversation items, content parts and tool definitions (the shipped shapes).

All are frozen msgspec Structs tagged on ``type`` with the wire tag string.
Optional fields that the shipped API leaves out when absent are typed
``... | UnsetType = UNSET`` so that they are omitted on encode rather than
written as ``null``. Unknown fields are ignored on decode: real clients replay
output items with fields this project does not model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

__all__ = [
    "ApplyPatchCall",
    "ApplyPatchCallOutput",
    "ApplyPatchTool",
    "CallOutput",
    "ClientCall",
    "ClientTool",
    "CodeInterpreterTool",
    "Compaction",
    "CompactionTrigger",
    "ComputerCall",
    "ComputerCallOutput",
    "ComputerScreenshot",
    "ComputerTool",
    "ComputerUsePreviewTool",
    "ContentPart",
    "CreateFile",
    "CustomGrammarFormat",
    "CustomTextFormat",
    "CustomTool",
    "CustomToolCall",
    "CustomToolCallOutput",
    "CustomToolFormat",
    "DeleteFile",
    "FileSearchTool",
    "FunctionCall",
    "FunctionCallOutput",
    "FunctionTool",
    "ImageGenerationTool",
    "InputFile",
    "InputImage",
    "InputItem",
    "InputText",
    "Item",
    "ItemReference",
    "LocalShellCall",
    "LocalShellCallOutput",
    "LocalShellExec",
    "LocalShellTool",
    "McpApprovalRequest",
    "McpApprovalResponse",
    "McpCall",
    "McpListTools",
    "McpListedTool",
    "McpTool",
    "Message",
    "NamespaceTool",
    "OutputText",
    "PatchOperation",
    "ProgrammaticToolCallingTool",
    "PromptCacheBreakpoint",
    "Reasoning",
    "ReasoningText",
    "Refusal",
    "ShellAction",
    "ShellCall",
    "ShellCallOutput",
    "ShellExit",
    "ShellOutput",
    "ShellTimeout",
    "ShellTool",
    "SummaryText",
    "Tool",
    "ToolChoice",
    "ToolChoiceAllowed",
    "ToolChoiceApplyPatch",
    "ToolChoiceCodeInterpreter",
    "ToolChoiceComputer",
    "ToolChoiceComputerUse",
    "ToolChoiceComputerUsePreview",
    "ToolChoiceCustom",
    "ToolChoiceFileSearch",
    "ToolChoiceFunction",
    "ToolChoiceImageGeneration",
    "ToolChoiceMcp",
    "ToolChoiceProgrammatic",
    "ToolChoiceShell",
    "ToolChoiceWebSearchPreview",
    "ToolChoiceWebSearchPreview20250311",
    "ToolSearchTool",
    "UpdateFile",
    "WebSearchPreviewTool",
    "WebSearchPreviewTool20250311",
    "WebSearchTool",
    "WebSearchTool20250826",
    "answered_call_id",
    "approval_name",
    "as_items",
    "call_name",
    "is_approval_name",
    "is_cut",
    "is_hosted",
    "item_text",
    "output_text",
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


# --- calls of the other client-executed tools, and their outputs -----------
# Shapes from openai-python (``response_custom_tool_call.py``,
# ``response_input_item.py``...): the fields that say what to run are
# required; ``id`` and ``status`` are optional on input, as for function calls.


class CustomToolCall(_Tagged, frozen=True, tag="custom_tool_call"):
    """A call of a ``custom`` tool: ``input`` is free text."""

    call_id: str
    name: str
    input: str
    id: str | UnsetType = UNSET
    status: ItemStatus | UnsetType = UNSET
    namespace: str | UnsetType | None = UNSET


class CustomToolCallOutput(_Tagged, frozen=True, tag="custom_tool_call_output"):
    call_id: str
    output: str | list[ContentPart]
    id: str | UnsetType = UNSET
    status: ItemStatus | UnsetType = UNSET


class LocalShellExec(_Tagged, frozen=True, tag="exec"):
    """What a ``local_shell_call`` runs: an argv, its environment."""

    command: list[str]
    env: dict[str, str]
    timeout_ms: int | UnsetType | None = UNSET
    user: str | UnsetType | None = UNSET
    working_directory: str | UnsetType | None = UNSET


class LocalShellCall(_Tagged, frozen=True, tag="local_shell_call"):
    call_id: str
    action: LocalShellExec
    id: str | UnsetType = UNSET
    status: ItemStatus | UnsetType = UNSET


class LocalShellCallOutput(_Tagged, frozen=True, tag="local_shell_call_output"):
    """The output of a ``local_shell_call``. The SDK names the call by ``id``
    (its type says "the ID of the local shell tool call"); the guide's
    examples send ``call_id``. Either is accepted; ``call_id`` wins
    (:func:`answered_call_id`)."""

    output: str
    id: str | UnsetType = UNSET
    call_id: str | UnsetType = UNSET
    status: ItemStatus | UnsetType = UNSET


class ShellAction(Struct, frozen=True, kw_only=True):
    """What a ``shell_call`` runs: command lines, in order."""

    commands: list[str]
    max_output_length: int | UnsetType | None = UNSET
    timeout_ms: int | UnsetType | None = UNSET


class ShellCall(_Tagged, frozen=True, tag="shell_call"):
    call_id: str
    action: ShellAction
    id: str | UnsetType = UNSET
    status: ItemStatus | UnsetType = UNSET
    environment: dict[str, Any] | UnsetType | None = UNSET


class ShellTimeout(_Tagged, frozen=True, tag="timeout"):
    pass


class ShellExit(_Tagged, frozen=True, tag="exit"):
    exit_code: int


class ShellOutput(Struct, frozen=True, kw_only=True):
    """One command's result in a ``shell_call_output``."""

    stdout: str
    stderr: str
    outcome: ShellTimeout | ShellExit


class ShellCallOutput(_Tagged, frozen=True, tag="shell_call_output"):
    call_id: str
    output: list[ShellOutput]
    id: str | UnsetType = UNSET
    status: ItemStatus | UnsetType = UNSET
    max_output_length: int | UnsetType | None = UNSET


class CreateFile(_Tagged, frozen=True, tag="create_file"):
    path: str
    diff: str


class UpdateFile(_Tagged, frozen=True, tag="update_file"):
    path: str
    diff: str


class DeleteFile(_Tagged, frozen=True, tag="delete_file"):
    path: str


PatchOperation = CreateFile | UpdateFile | DeleteFile


class ApplyPatchCall(_Tagged, frozen=True, tag="apply_patch_call"):
    call_id: str
    operation: PatchOperation
    id: str | UnsetType = UNSET
    status: Literal["in_progress", "completed"] | UnsetType = UNSET


class ApplyPatchCallOutput(_Tagged, frozen=True, tag="apply_patch_call_output"):
    call_id: str
    status: Literal["completed", "failed"]
    output: str | UnsetType | None = UNSET
    id: str | UnsetType = UNSET


class ComputerCall(_Tagged, frozen=True, tag="computer_call"):
    """A ``computer`` / ``computer_use_preview`` call: one ``action`` (or a
    batch, ``actions``), each ``{"type": "click" | "screenshot" | ..., ...}``."""

    call_id: str
    action: dict[str, Any] | UnsetType | None = UNSET
    actions: list[dict[str, Any]] | UnsetType | None = UNSET
    pending_safety_checks: list[dict[str, Any]] = msgspec.field(default_factory=list)
    id: str | UnsetType = UNSET
    status: ItemStatus | UnsetType = UNSET


class ComputerScreenshot(_Tagged, frozen=True, tag="computer_screenshot"):
    image_url: str | UnsetType | None = UNSET
    file_id: str | UnsetType | None = UNSET


class ComputerCallOutput(_Tagged, frozen=True, tag="computer_call_output"):
    call_id: str
    output: ComputerScreenshot
    acknowledged_safety_checks: list[dict[str, Any]] | UnsetType | None = UNSET
    id: str | UnsetType = UNSET
    status: ItemStatus | UnsetType = UNSET


class Reasoning(_Tagged, frozen=True, tag="reasoning"):
    """Passed through: kept in context and replayed, never interpreted."""

    id: str | UnsetType = UNSET
    summary: list[SummaryText] = msgspec.field(default_factory=list)
    content: list[ReasoningText] | UnsetType = UNSET
    encrypted_content: str | UnsetType | None = UNSET
    status: ItemStatus | UnsetType = UNSET


# --- the hosted mcp tool's items -------------------------------------------
# Shapes from openai-python (``response_output_item.py``: ``McpListTools``,
# ``McpCall``, ``McpApprovalRequest``; ``response_input_item.py``:
# ``McpApprovalResponse``). The server writes the first three; a client
# replays them as input and answers an approval request with the fourth.


class McpListedTool(Struct, frozen=True, kw_only=True):
    """One tool of an MCP server's listing."""

    name: str
    input_schema: Any
    description: str | UnsetType | None = UNSET
    annotations: Any | UnsetType = UNSET


class McpListTools(_Tagged, frozen=True, tag="mcp_list_tools"):
    """The tools an MCP server offers (``allowed_tools`` applied); ``error`` when
    the listing failed."""

    server_label: str
    tools: list[McpListedTool]
    id: str | UnsetType = UNSET
    error: str | UnsetType | None = UNSET


class McpCall(_Tagged, frozen=True, tag="mcp_call"):
    """A call the server made to an MCP server: ``output``, or ``error`` (one of
    ``{"type": "mcp_protocol_error" | "http_error", "code", "message"}``,
    ``{"type": "mcp_tool_execution_error", "content"}``)."""

    server_label: str
    name: str
    arguments: str
    id: str | UnsetType = UNSET
    approval_request_id: str | UnsetType | None = UNSET
    output: str | UnsetType | None = UNSET
    error: dict[str, Any] | UnsetType | None = UNSET
    status: Literal["in_progress", "completed", "incomplete", "calling", "failed"] | UnsetType = (
        UNSET
    )


class McpApprovalRequest(_Tagged, frozen=True, tag="mcp_approval_request"):
    """The model's call of an MCP tool that needs the client's approval first; the
    answer names it by ``id``."""

    id: str
    server_label: str
    name: str
    arguments: str


class McpApprovalResponse(_Tagged, frozen=True, tag="mcp_approval_response"):
    """Input: the client approves (or not) the request ``approval_request_id``."""

    approval_request_id: str
    approve: bool
    id: str | UnsetType | None = UNSET
    reason: str | UnsetType | None = UNSET


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


Item = (
    Message
    | FunctionCall
    | FunctionCallOutput
    | CustomToolCall
    | CustomToolCallOutput
    | LocalShellCall
    | LocalShellCallOutput
    | ShellCall
    | ShellCallOutput
    | ApplyPatchCall
    | ApplyPatchCallOutput
    | ComputerCall
    | ComputerCallOutput
    | Reasoning
    | McpListTools
    | McpCall
    | McpApprovalRequest
    | McpApprovalResponse
    | Compaction
    | CompactionTrigger
)



class ItemReference(_Tagged, frozen=True, tag="item_reference"):
    """Input only: an item of the client's stored responses, named by its ``id``
    (``{"type": "item_reference", "id": ...}``, or the bare ``{"id": ...}``).

    The server replaces it with the stored item before anything reads the
    input; no :data:`Item` is ever a reference (:func:`as_items` refuses one).
    """

    id: str


#: An item of a request's ``input`` as sent: an item, or a reference to a stored one.
InputItem = Item | ItemReference

#: A call of a client-executed tool: the client runs it and answers by ``call_id``.
ClientCall = (
    FunctionCall | CustomToolCall | LocalShellCall | ShellCall | ApplyPatchCall | ComputerCall
)
#: The answer to a :data:`ClientCall`, whatever its kind.
CallOutput = (
    FunctionCallOutput
    | CustomToolCallOutput
    | LocalShellCallOutput
    | ShellCallOutput
    | ApplyPatchCallOutput
    | ComputerCallOutput
)


def call_name(call: ClientCall) -> str:
    """The tool a call names: a function's or custom tool's name (namespaced as
    ``namespace.name``), else the built-in tool's type (``shell``...)."""
    if isinstance(call, FunctionCall | CustomToolCall):
        return f"{call.namespace}.{call.name}" if isinstance(call.namespace, str) else call.name
    if isinstance(call, LocalShellCall):
        return "local_shell"
    if isinstance(call, ShellCall):
        return "shell"
    if isinstance(call, ApplyPatchCall):
        return "apply_patch"
    return "computer"


#: How an MCP approval request's name begins where it waits beside calls.
_APPROVAL_PREFIX: Final = "mcp:"


def approval_name(request: McpApprovalRequest) -> str:
    """The name an MCP approval request waits under, beside the calls' names
    (:func:`call_name`): ``mcp:<server_label>.<name>``."""
    return f"{_APPROVAL_PREFIX}{request.server_label}.{request.name}"


def is_approval_name(name: str) -> bool:
    """Whether a waiting name is an MCP approval request's (:func:`approval_name`)."""
    return name.startswith(_APPROVAL_PREFIX)


def is_cut(call: ClientCall) -> bool:
    """A call cut short by the output budget (``incomplete``): it never runs and gets no output."""
    return call.status == "incomplete"


def answered_call_id(output: CallOutput) -> str:
    """The ``call_id`` an output answers (a ``local_shell_call_output`` may name
    it by ``id``; empty if it names none)."""
    if isinstance(output, LocalShellCallOutput):
        if isinstance(output.call_id, str):
            return output.call_id
        return output.id if isinstance(output.id, str) else ""
    return output.call_id


def output_text(output: CallOutput) -> str:
    """The plain text of a tool output (what the model reads of it)."""
    if isinstance(output, FunctionCallOutput | CustomToolCallOutput):
        return item_text(output.output)
    if isinstance(output, LocalShellCallOutput):
        return output.output
    if isinstance(output, ShellCallOutput):
        return "\n".join(part.stdout + part.stderr for part in output.output)
    if isinstance(output, ApplyPatchCallOutput):
        return output.output if isinstance(output.output, str) else output.status
    return "computer_screenshot"


def as_items(value: str | Sequence[InputItem]) -> list[Item]:
    """An ``input`` as items: a bare string is one user message (shipped rule).

    Item references must have been resolved first (the server does so where it
    receives a request); one left raises :class:`ValueError` (the caller broke
    that rule), and nothing changes.
    """
    if isinstance(value, str):
        return [Message(role="user", content=value)]
    items: list[Item] = []
    for item in value:
        if isinstance(item, ItemReference):
            raise ValueError(f"the item reference {item.id!r} was not resolved")
        items.append(item)
    return items


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
#
# Every type of the official SDKs' ``Tool`` union (openai-python
# ``types/responses/tool.py``). Fields the SDK requires are required here;
# the optional ones this project does not read are modelled loosely so they
# are echoed back in the Response's ``tools``; unknown fields are ignored, as
# on every item. Which kinds the client runs and which are hosted (accepted,
# echoed, never offered to the model): :data:`ClientTool`,
# :func:`is_hosted` (SPEC "Tool types").

_Loose = dict[str, Any]


class FunctionTool(_Tagged, frozen=True, tag="function"):
    """A client-side function tool: the client runs it and appends the output."""

    name: str
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class CustomTextFormat(_Tagged, frozen=True, tag="text"):
    """A custom tool's input is unconstrained text."""


class CustomGrammarFormat(_Tagged, frozen=True, tag="grammar"):
    """A custom tool's input follows a grammar (``lark`` or ``regex``)."""

    definition: str
    syntax: Literal["lark", "regex"]


CustomToolFormat = CustomTextFormat | CustomGrammarFormat


class CustomTool(_Tagged, frozen=True, tag="custom"):
    """A client-side tool called with free text (``custom_tool_call.input``)."""

    name: str
    description: str | UnsetType | None = UNSET
    format: CustomToolFormat | UnsetType | None = UNSET


class NamespaceTool(_Tagged, frozen=True, tag="namespace"):
    """A named group of function and custom tools; their calls carry ``namespace``."""

    name: str
    description: str
    tools: list[FunctionTool | CustomTool]


class LocalShellTool(_Tagged, frozen=True, tag="local_shell"):
    """The client runs ``local_shell_call`` actions (an argv) and answers them."""


class ShellTool(_Tagged, frozen=True, tag="shell"):
    """The client runs ``shell_call`` actions (command lines) and answers them."""

    environment: _Loose | UnsetType | None = UNSET


class ApplyPatchTool(_Tagged, frozen=True, tag="apply_patch"):
    """The client applies ``apply_patch_call`` operations and answers them."""


class ComputerTool(_Tagged, frozen=True, tag="computer"):
    """The client performs ``computer_call`` actions and answers with a screenshot."""


class ComputerUsePreviewTool(_Tagged, frozen=True, tag="computer_use_preview"):
    """The preview computer tool: its display and environment are declared."""

    display_height: int
    display_width: int
    environment: Literal["windows", "mac", "linux", "ubuntu", "browser"]


class FileSearchTool(_Tagged, frozen=True, tag="file_search"):
    """Hosted: search of vector stores."""

    vector_store_ids: list[str]
    filters: _Loose | UnsetType | None = UNSET
    max_num_results: int | UnsetType | None = UNSET
    ranking_options: _Loose | UnsetType | None = UNSET


class WebSearchTool(_Tagged, frozen=True, tag="web_search"):
    """Hosted: web search (Codex sends ``{"type": "web_search", "external_web_access": false}``)."""

    external_web_access: bool | UnsetType | None = UNSET
    filters: _Loose | UnsetType | None = UNSET
    search_context_size: Literal["low", "medium", "high"] | UnsetType | None = UNSET
    user_location: _Loose | UnsetType | None = UNSET


class WebSearchTool20250826(WebSearchTool, frozen=True, tag="web_search_2025_08_26"):
    """``web_search``'s dated name."""


class WebSearchPreviewTool(_Tagged, frozen=True, tag="web_search_preview"):
    """Hosted: the preview web search."""

    search_content_types: list[Literal["text", "image"]] | UnsetType | None = UNSET
    search_context_size: Literal["low", "medium", "high"] | UnsetType | None = UNSET
    user_location: _Loose | UnsetType | None = UNSET


class WebSearchPreviewTool20250311(
    WebSearchPreviewTool, frozen=True, tag="web_search_preview_2025_03_11"
):
    """``web_search_preview``'s dated name."""


class McpTool(_Tagged, frozen=True, tag="mcp"):
    """Hosted: a remote MCP server's tools."""

    server_label: str
    server_url: str | UnsetType | None = UNSET
    connector_id: str | UnsetType | None = UNSET
    tunnel_id: str | UnsetType | None = UNSET
    server_description: str | UnsetType | None = UNSET
    allowed_tools: list[str] | _Loose | UnsetType | None = UNSET
    require_approval: str | _Loose | UnsetType | None = UNSET
    headers: dict[str, str] | UnsetType | None = UNSET
    authorization: str | UnsetType | None = UNSET
    defer_loading: bool | UnsetType | None = UNSET


class CodeInterpreterTool(_Tagged, frozen=True, tag="code_interpreter"):
    """Hosted: runs Python in a container (an id, or ``{"type": "auto", ...}``)."""

    container: str | _Loose


class ImageGenerationTool(_Tagged, frozen=True, tag="image_generation"):
    """Hosted: image generation."""

    model: str | UnsetType | None = UNSET
    action: Literal["generate", "edit", "auto"] | UnsetType | None = UNSET
    size: str | UnsetType | None = UNSET
    quality: str | UnsetType | None = UNSET
    output_format: str | UnsetType | None = UNSET
    background: str | UnsetType | None = UNSET
    partial_images: int | UnsetType | None = UNSET


class ToolSearchTool(_Tagged, frozen=True, tag="tool_search"):
    """Hosted: finds deferred tools (``defer_loading``)."""

    description: str | UnsetType | None = UNSET
    execution: Literal["server", "client"] | UnsetType | None = UNSET
    parameters: Any = UNSET


class ProgrammaticToolCallingTool(_Tagged, frozen=True, tag="programmatic_tool_calling"):
    """Hosted: the model writes programs that call tools."""


Tool = (
    FunctionTool
    | CustomTool
    | NamespaceTool
    | LocalShellTool
    | ShellTool
    | ApplyPatchTool
    | ComputerTool
    | ComputerUsePreviewTool
    | FileSearchTool
    | WebSearchTool
    | WebSearchTool20250826
    | WebSearchPreviewTool
    | WebSearchPreviewTool20250311
    | McpTool
    | CodeInterpreterTool
    | ImageGenerationTool
    | ToolSearchTool
    | ProgrammaticToolCallingTool
)

#: The tool kinds the client runs: offered to the model, called in their own
#: item shapes, answered by their own output items.
ClientTool = (
    FunctionTool
    | CustomTool
    | NamespaceTool
    | LocalShellTool
    | ShellTool
    | ApplyPatchTool
    | ComputerTool
    | ComputerUsePreviewTool
)


def is_hosted(tool: Tool) -> bool:
    """A kind the platform runs (web search, file search, MCP, ...): this server
    accepts and echoes it but never offers it to the model."""
    return not isinstance(tool, ClientTool)


# --- tool_choice -------------------------------------------------------------


class ToolChoiceFunction(_Tagged, frozen=True, tag="function"):
    name: str


class ToolChoiceCustom(_Tagged, frozen=True, tag="custom"):
    name: str


class ToolChoiceAllowed(_Tagged, frozen=True, tag="allowed_tools"):
    """Only these tools (``{"type": ..., "name"?: ...}`` each) may be called;
    ``required``: at least one must be."""

    mode: Literal["auto", "required"]
    tools: list[dict[str, Any]]


class ToolChoiceMcp(_Tagged, frozen=True, tag="mcp"):
    server_label: str
    name: str | UnsetType | None = UNSET


class ToolChoiceApplyPatch(_Tagged, frozen=True, tag="apply_patch"):
    pass


class ToolChoiceShell(_Tagged, frozen=True, tag="shell"):
    pass


class ToolChoiceProgrammatic(_Tagged, frozen=True, tag="programmatic_tool_calling"):
    pass


class ToolChoiceComputer(_Tagged, frozen=True, tag="computer"):
    pass


class ToolChoiceComputerUsePreview(_Tagged, frozen=True, tag="computer_use_preview"):
    pass


class ToolChoiceComputerUse(_Tagged, frozen=True, tag="computer_use"):
    pass


class ToolChoiceFileSearch(_Tagged, frozen=True, tag="file_search"):
    pass


class ToolChoiceWebSearchPreview(_Tagged, frozen=True, tag="web_search_preview"):
    pass


class ToolChoiceWebSearchPreview20250311(_Tagged, frozen=True, tag="web_search_preview_2025_03_11"):
    pass


class ToolChoiceImageGeneration(_Tagged, frozen=True, tag="image_generation"):
    pass


class ToolChoiceCodeInterpreter(_Tagged, frozen=True, tag="code_interpreter"):
    pass


ToolChoice = (
    Literal["auto", "none", "required"]
    | ToolChoiceFunction
    | ToolChoiceCustom
    | ToolChoiceAllowed
    | ToolChoiceMcp
    | ToolChoiceApplyPatch
    | ToolChoiceShell
    | ToolChoiceProgrammatic
    | ToolChoiceComputer
    | ToolChoiceComputerUsePreview
    | ToolChoiceComputerUse
    | ToolChoiceFileSearch
    | ToolChoiceWebSearchPreview
    | ToolChoiceWebSearchPreview20250311
    | ToolChoiceImageGeneration
    | ToolChoiceCodeInterpreter
)
