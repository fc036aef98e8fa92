"""WebSocket compression is a setting: off by default, negotiated when turned on.

The `websockets` library (and so the official SDK) offers permessage-deflate
at its defaults; the server accepts it only with ``--ws-compression on``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.sync.client import connect

from protocol import APPEND_SUBPROTOCOL


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
