"""Raw WebSocket peers for tests: a wsproto handshake on a plain socket.

For the tests that must misbehave as a client (never read, reset the TCP
connection, send frames the trio client would refuse) and watch the
server's state from outside its thread (``tests.support.waiting``).
"""

from __future__ import annotations

import socket

import wsproto
import wsproto.events as ws


def handshake(
    port: int,
    *,
    rcvbuf: int | None = None,
    append: bool = True,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> tuple[socket.socket, wsproto.WSConnection]:
    """Open a raw socket and complete the upgrade with wsproto (the caller closes it);
    ``headers`` go on the upgrade request."""
    sock = socket.socket()
    sock.settimeout(10)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    sock.sendall(
        conn.send(
            ws.Request(
                host="127.0.0.1",
                target="/v1/responses",
                subprotocols=["longresponse.append.v1"] if append else [],
                extra_headers=headers or [],
            )
        )
    )
    while True:
        conn.receive_data(sock.recv(65536))
        for event in conn.events():
            if isinstance(event, ws.AcceptConnection):
                return sock, conn
            raise AssertionError(f"handshake failed: {event!r}")
