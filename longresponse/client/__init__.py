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

Reconnecting and resuming
-------------------------
:func:`resilient` yields a :class:`ResilientClient`: the same sends and reads
over as many connections as it takes. When the connection closes with a code
the official SDKs reconnect on (:data:`RETRYABLE_CLOSE_CODES`: 1001, 1005,
1006, 1011, 1012, 1013, 1015), or at the server's connection lifetime limit,
it reconnects with the SDKs' backoff (0.5 s doubling to 8 s, jitter x0.75 to
1.0, at most ``max_retries`` attempts in a row) and sends
``response.resume`` for every response it created or took up that has not
ended. What the reader sees:

- ``response.resumed`` in the event stream, for each response taken up: the
  Response as its last checkpoint holds it. Events of that response numbered
  from the resumed event's ``sequence_number`` on that came before it are
  void: the turn they belonged to runs again, with new item ids.
- The tool outputs already sent for calls the resumed response still waits
  for are sent again by the client (it keeps each output until the response
  takes it in or ends); outputs for calls no longer waited for are not.
  :meth:`~ResilientClient.until_done` stops at a ``response.resumed`` only
  when it waits for an output not sent yet (the ``response.done`` that asked
  for it was lost with the connection); :meth:`~ResilientClient.unanswered`
  names those calls.
- A response that cannot be taken up (created with ``store: false``, cut off
  before its first checkpoint, expired) comes back as an ``error`` naming it
  (``response_not_found``), and the client lets it go.
- Sends wait while the client reconnects; once it gives up (or the server
  closes with another code) reads and sends raise :class:`ConnectionClosedError`.
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
from .resilient import (
    RETRYABLE_CLOSE_CODES,
    ResilientClient,
    reconnect_delay,
    resilient,
)

__all__ = [
    "CLOSE_TIMEOUT",
    "MAX_QUEUED_EVENTS",
    "MAX_REJECT_BODY_BYTES",
    "RETRYABLE_CLOSE_CODES",
    "AppendClient",
    "ClientError",
    "ConnectionClosedError",
    "HandshakeError",
    "ResilientClient",
    "connect",
    "reconnect_delay",
    "resilient",
]
