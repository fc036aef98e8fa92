"""RedisStore: records and the ledger in Redis, shared by every process and host.

One key per record, set with ``PX`` (Redis expires it), and one per item id
it holds, naming it (set with the record, in one ``MULTI``, with the same
``PX``); the owner is checked after ``GET``, and ``delete`` is one Lua
script that reads the owner out of the blob and deletes only on a match
(atomic: no other client runs between the check and the ``DEL``; the item
keys are left to name a record that is gone). The ledger is one hash
without expiry.

A checkpoint of an append-mode rollout is two keys under one expiry: a hash
(``epoch``, ``state``, ``length``: how many items the list holds) and a list of
the item blobs, both named by owner and response id. Every checkpoint call is
one Lua script (``register_script``): the epoch check and the write run as one
step that no other client interleaves with, the expiry of both keys is set
together, and a write sends and appends only the new items (``LTRIM`` to
``keep``, ``RPUSH``). A hash whose list does not hold ``length`` items (one key
evicted without the other) counts as gone.
A running background response's id is in one set (:data:`REDIS_RUNNING_KEY`)
and its lease is a key naming its holder (:data:`REDIS_LEASE_PREFIX`), set
with ``PX``: Redis's own clock runs it out. Renewing, taking over and ending
a response held by a lease are each one Lua script (atomic: no other client
runs in between), so two processes never both take one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Final

import redis.asyncio
import redis.commands.core
import redis.exceptions
from redis.commands.core import AsyncScript

from .records import (
    CheckpointState,
    StoredConversation,
    StoredResponse,
    StoreError,
    UsageRecord,
    check_checkpoint_args,
    check_ttl,
    conversation_item_ids,
    decode_conversation,
    decode_record,
    decode_usage,
    encode_record,
    held_item_ids,
    is_running,
    keep_beyond_items,
    ledger_order,
    lets_go,
)

__all__ = [
    "REDIS_CHECKPOINT_ITEMS_PREFIX",
    "REDIS_CHECKPOINT_PREFIX",
    "REDIS_CONNECT_TIMEOUT",
    "REDIS_CONVERSATION_ITEM_PREFIX",
    "REDIS_CONVERSATION_PREFIX",
    "REDIS_ITEM_PREFIX",
    "REDIS_KEY_PREFIX",
    "REDIS_LEASE_PREFIX",
    "REDIS_RUNNING_KEY",
    "REDIS_SECRET_PREFIX",
    "REDIS_TIMEOUT",
    "REDIS_USAGE_KEY",
    "RedisStore",
]

#: Seconds to connect to Redis, and to wait for one answer, before the call
#: fails with :class:`StoreError` (a store that is down is loud, not stuck).
REDIS_CONNECT_TIMEOUT: Final = 2.0
REDIS_TIMEOUT: Final = 5.0

#: Redis key of a record: ``longresponse:response:{id}``.
REDIS_KEY_PREFIX: Final = "longresponse:response:"
#: Redis key naming the record that holds an item: ``longresponse:item:{owner}:{item id}``
#: -> response id (the owner is a digest: it holds no ``:``).
REDIS_ITEM_PREFIX: Final = "longresponse:item:"
#: Redis key of a conversation: ``longresponse:conversation:{id}`` (no expiry).
REDIS_CONVERSATION_PREFIX: Final = "longresponse:conversation:"
#: Redis key naming the conversation that holds an item:
#: ``longresponse:conversation_item:{owner}:{item id}`` -> conversation id.
REDIS_CONVERSATION_ITEM_PREFIX: Final = "longresponse:conversation_item:"
#: Redis hash of the usage ledger: field ``response_id`` -> msgpack UsageRecord.
REDIS_USAGE_KEY: Final = "longresponse:usage"
#: Redis key of a server secret: ``longresponse:secret:{name}``.
REDIS_SECRET_PREFIX: Final = "longresponse:secret:"
#: Redis set of the ids of the background responses that have not ended.
REDIS_RUNNING_KEY: Final = "longresponse:running"
#: Redis key of a running background response's lease: ``longresponse:lease:{id}``
#: -> its holder, with ``PX`` = the lease.
REDIS_LEASE_PREFIX: Final = "longresponse:lease:"

#: Redis hash of a checkpoint: ``longresponse:checkpoint:{owner}:{response id}`` ->
#: ``epoch``, ``state``, ``length``.
REDIS_CHECKPOINT_PREFIX: Final = "longresponse:checkpoint:"
#: Redis list of a checkpoint's item blobs, in order:
#: ``longresponse:checkpoint_items:{owner}:{response id}``.
REDIS_CHECKPOINT_ITEMS_PREFIX: Final = "longresponse:checkpoint_items:"

# The checkpoint scripts: KEYS[1] = the hash, KEYS[2] = the list. Items go in
# by RPUSH in batches (Lua's unpack has a stack limit). A hash whose list does
# not hold `length` items is treated as gone (one key evicted without the
# other); expiry is set on both keys by the same script, so they go together.
_CHECKPOINT_LUA: Final = """
local function push(key, first)
    for i = first, #ARGV, 1000 do
        redis.call('RPUSH', key, unpack(ARGV, i, math.min(i + 999, #ARGV)))
    end
end
local function live()
    local stored = redis.call('HMGET', KEYS[1], 'epoch', 'state', 'length')
    if not stored[1] then return nil end
    if redis.call('LLEN', KEYS[2]) ~= tonumber(stored[3]) then return nil end
    return stored
end
"""
# ARGV[1] = px, ARGV[2] = state, ARGV[3..] = items; -> the new epoch.
_CHECKPOINT_OPEN: Final = (
    _CHECKPOINT_LUA
    + """
local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0') + 1
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], 'epoch', epoch, 'state', ARGV[2], 'length', #ARGV - 2)
push(KEYS[2], 3)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return epoch
"""
)
# ARGV[1] = epoch, ARGV[2] = keep, ARGV[3] = px, ARGV[4] = state, ARGV[5..] = items;
# -> 1 written, 0 gone or taken over, -1 keep beyond the items stored.
_CHECKPOINT_WRITE: Final = (
    _CHECKPOINT_LUA
    + """
local stored = live()
if not stored or tonumber(stored[1]) ~= tonumber(ARGV[1]) then return 0 end
local keep = tonumber(ARGV[2])
if keep > tonumber(stored[3]) then return -1 end
if keep == 0 then
    redis.call('DEL', KEYS[2])
elseif keep < tonumber(stored[3]) then
    redis.call('LTRIM', KEYS[2], 0, keep - 1)
end
push(KEYS[2], 5)
redis.call('HSET', KEYS[1], 'state', ARGV[4], 'length', keep + #ARGV - 4)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
"""
)
# ARGV[1] = px (take) or nothing (read); -> {epoch, state, items} or nil.
_CHECKPOINT_TAKE: Final = (
    _CHECKPOINT_LUA
    + """
local stored = live()
if not stored then return nil end
local epoch = tonumber(stored[1])
if ARGV[1] then
    epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
    redis.call('PEXPIRE', KEYS[1], ARGV[1])
    redis.call('PEXPIRE', KEYS[2], ARGV[1])
end
return {epoch, stored[2], redis.call('LRANGE', KEYS[2], 0, -1)}
"""
)
# ARGV[1] = epoch, or nothing for any; -> 1 deleted, 0 not.
_CHECKPOINT_DELETE: Final = (
    _CHECKPOINT_LUA
    + """
local stored = live()
if not stored then return 0 end
if ARGV[1] and tonumber(stored[1]) ~= tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"""
)

# KEYS[1] = record key, ARGV[1] = owner. The blob is the msgpack map of a
# StoredResponse or a StoredConversation; cmsgpack is built into Redis's Lua.
_DELETE_IF_OWNER: Final = """
local blob = redis.call('GET', KEYS[1])
if not blob then return 0 end
if cmsgpack.unpack(blob)['owner'] ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
"""


# KEYS[1] = record key, KEYS[2] = its lease key, KEYS[3] = the running set;
# ARGV[1] = owner, ARGV[2] = response id. Deletes the record, and its lease.
_DELETE_RESPONSE_IF_OWNER: Final = """
local blob = redis.call('GET', KEYS[1])
if not blob then return 0 end
if cmsgpack.unpack(blob)['owner'] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[3], ARGV[2])
return redis.call('DEL', KEYS[1])
"""

# KEYS[1] = the running set, KEYS[2..] = lease keys; ARGV[1] = holder,
# ARGV[2] = lease in ms, ARGV[3..] = the response ids. Returns the ids lost.
_RENEW_LEASES: Final = """
local lost = {}
for i = 2, #KEYS do
  local current = redis.call('GET', KEYS[i])
  if current == ARGV[1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
  elseif not current and redis.call('SISMEMBER', KEYS[1], ARGV[i + 1]) == 1 then
    redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  else
    lost[#lost + 1] = ARGV[i + 1]
  end
end
return lost
"""

# The same KEYS and ARGV. Takes each running response whose lease ran out;
# returns the ids taken.
_TAKE_EXPIRED: Final = """
local taken = {}
for i = 2, #KEYS do
  if redis.call('SISMEMBER', KEYS[1], ARGV[i + 1]) == 1
      and redis.call('SET', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) then
    taken[#taken + 1] = ARGV[i + 1]
  end
end
return taken
"""

# KEYS[1] = lease key, KEYS[2] = record key, KEYS[3] = the running set,
# KEYS[4..] = item keys; ARGV[1] = holder, ARGV[2] = record blob, ARGV[3] = PX
# in ms ('' for none), ARGV[4] = response id. Returns 1 if written.
_PUT_HELD: Final = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local function put(key, value)
  if ARGV[3] == '' then
    redis.call('SET', key, value)
  else
    redis.call('SET', key, value, 'PX', ARGV[3])
  end
end
put(KEYS[2], ARGV[2])
for i = 4, #KEYS do put(KEYS[i], ARGV[4]) end
redis.call('SREM', KEYS[3], ARGV[4])
redis.call('DEL', KEYS[1])
return 1
"""


class RedisStore:
    """Records in Redis (``redis://host:port/db``), shared by every process and host.

    One key per record (:data:`REDIS_KEY_PREFIX` + id) holding its msgpack
    blob, set with ``PX`` so that Redis itself expires it; the ledger is one
    hash without expiry (:data:`REDIS_USAGE_KEY`). The client connects
    lazily: a wrong address shows up as :class:`StoreError` on the first call.
    A store belongs to the event loop it is first used on.
    """

    #: Other processes write here too (see ``Persistence.get``).
    shared = True

    def __init__(self, url: str, *, ttl: float | None = None) -> None:
        self.url = url
        self.ttl = check_ttl(ttl)
        self._redis = redis.asyncio.Redis.from_url(
            url,
            socket_connect_timeout=REDIS_CONNECT_TIMEOUT,
            socket_timeout=REDIS_TIMEOUT,
        )
        self._delete_if_owner = self._redis.register_script(_DELETE_IF_OWNER)
        self._checkpoint_open = self._redis.register_script(_CHECKPOINT_OPEN)
        self._checkpoint_write = self._redis.register_script(_CHECKPOINT_WRITE)
        self._checkpoint_take = self._redis.register_script(_CHECKPOINT_TAKE)
        self._checkpoint_delete = self._redis.register_script(_CHECKPOINT_DELETE)
        self._delete_response = self._redis.register_script(_DELETE_RESPONSE_IF_OWNER)
        self._renew_leases = self._redis.register_script(_RENEW_LEASES)
        self._take_expired = self._redis.register_script(_TAKE_EXPIRED)
        self._put_held = self._redis.register_script(_PUT_HELD)

    @property
    def _px(self) -> int | None:
        return None if self.ttl is None else max(1, round(self.ttl * 1000))

    async def put(self, record: StoredResponse) -> None:
        """``SET`` the record and its item keys in one ``MULTI`` (with ``PX`` = ttl
        when there is one); a background response's end drops its lease in it."""
        await self._put(record)

    async def put_running(self, record: StoredResponse, *, holder: str, lease: float) -> None:
        """:meth:`put`, with the id added to the running set and the lease key set,
        in the same ``MULTI``."""
        await self._put(record, (holder, lease))

    async def _put(self, record: StoredResponse, lease: tuple[str, float] | None = None) -> None:
        px = self._px
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(_redis_key(record.id), encode_record(record), px=px)
                for item_id in set(held_item_ids(record)):
                    pipe.set(_item_key(record.owner, item_id), record.id, px=px)
                if lease is not None:
                    pipe.sadd(REDIS_RUNNING_KEY, record.id)
                    pipe.set(_lease_key(record.id), lease[0], px=_milliseconds(lease[1]))
                elif lets_go(record):
                    pipe.srem(REDIS_RUNNING_KEY, record.id)
                    pipe.delete(_lease_key(record.id))
                await pipe.execute()
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc

    async def renew_leases(
        self, response_ids: Collection[str], *, holder: str, lease: float
    ) -> set[str]:
        """Extend ``holder``'s leases (one Lua script); the ids it no longer holds."""
        ids = list(dict.fromkeys(response_ids))
        if not ids:
            return set()
        lost = await self._leases(self._renew_leases, ids, holder, lease)
        return {_text(name) for name in lost}

    async def take_expired(
        self, *, holder: str, lease: float, response_id: str | None = None
    ) -> list[StoredResponse]:
        """Take over the running responses whose lease key is gone (one Lua
        script over the running set, or over ``response_id``), then read them."""
        if response_id is None:
            try:
                members = await self._redis.smembers(REDIS_RUNNING_KEY)
            except redis.exceptions.RedisError as exc:
                raise StoreError(f"Redis store: {exc}") from exc
            ids = sorted(_text(name) for name in members)
        else:
            ids = [response_id]
        if not ids:
            return []
        answer = await self._leases(self._take_expired, ids, holder, lease)
        taken = [_text(name) for name in answer]
        if not taken:
            return []
        try:
            blobs = await self._redis.mget([_redis_key(name) for name in taken])
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc
        records, stale = [], []
        for name, blob in zip(taken, blobs, strict=True):
            record = decode_record(blob) if isinstance(blob, bytes) else None
            if record is not None and is_running(record):
                records.append(record)
            else:  # ended, expired or deleted: nothing runs any more
                stale.append(name)
        if stale:
            try:
                async with self._redis.pipeline(transaction=True) as pipe:
                    pipe.srem(REDIS_RUNNING_KEY, *stale)
                    pipe.delete(*map(_lease_key, stale))
                    await pipe.execute()
            except redis.exceptions.RedisError as exc:
                raise StoreError(f"Redis store: {exc}") from exc
        return records

    async def _leases(
        self, script: AsyncScript, ids: list[str], holder: str, lease: float
    ) -> list[bytes]:
        keys = [REDIS_RUNNING_KEY, *map(_lease_key, ids)]
        try:
            answer = await script(keys=keys, args=[holder, _milliseconds(lease), *ids])
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc
        assert isinstance(answer, list)
        return answer

    async def put_held(self, record: StoredResponse, *, holder: str) -> bool:
        """Store ``record`` and drop its lease, only while ``holder`` holds it (one
        Lua script)."""
        px = self._px
        items = [_item_key(record.owner, item_id) for item_id in set(held_item_ids(record))]
        keys = [_lease_key(record.id), _redis_key(record.id), REDIS_RUNNING_KEY, *items]
        args: list[bytes | str] = [
            holder,
            encode_record(record),
            "" if px is None else str(px),
            record.id,
        ]
        try:
            written = await self._put_held(keys=keys, args=args)
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc
        return bool(written)

    async def get(self, response_id: str, *, owner: str) -> StoredResponse | None:
        """The record, or ``None`` if missing, expired or foreign."""
        try:
            blob = await self._redis.get(_redis_key(response_id))
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc
        if blob is None:
            return None
        assert isinstance(blob, bytes)  # the client does not decode replies to str
        record = decode_record(blob)
        return record if record.owner == owner else None

    async def delete(self, response_id: str, *, owner: str) -> bool:
        """Delete the record and its lease only if ``owner`` owns it (atomically, in
        one Lua script)."""
        keys = [_redis_key(response_id), _lease_key(response_id), REDIS_RUNNING_KEY]
        try:
            deleted = await self._delete_response(keys=keys, args=[owner, response_id])
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc
        return bool(deleted)

    async def holding(self, item_ids: Collection[str], *, owner: str) -> list[StoredResponse]:
        """The visible records of ``owner`` written last holding these item ids:
        one ``MGET`` of the item keys, one of the records they name."""
        keys = [_item_key(owner, item_id) for item_id in dict.fromkeys(item_ids)]
        blobs = await self._through_index(keys, REDIS_KEY_PREFIX.encode())
        return [r for r in map(decode_record, blobs) if r.owner == owner]

    async def put_conversation(self, record: StoredConversation) -> None:
        """``SET`` the conversation and its item keys in one ``MULTI`` (no expiry)."""
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(REDIS_CONVERSATION_PREFIX + record.id, encode_record(record))
                for item_id in conversation_item_ids(record):
                    key = f"{REDIS_CONVERSATION_ITEM_PREFIX}{record.owner}:{item_id}"
                    pipe.set(key, record.id)
                await pipe.execute()
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc

    async def get_conversation(
        self, conversation_id: str, *, owner: str
    ) -> StoredConversation | None:
        """The conversation, or ``None`` if missing or foreign (checked after ``GET``)."""
        try:
            blob = await self._redis.get(REDIS_CONVERSATION_PREFIX + conversation_id)
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc
        if blob is None:
            return None
        assert isinstance(blob, bytes)  # the client does not decode replies to str
        record = decode_conversation(blob)
        return record if record.owner == owner else None

    async def delete_conversation(self, conversation_id: str, *, owner: str) -> bool:
        """Delete the conversation only if ``owner`` owns it (the same Lua script)."""
        key = REDIS_CONVERSATION_PREFIX + conversation_id
        try:
            deleted = await self._delete_if_owner(keys=[key], args=[owner])
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc
        return bool(deleted)

    async def conversations_holding(
        self, item_ids: Collection[str], *, owner: str
    ) -> list[StoredConversation]:
        """The conversations of ``owner`` written last holding these item ids:
        one ``MGET`` of the item keys, one of the conversations they name."""
        prefix = f"{REDIS_CONVERSATION_ITEM_PREFIX}{owner}:"
        keys = [prefix + item_id for item_id in dict.fromkeys(item_ids)]
        blobs = await self._through_index(keys, REDIS_CONVERSATION_PREFIX.encode())
        return [r for r in map(decode_conversation, blobs) if r.owner == owner]

    async def _through_index(self, index_keys: list[str], prefix: bytes) -> list[bytes]:
        """The blobs the ``index_keys`` name (each the id of a blob under
        ``prefix``), once each; those deleted or expired since are left out."""
        if not index_keys:
            return []
        try:
            named = await self._redis.mget(index_keys)
            held = list(dict.fromkeys(name for name in named if isinstance(name, bytes)))
            if not held:
                return []
            blobs = await self._redis.mget([prefix + name for name in held])
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc
        # The client does not decode replies to str.
        return [blob for blob in blobs if isinstance(blob, bytes)]

    async def put_usage(self, record: UsageRecord) -> None:
        """``HSET`` the ledger field ``response_id`` (replacing it); the hash never expires."""
        try:
            await self._redis.hset(REDIS_USAGE_KEY, record.response_id, encode_record(record))
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc

    async def usage(self, *, owner: str | None = None) -> list[UsageRecord]:
        """The ledger, or ``owner``'s part, by ``created_at`` then ``response_id``.

        Reads the whole hash (``HGETALL``) and filters and sorts here: fine
        for a ledger of thousands of entries, not of millions.
        """
        try:
            entries = await self._redis.hgetall(REDIS_USAGE_KEY)
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc
        records = []
        for blob in entries.values():
            assert isinstance(blob, bytes)  # the client does not decode replies to str
            record = decode_usage(blob)
            if owner is None or record.owner == owner:
                records.append(record)
        return sorted(records, key=ledger_order)

    async def purge_expired(self) -> int:
        """Always 0: Redis expires keys itself (and never the ledger)."""
        return 0

    # --- checkpoints (ResponseStore.checkpoint_*; the module docstring) ---------

    async def checkpoint_open(
        self, response_id: str, *, owner: str, state: bytes, items: Sequence[bytes], ttl: float
    ) -> int:
        """Replace both keys of the checkpoint and set their expiry (one script); its epoch."""
        check_checkpoint_args(ttl)
        args: list[bytes | int | str] = [_px(ttl), state, *items]
        epoch = await self._checkpoint_script(self._checkpoint_open, response_id, owner, args)
        assert isinstance(epoch, int)
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
        """If still ``epoch``: ``LTRIM`` the list to ``keep``, ``RPUSH`` the new items,
        set the state and the expiry of both keys (one script)."""
        check_checkpoint_args(ttl, keep)
        args: list[bytes | int | str] = [epoch, keep, _px(ttl), state, *items]
        written = await self._checkpoint_script(self._checkpoint_write, response_id, owner, args)
        if written == -1:
            raise keep_beyond_items(keep, response_id)
        return written == 1

    async def checkpoint_take(
        self, response_id: str, *, owner: str, ttl: float
    ) -> CheckpointState | None:
        """``HINCRBY`` the epoch, refresh the expiry of both keys and read them (one script)."""
        check_checkpoint_args(ttl)
        taken = await self._checkpoint_script(self._checkpoint_take, response_id, owner, [_px(ttl)])
        return _checkpoint_state(response_id, owner, taken)

    async def checkpoint_read(self, response_id: str, *, owner: str) -> CheckpointState | None:
        """Both keys read in one script (nothing bumped or refreshed)."""
        read = await self._checkpoint_script(self._checkpoint_take, response_id, owner, [])
        return _checkpoint_state(response_id, owner, read)

    async def checkpoint_delete(
        self, response_id: str, *, owner: str, epoch: int | None = None
    ) -> bool:
        """``DEL`` both keys (only if still ``epoch``, when given; one script)."""
        args = [] if epoch is None else [epoch]
        deleted = await self._checkpoint_script(self._checkpoint_delete, response_id, owner, args)
        return deleted == 1

    async def _checkpoint_script(
        self,
        script: redis.commands.core.AsyncScript,
        response_id: str,
        owner: str,
        args: Sequence[bytes | int | str],
    ) -> object:
        """Run a checkpoint script on the two keys of ``owner``'s ``response_id``."""
        keys = [
            f"{REDIS_CHECKPOINT_PREFIX}{owner}:{response_id}",
            f"{REDIS_CHECKPOINT_ITEMS_PREFIX}{owner}:{response_id}",
        ]
        try:
            return await script(keys=keys, args=args)
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc

    async def ping(self) -> None:
        """``PING`` (raises :class:`StoreError` when Redis does not answer)."""
        try:
            await self._redis.ping()
        except (redis.exceptions.RedisError, OSError) as exc:
            raise StoreError(f"Redis store {self.url}: {exc}") from exc

    async def secret(self, name: str, candidate: bytes) -> bytes:
        """The secret ``name`` at ``longresponse:secret:{name}`` (``SET NX``, then ``GET``:
        the first process wins); no expiry."""
        key = REDIS_SECRET_PREFIX + name
        try:
            await self._redis.set(key, candidate, nx=True)
            value = await self._redis.get(key)
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc
        assert isinstance(value, bytes)  # just set, never expires
        return value

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()


def _redis_key(response_id: str) -> str:
    return REDIS_KEY_PREFIX + response_id


def _item_key(owner: str, item_id: str) -> str:
    return f"{REDIS_ITEM_PREFIX}{owner}:{item_id}"


def _px(ttl: float) -> int:
    return max(1, round(ttl * 1000))


def _checkpoint_state(response_id: str, owner: str, reply: object) -> CheckpointState | None:
    """The reply of the take-or-read script as a checkpoint (``None`` for nil)."""
    if reply is None:
        return None
    assert isinstance(reply, list)  # [epoch, state, [item, ...]]; replies stay bytes
    epoch, state, items = reply
    return CheckpointState(
        response_id=response_id, owner=owner, epoch=int(epoch), state=state, items=list(items)
    )
def _lease_key(response_id: str) -> str:
    return REDIS_LEASE_PREFIX + response_id


def _text(name: bytes | str) -> str:
    """A name Redis answered (the client does not decode replies to str)."""
    return name.decode() if isinstance(name, bytes) else name


def _milliseconds(seconds: float) -> int:
    return max(1, round(seconds * 1000))
