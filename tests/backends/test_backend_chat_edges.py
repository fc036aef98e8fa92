"""The Chat Completions backend against the ways a third-party engine misbehaves.

The engine is :class:`tests.support.engine_peer.StandIn`, a raw-socket stand-in for
engines that cannot run on this machine (vLLM, llama.cpp, older Ollama, a
proxy): it writes the exact records they send, and the gateway in front
(``make_server`` with a ``chat`` backend) reads them with its real client.
The clients at the front are the project's trio client (append mode) and the
official ``openai`` SDK. Pure parts (the stream reader, the body, the
mapping) are checked on their own where that says more.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest

from longresponse.backends.chat import ChatBackend, window_margin
from longresponse.backends.chat_stream import ChunkReader
from longresponse.backends.settings import SettingsError, load_toml, shown_url
from longresponse.chat.mapping import mcp_functions, messages_from_items, tool_choice_to_chat
from longresponse.chat.upstream import ChunkRecord as StreamChunk
from longresponse.client import connect
from longresponse.engine.compaction import CompactionKey
from longresponse.engine.sampling import ToolCallStart, UpstreamError
from longresponse.engine.stream import StreamBuilder
from protocol.events import ErrorEvent, OutputItemDone, ResponseDone
from protocol.items import (
    FunctionCall,
    FunctionTool,
    InputImage,
    InputText,
    McpCall,
    McpListedTool,
    McpListTools,
    McpTool,
    Message,
    ToolChoiceMcp,
    item_text,
)
from tests.backends.test_backend_chat import ADD, chat_backend, gateway
from tests.conftest import openai_client
from tests.support.engine_peer import StandIn, answer, choice, cut, record

KEY = {"authorization": "Bearer test-key"}
USAGE = record({"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 2}})


def text_answer(text: str = "ok") -> bytes:
    return answer(choice({"content": text}), choice(finish="stop"), USAGE, record("[DONE]"))


def call_delta(call_id: str | None, name: str | None, arguments: str, **extra: Any) -> bytes:
    function: dict[str, str] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    piece: dict[str, Any] = {"type": "function", "function": function, **extra}
    if call_id is not None:
        piece["id"] = call_id
    return choice({"tool_calls": [piece]})


@pytest.fixture
def engine() -> Iterator[list[StandIn]]:
    """Stand-ins made by a test, closed after it."""
    made: list[StandIn] = []
    yield made
    for stand_in in made:
        stand_in.close()


def stand_in(made: list[StandIn], script: Any) -> StandIn:
    peer = StandIn(script)
    made.append(peer)
    return peer


# --- a call cut short (review item 1) -----------------------------------------------


async def test_a_call_cut_short_is_incomplete_and_the_resume_goes_on(
    make_server: Any, engine: list[StandIn]
) -> None:
    def script(number: int, body: dict[str, Any]) -> list[Any]:
        if number == 1:
            return cut(call_delta("call_A", "add", '{"a": 1', index=0))
        return [text_answer("resumed")]

    peer = stand_in(engine, script)
    front = gateway(make_server, peer.url, max_retries=0)
    async with connect(front.url) as client:
        await client.create(model="engine", input="add", tools=[ADD])
        events = await client.until_done()
        cut_calls = [e.item for e in events if isinstance(e, OutputItemDone)]
        assert len(cut_calls) == 1
        assert isinstance(cut_calls[0], FunctionCall)
        assert cut_calls[0].status == "incomplete"
        assert isinstance(events[-1], ErrorEvent)
        pause = (await client.until_done())[-1]
        assert isinstance(pause, ResponseDone)
        assert pause.response.status == "requires_action"
        # Nothing waits for the cut call: an empty append resumes.
        assert pause.response.required_action.call_ids == []  # type: ignore[union-attr]
        await client.append([])
        done = (await client.until_done(timeout=10))[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "completed"
    assert isinstance(done.response.output[-1], Message)
    # The engine is never sent the call it did not finish (it would want its result).
    resumed = peer.requests[1]["messages"]
    assert [m["role"] for m in resumed] == ["user"]
    assert all("tool_calls" not in m for m in resumed)


def test_a_call_cut_by_the_length_limit_is_incomplete(
    make_server: Any, engine: list[StandIn]
) -> None:
    def script(number: int, body: dict[str, Any]) -> list[Any]:
        return [
            answer(
                call_delta("call_A", "add", '{"a": 1, "b"', index=0),
                choice(finish="length"),
                USAGE,
                record("[DONE]"),
            )
        ]

    peer = stand_in(engine, script)
    front = gateway(make_server, peer.url)
    response = openai_client(front).responses.create(model="engine", input="add", tools=[ADD])
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert [(o.type, o.status) for o in response.output] == [("function_call", "incomplete")]


# --- input appended while a turn fails (review item 10) ---------------------------


async def test_input_appended_while_the_turn_fails_resumes_at_once(
    make_server: Any, engine: list[StandIn]
) -> None:
    def script(number: int, body: dict[str, Any]) -> list[Any]:
        if number == 1:
            return [0.5, answer(b'{"error": {"message": "busy"}}', status=503)]
        return [text_answer("resumed")]

    peer = stand_in(engine, script)
    front = gateway(make_server, peer.url, max_retries=0)
    async with connect(front.url) as client:
        await client.create(model="engine", input="first")
        await client.next_event()  # created: the turn is under way
        await client.append("and then this")
        events = await client.until_done()
        assert isinstance(events[-1], ErrorEvent)
        assert events[-1].status == 502
        pause = (await client.until_done())[-1]
        assert isinstance(pause, ResponseDone)
        assert pause.response.status == "requires_action"
        # No further append: what came during the failed turn is enough.
        done = (await client.until_done(timeout=10))[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "completed"
    assert [m["content"] for m in peer.requests[1]["messages"]] == ["first", "and then this"]


# --- the output limit by the engine's count (review items 4 and 11) ----------------


async def test_the_output_limit_leaves_a_margin_by_the_engines_count(
    make_server: Any, engine: list[StandIn]
) -> None:
    counted = 300  # the engine counts far more than the o200k estimate (~40)

    def script(number: int, body: dict[str, Any]) -> list[Any]:
        if number == 1:
            usage = {"prompt_tokens": counted, "completion_tokens": 9}
            return [
                answer(
                    call_delta("call_A", "add", '{"a": 1, "b": 2}', index=0),
                    choice(finish="tool_calls"),
                    record({"choices": [], "usage": usage}),
                    record("[DONE]"),
                )
            ]
        return [text_answer("3")]

    peer = stand_in(engine, script)
    front = gateway(make_server, peer.url, context_window=400, max_tokens_field="max_tokens")
    async with connect(front.url) as client:
        await client.create(model="engine", input="add 1 and 2", tools=[ADD])
        pause = (await client.until_done())[-1]
        assert isinstance(pause, ResponseDone)
        await client.append([{"type": "function_call_output", "call_id": "call_A", "output": "3"}])
        done = (await client.until_done())[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "completed"
    first, second = peer.requests
    # No count of the engine's yet, and only the window would bind: no limit.
    assert "max_tokens" not in first
    # Then the engine's count (plus what was added) and a margin bound it.
    assert 1 <= second["max_tokens"] <= 400 - counted - window_margin(counted)


async def test_a_spent_budget_asks_the_engine_for_nothing(
    make_server: Any, engine: list[StandIn]
) -> None:
    spent = {"prompt_tokens": 30, "completion_tokens": 16}  # all of the budget

    def script(number: int, body: dict[str, Any]) -> list[Any]:
        return [
            answer(
                call_delta("call_A", "add", '{"a": 1, "b": 2}', index=0),
                choice(finish="tool_calls"),
                record({"choices": [], "usage": spent}),
                record("[DONE]"),
            )
        ]

    peer = stand_in(engine, script)
    front = gateway(make_server, peer.url)
    async with connect(front.url) as client:
        await client.create(model="engine", input="add", tools=[ADD], max_output_tokens=16)
        pause = (await client.until_done())[-1]
        assert isinstance(pause, ResponseDone)
        assert pause.response.status == "requires_action"
        await client.append([{"type": "function_call_output", "call_id": "call_A", "output": "3"}])
        done = (await client.until_done())[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "incomplete"
    assert done.response.incomplete_details is not None
    assert done.response.incomplete_details.reason == "max_output_tokens"
    assert len(peer.requests) == 1  # the spent budget was never sent as "no limit"


def add_call_counted(prompt_tokens: int) -> bytes:
    """A call of ``add``, the engine counting its prompt ``prompt_tokens``."""
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 9}
    return answer(
        call_delta("call_A", "add", '{"a": 1, "b": 2}', index=0),
        choice(finish="tool_calls"),
        record({"choices": [], "usage": usage}),
        record("[DONE]"),
    )


async def window_rollout(front: Any) -> ResponseDone:
    """An append rollout of one call of ``add``, then its answer: the final done."""
    async with connect(front.url) as client:
        await client.create(model="engine", input="add", tools=[ADD], max_output_tokens=5000)
        pause = (await client.until_done())[-1]
        assert isinstance(pause, ResponseDone)
        assert pause.response.status == "requires_action"
        await client.append([{"type": "function_call_output", "call_id": "call_A", "output": "3"}])
        done = (await client.until_done())[-1]
    assert isinstance(done, ResponseDone)
    return done


async def test_a_turn_the_windows_room_cuts_short_says_so_not_max_output_tokens(
    make_server: Any, engine: list[StandIn]
) -> None:
    """The engine's count leaves the window a little room: the limit sent is
    that room, and a ``length`` finish there is the window's, the budget unspent."""

    def script(number: int, body: dict[str, Any]) -> list[Any]:
        if number == 1:
            return [add_call_counted(300)]
        return [answer(choice({"content": "a long"}), choice(finish="length"), USAGE)]

    peer = stand_in(engine, script)
    front = gateway(make_server, peer.url, context_window=400, max_tokens_field="max_tokens")
    done = await window_rollout(front)
    second = peer.requests[1]
    assert 1 <= second["max_tokens"] <= 400 - 300 - window_margin(300)
    assert done.response.status == "incomplete"
    assert done.response.incomplete_details is not None
    assert done.response.incomplete_details.reason == "context_length_exceeded"
    assert done.response.usage is not None
    assert done.response.usage.output_tokens < 5000


async def test_a_prompt_that_leaves_the_window_no_room_is_refused_before_the_engine(
    make_server: Any, engine: list[StandIn]
) -> None:
    """Never a limit of one token: a prompt within the margin of the window
    ends the Response ``failed`` with ``context_length_exceeded``, unsent."""
    peer = stand_in(engine, lambda number, body: [add_call_counted(360)])
    front = gateway(make_server, peer.url, context_window=400, max_tokens_field="max_tokens")
    done = await window_rollout(front)
    assert len(peer.requests) == 1
    assert done.response.status == "failed"
    assert done.response.error is not None
    assert done.response.error.code == "context_length_exceeded"
    assert "leaves no room for output" in done.response.error.message


# --- /v1/chat/completions in front of an engine (review item 7) --------------------


def test_chat_completions_keep_the_engines_refusals(
    make_server: Any, engine: list[StandIn], caplog: pytest.LogCaptureFixture
) -> None:
    too_long = b'{"error": {"message": "This model\'s maximum context length is 4096 tokens."}}'

    def script(number: int, body: dict[str, Any]) -> list[Any]:
        if number == 1:
            return [
                answer(
                    b'{"error": {"message": "slow down"}}', status=429, headers={"retry-after": "3"}
                )
            ]
        return [answer(too_long, status=400)]

    peer = stand_in(engine, script)
    front = gateway(make_server, peer.url, max_retries=0)
    url = f"http://127.0.0.1:{front.port}/v1/chat/completions"
    request = {"model": "engine", "messages": [{"role": "user", "content": "hi"}]}
    with caplog.at_level(logging.ERROR, logger="longresponse"):
        limited = httpx.post(url, json=request, headers=KEY)
        assert limited.status_code == 429
        assert limited.headers["retry-after"] == "3"
        error = limited.json()["error"]
        assert (error["code"], error["type"]) == ("rate_limit_exceeded", "rate_limit_error")
        # A stream: the engine's error is the last record, then [DONE].
        with pytest.raises(openai.APIError) as refused:
            list(
                openai_client(front).chat.completions.create(
                    model="engine", messages=[{"role": "user", "content": "hi"}], stream=True
                )
            )
    body = refused.value.body
    assert isinstance(body, dict)
    assert (body["code"], body["param"]) == ("context_length_exceeded", "messages")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # not our fault


def test_chat_completions_report_the_engines_usage_and_reasoning(
    make_server: Any, engine: list[StandIn]
) -> None:
    usage = {
        "prompt_tokens": 1234,
        "completion_tokens": 56,
        "prompt_tokens_details": {"cached_tokens": 1000},
        "completion_tokens_details": {"reasoning_tokens": 50},
    }

    def script(number: int, body: dict[str, Any]) -> list[Any]:
        return [
            answer(
                choice({"reasoning_content": "think "}),
                choice({"reasoning_content": "hard"}),
                choice({"content": "42"}),
                choice(finish="stop"),
                record({"choices": [], "usage": usage}),
                record("[DONE]"),
            )
        ]

    peer = stand_in(engine, script)
    front = gateway(make_server, peer.url)
    url = f"http://127.0.0.1:{front.port}/v1/chat/completions"
    request = {"model": "engine", "messages": [{"role": "user", "content": "why"}]}
    completion = httpx.post(url, json=request, headers=KEY).json()
    message = completion["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == ("42", "think hard")
    assert completion["usage"]["prompt_tokens"] == 1234
    assert completion["usage"]["completion_tokens"] == 56
    assert completion["usage"]["prompt_tokens_details"]["cached_tokens"] == 1000
    assert completion["usage"]["completion_tokens_details"]["reasoning_tokens"] == 50
    chunks = list(
        openai_client(front).chat.completions.create(
            model="engine",
            messages=[{"role": "user", "content": "why"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert (deltas[0].model_extra or {}).get("reasoning_content") == "think hard"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 1234


# --- a cut stream, error records, call pieces (review items 8, 9, 13) ---------------


def pieces(*records: dict[str, Any]) -> list[StreamChunk]:
    return [
        msgspec.convert({"choices": [{"index": 0, "delta": {"tool_calls": [r]}}]}, StreamChunk)
        for r in records
    ]


def test_call_pieces_without_index_or_with_a_repeated_name_make_whole_calls() -> None:
    reader = ChunkReader()
    out = []
    for piece in pieces(  # older Ollama: no index at all, the name on every piece
        {"id": "call_a", "function": {"name": "add", "arguments": '{"a": 1}'}},
        {"id": "call_b", "function": {"name": "mul", "arguments": '{"x"'}},
        {"function": {"name": "mul", "arguments": ": 2}"}},
    ):
        out.extend(reader.feed(piece))
    out.extend(reader.end())
    starts = [c for c in out if isinstance(c, ToolCallStart)]
    assert starts == [ToolCallStart("call_a", "add"), ToolCallStart("call_b", "mul")]
    builder = StreamBuilder("resp_x", tag_response_id=False)
    for sample in out:
        builder.feed(sample)
    assert [(c.name, c.arguments) for c in builder.output] == [  # type: ignore[union-attr]
        ("add", '{"a": 1}'),
        ("mul", '{"x": 2}'),
    ]
    # A proxy that numbers every call 0: the new id makes the new call.
    reader = ChunkReader()
    out = []
    for piece in pieces(
        {"index": 0, "id": "call_a", "function": {"name": "add", "arguments": "{}"}},
        {"index": 0, "id": "call_b", "function": {"name": "add", "arguments": "{}"}},
    ):
        out.extend(reader.feed(piece))
    out.extend(reader.end())
    assert [c.call_id for c in out if isinstance(c, ToolCallStart)] == ["call_a", "call_b"]


@pytest.mark.parametrize(
    "record_",
    [
        {"object": "error", "message": "engine crashed, key sk-SECRET", "type": "X", "code": 500},
        {"message": "engine crashed, key sk-SECRET", "code": 503},
        {"error": {"message": "engine crashed, key sk-SECRET", "code": 500}},
    ],
)
def test_an_error_record_in_the_stream_ends_the_turn_without_the_key(
    record_: dict[str, Any],
) -> None:
    reader = ChunkReader(secret="sk-SECRET")
    reader.feed(
        msgspec.convert({"choices": [{"index": 0, "delta": {"content": "hi"}}]}, StreamChunk)
    )
    with pytest.raises(UpstreamError) as failed:
        reader.feed(msgspec.convert(record_, StreamChunk))
    assert failed.value.code == "upstream_unavailable"
    assert failed.value.output_started
    assert "engine crashed" in failed.value.message
    assert "sk-SECRET" not in failed.value.message


def test_done_before_the_finish_is_a_cut_stream(make_server: Any, engine: list[StandIn]) -> None:
    def script(number: int, body: dict[str, Any]) -> list[Any]:
        return [answer(choice({"content": "half an ans"}), record("[DONE]"))]

    peer = stand_in(engine, script)
    front = gateway(make_server, peer.url)
    events = list(openai_client(front).responses.create(model="engine", input="talk", stream=True))
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.code == "upstream_unavailable"
    assert "ended the stream" in events[-1].response.error.message
    assert events[-1].response.output[0].status == "incomplete"


def test_a_base_urls_credentials_are_never_shown(tmp_path: Path) -> None:
    assert shown_url("http://user:pw@engine:8000/v1") == "http://engine:8000/v1"
    for url in ("ftp://user:pw@engine/v1", "http://user:pw@/v1"):
        path = tmp_path / "models.toml"
        path.write_text(f'[models.m]\nkind = "chat"\nbase_url = "{url}"\n')
        with pytest.raises(SettingsError) as refused:
            load_toml(str(path))
        assert "user:pw" not in str(refused.value)
    ChatBackend(chat_backend("http://user:pw@engine.invalid/v1"))  # quiets httpx
    assert logging.getLogger("httpx").getEffectiveLevel() >= logging.WARNING


# --- connections reused (review item 14) --------------------------------------------


async def test_turns_reuse_one_connection_to_the_engine(
    make_server: Any, engine: list[StandIn]
) -> None:
    peer = stand_in(engine, lambda number, body: [text_answer(f"turn {number}")])
    front = gateway(make_server, peer.url)
    async with connect(front.url) as client:
        for turn in range(3):
            await client.create(model="engine", input=f"turn {turn}")
            done = (await client.until_done())[-1]
            assert isinstance(done, ResponseDone)
            assert done.response.status == "completed"
    assert len(peer.requests) == 3
    assert peer.connections == 1


# --- what a mapping used to lose (review item 15) -----------------------------------


def test_text_after_a_call_becomes_a_message_after_the_calls() -> None:
    reader = ChunkReader()
    out = []
    for piece in pieces(
        {"index": 0, "id": "call_a", "function": {"name": "add", "arguments": "{}"}}
    ):
        out.extend(reader.feed(piece))
    out.extend(
        reader.feed(
            msgspec.convert(
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": "Adding now."},
                            "finish_reason": "tool_calls",
                        }
                    ]
                },
                StreamChunk,
            )
        )
    )
    out.extend(reader.end())
    builder = StreamBuilder("resp_x", tag_response_id=False)
    for sample in out:
        builder.feed(sample)
    assert [type(item) for item in builder.output] == [FunctionCall, Message]
    assert item_text(builder.output[1].content) == "Adding now."  # type: ignore[union-attr]


def test_several_text_parts_stay_apart_and_an_image_is_refused() -> None:
    parts = [InputText(text="first line"), InputText(text="second line")]
    messages = messages_from_items([Message(role="user", content=parts)])
    assert msgspec.to_builtins(messages[0])["content"] == [
        {"type": "text", "text": "first line"},
        {"type": "text", "text": "second line"},
    ]
    image = InputImage(image_url="https://example.invalid/cat.png")
    with pytest.raises(UpstreamError) as refused:
        messages_from_items([Message(role="user", content=[parts[0], image])])
    assert (refused.value.code, refused.value.status, refused.value.param) == (
        "invalid_value",
        400,
        "input",
    )
    assert "input_image" in refused.value.message


def test_an_image_for_a_chat_engine_is_refused_over_http(
    make_server: Any, engine: list[StandIn]
) -> None:
    peer = stand_in(engine, lambda number, body: [text_answer()])
    front = gateway(make_server, peer.url)
    content = [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": "https://example.invalid/cat.png"},
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client(front).responses.create(
            model="engine", input=[{"role": "user", "content": content}]
        )
    assert refused.value.code == "invalid_value"
    assert peer.requests == []  # nothing was sent with the image left out


# --- the sim_* metadata is the simulated model's own ---------------------------------


async def test_sim_metadata_is_not_checked_for_a_real_backends_model(
    make_server: Any, engine: list[StandIn]
) -> None:
    """``sim_*`` keys are checked by the simulated model only: a real backend's
    model takes them as any metadata (sent on to its engine), on every shape."""
    peer = stand_in(engine, lambda number, body: [text_answer()])
    front = gateway(make_server, peer.url, max_retries=0)
    odd = {"sim_tool_calls": "x", "sim_ttft_ms": "forever"}
    async with connect(front.url) as client:  # append mode
        await client.create(model="engine", input="hi", metadata=odd)
        done = (await client.until_done())[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "completed"
    with openai_client(front).responses.connect() as conn:  # the shipped WebSocket shape
        conn.response.create(model="engine", input="hi", metadata=odd, store=False)
        for event in conn:
            if event.type in ("response.completed", "response.failed", "error"):
                break
    assert event.type == "response.completed"
    http = openai_client(front)
    assert http.responses.create(model="engine", input="hi", metadata=odd).status == "completed"
    chat = http.chat.completions.create(
        model="engine", messages=[{"role": "user", "content": "hi"}], metadata=odd
    )
    assert chat.choices[0].message.content == "ok"
    assert [request["metadata"] for request in peer.requests] == [odd] * 4
    # The simulated model still refuses them.
    with pytest.raises(openai.BadRequestError) as refused:
        http.responses.create(model="sim", input="hi", metadata=odd)
    assert refused.value.code == "invalid_value"


def test_listed_mcp_tools_are_offered_as_functions_and_their_calls_are_hosted() -> None:
    """The chat backend's side of a hosted MCP tool, without an engine: the
    latest listing of each ``mcp`` server of the request becomes functions
    named ``<server_label>__<tool>`` (none whose name a chat API would refuse,
    or a function tool's name takes); a call of one starts a hosted (``mcp``)
    call; a call that ran goes back to the engine as its call and result."""
    tools = [
        McpTool(server_label="loop", server_url="http://127.0.0.1:1/mcp"),
        FunctionTool(name="loop__add", parameters={"type": "object"}),
    ]
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    context = [
        McpListTools(server_label="loop", tools=[McpListedTool(name="old", input_schema={})]),
        McpListTools(
            server_label="loop",
            tools=[
                McpListedTool(name="shout", input_schema=schema, description="Capitals."),
                McpListedTool(name="add", input_schema={}),  # taken by the function tool
                McpListedTool(name="has space", input_schema={}),  # not a chat name
            ],
        ),
        McpListTools(server_label="other", tools=[McpListedTool(name="x", input_schema={})]),
    ]
    offered = mcp_functions(tools, context)
    assert list(offered) == ["loop__shout"]  # the latest listing only; "other" is no tool
    function = offered["loop__shout"].tool.function
    assert (function.name, function.parameters, function.description) == (
        "loop__shout",
        schema,
        "Capitals.",
    )
    reader = ChunkReader(mcp=offered)
    out = []
    for piece in pieces(
        {"index": 0, "id": "call_m", "function": {"name": "loop__shout", "arguments": "{}"}},
        {"index": 1, "id": "call_f", "function": {"name": "loop__add", "arguments": "{}"}},
    ):
        out.extend(reader.feed(piece))
    out.extend(reader.end())
    assert [c for c in out if isinstance(c, ToolCallStart)] == [
        ToolCallStart("call_m", "shout", kind="mcp", namespace="loop"),
        ToolCallStart("call_f", "loop__add"),
    ]
    ran = McpCall(
        id="mcp_1",
        server_label="loop",
        name="shout",
        arguments='{"text":"hi"}',
        status="completed",
        output="HI",
    )
    failed = msgspec.structs.replace(
        ran,
        id="mcp_2",
        output=None,
        status="failed",
        error={"type": "http_error", "code": 504, "message": "timed out"},
    )
    messages = msgspec.to_builtins(messages_from_items([ran, failed]))
    assert messages == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "mcp_1",
                    "type": "function",
                    "function": {"name": "loop__shout", "arguments": '{"text":"hi"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "mcp_1", "content": "HI"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "mcp_2",
                    "type": "function",
                    "function": {"name": "loop__shout", "arguments": '{"text":"hi"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "mcp_2", "content": "Error: timed out"},
    ]
    assert msgspec.to_builtins(
        tool_choice_to_chat(ToolChoiceMcp(server_label="loop", name="shout"))
    ) == {
        "type": "function",
        "function": {"name": "loop__shout"},
    }
    assert tool_choice_to_chat(ToolChoiceMcp(server_label="loop")) == "required"


# --- compaction: the engine's summary turn, and the window after it ----------------


async def test_a_compaction_asks_the_engine_for_its_summary_and_counts_the_window_anew(
    make_server: Any, engine: list[StandIn]
) -> None:
    """A tool output passes the threshold: the engine is asked for a summary (the
    context, then the instruction, no tool call, a limit), its text is the
    window's summary, and the window's turn is counted from the smaller
    window, not from the summary turn's prompt (which would have left it a
    few hundred tokens of room: the issue's limit of one token, in small)."""

    def counted(body: dict[str, Any]) -> int:  # the engine's count: 1 token for 3 bytes
        return len(json.dumps(body["messages"]) + json.dumps(body.get("tools", []))) // 3

    def script(number: int, body: dict[str, Any]) -> list[Any]:
        usage = record(
            {"choices": [], "usage": {"prompt_tokens": counted(body), "completion_tokens": 9}}
        )
        if number == 1:
            return [
                answer(
                    call_delta("call_A", "add", '{"a": 1, "b": 2}', index=0),
                    choice(finish="tool_calls"),
                    usage,
                    record("[DONE]"),
                )
            ]
        text = "the engine's summary" if number == 2 else "done"
        return [answer(choice({"content": text}), choice(finish="stop"), usage, record("[DONE]"))]

    peer = stand_in(engine, script)
    front = gateway(make_server, peer.url, context_window=2048, max_tokens_field="max_tokens")
    async with connect(front.url) as client:
        await client.create(
            model="engine",
            input="add",
            tools=[ADD],
            max_output_tokens=5000,
            context_management=[{"type": "compaction", "compact_threshold": 1000}],
        )
        pause = (await client.until_done())[-1]
        assert isinstance(pause, ResponseDone)
        long_output = "3 " + "and the sum is three " * 250
        await client.append(
            [{"type": "function_call_output", "call_id": "call_A", "output": long_output}]
        )
        done = (await client.until_done())[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "completed", done.response.error
    first, summary_turn, window_turn = peer.requests
    instruction = summary_turn["messages"][-1]
    assert instruction["role"] == "user"
    assert instruction["content"].startswith("Stop here and write a summary")
    assert summary_turn["messages"][:-1] == [*first["messages"], *summary_turn["messages"][1:-1]]
    assert summary_turn["tool_choice"] == "none"
    assert 0 < summary_turn["max_tokens"] < 500
    said = [m["content"] for m in window_turn["messages"] if m["role"] == "user"]
    assert (
        "Summary of the conversation so far, written when it was compacted:\nthe engine's summary"
        in "\n".join(said)
    )
    summarized = counted(summary_turn)
    assert window_turn["max_tokens"] > 2048 - summarized - window_margin(summarized)


def test_compact_endpoint_asks_the_engine_for_the_summary(
    make_server: Any, engine: list[StandIn]
) -> None:
    """``POST /v1/responses/compact`` in front of an engine: one summary turn, whose
    text the sealed window holds."""
    usage = record({"choices": [], "usage": {"prompt_tokens": 90, "completion_tokens": 9}})
    peer = stand_in(
        engine,
        lambda number, body: [
            answer(choice({"content": "the engine's summary"}), choice(finish="stop"), usage)
        ],
    )
    front = make_server(
        store="memory://", backends=(chat_backend(peer.url),), compaction_key="edge key"
    )
    conversation = [
        {"role": "user", "content": "add 1 and 2"},
        {"type": "function_call", "call_id": "call_A", "name": "add", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_A", "output": "3"},
    ]
    answered = httpx.post(
        f"{front.http_url}/v1/responses/compact",
        json={"model": "engine", "input": conversation},
        timeout=30,
    )
    assert answered.status_code == 200, answered.text
    (asked,) = peer.requests
    assert asked["messages"][-1]["content"].startswith("Stop here and write a summary")
    item = answered.json()["output"][-1]
    window = CompactionKey.derive("edge key").open(item["encrypted_content"], "")
    said = [item_text(m.content) for m in window if isinstance(m, Message)]
    assert said[0] == "add 1 and 2"  # the request, then the engine's summary, then the call
    assert said[1].startswith(
        "Summary of the conversation so far, written when it was compacted:\nthe engine's summary\n"
    )
    assert [type(m).__name__ for m in window][-2:] == ["FunctionCall", "FunctionCallOutput"]
