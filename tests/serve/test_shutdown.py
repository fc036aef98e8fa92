"""Graceful shutdown of a real server process (``longresponse serve``).

On SIGTERM or SIGINT the server stops reading new work, lets the turns in
flight run to their end, then closes every WebSocket with 1012 (Service
Restart: clients reconnect and resend); a connection with nothing running
(idle, or paused for its client's tool outputs) is closed at once; and the
drain timeout bounds a turn that would not finish.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import httpx
import pytest
import trio
import websockets

from longresponse.client import ConnectionClosedError, connect
from longresponse.server_process import ServerProcess
from protocol.events import OutputTextDelta, ResponseDone, ServerEvent
from tests.conftest import openai_client

#: server processes stopped by signals, with their drains.
pytestmark = pytest.mark.slow

READ_FILE = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
#: A turn of about three seconds: 75 words at 25 a second.
SLOW = {"sim_output_tokens": "75", "sim_tokens_per_second": "25"}


def serve(*flags: str) -> ServerProcess:
    return ServerProcess("--store", "memory://", *flags)


async def events_until_closed(client: Any) -> tuple[list[ServerEvent], ConnectionClosedError]:
    events: list[ServerEvent] = []
    while True:
        try:
            events.append(await client.next_event())
        except ConnectionClosedError as closed:
            return events, closed


async def exited(server: ServerProcess) -> int | None:
    assert server.process is not None
    return await trio.to_thread.run_sync(server.process.wait, 20)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_turn_in_flight_finishes_then_the_socket_closes_1012(sig: int) -> None:
    with serve("--shutdown-drain-timeout", "30") as server:
        assert server.process is not None
        async with connect(server.url) as client:
            await client.create(model="sim", input="Write at length.", metadata=SLOW)
            while not isinstance(await client.next_event(), OutputTextDelta):
                pass
            server.process.send_signal(sig)  # mid-turn
            events, closed = await events_until_closed(client)
        assert await exited(server) is not None
    done = [e for e in events if isinstance(e, ResponseDone)]
    assert [d.response.status for d in done] == ["completed"]
    assert events[-1] is done[0]  # the turn's end is the last thing sent
    assert (closed.code, closed.reason) == (1012, "service restart")
    text = done[0].response.output[-1].content[0].text  # type: ignore[union-attr]
    assert len(text.split()) >= 75  # the whole answer, not a cut-off one


async def test_connections_with_nothing_running_close_at_once() -> None:
    """An idle connection and a rollout paused for its client's tool outputs hold
    nothing up: both close 1012 long before the (long) drain timeout."""
    with serve("--shutdown-drain-timeout", "120") as server:
        assert server.process is not None
        async with connect(server.url) as idle, connect(server.url) as paused:
            await paused.create(model="sim", input="Read it.", tools=[READ_FILE])
            pause = (await paused.until_done())[-1]
            assert isinstance(pause, ResponseDone)
            assert pause.response.status == "requires_action"
            server.process.send_signal(signal.SIGTERM)
            with trio.fail_after(20):  # far below the drain timeout
                for client in (idle, paused):
                    events, closed = await events_until_closed(client)
                    assert events == []
                    assert closed.code == 1012
        with trio.fail_after(20):
            assert await exited(server) is not None


async def test_the_drain_timeout_bounds_a_turn_that_would_not_finish() -> None:
    forever = {"sim_output_tokens": "5000", "sim_tokens_per_second": "20"}
    with serve("--shutdown-drain-timeout", "1") as server:
        assert server.process is not None
        async with connect(server.url) as client:
            await client.create(model="sim", input="Never stop.", metadata=forever)
            while not isinstance(await client.next_event(), OutputTextDelta):
                pass
            server.process.send_signal(signal.SIGTERM)
            with trio.fail_after(20):  # the turn alone would take minutes
                events, closed = await events_until_closed(client)
        assert await exited(server) is not None
    assert closed.code == 1012
    assert events, "the turn kept streaming while it drained"
    assert not any(isinstance(e, ResponseDone) for e in events)  # cut off, no end


def test_a_multi_agent_response_waiting_for_inject_holds_nothing_up() -> None:
    """The official SDK on the multi-agent beta: a Response waiting in place
    for ``response.inject`` is not a running turn; the socket closes 1012."""
    with serve("--shutdown-drain-timeout", "120") as server:
        assert server.process is not None
        client = openai_client(server)  # type: ignore[arg-type]
        headers = {"OpenAI-Beta": "responses_multi_agent=v1"}
        with client.beta.responses.connect(extra_headers=headers) as conn:
            conn.response.create(
                model="sim",
                input="Read it.",
                tools=[READ_FILE],
                store=False,
                multi_agent={"enabled": True},
            )
            while (event := conn.recv()).type != "response.output_item.done":
                pass
            server.process.send_signal(signal.SIGTERM)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                conn.recv_bytes()
        assert server.process.wait(timeout=20) is not None
    assert event.item.type == "function_call"
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1012


def test_background_responses_and_their_followers_hold_shutdown_only_as_long_as_the_drain() -> None:
    """A slow background response with a stream follower: SIGTERM ends it failed
    within the drain timeout, the follower's stream ends, the process exits."""
    with serve("--shutdown-drain-timeout", "2") as server:
        slow = {"sim_output_tokens": "20000", "sim_tokens_per_second": "50"}
        body = {"input": "take your time", "background": True, "metadata": slow}
        with httpx.Client(timeout=30) as http:
            started = http.post(f"{server.http_url}/v1/responses", json=body)
            assert started.status_code == 200, started.text
            rid = started.json()["id"]
        seen: list[str] = []

        def follow() -> None:
            url = f"{server.http_url}/v1/responses/{rid}?stream=true"
            with httpx.Client(timeout=60) as reader, reader.stream("GET", url) as stream:
                for line in stream.iter_lines():
                    if line.startswith("event: "):
                        seen.append(line.removeprefix("event: "))

        follower = threading.Thread(target=follow)
        follower.start()
        time.sleep(0.5)
        assert server.process is not None
        sent = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=20)
        elapsed = time.monotonic() - sent
        follower.join(timeout=10)
        assert not follower.is_alive()
    assert elapsed < 10, f"shutdown took {elapsed:.1f} s with a 2 s drain"
    assert seen[-1] == "response.failed", seen[-3:]
