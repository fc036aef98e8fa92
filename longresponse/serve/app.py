"""The ASGI application: Starlette routing, one pure-ASGI WebSocket seam.

``GET /v1/responses`` upgraded to a WebSocket is served by
:class:`ResponsesEndpoint`, which checks the API key (401 before any state is
created), picks the connection's mode from the handshake (append mode when
asked for by subprotocol or beta header, the shipped shape otherwise) and
hands the socket to a :class:`Session`. The HTTP endpoints live in
``longresponse.serve.http``. The app's lifespan opens the store and its write-behind
queue, and drains the queue on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from protocol import APPEND_BETA_HEADER, APPEND_SUBPROTOCOL, Mode

from ..config import ServerConfig
from ..engine.admission import Pipeline
from ..engine.classifier import Policy
from ..engine.models import ModelRegistry
from ..engine.render import encode
from ..storage.backends import open_store
from ..storage.keys import ApiKeys, Unauthorized
from ..storage.persistence import Persistence
from .http import ResponsesHTTP
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import ServerMetrics
from .ws import ASGIReceive, ASGISend, Session

__all__ = ["TIMING_HEADER", "ResponsesEndpoint", "create_app"]

#: Upgrade header asking for ``responsesapi.websocket_timing`` events.
TIMING_HEADER = "x-responsesapi-include-timing-metrics"


def _headers(scope: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in scope.get("headers", []):
        out.setdefault(key.decode("latin-1").lower(), []).append(value.decode("latin-1"))
    return out


class _Services:
    """What the lifespan opens: filled at startup, read by every connection."""

    persistence: Persistence | None = None

    def get_persistence(self) -> Persistence:
        if self.persistence is None:
            raise RuntimeError("the store is not open: run the app with its lifespan")
        return self.persistence


class ResponsesEndpoint:
    """The WebSocket endpoint of ``/v1/responses`` (pure ASGI)."""

    def __init__(
        self,
        config: ServerConfig,
        models: ModelRegistry,
        keys: ApiKeys | None = None,
        services: _Services | None = None,
        pipeline: Pipeline | None = None,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.config = config
        self.models = models
        self.pipeline = pipeline or Pipeline(config.switches)
        self.metrics = metrics
        self.keys = keys or ApiKeys()
        self.services = services or _Services()
        self.live_sessions = 0  # for tests and metrics
        self.last_session: Session | None = None

    def wants_append(self, scope: dict[str, Any], headers: dict[str, list[str]]) -> bool:
        if APPEND_SUBPROTOCOL in scope.get("subprotocols", []):
            return True
        betas = ",".join(headers.get("openai-beta", []))
        return APPEND_BETA_HEADER in (b.strip() for b in betas.split(","))

    async def _refuse(self, scope: dict[str, Any], send: ASGISend, message: str) -> None:
        body = json.dumps(
            {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            }
        ).encode()
        if "websocket.http.response" in scope.get("extensions", {}):
            headers = [(b"content-type", b"application/json")]
            await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:  # pragma: no cover - servers without the denial extension answer 403
            await send({"type": "websocket.close", "code": 1008})

    async def __call__(self, scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":  # pragma: no cover - ASGI contract
            return
        headers = _headers(scope)
        try:
            authorization = headers.get("authorization", [])
            owner = self.keys.owner(authorization[0] if authorization else None)
        except Unauthorized as exc:
            await self._refuse(scope, send, str(exc))
            return
        subprotocol = (
            APPEND_SUBPROTOCOL if APPEND_SUBPROTOCOL in scope.get("subprotocols", []) else None
        )
        timing = any(v.strip().lower() == "true" for v in headers.get(TIMING_HEADER, []))
        mode = Mode.APPEND if self.wants_append(scope, headers) else Mode.SHIPPED
        session = Session(
            self.config,
            self.models,
            mode=mode,
            send_timing=timing,
            owner=owner,
            persistence=self.services.get_persistence,
            pipeline=self.pipeline,
            metrics=self.metrics,
        )
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
    """The longresponse ASGI app for ``config`` (defaults: embedded sim model, SQLite)."""
    config = config or ServerConfig()
    encode("")  # load the tokenizer now, not inside the first request
    models = ModelRegistry(config.sim)
    pipeline = Pipeline(config.switches, Policy(config.secrets_policy))
    models.counters = pipeline.counters
    metrics = ServerMetrics(pipeline.counters)
    keys = ApiKeys.from_env(config.api_keys)
    services = _Services()
    endpoint = ResponsesEndpoint(config, models, keys, services, pipeline, metrics)
    http = ResponsesHTTP(config, models, keys, services.get_persistence, pipeline, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        store = open_store(config.store, ttl=config.store_ttl)
        persistence = Persistence(store, overlapped=config.switches.overlapped_post_inference)
        persistence.start()
        app.state.loop = asyncio.get_running_loop()  # for tests that reach into the store
        services.persistence = app.state.persistence = persistence
        try:
            yield
        finally:
            await persistence.drain()  # a clean stop loses no queued write
            await store.aclose()
            services.persistence = None

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

    async def metrics_page(request: Request) -> Response:
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "live_sessions": endpoint.live_sessions})

    app = Starlette(
        routes=[
            WebSocketRoute("/v1/responses", endpoint),
            *http.routes(),
            Route("/v1/models", list_models),
            Route("/metrics", metrics_page),
            Route("/healthz", health),
        ],
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.models = models
    app.state.endpoint = endpoint
    app.state.http = http
    app.state.pipeline = pipeline
    app.state.metrics = metrics
    return app
