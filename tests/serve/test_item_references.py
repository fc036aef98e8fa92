"""Item references in ``input``, on every transport, against a real server.

A client with ``store`` on (the Vercel AI SDK at its defaults) sends earlier
items back as ``{"type": "item_reference", "id": ...}`` or the bare
``{"id": ...}``. The server puts the API key's stored item in its place
before anything reads the input; an id the key does not own, or that no
stored item has, is refused ``invalid_value`` on ``input[i].id``.

The simulated model quotes every user message and tool output it reads; a
function call output is refused unless its call is in the input, so an
answer quoting the output proves the referenced call was read too.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from longresponse.client import connect
from protocol.events import ResponseDone
from protocol.items import FunctionCall, Message, item_text
from tests.support.error_replies import assert_refused
from tests.support.http_clients import openai_client, post

TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _first_turn(client: Any, question: str) -> tuple[Any, Any, Any]:
    """A stored turn that calls the tool, its user message (as stored, with its
    id) and its function call; then the stored answer to that call."""
    first = client.responses.create(model="sim", input=question, tools=[TOOL])
    (call,) = [item for item in first.output if item.type == "function_call"]
    (asked,) = client.responses.input_items.list(first.id).data
    return first, asked, call


def _second_turn_input(asked: Any, call: Any, answer: Any, *, bare: bool) -> list[Any]:
    """The AI SDK's second user turn: earlier items as references, new ones whole."""

    def ref(item_id: str) -> dict[str, str]:
        return {"id": item_id} if bare else {"type": "item_reference", "id": item_id}

    (message,) = [item for item in answer.output if item.type == "message"]
    return [
        ref(asked.id),
        ref(call.id),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        ref(message.id),
        {"role": "user", "content": "And tomorrow?"},
    ]


def _whole(asked: Any, call: Any, answer: Any) -> list[Any]:
    """The same input with every item sent whole."""
    (message,) = [item for item in answer.output if item.type == "message"]
    return [
        asked.model_dump(exclude_none=True),
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        message.model_dump(exclude_none=True),
        {"role": "user", "content": "And tomorrow?"},
    ]


def _answered(client: Any, asked: Any, call: Any) -> Any:
    return client.responses.create(
        model="sim",
        input=[
            {"type": "item_reference", "id": asked.id},
            {"type": "item_reference", "id": call.id},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        ],
        tools=[TOOL],
    )


EXPECTED = "You asked: «Weather in Lyon?» | «And tomorrow?». I read 1 tool outputs:"


@pytest.mark.parametrize("bare", [False, True], ids=["item_reference", "bare_id"])
def test_references_over_http_json_and_sse(make_server: Any, bare: bool) -> None:
    client = openai_client(make_server())
    _, asked, call = _first_turn(client, "Weather in Lyon?")
    # The call and the question come back as references: the output answers the call.
    answer = _answered(client, asked, call)
    assert answer.status == "completed"
    assert "«Weather in Lyon?»" in answer.output_text
    assert f"[{call.call_id}] «sunny, 21 C»" in answer.output_text

    sent = _second_turn_input(asked, call, answer, bare=bare)
    by_reference = client.responses.create(
        model="sim", input=sent, tools=[TOOL], tool_choice="none"
    )
    assert by_reference.output_text.startswith(EXPECTED), by_reference.output_text
    # The model read what it would have read with every item sent whole.
    whole = client.responses.create(
        model="sim", input=_whole(asked, call, answer), tools=[TOOL], tool_choice="none"
    )
    assert by_reference.output_text == whole.output_text
    assert by_reference.usage.input_tokens == whole.usage.input_tokens
    # The response's input items are the stored items themselves, ids kept.
    listed = client.responses.input_items.list(by_reference.id, order="asc").data
    assert [item.type for item in listed] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
    ]
    assert (listed[0].id, listed[1].id) == (asked.id, call.id)
    assert listed[3].role == "assistant"
    assert listed[3].content[0].text == answer.output_text

    # Over SSE the same.
    with client.responses.create(
        model="sim", input=sent, tools=[TOOL], tool_choice="none", stream=True
    ) as stream:
        events = list(stream)
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == whole.output_text


def test_references_over_the_shipped_websocket(make_server: Any) -> None:
    client = openai_client(make_server())
    _, asked, call = _first_turn(client, "Weather in Lyon?")
    answer = _answered(client, asked, call)
    sent = _second_turn_input(asked, call, answer, bare=False)
    with client.responses.connect() as conn:
        conn.response.create(model="sim", input=sent, tools=[TOOL], tool_choice="none")
        while (event := conn.recv()).type != "response.completed":
            assert event.type != "error", event
        assert event.response.output_text.startswith(EXPECTED), event.response.output_text
        # A bare id on a lane, refused when unknown: the error names the item.
        conn.response.create(
            model="sim",
            input=[{"role": "user", "content": "hi"}, {"id": "msg_nope"}],
            stream_id="side",
        )
        event = conn.recv()
        assert event.type == "error"
        assert (event.error.code, event.error.param) == ("invalid_value", "input[1].id")
        assert event.stream_id == "side"
        # The connection goes on.
        conn.response.create(model="sim", input=[{"id": asked.id}])
        while (event := conn.recv()).type != "response.completed":
            assert event.type != "error", event
        assert event.response.output_text.startswith("You asked: «Weather in Lyon?».")


async def test_references_in_append_mode(server: Any) -> None:
    client = openai_client(server)
    _, asked, _ = _first_turn(client, "Weather in Lyon?")
    async with connect(server.url) as conn:
        # A create whose input is a reference, then an append carrying one.
        await conn.create(
            model="sim",
            input=[{"type": "item_reference", "id": asked.id}],
            tools=[TOOL],
            metadata={"sim_tool_calls": "1"},
        )
        events = await conn.until_done()
        done = events[-1]
        assert isinstance(done, ResponseDone), done
        assert done.response.status == "requires_action"
        (pending,) = [item for item in done.response.output if isinstance(item, FunctionCall)]
        await conn.append(
            [
                {"type": "function_call_output", "call_id": pending.call_id, "output": "rain"},
                {"id": asked.id},
            ]
        )
        events = await conn.until_done()
        done = events[-1]
        assert isinstance(done, ResponseDone), done
        # The referenced message is a new question: the model calls again.
        (again,) = [item for item in done.response.output if isinstance(item, FunctionCall)][1:]
        await conn.append(
            [{"type": "function_call_output", "call_id": again.call_id, "output": "snow"}]
        )
        events = await conn.until_done()
    done = events[-1]
    assert isinstance(done, ResponseDone), done
    assert done.response.status == "completed"
    last = done.response.output[-1]
    assert isinstance(last, Message)
    text = item_text(last.content)
    assert text.startswith("You asked: «Weather in Lyon?» | «Weather in Lyon?». I read 2"), text
    assert f"[{pending.call_id}] «rain» [{again.call_id}] «snow»" in text


def test_another_keys_item_and_an_unknown_id_are_refused(make_server: Any) -> None:
    keyed = make_server(api_keys=("key-one", "key-two"))
    one, two = openai_client(keyed, "key-one"), openai_client(keyed, "key-two")
    _, asked, call = _first_turn(one, "private question")
    mine = [{"type": "item_reference", "id": asked.id}]
    assert "«private question»" in one.responses.create(model="sim", input=mine).output_text
    for refs in (
        [{"type": "item_reference", "id": asked.id}],
        [{"id": call.id}],
        [{"type": "item_reference", "id": "msg_never_made"}],
    ):
        sent = [{"role": "user", "content": "hello"}, *refs]
        with pytest.raises(openai.BadRequestError) as refused:
            two.responses.create(model="sim", input=sent, tools=[TOOL])
        assert refused.value.status_code == 400
        assert (refused.value.code, refused.value.param) == ("invalid_value", "input[1].id")
        assert refs[0]["id"] in refused.value.message
        # Counting the input tokens refuses it alike.
        reply = post(
            keyed,
            {"model": "sim", "input": sent},
            path="/v1/responses/input_tokens",
            key="key-two",
        )
        assert_refused(reply, "invalid_value", "input[1].id")
    # Over the WebSocket too.
    with two.responses.connect() as conn:
        conn.response.create(model="sim", input=[*mine])
        event = conn.recv()
        assert event.type == "error"
        assert (event.error.code, event.error.param) == ("invalid_value", "input[0].id")
    # A deleted response's items are gone with it.
    first = one.responses.create(model="sim", input="short-lived")
    (gone,) = one.responses.input_items.list(first.id).data
    one.responses.delete(first.id)
    with pytest.raises(openai.BadRequestError) as refused:
        one.responses.create(model="sim", input=[{"id": gone.id}])
    assert (refused.value.code, refused.value.param) == ("invalid_value", "input[0].id")
