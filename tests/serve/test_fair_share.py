"""Shared workers are shared fairly between API keys (issue 28, item 7).

One key's long texts, read by the secrets classifier for seconds, held the
two check threads and the one classifier child, so another key's create
with a new tool or a 300 Ki-character text waited for all of them. Here,
over a real server with two keys, keyB's short requests are answered while
keyA's long reads are still running; the classifier's findings on long
texts read in several children at once are those of one :func:`scan`; and
:class:`FairSlots` serves waiting keys round-robin.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from longresponse.engine.classifier import scan
from longresponse.serve.fair_share import AdmittingTurns, FairSlots
from longresponse.serve.scan_process import FAR_CHARS, ScanProcess
from tests.support.waiting import wait_for

#: keyA's texts: ``--password `` repeated, which the classifier reads at
#: about 0.8 s a MB (so each takes seconds; keyB's take milliseconds).
LONG_CHARS = 1_600_000


def _post(url: str, key: str, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=120) as http:
        return http.post("/v1/responses", json=body, headers={"authorization": f"Bearer {key}"})


@pytest.mark.slow  # keyA's two long texts take seconds to read, one after the other
def test_one_keys_long_reads_do_not_hold_another_keys_short_requests(
    make_server: Callable[..., Any],
) -> None:
    running = make_server(api_keys=("keyA", "keyB"))
    url, turns = running.http_url, running.app.parts.turns
    ended: dict[str, float] = {}
    replies: dict[str, httpx.Response] = {}

    def send(label: str, key: str, body: dict[str, Any]) -> None:
        replies[label] = _post(url, key, body)
        ended[label] = time.perf_counter()

    long = {"model": "sim", "input": "--password " * (LONG_CHARS // 11), "store": False}
    attackers = [threading.Thread(target=send, args=(f"keyA{i}", "keyA", long)) for i in range(2)]
    for thread in attackers:
        thread.start()
    try:
        wait_for(
            lambda: turns.checker.slots.in_use == 2 and turns.scanner.slots.in_use == 1,
            "keyA's two creates in check threads, one read in a child",
            30,
        )
        tool = {"type": "function", "name": "read_file", "parameters": {"type": "object"}}
        send("tool", "keyB", {"model": "sim", "input": "hi", "store": False, "tools": [tool]})
        secret = "sk-proj-" + "Ab1" * 16
        text = "plain words " * (FAR_CHARS // 12) + secret
        send("text", "keyB", {"model": "sim", "input": text, "store": False})
    finally:
        for thread in attackers:
            thread.join(120)

    assert replies["tool"].status_code == 200, replies["tool"].text[:300]
    assert replies["text"].status_code == 200, replies["text"].text[:300]
    first_of_a = min(ended["keyA0"], ended["keyA1"])
    assert ended["tool"] < first_of_a, "keyB's create with a tool waited for keyA's reads"
    assert ended["text"] < first_of_a, "keyB's long text waited for keyA's reads"
    for label in ("keyA0", "keyA1"):  # read whole all the same, and answered
        assert replies[label].status_code == 200, replies[label].text[:300]


def test_long_texts_read_at_once_in_several_children_find_what_scan_finds() -> None:
    filler = "plain words and more " * (FAR_CHARS // 21 + 1)
    texts = {
        "keyA": filler + "password = 'hunter2-is-long'" + filler + "ghp_" + "a1B2" * 9,
        "keyB": "token: " + "ghp_" + "c3D4" * 9 + " " + filler + "sk-proj-" + "Ab1" * 16,
    }
    scanner = ScanProcess(children=2)
    found: dict[str, object] = {}
    barrier = threading.Barrier(2)

    def read(key: str) -> None:
        barrier.wait()
        found[key] = scanner.scan(texts[key], key=key)

    try:
        threads = [threading.Thread(target=read, args=(key,)) for key in texts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        scanner.close()
    for key, text in texts.items():
        assert found[key] == scan(text), key
    assert {f.kind for f in scan(texts["keyA"])} >= {"password_assignment", "github_token"}
    assert {f.kind for f in scan(texts["keyB"])} >= {"github_token", "openai_api_key"}


def test_waiting_keys_are_served_round_robin() -> None:
    slots = FairSlots(1, per_key=1)
    order: list[str] = []
    slots.request("a", lambda: order.append("a0"))  # granted now: the one slot
    for name in ("a1", "a2", "a3", "b0", "b1", "c0"):
        slots.request(name[0], lambda name=name: order.append(name))
    assert order == ["a0"]
    for _ in range(6):
        slots.release(order[-1][0])
    assert order == ["a0", "a1", "b0", "c0", "a2", "b1", "a3"]
    slots.release("a")
    assert slots.in_use == 0


def test_a_key_holds_at_most_its_share_of_the_slots() -> None:
    slots = FairSlots(3, per_key=2)
    granted: list[str] = []
    for name in ("a0", "a1", "a2", "b0"):
        slots.request(name[0], lambda name=name: granted.append(name))
    assert granted == ["a0", "a1", "b0"], "key a took a third slot while b waited"
    assert slots.held_by("a") == 2
    slots.release("b")
    assert slots.held_by("a") == 2, "a third slot for a: its share is two"
    slots.release("a")
    assert granted[-1] == "a2"


# --- a create's turn on the loop (AdmittingTurns) ----------------------------------


def test_a_keys_burst_waits_its_turn_while_another_key_goes_first() -> None:
    async def scenario() -> list[str]:
        turns = AdmittingTurns(slots=16, per_key=2)
        started: list[str] = []
        gate = asyncio.Event()

        async def create(key: str, number: int) -> None:
            async with turns.turn(key):
                started.append(f"{key}{number}")
                await gate.wait()

        async with asyncio.TaskGroup() as group:
            for number in range(6):
                group.create_task(create("a", number))
            await asyncio.sleep(0)
            group.create_task(create("b", 0))
            await asyncio.sleep(0.01)
            # keyA holds its two turns; its four others wait; keyB's goes at once.
            assert started == ["a0", "a1", "b0"]
            assert turns.slots.held_by("a") == 2
            gate.set()
        assert turns.slots.in_use == 0
        return started

    assert sorted(asyncio.run(scenario())) == sorted([*(f"a{n}" for n in range(6)), "b0"])


def test_a_create_whose_client_left_while_it_waited_gives_its_turn_up() -> None:
    async def scenario() -> None:
        turns = AdmittingTurns(slots=16, per_key=1)
        held = asyncio.Event()
        release = asyncio.Event()

        async def holder() -> None:
            async with turns.turn("a"):
                held.set()
                await release.wait()

        first = asyncio.create_task(holder())
        await held.wait()
        waiting = asyncio.create_task(holder())  # waits behind the first
        await asyncio.sleep(0.01)
        waiting.cancel()  # its client left
        await asyncio.gather(waiting, return_exceptions=True)
        release.set()
        await first
        assert turns.slots.in_use == 0
        async with asyncio.timeout(1):  # the next one is not blocked by the one that left
            async with turns.turn("a"):
                assert turns.slots.held_by("a") == 1

    asyncio.run(scenario())
