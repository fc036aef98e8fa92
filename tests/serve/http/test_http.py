"""The HTTP Responses API with the official SDK, stores, ownership and bad input."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pydantic
import pytest
from openai import OpenAI
from openai.types.responses import ResponseStreamEvent

from longresponse.config import ServerConfig
from longresponse.server_process import ServerProcess
from tests.conftest import RunningServer
from tests.support.error_replies import assert_refused
from tests.support.http_clients import OPEN_CLIENTS, openai_client, post

STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
TOOL = {
    "type": "function",
    "name": "run_tests",
    "parameters": {"type": "object", "properties": {"target": {"type": "string"}}},
}


def calls_of(response: Any) -> list[Any]:
    return [item for item in response.output if item.type == "function_call"]


def test_ten_turn_chain_over_http(server: Any) -> None:
    client = openai_client(server)
    meta = {"sim_tool_calls": "10"}
    response = client.responses.create(
        model="sim", input="Fix the flaky test.", tools=[TOOL], metadata=meta
    )
    outputs = []
    for turn in range(10):
        (call,) = calls_of(response)
        outputs.append(f"run {turn}: 3 passed, {turn} failed")
        before = response.usage.input_tokens
        response = client.responses.create(
            model="sim",
            previous_response_id=response.id,
            input=[
                {"type": "function_call_output", "call_id": call.call_id, "output": outputs[-1]}
            ],
            tools=[TOOL],
            metadata=meta,
        )
        assert response.previous_response_id is not None
        # The parent's tokens are in the server's token cache (the default): its
        # whole context, input and output, is cached; only the call output is new.
        usage = response.usage
        assert before < usage.input_tokens_details.cached_tokens < usage.input_tokens
    assert not calls_of(response)
    text = response.output_text
    assert "«Fix the flaky test.»" in text
    for output in outputs:
        assert f"«{output[:40]}»" in text


def test_retrieve_delete_and_cancel(server: Any) -> None:
    client = openai_client(server)
    response = client.responses.create(model="sim", input="keep me", metadata={"k": "v"})
    again = client.responses.retrieve(response.id)
    assert again.id == response.id
    assert again.output_text == response.output_text
    assert again.metadata == {"k": "v"}
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.cancel(response.id)
    assert "background" in str(refused.value)
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_missing")


def test_input_items_pagination(server: Any) -> None:
    client = openai_client(server)
    first = client.responses.create(
        model="sim",
        input=[{"role": "user", "content": f"message {i}"} for i in range(5)],
        tools=[TOOL],
    )
    (call,) = calls_of(first)
    second = client.responses.create(
        model="sim",
        previous_response_id=first.id,
        input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "done"},
            {"role": "user", "content": "and summarise"},
        ],
        tools=[TOOL],
    )
    everything = list(client.responses.input_items.list(second.id, order="asc", limit=100))
    kinds = [item.type for item in everything]
    assert kinds == ["message"] * 5 + ["function_call", "function_call_output", "message"]
    assert all(item.id for item in everything)
    assert everything[0].content[0].text == "message 0"
    # Default order is newest first, 20 a page; walk it two at a time.
    page = client.responses.input_items.list(second.id, limit=2)
    assert [item.id for item in page.data] == [everything[-1].id, everything[-2].id]
    assert page.has_more
    seen = []
    after = None
    while True:
        params: dict[str, Any] = {"limit": 3}
        if after:
            params["after"] = after
        page = client.responses.input_items.list(second.id, **params)
        seen.extend(item.id for item in page.data)
        if not page.has_more:
            break
        after = page.last_id
    assert seen == [item.id for item in reversed(everything)]
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(second.id, limit=101)


def test_streaming_events_match_the_websocket_shape(server: Any) -> None:
    client = openai_client(server)
    with httpx.stream(
        "POST",
        f"{server.http_url}/v1/responses",
        json={"model": "sim", "input": "stream this", "stream": True, "tools": [TOOL]},
        timeout=30,
    ) as streamed:
        assert streamed.headers["content-type"].startswith("text/event-stream")
        blocks = [b for b in streamed.read().decode().split("\n\n") if b.strip()]
    assert blocks[-1] == "data: [DONE]"  # the stream's end (Open Responses), no event
    blocks = blocks[:-1]
    events = []
    for block in blocks:
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        event = STREAM_EVENT.validate_json(lines["data"])
        assert lines["event"] == event.type
        events.append(event)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.completed"
    assert "stream_id" not in blocks[-1]
    assert "response_id" not in blocks[2]
    # The SDK's own streaming helper agrees, and the result is stored.
    with client.responses.stream(model="sim", input="again") as stream:
        final = stream.get_final_response()
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_store_false_is_never_found_again(server: Any) -> None:
    client = openai_client(server)
    response = client.responses.create(model="sim", input="forget me", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError) as missing:
        client.responses.create(model="sim", previous_response_id=response.id, input="and?")
    assert missing.value.code == "previous_response_not_found"
    assert missing.value.param == "previous_response_id"


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        pytest.param("{not json", 400, "invalid_json", None, id="malformed"),
        pytest.param('{"input": 5}', 400, "invalid_type", "input", id="wrong-type"),
        pytest.param('{"input": "x", "frobnicate": 1}', 400, "unknown_parameter", "frobnicate",
                     id="unknown-field"),
        pytest.param('{"input": "x", "stream_id": "a"}', 400, "unknown_parameter", "stream_id",
                     id="ws-only-field"),
        pytest.param('{"input": "x", "model": "gpt-9"}', 404, "model_not_found", "model",
                     id="unknown-model"),
        pytest.param('{"input": [{"role": "user"}]}', 400, "missing_required_parameter",
                     "input[0].content", id="missing-content"),
        pytest.param(
            json.dumps({"input": [{"type": "function_call_output", "call_id": "c", "output": ""}]}),
            400, "unknown_call_id", "input[0].call_id", id="orphan-output",
        ),
    ],
)  # fmt: skip
def test_bad_input_gets_the_error_envelope(
    server: Any, body: str, status: int, code: str, param: str | None
) -> None:
    assert_refused(post(server, body), code, param, status=status)


def test_oversize_body_is_refused(make_server: Any) -> None:
    small = make_server(max_message_bytes=2000)
    reply = post(small, json.dumps({"input": "x" * 5000}))
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] == "message_too_large"
    assert post(small, json.dumps({"input": "fits"})).status_code == 200


def test_api_keys_and_ownership(make_server: Any) -> None:
    keyed = make_server(api_keys=("key-one", "key-two"))
    assert post(keyed, '{"input": "x"}').status_code == 401
    assert post(keyed, '{"input": "x"}', authorization="Bearer nope").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai_client(keyed, "wrong").responses.create(model="sim", input="x")
    one, two = openai_client(keyed, "key-one"), openai_client(keyed, "key-two")
    mine = one.responses.create(model="sim", input="private", tools=[TOOL])
    assert one.responses.retrieve(mine.id).id == mine.id
    with pytest.raises(openai.NotFoundError):
        two.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        two.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        two.responses.input_items.list(mine.id)
    (call,) = calls_of(mine)
    output = [{"type": "function_call_output", "call_id": call.call_id, "output": "ok"}]
    with pytest.raises(openai.BadRequestError) as chained:
        two.responses.create(model="sim", previous_response_id=mine.id, input=output, tools=[TOOL])
    assert chained.value.code == "previous_response_not_found"
    # Hydration over a WebSocket is refused to the other key too.
    with two.responses.connect() as conn:
        conn.response.create(model="sim", previous_response_id=mine.id, input=output, tools=[TOOL])
        event = conn.recv()
        assert event.type == "error"
        assert event.error.code == "previous_response_not_found"
    with one.responses.connect() as conn:
        conn.response.create(model="sim", previous_response_id=mine.id, input=output, tools=[TOOL])
        while (event := conn.recv()).type != "response.completed":
            assert event.type != "error", event
        assert "«ok»" in event.response.output_text
    # The upgrade itself is refused without a key: no 101, no session.
    wrong = openai_client(keyed, "wrong")
    with pytest.raises(Exception, match="401"), wrong.responses.connect() as conn:
        conn.recv()
    assert keyed.live_sessions == 0


def test_server_refuses_public_address_without_keys(capsys: pytest.CaptureFixture[str]) -> None:
    from longresponse.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["serve", "--host", "0.0.0.0", "--port", "0"])
    assert refused.value.code == 2
    assert "without API keys" in capsys.readouterr().err


def test_websocket_hydration_after_reconnect_and_restart(tmp_path: Any) -> None:
    store = f"sqlite:///{tmp_path}/shared.db"
    first = RunningServer(ServerConfig(port=0, store=store)).start()
    try:
        client = openai_client(first)
        with client.responses.connect() as conn:
            conn.response.create(model="sim", input="survive me", tools=[TOOL], store=True)
            while (event := conn.recv()).type != "response.completed":
                pass
            parent = event.response
        (call,) = calls_of(parent)
        output = [{"type": "function_call_output", "call_id": call.call_id, "output": "back"}]
        with client.responses.connect() as conn:  # a new connection: not in its cache
            conn.response.create(
                model="sim", previous_response_id=parent.id, input=output, tools=[TOOL]
            )
            while (event := conn.recv()).type != "response.completed":
                assert event.type != "error", event
            assert "«survive me»" in event.response.output_text
            assert first.last_session.shipped.hydrations == 1
    finally:
        first.stop()
    second = RunningServer(ServerConfig(port=0, store=store)).start()
    try:
        with openai_client(second).responses.connect() as conn:
            conn.response.create(
                model="sim", previous_response_id=parent.id, input=output, tools=[TOOL]
            )
            while (event := conn.recv()).type != "response.completed":
                assert event.type != "error", event
            assert "«back»" in event.response.output_text
    finally:
        second.stop()


def test_clean_shutdown_drains_queued_writes(tmp_path: Any) -> None:
    store = f"sqlite:///{tmp_path}/drain.db"
    running = RunningServer(ServerConfig(port=0, store=store)).start()
    ids = []
    try:
        client = openai_client(running)
        for index in range(30):
            ids.append(client.responses.create(model="sim", input=f"number {index}").id)
    finally:
        running.stop()
    reopened = RunningServer(ServerConfig(port=0, store=store)).start()
    try:
        client = openai_client(reopened)
        for index, response_id in enumerate(ids):
            assert f"«number {index}»" in client.responses.retrieve(response_id).output_text
    finally:
        reopened.stop()


def test_two_processes_share_one_redis(redis_url: str) -> None:
    with (
        ServerProcess("--store", redis_url) as first,
        ServerProcess("--store", redis_url) as second,
    ):
        one, two = (
            OpenAI(base_url=f"{server.http_url}/v1", api_key="k", max_retries=0)
            for server in (first, second)
        )
        OPEN_CLIENTS.extend((one, two))
        made = one.responses.create(model="sim", input="made on one", tools=[TOOL])
        assert two.responses.retrieve(made.id).id == made.id
        (call,) = calls_of(made)
        output = [{"type": "function_call_output", "call_id": call.call_id, "output": "via two"}]
        # Chain over HTTP through the other process...
        chained = two.responses.create(
            model="sim", previous_response_id=made.id, input=output, tools=[TOOL]
        )
        assert "«made on one»" in chained.output_text
        assert "«via two»" in chained.output_text
        assert one.responses.retrieve(chained.id).output_text == chained.output_text
        # ...and hydrate over a WebSocket of the other process.
        with two.responses.connect() as conn:
            conn.response.create(
                model="sim", previous_response_id=made.id, input=output, tools=[TOOL]
            )
            while (event := conn.recv()).type != "response.completed":
                assert event.type != "error", event
            assert "«via two»" in event.response.output_text
        two.responses.delete(made.id)
        with pytest.raises(openai.NotFoundError):
            one.responses.retrieve(made.id)


def test_retention_ttl_expires_responses(redis_url: str, make_server: Any) -> None:
    for store in (redis_url, None):
        overrides: dict[str, Any] = {"store_ttl": 0.3}
        if store is not None:
            overrides["store"] = store
        running = make_server(**overrides)
        client = openai_client(running)
        response = client.responses.create(model="sim", input="short-lived")
        assert client.responses.retrieve(response.id).id == response.id
        time.sleep(0.5)  # real retention is wall-clock time
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(response.id)
        with pytest.raises(openai.BadRequestError):
            client.responses.create(model="sim", previous_response_id=response.id, input="x")


def _data_lines(stream: Any) -> list[str]:
    return [line[len("data: ") :] for line in stream.iter_lines() if line.startswith("data: ")]


def test_every_stream_ends_with_done_after_its_terminal_event(server: Any) -> None:
    """Open Responses ends a stream with ``data: [DONE]``; the SDKs skip it."""
    base = server.http_url
    with httpx.Client(base_url=base, timeout=30) as http:
        body = {"model": "sim", "input": "end me", "stream": True}
        with http.stream("POST", "/v1/responses", json=body) as reply:
            data = _data_lines(reply)
        assert data[-1] == "[DONE]"
        assert json.loads(data[-2])["type"] == "response.completed"
        assert "[DONE]" not in data[:-1]
        made = http.post("/v1/responses", json={**body, "background": True, "stream": False})
        response_id = made.json()["id"]
        for query in ("", "&starting_after=2", "&starting_after=100000"):
            with http.stream("GET", f"/v1/responses/{response_id}?stream=true{query}") as reply:
                data = _data_lines(reply)
            assert data[-1] == "[DONE]", query
            if query != "&starting_after=100000":  # past the end: [DONE] alone
                assert json.loads(data[-2])["type"] == "response.completed", query
            else:
                assert data == ["[DONE]"]
    # The official SDK reads the same stream and stops at its terminal event.
    events = list(openai_client(server).responses.create(model="sim", input="end me", stream=True))
    assert events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
