"""What only an engine sends: its stream records and its errors, read leniently.

The ``chat`` backend reads an engine's ``POST /chat/completions`` stream with
the same choices, deltas and usage this server sends
(:mod:`longresponse.chat.wire`), wrapped in a :class:`ChunkRecord` that asks
for nothing else: ``id``, ``model`` and ``object`` need not be there, unknown
fields are ignored, and a record may instead be an engine's mid-stream error
(:class:`ChatError`), in OpenAI's shape or vLLM's. llama.cpp's server adds
its running counts to a record when asked (:class:`EngineTimings`, with
``timings_per_token``; :class:`PromptProgress`, with ``return_progress``).
This server never sends these; it only reads them. Nothing here does I/O.
"""

from __future__ import annotations

from typing import Final

import msgspec
from msgspec import Struct

from .wire import ChatUsage, ChunkChoice

__all__ = [
    "ChatError",
    "ChunkRecord",
    "EngineTimings",
    "PromptProgress",
    "decode_chat_error",
    "decode_chunk_record",
]


class ChatError(Struct, frozen=True, kw_only=True):
    """An engine's ``error`` object (OpenAI's ``{"error": {...}}``, or vLLM's
    fields at the top level), read leniently."""

    message: str = ""
    type: str | None = None
    param: str | None = None
    code: str | int | None = None


class EngineTimings(Struct, frozen=True, kw_only=True):
    """llama.cpp's ``timings`` of a request so far (every record with
    ``timings_per_token``, else the last): prompt tokens found in its cache,
    prompt tokens evaluated, tokens generated."""

    cache_n: int = 0
    prompt_n: int = 0
    predicted_n: int = 0


class PromptProgress(Struct, frozen=True, kw_only=True):
    """llama.cpp's ``prompt_progress`` (with ``return_progress``), sent as its
    prefill begins and after each batch: the prompt's tokens, those found in
    its cache, those read so far (the cached included)."""

    total: int = 0
    cache: int = 0
    processed: int = 0


class ChunkRecord(Struct, frozen=True, kw_only=True):
    """One ``data:`` record of an engine's stream: a ``chat.completion.chunk``
    (only ``choices``, ``usage``, the ``model`` that answered and llama.cpp's
    ``timings`` and ``prompt_progress`` are read), or an error record some engines send
    mid-stream: OpenAI's ``{"error": {...}}``, or vLLM's bare
    ``{"object": "error", "message", "type", "param", "code"}``."""

    choices: list[ChunkChoice] = msgspec.field(default_factory=list)
    usage: ChatUsage | None = None
    timings: EngineTimings | None = None
    prompt_progress: PromptProgress | None = None
    model: str | None = None
    error: ChatError | None = None
    object: str | None = None
    message: str | None = None
    type: str | None = None
    param: str | None = None
    code: str | int | None = None

    def error_record(self) -> ChatError | None:
        """The error this record carries, if it is one."""
        if self.error is not None:
            return self.error
        bare = self.object == "error" or (self.message is not None and not self.choices)
        if not bare or self.usage is not None:
            return None
        return ChatError(
            message=self.message or "", type=self.type, param=self.param, code=self.code
        )


_record_decoder: Final = msgspec.json.Decoder(ChunkRecord)
_error_decoder: Final = msgspec.json.Decoder(ChatError)


def decode_chunk_record(data: bytes | str) -> ChunkRecord:
    """One ``data:`` payload of an engine's stream (raises ``msgspec.DecodeError``)."""
    return _record_decoder.decode(data)


def decode_chat_error(data: bytes | str) -> ChatError:
    """An engine's ``error`` object (raises ``msgspec.DecodeError``)."""
    return _error_decoder.decode(data)
