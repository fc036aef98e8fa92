"""Events queued together leave in one transport write, in order, each its own frame.

The outbox joins the frames of the events it finds queued into one write
(``LingeringWSProtocol.send_texts``, put in the scope by the seam); a server
without it sends them one by one. Either way the client reads every event, in
sequence, as a WebSocket message of its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.websockets.wsproto_impl import WSProtocol

from longresponse.client import connect
from longresponse.config import ServerConfig
from longresponse.serve.app import create_app
from longresponse.serve.ws.oversize import LingeringWSProtocol
from protocol.events import OutputTextDelta, ResponseDone
from tests.support.uvicorn_thread import start_in_thread

LONG_ANSWER = {"sim_output_tokens": "3000"}  # unthrottled: events pile up in the outbox


async def stream(url: str) -> list[Any]:
    """One long answer over the trio client; every event received."""
    async with connect(url) as client:
        await client.create(model="sim", input="talk", metadata=LONG_ANSWER)
        return await client.until_done()


def check_events(events: list[Any]) -> None:
    assert isinstance(events[-1], ResponseDone)
    assert events[-1].response.status == "completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert sum(isinstance(e, OutputTextDelta) for e in events) >= 3000


async def test_queued_events_share_a_write(
    make_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[int] = []
    send_texts = LingeringWSProtocol.send_texts

    async def counted(self: LingeringWSProtocol, texts: Sequence[str]) -> None:
        batches.append(len(texts))
        await send_texts(self, texts)

    monkeypatch.setattr(LingeringWSProtocol, "send_texts", counted)
    running = make_server(store="memory://")
    events = await stream(running.url)
    check_events(events)
    assert batches, "no write carried more than one event"
    assert min(batches) >= 2
    assert sum(batches) < len(events)  # lone events still go out by themselves
    assert running.last_session.outbox.send_texts is not None


@pytest.fixture
def plain_server() -> Iterator[str]:
    """A server on uvicorn's own wsproto protocol: no ``send_texts`` in the scope."""
    app = create_app(ServerConfig(port=0, store="memory://"))
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, ws="wsproto", lifespan="on", log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = start_in_thread(server, "the server")
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"ws://127.0.0.1:{port}/v1/responses"
    server.should_exit = True
    thread.join(timeout=10)


async def test_without_send_texts_events_go_one_by_one(
    plain_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sends: list[str] = []  # the ASGI messages the server sent, by type
    send = WSProtocol.send

    async def counted(self: WSProtocol, message: Any) -> None:
        sends.append(message["type"])
        await send(self, message)

    monkeypatch.setattr(WSProtocol, "send", counted)
    events = await stream(plain_server)
    check_events(events)
    assert sends.count("websocket.send") == len(events)  # one event per write


def _open_pair(extensions: list[Any] | None = None) -> Any:
    """A server-side wsproto connection, open, after a client's handshake."""
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Request

    client, server = WSConnection(ConnectionType.CLIENT), WSConnection(ConnectionType.SERVER)
    server.receive_data(client.send(Request(host="x", target="/", extensions=extensions or [])))
    list(server.events())
    client.receive_data(server.send(AcceptConnection(extensions=extensions or [])))
    return server


def test_plain_frames_are_byte_for_byte_wsproto_s() -> None:
    import wsproto.events

    from longresponse.serve.ws.oversize import plain_text_frames

    server = _open_pair()
    # Each length encoding: 7-bit, 16-bit (126..65535) and 64-bit, and the edges.
    texts = [b"", b"x" * 125, b"y" * 126, "é".encode() * 300, b"z" * 65535, b"w" * 65536]
    framed = plain_text_frames(server, texts)
    expected = b"".join(server.send(wsproto.events.Message(data=t.decode())) for t in texts)
    assert framed == expected


def test_wsproto_frames_what_an_extension_touches() -> None:
    from wsproto.extensions import PerMessageDeflate

    from longresponse.serve.ws.oversize import plain_text_frames

    assert plain_text_frames(_open_pair([PerMessageDeflate()]), [b"{}"]) is None
