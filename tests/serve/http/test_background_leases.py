"""A background response outlives its process: its record and its lease (issue 30).

In-process servers on SQLite files of their own. A response whose process
stopped is planted in the server's store as that process left it: its record
``in_progress`` (a finished response's output and usage, as a beat stores
them), held by a lease of a holder that is gone and ran out at once. A
response held by a live process elsewhere is planted the same way with a
long lease. Killing real processes is ``tests/serve/test_crash.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx
import msgspec
import openai
import pytest

from longresponse.serve.http.background import LEASE_LOST, STOPPED
from longresponse.storage.backends import StoredResponse, StoreError, UsageRecord
from longresponse.storage.records import ResponseStore
from tests.conftest import RunningServer
from tests.support.error_replies import assert_refused
from tests.support.http_clients import openai_client, post
from tests.support.waiting import wait_for

_T = TypeVar("_T")

#: About 100 s of output: still running whenever the test looks.
SLOW = {"sim_output_tokens": "2000", "sim_tokens_per_second": "20"}
#: The server's own lease in these tests: long, so that its own sweep (every
#: third of it, and once at its start) stays out of the way unless a test
#: asks for a short one.
LONG = 600.0


def on_loop(server: RunningServer, work: Coroutine[Any, Any, _T]) -> _T:
    """Run ``work`` on the server's loop (its store belongs there)."""
    loop = server.app.parts.loop
    assert loop is not None
    return asyncio.run_coroutine_threadsafe(work, loop).result(10)


def store_of(server: RunningServer) -> ResponseStore:
    persistence = server.app.parts.persistence
    assert persistence is not None
    return persistence.store


def stored(server: RunningServer, response_id: str) -> StoredResponse | None:
    return on_loop(server, store_of(server).get(response_id, owner=""))


def billed(server: RunningServer, response_id: str) -> list[UsageRecord]:
    records = on_loop(server, store_of(server).usage())
    return [record for record in records if record.response_id == response_id]


def plant(server: RunningServer, *, holder: str = "gone/1/dead", lease: float = 0.001) -> str:
    """A background response left ``in_progress`` by the process ``holder``, whose
    lease runs for ``lease`` seconds from now; its id."""
    client = openai_client(server)
    done = client.responses.create(model="sim", input="left behind", background=True)
    wait_for(
        lambda: (
            (record := stored(server, done.id)) is not None
            and record.response.status == "completed"
        ),
        "a finished background response to copy",
    )
    record = stored(server, done.id)
    assert record is not None
    response_id = f"resp_planted{done.id.removeprefix('resp_')}"
    response = msgspec.structs.replace(
        record.response, id=response_id, status="in_progress", completed_at=None
    )
    running = msgspec.structs.replace(record, id=response_id, response=response)
    on_loop(server, store_of(server).put_running(running, holder=holder, lease=lease))
    return response_id


def test_the_record_is_stored_before_the_create_is_answered(make_server: Any) -> None:
    server = make_server(background_lease=LONG)
    made = openai_client(server).responses.create(
        model="sim", input="keep me", background=True, metadata=SLOW
    )
    assert made.status == "queued"
    record = stored(server, made.id)  # read at once: no wait
    assert record is not None
    assert (record.response.status, record.response.background) == ("in_progress", True)
    inputs = msgspec.to_builtins(record.input_items)
    assert [item["content"][0]["text"] for item in inputs] == ["keep me"]
    openai_client(server).responses.cancel(made.id)
    ended = stored(server, made.id)
    assert ended is not None
    assert ended.response.status == "cancelled"
    # Its input keeps the ids it was stored with first.
    assert msgspec.to_builtins(ended.input_items) == inputs


def test_a_store_that_refuses_it_refuses_the_create(
    make_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make_server(background_lease=LONG)

    async def refuse(record: StoredResponse, *, holder: str, lease: float) -> None:
        raise StoreError("the disk is full")

    monkeypatch.setattr(store_of(server), "put_running", refuse)
    reply = post(server, {"model": "sim", "input": "x", "background": True})
    assert reply.status_code == 503, reply.text
    assert reply.json()["error"]["code"] == "store_unavailable"
    assert server.app.parts.background.running == 0
    monkeypatch.undo()
    assert post(server, {"model": "sim", "input": "x", "background": True}).status_code == 200


def test_a_response_whose_process_stopped_is_read_failed_and_billed_once(
    make_server: Any,
) -> None:
    server = make_server(background_lease=LONG)
    response_id = plant(server)
    planted = stored(server, response_id)
    assert planted is not None
    assert planted.response.usage is not None
    client = openai_client(server)
    seen = client.responses.retrieve(response_id)
    assert (seen.status, seen.background) == ("failed", True)
    assert seen.error is not None
    assert (seen.error.code, seen.error.message) == (STOPPED.code, STOPPED.message)
    # Its output as its last beat stored it.
    assert [item.id for item in seen.output] == [item.id for item in planted.response.output]
    assert seen.output_text
    assert client.responses.retrieve(response_id).to_dict() == seen.to_dict()
    wait_for(lambda: billed(server, response_id), "its usage record")
    (record,) = billed(server, response_id)
    assert record.output_tokens == planted.response.usage.output_tokens > 0
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.cancel(response_id)
    assert "Cannot cancel a failed response." in str(refused.value)


def test_a_cancel_of_one_whose_process_stopped_ends_it_cancelled(make_server: Any) -> None:
    server = make_server(background_lease=LONG)
    response_id = plant(server)
    client = openai_client(server)
    cancelled = client.responses.cancel(response_id)
    assert (cancelled.status, cancelled.output, cancelled.error) == ("cancelled", [], None)
    assert client.responses.retrieve(response_id).status == "cancelled"
    assert client.responses.cancel(response_id).status == "cancelled"  # again: unchanged
    wait_for(lambda: billed(server, response_id), "its usage record")
    assert len(billed(server, response_id)) == 1


def test_a_delete_of_one_whose_process_stopped_ends_it_then_deletes_it(
    make_server: Any,
) -> None:
    server = make_server(background_lease=LONG)
    response_id = plant(server)
    client = openai_client(server)
    assert client.responses.delete(response_id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response_id)
    wait_for(lambda: billed(server, response_id), "its usage record")
    assert len(billed(server, response_id)) == 1


def test_the_sweep_ends_it_unasked(make_server: Any) -> None:
    server = make_server(background_lease=0.3)  # a sweep every 0.1 s
    response_id = plant(server)

    def ended() -> bool:
        record = stored(server, response_id)
        return record is not None and record.response.status == "failed"

    wait_for(ended, "the sweep to end it")
    wait_for(lambda: billed(server, response_id), "its usage record")


def test_one_held_by_a_live_process_elsewhere_is_polled_but_left_to_it(
    make_server: Any,
) -> None:
    server = make_server(background_lease=LONG)
    response_id = plant(server, holder="alive/2/well", lease=LONG)
    client = openai_client(server)
    seen = client.responses.retrieve(response_id)
    assert seen.status == "in_progress"  # as its process last stored it
    assert seen.output_text
    assert [item.type for item in client.responses.input_items.list(response_id).data] == [
        "message"
    ]
    base = server.http_url
    with httpx.Client(base_url=base, timeout=10) as raw:
        assert_refused(
            raw.post(f"/v1/responses/{response_id}/cancel"), "invalid_value", "response_id"
        )
        assert_refused(raw.delete(f"/v1/responses/{response_id}"), "invalid_value", "response_id")
        assert_refused(
            raw.get(f"/v1/responses/{response_id}", params={"stream": "true"}),
            "invalid_value",
            "stream",
        )
    for path in ("/v1/responses", "/v1/responses/compact"):
        reply = post(
            server,
            {"model": "sim", "input": "next", "previous_response_id": response_id},
            path=path,
        )
        error = assert_refused(reply, "invalid_value", "previous_response_id")
        assert "has not finished (status in_progress)" in error["message"]
    assert client.responses.retrieve(response_id).status == "in_progress"
    assert billed(server, response_id) == []


def test_a_process_that_lost_its_lease_stops_the_response(make_server: Any) -> None:
    """It stalled past its lease and another process took the response over."""
    server = make_server(background_lease=0.3)
    client = openai_client(server)
    made = client.responses.create(model="sim", input="lost", background=True, metadata=SLOW)
    record = stored(server, made.id)
    assert record is not None
    on_loop(server, store_of(server).put_running(record, holder="thief/3/x", lease=LONG))
    wait_for(lambda: client.responses.retrieve(made.id).status == "failed", "it to stop")
    ended = client.responses.retrieve(made.id)
    assert ended.error is not None
    assert ended.error.message == LEASE_LOST.message
    assert server.app.parts.background.running == 0
