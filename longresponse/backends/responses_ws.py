"""The Responses backend over the upstream's WebSocket mode: one socket per rollout.

Theory of operation
-------------------
:class:`ResponsesWSBackend` knows the upstream's WebSocket URL (its
``base_url`` with ``http`` → ``ws`` and ``https`` → ``wss``, then
``/responses``: ``wss://api.openai.com/v1/responses``) and the headers; each
rollout's :class:`ResponsesWSSampler` opens ONE socket on its first turn and
keeps it for the rollout's life. Every turn sends one ``response.create``
with ``previous_response_id`` of the last upstream response that ended on
that socket and only the items added since
(:class:`~.responses_wire.Chain`); the first turn on a socket, or a context
that was rewritten, sends the full input. The upstream continues from its
connection-local state, so this works with ``store: false`` too (the
``store`` sent is ``upstream_store``). Events are read as over HTTP
(:class:`~.responses_wire.TurnReader`).

The socket's life:

- it idles while the client runs its tools (the library's pings keep it up);
- a socket the upstream closed (its 60-minute limit: an ``error``
  ``websocket_connection_limit_reached``, then the close) or that broke is
  found at the next turn, which opens a new one and sends the full input
  (once within a turn, if the old one dies under the turn before any event;
  that counts as one of the turn's attempts);
- a turn abandoned while its upstream response still runs (the client's
  ``response.cancel``, a disconnect, a timeout) aborts the socket at once,
  so the upstream stops; the next turn opens a new one;
- :meth:`ResponsesWSSampler.aclose`, called when the rollout ends or is
  dropped (:func:`longresponse.engine.sampling.release`), closes it.

Timeouts and retries are as over HTTP (:mod:`.responses_http`): the create
is sent and the first event (any event) read within ``first_token_timeout``,
then at most ``idle_timeout`` between two events; only a failure the
upstream cannot have begun (the socket could not be opened, an ``error``
event with a retryable code before ``response.created``) is sent again.

The websockets library's own logger would print the handshake's headers
(the API key among them) at DEBUG; the sockets log to :data:`SOCKET_LOG`,
which never logs below INFO.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import Any, Final

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.protocol import State

from ..config import BackendConfig
from ..engine.sampling import SampleChunk, SampleRequest, Stop, UpstreamError, Usage
from .responses_http import api_key, auth_headers, retry_wait
from .responses_wire import (
    CHAIN_LOST,
    ChainedTurns,
    TurnReader,
    create_body,
    refused,
    turn_ended,
)
from .served_model import ServedModel

__all__ = ["MAX_UPSTREAM_EVENT_BYTES", "SOCKET_LOG", "ResponsesWSBackend", "ResponsesWSSampler"]

#: The sockets' logger: never below INFO (websockets logs headers at DEBUG).
SOCKET_LOG: Final = logging.getLogger(f"{__name__}.socket")
SOCKET_LOG.setLevel(logging.INFO)
#: The largest upstream event read (a ``response.completed`` holds the whole output).
MAX_UPSTREAM_EVENT_BYTES: Final = 64 * 1024 * 1024
#: Seconds a clean close waits for the upstream's close frame.
CLOSE_TIMEOUT: Final = 1.0
#: Upstream codes after which its socket is gone: a new one, with full input.
SOCKET_LOST: Final = frozenset({"websocket_connection_limit_reached"})


def websocket_url(base_url: str) -> str:
    """``{base_url}/responses`` as a WebSocket URL (http → ws, https → wss)."""
    url = base_url.rstrip("/") + "/responses"
    for scheme, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(scheme):
            return ws + url[len(scheme) :]
    return url


class ResponsesWSBackend:
    """A Responses server's WebSocket mode (OpenAI, or another longresponse)."""

    def __init__(self, config: BackendConfig) -> None:
        self.config = config
        self.url = websocket_url(config.base_url)
        self.key = api_key(config)
        self.headers = auth_headers(self.key)
        self.served = ServedModel(config, self.key)

    def make_sampler(self) -> ResponsesWSSampler:
        return ResponsesWSSampler(self)

    async def check(self) -> None:
        """Ask the upstream once (over HTTP) whether it serves the configured model
        (``served_model``)."""
        await self.served.check()

    async def aclose(self) -> None:
        """Nothing shared to close: each rollout's sampler closes its own socket."""


class ResponsesWSSampler(ChainedTurns):
    """One rollout's upstream socket and chain."""

    def __init__(self, backend: ResponsesWSBackend) -> None:
        super().__init__(backend.config)
        self.backend = backend
        self.socket: ClientConnection | None = None
        self.headers = {**backend.headers, **self.headers}

    async def sample(self, request: SampleRequest) -> AsyncGenerator[SampleChunk, None]:
        if request.max_output_tokens == 0:  # the budget is spent: nothing to ask for
            yield Stop("max_output_tokens")
            return
        config = self.backend.config
        attempt, reopened = 0, False
        while True:
            sent = list(request.context)
            reader = TurnReader(secret=self.backend.key)
            previous = None
            reused = self.socket is not None and self.socket.state is State.OPEN
            try:
                socket = await self._open()
                previous, items = self.chain.continuation(sent)
                self.reasoned.attach(sent)
                created = create_body(config, request, items, previous, self.reasoned)
                body = {"type": "response.create", **created}
                async with contextlib.aclosing(self._turn(socket, body, reader)) as chunks:
                    async for chunk in chunks:
                        if isinstance(chunk, Usage):  # the upstream response ended
                            turn_ended(reader, sent, items, previous, self.chain, self.reasoned)
                        yield chunk
                return
            except UpstreamError as exc:
                if reader.begun:
                    raise  # the upstream may have begun it: never run it twice
                if previous is not None and exc.code in CHAIN_LOST:
                    self.chain.forget()  # the upstream forgot it: send everything
                    continue
                if reused and not reopened and self.socket is None:
                    reopened = True  # the socket died while idle: a new one, at once
                    attempt += 1
                    continue
                wait = retry_wait(config, exc, attempt)
                if wait is None:
                    raise
            attempt += 1
            await asyncio.sleep(wait)

    async def _open(self) -> ClientConnection:
        """The rollout's socket; a new one (and a new chain) if it is closed.

        Raises :class:`UpstreamError` if the upstream cannot be reached or refuses.
        """
        if self.socket is not None:
            if self.socket.state is State.OPEN:
                return self.socket
            self._abort()
        config = self.backend.config
        try:
            self.socket = await connect(
                self.backend.url,
                additional_headers=self.headers,
                open_timeout=config.connect_timeout,
                close_timeout=CLOSE_TIMEOUT,
                max_size=MAX_UPSTREAM_EVENT_BYTES,
                logger=SOCKET_LOG,
            )
        except InvalidStatus as exc:
            response = exc.response
            body: Any = None
            with contextlib.suppress(msgspec.DecodeError):
                body = msgspec.json.decode(response.body or b"null")
            retry_after = response.headers.get("Retry-After")
            raise refused(
                response.status_code, body, retry_after, secret=self.backend.key
            ) from None
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            raise UpstreamError(
                f"The upstream could not be reached ({type(exc).__name__})."
            ) from None
        return self.socket

    async def _turn(
        self, socket: ClientConnection, body: dict[str, Any], reader: TurnReader
    ) -> AsyncGenerator[SampleChunk, None]:
        """Send one create and read its events until the response ends.

        A turn left before its response ended aborts the socket (the upstream
        must stop writing it); an ``error`` event leaves the socket as it is.
        """
        config = self.backend.config
        loop = asyncio.get_running_loop()
        first_deadline = loop.time() + config.first_token_timeout
        running = True
        try:
            try:
                async with asyncio.timeout_at(first_deadline):
                    await socket.send(msgspec.json.encode(body).decode())
            except TimeoutError:
                reader.begun = True  # part of it may have gone: the socket is dropped
                raise UpstreamError(
                    f"The upstream took no request for {config.first_token_timeout:g} s."
                ) from None
            while not reader.ended:
                if reader.begun:
                    wait = config.idle_timeout
                    deadline = loop.time() + wait
                else:
                    wait, deadline = config.first_token_timeout, first_deadline
                try:
                    async with asyncio.timeout_at(deadline):
                        data = await socket.recv()
                except TimeoutError:
                    reader.begun = True  # the response may be running upstream
                    raise UpstreamError(
                        f"The upstream sent nothing for {wait:g} s.", output_started=reader.started
                    ) from None
                event = reader.decode(data)
                if event.type in ("error", "response.failed"):
                    running = False  # refused, or ended: the socket stays usable
                    if (event.error or {}).get("code", event.code) in SOCKET_LOST:
                        self._abort()
                for chunk in reader.read(event):
                    yield chunk
            running = False
        except ConnectionClosed:
            self._abort()
            raise UpstreamError(
                "The upstream closed the WebSocket during the turn.",
                output_started=reader.started,
            ) from None
        finally:
            if running:
                self._abort()

    def _abort(self) -> None:
        """Drop the socket now, without waiting (the next turn opens another)."""
        socket, self.socket = self.socket, None
        self.chain.forget()
        if socket is not None:
            socket.transport.abort()

    async def aclose(self) -> None:
        """Close the socket (the rollout ended or was dropped); a later turn reopens one."""
        socket, self.socket = self.socket, None
        self.chain.forget()
        if socket is not None:
            try:
                await socket.close()
            except BaseException:
                socket.transport.abort()
                raise
