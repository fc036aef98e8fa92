"""A loopback TCP relay that delivers a server's close late: the worst case of
a race, made certain.

An HTTP server that closes a kept-alive connection right after an answer
races the client's next request: when the request leaves before the close
arrives, it goes out on a connection nobody reads any more. On loopback the
close nearly always wins, so a test that waits for the race may never see
it. :class:`LateCloseRelay` sits between the two and forwards every byte both
ways, but holds back a close that comes between requests until the client
sends again; it then closes the client's side without forwarding what was
sent, as the server's kernel would have. A close that crosses a request (sent,
not yet answered) reaches the client at once, as it would without the relay.
Every connection to the relay is a new one to the server.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

__all__ = ["LateCloseRelay"]

#: Bytes read from either side at a time.
CHUNK = 65536
#: Seconds a relayed connection may take to end after the relay is left.
SETTLE = 5.0


class LateCloseRelay:
    """Relay ``127.0.0.1:<port>`` to ``host:port`` (``async with``). Counts:
    ``accepted`` connections, closes of the server ``held`` back, and requests
    ``cut`` (sent after a held close, never forwarded)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.accepted = 0
        self.held = 0
        self.cut = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None, "the relay is not listening"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def __aenter__(self) -> LateCloseRelay:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        if self._tasks:  # each ends once both sides closed; a stuck one is cut
            _, stuck = await asyncio.wait(self._tasks, timeout=SETTLE)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)
        await self._server.wait_closed()

    async def _relay(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.accepted += 1
        server_in, server_out = await asyncio.open_connection(*self.target)
        link = _Link()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._to_client(server_in, client_out, link))
                group.create_task(self._to_server(client_in, server_out, link))
        finally:
            self._tasks.discard(task)
            for writer in (client_out, server_out):
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    async def _to_client(
        self, server_in: asyncio.StreamReader, client_out: asyncio.StreamWriter, link: _Link
    ) -> None:
        while chunk := await server_in.read(CHUNK):
            link.unanswered = False
            client_out.write(chunk)
            await client_out.drain()
        link.closed.set()
        if link.unanswered:  # the close crossed a request: the client is told at once
            self.cut += 1
            client_out.close()
        else:  # the server closed between requests: the client is not told yet
            self.held += 1

    async def _to_server(
        self, client_in: asyncio.StreamReader, server_out: asyncio.StreamWriter, link: _Link
    ) -> None:
        while chunk := await client_in.read(CHUNK):
            if link.closed.is_set():
                self.cut += 1  # sent on a connection the server had closed
                return
            link.unanswered = True
            server_out.write(chunk)
            await server_out.drain()
        # The client closed: the server is told, and its side ends by itself.
        with contextlib.suppress(OSError):
            server_out.write_eof()
        await link.closed.wait()


class _Link:
    """One relayed connection: whether the server closed its side, and whether
    the client sent bytes the server has not answered since."""

    __slots__ = ("closed", "unanswered")

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.unanswered = False
