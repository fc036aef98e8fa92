"""The parts of the shipped surface together: what no single part's tests cover.

- a background response seals and opens compaction items for its own API key;
- a stored multi-agent response, resumed by ``response.inject`` while it ran,
  continues from the store over HTTP (its injected outputs were stored too).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from tests.conftest import openai_client

KEY = "surface-key"
READ_FILE = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
CONVERSATION = [
    {"role": "user", "content": "Find the bug in fizz_buzz()."},
    {"type": "function_call", "call_id": "call_a", "name": "read_file", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_a", "output": "def fizz_buzz(n): ..."},
]


def poll(http: httpx.Client, base: str, response_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        body = http.get(f"{base}/v1/responses/{response_id}").json()
        if body["status"] not in ("queued", "in_progress"):
            return body
        time.sleep(0.05)
    raise AssertionError(f"{response_id} did not finish")


def test_a_background_response_opens_its_owners_compaction_items(make_server: Any) -> None:
    keyed = make_server(api_keys=(KEY,))
    headers = {"Authorization": f"Bearer {KEY}"}
    base = keyed.http_url
    with httpx.Client(headers=headers, timeout=30) as http:
        window = http.post(
            f"{base}/v1/responses/compact", json={"model": "sim", "input": CONVERSATION}
        ).json()["output"]
        assert window[-1]["type"] == "compaction"
        follow_up = {"role": "user", "content": "Now fix it."}
        body = {"model": "sim", "input": [*window, follow_up], "background": True}
        started = http.post(f"{base}/v1/responses", json=body)
        assert started.status_code == 200, started.text
        done = poll(http, base, started.json()["id"])
        assert done["status"] == "completed", done
        text = done["output"][-1]["content"][0]["text"]
        assert "«Now fix it.»" in text
        assert "«Find the bug in fizz_buzz().»" in text

        # Its own compaction (a trigger turn) opens for the same key afterwards.
        trigger = {"model": "sim", "input": [*CONVERSATION, {"type": "compaction_trigger"}]}
        started = http.post(f"{base}/v1/responses", json={**trigger, "background": True})
        compacted = poll(http, base, started.json()["id"])
        assert compacted["status"] == "completed", compacted
        item = compacted["output"][-1]
        assert item["type"] == "compaction"
        again = http.post(f"{base}/v1/responses", json={"model": "sim", "input": [item]})
        assert again.status_code == 200, again.text
        chained = http.post(
            f"{base}/v1/responses",
            json={"model": "sim", "previous_response_id": compacted["id"], "input": "go on"},
        )
        assert chained.status_code == 200, chained.text


def test_a_stored_multi_agent_response_continues_from_the_store(server: Any) -> None:
    client = openai_client(server)
    beta = {"OpenAI-Beta": "responses_multi_agent=v1"}
    with client.beta.responses.connect(extra_headers=beta) as conn:
        conn.response.create(
            model="sim",
            input="Read the file, then answer.",
            tools=[READ_FILE],
            store=True,
            metadata={"sim_tool_calls": "1"},
            multi_agent={"enabled": True},
        )
        rid, call = None, None
        for event in conn:
            if event.type == "response.created":
                rid = event.response.id
            if event.type == "response.output_item.done" and event.item.type == "function_call":
                call = event.item
                break
        assert rid is not None
        assert call is not None
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "print(1)"}
        conn.response.inject(input=[output], response_id=rid)
        for event in conn:
            if event.type in ("response.completed", "response.failed", "error"):
                assert event.type == "response.completed", event
                break
    # Another process's view: the whole conversation from the store, in order.
    follow = client.responses.create(model="sim", previous_response_id=rid, input="And then?")
    assert follow.status == "completed"
    assert "«print(1)»" in follow.output_text
    assert "«Read the file, then answer.»" in follow.output_text
    listed = client.responses.input_items.list(rid, order="asc")
    # Its input: the request and the injected output (the calls are its output).
    assert [item.type for item in listed.data] == ["message", "function_call_output"]


def test_input_tokens_counts_a_compacted_conversation_as_a_create_reads_it(
    make_server: Any,
) -> None:
    keyed = make_server(api_keys=(KEY,))
    headers = {"Authorization": f"Bearer {KEY}"}
    base = keyed.http_url
    with httpx.Client(headers=headers, timeout=30) as http:
        window = http.post(
            f"{base}/v1/responses/compact", json={"model": "sim", "input": CONVERSATION}
        ).json()["output"]
        body = {"model": "sim", "input": [*window, {"role": "user", "content": "Now fix it."}]}
        count = http.post(f"{base}/v1/responses/input_tokens", json=body)
        assert count.status_code == 200, count.text
        created = http.post(f"{base}/v1/responses", json={**body, "store": True}).json()
        assert count.json()["input_tokens"] == created["usage"]["input_tokens"]

        # A parent whose stored chain holds the compaction item.
        follow = {"model": "sim", "previous_response_id": created["id"], "input": "And then?"}
        count = http.post(f"{base}/v1/responses/input_tokens", json=follow)
        assert count.status_code == 200, count.text
        chained = http.post(f"{base}/v1/responses", json=follow).json()
        assert count.json()["input_tokens"] == chained["usage"]["input_tokens"]

        # A trailing compaction_trigger is counted as no item, not a server error.
        trigger = {"model": "sim", "input": [*CONVERSATION, {"type": "compaction_trigger"}]}
        count = http.post(f"{base}/v1/responses/input_tokens", json=trigger)
        assert count.status_code == 200, count.text
        plain = http.post(
            f"{base}/v1/responses/input_tokens", json={"model": "sim", "input": CONVERSATION}
        )
        assert count.json()["input_tokens"] == plain.json()["input_tokens"]


def test_a_compaction_is_not_charged_to_max_output_tokens(server: Any) -> None:
    client = openai_client(server)
    long_input = [
        {"role": "user", "content": "Find the bug."},
        {"type": "function_call", "call_id": "call_b", "name": "read_file", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_b", "output": "line " * 1500},
    ]
    response = client.responses.create(
        model="sim",
        input=long_input,
        max_output_tokens=20,
        context_management=[{"type": "compaction", "compact_threshold": 1000}],
    )
    assert response.output[0].type == "compaction"
    assert response.usage is not None
    assert response.usage.output_tokens <= 20
    assert response.output[-1].type == "message"  # the answer still had its budget


def test_metadata_is_held_to_the_published_limits(server: Any) -> None:
    too_many = {f"key{i}": "v" for i in range(17)}
    with httpx.Client(timeout=30) as http:
        for metadata in (too_many, {"k" * 65: "v"}, {"k": "v" * 513}):
            reply = http.post(
                f"{server.http_url}/v1/responses", json={"input": "hi", "metadata": metadata}
            )
            assert reply.status_code == 400, reply.text
            assert (reply.json()["error"]["code"], reply.json()["error"]["param"]) == (
                "invalid_value",
                "metadata",
            )
        # Sixteen pairs, and a secret in the input: the flags that do not fit stay out.
        full = {f"key{i}": "v" for i in range(16)}
        body = {"input": "my key is AKIAIOSFODNN7EXAMPLE", "metadata": full}
        reply = http.post(f"{server.http_url}/v1/responses", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["metadata"] == full
        fifteen = {f"key{i}": "v" for i in range(15)}
        reply = http.post(f"{server.http_url}/v1/responses", json={**body, "metadata": fifteen})
        metadata = reply.json()["metadata"]
        assert len(metadata) == 16
        assert metadata["secrets_flagged"] == "1"


def test_the_newer_features_responses_hold_to_the_published_resource(server: Any) -> None:
    """Background (queued, polled, streamed, cancelled), compaction and the
    multi-agent beta: every Response they emit, against the schema file and
    the SDK's model."""
    from tests.serve.http.test_response_resource import conforms

    seen: list[dict[str, Any]] = []
    base = server.http_url
    with httpx.Client(timeout=30) as http:
        # Background: the answer to the create, a poll, the stream, the stored result.
        slow = {"sim_output_tokens": "40", "sim_tokens_per_second": "400"}
        body = {"input": "hello", "background": True, "metadata": slow}
        created = http.post(f"{base}/v1/responses", json=body).json()
        seen.append(created)
        seen.append(http.get(f"{base}/v1/responses/{created['id']}").json())
        with http.stream("GET", f"{base}/v1/responses/{created['id']}?stream=true") as stream:
            for line in stream.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    event = json.loads(line.removeprefix("data: "))
                    if "response" in event:
                        seen.append(event["response"])
        seen.append(poll(http, base, created["id"]))
        # A cancelled one.
        body = {**body, "metadata": {"sim_output_tokens": "5000", "sim_tokens_per_second": "50"}}
        running = http.post(f"{base}/v1/responses", json=body).json()
        seen.append(http.post(f"{base}/v1/responses/{running['id']}/cancel").json())
        seen.append(http.get(f"{base}/v1/responses/{running['id']}").json())
        # Server-side compaction in a response.
        long_output = {"type": "function_call_output", "call_id": "call_a", "output": "x " * 1500}
        compacting = {
            "input": [*CONVERSATION[:2], long_output],
            "context_management": [{"type": "compaction", "compact_threshold": 1000}],
        }
        seen.append(http.post(f"{base}/v1/responses", json=compacting).json())
        assert seen[-1]["output"][0]["type"] == "compaction"
    # The multi-agent beta over the WebSocket.
    client = openai_client(server)
    with client.beta.responses.connect(
        extra_headers={"OpenAI-Beta": "responses_multi_agent=v1"}
    ) as conn:
        conn.response.create(
            model="sim",
            input="Read it.",
            tools=[READ_FILE],
            store=False,
            multi_agent={"enabled": True},
        )
        rid = None
        while True:  # the raw frames, as they came
            event = json.loads(conn.recv_bytes())
            if event["type"] == "response.created":
                rid = event["response"]["id"]
                seen.append(event["response"])
            item = event.get("item") or {}
            if event["type"] == "response.output_item.done" and item["type"] == "function_call":
                output = {"type": "function_call_output", "call_id": item["call_id"], "output": "x"}
                conn.response.inject(input=[output], response_id=rid)
            if event["type"] == "response.completed":
                seen.append(event["response"])
                break
    statuses = {response["status"] for response in seen}
    assert {"queued", "completed", "cancelled"} <= statuses
    for response in seen:
        conforms(response)


def test_a_warm_up_refuses_a_compaction_trigger(server: Any) -> None:
    trigger = [*CONVERSATION, {"type": "compaction_trigger"}]
    with httpx.Client(timeout=30) as http:
        for warm in ({"generate": False}, {"prompt_cache_options": {"prewarm": True}}):
            reply = http.post(
                f"{server.http_url}/v1/responses", json={"input": trigger, "store": False, **warm}
            )
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            assert (error["code"], error["param"]) == ("invalid_value", "input[3].type")


def test_a_literal_route_answers_405_to_another_method(server: Any) -> None:
    """``/v1/responses/compact`` is its own route, not a response id."""
    with httpx.Client(timeout=30) as http:
        for path in ("/v1/responses/compact", "/v1/responses/input_tokens"):
            for method in ("GET", "DELETE"):
                reply = http.request(method, f"{server.http_url}{path}")
                assert reply.status_code == 405, (method, path, reply.text)
                assert reply.json()["error"]["code"] == "method_not_allowed"
                assert reply.headers["allow"] == "POST"
        # A real response id still reads as one.
        created = http.post(f"{server.http_url}/v1/responses", json={"input": "hi"}).json()
        assert http.get(f"{server.http_url}/v1/responses/{created['id']}").status_code == 200


def test_a_message_cut_by_max_output_tokens_is_incomplete(server: Any) -> None:
    client = openai_client(server)
    response = client.responses.create(
        model="sim", input="Tell me everything.", max_output_tokens=3, store=False
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    (message,) = [item for item in response.output if item.type == "message"]
    assert message.status == "incomplete"
    whole = client.responses.create(model="sim", input="Tell me everything.", store=False)
    assert whole.output[-1].status == "completed"
