"""The Conversations API against a real server, with the official ``openai`` SDK.

Conversations are created, read, updated and deleted; their items added,
listed (paginated as ``client.conversations.items.list`` reads it), read and
deleted; each owned by the API key that made it, in every store.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

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
