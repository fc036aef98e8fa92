"""Cancellation and disconnects: every task ends, nothing leaks, memory stays bounded."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import wsproto.events as ws

from longresponse.client import connect
from protocol import ResponseState
from protocol.events import OutputTextDelta, ResponseDone
from tests.support.http_clients import read_until_closed, stalled_post
from tests.support.raw_ws import handshake
from tests.support.waiting import wait_until

TOOL = {"type": "function", "name": "read_file", "parameters": {"type": "object"}}


async def live_rollouts(server: Any) -> list[Any]:
    """The rollouts of the server's latest session, once it has one."""
    await wait_until(
        lambda: server.last_session is not None and server.last_session.rollouts,
        "a session with a rollout",
    )
    return list(server.last_session.rollouts.values())


def assert_all_rollouts_ended(server: Any, rollouts: list[Any]) -> None:
    """Every rollout the session ran ended, and the closed session forgot them
    (what they carried is freed with it, not by a full collection: issue 20)."""
    session = server.last_session
    assert session is not None
    assert rollouts
    for rollout in rollouts:
        # Its task ended, and the rollout let go of it (a cancelled task keeps
        # its error's traceback, and with it the frames that ran the rollout).
        assert rollout.task is None
        assert rollout.state is not ResponseState.IN_PROGRESS
    assert session.rollouts == {}


async def test_close_mid_stream_cancels_the_rollout(make_server: Any) -> None:
    running = make_server()
    async with connect(running.url) as client:
        await client.create(
            model="sim",
            input="long answer",
            metadata={"sim_output_tokens": "100000", "sim_tokens_per_second": "500"},
        )
        while not isinstance(await client.next_event(), OutputTextDelta):
            pass
        assert running.live_sessions == 1
        rollouts = await live_rollouts(running)
    await wait_until(lambda: running.live_sessions == 0, "the session to end")
    assert_all_rollouts_ended(running, rollouts)


async def test_close_while_paused_frees_the_rollout(make_server: Any) -> None:
    running = make_server()
    async with connect(running.url) as client:
        await client.create(model="sim", input="go", tools=[TOOL])
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "requires_action"
        rollouts = await live_rollouts(running)
    await wait_until(lambda: running.live_sessions == 0, "the session to end")
    assert_all_rollouts_ended(running, rollouts)


async def test_abrupt_tcp_reset_mid_stream(make_server: Any) -> None:
    running = make_server()
    sock, conn = handshake(running.port)
    create = {
        "type": "response.create",
        "input": "stream",
        "metadata": {"sim_output_tokens": "100000", "sim_tokens_per_second": "500"},
    }
    with sock:
        sock.sendall(conn.send(ws.TextMessage(json.dumps(create))))
        conn.receive_data(sock.recv(65536))  # the first events are out
        rollouts = await live_rollouts(running)
        linger = b"\x01\x00\x00\x00\x00\x00\x00\x00"
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
    # closed with linger 0: a RST, no close frame
    await wait_until(lambda: running.live_sessions == 0, "the session to end")
    assert_all_rollouts_ended(running, rollouts)


async def test_slow_reader_is_disconnected_with_bounded_memory(make_server: Any) -> None:
    running = make_server(send_queue_depth=8, slow_reader_timeout=0.3)
    sock, conn = handshake(running.port, rcvbuf=4096)
    create = {
        "type": "response.create",
        "input": "flood me",
        "metadata": {"sim_output_tokens": "2000000"},
    }
    started = time.monotonic()
    with sock:
        sock.sendall(conn.send(ws.TextMessage(json.dumps(create))))
        rollouts = await live_rollouts(running)
        # Never read: the server must stop buffering and let go of us.
        await wait_until(lambda: running.live_sessions == 0, "the session to end", seconds=30)
    session = running.last_session
    assert session.close_reason == "slow_reader"
    assert session.outbox_high_water <= 8
    assert_all_rollouts_ended(running, rollouts)
    assert time.monotonic() - started < 30


def open_connections(running: Any) -> int:
    """Connections the server still holds open (uvicorn's own set of them)."""
    return len(running.server.server_state.connections)


async def test_a_slow_websocket_reader_is_dropped_and_its_connection_freed(
    make_server: Any,
) -> None:
    running = make_server(send_queue_depth=8, slow_reader_timeout=0.3)
    sock, conn = handshake(running.port, rcvbuf=4096)
    create = {
        "type": "response.create",
        "input": "flood me",
        "metadata": {"sim_output_tokens": "2000000"},
    }
    with sock:
        sock.sendall(conn.send(ws.TextMessage(json.dumps(create))))
        await wait_until(lambda: open_connections(running) == 1, "the connection")
        # Still never reading: the server lets go of the TCP connection too,
        # not only of the session (a graceful close would wait to flush).
        await wait_until(
            lambda: open_connections(running) == 0, "the connection to be dropped", seconds=30
        )
        sock.settimeout(5)
        received = read_until_closed(sock)
        # What reaches us is what was in flight, not the megabytes it held.
        assert len(received) < 4 * 1024 * 1024


async def test_a_slow_sse_reader_is_dropped_and_its_connection_freed(make_server: Any) -> None:
    running = make_server(slow_reader_timeout=0.3)
    body = {
        "input": "flood me",
        "stream": True,
        "store": False,
        "metadata": {"sim_output_tokens": "2000000"},
    }
    with stalled_post(running.port, "/v1/responses", body) as sock:
        await wait_until(lambda: open_connections(running) == 1, "the connection")
        await wait_until(
            lambda: open_connections(running) == 0, "the connection to be dropped", seconds=30
        )
        received = read_until_closed(sock)
        assert received.startswith(b"HTTP/1.1 200")
        assert len(received) < 4 * 1024 * 1024
        assert b"event: response.completed" not in received
