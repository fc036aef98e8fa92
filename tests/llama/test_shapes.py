"""Every shape through the real engine, each a loop of real tool calls.

The gateway stands in front of llama-server as docs/REAL_MODELS.md configures
it: the client's ``auto`` goes as ``required`` (the engine's grammar forces a
call), and an answer (``tool_choice: "none"``) is held to the template's
format by a grammar. The calls' ids and arguments are the engine's, and the
usage billed is the engine's own, compared with its ``/metrics`` counters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from longresponse.backends.settings import load_toml
from longresponse.client import connect
from longresponse.llama_server import LlamaServer
from protocol.events import FunctionCallArgumentsDelta, OutputItemDone, ResponseDone
from protocol.items import FunctionCall, Message
from tests.conftest import openai_client
from tests.llama.conftest import LOOP_TIMEOUT, MODEL, WEATHER, Counted
from tests.support.shipped_ws import sdk_turn

#: Real turns on two cores shared with other work: seconds on a quiet machine,
#: minutes on a loaded one (the engine measured 13-28 times slower).
pytestmark = pytest.mark.timeout(LOOP_TIMEOUT)

#: Seconds one turn may take on two busy cores.
TURN = 180.0


def forecast(call: Any) -> str:
    """The tool's output for a call (``call`` or its city): a few dozen tokens."""
    city = call if isinstance(call, str) else json.loads(call.arguments)["city"]
    return f"{city}: sunny, 21 C, light wind from the west, humidity 40 percent."


async def test_append_mode_one_response_pauses_on_each_real_call(
    front: Any, llama: LlamaServer
) -> None:
    gateway = front()
    counted = Counted(llama)
    async with connect(gateway.url) as client:
        await client.create(
            model=MODEL,
            input="What is the weather in Paris?",
            tools=[WEATHER],
            max_tool_calls=2,
            temperature=0,
            max_output_tokens=400,
        )
        response_id = None
        calls: list[FunctionCall] = []
        streamed: dict[str, str] = {}
        for _ in range(2):
            events = await client.until_done(timeout=TURN)
            pause = events[-1]
            assert isinstance(pause, ResponseDone)
            assert pause.response.status == "requires_action", pause.response
            response_id = response_id or pause.response.id
            assert pause.response.id == response_id  # one Response for the whole loop
            (call,) = [
                e.item
                for e in events
                if isinstance(e, OutputItemDone) and isinstance(e.item, FunctionCall)
            ]
            for event in events:
                if isinstance(event, FunctionCallArgumentsDelta):
                    streamed[event.item_id] = streamed.get(event.item_id, "") + event.delta
            assert call.name == "get_weather"
            assert streamed[call.id] == call.arguments  # the engine's, as it streamed them
            city = json.loads(call.arguments)["city"]
            assert isinstance(city, str)
            calls.append(call)
            await client.append(
                [
                    {
                        "type": "function_call_output",
                        "call_id": call.call_id,
                        "output": forecast(city),
                    }
                ]
            )
        events = await client.until_done(timeout=TURN)
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "completed"
    assert done.response.id == response_id
    answer = done.response.output[-1]
    assert isinstance(answer, Message)
    assert answer.content[0].text.strip()  # type: ignore[union-attr]
    # The engine's call ids (llama.cpp's 32 random characters), not ours.
    assert all(len(c.call_id) == 32 and not c.call_id.startswith("call_") for c in calls)
    usage = done.response.usage
    assert usage is not None
    evaluated, cached, generated = counted.delta()
    assert usage.input_tokens == evaluated + cached
    assert usage.input_tokens_details.cached_tokens == cached
    assert cached > 0  # each resume found its prefix in the engine's cache
    assert usage.output_tokens == generated


def _calls(response: Any) -> list[Any]:
    return [o for o in response.output if o.type == "function_call"]


def _billed(responses: list[Any]) -> tuple[int, int, int]:
    """(input less cached, cached, output) summed over ``responses``' usage."""
    usages = [r.usage for r in responses]
    cached = sum(u.input_tokens_details.cached_tokens for u in usages)
    return (
        sum(u.input_tokens for u in usages) - cached,
        cached,
        sum(u.output_tokens for u in usages),
    )


def test_the_shipped_websocket_chain_with_the_sdk(front: Any, llama: LlamaServer) -> None:
    gateway = front()
    counted = Counted(llama)
    done = []
    with openai_client(gateway).responses.connect() as conn:
        previous = None
        for turn, choice in enumerate(("auto", "auto", "none")):
            output = (
                [
                    {"type": "function_call_output", "call_id": c.call_id, "output": forecast(c)}
                    for c in _calls(done[-1])
                ]
                if done
                else "What is the weather in Rome?"
            )
            conn.response.create(
                model=MODEL,
                input=output,
                tools=[WEATHER],
                tool_choice=choice,
                previous_response_id=previous,
                store=False,
                temperature=0,
                max_output_tokens=60,
            )
            events = sdk_turn(conn)
            end = events[-1]
            assert end.type == "response.completed", end
            done.append(end.response)
            previous = end.response.id
            if turn < 2:
                (call,) = _calls(end.response)
                assert call.name == "get_weather"
                streamed = "".join(
                    e.delta for e in events if e.type == "response.function_call_arguments.delta"
                )
                assert streamed == call.arguments
                assert isinstance(json.loads(call.arguments)["city"], str)
    assert done[-1].output[-1].type == "message"
    assert done[-1].output_text.strip()
    assert _billed(done) == counted.delta()
    assert done[-1].usage.input_tokens_details.cached_tokens > 0


def test_an_http_chain_json_then_sse_with_the_sdk(front: Any, llama: LlamaServer) -> None:
    """Turn 1 as JSON, turns 2 and 3 as SSE, each continuing the stored last."""
    gateway = front()
    client = openai_client(gateway)
    counted = Counted(llama)
    create: dict[str, Any] = dict(
        model=MODEL, tools=[WEATHER], store=True, temperature=0, max_output_tokens=60
    )
    first = client.responses.create(input="What is the weather in Oslo?", **create)
    assert first.status == "completed"
    (call,) = _calls(first)
    assert call.name == "get_weather"
    done = [first]
    for choice in ("auto", "none"):
        answered = [
            {"type": "function_call_output", "call_id": c.call_id, "output": forecast(c)}
            for c in _calls(done[-1])
        ]
        stream = client.responses.create(
            input=answered,  # type: ignore[arg-type]
            previous_response_id=done[-1].id,
            tool_choice=choice,  # type: ignore[arg-type]
            stream=True,
            **create,
        )
        events = list(stream)
        end = events[-1]
        assert end.type == "response.completed", end
        done.append(end.response)
    (second,) = _calls(done[1])
    assert second.call_id != call.call_id
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == done[-1].output_text
    assert done[-1].output[-1].type == "message"
    assert _billed(done) == counted.delta()


def responses_kind(make_server: Any, llama: LlamaServer, tmp_path: Path, *, store: bool) -> Any:
    """A gateway whose backend is llama-server's own ``/v1/responses``."""
    path = tmp_path / "responses.toml"
    path.write_text(
        f'[models.{MODEL}]\nkind = "responses"\nbase_url = "{llama.base_url}"\n'
        f"upstream_store = {'true' if store else 'false'}\nfirst_token_timeout = 60\n"
    )
    return make_server(store="memory://", backends=load_toml(str(path)))


def test_the_responses_kind_against_llama_servers_own_responses_api(
    make_server: Any, llama: LlamaServer, tmp_path: Path
) -> None:
    """Stateless upstream: each turn sends the whole conversation (the engine
    counts it all, and finds the earlier turn's prefix cached)."""
    client = openai_client(responses_kind(make_server, llama, tmp_path, store=False))
    counted = Counted(llama)
    create: dict[str, Any] = dict(
        model=MODEL, tools=[WEATHER], tool_choice="required", temperature=0, max_output_tokens=60
    )
    first = client.responses.create(input="What is the weather in Paris?", **create)
    (call,) = _calls(first)
    second = client.responses.create(
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": forecast(call)}],
        previous_response_id=first.id,
        stream=True,
        **create,
    )
    end = list(second)[-1]
    assert end.type == "response.completed", end
    (again,) = _calls(end.response)
    assert again.name == "get_weather"
    assert again.call_id != call.call_id
    assert isinstance(json.loads(again.arguments)["city"], str)
    assert first.usage is not None
    # The whole conversation went up again: more than the first turn's prompt,
    # its prefix reused from the engine's cache.
    assert end.response.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert end.response.usage.input_tokens_details.cached_tokens > 0
    assert _billed([first, end.response]) == counted.delta()


def test_chat_completions_in_front_of_the_engine(front: Any) -> None:
    gateway = front()
    chat = openai_client(gateway).chat.completions
    tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Rome?"}]
    first = chat.create(model=MODEL, messages=messages, tools=[tool], temperature=0, max_tokens=60)
    (choice,) = first.choices
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert len(call.id) == 32  # the engine's id
    city = json.loads(call.function.arguments)["city"]  # type: ignore[union-attr]
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": forecast(city)},
    ]
    stream = chat.create(
        model=MODEL,
        messages=messages,
        tools=[tool],
        tool_choice="none",
        temperature=0,
        max_tokens=60,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]
    assert usage.prompt_tokens_details.cached_tokens > 0  # type: ignore[union-attr]
