"""MemoryStore: records in a dict of this process (``memory://``); nothing survives a restart.

Checkpoints of append-mode rollouts are a dict of this process too, keyed by
owner and response id, each with its deadline and its list of item blobs
(appended to in place).

Leases of background responses are a dict beside the records, measured on
the ttl's clock: with one process on the store, one runs out only when a
test's fake clock says so.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Sequence

from .records import (
    CheckpointState,
    StoredConversation,
    StoredResponse,
    UsageRecord,
    check_checkpoint_args,
    check_ttl,
    conversation_item_ids,
    decode_conversation,
    decode_record,
    decode_usage,
    encode_record,
    held_item_ids,
    is_expired,
    is_running,
    keep_beyond_items,
    ledger_order,
    lets_go,
)

__all__ = ["MemoryStore"]


@dataclasses.dataclass
class _Checkpoint:
    """One checkpoint as the memory store holds it (changed only by MemoryStore)."""

    epoch: int
    deadline: float
    #: ``CheckpointState.state``, replaced by every write.
    state_blob: bytes
    items: list[bytes]


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
        #: (owner, response id) -> checkpoint of an append-mode rollout
        self._checkpoints: dict[tuple[str, str], _Checkpoint] = {}
        #: response id -> (holder, lease expiry on the clock) of a running background response
        self._leases: dict[str, tuple[str, float]] = {}

    async def put(self, record: StoredResponse) -> None:
        """Store ``record``; nothing changes if it cannot be encoded."""
        expires_at = None if self.ttl is None else self._clock() + self.ttl
        self._records[record.id] = (record.owner, expires_at, encode_record(record))
        for item_id in held_item_ids(record):
            self._items[record.owner, item_id] = record.id
        if lets_go(record):
            self._leases.pop(record.id, None)

    async def put_running(self, record: StoredResponse, *, holder: str, lease: float) -> None:
        """Store ``record`` and give ``holder`` its lease for ``lease`` seconds."""
        await self.put(record)
        self._leases[record.id] = (holder, self._clock() + lease)

    async def renew_leases(
        self, response_ids: Collection[str], *, holder: str, lease: float
    ) -> set[str]:
        """Extend ``holder``'s leases; the ids it no longer holds."""
        until = self._clock() + lease
        lost = set()
        for response_id in response_ids:
            held = self._leases.get(response_id)
            if held is None or held[0] != holder:
                lost.add(response_id)
            else:
                self._leases[response_id] = (holder, until)
        return lost

    async def take_expired(
        self, *, holder: str, lease: float, response_id: str | None = None
    ) -> list[StoredResponse]:
        """Take over the responses whose lease ran out (or only ``response_id``'s)."""
        now = self._clock()
        ids = list(self._leases) if response_id is None else [response_id]
        taken = []
        for candidate in ids:
            held = self._leases.get(candidate)
            if held is None or held[1] > now:
                continue
            blob = self._unexpired(candidate)
            record = None if blob is None else decode_record(blob)
            if record is None or not is_running(record):
                del self._leases[candidate]
                continue
            self._leases[candidate] = (holder, now + lease)
            taken.append(record)
        return taken

    async def put_held(self, record: StoredResponse, *, holder: str) -> bool:
        """Store ``record`` and drop its lease, only while ``holder`` holds it."""
        held = self._leases.get(record.id)
        if held is None or held[0] != holder:
            return False
        await self.put(record)
        self._leases.pop(record.id, None)
        return True

    async def get(self, response_id: str, *, owner: str) -> StoredResponse | None:
        """The record, or ``None`` if missing, expired (then dropped) or foreign."""
        blob = self._visible(response_id, owner)
        return None if blob is None else decode_record(blob)

    async def delete(self, response_id: str, *, owner: str) -> bool:
        """Delete the record; ``False`` (and nothing deleted) if not visible to ``owner``."""
        if self._visible(response_id, owner) is None:
            return False
        del self._records[response_id]
        self._leases.pop(response_id, None)
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
        """Drop every expired record and checkpoint (never a ledger entry); the number dropped."""
        now = self._clock()
        expired = [
            key for key, (_, expires_at, _) in self._records.items() if is_expired(expires_at, now)
        ]
        for key in expired:
            del self._records[key]
        if expired:  # the index entries and leases of records gone
            self._items = {key: held for key, held in self._items.items() if held in self._records}
        return len(expired) + self._purge_expired_checkpoints(now)

    # --- checkpoints (ResponseStore.checkpoint_*) -----------------------------

    async def checkpoint_open(
        self, response_id: str, *, owner: str, state: bytes, items: Sequence[bytes], ttl: float
    ) -> int:
        """A new checkpoint (replacing any of that id and owner, expired or not); its epoch."""
        check_checkpoint_args(ttl)
        replaced = self._checkpoints.get((owner, response_id))
        epoch = 1 if replaced is None else replaced.epoch + 1
        self._checkpoints[owner, response_id] = _Checkpoint(
            epoch=epoch, deadline=self._clock() + ttl, state_blob=bytes(state), items=list(items)
        )
        return epoch

    async def checkpoint_write(
        self,
        response_id: str,
        *,
        owner: str,
        epoch: int,
        state: bytes,
        keep: int,
        items: Sequence[bytes],
        ttl: float,
    ) -> bool:
        """Keep ``keep`` items, append ``items``, replace the state, if still ``epoch``."""
        check_checkpoint_args(ttl, keep)
        checkpoint = self._live_checkpoint(response_id, owner)
        if checkpoint is None or checkpoint.epoch != epoch:
            return False
        if keep > len(checkpoint.items):
            raise keep_beyond_items(keep, response_id)
        del checkpoint.items[keep:]
        checkpoint.items.extend(items)
        checkpoint.state_blob = bytes(state)
        checkpoint.deadline = self._clock() + ttl
        return True

    async def checkpoint_take(
        self, response_id: str, *, owner: str, ttl: float
    ) -> CheckpointState | None:
        """Bump the epoch and refresh the deadline; the checkpoint with its new epoch."""
        check_checkpoint_args(ttl)
        checkpoint = self._live_checkpoint(response_id, owner)
        if checkpoint is None:
            return None
        checkpoint.epoch += 1
        checkpoint.deadline = self._clock() + ttl
        return self._checkpoint_state(response_id, owner, checkpoint)

    async def checkpoint_read(self, response_id: str, *, owner: str) -> CheckpointState | None:
        """The checkpoint as it is (nothing bumped or refreshed)."""
        checkpoint = self._live_checkpoint(response_id, owner)
        if checkpoint is None:
            return None
        return self._checkpoint_state(response_id, owner, checkpoint)

    async def checkpoint_delete(
        self, response_id: str, *, owner: str, epoch: int | None = None
    ) -> bool:
        """Delete the checkpoint (only if still ``epoch``, when given)."""
        checkpoint = self._live_checkpoint(response_id, owner)
        if checkpoint is None or (epoch is not None and checkpoint.epoch != epoch):
            return False
        del self._checkpoints[owner, response_id]
        return True

    def _live_checkpoint(self, response_id: str, owner: str) -> _Checkpoint | None:
        """The checkpoint, or ``None`` if missing or expired (then dropped)."""
        checkpoint = self._checkpoints.get((owner, response_id))
        if checkpoint is not None and is_expired(checkpoint.deadline, self._clock()):
            del self._checkpoints[owner, response_id]
            return None
        return checkpoint

    @staticmethod
    def _checkpoint_state(response_id: str, owner: str, checkpoint: _Checkpoint) -> CheckpointState:
        return CheckpointState(
            response_id=response_id,
            owner=owner,
            epoch=checkpoint.epoch,
            state=checkpoint.state_blob,
            items=list(checkpoint.items),
        )

    def _purge_expired_checkpoints(self, now: float) -> int:
        expired = [k for k, c in self._checkpoints.items() if is_expired(c.deadline, now)]
        for key in expired:
            del self._checkpoints[key]
            self._leases = {key: held for key, held in self._leases.items() if key in self._records}
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
        self._checkpoints.clear()
        self._leases.clear()

    def _visible(self, response_id: str, owner: str) -> bytes | None:
        blob = self._unexpired(response_id)
        return blob if blob is not None and self._records[response_id][0] == owner else None

    def _unexpired(self, response_id: str) -> bytes | None:
        """The blob of ``response_id``, whoever owns it; ``None`` if missing or
        expired (then dropped)."""
        entry = self._records.get(response_id)
        if entry is None:
            return None
        _, expires_at, blob = entry
        if is_expired(expires_at, self._clock()):
            del self._records[response_id]
            return None
        return blob
