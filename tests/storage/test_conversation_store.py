"""The conversation part of the store contract, on every backend (memory, SQLite, Redis).

A conversation is one record owned by a key: it round-trips whole, another
owner neither reads nor deletes it, a write replaces it, and SQLite and Redis
share it between separate store instances (as between processes).
"""

from __future__ import annotations

import contextlib
import uuid

from longresponse.storage.backends import StoredConversation
from protocol.items import FunctionCall, InputText, Message, OutputText
from tests.storage.test_store import Backend, on_asyncio
from tests.storage.test_store import backend as backend  # the fixtures, on every backend
from tests.storage.test_store import shared_backend as shared_backend


def make_conversation(owner: str = "alice", *, note: str = "first") -> StoredConversation:
    return StoredConversation(
        id=f"conv_{uuid.uuid4().hex}",
        owner=owner,
        created_at=1_700_000_000,
        metadata={"topic": note},
        items=[
            Message(id="msg_1", role="user", content=[InputText(text="Hi")], status="completed"),
            FunctionCall(id="fc_1", call_id="call_1", name="f", arguments="{}", status="completed"),
            Message(
                id="msg_2", role="assistant", content=[OutputText(text="Hello")], status="completed"
            ),
        ],
    )


@on_asyncio
async def test_conversation_round_trip_and_replace(backend: Backend) -> None:
    record = make_conversation()
    async with contextlib.aclosing(backend.open()) as store:
        assert await store.get_conversation(record.id, owner="alice") is None
        await store.put_conversation(record)
        assert await store.get_conversation(record.id, owner="alice") == record
        changed = make_conversation(note="second")
        changed = StoredConversation(
            id=record.id,
            owner="alice",
            created_at=record.created_at,
            metadata=changed.metadata,
            items=record.items[:1],
        )
        await store.put_conversation(changed)
        assert await store.get_conversation(record.id, owner="alice") == changed


@on_asyncio
async def test_conversation_of_another_owner_is_not_found(backend: Backend) -> None:
    record = make_conversation()
    async with contextlib.aclosing(backend.open()) as store:
        await store.put_conversation(record)
        assert await store.get_conversation(record.id, owner="mallory") is None
        assert await store.delete_conversation(record.id, owner="mallory") is False
        assert await store.get_conversation(record.id, owner="alice") == record
        assert await store.delete_conversation(record.id, owner="alice") is True
        assert await store.get_conversation(record.id, owner="alice") is None
        assert await store.delete_conversation(record.id, owner="alice") is False


@on_asyncio
async def test_conversation_shared_between_stores(shared_backend: Backend) -> None:
    record = make_conversation()
    async with (
        contextlib.aclosing(shared_backend.open()) as one,
        contextlib.aclosing(shared_backend.open()) as two,
    ):
        await one.put_conversation(record)
        assert await two.get_conversation(record.id, owner="alice") == record
        assert await two.delete_conversation(record.id, owner="alice") is True
        assert await one.get_conversation(record.id, owner="alice") is None


@on_asyncio
async def test_conversations_found_by_their_items_per_owner(backend: Backend) -> None:
    record = make_conversation()
    other = StoredConversation(
        id=f"conv_{uuid.uuid4().hex}", owner="alice", created_at=1, items=record.items[2:]
    )
    async with contextlib.aclosing(backend.open()) as store:
        await store.put_conversation(record)
        (found,) = await store.conversations_holding(["msg_1", "fc_1"], owner="alice")
        assert found == record
        assert await store.conversations_holding(["msg_1"], owner="mallory") == []
        assert await store.conversations_holding(["msg_never"], owner="alice") == []
        # The conversation written last that held the id answers for it.
        await store.put_conversation(other)
        assert await store.conversations_holding(["msg_2"], owner="alice") == [other]
        # A deleted conversation holds nothing any more.
        await store.delete_conversation(record.id, owner="alice")
        assert await store.conversations_holding(["msg_1", "fc_1"], owner="alice") == []
