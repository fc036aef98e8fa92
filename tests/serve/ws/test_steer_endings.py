"""What becomes of an accepted ``response.steer`` that never reaches a successor.

A steer is answered once: committed by its successor's ``response.created``,
or handed back with ``response.steer.failed`` (its id, the target, its
input). Here, against a real server in this process and the official SDK's
connection (every frame validated against the SDK's own event union):

- a restart (what SIGTERM does: ``GracefulServer`` drains) hands back every
  steer still pending before the 1012, and a steered response that is still
  running gets its successor first; the lifetime limit's close hands back too;
- a steered response that fails hands its steer back;
- a connection the client closes leaves nobody to hand it to: the server logs
  the steer (id and size, never the text) and counts it on ``/metrics``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pydantic
import pytest
import websockets
from openai.types.responses.responses_server_event import ResponsesServerEvent

from longresponse.storage.backends import StoreError
from tests.conftest import openai_client
from tests.support.shipped_ws import TERMINAL
from tests.support.waiting import wait_for

STRICT = pydantic.TypeAdapter(ResponsesServerEvent)
READ_FILE = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
#: A function call written at 4 tokens a second: no safe point (a steer is
#: held past it) for a second or more once its item is added.
SLOW_CALL = {"sim_tool_calls": "1", "sim_tokens_per_second": "4"}
#: Sampling starts after 400 ms: a steer sent on ``response.created`` arrives first.
SLOW_START = {"sim_tool_calls": "0", "sim_ttft_ms": "400"}
STEER = "make it about the sea"


def recv(conn: Any) -> Any:
    return STRICT.validate_json(conn.recv_bytes())


def until(conn: Any, *types: str) -> list[Any]:
    """Events up to and including the first of ``types``."""
    events = []
    while True:
        events.append(recv(conn))
        if events[-1].type in types:
            return events


def until_closed(conn: Any) -> tuple[list[Any], Any]:
    """Every event up to the server's close, and the close frame it sent."""
    events = []
    while True:
        try:
            raw = conn.recv_bytes()
        except websockets.ConnectionClosed as closed:
            return events, closed.rcvd
        events.append(STRICT.validate_json(raw))


@pytest.fixture
def connect() -> Iterator[Any]:
    """``connect(server)``: the SDK's connection to it, closed after the test."""
    opened: list[Any] = []

    def open_(server: Any) -> Any:
        manager = openai_client(server).responses.connect()
        opened.append(manager)
        return manager.__enter__()

    yield open_
    for manager in opened:
        manager.__exit__(None, None, None)


def steer_a_call(conn: Any) -> tuple[str, str]:
    """A response writing a slow function call, steered while it writes it: its id
    and the steer's."""
    conn.response.create(
        model="sim", input="read it", tools=[READ_FILE], store=False, metadata=SLOW_CALL
    )
    created = until(conn, "response.created")[-1].response
    until(conn, "response.output_item.added")
    conn.response.steer(previous_response_id=created.id, input=STEER)
    accepted = until(conn, "response.steer.accepted")[-1]
    return str(created.id), str(accepted.steer.id)


def assert_handed_back(failed: Any, target: str, steer_id: str | None, code: str) -> None:
    assert failed.type == "response.steer.failed"
    assert failed.steer.id.startswith("steer_")  # it had been accepted
    if steer_id is not None:
        assert failed.steer.id == steer_id
    assert (failed.steer.previous_response_id, failed.steer.input) == (target, STEER)
    assert (failed.error.type, failed.error.code) == ("invalid_request_error", code)


def test_a_restart_hands_back_a_held_steer_before_its_1012(make_server: Any, connect: Any) -> None:
    """The steered response stopped for tool output: its steer waits for the
    client's next create. A restart does not wait for that: the steer comes
    back, then the 1012."""
    server = make_server(graceful=True, shutdown_drain_timeout=30)
    conn = connect(server)
    target, steer_id = steer_a_call(conn)
    events = until(conn, "response.steer.pending")
    assert events[-2].type == "response.completed"  # the call is out, unanswered
    server.stop(wait=False)  # uvicorn's should_exit, as on SIGTERM
    events, close = until_closed(conn)
    assert [e.type for e in events] == ["response.steer.failed"]
    assert_handed_back(events[0], target, steer_id, "successor_creation_failed")
    assert "server is restarting" in events[0].error.message
    assert "not delivered" in events[0].error.message
    assert (close.code, close.reason) == (1012, "service restart")


def test_a_restart_that_cuts_a_turn_off_hands_its_steer_back_first(
    make_server: Any, connect: Any
) -> None:
    """The drain timeout runs out while the steered response still writes its
    call: it is cut off, and its steer comes back before the 1012."""
    server = make_server(graceful=True, shutdown_drain_timeout=0.3)
    conn = connect(server)
    target, steer_id = steer_a_call(conn)
    server.stop(wait=False)
    events, close = until_closed(conn)
    assert not [e.type for e in events if e.type in TERMINAL]  # cut off, no end
    assert_handed_back(events[-1], target, steer_id, "successor_creation_failed")
    assert "server is restarting" in events[-1].error.message
    assert (close.code, close.reason) == (1012, "service restart")  # the session's own close


def test_a_restart_lets_a_steered_response_run_its_successor_first(
    make_server: Any, connect: Any
) -> None:
    """A steer accepted while its response runs is part of the running turn: the
    drain waits for the successor, which reads it; nothing is handed back."""
    server = make_server(graceful=True, shutdown_drain_timeout=30)
    conn = connect(server)
    conn.response.create(model="sim", input="write a poem", store=False, metadata=SLOW_START)
    created = until(conn, "response.created")[-1].response
    conn.response.steer(previous_response_id=created.id, input=STEER)
    until(conn, "response.steer.accepted")
    server.stop(wait=False)
    events, close = until_closed(conn)
    kinds = [e.type for e in events]
    assert "response.steer.failed" not in kinds
    assert kinds.count("response.created") == 1  # the successor
    assert events[kinds.index("response.created")].response.previous_response_id == created.id
    assert events[-1].type == "response.completed"
    assert f"«{STEER}»" in events[-1].response.output[-1].content[0].text
    assert close.code == 1012


def test_the_connection_lifetime_limit_hands_a_steer_back_too(
    make_server: Any, connect: Any
) -> None:
    """Any close of the server's own hands back first: here the lifetime limit's."""
    server = make_server(connection_lifetime=1.5)
    conn = connect(server)
    target, steer_id = steer_a_call(conn)
    events, close = until_closed(conn)
    error, failed = [e for e in events if e.type in {"error", "response.steer.failed"}]
    assert error.error.code == "websocket_connection_limit_reached"
    assert_handed_back(failed, target, steer_id, "successor_creation_failed")
    assert "limit" in failed.error.message
    assert (close.code, close.reason) == (1000, "connection limit reached")


def test_a_steered_response_that_fails_hands_its_steer_back(
    make_server: Any, connect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steered response ends ``failed`` (its ``store=true`` write refused):
    no successor, and the steer comes back ``response_not_active``."""
    server = make_server()
    persistence = server.app.parts.persistence
    assert persistence is not None

    async def refuse(*_: object, **__: object) -> None:
        raise StoreError("the disk is full")

    monkeypatch.setattr(persistence.store, "put", refuse)
    conn = connect(server)
    conn.response.create(model="sim", input="write a poem", store=True, metadata=SLOW_START)
    target = until(conn, "response.created")[-1].response.id
    conn.response.steer(previous_response_id=target, input=STEER)
    events = until(conn, *TERMINAL)
    assert "response.steer.accepted" in [e.type for e in events]
    assert events[-1].type == "response.failed"
    failed = recv(conn)
    assert_handed_back(failed, target, None, "response_not_active")
    assert "failed" in failed.error.message
    # Nothing else was waiting: the connection goes on.
    monkeypatch.undo()
    conn.response.create(model="sim", input="again", store=False)
    assert until(conn, *TERMINAL)[-1].type == "response.completed"


def test_a_steer_dropped_with_its_connection_is_logged_and_counted(
    make_server: Any, connect: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The client closes while its steer waits: nobody can be told. One INFO
    line names the steer and its size (never its text), and
    ``longresponse_steers_dropped_total{reason="connection_closed"}`` counts it."""
    caplog.set_level(logging.INFO, logger="longresponse.serve.ws.steering")
    server = make_server()
    conn = connect(server)
    target, steer_id = steer_a_call(conn)
    conn.close()
    wait_for(lambda: server.live_sessions == 0, "the session to end")
    lines = [r for r in caplog.records if r.name == "longresponse.serve.ws.steering"]
    assert len(lines) == 1
    assert lines[0].levelno == logging.INFO
    line = lines[0].getMessage()
    assert "connection_closed" in line
    assert f"{steer_id} for {target} ({len(STEER) + 2} bytes)" in line  # its JSON string
    assert STEER not in line
    page = httpx.get(f"{server.http_url}/metrics", timeout=10).text
    assert 'longresponse_steers_dropped_total{reason="connection_closed"} 1.0' in page
    assert 'longresponse_steers_dropped_total{reason="slow_reader"} 0.0' in page
