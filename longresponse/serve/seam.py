"""The outermost ASGI layer: a way to drop a connection outright.

Theory of operation
-------------------
ASGI has no message for "drop this connection, unsent bytes and all". A
server that closes a socket gracefully first flushes what it buffered, so a
client that stopped reading keeps its connection, and the server its send
buffer, for as long as the client likes. That is what a slow reader past its
timeout must not be allowed to do.

:class:`Seam` wraps the application. For each HTTP and WebSocket connection it
puts an ``abort`` callable in the scope (under :data:`ABORT_KEY`) before any
middleware wraps the server's ``send``: the callable resets the server's own
transport (uvicorn's protocol objects hold it as ``transport``): ``SO_LINGER``
zero, then ``abort()``, so that the kernel drops what the client never read
instead of keeping it, with the socket, in FIN-WAIT-1 for as long as the
client holds its end open. An endpoint
that cuts off a slow reader calls :func:`abort` with its scope; under a server
without such a transport the call does nothing and the connection closes as
the server closes it.

Under uvicorn with ``LingeringWSProtocol`` a WebSocket scope also carries
the protocol's ``send_texts`` (:data:`SEND_TEXTS_KEY`): several text messages
in one transport write, which the outbox uses when events are queued.

When the peer is gone, the task that was writing to it is stopped with
:func:`stop_task`: cancelled once, and waited for without passing on the
cancellations that keep coming to the waiter (Starlette's streaming response
runs in an anyio task group, whose cancelled scope cancels its task again at
every step; a task awaited by a cancelled one is cancelled with it, so each
would reach the stopped task's cleanup and cut it short: an engine's stream
left open, the engine generating for nobody).

The scope also carries whether the peer is gone (:func:`peer_gone`: the
transport is closing, e.g. after a reset). A stream checks it before each
write: the server drops writes to a lost connection silently, but asyncio
logs every one past the fifth (``socket.send() raised exception``), and a
stream whose queued records go out without a pause would write them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import struct
from collections.abc import AsyncIterable, AsyncIterator, Coroutine
from typing import Any, Final, TypeVar

from .types import Receive, Scope, Send

__all__ = [
    "ABORT_KEY",
    "GONE_KEY",
    "SEND_TEXTS_KEY",
    "Seam",
    "abort",
    "peer_gone",
    "stop_task",
    "until_gone",
    "while_connected",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Where the scope carries the connection's abort callable.
ABORT_KEY: Final = "longresponse.abort"
#: Where the scope carries whether the connection's transport is closing.
GONE_KEY: Final = "longresponse.gone"
#: Where a WebSocket scope carries ``send_texts(texts)``, if the server has it.
SEND_TEXTS_KEY: Final = "longresponse.send_texts"
#: ``SO_LINGER`` on, with no time to linger: ``close()`` resets the connection.
_LINGER_ZERO: Final = struct.pack("ii", 1, 0)


def _transport_of(send: Send) -> Any:
    owner = getattr(send, "__self__", None)
    transport = getattr(owner, "transport", None)
    return transport if callable(getattr(transport, "abort", None)) else None


class Seam:
    """Wraps ``app``; forwards everything, adding the abort callable to the scope."""

    def __init__(self, app: Any, *, parts: Any = None) -> None:
        self.app = app
        #: What the app is made of (``longresponse.serve.app.ServerParts``), for
        #: the server process and for tests that observe the server in-process.
        self.parts = parts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            transport = _transport_of(send)
            if transport is not None:
                scope[ABORT_KEY] = functools.partial(_reset, transport)
                scope[GONE_KEY] = transport.is_closing
            send_texts = getattr(getattr(send, "__self__", None), "send_texts", None)
            if scope["type"] == "websocket" and callable(send_texts):
                scope[SEND_TEXTS_KEY] = send_texts
        try:
            await self.app(scope, receive, send)
        finally:
            # The server's protocol keeps the scope: the protocol's own methods
            # left in it would make a cycle that only a full collection frees.
            for key in (ABORT_KEY, GONE_KEY, SEND_TEXTS_KEY):
                scope.pop(key, None)

    def __getattr__(self, name: str) -> Any:
        # ``state``, ``routes``... of the wrapped application.
        return getattr(self.app, name)


def _reset(transport: Any) -> None:
    """Close ``transport`` with a reset: what its peer never read is dropped
    by the kernel too. (A plain close sends a FIN after that data, and the
    socket stays in FIN-WAIT-1, its send buffer full, for as long as the
    peer keeps it open without reading.)"""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
    transport.abort()


def abort(scope: Scope, why: str) -> bool:
    """Drop the connection of ``scope`` now; True if the server let us."""
    drop = scope.get(ABORT_KEY)
    if drop is None:
        return False
    log.info("dropping a connection: %s", why)
    drop()
    return True


def peer_gone(scope: Scope) -> bool:
    """The connection of ``scope`` is closing or lost: nothing written reaches the peer."""
    gone = scope.get(GONE_KEY)
    return gone is not None and bool(gone())


async def until_gone(scope: Scope, records: AsyncIterable[Any]) -> AsyncIterator[Any]:
    """``records``, until the peer of ``scope`` is gone (then ``records`` is closed)."""
    iterator = aiter(records)
    try:
        async for record in iterator:
            if peer_gone(scope):
                return
            yield record
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()


async def stop_task(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` once and wait until it is done, its cleanup whole.

    The caller's own cancellations meanwhile are not passed on to ``task``
    (it is awaited through :func:`asyncio.shield`); they are absorbed, as a
    caller in a ``finally`` is already on its way out. Whatever ``task``
    raised is left in it (retrieved, not raised).
    """
    task.cancel()
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            continue  # the caller cancelled again, or the task ended cancelled
        except Exception:
            break  # the task failed: its exception stays in it
    if not task.cancelled():
        task.exception()  # retrieved: asyncio does not log it as never retrieved


async def while_connected(receive: Receive, work: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
    """Run ``work`` while the HTTP client is connected (its ``http.disconnect``
    is watched meanwhile); a client that hangs up first stops it
    (:func:`stop_task`: its cleanup, closing an engine's stream, runs whole).
    The task, done: cancelled if the client left first."""

    async def hung_up() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(hung_up())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        await stop_task(watch)
        if not task.done():
            await stop_task(task)
    return task
