"""MemoryStore: records in a dict of this process (``memory://``); nothing survives a restart."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from .records import (
    StoredConversation,
    StoredResponse,
    UsageRecord,
    check_ttl,
    conversation_item_ids,
    decode_conversation,
    decode_record,
    decode_usage,
    encode_record,
    held_item_ids,
    is_expired,
    ledger_order,
)

__all__ = ["MemoryStore"]


class MemoryStore:
    """Records in a dict of this process (``memory://``); for tests and one-off runs.

    Unbounded when ``ttl`` is ``None``. ``clock`` (seconds, monotonic) measures
    the ttl; tests pass a fake one.
    """

    def __init__(
        self, *, ttl: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = check_ttl(ttl)
        self._clock = clock
        #: id -> (owner, expires_at or None, msgpack blob)
        self._records: dict[str, tuple[str, float | None, bytes]] = {}
        #: (owner, item id) -> the id of the record written last that holds it
        self._items: dict[tuple[str, str], str] = {}
        #: response_id -> msgpack UsageRecord (never expires)
        self._usage: dict[str, bytes] = {}
        #: conversation id -> (owner, msgpack StoredConversation)
        self._conversations: dict[str, tuple[str, bytes]] = {}
        #: (owner, item id) -> the id of the conversation written last that held it
        self._conversation_items: dict[tuple[str, str], str] = {}
        #: name -> server secret (this process only)
        self._secrets: dict[str, bytes] = {}

    async def put(self, record: StoredResponse) -> None:
        """Store ``record``; nothing changes if it cannot be encoded."""
        expires_at = None if self.ttl is None else self._clock() + self.ttl
        self._records[record.id] = (record.owner, expires_at, encode_record(record))
        for item_id in held_item_ids(record):
            self._items[record.owner, item_id] = record.id

    async def get(self, response_id: str, *, owner: str) -> StoredResponse | None:
        """The record, or ``None`` if missing, expired (then dropped) or foreign."""
        blob = self._visible(response_id, owner)
        return None if blob is None else decode_record(blob)

    async def delete(self, response_id: str, *, owner: str) -> bool:
        """Delete the record; ``False`` (and nothing deleted) if not visible to ``owner``."""
        if self._visible(response_id, owner) is None:
            return False
        del self._records[response_id]
        return True

    async def holding(self, item_ids: Collection[str], *, owner: str) -> list[StoredResponse]:
        """The visible records of ``owner`` written last holding these item ids."""
        found = {self._items.get((owner, item_id)) for item_id in item_ids}
        blobs = (self._visible(response_id, owner) for response_id in found if response_id)
        return [decode_record(blob) for blob in blobs if blob is not None]

    async def put_conversation(self, record: StoredConversation) -> None:
        """Store ``record``; nothing changes if it cannot be encoded."""
        self._conversations[record.id] = (record.owner, encode_record(record))
        for item_id in conversation_item_ids(record):
            self._conversation_items[record.owner, item_id] = record.id

    async def get_conversation(
        self, conversation_id: str, *, owner: str
    ) -> StoredConversation | None:
        """The conversation, or ``None`` if missing or foreign."""
        entry = self._conversations.get(conversation_id)
        if entry is None or entry[0] != owner:
            return None
        return decode_conversation(entry[1])

    async def delete_conversation(self, conversation_id: str, *, owner: str) -> bool:
        """Delete the conversation; ``False`` (and nothing deleted) if not ``owner``'s."""
        entry = self._conversations.get(conversation_id)
        if entry is None or entry[0] != owner:
            return False
        del self._conversations[conversation_id]
        return True

    async def conversations_holding(
        self, item_ids: Collection[str], *, owner: str
    ) -> list[StoredConversation]:
        """The conversations of ``owner`` written last holding these item ids."""
        found = {self._conversation_items.get((owner, item_id)) for item_id in item_ids}
        records = [await self.get_conversation(c, owner=owner) for c in found if c]
        return [record for record in records if record is not None]

    async def put_usage(self, record: UsageRecord) -> None:
        """Add ``record`` to the ledger, replacing its ``response_id``; unchanged if unencodable."""
        self._usage[record.response_id] = encode_record(record)

    async def usage(self, *, owner: str | None = None) -> list[UsageRecord]:
        """The ledger, or ``owner``'s part, by ``created_at`` then ``response_id``."""
        records = (decode_usage(blob) for blob in self._usage.values())
        return sorted(
            (record for record in records if owner is None or record.owner == owner),
            key=ledger_order,
        )

    async def purge_expired(self) -> int:
        """Drop every expired record (never a ledger entry); the number dropped."""
        now = self._clock()
        expired = [
            key for key, (_, expires_at, _) in self._records.items() if is_expired(expires_at, now)
        ]
        for key in expired:
            del self._records[key]
        if expired:  # the index entries of records gone
            self._items = {key: held for key, held in self._items.items() if held in self._records}
        return len(expired)

    async def ping(self) -> None:
        """A dict always answers."""

    async def secret(self, name: str, candidate: bytes) -> bytes:
        """The secret ``name`` of this process (a memory store is one process's)."""
        return self._secrets.setdefault(name, candidate)

    async def aclose(self) -> None:
        """Forget every record and the ledger."""
        self._records.clear()
        self._items.clear()
        self._usage.clear()
        self._conversations.clear()
        self._conversation_items.clear()

    def _visible(self, response_id: str, owner: str) -> bytes | None:
        entry = self._records.get(response_id)
        if entry is None:
            return None
        record_owner, expires_at, blob = entry
        if is_expired(expires_at, self._clock()):
            del self._records[response_id]
            return None
        return blob if record_owner == owner else None
