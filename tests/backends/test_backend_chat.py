"""The Chat Completions backend: a gateway in front of a second, real longresponse process.

The gateway runs in-thread (``make_server`` with a ``chat`` backend); the
engine behind it is another ``longresponse serve`` process answering
``POST /v1/chat/completions`` on the simulated model (its prefix cache
reports ``cached_tokens`` honestly). Clients at the front are the project's
trio client (append mode) and the official ``openai`` SDK (the shipped
WebSocket shape and HTTP). The stream reader and the mapping of refusals are
checked on their own first, as pure functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pydantic
import pytest
from openai.types.responses import ResponseStreamEvent

from longresponse.backends.chat import ChatBackend, chat_body, window_margin
from longresponse.backends.chat_stream import ChunkReader, refusal, responses_param
from longresponse.chat.upstream import ChunkRecord as StreamChunk
from longresponse.client import connect
from longresponse.config import BackendConfig
from longresponse.engine.sampling import (
    ArgumentsDelta,
    ItemEnd,
    ReasoningDone,
    SampleRequest,
    Stop,
    TextDelta,
    ToolCallStart,
    Usage,
)
from longresponse.engine.stream import StreamBuilder
from longresponse.server_process import ServerProcess
from protocol.events import OutputItemDone, ResponseDone
from protocol.items import FunctionCall, FunctionCallOutput, FunctionTool, Message
from protocol.response import FormatJSONObject
from tests.conftest import openai_client
from tests.support.engine_peer import StandIn, answer, choice, record
from tests.support.shipped_ws import sdk_turn

ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two numbers",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
TWO_CALLS = {"sim_tool_calls": "2", "sim_parallel_calls": "2"}
STREAM_EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def upstream() -> Iterator[ServerProcess]:
    """The engine: a second longresponse process serving chat completions."""
    with ServerProcess("--store", "memory://", "--sim-tokens-per-second", "0") as process:
        yield process


def chat_backend(engine: ServerProcess | str, **settings: Any) -> BackendConfig:
    base = engine if isinstance(engine, str) else f"{engine.http_url}/v1"
    settings.setdefault("upstream_model", "sim")
    return BackendConfig(name="engine", kind="chat", base_url=base, **settings)


def gateway(make_server: Any, engine: ServerProcess | str, **settings: Any) -> Any:
    return make_server(store="memory://", backends=(chat_backend(engine, **settings),))


def chunk(**fields: Any) -> StreamChunk:
    return msgspec.convert(fields, StreamChunk)


def call_piece(index: int, *, id: str | None = None, name: str = "", args: str = "") -> Any:
    function: dict[str, str] = {"arguments": args}
    if name:
        function["name"] = name
    piece: dict[str, Any] = {"index": index, "function": function}
    if id:
        piece["id"] = id
    return chunk(choices=[{"index": 0, "delta": {"tool_calls": [piece]}}])


# --- the stream reader, pure ------------------------------------------------------


def test_the_first_call_streams_and_interleaved_parallel_calls_are_kept_in_order() -> None:
    reader = ChunkReader()
    out = []
    for piece in (
        call_piece(0, id="call_a", name="add", args='{"a"'),
        call_piece(1, id="call_b", name="mul", args='{"x"'),
        call_piece(0, args=": 1}"),
        call_piece(1, args=": 2}"),
    ):
        out.extend(reader.feed(piece))
    assert out == [
        ToolCallStart("call_a", "add"),
        ArgumentsDelta('{"a"'),
        ArgumentsDelta(": 1}"),
    ]
    out = reader.feed(
        chunk(
            choices=[{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
            usage={
                "prompt_tokens": 40,
                "completion_tokens": 9,
                "prompt_tokens_details": {"cached_tokens": 32},
            },
        )
    )
    assert out == []
    assert reader.end() == [
        ItemEnd(),
        ToolCallStart("call_b", "mul"),
        ArgumentsDelta('{"x"'),
        ArgumentsDelta(": 2}"),
        ItemEnd(),
        Usage(input_tokens=40, cached_tokens=32, output_tokens=9),
        Stop("tool_calls"),
    ]


def test_reasoning_comes_whole_before_the_text_and_text_then_a_call_closes_it() -> None:
    reader = ChunkReader()
    out = reader.feed(chunk(choices=[{"delta": {"reasoning_content": "let me "}}]))
    assert out == []
    out = reader.feed(chunk(choices=[{"delta": {"reasoning": "think", "content": "Hi"}}]))
    out += reader.feed(call_piece(0, name="add", args="{}"))
    assert out[:3] == [ReasoningDone("let me think"), TextDelta("Hi"), ItemEnd()]
    assert isinstance(out[3], ToolCallStart)
    assert out[3].call_id.startswith("call_")  # the engine gave none
    assert reader.output_started
    assert reader.end()[-1] == Stop("tool_calls")


def test_reasoning_becomes_one_reasoning_item_the_sdk_parses() -> None:
    builder = StreamBuilder("resp_1", tag_response_id=False)
    events = builder.feed(ReasoningDone("step by step"))
    parsed = [STREAM_EVENT.validate_json(msgspec.json.encode(e)) for e in events]
    assert [e.type for e in parsed] == ["response.output_item.added", "response.output_item.done"]
    item = parsed[1].item
    assert (item.type, item.status) == ("reasoning", "completed")
    assert item.content[0].text == "step by step"
    assert builder.output == [events[1].item]  # type: ignore[union-attr]
    assert builder.output_tokens > 0


def llama_record(
    *,
    timings: tuple[int, int, int] | None = None,
    progress: tuple[int, int] | None = None,
    **delta: Any,
) -> StreamChunk:
    """A llama.cpp record with ``running_counts``: its ``timings`` (cache_n,
    prompt_n, predicted_n) and, in its prefill, ``prompt_progress`` (total 500,
    cache, processed)."""
    fields: dict[str, Any] = {"choices": [{"index": 0, "delta": {"role": "assistant", **delta}}]}
    if timings is not None:
        fields["timings"] = dict(zip(("cache_n", "prompt_n", "predicted_n"), timings, strict=True))
    if progress is not None:
        cache, processed = progress
        fields["prompt_progress"] = {"total": 500, "cache": cache, "processed": processed}
    return chunk(**fields)


def test_llamas_running_counts_come_before_what_they_count_and_once() -> None:
    """Each record whose counts changed gives them first: a cut after any record
    is billed what it streamed. The prefill's progress counts what the engine has
    read, and is not yet the answer (the first-token timeout still runs)."""
    reader = ChunkReader()
    assert reader.feed(llama_record(timings=(400, 0, 0), progress=(400, 400))) == [
        Usage(input_tokens=400, cached_tokens=400, output_tokens=0)
    ]
    assert reader.feed(llama_record(timings=(400, 64, 0), progress=(400, 464))) == [
        Usage(input_tokens=464, cached_tokens=400, output_tokens=0)
    ]
    assert not reader.started_stream
    assert reader.feed(llama_record(timings=(400, 100, 1))) == [
        Usage(input_tokens=500, cached_tokens=400, output_tokens=1)
    ]
    assert reader.started_stream
    assert not reader.output_started
    # Its template's marker was three tokens the parser held back: counted all the same.
    assert reader.feed(llama_record(timings=(400, 100, 4), content="Hi")) == [
        Usage(input_tokens=500, cached_tokens=400, output_tokens=4),
        TextDelta("Hi"),
    ]
    assert reader.feed(llama_record(timings=(400, 100, 4), content="!")) == [TextDelta("!")]
    assert reader.feed(chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])) == []
    last = {
        "prompt_tokens": 500,
        "completion_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 400},
    }
    final = chunk(
        choices=[], usage=last, timings={"cache_n": 400, "prompt_n": 100, "predicted_n": 4}
    )
    assert reader.feed(final) == []
    assert reader.end() == [ItemEnd(), Stop("stop")]  # the same counts: not again


def test_a_usage_before_the_finish_is_a_running_count_and_the_last_one_follows() -> None:
    """vLLM's ``continuous_usage_stats`` puts a ``usage`` on every record."""
    reader = ChunkReader()
    running = {"prompt_tokens": 30, "completion_tokens": 2}
    out = reader.feed(chunk(choices=[{"index": 0, "delta": {"content": "Hi"}}], usage=running))
    assert out == [Usage(input_tokens=30, cached_tokens=0, output_tokens=2), TextDelta("Hi")]
    reader.feed(chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    reader.feed(chunk(choices=[], usage={"prompt_tokens": 30, "completion_tokens": 3}))
    assert reader.end() == [
        ItemEnd(),
        Usage(input_tokens=30, cached_tokens=0, output_tokens=3),
        Stop("stop"),
    ]


def test_finish_reason_length_cuts_the_open_item_incomplete() -> None:
    reader = ChunkReader()
    reader.feed(chunk(choices=[{"delta": {"content": "a long"}, "finish_reason": "length"}]))
    assert reader.end() == [ItemEnd(incomplete=True), Stop("max_output_tokens")]


def test_finish_reason_length_keeps_the_calls_finished_before_the_cut() -> None:
    """Only the call being written when the budget ran out is incomplete (issue 22:
    every call of the turn was, 13 finished ones included)."""
    reader = ChunkReader()
    out = []
    for piece in (
        call_piece(0, id="call_a", name="add", args='{"a": 1, "b": 2}'),
        call_piece(1, id="call_b", name="add", args='{"a": 3, "b": 4}'),
        call_piece(2, id="call_c", name="add", args='{"a": 5,'),
    ):
        out.extend(reader.feed(piece))
    reader.feed(chunk(choices=[{"delta": {}, "finish_reason": "length"}]))
    out.extend(reader.end())
    ends = [c for c in out if isinstance(c, ItemEnd)]
    assert ends == [ItemEnd(), ItemEnd(), ItemEnd(incomplete=True)]
    assert out[-1] == Stop("max_output_tokens")


@pytest.mark.parametrize(
    ("status", "body", "code", "http", "param"),
    [
        (401, b'{"error": {"message": "bad key sk-SECRET"}}', "upstream_unavailable", 502, None),
        (404, b'{"error": {"message": "no model"}}', "upstream_unavailable", 502, None),
        (429, b'{"error": {"message": "busy"}}', "rate_limit_exceeded", 429, None),
        (
            400,
            b'{"object": "error", "message": "This model\'s maximum context length is 4096 '
            b'tokens.", "type": "BadRequestError", "param": null, "code": 400}',
            "context_length_exceeded",
            400,
            "input",
        ),
        (
            400,
            b'{"error": {"message": "bad schema", "code": "invalid_function_parameters", '
            b'"param": "tools[0].function.parameters"}}',
            "invalid_function_parameters",
            400,
            "tools[0].parameters",
        ),
        (500, b"Internal Server Error", "upstream_unavailable", 502, None),
    ],
)
def test_refusals_get_the_shipped_code(
    status: int, body: bytes, code: str, http: int, param: str | None
) -> None:
    error = refusal(status, body, retry="2", secret="sk-SECRET")
    assert (error.code, error.status, error.param) == (code, http, param)
    assert "sk-SECRET" not in error.message
    assert error.retry_after == (2.0 if status == 429 else None)


def test_chat_params_are_named_as_the_responses_request_names_them() -> None:
    assert responses_param("tools[3].function.name") == "tools[3].name"
    assert responses_param("messages[2].content") == "input"
    assert responses_param("max_tokens") == "max_output_tokens"
    assert responses_param("response_format.json_schema") == "text.format"
    assert responses_param("temperature") == "temperature"
    assert responses_param(None) is None


def test_a_turn_maps_to_one_chat_body() -> None:
    config = chat_backend(
        "http://engine.invalid/v1", cache_prompt=True, max_tokens_field="max_tokens"
    )
    request = SampleRequest(
        context=[
            Message(role="user", content="add 1 and 2"),
            FunctionCall(call_id="c1", name="add", arguments='{"a": 1, "b": 2}'),
            FunctionCall(call_id="c2", name="add", arguments='{"a": 2, "b": 2}'),
            FunctionCallOutput(call_id="c1", output="3"),
            FunctionCallOutput(call_id="c2", output="4"),
        ],
        tools=[FunctionTool(name="add", parameters=ADD["parameters"], description="Add")],  # type: ignore[arg-type]
        tool_choice="required",
        parallel_tool_calls=False,
        metadata={"sim_tool_calls": "0"},
        cached_tokens=0,
        uncached_tokens=10,
        max_output_tokens=77,
        text_format=FormatJSONObject(),
        instructions="Be exact.",
        temperature=0.2,
        top_p=0.9,
    )
    body = chat_body(config, request)
    assert body["model"] == "sim"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool"]
    assert body["messages"][0]["content"] == "Be exact."
    calls = body["messages"][2]["tool_calls"]
    assert [(c["id"], c["function"]["name"]) for c in calls] == [("c1", "add"), ("c2", "add")]
    assert body["messages"][3] == {"role": "tool", "content": "3", "tool_call_id": "c1"}
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "add", "description": "Add", "parameters": ADD["parameters"]},
        }
    ]
    assert (body["tool_choice"], body["parallel_tool_calls"]) == ("required", False)
    assert body["max_tokens"] == 77
    assert (body["temperature"], body["top_p"]) == (0.2, 0.9)
    assert body["metadata"] == {"sim_tool_calls": "0"}
    assert body["response_format"] == {"type": "json_object"}
    assert body["cache_prompt"] is True
    assert "timings_per_token" not in body
    assert "return_progress" not in body
    counted = chat_body(dataclasses.replace(config, running_counts=True), request)
    assert (counted["timings_per_token"], counted["return_progress"]) == (True, True)
    # The limit never passes the backend's cap nor what the window leaves
    # after the prompt by the engine's count, less a margin (engines refuse
    # that with a 400); with no count of the engine's yet, where only the
    # window would bind, the limit is left to the engine.
    huge = dataclasses.replace(request, max_output_tokens=10**6)
    assert chat_body(config, huge)["max_tokens"] == config.max_output_tokens
    small = dataclasses.replace(config, context_window=100)
    assert chat_body(small, huge, prompt_tokens=10)["max_tokens"] == 90 - window_margin(10)
    assert "max_tokens" not in chat_body(small, huge)
    assert chat_body(small, dataclasses.replace(request, max_output_tokens=20))["max_tokens"] == 20
    # llama.cpp's slot pinning: one slot per rollout, the same on every turn.
    assert "id_slot" not in body
    pinned = dataclasses.replace(config, slots=4)
    slots = {chat_body(pinned, request, f"{n:08x}{'0' * 24}")["id_slot"] for n in range(8)}
    assert slots == {0, 1, 2, 3}
    assert chat_body(pinned, request, "0000000a" + "0" * 24)["id_slot"] == 10 % 4


def test_each_rollout_has_its_own_affinity_key() -> None:
    def script(number: int, body: dict[str, Any]) -> list[Any]:
        return [answer(choice({"content": "ok"}), choice(finish="stop"), record("[DONE]"))]

    request = SampleRequest(
        context=[Message(role="user", content="hello")],
        tools=[],
        tool_choice="auto",
        parallel_tool_calls=True,
        metadata={},
        cached_tokens=0,
        uncached_tokens=1,
        max_output_tokens=16,
    )

    async def check(engine: StandIn) -> None:
        backend = ChatBackend(chat_backend(engine.url, affinity_header="x-pin"))
        try:
            one, two = backend.make_sampler(), backend.make_sampler()
            assert one.affinity != two.affinity
            async with contextlib.aclosing(one.sample(request)) as chunks:
                assert [chunk async for chunk in chunks]
            assert engine.headers[-1]["x-pin"] == one.affinity  # as the engine got it
        finally:
            await backend.aclose()

    with StandIn(script) as engine:
        asyncio.run(check(engine))


# --- end to end: a gateway in front of a second process ---------------------------


def test_models_lists_the_backend_model_owned_by_its_kind(
    make_server: Any, upstream: ServerProcess
) -> None:
    front = gateway(make_server, upstream)
    models = {m.id: m.owned_by for m in openai_client(front).models.list().data}
    assert models["engine"] == "chat"
    assert models["sim"] == "longresponse"


async def test_an_append_mode_rollout_with_parallel_calls(
    make_server: Any, upstream: ServerProcess
) -> None:
    front = gateway(make_server, upstream)
    async with connect(front.url) as client:
        await client.create(
            model="engine", input="Add some numbers.", tools=[ADD], metadata=TWO_CALLS
        )
        first = await client.until_done()
        pause = first[-1]
        assert isinstance(pause, ResponseDone)
        assert pause.response.status == "requires_action"
        calls = [
            e.item
            for e in first
            if isinstance(e, OutputItemDone) and isinstance(e.item, FunctionCall)
        ]
        assert len(calls) == 2
        assert pause.response.required_action.call_ids == [c.call_id for c in calls]  # type: ignore[union-attr]
        await client.append(
            [
                {"type": "function_call_output", "call_id": c.call_id, "output": f"sum {n}"}
                for n, c in enumerate(calls)
            ]
        )
        second = await client.until_done()
    done = second[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "completed"
    answer = done.response.output[-1]
    assert isinstance(answer, Message)
    text = answer.content[0].text  # type: ignore[union-attr]
    # The engine saw the whole context: the request and both outputs.
    assert "«Add some numbers.»" in text
    assert f"[{calls[0].call_id}] «sum 0»" in text
    assert f"[{calls[1].call_id}] «sum 1»" in text
    usage = done.response.usage
    assert usage is not None
    # The resume found its prefix in the engine's cache: the engine's own count
    # (its cache works in blocks of 16 tokens).
    cached = usage.input_tokens_details.cached_tokens
    assert cached > 0
    assert cached % 16 == 0


def test_a_shipped_websocket_chain(make_server: Any, upstream: ServerProcess) -> None:
    front = gateway(make_server, upstream)
    with openai_client(front).responses.connect() as conn:
        conn.response.create(
            model="engine", input="Add things.", tools=[ADD], metadata=TWO_CALLS, store=False
        )
        first = sdk_turn(conn)
        assert first[-1].type == "response.completed"
        calls = [o for o in first[-1].response.output if o.type == "function_call"]
        assert len(calls) == 2
        conn.response.create(
            model="engine",
            previous_response_id=first[-1].response.id,
            input=[
                {"type": "function_call_output", "call_id": c.call_id, "output": "5"} for c in calls
            ],
            tools=[ADD],
            metadata=TWO_CALLS,
            store=False,
        )
        second = sdk_turn(conn)
    end = second[-1]
    assert end.type == "response.completed"
    assert end.response.output[-1].type == "message"
    assert f"[{calls[1].call_id}] «5»" in end.response.output_text
    assert end.response.usage.input_tokens_details.cached_tokens > 0


def test_an_http_chain_with_the_engines_usage(make_server: Any, upstream: ServerProcess) -> None:
    front = gateway(make_server, upstream)
    client = openai_client(front)
    first = client.responses.create(
        model="engine", input="Please add.", tools=[ADD], metadata=TWO_CALLS, store=True
    )
    assert first.status == "completed"
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 2
    # Usage is the engine's own count of the prompt it was sent.
    counted = httpx.post(
        f"{upstream.http_url}/tokenize",
        json={
            "model": "sim",
            "messages": [{"role": "user", "content": "Please add."}],
            "tools": [
                {"type": "function", "function": {k: v for k, v in ADD.items() if k != "type"}}
            ],
        },
    ).json()["count"]
    assert first.usage is not None
    assert first.usage.input_tokens == counted
    stream = client.responses.create(
        model="engine",
        previous_response_id=first.id,
        input=[
            {"type": "function_call_output", "call_id": c.call_id, "output": "7"} for c in calls
        ],
        tools=[ADD],
        metadata=TWO_CALLS,
        stream=True,
    )
    events = list(stream)
    assert events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text
    assert f"[{calls[0].call_id}] «7»" in deltas
    assert events[-1].response.usage.input_tokens_details.cached_tokens > 0
