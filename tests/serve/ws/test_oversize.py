"""The contract ``longresponse/serve/ws/oversize.py`` keeps with uvicorn and wsproto.

:class:`LingeringWSProtocol` overrides uvicorn's ``WSProtocol.handle_message``
(a copy of it but for the refusal past ``ws_max_size``) and relies on
``handle_events`` ignoring every message once ``close_sent`` is set;
:func:`plain_text_frames` reads wsproto's private frame layer
(``Connection._proto``: ``extensions``, ``_outbound_opcode``, ``client``).
Neither is a public API, so ``pyproject.toml`` bounds both dependencies to
the versions checked here, and these tests fail when what was copied or read
changes: read the new uvicorn source (or wsproto's ``frame_protocol.py``),
carry the change into ``oversize.py``, then record the new digest here and
move the bound.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import tomllib

import pytest
import wsproto.events
from packaging.requirements import Requirement
from uvicorn.protocols.websockets.wsproto_impl import WSProtocol
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Message, Request

from longresponse.serve.ws.oversize import plain_text_frames
from tests.support.paths import ROOT

#: sha256 of uvicorn 0.55.0's ``WSProtocol.handle_message`` source, which
#: ``LingeringWSProtocol.handle_message`` copies but for the refusal.
HANDLE_MESSAGE_SHA256 = "a79fcd6e5be6e7d0ebcafcef6137a5bd110f65099767bb9062aff32236ab5a41"
#: What ``refuse_oversize`` relies on in ``handle_events``: after ``close_sent``
#: every event but the peer's close is dropped.
CLOSE_SENT_SKIPS = """\
        for event in self.conn.events():
            if self.close_sent:
                if isinstance(event, events.CloseConnection):
                    self.handle_close(event)
                continue
"""


def _requirement(name: str) -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    found = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == name]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("name", ["uvicorn", "wsproto"])
def test_the_installed_version_is_within_the_bounds_checked_here(name: str) -> None:
    requirement = _requirement(name)
    assert any(spec.operator == "<" for spec in requirement.specifier), (
        f"{name} has no upper bound: oversize.py relies on its internals"
    )
    assert requirement.specifier.contains(importlib.metadata.version(name))


def test_uvicorn_handle_message_is_what_oversize_copied() -> None:
    source = inspect.getsource(WSProtocol.handle_message)
    assert hashlib.sha256(source.encode()).hexdigest() == HANDLE_MESSAGE_SHA256, (
        "uvicorn's WSProtocol.handle_message changed: carry the change into "
        "LingeringWSProtocol.handle_message, then record its new digest here"
    )


def test_uvicorn_ignores_messages_once_the_close_is_sent() -> None:
    assert CLOSE_SENT_SKIPS in inspect.getsource(WSProtocol.handle_events)


def _open_pair() -> tuple[WSConnection, WSConnection]:
    client, server = WSConnection(ConnectionType.CLIENT), WSConnection(ConnectionType.SERVER)
    server.receive_data(client.send(Request(host="localhost", target="/v1/responses")))
    assert isinstance(next(server.events()), Request)
    client.receive_data(server.send(AcceptConnection()))
    assert isinstance(next(client.events()), AcceptConnection)
    return client, server


def test_wsproto_frame_layer_has_what_plain_text_frames_reads() -> None:
    _, server = _open_pair()
    assert server.connection is not None
    frames = server.connection._proto
    assert frames.extensions == []
    assert frames._outbound_opcode is None
    assert frames.client is False


@pytest.mark.parametrize("size", [0, 125, 126, 0xFFFF, 0x10000])
def test_plain_text_frames_are_what_wsproto_writes(size: int) -> None:
    client, server = _open_pair()
    texts = [b"a" * size, "\u00e9".encode() * 3]
    framed = plain_text_frames(server, texts)
    assert framed == b"".join(server.send(Message(data=t.decode())) for t in texts)
    client.receive_data(framed)
    received = [e.data for e in client.events() if isinstance(e, wsproto.events.TextMessage)]
    assert "".join(received) == "".join(t.decode() for t in texts)


def test_a_message_half_sent_is_left_to_wsproto() -> None:
    _, server = _open_pair()
    server.send(Message(data="part", message_finished=False))
    assert plain_text_frames(server, [b"x"]) is None
