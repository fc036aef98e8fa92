"""The inspector's observations: connections, rollouts, turns and recent events.

Theory of operation
-------------------
The server keeps one :class:`Inspector`. It is fed by a few calls from the
hot paths, each cheap and none of them waiting:

- a WebSocket session opens a
  :class:`~longresponse.serve.inspector.records.ConnectionRecord` when it starts and
  closes it when it ends (``serve.ws``); HTTP requests share one record of
  their own (shape ``http``), since HTTP connections end without a word;
- every decoded client message goes to its ``ConnectionRecord.client``
  (``serve.ws``; ``serve.http`` for a request body);
- every turn starts in :meth:`Inspector.watch` (``serve.turns``), which finds
  or opens the turn's
  :class:`~longresponse.serve.inspector.records.RolloutRecord` and wraps the turn's sink in a
  :class:`~longresponse.serve.inspector.watched.WatchedSink` that notes each
  server event on its way out;
- every finished turn comes to
  :meth:`~longresponse.serve.inspector.records.RolloutRecord.turn_ended` with
  its :class:`~longresponse.engine.timing.TurnTiming` (the rollout's timing hook).

A rollout here is a conversation as the client drives it: one append-mode
Response, or a chain of shipped-shape or HTTP responses linked by
``previous_response_id`` (each HTTP request has a fresh engine rollout; the
chain is one record all the same, so its turns line up with append's).

Per event only cheap fields are kept: its type, its ``sequence_number``, its
size on the wire, a wall-clock time and, for the few events that change a
rollout's state, a short summary (status, call ids); consecutive deltas of
one item share one entry, with their count. Payloads are never copied. A
rollout keeps its last :data:`RING_EVENTS` entries and :data:`MAX_TURNS`
turns; at most :data:`MAX_ROLLOUTS` rollouts are kept, the least recently
active finished ones forgotten first, and a finished one is forgotten
:data:`FORGET_AFTER` seconds after its last event.

Tenants are apart: every connection and rollout record carries its API key's
owner (``storage.keys``), and each reading (:meth:`Inspector.state`,
:meth:`Inspector.visible`, a :class:`Watcher`) is for one *viewer*: an owner
sees only its own records, ``None`` (the operator key, or keys off) sees
all. The shared ``http`` connection row shows a tenant only the bytes of its
own HTTP rollouts.

Watchers (the live feed, ``serve.inspect_routes``) each get a bounded queue;
at most :data:`MAX_WATCHERS` at once. With no watcher nothing is published.
A watcher whose queue overflows is dropped (its feed says ``lagged`` and
ends; an ``EventSource`` reconnects and starts from a fresh state). With the
inspector off (``--no-inspector``) every hook returns at once.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Final

from protocol.events import ResponseCreate

from ...engine.rollout import Rollout
from ...engine.stream import EventSink
from ..transport import Transport
from .records import (
    DIGEST_AFTER,
    FINISHED,
    ConnectionRecord,
    RolloutRecord,
)
from .watched import WatchedSink

__all__ = [
    "FORGET_AFTER",
    "MAX_ROLLOUTS",
    "MAX_WATCHERS",
    "RING_EVENTS",
    "WATCHER_QUEUE",
    "Inspector",
    "TooManyWatchers",
    "Watcher",
    "sees",
]

#: Recent events kept per rollout (client and server).
RING_EVENTS: Final = 512
#: Rollout records kept in all.
MAX_ROLLOUTS: Final = 128
#: Seconds a finished rollout's record stays after its last event.
FORGET_AFTER: Final = 900.0
#: Live feeds at once.
MAX_WATCHERS: Final = 4
#: Messages buffered per watcher before it is dropped as lagging.
WATCHER_QUEUE: Final = 4096


class TooManyWatchers(Exception):
    """:data:`MAX_WATCHERS` feeds are open already."""


def sees(viewer: str | None, owner: str | None) -> bool:
    """Whether ``viewer`` (an owner, or ``None`` for the operator) may see what
    ``owner`` did."""
    return viewer is None or owner == viewer


class Watcher:
    """One live feed's bounded queue of messages, for one viewer (module docstring)."""

    def __init__(self, depth: int, viewer: str | None = None) -> None:
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(depth)
        self.lagged = False
        #: Whose records this feed shows (``None``: everyone's).
        self.viewer = viewer

    def offer(self, kind: str, data: Any, owner: str | None = None) -> None:
        if self.lagged or not sees(self.viewer, owner):
            return
        try:
            self.queue.put_nowait((kind, data))
        except asyncio.QueueFull:
            self.lagged = True
            self.queue.get_nowait()  # room for the word that ends it
            self.queue.put_nowait(("lagged", {}))


class Inspector:
    """The server's observations (see the module docstring); one per app."""

    def __init__(
        self,
        *,
        enabled: bool = True,
        ring: int = RING_EVENTS,
        max_rollouts: int = MAX_ROLLOUTS,
        max_watchers: int = MAX_WATCHERS,
        forget_after: float = FORGET_AFTER,
        watcher_queue: int = WATCHER_QUEUE,
    ) -> None:
        self.enabled = enabled
        self.ring = ring
        self.max_rollouts = max_rollouts
        self.max_watchers = max_watchers
        self.forget_after = forget_after
        self.watcher_queue = watcher_queue
        self.started = time.time()
        self._ids = itertools.count(1)
        self.connections: dict[str, ConnectionRecord] = {}
        self.http = ConnectionRecord(self, "http", Transport.HTTP, None, owner=None)
        self.rollouts: dict[str, RolloutRecord] = {}
        self.by_response: dict[str, RolloutRecord] = {}
        self._by_rollout: weakref.WeakKeyDictionary[Rollout, RolloutRecord] = (
            weakref.WeakKeyDictionary()
        )
        self._by_sink: weakref.WeakKeyDictionary[Any, ConnectionRecord] = (
            weakref.WeakKeyDictionary()
        )
        self.watchers: list[Watcher] = []
        #: Set when the server stops (:meth:`stop`): open feeds end.
        self.stopping = False

    def stop(self) -> None:
        """The server is stopping: the open feeds end."""
        self.stopping = True

    # --- connections -----------------------------------------------------------

    def open_connection(
        self, session: Any, transport: Transport, owner: str = ""
    ) -> ConnectionRecord | None:
        if not self.enabled:
            return None
        record = ConnectionRecord(self, f"conn-{next(self._ids)}", transport, session, owner)
        self.connections[record.id] = record
        self._by_sink[session.outbox] = record
        if self.watchers:
            self.publish("connection", record.summary(), owner)
        return record

    def close_connection(self, record: ConnectionRecord | None) -> None:
        if record is None:
            return
        record.close()
        self.connections.pop(record.id, None)
        for rollout in self.rollouts.values():
            if rollout.connection is record:
                rollout.cut_off()
        if self.watchers:
            self.publish("connection", record.summary(), record.owner)

    # --- turns -----------------------------------------------------------------

    def watch(
        self,
        rollout: Rollout,
        request: ResponseCreate,
        response_id: str,
        sink: EventSink,
        owner: str = "",
    ) -> tuple[EventSink, RolloutRecord | None]:
        """A turn of ``owner``'s starts: its rollout's record (found or opened) and
        the sink to use."""
        if not self.enabled:
            return sink, None
        connection = self._by_sink.get(sink) or self.http
        record = self._by_rollout.get(rollout)
        previous = request.previous_response_id
        parent = self.by_response.get(previous) if previous is not None else None
        if parent is not None and parent.owner != owner:
            parent = None  # another key's chain is never joined (nor named as a fork's)
        if record is None and parent is not None:
            parent.digest()  # (``running`` follows from its events)
            if parent.responses[-1] == previous and not parent.running:
                record = parent  # the chain goes on (HTTP: a fresh engine rollout each time)
            else:
                record = self._open(response_id, connection, owner, parent=parent.id)  # a fork
        if record is None:
            record = self._open(response_id, connection, owner)
        self._by_rollout[rollout] = record
        connection.started(record)
        self.by_response[response_id] = record
        forgotten = record.turn_started(
            connection, rollout.model.name, response_id, request, connection.take_create(request)
        )
        if forgotten is not None:
            self.by_response.pop(forgotten, None)
        return WatchedSink.around(sink, record), record

    def _open(
        self,
        response_id: str,
        connection: ConnectionRecord,
        owner: str,
        *,
        parent: str | None = None,
    ) -> RolloutRecord:
        self._prune()
        record = RolloutRecord(
            self, response_id, connection.transport, connection, owner, parent=parent
        )
        self.rollouts[record.id] = record
        if self.watchers:
            self.publish("rollout", record.summary(), owner)
        return record

    def _prune(self) -> None:
        """Forget finished rollouts past their age, then the least recently active
        (finished first) while more than ``max_rollouts`` are kept."""
        for record in self.rollouts.values():
            record.digest()  # (the status and last activity follow from its events)
        now = time.monotonic()
        old = [
            r
            for r in self.rollouts.values()
            if r.status in FINISHED and now - r.active > self.forget_after
        ]
        excess = len(self.rollouts) - len(old) - self.max_rollouts + 1
        if excess > 0:
            rest = sorted(
                (r for r in self.rollouts.values() if r not in old),
                key=lambda r: (r.status not in FINISHED, r.active),
            )
            old.extend(rest[:excess])
        for record in old:
            self._forget(record)

    def _forget(self, record: RolloutRecord) -> None:
        del self.rollouts[record.id]
        for rid in record.responses:
            if self.by_response.get(rid) is record:
                del self.by_response[rid]
        if self.watchers:
            self.publish("forgotten", {"id": record.id}, record.owner)

    def record_of(self, rollout: Rollout) -> RolloutRecord | None:
        return self._by_rollout.get(rollout)

    # --- watchers ----------------------------------------------------------------

    def add_watcher(self, viewer: str | None = None) -> Watcher:
        """A new feed's queue, showing ``viewer``'s records (``None``: all). Raises
        :class:`TooManyWatchers` (nothing changes then)."""
        if len(self.watchers) >= self.max_watchers:
            raise TooManyWatchers(
                f"{len(self.watchers)} inspector feeds are open; the limit is "
                f"{self.max_watchers}. Close one and retry."
            )
        watcher = Watcher(self.watcher_queue, viewer)
        self.watchers.append(watcher)
        return watcher

    def remove_watcher(self, watcher: Watcher) -> None:
        if watcher in self.watchers:
            self.watchers.remove(watcher)

    def later(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` :data:`DIGEST_AFTER` seconds from now (at once with no loop)."""
        try:
            asyncio.get_running_loop().call_later(DIGEST_AFTER, callback)
        except RuntimeError:
            callback()

    def publish(self, kind: str, data: Any, owner: str | None) -> None:
        """Offer ``data`` (about ``owner``'s records) to the feeds that may see it."""
        for watcher in self.watchers:
            watcher.offer(kind, data, owner)

    # --- reading -------------------------------------------------------------------

    def visible(self, rollout_id: str, viewer: str | None) -> RolloutRecord | None:
        """The record ``rollout_id`` if it is kept and ``viewer`` may see it."""
        record = self.rollouts.get(rollout_id)
        return record if record is not None and sees(viewer, record.owner) else None

    def state(self, viewer: str | None = None) -> dict[str, Any]:
        """Connections and rollouts ``viewer`` may see (``None``: all), as the JSON
        endpoint gives them."""
        connections: Iterable[ConnectionRecord] = [
            c for c in self.connections.values() if sees(viewer, c.owner)
        ]
        kept = [r for r in self.rollouts.values() if sees(viewer, r.owner)]
        rollouts = [r.summary() for r in kept]
        http = self.http.summary()
        if viewer is not None:  # the shared row: this tenant's HTTP bytes only
            own = [r for r in kept if r.connection is self.http]
            http["bytes_in"] = sum(r.bytes_in for r in own)
            http["bytes_out"] = sum(r.bytes_out for r in own)
        return {
            "enabled": self.enabled,
            "connections": [http, *(c.summary() for c in connections)],
            "rollouts": rollouts,
            "live_rollouts": sum(1 for r in rollouts if r["status"] not in FINISHED),
            "paused_rollouts": sum(1 for r in rollouts if r["status"] == "paused"),
            "watchers": len(self.watchers),
            "max_watchers": self.max_watchers,
        }
