"""The ASGI application: Starlette routing, the stores' lifespan, the operator pages.

``/v1/responses`` as a WebSocket is the pure-ASGI endpoint of
``longresponse.serve.ws.session``; the HTTP Responses API is ``longresponse.serve.http.responses``;
both start their turns through one :class:`~longresponse.serve.turns.Turns`;
``POST /v1/responses/compact`` is ``longresponse.serve.http.compact``;
``POST /v1/chat/completions`` and ``POST /tokenize`` are ``longresponse.serve.http.chat``. The app's
lifespan opens the store and its write-behind queue, loads the compaction key
(``longresponse.storage.server_keys``), and drains the queue on shutdown,
after the HTTP ``background: true`` responses still running
(``longresponse.serve.http.background``) have been ended and queued for writing;
while it runs, it renews the leases on them (and ends those of processes that
stopped).
``/v1/models``, ``/metrics`` and ``/healthz`` are here; the lifespan also
runs the event-loop lag monitor behind ``/metrics``
(``longresponse.serve.metrics.LoopLagMonitor``). ``/inspect`` and its API are
``longresponse.serve.inspector.routes``, over the app's
``longresponse.serve.inspector.observer.Inspector``.

What the app is made of is handed out once, as one value: the
:class:`ServerParts` of the returned app (``app.parts``), which the server
process reads (the endpoint to drain, the background responses to end) and
tests observe. Nothing is stashed on Starlette's ``app.state``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from ..backends.registry import (
    Backend,
    ModelRegistry,
    check_backends,
    close_backends,
    open_backends,
    serve_backends,
)
from ..config import ServerConfig
from ..engine.admission import HostedTools, Pipeline
from ..engine.classifier import Policy
from ..engine.compaction import CompactionKey
from ..engine.render import encode
from ..hosted import load_sdk
from ..storage.backends import StoreError, open_store
from ..storage.keys import ApiKeys
from ..storage.persistence import Persistence
from ..storage.server_keys import configured_compaction_secret, stored_compaction_key
from .gate import RouteGate, redact_access_log
from .http.background import BackgroundResponses
from .http.chat import ChatCompletions
from .http.compact import CompactHTTP
from .http.conversations import ConversationsHTTP
from .http.input_tokens import InputTokens
from .http.responses import ResponsesHTTP, hung_up
from .inspector.observer import Inspector
from .inspector.routes import InspectRoutes
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import LoopLagMonitor, ServerMetrics
from .prefix_reuse import PrefixReuseCounters
from .request_ids import RequestIds
from .seam import Seam
from .turns import Turns
from .ws.session import ResponsesEndpoint, Session

__all__ = ["HEALTH_STORE_TIMEOUT", "ResponsesEndpoint", "ServerParts", "create_app"]

#: Seconds ``/healthz`` waits for the store's answer before reporting it down.
HEALTH_STORE_TIMEOUT = 2.0


class _Services:
    """What the lifespan opens: filled at startup (:meth:`open`), read by every
    connection, emptied at shutdown (:meth:`close`)."""

    persistence: Persistence | None = None
    compaction_key: CompactionKey | None = None
    lag: LoopLagMonitor | None = None
    #: The loop the app runs on (tests that reach into the store use it).
    loop: asyncio.AbstractEventLoop | None = None

    def open(
        self, persistence: Persistence, compaction_key: CompactionKey, lag: LoopLagMonitor
    ) -> None:
        self.persistence, self.compaction_key, self.lag = persistence, compaction_key, lag
        self.loop = asyncio.get_running_loop()

    def close(self) -> None:
        self.persistence = self.compaction_key = None

    def get_persistence(self) -> Persistence:
        if self.persistence is None:
            raise RuntimeError("the store is not open: run the app with its lifespan")
        return self.persistence

    def get_compaction_key(self) -> CompactionKey:
        if self.compaction_key is None:
            raise RuntimeError("the compaction key is not loaded: run the app with its lifespan")
        return self.compaction_key


@dataclasses.dataclass(frozen=True)
class ServerParts:
    """What one app is made of, for the server process (graceful shutdown) and for
    tests and examples that observe the server in-process (``app.parts``)."""

    config: ServerConfig
    models: ModelRegistry
    pipeline: Pipeline
    turns: Turns
    endpoint: ResponsesEndpoint
    http: ResponsesHTTP
    chat: ChatCompletions
    background: BackgroundResponses
    metrics: ServerMetrics
    inspector: Inspector
    _services: _Services

    @property
    def persistence(self) -> Persistence | None:
        """The store's write-behind queue while the app runs (its lifespan)."""
        return self._services.persistence

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the app runs on, once its lifespan has started."""
        return self._services.loop


class _ServerPages:
    """``GET /v1/models``, ``/metrics`` and ``/healthz``: what the server says of itself."""

    def __init__(
        self,
        models: ModelRegistry,
        metrics: ServerMetrics,
        endpoint: ResponsesEndpoint,
        services: _Services,
    ) -> None:
        self._models = models
        self._metrics = metrics
        self._endpoint = endpoint
        self._services = services

    def routes(self) -> list[Route]:
        return [
            Route("/v1/models", self.list_models),
            Route("/metrics", self.metrics_page),
            Route("/healthz", self.health),
        ]

    async def list_models(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": spec.name, "object": "model", "created": 0, "owned_by": spec.owned_by}
                    for spec in self._models.specs()
                ],
            }
        )

    async def metrics_page(self, request: Request) -> Response:
        return Response(self._metrics.render(), media_type=METRICS_CONTENT_TYPE)

    async def health(self, request: Request) -> JSONResponse:
        """200 while the store answers, 503 (``"store": "down"``) while it does not."""
        body: dict[str, object] = {"status": "ok", "live_sessions": self._endpoint.live_sessions}
        persistence = self._services.persistence
        try:
            if persistence is None:
                raise StoreError("the store is not open")
            async with asyncio.timeout(HEALTH_STORE_TIMEOUT):
                await persistence.store.ping()
            body["store"] = "up"
        except (StoreError, TimeoutError) as exc:
            body.update(status="degraded", store="down", store_error=str(exc) or "timed out")
            return JSONResponse(body, status_code=503)
        return JSONResponse(body)


def _lifespan(
    config: ServerConfig,
    services: _Services,
    metrics: ServerMetrics,
    background: BackgroundResponses,
    backends: list[Backend],
    turns: Turns,
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """The app's lifespan: opens the store, its write-behind queue, the
    compaction key and the loop-lag monitor at startup, and asks each
    upstream whether it serves its model (while serving); at shutdown ends
    what still runs, drains the queue and closes the store and the backends."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        store = open_store(config.store, ttl=config.store_ttl)
        await store.ping()  # an unreachable store stops the startup (StoreError)
        persistence = Persistence(store, overlapped=config.switches.overlapped_post_inference)
        persistence.start()
        secret = configured_compaction_secret(config.compaction_key)
        compaction_key = (
            CompactionKey.derive(secret, lifetime=config.compaction_lifetime)
            if secret is not None
            else CompactionKey(
                await stored_compaction_key(store), lifetime=config.compaction_lifetime
            )
        )
        monitor = LoopLagMonitor(metrics)
        services.open(persistence, compaction_key, monitor)
        lag = asyncio.create_task(monitor.run(), name="loop-lag")
        # Renews this process's background leases and ends those of stopped ones.
        leases = asyncio.create_task(background.keep_leases(), name="background-leases")
        # Whether each upstream serves its model: logged, while the server serves.
        checking = asyncio.create_task(check_backends(backends), name="backend-check")
        try:
            yield
        finally:
            for task in (lag, leases, checking):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await background.aclose()  # what still runs ends failed, and is stored
            await persistence.drain()  # a clean stop loses no queued write
            await store.aclose()
            await close_backends(backends)
            await turns.aclose_hosted()
            turns.close()
            services.close()

    return lifespan


def create_app(
    config: ServerConfig | None = None, *, on_session: Callable[[Session], object] | None = None
) -> Seam:
    """The longresponse ASGI app for ``config`` (defaults: embedded sim model, SQLite).

    ``on_session`` is told of each WebSocket session as it opens (a test's
    view of a connection's state; the server itself keeps no closed one)."""
    config = config or ServerConfig()
    encode("")  # load the tokenizer now, not inside the first request
    if config.mcp.allowed_hosts:  # the hosted mcp tool's SDK: now, not in a turn
        load_sdk()
    pipeline = Pipeline(
        config.switches,
        Policy(config.secrets_policy),
        HostedTools(config.hosted_tools),
        limits=config.schema_limits,
    )
    models = ModelRegistry(config.sim, counters=pipeline.counters)
    backends = open_backends(config.backends)  # real engines (longresponse.backends)
    serve_backends(models, backends)
    metrics = ServerMetrics(pipeline.counters)
    keys = ApiKeys.from_env(config.api_keys, operator=config.operator_key)
    services = _Services()
    inspector = Inspector(enabled=config.inspector, max_watchers=config.inspector_watchers)
    turns = Turns(
        config,
        models,
        pipeline,
        metrics=metrics,
        persistence=services.get_persistence,
        compaction_key=services.get_compaction_key,
        inspector=inspector,
    )
    endpoint = ResponsesEndpoint(config, turns, keys, on_session=on_session)
    background = BackgroundResponses(
        turns,
        max_running=config.max_background,
        max_per_key=config.max_background_per_key,
        max_duration=config.background_max_duration,
        slow_reader_timeout=config.slow_reader_timeout,
        log_bytes=config.background_log_bytes,
        endings_bytes=config.background_endings_bytes,
        lease=config.background_lease,
    )
    http = ResponsesHTTP(config, turns, keys, services.get_persistence, background)
    compaction = CompactHTTP(http)
    chat = ChatCompletions(config, http, models, pipeline)  # POST /v1/chat/completions
    metrics.registry.register(chat.collector())
    if turns.prefixes is not None:
        metrics.registry.register(PrefixReuseCounters(turns.prefixes))

    pages = _ServerPages(models, metrics, endpoint, services)
    lifespan = _lifespan(config, services, metrics, background, backends, turns)
    app = Starlette(
        routes=[
            WebSocketRoute("/v1/responses", endpoint),
            *compaction.routes(),
            *InputTokens(http).routes(),
            *http.routes(),
            *ConversationsHTTP(http, http.conversations).routes(),
            *chat.routes(),
            *pages.routes(),
            *InspectRoutes(
                inspector,
                persistence=lambda: services.persistence,
                lag=lambda: services.lag,
                live_sessions=lambda: endpoint.live_sessions,
                watchers_per_key=config.inspector_watchers_per_key,
                feed_lifetime=config.inspector_feed_lifetime,
                slow_reader_timeout=config.slow_reader_timeout,
                keys=keys,
            ).routes(),
        ],
        lifespan=lifespan,
        # A client that hangs up mid-body is one log line, not a traceback.
        exception_handlers={ClientDisconnect: hung_up},
    )
    # 404 for unknown paths, then the API key, then 405 (longresponse.serve.gate).
    app.add_middleware(RouteGate, router=app.router, keys=keys)
    redact_access_log()  # the inspector's ?key= never reaches the log
    parts = ServerParts(
        config=config,
        models=models,
        pipeline=pipeline,
        turns=turns,
        endpoint=endpoint,
        http=http,
        chat=chat,
        background=background,
        metrics=metrics,
        inspector=inspector,
        _services=services,
    )
    # x-request-id on every answer, a crash's 500 too
    return Seam(RequestIds(app), parts=parts)
