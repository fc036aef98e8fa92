"""A real MCP server on loopback: the official SDK's own (``MCPServer``), served by
uvicorn in a thread over streamable HTTP (``/mcp``) and the older SSE transport
(``/sse``), with tools for the tests and a record of the headers it received; and
a hostile one that answers a listing or a call with a body too large to keep
(:func:`hostile_app`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import zlib
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


async def elsewhere_app(scope: Any, receive: Any, send: Any) -> None:
    """An SSE server whose ``endpoint`` event names another origin (a URL of
    the tenant's making, which the MCP SDK refuses and logs), then waits."""
    if scope["type"] != "http":
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    endpoint = b"event: endpoint\ndata: http://tenant-text.invalid/ELSEWHERE\n\n"
    await send({"type": "http.response.body", "body": endpoint, "more_body": True})
    await asyncio.sleep(3600)


#: Bytes of text in each hostile answer (64 MiB; the gzip bomb sends 64 KiB of it).
HOSTILE_BYTES = 64 << 20
_MIB = 1 << 20


#: Schemas of a listed tool (``odd``) that no client could give as ``parameters``.
ODD_SCHEMAS: dict[str, dict[str, Any]] = {
    "minimum": {"type": "object", "properties": {"n": {"type": "number", "minimum": "zero"}}},
    "properties": {"type": "object", "properties": [{"n": {"type": "string"}}]},
    "minitems": {
        "type": "object",
        "properties": {"xs": {"type": "array", "minItems": 20_000, "items": {"type": "integer"}}},
        "required": ["xs"],
    },
}


def _hostile_parts(method: str, request_id: object) -> tuple[bytes, bytes]:
    """The JSON around a hostile answer's text: a call's output, or a listed
    tool's description."""
    if method == "tools/list":
        result = '{"tools":[{"name":"dump","inputSchema":{"type":"object"},"description":"'
        close = '"}]}'
    else:
        result = '{"content":[{"type":"text","text":"'
        close = '"}]}'
    head = f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"result":{result}'
    return head.encode(), (close + "}").encode()


def _gzip_bomb(head: bytes, tail: bytes) -> tuple[bytes, bytes, bytes]:
    """A gzip stream of ``head``, then a block that inflates to 1 MiB of ``0``
    (about 1 KiB: sent again and again, the same bytes each time, since a full
    flush starts each block afresh), then ``tail`` (its checksum does not match:
    no reader should get that far)."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    opening = squeeze.compress(head) + squeeze.flush(zlib.Z_FULL_FLUSH)
    block = squeeze.compress(b"0" * _MIB) + squeeze.flush(zlib.Z_FULL_FLUSH)
    return opening, block, squeeze.compress(tail) + squeeze.flush()


async def hostile_app(scope: Any, receive: Any, send: Any) -> None:
    """An MCP server (streamable HTTP, JSON answers) that connects properly and
    then answers its listing or a call (path ``/{kind}/{list|call}/mcp``) with
    ``HOSTILE_BYTES`` of text: ``huge`` with its Content-Length, ``endless``
    streamed without one and never ended, ``bomb`` as gzip (about 64 KiB that
    inflate to 64 MiB), ``brotli`` labelled ``br`` (never asked for), ``corrupt`` labelled
    ``gzip`` and sent plain. It stops
    sending when the client hangs up. A ``kind`` of :data:`ODD_SCHEMAS` lists
    the tool ``odd`` with that schema instead."""
    if scope["type"] != "http":
        return
    kind, target = scope["path"].strip("/").split("/")[:2]
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["method"] != "POST":
        status = 200 if scope["method"] == "DELETE" else 405
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    request = json.loads(body)
    method = request.get("method", "")
    if "id" not in request:  # a notification
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    headers = [(b"content-type", b"application/json"), (b"mcp-session-id", b"hostile")]
    hostile = (
        kind not in ODD_SCHEMAS and method == {"list": "tools/list", "call": "tools/call"}[target]
    )
    if not hostile:
        if method == "initialize":
            result: Any = {
                "protocolVersion": request["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }
        elif kind in ODD_SCHEMAS:
            result = {"tools": [{"name": "odd", "inputSchema": ODD_SCHEMAS[kind]}]}
        else:  # the listing of a server whose calls are hostile
            result = {"tools": [{"name": "dump", "inputSchema": {"type": "object"}}]}
        answer = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})
        return
    head, tail = _hostile_parts(method, request["id"])
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.ensure_future(watch())
    try:
        if kind == "huge":
            length = len(head) + HOSTILE_BYTES + len(tail)
            headers.append((b"content-length", str(length).encode()))
        elif kind == "bomb":
            headers.append((b"content-encoding", b"gzip"))
        elif kind == "brotli":  # not asked for
            headers.append((b"content-encoding", b"br"))
        elif kind == "corrupt":  # said to be gzip, and not
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if kind == "bomb":
            first, middle, last = _gzip_bomb(head, tail)
        else:
            first, middle, last = head, b"0" * _MIB, tail
        await send({"type": "http.response.body", "body": first, "more_body": True})
        sent = 0
        while not gone.is_set() and (kind == "endless" or sent < HOSTILE_BYTES // _MIB):
            await send({"type": "http.response.body", "body": middle, "more_body": True})
            sent += 1
            await asyncio.sleep(0)
        if not gone.is_set():
            await send({"type": "http.response.body", "body": last})
    finally:
        watcher.cancel()


class LoopbackMcp:
    """Both transports of one MCP server, each on its own loopback port."""

    def __init__(self) -> None:
        server = build_server()
        self._servers = [
            self._start(_Recorder(server.streamable_http_app())),
            self._start(_Recorder(server.sse_app())),
            self._start(garbage_app),
            self._start(hanging_app),
            self._start(hostile_app),
            self._start(elsewhere_app),
        ]
        self.http_url = f"http://127.0.0.1:{self._port(0)}/mcp"
        self.sse_url = f"http://127.0.0.1:{self._port(1)}/sse"
        #: Not MCP: garbage, and a stream that hangs.
        self.garbage_url = f"http://127.0.0.1:{self._port(2)}/mcp"
        self.hanging_url = f"http://127.0.0.1:{self._port(3)}/mcp"
        #: SSE whose ``endpoint`` names another origin.
        self.elsewhere_url = f"http://127.0.0.1:{self._port(5)}/sse"

    def hostile_url(self, kind: str, target: str) -> str:
        """The hostile server's URL answering ``target`` (``list`` or ``call``)
        with a ``kind`` body (``huge``, ``endless``, ``bomb``; :func:`hostile_app`)."""
        return f"http://127.0.0.1:{self._port(4)}/{kind}/{target}/mcp"

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
