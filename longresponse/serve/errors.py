"""The shipped error envelope, built in one place for every transport, and logged.

``{"error": {"message", "type", "param", "code"}}`` with the error's
``status``: the body of an HTTP error (``POST /v1/responses``, the gate's
refusals, the inspector's), a chat stream's error record, and the 401 that
refuses a WebSocket upgrade. A WebSocket ``error`` event
(:func:`error_frame`) carries the same fields, plus ``status``,
``sequence_number``, ``stream_id`` and ``error.headers`` with a request id
of its own. Everything comes from the :class:`~protocol.ProtocolError`,
complete where it was raised.

Every refusal is logged once, where it is answered: one line naming the
transport, status, code, param and request id (``refused POST /v1/responses
400 invalid_value param=tools[4].type request_id=req_…``), at info for a
4xx, warning for a 5xx. Never the message or the body: they may quote the
client's input.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from starlette.responses import JSONResponse

from protocol import ProtocolError, RemoteProtocolError, error_event
from protocol.events import ErrorEvent

from ..engine.sampling import UpstreamError
from .request_ids import REQUEST_ID_HEADER, new_request_id, request_id
from .types import Receive, Scope, Send

__all__ = [
    "ErrorResponse",
    "error_body",
    "error_frame",
    "http_error",
    "log_refusal",
    "upstream_http_error",
]

log = logging.getLogger(__name__)


def error_body(error: ProtocolError) -> dict[str, Any]:
    """The shipped error envelope of ``error`` (its ``status`` goes on the response)."""
    fields = {"message": error.message, "type": error.error_type, "param": error.param}
    return {"error": fields | {"code": error.code}}


def log_refusal(
    where: str, error: ProtocolError, ident: str | None, *, stream_id: str | None = None
) -> None:
    """The one log line of a refusal answered at ``where`` (``POST /v1/responses``,
    ``WebSocket /v1/responses``): status, code, param, request id, lane."""
    lane = f" stream_id={stream_id}" if stream_id is not None else ""
    log.log(
        logging.WARNING if error.status >= 500 else logging.INFO,
        "%s %s %d %s param=%s request_id=%s%s",
        "failed" if error.status >= 500 else "refused",
        where,
        error.status,
        error.code,
        error.param if error.param is not None else "-",
        ident or "-",
        lane,
    )


class ErrorResponse(JSONResponse):
    """An HTTP error answer: the envelope of ``error``, logged when it is sent."""

    def __init__(self, error: ProtocolError, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(error_body(error), status_code=error.status, headers=headers)
        self.error = error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope.get("method", "WebSocket")
        log_refusal(f"{method} {scope.get('path', '')}", self.error, request_id(scope))
        await super().__call__(scope, receive, send)


def http_error(error: ProtocolError, *, headers: dict[str, str] | None = None) -> ErrorResponse:
    """The shipped HTTP error envelope, with ``error``'s status."""
    return ErrorResponse(error, headers=headers)


def upstream_http_error(exc: UpstreamError, error: ProtocolError | None = None) -> ErrorResponse:
    """An engine's failure as the shipped HTTP error (``Retry-After`` when it gave one),
    or as ``error`` when the caller words it (the chat API names params its own way)."""
    status, error_type = exc.status, exc.error_type
    headers = None
    if exc.retry_after is not None:
        headers = {"retry-after": str(max(1, math.ceil(exc.retry_after)))}
    return http_error(
        error
        or RemoteProtocolError(
            exc.message, code=exc.code, param=exc.param, status=status, error_type=error_type
        ),
        headers=headers,
    )


def error_frame(
    error: ProtocolError,
    *,
    path: str,
    stream_id: str | None = None,
    sequence_number: int = 0,
) -> ErrorEvent:
    """The WebSocket ``error`` event of ``error`` (on ``stream_id`` or the error's
    own lane), logged: a fresh request id in ``error.headers`` and the log line."""
    ident = new_request_id()
    event = error_event(
        error,
        stream_id=stream_id,
        sequence_number=sequence_number,
        headers={REQUEST_ID_HEADER: ident},
    )
    lane = event.stream_id if isinstance(event.stream_id, str) else None
    log_refusal(f"WebSocket {path}", error, ident, stream_id=lane)
    return event
