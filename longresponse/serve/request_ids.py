"""A fresh request id for every HTTP answer and WebSocket handshake: ``x-request-id``.

Theory of operation
-------------------
A pure ASGI layer, outside everything but :class:`~longresponse.serve.seam.Seam`
(so a crash's 500 carries it too). For each HTTP request and WebSocket
connection it makes an id ``req_<32 hex>`` (:func:`new_request_id`), puts it
in the scope under :data:`REQUEST_ID_KEY` (the error envelope's log line
names it, ``serve.errors``), and adds it as ``x-request-id`` to the answer's
headers: ``http.response.start``, a WebSocket's ``websocket.accept`` (the
101) or the HTTP refusal of an upgrade. The official SDKs read it as the
response's ``request_id``. A WebSocket ``error`` frame answers a request of
its own and carries an id of its own in ``error.headers`` (``serve.errors``).
"""

from __future__ import annotations

from typing import Any, Final

from ..ids import new_id
from .types import Message, Receive, Scope, Send

__all__ = ["REQUEST_ID_HEADER", "REQUEST_ID_KEY", "RequestIds", "new_request_id", "request_id"]

#: Where the scope carries the request's id.
REQUEST_ID_KEY: Final = "longresponse.request_id"
#: The header the shipped API and the SDKs use for it.
REQUEST_ID_HEADER: Final = "x-request-id"

#: The messages that open an answer, and so carry its headers.
_STARTS: Final = frozenset(
    {"http.response.start", "websocket.accept", "websocket.http.response.start"}
)


def new_request_id() -> str:
    """A fresh request id, ``req_<32 hex digits>``."""
    return new_id("req")


def request_id(scope: Scope) -> str | None:
    """The id :class:`RequestIds` gave the request of ``scope`` (``None`` outside it)."""
    value = scope.get(REQUEST_ID_KEY)
    return value if isinstance(value, str) else None


class RequestIds:
    """Wraps ``app``: every HTTP answer and WebSocket handshake gets ``x-request-id``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        ident = scope[REQUEST_ID_KEY] = new_request_id()
        header = (REQUEST_ID_HEADER.encode(), ident.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] in _STARTS:
                headers = [h for h in message.get("headers", []) if h[0].lower() != header[0]]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        await self.app(scope, receive, send_with_id)

    def __getattr__(self, name: str) -> Any:
        # ``state``, ``routes``... of the wrapped application.
        return getattr(self.app, name)
