"""WebSocket compression is a setting: off by default, negotiated when turned on.

The `websockets` library offers permessage-deflate at its defaults (the
official SDK turns that off unless asked); the server accepts it only with
``--ws-compression on``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.sync.client import connect

from protocol import APPEND_SUBPROTOCOL
from tests.conftest import openai_client


def turn(url: str) -> tuple[str, str]:
    """One append-mode rollout with a default client: (extensions, final status)."""
    with connect(url, subprotocols=[APPEND_SUBPROTOCOL], open_timeout=10) as ws:
        extensions = ws.response.headers.get("Sec-WebSocket-Extensions") or ""
        ws.send(json.dumps({"type": "response.create", "input": "hello " * 200}))
        while True:
            event = json.loads(ws.recv(timeout=10))
            if event["type"] == "response.done":
                return extensions, event["response"]["status"]


def test_off_by_default_though_the_client_offers_it(server: Any) -> None:
    extensions, status = turn(server.url)
    assert "permessage-deflate" not in extensions
    assert status == "completed"


@pytest.mark.parametrize("on", [True, False])
def test_the_setting_decides(make_server: Any, on: bool) -> None:
    running = make_server(ws_compression=on)
    extensions, status = turn(running.url)
    assert ("permessage-deflate" in extensions) is on
    assert status == "completed"


@pytest.mark.parametrize(("offer", "on"), [(False, True), (True, True), (True, False)])
def test_the_official_sdk_offers_it_only_when_asked(
    make_server: Any, offer: bool, on: bool
) -> None:
    """``responses.connect()`` (openai 3.x) turns the ``websockets`` default off: it offers
    permessage-deflate only with ``websocket_connection_options={"compression": "deflate"}``
    (what ``longresponse bench`` does for ``ws-sdk+deflate``); the server's setting decides
    the rest."""
    running = make_server(ws_compression=on)
    options: dict[str, Any] = {"compression": "deflate"} if offer else {}
    with openai_client(running).responses.connect(websocket_connection_options=options) as conn:
        extensions = conn._connection.response.headers.get("Sec-WebSocket-Extensions") or ""
        conn.response.create(model="sim", input="hello")
        for event in conn:
            if event.type == "response.completed":
                break
    assert ("permessage-deflate" in extensions) is (offer and on)
    assert event.response.status == "completed"
