"""The shipped error envelope, built in one place for every transport.

``{"error": {"message", "type", "param", "code"}}`` with the error's
``status``: the body of an HTTP error (``POST /v1/responses``, the gate's
refusals, the inspector's), a chat stream's error record, and the 401 that
refuses a WebSocket upgrade. (A WebSocket ``error`` event carries the same
fields, as the protocol's ``error_event`` builds it.) Everything comes from
the :class:`~protocol.ProtocolError`, complete where it was raised.
"""

from __future__ import annotations

import math
from typing import Any

from starlette.responses import JSONResponse

from protocol import ProtocolError, RemoteProtocolError

from ..engine.failures import UpstreamError

__all__ = ["error_body", "http_error", "upstream_http_error"]


def error_body(error: ProtocolError) -> dict[str, Any]:
    """The shipped error envelope of ``error`` (its ``status`` goes on the response)."""
    fields = {"message": error.message, "type": error.error_type, "param": error.param}
    return {"error": fields | {"code": error.code}}


def http_error(error: ProtocolError, *, headers: dict[str, str] | None = None) -> JSONResponse:
    """The shipped HTTP error envelope, with ``error``'s status."""
    return JSONResponse(error_body(error), status_code=error.status, headers=headers)


def upstream_http_error(exc: UpstreamError, error: ProtocolError | None = None) -> JSONResponse:
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
