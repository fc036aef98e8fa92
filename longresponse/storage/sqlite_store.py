"""SQLiteStore: records and the ledger in one SQLite file (WAL), the embedded default.

Every call runs on one worker thread that owns the one connection, so the
event loop never waits on the disk. WAL lets readers in other connections and
processes go on while one writes, and ``busy_timeout`` makes a writer wait for
another instead of failing. Expired rows are hidden by every query and
deleted by :meth:`SQLiteStore.purge_expired`, which :meth:`SQLiteStore.put`
also runs at most once per :data:`SQLITE_PURGE_INTERVAL`.

Checkpoints of append-mode rollouts are two tables: ``checkpoints`` (one row
per owner and response id: epoch, ``expires_at``, the state blob) and
``checkpoint_items`` (one row per item blob, by position), so that a write
deletes the items after ``keep`` and inserts only the new ones. Each call is
one ``BEGIN IMMEDIATE`` transaction: the epoch is checked and the write done
under SQLite's one write lock, which every connection and process on the file
takes in turn. Expired checkpoints are hidden by every query and deleted by
:meth:`SQLiteStore.purge_expired` and, at most once per
:data:`SQLITE_PURGE_INTERVAL`, by :meth:`SQLiteStore.checkpoint_open`. The
tables are created when a file is opened, so a file written before they
existed gets them.

The leases of running background responses are a ``leases`` table (holder,
expiry in wall time, as the ttl), written in the same transaction as the
record; taking over and ending a response held by another process are each
one ``BEGIN IMMEDIATE`` transaction, so two processes on the file never both
take one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Final, TypeVar

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
    lets_go,
)

__all__ = ["SQLITE_BUSY_TIMEOUT", "SQLITE_PURGE_INTERVAL", "SQLiteStore"]

#: Seconds a SQLite writer waits for another connection's lock before failing.
SQLITE_BUSY_TIMEOUT: Final = 5.0
#: Seconds between two opportunistic purges of expired SQLite rows.
SQLITE_PURGE_INTERVAL: Final = 60.0

_T = TypeVar("_T")

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
CREATE TABLE IF NOT EXISTS items (
    owner TEXT NOT NULL,
    item_id TEXT NOT NULL,
    response_id TEXT NOT NULL,
    PRIMARY KEY (owner, item_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS items_response_id ON items (response_id);
CREATE TABLE IF NOT EXISTS usage (
    response_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_owner ON usage (owner, created_at, response_id);
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS conversation_items (
    owner TEXT NOT NULL,
    item_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    PRIMARY KEY (owner, item_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    response_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL
);
"""
_PUT: Final = (
    "INSERT OR REPLACE INTO responses (id, owner, created_at, expires_at, data)"
    " VALUES (?, ?, ?, ?, ?)"
)
_VISIBLE: Final = "id = ? AND owner = ? AND (expires_at IS NULL OR expires_at > ?)"
_GET: Final = f"SELECT data FROM responses WHERE {_VISIBLE}"
_DELETE: Final = f"DELETE FROM responses WHERE {_VISIBLE}"
_PURGE: Final = "DELETE FROM responses WHERE expires_at IS NOT NULL AND expires_at <= ?"
_PUT_LEASE: Final = (
    "INSERT OR REPLACE INTO leases (response_id, holder, expires_at) VALUES (?, ?, ?)"
)
_RENEW_LEASE: Final = "UPDATE leases SET expires_at = ? WHERE response_id = ? AND holder = ?"
_DROP_LEASE: Final = "DELETE FROM leases WHERE response_id = ?"
_LEASE_HOLDER: Final = "SELECT holder FROM leases WHERE response_id = ?"
_EXPIRED_LEASES: Final = "SELECT response_id FROM leases WHERE expires_at <= ?"
_EXPIRED_LEASE: Final = "SELECT response_id FROM leases WHERE expires_at <= ? AND response_id = ?"
_UNEXPIRED: Final = (
    "SELECT data FROM responses WHERE id = ? AND (expires_at IS NULL OR expires_at > ?)"
)
_PURGE_LEASES: Final = (
    "DELETE FROM leases WHERE response_id IN"
    " (SELECT id FROM responses WHERE expires_at IS NOT NULL AND expires_at <= ?)"
)
_PUT_ITEM: Final = "INSERT OR REPLACE INTO items (owner, item_id, response_id) VALUES (?, ?, ?)"
_DELETE_ITEMS: Final = "DELETE FROM items WHERE response_id = ?"
_PURGE_ITEMS: Final = (
    "DELETE FROM items WHERE response_id IN"
    " (SELECT id FROM responses WHERE expires_at IS NOT NULL AND expires_at <= ?)"
)
#: Item ids looked up in one statement (well under SQLite's 32,766 variables).
_HOLDING_BATCH: Final = 500
_PUT_CONVERSATION: Final = "INSERT OR REPLACE INTO conversations (id, owner, data) VALUES (?, ?, ?)"
_GET_CONVERSATION: Final = "SELECT data FROM conversations WHERE id = ? AND owner = ?"
_DELETE_CONVERSATION: Final = "DELETE FROM conversations WHERE id = ? AND owner = ?"
_PUT_CONVERSATION_ITEM: Final = (
    "INSERT OR REPLACE INTO conversation_items (owner, item_id, conversation_id) VALUES (?, ?, ?)"
)
_PUT_USAGE: Final = (
    "INSERT OR REPLACE INTO usage (response_id, owner, created_at, data) VALUES (?, ?, ?, ?)"
)
# TEXT compares by its UTF-8 bytes, which orders as Python orders str.
_USAGE: Final = "SELECT data FROM usage ORDER BY created_at, response_id"
_USAGE_OF: Final = "SELECT data FROM usage WHERE owner = ? ORDER BY created_at, response_id"

# Checkpoints of append-mode rollouts (the module docstring). Rowid tables,
# not WITHOUT ROWID: their rows hold blobs of any size.
_CHECKPOINT_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS checkpoints (
    owner TEXT NOT NULL,
    response_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    expires_at REAL NOT NULL,
    state BLOB NOT NULL,
    PRIMARY KEY (owner, response_id)
);
CREATE INDEX IF NOT EXISTS checkpoints_expires_at ON checkpoints (expires_at);
CREATE TABLE IF NOT EXISTS checkpoint_items (
    owner TEXT NOT NULL,
    response_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (owner, response_id, position)
);
"""
_CHECKPOINT_KEY: Final = "owner = ? AND response_id = ?"
_CHECKPOINT_LIVE: Final = f"{_CHECKPOINT_KEY} AND expires_at > ?"
_CHECKPOINT_EPOCH: Final = f"SELECT epoch FROM checkpoints WHERE {_CHECKPOINT_KEY}"
_CHECKPOINT_LIVE_EPOCH: Final = f"SELECT epoch FROM checkpoints WHERE {_CHECKPOINT_LIVE}"
_CHECKPOINT_GET: Final = f"SELECT epoch, state FROM checkpoints WHERE {_CHECKPOINT_LIVE}"
_CHECKPOINT_PUT: Final = (
    "INSERT OR REPLACE INTO checkpoints (owner, response_id, epoch, expires_at, state)"
    " VALUES (?, ?, ?, ?, ?)"
)
_CHECKPOINT_UPDATE: Final = (
    f"UPDATE checkpoints SET epoch = ?, expires_at = ?, state = ? WHERE {_CHECKPOINT_KEY}"
)
_CHECKPOINT_DELETE: Final = f"DELETE FROM checkpoints WHERE {_CHECKPOINT_KEY}"
_CHECKPOINT_ITEMS: Final = (
    f"SELECT data FROM checkpoint_items WHERE {_CHECKPOINT_KEY} ORDER BY position"
)
# Positions run 0..n-1 (items are only cut from the end and appended), so the
# count is the last position plus one: one step down the primary key.
_CHECKPOINT_ITEM_COUNT: Final = (
    f"SELECT coalesce(max(position) + 1, 0) FROM checkpoint_items WHERE {_CHECKPOINT_KEY}"
)
_CHECKPOINT_DELETE_ITEMS: Final = f"DELETE FROM checkpoint_items WHERE {_CHECKPOINT_KEY}"
_CHECKPOINT_PUT_ITEM: Final = (
    "INSERT INTO checkpoint_items (owner, response_id, position, data) VALUES (?, ?, ?, ?)"
)
_CHECKPOINT_CUT_ITEMS: Final = (
    f"DELETE FROM checkpoint_items WHERE {_CHECKPOINT_KEY} AND position >= ?"
)
_CHECKPOINT_PURGE_ITEMS: Final = (
    "DELETE FROM checkpoint_items WHERE (owner, response_id) IN"
    " (SELECT owner, response_id FROM checkpoints WHERE expires_at <= ?)"
)
_CHECKPOINT_PURGE: Final = "DELETE FROM checkpoints WHERE expires_at <= ?"


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
        self.ttl = check_ttl(ttl)
        self._clock = clock
        self._last_purge = -math.inf
        self._last_checkpoint_purge = -math.inf
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
                db.executescript(_CHECKPOINT_SCHEMA)
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
        """Store ``record`` and its items' ids (one transaction: written whole or not at all);
        a background response's end drops its lease in it.

        Also deletes expired rows if the last purge is older than
        :data:`SQLITE_PURGE_INTERVAL`.
        """
        write = self._writer(record)

        def put() -> None:
            with self._transaction():
                write()

        await self._run(put)

    async def put_running(self, record: StoredResponse, *, holder: str, lease: float) -> None:
        """Store ``record`` and give ``holder`` its lease (one transaction)."""
        write = self._writer(record)
        row = (record.id, holder, self._clock() + lease)

        def put() -> None:
            with self._transaction():
                write()
                self._db.execute(_PUT_LEASE, row)

        await self._run(put)

    async def renew_leases(
        self, response_ids: Collection[str], *, holder: str, lease: float
    ) -> set[str]:
        """Extend ``holder``'s leases (one transaction); the ids it no longer holds."""
        until = self._clock() + lease
        wanted = list(dict.fromkeys(response_ids))

        def renew() -> set[str]:
            with self._transaction():
                return {
                    response_id
                    for response_id in wanted
                    if self._db.execute(_RENEW_LEASE, (until, response_id, holder)).rowcount == 0
                }

        return await self._run(renew) if wanted else set()

    async def take_expired(
        self, *, holder: str, lease: float, response_id: str | None = None
    ) -> list[StoredResponse]:
        """Take over the responses whose lease ran out (or only ``response_id``'s):
        a plain read first (nothing to take is the common case, and writes
        nothing), then one transaction that reads again and takes."""
        now = self._clock()
        query, args = (
            (_EXPIRED_LEASES, (now,))
            if response_id is None
            else (_EXPIRED_LEASE, (now, response_id))
        )

        def take() -> list[tuple[str, bytes | None]]:
            if not self._db.execute(query, args).fetchone():
                return []
            with self._transaction():
                expired = [row[0] for row in self._db.execute(query, args).fetchall()]
                found = []
                for candidate in expired:
                    self._db.execute(_PUT_LEASE, (candidate, holder, now + lease))
                    row = self._db.execute(_UNEXPIRED, (candidate, now)).fetchone()
                    found.append((candidate, None if row is None else bytes(row[0])))
                return found

        taken = []
        stale = []
        for candidate, blob in await self._run(take):
            record = None if blob is None else decode_record(blob)
            if record is not None and is_running(record):
                taken.append(record)
            else:  # ended, expired or deleted: nothing runs any more
                stale.append((candidate,))
        if stale:
            await self._run(lambda: self._db.executemany(_DROP_LEASE, stale))
        return taken

    async def put_held(self, record: StoredResponse, *, holder: str) -> bool:
        """Store ``record`` and drop its lease, only while ``holder`` holds it (one
        transaction)."""
        write = self._writer(record)

        def put() -> bool:
            with self._transaction():
                row = self._db.execute(_LEASE_HOLDER, (record.id,)).fetchone()
                if row is None or row[0] != holder:
                    return False
                write()
                self._db.execute(_DROP_LEASE, (record.id,))
                return True

        return await self._run(put)

    def _writer(self, record: StoredResponse) -> Callable[[], None]:
        """The statements that store ``record``, to run inside a transaction on the
        worker thread (and the purge, when one is due); encoded here, up front."""
        blob = encode_record(record)
        now = self._clock()
        expires_at = None if self.ttl is None else now + self.ttl
        row = (record.id, record.owner, record.created_at, expires_at, blob)
        purge = now - self._last_purge >= SQLITE_PURGE_INTERVAL
        if purge:
            self._last_purge = now
        items = [(record.owner, item_id, record.id) for item_id in set(held_item_ids(record))]
        drop_lease = lets_go(record)

        def write() -> None:
            self._db.execute(_PUT, row)
            self._db.executemany(_PUT_ITEM, items)
            if drop_lease:
                self._db.execute(_DROP_LEASE, (record.id,))
            if purge:
                self._purge(now)

        return write

    def _purge(self, now: float) -> None:
        """Delete expired response rows, their items' ids and their leases (in a transaction)."""
        self._db.execute(_PURGE_ITEMS, (now,))
        self._db.execute(_PURGE_LEASES, (now,))
        self._db.execute(_PURGE, (now,))

    async def get(self, response_id: str, *, owner: str) -> StoredResponse | None:
        """The record, or ``None`` if missing, expired or foreign."""
        args = (response_id, owner, self._clock())
        row = await self._run(lambda: self._db.execute(_GET, args).fetchone())
        return None if row is None else decode_record(row[0])

    async def delete(self, response_id: str, *, owner: str) -> bool:
        """Delete the record and its items' ids; ``False`` (and nothing deleted) if
        not visible to ``owner``."""
        args = (response_id, owner, self._clock())

        def delete() -> bool:
            with self._transaction():
                deleted: bool = self._db.execute(_DELETE, args).rowcount > 0
                if deleted:
                    self._db.execute(_DELETE_ITEMS, (response_id,))
                    self._db.execute(_DROP_LEASE, (response_id,))
            return deleted

        return await self._run(delete)

    async def holding(self, item_ids: Collection[str], *, owner: str) -> list[StoredResponse]:
        """The visible records of ``owner`` written last holding these item ids
        (the ``items`` table, joined to ``responses``)."""
        wanted = list(dict.fromkeys(item_ids))
        now = self._clock()

        def rows() -> list[tuple[bytes]]:
            found: dict[str, bytes] = {}
            for start in range(0, len(wanted), _HOLDING_BATCH):
                batch = wanted[start : start + _HOLDING_BATCH]
                marks = ", ".join("?" * len(batch))
                query = (
                    "SELECT r.id, r.data FROM items i JOIN responses r ON r.id = i.response_id"
                    f" WHERE i.owner = ? AND i.item_id IN ({marks}) AND r.owner = ?"
                    " AND (r.expires_at IS NULL OR r.expires_at > ?)"
                )
                for response_id, data in self._db.execute(query, (owner, *batch, owner, now)):
                    found[response_id] = data
            return [(data,) for data in found.values()]

        return [decode_record(blob) for (blob,) in await self._run(rows)]

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One transaction on the worker thread: committed whole, or rolled back."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    async def put_conversation(self, record: StoredConversation) -> None:
        """Store ``record`` and its items' ids (one transaction: whole or not at all)."""
        row = (record.id, record.owner, encode_record(record))
        items = [(record.owner, item_id, record.id) for item_id in conversation_item_ids(record)]

        def put() -> None:
            with self._transaction():
                self._db.execute(_PUT_CONVERSATION, row)
                self._db.executemany(_PUT_CONVERSATION_ITEM, items)

        await self._run(put)

    async def get_conversation(
        self, conversation_id: str, *, owner: str
    ) -> StoredConversation | None:
        """The conversation, or ``None`` if missing or foreign."""
        args = (conversation_id, owner)
        row = await self._run(lambda: self._db.execute(_GET_CONVERSATION, args).fetchone())
        return None if row is None else decode_conversation(row[0])

    async def delete_conversation(self, conversation_id: str, *, owner: str) -> bool:
        """Delete the conversation; ``False`` (and nothing deleted) if not ``owner``'s."""
        args = (conversation_id, owner)
        deleted: int = await self._run(
            lambda: self._db.execute(_DELETE_CONVERSATION, args).rowcount
        )
        return deleted > 0

    async def conversations_holding(
        self, item_ids: Collection[str], *, owner: str
    ) -> list[StoredConversation]:
        """The conversations of ``owner`` written last holding these item ids
        (the ``conversation_items`` table, joined to ``conversations``)."""
        wanted = list(dict.fromkeys(item_ids))

        def rows() -> list[bytes]:
            found: dict[str, bytes] = {}
            for start in range(0, len(wanted), _HOLDING_BATCH):
                batch = wanted[start : start + _HOLDING_BATCH]
                marks = ", ".join("?" * len(batch))
                query = (
                    "SELECT c.id, c.data FROM conversation_items i"
                    " JOIN conversations c ON c.id = i.conversation_id"
                    f" WHERE i.owner = ? AND i.item_id IN ({marks}) AND c.owner = ?"
                )
                for conversation_id, data in self._db.execute(query, (owner, *batch, owner)):
                    found[conversation_id] = data
            return list(found.values())

        return [decode_conversation(blob) for blob in await self._run(rows)]

    async def put_usage(self, record: UsageRecord) -> None:
        """Add ``record`` to the ``usage`` table (one statement: written whole or not at all)."""
        row = (record.response_id, record.owner, record.created_at, encode_record(record))
        await self._run(lambda: self._db.execute(_PUT_USAGE, row))

    async def usage(self, *, owner: str | None = None) -> list[UsageRecord]:
        """The ledger, or ``owner``'s part, by ``created_at`` then ``response_id``."""

        def rows() -> list[tuple[bytes]]:
            if owner is None:
                return self._db.execute(_USAGE).fetchall()
            return self._db.execute(_USAGE_OF, (owner,)).fetchall()

        return [decode_usage(blob) for (blob,) in await self._run(rows)]

    async def purge_expired(self) -> int:
        """Delete every expired response and checkpoint (never a ledger row); the
        number deleted (responses and checkpoints, not counting their items)."""
        now = self._clock()
        self._last_purge = now

        def purge() -> int:
            with self._transaction():
                self._db.execute(_PURGE_ITEMS, (now,))
                self._db.execute(_PURGE_LEASES, (now,))
                purged: int = self._db.execute(_PURGE, (now,)).rowcount
                purged += self._purge_checkpoints(now)
            return purged

        return await self._run(purge)

    # --- checkpoints (ResponseStore.checkpoint_*; the module docstring) ---------

    async def checkpoint_open(
        self, response_id: str, *, owner: str, state: bytes, items: Sequence[bytes], ttl: float
    ) -> int:
        """A new checkpoint replacing any of that id and owner (its rows and items),
        in one transaction; its epoch.

        Also deletes expired checkpoints if the last sweep is older than
        :data:`SQLITE_PURGE_INTERVAL`.
        """
        check_checkpoint_args(ttl)
        now = self._clock()
        key = (owner, response_id)
        rows = [(owner, response_id, position, blob) for position, blob in enumerate(items)]
        purge = now - self._last_checkpoint_purge >= SQLITE_PURGE_INTERVAL
        if purge:
            self._last_checkpoint_purge = now

        def open_checkpoint() -> int:
            with self._transaction():
                if purge:
                    self._purge_checkpoints(now)
                replaced = self._db.execute(_CHECKPOINT_EPOCH, key).fetchone()
                epoch: int = 1 if replaced is None else replaced[0] + 1
                self._db.execute(_CHECKPOINT_DELETE_ITEMS, key)
                self._db.execute(_CHECKPOINT_PUT, (*key, epoch, now + ttl, state))
                self._db.executemany(_CHECKPOINT_PUT_ITEM, rows)
            return epoch

        return await self._run(open_checkpoint)

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
        """If still ``epoch``: delete the item rows from ``keep`` on, insert the new
        ones after them, update the state and ``expires_at``; one transaction."""
        check_checkpoint_args(ttl, keep)
        now = self._clock()
        key = (owner, response_id)
        rows = [(owner, response_id, keep + n, blob) for n, blob in enumerate(items)]

        def write() -> bool:
            with self._transaction():
                stored = self._db.execute(_CHECKPOINT_LIVE_EPOCH, (*key, now)).fetchone()
                if stored is None or stored[0] != epoch:
                    return False
                (count,) = self._db.execute(_CHECKPOINT_ITEM_COUNT, key).fetchone()
                if keep > count:
                    raise keep_beyond_items(keep, response_id)  # rolled back: nothing written
                if keep < count:
                    self._db.execute(_CHECKPOINT_CUT_ITEMS, (*key, keep))
                self._db.executemany(_CHECKPOINT_PUT_ITEM, rows)
                self._db.execute(_CHECKPOINT_UPDATE, (epoch, now + ttl, state, *key))
            return True

        return await self._run(write)

    async def checkpoint_take(
        self, response_id: str, *, owner: str, ttl: float
    ) -> CheckpointState | None:
        """Bump the epoch and ``expires_at`` and read the checkpoint back, in one
        transaction (two processes taking it run one after the other)."""
        check_checkpoint_args(ttl)
        now = self._clock()
        key = (owner, response_id)

        def take() -> CheckpointState | None:
            with self._transaction():
                stored = self._db.execute(_CHECKPOINT_GET, (*key, now)).fetchone()
                if stored is None:
                    return None
                epoch, state = stored[0] + 1, stored[1]
                self._db.execute(_CHECKPOINT_UPDATE, (epoch, now + ttl, state, *key))
                items = [blob for (blob,) in self._db.execute(_CHECKPOINT_ITEMS, key)]
            return CheckpointState(
                response_id=response_id, owner=owner, epoch=epoch, state=state, items=items
            )

        return await self._run(take)

    async def checkpoint_read(self, response_id: str, *, owner: str) -> CheckpointState | None:
        """The checkpoint, read in one snapshot (a deferred transaction: WAL keeps
        a writer's commit out of it)."""
        now = self._clock()
        key = (owner, response_id)

        def read() -> CheckpointState | None:
            with self._snapshot():
                stored = self._db.execute(_CHECKPOINT_GET, (*key, now)).fetchone()
                if stored is None:
                    return None
                items = [blob for (blob,) in self._db.execute(_CHECKPOINT_ITEMS, key)]
            return CheckpointState(
                response_id=response_id, owner=owner, epoch=stored[0], state=stored[1], items=items
            )

        return await self._run(read)

    async def checkpoint_delete(
        self, response_id: str, *, owner: str, epoch: int | None = None
    ) -> bool:
        """Delete the checkpoint row and its items (only if still ``epoch``, when given)."""
        now = self._clock()
        key = (owner, response_id)

        def delete() -> bool:
            with self._transaction():
                stored = self._db.execute(_CHECKPOINT_LIVE_EPOCH, (*key, now)).fetchone()
                if stored is None or (epoch is not None and stored[0] != epoch):
                    return False
                self._db.execute(_CHECKPOINT_DELETE_ITEMS, key)
                self._db.execute(_CHECKPOINT_DELETE, key)
            return True

        return await self._run(delete)

    def _purge_checkpoints(self, now: float) -> int:
        """Delete expired checkpoints and their items (on the worker thread, inside
        a transaction); the number of checkpoints deleted."""
        self._db.execute(_CHECKPOINT_PURGE_ITEMS, (now,))
        purged: int = self._db.execute(_CHECKPOINT_PURGE, (now,)).rowcount
        return purged

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[None]:
        """One read transaction on the worker thread: its reads see one state of the file."""
        self._db.execute("BEGIN")
        try:
            yield
        finally:
            self._db.execute("COMMIT")

    async def ping(self) -> None:
        """One read of the file (raises :class:`StoreError` if it fails)."""
        await self._run(lambda: self._db.execute("SELECT 1 FROM usage LIMIT 1").fetchone())

    async def secret(self, name: str, candidate: bytes) -> bytes:
        """The secret ``name`` in the ``secrets`` table; ``candidate`` if none was kept
        (``INSERT OR IGNORE``: the first process on the file wins)."""

        def get_or_put() -> bytes:
            self._db.execute(
                "INSERT OR IGNORE INTO secrets (name, value) VALUES (?, ?)", (name, candidate)
            )
            row = self._db.execute("SELECT value FROM secrets WHERE name = ?", (name,)).fetchone()
            return bytes(row[0])

        return await self._run(get_or_put)

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
