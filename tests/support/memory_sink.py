"""An in-memory event sink: a server ``Connection`` of the protocol core and the events it took.

What the engine's tests give a Rollout instead of a socket: every event is
checked by the core (its ``sequence_number``, the response's transitions,
its pending calls) and kept in :attr:`MemorySink.events`, nothing encoded.
A client's event the serve layer would have received goes to
:meth:`MemorySink.receive` (the core records an append's answered calls
before the rollout is given its items, as the session does).
"""

from __future__ import annotations

from protocol import Framing, Mode, ResponseTrack, Role, wire_type
from protocol.connection import Connection
from protocol.events import ClientEvent, ServerEvent

__all__ = ["MemorySink"]


class MemorySink:
    """An :class:`~longresponse.engine.stream.EventSink` that keeps what it is given."""

    def __init__(self, mode: Mode = Mode.APPEND) -> None:
        self.connection = Connection(Role.SERVER, mode, framing=Framing.NONE)
        self.events: list[ServerEvent] = []

    async def room(self) -> None:
        return None

    def push(self, event: ServerEvent) -> None:
        self.connection.send(event)
        self.events.append(event)

    def track(self, response_id: str) -> ResponseTrack:
        track = self.connection.response(response_id)
        assert track is not None  # asked only after response.created
        return track

    def receive(self, event: ClientEvent) -> None:
        """A client's event, as the core records it on receipt."""
        self.connection.receive_event(event)

    def types(self) -> list[str]:
        """The ``type`` of every event taken, in order."""
        return [wire_type(event) for event in self.events]
