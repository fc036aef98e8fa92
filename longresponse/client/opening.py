"""Opening a connection: the TCP stream, the WebSocket upgrade, the client's nursery."""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Protocol

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    RejectConnection,
    RejectData,
    Request,
)
from wsproto.utilities import RemoteProtocolError as WSRemoteProtocolError

from protocol import (
    APPEND_SUBPROTOCOL,
    MAX_MESSAGE_BYTES,
    CloseCode,
    Mode,
)

from .connection import (
    CLOSE_TIMEOUT,
    MAX_QUEUED_EVENTS,
    MAX_REJECT_BODY_BYTES,
    RECEIVE_BYTES,
    AppendClient,
    HandshakeError,
)

__all__ = ["connect"]

def _parse_url(url: str) -> tuple[str, int, str, str]:
    """``ws://host:port/path?query`` -> (host, port, Host header, request target)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "ws" or not parts.hostname:
        raise ValueError(f"expected a ws://host[:port]/path URL, not {url!r}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, parts.port or 80, parts.netloc.rpartition("@")[2], target


def _header_bytes(value: str | bytes) -> bytes:
    return value.encode("latin-1") if isinstance(value, str) else value


async def _handshake(stream: trio.abc.Stream, ws: WSConnection) -> str | None:
    """Read the server's answer to the upgrade request; return the subprotocol."""
    status: int | None = None
    headers: list[tuple[bytes, bytes]] = []
    body = bytearray()
    while True:
        data = bytes(await stream.receive_some(RECEIVE_BYTES))
        try:
            ws.receive_data(data or None)
        except WSRemoteProtocolError as exc:
            raise HandshakeError(status, bytes(body), headers=headers, reason=str(exc)) from exc
        for event in ws.events():
            if isinstance(event, AcceptConnection):
                return event.subprotocol  # frames already received stay queued in ws
            if isinstance(event, RejectConnection):
                status, headers = event.status_code, list(event.headers)
                if not event.has_body:
                    raise HandshakeError(status, headers=headers)
            elif isinstance(event, RejectData):
                body += event.data[: MAX_REJECT_BODY_BYTES - len(body)]
                if event.body_finished:
                    raise HandshakeError(status, bytes(body), headers=headers)
        if not data:
            reason = None if status else "the server closed the connection during the handshake"
            raise HandshakeError(status, bytes(body), headers=headers, reason=reason)


async def _open(
    url: str,
    subprotocols: Sequence[str],
    headers: Iterable[tuple[str | bytes, str | bytes]],
) -> tuple[trio.SocketStream, WSConnection, str | None]:
    host, port, host_header, target = _parse_url(url)
    stream = await trio.open_tcp_stream(host, port)
    try:
        ws = WSConnection(ConnectionType.CLIENT)
        request = Request(
            host=host_header,
            target=target,
            subprotocols=list(subprotocols),
            extra_headers=[(_header_bytes(k), _header_bytes(v)) for k, v in headers],
        )
        await stream.send_all(ws.send(request))
        subprotocol = await _handshake(stream, ws)
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream, ws, subprotocol


@contextlib.asynccontextmanager
async def connect(
    url: str,
    *,
    subprotocols: Sequence[str] = (APPEND_SUBPROTOCOL,),
    headers: Iterable[tuple[str | bytes, str | bytes]] = (),
    connect_timeout: float = 10.0,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    max_queued_events: int = MAX_QUEUED_EVENTS,
    close_timeout: float = CLOSE_TIMEOUT,
    mode: Mode | None = None,
) -> AsyncIterator[AppendClient]:
    """Connect to ``url`` (``ws://host:port/v1/responses``) and yield an :class:`AppendClient`.

    ``mode`` is what the connection speaks; by default append mode when the
    append subprotocol is offered, else the shipped shape (where only
    ``create`` is available, continued with ``previous_response_id``).

    The TCP connect and the upgrade together take at most ``connect_timeout``
    seconds (:class:`trio.TooSlowError`). A refused upgrade raises
    :class:`HandshakeError`. On exit the connection is closed (1000, or 1011
    if the block raised); exceptions from the block propagate unwrapped.
    """
    with trio.fail_after(connect_timeout):
        stream, ws, subprotocol = await _open(url, subprotocols, headers)
    with unwrapped():
        async with trio.open_nursery() as nursery:
            client = AppendClient(
                nursery,
                stream,
                ws,
                subprotocol=subprotocol,
                mode=mode or (Mode.APPEND if APPEND_SUBPROTOCOL in subprotocols else Mode.SHIPPED),
                max_message_bytes=max_message_bytes,
                max_queued_events=max_queued_events,
                close_timeout=close_timeout,
            )
            async with closing(client, nursery):
                yield client


class Closable(Protocol):
    """A client that closes its connection with a close code."""

    async def aclose(self, code: int = ...) -> None: ...


@contextlib.asynccontextmanager
async def closing(client: Closable, nursery: trio.Nursery) -> AsyncIterator[None]:
    """Hold ``client`` open for the block, then close it (1000, or 1011 if the
    block raised) and stop the ``nursery`` its tasks run in."""
    try:
        yield
    except BaseException:
        with trio.CancelScope(shield=True):  # aclose() bounds itself
            await client.aclose(CloseCode.INTERNAL_ERROR)
        raise
    else:
        await client.aclose()
    finally:
        nursery.cancel_scope.cancel()


@contextlib.contextmanager
def unwrapped() -> Iterator[None]:
    """The nursery is an implementation detail: hand back the block's own
    exception, not the group (trio's "designing for multiple errors", second
    option)."""
    try:
        yield
    except BaseExceptionGroup as group:
        single = _single_exception(group)
        if single is None:
            raise
        context = single.__context__
        try:
            raise single
        finally:
            single.__context__ = context
            del single, context


def _single_exception(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    errors = [exc for exc in group.exceptions if not isinstance(exc, trio.Cancelled)]
    if len(errors) > 1:
        return None
    return errors[0] if errors else group.exceptions[0]
