"""A frame past uvicorn's ``ws_max_size``: close 1009, and read on until the peer answers.

Theory of operation
-------------------
Messages up to ``max_message_bytes`` reach the application, which answers one
too large with an error event (the socket stays usable); uvicorn refuses
what is past ``ws_max_size`` (twice that) itself, before buffering more. Its
wsproto protocol then writes the close frame (1009, Message Too Big) and
closes the TCP connection at once, while the client is still sending the
rest of its frame. A socket closed with unread bytes in its receive buffer
sends a reset, not a FIN, and a reset makes the client's kernel drop what it
had not read yet, the 1009 close frame included: under load the client saw a
bare "connection reset".

:class:`LingeringWSProtocol` changes only that refusal: it drops what it had
buffered of the message, writes the 1009 close frame, and keeps reading,
discarding every frame, until the peer answers the close (the closing
handshake, RFC 6455 §7.1.1) or uvicorn's close timeout runs out; then it
closes the transport. Memory stays bounded (wsproto hands a frame over in
pieces; a closing protocol keeps none of them).

It also writes several text messages at once (:meth:`LingeringWSProtocol.send_texts`,
put in the scope by ``longresponse.serve.seam``): the frames of events already
queued go out in one transport write, one system call, instead of one each.
When no extension was negotiated (no permessage-deflate) it frames them
itself (:func:`plain_text_frames`: a server's text frame is a two- to
ten-byte header and the payload, unmasked), byte for byte what wsproto
writes, at a fifth of its cost per frame; with an extension, wsproto frames
them.

Neither is a public API: :meth:`LingeringWSProtocol.handle_message` copies
uvicorn's ``WSProtocol.handle_message`` but for the refusal, and
:func:`plain_text_frames` reads wsproto's private frame layer
(``_proto``, ``_outbound_opcode``). ``pyproject.toml`` bounds both packages
to the versions checked, and ``tests/serve/ws/test_oversize.py`` fails when
the copied source (by its digest) or the attributes read change.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Final

import wsproto.events
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.wsproto_impl import FrameTooLargeError, WSProtocol
from wsproto import WSConnection
from wsproto.connection import ConnectionState
from wsproto.utilities import LocalProtocolError

__all__ = ["LingeringWSProtocol", "plain_text_frames"]

_FIN_TEXT: Final = 0x81  # FIN, no RSV bits, opcode 1 (text)
_LENGTH_16: Final = struct.Struct("!BBH")
_LENGTH_64: Final = struct.Struct("!BBQ")


def plain_text_frames(conn: WSConnection, texts: Sequence[bytes]) -> bytes | None:
    """The server's frames of ``texts`` (UTF-8), one text message each, as wsproto
    would write them, or ``None`` where wsproto must (not open, an extension
    negotiated, or a message of its own half sent)."""
    connection = conn.connection
    if connection is None or connection.state is not ConnectionState.OPEN:
        return None
    frames = connection._proto  # wsproto's frame layer: its extensions and message state
    if frames.extensions or frames._outbound_opcode is not None or frames.client:
        return None
    parts: list[bytes] = []
    for data in texts:
        size = len(data)
        if size <= 125:
            parts.append(bytes((_FIN_TEXT, size)))
        elif size <= 0xFFFF:
            parts.append(_LENGTH_16.pack(_FIN_TEXT, 126, size))
        else:
            parts.append(_LENGTH_64.pack(_FIN_TEXT, 127, size))
        parts.append(data)
    return b"".join(parts)


class LingeringWSProtocol(WSProtocol):
    """uvicorn's wsproto protocol, with a 1009 that reaches the client."""

    def handle_message(self, event: Any) -> None:
        # As uvicorn's own, but for the refusal.
        try:
            self.buffer.extend(event)
        except FrameTooLargeError:
            self.refuse_oversize()
            return
        if event.message_finished:
            self.queue.put_nowait(self.buffer.to_message())
            self.buffer.clear()
            if not self.read_paused:
                self.read_paused = True
                self.transport.pause_reading()

    async def send_texts(self, texts: Sequence[bytes]) -> None:
        """Send ``texts`` (UTF-8) as text messages, their frames in one transport write.

        As ``send`` does for one ``websocket.send`` on an open connection:
        waits while the transport is paused for writing, raises
        ``ClientDisconnected`` once the peer is gone. Not for the handshake
        or after a close (raises ``RuntimeError``).
        """
        await self.writable.wait()
        if self.disconnected:
            raise ClientDisconnected()
        if not self.handshake_complete or self.close_sent or self.response_started:
            raise RuntimeError("send_texts: the WebSocket is not open")
        try:
            output = plain_text_frames(self.conn, texts)
            if output is None:
                output = b"".join(
                    self.conn.send(wsproto.events.Message(data=text.decode())) for text in texts
                )
        except LocalProtocolError as exc:
            raise ClientDisconnected from exc
        if not self.transport.is_closing():
            self.transport.write(output)

    def refuse_oversize(self) -> None:
        """Close 1009 and read on (discarding) until the peer answers the close."""
        self.buffer.clear()
        self.close_sent = True  # from now on handle_events ignores every message
        reason = f"Message exceeds the maximum size ({self.config.ws_max_size} bytes)"
        self.queue.put_nowait({"type": "websocket.disconnect", "code": 1009, "reason": reason})
        if self.transport.is_closing():
            return
        close = wsproto.events.CloseConnection(code=1009, reason=reason)
        self.transport.write(self.conn.send(close))
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        self.close_timer = self.loop.call_later(self.close_timeout, self.transport.close)
