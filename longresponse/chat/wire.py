"""The Chat Completions wire format: requests, answers and stream chunks as msgspec Structs.

Theory of operation
-------------------
``POST /v1/chat/completions`` is the API every inference engine serves
(vLLM, llama.cpp's server, Ollama, SGLang, OpenAI). This module is its
vocabulary, in both directions, so the server decodes a request with it and
a backend that calls such an engine can encode one:

- :class:`ChatRequest`, decoded by :func:`decode_chat_request` with unknown
  fields refused (``unknown_parameter``, with the field's ``param``), so a
  typo never goes unnoticed. The engine extras llama.cpp takes
  (``cache_prompt``, ``id_slot``) and OpenAI's ``prompt_cache_key`` are
  legal and change nothing here (one process has one prefix cache).
- messages are a union tagged by ``role`` (``system``, ``developer``,
  ``user``, ``assistant`` with ``tool_calls``, ``tool`` with
  ``tool_call_id``); content is a string or a non-empty list of parts,
  each with its ``type`` (only ``text`` is read: ``image_url``,
  ``input_audio`` and ``file`` are refused by the mapping); an assistant
  message may carry the fields the SDK puts on its own messages;
- fields the SDK types that this server cannot honour (``logprobs: true``,
  ``stop``, ``logit_bias``...) decode, then :func:`unsupported_field`
  refuses them (``unsupported_parameter``), while ``logprobs: false``,
  ``stop: null``, ``service_tier`` and ``stream_options.include_obfuscation``
  (sent by gateways by default) are accepted;
- :class:`ChatCompletion` (``object: "chat.completion"``) and
  :class:`ChatCompletionChunk` (``object: "chat.completion.chunk"``), the
  shapes the official SDK parses; a chunk's tool calls are index-based
  deltas (:class:`ToolCallDelta`);
- what only an engine sends (its stream records read leniently, its error
  objects) is in :mod:`.upstream`, built from these same deltas and usage.

A msgspec validation error becomes a :class:`RemoteProtocolError` carrying
the shipped ``code`` and a ``param`` in the shipped spelling
(``messages[2].tool_call_id``). Nothing here knows a socket or a model.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from protocol import ErrorCode, RemoteProtocolError, validation_refusal
from protocol.events import AtLeastOne, Metadata, Penalty, Temperature, TopP

__all__ = [
    "AssistantMessage",
    "AudioPart",
    "ChatChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatMessage",
    "ChatRequest",
    "ChatTool",
    "ChatToolChoice",
    "ChatUsage",
    "ChunkChoice",
    "ChunkDelta",
    "CompletionTokensDetails",
    "DeveloperMessage",
    "FilePart",
    "FunctionCallDelta",
    "FunctionDefinition",
    "FunctionName",
    "ImagePart",
    "JSONSchemaSpec",
    "NamedToolChoice",
    "OtherPart",
    "PromptTokensDetails",
    "ReplyFunction",
    "ReplyMessage",
    "ReplyToolCall",
    "ResponseFormat",
    "ResponseFormatJSONObject",
    "ResponseFormatJSONSchema",
    "ResponseFormatText",
    "StreamOptions",
    "SystemMessage",
    "TextPart",
    "TokenizeRequest",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallFunction",
    "ToolMessage",
    "UserMessage",
    "decode_chat_chunk",
    "decode_chat_completion",
    "decode_chat_request",
    "decode_tokenize_request",
    "unsupported_field",
]


# --- requests ----------------------------------------------------------------


class _Strict(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A request object: unknown fields are refused (``unknown_parameter``)."""


class TextPart(_Strict, frozen=True, tag_field="type", tag="text"):
    text: str


class RefusalPart(_Strict, frozen=True, tag_field="type", tag="refusal"):
    refusal: str


class OtherPart(Struct, frozen=True, kw_only=True, tag_field="type"):
    """A content part this server does not read (an image, audio, a file). It
    is decoded so that every part's ``type`` is required (a lone tagged
    Struct would take a part without one), then refused by the mapping."""


class ImagePart(OtherPart, frozen=True, tag="image_url"):
    pass


class AudioPart(OtherPart, frozen=True, tag="input_audio"):
    pass


class FilePart(OtherPart, frozen=True, tag="file"):
    pass


Content = str | Annotated[list[TextPart | ImagePart | AudioPart | FilePart], Meta(min_length=1)]


class ToolCallFunction(_Strict, frozen=True):
    name: str
    arguments: str
    #: The SDK's ``parse()`` adds the decoded arguments: accepted, ignored.
    parsed_arguments: Any = UNSET


class ToolCall(_Strict, frozen=True):
    """A call an assistant message made: ``{id, type: "function", function}``
    (``index``: left by the SDK's stream accumulator; accepted, ignored)."""

    id: str
    type: Literal["function"]
    function: ToolCallFunction
    index: int | UnsetType = UNSET


class _Message(_Strict, frozen=True, tag_field="role"):
    """A chat message; ``role`` is its tag."""


class SystemMessage(_Message, frozen=True, tag="system"):
    content: Content
    name: str | UnsetType = UNSET


class DeveloperMessage(_Message, frozen=True, tag="developer"):
    content: Content
    name: str | UnsetType = UNSET


class UserMessage(_Message, frozen=True, tag="user"):
    content: Content
    name: str | UnsetType = UNSET


class AssistantMessage(_Message, frozen=True, tag="assistant"):
    """An earlier model turn: text, tool calls or both (``reasoning_content``:
    the vLLM / DeepSeek field for the model's reasoning).

    The fields the official SDK puts on its own messages (``annotations``,
    ``audio``, ``function_call``, ``parsed``; ``refusal``), so a client may
    append ``choices[0].message`` as it came, are accepted and ignored.
    """

    content: str | Annotated[list[TextPart | RefusalPart], Meta(min_length=1)] | None = None
    tool_calls: list[ToolCall] | UnsetType | None = UNSET
    refusal: str | UnsetType | None = UNSET
    reasoning_content: str | UnsetType | None = UNSET
    name: str | UnsetType = UNSET
    annotations: list[Any] | UnsetType | None = UNSET
    audio: Any = UNSET
    function_call: Any = UNSET
    parsed: Any = UNSET


class ToolMessage(_Message, frozen=True, tag="tool"):
    content: Content
    tool_call_id: str


ChatMessage = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


class FunctionDefinition(_Strict, frozen=True, omit_defaults=True):
    """A function tool (sent by a backend with the unset fields left out)."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Strict, frozen=True, kw_only=True):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(_Strict, frozen=True):
    name: str


class NamedToolChoice(_Strict, frozen=True):
    """``{"type": "function", "function": {"name": ...}}``: call this tool."""

    type: Literal["function"]
    function: FunctionName


ChatToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ResponseFormatText(_Strict, frozen=True, tag_field="type", tag="text"):
    pass


class ResponseFormatJSONObject(_Strict, frozen=True, tag_field="type", tag="json_object"):
    pass


class JSONSchemaSpec(_Strict, frozen=True):
    name: str
    schema: dict[str, Any] = msgspec.field(default_factory=dict)
    description: str | None = None
    strict: bool | None = False


class ResponseFormatJSONSchema(_Strict, frozen=True, tag_field="type", tag="json_schema"):
    json_schema: JSONSchemaSpec


ResponseFormat = ResponseFormatText | ResponseFormatJSONObject | ResponseFormatJSONSchema


class StreamOptions(_Strict, frozen=True):
    include_usage: bool = False
    #: OpenAI's padding of stream events against side channels: nothing to pad here.
    include_obfuscation: bool | None = None


class ChatRequest(_Strict, frozen=True):
    """A ``POST /v1/chat/completions`` body (the fields this server takes)."""

    model: str
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    tools: list[ChatTool] | None = None
    tool_choice: ChatToolChoice | None = None
    parallel_tool_calls: bool | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: AtLeastOne | None = None
    max_completion_tokens: AtLeastOne | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    n: int | None = None
    user: str | None = None
    metadata: Metadata | None = None
    response_format: ResponseFormat | None = None
    store: bool | None = None
    safety_identifier: str | None = None
    #: OpenAI's cache hint and llama.cpp's: accepted, nothing to do (one cache).
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    cache_prompt: bool | None = None
    id_slot: int | None = None
    #: Accepted as gateways send them by default; nothing to change here.
    service_tier: str | None = None
    #: Typed by the SDK, not supported: refused by :func:`unsupported_field`
    #: unless off (``false``, ``null``, empty).
    logprobs: bool | None = None
    top_logprobs: int | None = None
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None
    reasoning_effort: str | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    verbosity: str | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None


UNSUPPORTED_PARAMETER: Final = "unsupported_parameter"
#: The fields of :class:`ChatRequest` the SDK types but this server cannot honour.
_UNSUPPORTED: Final = (
    "logprobs", "top_logprobs", "stop", "logit_bias", "reasoning_effort", "modalities",
    "audio", "prediction", "web_search_options", "verbosity", "functions", "function_call",
)  # fmt: skip


def unsupported_field(request: ChatRequest) -> RemoteProtocolError | None:
    """The refusal of the first field set that this server does not support
    (``unsupported_parameter``, its ``param``), or None when there is none."""
    for name in _UNSUPPORTED:
        value = getattr(request, name)
        if value is None or value is False or value == {} or value == []:
            continue
        return RemoteProtocolError(
            f"Unsupported parameter: '{name}' is not supported by this server.",
            code=UNSUPPORTED_PARAMETER,
            param=name,
        )
    return None


class TokenizeRequest(_Strict, frozen=True):
    """``POST /tokenize`` (vLLM's shape): a ``prompt`` or chat ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ChatTool] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None


# --- answers -----------------------------------------------------------------
#
# What this server sends, and what a backend reads from an engine: unknown
# fields are ignored and the optional ones may be ``null`` (vLLM, llama.cpp
# and OpenAI each add and omit a few), so the same Structs decode them all.


class _Out(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An answer object: fields left UNSET are not sent."""


class PromptTokensDetails(Struct, frozen=True, kw_only=True):
    cached_tokens: int | None = 0


class CompletionTokensDetails(Struct, frozen=True, kw_only=True):
    reasoning_tokens: int | None = 0


class ChatUsage(Struct, frozen=True, kw_only=True):
    """Token counts (an engine may leave out any of them: 0, as llama.cpp's
    stream omits ``total_tokens``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


class ReplyFunction(Struct, frozen=True, kw_only=True):
    name: str
    arguments: str


class ReplyToolCall(Struct, frozen=True, kw_only=True):
    """A call in an answer (as :class:`ToolCall`, but read leniently)."""

    id: str
    function: ReplyFunction
    type: str = "function"


class ReplyMessage(Struct, frozen=True, kw_only=True):
    """``choices[0].message`` of a completion (``tool_calls`` only when there are;
    ``reasoning_content`` as vLLM sends it, never from the simulated models)."""

    role: str = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ReplyToolCall] | UnsetType | None = UNSET
    reasoning_content: str | UnsetType | None = UNSET


class ChatChoice(Struct, frozen=True, kw_only=True):
    index: int
    message: ReplyMessage
    #: ``stop``, ``length`` or ``tool_calls`` from this server.
    finish_reason: str | None
    logprobs: Any = None


class ChatCompletion(Struct, frozen=True, kw_only=True, tag_field="object", tag="chat.completion"):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage | None = None
    system_fingerprint: str | None = None


class FunctionCallDelta(_Out, frozen=True):
    name: str | UnsetType | None = UNSET
    arguments: str | UnsetType | None = UNSET


class ToolCallDelta(_Out, frozen=True):
    """One call's piece in a chunk: the first carries ``id``, ``type`` and the
    name (arguments ``""``); later ones the same ``index`` and argument text.
    (This server always sends ``index``; older Ollama leaves it out.)"""

    index: int | None = None
    id: str | UnsetType | None = UNSET
    type: str | UnsetType | None = UNSET
    function: FunctionCallDelta | UnsetType | None = UNSET


class ChunkDelta(_Out, frozen=True):
    role: str | UnsetType | None = UNSET
    content: str | UnsetType | None = UNSET
    #: The reasoning, as vLLM and DeepSeek name it (newer vLLM: ``reasoning``,
    #: read, never sent by this server).
    reasoning_content: str | UnsetType | None = UNSET
    reasoning: str | UnsetType | None = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType | None = UNSET


class ChunkChoice(Struct, frozen=True, kw_only=True):
    """A chunk's choice (this server sends all of it; an engine may leave out
    ``index``, meaning 0, or the ``delta``)."""

    index: int = 0
    delta: ChunkDelta | None = None
    finish_reason: str | None = None
    logprobs: Any = None


class ChatCompletionChunk(
    Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="object",
    tag="chat.completion.chunk",
):  # fmt: skip
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    #: ``null`` on every chunk when usage was asked for, then set on the last
    #: one (whose ``choices`` is empty); absent otherwise.
    usage: ChatUsage | UnsetType | None = UNSET
    #: ``null`` from this server, on every chunk (as on the completion).
    system_fingerprint: str | UnsetType | None = UNSET



# --- decoding ----------------------------------------------------------------

_request_decoder: Final = msgspec.json.Decoder(ChatRequest)
_tokenize_decoder: Final = msgspec.json.Decoder(TokenizeRequest)
_NOT_JSON: Final = (msgspec.DecodeError, RecursionError, UnicodeError)


def _refusal(exc: msgspec.ValidationError) -> RemoteProtocolError:
    """The shipped error for a body that decodes as JSON but not as the request."""
    return validation_refusal(
        exc, whole="the body", unknown="Unrecognized request argument supplied: '{param}'."
    )


def _decode(decoder: msgspec.json.Decoder[Any], data: bytes | bytearray) -> Any:
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _refusal(exc) from exc
    except _NOT_JSON as exc:
        raise RemoteProtocolError(
            "We could not parse the JSON body of your request.", code=ErrorCode.INVALID_JSON
        ) from exc


def decode_chat_request(data: bytes | bytearray) -> ChatRequest:
    """Decode a chat completions body. Raises :class:`RemoteProtocolError`."""
    request: ChatRequest = _decode(_request_decoder, data)
    return request


_completion_decoder: Final = msgspec.json.Decoder(ChatCompletion)
_chunk_decoder: Final = msgspec.json.Decoder(ChatCompletionChunk)


def decode_chat_completion(data: bytes | str) -> ChatCompletion:
    """An engine's ``chat.completion`` (raises ``msgspec.DecodeError``)."""
    return _completion_decoder.decode(data)


def decode_chat_chunk(data: bytes | str) -> ChatCompletionChunk:
    """One ``data:`` payload of an engine's stream (raises ``msgspec.DecodeError``)."""
    return _chunk_decoder.decode(data)


def decode_tokenize_request(data: bytes | bytearray) -> TokenizeRequest:
    """Decode a ``/tokenize`` body. Raises :class:`RemoteProtocolError`."""
    request: TokenizeRequest = _decode(_tokenize_decoder, data)
    return request
