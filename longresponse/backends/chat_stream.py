"""A Chat Completions stream read as sampler chunks, and an engine's refusal read as an error.

Theory of operation
-------------------
An engine's ``POST /chat/completions`` with ``stream: true`` answers with
Server-Sent Events, one ``chat.completion.chunk`` per ``data:`` record and
``data: [DONE]`` at the end. :class:`ChunkReader` turns the decoded chunks
(``longresponse.chat.upstream.ChunkRecord``, whose choices, deltas and usage
are the server's own ``longresponse.chat.wire`` types) into the sampler's
vocabulary (``longresponse.engine.sampling``) in an order the engine's
:class:`~longresponse.engine.stream.StreamBuilder` accepts: one output item
open at a time, each closed by an ``ItemEnd``.

- ``delta.content`` is text: :class:`TextDelta`; text that comes after a
  call began (rare) is kept and sent as a message after the calls.
- ``delta.tool_calls`` are index-based pieces of calls: the first piece of a
  call carries its ``id`` and ``function.name``, later ones pieces of
  ``function.arguments``. A piece without ``index`` (older Ollama) goes to
  the call of the piece before; one whose ``id`` differs from the call at
  its index starts a new call; a name repeated on later pieces is kept once.
  The first call is streamed as it comes (:class:`ToolCallStart`, then
  :class:`ArgumentsDelta`); pieces of the other calls (parallel calls, in
  any interleaving) are kept per index and sent,
  in index order, once the first call ends with the stream. A call without
  an ``id`` gets one.
- ``delta.reasoning_content`` (vLLM, DeepSeek; newer vLLM says ``reasoning``)
  is the engine's reasoning: kept, and sent whole as one reasoning item
  (:class:`ReasoningDone`) before the next item opens, or at the end.
- ``finish_reason: "length"`` stops with ``max_output_tokens`` and marks
  ``incomplete`` only the item the engine was writing when the budget ran
  out (the last to get a piece): calls it finished before stay whole;
  ``tool_calls`` (or calls made) stops with ``tool_calls``; anything else
  with ``stop``.
- ``usage`` (sent on the last chunk with ``stream_options.include_usage``),
  ``prompt_tokens_details.cached_tokens`` included: a :class:`Usage` before
  the :class:`Stop`.
- The engine's running counts, for a turn cut before that last chunk (a
  cancel, a client gone, a steer): llama.cpp's ``prompt_progress`` (the
  prompt's tokens read so far and its cached part, as its prefill begins
  and after each batch) and ``timings`` (``cache_n`` + ``prompt_n`` the
  prompt, ``predicted_n`` the tokens generated), or a ``usage`` on a record
  before the ``finish_reason`` (vLLM's ``continuous_usage_stats``). Each
  record whose counts changed gives a :class:`Usage` first, before its own
  output, so that the rollout, which bills the latest, has billed what a
  record streamed as soon as it has it. Not every token is a record
  (llama.cpp's template parser holds back the tokens of its markers): the
  engine's count is exact where counting records would not be.

:func:`refusal` maps an engine's HTTP error (status, body, ``Retry-After``)
to :class:`~longresponse.engine.sampling.UpstreamError` with the shipped code:
401/403 the engine refused our credentials (``upstream_unavailable``, the
key never quoted); 404 ``upstream_unavailable`` too (the server's backend
is misconfigured: the engine lacks its model, or, where the engine's
message speaks of no model, ``base_url`` names a path it does not have);
429 ``rate_limit_exceeded`` with the retry hint; a context-length refusal
``context_length_exceeded``; other 4xx
``invalid_value`` with the engine's ``param`` in Responses terms
(``tools[0].function.parameters`` is ``tools[0].parameters``); 5xx
``upstream_unavailable``. Nothing here does I/O.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Final

import msgspec

from ..chat.mapping import McpFunction
from ..chat.upstream import ChatError, ChunkRecord, decode_chat_error, decode_chunk_record
from ..chat.wire import ChatUsage, ToolCallDelta
from ..engine.sampling import (
    ArgumentsDelta,
    ItemEnd,
    ReasoningDone,
    SampleChunk,
    Stop,
    TextDelta,
    ToolCallStart,
    UpstreamError,
    Usage,
)
from .responses_wire import redact

__all__ = [
    "ChunkReader",
    "decode_chunk",
    "refusal",
    "responses_param",
    "retry_after",
]


def decode_chunk(data: bytes | str) -> ChunkRecord:
    """A ``data:`` record's chunk; raises :class:`UpstreamError` if it is not one."""
    try:
        return decode_chunk_record(data)
    except (msgspec.DecodeError, RecursionError, UnicodeError):
        raise UpstreamError(
            "The upstream engine sent a stream record that is not a chat completion chunk.",
            output_started=True,
        ) from None


class _Call:
    __slots__ = ("arguments", "call_id", "name")

    def __init__(self) -> None:
        self.call_id = ""
        self.name = ""
        self.arguments: list[str] = []


class ChunkReader:
    """Turns one turn's chunks into sampler chunks (see the module docstring)."""

    def __init__(
        self,
        secret: str | None = None,
        mcp: Mapping[str, McpFunction] | None = None,
        *,
        window_bound: bool = False,
    ) -> None:
        self._secret = secret  # the API key: never quoted from the engine
        #: The turn's output limit is the room its window leaves, not its budget:
        #: a ``length`` finish is the window's (``context_length_exceeded``).
        self._window_bound = window_bound
        #: The MCP tools offered as functions, by chat name: a call of one is hosted.
        self._mcp = mcp or {}
        self._text_open = False
        self._calls: dict[int, _Call] = {}
        self._live: int | None = None  # the call streamed as it comes
        self._last = 0  # the call the latest piece went to
        self._late: list[str] = []
        self._finish: str | None = None
        self._usage: ChatUsage | None = None
        #: The engine's latest counts given as a :class:`Usage` (the rollout bills them).
        self._counted: Usage | None = None
        self._reasoning: list[str] = []
        #: What the latest piece went to: ``"text"``, ``"late"`` (text after a
        #: call began) or a call's index; on ``length`` only it is cut short.
        self._writing: str | int | None = None
        #: Whether anything the client sees has been produced.
        self.output_started = False
        #: Whether the engine has begun its answer: any record but llama.cpp's
        #: prompt progress (the first-token timeout is over).
        self.started_stream = False

    @property
    def finished(self) -> bool:
        """The engine gave its ``finish_reason``."""
        return self._finish is not None

    def feed(self, chunk: ChunkRecord) -> list[SampleChunk]:
        """The sampler chunks of one stream chunk (possibly none)."""
        out: list[SampleChunk] = []
        if (error := chunk.error_record()) is not None:
            raise _mid_stream(error, self.output_started, self._secret)
        for choice in chunk.choices:
            if choice.index != 0:
                continue  # n is 1: no other choice is asked for
            delta = choice.delta
            if delta is not None and (delta.reasoning_content or delta.reasoning):
                self._reasoning.append(delta.reasoning_content or delta.reasoning or "")
            if delta is not None and delta.content and self._live is not None:
                self._late.append(delta.content)  # text after a call began: kept for the end
                self._writing = "late"
            elif delta is not None and delta.content:
                if not self._text_open:
                    self._flush_reasoning(out)
                self._text_open = True
                self._writing = "text"
                out.append(TextDelta(delta.content))
            if delta is not None and delta.tool_calls:
                for piece in delta.tool_calls:
                    self._call_piece(piece, out)
            if choice.finish_reason is not None:
                self._finish = choice.finish_reason
        if chunk.usage is not None:
            self._usage = chunk.usage
        if chunk.prompt_progress is None:
            self.started_stream = True  # a prefill's progress is not an answer yet
        self.output_started = self.output_started or bool(out)
        counted = self._running(chunk)
        if counted is not None and counted != self._counted:
            self._counted = counted
            out.insert(0, counted)  # billed before what it counts is streamed
        return out

    def _running(self, chunk: ChunkRecord) -> Usage | None:
        """The engine's counts so far as ``chunk`` gives them (module docstring):
        a ``usage`` before the finish, else llama.cpp's progress or timings."""
        if chunk.usage is not None:
            return None if self.finished else _usage(chunk.usage)
        progress, timings = chunk.prompt_progress, chunk.timings
        generated = timings.predicted_n if timings is not None else 0
        if progress is not None:  # its prefill: what it has read of the prompt so far
            return Usage(
                input_tokens=progress.processed,
                cached_tokens=progress.cache,
                output_tokens=generated,
            )
        if timings is not None:
            return Usage(
                input_tokens=timings.cache_n + timings.prompt_n,
                cached_tokens=timings.cache_n,
                output_tokens=generated,
            )
        return None

    def _call_piece(self, piece: ToolCallDelta, out: list[SampleChunk]) -> None:
        index = self._last if piece.index is None else piece.index
        call = self._calls.get(index)
        if call is not None and piece.id and call.call_id and piece.id != call.call_id:
            # Another call's id where its index is taken (no index, or a proxy's
            # constant 0): a new call, at the next free index.
            index, call = max(self._calls) + 1, None
        if call is None:
            call = self._calls[index] = _Call()
        self._last = self._writing = index
        if piece.id:
            call.call_id = piece.id
        function = piece.function or None  # (UNSET or null: no function piece)
        if function is not None and function.name and not call.name:
            call.name = function.name  # (engines that repeat it on each piece: once)
        if function is not None and function.arguments:
            call.arguments.append(function.arguments)
        if self._live is None and call.name:
            if self._text_open:
                out.append(ItemEnd())
                self._text_open = False
            self._flush_reasoning(out)
            self._live = index
            out.extend(_start(call, self._mcp))
        elif self._live == index and call.arguments:
            out.extend(ArgumentsDelta(part) for part in call.arguments)
            call.arguments.clear()

    def end(self) -> list[SampleChunk]:
        """The stream ended: close what is open, send the kept calls, usage, the stop.

        On ``finish_reason: "length"`` only the item being written is
        ``incomplete``; the calls finished before it are whole. The stop is then
        ``max_output_tokens``, or ``context_length_exceeded`` when the limit
        was the room the window left (``window_bound``), not the budget."""
        cut = self._finish == "length"
        out: list[SampleChunk] = []
        if self._text_open:
            out.append(ItemEnd(incomplete=cut and self._writing == "text"))
        elif self._live is not None:
            out.append(ItemEnd(incomplete=cut and self._writing == self._live))
        self._flush_reasoning(out)
        for index in sorted(self._calls):
            call = self._calls[index]
            if index != self._live and call.name:
                out.extend(_start(call, self._mcp))
                out.append(ItemEnd(incomplete=cut and self._writing == index))
        if self._late:
            late = ItemEnd(incomplete=cut and self._writing == "late")
            out.extend([TextDelta("".join(self._late)), late])
        if self._usage is not None and (usage := _usage(self._usage)) != self._counted:
            self._counted = usage
            out.append(usage)
        if cut:
            out.append(
                Stop("context_length_exceeded" if self._window_bound else "max_output_tokens")
            )
        elif self._finish in ("tool_calls", "function_call") or self._calls:
            out.append(Stop("tool_calls"))
        else:
            out.append(Stop("stop"))
        return out

    def _flush_reasoning(self, out: list[SampleChunk]) -> None:
        if self._reasoning:
            out.append(ReasoningDone("".join(self._reasoning)))
            self._reasoning.clear()


def _usage(usage: ChatUsage) -> Usage:
    prompt = usage.prompt_tokens_details
    completion = usage.completion_tokens_details
    return Usage(
        input_tokens=usage.prompt_tokens,
        cached_tokens=(prompt.cached_tokens or 0) if prompt else 0,
        output_tokens=usage.completion_tokens,
        reasoning_tokens=(completion.reasoning_tokens or 0) if completion else 0,
    )


def _start(call: _Call, mcp: Mapping[str, McpFunction]) -> list[SampleChunk]:
    call_id = call.call_id or f"call_{secrets.token_hex(12)}"
    hosted = mcp.get(call.name)
    start = (
        ToolCallStart(call_id, hosted.name, kind="mcp", namespace=hosted.server_label)
        if hosted is not None
        else ToolCallStart(call_id=call_id, name=call.name)
    )
    out: list[SampleChunk] = [start]
    out.extend(ArgumentsDelta(part) for part in call.arguments)
    call.arguments.clear()
    return out


# --- refusals ------------------------------------------------------------------

#: How engines say a prompt is longer than the model's window (OpenAI, vLLM,
#: llama.cpp, Ollama, SGLang).
_TOO_LONG: Final = re.compile(
    r"maximum context length|context length|context window|context_length|"
    r"exceeds? the (?:available )?context|too many tokens|prompt is too long|"
    r"longer than the model",
    re.IGNORECASE,
)
_TOOLS: Final = re.compile(r"^tools\[(\d+)\]\.function(\.|$)")
_RENAMED: Final = {
    # the output budget, as engines name it
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "max_new_tokens": "max_output_tokens",
    "n_predict": "max_output_tokens",
    "tool_choice.function.name": "tool_choice.name",
}


def responses_param(param: str | None) -> str | None:
    """An engine's chat ``param`` as the Responses request names it."""
    if not param:
        return None
    if param.startswith("messages"):
        return "input"
    if param.startswith("response_format"):
        return "text.format"
    if (renamed := _RENAMED.get(param)) is not None:
        return renamed
    return _TOOLS.sub(lambda m: f"tools[{m[1]}]{m[2]}", param)


def _error_body(body: bytes) -> ChatError:
    """The ``error`` object of an engine's error answer (OpenAI's shape, or vLLM's bare one)."""
    try:
        wrapped = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError, UnicodeError):
        return ChatError(message=body[:500].decode("utf-8", "replace").strip())
    inner = wrapped.get("error", wrapped) if isinstance(wrapped, dict) else None
    if isinstance(inner, str):
        return ChatError(message=inner)
    if not isinstance(inner, dict):
        return ChatError()
    try:
        return decode_chat_error(msgspec.json.encode(inner))
    except msgspec.ValidationError:
        message = inner.get("message")
        return ChatError(message=message if isinstance(message, str) else "")


def retry_after(value: str | None) -> float | None:
    """The seconds of a ``Retry-After`` header (a number; a date is not read)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 <= seconds < 86_400 else None


def refusal(
    status: int, body: bytes, *, retry: str | None = None, secret: str | None = None
) -> UpstreamError:
    """An engine's HTTP error answer as the shipped error (see the module docstring).

    ``secret`` (the API key) is cut out of whatever the engine said.
    """
    error = _error_body(body)
    said = redact(error.message.strip(), secret)[:1000]
    if status in (401, 403):
        return UpstreamError(
            f"The upstream engine refused the server's credentials (HTTP {status}); "
            "check the API key its api_key_env names."
        )
    if status == 404:
        # The client asked for a model this server serves: the backend is
        # misconfigured, which is the server's fault, not the client's. A 404
        # that speaks of no model is a path the engine does not have (llama.cpp:
        # "File Not Found"): base_url is wrong.
        if error.code == "model_not_found" or "model" in said.lower():
            return UpstreamError(f"The upstream engine does not serve the model (HTTP 404): {said}")
        return UpstreamError(
            f"The upstream engine has no such endpoint (HTTP 404): {said}; "
            "the server's base_url for this model is wrong."
        )
    if status == 429:
        return UpstreamError(
            f"The upstream engine is rate limited (HTTP 429): {said}",
            code="rate_limit_exceeded",
            status=429,
            retry_after=retry_after(retry),
        )
    too_long = error.code == "context_length_exceeded" or bool(_TOO_LONG.search(said))
    if 400 <= status < 500 and too_long:
        return UpstreamError(
            f"The input is longer than the model's context window: {said}",
            code="context_length_exceeded",
            status=400,
            param="input",
        )
    if 400 <= status < 500:
        code = error.code if isinstance(error.code, str) and error.code else "invalid_value"
        return UpstreamError(
            f"The upstream engine refused the request (HTTP {status}): {said}",
            code=code,
            status=400,
            param=responses_param(error.param),
        )
    return UpstreamError(f"The upstream engine failed (HTTP {status}): {said}")


def _mid_stream(error: ChatError, started: bool, secret: str | None) -> UpstreamError:
    """An ``error`` record in the stream: the engine broke off the turn."""
    status = error.code if isinstance(error.code, int) and 400 <= error.code < 600 else 502
    body = msgspec.json.encode({"error": msgspec.to_builtins(error)})
    exc = refusal(status, body, secret=secret)
    exc.output_started = started
    return exc
