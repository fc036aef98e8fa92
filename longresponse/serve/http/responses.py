"""The HTTP Responses API: the shape every client speaks, and the research baseline.

``POST /v1/responses`` (JSON, or SSE with ``stream: true``),
``GET``/``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``,
``POST /v1/responses/{id}/cancel``; ``background: true`` is ``serve/background.py``.

Every request is stateless: a continuation (``previous_response_id``) walks
the chain back through the store, renders and tokenizes the whole history
again, and runs a fresh Rollout over it. That is the cost the WebSocket
shapes avoid, and what the benchmark compares them against.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from protocol import ErrorCode, ProtocolError, RemoteProtocolError, decode_create_body
from protocol.events import ResponseCreate
from protocol.items import Item, as_items
from protocol.response import Response as ResponseObject

from ...config import WRITE_SLICE_SECONDS, ServerConfig
from ...engine.sampling import UpstreamError
from ...engine.stream import StreamClosed
from ...engine.timing import TurnTiming
from ...engine.turn import Started
from ...storage.keys import ApiKeys, Unauthorized
from ...storage.persistence import Persistence
from ..continuation import Continuation, continue_from
from ..deadline import DeadlineStream
from ..errors import http_error, upstream_http_error
from ..gate import owner_of
from ..references import resolve_references
from ..request_ids import request_id
from ..seam import abort, peer_gone, stop_task, while_connected
from ..skeleton import check_create_skeleton
from ..transport import Transport
from ..turns import Caller, StoreRefused, Turns
from ..types import Scope
from .background import BackgroundResponses, check_cancellable
from .listing import item_id, list_query, page, past
from .sinks import SSE_DONE, SSE_QUEUE_DEPTH, RecordingSink, SSESink

__all__ = ["ResponsesHTTP", "hung_up", "too_many_items"]

log = logging.getLogger(__name__)


async def hung_up(request: Request, exc: Exception) -> Response:
    """The app's answer to :class:`ClientDisconnect` (a client gone mid-body):
    :meth:`ResponsesHTTP.read_body` logged it in one line; nobody reads this."""
    return Response(status_code=400)


_encoder = msgspec.json.Encoder()


def too_many_items(
    count: int, limit: int, *, what: str = "input items", param: str = "input"
) -> RemoteProtocolError:
    """The refusal of a request carrying ``count`` input items (``what``, at
    ``param``: chat's messages), past ``limit`` (``--max-items-per-event``, a
    create's limit on every endpoint)."""
    return RemoteProtocolError(
        f"The request carries {count} {what}; the limit is {limit}.",
        code=ErrorCode.TOO_MANY_ITEMS,
        param=param,
    )


def _not_found(response_id: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"Response with id '{RemoteProtocolError.clip(response_id)}' not found.",
        code=ErrorCode.RESPONSE_NOT_FOUND,
        param="response_id",
        status=404,
    )


def _json(obj: Any, status: int = 200) -> Response:
    return Response(_encoder.encode(obj), status_code=status, media_type="application/json")


class ResponsesHTTP:
    """The HTTP endpoints, sharing models, keys and persistence with the WebSocket side."""

    def __init__(
        self,
        config: ServerConfig,
        turns: Turns,
        keys: ApiKeys,
        persistence: Callable[[], Persistence],
        background: BackgroundResponses | None = None,
    ) -> None:
        self.config = config
        self.turns = turns
        self.keys = keys
        self._persistence = persistence
        self.background = background or BackgroundResponses(turns)
        #: The Conversations API's conversations (``conversation`` on a create reads them).
        self.conversations = turns.conversations
        self.requests = 0

    @property
    def persistence(self) -> Persistence:
        return self._persistence()

    def routes(self) -> list[Route]:
        return [
            Route("/v1/responses", self.create, methods=["POST"]),
            Route("/v1/responses/{response_id}", self.retrieve, methods=["GET"]),
            Route("/v1/responses/{response_id}", self.delete, methods=["DELETE"]),
            Route("/v1/responses/{response_id}/input_items", self.input_items, methods=["GET"]),
            Route("/v1/responses/{response_id}/cancel", self.cancel, methods=["POST"]),
        ]

    def owner(self, request: Request) -> str:
        """The API key's owner (``""`` when keys are off); raises
        :class:`RemoteProtocolError` ``invalid_api_key`` (401). Every HTTP route
        that takes a body asks this first."""
        try:
            return owner_of(request.scope, self.keys)
        except Unauthorized as exc:
            raise RemoteProtocolError(str(exc), code="invalid_api_key", status=401) from exc

    async def read_body(self, request: Request) -> bytearray:
        """The request's body, read up to ``--max-message-bytes``; past it (declared
        or streamed) raises the shipped 413 refusal, having kept nothing.

        Each chunk is appended as it comes: joining 15 MB of chunks at the end
        held the loop 9-17 ms in one copy; appending costs well under a
        millisecond a chunk (a large buffer grows in place)."""
        limit = self.config.max_message_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(int(declared), limit)
        body = bytearray()
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(size, limit)
                body += chunk
        except ClientDisconnect:
            # Not an application error: one line, then the app's handler
            # (``hung_up``) answers nobody, quietly.
            log.info(
                "client hung up mid-body: %s %s after %d of %s bytes request_id=%s",
                request.method,
                request.url.path,
                size,
                declared if declared is not None else "?",
                request_id(request.scope) or "-",
            )
            raise
        return body

    # --- POST /v1/responses ------------------------------------------------------

    async def create(self, request: Request) -> Response:
        received_at = time.perf_counter()
        self.requests += 1
        try:
            owner = self.owner(request)
        except ProtocolError as error:
            self.turns.inspector.http.refused(None)
            return http_error(error)
        # A key's creates take turns until their model runs: a burst of one key's
        # waits here, not ready, while other keys' requests are served.
        async with self.turns.admitting.turn(owner):
            run = await self._admit(request, owner, received_at)
        if not isinstance(run, _Run):
            return run  # refused, or a background response's answer
        if run.body.stream:
            return StreamingResponse(run.sse(), media_type="text/event-stream")
        return await run.json(request)

    async def _admit(self, request: Request, owner: str, received_at: float) -> _Run | Response:
        """Read, check and admit a create of ``owner``'s: its turn started (a
        :class:`_Run`), or the answer already (an error, a background response)."""
        body: ResponseCreate | None = None
        try:
            raw = await self.read_body(request)
            await self.check_skeleton(raw)
            body = decode_create_body(raw)
            body = await resolve_references(body, self.persistence, owner=owner)
            self.turns.inspector.http.client(body, len(raw))
            if body.stream_id is not msgspec.UNSET:
                raise RemoteProtocolError(
                    "Unknown parameter: 'stream_id' (it exists on WebSocket connections only).",
                    code=ErrorCode.UNKNOWN_PARAMETER,
                    param="stream_id",
                )
            self.turns.check_background(body, transport=Transport.HTTP)
            self.turns.waits_in_place(body, beta=False, transport=Transport.HTTP)
            model = self.turns.resolve(body)
            self.turns.check_metadata(body, model)
            decoded = time.perf_counter()
            new_items = as_items(body.input)
            continuation = await self.stored_continuation(body, new_items, owner)
            self.turns.reuse_prefix(continuation, new_items, owner=owner)
            # The costly checks, off the loop: HTTP checks its history again, but
            # for a known prefix.
            unchecked = continuation.unchecked(new_items)
            async with self.turns.settled(body, unchecked, owner=owner):
                if body.background:  # owned by the server from here on
                    created = await self.background.create(
                        body,
                        new_items,
                        continuation,
                        owner=owner,
                        model=model,
                        received_at=received_at,
                        decode=decoded - received_at,
                    )
                    return _while_connected(created, request.scope)
                run = _Run(self, body, owner, continuation.history, received_at, request.scope)
                # Stateless: the whole history is validated and classified again.
                caller = Caller(Transport.HTTP, run.sink, owner, decode=decoded - received_at)
                run.begin(self.turns.start_turn(body, new_items, caller, continuation, model=model))
        except ProtocolError as error:
            self.turns.inspector.http.refused(body)
            return http_error(error)
        return run

    async def check_skeleton(self, raw: bytes | bytearray) -> None:
        """A create body's item, tool and schema limits, checked before it is
        decoded (``longresponse.serve.skeleton``). Raises their
        :class:`RemoteProtocolError`."""
        await check_create_skeleton(raw, self.turns.pipeline.limits, self.check_item_count)

    def check_item_count(self, count: int) -> None:
        """Refuse ``count`` input items past ``--max-items-per-event`` (raises
        :class:`RemoteProtocolError` ``too_many_items``)."""
        if count > self.config.max_items_per_event:
            raise too_many_items(count, self.config.max_items_per_event)

    async def stored_continuation(
        self, body: ResponseCreate, new_items: list[Item], owner: str
    ) -> Continuation:
        """Where an HTTP request continues from: the store (HTTP keeps nothing else),
        the stored chain or the ``conversation``'s items.

        Raises :class:`RemoteProtocolError`: too many input items, the
        continuation rules (``longresponse.serve.continuation``), or those of
        ``conversation`` (``Conversations.continuation``).
        """
        self.check_item_count(len(new_items))
        in_conversation = await self.conversations.continuation(body, owner)
        if in_conversation is not None:
            return in_conversation
        return await continue_from(
            body.previous_response_id,
            new_items,
            lookup=_nothing_cached,
            evict=_nothing_cached,
            lane=None,
            persistence=self.persistence,
            owner=owner,
        )

    # --- the other endpoints -----------------------------------------------------

    async def retrieve(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        query = request.query_params
        try:
            owner = self.owner(request)
            if query.get("stream") in ("true", "1"):  # a background response's events
                streamed = await self.background.stream(
                    response_id, query.get("starting_after"), owner, self.persistence
                )
                if streamed is None:
                    raise _not_found(response_id)
                return _while_connected(streamed, request.scope)
            running = self.background.get(response_id, owner=owner)
            if running is not None:
                return _json(running.snapshot())
            record = await self.persistence.get(response_id, owner=owner)
            if record is None:
                raise _not_found(response_id)
            # A background response whose process stopped ends here, not in_progress.
            response = await self.background.settle(record)
        except ProtocolError as error:
            return http_error(error)
        return _json(response)

    async def delete(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        try:
            owner = self.owner(request)
            await self.background.check_deletable(
                response_id, owner=owner, persistence=self.persistence
            )
            if not await self.persistence.delete(response_id, owner=owner):
                raise _not_found(response_id)
            self.background.forget(response_id)
        except ProtocolError as error:
            return http_error(error)
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})

    async def input_items(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        query = request.query_params
        try:
            owner = self.owner(request)
            limit, order = list_query(query)
            conversation = await self.persistence.conversation(response_id, owner=owner)
            if conversation is None:
                raise _not_found(response_id)
            last = conversation.last
            if last.context is None:
                items = conversation.items[: len(conversation.items) - len(last.response.output)]
            else:  # the last response's items are in context order: leave out its output
                produced = {item_id(item) for item in last.response.output}
                before = conversation.items[: len(conversation.items) - len(last.context)]
                items = [*before, *(i for i in last.context if item_id(i) not in produced)]
            if order == "desc":
                items = items[::-1]
            where = f"response '{RemoteProtocolError.clip(response_id)}'"
            items = past(items, query.get("after"), noun="input item", where=where)
        except ProtocolError as error:
            return http_error(error)
        return _json(page(items[:limit], has_more=len(items) > limit))

    async def cancel(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        try:
            owner = self.owner(request)
            response = await self.background.cancel(response_id, owner=owner)
            if response is None:  # not running here: the stored one decides
                record = await self.persistence.get(response_id, owner=owner)
                if record is None:
                    raise _not_found(response_id)
                response = await self.background.cancel_stored(record)
            check_cancellable(response)
        except ProtocolError as error:
            return http_error(error)
        return _json(response)


def _nothing_cached(response_id: str) -> None:
    return None  # HTTP keeps no connection cache: every parent comes from the store


class _Run:
    """One HTTP request's rollout, answered as JSON or as SSE."""

    def __init__(
        self,
        http: ResponsesHTTP,
        body: ResponseCreate,
        owner: str,
        history: list[Item],
        received_at: float,
        scope: Scope,
    ) -> None:
        self.http = http
        self.body = body
        self.owner = owner
        self.received_at = received_at
        self.history = history
        self.started: Started | None = None
        self.final: ResponseObject | None = None
        self._sse = (
            SSESink(
                SSE_QUEUE_DEPTH,
                slow_reader_timeout=http.config.slow_reader_timeout,
                drop=lambda: abort(scope, "slow SSE reader"),
            )
            if body.stream
            else None
        )
        self.sink: RecordingSink = self._sse or RecordingSink()
        self._scope = scope

    def begin(self, started: Started) -> None:
        """The turn is admitted and opened (its events go to :attr:`sink`)."""
        self.started = started

    async def _segment(self) -> bool:
        assert self.started is not None
        rollout = self.started.rollout
        try:
            boundary = await self.http.turns.run_segment(
                self.started,
                owner=self.owner,
                transport=Transport.HTTP,
                history=self.history,
                received_at=self.received_at,
            )
        finally:
            await rollout.close()  # a request's rollout ends with it
        if boundary is None:
            return False
        self.final = boundary.response
        return True

    async def _segment_while_connected(self, request: Request) -> bool | None:
        """:meth:`_segment`, stopped (the engine's stream closed with it) when the
        client hangs up first; None then."""
        work = await while_connected(request.receive, self._segment())
        return None if work.cancelled() else work.result()

    async def json(self, request: Request) -> Response:
        assert self.started is not None
        finished = await self._segment_while_connected(request)
        if finished is None:  # the client is gone: nobody reads this
            return Response(status_code=499)
        if not finished or self.final is None:
            failure = self.started.reply.error
            segment = self.started.segment
            if segment is not None and isinstance(segment.exception, UpstreamError):
                return upstream_http_error(segment.exception)
            if segment is not None and isinstance(segment.exception, StoreRefused) and failure:
                return http_error(
                    RemoteProtocolError(
                        failure.message,
                        code="store_unavailable",
                        status=503,
                        error_type="server_error",
                    )
                )
            if failure is not None and failure.code == "context_length_exceeded":
                return http_error(
                    RemoteProtocolError(failure.message, code=failure.code, param="input")
                )
            return http_error(
                RemoteProtocolError(
                    "The server had an error while processing your request.",
                    code=ErrorCode.SERVER_ERROR,
                    status=500,
                    error_type="server_error",
                )
            )
        response = _json(self.final)
        seen = self.http.turns.inspector.record_of(self.started.rollout)
        if seen is not None:  # the body's bytes, for the inspector's timeline
            seen.sent_late(len(response.body))
        timings = self.started.rollout.timings
        if timings:
            # Server-side phase times of this request (RFC Server-Timing).
            timing = timings[-1]
            response.headers["server-timing"] = ", ".join(
                f"{name};dur={value * 1000:.3f}"
                for name, value in (
                    ("resume", timing.resume),
                    *((phase, getattr(timing, phase)) for phase in TurnTiming.PHASES),
                )
            )
        return response

    async def sse(self) -> AsyncIterator[bytes]:
        sink = self._sse
        assert sink is not None  # made for a streaming request

        async def produce() -> None:
            try:
                await self._segment()
            except StreamClosed:
                pass  # a slow reader was cut off: nobody is left to tell
            finally:
                sink.end()

        # Owned here: cancelled with this generator when the client goes away.
        producer = asyncio.get_running_loop().create_task(produce())
        try:
            turn = time.monotonic()
            while (record := await sink.next()) is not None:
                if peer_gone(self._scope):
                    return  # the client left: stop writing (the finally stops the rollout)
                yield record
                if time.monotonic() - turn >= WRITE_SLICE_SECONDS:  # others' turn
                    await asyncio.sleep(0)
                    turn = time.monotonic()
            yield SSE_DONE
        finally:
            await stop_task(producer)  # its cleanup closes the engine's stream


def _while_connected(response: Response, scope: Scope) -> Response:
    """A streamed response stops writing once its client is gone: the server
    drops those writes, but asyncio logs each one (``serve.seam``)."""
    if isinstance(response, DeadlineStream):
        response.stop_when_gone(scope)
    return response


def _too_large(size: int, limit: int) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"The request body is {size} bytes; the limit is {limit}.",
        code=ErrorCode.MESSAGE_TOO_LARGE,
        status=413,
    )
