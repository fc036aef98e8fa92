"""The inspector's routes: the page, its JSON endpoint and its live feed.

Theory of operation
-------------------
``GET /inspect`` is a plain HTML page; its script and style sheet are
package data (``longresponse/serve/static/``), served under
``/inspect/static/``: no build step, no library, nothing fetched from
elsewhere. The page reads everything from the same endpoints a tool would:

- ``GET /inspect/api/state``: the server panel (event-loop lag, live and
  paused rollouts, memory, store), the connections, and a summary of every
  rollout kept (:class:`~longresponse.serve.inspector.observer.Inspector`);
- ``GET /inspect/api/rollouts/{id}``: one rollout, its turn timeline and
  its recent events;
- ``GET /inspect/api/rollouts/{id}/trace``: the same rollout as a download in
  the ``turns.json`` document shape ``longresponse bench`` writes (the
  client's own figures, which the server cannot know, are ``null``), with
  its events beside the turns;
- ``GET /inspect/api/feed``: Server-Sent Events: ``state`` at once and then
  every :data:`FEED_STATE_INTERVAL` seconds, ``event``, ``turn``,
  ``rollout``, ``connection`` and ``forgotten`` as they happen, ``lagged``
  before a feed that fell behind ends. At most ``max_watchers`` feeds are
  open, and at most ``watchers_per_key`` of one API key (with keys on); one
  more is refused (429, ``code: "too_many_watchers"``). A feed ends after
  ``feed_lifetime`` seconds (an ``EventSource`` reconnects), and a reader
  whose write waits ``slow_reader_timeout`` is cut off
  (:class:`~longresponse.serve.deadline.DeadlineStream`): a feed that is never
  read does not keep its place.

With API keys on, the gate (``serve.gate``) answers 401 before any of these
runs, and takes the key from ``?key=`` here since a browser cannot set a
header on a page load or an ``EventSource``; the page passes on the
``key`` of its own address to every request it makes. Each key is shown its
own connections and rollouts only (``gate.viewer``): another key's rollout
is ``not_found`` as one never kept; the operator key, and everyone with keys
off, sees them all.
"""

from __future__ import annotations

import asyncio
import collections
import json
import platform
import resource
import time
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from protocol import RemoteProtocolError

from ...config import INSPECTOR_FEED_LIFETIME, INSPECTOR_WATCHERS_PER_KEY, SLOW_READER_TIMEOUT
from ...storage.backends import StoreError
from ...storage.keys import ApiKeys
from ...storage.persistence import Persistence
from ..deadline import DeadlineStream
from ..errors import http_error
from ..gate import owner_of, viewer
from ..metrics import LoopLagMonitor
from ..seam import peer_gone
from .observer import Inspector, TooManyWatchers

__all__ = ["FEED_STATE_INTERVAL", "STATIC_FILES", "TOO_MANY_WATCHERS", "InspectRoutes"]

#: Seconds between the feed's ``state`` messages (ages, outboxes, the panel).
FEED_STATE_INTERVAL: Final = 1.0
#: Seconds the panel waits for the store's answer.
STORE_TIMEOUT: Final = 1.0
#: ``error.code`` of a feed refused because ``max_watchers`` are open.
TOO_MANY_WATCHERS: Final = "too_many_watchers"
#: The page's files, by the name they are served under.
STATIC_FILES: Final = {
    "inspect.js": "text/javascript; charset=utf-8",
    "inspect.css": "text/css; charset=utf-8",
}


def _static(name: str) -> bytes:
    return (resources.files("longresponse.serve.inspector") / "static" / name).read_bytes()


def _memory() -> dict[str, Any]:
    """The process's resident memory now and at its peak, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    rss: int | None = None
    try:
        with open("/proc/self/statm") as statm:
            rss = int(statm.read().split()[1]) * resource.getpagesize()
    except OSError:  # pragma: no cover - not Linux
        pass
    return {"rss_bytes": rss, "peak_rss_bytes": peak}


def _sse(kind: str, data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class InspectRoutes:
    """``/inspect`` and ``/inspect/api/*`` for one app (module docstring)."""

    def __init__(
        self,
        inspector: Inspector,
        *,
        persistence: Callable[[], Persistence | None],
        lag: Callable[[], LoopLagMonitor | None],
        live_sessions: Callable[[], int],
        watchers_per_key: int = INSPECTOR_WATCHERS_PER_KEY,
        feed_lifetime: float = INSPECTOR_FEED_LIFETIME,
        slow_reader_timeout: float = SLOW_READER_TIMEOUT,
        keys: ApiKeys | None = None,
    ) -> None:
        self.inspector = inspector
        self.keys = keys or ApiKeys()
        self.watchers_per_key = watchers_per_key
        self.feed_lifetime = feed_lifetime
        self.slow_reader_timeout = slow_reader_timeout
        #: Open feeds by owner (API key).
        self._feeds: collections.Counter[str] = collections.Counter()
        self._persistence = persistence
        self._lag = lag
        self._live_sessions = live_sessions
        self._store: tuple[float, dict[str, Any]] | None = None

    def routes(self) -> list[Route]:
        return [
            Route("/inspect", self.page, methods=["GET"]),
            Route("/inspect/static/{name}", self.static, methods=["GET"]),
            Route("/inspect/api/state", self.state, methods=["GET"]),
            Route("/inspect/api/rollouts/{rollout_id}", self.rollout, methods=["GET"]),
            Route("/inspect/api/rollouts/{rollout_id}/trace", self.trace, methods=["GET"]),
            Route("/inspect/api/feed", self.feed, methods=["GET"]),
        ]

    # --- the page --------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        return Response(_static("inspect.html"), media_type="text/html; charset=utf-8")

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        media_type = STATIC_FILES.get(name)
        if media_type is None:
            return http_error(
                RemoteProtocolError(
                    f"No inspector file {RemoteProtocolError.clip(name)!r}.",
                    code="unknown_url",
                    param=None,
                    status=404,
                )
            )
        return Response(_static(name), media_type=media_type)

    # --- the JSON endpoint -------------------------------------------------------

    async def server_panel(self) -> dict[str, Any]:
        """Loop lag, rollouts, memory and the store, as the panel shows them."""
        monitor = self._lag()
        last, worst = monitor.recent if monitor is not None else (0.0, 0.0)
        return {
            "now": time.time(),
            "uptime_s": time.time() - self.inspector.started,
            "python": platform.python_version(),
            "event_loop_lag_ms": last * 1000,
            "event_loop_lag_max_ms": worst * 1000,
            "live_sessions": self._live_sessions(),
            "memory": _memory(),
            "store": await self._store_state(),
        }

    async def _store_state(self) -> dict[str, Any]:
        """``up`` or ``down`` (with why), asked at most once a second."""
        now = time.monotonic()
        if self._store is not None and now - self._store[0] < FEED_STATE_INTERVAL:
            return self._store[1]
        persistence = self._persistence()
        state: dict[str, Any]
        try:
            if persistence is None:
                raise StoreError("the store is not open")
            async with asyncio.timeout(STORE_TIMEOUT):
                await persistence.store.ping()
            state = {"state": "up", "backend": type(persistence.store).__name__}
        except (StoreError, TimeoutError) as exc:
            state = {"state": "down", "error": str(exc) or "timed out"}
        self._store = (now, state)
        return state

    def _viewer(self, request: Request) -> str | None:
        return viewer(request.scope, self.keys)

    async def _state(self, viewer: str | None) -> dict[str, Any]:
        state = self.inspector.state(viewer)
        server = await self.server_panel()
        if viewer is not None:  # a tenant counts its own sessions, not everyone's
            server["live_sessions"] = sum(
                1 for c in state["connections"] if c["open"] and c["id"] != "http"
            )
        server["live_rollouts"] = state.pop("live_rollouts")
        server["paused_rollouts"] = state.pop("paused_rollouts")
        server["watchers"] = state.pop("watchers")
        server["max_watchers"] = state.pop("max_watchers")
        return {"server": server, **state}

    async def state(self, request: Request) -> Response:
        return JSONResponse(await self._state(self._viewer(request)))

    def _record(self, request: Request) -> Any:
        rollout_id = request.path_params["rollout_id"]
        record = self.inspector.visible(rollout_id, self._viewer(request))
        if record is None:
            raise RemoteProtocolError(
                f"No rollout {RemoteProtocolError.clip(rollout_id)!r} is kept by the inspector "
                f"(it keeps {self.inspector.max_rollouts}; finished ones are forgotten first).",
                code="not_found",
                param="rollout_id",
                status=404,
            )
        return record

    async def rollout(self, request: Request) -> Response:
        try:
            record = self._record(request)
        except RemoteProtocolError as error:
            return http_error(error)
        return JSONResponse(record.detail())

    async def trace(self, request: Request) -> Response:
        try:
            record = self._record(request)
        except RemoteProtocolError as error:
            return http_error(error)
        response = JSONResponse(trace_document(record.detail()))
        response.headers["content-disposition"] = f'attachment; filename="{record.id}.json"'
        return response

    # --- the live feed -------------------------------------------------------------

    async def feed(self, request: Request) -> Response:
        owner = owner_of(request.scope, self.keys)
        shown = self._viewer(request)
        try:
            if owner and self._feeds[owner] >= self.watchers_per_key:
                raise TooManyWatchers(
                    f"This API key has {self._feeds[owner]} inspector feeds open; the limit "
                    f"is {self.watchers_per_key}. Close one and retry."
                )
            watcher = self.inspector.add_watcher(shown)
        except TooManyWatchers as exc:
            return http_error(RemoteProtocolError(str(exc), code=TOO_MANY_WATCHERS, status=429))
        self._feeds[owner] += 1
        scope = request.scope
        inspector = self.inspector
        ends = time.monotonic() + self.feed_lifetime
        released = False

        def release() -> None:  # once, from whichever end comes first
            nonlocal released
            if not released:
                released = True
                inspector.remove_watcher(watcher)
                self._feeds[owner] -= 1
                if not self._feeds[owner]:
                    del self._feeds[owner]

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield _sse("state", await self._state(shown))
                next_state = time.monotonic() + FEED_STATE_INTERVAL
                while not inspector.stopping and not peer_gone(scope):
                    if time.monotonic() >= ends:
                        return  # its lifetime is up: the EventSource reconnects
                    timeout = max(0.0, min(next_state, ends) - time.monotonic())
                    try:
                        async with asyncio.timeout(timeout):
                            kind, data = await watcher.queue.get()
                    except TimeoutError:
                        yield _sse("state", await self._state(shown))
                        next_state = time.monotonic() + FEED_STATE_INTERVAL
                        continue
                    yield _sse(kind, data)
                    if kind == "lagged":
                        return
            finally:
                release()

        return DeadlineStream(
            stream(),
            timeout=self.slow_reader_timeout,
            why="slow inspector feed reader",
            on_close=release,
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )


def trace_document(detail: dict[str, Any]) -> dict[str, Any]:
    """One rollout in ``longresponse bench``'s ``turns.json`` shape, events beside."""
    turns = []
    for index, row in enumerate(detail["timeline"]):
        cached, total = row["cached_tokens"], row["input_tokens"]
        turns.append(
            {
                "turn": index,
                "kind": "create" if index == 0 else "continuation",
                "sent_bytes": row["bytes_in"],
                "received_bytes": row["bytes_out"],
                "observed_ms": None,
                "client_ttft_ms": None,
                "output_tokens": None,
                "input_tokens": total,
                "cached_tokens": cached,
                "uncached_tokens": max(0, total - cached),
                "model_ms": None,
                "overhead_ms": None,
                "server_overhead_ms": row["server"]["resume_ms"]
                + row["server"]["count_ms"]
                + row["server"]["post_inference_ms"],
                "server": row["server"],
                "tool_latency_ms": row["pause_ms"],
                "echo_rtt_ms": None,
                "overhead_minus_echo_ms": None,
                "client_echo_rtt_ms": None,
                "response_id": row["response_id"],
            }
        )
    record = {
        "scenario": "inspect",
        "shape": detail["shape"],
        "id": detail["id"],
        "status": detail["status"],
        "error": None if detail["status"] != "failed" else "failed",
        "e2e_ms": None,
        "final_answer": None,
        "turns": turns,
        "frames": [],
        "events": detail["events"],
    }
    return {"meta": {"source": "longresponse inspector"}, "rollouts": [record]}
