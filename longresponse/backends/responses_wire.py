"""The Responses API as an upstream speaks it: one turn's create, the chain, the events.

Theory of operation
-------------------
Both Responses backends (HTTP SSE in :mod:`.responses_http`, WebSocket mode
in :mod:`.responses_ws`) send the same create body and read the same event
stream; only the transport differs. This module holds what they share.

:class:`Chain` is a rollout's memory of its upstream conversation: the id of
the last upstream response that ended, the context that turn sent, and how
many output items the gateway's rollout took from it. The next turn
continues with ``previous_response_id`` and only the items added since (the
client's tool outputs, steering), provided the context still starts with
exactly what was sent, item for item, followed by that turn's output; if it
was rewritten (truncation dropped the oldest items, a compaction replaced
it, a model switch made a new sampler), or the last turn did not end, the
turn sends the full input without a previous id.

:func:`create_body` is one turn's create: the items as ``input`` (they are
Responses items already; item ids, which are the gateway's own, are dropped,
and so are reasoning and compaction items, which are the gateway's and
which an upstream could not open), instructions, tools, tool choice, the
budget left, metadata (a longresponse upstream's ``sim_*`` keys pass
through), temperature and top_p, ``text.format``.

:class:`Reasoned` carries an upstream reasoning model's own reasoning from
turn to turn when the upstream keeps nothing (``upstream_store`` false): the
create asks for ``include: ["reasoning.encrypted_content"]``, the reader
keeps each reasoning item that comes with its encrypted content, and a turn
that sends the full input sends each one again, as it came, just before the
output item that followed it. A chained turn sends none (the upstream has
them), and an item whose output is no longer in the context is let go.

:class:`TurnReader` turns the upstream's events into sampler chunks:
``response.output_text.delta`` → TextDelta (and ``response.refusal.delta``:
the gateway's message carries a refusal as its text, so an answer that is
only a refusal still arrives); a ``function_call`` item added →
ToolCallStart; ``response.function_call_arguments.delta`` → ArgumentsDelta;
an item done → ItemEnd (incomplete when its status says so); the terminal
``response.completed`` / ``response.incomplete`` → Usage (the upstream's own
counts) and Stop. Reasoning items are not streamed: their summary and
content are skipped (the StreamBuilder writes messages and calls only), and
only their token count reaches the usage. ``response.failed`` and ``error``
events, and the HTTP statuses of a refused request (:func:`refused`), become
:class:`~longresponse.engine.sampling.UpstreamError` with the shipped code.
No message of this module ever holds the API key: the errors quote the
upstream's own message with the key cut out (:func:`redact`), and a refusal
of the credentials is worded here.

Retrying is safe only while the upstream cannot have begun the response:
:attr:`TurnReader.begun` is set by the first event that is not an
``error`` (``response.created`` on), and by the transports for any failure
after which the request may have been acted upon (a timeout, a stream that
broke, an event that could not be read); a turn whose reader has begun is
never sent again.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import msgspec
from msgspec import UNSET

from protocol.items import FunctionCall, FunctionCallOutput, Item, Message

from ..config import BackendConfig
from ..engine.sampling import (
    ArgumentsDelta,
    ItemEnd,
    SampleChunk,
    SampleRequest,
    Stop,
    TextDelta,
    ToolCallStart,
    UpstreamError,
    Usage,
)

__all__ = [
    "CHAIN_LOST",
    "MIN_OUTPUT_TOKENS",
    "Chain",
    "ChainedTurns",
    "Reasoned",
    "TurnReader",
    "create_body",
    "decode_event",
    "redact",
    "refused",
    "retryable",
    "turn_ended",
    "upstream_input",
]

log = logging.getLogger(__name__)

#: The least ``max_output_tokens`` the shipped API accepts; a smaller budget
#: left is sent as this (the turn may overrun it by as much).
MIN_OUTPUT_TOKENS: Final = 16
#: Upstream codes that mean the chain's parent is gone: resend the full input.
CHAIN_LOST: Final = frozenset({"previous_response_not_found"})


# --- what a turn sends ------------------------------------------------------------


def upstream_input(items: Sequence[Item], reasoned: Reasoned | None = None) -> list[Any]:
    """``items`` as an upstream may read them: messages, finished calls and outputs,
    no ids; before an output item, the upstream's reasoning that led to it (``reasoned``)."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, FunctionCall) and item.status == "incomplete":
            continue  # a call cut short never reaches the model again
        if isinstance(item, Message | FunctionCall | FunctionCallOutput):
            if reasoned is not None:
                out.extend(reasoned.before(item))
            out.append(msgspec.structs.replace(item, id=UNSET) if item.id else item)
    return out


@dataclasses.dataclass(slots=True)
class Reasoned:
    """The upstream's reasoning items (encrypted), by the output item each preceded."""

    #: id() of an output item in the context → (that item, the reasoning before it).
    _before: dict[int, tuple[Item, list[dict[str, Any]]]] = dataclasses.field(default_factory=dict)
    #: The last ended turn: the context it sent, and its reasoning by output index.
    _sent: list[Item] = dataclasses.field(default_factory=list)
    _pending: list[tuple[int, dict[str, Any]]] = dataclasses.field(default_factory=list)

    def ended(self, context: Sequence[Item], reasoning: list[tuple[int, dict[str, Any]]]) -> None:
        """A turn that sent ``context`` ended with ``reasoning`` (see :class:`TurnReader`)."""
        self._sent, self._pending = list(context), list(reasoning)

    def attach(self, context: Sequence[Item]) -> None:
        """Pin the last turn's reasoning to its output items, now in ``context``;
        forget what belongs to items ``context`` no longer holds."""
        sent, pending = self._sent, self._pending
        self._sent, self._pending = [], []
        if pending and all(a is b for a, b in zip(sent, context, strict=False)):
            for index, item in pending:
                at = len(sent) + index
                if at < len(context) and isinstance(context[at], Message | FunctionCall):
                    target = context[at]
                    self._before.setdefault(id(target), (target, []))[1].append(item)
        live = {id(item) for item in context}
        self._before = {key: found for key, found in self._before.items() if key in live}

    def before(self, item: Item) -> list[dict[str, Any]]:
        found = self._before.get(id(item))
        return found[1] if found is not None and found[0] is item else []


class ChainedTurns:
    """What both Responses samplers keep for one rollout: its chain of upstream
    responses, the reasoning it keeps, its affinity header (if configured)."""

    #: The upstream counts its own input: the rollout's count of the new input
    #: can wait until the first output (``longresponse.engine.counting``).
    counts_first = False

    def __init__(self, config: BackendConfig) -> None:
        self.chain = Chain()
        self.reasoned = Reasoned()
        self.headers: dict[str, str] = (
            {config.affinity_header: secrets.token_hex(8)} if config.affinity_header else {}
        )


@dataclasses.dataclass(slots=True)
class Chain:
    """One rollout's upstream conversation: where the next turn continues from."""

    response_id: str | None = None
    #: The context as the last ended turn sent it (the same item objects).
    sent: list[Item] = dataclasses.field(default_factory=list)
    #: Output items that turn added to the rollout's context.
    produced: int = 0

    def continuation(self, context: Sequence[Item]) -> tuple[str | None, Sequence[Item]]:
        """The previous id to continue from and the items to send (all of them, and
        no id, unless ``context`` still starts with what was sent and its output)."""
        sent, start = self.sent, len(self.sent) + self.produced
        if (
            self.response_id is None
            or len(context) < start
            or any(a is not b for a, b in zip(sent, context, strict=False))
            or not all(isinstance(i, Message | FunctionCall) for i in context[len(sent) : start])
        ):
            return None, context
        return self.response_id, context[start:]

    def ended(self, response_id: str, context: Sequence[Item], produced: int) -> None:
        self.response_id, self.sent, self.produced = response_id, list(context), produced

    def forget(self) -> None:
        self.response_id, self.sent, self.produced = None, [], 0


def turn_ended(
    reader: TurnReader,
    sent: Sequence[Item],
    items: Sequence[Item],
    previous: str | None,
    chain: Chain | None,
    reasoned: Reasoned,
) -> None:
    """A turn's upstream response ended (its usage came): keep its reasoning, and
    the point the next turn continues from (``chain``; ``None``: it never chains)."""
    reasoned.ended(sent, reader.reasoning)
    if reader.response_id:
        log.debug("upstream response %s after %s: %d items sent",
                  reader.response_id, previous, len(items))  # fmt: skip
        if chain is not None:
            chain.ended(reader.response_id, sent, reader.produced)


def create_body(
    config: BackendConfig,
    request: SampleRequest,
    items: Sequence[Item],
    previous_response_id: str | None,
    reasoned: Reasoned | None = None,
) -> dict[str, Any]:
    """The ``response.create`` / ``POST /responses`` body of one turn (without ``stream``)."""
    body: dict[str, Any] = {
        "model": config.model,
        "input": upstream_input(items, reasoned),
        "store": config.upstream_store,
        "tool_choice": request.tool_choice,
        "parallel_tool_calls": request.parallel_tool_calls,
    }
    if previous_response_id is not None:
        body["previous_response_id"] = previous_response_id
    if not config.upstream_store:
        body["include"] = ["reasoning.encrypted_content"]  # the upstream keeps none
    if request.instructions is not None:
        body["instructions"] = request.instructions
    if request.tools:
        body["tools"] = list(request.tools)
    budget = config.max_output_tokens
    if request.max_output_tokens is not None:
        budget = min(budget, request.max_output_tokens)
    body["max_output_tokens"] = max(MIN_OUTPUT_TOKENS, budget)
    if request.metadata:
        body["metadata"] = dict(request.metadata)
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.text_format is not None:
        body["text"] = {"format": request.text_format}
    return body


# --- what comes back --------------------------------------------------------------


class _Event(msgspec.Struct, frozen=True):
    """The fields of an upstream event this gateway reads (the rest is ignored)."""

    type: str
    delta: str = ""
    item: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    #: ``error``: nested (WebSocket mode) or flat (SSE).
    error: dict[str, Any] | None = None
    code: str | None = None
    message: str | None = None
    param: str | None = None
    status: int | None = None


_decoder: Final = msgspec.json.Decoder(_Event)


def decode_event(data: bytes | str) -> _Event:
    """One upstream event. Raises :class:`UpstreamError` if it is not one."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError:
        raise UpstreamError("The upstream sent an event that is not valid JSON.") from None


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` (the API key) cut out."""
    return text.replace(secret, "[redacted]") if secret else text


def retryable(exc: UpstreamError) -> bool:
    """Worth sending again: nothing was produced, and the upstream was down or busy."""
    return not exc.output_started and exc.code in ("upstream_unavailable", "rate_limit_exceeded")


def refused(
    status: int,
    body: Mapping[str, Any] | None,
    retry_after: str | None = None,
    *,
    secret: str | None = None,
) -> UpstreamError:
    """The error of an upstream that refused the request with HTTP ``status``;
    ``secret`` (the API key) is cut out of what the upstream said."""
    error = body.get("error") if isinstance(body, Mapping) else None
    error = error if isinstance(error, Mapping) else {}
    code = error.get("code") if isinstance(error.get("code"), str) else None
    message = error.get("message") if isinstance(error.get("message"), str) else None
    param = error.get("param") if isinstance(error.get("param"), str) else None
    return _mapped(status, code, message, param, retry_after, secret)


def _mapped(
    status: int,
    code: str | None,
    message: str | None,
    param: str | None,
    retry_after: str | None,
    secret: str | None,
) -> UpstreamError:
    if message is not None:
        message = redact(message, secret)
    if code in CHAIN_LOST:
        return UpstreamError(message or "The upstream lost the chain's previous response.",
                             code=code, status=400, param=param)  # fmt: skip
    if status in (401, 403):
        return UpstreamError(f"The upstream refused this server's credentials (HTTP {status}).")
    if status == 429 or code == "rate_limit_exceeded":
        return UpstreamError(
            message or "The upstream is rate limiting requests.",
            code="rate_limit_exceeded",
            status=429,
            retry_after=_seconds(retry_after),
        )
    if code == "context_length_exceeded":
        return UpstreamError(message or "The input is too long for the upstream model.",
                             code=code, status=400, param=param)  # fmt: skip
    if code == "model_not_found" or (status == 404 and "model" in (message or "").lower()):
        # The client asked for a model this server serves: the backend is
        # misconfigured, which is the server's fault, not the client's.
        return UpstreamError(f"The upstream does not serve this backend's model ({message}).")
    if status == 404:  # a path it does not have: base_url is wrong
        return UpstreamError(
            f"The upstream has no such endpoint (HTTP 404: {message}); "
            "the server's base_url for this model is wrong."
        )
    if 400 <= status < 500 or (status == 0 and code not in (None, "server_error")):
        return UpstreamError(
            message or f"The upstream refused the request (HTTP {status}).",
            code=code or "invalid_request_error",
            status=400,
            param=param,
        )
    return UpstreamError(message or f"The upstream failed (HTTP {status}).")


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: no hint


@dataclasses.dataclass(slots=True)
class TurnReader:
    """Reads one upstream response's events as sampler chunks."""

    #: The upstream response's id (from its first event).
    response_id: str | None = None
    #: Output items the gateway's rollout gets from this turn (one per ItemEnd).
    produced: int = 0
    #: Something was already passed on (a retry would repeat it).
    started: bool = False
    #: The upstream may have begun the response: sending it again could run it
    #: twice. Set by any event but ``error``, and by the transports.
    begun: bool = False
    #: The API key, cut out of every upstream message (None: none is sent).
    secret: str | None = None
    #: Reasoning items that came with encrypted content, each with the number of
    #: output items produced before it (the index of the one it led to).
    reasoning: list[tuple[int, dict[str, Any]]] = dataclasses.field(default_factory=list)
    #: The terminal event arrived.
    ended: bool = False
    _open: str | None = None  # the type of the item being passed on
    _streamed: bool = False  # the open call's arguments came as deltas
    _calls: bool = False

    def decode(self, data: bytes | str) -> _Event:
        """One upstream event of this turn. Raises :class:`UpstreamError` if it is
        not one; the turn is then begun (the upstream is running something)."""
        try:
            return decode_event(data)
        except UpstreamError as exc:
            self.begun, exc.output_started = True, self.started
            raise

    def read(self, event: _Event) -> Iterator[SampleChunk]:  # noqa: C901 (a branch per event type)
        """The chunks of ``event`` (Usage then Stop for the terminal one).

        Raises :class:`UpstreamError` for ``response.failed`` and ``error``.
        """
        kind = event.type
        if kind != "error":
            self.begun = True
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            if event.delta:
                self._open, self.started = "message", True
                yield TextDelta(event.delta)
        elif kind == "response.function_call_arguments.delta":
            if self._open == "function_call" and event.delta:
                self._streamed = True
                yield ArgumentsDelta(event.delta)
        elif kind == "response.output_item.added":
            item = event.item or {}
            if item.get("type") == "function_call":
                self._open, self.started, self._calls = "function_call", True, True
                self._streamed = False
                yield ToolCallStart(str(item.get("call_id", "")), str(item.get("name", "")))
        elif kind == "response.output_item.done":
            item = event.item or {}
            # An upstream that sent the item whole, without deltas: pass it on whole.
            if self._open == "function_call" and not self._streamed and item.get("arguments"):
                yield ArgumentsDelta(str(item["arguments"]))
            elif self._open is None and item.get("type") == "message" and (text := _text(item)):
                self._open, self.started = "message", True
                yield TextDelta(text)
            if self._open is not None:
                self._open = None
                self.produced += 1
                yield ItemEnd(incomplete=item.get("status") == "incomplete")
            elif item.get("type") == "reasoning" and item.get("encrypted_content"):
                self.reasoning.append((self.produced, item))
        elif kind in ("response.created", "response.in_progress", "response.queued"):
            if event.response is not None and self.response_id is None:
                self.response_id = event.response.get("id")
        elif kind in ("response.completed", "response.incomplete"):
            self.ended = True
            response = event.response or {}
            self.response_id = response.get("id") or self.response_id
            yield _usage(response.get("usage"))
            details = response.get("incomplete_details") or {}
            if kind == "response.incomplete" and details.get("reason") == "max_output_tokens":
                yield Stop("max_output_tokens")
            else:
                yield Stop("tool_calls" if self._calls else "stop")
        elif kind == "response.failed":
            error = (event.response or {}).get("error") or {}
            raise self._failed(0, error.get("code"), error.get("message"), None)
        elif kind == "error":
            nested = event.error or {}
            raise self._failed(
                event.status or 0,
                nested.get("code", event.code),
                nested.get("message", event.message),
                nested.get("param", event.param),
            )

    def _failed(
        self, status: int, code: str | None, message: str | None, param: str | None
    ) -> UpstreamError:
        exc = _mapped(status, code, message, param, None, self.secret)
        exc.output_started = self.started
        return exc


def _text(item: Mapping[str, Any]) -> str:
    """The output text of a message item (a refusal part counts as text)."""
    content = item.get("content")
    if not isinstance(content, list):
        return ""
    text = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "output_text":
            text.append(str(part.get("text", "")))
        elif isinstance(part, Mapping) and part.get("type") == "refusal":
            text.append(str(part.get("refusal", "")))
    return "".join(text)


def _usage(usage: Any) -> Usage:
    usage = usage if isinstance(usage, Mapping) else {}
    inputs = usage.get("input_tokens_details") or {}
    outputs = usage.get("output_tokens_details") or {}
    return Usage(
        input_tokens=int(usage.get("input_tokens") or 0),
        cached_tokens=int(inputs.get("cached_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        reasoning_tokens=int(outputs.get("reasoning_tokens") or 0),
    )
