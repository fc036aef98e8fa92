"""The chat endpoint under hostile and unusual input: bounded work, tenants
kept apart, slow readers dropped, the SDK's own objects accepted.

Each test drives the real server with the official ``openai`` SDK where the
point is interoperability, and with ``httpx`` or a raw socket where it sends
what the SDK will not (bad input, a reader that never reads).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import httpx
import openai
import pytest

from longresponse.backends.sim.structured import value_for_schema
from longresponse.config import MAX_SCHEMA_WIDTH, MAX_TOOLS
from longresponse.engine.sampling import ModelSpec, SampleChunk, SampleRequest, TextDelta
from longresponse.engine.structured import MAX_SCHEMA_COUNT, MAX_SCHEMA_DEPTH
from longresponse.json_schema import pattern_matches
from tests.support.error_replies import assert_refused
from tests.support.http_clients import openai_client, read_until_closed, stalled_post
from tests.support.waiting import wait_for

GOOD = {"model": "sim", "messages": [{"role": "user", "content": "Hi"}]}
TOOL_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def nested(depth: int) -> dict[str, Any]:
    """An object schema ``depth`` levels of ``properties`` deep (two JSON levels each)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def json_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


# --- bounded work ---------------------------------------------------------------

HUGE = [
    {"type": "object", "properties": {"a": {"type": "array", "minItems": 1_000_000}}},
    {"type": "object", "properties": {"a": {"type": "string", "minLength": 10**12}}},
    {"type": "object", "minProperties": MAX_SCHEMA_COUNT + 1},
    nested(MAX_SCHEMA_DEPTH),  # 128 levels of JSON: past the cap
    nested(200),  # past what the metaschema check itself can recurse
]


@pytest.mark.parametrize("schema", HUGE)
def test_a_schema_asking_for_unbounded_work_is_refused_on_both_endpoints(
    server: Any, schema: dict[str, Any]
) -> None:
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        chat_body = {**GOOD, "response_format": json_format(schema)}
        chat = http.post("/v1/chat/completions", json=chat_body)
        assert_refused(chat, "invalid_value", "response_format.json_schema.schema")
        text = {"format": {"type": "json_schema", "name": "answer", "schema": schema}}
        responses = http.post("/v1/responses", json={"model": "sim", "input": "Hi", "text": text})
        assert_refused(responses, "invalid_value", "text.format.schema")
        # The connection stays usable.
        assert http.post("/v1/chat/completions", json=GOOD).status_code == 200


@pytest.mark.parametrize("depth", [MAX_SCHEMA_DEPTH, 200])
def test_tool_parameters_nested_too_deep_are_refused_on_both_endpoints(
    server: Any, depth: int
) -> None:
    parameters = {"type": "object", "properties": {"a": nested(depth)}}
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        tool = {"type": "function", "function": {"name": "deep", "parameters": parameters}}
        chat = http.post("/v1/chat/completions", json={**GOOD, "tools": [tool]})
        assert_refused(chat, "invalid_value", "tools[0].function.parameters")
        flat = {"type": "function", "name": "deep", "parameters": parameters}
        responses = http.post("/v1/responses", json={"model": "sim", "input": "x", "tools": [flat]})
        assert_refused(responses, "invalid_value", "tools[0].parameters")


def test_a_backtracking_pattern_is_matched_in_linear_time() -> None:
    # Python's re takes about 2**n steps here (5 s at n=26); RE2 is linear.
    assert not pattern_matches("(x+)+y", "x" * 10_000)
    assert pattern_matches("(x+)+y", "x" * 10_000 + "y")


def test_a_backtracking_pattern_gets_its_answer(server: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"x": {"type": "string", "pattern": "(x+)+y"}},
        "required": ["x"],
    }
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        body = {**GOOD, "messages": [user("x" * 26)], "response_format": json_format(schema)}
        answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    content = json.loads(answer.json()["choices"][0]["message"]["content"])
    assert pattern_matches("(x+)+y", content["x"])


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)b", r"(?<!a)b", "x{1000}{1000}"])
def test_a_pattern_re2_cannot_run_is_refused_where_it_stands(server: Any, pattern: str) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": pattern}}}
    where = ".properties.name.pattern"
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        chat = http.post(
            "/v1/chat/completions", json={**GOOD, "response_format": json_format(schema)}
        )
        assert_refused(chat, "invalid_value", "response_format.json_schema.schema" + where)
        text = {"format": {"type": "json_schema", "name": "answer", "schema": schema}}
        responses = http.post("/v1/responses", json={"model": "sim", "input": "Hi", "text": text})
        assert_refused(responses, "invalid_value", "text.format.schema" + where)
        assert "RE2" in responses.json()["error"]["message"]
        flat = {"type": "function", "name": "f", "parameters": schema}
        tools = http.post("/v1/responses", json={"model": "sim", "input": "x", "tools": [flat]})
        assert_refused(tools, "invalid_value", "tools[0].parameters" + where)
        tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
        chat = http.post("/v1/chat/completions", json={**GOOD, "tools": [tool]})
        assert_refused(chat, "invalid_value", "tools[0].function.parameters" + where)


def test_more_tools_than_the_limit_are_refused_on_every_endpoint(server: Any) -> None:
    def flat(count: int) -> list[dict[str, Any]]:
        return [
            {"type": "function", "name": f"t{i}", "parameters": TOOL_PARAMS} for i in range(count)
        ]

    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        body = {"model": "sim", "input": "x", "tools": flat(MAX_TOOLS + 1)}
        assert_refused(http.post("/v1/responses", json=body), "invalid_value", "tools")
        assert_refused(http.post("/v1/responses/input_tokens", json=body), "invalid_value", "tools")
        chat_tools = [
            {"type": "function", "function": {"name": f"t{i}", "parameters": TOOL_PARAMS}}
            for i in range(MAX_TOOLS + 1)
        ]
        assert_refused(
            http.post("/v1/chat/completions", json={**GOOD, "tools": chat_tools}),
            "invalid_value",
            "tools",
        )
        body = {"model": "sim", "input": "x", "tools": flat(MAX_TOOLS)}
        assert http.post("/v1/responses/input_tokens", json=body).status_code == 200


def wide(count: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(count)}}


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        (wide(MAX_SCHEMA_WIDTH + 1), "members in one object"),
        (
            {
                "type": "object",
                "properties": {f"g{i}": wide(MAX_SCHEMA_WIDTH - 1) for i in range(6)},
            },
            "objects and arrays",
        ),
    ],
)
def test_a_schema_too_wide_or_too_big_is_refused_before_the_metaschema_check(
    server: Any, schema: dict[str, Any], why: str
) -> None:
    # The message is the walk's: the metaschema check (0.4 ms a property) never ran.
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        chat = http.post(
            "/v1/chat/completions", json={**GOOD, "response_format": json_format(schema)}
        )
        assert_refused(chat, "invalid_value", "response_format.json_schema.schema")
        assert why in chat.json()["error"]["message"]
        flat = {"type": "function", "name": "f", "parameters": schema}
        tools = http.post("/v1/responses", json={"model": "sim", "input": "x", "tools": [flat]})
        assert_refused(tools, "invalid_value", "tools[0].parameters")
        assert why in tools.json()["error"]["message"]


def test_nested_arrays_stop_at_the_token_budget(server: Any) -> None:
    # Each level is within the cap, but together 10^12 strings: the budget ends it.
    inner = {"type": "array", "minItems": MAX_SCHEMA_COUNT, "items": {"type": "string"}}
    outer = {"type": "array", "minItems": MAX_SCHEMA_COUNT, "items": inner}
    schema = {"type": "object", "properties": {"grid": outer}}
    completion = openai_client(server).chat.completions.create(
        model="sim",
        messages=[user("Fill the grid.")],
        response_format=json_format(schema),  # type: ignore[arg-type]
        max_tokens=200,
        timeout=30,
    )
    [choice] = completion.choices
    assert choice.finish_reason == "length"
    assert completion.usage is not None
    assert 0 < completion.usage.completion_tokens <= 200


def test_the_generator_charges_every_value_to_the_budget() -> None:
    big = value_for_schema({"type": "array", "minItems": 10**9}, "x", budget=100)
    assert 0 < len(big) <= 100
    padded = value_for_schema({"type": "string", "minLength": 10**9}, "x", budget=10)
    assert 1 <= len(padded) <= 10 * 64


def test_a_recursive_ref_gets_an_answer_not_a_crash(server: Any) -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
    client = openai_client(server)
    completion = client.chat.completions.create(
        model="sim",
        messages=[user("Recurse.")],
        response_format=json_format(schema),  # type: ignore[arg-type]
    )
    [choice] = completion.choices
    assert choice.finish_reason == "length"  # no finite value exists: cut, not crashed
    assert choice.message.content is not None
    assert choice.message.content.startswith('{"a":{"a":')
    stream = client.chat.completions.create(
        model="sim",
        messages=[user("Recurse.")],
        response_format=json_format(schema),  # type: ignore[arg-type]
        stream=True,
    )
    finishes = [c.choices[0].finish_reason for c in stream if c.choices]
    assert finishes[-1] == "length"
    # And on the Responses API, which shares the generator.
    text = {"format": {"type": "json_schema", "name": "answer", "schema": schema}}
    response = httpx.post(
        f"{server.http_url}/v1/responses", json={"model": "sim", "input": "x", "text": text}
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "incomplete"


# --- a model that fails ------------------------------------------------------------


class _Failing:
    """A sampler that says one word, then raises."""

    async def sample(self, request: SampleRequest) -> AsyncGenerator[SampleChunk, None]:
        yield TextDelta("Hello")
        raise RuntimeError("the accelerator caught fire")


def test_a_model_that_raises_gets_the_envelope_not_a_reset(server: Any) -> None:
    server.app.parts.chat.models.add(
        ModelSpec(
            name="sim-broken",
            context_window=100_000,
            max_output_tokens=1000,
            make_sampler=_Failing,
        )
    )
    body = {**GOOD, "model": "sim-broken"}
    with httpx.Client(base_url=server.http_url) as http:
        answer = http.post("/v1/chat/completions", json=body)
        assert answer.status_code == 500
        assert answer.json()["error"]["type"] == "server_error"
        assert answer.json()["error"]["code"] == "server_error"
        streamed = http.post("/v1/chat/completions", json={**body, "stream": True})
        assert streamed.status_code == 200
        records = [r for r in streamed.text.split("\n\n") if r]
        assert records[-1] == "data: [DONE]"
        assert json.loads(records[-2][6:])["error"]["code"] == "server_error"
        assert json.loads(records[0][6:])["choices"][0]["delta"]["content"] == "Hello"
        assert http.post("/v1/chat/completions", json=GOOD).status_code == 200
    with pytest.raises(openai.APIError) as failed:
        for _ in openai_client(server).chat.completions.create(**body, stream=True):  # type: ignore[call-overload]
            pass
    assert "model failed" in failed.value.message


# --- tenants ----------------------------------------------------------------------


def test_one_key_cannot_see_anothers_prompt_in_the_cache(make_server: Any) -> None:
    running = make_server(api_keys=("key-alice", "key-bob"))
    secret = [
        {"role": "system", "content": "Alice's confidential plan: " + "merger terms. " * 40},
        user("summarize"),
    ]
    alice = openai_client(running, key="key-alice")
    bob = openai_client(running, key="key-bob")
    cached = [
        cached_tokens(client.chat.completions.create(model="sim", messages=secret))
        for client in (alice, alice, bob)
    ]
    assert cached[0] == 0
    assert cached[1] > 0  # the owner's own cache works
    assert cached[2] == 0  # but nobody else's


def test_one_key_at_its_in_flight_limit_does_not_stop_another(make_server: Any) -> None:
    """keyA at ``--chat-max-in-flight-per-key`` gets 429 with the shipped
    envelope; keyB is still served (the limit in all, 2, was keyA's to fill)."""
    keyed = make_server(
        api_keys=("key-a", "key-b"), chat_max_in_flight=2, chat_max_in_flight_per_key=1
    )
    chat = keyed.app.parts.chat
    slow = {"sim_output_tokens": "100000", "sim_tokens_per_second": "5"}
    a = openai_client(keyed, "key-a")
    held = a.chat.completions.create(
        model="sim", messages=[user("long")], stream=True, metadata=slow
    )
    with held:
        next(iter(held))  # running: its first chunk is out
        url = f"{keyed.http_url}/v1/chat/completions"
        refused = httpx.post(url, json=GOOD, headers={"authorization": "Bearer key-a"})
        served = httpx.post(url, json=GOOD, headers={"authorization": "Bearer key-b"})
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "rate_limit_error",
        "rate_limit_exceeded",
        None,
    )
    assert "this API key" in error["message"]
    assert served.status_code == 200, served.text
    assert served.json()["choices"][0]["finish_reason"] == "stop"
    wait_for(lambda: chat.running == 0, "keyA's stream to end")
    again = httpx.post(url, json=GOOD, headers={"authorization": "Bearer key-a"})
    assert again.status_code == 200, again.text


def cached_tokens(completion: Any) -> int:
    assert completion.usage is not None
    assert completion.usage.prompt_tokens_details is not None
    count: int = completion.usage.prompt_tokens_details.cached_tokens
    return count


# --- slow readers -----------------------------------------------------------------


@pytest.mark.slow  # waits out the slow-reader timeout
def test_a_stalled_reader_of_a_stream_that_fits_the_queue_is_dropped(
    make_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rest of the stream fits the queue whenever it is shorter than the
    # socket buffers plus the queue; a queue deeper than the whole stream
    # makes that so on any machine (the server runs in this process).
    monkeypatch.setattr("longresponse.serve.http.chat.SSE_QUEUE_DEPTH", 1 << 20)
    running = make_server(slow_reader_timeout=0.5)
    chat = running.app.parts.chat
    body = {**GOOD, "stream": True, "metadata": {"sim_output_tokens": "50000"}}
    with stalled_post(running.port, "/v1/chat/completions", body) as sock:
        wait_for(lambda: chat.requests == 1, "the request")
        # Never reading: the whole answer is generated, but its reader never
        # takes it, so the connection is dropped within the timeout.
        wait_for(lambda: chat.running == 0 and chat.stopped == 1, "the reader's drop", 20)
        received = read_until_closed(sock)
    assert received.startswith(b"HTTP/1.1 200")
    assert b"data: [DONE]" not in received


# --- params ---------------------------------------------------------------------------


def test_a_bad_json_schema_name_names_the_chat_param(server: Any) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "no spaces", "schema": TOOL_PARAMS}}
    answer = httpx.post(
        f"{server.http_url}/v1/chat/completions", json={**GOOD, "response_format": bad}
    )
    assert_refused(answer, "invalid_value", "response_format.json_schema.name")
    assert "response_format.json_schema.name" in answer.json()["error"]["message"]


# --- the SDK's own messages -------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}


def test_the_sdks_own_messages_go_back_as_they_came(server: Any) -> None:
    client = openai_client(server)
    messages: list[Any] = [user("What is the weather in Paris?")]
    with client.chat.completions.stream(model="sim", messages=messages, tools=[WEATHER]) as stream:
        for _ in stream:
            pass
        message = stream.get_final_completion().choices[0].message
    [call] = message.tool_calls or []
    assert call.function.parsed_arguments == {"city": "city-0"}
    # The parsed message object itself (annotations, parsed, parsed_arguments...).
    messages += [message, {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    answer = client.chat.completions.create(model="sim", messages=messages, tools=[WEATHER])
    assert answer.choices[0].finish_reason == "stop"
    assert "sunny" in (answer.choices[0].message.content or "")
    # And as plain dicts, every field model_dump() gives (nulls included).
    messages += [answer.choices[0].message.model_dump(), user("And in Rome?")]
    again = client.chat.completions.create(model="sim", messages=messages, tools=[WEATHER])
    [called] = again.choices[0].message.tool_calls or []
    dumped = again.choices[0].message.model_dump()
    assert set(dumped) >= {"annotations", "audio", "function_call", "refusal"}
    messages += [dumped, {"role": "tool", "tool_call_id": called.id, "content": "rainy"}]
    parsed = client.chat.completions.parse(model="sim", messages=messages, tools=[WEATHER])
    assert "rainy" in (parsed.choices[0].message.content or "")
    messages += [parsed.choices[0].message.model_dump(), user("Thanks.")]
    last = client.chat.completions.create(model="sim", messages=messages)
    assert last.choices[0].finish_reason == "stop"


# --- tool_choice ---------------------------------------------------------------------


def test_a_forced_tool_choice_calls_again_after_a_result(server: Any) -> None:
    client = openai_client(server)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice, finish in (("required", "tool_calls"), (named, "stop")):
        messages: list[Any] = [user("Weather?")]
        for _ in range(3):  # a call every turn, results or not
            completion = client.chat.completions.create(
                model="sim",
                messages=messages,
                tools=[WEATHER],
                tool_choice=choice,  # type: ignore[arg-type]
            )
            [picked] = completion.choices
            assert picked.finish_reason == finish
            [call] = picked.message.tool_calls or []
            assert call.function.name == "get_weather"
            messages += [
                picked.message.model_dump(),
                {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
            ]
    # The Responses API forces a call the same way.
    flat = {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]
    first = client.responses.create(model="sim", input="Weather?", tools=[flat])
    [call] = [item for item in first.output if item.type == "function_call"]
    second = client.responses.create(
        model="sim",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[flat],
        tool_choice="required",
    )
    assert [item.type for item in second.output] == ["function_call"]


# --- nonsense refused, gateway defaults accepted ---------------------------------------

NOT_AN_OBJECT = {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
UNTYPED_CALL = {"id": "call_1", "function": {"name": "get_weather", "arguments": "{}"}}
NONSENSE = [
    (
        {"messages": [{"role": "user", "content": [{"text": "x"}]}]},
        "missing_required_parameter",
        "messages[0].content[0].type",
    ),
    (
        {"messages": [user("x"), {"role": "assistant", "tool_calls": [UNTYPED_CALL]}]},
        "missing_required_parameter",
        "messages[1].tool_calls[0].type",
    ),
    ({"messages": [{"role": "user", "content": []}]}, "invalid_value", "messages[0].content"),
    ({"tools": [NOT_AN_OBJECT]}, "invalid_value", "tools[0].function.parameters"),
    ({"seed": 2**64}, "invalid_value", "seed"),
    ({"max_tokens": 10**8}, "invalid_value", "max_tokens"),
    ({"max_completion_tokens": 10**8}, "invalid_value", "max_completion_tokens"),
    ({"logprobs": True}, "unsupported_parameter", "logprobs"),
    ({"top_logprobs": 2}, "unsupported_parameter", "top_logprobs"),
    ({"stop": ["\n"]}, "unsupported_parameter", "stop"),
    ({"logit_bias": {"50256": -100}}, "unsupported_parameter", "logit_bias"),
    ({"reasoning_effort": "low"}, "unsupported_parameter", "reasoning_effort"),
    ({"modalities": ["text", "audio"]}, "unsupported_parameter", "modalities"),
]


@pytest.mark.parametrize(("change", "code", "param"), NONSENSE)
def test_nonsense_is_refused_with_its_param(
    server: Any, change: dict[str, Any], code: str, param: str
) -> None:
    with httpx.Client(base_url=server.http_url) as http:
        assert_refused(http.post("/v1/chat/completions", json={**GOOD, **change}), code, param)
        assert http.post("/v1/chat/completions", json=GOOD).status_code == 200


def test_a_tool_whose_parameters_are_not_an_object_is_refused_by_responses_too(
    server: Any,
) -> None:
    flat = {"type": "function", "name": "f", "parameters": {"type": "string"}}
    answer = httpx.post(
        f"{server.http_url}/v1/responses", json={"model": "sim", "input": "x", "tools": [flat]}
    )
    assert_refused(answer, "invalid_value", "tools[0].parameters")


def test_what_gateways_send_by_default_is_accepted(server: Any) -> None:
    body = {
        **GOOD,
        "stream": True,
        "stream_options": {"include_usage": True, "include_obfuscation": True},
        "logprobs": False,
        "stop": None,
        "service_tier": "auto",
        "seed": 2**63 - 1,
        "logit_bias": None,
        "prompt_cache_retention": "in-memory",
    }
    answer = httpx.post(f"{server.http_url}/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    records = [r for r in answer.text.split("\n\n") if r]
    assert records[-1] == "data: [DONE]"
    chunks = [json.loads(record[6:]) for record in records[:-1]]
    assert all(chunk["system_fingerprint"] is None for chunk in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    # The SDK sends the same with its own types.
    stream = openai_client(server).chat.completions.create(
        model="sim",
        messages=[user("Hi")],
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": True},
        logprobs=False,
        stop=None,
        service_tier="auto",
    )
    read = list(stream)
    assert read[-1].usage is not None
    assert all(chunk.system_fingerprint is None for chunk in read)


def test_an_unset_max_tokens_is_what_the_window_leaves(make_server: Any) -> None:
    from longresponse.config import SimConfig

    running = make_server(sim=SimConfig(context_window=200))
    client = openai_client(running)
    messages = [user("word " * 150)]
    long = {"sim_output_tokens": "1000"}
    completion = client.chat.completions.create(model="sim", messages=messages, metadata=long)
    assert completion.usage is not None
    assert completion.choices[0].finish_reason == "length"
    room = 200 - completion.usage.prompt_tokens
    assert 0 < completion.usage.completion_tokens <= room
    exact = client.chat.completions.create(
        model="sim", messages=messages, metadata=long, max_tokens=room
    )
    assert exact.choices[0].finish_reason == "length"
    assert exact.usage is not None
    assert exact.usage.completion_tokens == completion.usage.completion_tokens
    with pytest.raises(openai.BadRequestError) as refused_more:
        client.chat.completions.create(
            model="sim", messages=messages, metadata=long, max_tokens=room + 1
        )
    assert refused_more.value.param == "max_tokens"
