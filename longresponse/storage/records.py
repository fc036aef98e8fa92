"""What a store keeps, and the interface every backend implements.

A :class:`StoredResponse` is one finished Response plus what is needed to
rebuild its conversation: its own NEW input items and the id of the response
it continued. Every item it holds (input, output, context) with an id can be
found again by that id, per owner (:meth:`ResponseStore.holding`: an input
``item_reference``); when two records of one owner hold the same id, the
later written one answers. A :class:`UsageRecord` is one entry of the billing ledger.
A :class:`StoredConversation` is one conversation of the Conversations API
(its metadata and every item in it, in order); it never expires.
A :class:`CheckpointState` is the durable checkpoint of a paused append-mode
rollout (opaque blobs the serve layer encodes; kept per owner and response id,
fenced by an epoch, gone ``ttl`` seconds after it was last written or taken).
Every backend keeps both as msgpack blobs (one reused encoder, one reused
decoder per type), so what comes back is what went in, whichever backend holds
it; the helpers here are that codec. :class:`ResponseStore` is the interface;
``longresponse.storage.backends`` says which backends exist and how they keep
the ttl, the owner and the ledger.

A background response is stored before it runs (:meth:`ResponseStore.put_running`:
status ``queued`` or ``in_progress``), held by a *lease*: the server process
that runs it (its ``holder``) renews it (:meth:`ResponseStore.renew_leases`)
for as long as it runs, and storing its end (a :meth:`ResponseStore.put` of
the record with any other status) or deleting it lets go of it. A lease that
ran out names a response whose process stopped: any process may take it over
(:meth:`ResponseStore.take_expired`, atomic: one taker) and store its end
(:meth:`ResponseStore.put_held`, only while it still holds it). Every backend
measures a lease on the clock it measures the ttl on.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Sequence
from typing import Final, Protocol

import msgspec

from protocol.items import Item
from protocol.response import Response

__all__ = [
    "UNFINISHED",
    "CheckpointState",
    "ResponseStore",
    "StoreError",
    "StoredConversation",
    "StoredResponse",
    "UsageRecord",
    "check_checkpoint_args",
    "check_ttl",
    "conversation_item_ids",
    "decode_conversation",
    "decode_record",
    "decode_usage",
    "encode_record",
    "held_item_ids",
    "is_expired",
    "is_running",
    "keep_beyond_items",
    "ledger_order",
    "lets_go",
]

#: The statuses of a background response that has not ended (held by a lease).
UNFINISHED: Final = frozenset({"queued", "in_progress"})


class StoredResponse(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    owner: str
    created_at: float
    response: Response
    #: This response's own input items (ids assigned), not the whole history.
    input_items: list[Item]
    previous_response_id: str | None = None
    #: This response's items in the order the model saw them, when input
    #: arrived while it ran (a multi-agent response resumed by
    #: ``response.inject``): its input, calls, their outputs and its answer.
    #: ``None``: its input, then its output.
    context: list[Item] | None = None


class StoredConversation(msgspec.Struct, frozen=True, kw_only=True):
    """One conversation (``conv_...``): its metadata and its items, oldest first.

    Kept as one blob and replaced whole on every change (items added or
    deleted, metadata updated); it belongs to ``owner`` as a response does.
    """

    id: str
    owner: str
    #: Seconds since the epoch (the API's integer ``created_at``).
    created_at: int
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    #: Every item of the conversation, each with its id, oldest first.
    items: list[Item] = msgspec.field(default_factory=list)


class UsageRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of the billing ledger: what one finished response consumed.

    Keyed by ``response_id``: a later record for the same response replaces
    the earlier one. Never expires with the response (see the module docstring).
    """

    response_id: str
    owner: str
    model: str
    input_tokens: int
    #: Of ``input_tokens``, how many came from the prompt cache.
    cached_tokens: int
    output_tokens: int
    #: Seconds since the epoch; the ledger is ordered by it.
    created_at: float
    #: How the response was served: ``"append"``, ``"ws"`` or ``"http"`` (serve's Transport).
    transport: str


class CheckpointState(msgspec.Struct, frozen=True, kw_only=True):
    """The checkpoint of one append-mode rollout, as the store holds it.

    Keyed by ``(owner, response_id)``. ``epoch`` fences writers: every
    :meth:`ResponseStore.checkpoint_take` bumps it, and a write that names an
    older epoch is refused, so at most one process holds the rollout.
    """

    response_id: str
    owner: str
    #: Who holds the rollout: bumped by every take-over.
    epoch: int
    #: Opaque (the serve layer encodes it): small, rewritten on every write.
    state: bytes
    #: The rollout's context items, each an opaque blob, in order; appended to.
    items: list[bytes]


class ResponseStore(Protocol):
    async def put(self, record: StoredResponse) -> None:
        """Persist ``record`` (replacing one with the same id); a background
        response's end lets go of its lease (:func:`lets_go`)."""

    async def get(self, response_id: str, *, owner: str) -> StoredResponse | None:
        """The record, or ``None`` if missing, expired or owned by someone else."""

    async def delete(self, response_id: str, *, owner: str) -> bool:
        """Delete the record (and any lease on it); ``False`` if there was none
        visible to ``owner``."""

    async def holding(self, item_ids: Collection[str], *, owner: str) -> list[StoredResponse]:
        """The records of ``owner`` that hold items with these ids (each record
        once, in no order): for each id, the record written last that holds it,
        if it is still visible to ``owner`` (not deleted, not expired)."""

    async def put_running(self, record: StoredResponse, *, holder: str, lease: float) -> None:
        """Persist ``record``, a background response that has not ended (status
        ``queued`` or ``in_progress``), as :meth:`put` does, and give ``holder`` its
        lease for ``lease`` seconds from now (replacing any lease on it); one write."""

    async def renew_leases(
        self, response_ids: Collection[str], *, holder: str, lease: float
    ) -> set[str]:
        """Extend ``holder``'s leases on these responses to ``lease`` seconds from now
        (one that ran out and was not taken over is renewed too); the ids whose
        lease ``holder`` no longer holds (taken over, or the response ended or gone)."""

    async def take_expired(
        self, *, holder: str, lease: float, response_id: str | None = None
    ) -> list[StoredResponse]:
        """Take over every background response whose lease ran out (or only
        ``response_id``'s), whoever owns it: ``holder`` holds each for ``lease``
        seconds from now, and no other taker gets it. Their records, as last
        stored, not yet ended; a lease on a record that ended, expired or was
        deleted is dropped."""

    async def put_held(self, record: StoredResponse, *, holder: str) -> bool:
        """Persist ``record`` (the end of a response ``holder`` holds the lease of)
        and let go of the lease, only if ``holder`` still holds it, in one atomic
        step; ``False`` (nothing written) otherwise."""

    async def put_conversation(self, record: StoredConversation) -> None:
        """Persist ``record`` (replacing the conversation with the same id); never expires."""

    async def get_conversation(
        self, conversation_id: str, *, owner: str
    ) -> StoredConversation | None:
        """The conversation, or ``None`` if missing or owned by someone else."""

    async def delete_conversation(self, conversation_id: str, *, owner: str) -> bool:
        """Delete the conversation; ``False`` if there was none visible to ``owner``."""

    async def conversations_holding(
        self, item_ids: Collection[str], *, owner: str
    ) -> list[StoredConversation]:
        """The conversations of ``owner`` that held items with these ids when last
        written (each once, in no order); the caller checks they still hold them."""

    async def put_usage(self, record: UsageRecord) -> None:
        """Add ``record`` to the usage ledger, replacing one with the same ``response_id``.

        The entry never expires and is not removed by :meth:`delete`. On
        :class:`StoreError` it may or may not have been written.
        """

    async def usage(self, *, owner: str | None = None) -> list[UsageRecord]:
        """The whole ledger, or ``owner``'s part of it, by ``created_at`` then ``response_id``."""

    async def ping(self) -> None:
        """Check the store answers; raises :class:`StoreError` if it does not."""

    async def secret(self, name: str, candidate: bytes) -> bytes:
        """The server secret ``name``: the one already kept, else ``candidate``, kept now.

        Atomic across every process on the store: the first writer wins and
        all of them read its value. Never expires.
        """

    # --- checkpoints of append-mode rollouts (CheckpointState) ---------------

    async def checkpoint_open(
        self, response_id: str, *, owner: str, state: bytes, items: Sequence[bytes], ttl: float
    ) -> int:
        """A new checkpoint of ``owner``'s ``response_id`` holding ``state`` and
        ``items``, replacing any of that id and owner (its items dropped); its epoch.

        The epoch is 1, or one past the epoch of the checkpoint replaced (so no
        earlier holder's epoch matches the new one). Gone ``ttl`` seconds
        after this call unless written or taken again. Raises
        :class:`ValueError` for a ttl that is not a positive number of
        seconds; on :class:`StoreError` it may or may not have been written.
        """

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
        """Atomically, if the checkpoint is there and its epoch is still ``epoch``:
        keep its first ``keep`` items, drop those after them, append ``items``,
        replace ``state`` and expire it ``ttl`` seconds from now; ``True``.

        ``False``, and nothing written, when it is gone (expired, deleted,
        never opened, another owner's) or taken over (its epoch moved on).
        Only the new items travel and are written: the kept ones stay as
        they are. Raises :class:`ValueError`, nothing written, for a bad ttl,
        a negative ``keep`` or one beyond the items stored; on
        :class:`StoreError` it may or may not have been written.
        """

    async def checkpoint_take(
        self, response_id: str, *, owner: str, ttl: float
    ) -> CheckpointState | None:
        """Atomically bump the checkpoint's epoch, expire it ``ttl`` seconds from
        now, and return it with the new epoch: the caller holds it now, and
        every earlier holder's writes are refused.

        ``None`` (nothing changed) if it is missing, expired or another
        owner's. Of two processes racing, each gets its own epoch and only
        the later one's writes land.
        """

    async def checkpoint_read(self, response_id: str, *, owner: str) -> CheckpointState | None:
        """The checkpoint (one consistent snapshot), without taking it or
        refreshing its expiry; ``None`` as for :meth:`checkpoint_take`."""

    async def checkpoint_delete(
        self, response_id: str, *, owner: str, epoch: int | None = None
    ) -> bool:
        """Delete the checkpoint and its items (with ``epoch``, only if it is still
        that epoch); ``True`` if one was deleted, ``False`` if none visible to
        ``owner`` was there (or its epoch moved on)."""

    async def aclose(self) -> None:
        """Release connections and files."""


class StoreError(Exception):
    """The backend failed (I/O, connection, undecodable record, closed store).

    Raised ``from`` the backend's own exception. The record in question may or
    may not have been written or deleted.
    """


_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(StoredResponse)
_usage_decoder: Final = msgspec.msgpack.Decoder(UsageRecord)
_conversation_decoder: Final = msgspec.msgpack.Decoder(StoredConversation)


def encode_record(record: StoredResponse | UsageRecord | StoredConversation) -> bytes:
    return _encoder.encode(record)


def decode_record(blob: bytes) -> StoredResponse:
    try:
        return _decoder.decode(blob)
    except msgspec.DecodeError as exc:
        raise StoreError(f"a stored record no longer decodes: {exc}") from exc


def decode_usage(blob: bytes) -> UsageRecord:
    try:
        return _usage_decoder.decode(blob)
    except msgspec.DecodeError as exc:
        raise StoreError(f"a usage record no longer decodes: {exc}") from exc


def decode_conversation(blob: bytes) -> StoredConversation:
    try:
        return _conversation_decoder.decode(blob)
    except msgspec.DecodeError as exc:
        raise StoreError(f"a stored conversation no longer decodes: {exc}") from exc


def held_item_ids(record: StoredResponse) -> Iterator[str]:
    """The ids of the items ``record`` holds: its input, output and context items."""
    for items in (record.input_items, record.response.output, record.context or ()):
        for item in items:
            item_id = getattr(item, "id", None)
            if isinstance(item_id, str):
                yield item_id


def conversation_item_ids(record: StoredConversation) -> Iterator[str]:
    """The ids of the items ``record`` holds."""
    for item in record.items:
        item_id = getattr(item, "id", None)
        if isinstance(item_id, str):
            yield item_id


def is_running(record: StoredResponse) -> bool:
    """``record`` is a background response that has not ended."""
    return record.response.background and record.response.status in UNFINISHED


def lets_go(record: StoredResponse) -> bool:
    """Storing ``record`` lets go of its lease: a background response's end."""
    return record.response.background and record.response.status not in UNFINISHED


def ledger_order(record: UsageRecord) -> tuple[float, str]:
    return (record.created_at, record.response_id)


def check_ttl(ttl: float | None) -> float | None:
    if ttl is not None and not (math.isfinite(ttl) and ttl > 0):
        raise ValueError(f"ttl must be a positive number of seconds or None, not {ttl!r}")
    return ttl


def check_checkpoint_args(ttl: float, keep: int = 0) -> None:
    """Raise :class:`ValueError` for a checkpoint ttl that is not a positive number
    of seconds, or a negative ``keep``."""
    if not (isinstance(ttl, int | float) and math.isfinite(ttl) and ttl > 0):
        raise ValueError(f"a checkpoint ttl must be a positive number of seconds, not {ttl!r}")
    if keep < 0:
        raise ValueError(f"keep must be 0 or more, not {keep}")


def keep_beyond_items(keep: int, response_id: str) -> ValueError:
    """The error of a checkpoint write that would keep more items than are stored."""
    return ValueError(
        f"keep={keep} is beyond the items stored in the checkpoint of {response_id}; "
        "nothing was written"
    )


def is_expired(expires_at: float | None, now: float) -> bool:
    return expires_at is not None and expires_at <= now
