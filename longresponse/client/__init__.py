"""The trio client: a thin pump around the sans-IO :class:`protocol.Connection`.

Theory of operation
-------------------
:func:`connect` opens a TCP stream, performs the WebSocket upgrade with
wsproto (offering the ``longresponse.append.v1`` subprotocol) and yields an
:class:`AppendClient`. The client owns one task, the receive loop, which runs
in a nursery held by :func:`connect` for the life of the connection:

- bytes from the socket go into wsproto; text fragments are joined into whole
  messages (at most ``max_message_bytes``, else the connection fails with
  1009) and fed to ``connection.receive_message``; the checked events go into
  a bounded channel that :meth:`AppendClient.next_event` reads. When the
  channel is full the loop stops reading the socket, so a slow consumer slows
  the server down instead of growing memory.
- pings are answered; a close frame is answered and ends the loop; the end
  of the TCP stream without a close frame is close code 1006 (RFC 6455
  §7.1.5).

A message that breaks the protocol (invalid JSON, a ``sequence_number`` out of
order, an event for an unknown response) does not stop the loop. The sans-IO
connection rejects it and stays unchanged, and the
:class:`protocol.RemoteProtocolError` takes that message's place in the event
stream: :meth:`AppendClient.next_event` raises it once, in order, and the next
call returns the next event. ``error`` events are not exceptions: they are
the server's answers to bad requests and come back as events.

Sends go through ``connection.send`` under one lock, so the sans-IO state sees
events in the order they go on the wire, and a send the protocol forbids
raises :class:`protocol.LocalProtocolError` before anything leaves.
"""

from .connection import (
    CLOSE_TIMEOUT,
    MAX_QUEUED_EVENTS,
    MAX_REJECT_BODY_BYTES,
    AppendClient,
    ClientError,
    ConnectionClosedError,
    HandshakeError,
)
from .opening import connect

__all__ = [
    "CLOSE_TIMEOUT",
    "MAX_QUEUED_EVENTS",
    "MAX_REJECT_BODY_BYTES",
    "AppendClient",
    "ClientError",
    "ConnectionClosedError",
    "HandshakeError",
    "connect",
]
