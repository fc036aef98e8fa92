"""The checkpoint part of the store contract, on every backend (memory, SQLite, Redis).

A checkpoint is what an append-mode rollout keeps at a pause: an epoch, a
state blob and its context items. These tests hold every backend to it: a
write keeps ``keep`` items and appends the new ones, a take moves the epoch on
and refuses the earlier holder's writes, it expires ``ttl`` seconds after the
last open, write or take, another owner never sees or changes it, and two
stores on one SQLite file or one Redis (as two processes) racing to take it
end with exactly one holder. The backend-specific tests look at the rows and
keys to show that a write appends the new items and leaves the kept ones
untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis.asyncio

from longresponse.storage.backends import (
    SQLITE_PURGE_INTERVAL,
    CheckpointState,
    MemoryStore,
    RedisStore,
    ResponseStore,
    SQLiteStore,
)
from longresponse.storage.persistence import Persistence
from longresponse.storage.redis_store import (
    REDIS_CHECKPOINT_ITEMS_PREFIX,
    REDIS_CHECKPOINT_PREFIX,
)
from tests.storage.test_store import Backend, FakeClock, on_asyncio
from tests.storage.test_store import backend as backend  # the fixtures, on every backend
from tests.storage.test_store import shared_backend as shared_backend

#: A ttl no test outlives.
LONG = 600.0


def new_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def new_owner() -> str:
    return uuid.uuid4().hex  # a digest, as keys.py makes them


def blobs(*names: str) -> list[bytes]:
    return [name.encode() for name in names]


async def items_of(store: ResponseStore, response_id: str, owner: str) -> list[bytes] | None:
    state = await store.checkpoint_read(response_id, owner=owner)
    return None if state is None else state.items


# --- the contract, on every backend -----------------------------------------


@on_asyncio
async def test_open_read_take_round_trip(backend: Backend) -> None:
    rid, owner = new_id(), new_owner()
    async with contextlib.aclosing(backend.open()) as store:
        assert await store.checkpoint_read(rid, owner=owner) is None
        assert await store.checkpoint_take(rid, owner=owner, ttl=LONG) is None
        epoch = await store.checkpoint_open(
            rid, owner=owner, state=b"s1", items=blobs("a", "b\x00\xff"), ttl=LONG
        )
        assert epoch == 1
        opened = CheckpointState(
            response_id=rid, owner=owner, epoch=1, state=b"s1", items=blobs("a", "b\x00\xff")
        )
        assert await store.checkpoint_read(rid, owner=owner) == opened
        assert await store.checkpoint_read(rid, owner=owner) == opened  # reading takes nothing
        taken = await store.checkpoint_take(rid, owner=owner, ttl=LONG)
        assert taken == CheckpointState(
            response_id=rid, owner=owner, epoch=2, state=b"s1", items=blobs("a", "b\x00\xff")
        )
        assert await store.checkpoint_read(rid, owner=owner) == taken


@on_asyncio
async def test_write_keeps_then_appends_and_replaces_the_state(backend: Backend) -> None:
    rid, owner = new_id(), new_owner()
    async with contextlib.aclosing(backend.open()) as store:
        epoch = await store.checkpoint_open(rid, owner=owner, state=b"", items=[], ttl=LONG)

        async def write(keep: int, *names: str, state: bytes = b"s") -> bool:
            return await store.checkpoint_write(
                rid, owner=owner, epoch=epoch, state=state, keep=keep, items=blobs(*names), ttl=LONG
            )

        assert await write(0, "a", "b")
        assert await items_of(store, rid, owner) == blobs("a", "b")
        assert await write(2, "c", state=b"after c")  # a pause: keep all, append one
        read = await store.checkpoint_read(rid, owner=owner)
        assert read is not None
        assert (read.epoch, read.state, read.items) == (epoch, b"after c", blobs("a", "b", "c"))
        assert await write(1, "d", "e")  # keep < stored: the rest dropped, then appended
        assert await items_of(store, rid, owner) == blobs("a", "d", "e")
        assert await write(3, state=b"state only")  # nothing to append
        read = await store.checkpoint_read(rid, owner=owner)
        assert read is not None
        assert (read.state, read.items) == (b"state only", blobs("a", "d", "e"))
        assert await write(0)  # everything dropped
        assert await items_of(store, rid, owner) == []
        assert await write(0, "f")
        assert await items_of(store, rid, owner) == blobs("f")


@on_asyncio
async def test_a_bad_keep_or_ttl_writes_nothing(backend: Backend) -> None:
    rid, owner = new_id(), new_owner()
    async with contextlib.aclosing(backend.open()) as store:
        epoch = await store.checkpoint_open(rid, owner=owner, state=b"s", items=[b"a"], ttl=LONG)
        before = await store.checkpoint_read(rid, owner=owner)
        for keep in (2, 50, -1):
            with pytest.raises(ValueError, match="keep"):
                await store.checkpoint_write(
                    rid, owner=owner, epoch=epoch, state=b"x", keep=keep, items=[b"b"], ttl=LONG
                )
        for ttl in (0, -1.0, math.nan, math.inf):
            with pytest.raises(ValueError, match="ttl"):
                await store.checkpoint_write(
                    rid, owner=owner, epoch=epoch, state=b"x", keep=1, items=[b"b"], ttl=ttl
                )
            with pytest.raises(ValueError, match="ttl"):
                await store.checkpoint_take(rid, owner=owner, ttl=ttl)
            with pytest.raises(ValueError, match="ttl"):
                await store.checkpoint_open(rid, owner=owner, state=b"x", items=[], ttl=ttl)
        assert await store.checkpoint_read(rid, owner=owner) == before


@on_asyncio
async def test_a_take_refuses_the_earlier_holder(backend: Backend) -> None:
    rid, owner = new_id(), new_owner()
    async with contextlib.aclosing(backend.open()) as store:
        first = await store.checkpoint_open(rid, owner=owner, state=b"s1", items=[b"a"], ttl=LONG)
        taken = await store.checkpoint_take(rid, owner=owner, ttl=LONG)
        assert taken is not None
        assert taken.epoch == first + 1
        # The earlier holder writes nothing, deletes nothing.
        assert not await store.checkpoint_write(
            rid, owner=owner, epoch=first, state=b"stale", keep=0, items=[b"z"], ttl=LONG
        )
        assert not await store.checkpoint_delete(rid, owner=owner, epoch=first)
        assert await store.checkpoint_read(rid, owner=owner) == taken
        # The new holder writes.
        assert await store.checkpoint_write(
            rid, owner=owner, epoch=taken.epoch, state=b"s2", keep=1, items=[b"b"], ttl=LONG
        )
        again = await store.checkpoint_take(rid, owner=owner, ttl=LONG)
        assert again is not None
        assert (again.epoch, again.state, again.items) == (taken.epoch + 1, b"s2", blobs("a", "b"))
        assert not await store.checkpoint_write(
            rid, owner=owner, epoch=taken.epoch, state=b"x", keep=2, items=[], ttl=LONG
        )


@on_asyncio
async def test_delete(backend: Backend) -> None:
    rid, owner = new_id(), new_owner()
    async with contextlib.aclosing(backend.open()) as store:
        assert not await store.checkpoint_delete(rid, owner=owner)
        epoch = await store.checkpoint_open(rid, owner=owner, state=b"s", items=[b"a"], ttl=LONG)
        assert not await store.checkpoint_delete(rid, owner=owner, epoch=epoch + 1)
        assert await store.checkpoint_delete(rid, owner=owner, epoch=epoch)
        assert await store.checkpoint_read(rid, owner=owner) is None
        assert await store.checkpoint_take(rid, owner=owner, ttl=LONG) is None
        assert not await store.checkpoint_write(
            rid, owner=owner, epoch=epoch, state=b"s", keep=0, items=[b"b"], ttl=LONG
        )
        assert not await store.checkpoint_delete(rid, owner=owner, epoch=epoch)
        await store.checkpoint_open(rid, owner=owner, state=b"s", items=[], ttl=LONG)
        assert await store.checkpoint_delete(rid, owner=owner)  # any epoch
        assert not await store.checkpoint_delete(rid, owner=owner)


@on_asyncio
async def test_open_replaces_and_fences_the_replaced_one(backend: Backend) -> None:
    rid, owner = new_id(), new_owner()
    async with contextlib.aclosing(backend.open()) as store:
        old = await store.checkpoint_open(rid, owner=owner, state=b"old", items=[b"a"], ttl=LONG)
        new = await store.checkpoint_open(rid, owner=owner, state=b"new", items=[b"b"], ttl=LONG)
        assert new == old + 1
        assert await store.checkpoint_read(rid, owner=owner) == CheckpointState(
            response_id=rid, owner=owner, epoch=new, state=b"new", items=[b"b"]
        )
        assert not await store.checkpoint_write(
            rid, owner=owner, epoch=old, state=b"x", keep=1, items=[b"c"], ttl=LONG
        )


@on_asyncio
async def test_many_items_in_one_call(backend: Backend) -> None:
    rid, owner = new_id(), new_owner()
    first = [f"item {n}".encode() for n in range(2_500)]
    more = [f"more {n}".encode() for n in range(2_345)]
    async with contextlib.aclosing(backend.open()) as store:
        epoch = await store.checkpoint_open(rid, owner=owner, state=b"s", items=first, ttl=LONG)
        assert await store.checkpoint_write(
            rid, owner=owner, epoch=epoch, state=b"s", keep=2_000, items=more, ttl=LONG
        )
        assert await items_of(store, rid, owner) == first[:2_000] + more


@on_asyncio
async def test_expiry_counts_from_the_last_open_write_or_take(backend: Backend) -> None:
    rid, owner = new_id(), new_owner()
    async with contextlib.aclosing(backend.open()) as store:
        epoch = await store.checkpoint_open(rid, owner=owner, state=b"s", items=[b"a"], ttl=0.5)
        await backend.elapse(0.3)
        taken = await store.checkpoint_take(rid, owner=owner, ttl=LONG)  # refreshed
        assert taken is not None
        epoch = taken.epoch
        await backend.elapse(0.3)  # past the first deadline
        assert await items_of(store, rid, owner) == [b"a"]
        assert await store.checkpoint_write(
            rid, owner=owner, epoch=epoch, state=b"s", keep=1, items=[b"b"], ttl=0.2
        )
        await backend.elapse(0.25)
        assert await store.checkpoint_read(rid, owner=owner) is None
        assert await store.checkpoint_take(rid, owner=owner, ttl=LONG) is None
        assert not await store.checkpoint_write(
            rid, owner=owner, epoch=epoch, state=b"s", keep=0, items=[], ttl=LONG
        )
        assert not await store.checkpoint_delete(rid, owner=owner)
        # Opened again: a new checkpoint, none of the expired one's items.
        await store.checkpoint_open(rid, owner=owner, state=b"t", items=[b"c"], ttl=LONG)
        assert await items_of(store, rid, owner) == [b"c"]


@on_asyncio
async def test_another_owner_neither_sees_nor_changes_it(backend: Backend) -> None:
    rid, alice, mallory = new_id(), new_owner(), new_owner()
    async with contextlib.aclosing(backend.open()) as store:
        epoch = await store.checkpoint_open(rid, owner=alice, state=b"s", items=[b"a"], ttl=LONG)
        mine = await store.checkpoint_read(rid, owner=alice)
        assert await store.checkpoint_read(rid, owner=mallory) is None
        assert await store.checkpoint_take(rid, owner=mallory, ttl=LONG) is None
        assert await store.checkpoint_read(rid, owner="") is None
        assert not await store.checkpoint_write(
            rid, owner=mallory, epoch=epoch, state=b"x", keep=0, items=[b"x"], ttl=LONG
        )
        assert not await store.checkpoint_delete(rid, owner=mallory)
        assert not await store.checkpoint_delete(rid, owner=mallory, epoch=epoch)
        assert await store.checkpoint_read(rid, owner=alice) == mine  # epoch not bumped either
        # Her own checkpoint of the same id is hers alone.
        theirs = await store.checkpoint_open(rid, owner=mallory, state=b"m", items=[], ttl=LONG)
        assert theirs == 1
        assert await store.checkpoint_read(rid, owner=alice) == mine
        assert await store.checkpoint_delete(rid, owner=mallory)
        assert await store.checkpoint_read(rid, owner=alice) == mine


# --- two stores on one backend, as two processes -------------------------------


@on_asyncio
async def test_two_stores_racing_to_take_leave_one_holder(shared_backend: Backend) -> None:
    rid, owner = new_id(), new_owner()
    async with (
        contextlib.aclosing(shared_backend.open()) as first,
        contextlib.aclosing(shared_backend.open()) as second,
    ):
        await first.checkpoint_open(rid, owner=owner, state=b"s", items=[b"a"], ttl=LONG)
        for _ in range(20):
            one, two = await asyncio.gather(
                first.checkpoint_take(rid, owner=owner, ttl=LONG),
                second.checkpoint_take(rid, owner=owner, ttl=LONG),
            )
            assert one is not None
            assert two is not None
            assert abs(one.epoch - two.epoch) == 1
            wrote = await asyncio.gather(
                *(
                    store.checkpoint_write(
                        rid, owner=owner, epoch=held.epoch, state=b"s", keep=1, items=[], ttl=LONG
                    )
                    for store, held in ((first, one), (second, two))
                )
            )
            assert wrote == [one.epoch > two.epoch, two.epoch > one.epoch]


@on_asyncio
async def test_interleaved_holders_never_lose_a_landed_write(shared_backend: Backend) -> None:
    """Each of two stores takes the checkpoint and appends one item, over and over.

    A write that landed after another store had taken the checkpoint would cut
    off what that one appended (it keeps as many items as it saw when it
    took); so the items left are exactly the writes that returned ``True``.
    """
    rid, owner = new_id(), new_owner()

    async def holder(store: ResponseStore, name: str) -> list[bytes]:
        landed = []
        for n in range(25):
            held = await store.checkpoint_take(rid, owner=owner, ttl=LONG)
            assert held is not None
            marker = f"{name} {n}".encode()
            if await store.checkpoint_write(
                rid,
                owner=owner,
                epoch=held.epoch,
                state=marker,
                keep=len(held.items),
                items=[marker],
                ttl=LONG,
            ):
                landed.append(marker)
        return landed

    async with (
        contextlib.aclosing(shared_backend.open()) as first,
        contextlib.aclosing(shared_backend.open()) as second,
    ):
        await first.checkpoint_open(rid, owner=owner, state=b"", items=[], ttl=LONG)
        mine, theirs = await asyncio.gather(holder(first, "one"), holder(second, "two"))
        final = await first.checkpoint_read(rid, owner=owner)
        assert final is not None
        assert final.epoch == 1 + 50
        assert sorted(final.items) == sorted(mine + theirs)
        assert final.items[-1] == final.state


_CHILD_TAKER = """
import asyncio, json, sys
from longresponse.storage.backends import SQLiteStore

path, rid, owner, name, rounds = sys.argv[1:6]

async def main():
    store = SQLiteStore(path)
    landed, epochs = [], []
    try:
        for n in range(int(rounds)):
            held = await store.checkpoint_take(rid, owner=owner, ttl=600)
            marker = f"{name} {n}"
            epochs.append(held.epoch)
            if await store.checkpoint_write(
                rid, owner=owner, epoch=held.epoch, state=marker.encode(),
                keep=len(held.items), items=[marker.encode()], ttl=600,
            ):
                landed.append(marker)
    finally:
        await store.aclose()
    print(json.dumps({"landed": landed, "epochs": epochs}))

asyncio.run(main())
"""


@on_asyncio
async def test_sqlite_processes_racing_to_take_leave_one_holder(tmp_path: Path) -> None:
    """Two real processes on one file: every take gets an epoch of its own, and
    the items left are exactly the writes that landed (see the test above)."""
    path, rid, owner, rounds = tmp_path / "responses.db", new_id(), new_owner(), 40
    async with contextlib.aclosing(SQLiteStore(path)) as store:
        await store.checkpoint_open(rid, owner=owner, state=b"", items=[], ttl=LONG)
        children = [
            await asyncio.create_subprocess_exec(
                sys.executable, "-c", _CHILD_TAKER, str(path), rid, owner, name, str(rounds),
                stdout=subprocess.PIPE,
            )
            for name in ("one", "two")
        ]  # fmt: skip
        outputs = await asyncio.wait_for(asyncio.gather(*(c.communicate() for c in children)), 60)
        assert [child.returncode for child in children] == [0, 0]
        results = [json.loads(stdout) for stdout, _ in outputs]
        epochs = [epoch for result in results for epoch in result["epochs"]]
        assert sorted(epochs) == list(range(2, 2 + 2 * rounds))  # each take its own epoch
        final = await store.checkpoint_read(rid, owner=owner)
        assert final is not None
        assert final.epoch == 1 + 2 * rounds
        landed = [marker.encode() for result in results for marker in result["landed"]]
        assert sorted(final.items) == sorted(landed)
        assert final.items[-1] == final.state


# --- SQLite --------------------------------------------------------------------


def item_rows(path: Path, rid: str) -> list[tuple[int, int, bytes]]:
    """(rowid, position, blob) of the checkpoint's item rows, by position."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(
            "SELECT rowid, position, data FROM checkpoint_items WHERE response_id = ?"
            " ORDER BY position",
            (rid,),
        ).fetchall()


@on_asyncio
async def test_sqlite_write_appends_without_rewriting(tmp_path: Path) -> None:
    path, rid, owner = tmp_path / "responses.db", new_id(), new_owner()
    turns = [f"turn {n}".encode() * 100 for n in range(50)]
    async with contextlib.aclosing(SQLiteStore(path)) as store:
        epoch = await store.checkpoint_open(rid, owner=owner, state=b"s", items=turns, ttl=LONG)
        before = item_rows(path, rid)
        assert len(before) == 50
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            # Changed behind the store's back: a rewrite would put it back.
            db.execute(
                "UPDATE checkpoint_items SET data = ? WHERE response_id = ? AND position = 0",
                (b"untouched", rid),
            )
        assert await store.checkpoint_write(
            rid, owner=owner, epoch=epoch, state=b"s", keep=50, items=[b"turn 50"], ttl=LONG
        )
        after = item_rows(path, rid)
        assert len(after) == 51
        assert after[0] == (before[0][0], 0, b"untouched")
        assert after[1:50] == before[1:50]  # the same rows: same rowids, same blobs
        assert after[50][1:] == (50, b"turn 50")
        assert await store.checkpoint_write(
            rid, owner=owner, epoch=epoch, state=b"s", keep=49, items=[b"again"], ttl=LONG
        )
        cut = item_rows(path, rid)
        assert len(cut) == 50
        assert cut[1:49] == before[1:49]
        assert cut[49][1:] == (49, b"again")


@on_asyncio
async def test_sqlite_checkpoints_expire_and_are_swept(tmp_path: Path) -> None:
    path, clock, owner = tmp_path / "responses.db", FakeClock(), new_owner()

    def rows() -> tuple[int, int]:
        with contextlib.closing(sqlite3.connect(path)) as db:
            (checkpoints,) = db.execute("SELECT count(*) FROM checkpoints").fetchone()
            (items,) = db.execute("SELECT count(*) FROM checkpoint_items").fetchone()
        return checkpoints, items

    async with contextlib.aclosing(SQLiteStore(path, clock=clock)) as store:
        old, newer, last = new_id(), new_id(), new_id()
        await store.checkpoint_open(old, owner=owner, state=b"s", items=[b"a", b"b"], ttl=1.0)
        clock.now += 2.0
        assert await store.checkpoint_read(old, owner=owner) is None
        assert rows() == (1, 2)  # hidden, not yet deleted
        await store.checkpoint_open(newer, owner=owner, state=b"s", items=[b"c"], ttl=1.0)
        assert rows() == (2, 3)  # the last sweep is too recent to run another
        clock.now += SQLITE_PURGE_INTERVAL
        await store.checkpoint_open(last, owner=owner, state=b"s", items=[b"d"], ttl=LONG)
        assert rows() == (1, 1)  # swept with this open
        clock.now += LONG
        assert await store.purge_expired() == 1
        assert rows() == (0, 0)


@on_asyncio
async def test_sqlite_file_without_checkpoint_tables_gets_them(tmp_path: Path) -> None:
    path, rid, owner = tmp_path / "responses.db", new_id(), new_owner()
    async with contextlib.aclosing(SQLiteStore(path)):
        pass
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("DROP TABLE checkpoints")  # as a file written before checkpoints existed
        db.execute("DROP TABLE checkpoint_items")
    async with contextlib.aclosing(SQLiteStore(path)) as store:
        assert await store.checkpoint_read(rid, owner=owner) is None
        assert await store.checkpoint_open(rid, owner=owner, state=b"s", items=[b"a"], ttl=LONG)
    async with contextlib.aclosing(SQLiteStore(path)) as store:  # and keeps them
        assert await items_of(store, rid, owner) == [b"a"]


# --- Redis ---------------------------------------------------------------------


@on_asyncio
async def test_redis_write_appends_without_rewriting(redis_url: str) -> None:
    rid, owner = new_id(), new_owner()
    state_key = f"longresponse:checkpoint:{owner}:{rid}"
    items_key = f"longresponse:checkpoint_items:{owner}:{rid}"
    assert (state_key, items_key) == (
        REDIS_CHECKPOINT_PREFIX + f"{owner}:{rid}",
        REDIS_CHECKPOINT_ITEMS_PREFIX + f"{owner}:{rid}",
    )
    turns = [f"turn {n}".encode() for n in range(50)]
    async with (
        contextlib.aclosing(RedisStore(redis_url)) as store,
        contextlib.aclosing(redis.asyncio.Redis.from_url(redis_url)) as raw,
    ):
        epoch = await store.checkpoint_open(rid, owner=owner, state=b"s", items=turns, ttl=60)
        assert await raw.hgetall(state_key) == {b"epoch": b"1", b"state": b"s", b"length": b"50"}
        assert await raw.llen(items_key) == 50
        await raw.lset(items_key, 0, b"untouched")  # a rewrite would put it back
        assert await store.checkpoint_write(
            rid, owner=owner, epoch=epoch, state=b"t", keep=50, items=[b"turn 50"], ttl=120
        )
        assert await raw.llen(items_key) == 51
        assert await raw.lrange(items_key, 0, -1) == [b"untouched", *turns[1:], b"turn 50"]
        for key in (state_key, items_key):  # the expiry of both, refreshed together
            assert 119_000 < await raw.pttl(key) <= 120_000
        assert await store.checkpoint_delete(rid, owner=owner)
        assert await raw.exists(state_key, items_key) == 0


@on_asyncio
async def test_redis_a_checkpoint_missing_items_counts_as_gone(redis_url: str) -> None:
    """One key evicted without the other (``maxmemory``): not a checkpoint with
    its context silently cut short."""
    rid, owner = new_id(), new_owner()
    async with (
        contextlib.aclosing(RedisStore(redis_url)) as store,
        contextlib.aclosing(redis.asyncio.Redis.from_url(redis_url)) as raw,
    ):
        epoch = await store.checkpoint_open(rid, owner=owner, state=b"s", items=[b"a"], ttl=60)
        await raw.delete(REDIS_CHECKPOINT_ITEMS_PREFIX + f"{owner}:{rid}")
        assert await store.checkpoint_read(rid, owner=owner) is None
        assert await store.checkpoint_take(rid, owner=owner, ttl=60) is None
        assert not await store.checkpoint_write(
            rid, owner=owner, epoch=epoch, state=b"s", keep=0, items=[b"b"], ttl=60
        )


# --- Persistence -----------------------------------------------------------------


@on_asyncio
async def test_persistence_passes_checkpoints_through_and_counts_them() -> None:
    rid, owner = new_id(), new_owner()
    persistence = Persistence(MemoryStore())
    epoch = await persistence.checkpoint_open(
        rid, owner=owner, state=b"st", items=[b"abc", b"de"], ttl=LONG
    )
    assert await persistence.checkpoint_write(
        rid, owner=owner, epoch=epoch, state=b"s", keep=2, items=[b"f"], ttl=LONG
    )
    taken = await persistence.checkpoint_take(rid, owner=owner, ttl=LONG)
    assert taken is not None
    assert not await persistence.checkpoint_write(
        rid, owner=owner, epoch=epoch, state=b"lost", keep=0, items=[b"lost"], ttl=LONG
    )
    assert await persistence.checkpoint_read(rid, owner=owner) == taken
    assert taken.items == [b"abc", b"de", b"f"]
    assert (persistence.checkpoints_written, persistence.checkpoint_bytes) == (2, 7 + 2)
    assert persistence.checkpoint_seconds > 0
    assert await persistence.checkpoint_delete(rid, owner=owner, epoch=taken.epoch)
    assert await persistence.checkpoint_read(rid, owner=owner) is None
