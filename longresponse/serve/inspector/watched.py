"""The inspector's hook on a turn's sink: :class:`WatchedSink` notes each server event.

The inspector wraps the sink of every turn it watches
(:meth:`~longresponse.serve.inspector.observer.Inspector.watch`); each event
pushed goes to the sink, then to its rollout's
:meth:`~longresponse.serve.inspector.records.RolloutRecord.sent` with its
encoded size, read off the sink's queue counter.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol, cast

from protocol import ResponseTrack
from protocol.events import ServerEvent

from ...engine.stream import EventSink
from .records import RolloutRecord

__all__ = ["UnsizedWatchedSink", "WatchedSink"]


class _Sized(EventSink, Protocol):
    """A sink that counts the bytes waiting in its queue (the outbox, an SSE buffer)."""

    @property
    def queued_bytes(self) -> int: ...


class WatchedSink:
    """A turn's sink, noting each server event (and its encoded size) on the way.

    ``room`` and ``track`` are the sink's own (no layer in between); ``push``
    reads the sink's queue counter before and after, so an event's size
    costs two attribute reads. Sinks that keep no count (an HTTP JSON
    request's) are wrapped by :class:`UnsizedWatchedSink`.
    """

    room: Callable[[], Coroutine[Any, Any, None]]
    track: Callable[[str], ResponseTrack]

    def __init__(self, sink: EventSink, record: RolloutRecord) -> None:
        self.sink = sink
        self._sized = cast(_Sized, sink)  # (read only where it is one: see ``around``)
        self.record = record
        self.room = sink.room
        self.track = sink.track

    @staticmethod
    def around(sink: EventSink, record: RolloutRecord) -> WatchedSink:
        """The wrapper that fits ``sink``."""
        if hasattr(sink, "queued_bytes"):
            return WatchedSink(sink, record)
        return UnsizedWatchedSink(sink, record)

    def push(self, event: ServerEvent) -> None:
        sink = self._sized
        before = sink.queued_bytes
        sink.push(event)
        self.record.sent(event, sink.queued_bytes - before)

    def __getattr__(self, name: str) -> Any:  # e.g. the outbox's ``error``
        return getattr(self.sink, name)


class UnsizedWatchedSink(WatchedSink):
    """A :class:`WatchedSink` around a sink that encodes nothing (sizes are 0)."""

    def push(self, event: ServerEvent) -> None:
        self.sink.push(event)
        self.record.sent(event, 0)
