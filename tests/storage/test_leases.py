"""The leases of running background responses: one contract, on every backend.

A lease is measured on the clock the backend measures its ttl on: a fake one
for memory and SQLite (nothing waits), Redis's own for Redis (the test waits
the short lease for real). Holders are the names of server processes; every
test uses response ids of its own, so the Redis set of running ids, shared
by the whole run, holds other tests' ids too.
"""

from __future__ import annotations

import msgspec

from longresponse.storage.backends import StoredResponse
from longresponse.storage.records import is_running
from protocol.response import ResponseError
from tests.storage.test_store import Backend, make_record, on_asyncio
from tests.storage.test_store import backend as backend  # the fixtures, on every backend
from tests.storage.test_store import shared_backend as shared_backend

LEASE = 0.3


def running(status: str = "in_progress", response_id: str | None = None) -> StoredResponse:
    """A background response that has not ended."""
    record = make_record(response_id)
    response = msgspec.structs.replace(
        record.response, status=status, background=True, completed_at=None, output=[]
    )
    return msgspec.structs.replace(record, response=response)


def ended(record: StoredResponse, status: str = "failed") -> StoredResponse:
    error = ResponseError(code="server_error", message="stopped") if status == "failed" else None
    response = msgspec.structs.replace(record.response, status=status, error=error)
    return msgspec.structs.replace(record, response=response)


def ids(records: list[StoredResponse]) -> list[str]:
    return [record.id for record in records]


@on_asyncio
async def test_a_running_record_is_found_and_kept_while_renewed(backend: Backend) -> None:
    store = backend.open()
    try:
        record = running("queued")
        await store.put_running(record, holder="a", lease=LEASE)
        assert await store.get(record.id, owner="alice") == record
        assert await store.get(record.id, owner="mallory") is None
        assert is_running(record)
        for _ in range(3):  # renewed every half lease: never taken
            await backend.elapse(LEASE / 2)
            assert await store.renew_leases([record.id], holder="a", lease=LEASE) == set()
            taken = await store.take_expired(holder="b", lease=LEASE, response_id=record.id)
            assert taken == []
        assert await store.renew_leases([record.id], holder="b", lease=LEASE) == {record.id}
    finally:
        await store.aclose()


@on_asyncio
async def test_a_lease_that_ran_out_is_taken_once(backend: Backend) -> None:
    store = backend.open()
    try:
        record = running()
        await store.put_running(record, holder="a", lease=LEASE)
        assert await store.take_expired(holder="b", lease=LEASE, response_id=record.id) == []
        await backend.elapse(LEASE * 1.5)
        assert ids(await store.take_expired(holder="b", lease=LEASE, response_id=record.id)) == [
            record.id
        ]
        # Taken: nobody else gets it, and the holder that stopped renewing lost it.
        assert await store.take_expired(holder="c", lease=LEASE, response_id=record.id) == []
        assert await store.renew_leases([record.id], holder="a", lease=LEASE) == {record.id}
        # Only the taker stores its end, once; the lease goes with it.
        end = ended(record)
        assert not await store.put_held(ended(record, "completed"), holder="a")
        assert (await store.get(record.id, owner="alice")) == record
        assert await store.put_held(end, holder="b")
        assert (await store.get(record.id, owner="alice")) == end
        assert not await store.put_held(end, holder="b")
        await backend.elapse(LEASE * 1.5)
        assert await store.take_expired(holder="c", lease=LEASE, response_id=record.id) == []
    finally:
        await store.aclose()


@on_asyncio
async def test_a_sweep_takes_every_lease_that_ran_out_and_no_other(backend: Backend) -> None:
    store = backend.open()
    try:
        stale, fresh = running(), running("queued")
        await store.put_running(stale, holder="a", lease=LEASE)
        await backend.elapse(LEASE * 1.5)
        await store.put_running(fresh, holder="a", lease=LEASE)
        taken = ids(await store.take_expired(holder="b", lease=LEASE))
        assert stale.id in taken
        assert fresh.id not in taken
        assert await store.renew_leases([stale.id, fresh.id], holder="a", lease=LEASE) == {stale.id}
    finally:
        await store.aclose()


@on_asyncio
async def test_a_lease_not_taken_is_renewed_by_its_holder(backend: Backend) -> None:
    """A holder late to renew keeps what nobody took meanwhile."""
    store = backend.open()
    try:
        record = running()
        await store.put_running(record, holder="a", lease=LEASE)
        await backend.elapse(LEASE * 1.5)
        assert await store.renew_leases([record.id], holder="a", lease=LEASE) == set()
        assert await store.take_expired(holder="b", lease=LEASE, response_id=record.id) == []
    finally:
        await store.aclose()


@on_asyncio
async def test_storing_the_end_or_deleting_lets_go(backend: Backend) -> None:
    store = backend.open()
    try:
        finished, deleted = running(), running()
        for record in (finished, deleted):
            await store.put_running(record, holder="a", lease=LEASE)
        await store.put(ended(finished, "completed"))
        assert await store.delete(deleted.id, owner="alice")
        assert await store.renew_leases([finished.id, deleted.id], holder="a", lease=LEASE) == {
            finished.id,
            deleted.id,
        }
        await backend.elapse(LEASE * 1.5)
        for record in (finished, deleted):
            assert await store.take_expired(holder="b", lease=LEASE, response_id=record.id) == []
        assert await store.get(finished.id, owner="alice") == ended(finished, "completed")
    finally:
        await store.aclose()


@on_asyncio
async def test_a_checkpoint_replaces_the_record_and_keeps_the_lease(backend: Backend) -> None:
    store = backend.open()
    try:
        queued = running("queued")
        await store.put_running(queued, holder="a", lease=LEASE)
        later = running("in_progress", queued.id)
        await store.put_running(later, holder="a", lease=LEASE)
        assert await store.get(queued.id, owner="alice") == later
        await backend.elapse(LEASE * 1.5)
        assert await store.take_expired(holder="b", lease=LEASE, response_id=queued.id) == [later]
    finally:
        await store.aclose()


@on_asyncio
async def test_a_lease_on_a_record_gone_with_its_ttl_is_dropped(backend: Backend) -> None:
    store = backend.open(ttl=LEASE)
    try:
        record = running()
        await store.put_running(record, holder="a", lease=LEASE)
        await backend.elapse(LEASE * 1.5)
        assert await store.get(record.id, owner="alice") is None
        assert await store.take_expired(holder="b", lease=LEASE, response_id=record.id) == []
        assert await store.renew_leases([record.id], holder="a", lease=LEASE) == {record.id}
    finally:
        await store.aclose()


@on_asyncio
async def test_another_process_takes_what_a_stopped_one_held(shared_backend: Backend) -> None:
    first, second = shared_backend.open(), shared_backend.open()
    try:
        record = running()
        await first.put_running(record, holder="first", lease=LEASE)
        assert await second.get(record.id, owner="alice") == record
        await shared_backend.elapse(LEASE * 1.5)
        taken = await second.take_expired(holder="second", lease=LEASE, response_id=record.id)
        assert taken == [record]
        assert await first.take_expired(holder="first", lease=LEASE, response_id=record.id) == []
        assert await second.put_held(ended(record), holder="second")
        assert (await first.get(record.id, owner="alice")) == ended(record)
    finally:
        await first.aclose()
        await second.aclose()
