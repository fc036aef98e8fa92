"""The floor: a bare WebSocket echo endpoint, and a raw client that reads fast.

The endpoint is what a WebSocket costs with nothing behind it, served by the
same stack as longresponse (Starlette + uvicorn with wsproto) at the same path
``/v1/responses``. It accepts every upgrade and echoes every text frame back,
except one command frame, which it answers by streaming::

    {"type":"stream","count":N,"frame":"<text>"}   ->   <text> sent N times

so that the throughput bench can compare a server's delta events with the
same frames sent by a loop that does nothing else.

:class:`RawConnection` is the client side of both: trio + wsproto, no protocol
checks, whole text messages handed back in batches (one batch per socket
read), so reading costs as little as Python allows and the client is not what
is measured.

    python -m longresponse.bench.echo --port 8001
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import urllib.parse
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import msgspec
import trio
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)

from ..server_process import ServerProcess, free_port

__all__ = [
    "ECHO_PATH",
    "STREAM_PREFIX",
    "EchoProcess",
    "RawConnection",
    "create_echo_app",
    "echo_round_trip",
    "main",
    "stream_command",
]

ECHO_PATH: Final = "/v1/responses"
#: A text frame that starts with this is a stream command, not echoed.
STREAM_PREFIX: Final = '{"type":"stream"'
#: Bytes asked of the socket per read.
RECEIVE_BYTES: Final = 256 * 1024
#: Seconds the client waits for the server's side of the closing handshake.
CLOSE_TIMEOUT: Final = 5.0


class _StreamCommand(msgspec.Struct, frozen=True):
    type: str
    count: int
    frame: str


_decode_command = msgspec.json.Decoder(_StreamCommand)


def stream_command(frame: str, count: int) -> str:
    """The text frame that asks the echo endpoint to send ``frame`` ``count`` times."""
    return msgspec.json.encode(_StreamCommand(type="stream", count=count, frame=frame)).decode()


async def _echo(websocket: WebSocket) -> None:
    await websocket.accept()
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        if text is None:
            continue  # binary frames are not part of the floor
        if text.startswith(STREAM_PREFIX):
            command = _decode_command.decode(text)
            for _ in range(command.count):
                await websocket.send_text(command.frame)
        else:
            await websocket.send_text(text)


def create_echo_app() -> Starlette:
    """The echo endpoint as a Starlette app (``ECHO_PATH``)."""
    return Starlette(routes=[WebSocketRoute(ECHO_PATH, _echo)])


# --- the client -------------------------------------------------------------


class RawConnection:
    """One WebSocket connection read and written as raw text frames (trio + wsproto).

    Made by :meth:`open`; no protocol checks, no events parsed. Pings are
    answered; a close frame from the server ends the connection
    (:meth:`receive_batch` returns an empty list from then on).
    """

    def __init__(self, stream: trio.SocketStream, ws: WSConnection, subprotocol: str | None):
        self.stream = stream
        self.ws = ws
        self.subprotocol = subprotocol
        self.closed = False
        self._fragments: list[str] = []
        self._pending: deque[str] = deque()  # received, not yet taken by receive_text

    @classmethod
    async def open(
        cls,
        url: str,
        subprotocols: Sequence[str] = (),
        headers: Sequence[tuple[str, str]] = (),
    ) -> RawConnection:
        """Connect and upgrade; raises ``ConnectionError`` if the server refuses."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "ws" or not parts.hostname:
            raise ValueError(f"expected a ws://host[:port]/path URL, not {url!r}")
        stream = await trio.open_tcp_stream(parts.hostname, parts.port or 80)
        try:
            ws = WSConnection(ConnectionType.CLIENT)
            request = Request(
                host=parts.netloc,
                target=parts.path or "/",
                subprotocols=list(subprotocols),
                extra_headers=[(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers],
            )
            await stream.send_all(ws.send(request))
            while True:
                data = bytes(await stream.receive_some(RECEIVE_BYTES))
                ws.receive_data(data or None)
                for event in ws.events():
                    if isinstance(event, AcceptConnection):
                        return cls(stream, ws, event.subprotocol)
                    if isinstance(event, RejectConnection):
                        raise ConnectionError(f"upgrade refused with HTTP {event.status_code}")
                if not data:
                    raise ConnectionError("the server closed the connection during the upgrade")
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise

    async def send_text(self, text: str) -> None:
        await self.stream.send_all(self.ws.send(TextMessage(data=text)))

    async def receive_batch(self) -> list[str]:
        """The whole text messages that one socket read completes (at least one).

        Returns ``[]`` once the connection is closed. Not to be mixed with
        :meth:`receive_text` on one connection.
        """
        messages: list[str] = []
        while not messages and not self.closed:
            try:
                data = bytes(await self.stream.receive_some(RECEIVE_BYTES))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            self.ws.receive_data(data or None)
            self.closed = not data
            for event in self.ws.events():
                if isinstance(event, TextMessage):
                    if event.message_finished and not self._fragments:
                        messages.append(event.data)
                        continue
                    self._fragments.append(event.data)
                    if event.message_finished:
                        messages.append("".join(self._fragments))
                        self._fragments.clear()
                elif isinstance(event, Ping) and self.ws.state is ConnectionState.OPEN:
                    await self.stream.send_all(self.ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    if self.ws.state is ConnectionState.REMOTE_CLOSING:
                        await self.stream.send_all(self.ws.send(event.response()))
                    self.closed = True
        return messages

    async def receive_text(self, timeout: float = 30.0) -> str:  # noqa: ASYNC109
        """One whole text message (batches are split up; nothing is lost).

        Raises ``trio.TooSlowError`` after ``timeout`` seconds without a
        message, ``ConnectionError`` once the connection is closed.
        """
        while not self._pending:
            with trio.fail_after(timeout):
                batch = await self.receive_batch()
            if not batch:
                raise ConnectionError("the connection closed")
            self._pending.extend(batch)
        return self._pending.popleft()

    async def aclose(self) -> None:
        """Closing handshake (bounded by :data:`CLOSE_TIMEOUT`), then TCP. Never raises
        for a connection that is already broken."""
        with (
            trio.move_on_after(CLOSE_TIMEOUT),
            contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
        ):
            if self.ws.state is ConnectionState.OPEN:
                await self.stream.send_all(self.ws.send(CloseConnection(code=1000)))
            while not self.closed:
                await self.receive_batch()
        await trio.aclose_forcefully(self.stream)


async def echo_round_trip(url: str, frame: str, repeats: int) -> list[float]:
    """Seconds from sending ``frame`` to its echo arriving, once per repeat, on one connection."""
    conn = await RawConnection.open(url)
    try:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            await conn.send_text(frame)
            await conn.receive_text()
            times.append(time.perf_counter() - start)
        return times
    finally:
        await conn.aclose()


# --- the process --------------------------------------------------------------


class EchoProcess(ServerProcess):
    """``python -m longresponse.bench.echo`` on a free loopback port, as a context manager.

    ``.url`` is ``ws://127.0.0.1:PORT/v1/responses``; it is ready when the port
    accepts connections and is stopped with SIGINT, like :class:`ServerProcess`.
    """

    def __init__(self, *, port: int | None = None, log_level: str = "warning") -> None:
        super().__init__(port=port or free_port(), log_level=log_level)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "longresponse.bench.echo", "--port", str(self.port),
                "--log-level", self.log_level]  # fmt: skip

    def cpu_seconds(self) -> float | None:
        """The process's CPU time (user + system), or ``None`` where ``/proc`` cannot tell."""
        if self.process is None:
            return None
        try:
            stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        except OSError:
            return None
        # Fields after the command name (which may hold spaces): utime, stime are 14, 15.
        fields = stat.rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(
        prog="python -m longresponse.bench.echo",
        description="A bare WebSocket echo endpoint at /v1/responses (the benchmark's floor).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8001, help="TCP port")
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["critical", "error", "warning", "info", "debug"],
        help="log verbosity",
    )
    args = parser.parse_args(argv)
    uvicorn.run(
        create_echo_app(),
        host=args.host,
        port=args.port,
        ws="wsproto",
        lifespan="off",
        log_level=args.log_level,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
