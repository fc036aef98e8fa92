"""How a Response is served: :class:`Transport`, the one name for it in every layer.

``append`` (a WebSocket in append mode), ``ws`` (the shipped WebSocket shape)
or ``http`` (``POST /v1/responses``). The values are the labels ``/metrics``
and the usage ledger carry, byte for byte. :attr:`Transport.mode` is the
protocol's :class:`~protocol.Mode` the transport speaks: HTTP speaks the
shipped shape too, through a protocol ``Connection`` of its own.
"""

from __future__ import annotations

import enum

from protocol import Mode

__all__ = ["Transport"]


class Transport(enum.StrEnum):
    """How a Response is served; the value is its label on ``/metrics`` and in the ledger."""

    APPEND = "append"
    WS = "ws"
    HTTP = "http"

    @property
    def mode(self) -> Mode:
        """The protocol's mode: append mode, or the shipped shape (WebSocket and HTTP)."""
        return Mode.APPEND if self is Transport.APPEND else Mode.SHIPPED
