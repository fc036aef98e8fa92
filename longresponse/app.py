"""The ASGI application: Starlette routing, one pure-ASGI WebSocket seam.

``GET /v1/responses`` upgraded to a WebSocket is served by
:class:`ResponsesEndpoint`, which picks the connection's mode from the
handshake (append mode when asked for by subprotocol or beta header, the
shipped shape otherwise) and hands the socket to a :class:`Session`.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute

from protocol import (
    APPEND_BETA_HEADER,
    APPEND_SUBPROTOCOL,
    Mode,
)

from .config import ServerConfig
from .render import encode
from .sampler import ModelRegistry
from .session import ASGIReceive, ASGISend, Session

__all__ = ["TIMING_HEADER", "ResponsesEndpoint", "create_app"]

#: Upgrade header asking for ``responsesapi.websocket_timing`` events.
TIMING_HEADER = "x-responsesapi-include-timing-metrics"


def _headers(scope: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in scope.get("headers", []):
        out.setdefault(key.decode("latin-1").lower(), []).append(value.decode("latin-1"))
    return out


class ResponsesEndpoint:
    """The WebSocket endpoint of ``/v1/responses`` (pure ASGI)."""

    def __init__(self, config: ServerConfig, models: ModelRegistry) -> None:
        self.config = config
        self.models = models
        self.live_sessions = 0  # for tests and metrics
        self.last_session: Session | None = None

    def wants_append(self, scope: dict[str, Any], headers: dict[str, list[str]]) -> bool:
        if APPEND_SUBPROTOCOL in scope.get("subprotocols", []):
            return True
        betas = ",".join(headers.get("openai-beta", []))
        return APPEND_BETA_HEADER in (b.strip() for b in betas.split(","))

    async def __call__(self, scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":  # pragma: no cover - ASGI contract
            return
        headers = _headers(scope)
        subprotocol = (
            APPEND_SUBPROTOCOL if APPEND_SUBPROTOCOL in scope.get("subprotocols", []) else None
        )
        timing = any(v.strip().lower() == "true" for v in headers.get(TIMING_HEADER, []))
        mode = Mode.APPEND if self.wants_append(scope, headers) else Mode.SHIPPED
        session = Session(self.config, self.models, mode=mode, send_timing=timing)
        # Counted before the handshake completes, so a client that sees the
        # 101 also sees its session counted.
        self.live_sessions += 1
        self.last_session = session
        try:
            await send({"type": "websocket.accept", "subprotocol": subprotocol})
            await session.serve(receive, send)
        finally:
            self.live_sessions -= 1


def create_app(config: ServerConfig | None = None) -> Starlette:
    """The longresponse ASGI app for ``config`` (defaults: embedded sim model)."""
    config = config or ServerConfig()
    encode("")  # load the tokenizer now, not inside the first request
    models = ModelRegistry(config.sim)
    endpoint = ResponsesEndpoint(config, models)

    async def list_models(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "created": 0, "owned_by": "longresponse"}
                    for name in models.names()
                ],
            }
        )

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "live_sessions": endpoint.live_sessions})

    app = Starlette(
        routes=[
            WebSocketRoute("/v1/responses", endpoint),
            Route("/v1/models", list_models),
            Route("/healthz", health),
        ]
    )
    app.state.config = config
    app.state.models = models
    app.state.endpoint = endpoint
    return app
