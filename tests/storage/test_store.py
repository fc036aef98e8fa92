"""The response stores: one contract, run against every backend.

Memory and SQLite measure the ttl on a fake clock, so their expiry tests do
not wait. Redis expires keys on its own clock, so its expiry test waits the
(short) ttl for real. Redis is a real ``redis-server`` (tests/support/redis_server.py).

The Redis usage ledger is one hash shared by the whole run, so each ledger
test writes under owners of its own (:func:`new_owner`) and looks only at its
own entries when it lists the whole ledger.

The stores are asyncio code while the suite runs in pytest-trio's trio mode:
each test is a plain function that runs its scenario with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import math
import random
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, ParamSpec

import msgspec
import pytest
import redis.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from longresponse.storage.backends import (
    REDIS_KEY_PREFIX,
    REDIS_USAGE_KEY,
    SQLITE_PURGE_INTERVAL,
    MemoryStore,
    RedisStore,
    ResponseStore,
    SQLiteStore,
    StoredResponse,
    StoreError,
    UsageRecord,
    open_store,
)
from protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    FunctionTool,
    InputText,
    Message,
    OutputText,
    Reasoning,
    SummaryText,
)
from protocol.response import InputTokensDetails, OutputTokensDetails, Response, Usage

P = ParamSpec("P")

TTL = 0.2


def on_asyncio(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Run an ``async def`` test on a fresh asyncio loop (the suite's own mode is trio)."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class Backend:
    name: str
    #: A new store on this backend (same file / same server on every call).
    open: Callable[..., ResponseStore]
    #: Let ``seconds`` pass as the backend's ttl sees it.
    elapse: Callable[[float], Coroutine[Any, Any, None]]


def _backend(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    clock = FakeClock()

    async def advance(seconds: float) -> None:
        clock.now += seconds

    if name == "memory":
        return Backend(name, lambda ttl=None: MemoryStore(ttl=ttl, clock=clock), advance)
    if name == "sqlite":
        path = tmp_path / "responses.db"
        return Backend(name, lambda ttl=None: SQLiteStore(path, ttl=ttl, clock=clock), advance)
    url = request.getfixturevalue("redis_url")
    return Backend(name, lambda ttl=None: RedisStore(url, ttl=ttl), asyncio.sleep)


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.services)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return _backend(request.param, request, tmp_path)


@pytest.fixture(params=["sqlite", "redis"])
def shared_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A backend whose separate store instances (as separate processes) share records."""
    return _backend(request.param, request, tmp_path)


def new_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def make_record(
    response_id: str | None = None,
    *,
    owner: str = "alice",
    text: str = "The answer is 42.",
    created_at: float = 1_700_000_000.25,
    output_tokens: int = 7,
    metadata: dict[str, str] | None = None,
    previous_response_id: str | None = None,
) -> StoredResponse:
    """A completed response with every kind of output item, usage and tools."""
    response_id = response_id or new_id()
    response = Response(
        id=response_id,
        created_at=int(created_at),
        completed_at=int(created_at) + 1,
        status="completed",
        model="sim",
        instructions="Be brief.",
        previous_response_id=previous_response_id,
        output=[
            Reasoning(id="rs_1", summary=[SummaryText(text="thinking")], encrypted_content=None),
            FunctionCall(
                id="fc_1", call_id="call_1", name="lookup", arguments='{"q": 1}', status="completed"
            ),
            Message(
                id="msg_2",
                role="assistant",
                content=[OutputText(text=text)],
                status="completed",
                phase="final_answer",
            ),
        ],
        tools=[FunctionTool(name="lookup", parameters={"type": "object"}, strict=True)],
        usage=Usage(
            input_tokens=11,
            input_tokens_details=InputTokensDetails(cached_tokens=3),
            output_tokens=output_tokens,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=2),
            total_tokens=11 + output_tokens,
        ),
        metadata=metadata if metadata is not None else {"run": "1"},
    )
    return StoredResponse(
        id=response_id,
        owner=owner,
        created_at=created_at,
        response=response,
        input_items=[
            Message(id="msg_0", role="user", content=[InputText(text="What is it?")]),
            FunctionCallOutput(id="fco_0", call_id="call_0", output="42"),
        ],
        previous_response_id=previous_response_id,
    )


def new_owner() -> str:
    return f"acct_{uuid.uuid4().hex}"


def make_usage(
    response_id: str | None = None,
    *,
    owner: str,
    created_at: float = 1_700_000_000.25,
    input_tokens: int = 11,
    output_tokens: int = 7,
    transport: str = "ws",
) -> UsageRecord:
    return UsageRecord(
        response_id=response_id or new_id(),
        owner=owner,
        model="sim",
        input_tokens=input_tokens,
        cached_tokens=3,
        output_tokens=output_tokens,
        created_at=created_at,
        transport=transport,
    )


def only(records: list[UsageRecord], mine: list[UsageRecord]) -> list[UsageRecord]:
    """The entries of ``records`` written by this test (the Redis ledger is shared)."""
    ids = {record.response_id for record in mine}
    return [record for record in records if record.response_id in ids]


# --- the contract, on every backend -----------------------------------------


@on_asyncio
async def test_round_trip(backend: Backend) -> None:
    record = make_record(previous_response_id=new_id())
    async with contextlib.aclosing(backend.open()) as store:
        await store.put(record)
        assert await store.get(record.id, owner="alice") == record


@on_asyncio
async def test_missing_id_is_none(backend: Backend) -> None:
    async with contextlib.aclosing(backend.open()) as store:
        assert await store.get(new_id(), owner="alice") is None
        assert await store.delete(new_id(), owner="alice") is False


@on_asyncio
async def test_other_owner_finds_nothing(backend: Backend) -> None:
    record = make_record(owner="alice")
    async with contextlib.aclosing(backend.open()) as store:
        await store.put(record)
        assert await store.get(record.id, owner="mallory") is None
        assert await store.get(record.id, owner="") is None
        assert await store.delete(record.id, owner="mallory") is False
        assert await store.get(record.id, owner="alice") == record


@on_asyncio
async def test_delete_then_get(backend: Backend) -> None:
    record = make_record()
    async with contextlib.aclosing(backend.open()) as store:
        await store.put(record)
        assert await store.delete(record.id, owner="alice") is True
        assert await store.get(record.id, owner="alice") is None
        assert await store.delete(record.id, owner="alice") is False


@on_asyncio
async def test_put_replaces_same_id(backend: Backend) -> None:
    first = make_record(text="first")
    second = make_record(first.id, text="second")
    async with contextlib.aclosing(backend.open()) as store:
        await store.put(first)
        await store.put(second)
        assert await store.get(first.id, owner="alice") == second


@on_asyncio
async def test_ttl_expiry(backend: Backend) -> None:
    expiring, lasting = make_record(), make_record()
    async with (
        contextlib.aclosing(backend.open(ttl=TTL)) as short,
        contextlib.aclosing(backend.open()) as forever,
    ):
        await short.put(expiring)
        await forever.put(lasting)
        assert await short.get(expiring.id, owner="alice") == expiring
        await backend.elapse(TTL + 0.05)
        assert await short.get(expiring.id, owner="alice") is None
        assert await short.delete(expiring.id, owner="alice") is False
        assert await forever.get(lasting.id, owner="alice") == lasting


ITEM_IDS = {"msg_0", "fco_0", "rs_1", "fc_1", "msg_2"}


@on_asyncio
async def test_items_found_by_id_per_owner(backend: Backend) -> None:
    owner, other = new_owner(), new_owner()
    record = make_record(owner=owner)
    async with contextlib.aclosing(backend.open()) as store:
        assert await store.holding(ITEM_IDS, owner=owner) == []
        await store.put(record)
        # Input and output items alike, each record once.
        assert await store.holding(ITEM_IDS, owner=owner) == [record]
        assert await store.holding(["msg_0"], owner=owner) == [record]
        assert await store.holding(["msg_2", "msg_missing"], owner=owner) == [record]
        assert await store.holding(["msg_missing"], owner=owner) == []
        assert await store.holding([], owner=owner) == []
        # Another owner finds nothing of it, nor by the same ids.
        assert await store.holding(ITEM_IDS, owner=other) == []
        assert await store.delete(record.id, owner=owner) is True
        assert await store.holding(ITEM_IDS, owner=owner) == []


@on_asyncio
async def test_items_of_the_record_written_last(backend: Backend) -> None:
    owner = new_owner()
    first, second = make_record(owner=owner, text="first"), make_record(owner=owner, text="second")
    theirs = make_record(owner=new_owner(), text="theirs")
    async with contextlib.aclosing(backend.open()) as store:
        await store.put(first)
        await store.put(second)
        await store.put(theirs)  # the same item ids, another owner
        assert await store.holding(["msg_2"], owner=owner) == [second]
        assert await store.holding(["msg_2"], owner=theirs.owner) == [theirs]


@on_asyncio
async def test_items_expire_with_their_record(backend: Backend) -> None:
    owner = new_owner()
    record = make_record(owner=owner)
    async with contextlib.aclosing(backend.open(ttl=TTL)) as store:
        await store.put(record)
        assert await store.holding(["fc_1"], owner=owner) == [record]
        await backend.elapse(TTL + 0.05)
        assert await store.holding(["fc_1"], owner=owner) == []


@on_asyncio
async def test_two_stores_share_records(shared_backend: Backend) -> None:
    one, two = make_record(), make_record()
    async with (
        contextlib.aclosing(shared_backend.open()) as first,
        contextlib.aclosing(shared_backend.open()) as second,
    ):
        await first.put(one)
        await second.put(two)
        assert await second.get(one.id, owner="alice") == one
        assert await first.get(two.id, owner="alice") == two
        assert await second.delete(one.id, owner="alice") is True
        assert await first.get(one.id, owner="alice") is None


@on_asyncio
async def test_concurrent_writers_lose_nothing(shared_backend: Backend) -> None:
    batches = [[make_record() for _ in range(40)] for _ in range(2)]
    async with (
        contextlib.aclosing(shared_backend.open()) as first,
        contextlib.aclosing(shared_backend.open()) as second,
    ):
        await asyncio.gather(
            *(first.put(record) for record in batches[0]),
            *(second.put(record) for record in batches[1]),
        )
        for store in (first, second):
            for record in batches[0] + batches[1]:
                assert await store.get(record.id, owner="alice") == record


@on_asyncio
async def test_usage_round_trip(backend: Backend) -> None:
    owner = new_owner()
    records = [
        make_usage(owner=owner, transport=transport, created_at=1_700_000_000.0 + n)
        for n, transport in enumerate(["append", "ws", "http"])
    ]
    async with contextlib.aclosing(backend.open()) as store:
        assert await store.usage(owner=owner) == []
        for record in records:
            await store.put_usage(record)
        assert await store.usage(owner=owner) == records
        assert only(await store.usage(), records) == records


@on_asyncio
async def test_usage_same_response_keeps_one_record(backend: Backend) -> None:
    owner, other = new_owner(), new_owner()
    first = make_usage(owner=owner, output_tokens=7, created_at=1_700_000_000.0)
    latest = make_usage(
        first.response_id,
        owner=owner,
        input_tokens=99,
        output_tokens=123,
        created_at=1_700_000_050.0,
        transport="http",
    )
    moved = make_usage(first.response_id, owner=other, output_tokens=5)
    async with contextlib.aclosing(backend.open()) as store:
        await store.put_usage(first)
        await store.put_usage(first)
        assert await store.usage(owner=owner) == [first]
        await store.put_usage(latest)
        assert await store.usage(owner=owner) == [latest]
        assert only(await store.usage(), [first]) == [latest]
        # Last write wins, owner included: the entry moves, it is not copied.
        await store.put_usage(moved)
        assert await store.usage(owner=owner) == []
        assert await store.usage(owner=other) == [moved]
        assert only(await store.usage(), [first]) == [moved]


@on_asyncio
async def test_usage_owner_filter(backend: Backend) -> None:
    alice, bob = new_owner(), new_owner()
    alices = [make_usage(owner=alice, created_at=1_700_000_000.0 + 2 * n) for n in range(3)]
    bobs = [make_usage(owner=bob, created_at=1_700_000_001.0 + 2 * n) for n in range(3)]
    keyless = make_usage(owner="")  # the owner without API keys is an owner like any other
    async with contextlib.aclosing(backend.open()) as store:
        for record in [r for pair in zip(alices, bobs, strict=True) for r in pair] + [keyless]:
            await store.put_usage(record)
        assert await store.usage(owner=alice) == alices
        assert await store.usage(owner=bob) == bobs
        assert await store.usage(owner=new_owner()) == []
        empty_owner = await store.usage(owner="")
        assert {record.owner for record in empty_owner} == {""}
        assert only(empty_owner, [*alices, *bobs, keyless]) == [keyless]
        everything = only(await store.usage(), [*alices, *bobs, keyless])
        assert sorted(everything, key=lambda r: r.response_id) == sorted(
            [*alices, *bobs, keyless], key=lambda r: r.response_id
        )


@on_asyncio
async def test_usage_ordered_by_created_at_then_response_id(backend: Backend) -> None:
    owner = new_owner()
    # Three instants, three responses at each; ids tie-break within an instant,
    # and they sort differently from the order of creation.
    expected = [
        make_usage(f"resp_{uuid.uuid4().hex[:8]}_{letter}", owner=owner, created_at=at)
        for at in (-5.5, 0.0, 1_700_000_000.125)
        for letter in "abc"
    ]
    expected.sort(key=lambda record: (record.created_at, record.response_id))
    written = expected.copy()
    random.Random(7).shuffle(written)
    assert written != expected
    async with contextlib.aclosing(backend.open()) as store:
        for record in written:
            await store.put_usage(record)
        assert await store.usage(owner=owner) == expected
        assert only(await store.usage(), expected) == expected


@on_asyncio
async def test_usage_outlives_the_response(backend: Backend) -> None:
    owner = new_owner()
    expiring, deleted = make_record(owner=owner), make_record(owner=owner)
    ledger = [
        make_usage(expiring.id, owner=owner, created_at=1.0),
        make_usage(deleted.id, owner=owner, created_at=2.0),
    ]
    async with contextlib.aclosing(backend.open(ttl=TTL)) as store:
        for record, usage in zip([expiring, deleted], ledger, strict=True):
            await store.put(record)
            await store.put_usage(usage)
        assert await store.delete(deleted.id, owner=owner) is True
        await backend.elapse(TTL + 0.05)
        assert await store.get(expiring.id, owner=owner) is None
        assert await store.usage(owner=owner) == ledger


@on_asyncio
async def test_two_stores_share_usage(shared_backend: Backend) -> None:
    owner = new_owner()
    one, two = make_usage(owner=owner, created_at=1.0), make_usage(owner=owner, created_at=2.0)
    contested_id = new_id()
    contested = [
        make_usage(contested_id, owner=owner, created_at=3.0, output_tokens=n) for n in range(20)
    ]
    async with (
        contextlib.aclosing(shared_backend.open()) as first,
        contextlib.aclosing(shared_backend.open()) as second,
    ):
        await first.put_usage(one)
        await second.put_usage(two)
        assert await first.usage(owner=owner) == [one, two]
        assert await second.usage(owner=owner) == [one, two]
        # Both write the same response at once: one entry survives, whole.
        await asyncio.gather(
            *(first.put_usage(record) for record in contested[0::2]),
            *(second.put_usage(record) for record in contested[1::2]),
        )
        for store in (first, second):
            ledger = await store.usage(owner=owner)
            assert ledger[:2] == [one, two]
            assert len(ledger) == 3
            assert ledger[2] in contested


@settings(max_examples=50, deadline=None)
@given(
    writes=st.lists(
        st.builds(
            make_usage,
            st.sampled_from(["resp_a", "resp_b", "resp_c", "resp_d"]),
            owner=st.sampled_from(["", "alice", "bob"]),
            created_at=st.sampled_from([0.0, 1.5, -3.0]) | st.floats(-1e12, 1e12),
            input_tokens=st.integers(0, 2**62),
            output_tokens=st.integers(0, 2**62),
            transport=st.sampled_from(["append", "ws", "http"]),
        ),
        max_size=12,
    ),
    owner=st.none() | st.sampled_from(["", "alice", "bob"]),
)
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_any_usage_ledger_keeps_the_last_write_per_response(
    kind: str, writes: list[UsageRecord], owner: str | None
) -> None:
    latest = {record.response_id: record for record in writes}
    expected = sorted(
        (record for record in latest.values() if owner is None or record.owner == owner),
        key=lambda record: (record.created_at, record.response_id),
    )

    async def scenario() -> None:
        store = MemoryStore() if kind == "memory" else SQLiteStore(":memory:")
        async with contextlib.aclosing(store):
            for record in writes:
                await store.put_usage(record)
            assert await store.usage(owner=owner) == expected

    asyncio.run(scenario())


@settings(max_examples=50, deadline=None)
@given(
    text=st.text(max_size=40),
    owner=st.text(max_size=20),
    created_at=st.floats(-1e12, 1e12),
    output_tokens=st.integers(0, 2**62),
    metadata=st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3),
)
def test_any_record_round_trips(
    text: str, owner: str, created_at: float, output_tokens: int, metadata: dict[str, str]
) -> None:
    record = make_record(
        owner=owner,
        text=text,
        created_at=created_at,
        output_tokens=output_tokens,
        metadata=metadata,
    )

    async def scenario() -> None:
        store = MemoryStore()
        await store.put(record)
        assert await store.get(record.id, owner=owner) == record
        assert await store.get(record.id, owner=owner + "x") is None

    asyncio.run(scenario())


# --- open_store --------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("memory://", MemoryStore),
        ("sqlite:///{tmp}/a.db", SQLiteStore),
        ("sqlite://relative.db", SQLiteStore),
        ("plain.db", SQLiteStore),
        ("{tmp}/nested/dir/plain.db", SQLiteStore),
        ("redis://127.0.0.1:1/0", RedisStore),
    ],
)
def test_open_store_dispatch(
    url: str, kind: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store(url.format(tmp=tmp_path), ttl=60)
    assert isinstance(store, kind)

    async def scenario() -> None:
        async with contextlib.aclosing(store):
            if kind is not RedisStore:  # nothing listens on port 1: see test_redis_unreachable
                record = make_record()
                await store.put(record)
                assert await store.get(record.id, owner="alice") == record

    asyncio.run(scenario())
    if isinstance(store, SQLiteStore):
        assert store.path is not None
        assert store.path.is_file()
        assert store.path.resolve().is_relative_to(tmp_path.resolve())


@pytest.mark.parametrize(
    "url", ["postgres://db/x", "http://host/", "unix:///tmp/redis.sock", "sqlite://"]
)
def test_open_store_rejects_bad_urls(url: str) -> None:
    with pytest.raises(ValueError, match="store URL"):
        open_store(url)


@pytest.mark.parametrize("ttl", [0, -1.0, math.nan, math.inf])
def test_open_store_rejects_bad_ttl(ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl"):
        open_store("memory://", ttl=ttl)


# --- SQLite ------------------------------------------------------------------


@on_asyncio
async def test_sqlite_survives_reopening_and_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "responses.db"
    record = make_record()
    async with contextlib.aclosing(SQLiteStore(path)) as store:
        await store.put(record)
    async with contextlib.aclosing(SQLiteStore(path)) as store:
        assert await store.get(record.id, owner="alice") == record
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


@on_asyncio
async def test_sqlite_usage_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "responses.db"
    owner = new_owner()
    first, second = make_usage(owner=owner, created_at=1.0), make_usage(owner=owner, created_at=2.0)
    async with contextlib.aclosing(SQLiteStore(path, ttl=TTL)) as store:
        await store.put_usage(second)
        await store.put_usage(first)
    async with contextlib.aclosing(SQLiteStore(path)) as store:
        assert await store.usage(owner=owner) == [first, second]
        assert await store.usage() == [first, second]
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT response_id, owner, created_at FROM usage ORDER BY created_at")
        assert rows.fetchall() == [
            (first.response_id, owner, 1.0),
            (second.response_id, owner, 2.0),
        ]


@on_asyncio
async def test_sqlite_file_without_usage_table_gets_one(tmp_path: Path) -> None:
    path = tmp_path / "responses.db"
    record, usage = make_record(), make_usage(owner="alice")
    async with contextlib.aclosing(SQLiteStore(path)) as store:
        await store.put(record)
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("DROP TABLE usage")  # as a file written before the ledger existed
    async with contextlib.aclosing(SQLiteStore(path)) as store:
        assert await store.usage() == []
        await store.put_usage(usage)
        assert await store.usage() == [usage]
        assert await store.get(record.id, owner="alice") == record


@on_asyncio
async def test_sqlite_purge_keeps_usage_rows(tmp_path: Path) -> None:
    clock = FakeClock()
    record = make_record()
    usage = make_usage(record.id, owner="alice")
    async with contextlib.aclosing(SQLiteStore(tmp_path / "r.db", ttl=TTL, clock=clock)) as store:
        await store.put(record)
        await store.put_usage(usage)
        clock.now += TTL
        assert await store.purge_expired() == 1
        assert await store.usage() == [usage]


@on_asyncio
async def test_sqlite_purges_expired_rows(tmp_path: Path) -> None:
    path = tmp_path / "responses.db"
    clock = FakeClock()

    def rows() -> set[str]:
        with contextlib.closing(sqlite3.connect(path)) as db:
            return {row[0] for row in db.execute("SELECT id FROM responses")}

    async with contextlib.aclosing(SQLiteStore(path, ttl=TTL, clock=clock)) as store:
        old, newer = make_record(), make_record()
        await store.put(old)
        clock.now += TTL
        assert await store.get(old.id, owner="alice") is None
        assert rows() == {old.id}  # hidden, not yet deleted
        await store.put(newer)  # the last purge is too recent to run another
        assert rows() == {old.id, newer.id}
        clock.now += SQLITE_PURGE_INTERVAL
        await store.put(make_record(newer.id))  # the purge runs with this put
        assert rows() == {newer.id}
        clock.now += TTL
        assert await store.purge_expired() == 1
        assert rows() == set()


_CHILD_WRITER = """
import asyncio, sys
import msgspec
from longresponse.storage.backends import SQLiteStore, StoredResponse

records = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=list[StoredResponse])

async def main():
    store = SQLiteStore(sys.argv[1])
    try:
        for record in records:
            await store.put(record)
    finally:
        await store.aclose()

asyncio.run(main())
"""


@on_asyncio
async def test_sqlite_two_processes_on_one_file(tmp_path: Path) -> None:
    path = tmp_path / "responses.db"
    mine, theirs = [make_record() for _ in range(30)], [make_record() for _ in range(30)]
    async with contextlib.aclosing(SQLiteStore(path)) as store:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _CHILD_WRITER, str(path), stdin=subprocess.PIPE
        )
        await asyncio.gather(
            asyncio.wait_for(child.communicate(msgspec.msgpack.encode(theirs)), 30),
            *(store.put(record) for record in mine),
        )
        assert child.returncode == 0
        for record in mine + theirs:
            assert await store.get(record.id, owner="alice") == record


@on_asyncio
async def test_sqlite_closed_store_raises(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "responses.db")
    await store.aclose()
    await store.aclose()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        await store.get(new_id(), owner="alice")


def test_sqlite_unopenable_path_raises(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(StoreError, match="cannot open"):
        SQLiteStore(tmp_path / "taken")


# --- Redis -------------------------------------------------------------------


@on_asyncio
async def test_redis_key_layout_and_expiry(redis_url: str) -> None:
    record = make_record()
    key = REDIS_KEY_PREFIX + record.id
    async with (
        contextlib.aclosing(RedisStore(redis_url, ttl=60)) as store,
        contextlib.aclosing(redis.asyncio.Redis.from_url(redis_url)) as raw,
    ):
        await store.put(record)
        assert key == f"longresponse:response:{record.id}"
        blob = await raw.get(key)
        assert isinstance(blob, bytes)
        assert msgspec.msgpack.decode(blob, type=StoredResponse) == record
        assert 59_000 < await raw.pttl(key) <= 60_000
        assert await store.purge_expired() == 0


@on_asyncio
async def test_redis_undecodable_record_raises(redis_url: str) -> None:
    response_id = new_id()
    async with (
        contextlib.aclosing(RedisStore(redis_url)) as store,
        contextlib.aclosing(redis.asyncio.Redis.from_url(redis_url)) as raw,
    ):
        await raw.set(REDIS_KEY_PREFIX + response_id, b"\xc1 not msgpack")
        with pytest.raises(StoreError, match="no longer decodes"):
            await store.get(response_id, owner="alice")


@on_asyncio
async def test_redis_usage_layout_never_expires(redis_url: str) -> None:
    usage = make_usage(owner=new_owner())
    async with (
        contextlib.aclosing(RedisStore(redis_url, ttl=60)) as store,
        contextlib.aclosing(redis.asyncio.Redis.from_url(redis_url)) as raw,
    ):
        await store.put_usage(usage)
        assert REDIS_USAGE_KEY == "longresponse:usage"
        blob = await raw.hget(REDIS_USAGE_KEY, usage.response_id)
        assert isinstance(blob, bytes)
        assert msgspec.msgpack.decode(blob, type=UsageRecord) == usage
        assert await raw.pttl(REDIS_USAGE_KEY) == -1  # the hash has no expiry


@on_asyncio
async def test_redis_undecodable_usage_raises(redis_url: str) -> None:
    response_id = new_id()
    async with (
        contextlib.aclosing(RedisStore(redis_url)) as store,
        contextlib.aclosing(redis.asyncio.Redis.from_url(redis_url)) as raw,
    ):
        await raw.hset(REDIS_USAGE_KEY, response_id, b"\xc1 not msgpack")
        try:
            with pytest.raises(StoreError, match="no longer decodes"):
                await store.usage(owner="alice")
        finally:
            await raw.hdel(REDIS_USAGE_KEY, response_id)  # the ledger is shared by the run


@on_asyncio
async def test_redis_unreachable_raises() -> None:
    async with contextlib.aclosing(RedisStore("redis://127.0.0.1:1/0")) as store:
        with pytest.raises(StoreError):
            await store.get(new_id(), owner="alice")
        with pytest.raises(StoreError):
            await store.put_usage(make_usage(owner="alice"))
        with pytest.raises(StoreError):
            await store.usage()


# --- server secrets ------------------------------------------------------------


@on_asyncio
async def test_a_secret_is_kept_once_and_never_replaced(backend: Backend) -> None:
    name = f"test-{new_id()}"
    async with contextlib.aclosing(backend.open(ttl=TTL)) as store:
        assert await store.secret(name, b"first") == b"first"
        assert await store.secret(name, b"second") == b"first"
        await backend.elapse(TTL + 0.05)  # the records' ttl is not the secrets'
        assert await store.secret(name, b"third") == b"first"


@on_asyncio
async def test_stores_on_one_backend_agree_on_a_secret(shared_backend: Backend) -> None:
    name = f"test-{new_id()}"
    async with (
        contextlib.aclosing(shared_backend.open()) as first,
        contextlib.aclosing(shared_backend.open()) as second,
    ):
        kept = await asyncio.gather(
            *(store.secret(name, bytes([n])) for n, store in enumerate([first, second] * 5))
        )
        assert len(set(kept)) == 1
    async with contextlib.aclosing(shared_backend.open()) as reopened:
        assert await reopened.secret(name, b"late") == kept[0]
