"""The ASGI application: Starlette routing, the stores' lifespan, the operator pages.

``/v1/responses`` as a WebSocket is the pure-ASGI endpoint of
``longresponse.serve.ws``; the HTTP Responses API is ``longresponse.serve.http``;
both start their turns through one :class:`~longresponse.serve.turns.Turns`.
The app's lifespan opens the store and its write-behind queue, and drains the
queue on shutdown. ``/v1/models``, ``/metrics`` and ``/healthz`` are here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from ..config import ServerConfig
from ..engine.admission import Pipeline
from ..engine.classifier import Policy
from ..engine.models import ModelRegistry
from ..engine.render import encode
from ..storage.backends import open_store
from ..storage.keys import ApiKeys
from ..storage.persistence import Persistence
from .gate import RouteGate
from .http import ResponsesHTTP
from .input_tokens import InputTokens
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import ServerMetrics
from .turns import Turns
from .ws import ResponsesEndpoint

__all__ = ["ResponsesEndpoint", "create_app"]


class _Services:
    """What the lifespan opens: filled at startup, read by every connection."""

    persistence: Persistence | None = None

    def get_persistence(self) -> Persistence:
        if self.persistence is None:
            raise RuntimeError("the store is not open: run the app with its lifespan")
        return self.persistence



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
    turns = Turns(
        config, models, pipeline, metrics=metrics, persistence=services.get_persistence
    )
    endpoint = ResponsesEndpoint(config, turns, keys)
    http = ResponsesHTTP(config, turns, keys, services.get_persistence)

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
            *InputTokens(http).routes(),
            *http.routes(),
            Route("/v1/models", list_models),
            Route("/metrics", metrics_page),
            Route("/healthz", health),
        ],
        lifespan=lifespan,
    )
    # 404 for unknown paths, then the API key, then 405 (longresponse.serve.gate).
    app.add_middleware(RouteGate, router=app.router, keys=keys)
    app.state.config = config
    app.state.models = models
    app.state.endpoint = endpoint
    app.state.http = http
    app.state.pipeline = pipeline
    app.state.turns = turns
    app.state.metrics = metrics
    return app
