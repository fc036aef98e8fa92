"""The Conversations API against a real server, with the official ``openai`` SDK.

Conversations are created, read, updated and deleted; their items added,
listed (paginated as ``client.conversations.items.list`` reads it), read and
deleted; each owned by the API key that made it, in every store.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from longresponse.client import connect
from protocol.events import ErrorEvent
from tests.support.http_clients import openai_client


def _texts(items: Any) -> list[str]:
    return [item.content[0].text for item in items]


@pytest.mark.parametrize(
    "store", ["sqlite", "memory", pytest.param("redis", marks=pytest.mark.services)]
)
def test_conversation_lifecycle_in_every_store(
    make_server: Any, store: str, request: pytest.FixtureRequest
) -> None:
    overrides = {"memory": {"store": "memory://"}, "sqlite": {}}.get(store)
    if overrides is None:
        overrides = {"store": request.getfixturevalue("redis_url")}
    client = openai_client(make_server(**overrides))
    conv = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "Hello"}],
        metadata={"topic": "greetings"},
    )
    assert conv.id.startswith("conv_")
    assert conv.object == "conversation"
    assert conv.metadata == {"topic": "greetings"}
    assert conv.created_at > 0
    again = client.conversations.retrieve(conv.id)
    assert (again.id, again.created_at, again.metadata) == (conv.id, conv.created_at, conv.metadata)
    updated = client.conversations.update(conv.id, metadata={"topic": "farewells"})
    assert updated.metadata == {"topic": "farewells"}
    assert client.conversations.retrieve(conv.id).metadata == {"topic": "farewells"}
    (item,) = client.conversations.items.list(conv.id).data
    assert item.type == "message"
    assert item.role == "user"
    assert item.id.startswith("msg_")
    assert _texts([item]) == ["Hello"]
    deleted = client.conversations.delete(conv.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (conv.id, "conversation.deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.delete(conv.id)


def test_another_key_gets_404(make_server: Any) -> None:
    keyed = make_server(api_keys=("key-one", "key-two"))
    one, two = openai_client(keyed, "key-one"), openai_client(keyed, "key-two")
    conv = one.conversations.create(items=[{"role": "user", "content": "secret"}])
    (item,) = one.conversations.items.list(conv.id).data
    for attempt in (
        lambda: two.conversations.retrieve(conv.id),
        lambda: two.conversations.update(conv.id, metadata={"x": "y"}),
        lambda: two.conversations.delete(conv.id),
        lambda: two.conversations.items.list(conv.id),
        lambda: two.conversations.items.create(conv.id, items=[{"role": "user", "content": "x"}]),
        lambda: two.conversations.items.retrieve(item.id, conversation_id=conv.id),
        lambda: two.conversations.items.delete(item.id, conversation_id=conv.id),
    ):
        with pytest.raises(openai.NotFoundError) as refused:
            attempt()
        assert refused.value.status_code == 404
        assert conv.id in refused.value.message
    # Untouched by all of that.
    assert one.conversations.retrieve(conv.id).metadata == {}
    assert _texts(one.conversations.items.list(conv.id).data) == ["secret"]


def test_create_limits(server: Any) -> None:
    client = openai_client(server)
    many = [{"role": "user", "content": f"m{i}"} for i in range(21)]
    with pytest.raises(openai.BadRequestError) as refused:
        client.conversations.create(items=many)
    assert (refused.value.code, refused.value.param) == ("array_above_max_length", "items")
    conv = client.conversations.create(items=many[:20])
    with pytest.raises(openai.BadRequestError) as refused:
        client.conversations.items.create(conv.id, items=many)
    assert (refused.value.code, refused.value.param) == ("array_above_max_length", "items")
    with pytest.raises(openai.BadRequestError) as refused:
        client.conversations.update(conv.id, metadata={f"k{i}": "v" for i in range(17)})
    assert refused.value.param == "metadata"
    assert len(client.conversations.items.list(conv.id, limit=100).data) == 20
    # A key the API does not have, and a bad item, name where they are.
    with pytest.raises(openai.BadRequestError) as refused:
        client.conversations.create(extra_body={"colour": "blue"})
    assert (refused.value.code, refused.value.param) == ("unknown_parameter", "colour")
    with pytest.raises(openai.BadRequestError) as refused:
        client.conversations.create(items=[{"role": "nobody", "content": "x"}])
    assert (refused.value.code, refused.value.param) == ("invalid_value", "items[0].role")


def test_items_add_list_page_retrieve_delete(server: Any) -> None:
    client = openai_client(server)
    conv = client.conversations.create()
    assert client.conversations.items.list(conv.id).data == []
    added = client.conversations.items.create(
        conv.id,
        items=[{"type": "message", "role": "user", "content": f"m{i}"} for i in range(5)],
    )
    assert added.object == "list"
    assert _texts(added.data) == [f"m{i}" for i in range(5)]
    assert (added.first_id, added.last_id) == (added.data[0].id, added.data[-1].id)
    more = client.conversations.items.create(
        conv.id,
        items=[
            {"role": "user", "content": [{"type": "input_text", "text": "m5"}]},
            {"role": "assistant", "type": "message", "content": "m6"},
        ],
    )
    assert _texts(more.data) == ["m5", "m6"]
    # Newest first by default; oldest first with order=asc.
    assert _texts(client.conversations.items.list(conv.id).data) == [
        f"m{i}" for i in range(6, -1, -1)
    ]
    # The SDK walks the pages by `after` = the last id while `has_more`.
    first = client.conversations.items.list(conv.id, limit=3, order="asc")
    assert _texts(first.data) == ["m0", "m1", "m2"]
    assert first.has_more
    assert first.last_id == first.data[-1].id
    walked = list(client.conversations.items.list(conv.id, limit=3, order="asc"))
    assert _texts(walked) == [f"m{i}" for i in range(7)]
    backwards = list(client.conversations.items.list(conv.id, limit=2))
    assert _texts(backwards) == [f"m{i}" for i in range(6, -1, -1)]
    last = client.conversations.items.list(conv.id, limit=3, order="asc", after=walked[3].id)
    assert _texts(last.data) == ["m4", "m5", "m6"]
    assert not last.has_more
    # One item by id; then deleted (the conversation comes back), and gone.
    third = walked[2]
    fetched = client.conversations.items.retrieve(third.id, conversation_id=conv.id)
    assert (fetched.id, _texts([fetched])) == (third.id, ["m2"])
    after_delete = client.conversations.items.delete(third.id, conversation_id=conv.id)
    assert after_delete.id == conv.id
    assert after_delete.object == "conversation"
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(third.id, conversation_id=conv.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.delete(third.id, conversation_id=conv.id)
    remaining = list(client.conversations.items.list(conv.id, order="asc"))
    assert _texts(remaining) == ["m0", "m1", "m3", "m4", "m5", "m6"]
    with pytest.raises(openai.BadRequestError) as refused:
        client.conversations.items.list(conv.id, after="msg_never_made")
    assert refused.value.param == "after"


# --- `conversation` on a response -------------------------------------------


def test_two_turns_in_a_conversation_see_each_other(server: Any) -> None:
    """The simulated model quotes every user message it reads: the second turn
    quotes the first's, and the conversation holds both turns' items."""
    client = openai_client(server)
    conv = client.conversations.create(items=[{"role": "user", "content": "My name is Ada."}])
    first = client.responses.create(model="sim", input="First question?", conversation=conv.id)
    assert first.conversation is not None
    assert first.conversation.id == conv.id
    assert "«My name is Ada.»" in first.output_text
    assert "«First question?»" in first.output_text
    second = client.responses.create(
        model="sim", input="Second question?", conversation={"id": conv.id}, store=False
    )
    for quoted in ("«My name is Ada.»", "«First question?»", "«Second question?»"):
        assert quoted in second.output_text
    items = list(client.conversations.items.list(conv.id, order="asc"))
    assert [(item.type, item.role) for item in items] == [
        ("message", "user"),
        ("message", "user"),
        ("message", "assistant"),
        ("message", "user"),
        ("message", "assistant"),
    ]
    assert _texts(items)[:2] == ["My name is Ada.", "First question?"]
    assert items[2].id == first.output[-1].id
    assert _texts(items[2:3]) == [first.output_text]
    assert _texts(items[4:]) == [second.output_text]
    # The stored response's input item is the conversation's (one id for both).
    (asked,) = client.responses.input_items.list(first.id).data
    assert asked.id == items[1].id
    # Counting the input tokens reads the conversation as a create would.
    bare = client.responses.input_tokens.count(model="sim", input="Next?")
    counted = client.responses.input_tokens.count(model="sim", input="Next?", conversation=conv.id)
    assert counted.input_tokens > bare.input_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.input_tokens.count(model="sim", input="x", conversation="conv_never_made")
    # Streamed (SSE) alike: the third turn reads the second's answer too.
    with client.responses.stream(
        model="sim", input="Third question?", conversation=conv.id
    ) as stream:
        third = stream.get_final_response()
    assert "«Second question?»" in third.output_text
    assert len(list(client.conversations.items.list(conv.id))) == 7


def test_a_tool_loop_in_a_conversation(server: Any) -> None:
    """A call's output, sent with only the conversation, answers the call the
    conversation holds (the simulated model quotes the output)."""
    client = openai_client(server)
    conv = client.conversations.create()
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    asked = client.responses.create(
        model="sim", input="Weather in Lyon?", tools=[tool], conversation=conv.id
    )
    (call,) = [item for item in asked.output if item.type == "function_call"]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    answer = client.responses.create(
        model="sim", input=[output], tools=[tool], conversation=conv.id
    )
    assert f"[{call.call_id}] «sunny»" in answer.output_text
    kinds = [item.type for item in client.conversations.items.list(conv.id, order="asc")]
    assert kinds == ["message", "function_call", "function_call_output", "message"]


def test_a_background_response_in_a_conversation(server: Any) -> None:
    """A background create reads the conversation too, and its items are in the
    conversation by the time its terminal event is sent."""
    client = openai_client(server)
    conv = client.conversations.create(items=[{"role": "user", "content": "Earlier words."}])
    made = client.responses.create(
        model="sim", input="In the background?", conversation=conv.id, background=True
    )
    *_, final = client.responses.retrieve(made.id, stream=True)
    assert final.type == "response.completed"
    assert "«Earlier words.»" in final.response.output_text
    items = list(client.conversations.items.list(conv.id, order="asc"))
    assert _texts(items) == ["Earlier words.", "In the background?", final.response.output_text]


def test_conversation_refusals(make_server: Any) -> None:
    keyed = make_server(api_keys=("key-one", "key-two"))
    one, two = openai_client(keyed, "key-one"), openai_client(keyed, "key-two")
    conv = one.conversations.create()
    first = one.responses.create(model="sim", input="hello")
    # With previous_response_id in the same request: refused, nothing appended.
    with pytest.raises(openai.BadRequestError) as refused:
        one.responses.create(
            model="sim", input="again", conversation=conv.id, previous_response_id=first.id
        )
    assert refused.value.code == "mutually_exclusive_parameters"
    assert refused.value.param == "conversation"
    # An id never made, and another key's conversation: 404, never ignored.
    for client, conversation in ((one, "conv_never_made"), (two, conv.id)):
        with pytest.raises(openai.NotFoundError) as missing:
            client.responses.create(model="sim", input="hi", conversation=conversation)
        assert missing.value.status_code == 404
        assert (missing.value.code, missing.value.param) == (
            "conversation_not_found",
            "conversation",
        )
        assert conversation in missing.value.message
    assert one.conversations.items.list(conv.id).data == []


def test_a_conversations_items_are_item_reference_targets(make_server: Any) -> None:
    """An item added to a conversation can be named by ``item_reference`` (or
    the bare ``{"id": ...}``) by the key that owns it, and by no other."""
    keyed = make_server(api_keys=("key-one", "key-two"))
    one, two = openai_client(keyed, "key-one"), openai_client(keyed, "key-two")
    conv = one.conversations.create(items=[{"role": "user", "content": "Kept in a conversation."}])
    (item,) = one.conversations.items.list(conv.id).data
    for ref in ({"type": "item_reference", "id": item.id}, {"id": item.id}):
        # store=False: a stored response would hold the item too.
        answer = one.responses.create(model="sim", input=[ref], store=False)
        assert "«Kept in a conversation.»" in answer.output_text
        with pytest.raises(openai.BadRequestError) as refused:
            two.responses.create(model="sim", input=[ref])
        assert (refused.value.code, refused.value.param) == ("invalid_value", "input[0].id")
    one.conversations.items.delete(item.id, conversation_id=conv.id)
    with pytest.raises(openai.BadRequestError) as refused:
        one.responses.create(model="sim", input=[{"id": item.id}])
    assert (refused.value.code, refused.value.param) == ("invalid_value", "input[0].id")


def test_conversation_over_the_websocket(make_server: Any) -> None:
    """The shipped WebSocket reads and extends a conversation as HTTP does, and
    answers its refusals as error events."""
    keyed = make_server(api_keys=("key-one", "key-two"))
    one, two = openai_client(keyed, "key-one"), openai_client(keyed, "key-two")
    conv = one.conversations.create(items=[{"role": "user", "content": "Remember: blue."}])
    over_http = one.responses.create(model="sim", input="Over HTTP?", conversation=conv.id)
    with one.responses.connect() as conn:
        conn.response.create(model="sim", input="Over the socket?", conversation=conv.id)
        while (event := conn.recv()).type != "response.completed":
            assert event.type != "error", event
        answer = event.response
        assert answer.conversation is not None
        assert answer.conversation.id == conv.id
        for quoted in ("«Remember: blue.»", "«Over HTTP?»", "«Over the socket?»"):
            assert quoted in answer.output_text
        conn.response.create(
            model="sim", input="x", conversation=conv.id, previous_response_id=over_http.id
        )
        refused = conn.recv()
        assert refused.type == "error"
        assert (refused.error.code, refused.error.param) == (
            "mutually_exclusive_parameters",
            "conversation",
        )
    # The socket's turn was appended; the next HTTP turn reads it.
    items = list(one.conversations.items.list(conv.id, order="asc"))
    assert _texts(items)[3:] == ["Over the socket?", answer.output_text]
    with two.responses.connect() as conn:
        conn.response.create(model="sim", input="peek", conversation=conv.id)
        refused = conn.recv()
        assert refused.type == "error"
        assert (refused.error.code, refused.error.param) == (
            "conversation_not_found",
            "conversation",
        )
        assert refused.status == 404


async def test_conversation_is_refused_in_append_mode(server: Any) -> None:
    """Append mode runs one long Response with no turns to append to a
    conversation: ``conversation`` is refused there, never ignored."""
    conv = openai_client(server).conversations.create()
    async with connect(server.url) as conn:
        await conn.create(model="sim", input="hi", conversation=conv.id)
        event = await conn.next_event()
    assert isinstance(event, ErrorEvent), event
    assert (event.error.code, event.error.param) == ("invalid_value", "conversation")
