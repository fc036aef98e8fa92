"""``response.inject``, the multi-agent beta's append, against a real server.

The shipped shape is driven by the official SDK's beta client
(``client.beta.responses.connect`` with the beta header, then
``connection.response.inject``); every frame it gets is validated with
pydantic against the SDK's own ``BetaResponsesServerEvent`` union. Append
mode is driven by the project's trio client; bad frames go raw.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
import wsproto
import wsproto.events as ws
from openai.types.beta.beta_responses_server_event import BetaResponsesServerEvent

from longresponse.client import connect
from protocol.events import (
    ErrorEvent,
    ResponseDone,
    ResponseInjectCreated,
    ResponseInjectFailed,
    ResponseInProgress,
)
from protocol.items import FunctionCall
from tests.conftest import openai_client
from tests.support.raw_ws import handshake
from tests.support.shipped_ws import TERMINAL

BETA = {"OpenAI-Beta": "responses_multi_agent=v1"}
BETA_VALUE = b"responses_multi_agent=v1"
STRICT = pydantic.TypeAdapter(BetaResponsesServerEvent)
READ_FILE = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}


@pytest.fixture
def beta(server: Any) -> Iterator[Any]:
    """The official SDK's beta connection, opened with the multi-agent header."""
    with openai_client(server).beta.responses.connect(extra_headers=BETA) as connection:
        yield connection


def recv(conn: Any, *, strict: bool = True) -> Any:
    """One frame, validated against the SDK's beta union (or parsed leniently)."""
    raw = conn.recv_bytes()
    return STRICT.validate_json(raw) if strict else conn.parse_event(raw)


def until(conn: Any, *types: str) -> list[Any]:
    """Events up to and including the first of ``types``."""
    events = []
    while True:
        events.append(recv(conn))
        if events[-1].type in types:
            return events


def calls(events: list[Any]) -> list[Any]:
    return [
        e.item
        for e in events
        if e.type == "response.output_item.done" and e.item.type == "function_call"
    ]


def outputs(items: list[Any], text: str) -> list[dict[str, str]]:
    return [
        {"type": "function_call_output", "call_id": item.call_id, "output": f"{text} {n}"}
        for n, item in enumerate(items)
    ]


def multi_agent(conn: Any, calls: int = 1, **fields: Any) -> None:
    conn.response.create(
        model="sim",
        input="Read the files, then answer.",
        tools=[READ_FILE],
        store=False,
        metadata={"sim_tool_calls": str(calls)},
        multi_agent={"enabled": True},
        **fields,
    )


# --- the shipped shape, with the official SDK ---------------------------------


def test_a_multi_agent_response_waits_in_place_and_inject_resumes_it(beta: Any) -> None:
    multi_agent(beta, calls=2)
    first = until(beta, "response.output_item.done")
    rid = first[0].response.id
    assert [e.type for e in first[:2]] == ["response.created", "response.in_progress"]
    (call_1,) = calls(first)

    beta.response.inject(input=outputs([call_1], "first file"), response_id=rid)
    # Nothing is sent while the response waits: the receipt is the next event.
    receipt = recv(beta)
    assert receipt.type == "response.inject.created"
    assert (receipt.response_id, receipt.sequence_number) == (rid, first[-1].sequence_number + 1)
    second = until(beta, "response.output_item.done")
    (call_2,) = calls(second)
    assert call_2.call_id != call_1.call_id

    beta.response.inject(input=outputs([call_2], "second file"), response_id=rid)
    rest = until(beta, *TERMINAL)
    events = [*first, receipt, *second, *rest]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert {e.type for e in events} <= {
        "response.created",
        "response.in_progress",
        "response.inject.created",
        "response.output_item.added",
        "response.output_item.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.delta",
        "response.output_text.done",
        "response.completed",
    }
    done = rest[-1]
    assert done.type == "response.completed"
    assert done.response.id == rid
    assert done.response.status == "completed"
    assert [item.type for item in done.response.output] == [
        "function_call",
        "function_call",
        "message",
    ]
    answer = done.response.output[-1].content[0].text
    assert "«first file 0»" in answer
    assert "«second file 0»" in answer
    # One Response for the whole loop: its usage counts both resumed turns.
    assert done.response.usage.input_tokens_details.cached_tokens > 0

    # It chains like any shipped Response.
    beta.response.create(
        model="sim", input="And now?", previous_response_id=rid, store=False, tools=[READ_FILE]
    )
    follow = until(beta, *TERMINAL)
    assert follow[-1].type == "response.completed"
    assert follow[-1].response.previous_response_id == rid


def test_inject_failures_hand_the_input_back(beta: Any) -> None:
    items = [{"type": "function_call_output", "call_id": "call_x", "output": "late"}]
    beta.response.inject(input=items, response_id="resp_nope")
    failed = recv(beta)
    assert failed.type == "response.inject.failed"
    assert failed.error.code == "response_not_found"
    assert (failed.response_id, failed.sequence_number) == ("resp_nope", 0)
    assert [item.model_dump(exclude_none=True) for item in failed.input] == items

    multi_agent(beta)
    events = until(beta, "response.output_item.done")
    rid = events[0].response.id
    beta.response.inject(input=outputs(calls(events), "ok"), response_id=rid)
    events += until(beta, *TERMINAL)
    assert events[-1].type == "response.completed"

    late = outputs(calls(events), "again")
    beta.response.inject(input=late, response_id=rid)
    failed = recv(beta)
    assert failed.type == "response.inject.failed"
    assert failed.error.code == "response_already_completed"
    assert failed.response_id == rid
    assert failed.sequence_number == events[-1].sequence_number + 1
    assert [item.model_dump(exclude_none=True) for item in failed.input] == late
    # The connection goes on.
    multi_agent(beta, calls=0)
    assert until(beta, *TERMINAL)[-1].type == "response.completed"


def test_inject_replies_carry_the_lane_of_their_response(beta: Any) -> None:
    multi_agent(beta, stream_id="agent-a")
    events = until(beta, "response.output_item.done")
    assert {e.stream_id for e in events} == {"agent-a"}
    beta.response.inject(input=outputs(calls(events), "ok"), response_id=events[0].response.id)
    receipt = recv(beta)
    assert (receipt.type, receipt.stream_id) == ("response.inject.created", "agent-a")
    assert until(beta, *TERMINAL)[-1].type == "response.completed"


def test_input_a_response_cannot_take_is_a_request_error(beta: Any) -> None:
    multi_agent(beta)
    events = until(beta, "response.output_item.done")
    rid = events[0].response.id
    wrong = [{"type": "function_call_output", "call_id": "call_unknown", "output": "?"}]
    beta.response.inject(input=wrong, response_id=rid)
    error = recv(beta)
    assert error.type == "error"
    assert (error.error.code, error.error.param) == ("unknown_call_id", "input[0].call_id")
    # Nothing was committed: the response still waits for its call.
    beta.response.inject(input=outputs(calls(events), "ok"), response_id=rid)
    assert recv(beta).type == "response.inject.created"
    assert until(beta, *TERMINAL)[-1].type == "response.completed"


@pytest.mark.slow  # a two-second stream at 60 tokens/s
def test_a_response_created_without_multi_agent_takes_no_injected_input(beta: Any) -> None:
    beta.response.create(
        model="sim",
        input="Write at length.",
        store=False,
        metadata={"sim_output_tokens": "120", "sim_tokens_per_second": "60"},
    )
    created = recv(beta)
    beta.response.inject(input=[], response_id=created.response.id)
    events = until(beta, *TERMINAL)
    errors = [e for e in events if e.type == "error"]
    assert [(e.error.code, e.error.param) for e in errors] == [("invalid_value", "response_id")]
    assert "without multi_agent" in errors[0].error.message
    assert until(beta, *TERMINAL)[-1].type == "response.completed"


@pytest.mark.slow  # waits out the pause timeout
def test_a_multi_agent_response_whose_outputs_never_come_ends_incomplete(
    make_server: Any,
) -> None:
    running = make_server(pause_timeout=0.3)
    with openai_client(running).beta.responses.connect(extra_headers=BETA) as conn:
        multi_agent(conn)
        events = until(conn, "response.output_item.done")
        end = recv(conn, strict=False)  # pause_timeout is not in the SDK's reason enum
    assert calls(events)
    assert end.type == "response.incomplete"
    assert end.response.incomplete_details.reason == "pause_timeout"
    assert end.sequence_number == events[-1].sequence_number + 1


def test_without_the_beta_header_there_is_no_multi_agent(server: Any) -> None:
    with openai_client(server).beta.responses.connect() as conn:
        multi_agent(conn)
        error = recv(conn)
        assert (error.type, error.error.code, error.error.param) == (
            "error",
            "invalid_value",
            "multi_agent",
        )
        conn.response.inject(input=[], response_id="resp_any")
        error = recv(conn)
        assert (error.type, error.error.code, error.error.param) == (
            "error",
            "unknown_event_type",
            "type",
        )
        conn.response.create(model="sim", input="still here", store=False)
        assert until(conn, *TERMINAL)[-1].type == "response.completed"


def test_http_refuses_multi_agent(server: Any) -> None:
    import openai

    client = openai_client(server)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model="sim", input="hi", extra_body={"multi_agent": {"enabled": True}}
        )
    assert refused.value.code == "invalid_value"
    assert refused.value.param == "multi_agent"


# --- append mode, with the trio client ----------------------------------------


async def test_append_mode_accepts_inject(server: Any) -> None:
    # A paced answer keeps the response alive while the test reads the client's
    # record of the answered call (the client reads ahead of what it is asked for).
    async with connect(server.url) as client:
        paced = {"sim_tokens_per_second": "200"}
        await client.create(model="sim", input="Read it.", tools=[READ_FILE], metadata=paced)
        paused = (await client.until_done())[-1]
        assert isinstance(paused, ResponseDone)
        assert paused.response.status == "requires_action"
        rid = paused.response.id
        (call,) = [i for i in paused.response.output if isinstance(i, FunctionCall)]
        await client.inject(
            [{"type": "function_call_output", "call_id": call.call_id, "output": "its text"}], rid
        )
        track = client.connection.response(rid)
        assert track is not None
        assert track.answered_calls == {call.call_id}  # recorded while the response lives
        receipt = await client.next_event()
        assert isinstance(receipt, ResponseInjectCreated)
        assert (receipt.response_id, receipt.sequence_number) == (
            rid,
            paused.sequence_number + 1,
        )
        resumed = await client.next_event()
        assert isinstance(resumed, ResponseInProgress)
        assert resumed.sequence_number == receipt.sequence_number + 1
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "completed"
        assert "«its text»" in done.response.output[-1].content[0].text  # type: ignore[union-attr]
        assert len(track.answered_calls) == 0  # a finished response keeps no calls

        # The client's core refuses an inject to a finished response; sent raw,
        # the server answers inject.failed with the input handed back.
        late = [{"type": "function_call_output", "call_id": call.call_id, "output": "again"}]
        frame = {"type": "response.inject", "response_id": rid, "input": late}
        await client.send_raw(json.dumps(frame))
        failed = await client.next_event()
        assert isinstance(failed, ResponseInjectFailed)
        assert failed.error.code == "response_already_completed"
        assert failed.sequence_number == done.sequence_number + 1
        assert [i.call_id for i in failed.input] == [call.call_id]  # type: ignore[union-attr]


async def test_inject_is_admitted_like_an_append(make_server: Any) -> None:
    running = make_server(secrets_policy="refuse")
    async with connect(running.url) as client:
        await client.create(model="sim", input="Read it.", tools=[READ_FILE])
        paused = (await client.until_done())[-1]
        assert isinstance(paused, ResponseDone)
        (call,) = [i for i in paused.response.output if isinstance(i, FunctionCall)]
        secret = "AKIA" + "QWERTYUIOPASDFGH"
        leak = [{"type": "function_call_output", "call_id": call.call_id, "output": secret}]
        frame = {"type": "response.inject", "response_id": paused.response.id, "input": leak}
        await client.send_raw(json.dumps(frame))
        (error,) = await client.until_done()
        assert isinstance(error, ErrorEvent)
        assert (error.error.code, error.error.param) == ("secret_detected", "input[0]")
        # Refused, so nothing was recorded: the call can still be answered.
        fine = [{"type": "function_call_output", "call_id": call.call_id, "output": "fine"}]
        frame["input"] = fine
        await client.send_raw(json.dumps(frame))
        assert isinstance(await client.next_event(), ResponseInjectCreated)


# --- a schema-invalid inject: an error, then the socket closes -----------------


def frames_until_close(sock: socket.socket, conn: wsproto.WSConnection) -> tuple[list[Any], int]:
    """Every message up to the server's close frame, and its code."""
    events: list[Any] = []
    while True:
        data = sock.recv(65536)
        assert data, "TCP closed without a close frame"
        conn.receive_data(data)
        for event in conn.events():
            if isinstance(event, ws.TextMessage):
                events.append(json.loads(event.data))
            elif isinstance(event, ws.CloseConnection):
                return events, event.code


@pytest.mark.parametrize(
    ("append", "frame", "param"),
    [
        (False, {"type": "response.inject", "input": []}, "response_id"),
        (False, {"type": "response.inject", "response_id": "r", "input": "text"}, "input"),
        (True, {"type": "response.inject", "response_id": "r"}, "input"),
    ],
    ids=["multi-agent-no-response-id", "multi-agent-input-not-a-list", "append-no-input"],
)
def test_a_schema_invalid_inject_gets_an_error_and_the_socket_closes(
    server: Any, append: bool, frame: dict[str, Any], param: str
) -> None:
    sock, conn = handshake(server.port, append=append, headers=[(b"openai-beta", BETA_VALUE)])
    after = {"type": "response.create", "model": "sim", "input": "too late"}
    with sock:
        # In one write: what follows the bad inject is dropped unread.
        sock.sendall(
            conn.send(ws.TextMessage(json.dumps(frame)))
            + conn.send(ws.TextMessage(json.dumps(after)))
        )
        events, code = frames_until_close(sock, conn)
    assert [e["type"] for e in events] == ["error"]
    assert events[0]["status"] == 400
    assert events[0]["error"]["param"] == param
    assert events[0]["error"]["code"] in ("missing_required_parameter", "invalid_type")
    assert code == 1002


def test_other_bad_frames_keep_the_socket_open(server: Any) -> None:
    sock, conn = handshake(server.port, append=False, headers=[(b"openai-beta", BETA_VALUE)])
    with sock:
        bad = {"type": "response.create", "input": 5}
        sock.sendall(conn.send(ws.TextMessage(json.dumps(bad))))
        sock.sendall(conn.send(ws.CloseConnection(code=1000)))
        events, code = frames_until_close(sock, conn)
    assert [(e["type"], e["error"]["param"]) for e in events] == [("error", "input")]
    assert code == 1000  # our own close, answered: the server did not close first
