"""AppendClient: one WebSocket connection, a thin pump around the sans-IO core.

See the package docstring (``longresponse.client``) for the theory of
operation; :mod:`longresponse.client.opening` opens the connection.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final, cast

import msgspec
import trio
from wsproto import WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    TextMessage,
)

from protocol import (
    CLOSED,
    MAX_MESSAGE_BYTES,
    NEED_DATA,
    CloseCode,
    Connection,
    LocalProtocolError,
    Mode,
    RemoteProtocolError,
    Role,
    decode_client_event,
    wire_type,
)
from protocol.events import (
    ClientEvent,
    ErrorEvent,
    ResponseAppend,
    ResponseCancel,
    ResponseCompleted,
    ResponseCreate,
    ResponseDone,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInject,
    ResponseResume,
    ServerEvent,
)
from protocol.items import Item

__all__ = [
    "ABNORMAL_CLOSURE",
    "CLOSE_TIMEOUT",
    "MAX_QUEUED_EVENTS",
    "MAX_REJECT_BODY_BYTES",
    "RECEIVE_BYTES",
    "AppendClient",
    "ClientError",
    "ConnectionClosedError",
    "HandshakeError",
]

#: Events received but not yet consumed; past this the receive loop waits.
MAX_QUEUED_EVENTS: Final = 1024
#: Seconds to wait for the closing handshake before closing TCP forcefully.
CLOSE_TIMEOUT: Final = 10.0
#: Most of a refused upgrade's HTTP body kept for :class:`HandshakeError`.
MAX_REJECT_BODY_BYTES: Final = 64 * 1024
#: Bytes asked of the socket per read.
RECEIVE_BYTES: Final = 64 * 1024

#: RFC 6455 §7.1.5: the close code when the connection ended without a close frame.
ABNORMAL_CLOSURE: Final = 1006


class ClientError(Exception):
    """Base class of the client's own errors."""


class HandshakeError(ClientError):
    """The WebSocket upgrade failed.

    ``status`` is the HTTP status the server answered with (``None`` when it
    sent no valid response), ``body`` the start of the response body
    (at most :data:`MAX_REJECT_BODY_BYTES`), ``headers`` its headers.
    """

    def __init__(
        self,
        status: int | None,
        body: bytes = b"",
        *,
        headers: Sequence[tuple[bytes, bytes]] = (),
        reason: str | None = None,
    ) -> None:
        if reason is None:
            reason = f"the server refused the WebSocket upgrade with HTTP {status}"
        super().__init__(f"{reason}: {body[:200]!r}" if body else reason)
        self.status = status
        self.body = body
        self.headers = list(headers)


class ConnectionClosedError(ClientError):
    """The WebSocket connection is closed; ``code`` and ``reason`` say how.

    ``code`` is the code of the server's close frame, the one this client sent
    when it failed the connection, or 1006 when TCP ended without one.
    """

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(f"connection closed with code {code}" + (f": {reason}" if reason else ""))
        self.code = code
        self.reason = reason


class AppendClient:
    """One append-mode WebSocket connection; made by :func:`connect`.

    ``connection`` is the sans-IO :class:`protocol.Connection` (its responses'
    states, pending calls and sequence numbers as this client has seen them),
    ``subprotocol`` the subprotocol the server accepted, and ``close_code`` /
    ``close_reason`` are ``None`` until the connection is closed.
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        stream: trio.abc.Stream,
        ws: WSConnection,
        *,
        subprotocol: str | None,
        mode: Mode = Mode.APPEND,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_queued_events: int = MAX_QUEUED_EVENTS,
        close_timeout: float = CLOSE_TIMEOUT,
    ) -> None:
        self.connection = Connection(Role.CLIENT, mode, max_message_bytes=max_message_bytes)
        self.subprotocol = subprotocol
        self.max_message_bytes = max_message_bytes
        self.close_timeout = close_timeout
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self._stream = stream
        self._ws = ws
        self._send_lock = trio.Lock()
        self._queue_send, self._queue_receive = trio.open_memory_channel[
            ServerEvent | RemoteProtocolError
        ](max_queued_events)
        self._fragments: list[bytes] = []
        self._fragment_bytes = 0
        self._sent_close: CloseConnection | None = None
        self._eof = False  # TCP ended
        self._failed = False  # we failed the connection (RFC 6455 §7.1.7)
        self._input_ended = trio.Event()  # close_code is known; no more events
        self._done = trio.Event()  # the receive loop has finished; TCP is closed
        nursery.start_soon(self._receive_loop)

    def __repr__(self) -> str:
        state = "open" if self.close_code is None else f"closed {self.close_code}"
        return f"<AppendClient {state} subprotocol={self.subprotocol!r}>"

    # --- sending -----------------------------------------------------------

    async def create(self, **fields: Any) -> None:
        """Send ``response.create`` with ``fields`` (the body of ``POST /v1/responses``).

        Fields are checked by the same decoder the server uses, so items may be
        Structs or plain dicts. Raises :class:`protocol.LocalProtocolError`
        (nothing sent, nothing recorded) for a body the server would reject,
        :class:`ConnectionClosedError` once the connection is closing.
        """
        await self._send_event(_build_event(ResponseCreate, fields))

    async def resume(self, response_id: str) -> None:
        """Send ``response.resume``: take up on this connection an append-mode
        response created with ``store: true`` whose connection (or server) was
        lost. The server answers ``response.resumed``: the Response as its last
        checkpoint holds it (its ``output``; ``requires_action`` with the calls
        still waiting, or ``in_progress`` when its turn runs again), numbered
        after the checkpoint; events seen after that number on the old
        connection are void. Or an ``error`` naming it (``response_not_found``
        when it kept no checkpoint). Raises :class:`protocol.LocalProtocolError`
        (nothing sent) when the response is live on this connection already.
        """
        await self._send_event(ResponseResume(response_id=response_id))

    async def append(
        self, input: str | Sequence[Item | Mapping[str, Any]], response_id: str | None = None
    ) -> None:
        """Send ``response.append``: tool outputs for pending calls, or steering input.

        Without ``response_id`` it targets the latest response. Raises
        :class:`protocol.LocalProtocolError` (nothing sent, nothing recorded)
        for an unknown or already answered ``call_id``, a finished response or
        no response at all; :class:`ConnectionClosedError` once closing.
        """
        fields = {"input": input if isinstance(input, str) else list(input)}
        await self._send_event(_build_event(ResponseAppend, fields | {"response_id": response_id}))

    async def inject(self, input: Sequence[Item | Mapping[str, Any]], response_id: str) -> None:
        """Send ``response.inject`` (the multi-agent beta's append) to ``response_id``.

        The server answers ``response.inject.created`` (or
        ``response.inject.failed``, the input handed back). Raises
        :class:`protocol.LocalProtocolError` (nothing sent, nothing recorded)
        where :meth:`append` would; :class:`ConnectionClosedError` once closing.
        """
        fields = {"input": list(input), "response_id": response_id}
        await self._send_event(_build_event(ResponseInject, fields))

    async def cancel(self, response_id: str | None = None) -> None:
        """Send ``response.cancel`` for ``response_id`` (default: the latest response).

        Raises :class:`protocol.LocalProtocolError` (nothing sent) if the
        response is unknown or already finished.
        """
        await self._send_event(ResponseCancel(response_id=response_id))

    async def send_raw(self, data: str | bytes) -> None:
        """Send ``data`` as one frame without any protocol check (for tests of bad input).

        ``str`` goes in a text frame, ``bytes`` in a binary frame (as in
        ``websockets``; a text frame cannot carry invalid UTF-8). The sans-IO
        state is not updated.
        """
        message: Message[Any]
        if isinstance(data, str):
            message = TextMessage(data=data)
        else:
            message = BytesMessage(data=data)
        async with self._send_lock:
            self._check_open()
            await self._write(self._ws.send(message))

    async def _send_event(self, event: ClientEvent) -> None:
        async with self._send_lock:
            self._check_open()
            data = self.connection.send(event)  # raises before anything leaves
            await self._write(self._ws.send(TextMessage(data=data.decode())))

    async def _send_frame(self, event: Event) -> None:
        async with self._send_lock:
            self._check_open(closing=isinstance(event, CloseConnection))
            if isinstance(event, CloseConnection):
                self._sent_close = event
            await self._write(self._ws.send(event))

    def _check_open(self, *, closing: bool = False) -> None:
        """Raise :class:`ConnectionClosedError` unless wsproto may send now.

        A close frame may still go out to answer the server's (REMOTE_CLOSING).
        """
        state = self._ws.state
        if self._failed or not (
            state is ConnectionState.OPEN or (closing and state is ConnectionState.REMOTE_CLOSING)
        ):
            raise self._closed_error()

    async def _write(self, data: bytes) -> None:
        try:
            await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise self._closed_error() from exc
        except trio.Cancelled:
            # Part of a frame may be out; the stream cannot carry another one.
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self._stream)
            raise

    def _closed_error(self) -> ConnectionClosedError:
        if self.close_code is not None:
            return ConnectionClosedError(self.close_code, self.close_reason or "")
        if self._sent_close is not None:  # our closing handshake is under way
            return ConnectionClosedError(self._sent_close.code, self._sent_close.reason or "")
        return ConnectionClosedError(ABNORMAL_CLOSURE)

    # --- receiving ---------------------------------------------------------

    # A per-call ``timeout`` (ASYNC109) is this API's contract: tests and
    # examples read events with a deadline on every call.
    async def next_event(self, timeout: float | None = 30.0) -> ServerEvent:  # noqa: ASYNC109
        """Return the next server event, waiting at most ``timeout`` seconds.

        Raises :class:`protocol.RemoteProtocolError` in place of a message that
        broke the protocol (the message is dropped, the connection state is
        unchanged and the next call goes on with the next message);
        :class:`ConnectionClosedError` once the connection is closed and every
        event received before has been returned; :class:`trio.TooSlowError`
        on timeout (no event is lost).
        """
        # An event already queued is taken without a deadline (a cancel scope
        # costs ~12 us, three times the read itself), at a full checkpoint.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            item = self._queue_receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return await self._wait_event(timeout)
        await trio.lowlevel.cancel_shielded_checkpoint()
        if isinstance(item, RemoteProtocolError):
            raise item
        return item

    async def _wait_event(self, timeout: float | None) -> ServerEvent:  # noqa: ASYNC109
        """:meth:`next_event` when nothing is queued: wait at most ``timeout`` seconds."""
        with trio.fail_after(math.inf if timeout is None else timeout):
            try:
                item = await self._queue_receive.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                await self._input_ended.wait()
                raise self._closed_error() from None
        if isinstance(item, RemoteProtocolError):
            raise item
        return item

    async def events(self) -> AsyncIterator[ServerEvent]:
        """Iterate over server events until the connection closes.

        Ends quietly after a normal closure (1000, 1001); raises
        :class:`ConnectionClosedError` after any other, and
        :class:`protocol.RemoteProtocolError` like :meth:`next_event`.
        """
        while True:
            try:
                event = await self.next_event(timeout=None)
            except ConnectionClosedError as exc:
                if exc.code in (CloseCode.NORMAL_CLOSURE, CloseCode.GOING_AWAY):
                    return
                raise
            yield event

    async def until_done(
        self,
        response_id: str | None = None,
        timeout: float | None = 30.0,  # noqa: ASYNC109
    ) -> list[ServerEvent]:
        """Collect events up to and including the next terminal event (``response.done``,
        ``response.completed|incomplete|failed``) or ``error``.

        With ``response_id`` only that response's ``response.done`` (or an
        ``error`` naming it or naming no response) ends the collection; events
        of other responses are collected too, so none is lost. ``timeout``
        bounds the whole wait (:class:`trio.TooSlowError`). On any exception
        the events collected so far are lost with it.
        """
        collected: list[ServerEvent] = []
        with trio.fail_after(math.inf if timeout is None else timeout):
            while True:
                event = await self.next_event(timeout=None)
                collected.append(event)
                if _ends_wait(event, response_id):
                    return collected

    # --- closing -----------------------------------------------------------

    async def aclose(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """Close the connection: closing handshake, then TCP. Safe to call twice.

        Events not yet consumed are discarded; later :meth:`next_event` calls
        raise :class:`ConnectionClosedError`. Waits at most ``close_timeout``
        for the server's answer; after that, or if cancelled, TCP is closed
        forcefully.
        """
        self._queue_receive.close()  # the receive loop now discards what arrives
        try:
            with trio.move_on_after(self.close_timeout):
                if self._ws.state is ConnectionState.OPEN and not self._failed:
                    with contextlib.suppress(ConnectionClosedError):
                        await self._send_frame(CloseConnection(code=code, reason=reason))
                await self._done.wait()
        finally:
            if not self._done.is_set():
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(self._stream)

    # --- the receive loop --------------------------------------------------

    async def _receive_loop(self) -> None:
        try:
            await self._handle_ws_events()  # frames that came with the 101 response
            while not (self._eof or self._failed) and self._ws.state is not ConnectionState.CLOSED:
                data = await self._receive_some()
                self._eof = data is None
                self._ws.receive_data(data)
                await self._handle_ws_events()
            self._end_input()
            if not (self._eof or self._failed):
                # RFC 6455 §7.1.1: the server closes TCP first; give it time to.
                with trio.move_on_after(self.close_timeout):
                    while await self._receive_some() is not None:
                        pass
        finally:
            self._end_input()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self._stream)
            self._done.set()

    async def _receive_some(self) -> bytes | None:
        try:
            data = await self._stream.receive_some(RECEIVE_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None
        return bytes(data) or None

    async def _handle_ws_events(self) -> None:
        for event in self._ws.events():
            if self._failed:
                return
            if isinstance(event, Message):
                await self._take_fragment(event)
            elif isinstance(event, Ping):
                with contextlib.suppress(ConnectionClosedError):
                    await self._send_frame(event.response())
            elif isinstance(event, CloseConnection):
                await self._take_close(event)

    async def _take_fragment(self, event: Message[Any]) -> None:
        # Text and binary messages alike: both hold JSON for the codec.
        message: str | bytes
        if event.message_finished and not self._fragments and isinstance(event.data, str):
            # Whole in one frame: ASCII goes to the codec as the str it is (one
            # byte a character); other text is encoded once, to count and decode.
            message = event.data if event.data.isascii() else event.data.encode()
            if len(message) > self.max_message_bytes:
                await self._fail(CloseCode.MESSAGE_TOO_BIG, "message too big")
                return
        else:
            chunk = event.data.encode() if isinstance(event.data, str) else bytes(event.data)
            self._fragment_bytes += len(chunk)
            if self._fragment_bytes > self.max_message_bytes:
                await self._fail(CloseCode.MESSAGE_TOO_BIG, "message too big")
                return
            self._fragments.append(chunk)
            if not event.message_finished:
                return
            message = b"".join(self._fragments)
            self._fragments, self._fragment_bytes = [], 0
        try:
            self.connection.receive_message(message)
        except RemoteProtocolError as exc:
            await self._deliver(exc)
            return
        while (received := self.connection.next_event()) not in (NEED_DATA, CLOSED):
            await self._deliver(cast("ServerEvent", received))

    async def _take_close(self, event: CloseConnection) -> None:
        if self._eof:  # wsproto's stand-in for a close frame that never came
            return
        state = self._ws.state
        if state in (ConnectionState.REMOTE_CLOSING, ConnectionState.CLOSED):
            if self.close_code is None:
                self.close_code, self.close_reason = int(event.code), event.reason or ""
            if state is ConnectionState.REMOTE_CLOSING:
                with contextlib.suppress(ConnectionClosedError):
                    await self._send_frame(event.response())
        else:  # wsproto could not parse a frame and proposes a close
            await self._fail(int(event.code), event.reason or "")

    async def _fail(self, code: int, reason: str) -> None:
        """Fail the connection (RFC 6455 §7.1.7): send a close frame, stop reading."""
        if self.close_code is None:
            self.close_code, self.close_reason = code, reason
        with trio.move_on_after(self.close_timeout), contextlib.suppress(ConnectionClosedError):
            await self._send_frame(CloseConnection(code=code, reason=reason))
        self._failed = True

    async def _deliver(self, item: ServerEvent | RemoteProtocolError) -> None:
        with contextlib.suppress(trio.BrokenResourceError):  # aclose() discards events
            try:  # no checkpoint per event: the loop's next read is one
                self._queue_send.send_nowait(item)
            except trio.WouldBlock:  # the reader is behind: wait for room
                await self._queue_send.send(item)

    def _end_input(self) -> None:
        if self._input_ended.is_set():
            return
        if self.close_code is None:
            self.close_code, self.close_reason = ABNORMAL_CLOSURE, ""
        self.connection.receive_closed()
        self._queue_send.close()
        self._input_ended.set()


def _ends_wait(event: ServerEvent, response_id: str | None) -> bool:
    if isinstance(event, ResponseDone | ResponseCompleted | ResponseIncomplete | ResponseFailed):
        return response_id is None or event.response.id == response_id
    if isinstance(event, ErrorEvent):
        return response_id is None or event.response_id in (response_id, msgspec.UNSET)
    return False


def _build_event(cls: type[ClientEvent], fields: Mapping[str, Any]) -> ClientEvent:
    """Build a client event from ``fields`` through the server's own decoder."""
    tag = wire_type(cls)
    try:
        event = decode_client_event(msgspec.json.encode({**fields, "type": tag}))
    except RemoteProtocolError as exc:
        raise LocalProtocolError(
            exc.message, code=exc.code, param=exc.param, status=exc.status
        ) from exc
    assert isinstance(event, cls)
    return event
