"""Append mode end to end: the real server on loopback, driven by the trio client."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
import trio

from longresponse.client import AppendClient, connect
from protocol import ResponseState
from protocol.events import (
    ErrorEvent,
    OutputItemDone,
    OutputTextDelta,
    ResponseCreated,
    ResponseDone,
    ResponseInProgress,
    TimingEvent,
)
from protocol.items import FunctionCall, Message, OutputText

LS_TOOL = {
    "type": "function",
    "name": "list_dir",
    "description": "List a directory",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "depth": {"type": "integer"}},
        "required": ["path"],
    },
}
READ_TOOL = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def final_text(done: ResponseDone) -> str:
    message = done.response.output[-1]
    assert isinstance(message, Message)
    assert isinstance(message.content, list)
    part = message.content[0]
    assert isinstance(part, OutputText)
    return part.text


def calls_of(events: list[Any]) -> list[FunctionCall]:
    return [
        e.item for e in events if isinstance(e, OutputItemDone) and isinstance(e.item, FunctionCall)
    ]


def tool_output(call: FunctionCall, turn: int) -> str:
    # Unique within its first 40 characters, so the final answer's quotes can
    # be matched one to one.
    return f"result {turn:03d} of {call.name} {call.call_id[-8:]}: " + "x" * 200


async def run_tool_loop(client: AppendClient, calls: int, **create: Any) -> tuple[list[Any], str]:
    """Create a rollout that makes ``calls`` tool calls and answer every one."""
    await client.create(
        model="sim",
        input="Find the bug in fizz_buzz() and explain it.",
        tools=[LS_TOOL, READ_TOOL],
        metadata={"sim_tool_calls": str(calls)},
        **create,
    )
    every: list[Any] = []
    outputs: list[str] = []
    while True:
        events = await client.until_done()
        every.extend(events)
        done = events[-1]
        assert isinstance(done, ResponseDone), events[-1]
        if done.response.status != "requires_action":
            return every, "\n".join(outputs)
        for call in calls_of(events):
            text = tool_output(call, len(outputs))
            outputs.append(text)
            await client.append(
                [{"type": "function_call_output", "call_id": call.call_id, "output": text}]
            )


async def test_25_call_rollout_is_one_response(server: Any) -> None:
    async with connect(server.url) as client:
        assert client.subprotocol == "longresponse.append.v1"
        events, outputs = await run_tool_loop(client, 25)
    created = [e for e in events if isinstance(e, ResponseCreated)]
    dones = [e for e in events if isinstance(e, ResponseDone)]
    assert len(created) == 1
    response_id = created[0].response.id
    assert len(dones) == 26
    assert all(d.response.id == response_id for d in dones)
    assert [d.response.status for d in dones] == ["requires_action"] * 25 + ["completed"]
    for done in dones[:-1]:
        assert done.response.required_action is not None
        assert len(done.response.required_action.call_ids) == 1  # type: ignore[union-attr]
    # One sequence for the whole rollout, across every pause.
    assert [e.sequence_number for e in events] == list(range(len(events)))
    indexes = [e.output_index for e in events if isinstance(e, OutputItemDone)]
    assert indexes == list(range(26))
    # Resumes are announced.
    assert sum(isinstance(e, ResponseInProgress) for e in events) == 1 + 25
    # The context proof: the final answer quotes the request and every output.
    text = final_text(dones[-1])
    request = "Find the bug in fizz_buzz() and explain it."
    assert f"«{request[:40]}»" in text
    for line in outputs.splitlines():
        assert f"«{line[:40]}»" in text
    usage = dones[-1].response.usage
    assert usage is not None
    assert usage.input_tokens_details.cached_tokens > 0
    assert usage.input_tokens > usage.input_tokens_details.cached_tokens


async def test_parallel_calls_answered_one_at_a_time(server: Any) -> None:
    async with connect(server.url) as client:
        await client.create(
            model="sim",
            input="Read three files",
            tools=[READ_TOOL],
            metadata={"sim_tool_calls": "3", "sim_parallel_calls": "3"},
        )
        first = await client.until_done()
        done = first[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "requires_action"
        calls = calls_of(first)
        assert len(calls) == 3
        assert done.response.required_action.call_ids == [c.call_id for c in calls]  # type: ignore[union-attr]
        rid = done.response.id
        for index, call in enumerate(calls[:2]):
            await client.append(
                [
                    {
                        "type": "function_call_output",
                        "call_id": call.call_id,
                        "output": f"file {index}",
                    }
                ],
                response_id=rid,
            )
        # Probe: a bad append is answered at once, and nothing resumed meanwhile.
        await client.send_raw(
            json.dumps(
                {
                    "type": "response.append",
                    "input": [{"type": "function_call_output", "call_id": "nope", "output": ""}],
                }
            )
        )
        probe = await client.next_event()
        assert isinstance(probe, ErrorEvent)
        assert probe.error.code == "unknown_call_id"
        assert client.connection.response(rid).state is ResponseState.REQUIRES_ACTION  # type: ignore[union-attr]
        await client.append(
            [{"type": "function_call_output", "call_id": calls[2].call_id, "output": "file 2"}]
        )
        rest = await client.until_done()
        assert isinstance(rest[0], ResponseInProgress)
        assert rest[0].sequence_number == done.sequence_number + 1
        last = rest[-1]
        assert isinstance(last, ResponseDone)
        assert last.response.status == "completed"
        text = final_text(last)
        for index, call in enumerate(calls):
            assert f"[{call.call_id}] «file {index}»" in text


async def test_outputs_sent_together_resume_once(server: Any) -> None:
    async with connect(server.url) as client:
        await client.create(
            model="sim",
            input="go",
            tools=[READ_TOOL],
            metadata={"sim_tool_calls": "2", "sim_parallel_calls": "2"},
        )
        calls = calls_of(await client.until_done())
        await client.append(
            [
                {"type": "function_call_output", "call_id": c.call_id, "output": f"out {c.call_id}"}
                for c in calls
            ]
        )
        rest = await client.until_done()
        assert sum(isinstance(e, ResponseInProgress) for e in rest) == 1
        assert rest[-1].response.status == "completed"  # type: ignore[union-attr]


async def test_steering_message_taken_in_at_next_boundary(server: Any) -> None:
    async with connect(server.url) as client:
        await client.create(
            model="sim",
            input="Summarise the repository",
            metadata={"sim_output_tokens": "300", "sim_tokens_per_second": "2000"},
        )
        # Wait until the model is sampling, then steer.
        while not isinstance(await client.next_event(), OutputTextDelta):
            pass
        await client.append("Also mention the tests, please.")
        events = await client.until_done()
        done = events[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "completed"
        messages = [i for i in done.response.output if isinstance(i, Message)]
        assert len(messages) == 2  # the first answer, then one that saw the steer
        assert "«Also mention the tests, please.»" in final_text(done)
        first = messages[0].content[0]
        assert isinstance(first, OutputText)
        assert "Also mention" not in first.text


async def test_user_message_while_paused_is_queued_until_outputs_arrive(server: Any) -> None:
    async with connect(server.url) as client:
        await client.create(model="sim", input="start", tools=[READ_TOOL])
        first = await client.until_done()
        (call,) = calls_of(first)
        await client.append("and be brief")
        await client.send_raw(json.dumps({"type": "response.cancel", "response_id": "resp_nope"}))
        probe = await client.next_event()
        assert isinstance(probe, ErrorEvent)
        assert probe.error.code == "response_not_found"
        await client.append(
            [{"type": "function_call_output", "call_id": call.call_id, "output": "ok"}]
        )
        # The new user message restarts the model's tool budget: one more call.
        again = await client.until_done()
        assert isinstance(again[0], ResponseInProgress)
        (second,) = calls_of(again)
        await client.append(
            [{"type": "function_call_output", "call_id": second.call_id, "output": "fine"}]
        )
        rest = await client.until_done()
        text = final_text(rest[-1])  # type: ignore[arg-type]
        assert "«and be brief»" in text
        assert f"[{call.call_id}] «ok»" in text
        assert f"[{second.call_id}] «fine»" in text


async def test_cancel_while_sampling(server: Any) -> None:
    async with connect(server.url) as client:
        await client.create(
            model="sim",
            input="write a lot",
            metadata={"sim_output_tokens": "100000", "sim_tokens_per_second": "1000"},
        )
        while not isinstance(await client.next_event(), OutputTextDelta):
            pass
        await client.cancel()
        events = await client.until_done()
        done = events[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "cancelled"
        # The socket is usable afterwards, and the rollout is terminal.
        await client.send_raw(json.dumps({"type": "response.cancel"}))
        again = await client.next_event()
        assert isinstance(again, ErrorEvent)
        assert again.error.code == "response_already_completed"


async def test_cancel_while_paused(server: Any) -> None:
    async with connect(server.url) as client:
        await client.create(model="sim", input="start", tools=[READ_TOOL])
        first = await client.until_done()
        await client.cancel(first[-1].response.id)  # type: ignore[union-attr]
        events = await client.until_done()
        assert [type(e) for e in events] == [ResponseDone]
        assert events[0].response.status == "cancelled"  # type: ignore[union-attr]


async def test_pause_timeout_ends_incomplete(make_server: Any) -> None:
    quick = make_server(pause_timeout=0.2)
    async with connect(quick.url) as client:
        await client.create(model="sim", input="start", tools=[READ_TOOL])
        first = await client.until_done()
        assert first[-1].response.status == "requires_action"  # type: ignore[union-attr]
        events = await client.until_done(timeout=10)
        done = events[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "incomplete"
        assert done.response.incomplete_details is not None
        assert done.response.incomplete_details.reason == "pause_timeout"


async def test_max_output_tokens_ends_incomplete(server: Any) -> None:
    async with connect(server.url) as client:
        await client.create(
            model="sim", input="talk", max_output_tokens=5, metadata={"sim_output_tokens": "50"}
        )
        done = (await client.until_done())[-1]
        assert done.response.status == "incomplete"  # type: ignore[union-attr]
        assert done.response.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]


async def test_several_rollouts_on_one_connection(server: Any) -> None:
    async with connect(server.url) as client:
        await client.create(model="sim", input="first", tools=[READ_TOOL])
        await client.create(model="sim", input="second", tools=[READ_TOOL])
        seen: dict[str, list[Any]] = {}
        paused: dict[str, ResponseDone] = {}
        while len(paused) < 2:
            event = await client.next_event()
            rid = event.response.id if hasattr(event, "response") else event.response_id
            seen.setdefault(rid, []).append(event)
            if isinstance(event, ResponseDone):
                paused[rid] = event
        assert len(seen) == 2
        for rid, events in seen.items():
            assert [e.sequence_number for e in events] == list(range(len(events)))
            (call,) = calls_of(events)
            await client.append(
                [{"type": "function_call_output", "call_id": call.call_id, "output": rid}],
                response_id=rid,
            )
        finished = 0
        while finished < 2:
            event = await client.next_event()
            if isinstance(event, ResponseDone):
                assert event.response.status == "completed"
                assert f"«{event.response.id}»" in final_text(event)
                finished += 1


async def test_timing_events_only_when_asked(server: Any) -> None:
    headers = [("x-responsesapi-include-timing-metrics", "true")]
    async with connect(server.url, headers=headers) as client:
        await client.create(model="sim", input="hi")
        events = await client.until_done()
        extra = await client.next_event()
        assert isinstance(extra, TimingEvent)
        assert extra.response_id == events[-1].response.id  # type: ignore[union-attr]
        assert {"resume_ms", "pre_inference_ms", "new_tokens"} <= set(extra.timing_metrics)
    async with connect(server.url) as client:
        await client.create(model="sim", input="hi")
        await client.until_done()
        await client.send_raw("{}")
        nxt = await client.next_event()
        assert isinstance(nxt, ErrorEvent)  # no timing event came first


@pytest.mark.parametrize("n", [1, 3])
async def test_without_tools_the_model_answers(server: Any, n: int) -> None:
    async with connect(server.url) as client:
        for i in range(n):
            await client.create(model="sim", input=f"question {i}")
            done = (await client.until_done())[-1]
            assert f"«question {i}»" in final_text(done)  # type: ignore[arg-type]


async def test_deadline_when_nothing_arrives(server: Any) -> None:
    async with connect(server.url) as client:
        with pytest.raises(trio.TooSlowError):
            await client.next_event(timeout=0.05)


async def test_the_resume_event_says_in_progress(server: Any) -> None:
    async with connect(server.url) as client:
        await client.create(model="sim", input="go", tools=[READ_TOOL])
        events = await client.until_done()
        paused = events[-1]
        assert isinstance(paused, ResponseDone)
        assert paused.response.status == "requires_action"
        (call,) = calls_of(events)
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "ok"}
        await client.append([output])
        resumed = await client.next_event()
        assert isinstance(resumed, ResponseInProgress), resumed
        assert resumed.response.status == "in_progress"
        assert resumed.response.required_action is msgspec.UNSET
        assert resumed.sequence_number == paused.sequence_number + 1
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "completed"
