"""The inspector keeps tenants apart, keeps no create's body, and bounds client strings.

Two keys (``sk-a``, ``sk-b``) and the operator key (``sk-op``): each key reads
its own connections and rollouts only, over the state, a rollout, its trace and
the live feed; the operator reads everyone's; with no keys, everyone reads
everything. ``/metrics`` is the operator's.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import httpx
from websockets.sync.client import connect as ws_connect

from longresponse.serve.gate import redact_query_key
from longresponse.serve.inspector.records import MAX_CLIENT_STRING, MAX_LISTED, listed
from longresponse.storage.keys import ApiKeys

KEYS = ("sk-a", "sk-b")
OPERATOR = "sk-op"


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def create(http: httpx.Client, key: str) -> str:
    answer = http.post(
        "/v1/responses", json={"model": "sim", "input": f"hello from {key}"}, headers=bearer(key)
    )
    assert answer.status_code == 200, answer.text
    rid: str = answer.json()["id"]
    return rid


def shipped_create(server: Any, key: str) -> str:
    """One shipped-shape WebSocket create of ``key``'s, run to its end; its id."""
    with ws_connect(server.url, additional_headers=bearer(key)) as socket:
        socket.send(json.dumps({"type": "response.create", "model": "sim", "input": "hi"}))
        while True:
            event = json.loads(socket.recv(timeout=10))
            if event["type"] == "response.completed":
                rid: str = event["response"]["id"]
                return rid


def messages(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    kind = None
    for line in lines:
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            yield kind or "", json.loads(line[len("data: ") :])


def shown_ids(state: dict[str, Any]) -> set[str]:
    return {r["id"] for r in state["rollouts"]}


def test_each_key_sees_only_its_own_and_the_operator_sees_all(make_server: Any) -> None:
    server = make_server(api_keys=KEYS, operator_key=OPERATOR)
    with httpx.Client(base_url=server.http_url, timeout=10) as http:
        a = create(http, "sk-a")
        b = create(http, "sk-b")
        a_ws = shipped_create(server, "sk-a")
        for key, own, other in (("sk-a", {a, a_ws}, b), ("sk-b", {b}, a)):
            state = http.get("/inspect/api/state", headers=bearer(key)).json()
            assert shown_ids(state) == own
            assert other not in json.dumps(state)
            assert state["server"]["live_rollouts"] == 0
            for path in (f"/inspect/api/rollouts/{other}", f"/inspect/api/rollouts/{other}/trace"):
                hidden = http.get(path, headers=bearer(key))
                assert hidden.status_code == 404, path
                assert hidden.json()["error"]["code"] == "not_found"
                assert other not in hidden.text.replace(f"{other!r}", "")
            mine = next(iter(own))
            assert http.get(f"/inspect/api/rollouts/{mine}", headers=bearer(key)).status_code == 200
            trace = http.get(f"/inspect/api/rollouts/{mine}/trace", headers=bearer(key))
            assert trace.status_code == 200
        # The shared ``http`` row counts a tenant's own HTTP bytes only.
        rows = {
            key: http.get("/inspect/api/state", headers=bearer(key)).json()["connections"]
            for key in (*KEYS, OPERATOR)
        }
        assert [c["id"] for c in rows["sk-b"]] == ["http"]  # a's WebSocket is not b's
        assert {c["id"] for c in rows["sk-a"]} == {c["id"] for c in rows[OPERATOR]}
        assert 0 < rows["sk-b"][0]["bytes_in"] < rows[OPERATOR][0]["bytes_in"]
        everything = http.get("/inspect/api/state", headers=bearer(OPERATOR)).json()
        assert shown_ids(everything) == {a, b, a_ws}
        assert http.get(f"/inspect/api/rollouts/{b}?key={OPERATOR}").status_code == 200


def test_the_feed_shows_a_key_its_own_events_only(make_server: Any) -> None:
    server = make_server(api_keys=KEYS, operator_key=OPERATOR)
    with (
        httpx.Client(base_url=server.http_url, timeout=10) as http,
        http.stream("GET", "/inspect/api/feed?key=sk-b") as feed_b,
        http.stream("GET", "/inspect/api/feed", headers=bearer(OPERATOR)) as feed_op,
    ):
        b_lines, op_lines = messages(feed_b.iter_lines()), messages(feed_op.iter_lines())
        assert next(b_lines)[0] == next(op_lines)[0] == "state"
        a = create(http, "sk-a")
        b = create(http, "sk-b")  # published after all of a's: b's feed has read past a's
        seen_by_b = []
        for kind, data in b_lines:
            seen_by_b.append((kind, data))
            if kind == "rollout" and data["id"] == b and data["status"] == "completed":
                break
        assert a not in json.dumps(seen_by_b)
        assert any(kind == "event" for kind, _ in seen_by_b)
        seen_by_op = ""
        for kind, data in op_lines:
            seen_by_op += json.dumps(data)
            if kind == "rollout" and data["id"] == b and data["status"] == "completed":
                break
        assert a in seen_by_op


def test_without_keys_everyone_sees_everything(make_server: Any) -> None:
    server = make_server()
    with httpx.Client(base_url=server.http_url, timeout=10) as http:
        ids = {create(http, "anyone"), create(http, "someone")}
        assert shown_ids(http.get("/inspect/api/state").json()) == ids
        assert http.get("/metrics").status_code == 200


def test_metrics_are_the_operators(make_server: Any) -> None:
    server = make_server(api_keys=KEYS, operator_key=OPERATOR)
    with httpx.Client(base_url=server.http_url, timeout=10) as http:
        refused = http.get("/metrics", headers=bearer("sk-a"))
        assert refused.status_code == 403
        assert refused.json()["error"] == {
            "message": refused.json()["error"]["message"],
            "type": "invalid_request_error",
            "param": None,
            "code": "operator_key_required",
        }
        assert http.get("/metrics").status_code == 401
        assert http.get("/metrics", headers=bearer(OPERATOR)).status_code == 200
    # Keys without an operator key: nobody reads every tenant's counters.
    keyed = make_server(api_keys=KEYS)
    with httpx.Client(base_url=keyed.http_url, timeout=10) as http:
        assert http.get("/metrics", headers=bearer("sk-a")).status_code == 403


def test_the_operator_key_comes_from_the_environment_too() -> None:
    keys = ApiKeys.from_env(["sk-a"], {"LONGRESPONSE_OPERATOR_KEY": " sk-op "})
    assert keys.viewer(keys.owner("Bearer sk-op")) is None
    assert keys.viewer(keys.owner("Bearer sk-a")) == keys.owner("Bearer sk-a")
    assert ApiKeys().viewer(ApiKeys().owner(None)) is None  # keys off: all
    assert "sk-op" not in repr(keys.__dict__.get("operator"))


def test_a_percent_encoded_query_key_is_the_key_itself(make_server: Any) -> None:
    server = make_server(api_keys=KEYS, operator_key=OPERATOR)
    with httpx.Client(base_url=server.http_url, timeout=10) as http:
        a, b = create(http, "sk-a"), create(http, "sk-b")
        # ``%6Bey`` and ``k%65y`` are ``key``, the value decoded too: each is a's key
        # and shows what a's key shows, never more.
        for query in ("%6Bey=sk-a", "k%65y=sk-a", "key=sk%2Da"):
            state = http.get(f"/inspect/api/state?{query}")
            assert state.status_code == 200, query
            assert shown_ids(state.json()) == {a}, query
        for query in ("%256Bey=sk-a", "KEY=sk-a", "k%65y=sk-wrong", "%6Bey=", "keys=sk-a"):
            assert http.get(f"/inspect/api/state?{query}").status_code == 401, query
        assert b not in http.get("/inspect/api/state?%6Bey=sk-a").text


def test_the_access_log_redacts_every_spelling_of_key() -> None:
    for raw in (
        "/inspect/api/state?%6Bey=sk-a",
        "/inspect/api/state?k%65y=sk-a&x=1",
        "/inspect/api/state?x=1&%6B%65%79=sk-a",
        "/inspect/api/state?%256Bey=sk-a",
        "/inspect/api/state?KEY=sk-a",
        "/inspect?key=sk-a",
    ):
        redacted = redact_query_key(raw)
        assert "sk-a" not in redacted, raw
        assert "=[redacted]" in redacted
    assert redact_query_key("/inspect?x=1&monkey=2") == "/inspect?x=1&monkey=2"


def test_refused_websocket_creates_keep_no_body(make_server: Any) -> None:
    server = make_server()
    inspector = server.app.parts.inspector
    body = {
        "type": "response.create",
        "model": "sim",
        "input": "x" * 1_000_000,
        "previous_response_id": "resp_missing",
    }
    encoded = json.dumps(body)

    def refused_creates(count: int) -> None:
        with ws_connect(server.url, max_size=None) as socket:
            shipped_create_on(socket)  # a rollout record points at this connection
            for _ in range(count):
                socket.send(encoded)
                event = json.loads(socket.recv(timeout=10))
                assert event["type"] == "error"
                assert event["error"]["code"] == "previous_response_not_found"

    def server_closed_them() -> None:
        """The server has ended every connection (it may see a close after the
        client has left)."""
        deadline = time.monotonic() + 10
        while inspector.connections:
            assert time.monotonic() < deadline, "the server did not end the connections"
            time.sleep(0.01)

    refused_creates(1)  # warm
    server_closed_them()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            refused_creates(4)
        server_closed_them()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # 12 refused bodies of 1 MB each: none kept (the old path kept every one).
    assert kept < 1_000_000, kept  # (before: 12.1 MB)
    records = {r.connection for r in inspector.rollouts.values()}
    assert all(not c.creates for c in records)


def shipped_create_on(socket: Any) -> None:
    socket.send(json.dumps({"type": "response.create", "model": "sim", "input": "hi"}))
    while json.loads(socket.recv(timeout=10))["type"] != "response.completed":
        pass


def test_a_client_string_is_kept_bounded(make_server: Any) -> None:
    server = make_server()
    long_id = "resp_" + "y" * 200_000
    with ws_connect(server.url, subprotocols=["longresponse.append.v1"]) as socket:
        assert socket.subprotocol is not None
        socket.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": "sim",
                    "input": "hi",
                    "previous_response_id": long_id,
                }
            )
        )
        while json.loads(socket.recv(timeout=10))["type"] != "response.done":
            pass
    with httpx.Client(base_url=server.http_url, timeout=10) as http:
        (rollout,) = http.get("/inspect/api/state").json()["rollouts"]
        detail = http.get(f"/inspect/api/rollouts/{rollout['id']}").json()
    (kept,) = [
        e["detail"]["previous_response_id"]
        for e in detail["events"]
        if e["type"] == "response.create"
    ]
    assert kept.startswith(long_id[:MAX_CLIENT_STRING])
    assert kept.endswith(f"[+{len(long_id) - MAX_CLIENT_STRING} chars]")
    assert len(kept) < MAX_CLIENT_STRING + 32


def test_a_list_the_client_sizes_is_kept_bounded() -> None:
    kept = listed(f"call_{i}_" + "z" * 1000 for i in range(1000))
    assert len(kept) == MAX_LISTED + 1
    assert kept[-1] == f"…[+{1000 - MAX_LISTED} more]"
    assert all(len(k or "") < MAX_CLIENT_STRING + 32 for k in kept)
    assert listed(["a", None]) == ["a", None]
