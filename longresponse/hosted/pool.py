"""The HTTP under the ``mcp`` tool's sessions: one pool, each session's view of it.

Theory of operation
-------------------
Making an HTTP client costs its TLS context (about 45 ms of the event loop:
the CA bundle is read and parsed), so the server makes one, with its
connection pool, when it starts (:class:`McpPool`), and every MCP session
speaks through it. A session gets a view of the pool (:meth:`McpPool.client`:
an SDK-facing client over a :class:`_SessionTransport`, about 20 µs to make)
that adds the session's own headers (its ``authorization`` and ``headers``)
to each of its requests: they are never set on anything another session
uses, and a pooled connection carries no header from one request to the next.

Every answer is read through :class:`_BoundedBody`, which inflates it itself
(``gzip`` and ``deflate``, the encodings it asks for; an answer in any
other fails when read) in pieces of at most :data:`PIECE_BYTES`, counting the bytes received
and the bytes inflated as they come. An answer that is not a stream of
events may be at most :meth:`Answers.body_limit` bytes of either, what the session's
operation expects (:meth:`Answers.expect`: a listing's or an output's limit,
twice over and 64 KiB, since an answer may carry its output both as content
and as structured content): one byte more and the read stops, the body read
so far is dropped with the response, and the operation fails with that
limit's own error (:attr:`Answers.refusal`). The SDK parses an answer only
once it is read whole, so nothing larger than that bound is ever parsed or
held. A stream of events (``text/event-stream``) is not bounded as a whole:
its events are, by the SDK's event size limit, each handled as it comes, and
the stream by the operation's deadline; its pieces are, as they inflate.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Final

import httpx2

__all__ = ["ENVELOPE_BYTES", "PIECE_BYTES", "Answers", "McpPool"]

#: The most one piece of an inflated answer may be (``zlib``'s ``max_length``).
PIECE_BYTES: Final = 64 << 10
#: What an answer may hold besides its listing or output (the JSON-RPC envelope,
#: the annotations and notifications of a stream).
ENVELOPE_BYTES: Final = 64 << 10
#: Connections kept open for reuse, across every session.
KEEPALIVE_CONNECTIONS: Final = 64
#: The encodings :class:`_BoundedBody` inflates (the request's ``accept-encoding``).
ACCEPTED_ENCODINGS: Final = "gzip, deflate"


class AnswerTooLarge(httpx2.StreamError):
    """An answer passed the limit of :class:`Answers`. A stream error of the
    SDK's HTTP client, which the SDK turns into the request's failure at once
    (any other error of a read would end the session's tasks, and anyio would
    cancel the turn's task with them)."""


class AnswerUnreadable(httpx2.StreamError):
    """An answer in an encoding not asked for (:data:`ACCEPTED_ENCODINGS`), or one
    that does not inflate: failed when read, as :class:`AnswerTooLarge` is."""


class Answers:
    """What one session's answers may weigh, and whether one weighed more.

    ``refused`` is then the message the operation gave :meth:`expect` (its
    limit's error, which the operation raises in place of whatever the SDK
    made of the cut-off read)."""

    def __init__(self, limit: int, too_large: str) -> None:
        self.limit, self._too_large = limit, too_large
        self.refused: str | None = None
        #: Why an answer could not be read (its encoding), if one could not.
        self.unreadable: str | None = None

    def expect(self, limit: int, too_large: str) -> None:
        """The next operation's answers are at most :meth:`body_limit` of ``limit``;
        one larger fails it with ``too_large``. Forgets an earlier refusal."""
        self.limit, self._too_large, self.refused = limit, too_large, None
        self.unreadable = None

    def body_limit(self) -> int:
        return 2 * self.limit + ENVELOPE_BYTES

    def refuse(self) -> AnswerTooLarge:
        """Note the refusal and return the read's error (the SDK's stream error)."""
        self.refused = self._too_large
        return AnswerTooLarge(f"an MCP answer passed {self.body_limit()} bytes")


class _Inflater:
    """``gzip`` or ``deflate`` inflated in pieces of at most ``PIECE_BYTES``."""

    def __init__(self, encoding: str) -> None:
        gzip = encoding == "gzip"
        self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS)
        #: ``deflate``: a zlib stream, or a bare deflate one (no zlib header), as sent.
        self._sniff = not gzip

    def pieces(self, data: bytes) -> Iterator[bytes]:
        if self._sniff and data:
            self._sniff = False
            if data[0] & 0x0F != zlib.DEFLATED:
                self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
        piece = self._zlib.decompress(data, PIECE_BYTES)
        while piece:
            yield piece
            piece = self._zlib.decompress(self._zlib.unconsumed_tail, PIECE_BYTES)


class _BoundedBody(httpx2.AsyncByteStream):
    """An answer's body, inflated here and counted as it is read (see the module
    docstring); ``limit`` ``None``: a stream of events, its pieces bounded only."""

    def __init__(self, inner: Any, encoding: str, answers: Answers, limit: int | None) -> None:
        self._inner, self._encoding = inner, encoding
        self._inflater = _Inflater(encoding) if encoding in ("gzip", "deflate") else None
        self._answers, self._limit = answers, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._encoding not in ("identity", "gzip", "deflate"):
            raise self._unreadable("in an encoding this server did not ask for")
        received = inflated = 0
        limit = self._limit
        async for chunk in self._inner:
            received += len(chunk)
            if limit is not None and received > limit:
                raise self._answers.refuse()
            pieces = [chunk] if self._inflater is None else self._inflater.pieces(chunk)
            try:
                for piece in pieces:
                    inflated += len(piece)
                    if limit is not None and inflated > limit:
                        raise self._answers.refuse()
                    yield piece
            except zlib.error:
                raise self._unreadable(f"whose {self._encoding} does not inflate") from None

    def _unreadable(self, why: str) -> AnswerUnreadable:
        self._answers.unreadable = why
        return AnswerUnreadable(f"an MCP answer {why}")

    async def aclose(self) -> None:
        await self._inner.aclose()


class _SessionTransport(httpx2.AsyncBaseTransport):
    """One session's view of the pool: its headers on each request, its answers
    bounded (see the module docstring). Closing it leaves the pool open."""

    def __init__(
        self, pool: httpx2.AsyncBaseTransport, headers: Mapping[str, str], answers: Answers
    ) -> None:
        self._pool, self._headers, self._answers = pool, headers, answers

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        for name, value in self._headers.items():
            if name not in request.headers:  # the SDK's own headers come first, as before
                request.headers[name] = value
        request.headers["accept-encoding"] = ACCEPTED_ENCODINGS
        response = await self._pool.handle_async_request(request)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        headers = [
            (name, value)
            for name, value in response.headers.multi_items()
            if name.lower() not in ("content-encoding", "content-length")
        ]
        events = response.headers.get("content-type", "").lower().startswith("text/event-stream")
        limit = None if events else self._answers.body_limit()
        return httpx2.Response(
            response.status_code,
            headers=headers,
            stream=_BoundedBody(response.stream, encoding, self._answers, limit),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        pass


class McpPool:
    """The one TLS context and connection pool of every MCP session (see the
    module docstring); closed with the server."""

    def __init__(self) -> None:
        #: The TLS context, made once (what made each session cost ~45 ms).
        self.tls = httpx2.create_ssl_context()
        self._transport = httpx2.AsyncHTTPTransport(
            verify=self.tls,
            limits=httpx2.Limits(
                max_connections=None, max_keepalive_connections=KEEPALIVE_CONNECTIONS
            ),
        )

    def client(
        self, headers: Mapping[str, str], answers: Answers, timeout: httpx2.Timeout
    ) -> httpx2.AsyncClient:
        """A session's client: the pool with ``headers`` on each of its requests
        and its answers bounded by ``answers``; closing it leaves the pool open."""
        transport = _SessionTransport(self._transport, dict(headers), answers)
        return httpx2.AsyncClient(transport=transport, timeout=timeout)

    async def aclose(self) -> None:
        await self._transport.aclose()
