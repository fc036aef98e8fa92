"""The resilient client reconnects and resumes for its user (``longresponse.client.resilient``).

The real server on loopback, reached through a relay the test cuts, stalls
and turns away (``tests/support/cutting_relay.py``); and, in the slow tier,
``longresponse serve`` processes stopped with SIGTERM (a drain: 1012) or
killed with SIGKILL (1006) and started again on the same port. The user's
loop is the README's: answer each pause until the Response completes.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from longresponse.client import (
    ConnectionClosedError,
    HandshakeError,
    ResilientClient,
    reconnect_delay,
    resilient,
)
from longresponse.server_process import ServerProcess, stop_process
from longresponse.storage.backends import open_store
from protocol import LocalProtocolError
from protocol.events import (
    ErrorEvent,
    OutputTextDelta,
    ResponseDone,
    ResponseInProgress,
    ResponseResumed,
    ServerEvent,
)
from protocol.items import FunctionCall
from protocol.response import Response
from tests.support.cutting_relay import CuttingRelay
from tests.support.waiting import wait_until

TOOL = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
#: Reconnect at once in these tests (the SDKs' 0.5 s is the default).
QUICK = {"initial_delay": 0.01, "max_delay": 0.05}


def output_for(call_id: str) -> str:
    """The tool output for a call (short: the simulated model quotes 40 characters)."""
    return f"contents of {call_id[-8:]}"


async def drive(
    client: ResilientClient, first: ServerEvent | None = None
) -> tuple[Response, list[ServerEvent], list[str]]:
    """The README's loop: answer what each pause waits for until the Response
    ends (from ``first``, an event already read, if given); the final
    Response, every event read, and the call ids answered."""
    seen: list[ServerEvent] = []
    answered: list[str] = []
    while True:
        events = [first] if first is not None else await client.until_done()
        first = None
        seen += events
        last = events[-1]
        assert isinstance(last, ResponseDone | ResponseResumed), last
        response = last.response
        if response.status != "requires_action":
            return response, seen, answered
        waiting = client.unanswered(response)
        assert waiting
        answered += waiting
        await client.append(
            [
                {"type": "function_call_output", "call_id": c, "output": output_for(c)}
                for c in waiting
            ]
        )


def assert_quotes_every_output(response: Response, calls: int) -> None:
    assert response.status == "completed"
    text = response.output[-1].content[0].text  # type: ignore[union-attr]
    call_ids = [item.call_id for item in response.output if isinstance(item, FunctionCall)]
    assert len(call_ids) == calls
    assert f"I read {calls} tool outputs" in text
    for call_id in call_ids:
        assert f"«{output_for(call_id)}»" in text


async def billed(store_url: str, response_id: str) -> list[tuple[int, int]]:
    """The ledger's records of ``response_id`` (input, output tokens), once the
    write-behind queue has had its turn."""

    async def read() -> list[tuple[int, int]]:
        store = open_store(store_url)
        try:
            records = await store.usage()
        finally:
            await store.aclose()
        return [(r.input_tokens, r.output_tokens) for r in records if r.response_id == response_id]

    return await trio.to_thread.run_sync(asyncio.run, read())


async def assert_billed_once(store_url: str, response: Response) -> None:
    usage = response.usage
    assert usage is not None
    whole = [(usage.input_tokens, usage.output_tokens)]
    last: list[list[tuple[int, int]]] = [[]]

    async def check() -> bool:
        last[0] = await billed(store_url, response.id)
        return last[0] == whole

    started = trio.current_time()
    while not await check():
        assert trio.current_time() - started < 10, (last[0], whole)
        await trio.sleep(0.02)


@pytest.fixture
async def relayed(make_server: Any) -> AsyncIterator[tuple[Any, CuttingRelay]]:
    """A test server and a relay in front of it."""
    running = make_server()
    relay = CuttingRelay(running.port)
    async with trio.open_nursery() as nursery:
        await nursery.start(relay.run)
        yield running, relay
        nursery.cancel_scope.cancel()


# --- the backoff ------------------------------------------------------------------


class _Fixed:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(
    ("attempt", "low", "high"),
    [(1, 0.375, 0.5), (2, 0.75, 1.0), (3, 1.5, 2.0), (4, 3.0, 4.0), (5, 6.0, 8.0), (9, 6.0, 8.0)],
)
def test_the_delay_is_the_sdks_backoff(attempt: int, low: float, high: float) -> None:
    assert reconnect_delay(attempt, rng=_Fixed(0.0)) == low  # type: ignore[arg-type]
    assert reconnect_delay(attempt, rng=_Fixed(1.0)) == high  # type: ignore[arg-type]
    assert low <= reconnect_delay(attempt) <= high


# --- a connection cut -------------------------------------------------------------


async def test_a_cut_while_paused_is_resumed_and_answered(
    relayed: tuple[Any, CuttingRelay],
) -> None:
    running, relay = relayed
    async with resilient(relay.url, **QUICK) as client:
        await client.create(
            model="sim", input="Read three files.", tools=[TOOL], metadata={"sim_tool_calls": "3"}
        )
        (*_, paused) = await client.until_done()
        assert isinstance(paused, ResponseDone)
        assert paused.response.status == "requires_action"
        relay.cut()
        # The pause is taken up on a new connection, where the checkpoint left it.
        (resumed,) = await client.until_done()
        assert isinstance(resumed, ResponseResumed)
        assert resumed.response.id == paused.response.id
        assert resumed.sequence_number == paused.sequence_number + 1
        assert resumed.response.output == paused.response.output
        waiting = paused.response.required_action.call_ids  # type: ignore[union-attr]
        assert client.unanswered(resumed.response) == waiting
        response, seen, _ = await drive(client, resumed)
        assert client.drops == [1006]
        assert client.live_responses == []
    assert relay.accepted == 2
    assert not any(isinstance(event, ErrorEvent) for event in seen)
    assert_quotes_every_output(response, 3)
    await assert_billed_once(running.config.store, response)


async def test_outputs_lost_with_the_connection_are_sent_again(
    relayed: tuple[Any, CuttingRelay],
) -> None:
    running, relay = relayed
    async with resilient(relay.url, **QUICK) as client:
        await client.create(
            model="sim", input="Read two files.", tools=[TOOL], metadata={"sim_tool_calls": "2"}
        )
        (*_, paused) = await client.until_done()
        assert isinstance(paused, ResponseDone)
        (call_id,) = client.unanswered(paused.response)
        # The append leaves, and goes nowhere; then the connection is cut.
        relay.stall_up = True
        output = {"type": "function_call_output", "call_id": call_id, "output": "lost once"}
        await client.append([output])
        await relay.swallowed()  # the append
        relay.cut()
        # The resumed response still waits for that call: the client sends the
        # output again itself, and the reader is not stopped at the resume.
        events = await client.until_done()
        resumed = next(e for e in events if isinstance(e, ResponseResumed))
        assert resumed.response.required_action.call_ids == [call_id]  # type: ignore[union-attr]
        assert client.unanswered(resumed.response) == []
        assert any(isinstance(e, ResponseInProgress) for e in events)
        last = events[-1]
        assert isinstance(last, ResponseDone)
        assert last.response.status == "requires_action"
        response, _, _ = await drive(client, last)
        assert client.drops == [1006]
    text = response.output[-1].content[0].text  # type: ignore[union-attr]
    assert text.count("«lost once»") == 1
    assert_quotes_every_output_but(response, call_id, 2)
    await assert_billed_once(running.config.store, response)


def assert_quotes_every_output_but(response: Response, call_id: str, calls: int) -> None:
    text = response.output[-1].content[0].text  # type: ignore[union-attr]
    call_ids = [item.call_id for item in response.output if isinstance(item, FunctionCall)]
    assert len(call_ids) == calls
    for other in call_ids:
        if other != call_id:
            assert f"«{output_for(other)}»" in text


async def test_outputs_taken_in_are_not_sent_again_and_the_cut_turn_runs_again(
    relayed: tuple[Any, CuttingRelay],
) -> None:
    running, relay = relayed
    slow_answer = {
        "sim_tool_calls": "1",
        "sim_output_tokens": "300",
        "sim_tokens_per_second": "600",
    }
    async with resilient(relay.url, **QUICK) as client:
        await client.create(model="sim", input="Read a file.", tools=[TOOL], metadata=slow_answer)
        (*_, paused) = await client.until_done()
        assert isinstance(paused, ResponseDone)
        (call_id,) = client.unanswered(paused.response)
        await client.append(
            [{"type": "function_call_output", "call_id": call_id, "output": output_for(call_id)}]
        )
        # The output is taken in (its checkpoint is durable before this event),
        # and the final answer streams; cut it half-way.
        before: list[ServerEvent] = []
        while not isinstance(event := await client.next_event(), OutputTextDelta):
            before.append(event)
        before.append(event)
        taken = next(e for e in before if isinstance(e, ResponseInProgress))
        relay.cut()
        events = await client.until_done()
        assert client.drops == [1006]
    resumed = next(e for e in events if isinstance(e, ResponseResumed))
    # Taken up in progress: nothing was sent again (the call is not waited
    # for any more; the server would have refused it) and the answer starts over.
    assert resumed.response.status == "in_progress"
    assert resumed.sequence_number == taken.sequence_number + 1
    assert not any(isinstance(e, ErrorEvent) for e in events)
    # What streamed after the checkpoint before the cut is void: the new
    # connection numbers its events from the resume on, the answer whole.
    void = [e for e in before if e.sequence_number >= resumed.sequence_number]
    assert void
    assert isinstance(void[-1], OutputTextDelta)
    after = events[events.index(resumed) + 1 :]
    assert [e.sequence_number for e in after] == list(
        range(resumed.sequence_number + 1, resumed.sequence_number + 1 + len(after))
    )
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert_quotes_every_output(done.response, 1)
    await assert_billed_once(running.config.store, done.response)


async def test_a_pause_whose_done_was_lost_stops_the_reader_at_the_resume(
    relayed: tuple[Any, CuttingRelay],
) -> None:
    running, relay = relayed
    slow_start = {"sim_tool_calls": "2", "sim_ttft_ms": "200"}
    async with resilient(relay.url, **QUICK) as client:
        await client.create(model="sim", input="Read two files.", tools=[TOOL], metadata=slow_start)
        while not isinstance(await client.next_event(), ResponseInProgress):
            pass
        # The turn's events, its response.done among them, go into the void.
        relay.stall_down = True
        await relay.swallowed(b'"response.done"')
        relay.cut()
        (resumed,) = await client.until_done()
        assert isinstance(resumed, ResponseResumed)
        assert resumed.response.status == "requires_action"
        assert len(client.unanswered(resumed.response)) == 1
        # The loop goes on from the resumed event as from a response.done.
        response, _, _ = await drive(client, resumed)
    assert_quotes_every_output(response, 2)
    await assert_billed_once(running.config.store, response)


async def test_a_cancel_lost_with_the_connection_is_sent_again(
    relayed: tuple[Any, CuttingRelay],
) -> None:
    running, relay = relayed
    async with resilient(relay.url, **QUICK) as client:
        await client.create(
            model="sim", input="Read a file.", tools=[TOOL], metadata={"sim_tool_calls": "1"}
        )
        (*_, paused) = await client.until_done()
        assert isinstance(paused, ResponseDone)
        relay.stall_up = True
        await client.cancel()
        await relay.swallowed()  # the cancel
        relay.cut()
        # Resumed (still paused: the cancel never arrived), then cancelled; the
        # reader is not stopped at the resume for the output it will not send.
        events = await client.until_done()
        assert [type(e) for e in events] == [ResponseResumed, ResponseDone]
        done = events[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "cancelled"
        assert client.live_responses == []
    await assert_billed_once(running.config.store, done.response)


async def test_a_create_lost_before_its_response_created_is_sent_again(
    relayed: tuple[Any, CuttingRelay],
) -> None:
    running, relay = relayed
    async with resilient(relay.url, **QUICK) as client:
        relay.stall_up = True
        await client.create(
            model="sim", input="Read a file.", tools=[TOOL], metadata={"sim_tool_calls": "1"}
        )
        await relay.swallowed()  # the create
        relay.cut()
        response, seen, _ = await drive(client)
        assert client.drops == [1006]
    assert not any(isinstance(e, ResponseResumed | ErrorEvent) for e in seen)
    assert_quotes_every_output(response, 1)
    await assert_billed_once(running.config.store, response)


async def test_a_response_with_no_checkpoint_comes_back_as_an_error_and_is_let_go(
    relayed: tuple[Any, CuttingRelay],
) -> None:
    _, relay = relayed
    async with resilient(relay.url, **QUICK) as client:
        await client.create(
            model="sim", input="Read a file.", tools=[TOOL], store=False,
            metadata={"sim_tool_calls": "1"},
        )  # fmt: skip
        (*_, paused) = await client.until_done()
        assert isinstance(paused, ResponseDone)
        relay.cut()
        (refused,) = await client.until_done()
        assert isinstance(refused, ErrorEvent)
        assert refused.error.code == "response_not_found"
        assert refused.response_id == paused.response.id
        assert client.live_responses == []
        with pytest.raises(LocalProtocolError) as gone:
            await client.append(
                [{"type": "function_call_output", "call_id": "call_x", "output": "x"}],
                response_id=paused.response.id,
            )
        assert gone.value.code == "response_not_found"
        # The new connection serves new responses.
        await client.create(model="sim", input="still here")
        (*_, done) = await client.until_done()
        assert isinstance(done, ResponseDone)
        assert done.response.status == "completed"


async def test_it_gives_up_after_max_retries(relayed: tuple[Any, CuttingRelay]) -> None:
    _, relay = relayed
    async with resilient(relay.url, max_retries=3, **QUICK) as client:
        await client.create(
            model="sim", input="Read a file.", tools=[TOOL], metadata={"sim_tool_calls": "1"}
        )
        (*_, paused) = await client.until_done()
        assert isinstance(paused, ResponseDone)
        relay.refuse = True
        relay.cut()
        with pytest.raises(ConnectionClosedError) as ended:
            await client.next_event()
        assert ended.value.code == 1006
        assert "gave up after 3" in ended.value.reason
        assert isinstance(ended.value.__cause__, HandshakeError)
        assert relay.accepted == 1 + 3
        with pytest.raises(ConnectionClosedError):
            await client.create(model="sim", input="no more")
        # The response it held is still checkpointed: another client may resume it.
        assert client.live_responses == [paused.response.id]


async def test_a_close_code_the_sdks_do_not_retry_ends_the_client(server: Any) -> None:
    # The client's own limit fails the connection with 1009: not retried.
    metadata = {f"note{i}": "é" * 500 for i in range(4)}
    async with resilient(server.url, max_message_bytes=4000, **QUICK) as client:
        await client.create(model="sim", input="hello", metadata=metadata)
        with pytest.raises(ConnectionClosedError) as closed:
            await client.until_done()
        assert closed.value.code == 1009
        assert client.drops == []


async def test_the_connection_lifetime_limit_is_crossed(make_server: Any) -> None:
    running = make_server(connection_lifetime=0.3)
    async with resilient(running.url, **QUICK) as client:
        await client.create(
            model="sim", input="Read two files.", tools=[TOOL], metadata={"sim_tool_calls": "2"}
        )
        (*_, paused) = await client.until_done()
        assert isinstance(paused, ResponseDone)
        # Paused past the limit: the server's error and close (1000) are the
        # client's to answer: a new connection at once, the pause taken up.
        await wait_until(lambda: client.drops, "the lifetime limit")
        (resumed,) = await client.until_done()
        assert isinstance(resumed, ResponseResumed)
        response, seen, _ = await drive(client, resumed)
        assert client.drops[0] == 1000
    assert not any(isinstance(e, ErrorEvent) for e in seen)
    assert_quotes_every_output(response, 2)


# --- a server process stopped and started again ------------------------------------


@pytest.mark.slow  # a server process stopped (drained or killed) and started again
@pytest.mark.parametrize(("stop", "code"), [(signal.SIGTERM, 1012), (signal.SIGKILL, 1006)])
async def test_a_stopped_process_is_left_and_its_successor_resumes(
    tmp_path: Any, stop: signal.Signals, code: int
) -> None:
    store = f"sqlite:///{tmp_path}/responses.db"
    first = await trio.to_thread.run_sync(ServerProcess("--store", store).start)
    successor: ServerProcess | None = None
    try:
        # Long enough (about 20 s) to span the drain and the successor's start.
        patient = {"max_retries": 40, "initial_delay": 0.05, "max_delay": 0.5}
        async with resilient(first.url, **patient) as client:
            await client.create(
                model="sim", input="Read three files.", tools=[TOOL],
                metadata={"sim_tool_calls": "3"},
            )  # fmt: skip
            (*_, paused) = await client.until_done()
            assert isinstance(paused, ResponseDone)
            await trio.to_thread.run_sync(stop_process, first.process, stop, 30.0)
            successor = ServerProcess("--store", store, port=first.port)
            await trio.to_thread.run_sync(successor.start)
            (resumed,) = await client.until_done(timeout=60)
            assert isinstance(resumed, ResponseResumed)
            response, _, _ = await drive(client, resumed)
            assert client.drops == [code]
        assert_quotes_every_output(response, 3)
        await assert_billed_once(store, response)
    finally:
        for process in (first, successor):
            if process is not None:
                await trio.to_thread.run_sync(process.stop)
