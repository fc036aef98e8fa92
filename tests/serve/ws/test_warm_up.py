"""Warm-up in both spellings, on HTTP and the shipped WebSocket shape, and honest cache usage.

``generate: false`` and ``prompt_cache_options: {"prewarm": true}`` (which
forces ``generate`` to false) take the input in without sampling. Every
Response's usage splits its input: ``cached_tokens`` (processed by an earlier
turn) + ``cache_write_tokens`` (written to the rollout's cache by this one).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import openai_client
from tests.serve.http.test_response_resource import conforms, shipped_turn, sse_events
from tests.serve.ws.test_shipped_ws import STRICT, WEATHER, check_turn_shape, turn

WARM_TYPES = ["response.created", "response.in_progress", "response.completed"]


def honest(usage: Any) -> None:
    details = usage.input_tokens_details
    assert details.cached_tokens + details.cache_write_tokens == usage.input_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


@pytest.mark.parametrize(
    "spelling",
    [
        pytest.param({"extra_body": {"generate": False}}, id="generate-false"),
        pytest.param({"prompt_cache_options": {"prewarm": True}}, id="prewarm"),
        pytest.param(
            {
                "prompt_cache_options": {"prewarm": True, "ttl": "30m"},
                "extra_body": {"generate": True},
            },
            id="prewarm-forces-generate-false",
        ),
    ],
)
def test_http_warm_up_then_chain(server: Any, spelling: dict[str, Any]) -> None:
    client = openai_client(server)
    warm = client.responses.create(
        model="sim", input="warm me up", instructions="Be brief.", tools=[WEATHER], **spelling
    )
    assert warm.status == "completed"
    assert warm.output == []
    assert warm.usage is not None
    honest(warm.usage)
    assert warm.usage.output_tokens == 0
    # HTTP keeps nothing between requests: the warm-up wrote the whole context.
    assert warm.usage.input_tokens_details.cached_tokens == 0
    assert warm.usage.input_tokens_details.cache_write_tokens == warm.usage.input_tokens > 0
    conforms(client.responses.with_raw_response.retrieve(warm.id).http_response.json())
    # The warm-up's id chains (from the store) like any other.
    after = client.responses.create(
        model="sim", previous_response_id=warm.id, input="now go", tools=[WEATHER]
    )
    assert after.status == "completed"
    assert [item.type for item in after.output] == ["function_call"]
    assert after.usage is not None
    honest(after.usage)
    assert after.usage.input_tokens > warm.usage.input_tokens


def test_http_warm_up_streams_three_events(server: Any) -> None:
    events = sse_events(server, {"model": "sim", "input": "warm", "generate": False})
    assert [e["type"] for e in events] == WARM_TYPES
    assert events[-1]["response"]["output"] == []
    conforms(events[-1]["response"])


@pytest.mark.parametrize("spelling", ["generate", "prewarm"])
def test_websocket_warm_up_is_read_as_cached_next_turn(server: Any, spelling: str) -> None:
    fields: dict[str, Any] = {"generate": False}
    if spelling == "prewarm":
        fields = {"prompt_cache_options": {"prewarm": True}}
    client = openai_client(server)
    with client.responses.connect() as conn:
        conn.response.create(
            model="sim", input="warm me up", tools=[WEATHER], store=False, **fields
        )
        warm = turn(conn)
        assert [e.type for e in warm] == WARM_TYPES
        usage = warm[-1].response.usage
        honest(usage)
        assert usage.input_tokens_details.cached_tokens == 0
        assert usage.input_tokens_details.cache_write_tokens == usage.input_tokens > 0
        conn.response.create(
            model="sim",
            previous_response_id=warm[-1].response.id,
            input="now go",
            tools=[WEATHER],
            store=False,
        )
        events = turn(conn)
        check_turn_shape(events)
        after = events[-1].response.usage
        honest(after)
        # The prewarmed context is in the cache: the next turn reads it cached
        # and writes only its own new input.
        assert after.input_tokens_details.cached_tokens == usage.input_tokens
        assert 0 < after.input_tokens_details.cache_write_tokens < usage.input_tokens


def test_cache_usage_of_a_chain(server: Any) -> None:
    client = openai_client(server)
    with client.responses.connect() as conn:
        conn.response.create(model="sim", input="first", tools=[WEATHER], store=False)
        first = turn(conn)
        call = next(e.item for e in first if e.type == "response.output_item.done")
        conn.response.create(
            model="sim",
            previous_response_id=first[-1].response.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sun"}],
            tools=[WEATHER],
            store=False,
        )
        second = turn(conn)
    one, two = first[-1].response.usage, second[-1].response.usage
    honest(one)
    honest(two)
    assert one.input_tokens_details.cached_tokens == 0  # nothing processed before turn 1
    # Turn 2 reads turn 1's whole context (its call included) from the cache.
    assert two.input_tokens_details.cached_tokens > one.input_tokens
    assert two.input_tokens_details.cache_write_tokens > 0


PCO = "prompt_cache_options"


@pytest.mark.parametrize(
    ("field", "value", "code", "param"),
    [
        ("generate", "no", "invalid_type", "generate"),
        (PCO, {"prewarm": "yes"}, "invalid_type", f"{PCO}.prewarm"),
        (PCO, {"ttl": "1h"}, "invalid_value", f"{PCO}.ttl"),
        (PCO, {"mode": "never"}, "invalid_value", f"{PCO}.mode"),
        (PCO, True, "invalid_type", PCO),
    ],
)
def test_bad_warm_up_fields(server: Any, field: str, value: Any, code: str, param: str) -> None:
    reply = httpx.post(
        f"{server.http_url}/v1/responses", json={"input": "x", field: value}, timeout=10
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
    client = openai_client(server)
    with client.responses.connect() as conn:
        conn.send_raw(json.dumps({"type": "response.create", "input": "x", field: value}))
        event = STRICT.validate_json(conn.recv_bytes())
        assert event.type == "error"
        assert (event.error.code, event.error.param, event.status) == (code, param, 400)
        conn.response.create(model="sim", input="still here", generate=False)
        assert [f["type"] for f in shipped_turn(conn)] == WARM_TYPES
