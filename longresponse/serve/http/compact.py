"""``POST /v1/responses/compact``: a conversation, compacted into a window to go on from.

Theory of operation
-------------------
The body is a subset of a create's: ``model`` (required), ``input``,
``instructions`` and ``previous_response_id``; ``prompt_cache_key`` and
``service_tier`` are type-checked and ignored, and so are the compaction-only
``image``, ``prompt_cache_options`` and ``prompt_cache_retention``; any other
key is ``unknown_parameter``. The body is checked by the create decoder of
the protocol, so a bad field gets the same ``code`` and ``param`` as it would
on ``POST /v1/responses``.

The input holds at most ``--max-items-per-event`` items, as a create's does
(more: ``too_many_items`` on ``input``, before anything else is read).
The conversation is the stored chain named by ``previous_response_id`` (same
owner; its pending calls may stay unanswered), then the input. It is
admitted as a create's input is (validated, compaction items opened, read by
the secrets classifier under the server's policy), taken in as a rollout
takes input in (the latest compaction item supersedes what precedes it), and
compacted with the model's summary (its ``ModelSpec.summarize``, within the
budget of a window compacted under 90% of the model's context window;
``longresponse.engine.compaction``). A model whose sampler ``summarizes`` (a
real engine) writes the summary's text in a summary turn first; no other
model turn runs, and nothing is stored.

The answer (``protocol.response.ResponseCompaction``) lists the
conversation's user messages, then the compaction item; passed unchanged as
the ``input`` of a create without ``previous_response_id`` (over HTTP or
either WebSocket shape) it continues the conversation from that window. Its
``usage`` counts what the model read (the instructions and the conversation,
rendered) and wrote (the window, rendered). An answer with a string of
:data:`LONG_TEXT` characters or more is written a piece at a time
(:func:`answer_body`), the event loop given a turn between two.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Final

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from protocol import ErrorCode, ProtocolError, RemoteProtocolError, decode_create_body
from protocol.events import ResponseCreate
from protocol.items import Compaction, InputText, Item, Message, as_items
from protocol.response import InputTokensDetails, OutputTokensDetails, ResponseCompaction, Usage

from ...engine.compaction import (
    ModelSummary,
    compact,
    drain,
    model_summary,
    summary_request,
    threshold_or_default,
)
from ...engine.counting import token_lengths
from ...engine.render import render_prefix
from ...engine.sampling import ModelSpec, SampleRequest, release
from ...engine.summary import SummaryBudget, budget
from ...ids import new_id
from ...storage.records import is_running
from ..continuation import not_finished
from ..errors import http_error
from ..references import resolve_references
from .responses import ResponsesHTTP

__all__ = ["COMPACT_PARAMETERS", "LONG_TEXT", "CompactHTTP", "answer_body"]

#: The body parameters of a compaction that mean something here.
COMPACT_PARAMETERS: Final = frozenset(
    {"model", "input", "instructions", "previous_response_id", "prompt_cache_key", "service_tier"}
)
#: Parameters of the shipped compaction endpoint that are accepted and ignored.
_IGNORED: Final = ("image", "prompt_cache_options", "prompt_cache_retention")

_encoder: Final = msgspec.json.Encoder()
#: An answer's strings this long (its window, a long user message) are
#: written a piece of this many characters at a time, the loop given a turn
#: between two: encoded in one piece, a 35 MB answer held it 23-30 ms.
LONG_TEXT: Final = 1 << 20
#: A body's members, each value left as its JSON text (no recursion into it).
_members: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_NULL: Final = msgspec.Raw(b"null")
#: The items of a list ``input``, each left as its JSON text.
_items: Final = msgspec.json.Decoder(list[msgspec.Raw])


class CompactHTTP:
    """The compaction endpoint, sharing keys, store and turns with the HTTP API."""

    def __init__(self, http: ResponsesHTTP) -> None:
        self.http = http
        self.turns = http.turns
        self.compactions = 0

    def routes(self) -> list[Route]:
        return [Route("/v1/responses/compact", self.compact, methods=["POST"])]

    async def compact(self, request: Request) -> Response:
        try:
            owner = self.http.owner(request)
            body = _decode(await self.http.read_body(request), self.http.check_item_count)
            body = await resolve_references(body, self.http.persistence, owner=owner)
            model = self.turns.resolve(body)  # refuses an unknown model
            compactor = self.turns.compactor(owner)
            assert compactor is not None  # the lifespan loaded the key
            items = as_items(body.input)  # counted already (_decode)
            history = await self._history(body.previous_response_id, owner)
            async with self.turns.settled_checks(
                [], None, [*history, *items], owner=owner
            ):  # off the loop
                admission = self.turns.pipeline.admit(
                    items, history=history, cached=False, compactor=compactor
                )
            context = drain([*history, *admission.items], compactor).items
            prefix = len(render_prefix(body.instructions, []))
            read = prefix + sum(await token_lengths(context))
            limit = budget(threshold_or_default(body, model.context_window), prefix)
            summary = await _model_summary(model, body, context, read, limit)
            text = summary.text if summary is not None else None
            # Summarizing and sealing grow with the context: in a check worker.
            item, window = await self.turns.in_worker(
                compact, context, compactor, model.summarize, limit, text, owner=owner
            )
        except ProtocolError as error:
            return http_error(error)
        self.compactions += 1
        written = sum(await token_lengths(window))
        answer = ResponseCompaction(
            id=new_id("resp"),
            created_at=int(time.time()),
            output=[*_user_messages(context), item],
            usage=Usage(
                input_tokens=read,
                input_tokens_details=InputTokensDetails(),
                output_tokens=written,
                output_tokens_details=OutputTokensDetails(),
                total_tokens=read + written,
            ),
        )
        encoded = answer_body(answer)
        if isinstance(encoded, bytes):
            return Response(encoded, media_type="application/json")
        return StreamingResponse(encoded, media_type="application/json")

    async def _history(self, parent_id: str | None, owner: str) -> list[Item]:
        """The stored chain ending at ``parent_id`` (none: nothing).

        Raises :class:`RemoteProtocolError` ``previous_response_not_found``.
        """
        if parent_id is None:
            return []
        conversation = await self.http.persistence.conversation(parent_id, owner=owner)
        if conversation is None:
            raise RemoteProtocolError(
                f"Previous response with id {RemoteProtocolError.clip(parent_id)!r} not found.",
                code=ErrorCode.PREVIOUS_RESPONSE_NOT_FOUND,
                param="previous_response_id",
            )
        if is_running(conversation.last):
            raise not_finished(parent_id, conversation.last.response.status)
        return conversation.items


async def _model_summary(
    model: ModelSpec,
    body: ResponseCreate,
    context: Sequence[Item],
    read: int,
    limit: SummaryBudget,
) -> ModelSummary | None:
    """The model's own summary text of ``context`` (``read`` tokens), if its
    sampler writes one: a summary turn on a sampler made for it, released after."""
    sampler = model.make_sampler()
    try:
        turn = SampleRequest(
            context=context,
            tools=[],
            tool_choice="none",
            parallel_tool_calls=False,
            metadata={},
            cached_tokens=0,
            uncached_tokens=read,
            instructions=body.instructions,
        )
        return await model_summary(
            sampler, summary_request(turn, limit), model=model.name, response_id="compact"
        )
    finally:
        await release(sampler)


def _decode(data: bytes | bytearray, check_count: Callable[[int], None]) -> ResponseCreate:
    """The compaction body, checked by the protocol's create decoder; its
    items are counted first, on their text, by ``check_count`` (a create's
    limit: 100,000 items are not built to be refused).

    Raises :class:`RemoteProtocolError` (``invalid_json``,
    ``missing_required_parameter`` on ``model``, ``unknown_parameter``,
    ``too_many_items`` on ``input``, and whatever the create decoder finds).
    """
    try:  # the top level only: a value is kept as its JSON text
        raw = _members.decode(data)
    except (msgspec.DecodeError, RecursionError):  # not an object, or nested too deeply
        decode_create_body(data)  # raises its precise error, where the value is refused
        raise RemoteProtocolError(
            "We could not parse the JSON body of your request.", code=ErrorCode.INVALID_JSON
        ) from None
    if raw.get("model", _NULL) == _NULL:
        raise RemoteProtocolError(
            "Missing required parameter: 'model'.",
            code=ErrorCode.MISSING_REQUIRED_PARAMETER,
            param="model",
        )
    ignored = [name for name in _IGNORED if raw.pop(name, None) is not None]
    for name in raw:
        if name not in COMPACT_PARAMETERS:
            raise RemoteProtocolError(
                f"Unknown parameter: '{name}'.", code=ErrorCode.UNKNOWN_PARAMETER, param=name
            )
    try:
        listed = _items.decode(raw.get("input", _NULL))
    except msgspec.ValidationError:  # a string (one item), or the create decoder's error
        pass
    else:
        check_count(len(listed))
    # Encoded again only without what is ignored (15 MB: 14-17 ms on the loop).
    body = decode_create_body(_encoder.encode(raw) if ignored else data)
    if body.previous_response_id is None and not body.input:
        raise RemoteProtocolError(
            "Nothing to compact: give 'input', 'previous_response_id', or both.",
            code=ErrorCode.MISSING_REQUIRED_PARAMETER,
            param="input",
        )
    return body


def _user_messages(context: Sequence[Item]) -> list[Item]:
    """The user messages of ``context``, each with its text as content parts."""
    kept: list[Item] = []
    for item in context:
        if isinstance(item, Message) and item.role == "user":
            if isinstance(item.content, str):
                item = msgspec.structs.replace(item, content=[InputText(text=item.content)])
            kept.append(item)
    return kept


def answer_body(answer: ResponseCompaction) -> bytes | AsyncIterator[bytes]:
    """``answer``'s JSON: in one piece, or with a long string (:func:`_marked`)
    its pieces, to be written one at a time."""
    marked, longs = _marked(answer)
    return _pieces(marked, longs) if longs else _encoder.encode(answer)


def _marked(answer: ResponseCompaction) -> tuple[bytes, dict[bytes, str]]:
    """``answer`` encoded with each string of :data:`LONG_TEXT` characters or
    more (a user message's text, the window) replaced by a random marker, and
    those strings by their marker's encoding (none: nothing encoded)."""
    longs: dict[bytes, str] = {}

    def marked(text: str) -> str:
        if len(text) < LONG_TEXT:
            return text
        marker = f"longresponse-{secrets.token_hex(16)}"
        longs[_encoder.encode(marker)] = text
        return marker

    output: list[Item] = []
    for item in answer.output:
        if isinstance(item, Compaction):
            item = msgspec.structs.replace(item, encrypted_content=marked(item.encrypted_content))
        elif isinstance(item, Message) and not isinstance(item.content, str):
            parts = [
                msgspec.structs.replace(part, text=marked(part.text))
                if isinstance(part, InputText)
                else part
                for part in item.content
            ]
            item = msgspec.structs.replace(item, content=parts)
        output.append(item)
    if not longs:
        return b"", longs
    return _encoder.encode(msgspec.structs.replace(answer, output=output)), longs


async def _pieces(rest: bytes, longs: dict[bytes, str]) -> AsyncIterator[bytes]:
    """Each marker's place in ``rest`` filled with its string, encoded a piece
    at a time (JSON escapes each character alone, so the pieces join into its
    encoding), the loop given a turn between two."""
    for marker, text in longs.items():
        head, rest = rest.split(marker, 1)
        yield head + b'"'
        for start in range(0, len(text), LONG_TEXT):
            await asyncio.sleep(0)
            yield _encoder.encode(text[start : start + LONG_TEXT])[1:-1]
        yield b'"'
    yield rest
