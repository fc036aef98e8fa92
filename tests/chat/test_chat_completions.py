"""``POST /v1/chat/completions`` and ``POST /tokenize``, driven by the official ``openai`` SDK.

The SDK parses every answer and every stream (its ``ChatCompletionStreamState``
accumulates tool-call deltas by index, as engines stream them), so these
tests prove the endpoint speaks the format a Chat Completions client expects;
raw ``httpx`` sends what the SDK will not (bad input), and reads a stream it
then walks away from.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any

import httpx
import msgspec
import openai
import pytest

from longresponse.chat.mapping import items_from_messages, messages_from_items
from longresponse.chat.prefix_cache import BLOCK_TOKENS, ENTRY_BYTES, PrefixCache, block_digests
from longresponse.chat.wire import (
    ChatRequest,
    decode_chat_chunk,
    decode_chat_completion,
    decode_chat_request,
)
from longresponse.config import SimConfig
from tests.support.http_clients import openai_client, read_until_closed, stalled_post
from tests.support.waiting import wait_for

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
    },
}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def tokenize(server: Any, **body: Any) -> dict[str, Any]:
    answer = httpx.post(f"{server.http_url}/tokenize", json={"model": "sim", **body})
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


# --- answers -------------------------------------------------------------------


def test_a_completion_answers_and_reports_usage(server: Any) -> None:
    client = openai_client(server)
    question = f"What is the capital of France? {uuid.uuid4()}"
    completion = client.chat.completions.create(
        model="sim",
        messages=[{"role": "system", "content": "Be terse."}, user(question)],
        temperature=0.2,
        top_p=0.9,
        user="someone",
    )
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == "sim"
    assert completion.created > 0
    [choice] = completion.choices
    assert choice.index == 0
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.tool_calls is None
    assert choice.message.content is not None
    assert question[:40] in choice.message.content  # the sim quotes what it was asked
    usage = completion.usage
    assert usage is not None
    prompt = tokenize(server, messages=[{"role": "system", "content": "Be terse."}, user(question)])
    assert usage.prompt_tokens == prompt["count"]
    assert usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0  # a prompt never seen
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 0


def accumulate(chunks: list[Any]) -> dict[int, dict[str, str]]:
    """Tool calls from their index-based deltas, checked as a client reads them."""
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                if delta.index not in calls:  # the first delta of a call opens it
                    assert delta.id
                    assert delta.type == "function"
                    assert delta.function.name
                    assert delta.function.arguments == ""
                    calls[delta.index] = {"id": delta.id, "name": delta.function.name, "args": ""}
                else:
                    assert delta.id is None
                    assert delta.function.name is None
                    calls[delta.index]["args"] += delta.function.arguments or ""
    return calls


def test_parallel_tool_calls_stream_and_round_trip(server: Any) -> None:
    client = openai_client(server)
    question = f"Weather and time in Paris? {uuid.uuid4()}"
    messages: list[dict[str, Any]] = [user(question)]
    chunks = list(
        client.chat.completions.create(
            model="sim",
            messages=messages,
            tools=[WEATHER, CLOCK],
            stream=True,
            metadata={"sim_tool_calls": "2", "sim_parallel_calls": "2"},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1
    assert all(chunk.usage is None for chunk in chunks)  # not asked for
    assert [c.choices[0].finish_reason for c in chunks].count("tool_calls") == 1
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    calls = accumulate(chunks)
    assert sorted(calls) == [0, 1]
    assert [calls[0]["name"], calls[1]["name"]] == ["get_weather", "get_time"]
    assert sum(len(c.choices[0].delta.tool_calls or []) for c in chunks) > 2  # split arguments
    assert json.loads(calls[0]["args"]) == {"city": "city-0"}
    outputs = {0: "Sunny, 21 degrees in Paris", 1: "It is 14:05 in Paris"}
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["args"]},
                }
                for call in calls.values()
            ],
        }
    )
    messages.extend(
        {"role": "tool", "tool_call_id": calls[i]["id"], "content": outputs[i]} for i in calls
    )
    final = client.chat.completions.create(
        model="sim",
        messages=messages,
        tools=[WEATHER, CLOCK],
        metadata={"sim_tool_calls": "2", "sim_parallel_calls": "2"},
    )
    choice = final.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content is not None
    for index, output in outputs.items():
        assert f"[{calls[index]['id']}] «{output}»" in choice.message.content
    assert question[:40] in choice.message.content


def test_the_sdk_stream_helper_parses_the_stream(server: Any) -> None:
    client = openai_client(server)
    strict_weather = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
    with client.chat.completions.stream(
        model="sim",
        messages=[user(f"Weather? {uuid.uuid4()}")],
        tools=[strict_weather],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream_options={"include_usage": True},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in kinds
    assert "tool_calls.function.arguments.done" in kinds
    [choice] = final.choices
    assert choice.finish_reason == "stop"  # a forced call ends with stop, as OpenAI's does
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert call.function.parsed_arguments == {"city": "city-0"}
    assert final.usage is not None
    assert final.usage.completion_tokens > 0


def test_include_usage_ends_the_stream_with_a_usage_chunk(server: Any) -> None:
    client = openai_client(server)
    messages = [user(f"Count for me. {uuid.uuid4()}")]
    chunks = list(
        client.chat.completions.create(
            model="sim",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            metadata={"sim_output_tokens": "40"},
        )
    )
    *body, last = chunks
    assert all(chunk.usage is None for chunk in body)
    assert body[-1].choices[0].finish_reason == "stop"
    assert last.choices == []
    assert last.usage is not None
    text = "".join(chunk.choices[0].delta.content or "" for chunk in body)
    whole = openai_client(server).chat.completions.create(
        model="sim", messages=messages, metadata={"sim_output_tokens": "40"}
    )
    assert whole.choices[0].message.content == text
    assert whole.usage is not None
    assert last.usage.completion_tokens == whole.usage.completion_tokens > 30
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens


def test_max_tokens_cuts_the_answer_with_finish_reason_length(server: Any) -> None:
    client = openai_client(server)
    for budget in ({"max_tokens": 5}, {"max_completion_tokens": 5}):
        completion = client.chat.completions.create(
            model="sim",
            messages=[user(f"Talk at length. {uuid.uuid4()}")],
            metadata={"sim_output_tokens": "200"},
            **budget,  # type: ignore[arg-type]
        )
        assert completion.choices[0].finish_reason == "length"
        assert completion.usage is not None
        assert 0 < completion.usage.completion_tokens <= 5


def test_response_format_json_schema_answers_in_json(server: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    completion = openai_client(server).chat.completions.create(
        model="sim",
        messages=[user("Answer in JSON.")],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "reply", "schema": schema, "strict": True},
        },
    )
    content = completion.choices[0].message.content
    assert content is not None
    assert set(json.loads(content)) == {"answer"}


def test_engine_extras_and_the_affinity_header_are_accepted(server: Any) -> None:
    completion = openai_client(server).chat.completions.create(
        model="sim-alt",
        messages=[user("Hello")],
        extra_headers={"x-longresponse-affinity": "rollout-1"},
        extra_body={"cache_prompt": True, "id_slot": 3},
        prompt_cache_key="rollout-1",
    )
    assert completion.model == "sim-alt"
    assert completion.choices[0].finish_reason == "stop"


# --- the prefix cache ------------------------------------------------------------


def test_a_follow_up_finds_the_shared_prefix_cached(make_server: Any) -> None:
    running = make_server()
    client = openai_client(running)
    first_messages = [
        {"role": "system", "content": f"You are a careful assistant. {uuid.uuid4()}"},
        user("Tell me about the harbour of Marseille and its history, in detail."),
    ]
    first = client.chat.completions.create(model="sim", messages=first_messages)
    assert first.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    answer = first.choices[0].message.content
    follow = [*first_messages, {"role": "assistant", "content": answer}, user("And Lyon?")]
    second = client.chat.completions.create(model="sim", messages=follow)
    # What the two share, in whole blocks: the first prompt and its answer.
    done = tokenize(running, messages=[*first_messages, {"role": "assistant", "content": answer}])
    asked = tokenize(running, messages=follow)
    shared = 0
    for mine, theirs in zip(done["tokens"], asked["tokens"], strict=False):
        if mine != theirs:
            break
        shared += 1
    expected = min(shared // BLOCK_TOKENS, (asked["count"] - 1) // BLOCK_TOKENS) * BLOCK_TOKENS
    assert second.usage is not None
    assert second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens == asked["count"]
    assert expected > first.usage.prompt_tokens  # the answer's blocks were kept too
    assert second.usage.prompt_tokens_details.cached_tokens == expected
    # The same request again: all but the last (partial) block is cached.
    again = client.chat.completions.create(model="sim", messages=follow)
    assert again.usage is not None
    assert again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached == (asked["count"] - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    cache = running.app.parts.chat.cache
    assert cache.tokens_found >= expected + cached


class TellingSampler:
    """Wraps a sampler: every request it is asked to sample is kept in ``told``."""

    def __init__(self, inner: Any, told: list[Any]) -> None:
        self.inner = inner
        self.told = told

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def sample(self, request: Any) -> Any:
        self.told.append(request)
        return self.inner.sample(request)


def test_prefill_is_charged_for_the_uncached_tokens_only(make_server: Any) -> None:
    """The sampler (whose prefill delay is uncached tokens / prefill rate) is
    told exactly the tokens the cache did not have."""
    server = make_server()
    models = server.app.parts.models
    sim = models.resolve("sim")
    told: list[Any] = []
    models.add(  # in place of the sim
        dataclasses.replace(sim, make_sampler=lambda: TellingSampler(sim.make_sampler(), told))
    )
    messages = [user(f"{uuid.uuid4()} " + "cache me " * 60)]

    def start() -> Any:
        openai_client(server).chat.completions.create(model="sim", messages=messages)
        return told[-1]

    cold = start()
    assert cold.cached_tokens == 0
    assert cold.uncached_tokens == tokenize(server, messages=messages)["count"]
    warm = start()
    assert warm.cached_tokens == (cold.uncached_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS > 0
    assert warm.uncached_tokens == cold.uncached_tokens - warm.cached_tokens


def test_a_block_matches_only_with_its_whole_prefix() -> None:
    cache = PrefixCache(64 * BLOCK_TOKENS)
    tokens = list(range(10 * BLOCK_TOKENS))
    cache.insert(block_digests("sim", tokens))
    assert cache.cached_tokens(block_digests("sim", tokens), len(tokens)) == 9 * BLOCK_TOKENS
    longer = [*tokens, 1, 2, 3]
    assert cache.cached_tokens(block_digests("sim", longer), len(longer)) == 10 * BLOCK_TOKENS
    changed = [99999, *tokens[1:]]  # the same later blocks, after another first token
    assert cache.cached_tokens(block_digests("sim", changed), len(changed)) == 0
    assert cache.cached_tokens(block_digests("sim-alt", tokens), len(tokens)) == 0
    assert len(cache) == 10
    assert cache.nbytes == 10 * ENTRY_BYTES


def test_a_tiny_budget_evicts_least_recently_used_first(make_server: Any) -> None:
    running = make_server(chat_prefix_cache_tokens=4 * BLOCK_TOKENS)
    client = openai_client(running)
    long_text = "The quick brown fox jumps over the lazy dog. " * 20

    def cached(tag: str) -> int:
        completion = client.chat.completions.create(
            model="sim", messages=[{"role": "system", "content": tag}, user(long_text)]
        )
        assert completion.usage is not None
        assert completion.usage.prompt_tokens_details
        assert completion.usage.prompt_tokens > 8 * BLOCK_TOKENS
        return completion.usage.prompt_tokens_details.cached_tokens

    assert cached("first") == 0
    assert cached("first") == 4 * BLOCK_TOKENS  # the head of the prompt, as budgeted
    assert cached("second") == 0  # new blocks push the old ones out
    assert cached("first") == 0
    cache = running.app.parts.chat.cache
    assert cache.tokens <= 4 * BLOCK_TOKENS
    assert cache.evictions > 0


def test_a_zero_budget_turns_the_cache_off(make_server: Any) -> None:
    running = make_server(chat_prefix_cache_tokens=0)
    client = openai_client(running)
    for _ in range(2):
        completion = client.chat.completions.create(model="sim", messages=[user("x " * 100)])
        assert completion.usage is not None
        assert completion.usage.prompt_tokens_details
        assert completion.usage.prompt_tokens_details.cached_tokens == 0
    assert len(running.app.parts.chat.cache) == 0


# --- the mapping, both ways ----------------------------------------------------------


def test_messages_and_items_map_both_ways() -> None:
    call = {**CALL, "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}
    conversation = [
        {"role": "system", "content": "Be terse."},
        {"role": "developer", "content": "Use tools."},
        user("Weather in Oslo?"),
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [call],
            "reasoning_content": "x",
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Snow"},
        {"role": "assistant", "content": "Snow in Oslo."},
    ]
    body = json.dumps({"model": "sim", "messages": conversation}).encode()
    request = decode_chat_request(body)
    items = items_from_messages(request.messages)
    kinds = [type(item).__name__ for item in items]
    assert kinds == [
        "Message", "Message", "Message", "Reasoning", "Message", "FunctionCall",
        "FunctionCallOutput", "Message",
    ]  # fmt: skip
    back = messages_from_items(items)
    assert back == request.messages
    again = msgspec.json.decode(msgspec.json.encode(ChatRequest(model="sim", messages=back)))
    assert again["messages"][3]["tool_calls"][0]["function"]["arguments"] == '{"city":"Oslo"}'
    assert again["messages"][4] == {"role": "tool", "content": "Snow", "tool_call_id": "call_1"}


def test_an_engines_answers_decode_with_the_same_structs(server: Any) -> None:
    """A backend reads an engine's stream with these Structs: this server's own,
    and vLLM's (nulls, extra fields, ``reasoning_content``)."""
    body = {
        "model": "sim",
        "messages": [user("Weather?")],
        "tools": [WEATHER],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    answer = httpx.post(f"{server.http_url}/v1/chat/completions", json=body)
    records = [line[6:] for line in answer.text.split("\n\n") if line.startswith("data: {")]
    chunks = [decode_chat_chunk(record) for record in records]
    assert msgspec.json.encode(chunks[0]) == records[0].encode()  # lossless both ways
    assert chunks[-1].usage is not None
    calls = [d for c in chunks for ch in c.choices for d in ch.delta.tool_calls or []]
    assert calls[0].id is not None
    vllm = (
        '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
        '"system_fingerprint":null,"choices":[{"index":0,"delta":{"role":null,"content":null,'
        '"reasoning_content":"think","tool_calls":[{"index":0,"id":null,"type":null,'
        '"function":{"name":null,"arguments":"{}"}}]},"logprobs":null,"finish_reason":null,'
        '"stop_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":1,'
        '"total_tokens":4,"prompt_tokens_details":null}}'
    )
    chunk = decode_chat_chunk(vllm)
    assert chunk.choices[0].delta.reasoning_content == "think"
    assert chunk.usage is not None
    assert chunk.usage.prompt_tokens_details is None
    whole = httpx.post(f"{server.http_url}/v1/chat/completions", json={**GOOD, "tools": [WEATHER]})
    completion = decode_chat_completion(whole.content)
    assert completion.choices[0].finish_reason == "tool_calls"
    assert msgspec.json.decode(msgspec.json.encode(completion)) == whole.json()


# --- the stream's end -------------------------------------------------------------


def test_a_client_that_leaves_mid_stream_stops_the_generation(server: Any) -> None:
    chat = server.app.parts.chat
    stopped = chat.stopped
    body = {
        "model": "sim",
        "messages": [user("Talk for a long time.")],
        "stream": True,
        # At 200 tokens/s a 100,000-token answer takes over eight minutes.
        "metadata": {"sim_output_tokens": "100000", "sim_tokens_per_second": "200"},
    }
    with (
        httpx.Client() as http,
        http.stream("POST", f"{server.http_url}/v1/chat/completions", json=body) as answer,
    ):
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        lines = answer.iter_lines()
        first = next(line for line in lines if line)
        assert first.startswith("data: ")
        assert json.loads(first[6:])["choices"][0]["delta"]["role"] == "assistant"
        assert chat.running >= 1
    left = time.monotonic()
    wait_for(lambda: chat.stopped == stopped + 1 and chat.running == 0, "the turn to stop")
    assert time.monotonic() - left < 10  # stopped, not run to its end


def test_a_client_that_hangs_up_on_a_completion_stops_it(server: Any) -> None:
    chat = server.app.parts.chat
    stopped = chat.stopped
    body = {
        "model": "sim",
        "messages": [user("Talk for a long time, then answer.")],
        "metadata": {"sim_output_tokens": "100000", "sim_tokens_per_second": "200"},
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.http_url}/v1/chat/completions", json=body, timeout=0.5)
    wait_for(lambda: chat.stopped == stopped + 1 and chat.running == 0, "the turn to stop")


def test_a_slow_stream_reader_is_dropped_and_its_turn_stopped(make_server: Any) -> None:
    running = make_server(slow_reader_timeout=0.3)
    chat = running.app.parts.chat
    body = {
        "model": "sim",
        "messages": [user("flood me")],
        "stream": True,
        "metadata": {"sim_output_tokens": "2000000"},
    }
    with stalled_post(running.port, "/v1/chat/completions", body) as sock:
        wait_for(lambda: chat.running == 1, "the turn to start")
        # Never reading: the connection is dropped and the turn stopped.
        wait_for(lambda: chat.stopped == 1 and chat.running == 0, "the reader's drop", 30)
        received = read_until_closed(sock)
    assert received.startswith(b"HTTP/1.1 200")
    assert len(received) < 4 * 1024 * 1024
    assert b"data: [DONE]" not in received


def test_a_stream_ends_with_done(server: Any) -> None:
    body = {"model": "sim", "messages": [user("Hi")], "stream": True}
    answer = httpx.post(f"{server.http_url}/v1/chat/completions", json=body)
    assert answer.status_code == 200
    records = [line for line in answer.text.split("\n\n") if line]
    assert records[-1] == "data: [DONE]"
    assert all(record.startswith("data: {") for record in records[:-1])


# --- bad input ----------------------------------------------------------------------

GOOD = {"model": "sim", "messages": [user("Hi")]}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
CALLED = [user("x"), {"role": "assistant", "tool_calls": [CALL]}]
TOOL = {"role": "tool", "tool_call_id": "call_2", "content": "y"}
ODD_TOOL = {"type": "function", "function": {"name": "a", "parameters": {"type": 5}}}
ODD_SCHEMA = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": 5}}}
NAMED = {"type": "function", "function": {"name": "x"}}
BAD_INPUT = [
    ({"colour": "blue"}, 400, "unknown_parameter", "colour"),
    ({"model": None}, 400, "invalid_type", "model"),
    ({"model": "gpt-nope"}, 404, "model_not_found", "model"),
    ({"messages": []}, 400, "invalid_value", "messages"),
    ({"messages": [{"content": "x"}]}, 400, "missing_required_parameter", "messages[0].role"),
    ({"messages": [{"role": "function", "content": ""}]}, 400, "invalid_value", "messages[0].role"),
    ({"messages": [{**user("x"), "mood": 1}]}, 400, "unknown_parameter", "messages[0].mood"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400, "invalid_value", "messages[0].content[0].type",
    ),
    ({"messages": [*CALLED, TOOL]}, 400, "unknown_call_id", "messages[2].tool_call_id"),
    ({"messages": [*CALLED, user("")]}, 400, "missing_tool_output", "messages[1].tool_calls[0].id"),
    ({"messages": CALLED}, 400, "missing_tool_output", "messages[1].tool_calls[0].id"),
    (
        {"messages": [user("x"), {"role": "assistant", "tool_calls": [CALL, CALL]}]},
        400, "duplicate_call_id", "messages[1].tool_calls[1].id",
    ),
    (
        {"messages": [user("x"), {"role": "tool", "content": "y"}]},
        400, "missing_required_parameter", "messages[1].tool_call_id",
    ),
    (
        {"messages": [user("x"), {"role": "assistant", "content": None}]},
        400, "missing_required_parameter", "messages[1].content",
    ),
    ({"n": 2}, 400, "invalid_value", "n"),
    ({"temperature": 3}, 400, "invalid_value", "temperature"),
    ({"max_tokens": 0}, 400, "invalid_value", "max_tokens"),
    ({"stream_options": {"include_usage": True}}, 400, "invalid_value", "stream_options"),
    ({"tool_choice": "required"}, 400, "invalid_value", "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": NAMED}, 400, "invalid_value", "tool_choice.function.name"),
    (
        {"tools": [{"type": "function", "function": {"name": "a b"}}]},
        400, "invalid_value", "tools[0].function.name",
    ),
    ({"tools": [ODD_TOOL]}, 400, "invalid_value", "tools[0].function.parameters"),
    ({"tools": [{"type": "code_interpreter"}]}, 400, "invalid_value", "tools[0].type"),
    ({"response_format": ODD_SCHEMA}, 400, "invalid_value", "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, 400, "invalid_value", "response_format.type"),
    ({"metadata": {"sim_tool_calls": "many"}}, 400, "invalid_value", "metadata.sim_tool_calls"),
    ({"id_slot": "zero"}, 400, "invalid_type", "id_slot"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "status", "code", "param"), BAD_INPUT)
def test_bad_input_gets_the_error_envelope(
    server: Any, change: dict[str, Any], status: int, code: str, param: str
) -> None:
    with httpx.Client(base_url=server.http_url) as http:
        answer = http.post("/v1/chat/completions", json={**GOOD, **change})
        assert answer.status_code == status, answer.text
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["code"] == code
        assert error["param"] == param
        assert error["message"]
        # The connection stays usable.
        again = http.post("/v1/chat/completions", json=GOOD)
        assert again.status_code == 200
        assert again.json()["choices"][0]["finish_reason"] == "stop"


def test_a_body_that_is_not_json_is_refused(server: Any) -> None:
    answer = httpx.post(
        f"{server.http_url}/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_json"


def test_a_context_too_long_for_the_window_is_refused(make_server: Any) -> None:
    running = make_server(sim=SimConfig(context_window=50))
    client = openai_client(running)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="sim", messages=[user("word " * 100)])
    assert refused.value.code == "context_length_exceeded"
    assert refused.value.param == "messages"


def test_api_keys_gate_the_chat_endpoints(make_server: Any) -> None:
    running = make_server(api_keys=("sk-chat",))
    for path, body in (("/v1/chat/completions", GOOD), ("/tokenize", {"prompt": "x"})):
        answer = httpx.post(f"{running.http_url}{path}", json=body)
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai_client(running, key="sk-wrong").chat.completions.create(**GOOD)  # type: ignore[call-overload]
    completion = openai_client(running, key="sk-chat").chat.completions.create(**GOOD)  # type: ignore[call-overload]
    assert completion.choices[0].finish_reason == "stop"


# --- /tokenize ------------------------------------------------------------------------


def test_tokenize_counts_a_prompt_and_a_chat(server: Any) -> None:
    counted = tokenize(server, prompt="Hello there, general Kenobi")
    assert counted["count"] == len(counted["tokens"]) > 3
    assert counted["max_model_len"] == server.config.sim.context_window
    messages = [user(f"Tokens, please. {uuid.uuid4()}")]
    chat = tokenize(server, messages=messages, tools=[WEATHER])
    completion = openai_client(server).chat.completions.create(
        model="sim",
        messages=messages,
        tools=[WEATHER],
        tool_choice="none",  # type: ignore[list-item]
    )
    assert completion.usage is not None
    assert chat["count"] == completion.usage.prompt_tokens
    # An unanswered call may be counted (a count is not a completion).
    open_call = [user("x"), {"role": "assistant", "tool_calls": [CALL]}]
    alone = tokenize(server, messages=[user("x")])["count"]
    assert tokenize(server, messages=open_call)["count"] > alone


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"model": "sim"}, 400, "invalid_value", "messages"),
        ({"model": "sim", "prompt": "a", "messages": [user("b")]}, 400, "invalid_value", "prompt"),
        ({"model": "nope", "prompt": "a"}, 404, "model_not_found", "model"),
        ({"model": "sim", "prompt": 5}, 400, "invalid_type", "prompt"),
        ({"model": "sim", "prompt": "a", "extra": 1}, 400, "unknown_parameter", "extra"),
    ],
)
def test_tokenize_refuses_bad_input(
    server: Any, body: dict[str, Any], status: int, code: str, param: str
) -> None:
    answer = httpx.post(f"{server.http_url}/tokenize", json=body)
    assert answer.status_code == status
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
