"""Chat Completions <-> the engine's items: the pure mapping, both ways.

Theory of operation
-------------------
The engine speaks Responses items (``protocol.items``); an inference engine
speaks chat messages (``longresponse.chat.wire``). The mapping is
one-to-few and lossless for what both can say:

=============================== ==================================================
chat message                    items
=============================== ==================================================
``system`` / ``developer``      ``Message`` with that role
``user``                        ``Message`` role ``user``
``assistant``                   ``Reasoning`` (from ``reasoning_content``), then a
                                ``Message`` role ``assistant`` (its text, when it
                                has any), then one ``FunctionCall`` per tool call
``tool``                        ``FunctionCallOutput`` (``tool_call_id`` -> ``call_id``)
=============================== ==================================================

:func:`items_from_messages` reads a request (the server's direction) and
checks the conversation as OpenAI does: every ``tool`` message answers a call
of an earlier assistant message (``unknown_call_id``), no call id twice
(``duplicate_call_id``), and, for a completion, every call is answered before
the next non-tool message or the end (``missing_tool_output``), each with
a ``param`` naming the message. :func:`messages_from_items` is the reverse,
for a backend that sends a rollout's context to an engine: consecutive
assistant text and calls become one assistant message, as engines expect.
Tools, ``tool_choice`` and ``response_format`` map onto ``FunctionTool``,
``ToolChoice`` and ``TextFormat`` and back. Nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final, Literal

import msgspec

from protocol import ErrorCode, RemoteProtocolError
from protocol.items import (
    Compaction,
    CompactionTrigger,
    ContentPart,
    FunctionCall,
    FunctionCallOutput,
    FunctionTool,
    InputFile,
    InputImage,
    Item,
    McpCall,
    Message,
    OutputText,
    Reasoning,
    ReasoningText,
    Tool,
    ToolChoice,
    ToolChoiceAllowed,
    ToolChoiceFunction,
    ToolChoiceMcp,
    item_text,
)
from protocol.response import FormatJSONObject, FormatJSONSchema, FormatText, TextFormat

from ..engine.admission import TOOL_NAME_PATTERN
from ..engine.sampling import UpstreamError, latest_listings
from .wire import (
    AssistantMessage,
    AudioPart,
    ChatMessage,
    ChatTool,
    ChatToolChoice,
    Content,
    DeveloperMessage,
    FilePart,
    FunctionDefinition,
    FunctionName,
    ImagePart,
    JSONSchemaSpec,
    NamedToolChoice,
    OtherPart,
    RefusalPart,
    ResponseFormat,
    ResponseFormatJSONObject,
    ResponseFormatJSONSchema,
    ResponseFormatText,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolCallFunction,
    ToolMessage,
    UserMessage,
)

__all__ = [
    "McpFunction",
    "format_from_chat",
    "format_to_chat",
    "items_from_messages",
    "mcp_chat_name",
    "mcp_functions",
    "message_text",
    "messages_from_items",
    "tool_choice_from_chat",
    "tool_choice_to_chat",
    "tools_from_chat",
    "tools_to_chat",
]


_ROLES: Final[dict[type, Literal["system", "developer", "user"]]] = {
    SystemMessage: "system",
    DeveloperMessage: "developer",
    UserMessage: "user",
}


def message_text(content: str | Sequence[TextPart | RefusalPart | OtherPart] | None) -> str:
    """The text of a message's ``content`` (parts joined as they come; a part
    that is not text or a refusal adds nothing)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(
        part.text
        if isinstance(part, TextPart)
        else part.refusal
        if isinstance(part, RefusalPart)
        else ""
        for part in content
    )


def _read_text(content: str | Sequence[TextPart | OtherPart], where: str) -> str:
    """The text of a request message's ``content``; a part this server does
    not read is ``invalid_value`` (param ``<where>.content[i].type``)."""
    if not isinstance(content, str):
        for index, part in enumerate(content):
            if isinstance(part, OtherPart):
                param = f"{where}.content[{index}].type"
                raise RemoteProtocolError(
                    f"Invalid value for '{param}': this server reads text parts only.",
                    code=ErrorCode.INVALID_VALUE,
                    param=param,
                )
    return message_text(content)


# --- messages -> items (the server's direction) --------------------------------


def items_from_messages(messages: Sequence[ChatMessage], *, answered: bool = True) -> list[Item]:
    """The items of a chat conversation, checked (see the module docstring).

    With ``answered`` (a completion), every call must have its ``tool``
    message before the next other message and before the end; a count
    (``/tokenize``) leaves that out. Raises :class:`RemoteProtocolError`;
    nothing is kept.
    """
    items: list[Item] = []
    seen: set[str] = set()
    open_calls: dict[str, str] = {}  # call id -> param of the call, until answered
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if answered and open_calls and not isinstance(message, ToolMessage):
            _unanswered(open_calls)
        if isinstance(message, SystemMessage | DeveloperMessage | UserMessage):
            role = _ROLES[type(message)]
            items.append(Message(role=role, content=_read_text(message.content, where)))
        elif isinstance(message, AssistantMessage):
            items.extend(_assistant_items(message, where, seen, open_calls))
        else:
            if message.tool_call_id not in seen:
                raise RemoteProtocolError(
                    f"Invalid '{where}.tool_call_id': no earlier assistant message made a "
                    f"call with id {RemoteProtocolError.clip(message.tool_call_id)!r}.",
                    code=ErrorCode.UNKNOWN_CALL_ID,
                    param=f"{where}.tool_call_id",
                )
            open_calls.pop(message.tool_call_id, None)
            items.append(
                FunctionCallOutput(
                    call_id=message.tool_call_id, output=_read_text(message.content, where)
                )
            )
    if answered and open_calls:
        _unanswered(open_calls)
    return items


def _assistant_items(
    message: AssistantMessage, where: str, seen: set[str], open_calls: dict[str, str]
) -> list[Item]:
    items: list[Item] = []
    if isinstance(message.reasoning_content, str) and message.reasoning_content:
        items.append(Reasoning(content=[ReasoningText(text=message.reasoning_content)]))
    text = message_text(message.content)
    calls = message.tool_calls or []
    if text:
        items.append(Message(role="assistant", content=[OutputText(text=text)]))
    elif not calls:
        raise RemoteProtocolError(
            f"Missing required parameter: '{where}.content' (an assistant message "
            "without tool_calls needs content).",
            code=ErrorCode.MISSING_REQUIRED_PARAMETER,
            param=f"{where}.content",
        )
    for number, call in enumerate(calls):
        param = f"{where}.tool_calls[{number}].id"
        if call.id in seen:
            raise RemoteProtocolError(
                f"Invalid '{param}': the call id {RemoteProtocolError.clip(call.id)!r} is "
                "used twice.",
                code=ErrorCode.DUPLICATE_CALL_ID,
                param=param,
            )
        seen.add(call.id)
        open_calls[call.id] = param
        items.append(
            FunctionCall(
                call_id=call.id, name=call.function.name, arguments=call.function.arguments
            )
        )
    return items


def _unanswered(open_calls: dict[str, str]) -> None:
    call_id, param = next(iter(open_calls.items()))
    raise RemoteProtocolError(
        "An assistant message with 'tool_calls' must be followed by tool messages "
        f"responding to each 'tool_call_id'; {RemoteProtocolError.clip(call_id)!r} has none.",
        code=ErrorCode.MISSING_TOOL_OUTPUT,
        param=param,
    )


# --- items -> messages (a backend's direction) ---------------------------------


def messages_from_items(  # noqa: C901 (a branch per item type)
    items: Sequence[Item], instructions: str | None = None
) -> list[ChatMessage]:
    """The chat messages of a context: ``instructions`` as a leading system
    message, then the items (the reverse of :func:`items_from_messages`).

    Reasoning rides on the next assistant message as ``reasoning_content``;
    a compaction (opaque to an engine) and a compaction trigger are left out;
    a hosted MCP call that ran is the engine's call of its function
    (:func:`mcp_chat_name`) and the call's output (or error) as its result;
    listings and approvals are left out (the listed tools are the request's
    ``tools``: :func:`mcp_functions`).
    """
    messages: list[ChatMessage] = []
    if instructions:
        messages.append(SystemMessage(content=instructions))
    reasoning: list[str] = []
    assistant: AssistantMessage | None = None

    def flush() -> None:
        nonlocal assistant
        if assistant is not None:
            messages.append(assistant)
            assistant = None

    for item in items:
        if isinstance(item, Reasoning):
            flush()
            reasoning.extend(part.text for part in item.summary)
            if isinstance(item.content, list):
                reasoning.extend(part.text for part in item.content)
        elif isinstance(item, Message) and item.role == "assistant":
            flush()
            assistant = AssistantMessage(
                content=item_text(item.content), reasoning_content=_pop(reasoning)
            )
        elif isinstance(item, FunctionCall) and item.status == "incomplete":
            continue  # cut short (SPEC §16): it never ran; an engine wants a result per call
        elif isinstance(item, FunctionCall):
            call = ToolCall(
                id=item.call_id,
                type="function",
                function=ToolCallFunction(name=item.name, arguments=item.arguments),
            )
            if assistant is None:
                assistant = AssistantMessage(tool_calls=[], reasoning_content=_pop(reasoning))
            calls = assistant.tool_calls if isinstance(assistant.tool_calls, list) else []
            assistant = msgspec.structs.replace(assistant, tool_calls=[*calls, call])
        elif isinstance(item, FunctionCallOutput):
            flush()
            content = chat_content(item.output)
            messages.append(ToolMessage(tool_call_id=item.call_id, content=content))
        elif isinstance(item, McpCall) and item.status in ("completed", "failed"):
            # A hosted call the server made: the engine's call and its result.
            call_id = item.id if isinstance(item.id, str) else f"mcp_{len(messages)}"
            call = ToolCall(
                id=call_id,
                type="function",
                function=ToolCallFunction(
                    name=mcp_chat_name(item.server_label, item.name), arguments=item.arguments
                ),
            )
            flush()
            messages.append(AssistantMessage(tool_calls=[call], reasoning_content=_pop(reasoning)))
            result = item.output if isinstance(item.output, str) else _mcp_error(item.error)
            messages.append(ToolMessage(tool_call_id=call_id, content=result))
        elif isinstance(item, Message):
            flush()
            text = chat_content(item.content)
            if item.role == "system":
                messages.append(SystemMessage(content=text))
            elif item.role == "developer":
                messages.append(DeveloperMessage(content=text))
            else:
                messages.append(UserMessage(content=text))
        elif isinstance(item, Compaction | CompactionTrigger):
            continue
    flush()
    return messages


def chat_content(content: str | list[ContentPart]) -> Content:
    """A message's (or a tool output's) content as an engine is sent it: one
    text as a string, several as text parts (kept apart, as the client gave
    them). An image or a file cannot be carried to a Chat Completions engine
    by this server: refused, rather than left out unseen."""
    if isinstance(content, str):
        return content
    parts: list[TextPart | ImagePart | AudioPart | FilePart] = []
    for part in content:
        if isinstance(part, InputImage | InputFile):
            kind = "input_image" if isinstance(part, InputImage) else "input_file"
            raise UpstreamError(
                f"This model's engine takes text only; an {kind} part cannot be sent to it.",
                code=ErrorCode.INVALID_VALUE,
                status=400,
                param="input",
            )
        parts.append(TextPart(text=item_text([part])))
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return parts[0].text
    return parts or ""


def _pop(reasoning: list[str]) -> str | msgspec.UnsetType:
    if not reasoning:
        return msgspec.UNSET
    text = "\n".join(reasoning)
    reasoning.clear()
    return text


# --- tools, tool_choice, response_format ---------------------------------------


def tools_from_chat(tools: Sequence[ChatTool] | None) -> list[FunctionTool]:
    """``tools[i].function`` as the engine's function tools."""
    return [
        FunctionTool(
            name=tool.function.name,
            parameters=tool.function.parameters,
            strict=tool.function.strict,
            description=tool.function.description,
        )
        for tool in tools or ()
    ]


def tools_to_chat(tools: Sequence[Tool]) -> list[ChatTool]:
    """The engine's function tools as chat ``tools`` (the reverse of :func:`tools_from_chat`).

    Only top-level function tools: a Chat Completions engine has no custom,
    namespace or built-in tools (they are not offered to it)."""
    return [
        ChatTool(
            function=FunctionDefinition(
                name=tool.name,
                description=tool.description,
                parameters=tool.parameters,
                strict=tool.strict,
            )
        )
        for tool in tools
        if isinstance(tool, FunctionTool)
    ]


def tool_choice_from_chat(
    choice: ChatToolChoice | None, tools: Sequence[FunctionTool]
) -> ToolChoice:
    """The engine's ``tool_choice``; a named tool must be among ``tools``.

    Absent, it is ``auto`` with tools and ``none`` without. Without tools
    only ``none`` may be given: any other choice (``auto`` included), or a
    name that is not a tool, is ``invalid_value`` (param ``tool_choice``, or
    ``tool_choice.function.name``).
    """
    if choice is None:
        return "auto" if tools else "none"
    if not tools and choice != "none":
        raise RemoteProtocolError(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' "
            "are specified.",
            code=ErrorCode.INVALID_VALUE,
            param="tool_choice",
        )
    if isinstance(choice, NamedToolChoice):
        if not any(tool.name == choice.function.name for tool in tools):
            raise RemoteProtocolError(
                f"Invalid value for 'tool_choice.function.name': no tool is named "
                f"{choice.function.name!r}.",
                code=ErrorCode.INVALID_VALUE,
                param="tool_choice.function.name",
            )
        return ToolChoiceFunction(name=choice.function.name)
    return choice


@dataclasses.dataclass(frozen=True, slots=True)
class McpFunction:
    """A listed tool of an MCP server, as a chat engine is offered it."""

    server_label: str
    name: str
    tool: ChatTool


def mcp_chat_name(server_label: str, name: str) -> str:
    """The function name a chat engine knows a listed MCP tool by."""
    return f"{server_label}__{name}"


def mcp_functions(tools: Sequence[Tool], context: Sequence[Item]) -> dict[str, McpFunction]:
    """The tools of every ``mcp`` server of ``tools`` that ``context`` lists
    (its latest listing), by their chat name (:func:`mcp_chat_name`); a tool
    whose chat name a Chat Completions API would refuse, or which a function
    tool's name already takes, is not offered."""
    listings = latest_listings(tools, context)
    if not listings:
        return {}
    taken = {tool.name for tool in tools if isinstance(tool, FunctionTool)}
    offered: dict[str, McpFunction] = {}
    for label, listing in listings.items():
        for listed in listing.tools:
            name = mcp_chat_name(label, listed.name)
            if name in taken or name in offered or not TOOL_NAME_PATTERN.fullmatch(name):
                continue
            schema = listed.input_schema if isinstance(listed.input_schema, dict) else None
            description = listed.description if isinstance(listed.description, str) else None
            definition = FunctionDefinition(
                name=name, description=description, parameters=schema or {"type": "object"}
            )
            offered[name] = McpFunction(label, listed.name, ChatTool(function=definition))
    return offered


def _mcp_error(error: object) -> str:
    """What a failed hosted call's result says to the engine."""
    if isinstance(error, dict):
        if isinstance(error.get("message"), str):
            return f"Error: {error['message']}"
        texts = [part.get("text") for part in error.get("content") or [] if isinstance(part, dict)]
        if texts:
            return "Error: " + " ".join(str(text) for text in texts)
    return "Error: the tool call failed."


def tool_choice_to_chat(choice: ToolChoice) -> ChatToolChoice:
    """A ``tool_choice`` a chat engine can take: one naming another kind of tool
    than a function is ``auto`` there (``required`` for ``allowed_tools`` in
    ``required`` mode)."""
    if isinstance(choice, ToolChoiceFunction):
        return NamedToolChoice(type="function", function=FunctionName(name=choice.name))
    if isinstance(choice, str):
        return choice
    if isinstance(choice, ToolChoiceAllowed) and choice.mode == "required":
        return "required"
    if isinstance(choice, ToolChoiceMcp):  # a listed tool of that server, or any
        if isinstance(choice.name, str):
            name = mcp_chat_name(choice.server_label, choice.name)
            return NamedToolChoice(type="function", function=FunctionName(name=name))
        return "required"
    return "auto"


def format_from_chat(response_format: ResponseFormat | None) -> TextFormat | None:
    """``response_format`` as the engine's ``text.format`` (checked at admission)."""
    if response_format is None or isinstance(response_format, ResponseFormatText):
        return None if response_format is None else FormatText()
    if isinstance(response_format, ResponseFormatJSONObject):
        return FormatJSONObject()
    spec = response_format.json_schema
    return FormatJSONSchema(
        name=spec.name, schema=spec.schema, description=spec.description, strict=spec.strict
    )


def format_to_chat(text_format: TextFormat | None) -> ResponseFormat | None:
    if text_format is None:
        return None
    if isinstance(text_format, FormatJSONSchema):
        return ResponseFormatJSONSchema(
            json_schema=JSONSchemaSpec(
                name=text_format.name,
                schema=text_format.schema,
                description=text_format.description,
                strict=text_format.strict,
            )
        )
    if isinstance(text_format, FormatJSONObject):
        return ResponseFormatJSONObject()
    return ResponseFormatText()
