"""The limits a rollout works within: :class:`EngineLimits`, the engine's own settings.

The engine reads four of the server's settings and nothing else of them. The
serve layer fills this one small frozen type from its configuration where it
starts turns (``serve/turns.py``), so the engine never sees the whole
``ServerConfig``. The defaults are the server's, but for the keepalive: a
rollout made without limits never sends one.
"""

from __future__ import annotations

import dataclasses

from ..config import MAX_RESPONSE_EVENTS, MAX_RESPONSE_OUTPUT_TOKENS, PAUSE_TIMEOUT

__all__ = ["EngineLimits"]


@dataclasses.dataclass(frozen=True, slots=True)
class EngineLimits:
    """What bounds one rollout: how long it pauses, and how much one Response may hold."""

    #: Seconds a paused rollout waits for its tool outputs before it ends
    #: ``incomplete`` with reason ``pause_timeout``.
    pause_timeout: float = PAUSE_TIMEOUT
    #: Events one Response may send (then it ends ``incomplete``, ``max_events``).
    max_events: int = MAX_RESPONSE_EVENTS
    #: Output tokens one Response may write, whatever the request asks.
    max_output_tokens: int = MAX_RESPONSE_OUTPUT_TOKENS
    #: Seconds the model may stay silent before a ``keepalive`` event (0: never).
    keepalive_interval: float = 0.0
