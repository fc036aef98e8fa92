"""``POST /v1/responses/input_tokens``, driven by the official SDK's ``input_tokens.count``.

The count is the ``usage.input_tokens`` the same body gets from a create;
the request is checked as a create is, and nothing is stored, billed or run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from longresponse.config import SimConfig
from tests.serve.ws.test_shipped_ws import WEATHER
from tests.support.error_replies import assert_refused
from tests.support.http_clients import openai_client, post

COUNT = "/v1/responses/input_tokens"

BODY = {
    "model": "sim",
    "instructions": "You are terse.",
    "tools": [WEATHER],
    "input": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And"}]},
    ],
}


def ledger(server: Any) -> list[Any]:
    persistence = server.app.parts.persistence
    future = asyncio.run_coroutine_threadsafe(persistence.store.usage(), server.app.parts.loop)
    return list(future.result(5))


def test_count_equals_the_input_a_create_reads(server: Any) -> None:
    client = openai_client(server)
    before = ledger(server)
    resolutions = server.app.parts.models.resolutions
    counted = client.responses.input_tokens.count(**BODY)
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens > 0
    # Nothing stored, billed or sampled: the ledger has no new record.
    assert ledger(server) == before
    assert server.app.parts.models.resolutions == resolutions + 1  # resolved, not run
    created = client.responses.create(**BODY)
    assert created.usage is not None
    assert created.usage.input_tokens == counted.input_tokens
    # A continuation from the store: the whole chain counts, as HTTP reads it.
    call = created.output[0]
    assert call.type == "function_call"
    follow = {
        "model": "sim",
        "tools": [WEATHER],
        "previous_response_id": created.id,
        "input": [{"type": "function_call_output", "call_id": call.call_id, "output": "rain"}],
    }
    counted_next = client.responses.input_tokens.count(**follow)
    assert counted_next.input_tokens > counted.input_tokens
    continued = client.responses.create(**follow)
    assert continued.usage is not None
    assert continued.usage.input_tokens == counted_next.input_tokens


def test_count_follows_the_window_rules(make_server: Any) -> None:
    small = make_server(sim=SimConfig(context_window=80))
    client = openai_client(small)
    long_input = [{"role": "user", "content": f"message {i} " + "word " * 20} for i in range(6)]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.input_tokens.count(model="sim", input=long_input)
    assert refused.value.code == "context_length_exceeded"
    assert refused.value.param == "input"
    kept = client.responses.input_tokens.count(model="sim", input=long_input, truncation="auto")
    assert 0 < kept.input_tokens <= 80
    created = client.responses.create(model="sim", input=long_input, truncation="auto")
    assert created.usage is not None
    assert created.usage.input_tokens == kept.input_tokens


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        pytest.param("{nope", 400, "invalid_json", None, id="malformed"),
        pytest.param({"input": 3}, 400, "invalid_type", "input", id="wrong-type"),
        pytest.param({"input": "x", "store": False}, 400, "unknown_parameter", "store",
                     id="create-only-field"),
        pytest.param({"input": "x", "stream": True}, 400, "unknown_parameter", "stream",
                     id="stream"),
        pytest.param({"input": "x", "frobnicate": 1}, 400, "unknown_parameter", "frobnicate",
                     id="unknown-field"),
        pytest.param({"input": "x", "model": "gpt-9"}, 404, "model_not_found", "model",
                     id="unknown-model"),
        pytest.param({"input": "x", "previous_response_id": "resp_nope"}, 400,
                     "previous_response_not_found", "previous_response_id", id="unknown-parent"),
        pytest.param({"input": [{"role": "user"}]}, 400, "missing_required_parameter",
                     "input[0].content", id="missing-content"),
        pytest.param({"input": [{"type": "function_call_output", "call_id": "c", "output": ""}]},
                     400, "unknown_call_id", "input[0].call_id", id="orphan-output"),
        pytest.param({"input": "x", "tools": [{**WEATHER, "name": "bad name"}]}, 400,
                     "invalid_value", "tools[0].name", id="bad-tool-name"),
        pytest.param(
            {"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "strict": True,
                                               "schema": {"type": "array"}}}},
            400, "invalid_value", "text.format.schema", id="unusable-schema",
        ),
    ],
)  # fmt: skip
def test_bad_input(server: Any, body: Any, status: int, code: str, param: str | None) -> None:
    assert_refused(post(server, body, path=COUNT, timeout=10), code, param, status=status)
    fine = post(server, {"input": "fine"}, path=COUNT, timeout=10)
    assert fine.json()["object"] == "response.input_tokens"


def test_pending_calls_must_be_answered(server: Any) -> None:
    client = openai_client(server)
    created = client.responses.create(model="sim", input="weather?", tools=[WEATHER])
    with pytest.raises(openai.BadRequestError) as missing:
        client.responses.input_tokens.count(
            model="sim", previous_response_id=created.id, input="never mind"
        )
    assert (missing.value.code, missing.value.param) == ("missing_tool_output", "input")


def test_keys_and_owners(make_server: Any) -> None:
    keyed = make_server(api_keys=("key-one", "key-two"))
    assert post(keyed, {"input": "x"}, path=COUNT, timeout=10).status_code == 401
    wrong = post(keyed, {"input": "x"}, path=COUNT, key="nope", timeout=10)
    assert wrong.json()["error"]["code"] == "invalid_api_key"
    one, two = openai_client(keyed, "key-one"), openai_client(keyed, "key-two")
    mine = one.responses.create(model="sim", input="mine")
    assert one.responses.input_tokens.count(previous_response_id=mine.id, input="more").input_tokens
    with pytest.raises(openai.BadRequestError) as foreign:
        two.responses.input_tokens.count(previous_response_id=mine.id, input="more")
    assert foreign.value.code == "previous_response_not_found"
