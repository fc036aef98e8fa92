"""The inspector: /inspect in headless Chromium, its JSON endpoint, its feed, its bounds.

The page test runs an append rollout (the project's trio client) left paused
on a pending tool call, a shipped-shape chain (the official SDK's
``responses.connect()``) and an HTTP chain (the SDK over HTTP), then opens
``/inspect`` in Debian's chromium through its chromedriver (selenium, no
download) and checks what the page shows; it saves ``docs/inspect.png``.
"""

from __future__ import annotations

import collections
import itertools
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio

from longresponse.bench.conversation import Turn
from longresponse.bench.measure import turn_row
from longresponse.bench.options import Workload
from longresponse.client import AppendClient, connect
from longresponse.engine.timing import TurnTiming
from longresponse.serve.inspector import observer as inspector_module
from longresponse.serve.inspector.observer import Watcher
from longresponse.server_process import ServerProcess, free_port
from protocol.events import OutputItemDone, ResponseDone
from protocol.items import FunctionCall
from tests.conftest import RunningServer, openai_client
from tests.support.paths import ROOT

READ_TOOL = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
SCREENSHOT = ROOT / "docs" / "inspect.png"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: Seconds the browser waits for the page to show something.
PAGE_WAIT = 10


def calls_of(events: list[Any]) -> list[FunctionCall]:
    return [
        e.item for e in events if isinstance(e, OutputItemDone) and isinstance(e.item, FunctionCall)
    ]


async def paused_append_rollout(client: AppendClient, answered: int) -> tuple[str, str]:
    """An append rollout whose first ``answered`` tool calls get their outputs; it
    is left paused on the next one. Returns (response id, the pending call id)."""
    await client.create(
        model="sim",
        input="Find the bug in fizz_buzz().",
        tools=[READ_TOOL],
        metadata={"sim_tool_calls": str(answered + 1)},
    )
    for turn in range(answered + 1):
        events = await client.until_done()
        done = events[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "requires_action"
        (call,) = calls_of(events)
        if turn == answered:
            return done.response.id, call.call_id
        output = f"contents {turn}: " + "x" * 400
        await client.append(
            [{"type": "function_call_output", "call_id": call.call_id, "output": output}]
        )
    raise AssertionError("unreachable")


def shipped_chain(server: RunningServer, calls: int) -> list[str]:
    """A shipped-shape chain over the SDK's WebSocket: ``calls`` tool calls answered."""
    client = openai_client(server)
    ids: list[str] = []
    with client.responses.connect() as conn:
        conn.response.create(
            model="sim",
            input="Check the weather.",
            tools=[READ_TOOL],
            store=False,
            metadata={"sim_tool_calls": str(calls)},
        )
        while True:
            event = conn.recv()
            while event.type != "response.completed":
                event = conn.recv()
            response = event.response
            ids.append(response.id)
            pending = [o for o in response.output if o.type == "function_call"]
            if not pending:
                return ids
            conn.response.create(
                model="sim",
                previous_response_id=response.id,
                input=[
                    {"type": "function_call_output", "call_id": c.call_id, "output": "y" * 400}
                    for c in pending
                ],
                tools=[READ_TOOL],
                store=False,
                metadata={"sim_tool_calls": str(calls)},
            )


def http_chain(server: RunningServer, calls: int) -> list[str]:
    """The same conversation over HTTP with the SDK: stored, chained by previous_response_id."""
    client = openai_client(server)
    response = client.responses.create(
        model="sim",
        input="Check the weather.",
        tools=[READ_TOOL],
        metadata={"sim_tool_calls": str(calls)},
    )
    ids = [response.id]
    while pending := [o for o in response.output if o.type == "function_call"]:
        response = client.responses.create(
            model="sim",
            previous_response_id=response.id,
            input=[
                {"type": "function_call_output", "call_id": c.call_id, "output": "y" * 400}
                for c in pending
            ],
            tools=[READ_TOOL],
            metadata={"sim_tool_calls": str(calls)},
        )
        ids.append(response.id)
    return ids


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Debian chromium through its own chromedriver (nothing downloaded)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="inspect-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1600,1100",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def check_page(driver: Any, base: str, append_id: str, pending: str, shipped: list[str]) -> None:
    """What the page must show (runs in a thread: selenium blocks)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    # The page redraws its rows as the feed speaks: an element read a moment
    # after it was found may be gone, so each read finds its row again.
    wait = WebDriverWait(driver, PAGE_WAIT, ignored_exceptions=(StaleElementReferenceException,))
    driver.get(f"{base}/inspect")

    def rollout_row(rid: str) -> Any:
        return driver.find_element(By.CSS_SELECTOR, f'#rollouts tr[data-rollout-id="{rid}"]')

    def seen(rid: str) -> tuple[str | None, str]:
        """The row's status and text, read from one element (found again if stale)."""

        def read(_: Any) -> tuple[str | None, str]:
            row = rollout_row(rid)
            return row.get_attribute("data-status"), row.text

        return wait.until(read)

    def click(rid: str) -> None:
        wait.until(lambda d: rollout_row(rid).click() or True)

    wait.until(lambda d: rollout_row(append_id))
    # Both rollouts, with their state: the append one paused on its call.
    status, text = seen(append_id)
    assert status == "paused"
    assert "waiting for" in text
    assert pending in text
    assert "append" in text
    status, text = seen(shipped[0])
    assert status == "completed"
    assert "shipped" in text
    # The server panel.
    wait.until(lambda d: "up" in d.find_element(By.CSS_SELECTOR, "#server").text)
    panel = driver.find_element(By.CSS_SELECTOR, "#server").text
    assert "event-loop lag" in panel
    assert "paused rollouts" in panel
    # The shipped chain's timeline: one bar per response of the chain.
    click(shipped[0])
    wait.until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#timeline svg.turn-bar")) == len(shipped)
    )
    assert shipped[0] in driver.find_element(By.ID, "detail-id").text
    # The append rollout's timeline: three turns, each a stacked bar of phases.
    click(append_id)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#timeline svg.turn-bar")) == 3)
    assert append_id in driver.find_element(By.ID, "detail-id").text
    assert pending in driver.find_element(By.ID, "detail-state").text
    bars = driver.find_elements(By.CSS_SELECTOR, "#timeline svg.turn-bar")
    for bar in bars:
        phases = {r.get_attribute("data-phase") for r in bar.find_elements(By.TAG_NAME, "rect")}
        assert {"admission", "render", "ttft", "count", "decode", "pause"} <= phases
    # The tool outputs were counted after their turn's first output: a count bar.
    count = bars[1].find_element(By.CSS_SELECTOR, 'rect[data-phase="count"]')
    assert float(count.get_attribute("width")) > 0
    # The later turns waited for the client's tools: their pause bar has a width.
    pause = bars[1].find_element(By.CSS_SELECTOR, 'rect[data-phase="pause"]')
    assert float(pause.get_attribute("width")) > 0
    numbers = driver.find_elements(By.CSS_SELECTOR, "#timeline .turn-numbers")
    assert "cached" in numbers[1].text
    assert "total" in numbers[1].text
    assert "kB" in numbers[1].text or " B" in numbers[1].text
    # The event log: client and server events, filterable by type.
    log = driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")
    types = {r.get_attribute("data-type") for r in log}
    assert {"response.create", "response.append", "response.done"} <= types
    # A run of deltas is one row: its count, its sequence numbers first to last.
    (run, *_) = (r for r in log if r.get_attribute("data-type").endswith("arguments.delta"))
    cells = run.find_elements(By.TAG_NAME, "td")
    assert cells[3].text.startswith("response.function_call_arguments.delta \u00d7")
    first, last = cells[4].text.split("\u2013")
    assert int(last) - int(first) + 1 == int(cells[3].text.rsplit("\u00d7", 1)[1])
    Select(driver.find_element(By.ID, "event-filter")).select_by_value("response.append")
    filtered = driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")
    assert len(filtered) == 2
    assert {r.get_attribute("data-type") for r in filtered} == {"response.append"}
    Select(driver.find_element(By.ID, "event-filter")).select_by_value("")
    download = driver.find_element(By.ID, "download").get_attribute("href")
    assert download.endswith(f"/inspect/api/rollouts/{append_id}/trace")
    SCREENSHOT.parent.mkdir(exist_ok=True)
    driver.save_screenshot(str(SCREENSHOT))


async def test_the_page_shows_rollouts_turns_pauses_and_events(
    make_server: Any, browser: Any
) -> None:
    server = make_server()
    await trio.to_thread.run_sync(http_chain, server, 3)
    shipped = await trio.to_thread.run_sync(shipped_chain, server, 2)
    assert len(shipped) == 3
    async with connect(server.url) as client:
        append_id, pending = await paused_append_rollout(client, answered=2)
        await trio.to_thread.run_sync(
            check_page, browser, server.http_url, append_id, pending, shipped
        )
    assert SCREENSHOT.stat().st_size > 10_000


# --- the JSON endpoint and the feed, without the page ---------------------------------


def next_message(lines: Iterator[str]) -> tuple[str, Any]:
    """The next Server-Sent Event of a feed: its name and its data."""
    kind = None
    for line in lines:
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            assert kind is not None
            return kind, json.loads(line[len("data: ") :])
    raise AssertionError("the feed ended")


def follow_feed(url: str, opened: threading.Event, turns: int) -> dict[str, list[Any]]:
    """Read a feed (in a thread) until it told of ``turns`` turns; by message kind."""
    seen: dict[str, list[Any]] = collections.defaultdict(list)
    with httpx.stream("GET", url, timeout=10) as feed:
        assert feed.status_code == 200
        assert feed.headers["content-type"].startswith("text/event-stream")
        lines = feed.iter_lines()
        while len(seen["turn"]) < turns:
            kind, data = next_message(lines)
            seen[kind].append(data)
            opened.set()
    return seen


async def test_the_json_endpoint_and_the_feed(make_server: Any) -> None:
    server = make_server()
    opened = threading.Event()
    followed: dict[str, list[Any]] = {}

    async def follow() -> None:
        url = f"{server.http_url}/inspect/api/feed"
        followed.update(await trio.to_thread.run_sync(follow_feed, url, opened, 2))

    async with httpx.AsyncClient(base_url=server.http_url) as http:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(follow)
                assert await trio.to_thread.run_sync(opened.wait, 10)
                async with connect(server.url) as client:
                    response_id, pending = await paused_append_rollout(client, answered=1)
                    state = (await http.get("/inspect/api/state")).json()
        # The feed began with the state, then told of the rollout, its events and
        # its turns as they happened.
        first = followed["state"][0]
        assert first["rollouts"] == []
        assert {"event_loop_lag_ms", "memory", "store", "live_rollouts"} <= set(first["server"])
        assert all(t["rollout"] == response_id for t in followed["turn"])
        assert [t["turn"]["turn"] for t in followed["turn"]] == [1, 2]
        told = {e["event"]["type"] for e in followed["event"]}
        assert {"response.create", "response.append", "response.done"} <= told
        assert followed["rollout"][-1]["status"] == "paused"
        assert followed["connection"][0]["shape"] == "append"
        # The state while it is paused: the connection, the rollout, its call.
        (rollout,) = state["rollouts"]
        assert rollout["id"] == response_id
        assert rollout["status"] == "paused"
        assert rollout["pending_call_ids"] == [pending]
        assert state["server"]["paused_rollouts"] == 1
        assert {c["shape"] for c in state["connections"]} == {"http", "append"}
        # The rollout, with its timeline and its events; its connection closed
        # (once the server has seen it go), it was cut off, as the server ended it.
        with trio.fail_after(5):
            while server.live_sessions:  # noqa: ASYNC110 - the server's own count
                await trio.sleep(0.01)
        detail = (await http.get(f"/inspect/api/rollouts/{response_id}")).json()
        assert detail["status"] == "cancelled"
        assert detail["pending_call_ids"] == []
        assert len(detail["timeline"]) == 2
        second = detail["timeline"][1]
        assert second["cached_tokens"] > 0
        assert second["input_tokens"] >= second["cached_tokens"]
        assert second["bytes_in"] > 400  # the append with its 400-character output
        assert second["bytes_out"] > 0
        assert second["pause_ms"] >= 0
        assert set(second["server"]) == set(TurnTiming(turn=0).as_metrics())
        events = detail["events"]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert all(a["at"] <= b["at"] for a, b in itertools.pairwise(events))
        assert ("client", "response.append") in {(e["direction"], e["type"]) for e in events}
        assert all(e["bytes"] > 0 for e in events if e["direction"] == "server")
        # Consecutive deltas of one item share an entry (one per turn here): the
        # first one's sequence_number, their count; the next event follows the run.
        deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
        assert len(deltas) == 2
        assert all(e["count"] > 1 for e in deltas)
        assert all(e["count"] == 1 for e in events if e not in deltas)
        sent = [e for e in events if e["direction"] == "server"]
        for entry, after in itertools.pairwise(sent):
            if entry in deltas:
                assert after["sequence_number"] == entry["sequence_number"] + entry["count"]
        # The feed told of each run as it grew: the same entry, its count one more
        # each time, up to the count kept.
        for entry in deltas:
            told_run = [e["event"] for e in followed["event"] if e["event"]["seq"] == entry["seq"]]
            assert [e["count"] for e in told_run] == list(range(1, entry["count"] + 1))
            assert told_run[-1] == entry
        # The download: longresponse bench's turns.json shape, one rollout.
        trace = await http.get(f"/inspect/api/rollouts/{response_id}/trace")
        assert trace.headers["content-disposition"] == f'attachment; filename="{response_id}.json"'
        (record,) = trace.json()["rollouts"]
        bench_row = turn_row(
            Turn(0, 1, 1.0, 1.0, 1, 1, 0, {}, 0.0), None, Workload(1, 1, 0, 0, 0, 0), "append"
        )
        assert set(bench_row) <= set(record["turns"][0])
        assert [t["kind"] for t in record["turns"]] == ["create", "continuation"]
        assert record["events"] == events
        # An unknown rollout: the shipped envelope.
        missing = await http.get("/inspect/api/rollouts/resp_nope")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        assert missing.json()["error"]["param"] == "rollout_id"


# --- keys, bounds -------------------------------------------------------------------

INSPECT_PATHS = [
    "/inspect",
    "/inspect/static/inspect.js",
    "/inspect/api/state",
    "/inspect/api/rollouts/resp_x",
    "/inspect/api/rollouts/resp_x/trace",
    "/inspect/api/feed",
]


def test_wrong_or_missing_key_is_401_for_the_page_the_api_and_the_feed(
    make_server: Any,
) -> None:
    server = make_server(api_keys=("sk-right",))
    with httpx.Client(base_url=server.http_url) as http:
        for path in INSPECT_PATHS:
            for query in ("", "?key=sk-wrong"):
                answer = http.get(path + query)
                assert answer.status_code == 401, (path, query)
                error = answer.json()["error"]
                assert error["code"] == "invalid_api_key"
                assert error["type"] == "invalid_request_error"
            wrong_header = http.get(path, headers={"authorization": "Bearer sk-wrong"})
            assert wrong_header.status_code == 401
        # The right key, as ?key= (a browser) or as the header (a tool).
        page = http.get("/inspect?key=sk-right")
        assert page.status_code == 200
        assert "<title>longresponse inspector</title>" in page.text
        state = http.get("/inspect/api/state", headers={"authorization": "Bearer sk-right"})
        assert state.status_code == 200
        with http.stream("GET", "/inspect/api/feed?key=sk-right") as feed:
            assert feed.status_code == 200
            assert next_message(feed.iter_lines())[0] == "state"
        # ?key= is the inspector's only: the API proper still wants the header.
        models = http.get("/v1/models?key=sk-right")
        assert models.status_code == 401


def test_the_feed_refuses_watchers_past_the_bound(make_server: Any) -> None:
    server = make_server(inspector_watchers=2)
    with httpx.Client(base_url=server.http_url) as http:
        # (Each feed's line iterator is held: dropping it closes the stream.)
        with http.stream("GET", "/inspect/api/feed") as one:
            one_lines = one.iter_lines()
            assert next_message(one_lines)[0] == "state"
            with http.stream("GET", "/inspect/api/feed") as two:
                two_lines = two.iter_lines()
                assert next_message(two_lines)[0] == "state"
                refused = http.get("/inspect/api/feed")
                assert refused.status_code == 429
                error = refused.json()["error"]
                assert error["code"] == "too_many_watchers"
                assert "limit is 2" in error["message"]
                state = http.get("/inspect/api/state").json()
                assert state["server"]["watchers"] == 2
                assert next_message(one_lines)[0] == "state"  # both still served
                assert next_message(two_lines)[0] == "state"
        # Closed feeds leave (the server sees the disconnect): a new one is taken.
        deadline = time.monotonic() + 5
        while http.get("/inspect/api/state").json()["server"]["watchers"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with http.stream("GET", "/inspect/api/feed") as three:
            assert three.status_code == 200


async def test_each_rollout_keeps_a_bounded_ring_and_rollouts_are_pruned(
    make_server: Any,
) -> None:
    server = make_server()
    inspector = server.app.parts.inspector
    inspector.ring = 16
    inspector.max_rollouts = 3
    async with httpx.AsyncClient(base_url=server.http_url) as http, connect(server.url) as client:
        response_id, _ = await paused_append_rollout(client, answered=3)
        detail = (await http.get(f"/inspect/api/rollouts/{response_id}")).json()
        events = detail["events"]
        assert len(events) == 16
        assert detail["events_kept"] == 16
        # The most recent ones, still numbered from the rollout's first event.
        assert events[-1]["seq"] > 16
        assert [e["seq"] for e in events] == list(range(events[0]["seq"], events[-1]["seq"] + 1))
        assert events[-1]["type"] == "response.done"
        assert len(detail["timeline"]) == 4  # turns are kept apart from the ring
        # More rollouts than kept: the finished ones go first, the paused one stays.
        first = None
        for n in range(4):
            answer = await http.post("/v1/responses", json={"model": "sim", "input": f"hi {n}"})
            first = first or answer.json()["id"]
        state = (await http.get("/inspect/api/state")).json()
        kept = [r["id"] for r in state["rollouts"]]
        assert len(kept) == 3
        assert response_id in kept
        assert first not in kept
        assert (await http.get(f"/inspect/api/rollouts/{first}")).status_code == 404


async def test_what_is_read_is_never_behind_the_events_sent(
    make_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Server events are digested after the turn; here the timer never comes
    # (an hour), so only the readers' own digest can show the last turn.
    monkeypatch.setattr(inspector_module, "DIGEST_AFTER", 3600.0)
    server = make_server()
    async with httpx.AsyncClient(base_url=server.http_url) as http, connect(server.url) as client:
        response_id, pending = await paused_append_rollout(client, answered=1)
        state = (await http.get("/inspect/api/state")).json()
        (rollout,) = state["rollouts"]
        assert rollout["status"] == "paused"
        assert rollout["pending_call_ids"] == [pending]  # the second turn's call
        detail = (await http.get(f"/inspect/api/rollouts/{response_id}")).json()
        last = detail["events"][-1]
        assert last["type"] == "response.done"
        assert last["detail"] == {"status": "requires_action", "call_ids": [pending]}
        assert [e["seq"] for e in detail["events"]] == list(range(1, len(detail["events"]) + 1))
        appends = [i for i, e in enumerate(detail["events"]) if e["type"] == "response.append"]
        (append,) = appends
        # The append came after the first turn's events and before the second's.
        assert detail["events"][append - 1]["type"] == "response.done"
        assert detail["events"][append + 1]["type"] == "response.in_progress"


async def test_with_the_inspector_off_nothing_is_kept(make_server: Any) -> None:
    server = make_server(inspector=False)
    async with connect(server.url) as client:
        await paused_append_rollout(client, answered=0)
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            state = (await http.get("/inspect/api/state")).json()
    assert state["enabled"] is False
    assert state["rollouts"] == []
    assert [c["id"] for c in state["connections"]] == ["http"]


def test_a_watcher_that_falls_behind_is_told_and_dropped() -> None:
    watcher = Watcher(depth=3)
    for n in range(5):
        watcher.offer("event", {"n": n})
    assert watcher.lagged
    drained = [watcher.queue.get_nowait() for _ in range(watcher.queue.qsize())]
    assert drained[-1] == ("lagged", {})
    # The oldest gave way to the word that ends the feed; nothing after it was taken.
    assert [d for _, d in drained[:-1]] == [{"n": 1}, {"n": 2}]


@pytest.mark.slow  # a server process's graceful shutdown
def test_an_open_feed_does_not_hold_up_a_graceful_shutdown() -> None:
    """SIGTERM with a feed open: the feed ends and the process exits well within
    the drain timeout (a feed is not a turn to wait for)."""
    with ServerProcess("--store", "memory://", "--shutdown-drain-timeout", "20") as server:
        opened = threading.Event()
        kinds: list[str] = []

        def follow() -> None:
            url = f"{server.http_url}/inspect/api/feed"
            with httpx.Client(timeout=30) as reader, reader.stream("GET", url) as feed:
                for line in feed.iter_lines():
                    if line.startswith("event: "):
                        kinds.append(line.removeprefix("event: "))
                        opened.set()

        follower = threading.Thread(target=follow)
        follower.start()
        assert opened.wait(10)
        assert server.process is not None
        sent = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=20)  # (uvicorn re-raises the signal once it is done)
        elapsed = time.monotonic() - sent
        follower.join(timeout=10)
        assert not follower.is_alive()
    assert kinds[0] == "state"
    assert elapsed < 5, f"shutdown took {elapsed:.1f} s with a feed open"


def test_a_shipped_chain_paused_on_a_call_and_its_open_connection(make_server: Any) -> None:
    server = make_server()
    client = openai_client(server)
    with client.responses.connect() as conn, httpx.Client(base_url=server.http_url) as http:
        conn.response.create(
            model="sim",
            input="Check the weather.",
            tools=[READ_TOOL],
            store=False,
            metadata={"sim_tool_calls": "1"},
        )
        event = conn.recv()
        while event.type != "response.completed":
            event = conn.recv()
        (call,) = [o for o in event.response.output if o.type == "function_call"]
        state = http.get("/inspect/api/state").json()
        (shipped,) = [c for c in state["connections"] if c["shape"] == "shipped"]
        assert shipped["open"] is True
        assert shipped["lanes"] == 1  # the default lane
        assert shipped["outbox_events"] == 0
        assert shipped["bytes_in"] > 0
        (rollout,) = state["rollouts"]
        assert rollout["id"] == event.response.id
        assert rollout["connection"] == shipped["id"]
        # Completed with a client call unanswered: the chain waits for it.
        assert rollout["status"] == "paused"
        assert rollout["pending_call_ids"] == [call.call_id]
        conn.response.create(
            model="sim",
            previous_response_id=event.response.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
            tools=[READ_TOOL],
            store=False,
            metadata={"sim_tool_calls": "1"},
        )
        event = conn.recv()
        while event.type != "response.completed":
            event = conn.recv()
        detail = http.get(f"/inspect/api/rollouts/{rollout['id']}").json()
    # The continuation is the same rollout's second turn; nothing is pending now.
    assert detail["status"] == "completed"
    assert detail["pending_call_ids"] == []
    assert detail["response_ids"] == [rollout["id"], event.response.id]
    assert [t["response_id"] for t in detail["timeline"]] == detail["response_ids"]
    assert detail["timeline"][1]["cached_tokens"] > 0  # continued in place


def test_an_http_chain_is_one_rollout_and_a_fork_opens_another(make_server: Any) -> None:
    server = make_server()
    with httpx.Client(base_url=server.http_url) as http:
        first = http.post("/v1/responses", json={"model": "sim", "input": "one"}).json()
        body = {"model": "sim", "input": "two", "previous_response_id": first["id"]}
        second = http.post("/v1/responses", json=body).json()
        fork = http.post("/v1/responses", json=body).json()  # from `first` again
        state = http.get("/inspect/api/state").json()
        chain = http.get(f"/inspect/api/rollouts/{first['id']}").json()
    assert [r["id"] for r in state["rollouts"]] == [first["id"], fork["id"]]
    assert chain["response_ids"] == [first["id"], second["id"]]
    assert chain["shape"] == "http"
    assert chain["connection"] == "http"
    # HTTP reads the stored history back; with the parent's tokens in the token
    # cache (the default) it is not rendered again, and the parent's context
    # (its input and output) counts as cached, as on a WebSocket chain.
    one, two = chain["timeline"]
    assert two["cached_tokens"] > one["input_tokens"]
    assert two["cached_tokens"] + two["new_tokens"] == two["input_tokens"]
    assert chain["timeline"][1]["bytes_out"] > 0  # the JSON body
    (forked,) = [r for r in state["rollouts"] if r["id"] == fork["id"]]
    assert forked["parent"] == first["id"]


@pytest.mark.slow  # a server process, its log read back
def test_a_key_in_the_address_never_reaches_the_access_log() -> None:
    # The page carries its key as ?key= (a browser cannot set a header on a page
    # load or an EventSource), and uvicorn's access log prints the query: a real
    # server process at log level info, its log read back.
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "longresponse", "serve", "--port", str(port),
         "--store", "memory://", "--api-key", "sk-in-the-address", "--log-level", "info"],
        stdout=subprocess.PIPE,  # uvicorn's access log
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
                    page = http.get("/inspect", params={"key": "sk-in-the-address"})
                    state = http.get("/inspect/api/state?key=sk-in-the-address&x=1")
                    wrong = http.get("/inspect?key=sk-wrong-one")
                    # Every spelling of ``key`` authenticates as the key itself and
                    # is cut out of the log all the same.
                    encoded = [
                        http.get(f"/inspect/api/state?{query}").status_code
                        for query in (
                            "%6Bey=sk-in-the-address",
                            "k%65y=sk-in-the-address&x=2",
                            "%256Bey=sk-in-the-address",
                        )
                    ]
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.1)
        assert (page.status_code, state.status_code, wrong.status_code) == (200, 200, 401)
        assert encoded == [200, 200, 401]
    finally:
        process.send_signal(signal.SIGINT)
        log, _ = process.communicate(timeout=30)
    assert "GET /inspect/api/state?key=[redacted]&x=1" in log
    assert "GET /inspect?key=[redacted]" in log
    assert "GET /inspect/api/state?%6Bey=[redacted]" in log
    assert "GET /inspect/api/state?k%65y=[redacted]&x=2" in log
    assert "sk-in-the-address" not in log
    assert "sk-wrong-one" not in log


async def test_an_http_create_refused_before_its_turn_leaves_no_body_behind(
    make_server: Any,
) -> None:
    server = make_server()
    creates = server.app.parts.inspector.http.creates
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        for body in (
            {"model": "no-such-model", "input": "x" * 100_000},
            {"model": "sim", "input": "x", "previous_response_id": "resp_missing"},
        ):
            refused = await http.post("/v1/responses", json=body)
            assert refused.status_code in (400, 404)
        answered = await http.post("/v1/responses", json={"model": "sim", "input": "hi"})
        assert answered.status_code == 200
    assert creates == {}
