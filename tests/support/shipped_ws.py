"""The shipped (OpenAI) WebSocket shape, as the tests read a response from it.

- ``TERMINAL``: the event types that end one response on the socket.
- ``sdk_turn``: one response's events over the official SDK's connection.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TERMINAL", "sdk_turn"]

#: The event types after which a response sends nothing more.
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})


def sdk_turn(conn: Any) -> list[Any]:
    """One response's events over the SDK's socket ``conn``, up to and including
    its terminal event; ``AssertionError`` if the socket closes before it."""
    events = []
    for event in conn:
        events.append(event)
        if event.type in TERMINAL:
            return events
    raise AssertionError("the socket closed mid-response")
