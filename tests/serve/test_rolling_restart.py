"""Issue 30's deployment target: append rollouts outlive a kill -9 and a rolling restart.

The deployment of ``tests/serve/test_nginx.py`` (Debian's nginx with
docs/RELIABILITY.md's proxy settings, round robin over two ``longresponse
serve`` processes on the session's real ``redis-server``), driven by the
trio client that reconnects and resumes (``longresponse.client.resilient``):

- :data:`ROLLOUTS` append-mode rollouts of :data:`CALLS` tool calls each run
  at once through nginx, each on its own connection; each tool takes a
  moment (seeded), each turn a moment of model time (``sim_ttft_ms``);
- once every rollout has answered two calls, one process is killed (SIGKILL)
  and started again on its port; after four, the other one (which holds every
  socket by then) is stopped with SIGTERM (its drain lets running turns end
  and closes every socket 1012) and started again; after six, the first one
  is (:data:`RESTARTS`);
- no rollout may answer its last call before all of that is over, so every
  one of them lives through every restart.

Every rollout completes with every tool output quoted in its final answer,
and the usage ledger (the Redis store's ``usage()``) holds exactly one record
per rollout, the final Response's usage, and none for any other response of
this key.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import random
import signal
import time
import uuid
from typing import Any

import pytest
import trio

from longresponse.client import resilient
from longresponse.server_process import ServerProcess, stop_process
from longresponse.storage.backends import open_store
from protocol.events import ErrorEvent, ResponseDone, ResponseResumed
from protocol.response import Response
from tests.support.nginx_server import NginxProxy

#: Debian's nginx in front of two processes on one redis.
pytestmark = pytest.mark.services

ROLLOUTS = 20
CALLS = 10
TOOL = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
#: A moment of model time per turn, a few tokens at a time.
MODEL = {"sim_tool_calls": str(CALLS), "sim_ttft_ms": "100", "sim_tokens_per_second": "200"}
#: Seconds a tool takes, drawn per call.
TOOL_SECONDS = (0.1, 0.4)
#: Seconds a stopped process may take to drain, and a rollout to end.
STOP_TIMEOUT = 30.0
ROLLOUT_TIMEOUT = 120.0


class Run:
    """What the rollouts and the restarts share."""

    def __init__(self) -> None:
        self.answered = [0] * ROLLOUTS
        self.progress = trio.Event()  # set and replaced whenever a rollout answers a call
        self.restarted = trio.Event()  # every restart is over: the last calls may be answered
        #: Per rollout: its final Response, the outputs sent, the close codes of
        #: its connections that dropped, and its resumes by status.
        self.results: dict[
            int, tuple[Response, list[str], list[int], collections.Counter[str]]
        ] = {}

    def answer(self, index: int) -> None:
        self.answered[index] += 1
        self.progress.set()
        self.progress = trio.Event()

    async def until_every_rollout_answered(self, calls: int) -> None:
        while min(self.answered) < calls:
            await self.progress.wait()


def output_of(index: int, call: int) -> str:
    return f"rollout {index} file {call}"


async def rollout(url: str, key: str, index: int, run: Run) -> None:
    """One rollout to its end, as the README's loop drives it (the resilient client)."""
    rng = random.Random(index)
    outputs: list[str] = []
    resumed: collections.Counter[str] = collections.Counter()
    headers = [(b"authorization", f"Bearer {key}".encode())]
    async with resilient(url, headers=headers) as client:
        await client.create(
            model="sim", input=f"Rollout {index}: read {CALLS} files.", tools=[TOOL], metadata=MODEL
        )
        while True:
            events = await client.until_done(timeout=ROLLOUT_TIMEOUT)
            for event in events:
                if isinstance(event, ResponseResumed):
                    resumed[event.response.status] += 1
            last = events[-1]
            assert not isinstance(last, ErrorEvent), (index, last)
            assert isinstance(last, ResponseDone | ResponseResumed), (index, last)
            response = last.response
            if response.status != "requires_action":
                break
            answers = []
            for call_id in client.unanswered(response):
                if len(outputs) == CALLS - 1:
                    await run.restarted.wait()  # the last call waits for every restart
                await trio.sleep(rng.uniform(*TOOL_SECONDS))  # the tool runs
                outputs.append(output_of(index, len(outputs)))
                answers.append(
                    {"type": "function_call_output", "call_id": call_id, "output": outputs[-1]}
                )
            await client.append(answers)
            for _ in answers:
                run.answer(index)
        run.results[index] = (response, outputs, list(client.drops), resumed)


#: Each restart, once every rollout has answered this many calls: kill -9 of the
#: first process, then SIGTERM of each in turn (the second first: after the kill
#: every socket is on it), each started again on its port.
RESTARTS = ((2, 0, signal.SIGKILL), (4, 1, signal.SIGTERM), (6, 0, signal.SIGTERM))


async def restarts(processes: list[ServerProcess], flags: tuple[str, ...], run: Run) -> None:
    """:data:`RESTARTS`, one after the other, while the rollouts run."""
    for calls, index, stop in RESTARTS:
        await run.until_every_rollout_answered(calls)
        process = processes[index]
        await trio.to_thread.run_sync(stop_process, process.process, stop, STOP_TIMEOUT)
        processes[index] = ServerProcess(*flags, port=process.port)
        await trio.to_thread.run_sync(processes[index].start)
    run.restarted.set()


async def drive(url: str, key: str, processes: list[ServerProcess], flags: tuple[str, ...]) -> Run:
    run = Run()
    async with trio.open_nursery() as nursery:
        for index in range(ROLLOUTS):
            nursery.start_soon(rollout, url, key, index, run)
        await restarts(processes, flags, run)
    return run


def ledger(store_url: str) -> list[Any]:
    async def read() -> list[Any]:
        store = open_store(store_url)
        try:
            return await store.usage()
        finally:
            await store.aclose()

    return asyncio.run(read())


@pytest.mark.slow  # four process starts, a kill -9 and two drains under 20 rollouts (about 10 s)
def test_rollouts_outlive_a_kill_and_a_rolling_restart(redis_url: str) -> None:
    key = f"rolling-{uuid.uuid4().hex}"  # this test's records, and only them, in the ledger
    flags = ("--store", redis_url, "--api-key", key)
    processes = [ServerProcess(*flags), ServerProcess(*flags)]
    started = time.monotonic()
    try:
        with concurrent.futures.ThreadPoolExecutor() as starting:
            list(starting.map(ServerProcess.start, processes))
        with NginxProxy([process.port for process in processes]) as proxy:
            url = f"ws://127.0.0.1:{proxy.port}/v1/responses"
            run = trio.run(drive, url, key, processes, flags)
            refused = proxy.log.count("no live upstreams")
    finally:
        for process in processes:
            process.stop()
    seconds = time.monotonic() - started
    # nginx sent every reconnect on to a process that was up.
    assert refused == 0, proxy.log
    assert sorted(run.results) == list(range(ROLLOUTS))
    drops: list[int] = []
    for index, (response, outputs, dropped, _) in run.results.items():
        assert response.status == "completed", (index, response.status, response.error)
        text = response.output[-1].content[0].text  # type: ignore[union-attr]
        assert f"I read {CALLS} tool outputs" in text, (index, text)
        for output in outputs:
            assert f"«{output}»" in text, (index, output, text)
        assert len(outputs) == CALLS
        drops += dropped
    # Every rollout lived through the restarts: each lost its connection at
    # least once (to the kill or a drain) and was resumed.
    assert all(run.results[i][2] for i in range(ROLLOUTS))
    assert set(drops) <= {1006, 1012}
    assert drops.count(1012) >= ROLLOUTS  # every socket drained once at least
    # One ledger record per rollout, the final Response's usage, and no other.
    records = {r.response_id: r for r in ledger(redis_url)}
    ours = {response.id: response for response, *_ in run.results.values()}
    owners = {records[response_id].owner for response_id in ours}
    assert len(owners) == 1
    of_this_key = {rid for rid, record in records.items() if record.owner in owners}
    assert of_this_key == set(ours)
    for response_id, response in ours.items():
        usage, record = response.usage, records[response_id]
        assert usage is not None
        assert (record.input_tokens, record.cached_tokens, record.output_tokens) == (
            usage.input_tokens,
            usage.input_tokens_details.cached_tokens,
            usage.output_tokens,
        ), response_id
    resumed = sum((r[3] for r in run.results.values()), collections.Counter[str]())
    print(  # the figures docs/RELIABILITY.md gives
        f"\n{ROLLOUTS} rollouts x {CALLS} calls completed in {seconds:.1f} s "
        f"(process starts included); connections dropped {len(drops)} times "
        f"({drops.count(1006)} x 1006, {drops.count(1012)} x 1012); resumed "
        f"{resumed['requires_action']} times paused, {resumed['in_progress']} times "
        "with the turn run again"
    )
