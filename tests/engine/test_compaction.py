"""Compaction end to end: ``POST /v1/responses/compact``, compaction items as input,
server-side compaction (``context_management``) and ``compaction_trigger``.

Driven by the official ``openai`` SDK (HTTP and ``responses.connect()``) and,
for append mode, by the project's trio client. Every shipped-shape event is
validated strictly against the SDK's own models. The simulated model's
compaction keeps the request and the head of every tool output, so each test
proves the context survived by the final answer quoting them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from openai import OpenAI
from openai.types.responses.response_compaction_item import ResponseCompactionItem
from openai.types.responses.response_input_item import ResponseInputItem
from openai.types.responses.response_stream_event import ResponseStreamEvent
from openai.types.responses.response_usage import ResponseUsage
from openai.types.responses.responses_server_event import ResponsesServerEvent

from longresponse.client import connect
from longresponse.config import SimConfig
from protocol.events import CompactionCompacting, OutputItemAdded, OutputItemDone, ResponseDone
from protocol.items import Compaction, FunctionCall, Message, OutputText
from tests.support.http_clients import openai_client
from tests.support.shipped_ws import TERMINAL

STRICT_WS = pydantic.TypeAdapter(ResponsesServerEvent)
STRICT_SSE = pydantic.TypeAdapter(ResponseStreamEvent)
STRICT_INPUT_ITEM = pydantic.TypeAdapter(ResponseInputItem)

READ = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
REQUEST = "Find the bug in fizz_buzz() and explain why it happens."
#: At the shipped minimum: a few long tool outputs cross it.
THRESHOLD = 1000


def tool_output(number: int) -> str:
    """About 170 tokens, unique within the 40 characters the answer quotes."""
    return f"output {number:03d} of read_file, line by line: " + "fizz buzz " * 80


def quotes_everything(text: str, outputs: list[str]) -> None:
    assert f"«{REQUEST[:40]}»" in text, text
    for output in outputs:
        assert f"«{output[:40]}»" in text, (output[:40], text)
    assert f"I read {len(outputs)} tool outputs" in text


def check_compaction_item(item: dict[str, Any]) -> None:
    """A finished compaction item, strictly as the SDK models it."""
    ResponseCompactionItem.model_validate(item, strict=True)
    assert item["type"] == "compaction"
    assert item["encrypted_content"]


def compact(client: OpenAI, **body: Any) -> dict[str, Any]:
    """``client.responses.compact(...)``, as the JSON the server sent (checked).

    The SDK types the user messages of the output as output messages, so
    its parsed view of them is lossy; clients replay the JSON.
    """
    raw = client.responses.with_raw_response.compact(**body)
    assert raw.parse().object == "response.compaction"
    parsed: dict[str, Any] = json.loads(raw.http_response.text)
    check_compacted(parsed)
    return parsed


def check_compacted(body: dict[str, Any]) -> None:
    """A ``response.compaction`` object: user messages, then one compaction item."""
    assert body["object"] == "response.compaction"
    assert body["id"].startswith("resp_")
    assert isinstance(body["created_at"], int)
    ResponseUsage.model_validate(body["usage"], strict=True)
    *users, last = body["output"]
    check_compaction_item(last)
    for user in users:
        STRICT_INPUT_ITEM.validate_python(user, strict=True)
        assert user["type"] == "message"
        assert user["role"] == "user"


# --- POST /v1/responses/compact, then the window as input ------------------------


def http_tool_chain(client: OpenAI, calls: int, **create: Any) -> tuple[Any, list[str]]:
    """A stored HTTP conversation of ``calls`` tool calls, chained by id."""
    response = client.responses.create(
        model="sim", input=REQUEST, tools=[READ], metadata={"sim_tool_calls": str(calls)}, **create
    )
    outputs: list[str] = []
    while calls_in := [item for item in response.output if item.type == "function_call"]:
        answers = []
        for call in calls_in:
            outputs.append(tool_output(len(outputs)))
            answers.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": outputs[-1]}
            )
        response = client.responses.create(
            model="sim",
            previous_response_id=response.id,
            input=answers,
            tools=[READ],
            metadata={"sim_tool_calls": str(calls)},
            **create,
        )
    return response, outputs


def test_compact_over_http_then_continue_from_the_window(server: Any) -> None:
    client = openai_client(server)
    last, outputs = http_tool_chain(client, 4)
    body = compact(client, model="sim", previous_response_id=last.id)
    assert [item["content"] for item in body["output"][:-1]] == [
        [{"type": "input_text", "text": REQUEST}]
    ]
    # The model read the whole conversation to compact it, and wrote less.
    usage = body["usage"]
    assert 0 < usage["output_tokens"] < usage["input_tokens"]
    window = body["output"]
    follow_up = {"role": "user", "content": "Now fix it."}
    # A new chain from the window: no previous_response_id, the output unchanged.
    continued = client.responses.create(model="sim", input=[*window, follow_up])
    quotes_everything(continued.output_text, outputs)
    assert "«Now fix it.»" in continued.output_text
    # The same question asked of the whole stored chain reads far more.
    chained = client.responses.create(model="sim", previous_response_id=last.id, input=[follow_up])
    assert continued.output_text == chained.output_text
    assert continued.usage is not None
    assert chained.usage is not None
    assert continued.usage.input_tokens < chained.usage.input_tokens / 2


def test_compact_takes_the_whole_input_and_instructions(server: Any) -> None:
    client = openai_client(server)
    conversation = [
        {"role": "user", "content": REQUEST},
        {"type": "function_call", "call_id": "call_a", "name": "read_file", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_a", "output": tool_output(0)},
        {"role": "assistant", "content": "It divides by zero somewhere."},
        {"role": "user", "content": "Which line?"},
    ]
    bare = compact(client, model="sim", input=conversation)
    with_instructions = compact(
        client, model="sim", input=conversation, instructions="You are a careful reviewer. " * 20
    )
    assert with_instructions["usage"]["input_tokens"] > bare["usage"]["input_tokens"]
    assert with_instructions["usage"]["output_tokens"] == bare["usage"]["output_tokens"]
    window = bare["output"]
    assert [item["role"] for item in window[:-1]] == ["user", "user"]
    answer = client.responses.create(model="sim", input=window)
    quotes_everything(answer.output_text.replace(" | «Which line?»", ""), [tool_output(0)])
    # The assistant's earlier answer is not kept: the summary holds what the
    # request and the tools said.
    assert "divides by zero" not in answer.output_text


def test_window_over_the_shipped_websocket(server: Any) -> None:
    client = openai_client(server)
    last, outputs = http_tool_chain(client, 3)
    items = compact(client, model="sim", previous_response_id=last.id)["output"]
    with client.responses.connect() as conn:
        conn.response.create(model="sim", input=items, tools=[READ], store=False)
        events = ws_turn(conn)
    assert events[-1].type == "response.completed"
    quotes_everything(events[-1].response.output_text, outputs)


async def test_window_in_append_mode(server: Any) -> None:
    client = openai_client(server)
    last, outputs = http_tool_chain(client, 3)
    items = compact(client, model="sim", previous_response_id=last.id)["output"]
    async with connect(server.url) as append:
        await append.create(model="sim", input=[*items, {"role": "user", "content": "And?"}])
        done = (await append.until_done())[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "completed"
    quotes_everything(answer_text(done), outputs)
    assert "«And?»" in answer_text(done)


# --- server-side compaction: context_management --------------------------------


def ws_recv(conn: Any) -> Any:
    event = STRICT_WS.validate_json(conn.recv_bytes())
    assert event.type != "error", event
    return event


def ws_turn(conn: Any) -> list[Any]:
    events = []
    while True:
        events.append(ws_recv(conn))
        if events[-1].type in TERMINAL:
            return events


def compaction_events(events: list[Any]) -> list[Any]:
    """The three events of each compaction item, checked for their order and shape."""
    found = []
    for index, event in enumerate(events):
        if event.type == "response.compaction.compacting":
            added, done = events[index - 1], events[index + 1]
            assert added.type == "response.output_item.added"
            assert added.item.type == "compaction"
            assert added.item.id == event.item_id == done.item.id
            assert added.output_index == event.output_index == done.output_index
            assert done.type == "response.output_item.done"
            check_compaction_item(done.item.model_dump())
            found.append(done.item)
    return found


def test_context_management_over_the_shipped_websocket(server: Any) -> None:
    client = openai_client(server)
    context_management = [{"type": "compaction", "compact_threshold": THRESHOLD}]
    outputs: list[str] = []
    compactions: list[Any] = []
    within_threshold: list[int] = []
    with client.responses.connect() as conn:
        conn.response.create(
            model="sim",
            input=REQUEST,
            tools=[READ],
            store=False,
            metadata={"sim_tool_calls": "10"},
            context_management=context_management,  # type: ignore[arg-type]
        )
        while True:
            events = ws_turn(conn)
            assert [e.sequence_number for e in events] == list(range(len(events)))
            response = events[-1].response
            assert response.status == "completed"
            found = compaction_events(events)
            compactions.extend(found)
            if found:  # the compaction item leads the output; the model went on after it
                assert response.output[0].type == "compaction"
                assert len(response.output) == 2
            else:
                within_threshold.append(response.usage.input_tokens)
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                break
            answers = []
            for call in calls:
                outputs.append(tool_output(len(outputs)))
                answers.append(
                    {"type": "function_call_output", "call_id": call.call_id, "output": outputs[-1]}
                )
            conn.response.create(
                model="sim",
                previous_response_id=response.id,
                input=answers,
                tools=[READ],
                store=False,
                metadata={"sim_tool_calls": "10"},
                context_management=context_management,  # type: ignore[arg-type]
            )
    assert len(outputs) == 10
    assert len(compactions) >= 2  # each window filled up again
    quotes_everything(response.output_text, outputs)
    # A turn that did not compact read at most the threshold: that is the rule.
    assert within_threshold
    assert all(tokens <= THRESHOLD for tokens in within_threshold)


def test_context_management_over_http_stateless_input_chaining(server: Any) -> None:
    """A client that resends everything it has: the latest compaction item in its
    input supersedes what came before it."""
    client = openai_client(server)
    history: list[Any] = [{"role": "user", "content": REQUEST}]
    outputs: list[str] = []
    compacted = 0
    after_compaction = 0  # turns that read a window and did not compact again
    while True:
        response = client.responses.create(
            model="sim",
            input=history,
            tools=[READ],
            store=False,
            metadata={"sim_tool_calls": "8"},
            context_management=[{"type": "compaction", "compact_threshold": THRESHOLD}],
        )
        output = [item.to_dict() for item in response.output]
        compacted += sum(item["type"] == "compaction" for item in output)
        if not any(item["type"] == "compaction" for item in output):
            assert response.usage is not None
            assert response.usage.input_tokens <= THRESHOLD
            after_compaction += compacted > 0
        history.extend(output)
        calls = [item for item in output if item["type"] == "function_call"]
        if not calls:
            break
        for call in calls:
            outputs.append(tool_output(len(outputs)))
            history.append(
                {"type": "function_call_output", "call_id": call["call_id"], "output": outputs[-1]}
            )
    assert compacted >= 1
    assert after_compaction >= 2
    # The input held everything, but the model read the window after the latest compaction.
    quotes_everything(response.output_text, outputs)


def test_context_management_over_http_chained_through_the_store(server: Any) -> None:
    """Each request rebuilds its chain from the store: the compaction items in it
    are opened again, and the window is what the model reads."""
    client = openai_client(server)
    last, outputs = http_tool_chain(
        client, 8, context_management=[{"type": "compaction", "compact_threshold": THRESHOLD}]
    )
    quotes_everything(last.output_text, outputs)
    # The whole stored chain is far over the threshold; the model read a window.
    assert last.usage is not None
    assert last.usage.input_tokens <= THRESHOLD


def test_context_management_streams_over_http_sse(server: Any) -> None:
    client = openai_client(server)
    conversation = [{"role": "user", "content": REQUEST}]
    for number in range(6):
        call_id = f"call_{number}"
        conversation.append(
            {"type": "function_call", "call_id": call_id, "name": "read_file", "arguments": "{}"}
        )
        conversation.append(
            {"type": "function_call_output", "call_id": call_id, "output": tool_output(number)}
        )
    with client.responses.with_streaming_response.create(
        model="sim",
        input=conversation,  # type: ignore[arg-type]
        stream=True,
        context_management=[{"type": "compaction", "compact_threshold": THRESHOLD}],
    ) as streamed:
        data = [
            line[len("data: ") :] for line in streamed.iter_lines() if line.startswith("data: ")
        ]
    assert data[-1] == "[DONE]"  # the stream's end, after its last event
    events = [STRICT_SSE.validate_json(line) for line in data[:-1]]
    (item,) = compaction_events(events)
    completed = events[-1]
    assert completed.type == "response.completed"
    assert [entry.type for entry in completed.response.output] == ["compaction", "message"]
    assert completed.response.output[0].id == item.id
    quotes_everything(completed.response.output_text, [tool_output(n) for n in range(6)])


async def test_append_mode_long_rollout_stays_within_its_window(make_server: Any) -> None:
    """Without compaction the rollout outgrows a 2,500-token window and fails;
    with it, the same rollout compacts, keeps going and answers from its window."""
    running = make_server(sim=SimConfig(context_window=2500))

    async def rollout(**create: Any) -> tuple[list[Any], list[str]]:
        events: list[Any] = []
        outputs: list[str] = []
        async with connect(running.url) as client:
            await client.create(
                model="sim",
                input=REQUEST,
                tools=[READ],
                metadata={"sim_tool_calls": "16"},
                **create,
            )
            while True:
                batch = await client.until_done()
                events.extend(batch)
                done = batch[-1]
                assert isinstance(done, ResponseDone), done
                if done.response.status != "requires_action":
                    return events, outputs
                for call in done.response.output:
                    if isinstance(call, FunctionCall) and call.call_id in (
                        done.response.required_action.call_ids  # type: ignore[union-attr]
                    ):
                        outputs.append(tool_output(len(outputs)))
                        await client.append(
                            [
                                {
                                    "type": "function_call_output",
                                    "call_id": call.call_id,
                                    "output": outputs[-1],
                                }
                            ]
                        )

    events, _ = await rollout()
    done = events[-1]
    assert done.response.status == "failed"
    assert done.response.error.code == "context_length_exceeded"

    events, outputs = await rollout(
        context_management=[{"type": "compaction", "compact_threshold": THRESHOLD}]
    )
    done = events[-1]
    assert done.response.status == "completed", done.response.error
    assert len(outputs) == 16
    quotes_everything(answer_text(done), outputs)
    # One Response, one sequence, across every pause and every compaction.
    assert [e.sequence_number for e in events] == list(range(len(events)))
    compacting = [e for e in events if isinstance(e, CompactionCompacting)]
    assert len(compacting) >= 2
    for event in compacting:
        added = next(
            e
            for e in events
            if isinstance(e, OutputItemAdded) and e.output_index == event.output_index
        )
        finished = next(
            e
            for e in events
            if isinstance(e, OutputItemDone) and e.output_index == event.output_index
        )
        assert isinstance(added.item, Compaction)
        assert added.item.encrypted_content == ""
        assert isinstance(finished.item, Compaction)
        assert finished.item.encrypted_content
        assert added.item.id == finished.item.id == event.item_id
    kinds = [type(item).__name__ for item in done.response.output]
    assert kinds.count("Compaction") == len(compacting)
    assert kinds.count("FunctionCall") == 16


def answer_text(done: ResponseDone) -> str:
    message = done.response.output[-1]
    assert isinstance(message, Message)
    assert isinstance(message.content, list)
    part = message.content[0]
    assert isinstance(part, OutputText)
    return part.text


# --- compaction_trigger -----------------------------------------------------------


@pytest.fixture
def conn(server: Any) -> Iterator[Any]:
    with openai_client(server).responses.connect() as connection:
        yield connection


def test_compaction_trigger_asks_for_a_compaction_turn(conn: Any) -> None:
    conn.response.create(
        model="sim", input=REQUEST, tools=[READ], store=False, metadata={"sim_tool_calls": "2"}
    )
    outputs: list[str] = []
    response = ws_turn(conn)[-1].response
    while calls := [item for item in response.output if item.type == "function_call"]:
        outputs.append(tool_output(len(outputs)))
        conn.response.create(
            model="sim",
            previous_response_id=response.id,
            input=[
                {"type": "function_call_output", "call_id": calls[0].call_id, "output": outputs[-1]}
            ],
            tools=[READ],
            store=False,
            metadata={"sim_tool_calls": "2"},
        )
        response = ws_turn(conn)[-1].response
    before = response
    conn.response.create(
        model="sim",
        previous_response_id=before.id,
        input=[{"type": "compaction_trigger"}],
        tools=[READ],
        store=False,
    )
    events = ws_turn(conn)
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.compaction.compacting",
        "response.output_item.done",
        "response.completed",
    ]
    (_item,) = compaction_events(events)
    compaction = events[-1].response
    assert [entry.type for entry in compaction.output] == ["compaction"]
    # Nothing sampled: the window is no output of the model (the next turn
    # reads it as input), so it is not charged to max_output_tokens.
    assert compaction.usage.output_tokens == 0
    conn.response.create(
        model="sim", previous_response_id=compaction.id, input="And the fix?", store=False
    )
    after = ws_turn(conn)[-1].response
    quotes_everything(after.output_text.replace(" | «And the fix?»", ""), outputs)
    # The window is smaller than the conversation it replaced.
    assert after.usage.input_tokens < before.usage.input_tokens


# --- a client that compacts by itself ---------------------------------------------


def test_a_summary_handed_back_continues_the_calls_it_counts(server: Any) -> None:
    """Codex with a provider other than OpenAI's compacts by itself: it asks the
    model for a summary (no tools), then sends the request and the summary as the
    last user message. The calls the summary counts are made; the loop goes on
    where it was instead of starting again."""
    client = openai_client(server)
    meta = {"sim_tool_calls": "3"}
    request = {"role": "user", "content": REQUEST}
    history: list[Any] = [request]
    outputs: list[str] = []
    calls_after_compaction = 0
    for compactions in range(10):  # the model finishes well before
        response = client.responses.create(
            model="sim", input=history, tools=[READ], store=False, metadata=meta
        )
        calls = [item.to_dict() for item in response.output if item.type == "function_call"]
        if not calls:
            break
        calls_after_compaction += compactions > 0
        outputs.append(tool_output(len(outputs)))
        history += [*calls, {"type": "function_call_output", "call_id": calls[0]["call_id"],
                             "output": outputs[-1]}]  # fmt: skip
        summary = client.responses.create(
            model="sim",
            input=[*history, {"role": "user", "content": "Summarize the conversation."}],
            store=False,
        ).output_text
        assert f"I read {len(outputs)} tool outputs" in summary  # earlier summaries count too
        history = [request, {"role": "user", "content": f"A summary: {summary}"}]
    else:
        pytest.fail("the model never stopped calling")
    assert len(outputs) == 3
    assert calls_after_compaction == 2
    assert "I read 3 tool outputs" in response.output_text
