"""A request that fails, is refused or is cancelled gives its memory back when
it ends, with the collector off (issue 28).

The server's collector runs a full collection rarely (``serve/collector.py``),
so whatever a finished request leaves in a reference cycle stays until then:
an exception kept with its traceback holds every frame that raised it, and
with them the rollout, its token arrays and the request's text. Here the
collector is off for the whole scenario, as it is between full collections,
and each scenario must leave none of the objects a request or a connection
is made of alive once it has ended.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import json
from collections.abc import Iterator
from typing import Any, Final

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from longresponse.config import ServerConfig
from protocol import APPEND_SUBPROTOCOL
from tests.support.waiting import wait_for

#: An input far past the small window below: refused ``context_length_exceeded``.
LONG = "word " * 100_000
TOOL = {"type": "function", "name": "read_file", "parameters": {"type": "object"}}


#: What a request or a connection is made of, on the server's side (the
#: inspector's records of the latest connections, the pipeline's last tools
#: and the store's writer's last record are kept by design, bounded).
KINDS: Final = frozenset({
    "Rollout", "Segment", "Reply", "TokenCache", "StreamBuilder", "Session", "Outbox",
    "Connection", "ResponseTrack", "ShippedShape", "AppendShape", "Lanes", "Lane",
    "Steering", "SegmentCache", "LingeringWSProtocol", "RecordingSink", "SSESink",
})  # fmt: skip


def alive() -> collections.Counter[str]:
    """The server's request and connection objects alive, by class."""
    return collections.Counter(
        name
        for o in gc.get_objects()
        if (name := type(o).__qualname__) in KINDS
        and type(o).__module__.startswith(("longresponse.", "protocol."))
    )


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def small_window(make_server: Any, collector_off: None) -> Any:
    sim = dataclasses.replace(ServerConfig().sim, context_window=2000)
    return make_server(sim=sim)


def freed(running: Any, before: collections.Counter[str]) -> None:
    """Wait until the server holds no more of :data:`KINDS` than ``before``."""

    running.last_session = None  # the harness keeps the last one for other tests

    def back() -> bool:
        return running.live_sessions == 0 and alive() <= before

    try:
        wait_for(back, "the finished requests' memory to be freed", seconds=5)
    except AssertionError:
        raise AssertionError(f"still alive: {alive() - before}") from None


def test_a_refused_http_create_keeps_nothing(small_window: Any) -> None:
    before = alive()
    with httpx.Client(base_url=small_window.http_url, timeout=30) as http:
        for stream in (False, True):
            for _ in range(3):
                reply = http.post(
                    "/v1/responses", json={"model": "sim", "input": LONG, "stream": stream}
                )
                if stream:
                    assert "context_length_exceeded" in reply.text
                else:
                    assert reply.status_code == 400
                    assert reply.json()["error"]["code"] == "context_length_exceeded"
    freed(small_window, before)


def test_a_failed_websocket_create_keeps_nothing_once_closed(small_window: Any) -> None:
    before = alive()
    for _ in range(3):
        with ws_connect(small_window.url, max_size=None) as socket:
            socket.send(json.dumps({"type": "response.create", "model": "sim", "input": LONG}))
            while (event := json.loads(socket.recv(timeout=30)))["type"] not in (
                "response.failed",
                "error",
            ):
                pass
            assert "context_length_exceeded" in json.dumps(event)
    freed(small_window, before)


def test_an_append_rollout_that_took_large_input_keeps_nothing_once_closed(
    make_server: Any, collector_off: None
) -> None:
    """A paused rollout given a large tool output, then cancelled mid-turn; and
    one left paused when its client goes."""
    running = make_server()
    before = alive()
    for cancel in (True, False, True):
        with ws_connect(running.url, subprotocols=[APPEND_SUBPROTOCOL], max_size=None) as socket:
            socket.send(json.dumps({"type": "response.create", "model": "sim", "input": "go",
                                    "tools": [TOOL]}))  # fmt: skip
            while (event := json.loads(socket.recv(timeout=30)))["type"] != "response.done":
                pass
            (call,) = event["response"]["output"]
            if not cancel:
                continue  # paused at its call when the client leaves
            output = {"type": "function_call_output", "call_id": call["call_id"], "output": LONG}
            socket.send(json.dumps({"type": "response.append", "input": [output]}))
            while json.loads(socket.recv(timeout=30))["type"] != "response.output_item.added":
                pass
            socket.send(json.dumps({"type": "response.cancel"}))
            while (event := json.loads(socket.recv(timeout=30)))["type"] != "response.done":
                pass
            assert event["response"]["status"] in ("cancelled", "requires_action", "completed")
    freed(running, before)


def test_a_shipped_connection_closed_mid_response_keeps_nothing(
    make_server: Any, collector_off: None
) -> None:
    """A shipped-shape response still running (its model waiting for its first
    token, a steer queued for it) when its client goes: the lane's task is
    cancelled, and nothing of the connection stays."""
    running = make_server()
    before = alive()
    waiting = {"sim_tool_calls": "0", "sim_ttft_ms": "5000"}
    for _ in range(3):
        with ws_connect(running.url, max_size=None) as socket:
            socket.send(json.dumps({"type": "response.create", "model": "sim", "input": "go",
                                    "metadata": waiting}))  # fmt: skip
            while (event := json.loads(socket.recv(timeout=30)))["type"] != "response.created":
                pass
            steer = {"type": "response.steer", "previous_response_id": event["response"]["id"],
                     "input": LONG}  # fmt: skip
            socket.send(json.dumps(steer))
            while json.loads(socket.recv(timeout=30))["type"] != "response.steer.accepted":
                pass
    freed(running, before)
