"""Persisted responses (``store=true``): three backends behind one interface, by URL.

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

Every backend also keeps the server's secrets (:meth:`~ResponseStore.secret`,
get-or-create, first writer wins): a ``secrets`` table for SQLite, one key
per secret for Redis, a dict for memory (so there a secret is the process's
own). ``longresponse.storage.server_keys`` keeps the compaction key there.

Every backend also keeps the conversations of the Conversations API
(:class:`StoredConversation`, one blob each, replaced whole on a change,
owned per key, never expiring): a ``conversations`` table for SQLite, one key
per conversation for Redis (deleted by the same owner-checking script), a
dict for memory.

Every backend also keeps the checkpoints of append-mode rollouts
(:class:`CheckpointState`: an epoch, a small state blob rewritten on every
write, and the context items, each a blob, appended to), per owner and
response id, gone ``ttl`` seconds (the caller's, not the store's) after the
last open, write or take: two tables for SQLite, a hash and a list under one
expiry for Redis (every call one Lua script), a dict for memory. A write names
the epoch it holds and is refused once :meth:`~ResponseStore.checkpoint_take`
has moved it on, so of two processes taking one rollout, only the later one
writes.

Every backend also keeps the leases of running background responses
(``longresponse.storage.records`` says what a lease is): a dict for memory, a
``leases`` table for SQLite (wall time, as the ttl), and for Redis a set of
running ids and one key per lease with ``PX`` (Redis's clock). Writing a
record and its lease, taking over leases that ran out and storing the end of
a taken response are each atomic, so of several processes sharing a store
exactly one takes a response over.

Failures of the backend itself (disk, network, a blob that no longer decodes)
raise :class:`StoreError`; a missing, expired or foreign record is not an
error (``None`` / ``False``).
"""

from __future__ import annotations

from .memory import MemoryStore
from .records import (
    CheckpointState,
    ResponseStore,
    StoredConversation,
    StoredResponse,
    StoreError,
    UsageRecord,
)
from .redis_store import REDIS_KEY_PREFIX, REDIS_USAGE_KEY, RedisStore
from .sqlite_store import SQLITE_BUSY_TIMEOUT, SQLITE_PURGE_INTERVAL, SQLiteStore

__all__ = [
    "REDIS_KEY_PREFIX",
    "REDIS_USAGE_KEY",
    "SQLITE_BUSY_TIMEOUT",
    "SQLITE_PURGE_INTERVAL",
    "CheckpointState",
    "MemoryStore",
    "RedisStore",
    "ResponseStore",
    "SQLiteStore",
    "StoreError",
    "StoredConversation",
    "StoredResponse",
    "UsageRecord",
    "open_store",
]


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
