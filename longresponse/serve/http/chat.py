"""``POST /v1/chat/completions`` and ``POST /tokenize`` on the simulated models.

Theory of operation
-------------------
The endpoint an inference engine serves, so longresponse can stand as the
engine behind another longresponse (or any Chat Completions client). It sits
behind the same gate as ``/v1/responses`` (404, the API key's 401, 405:
``longresponse.serve.gate``) and answers bad input with the shipped error
envelope. A request is checked before anything runs:

1. the body decodes as :class:`~longresponse.chat.wire.ChatRequest`
   (types, ranges, unknown fields refused with their ``param``), and no
   field the server cannot honour is set (``unsupported_parameter``);
2. ``model`` names a model (else 404 ``model_not_found``); ``n`` is 1;
   ``stream_options`` only with ``stream``; the metadata passes the model's
   own check (the simulated model's ``sim_*`` keys are in range);
3. tools (names, schemas), ``tool_choice``, ``response_format`` as the
   Responses path checks them, with chat's params (``tools[0].function.name``);
4. the messages become items and the tool calls are paired with their
   answers (``longresponse.chat.mapping``);
5. the prompt is rendered and hashed in a worker thread and must fit the
   context window (``context_length_exceeded``, param ``messages``), and
   ``max_tokens`` the room left (``invalid_value``); unset, the answer may
   take all of it (up to ``--max-response-output-tokens``).

Then the prefix cache (``longresponse.chat.prefix_cache``) says how many
leading tokens are cached: the simulated prefill is charged for the rest
only, and ``usage.prompt_tokens_details.cached_tokens`` reports them. The
prompt's blocks join the cache when the first token comes (prefill done);
the blocks of prompt and answer, when the answer ends.

``stream: false`` returns one ``chat.completion``. ``stream: true`` returns
Server-Sent Events, ``data: {chunk}`` records then ``data: [DONE]``, written
as the model decodes. The turn runs in a task owned by the response and
feeds a queue bounded in records: a reader that leaves it full for the
slow-reader timeout has its connection dropped (``serve.seam.abort``), and
so does one that has not taken the whole stream, ``[DONE]`` included,
within that timeout once the last record is queued (the writer marks each
record done once written; the producer waits for all of them). A client
that goes away stops the turn, sampler included, at once
(:attr:`ChatCompletions.stopped` counts both). The writer also ends when
the producer does, so a producer that fails never leaves it waiting.

A model that raises is a ``server_error``: the shipped envelope with
status 500 for ``stream: false``; for a stream, a last ``data:`` record
holding that envelope (the official SDK raises on it), then ``[DONE]``.
An engine behind a real backend that fails or refuses
(:class:`~longresponse.engine.sampling.UpstreamError`) keeps its own code,
status, ``param`` and type (429 ``rate_limit_exceeded`` with
``Retry-After``, 400 ``context_length_exceeded``, 502
``upstream_unavailable``), in the envelope or the stream's last record; it
is logged in one line with its cause
(:func:`~longresponse.engine.failures.log_upstream_failure`), not as a fault
of this server.

Headers such as ``x-longresponse-affinity`` (a gateway's per-rollout pin)
and the body's ``cache_prompt`` / ``id_slot`` / ``prompt_cache_key`` are
accepted and change nothing: one process has one cache.

``POST /tokenize`` is vLLM's: ``{"model", "prompt"}`` (plain text) or
``{"model", "messages"[, "tools"]}`` (the chat prompt, exactly as a
completion renders it) gives ``{"count", "max_model_len", "tokens"}``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Final

import msgspec
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from protocol import ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError
from protocol.items import Item

from ...backends.registry import ModelRegistry
from ...chat.engine import ChatPrompt, ChatTurn, render_prompt, render_tokens
from ...chat.mapping import (
    format_from_chat,
    items_from_messages,
    tool_choice_from_chat,
    tools_from_chat,
)
from ...chat.prefix_cache import PrefixCache, block_digests
from ...chat.wire import (
    ChatRequest,
    decode_chat_request,
    decode_tokenize_request,
    unsupported_field,
)
from ...config import WRITE_SLICE_SECONDS, ServerConfig
from ...engine.admission import Pipeline
from ...engine.failures import log_upstream_failure
from ...engine.render import encode, render_item
from ...engine.sampling import ModelSpec, SampleRequest, UpstreamError
from ...ids import new_id
from ..errors import error_body, http_error, upstream_http_error
from ..seam import abort, peer_gone, stop_task, while_connected
from ..skeleton import check_chat_skeleton
from ..types import Scope
from .responses import ResponsesHTTP, too_many_items
from .sinks import SSE_QUEUE_DEPTH

__all__ = ["DONE_RECORD", "ChatCompletions"]

#: The record that ends a chat stream.
DONE_RECORD: Final = b"data: [DONE]\n\n"
log = logging.getLogger(__name__)
_encoder: Final = msgspec.json.Encoder()

#: Admission's params -> chat's spelling of the same field (anchored at the
#: start: a deeper param such as ``tools[0].parameters.properties.name.pattern``
#: keeps the names inside the schema as they are).
_PARAMS: Final = (
    (re.compile(r"text\.format\."), "response_format.json_schema."),
    (re.compile(r"(tools\[\d+\])\.(name|parameters)\b"), r"\1.function.\2"),
)


def _chat_param(param: str | None) -> str | None:
    """A Responses ``param`` as the chat API names it."""
    if param is None:
        return None
    for old, new in _PARAMS:
        if old.match(param):
            return old.sub(new, param, count=1)
    return param


def _rename(error: RemoteProtocolError) -> RemoteProtocolError:
    param = _chat_param(error.param) or ""
    message = error.message.replace(f"'{error.param}'", f"'{param}'")
    return RemoteProtocolError(message, code=error.code, param=param or None, status=error.status)


class ChatCompletions:
    """The chat endpoints, sharing models, keys and limits with the Responses API."""

    def __init__(
        self, config: ServerConfig, http: ResponsesHTTP, models: ModelRegistry, pipeline: Pipeline
    ) -> None:
        self.config = config
        self.http = http
        self.models = models
        self.pipeline = pipeline
        self.cache = PrefixCache(config.chat_prefix_cache_tokens)
        #: Counters: requests taken, turns running now, turns ended before their
        #: answer did (the client left, or read too slowly).
        self.requests = 0
        self.running = 0
        #: Turns running now, by the owner of their API key (keys on).
        self._running_per_key: collections.Counter[str] = collections.Counter()
        self.stopped = 0
        #: Requests refused with 429 because ``chat_max_in_flight`` were running.
        self.refused_busy = 0

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.complete, methods=["POST"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
        ]

    # --- POST /v1/chat/completions -------------------------------------------

    async def complete(self, request: Request) -> Response:
        self.requests += 1
        try:
            owner = self.http.owner(request)
            self._check_room(owner)
            data = await self.http.read_body(request)
            try:  # the limits first, on the body's skeleton (``serve/skeleton.py``)
                await check_chat_skeleton(data, self.pipeline.limits, self._check_messages)
            except RemoteProtocolError as error:
                raise _rename(error) from None
            body = decode_chat_request(data)
            del data  # not held while the answer streams
            turn, prompt = await self._start(body, owner)
        except ProtocolError as error:
            response = http_error(error)
            if error.status == 429:
                response.headers["retry-after"] = "1"
            return response
        if body.stream:
            return StreamingResponse(
                self._sse(turn, prompt, request.scope, owner), media_type="text/event-stream"
            )
        return await self._json(turn, prompt, request, owner)

    def _check_messages(self, count: int) -> None:
        """A create's item limit, on the messages. Raises :class:`RemoteProtocolError`."""
        limit = self.config.max_items_per_event
        if count > limit:
            raise too_many_items(count, limit, what="messages", param="messages")

    def _check_room(self, owner: str) -> None:
        """Refuse a completion beyond ``--chat-max-in-flight``, or beyond
        ``--chat-max-in-flight-per-key`` of ``owner``'s (an API key's owner;
        ``""``, keys off, has no limit of its own): 429, retry in a second.
        Raises :class:`RemoteProtocolError`, counting the refusal."""
        limit = self.config.chat_max_in_flight
        if self.running >= limit:
            self.refused_busy += 1
            raise RemoteProtocolError(
                f"{self.running} completions are running; the limit is {limit}. Retry later.",
                code=ErrorCode.RATE_LIMIT_EXCEEDED,
                status=429,
                error_type="rate_limit_error",
            )
        per_key = self.config.chat_max_in_flight_per_key
        if owner and self._running_per_key[owner] >= per_key:
            self.refused_busy += 1
            raise RemoteProtocolError(
                f"{per_key} completions of this API key are running, its limit. Retry later.",
                code=ErrorCode.RATE_LIMIT_EXCEEDED,
                status=429,
                error_type="rate_limit_error",
            )

    def _began(self, owner: str) -> None:
        """A turn of ``owner``'s runs: counted in all and per key until :meth:`_ended`."""
        self.running += 1
        self._running_per_key[owner] += 1

    def _ended(self, owner: str) -> None:
        self.running -= 1
        self._running_per_key[owner] -= 1
        if not self._running_per_key[owner]:
            del self._running_per_key[owner]

    def collector(self) -> Collector:
        """The endpoint's counters for ``/metrics``."""
        return _ChatCounters(self)

    async def _start(self, body: ChatRequest, owner: str) -> tuple[ChatTurn, ChatPrompt]:
        """Check ``body`` and make its turn (its cache blocks ``owner``'s).
        Raises :class:`RemoteProtocolError`."""
        self._check_messages(len(body.messages))
        model = self.models.resolve(body.model)
        if (unsupported := unsupported_field(body)) is not None:
            raise unsupported
        if body.n not in (None, 1):
            raise RemoteProtocolError(
                f"Invalid 'n': this server makes one choice per request, not {body.n}.",
                code=ErrorCode.INVALID_VALUE,
                param="n",
            )
        if body.stream_options is not None and not body.stream:
            raise RemoteProtocolError(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                code=ErrorCode.INVALID_VALUE,
                param="stream_options",
            )
        metadata = body.metadata or {}
        if model.check_request is not None:  # the simulated model's sim_* keys
            model.check_request(metadata)
        tools = tools_from_chat(body.tools)
        text_format = format_from_chat(body.response_format)
        try:
            async with self.http.turns.settled_checks(
                tools, text_format, owner=owner
            ):  # off the loop
                self.pipeline.check_tools(tools)
                self.pipeline.check_text_format(text_format)
        except RemoteProtocolError as error:
            raise _rename(error) from None
        tool_choice = tool_choice_from_chat(body.tool_choice, tools)
        items = items_from_messages(body.messages)
        prompt = await asyncio.to_thread(render_prompt, model.name, items, tools, owner=owner)
        self._fits(model, len(prompt.tokens))
        cached = self.cache.cached_tokens(prompt.digests, len(prompt.tokens))
        limit = min(self.config.max_response_output_tokens, _budget(body, model, prompt))
        sample = SampleRequest(
            context=items,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=body.parallel_tool_calls is not False,
            metadata=metadata,
            cached_tokens=cached,
            uncached_tokens=len(prompt.tokens) - cached,
            max_output_tokens=limit,
            text_format=text_format,
        )
        turn = ChatTurn(
            completion_id=new_id("chatcmpl").replace("_", "-"),
            created=int(time.time()),
            model=model.name,
            sampler=model.make_sampler(),
            request=sample,
            include_usage=body.stream_options is not None and body.stream_options.include_usage,
            prefilled=lambda: self.cache.insert(prompt.digests),
        )
        return turn, prompt

    @staticmethod
    def _fits(model: ModelSpec, tokens: int) -> None:
        if tokens > model.context_window:
            raise RemoteProtocolError(
                model.too_long(tokens), code="context_length_exceeded", param="messages"
            )

    async def _remember(self, turn: ChatTurn, prompt: ChatPrompt) -> None:
        """The answer's blocks join the cache, as the next request will render them."""
        answer = turn.answer_items()
        if not answer:
            return
        digests = await asyncio.to_thread(_answer_digests, prompt, answer)
        self.cache.insert(digests)

    async def _json(
        self, turn: ChatTurn, prompt: ChatPrompt, request: Request, owner: str
    ) -> Response:
        """The whole answer as one ``chat.completion``; a client that hangs up
        first stops the turn (its ``http.disconnect`` is watched meanwhile)."""

        async def run() -> ProtocolError | UpstreamError | None:
            try:
                async for _ in turn.chunks():
                    pass
            except UpstreamError as exc:  # the engine behind failed or refused: its error
                log_upstream_failure(exc, model=turn.model, response_id=turn.completion_id)
                return exc
            except Exception as exc:  # the model failed: the envelope, not a bare 500
                return _server_error(exc)
            await self._remember(turn, prompt)
            return None

        self._began(owner)
        try:
            work = await while_connected(request.receive, run())
        finally:
            self._ended(owner)
        if work.cancelled():  # the client is gone: nobody reads this
            self.stopped += 1
            return Response(status_code=499)
        if isinstance(failed := work.result(), UpstreamError):
            return upstream_http_error(failed, _upstream(failed))
        if failed is not None:
            return http_error(failed)
        return Response(_encoder.encode(turn.completion()), media_type="application/json")

    async def _sse(
        self, turn: ChatTurn, prompt: ChatPrompt, scope: Scope, owner: str
    ) -> AsyncIterator[bytes]:
        remember = functools.partial(self._remember, turn, prompt)
        stream = _ChatStream(turn, scope, self.config.slow_reader_timeout, remember)
        self._began(owner)
        # Owned here: cancelled with this generator when the client goes away.
        producer = asyncio.get_running_loop().create_task(stream.produce())
        try:
            turn_started = time.monotonic()
            while (record := await stream.taken(producer)) is not None:
                if peer_gone(scope):
                    return  # the client left: the finally stops the turn
                yield record
                stream.written()
                if record is DONE_RECORD:
                    return
                if time.monotonic() - turn_started >= WRITE_SLICE_SECONDS:  # others' turn
                    await asyncio.sleep(0)
                    turn_started = time.monotonic()
        finally:
            self._ended(owner)
            if turn.finish_reason is None or stream.dropped:
                self.stopped += 1
            await stop_task(producer)  # its cleanup closes the engine's stream

    # --- POST /tokenize -----------------------------------------------------------

    async def tokenize(self, request: Request) -> Response:
        try:
            self.http.owner(request)
            body = decode_tokenize_request(await self.http.read_body(request))
            model = self.models.resolve(body.model)
            if (body.prompt is None) == (body.messages is None):
                raise RemoteProtocolError(
                    "Give either 'prompt' or 'messages' (one of them).",
                    code=ErrorCode.INVALID_VALUE,
                    param="prompt" if body.prompt is not None else "messages",
                )
            if body.prompt is not None:
                tokens = await asyncio.to_thread(encode, body.prompt)
            else:
                tools = tools_from_chat(body.tools)
                items = items_from_messages(body.messages or [], answered=False)
                tokens = await asyncio.to_thread(render_tokens, items, tools)
        except ProtocolError as error:
            return http_error(error)
        return JSONResponse(
            {"count": len(tokens), "max_model_len": model.context_window, "tokens": tokens}
        )


def _budget(body: ChatRequest, model: ModelSpec, prompt: ChatPrompt) -> int:
    """The answer's token budget: what the window leaves after the prompt, or
    less when ``max_tokens`` / ``max_completion_tokens`` ask for less; asking
    for more is ``invalid_value`` (as vLLM refuses it)."""
    room = model.context_window - len(prompt.tokens)
    budget = room
    asks = (("max_tokens", body.max_tokens), ("max_completion_tokens", body.max_completion_tokens))
    for name, asked in asks:
        if asked is None:
            continue
        if asked > room:
            raise RemoteProtocolError(
                f"Invalid '{name}': {asked} tokens do not fit the context window of "
                f"{model.context_window} tokens after the {len(prompt.tokens)} of the messages.",
                code=ErrorCode.INVALID_VALUE,
                param=name,
            )
        budget = min(budget, asked)
    return budget


def _server_error(exc: Exception) -> ProtocolError:
    """What a client is told when the model raised (logged here, not sent)."""
    log.error("chat completion failed", exc_info=exc)
    return LocalProtocolError(
        "The model failed while generating the answer.",
        code=ErrorCode.SERVER_ERROR,
        status=500,
        error_type="server_error",
    )


def _upstream(exc: UpstreamError) -> ProtocolError:
    """The engine behind failed or refused: its code, status and param (no traceback)."""
    param = _chat_param("messages" if exc.param == "input" else exc.param)
    return RemoteProtocolError(
        exc.message, code=exc.code, param=param, status=exc.status, error_type=exc.error_type
    )


def _answer_digests(prompt: ChatPrompt, answer: list[Item]) -> list[bytes]:
    """The digests of prompt and answer (pure: run in a worker thread)."""
    tokens = list(prompt.tokens)
    for item in answer:
        tokens.extend(render_item(item))
    return block_digests(prompt.seed, tokens, known=prompt.digests)


class _ChatCounters(Collector):
    """``longresponse_chat_*`` on ``/metrics``: what the endpoint took, ran, stopped, refused."""

    def __init__(self, chat: ChatCompletions) -> None:
        self.chat = chat

    def collect(self) -> Iterator[Metric]:
        chat = self.chat
        for name, help_text, value in (
            ("requests", "Chat completion requests received.", chat.requests),
            ("stopped", "Chat turns ended before their answer (client gone).", chat.stopped),
            ("refused_busy", "Chat requests refused with 429 (at the limit).", chat.refused_busy),
        ):
            yield CounterMetricFamily(f"longresponse_chat_{name}", help_text, value=value)
        yield GaugeMetricFamily(
            "longresponse_chat_running", "Chat completions running now.", value=chat.running
        )


class _ChatStream:
    """One streamed chat completion between the engine and its reader.

    :meth:`produce` (a task) queues the engine's chunks as SSE records, then
    an error record if the model failed, then ``[DONE]``; the response's body
    takes them (:meth:`taken`) and marks each written (:meth:`written`). A
    reader that leaves the queue full, or its last records unread, for
    ``timeout`` seconds is dropped (``dropped``), and the producer ends.
    """

    def __init__(
        self,
        turn: ChatTurn,
        scope: Scope,
        timeout: float,
        remember: Callable[[], Awaitable[None]],
    ) -> None:
        self._turn = turn
        self._scope = scope
        self._timeout = timeout
        self._remember = remember
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue(SSE_QUEUE_DEPTH)
        #: The reader was too slow and has been let go.
        self.dropped = False

    async def _put(self, record: bytes) -> bool:
        """Queue ``record``; a reader that leaves the queue full too long is dropped."""
        try:
            async with asyncio.timeout(self._timeout):
                await self._queue.put(record)
        except TimeoutError:
            abort(self._scope, "slow chat stream reader")
            self.dropped = True
            return False
        return True

    async def produce(self) -> None:
        turn = self._turn
        try:
            try:
                async for chunk in turn.chunks():
                    if not await self._put(b"data: " + _encoder.encode(chunk) + b"\n\n"):
                        return
                await self._remember()
            except Exception as exc:  # the model failed: say so, then end the stream
                if isinstance(exc, UpstreamError):
                    log_upstream_failure(exc, model=turn.model, response_id=turn.completion_id)
                error = _upstream(exc) if isinstance(exc, UpstreamError) else _server_error(exc)
                if not await self._put(b"data: " + _encoder.encode(error_body(error)) + b"\n\n"):
                    return
            if not await self._put(DONE_RECORD):
                return
            # The whole stream is queued; its reader still has to take it in time.
            try:
                async with asyncio.timeout(self._timeout):
                    await self._queue.join()
            except TimeoutError:
                abort(self._scope, "chat stream reader left its last records")
                self.dropped = True
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(None)

    async def taken(self, producer: asyncio.Task[None]) -> bytes | None:
        """The next record; None once ``producer`` is done and nothing is left."""
        queue = self._queue
        if not queue.empty():
            return queue.get_nowait()
        getter = asyncio.ensure_future(queue.get())
        try:
            await asyncio.wait((getter, producer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
        return queue.get_nowait() if not queue.empty() else None

    def written(self) -> None:
        """The last record taken is written: the producer waits for this at the end."""
        self._queue.task_done()
