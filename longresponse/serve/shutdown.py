"""Graceful shutdown: WebSockets drained before uvicorn stops.

Theory of operation
-------------------
On SIGINT or SIGTERM uvicorn sets ``Server.should_exit``; its main loop
notices within 0.1 s and calls ``Server.shutdown()``, which closes the
listening sockets, then calls ``shutdown()`` on every open connection. For a
WebSocket (``uvicorn.protocols.websockets.wsproto_impl``) that sends a close
frame with 1012 at once and closes the transport, whatever the application
is doing: a turn being streamed is cut off mid-response. Only after the
connections are gone does the app hear of it (the lifespan's shutdown event),
too late to let anything finish.

:class:`GracefulServer` is uvicorn's ``Server`` with one step put first in
``shutdown()``: it stops accepting connections, then asks the WebSocket
endpoint to drain (:meth:`ResponsesEndpoint.drain`): each session stops
reading client messages, lets its running turns finish, and closes 1012
itself, within ``drain_timeout`` seconds (``--shutdown-drain-timeout``);
then uvicorn's own shutdown runs as before (HTTP requests in flight finish,
the lifespan drains the write-behind queue). A second SIGINT during the
drain (uvicorn's ``force_exit``) ends it at once. HTTP ``background: true``
responses still running are then ended ``failed`` (and stored), so readers
following them are not left waiting, and uvicorn's wait for open HTTP
connections is bounded by the same timeout (``timeout_graceful_shutdown``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn

from .http.background import BackgroundResponses
from .ws.session import ResponsesEndpoint

__all__ = ["GracefulServer"]


class GracefulServer(uvicorn.Server):
    """uvicorn's server, draining ``endpoint``'s WebSockets before it shuts them."""

    def __init__(
        self,
        config: uvicorn.Config,
        endpoint: ResponsesEndpoint,
        *,
        drain_timeout: float,
        background: BackgroundResponses | None = None,
    ) -> None:
        super().__init__(config)
        self.endpoint = endpoint
        self.drain_timeout = drain_timeout
        self.background = background

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # no new connections while draining
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.drain_timeout):
                await self.endpoint.drain(abandon=lambda: self.force_exit)
        if self.background is not None:
            # HTTP background responses end failed (and are stored) now, so their
            # followers' streams end and uvicorn's wait for HTTP connections
            # (bounded by timeout_graceful_shutdown) is not held up by them.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.drain_timeout):
                    await self.background.aclose()
        await super().shutdown(sockets=sockets)
