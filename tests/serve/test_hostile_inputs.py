"""The hostile-input harness: every endpoint against the same hostile inputs.

One table (:data:`SURFACES`) lists the surfaces a client can reach: the
Responses API over HTTP (JSON and SSE), ``/input_tokens``, ``/compact``, the
Chat Completions endpoint, a stored response's ``GET`` / ``DELETE`` /
``cancel``, the shipped WebSocket, append mode and the inspector's API. A
surface is one line: how a request is sent and answered, and which hostile
inputs (:class:`Case`) apply, with the precise answer each must get:

- the largest allowed value of each field whose cost grows with its size
  (tools, a schema's width, input items, the body's bytes), answered;
- the smallest refused one, refused with its exact ``code`` and ``param``;
- nesting far past any decoder's recursion, wrong types, an id of 100,000
  characters (refused, and quoted clipped);
- a client that hangs up mid-body, and one that never reads a long stream
  (cut off within ``--slow-reader-timeout``).

While each case runs (sent by a child process, so that its work is not in
the timed client's interpreter), a well-behaved client's ``GET /healthz``
is timed again and again; its worst wait must stay within
:data:`ALLOWED_DELAY` of its worst wait alone, measured again before each
surface (the machine's load changes during the run), and a case is tried
:data:`ATTEMPTS` times before that fails: a real hold repeats, a loaded
machine's hiccup does not. After
every surface, the server's RSS must be back within 10% of its warm idle
value. A new surface joins by adding its line to :data:`SURFACES`.

A second server, with the default 16 MiB body limit, gets issue 20's
multi-megabyte bodies far past a limit (40,000 tools, a schema of 120,000
properties, 100,000 items; :func:`multi_megabyte_cases`): each refused with
its precise error, and within the same delay.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import re
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

import httpx
import pytest
import wsproto.events as ws
from websockets.sync.client import connect as ws_connect

from longresponse.config import MAX_SCHEMA_WIDTH, MAX_TOOLS
from longresponse.server_process import ServerProcess
from protocol import APPEND_SUBPROTOCOL, MAX_ITEMS_PER_EVENT, ProtocolError
from tests.support import http_clients
from tests.support.raw_ws import handshake

#: another client's delay under abuse, measured: run alone, after the parallel part.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

#: How much later than alone the well-behaved client's worst ``/healthz`` may be.
ALLOWED_DELAY: Final = 0.050
#: Tries of a case before a delay fails it: a real hold repeats every time, a
#: loaded machine's hiccup (another process on the core) rarely three times.
ATTEMPTS: Final = 3
#: The server's body and frame limit here (small, so the largest body is cheap).
MESSAGE_BYTES: Final = 1 << 20
#: The slow-reader timeout here.
SLOW_READER_TIMEOUT: Final = 0.5
#: Nesting of the deep cases (far past msgspec's and CPython's recursion limits).
DEPTH: Final = 100_000
#: A client id far longer than any real one.
LONG_ID: Final = "resp_" + "a" * 100_000
#: What an error message may be at most, quoting such an id.
MAX_MESSAGE: Final = ProtocolError.MAX_QUOTED + 256


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a hostile request got: an HTTP status (or a WebSocket error's),
    the error's code and param, the message's length, and for a stream how it ended."""

    status: int
    code: str | None = None
    param: str | None = None
    message: int = 0
    ended: str = ""


@dataclasses.dataclass(frozen=True)
class Case:
    """A hostile input for one surface and the answer it must get."""

    name: str
    send: Callable[[Servers], Outcome]
    expect: Outcome
    #: Whether the probe's wait is bounded while it runs. A reader that never
    #: reads makes the server stream at full speed until it is cut off: that
    #: load is what tests/serve/test_loop_lag.py times (median and p90 of a
    #: client's turns), not a hold of the loop.
    timed: bool = True


@dataclasses.dataclass(frozen=True)
class Servers:
    http_url: str
    port: int


# --- sending ------------------------------------------------------------------

_salt = iter(range(1 << 62))


def fresh() -> int:
    """A new number each call: a body the server never saw (nothing cached)."""
    return next(_salt)


def http_outcome(answer: httpx.Response) -> Outcome:
    if answer.status_code < 400:
        return Outcome(answer.status_code)
    error = answer.json()["error"]
    return Outcome(answer.status_code, error["code"], error["param"], len(error["message"]))


def post(path: str, body: dict[str, Any] | bytes) -> Callable[[Servers], Outcome]:
    def send(servers: Servers) -> Outcome:
        return http_outcome(http_clients.post(servers, body, path=path, timeout=60))

    return send


def request(method: str, path: str) -> Callable[[Servers], Outcome]:
    def send(servers: Servers) -> Outcome:
        return http_outcome(httpx.request(method, servers.http_url + path, timeout=60))

    return send


def sse(path: str, body: dict[str, Any]) -> Callable[[Servers], Outcome]:
    """A streamed POST read to its end: the status, and the last event's type."""

    def send(servers: Servers) -> Outcome:
        raw = json.dumps({**body, "stream": True}).encode()
        headers = {"content-type": "application/json"}
        with httpx.stream(
            "POST", servers.http_url + path, content=raw, headers=headers, timeout=60
        ) as answer:
            if answer.status_code >= 400:
                answer.read()
                return http_outcome(answer)
            last = ""
            for line in answer.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    last = json.loads(line[6:]).get("type", "") or "chunk"
        return Outcome(answer.status_code, ended="answered" if last in ANSWERED else last)

    return send


#: A response's endings that answer it (``incomplete``: cut at max_output_tokens).
ANSWERED: Final = frozenset({"response.completed", "response.incomplete", "response.done"})

#: Events that end a create on a WebSocket.
ENDINGS: Final = frozenset(
    {"response.completed", "response.failed", "response.incomplete", "response.done", "error"}
)


def frame(text: str | dict[str, Any], *, append: bool) -> Callable[[Servers], Outcome]:
    """One frame on a new WebSocket (append mode or the shipped shape), read
    until its create ends; then the socket must still answer a bad frame."""

    def send(servers: Servers) -> Outcome:
        data = text if isinstance(text, str) else json.dumps(text)
        protocols = [APPEND_SUBPROTOCOL] if append else None
        url = f"ws://127.0.0.1:{servers.port}/v1/responses"
        with ws_connect(url, max_size=None, subprotocols=protocols) as socket_:  # type: ignore[arg-type]
            socket_.send(data)
            while (event := json.loads(socket_.recv(timeout=60)))["type"] not in ENDINGS:
                pass
            socket_.send("{not json")  # still usable: a precise error, not a close
            assert json.loads(socket_.recv(timeout=60))["error"]["code"] == "invalid_json"
        if event["type"] != "error":
            return Outcome(200, ended="answered" if event["type"] in ANSWERED else event["type"])
        error = event["error"]
        return Outcome(event["status"], error["code"], error["param"], len(error["message"]))

    return send


def hang_up_http(path: str) -> Callable[[Servers], Outcome]:
    """A POST that declares 1,000 bytes, sends 300 and closes."""

    def send(servers: Servers) -> Outcome:
        with socket.create_connection(("127.0.0.1", servers.port), timeout=10) as sock:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: 1000\r\n\r\n".encode()
                + b'{"model": "sim", "input": "'
                + b"x" * 272
            )
        return Outcome(0)

    return send


def hang_up_ws(*, append: bool) -> Callable[[Servers], Outcome]:
    """A WebSocket frame that declares 1,000 bytes; 300 are sent, then the socket closes."""

    def send(servers: Servers) -> Outcome:
        protocols = [APPEND_SUBPROTOCOL] if append else None
        url = f"ws://127.0.0.1:{servers.port}/v1/responses"
        with ws_connect(url, subprotocols=protocols) as socket_:  # type: ignore[arg-type]
            # A masked text frame header with a 16-bit length, then part of it.
            header = bytes([0x81, 0x80 | 126]) + (1000).to_bytes(2, "big") + b"\0\0\0\0"
            socket_.socket.sendall(header + b"x" * 300)
            socket_.socket.shutdown(socket.SHUT_RDWR)
        return Outcome(0)

    return send


def never_read(
    opened: Callable[[Servers], socket.socket],
    dropped: Callable[[Servers], bool] | None = None,
    endings: tuple[str, ...] = ("response.completed", "[DONE]"),
) -> Callable[[Servers], Outcome]:
    """A long stream asked for and never read (4 KiB receive buffer); after the
    timeout and a margin (or, for a feed that writes only when there is
    traffic, once ``dropped`` says so, traffic made meanwhile), reading must
    reach the end of the connection before any terminal event: the server cut
    the reader off."""

    def send(servers: Servers) -> Outcome:
        with opened(servers) as sock:
            if dropped is None:
                time.sleep(SLOW_READER_TIMEOUT + 1.5)
            deadline = time.monotonic() + 30
            while dropped is not None and not dropped(servers):
                assert time.monotonic() < deadline, "never dropped"
                traffic(servers)
            sock.settimeout(10)
            received, ended = b"", "cut"
            try:
                while chunk := sock.recv(1 << 20):
                    received = received[-4096:] + chunk
                    if any(end.encode() in received for end in endings):
                        return Outcome(0, ended="finished")
            except ConnectionResetError:
                pass
            except TimeoutError:
                ended = "still open"
            return Outcome(0, ended=ended)

    return send


def traffic(servers: Servers) -> None:
    """A streamed answer of 300 tokens, read at once (for a feed to tell of)."""
    body = {"model": "sim", "input": "x", "store": False, "stream": True}
    body["metadata"] = {"sim_output_tokens": "300"}
    with httpx.stream("POST", servers.http_url + "/v1/responses", json=body, timeout=60) as answer:
        for _ in answer.iter_bytes():
            pass


def no_feed(servers: Servers) -> bool:
    state = httpx.get(servers.http_url + "/inspect/api/state", timeout=60).json()
    return bool(state["server"]["watchers"] == 0)


def http_stream(
    method: str, path: Callable[[Servers], str] | str, body: dict[str, Any] | None = None
) -> Callable[[Servers], socket.socket]:
    """A request sent from a socket with a 4 KiB receive buffer (the caller never reads)."""

    def opened(servers: Servers) -> socket.socket:
        data = json.dumps(body).encode() if body is not None else b""
        target = path if isinstance(path, str) else path(servers)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", servers.port))
        sock.sendall(
            f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        return sock

    return opened


def ws_stream(create: dict[str, Any]) -> Callable[[Servers], socket.socket]:
    """An append-mode create sent from a socket with a 4 KiB receive buffer."""

    def opened(servers: Servers) -> socket.socket:
        sock, conn = handshake(servers.port, rcvbuf=4096)
        sock.sendall(conn.send(ws.TextMessage(json.dumps(create))))
        return sock

    return opened


#: Background responses the cases started, cancelled once their case is over.
BACKGROUND: list[str] = []


def background_follower(servers: Servers) -> str:
    """A long background response: the path that streams it."""
    # Long enough to fill every buffer on the way, short enough to store cheaply.
    body = {**LONG_ANSWER, "background": True, "store": True}
    body["metadata"] = {"sim_output_tokens": "200000"}
    created = httpx.post(servers.http_url + "/v1/responses", json=body, timeout=60)
    assert created.status_code == 200, created.text
    BACKGROUND.append(created.json()["id"])
    return f"/v1/responses/{BACKGROUND[-1]}?stream=true"


def cancelling(send: Callable[[Servers], Outcome]) -> Callable[[Servers], Outcome]:
    """``send``, then the background responses it started are cancelled (a
    follower's drop leaves its response running, as it should)."""

    def run(servers: Servers) -> Outcome:
        try:
            return send(servers)
        finally:
            while BACKGROUND:  # (one that ended meanwhile answers 400: nothing to cancel)
                path = f"/v1/responses/{BACKGROUND.pop()}/cancel"
                assert httpx.post(servers.http_url + path, timeout=60).status_code in (200, 400)

    return run


# --- bodies ---------------------------------------------------------------------

LONG_ANSWER: Final = {
    "model": "sim",
    "input": "flood me",
    "metadata": {"sim_output_tokens": "2000000"},
}


def tools(count: int) -> list[dict[str, Any]]:
    salt = fresh()
    parameters = {"type": "object", "properties": {"a": {"type": "string"}}}
    return [
        {"type": "function", "name": f"t{salt}_{i}", "parameters": parameters} for i in range(count)
    ]


def chat_tools(count: int) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}}
        for t in tools(count)
    ]


def schema(width: int) -> dict[str, Any]:
    salt = fresh()
    properties = {f"p{salt}_{i}": {"type": "string"} for i in range(width)}
    return {"type": "object", "properties": properties}


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def filler(total: int, around: int) -> str:
    """Text that makes a body of about ``total`` bytes, given ``around`` bytes of the rest."""
    return "word " * ((total - around) // 5)


class Responses:
    """Bodies of a create (``/v1/responses``, ``/input_tokens``, the WebSockets)."""

    def __init__(self, extra: dict[str, Any] | None = None, *, counting: bool = False) -> None:
        self.extra = extra or {}
        self.counting = counting  # /input_tokens takes no max_output_tokens or store

    def body(self, **fields: Any) -> dict[str, Any]:
        base: dict[str, Any] = {"model": "sim", "input": "hi"}
        if not self.counting:
            base.update(store=False, max_output_tokens=16, tool_choice="none")
        return {**self.extra, **base, **fields}

    def raw(self, json_field: str) -> str:
        """A body whose ``tools[0].parameters`` is the given JSON text."""
        body = json.dumps(self.body(tools=[{"type": "function", "name": "a", "parameters": 0}]))
        return body.replace('"parameters": 0', f'"parameters": {{"x": {json_field}}}')

    def format(self, width: int) -> dict[str, Any]:
        return {"format": {"type": "json_schema", "name": "a", "schema": schema(width)}}


def create_cases(
    send: Callable[[dict[str, Any] | bytes], Callable[[Servers], Outcome]],
    bodies: Responses,
    *,
    ok: Outcome,
    limit_status: int = 400,
) -> list[Case]:
    """Every hostile input of a create, for a surface that sends a body with ``send``."""
    items = [{"role": "user", "content": "x"}]
    schema_param = "text.format.schema"
    largest = bodies.body(input=filler(MESSAGE_BYTES, 2_000))
    over = bodies.body(input="x" * MESSAGE_BYTES)
    return [
        Case("tools at the limit", lambda s: send(bodies.body(tools=tools(MAX_TOOLS)))(s), ok),
        Case(
            "tools past the limit",
            lambda s: send(bodies.body(tools=tools(MAX_TOOLS + 1)))(s),
            Outcome(400, "invalid_value", "tools"),
        ),
        Case(
            "schema at the width limit",
            lambda s: send(bodies.body(text=bodies.format(MAX_SCHEMA_WIDTH)))(s),
            ok,
        ),
        Case(
            "schema past the width limit",
            lambda s: send(bodies.body(text=bodies.format(MAX_SCHEMA_WIDTH + 1)))(s),
            Outcome(400, "invalid_value", schema_param),
        ),
        Case("items at the limit", send(bodies.body(input=items * MAX_ITEMS_PER_EVENT)), ok),
        Case(
            "items past the limit",
            send(bodies.body(input=items * (MAX_ITEMS_PER_EVENT + 1))),
            Outcome(limit_status, "too_many_items", "input"),
        ),
        Case("body at the limit", send(largest), ok),
        Case("body past the limit", send(over), Outcome(413, "message_too_large", None)),
        Case(
            "nesting in a schema",
            send(bodies.raw(deep(DEPTH)).encode()),
            Outcome(400, "invalid_json", None),
        ),
        Case("wrong type", send(bodies.body(input=5)), Outcome(400, "invalid_type", "input")),
        Case(
            "an id of 100,000 characters",
            send(bodies.body(previous_response_id=LONG_ID)),
            Outcome(400, "previous_response_not_found", "previous_response_id"),
        ),
    ]


def http_create(path: str, bodies: Responses) -> list[Case]:
    return [
        *create_cases(lambda body: post(path, body), bodies, ok=Outcome(200)),
        Case("hang-up mid-body", hang_up_http(path), Outcome(0)),
    ]


def ws_create(*, append: bool) -> list[Case]:
    bodies = Responses({"type": "response.create"})

    def send(body: dict[str, Any] | bytes) -> Callable[[Servers], Outcome]:
        return frame(body.decode() if isinstance(body, bytes) else body, append=append)

    create = {"type": "response.create", **LONG_ANSWER}
    cases = create_cases(send, bodies, ok=Outcome(200, ended="answered"))
    if append:  # append mode type-checks previous_response_id and ignores it (SPEC)
        cases = [
            dataclasses.replace(case, expect=Outcome(200, ended="answered"))
            if case.name == "an id of 100,000 characters"
            else case
            for case in cases
        ]
    return [
        *cases,
        Case("hang-up mid-frame", hang_up_ws(append=append), Outcome(0)),
        *(
            [
                Case(
                    "never reads",
                    never_read(ws_stream(create)),
                    Outcome(0, ended="cut"),
                    timed=False,
                )
            ]
            if append
            else []
        ),
    ]


def chat_cases() -> list[Case]:
    path = "/v1/chat/completions"
    messages = [{"role": "user", "content": "hi"}]

    def body(**fields: Any) -> dict[str, Any]:
        return {"model": "sim", "messages": messages, "max_tokens": 16, **fields}

    def response_format(width: int) -> dict[str, Any]:
        return {"type": "json_schema", "json_schema": {"name": "a", "schema": schema(width)}}

    deep_tool = json.dumps(
        body(tools=[{"type": "function", "function": {"name": "a", "parameters": 0}}])
    )
    deep_tool = deep_tool.replace('"parameters": 0', f'"parameters": {{"x": {deep(DEPTH)}}}')
    one = [{"role": "user", "content": "x"}]
    return [
        Case(
            "tools at the limit",
            lambda s: post(path, body(tools=chat_tools(MAX_TOOLS)))(s),
            Outcome(200),
        ),
        Case(
            "tools past the limit",
            lambda s: post(path, body(tools=chat_tools(MAX_TOOLS + 1)))(s),
            Outcome(400, "invalid_value", "tools"),
        ),
        Case(
            "schema at the width limit",
            lambda s: post(path, body(response_format=response_format(MAX_SCHEMA_WIDTH)))(s),
            Outcome(200),
        ),
        Case(
            "schema past the width limit",
            lambda s: post(path, body(response_format=response_format(MAX_SCHEMA_WIDTH + 1)))(s),
            Outcome(400, "invalid_value", "response_format.json_schema.schema"),
        ),
        Case(
            "messages at the limit",
            post(path, body(messages=one * MAX_ITEMS_PER_EVENT)),
            Outcome(200),
        ),
        Case(
            "messages past the limit",
            post(path, body(messages=one * (MAX_ITEMS_PER_EVENT + 1))),
            Outcome(400, "too_many_items", "messages"),
        ),
        Case(
            "body at the limit",
            post(path, body(messages=[{"role": "user", "content": filler(MESSAGE_BYTES, 2_000)}])),
            Outcome(200),
        ),
        Case(
            "body past the limit",
            post(path, body(messages=[{"role": "user", "content": "x" * MESSAGE_BYTES}])),
            Outcome(413, "message_too_large", None),
        ),
        Case(
            "nesting in a schema",
            post(path, deep_tool.encode()),
            Outcome(400, "invalid_json", None),
        ),
        Case("wrong type", post(path, body(messages=5)), Outcome(400, "invalid_type", "messages")),
        Case("hang-up mid-body", hang_up_http(path), Outcome(0)),
        Case(
            "never reads",
            never_read(
                http_stream(
                    "POST",
                    path,
                    {
                        "model": "sim",
                        "messages": messages,
                        "stream": True,
                        "metadata": {"sim_output_tokens": "2000000"},
                    },
                )
            ),
            Outcome(0, ended="cut"),
            timed=False,
        ),
    ]


def compact_cases() -> list[Case]:
    path = "/v1/responses/compact"
    items = [{"role": "user", "content": "x"}]

    def body(**fields: Any) -> dict[str, Any]:
        return {"model": "sim", "input": "hi", **fields}

    deep_body = json.dumps(body(metadata=0)).replace('"metadata": 0', f'"metadata": {deep(DEPTH)}')
    return [
        Case(
            "items at the limit", post(path, body(input=items * MAX_ITEMS_PER_EVENT)), Outcome(200)
        ),
        Case(
            "items past the limit",
            post(path, body(input=items * (MAX_ITEMS_PER_EVENT + 1))),
            Outcome(400, "too_many_items", "input"),
        ),
        Case(
            "body at the limit", post(path, body(input=filler(MESSAGE_BYTES, 2_000))), Outcome(200)
        ),
        Case(
            "body past the limit",
            post(path, body(input="x" * MESSAGE_BYTES)),
            Outcome(413, "message_too_large", None),
        ),
        Case("nesting", post(path, deep_body.encode()), Outcome(400, "invalid_type", "metadata")),
        Case(
            "nesting at the top",
            post(path, deep(DEPTH).encode()),
            Outcome(400, "invalid_type", None),
        ),
        Case("wrong type", post(path, body(input=5)), Outcome(400, "invalid_type", "input")),
        Case(
            "an id of 100,000 characters",
            post(path, body(previous_response_id=LONG_ID)),
            Outcome(400, "previous_response_not_found", "previous_response_id"),
        ),
        Case("hang-up mid-body", hang_up_http(path), Outcome(0)),
    ]


def resource_cases(method: str, suffix: str = "") -> list[Case]:
    """``GET`` / ``DELETE`` / ``cancel`` of a stored response."""
    long_id = "resp_" + "a" * 8_000  # a long URL (what an HTTP server reads of one is bounded)
    cases = [
        Case(
            "an id of 8,000 characters",
            request(method, f"/v1/responses/{long_id}{suffix}"),
            Outcome(404, "response_not_found", "response_id"),
        ),
    ]
    if method == "GET":
        cases += [
            Case(
                "wrong type",
                request("GET", "/v1/responses/resp_x?stream=true&starting_after=abc"),
                Outcome(400, "invalid_value", "starting_after"),
            ),
            Case(
                "never reads",
                cancelling(never_read(http_stream("GET", background_follower))),
                Outcome(0, ended="cut"),
                timed=False,
            ),
        ]
    return cases


def inspector_cases() -> list[Case]:
    return [
        Case("state", request("GET", "/inspect/api/state"), Outcome(200)),
        Case(
            "an id of 8,000 characters",
            request("GET", "/inspect/api/rollouts/" + "r" * 8_000),
            Outcome(404, "not_found", "rollout_id"),
        ),
        Case(
            "a file name of 8,000 characters",
            request("GET", "/inspect/static/" + "f" * 8_000),
            Outcome(404, "unknown_url", None),
        ),
        Case(
            "never reads",
            never_read(http_stream("GET", "/inspect/api/feed"), no_feed, endings=()),
            Outcome(0, ended="cut"),
            timed=False,
        ),
    ]


#: Every surface a client reaches, and the hostile inputs it gets. A new
#: surface is one more line.
SURFACES: Final[dict[str, Callable[[], list[Case]]]] = {
    "POST /v1/responses": lambda: http_create("/v1/responses", Responses()),
    "POST /v1/responses (SSE)": lambda: [
        *create_cases(
            lambda body: (
                sse("/v1/responses", body)
                if isinstance(body, dict)
                else post("/v1/responses", body)
            ),
            Responses(),
            ok=Outcome(200, ended="answered"),
        ),
        Case(
            "never reads",
            never_read(
                http_stream(
                    "POST", "/v1/responses", {**LONG_ANSWER, "stream": True, "store": False}
                )
            ),
            Outcome(0, ended="cut"),
            timed=False,
        ),
    ],
    "POST /v1/responses/input_tokens": lambda: http_create(
        "/v1/responses/input_tokens", Responses(counting=True)
    ),
    "POST /v1/responses/compact": compact_cases,
    "POST /v1/chat/completions": chat_cases,
    "GET /v1/responses/{id}": lambda: resource_cases("GET"),
    "DELETE /v1/responses/{id}": lambda: resource_cases("DELETE"),
    "POST /v1/responses/{id}/cancel": lambda: resource_cases("POST", "/cancel"),
    "WebSocket, the shipped shape": lambda: ws_create(append=False),
    "WebSocket, append mode": lambda: ws_create(append=True),
    "inspector API": inspector_cases,
    "a tenant's tools (issue 28)": lambda: tenant_tool_cases(),
}


#: The loopback address the harness's server allows ``mcp`` tools to name:
#: nothing listens there, and nothing may try (the cases are refused first).
MCP_HOST: Final = "127.0.0.1:9"


def tenant_tool_cases() -> list[Case]:
    """Issue 28's attacks through the tools a create offers."""
    bodies = Responses()
    grid = {"type": "array", "minItems": 10_000, "items": {"type": "integer"}}
    hostile = {
        "type": "function",
        "name": "grid",
        "parameters": {
            "type": "object",
            "properties": {"rows": {"type": "array", "minItems": 10_000, "items": grid}},
            "required": ["rows"],
        },
    }
    mcp = [
        {"type": "mcp", "server_label": f"s{i}", "server_url": f"http://{MCP_HOST}/mcp"}
        for i in range(500)
    ]
    return [
        # 10^8 argument elements asked for in 300 bytes: the simulated model
        # charges them to the output budget first, and the call does not fit.
        Case(
            "a tool whose arguments multiply past the budget",
            post("/v1/responses", bodies.body(tools=[hostile], tool_choice="required")),
            Outcome(200),
        ),
        Case(
            "500 mcp tools",
            post("/v1/responses", bodies.body(tools=mcp)),
            Outcome(400, "invalid_value", "tools[16]"),
        ),
    ]


#: Issue 20's multi-megabyte bodies, far past a limit, against a server with
#: the default 16 MiB body limit: each refused with its precise error, and
#: quickly (the limits are checked on the body's skeleton, before it is
#: decoded: ``longresponse/serve/skeleton.py``).
TOOLS_FAR_PAST: Final = 40_000
WIDTH_FAR_PAST: Final = 120_000
ITEMS_FAR_PAST: Final = 100_000


def multi_megabyte_cases() -> list[Case]:
    refused_tools = Outcome(400, "invalid_value", "tools")
    body = Responses().body
    items = [{"role": "user", "content": "x"}] * ITEMS_FAR_PAST
    chat = {"model": "sim", "messages": [{"role": "user", "content": "x"}]}
    json_schema = {"name": "a", "schema": schema(WIDTH_FAR_PAST)}
    create = {"type": "response.create", "model": "sim", "input": "x"}
    return [
        Case(
            "40,000 tools, /v1/responses",
            lambda s: post("/v1/responses", body(tools=tools(TOOLS_FAR_PAST)))(s),
            refused_tools,
        ),
        Case(
            "40,000 tools, /input_tokens",
            lambda s: post(
                "/v1/responses/input_tokens",
                Responses(counting=True).body(tools=tools(TOOLS_FAR_PAST)),
            )(s),
            refused_tools,
        ),
        Case(
            "40,000 tools, chat",
            lambda s: post("/v1/chat/completions", {**chat, "tools": chat_tools(TOOLS_FAR_PAST)})(
                s
            ),
            refused_tools,
        ),
        Case(
            "40,000 tools, a shipped WebSocket create",
            lambda s: frame({**create, "tools": tools(TOOLS_FAR_PAST)}, append=False)(s),
            refused_tools,
        ),
        Case(
            "120,000 properties, text.format.schema",
            lambda s: post("/v1/responses", body(text=Responses().format(WIDTH_FAR_PAST)))(s),
            Outcome(400, "invalid_value", "text.format.schema"),
        ),
        Case(
            "120,000 properties, chat response_format",
            lambda s: post(
                "/v1/chat/completions",
                {**chat, "response_format": {"type": "json_schema", "json_schema": json_schema}},
            )(s),
            Outcome(400, "invalid_value", "response_format.json_schema.schema"),
        ),
        Case(
            "120,000 properties, a tool's parameters",
            lambda s: post(
                "/v1/responses",
                body(
                    tools=[{"type": "function", "name": "a", "parameters": schema(WIDTH_FAR_PAST)}]
                ),
            )(s),
            Outcome(400, "invalid_value", "tools[0].parameters"),
        ),
        Case(
            "100,000 items, /v1/responses",
            post("/v1/responses", body(input=items)),
            Outcome(400, "too_many_items", "input"),
        ),
        Case(
            "100,000 items, /compact",
            post("/v1/responses/compact", {"model": "sim", "input": items}),
            Outcome(400, "too_many_items", "input"),
        ),
    ]


# --- the child process that sends the cases -------------------------------------

#: The cases the child sends, by table name: every surface, and the multi-megabyte bodies.
TABLES: Final[dict[str, Callable[[], list[Case]]]] = {
    **SURFACES,
    "multi-megabyte bodies": multi_megabyte_cases,
}


def abuser(servers: Servers, commands: Any, results: Any) -> None:
    """Run each ``(surface, case)`` it is sent; put back the outcome (or the error)."""
    tables = {name: {case.name: case for case in build()} for name, build in TABLES.items()}
    while (command := commands.get()) is not None:
        surface, name = command
        try:
            results.put((command, tables[surface][name].send(servers)))
        except Exception as exc:  # reported to the test, which fails with it
            results.put((command, f"{type(exc).__name__}: {exc}"))


# --- the well-behaved client ------------------------------------------------------


class Probe:
    """``GET /healthz`` again and again on one connection, in a thread: the waits."""

    def __init__(self, http_url: str) -> None:
        self.client = httpx.Client(base_url=http_url, timeout=60)
        self.waits: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Probe:
        self.waits = []
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            assert self.client.get("/healthz").status_code == 200
            self.waits.append(time.perf_counter() - started)
            self._stop.wait(0.002)


def rss(http_url: str) -> float:
    page = httpx.get(f"{http_url}/metrics", timeout=10).text
    match = re.search(r"^process_resident_memory_bytes (\S+)$", page, re.MULTILINE)
    assert match is not None
    return float(match.group(1))


@dataclasses.dataclass
class Harness:
    server: ServerProcess
    servers: Servers
    commands: Any
    results: Any
    probe: Probe
    alone: float  # the probe's worst wait with nothing else running
    idle_rss: float
    #: Per case: the probe's worst wait during it, and how long it took.
    figures: dict[str, float] = dataclasses.field(default_factory=dict)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)

    def quiet(self) -> float:
        """The probe's worst wait over half a second with nothing else sent: the
        machine's own noise right now (other processes share its two cores)."""
        with self.probe:
            time.sleep(0.5)
        return max(self.probe.waits)

    def run(self, surface: str, case: Case) -> tuple[Outcome | str, float]:
        """The case's outcome and the probe's worst wait while it ran."""
        started = time.perf_counter()
        with self.probe:
            time.sleep(0.02)
            self.commands.put((surface, case.name))
            while True:  # (an answer to a case of a test that timed out is dropped)
                command, outcome = self.results.get(timeout=120)
                if command == (surface, case.name):
                    break
            time.sleep(0.02)
        self.seconds[f"{surface}: {case.name}"] = time.perf_counter() - started
        return outcome, max(self.probe.waits)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    store = tmp_path_factory.mktemp("hostile") / "responses.db"
    flags = (
        "--store", f"sqlite:///{store}",
        "--max-message-bytes", str(MESSAGE_BYTES),
        "--slow-reader-timeout", str(SLOW_READER_TIMEOUT),
        "--mcp-allow-host", MCP_HOST,
    )  # fmt: skip
    yield from running_harness(flags)


@pytest.fixture(scope="module")
def large_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """A server with the default body limit (16 MiB), for the multi-megabyte bodies."""
    store = tmp_path_factory.mktemp("hostile-large") / "responses.db"
    yield from running_harness(("--store", f"sqlite:///{store}"))


def running_harness(flags: tuple[str, ...]) -> Iterator[Harness]:
    context = multiprocessing.get_context("spawn")
    with ServerProcess(*flags) as server:
        servers = Servers(server.http_url, server.port)
        commands, results = context.Queue(), context.Queue()
        child = context.Process(target=abuser, args=(servers, commands, results), daemon=True)
        child.start()
        probe = Probe(server.http_url)
        try:
            # Warm: one answered request of each kind, then the probe alone.
            for surface, case in (
                ("POST /v1/responses", "body at the limit"),
                ("POST /v1/responses (SSE)", "tools at the limit"),
                ("WebSocket, append mode", "body at the limit"),
                ("POST /v1/chat/completions", "body at the limit"),
            ):
                commands.put((surface, case))
                assert isinstance(results.get(timeout=120)[1], Outcome)
            idle = rss(server.http_url)
            with probe:
                time.sleep(1.0)
            alone = statistics.quantiles(probe.waits, n=20)[-1]  # its 95th percentile
            yield Harness(server, servers, commands, results, probe, alone, idle)
        finally:
            commands.put(None)
            child.join(30)
            if child.is_alive():
                child.kill()
            probe.client.close()


@pytest.mark.timeout(300)  # a surface takes 1-8 s; a loaded machine, more
@pytest.mark.parametrize("surface", list(SURFACES))
def test_every_hostile_input_is_answered_without_delaying_anyone(
    harness: Harness, surface: str
) -> None:
    failures = []
    alone = max(harness.alone, harness.quiet())
    for case in SURFACES[surface]():
        for attempt in range(ATTEMPTS):
            outcome, worst = harness.run(surface, case)
            if not isinstance(outcome, Outcome):
                failures.append(f"{case.name}: {outcome}")
                break
            delayed = case.timed and worst - alone > ALLOWED_DELAY
            if not delayed or attempt == ATTEMPTS - 1:
                break
        harness.figures[f"{surface}: {case.name}"] = worst
        if not isinstance(outcome, Outcome):
            continue
        expect = case.expect
        got = dataclasses.replace(outcome, message=0)
        if got != expect:
            failures.append(f"{case.name}: got {outcome}, expected {expect}")
        if outcome.message > MAX_MESSAGE:
            failures.append(f"{case.name}: a message of {outcome.message} characters")
        if delayed:
            failures.append(
                f"{case.name}: /healthz waited {worst * 1000:.0f} ms (alone {alone * 1000:.0f} ms)"
            )
    assert not failures, "\n".join(failures)


@pytest.mark.timeout(300)
def test_multi_megabyte_bodies_are_refused_without_delaying_anyone(
    large_harness: Harness,
) -> None:
    """40,000 tools, a schema of 120,000 properties and 100,000 items, on each
    endpoint that takes them (5-7 MB each): refused with their precise
    error, and another client's /healthz within 50 ms of its wait alone."""
    harness, failures = large_harness, []
    alone = max(harness.alone, harness.quiet())
    for case in multi_megabyte_cases():
        for _ in range(ATTEMPTS):
            outcome, worst = harness.run("multi-megabyte bodies", case)
            if not isinstance(outcome, Outcome) or worst - alone <= ALLOWED_DELAY:
                break
        if not isinstance(outcome, Outcome):
            failures.append(f"{case.name}: {outcome}")
            continue
        if dataclasses.replace(outcome, message=0) != case.expect:
            failures.append(f"{case.name}: got {outcome}, expected {case.expect}")
        if worst - alone > ALLOWED_DELAY:
            failures.append(
                f"{case.name}: /healthz waited {worst * 1000:.0f} ms (alone {alone * 1000:.0f} ms)"
            )
    assert not failures, "\n".join(failures)


def test_memory_comes_back_after_the_hostile_clients(harness: Harness) -> None:
    """Run last: every case above has closed its connections."""
    assert len(harness.figures) > 50, "runs after the surfaces"
    deadline = time.monotonic() + 10
    while (after := rss(harness.servers.http_url)) > 1.1 * harness.idle_rss:
        assert time.monotonic() < deadline, (
            f"RSS {after / 2**20:.0f} MiB, warm idle {harness.idle_rss / 2**20:.0f} MiB"
        )
        time.sleep(0.2)
