"""A real MCP server on loopback: the official SDK's own (``MCPServer``), served by
uvicorn in a thread over streamable HTTP (``/mcp``) and the older SSE transport
(``/sse``), with tools for the tests and a record of the headers it received."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import uvicorn

from tests.support.uvicorn_thread import start_in_thread

#: The headers of every request the server received (the secrets' only destination).
SEEN_HEADERS: list[dict[str, str]] = []
#: What became of each call of the ``slow`` tool: "started", then "cancelled".
SLOW_CALLS: list[str] = []


def build_server() -> Any:
    from mcp.server import MCPServer
    from mcp_types import ToolAnnotations

    server = MCPServer("loopback")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def shout(text: str) -> str:
        """The text in capitals."""
        return text.upper()

    @server.tool()
    def broken(reason: str) -> str:
        """Always fails."""
        raise ValueError(f"broken on purpose: {reason}")

    @server.tool()
    async def slow(seconds: float) -> str:
        """Hangs (for the timeouts and cancellation)."""
        SLOW_CALLS.append("started")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            SLOW_CALLS.append("cancelled")
            raise
        return "late"

    @server.tool()
    def huge(count: int) -> str:
        """A large output."""
        return "x" * 200_000

    return server


class _Recorder:
    """ASGI middleware keeping each HTTP request's headers."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            SEEN_HEADERS.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


async def garbage_app(scope: Any, receive: Any, send: Any) -> None:
    """An HTTP server that answers every request with bytes that are not MCP."""
    if scope["type"] != "http":
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": b"<html>not json-rpc"})


async def hanging_app(scope: Any, receive: Any, send: Any) -> None:
    """An HTTP server that starts an event stream and never sends an event."""
    if scope["type"] != "http":
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    await send({"type": "http.response.body", "body": b": hello\n\n", "more_body": True})
    await asyncio.sleep(3600)


class LoopbackMcp:
    """Both transports of one MCP server, each on its own loopback port."""

    def __init__(self) -> None:
        server = build_server()
        self._servers = [
            self._start(_Recorder(server.streamable_http_app())),
            self._start(_Recorder(server.sse_app())),
            self._start(garbage_app),
            self._start(hanging_app),
        ]
        self.http_url = f"http://127.0.0.1:{self._port(0)}/mcp"
        self.sse_url = f"http://127.0.0.1:{self._port(1)}/sse"
        #: Not MCP: garbage, and a stream that hangs.
        self.garbage_url = f"http://127.0.0.1:{self._port(2)}/mcp"
        self.hanging_url = f"http://127.0.0.1:{self._port(3)}/mcp"

    @staticmethod
    def _start(app: Any) -> uvicorn.Server:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        running = uvicorn.Server(config)
        start_in_thread(running, "the loopback MCP server")
        return running

    def _port(self, index: int) -> int:
        server = self._servers[index]
        return int(server.servers[0].sockets[0].getsockname()[1])

    def stop(self) -> None:
        for server in self._servers:
            server.should_exit = True
            server.force_exit = True


@contextlib.contextmanager
def loopback_mcp() -> Iterator[LoopbackMcp]:
    running = LoopbackMcp()
    try:
        yield running
    finally:
        running.stop()
