"""``response.steer``, the shipped shape's steering, against a real server.

Driven by the official SDK (``client.responses.connect()``, then
``connection.response.steer``); every frame is validated with pydantic
against the SDK's own ``ResponsesServerEvent`` union, which holds the three
steer replies. Bad shapes go raw through ``connection.send``. The simulated
model quotes every user message in its answer, which shows what context a
successor read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from openai.types.responses.responses_server_event import ResponsesServerEvent

from tests.conftest import openai_client
from tests.support.shipped_ws import TERMINAL

STRICT = pydantic.TypeAdapter(ResponsesServerEvent)
READ_FILE = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
#: The model takes this long before its first output: a steer sent on
#: ``response.created`` arrives while it samples.
SLOW_START = {"sim_tool_calls": "0", "sim_ttft_ms": "400"}


@pytest.fixture
def conn(server: Any) -> Iterator[Any]:
    with openai_client(server).responses.connect() as connection:
        yield connection


def recv(conn: Any, *, strict: bool = True) -> Any:
    raw = conn.recv_bytes()
    return STRICT.validate_json(raw) if strict else conn.parse_event(raw)


def until(conn: Any, *types: str, strict: bool = True) -> list[Any]:
    """Events up to and including the first of ``types``."""
    events = []
    while True:
        events.append(recv(conn, strict=strict))
        if events[-1].type in types:
            return events


def answer(events: list[Any]) -> str:
    texts = [e.text for e in events if e.type == "response.output_text.done"]
    assert len(texts) == 1, [e.type for e in events]
    return str(texts[0])


def test_steer_ends_the_response_steered_and_a_successor_reads_the_input(conn: Any) -> None:
    conn.response.create(model="sim", input="write a poem", store=False, metadata=SLOW_START)
    created = until(conn, "response.created")[-1].response
    conn.response.steer(previous_response_id=created.id, input="make it about the sea")
    accepted = until(conn, "response.steer.accepted")
    assert accepted[-1].steer.previous_response_id == created.id
    assert accepted[-1].steer.id.startswith("steer_")
    assert accepted[-1].sequence_number == accepted[-2].sequence_number + 1  # its stream
    ended = until(conn, *TERMINAL)[-1]
    assert ended.type == "response.incomplete"
    assert ended.response.incomplete_details.reason == "steered"
    assert ended.response.output == []  # stopped before its first item
    successor = until(conn, "response.created")[-1].response  # the commit point
    assert successor.previous_response_id == created.id
    assert successor.metadata == SLOW_START  # the steered request's settings
    events = until(conn, *TERMINAL)
    assert events[-1].type == "response.completed"
    text = answer(events)
    assert "«write a poem»" in text
    assert "«make it about the sea»" in text
    # The successor is an ordinary segment: it chains.
    conn.response.create(
        model="sim", input="thanks", previous_response_id=successor.id, store=False
    )
    assert "«make it about the sea»" in answer(until(conn, *TERMINAL))


def test_a_steer_after_the_last_item_still_gets_a_successor(conn: Any) -> None:
    """Steered between the message's end and the terminal event: the response
    completes as it was, and the successor follows."""
    slow = {"sim_tool_calls": "0", "sim_tokens_per_second": "40", "sim_output_tokens": "8"}
    conn.response.create(model="sim", input="count", store=False, metadata=slow)
    created = until(conn, "response.created")[-1].response
    until(conn, "response.output_text.delta")
    conn.response.steer(
        previous_response_id=created.id,
        input=[
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "stop"}]}
        ],
    )
    events = until(conn, *TERMINAL)
    assert "response.steer.accepted" in [e.type for e in events]
    first = events[-1]
    assert first.type in {"response.completed", "response.incomplete"}
    successor = until(conn, "response.created")[-1].response
    assert successor.previous_response_id == created.id
    assert "«stop»" in answer(until(conn, *TERMINAL))


def test_steer_while_the_response_waits_for_tool_output_is_pending(conn: Any) -> None:
    slow = {"sim_tool_calls": "2", "sim_parallel_calls": "2", "sim_tokens_per_second": "10"}
    conn.response.create(
        model="sim", input="read two files", tools=[READ_FILE], store=False, metadata=slow
    )
    created = until(conn, "response.created")[-1].response
    until(conn, "response.output_item.done")  # a call is out: no safe point until the end
    conn.response.steer(previous_response_id=created.id, input="only the first one matters")
    events = until(conn, *TERMINAL)
    assert "response.steer.accepted" in [e.type for e in events]
    completed = events[-1]
    assert completed.type == "response.completed"
    calls = [item for item in completed.response.output if item.type == "function_call"]
    assert len(calls) == 2
    pending = recv(conn)
    assert pending.type == "response.steer.pending"
    assert pending.reason == "waiting_for_required_input"
    assert [(stub.type, stub.call_id, stub.name) for stub in pending.required_input] == [
        ("function_call_output", call.call_id, "read_file") for call in calls
    ]
    assert pending.sequence_number == completed.sequence_number + 1
    # The client answers the calls with one explicit create; the steer is prepended.
    conn.response.create(
        model="sim",
        previous_response_id=created.id,
        tools=[READ_FILE],
        store=False,
        metadata={"sim_tool_calls": "0"},
        input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": f"file {n}"}
            for n, call in enumerate(calls)
        ],
    )
    events = until(conn, *TERMINAL)
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    text = answer(events)
    assert "«only the first one matters»" in text
    assert "«file 0»" in text


def test_steering_a_finished_or_unknown_response_fails_with_the_input_back(conn: Any) -> None:
    conn.response.create(model="sim", input="hi", store=False, metadata={"sim_tool_calls": "0"})
    done = until(conn, *TERMINAL)[-1].response
    conn.response.steer(previous_response_id=done.id, input="too late")
    failed = recv(conn)
    assert failed.type == "response.steer.failed"
    assert (failed.error.code, failed.error.type) == (
        "response_already_completed",
        "invalid_request_error",
    )
    assert (failed.steer.previous_response_id, failed.steer.input) == (done.id, "too late")
    assert failed.steer.id is None  # never accepted
    conn.response.steer(previous_response_id="resp_nope", input="x")
    failed = recv(conn)
    assert (failed.type, failed.error.code) == ("response.steer.failed", "response_not_found")
    assert failed.sequence_number == 0


def test_too_many_pending_steers(make_server: Any) -> None:
    server = make_server(max_pending_steers=2)
    with openai_client(server).responses.connect() as conn:
        conn.response.create(model="sim", input="go", store=False, metadata=SLOW_START)
        created = until(conn, "response.created")[-1].response
        for n in range(3):
            conn.response.steer(previous_response_id=created.id, input=f"steer {n}")
        replies = [recv(conn) for _ in range(4)]  # in_progress and the three answers
        kinds = [e.type for e in replies if e.type.startswith("response.steer")]
        assert kinds == ["response.steer.accepted"] * 2 + ["response.steer.failed"]
        assert replies[-1].error.code == "too_many_pending_steers"
        assert replies[-1].steer.input == "steer 2"
        until(conn, "response.incomplete")
        text = answer(until(conn, *TERMINAL))
        assert "«steer 0»" in text
        assert "«steer 1»" in text
        assert "steer 2" not in text


@pytest.mark.parametrize(
    ("extra", "code", "needle"),
    [
        ({"input": "x", "stream_id": "a"}, "invalid_input", "stream_id"),
        ({"input": []}, "invalid_input", "empty array"),
        ({"input": [{"role": "assistant", "content": "x"}]}, "invalid_input", "input[0].role"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": "o"}]},
            "invalid_input",
            "input[0].type",
        ),
    ],
)
def test_bad_shapes_fail_precisely_and_the_connection_stays_usable(
    conn: Any, extra: dict[str, Any], code: str, needle: str
) -> None:
    conn.response.create(model="sim", input="go", store=False, metadata=SLOW_START)
    created = until(conn, "response.created")[-1].response
    conn.send({"type": "response.steer", "previous_response_id": created.id, **extra})
    events = until(conn, "response.steer.failed", strict=False)
    failed = events[-1]
    assert failed.error.code == code
    assert needle in failed.error.message
    sent = extra["input"]
    if isinstance(sent, list):  # handed back as decoded: a message gets its type
        sent = [{"type": "message", **item} if "type" not in item else item for item in sent]
    back = failed.steer.input
    if isinstance(back, list):
        back = [i if isinstance(i, dict) else i.model_dump(exclude_none=True) for i in back]
    assert back == sent
    ended = until(conn, *TERMINAL)[-1]
    assert ended.type == "response.completed"  # nothing was queued: no successor
    conn.response.create(model="sim", input="again", previous_response_id=created.id, store=False)
    assert "«again»" in answer(until(conn, *TERMINAL))


def test_a_steer_that_cannot_be_handed_back_is_an_error(conn: Any) -> None:
    """No readable target, or an input that is neither a string nor a list: a
    ``response.steer.failed`` could not carry it, so a plain ``error`` answers."""
    conn.send({"type": "response.steer", "input": "x"})
    error = recv(conn)
    assert error.type == "error"
    assert (error.error.code, error.error.param) == (
        "missing_required_parameter",
        "previous_response_id",
    )
    conn.send({"type": "response.steer", "previous_response_id": "resp_1", "input": 5})
    error = recv(conn)
    assert (error.type, error.error.code, error.error.param) == ("error", "invalid_type", "input")
    conn.response.create(model="sim", input="still here", store=False)
    assert "«still here»" in answer(until(conn, *TERMINAL))


def test_a_conversation_bound_response_is_not_steered(conn: Any, server: Any) -> None:
    """As shipped, steering is not for responses in a conversation: the steer
    fails with its input back and the response runs on to completion."""
    conv = openai_client(server).conversations.create()
    conn.response.create(
        model="sim", input="write a poem", conversation=conv.id, metadata=SLOW_START
    )
    created = until(conn, "response.created")[-1].response
    conn.response.steer(previous_response_id=created.id, input="make it about the sea")
    events = until(conn, "response.steer.failed")
    failed = events[-1]
    assert failed.error.code == "steering_not_supported"
    assert (failed.steer.previous_response_id, failed.steer.input) == (
        created.id,
        "make it about the sea",
    )
    events = until(conn, *TERMINAL)
    assert events[-1].type == "response.completed"
    assert "«make it about the sea»" not in answer(events)
