"""An append-mode response outlives its connection and its process (``response.resume``).

The real server on loopback (and, for a crash, ``longresponse serve`` processes
on one SQLite file), driven by the trio client: a rollout created with
``store: true`` pauses at a tool call, its connection goes away, and a new
connection takes it up where its last checkpoint left it, with the same id,
its output so far and its numbering going on; the tool outputs appended there
finish it, and the ledger holds one record of its whole usage.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
import trio

from longresponse.client import connect
from longresponse.server_process import ServerProcess
from longresponse.storage.backends import open_store
from protocol.events import (
    ErrorEvent,
    OutputItemAdded,
    ResponseDone,
    ResponseInProgress,
    ResponseResumed,
)
from protocol.items import FunctionCall
from tests.support.waiting import wait_for

TOOL = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
CALLS = {"sim_tool_calls": "3"}


async def paused(url: str) -> ResponseDone:
    """A rollout (``store`` at its default, true) paused at its first call, its
    connection then closed."""
    async with connect(url) as client:
        await client.create(model="sim", input="Read three files.", tools=[TOOL], metadata=CALLS)
        done = (await client.until_done())[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "requires_action"
    return done


def _calls(response: Any) -> list[FunctionCall]:
    return [item for item in response.output if isinstance(item, FunctionCall)]


async def finish(url: str, response_id: str) -> tuple[ResponseResumed, ResponseDone, list[str]]:
    """Take ``response_id`` up on a new connection and answer every call to the end;
    the ``response.resumed``, the final ``response.done`` and the outputs sent."""
    sent: list[str] = []
    async with connect(url) as client:
        await client.resume(response_id)
        resumed = await client.next_event()
        assert isinstance(resumed, ResponseResumed), resumed
        response = resumed.response
        while response.status == "requires_action":
            (call,) = _calls(response)[-1:]
            sent.append(f"file {len(sent)}")
            output = {"type": "function_call_output", "call_id": call.call_id, "output": sent[-1]}
            await client.append([output], response_id=response_id)
            done = (await client.until_done(response_id))[-1]
            assert isinstance(done, ResponseDone)
            response = done.response
    return resumed, done, sent


async def test_a_paused_response_is_taken_up_on_a_new_connection(make_server: Any) -> None:
    running = make_server()
    before = await paused(running.url)
    response_id = before.response.id
    resumed, done, sent = await finish(running.url, response_id)
    # The same response, where its checkpoint left it: its output and its numbering.
    assert resumed.response.id == response_id
    assert resumed.response.status == "requires_action"
    assert resumed.sequence_number == before.sequence_number + 1
    assert resumed.response.output == before.response.output
    assert resumed.response.required_action == before.response.required_action
    # It goes on to the end, every output read by the model.
    assert done.response.status == "completed"
    assert done.response.id == response_id
    text = done.response.output[-1].content[0].text  # type: ignore[union-attr]
    assert all(f"«{output}»" in text for output in sent)
    assert len(_calls(done.response)) == 3
    # One ledger record, of the whole usage; the checkpoint is gone with the end.
    usage = done.response.usage
    assert usage is not None
    whole = (usage.input_tokens, usage.output_tokens)
    billed = lambda: _billed(running.config.store, response_id) == [whole]  # noqa: E731
    await trio.to_thread.run_sync(wait_for, billed, "the ledger's record")
    assert await trio.to_thread.run_sync(_checkpoint, running.config.store, response_id) is None


async def test_it_reports_the_usage_of_an_uninterrupted_rollout(make_server: Any) -> None:
    running = make_server()
    before = await paused(running.url)
    _, taken_up, _ = await finish(running.url, before.response.id)
    # The same conversation never interrupted.
    async with connect(running.url) as client:
        await client.create(model="sim", input="Read three files.", tools=[TOOL], metadata=CALLS)
        sent = 0
        while True:
            done = (await client.until_done())[-1]
            assert isinstance(done, ResponseDone)
            if done.response.status != "requires_action":
                break
            (call,) = _calls(done.response)[-1:]
            answer = f"file {sent}"
            output = {"type": "function_call_output", "call_id": call.call_id, "output": answer}
            sent += 1
            await client.append([output])
    assert taken_up.response.usage == done.response.usage


async def test_a_response_taken_up_in_progress_is_numbered_right_after_its_resume(
    make_server: Any,
) -> None:
    running = make_server()
    slow = CALLS | {"sim_ttft_ms": "1000"}  # the turn after the output is still waiting
    async with connect(running.url) as client:
        await client.create(model="sim", input="Read three files.", tools=[TOOL], metadata=slow)
        done = (await client.until_done(timeout=10))[-1]
        assert isinstance(done, ResponseDone)
        (call,) = _calls(done.response)
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "file 0"}
        await client.append([output])
        while not isinstance(taken := await client.next_event(), ResponseInProgress):
            pass
    # Its checkpoint is the one made before that response.in_progress: the
    # response goes on at the next number, none skipped.
    async with connect(running.url) as client:
        await client.resume(done.response.id)
        resumed = await client.next_event()
    assert isinstance(resumed, ResponseResumed)
    assert resumed.response.status == "in_progress"
    assert resumed.sequence_number == taken.sequence_number + 1


async def test_a_rollout_cut_off_in_its_first_turn_is_taken_up_from_its_start(
    make_server: Any,
) -> None:
    running = make_server()
    slow = {"sim_tool_calls": "1", "sim_ttft_ms": "1000"}  # the first turn is still waiting
    async with connect(running.url) as client:
        await client.create(model="sim", input="Read a file.", tools=[TOOL], metadata=slow)
        while not isinstance(started := await client.next_event(), ResponseInProgress):
            pass
    async with connect(running.url) as client:
        await client.resume(started.response.id)
        resumed = await client.next_event()
        assert isinstance(resumed, ResponseResumed), resumed
        # Its start, checkpointed before that response.in_progress: nothing out
        # yet, and the first turn runs again here.
        assert resumed.response.status == "in_progress"
        assert resumed.response.output == []
        assert resumed.sequence_number == started.sequence_number + 1
        first = (await client.until_done(timeout=10))[-1]
    assert isinstance(first, ResponseDone)
    assert first.response.status == "requires_action"
    _, done, sent = await finish(running.url, started.response.id)
    assert done.response.status == "completed"
    text = done.response.output[-1].content[0].text  # type: ignore[union-attr]
    assert "«Read a file.»" in text
    assert sent == ["file 0"]
    assert "«file 0»" in text


async def test_a_resume_past_the_rollout_limit_is_refused_naming_it(make_server: Any) -> None:
    running = make_server(max_rollouts_per_connection=1)
    before = await paused(running.url)
    async with connect(running.url) as client:
        await client.create(model="sim", input="go", tools=[TOOL], metadata=CALLS)
        assert isinstance((await client.until_done())[-1], ResponseDone)
        await client.resume(before.response.id)
        refused = await client.next_event()
    assert isinstance(refused, ErrorEvent), refused
    assert refused.error.code == "too_many_rollouts"
    # A client resuming several responses knows which one was refused.
    assert refused.response_id == before.response.id


@pytest.mark.parametrize("case", ["unknown", "store_false", "other_key", "finished"])
async def test_what_cannot_be_taken_up_is_refused_naming_it(make_server: Any, case: str) -> None:
    running = make_server(api_keys=("key-one", "key-two"))
    one, two = ("key-one", "key-two")
    response_id = "resp_nothing_here"
    if case != "unknown":
        async with connect(running.url, headers=[_auth(one)]) as client:
            body: dict[str, Any] = {"model": "sim", "input": "go"}
            if case == "store_false":
                body["store"] = False
            if case != "finished":  # paused at a call; finished: no tool, an answer
                body |= {"tools": [TOOL], "metadata": CALLS}
            await client.create(**body)
            done = (await client.until_done())[-1]
            assert isinstance(done, ResponseDone)
            response_id = done.response.id
    key = two if case == "other_key" else one
    async with connect(running.url, headers=[_auth(key)]) as client:
        await client.resume(response_id)
        refused = await client.next_event()
        assert isinstance(refused, ErrorEvent), refused
        assert (refused.error.code, refused.error.param) == ("response_not_found", "response_id")
        assert refused.response_id == response_id
        # The connection stays usable.
        await client.create(model="sim", input="still here")
        assert isinstance((await client.until_done())[-1], ResponseDone)


def _billed(store_url: str, response_id: str) -> list[tuple[int, int]]:
    """The ledger's records of ``response_id``: (input, output) tokens."""

    async def read() -> list[tuple[int, int]]:
        store = open_store(store_url)
        try:
            records = await store.usage()
        finally:
            await store.aclose()
        return [(r.input_tokens, r.output_tokens) for r in records if r.response_id == response_id]

    return asyncio.run(read())


def _checkpoint(store_url: str, response_id: str) -> object:
    """The checkpoint the store holds for ``response_id`` (keys off: owner "")."""

    async def read() -> object:
        store = open_store(store_url)
        try:
            return await store.checkpoint_read(response_id, owner="")
        finally:
            await store.aclose()

    return asyncio.run(read())


def _auth(key: str) -> tuple[bytes, bytes]:
    return (b"authorization", f"Bearer {key}".encode())


@pytest.mark.slow  # two server processes, one killed
def test_a_paused_response_outlives_its_process(tmp_path: Any) -> None:
    store = f"sqlite:///{tmp_path}/responses.db"
    with ServerProcess("--store", store) as first:
        before = trio.run(paused, first.url)
        assert first.process is not None
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.wait(timeout=10)
    with ServerProcess("--store", store) as second:
        resumed, done, sent = trio.run(finish, second.url, before.response.id)
    assert resumed.response.output == before.response.output
    assert done.response.status == "completed"
    text = done.response.output[-1].content[0].text  # type: ignore[union-attr]
    assert all(f"«{output}»" in text for output in sent)


async def test_a_turn_cut_off_runs_again_from_its_checkpoint(make_server: Any) -> None:
    # The outputs were taken (response.in_progress) and the next turn was
    # streaming when the connection went: that turn runs again elsewhere.
    running = make_server()
    slow = CALLS | {"sim_tokens_per_second": "50"}
    async with connect(running.url) as client:
        await client.create(model="sim", input="Read three files.", tools=[TOOL], metadata=slow)
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        (call,) = _calls(done.response)
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "file 0"}
        await client.append([output])
        while not isinstance(await client.next_event(), OutputItemAdded):
            pass  # the next turn has begun streaming: cut it off
    async with connect(running.url) as client:
        await client.resume(done.response.id)
        resumed = await client.next_event()
        assert isinstance(resumed, ResponseResumed)
        assert resumed.response.status == "in_progress"
        assert resumed.response.output == done.response.output  # the cut turn is void
        again = (await client.until_done())[-1]
    assert isinstance(again, ResponseDone)
    assert again.response.status == "requires_action"
    # The turn ran again over the output taken before the cut.
    calls = _calls(again.response)
    assert len(calls) == 2
    assert calls[0] == call
