"""One API key's connections cannot take another's place (issue 28, item 8).

- ``--max-connections-per-key``: a key at its cap of open WebSockets has its
  next handshake refused with HTTP 429 and the shipped error envelope
  (``too_many_connections``), while another key connects and is served; a
  connection closed gives its place back.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from tests.conftest import openai_client
from tests.support.shipped_ws import TERMINAL, sdk_turn


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _answered(conn: Any) -> bool:
    """Whether a create on the shipped-shape socket ``conn`` completes."""
    conn.send(json.dumps({"type": "response.create", "model": "sim", "input": "hi"}))
    while (kind := json.loads(conn.recv(timeout=30))["type"]) not in TERMINAL:
        pass
    return kind == "response.completed"


def test_a_key_at_its_connection_cap_is_refused_while_another_connects(
    make_server: Any,
) -> None:
    server = make_server(api_keys=("key-a", "key-b"), max_connections_per_key=2)
    with contextlib.ExitStack() as held:
        key_a = [
            held.enter_context(ws_connect(server.url, additional_headers=_bearer("key-a")))
            for _ in range(2)
        ]
        with pytest.raises(InvalidStatus) as refused, ws_connect(
            server.url, additional_headers=_bearer("key-a")
        ):
            pass
        answer = refused.value.response
        assert answer.status_code == 429
        assert answer.headers["retry-after"] == "1"
        assert json.loads(answer.body or b"") == {
            "error": {
                "type": "rate_limit_error",
                "code": "too_many_connections",
                "message": "This API key has 2 WebSocket connections open, the most allowed "
                "(--max-connections-per-key). Close one and try again.",
                "param": None,
            }
        }
        # Another key connects and is served, over the official SDK.
        with openai_client(server, key="key-b").responses.connect() as conn:
            conn.response.create(model="sim", input="hello from b")
            assert sdk_turn(conn)[-1].type == "response.completed"
        # keyA's two are still open, and served.
        assert _answered(key_a[0])
        endpoint = server.app.parts.endpoint
        assert endpoint.open_per_key == {endpoint.keys.owner("Bearer key-a"): 2}
    # Closed, keyA's connections gave their places back.
    with ws_connect(server.url, additional_headers=_bearer("key-a")) as again:
        assert _answered(again)
    assert server.app.parts.endpoint.open_per_key == {}

