"""Errors as the shipped API sends them, request ids, and the refusal log line.

- Every HTTP answer carries ``x-request-id`` (``req_…``, fresh per request):
  the official SDK's ``request_id`` is set, on success and on an error.
- The WebSocket handshake (101) carries one too; a WebSocket ``error`` frame
  carries ``status``, ``error.{type, code, message, param, headers}``
  (``headers["x-request-id"]``), ``sequence_number`` and, on a lane,
  ``stream_id``: the SDK's ``ResponseWsError`` reads every field.
- A refusal is logged once, naming its transport, status, code, param and
  request id (the same id the client got), and nothing of the body.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import httpx
import openai
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from longresponse.client import connect
from protocol.events import ErrorEvent, ResponseDone
from tests.conftest import openai_client

LOGGER = "longresponse.serve.errors"
REQUEST_ID = re.compile(r"^req_[0-9a-f]{32}$")
SECRET_MARKER = "body-text-never-logged"
TOOL = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_every_http_answer_carries_a_fresh_request_id(server: Any) -> None:
    client = openai_client(server)
    first = client.responses.with_raw_response.create(model="sim", input="hi")
    second = client.responses.with_raw_response.create(model="sim", input="hi")
    assert REQUEST_ID.match(first.request_id or ""), first.headers
    assert REQUEST_ID.match(second.request_id or "")
    assert first.request_id != second.request_id
    assert first.parse().status == "completed"
    with client.responses.with_streaming_response.create(
        model="sim", input="hi", stream=True
    ) as streamed:
        assert REQUEST_ID.match(streamed.request_id or "")
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="sim", input="hi", service_tier="turbo")  # type: ignore[arg-type]
    assert REQUEST_ID.match(refused.value.request_id or "")
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        for answer in (
            http.get("/healthz"),
            http.get("/v1/models"),
            http.get("/nowhere"),  # the gate's 404
            http.delete("/v1/models"),  # the gate's 405
        ):
            assert REQUEST_ID.match(answer.headers.get("x-request-id", "")), answer


def test_an_http_refusal_is_logged_with_code_param_and_request_id(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    body = {"model": "sim", "input": SECRET_MARKER, "include": ["reasoning.encrypted_content", 7]}
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        answer = http.post("/v1/responses", json=body)
        missing = http.get("/v1/responses/resp_nope")
    assert answer.status_code == 400
    ident = answer.headers["x-request-id"]
    lines = refusals(caplog)
    assert (
        f"refused POST /v1/responses 400 invalid_type param=include[1] request_id={ident}"
        in lines
    ), lines
    assert (
        "refused GET /v1/responses/resp_nope 404 response_not_found param=response_id "
        f"request_id={missing.headers['x-request-id']}"
    ) in lines
    assert all(SECRET_MARKER not in r.getMessage() for r in caplog.records)
    # One line per refusal.
    assert sum(ident in line for line in lines) == 1


def test_the_handshake_carries_a_request_id(server: Any) -> None:
    with ws_connect(server.url) as socket:
        assert socket.response is not None
        assert REQUEST_ID.match(socket.response.headers.get("x-request-id", ""))


def test_the_websocket_error_frame_is_the_shipped_one(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    client = openai_client(server)
    with client.responses.connect() as conn:
        conn.send_raw(
            json.dumps(
                {
                    "type": "response.create",
                    "model": "sim",
                    "input": SECRET_MARKER,
                    "stream_id": "lane-1",
                    "previous_response_id": "resp_nope",
                }
            )
        )
        event = conn.recv()
        raw = event.to_dict()
        conn.send_raw(json.dumps({"type": "response.create", "model": "sim", "top_p": 7}))
        default_lane = conn.recv().to_dict()
    assert event.type == "error"
    # The SDK's own model of the frame reads every field.
    assert event.status == 400
    assert event.error.type == "invalid_request_error"
    assert event.error.code == "previous_response_not_found"
    assert event.error.param == "previous_response_id"
    assert event.error.message == "Previous response with id 'resp_nope' not found."
    assert event.stream_id == "lane-1"
    assert event.sequence_number == 0
    assert event.error.headers is not None
    ident = event.error.headers["x-request-id"]
    assert REQUEST_ID.match(ident)
    assert set(raw) == {"type", "status", "error", "sequence_number", "stream_id"}
    assert set(raw["error"]) == {"type", "code", "message", "param", "headers"}
    # The default lane's error names no lane; each error has an id of its own.
    assert "stream_id" not in default_lane
    assert (default_lane["status"], default_lane["error"]["param"]) == (400, "top_p")
    other = default_lane["error"]["headers"]["x-request-id"]
    assert REQUEST_ID.match(other)
    assert other != ident
    lines = refusals(caplog)
    assert (
        "refused WebSocket /v1/responses 400 previous_response_not_found "
        f"param=previous_response_id request_id={ident} stream_id=lane-1"
    ) in lines, lines
    assert (
        f"refused WebSocket /v1/responses 400 invalid_value param=top_p request_id={other}"
        in lines
    )
    assert all(SECRET_MARKER not in r.getMessage() for r in caplog.records)


async def test_an_append_mode_error_carries_its_responses_next_sequence_number(
    server: Any,
) -> None:
    async with connect(server.url) as client:
        await client.create(
            model="sim", input="read it", tools=[TOOL], metadata={"sim_tool_calls": "1"}
        )
        events = await client.until_done()
        paused = events[-1]
        assert isinstance(paused, ResponseDone)
        assert paused.response.status == "requires_action"
        await client.send_raw(
            json.dumps(
                {
                    "type": "response.append",
                    "input": [{"type": "function_call_output", "call_id": "call_zz", "output": ""}],
                }
            )
        )
        error = await client.next_event()
    assert isinstance(error, ErrorEvent)
    assert error.error.code == "unknown_call_id"
    assert error.response_id == paused.response.id
    # Outside the response's stream: the next number, not used up.
    assert error.sequence_number == paused.sequence_number + 1
    assert isinstance(error.error.headers, dict)
    assert REQUEST_ID.match(error.error.headers["x-request-id"])


def test_an_upgrade_refusal_is_logged(
    make_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    keyed = make_server(api_keys=("right-key",))
    with httpx.Client(base_url=keyed.http_url, timeout=30) as http:
        answer = http.get("/v1/models", headers={"Authorization": "Bearer wrong"})
    assert answer.status_code == 401
    ident = answer.headers["x-request-id"]
    assert (
        f"refused GET /v1/models 401 invalid_api_key param=- request_id={ident}"
        in refusals(caplog)
    )
    with pytest.raises(InvalidStatus) as refused, ws_connect(
        keyed.url, additional_headers={"Authorization": "Bearer wrong"}
    ):
        pass
    response = refused.value.response
    assert response.status_code == 401
    ident = response.headers["x-request-id"]
    assert (
        f"refused WebSocket /v1/responses 401 invalid_api_key param=- request_id={ident}"
        in refusals(caplog)
    )


def test_a_client_that_hangs_up_mid_body_is_one_info_line(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A POST whose body stops halfway: no traceback, one line naming the
    method, path, bytes read and request id (it was 47 lines of
    ``ClientDisconnect`` traceback logged as an application error)."""
    import socket
    import time

    caplog.set_level(logging.INFO)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer test-key\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n" + b'{"model": "sim", "input": "' + b"x" * 300
        )
        time.sleep(0.2)  # the server reads the first half before the hang-up
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        lines = [r for r in caplog.records if "hung up mid-body" in r.getMessage()]
        if lines:
            break
        time.sleep(0.02)
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    (line,) = lines
    assert line.levelno == logging.INFO
    assert line.exc_info is None
    message = line.getMessage()
    assert "POST /v1/responses after 327 of 1000 bytes request_id=req_" in message
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
