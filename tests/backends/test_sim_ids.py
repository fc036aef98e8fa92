"""Call ids and item ids are unique per response, though the simulated model is
deterministic: two independent conversations asking the same question get the
same calls and arguments under ids of their own, and the same usage."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.conftest import openai_client


def _tool(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }


TOOLS = [_tool("read_file"), _tool("list_dir"), _tool("grep")]
#: Three calls in one turn: ids within one response must differ too.
META = {"sim_tool_calls": "3", "sim_parallel_calls": "3"}
QUESTION = "Find the bug in app.py"
CALL_ID = re.compile(r"call_\d{24}")


def _calls(response: Any) -> list[Any]:
    return [item for item in response.output if item.type == "function_call"]


def _answer(client: Any, response: Any) -> Any:
    outputs = [
        {"type": "function_call_output", "call_id": call.call_id, "output": f"{call.name} ok"}
        for call in _calls(response)
    ]
    return client.responses.create(
        model="sim", previous_response_id=response.id, input=outputs, tools=TOOLS, metadata=META
    )


def test_two_conversations_with_the_same_question_get_ids_of_their_own(server: Any) -> None:
    client = openai_client(server)
    first, second = (
        client.responses.create(model="sim", input=QUESTION, tools=TOOLS, metadata=META)
        for _ in range(2)
    )
    calls = [_calls(first), _calls(second)]
    # The model is deterministic in what it calls and with what arguments...
    assert [(c.name, json.loads(c.arguments)) for c in calls[0]] == [
        (c.name, json.loads(c.arguments)) for c in calls[1]
    ]
    assert [c.name for c in calls[0]] == ["read_file", "list_dir", "grep"]
    # ...but every call id and item id is its own, within a response and across them.
    call_ids = [c.call_id for turn in calls for c in turn]
    item_ids = [c.id for turn in calls for c in turn]
    assert len(set(call_ids)) == len(call_ids) == 6, call_ids
    assert len(set(item_ids)) == len(item_ids) == 6, item_ids
    assert all(CALL_ID.fullmatch(call_id) for call_id in call_ids), call_ids
    # The answers quote their own call ids and otherwise say the same, at the same cost.
    done = [_answer(client, first), _answer(client, second)]
    for response, turn in zip(done, calls, strict=True):
        assert not _calls(response)
        for call in turn:
            assert f"[{call.call_id}] «{call.name} ok»" in response.output_text
    texts = [CALL_ID.sub("call_X", response.output_text) for response in done]
    assert texts[0] == texts[1]
    assert done[0].output[0].id != done[1].output[0].id
    assert done[0].usage.to_dict() == done[1].usage.to_dict()


def test_streamed_and_websocket_responses_name_their_items_apart(server: Any) -> None:
    client = openai_client(server)
    added: list[list[Any]] = []
    with client.responses.stream(model="sim", input=QUESTION, tools=TOOLS, metadata=META) as s:
        added.append([e.item for e in s if e.type == "response.output_item.added"])
    with client.responses.connect() as conn:
        conn.response.create(
            model="sim", input=QUESTION, tools=TOOLS, metadata=META, store=False
        )
        items = []
        for event in conn:
            if event.type == "response.output_item.added":
                items.append(event.item)
            if event.type in ("response.completed", "response.failed", "response.incomplete"):
                break
        added.append(items)
    assert [len(items) for items in added] == [3, 3]
    call_ids = {item.call_id for items in added for item in items}
    item_ids = {item.id for items in added for item in items}
    assert len(call_ids) == len(item_ids) == 6
