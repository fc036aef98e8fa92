"""Clients of a test server's HTTP surface, written once for every test.

- ``openai_client``: the official ``openai`` SDK pointed at a server, closed
  after the test (``tests/conftest.py`` empties ``OPEN_CLIENTS``, and
  ``SHARED_CLIENTS`` when the shared server stops).
- ``post``: a raw JSON POST with ``httpx``, for what the SDK would refuse
  to send (malformed bodies, unknown fields, wrong keys).
- ``unread_request`` / ``stalled_post``: a request from a socket that then
  reads nothing (a slow reader); ``read_until_closed`` takes what reached it
  once the server lets go.

A ``server`` here is anything with ``http_url`` (and ``port`` for the raw
sockets): a ``RunningServer`` in this process or a server process.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from openai import OpenAI

__all__ = [
    "OPEN_CLIENTS",
    "SHARED_CLIENTS",
    "openai_client",
    "post",
    "read_until_closed",
    "stalled_post",
    "unread_request",
]

#: SDK clients made by a test, closed after it (their HTTP pools hold sockets).
OPEN_CLIENTS: list[Any] = []
#: SDK clients of the shared server, one per key, kept for the run as an
#: application keeps its client: each ``OpenAI()`` builds an SSL context from
#: the CA bundle (30-40 ms of CPU), a fifth of the fast tier's time when
#: every test built its own.
SHARED_CLIENTS: dict[tuple[str, str], Any] = {}


def openai_client(server: Any, key: str = "test-key") -> OpenAI:
    """An official ``openai`` client for ``server`` at its defaults (but no
    retries), closed when the test ends; the shared server's (a ``RunningServer``
    made with ``shared=True``) are kept for the run."""
    from openai import OpenAI

    shared = bool(getattr(server, "shared", False))
    if shared and (kept := SHARED_CLIENTS.get((server.http_url, key))):
        return kept
    client = OpenAI(base_url=f"{server.http_url}/v1", api_key=key, max_retries=0)
    if shared:
        SHARED_CLIENTS[server.http_url, key] = client
    else:
        OPEN_CLIENTS.append(client)
    return client


def post(
    server: Any,
    body: Any,
    *,
    path: str = "/v1/responses",
    key: str | None = None,
    timeout: float = 30.0,
    **headers: str,
) -> httpx.Response:
    """POST ``body`` to ``path`` as JSON: a ``str`` or ``bytes`` body as it is
    (malformed on purpose, say), anything else encoded. ``key`` goes in an
    ``Authorization: Bearer`` header; ``headers`` are added last."""
    content = body if isinstance(body, str | bytes) else json.dumps(body)
    sent = {"content-type": "application/json"}
    if key is not None:
        sent["authorization"] = f"Bearer {key}"
    return _POSTER.post(
        f"{server.http_url}{path}", content=content, headers={**sent, **headers}, timeout=timeout
    )


#: What :func:`post` sends with: ``httpx.post`` as it was (a new connection for
#: each request, none kept), less a client built per call, which read the CA
#: bundle every time (30-40 ms of CPU: a tenth of the fast tier's).
_POSTER = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


@contextlib.contextmanager
def unread_request(port: int, request: bytes) -> Iterator[socket.socket]:
    """Send the raw HTTP ``request`` from a socket with a 4 KiB receive buffer
    that then reads nothing until the caller does (a slow reader)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    with sock:
        sock.connect(("127.0.0.1", port))
        sock.sendall(request)
        yield sock


@contextlib.contextmanager
def stalled_post(port: int, path: str, body: dict[str, Any]) -> Iterator[socket.socket]:
    """A raw HTTP POST of ``body`` to ``path`` from a slow reader (``unread_request``)."""
    data = json.dumps(body).encode()
    request = (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n" % path.encode()
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)
    )
    with unread_request(port, request) as sock:
        yield sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything ``sock`` receives until the peer closes or resets it."""
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(1 << 20):
            received += chunk
    return received
