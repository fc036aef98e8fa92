"""Conversations (``conv_...``): items kept under one id, that responses read and extend.

The Conversations API keeps a conversation's metadata and items in the store
(:class:`~longresponse.storage.records.StoredConversation`), owned by the API
key that made it: another key finds nothing (404, as for a response). A
response created with ``conversation`` (an id or ``{"id": ...}``) reads the
conversation's items before its own input, and once it completes its input
and output items are appended (:meth:`Conversations.append`).

Every change reads the conversation, changes it and writes it back whole,
under one lock of this process: two changes in this process never lose one
another. (Two processes changing one conversation at once on a shared store
may: the last write wins.)
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec

from protocol import ErrorCode, RemoteProtocolError
from protocol.events import ResponseCreate
from protocol.items import Item
from protocol.response import ConversationRef

from ..ids import new_id
from ..storage.persistence import Persistence, stored_input_items
from ..storage.records import ResponseStore, StoredConversation
from .continuation import Continuation

__all__ = [
    "MAX_CONVERSATION_ITEMS_PER_CALL",
    "MAX_METADATA_KEY",
    "MAX_METADATA_PAIRS",
    "MAX_METADATA_VALUE",
    "Conversations",
    "conversation_id_of",
    "decode_conversation_body",
    "item_not_found",
    "not_found",
]

#: Items one create (of a conversation, or of its items) may carry (as shipped).
MAX_CONVERSATION_ITEMS_PER_CALL: Final = 20
#: Metadata: at most 16 pairs, keys up to 64 characters, values up to 512.
MAX_METADATA_PAIRS: Final = 16
MAX_METADATA_KEY: Final = 64
MAX_METADATA_VALUE: Final = 512


class _Body(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    items: list[Item] | None = None
    metadata: dict[str, str] | None = None


def decode_conversation_body(raw: bytes | bytearray) -> tuple[list[Item], dict[str, str] | None]:
    """The ``items`` and ``metadata`` of a conversation (or items) create or update
    body; an item without ``type`` but with ``role`` is a message.

    Raises :class:`RemoteProtocolError` (``invalid_json``, ``invalid_value``,
    ``array_above_max_length`` past :data:`MAX_CONVERSATION_ITEMS_PER_CALL`).
    """
    try:
        data: Any = msgspec.json.decode(raw) if raw else {}
    except msgspec.DecodeError as exc:
        raise RemoteProtocolError(
            "We could not parse the JSON body of your request.", code=ErrorCode.INVALID_JSON
        ) from exc
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        for item in data["items"]:
            if isinstance(item, dict) and "type" not in item and "role" in item:
                item["type"] = "message"
    try:
        body = msgspec.convert(data, _Body)
    except msgspec.ValidationError as exc:
        raise _invalid_body(exc) from exc
    items = body.items or []
    if len(items) > MAX_CONVERSATION_ITEMS_PER_CALL:
        raise RemoteProtocolError(
            f"Invalid 'items': array too long. Expected an array with maximum length "
            f"{MAX_CONVERSATION_ITEMS_PER_CALL}, but got an array with length {len(items)} "
            "instead.",
            code="array_above_max_length",
            param="items",
        )
    if body.metadata is not None:
        _check_metadata(body.metadata)
    return items, body.metadata


def _invalid_body(exc: msgspec.ValidationError) -> RemoteProtocolError:
    """``unknown_parameter`` for an unknown key, else ``invalid_value``; the
    param is the path msgspec names (``items[0].role``)."""
    found = _AT.search(str(exc))
    path = found["path"] if found else ""
    unknown = _UNKNOWN.match(str(exc))
    if unknown:
        name = f"{path}.{unknown['name']}" if path else unknown["name"]
        return RemoteProtocolError(
            f"Unknown parameter: '{name}'.", code=ErrorCode.UNKNOWN_PARAMETER, param=name
        )
    return RemoteProtocolError(
        f"Invalid request body: {exc}", code=ErrorCode.INVALID_VALUE, param=path or None
    )


_AT: Final = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_UNKNOWN: Final = re.compile(r"Object contains unknown field `(?P<name>[^`]+)`")


def _check_metadata(metadata: dict[str, str]) -> None:
    if len(metadata) > MAX_METADATA_PAIRS:
        raise RemoteProtocolError(
            f"Invalid 'metadata': too many properties. Expected an object with at most "
            f"{MAX_METADATA_PAIRS} properties, but got {len(metadata)} instead.",
            code="object_above_max_properties",
            param="metadata",
        )
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise RemoteProtocolError(
                f"Invalid 'metadata.{RemoteProtocolError.clip(key)}': keys are at most "
                f"{MAX_METADATA_KEY} characters and values at most {MAX_METADATA_VALUE}.",
                code=ErrorCode.INVALID_VALUE,
                param="metadata",
            )


def conversation_id_of(ref: str | ConversationRef | None) -> str | None:
    """The id a create's ``conversation`` names (the bare id or ``{"id": ...}``)."""
    return ref.id if isinstance(ref, ConversationRef) else ref


def not_found(conversation_id: str, *, param: str = "conversation_id") -> RemoteProtocolError:
    return RemoteProtocolError(
        f"Conversation with id '{RemoteProtocolError.clip(conversation_id)}' not found.",
        code="conversation_not_found",
        param=param,
        status=404,
    )


class Conversations:
    """The conversations of every key, in the store of the server's persistence."""

    def __init__(self, persistence: Callable[[], Persistence | None]) -> None:
        self._persistence = persistence
        self._lock = asyncio.Lock()

    def _store(self) -> ResponseStore:
        persistence = self._persistence()
        if persistence is None:
            raise RemoteProtocolError(
                "Conversations need a store, and this server has none.",
                code="store_unavailable",
                status=503,
                error_type="server_error",
            )
        return persistence.store

    async def continuation(self, request: ResponseCreate, owner: str) -> Continuation | None:
        """Where a create with ``conversation`` continues from: the conversation's
        items, oldest first, before its input (its turns share the affinity key
        of the conversation's id); ``None`` without ``conversation``.

        Raises :class:`RemoteProtocolError`: ``mutually_exclusive_parameters``
        (400, param ``conversation``) with ``previous_response_id`` too;
        ``conversation_not_found`` (404, param ``conversation``) for an id the
        key has no conversation of.
        """
        conversation_id = conversation_id_of(request.conversation)
        if conversation_id is None:
            return None
        if request.previous_response_id is not None:
            raise RemoteProtocolError(
                "Mutually exclusive parameters: Ensure you are only providing one of: "
                "'previous_response_id' or 'conversation'.",
                code="mutually_exclusive_parameters",
                param="conversation",
            )
        record = await self.get(conversation_id, owner, param="conversation")
        history = record.items
        # Every turn of the conversation keeps one affinity key: its id's.
        return Continuation(
            history=history, checked=history, cached=False, hydrated=True, chain=record.id
        )

    async def create(
        self, owner: str, items: Sequence[Item], metadata: dict[str, str] | None
    ) -> StoredConversation:
        """A new conversation holding ``items`` (ids assigned), written when this returns.

        Raises the store's :class:`StoreError` (then it may or may not exist).
        """
        record = StoredConversation(
            id=new_id("conv"),
            owner=owner,
            created_at=int(time.time()),
            metadata=metadata or {},
            items=stored_input_items(items),
        )
        await self._store().put_conversation(record)
        return record

    async def get(
        self, conversation_id: str, owner: str, *, param: str = "conversation_id"
    ) -> StoredConversation:
        """``owner``'s conversation; raises :class:`RemoteProtocolError` 404 (at
        ``param``) if there is none (or it is another key's)."""
        record = await self._store().get_conversation(conversation_id, owner=owner)
        if record is None:
            raise not_found(conversation_id, param=param)
        return record

    async def update(
        self, conversation_id: str, owner: str, metadata: dict[str, str] | None
    ) -> StoredConversation:
        """Replace the metadata (``None`` keeps it); raises as :meth:`get`."""
        async with self._lock:
            record = await self.get(conversation_id, owner)
            if metadata is not None:
                record = msgspec.structs.replace(record, metadata=metadata)
                await self._store().put_conversation(record)
        return record

    async def delete(self, conversation_id: str, owner: str) -> None:
        """Delete the conversation; raises :class:`RemoteProtocolError` 404 if
        ``owner`` has none of that id."""
        async with self._lock:
            if not await self._store().delete_conversation(conversation_id, owner=owner):
                raise not_found(conversation_id)

    async def append(
        self,
        conversation_id: str,
        owner: str,
        items: Sequence[Item],
        *,
        param: str = "conversation_id",
    ) -> list[Item]:
        """Append ``items`` (ids assigned to those without) and return them as
        stored; raises as :meth:`get` (nothing appended then)."""
        added = stored_input_items(items)
        async with self._lock:
            record = await self.get(conversation_id, owner, param=param)
            changed = msgspec.structs.replace(record, items=[*record.items, *added])
            await self._store().put_conversation(changed)
        return added

    async def delete_item(
        self, conversation_id: str, owner: str, item_id: str
    ) -> StoredConversation:
        """Remove the item ``item_id``; raises :class:`RemoteProtocolError` 404 if
        the conversation or the item is not found (nothing changed then)."""
        async with self._lock:
            record = await self.get(conversation_id, owner)
            kept = [item for item in record.items if getattr(item, "id", None) != item_id]
            if len(kept) == len(record.items):
                raise item_not_found(item_id)
            record = msgspec.structs.replace(record, items=kept)
            await self._store().put_conversation(record)
        return record


def item_not_found(item_id: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"Item with id '{RemoteProtocolError.clip(item_id)}' not found.",
        code="item_not_found",
        param="item_id",
        status=404,
    )
