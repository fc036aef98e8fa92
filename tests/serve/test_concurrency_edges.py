"""Edge cases found in review, each once a real bug, now regression tests.

Forks after an in-place prefix change, a cancel while sampling waits for a
full outbox, error replies from a client that never reads, the lane of a
refused create, and an append or cancel sent right behind its create. Each
docstring says what used to go wrong.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest
import trio
import wsproto
import wsproto.events as ws

from longresponse.engine.render import render_item, render_prefix
from tests.support.http_clients import openai_client
from tests.support.raw_ws import handshake
from tests.support.shipped_ws import TERMINAL
from tests.support.waiting import wait_until


def turn(conn: Any) -> list[Any]:
    events = []
    while True:
        event = json.loads(conn.recv_bytes())
        events.append(event)
        if event["type"] in TERMINAL:
            return events


def drain(
    sock: socket.socket, conn: wsproto.WSConnection, seconds: float, *, pauses: bool = False
) -> tuple[list[Any], Any]:
    """Read frames until the socket closes, a response ends (or, with
    ``pauses``, waits for tool output) or ``seconds`` pass; return (events, close)."""
    events: list[Any] = []
    close: Any = None
    sock.settimeout(0.5)
    deadline = time.monotonic() + seconds
    buffer = ""
    while time.monotonic() < deadline:
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            continue
        except ConnectionResetError:
            conn.receive_data(None)
            break
        conn.receive_data(data if data else None)
        for event in conn.events():
            if isinstance(event, ws.TextMessage):
                buffer += event.data
                if event.message_finished:
                    events.append(json.loads(buffer))
                    buffer = ""
            elif isinstance(event, ws.CloseConnection):
                close = event
        if not data or close is not None:
            break
        if (
            events
            and events[-1].get("type") == "response.done"
            and events[-1]["response"]["status"]
            in {"cancelled", "completed", "failed", "incomplete"}
            | ({"requires_action"} if pauses else set())
        ):
            break
    return events, close


# --- 1. fork from an older segment after the prefix was rebased ------------


def test_fork_after_in_place_continuation_with_shorter_instructions(make_server: Any) -> None:
    """Rollout.fork slices ``tokens`` at ``boundary.tokens``, a length measured
    with the prefix (instructions/tools) the rollout had THEN. An in-place
    continuation that changed the instructions rebased the token cache onto a
    new prefix of another length, so the boundary's offset no longer lines up.
    With a shorter new prefix the offset is past the end: TokenCache.fork
    raises ValueError inside ShippedShape._run, which _serve_lane does not
    catch: the session's TaskGroup dies and the whole socket drops (every lane).
    """
    running = make_server()
    with openai_client(running).responses.connect() as conn:
        conn.response.create(
            model="sim", input="hi", instructions="Be very careful. " * 200, store=False
        )
        a = turn(conn)[-1]
        assert a["type"] == "response.completed"
        # Continue A in place with no instructions: the prefix shrinks.
        conn.response.create(
            model="sim", previous_response_id=a["response"]["id"], input="next", store=False
        )
        b = turn(conn)[-1]
        assert b["type"] == "response.completed"
        # Fork from A (no longer the latest segment).
        conn.response.create(
            model="sim",
            previous_response_id=a["response"]["id"],
            input="fork",
            instructions="Be very careful. " * 200,
            store=False,
        )
        c = turn(conn)[-1]
        assert c["type"] == "response.completed", c
        text = c["response"]["output"][0]["content"][0]["text"]
        assert "«hi»" in text
        assert "«fork»" in text
        assert "next" not in text


def test_fork_after_in_place_continuation_with_longer_instructions(make_server: Any) -> None:
    """Same root cause, the other direction: the new prefix is longer, so the
    fork's token cache silently loses the tail of the history (the
    incremental render no longer equals a full render, and usage.input_tokens
    of the fork is wrong)."""
    running = make_server()
    with openai_client(running).responses.connect() as conn:
        conn.response.create(model="sim", input="hi", store=False)
        a = turn(conn)[-1]
        conn.response.create(
            model="sim",
            previous_response_id=a["response"]["id"],
            input="next",
            instructions="Be very careful. " * 200,
            store=False,
        )
        turn(conn)
        conn.response.create(
            model="sim", previous_response_id=a["response"]["id"], input="fork", store=False
        )
        c = turn(conn)[-1]
        assert c["type"] == "response.completed", c
        session = running.last_session
        child, _ = session.shipped.cache.lookup(c["response"]["id"])
        full = list(render_prefix(None, []))
        for item in child.context:
            full.extend(render_item(item))
        assert child.tokens.snapshot() == full
        # What the fork's model saw as input: the prefix, "hi", A's answer, "fork".
        expected_input = len(full) - len(render_item(child.context[-1]))
        assert c["response"]["usage"]["input_tokens"] == expected_input


# --- 2. response.cancel while the rollout waits for outbox space -----------


async def test_cancel_while_blocked_on_a_full_outbox(make_server: Any) -> None:
    """StreamBuilder numbers an event when it is built, before Session.emit
    waits for room. A response.cancel that lands while the rollout waits in
    emit (slow reader, full outbox) drops that event, but its
    sequence_number is used: Rollout.run then builds the cancelled
    response.done with the NEXT number, Connection.send rejects the gap with
    LocalProtocolError, which escapes Rollout.run (raised inside its
    ``except CancelledError`` handler), is not suppressed by
    Session._run_rollout, and tears down the session's TaskGroup: the client
    never gets its ``response.done`` (cancelled) and the socket drops.
    """
    running = make_server(send_queue_depth=4, slow_reader_timeout=30.0)
    sock, conn = handshake(running.port, rcvbuf=4096)
    create = {
        "type": "response.create",
        "input": "flood me",
        "metadata": {"sim_output_tokens": "2000000"},
    }
    with sock:
        sock.sendall(conn.send(ws.TextMessage(json.dumps(create))))
        await wait_until(lambda: running.last_session is not None, "a session")
        session = running.last_session
        # Wait until the rollout is parked in emit on a full outbox.
        await wait_until(
            lambda: len(session.outbox) >= 4 and session.rollouts, "a full outbox", seconds=20
        )
        await trio.sleep(0.2)
        (rollout_id,) = list(session.rollouts)
        cancel = {"type": "response.cancel", "response_id": rollout_id}
        sock.sendall(conn.send(ws.TextMessage(json.dumps(cancel))))
        await trio.sleep(0.3)
        events, close = drain(sock, conn, seconds=20)
    assert events, "nothing received"
    last = events[-1]
    assert last["type"] == "response.done", (last, close)
    assert last["response"]["status"] == "cancelled"
    numbers = [e["sequence_number"] for e in events if "sequence_number" in e]
    assert numbers == list(range(len(numbers))), "gap in sequence_number"


# --- 3. error replies are not bounded by send_queue_depth ------------------


@pytest.mark.slow  # floods a stuck socket for seconds
async def test_error_replies_grow_the_outbox_without_bound(make_server: Any) -> None:
    """Session._emit_error appends past send_queue_depth ("the reader is what
    limits client messages"), but a client that writes and never reads is
    not limited by anything: every junk frame adds an encoded error event to
    the outbox while the writer is blocked on the full socket. Memory grows
    with the number of frames sent (design §10 / pitfall 9: the outbound
    buffer must stay bounded; the slow reader should be cut off instead)."""
    running = make_server(send_queue_depth=4, slow_reader_timeout=60.0)
    sock, conn = handshake(running.port, rcvbuf=4096)
    flood = {
        "type": "response.create",
        "input": "flood me",
        "metadata": {"sim_output_tokens": "2000000"},
    }
    with sock:
        sock.sendall(conn.send(ws.TextMessage(json.dumps(flood))))
        await wait_until(lambda: running.last_session is not None, "a session")
        session = running.last_session
        await wait_until(lambda: len(session.outbox) >= 4, "a full outbox", seconds=20)
        junk = conn.send(ws.TextMessage("x")) * 5000
        sock.sendall(junk)
        # Give the server time to read them all (it keeps reading: nothing
        # stops its read loop while the writer is stuck).
        size = 0
        with trio.move_on_after(5):
            while len(session.outbox) < 1000:  # noqa: ASYNC110
                await trio.sleep(0.05)
        size = len(session.outbox)
        alive = running.live_sessions
    assert alive == 0 or size <= 4 * 2, f"outbox holds {size} events (depth 4)"


# --- 4. errors of a named lane without their stream_id ---------------------


def test_too_many_items_error_on_a_named_lane_carries_stream_id(make_server: Any) -> None:
    """Connection.receive_message rejects a create with too many items before
    Session.handle_message has the event, so the error loses the stream_id
    the create named (G2: an error tied to a named lane carries its
    stream_id). The same holds for any decode error of a create on a lane
    (e.g. a wrongly typed field)."""
    running = make_server(max_items_per_event=2)
    with openai_client(running).responses.connect() as conn:
        items = [{"type": "message", "role": "user", "content": "x"}] * 3
        conn.send({"type": "response.create", "model": "sim", "input": items, "stream_id": "lane1"})
        error = json.loads(conn.recv_bytes())
        assert error["type"] == "error"
        assert error["error"]["code"] == "too_many_items"
        assert error.get("stream_id") == "lane1", error
        conn.send(
            {
                "type": "response.create",
                "model": "sim",
                "input": "x",
                "temperature": "hot",
                "stream_id": "lane2",
            }
        )
        error = json.loads(conn.recv_bytes())
        assert error["type"] == "error"
        assert error.get("stream_id") == "lane2", error


# --- 5. response.cancel / append without response_id right after a create --


async def test_cancel_without_id_right_after_create_targets_the_new_rollout(
    make_server: Any,
) -> None:
    """Without ``response_id`` an append/cancel targets the latest rollout,
    but Session._target asks the sans-IO Connection, which learns of a
    rollout only when its ``response.created`` is SENT (by the rollout's own
    task, later). A create followed at once by a cancel (one TCP read) thus
    cancels the PREVIOUS rollout (here: a paused one the client still wants)
    and leaves the new one running. Which rollout is hit depends on server
    scheduling, not on the order of the client's messages."""
    running = make_server()
    sock, conn = handshake(running.port)
    tool = {"type": "function", "name": "read_file", "parameters": {"type": "object"}}
    first = {"type": "response.create", "input": "pause", "tools": [tool]}
    with sock:
        sock.sendall(conn.send(ws.TextMessage(json.dumps(first))))
        events, _ = [], None
        while not events or events[-1].get("type") != "response.done":
            got, _ = drain(sock, conn, seconds=2, pauses=True)
            events.extend(got)
        r1 = events[-1]["response"]["id"]
        assert events[-1]["response"]["status"] == "requires_action"
        second = {
            "type": "response.create",
            "input": "long",
            "metadata": {"sim_output_tokens": "5000", "sim_tokens_per_second": "1000"},
        }
        burst = conn.send(ws.TextMessage(json.dumps(second))) + conn.send(
            ws.TextMessage(json.dumps({"type": "response.cancel"}))
        )
        sock.sendall(burst)
        await trio.sleep(0.5)
        session = running.last_session
        states = {rid: r.state.value for rid, r in session.rollouts.items()}
    assert states.get(r1) == "requires_action", states
    assert "cancelled" in states.values(), states
