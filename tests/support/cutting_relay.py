"""A loopback TCP relay a test can cut, stall and turn away: a proxy's idle cut,
a network that swallows bytes, a server that is gone, made certain.

:class:`CuttingRelay` runs in the test's trio nursery and forwards every
connection to ``127.0.0.1:<target>``, byte for byte both ways (the WebSocket
frames of the trio client are neither compressed nor changed). A test can:

- :meth:`~CuttingRelay.cut` every connection: both sides' sockets are closed
  at once, with no close frame (the client sees 1006, the server a
  disconnect);
- stall one direction (``stall_up``: the client's bytes, ``stall_down``: the
  server's): what arrives is kept in ``swallowed_up`` / ``swallowed_down``
  instead of being forwarded, and :meth:`~CuttingRelay.swallowed` waits until
  a marker is among it (the server's frames are plain text: a marker such as
  ``b'"response.done"'`` shows that event went into the void; the client's
  are masked, so upward it waits for any byte);
- ``refuse`` new connections (each is closed as soon as it is accepted: the
  client's handshake fails), or send them to another ``target``.

Each new connection starts unstalled; ``accepted`` counts them.
"""

from __future__ import annotations

import trio

__all__ = ["CuttingRelay"]

#: Bytes read from either side at a time.
CHUNK = 65536


class CuttingRelay:
    """Relay ``127.0.0.1:<port>`` to ``127.0.0.1:<target>``; start it with
    ``await nursery.start(relay.run)``."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self.accepted = 0
        self.refuse = False
        self.stall_up = False
        self.stall_down = False
        self.swallowed_up = bytearray()
        self.swallowed_down = bytearray()
        self._links: set[trio.CancelScope] = set()
        self._more = trio.Event()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._relay, listeners)
            task_status.started()

    def cut(self) -> None:
        """Close every connection now, both sides, without a close frame; new
        connections start unstalled."""
        self.stall_up = self.stall_down = False
        for link in list(self._links):
            link.cancel()

    async def swallowed(self, marker: bytes | None = None) -> None:
        """Wait until ``marker`` is among the server's bytes a stall swallowed or,
        without one, until the client's stall swallowed any (its frames are
        masked: nothing in them can be read as it is)."""
        while not (marker in self.swallowed_down if marker else self.swallowed_up):
            await self._more.wait()

    async def _relay(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        if self.refuse:
            await trio.aclose_forcefully(client)
            return
        try:
            server = await trio.open_tcp_stream("127.0.0.1", self.target)
        except OSError:
            await trio.aclose_forcefully(client)
            return
        link = trio.CancelScope()
        self._links.add(link)
        try:
            with link:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._copy, client, server, True, link)
                    nursery.start_soon(self._copy, server, client, False, link)
        finally:
            self._links.discard(link)
            await trio.aclose_forcefully(client)
            await trio.aclose_forcefully(server)

    async def _copy(
        self, source: trio.SocketStream, sink: trio.SocketStream, up: bool, link: trio.CancelScope
    ) -> None:
        try:
            while data := await source.receive_some(CHUNK):
                if self.stall_up if up else self.stall_down:
                    (self.swallowed_up if up else self.swallowed_down).extend(data)
                    self._more.set()
                    self._more = trio.Event()
                    continue
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        link.cancel()  # one side ended: the other goes too
