"""Persisted responses (``store=true``): one interface, three backends.

A :class:`StoredResponse` is one finished Response plus what is needed to
rebuild its conversation: its own NEW input items and the id of the response
it continued. Rebuilding a chain means walking ``previous_response_id`` back
through the store (the stateless baseline the HTTP path measures).

Backends, chosen by :func:`open_store` from a URL:

``memory://``            in-process dict (tests; nothing survives a restart)
``sqlite:///path/file``  embedded default: one file, WAL, several connections
``redis://host:port/db`` shared by several processes or hosts

Every record belongs to an ``owner`` (a digest of the API key, ``""`` without
keys): a read, delete or chain by another owner finds nothing. Records older
than the store's ``ttl`` (seconds; ``None`` = forever) are not found.

Every backend also keeps the usage ledger for billing: one
:class:`UsageRecord` per finished response, written with
:meth:`~ResponseStore.put_usage` and listed with :meth:`~ResponseStore.usage`.
Ledger records never expire: billing must outlive retention, so neither the
``ttl``, nor ``purge_expired``, nor deleting the response removes them.

Theory of operation
-------------------
Every backend keeps the record as one msgpack blob (one reused encoder, one
reused decoder into :class:`StoredResponse`), so what comes back is what went
in, whichever backend holds it. The ttl counts from :meth:`~ResponseStore.put`
(the moment the response is stored), not from ``created_at``: each backend
measures it on one clock of its own (the process's monotonic clock for
memory, wall time shared by every process on the file for SQLite, the
server's clock for Redis).

* :class:`MemoryStore` keeps blobs in a dict; an expired one is dropped when
  it is looked at.
* :class:`SQLiteStore` runs every call on one worker thread that owns the one
  connection, so the event loop never waits on the disk. WAL lets readers in
  other connections and processes go on while one writes, and ``busy_timeout``
  makes a writer wait for another instead of failing. Expired rows are hidden
  by every query and deleted by :meth:`SQLiteStore.purge_expired`, which
  :meth:`SQLiteStore.put` also runs at most once per
  :data:`SQLITE_PURGE_INTERVAL`.
* :class:`RedisStore` sets one key per record with ``PX`` (Redis expires it);
  the owner is checked after ``GET``, and ``delete`` is one Lua script that
  reads the owner out of the blob and deletes only on a match (atomic: no
  other client runs between the check and the ``DEL``).

The ledger sits beside the records, keyed by ``response_id`` so that writing
the same response twice leaves one entry (the last write wins): a dict for
memory, a ``usage`` table (``INSERT OR REPLACE``) for SQLite, and one hash,
:data:`REDIS_USAGE_KEY`, for Redis (``HSET`` of a field replaces it; the hash
has no expiry). Listing sorts by ``created_at``, then ``response_id``.

Failures of the backend itself (disk, network, a blob that no longer decodes)
raise :class:`StoreError`; a missing, expired or foreign record is not an
error (``None`` / ``False``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol, TypeVar

import msgspec
import redis.asyncio
import redis.exceptions

from protocol.items import Item
from protocol.response import Response

__all__ = [
    "REDIS_KEY_PREFIX",
    "REDIS_USAGE_KEY",
    "SQLITE_BUSY_TIMEOUT",
    "SQLITE_PURGE_INTERVAL",
    "MemoryStore",
    "RedisStore",
    "ResponseStore",
    "SQLiteStore",
    "StoreError",
    "StoredResponse",
    "UsageRecord",
    "open_store",
]

#: Redis key of a record: ``longresponse:response:{id}``.
REDIS_KEY_PREFIX: Final = "longresponse:response:"
#: Redis hash of the usage ledger: field ``response_id`` -> msgpack UsageRecord.
REDIS_USAGE_KEY: Final = "longresponse:usage"
#: Seconds a SQLite writer waits for another connection's lock before failing.
SQLITE_BUSY_TIMEOUT: Final = 5.0
#: Seconds between two opportunistic purges of expired SQLite rows.
SQLITE_PURGE_INTERVAL: Final = 60.0

_T = TypeVar("_T")


class StoredResponse(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    owner: str
    created_at: float
    response: Response
    #: This response's own input items (ids assigned), not the whole history.
    input_items: list[Item]
    previous_response_id: str | None = None


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
    #: How the response was served: ``"append"``, ``"ws"`` or ``"http"``.
    transport: str


class ResponseStore(Protocol):
    async def put(self, record: StoredResponse) -> None:
        """Persist ``record`` (replacing one with the same id)."""

    async def get(self, response_id: str, *, owner: str) -> StoredResponse | None:
        """The record, or ``None`` if missing, expired or owned by someone else."""

    async def delete(self, response_id: str, *, owner: str) -> bool:
        """Delete the record; ``False`` if there was none visible to ``owner``."""

    async def put_usage(self, record: UsageRecord) -> None:
        """Add ``record`` to the usage ledger, replacing one with the same ``response_id``.

        The entry never expires and is not removed by :meth:`delete`. On
        :class:`StoreError` it may or may not have been written.
        """

    async def usage(self, *, owner: str | None = None) -> list[UsageRecord]:
        """The whole ledger, or ``owner``'s part of it, by ``created_at`` then ``response_id``."""

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


def _encode(record: StoredResponse | UsageRecord) -> bytes:
    return _encoder.encode(record)


def _decode(blob: bytes) -> StoredResponse:
    try:
        return _decoder.decode(blob)
    except msgspec.DecodeError as exc:
        raise StoreError(f"a stored record no longer decodes: {exc}") from exc


def _decode_usage(blob: bytes) -> UsageRecord:
    try:
        return _usage_decoder.decode(blob)
    except msgspec.DecodeError as exc:
        raise StoreError(f"a usage record no longer decodes: {exc}") from exc


def _ledger_order(record: UsageRecord) -> tuple[float, str]:
    return (record.created_at, record.response_id)


def _check_ttl(ttl: float | None) -> float | None:
    if ttl is not None and not (math.isfinite(ttl) and ttl > 0):
        raise ValueError(f"ttl must be a positive number of seconds or None, not {ttl!r}")
    return ttl


# --- memory ----------------------------------------------------------------


class MemoryStore:
    """Records in a dict of this process (``memory://``); for tests and one-off runs.

    Unbounded when ``ttl`` is ``None``. ``clock`` (seconds, monotonic) measures
    the ttl; tests pass a fake one.
    """

    def __init__(
        self, *, ttl: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = _check_ttl(ttl)
        self._clock = clock
        #: id -> (owner, expires_at or None, msgpack blob)
        self._records: dict[str, tuple[str, float | None, bytes]] = {}
        #: response_id -> msgpack UsageRecord (never expires)
        self._usage: dict[str, bytes] = {}

    async def put(self, record: StoredResponse) -> None:
        """Store ``record``; nothing changes if it cannot be encoded."""
        expires_at = None if self.ttl is None else self._clock() + self.ttl
        self._records[record.id] = (record.owner, expires_at, _encode(record))

    async def get(self, response_id: str, *, owner: str) -> StoredResponse | None:
        """The record, or ``None`` if missing, expired (then dropped) or foreign."""
        blob = self._visible(response_id, owner)
        return None if blob is None else _decode(blob)

    async def delete(self, response_id: str, *, owner: str) -> bool:
        """Delete the record; ``False`` (and nothing deleted) if not visible to ``owner``."""
        if self._visible(response_id, owner) is None:
            return False
        del self._records[response_id]
        return True

    async def put_usage(self, record: UsageRecord) -> None:
        """Add ``record`` to the ledger, replacing its ``response_id``; unchanged if unencodable."""
        self._usage[record.response_id] = _encode(record)

    async def usage(self, *, owner: str | None = None) -> list[UsageRecord]:
        """The ledger, or ``owner``'s part, by ``created_at`` then ``response_id``."""
        records = (_decode_usage(blob) for blob in self._usage.values())
        return sorted(
            (record for record in records if owner is None or record.owner == owner),
            key=_ledger_order,
        )

    async def purge_expired(self) -> int:
        """Drop every expired record (never a ledger entry); the number dropped."""
        now = self._clock()
        expired = [
            key for key, (_, expires_at, _) in self._records.items() if _expired(expires_at, now)
        ]
        for key in expired:
            del self._records[key]
        return len(expired)

    async def aclose(self) -> None:
        """Forget every record and the ledger."""
        self._records.clear()
        self._usage.clear()

    def _visible(self, response_id: str, owner: str) -> bytes | None:
        entry = self._records.get(response_id)
        if entry is None:
            return None
        record_owner, expires_at, blob = entry
        if _expired(expires_at, self._clock()):
            del self._records[response_id]
            return None
        return blob if record_owner == owner else None


def _expired(expires_at: float | None, now: float) -> bool:
    return expires_at is not None and expires_at <= now


# --- SQLite ----------------------------------------------------------------

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_expires_at
    ON responses (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS usage (
    response_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_owner ON usage (owner, created_at, response_id);
"""
_PUT: Final = (
    "INSERT OR REPLACE INTO responses (id, owner, created_at, expires_at, data)"
    " VALUES (?, ?, ?, ?, ?)"
)
_VISIBLE: Final = "id = ? AND owner = ? AND (expires_at IS NULL OR expires_at > ?)"
_GET: Final = f"SELECT data FROM responses WHERE {_VISIBLE}"
_DELETE: Final = f"DELETE FROM responses WHERE {_VISIBLE}"
_PURGE: Final = "DELETE FROM responses WHERE expires_at IS NOT NULL AND expires_at <= ?"
_PUT_USAGE: Final = (
    "INSERT OR REPLACE INTO usage (response_id, owner, created_at, data) VALUES (?, ?, ?, ?)"
)
# TEXT compares by its UTF-8 bytes, which orders as Python orders str.
_USAGE: Final = "SELECT data FROM usage ORDER BY created_at, response_id"
_USAGE_OF: Final = "SELECT data FROM usage WHERE owner = ? ORDER BY created_at, response_id"


class SQLiteStore:
    """Records in one SQLite file (WAL), shared by every connection and process on it.

    Opening creates the parent directories, the file and the table, and turns
    WAL on; it blocks the caller for that (call it at startup). Every later call
    runs on a single worker thread that owns the connection. ``clock`` is wall
    time (seconds since the epoch) because other processes read the same
    ``expires_at`` column; tests pass a fake one.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        ttl: float | None = None,
        clock: Callable[[], float] = time.time,
        busy_timeout: float = SQLITE_BUSY_TIMEOUT,
    ) -> None:
        self.path = Path(path) if str(path) != ":memory:" else None
        self.ttl = _check_ttl(ttl)
        self._clock = clock
        self._last_purge = -math.inf
        self._closed = False
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="longresponse-sqlite"
        )
        try:
            self._db = self._executor.submit(self._connect, str(path), busy_timeout).result()
        except BaseException:
            self._executor.shutdown(wait=False)
            raise

    def _connect(self, path: str, busy_timeout: float) -> sqlite3.Connection:
        try:
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: every statement commits on its own, so no
            # transaction (and no lock) outlives a call.
            db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
            try:
                db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
                db.execute("PRAGMA journal_mode = WAL")
                db.execute("PRAGMA synchronous = NORMAL")
                db.executescript(_SCHEMA)
            except BaseException:
                db.close()
                raise
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the SQLite store {path!r}: {exc}") from exc
        return db

    async def _run(self, call: Callable[[], _T]) -> _T:
        if self._closed:
            raise StoreError("the store is closed")
        # A cancelled caller stops waiting; the call itself still runs to the end.
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, call)
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite store {self.path}: {exc}") from exc

    async def put(self, record: StoredResponse) -> None:
        """Store ``record`` (one statement: written whole or not at all).

        Also deletes expired rows if the last purge is older than
        :data:`SQLITE_PURGE_INTERVAL`.
        """
        blob = _encode(record)
        now = self._clock()
        expires_at = None if self.ttl is None else now + self.ttl
        row = (record.id, record.owner, record.created_at, expires_at, blob)
        purge = now - self._last_purge >= SQLITE_PURGE_INTERVAL
        if purge:
            self._last_purge = now

        def put() -> None:
            self._db.execute(_PUT, row)
            if purge:
                self._db.execute(_PURGE, (now,))

        await self._run(put)

    async def get(self, response_id: str, *, owner: str) -> StoredResponse | None:
        """The record, or ``None`` if missing, expired or foreign."""
        args = (response_id, owner, self._clock())
        row = await self._run(lambda: self._db.execute(_GET, args).fetchone())
        return None if row is None else _decode(row[0])

    async def delete(self, response_id: str, *, owner: str) -> bool:
        """Delete the record; ``False`` (and nothing deleted) if not visible to ``owner``."""
        args = (response_id, owner, self._clock())
        return await self._run(lambda: self._db.execute(_DELETE, args).rowcount > 0)

    async def put_usage(self, record: UsageRecord) -> None:
        """Add ``record`` to the ``usage`` table (one statement: written whole or not at all)."""
        row = (record.response_id, record.owner, record.created_at, _encode(record))
        await self._run(lambda: self._db.execute(_PUT_USAGE, row))

    async def usage(self, *, owner: str | None = None) -> list[UsageRecord]:
        """The ledger, or ``owner``'s part, by ``created_at`` then ``response_id``."""

        def rows() -> list[tuple[bytes]]:
            if owner is None:
                return self._db.execute(_USAGE).fetchall()
            return self._db.execute(_USAGE_OF, (owner,)).fetchall()

        return [_decode_usage(blob) for (blob,) in await self._run(rows)]

    async def purge_expired(self) -> int:
        """Delete every expired response row (never a ledger row); the number deleted."""
        now = self._clock()
        self._last_purge = now
        return await self._run(lambda: self._db.execute(_PURGE, (now,)).rowcount)

    async def aclose(self) -> None:
        """Close the connection and stop the worker thread; idempotent.

        Later calls raise :class:`StoreError`.
        """
        if self._closed:
            return
        try:
            await self._run(self._db.close)
        finally:
            self._closed = True
            self._executor.shutdown(wait=False)


# --- Redis -----------------------------------------------------------------

# KEYS[1] = record key, ARGV[1] = owner. The blob is the msgpack map of a
# StoredResponse; cmsgpack is built into Redis's Lua.
_DELETE_IF_OWNER: Final = """
local blob = redis.call('GET', KEYS[1])
if not blob then return 0 end
if cmsgpack.unpack(blob)['owner'] ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
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
        self.ttl = _check_ttl(ttl)
        self._redis = redis.asyncio.Redis.from_url(url)
        self._delete_if_owner = self._redis.register_script(_DELETE_IF_OWNER)

    async def put(self, record: StoredResponse) -> None:
        """``SET`` the record (with ``PX`` = ttl when there is one)."""
        px = None if self.ttl is None else max(1, round(self.ttl * 1000))
        try:
            await self._redis.set(_redis_key(record.id), _encode(record), px=px)
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc

    async def get(self, response_id: str, *, owner: str) -> StoredResponse | None:
        """The record, or ``None`` if missing, expired or foreign."""
        try:
            blob = await self._redis.get(_redis_key(response_id))
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc
        if blob is None:
            return None
        assert isinstance(blob, bytes)  # the client does not decode replies to str
        record = _decode(blob)
        return record if record.owner == owner else None

    async def delete(self, response_id: str, *, owner: str) -> bool:
        """Delete the record only if ``owner`` owns it (atomically, in one Lua script)."""
        try:
            deleted = await self._delete_if_owner(keys=[_redis_key(response_id)], args=[owner])
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis store: {exc}") from exc
        return bool(deleted)

    async def put_usage(self, record: UsageRecord) -> None:
        """``HSET`` the ledger field ``response_id`` (replacing it); the hash never expires."""
        try:
            await self._redis.hset(REDIS_USAGE_KEY, record.response_id, _encode(record))
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
            record = _decode_usage(blob)
            if owner is None or record.owner == owner:
                records.append(record)
        return sorted(records, key=_ledger_order)

    async def purge_expired(self) -> int:
        """Always 0: Redis expires keys itself (and never the ledger)."""
        return 0

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()


def _redis_key(response_id: str) -> str:
    return REDIS_KEY_PREFIX + response_id


# --- dispatch --------------------------------------------------------------


def open_store(url: str, *, ttl: float | None = None) -> ResponseStore:
    """The store for ``url`` (see the module docstring).

    ``sqlite:///abs/path.db`` and ``sqlite://relative.db`` name a file, and so
    does a plain path without a scheme. Raises :class:`ValueError` for an
    unknown scheme, an empty SQLite path or a bad ``ttl``, and
    :class:`StoreError` if a SQLite file cannot be opened.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return SQLiteStore(_nonempty_path(url, url), ttl=ttl)
    match scheme.lower():
        case "memory":
            return MemoryStore(ttl=ttl)
        case "sqlite":
            return SQLiteStore(_nonempty_path(rest, url), ttl=ttl)
        case "redis" | "rediss":
            return RedisStore(url, ttl=ttl)
        case _:
            raise ValueError(
                f"unknown store URL scheme {scheme!r} in {url!r}; expected memory://, "
                "sqlite:///path/to/file.db (or a plain path), or redis://host:port/db"
            )


def _nonempty_path(path: str, url: str) -> str:
    if not path:
        raise ValueError(f"the store URL {url!r} names no SQLite file")
    return path
