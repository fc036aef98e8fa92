"""``longresponse soak``: many connections of mixed shapes for minutes; memory over time.

Theory of operation
-------------------
A fleet of N clients in one trio process, a third of each shape: append mode
(one WebSocket, each rollout a ``response.create`` that pauses on a tool call,
then a ``response.append`` of its output), the shipped WebSocket shape
(``response.create`` chained by ``previous_response_id``, ``store: false``,
from the connection's cache) and HTTP chains (``POST /v1/responses`` with
``stream: true``, ``store: true``, chained through the store). Every chain
restarts after ``--chain`` tool rounds, so no context grows for the whole run;
a shipped-shape client opens a new connection for each chain (the connection
cache keeps every segment of a connection until its byte budget, SPEC §10.4,
so restarted chains on one connection would grow it by design). Each client
waits ``--think`` seconds between turns.

What is checked, per shape: errors (an ``error`` event or HTTP status, a
response that ends other than expected, a broken connection, a timeout);
sequence gaps (each response's ``sequence_number`` must run 0, 1, 2... without
a hole or a repeat); lost outputs (the answer after a tool output must quote
it, under its call id); and the latency of every turn (send to terminal
event), reported as p50/p99.

The run has three phases, with the server's resident memory
(``process_resident_memory_bytes`` on ``/metrics``) sampled throughout:

1. warm-up: the fleet runs ``--warm-up`` seconds, closes, and after
   ``--settle`` seconds the *warm idle* figure is read;
2. soak: the fleet runs ``--minutes``; the samples after its first
   ``--warm-up`` seconds (the ramp-up) must stay within 10% of each other;
3. after: the fleet has closed; ``--settle`` seconds later the figure must
   be back within 10% of the warm idle one.

Bounded: the connection count is capped as ``bench-scale`` caps it, minutes
at :data:`MAX_MINUTES`, every awaited event at :data:`EVENT_TIMEOUT` and
every phase at its length plus :data:`GRACE` (a client still in a turn then
is cut off, and counted as an error); the server must be on loopback (it is
started with a temporary SQLite store unless ``--url`` names one).
Writes ``soak.json``, ``soak.md`` and ``soak.png`` (:mod:`.soak_report`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any, Final

import httpx
import trio

from protocol import APPEND_SUBPROTOCOL

from ..server_process import server_url
from ..storage.keys import is_loopback
from .echo import RawConnection
from .scale import connection_cap
from .scrape import PROCESS_RESIDENT_BYTES, read_samples
from .soak_report import markdown, plot, verdict
from .throughput import http_url_of, machine, write_results

__all__ = [
    "MAX_MINUTES",
    "SHAPES",
    "Sequences",
    "add_arguments",
    "main",
    "quotes_output",
    "run",
]

SHAPES: Final = ("append", "shipped", "http")
MAX_MINUTES: Final = 120.0
#: Seconds one awaited event, or one HTTP turn, may take.
EVENT_TIMEOUT: Final = 60.0
#: Seconds a phase may overrun its length while the clients finish their turns.
GRACE: Final = 90.0
#: Distinct error messages kept per shape (each is counted, all of them).
ERRORS_KEPT: Final = 20
TOOLS: Final = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]
TERMINAL: Final = frozenset(
    {"response.done", "response.completed", "response.failed", "response.incomplete"}
)


class TurnFailed(Exception):
    """A turn ended other than expected (its message is what the report counts)."""


@dataclasses.dataclass(slots=True)
class Tally:
    """What one shape's clients saw in one phase."""

    turns: int = 0
    gaps: int = 0
    lost: int = 0
    errors: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    latencies: list[float] = dataclasses.field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)

        def pct(q: float) -> float | None:
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None

        return {
            "turns": self.turns,
            "errors": sum(self.errors.values()),
            "error_kinds": dict(self.errors.most_common(ERRORS_KEPT)),
            "sequence_gaps": self.gaps,
            "lost_outputs": self.lost,
            "latency_p50_s": pct(0.50),
            "latency_p99_s": pct(0.99),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    think: float = 2.0
    output_tokens: int = 32
    tokens_per_second: float = 400.0
    chain: int = 4

    def metadata(self) -> dict[str, str]:
        return {
            "sim_tool_calls": "1",
            "sim_output_tokens": str(self.output_tokens),
            "sim_tokens_per_second": str(self.tokens_per_second),
        }


class Sequences:
    """Counts holes and repeats in each response's ``sequence_number``s."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.next: int | None = None

    def see(self, event: dict[str, Any]) -> None:
        seq = event.get("sequence_number")
        if not isinstance(seq, int):
            return  # an error event, or a timing event
        if event["type"] in ("response.created", "response.queued"):
            self.next = 0
        if seq != self.next:
            self.tally.gaps += 1
        self.next = seq + 1


def _check(event: dict[str, Any], status: str) -> dict[str, Any]:
    """The response of terminal ``event``; raises :class:`TurnFailed` unless ``status``."""
    response = event["response"]
    assert isinstance(response, dict)
    if response["status"] != status:
        raise TurnFailed(f"{event['type']} {response['status']}, expected {status}")
    return response


def _call_of(response: dict[str, Any]) -> str:
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    if len(calls) != 1:
        raise TurnFailed(f"{len(calls)} function calls, expected 1")
    return str(calls[0]["call_id"])


def quotes_output(response: dict[str, Any], call_id: str, output: str) -> bool:
    """The answer quotes the tool output under its call id (else it was lost)."""
    texts = [
        part.get("text", "")
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
    ]
    return f"[{call_id}] «{output}»" in " ".join(texts)


async def _terminal(conn: RawConnection, sequences: Sequences) -> dict[str, Any]:
    """Events up to the next terminal one (returned); raises :class:`TurnFailed` on an error."""
    while True:
        event: dict[str, Any] = json.loads(await conn.receive_text(EVENT_TIMEOUT))
        if event["type"] == "error":
            raise TurnFailed(f"error {event['error'].get('code')}")
        sequences.see(event)
        if event["type"] in TERMINAL:
            return event


class _Client:
    """One soak client: its shape's turns in a loop until the deadline."""

    def __init__(self, shape: str, name: str, url: str, work: Workload, tally: Tally) -> None:
        self.shape = shape
        self.name = name
        self.url = url
        self.work = work
        self.tally = tally
        self.rounds = 0
        self.finished = False

    def _output(self) -> str:
        self.rounds += 1
        return f"{self.name}-{self.rounds}"

    async def _timed(self, turn: Any) -> Any:
        start = time.perf_counter()
        result = await turn
        self.tally.latencies.append(time.perf_counter() - start)
        self.tally.turns += 1
        return result

    def _tool_round(self, response: dict[str, Any], call_id: str, output: str) -> None:
        if not quotes_output(response, call_id, output):
            self.tally.lost += 1

    async def loop(self, deadline: float) -> None:
        """Turns until ``deadline`` (trio clock); failures are counted and the
        connection reopened."""
        while trio.current_time() < deadline:
            try:
                await getattr(self, SHAPE_RUNNERS[self.shape])(deadline)
            except Exception as exc:  # every failure is counted, none ends the soak
                self.tally.errors[f"{type(exc).__name__}: {exc}"[:120]] += 1
                await trio.sleep(self.work.think)
        self.finished = True

    async def _ws_rounds(self, deadline: float, append: bool) -> None:
        """Append mode: one connection for the whole phase. The shipped shape: one
        connection per chain (its cache keeps every segment until its budget)."""
        protocols = [APPEND_SUBPROTOCOL] if append else []
        while trio.current_time() < deadline:
            conn = await RawConnection.open(self.url, subprotocols=protocols)
            try:
                while trio.current_time() < deadline:
                    previous: str | None = None
                    for _ in range(self.work.chain):
                        if trio.current_time() >= deadline:
                            break
                        if append:
                            await self._append_round(conn)
                        else:
                            previous = await self._shipped_round(conn, previous)
                        await trio.sleep(self.work.think)
                    if not append:
                        break
            finally:
                await conn.aclose()

    async def append_rounds(self, deadline: float) -> None:
        await self._ws_rounds(deadline, append=True)

    async def shipped_rounds(self, deadline: float) -> None:
        await self._ws_rounds(deadline, append=False)

    async def _append_round(self, conn: RawConnection) -> None:
        """One rollout: create, pause on the call, append its output, done."""
        sequences = Sequences(self.tally)
        create = {"type": "response.create", "model": "sim", "input": "Read the file.",
                  "tools": TOOLS, "store": False, "metadata": self.work.metadata()}  # fmt: skip
        await conn.send_text(json.dumps(create))
        paused = _check(await self._timed(_terminal(conn, sequences)), "requires_action")
        call_id, output = _call_of(paused), self._output()
        append = {"type": "response.append", "response_id": paused["id"], "input": [
            {"type": "function_call_output", "call_id": call_id, "output": output}]}  # fmt: skip
        await conn.send_text(json.dumps(append))
        done = _check(await self._timed(_terminal(conn, sequences)), "completed")
        self._tool_round(done, call_id, output)

    async def _shipped_round(self, conn: RawConnection, previous: str | None) -> str:
        """Two chained responses: the call, then its output; returns the last id."""
        body: dict[str, Any] = {"type": "response.create", "model": "sim", "tools": TOOLS,
                                "store": False, "metadata": self.work.metadata(),
                                "input": "Read the file."}  # fmt: skip
        if previous is not None:
            body["previous_response_id"] = previous
        await conn.send_text(json.dumps(body))
        called = _check(await self._timed(_terminal(conn, Sequences(self.tally))), "completed")
        call_id, output = _call_of(called), self._output()
        body["previous_response_id"] = called["id"]
        body["input"] = [{"type": "function_call_output", "call_id": call_id, "output": output}]
        await conn.send_text(json.dumps(body))
        done = _check(await self._timed(_terminal(conn, Sequences(self.tally))), "completed")
        self._tool_round(done, call_id, output)
        return str(done["id"])

    async def http_rounds(self, deadline: float) -> None:
        base = http_url_of(self.url)
        async with httpx.AsyncClient(base_url=base, timeout=EVENT_TIMEOUT) as http:
            while trio.current_time() < deadline:
                previous: str | None = None
                for _ in range(self.work.chain):
                    if trio.current_time() >= deadline:
                        break
                    body: dict[str, Any] = {"model": "sim", "tools": TOOLS, "store": True,
                                            "stream": True, "metadata": self.work.metadata(),
                                            "input": "Read the file."}  # fmt: skip
                    if previous is not None:
                        body["previous_response_id"] = previous
                    called = await self._timed(self._sse(http, body))
                    call_id, output = _call_of(called), self._output()
                    body["previous_response_id"] = called["id"]
                    body["input"] = [
                        {"type": "function_call_output", "call_id": call_id, "output": output}
                    ]
                    done = await self._timed(self._sse(http, body))
                    self._tool_round(done, call_id, output)
                    previous = str(done["id"])
                    await trio.sleep(self.work.think)

    async def _sse(self, http: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
        sequences = Sequences(self.tally)
        final: dict[str, Any] | None = None
        async with http.stream("POST", "/v1/responses", json=body) as reply:
            if reply.status_code != 200:
                await reply.aread()
                raise TurnFailed(f"HTTP {reply.status_code}")
            async for line in reply.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event.get("type") == "error":
                    raise TurnFailed(f"error {event.get('error', {}).get('code')}")
                sequences.see(event)
                if event.get("type") in TERMINAL:
                    final = event
        if final is None:
            raise TurnFailed("the stream ended without a terminal event")
        return _check(final, "completed")


SHAPE_RUNNERS: Final = {
    "append": "append_rounds",
    "shipped": "shipped_rounds",
    "http": "http_rounds",
}


async def _fleet(url: str, connections: int, seconds: float, work: Workload) -> dict[str, Tally]:
    """N clients (shapes in turn) for ``seconds``; their tallies by shape."""
    tallies = {shape: Tally() for shape in SHAPES}
    deadline = trio.current_time() + seconds
    clients: list[_Client] = []
    with trio.move_on_after(seconds + GRACE):
        async with trio.open_nursery() as nursery:
            for i in range(connections):
                shape = SHAPES[i % len(SHAPES)]
                clients.append(_Client(shape, f"{shape}-{i}", url, work, tallies[shape]))
                nursery.start_soon(clients[-1].loop, deadline)
                if i % 20 == 19:
                    await trio.sleep(0.05)  # open in batches: no thundering herd
    for client in clients:
        if not client.finished:
            client.tally.errors["cut off: still in a turn when the phase's grace ran out"] += 1
    return tallies


async def _sample(http: httpx.AsyncClient, url: str, phase: str, start: float) -> dict[str, Any]:
    samples = await read_samples(http, http_url_of(url), PROCESS_RESIDENT_BYTES)
    return {"t": round(time.monotonic() - start, 2), "phase": phase,
            "rss": int(samples[PROCESS_RESIDENT_BYTES])}  # fmt: skip


async def run(
    url: str,
    connections: int,
    minutes: float,
    *,
    warm_up: float = 60.0,
    settle: float = 10.0,
    sample_every: float = 5.0,
    work: Workload = Workload(),
) -> dict[str, Any]:
    """The three phases (see the module docstring); the record the report is made of."""
    start = time.monotonic()
    samples: list[dict[str, Any]] = []
    phase = ["warm-up"]
    async with httpx.AsyncClient(timeout=EVENT_TIMEOUT) as http:

        async def sampler() -> None:
            while True:
                samples.append(await _sample(http, url, phase[0], start))
                await trio.sleep(sample_every)

        samples.append(await _sample(http, url, "cold idle", start))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler)
            warm = await _fleet(url, connections, warm_up, work)
            phase[0] = "settle"
            await trio.sleep(settle)
            warm_idle = await _sample(http, url, "warm idle", start)
            samples.append(warm_idle)
            phase[0] = "soak"
            soak_started = time.monotonic() - start
            soak = await _fleet(url, connections, minutes * 60, work)
            phase[0] = "closed"
            await trio.sleep(settle)
            after = await _sample(http, url, "after", start)
            samples.append(after)
            nursery.cancel_scope.cancel()
    return {
        "warm_up": {shape: tally.summary() for shape, tally in warm.items()},
        "soak": {shape: tally.summary() for shape, tally in soak.items()},
        "rss": {
            "samples": samples,
            "warm_idle": warm_idle["rss"],
            "after": after["rss"],
            "soak_started_s": round(soak_started, 2),
            "ramp_s": warm_up,
        },
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--connections", type=int, default=200,
                        help="concurrent clients, a third of each shape (capped like bench-scale)")
    parser.add_argument("--minutes", type=float, default=10.0,
                        help=f"length of the soak phase (at most {MAX_MINUTES:g})")
    parser.add_argument("--warm-up", type=float, default=60.0,
                        help="seconds of the warm-up phase, and of the soak's ramp-up")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds idle before the warm idle and the after figures")
    parser.add_argument("--sample-every", type=float, default=5.0,
                        help="seconds between RSS samples")
    parser.add_argument("--think", type=float, default=2.0, help="seconds between turns")
    parser.add_argument("--output-tokens", type=int, default=32, help="tokens per answer")
    parser.add_argument("--tokens-per-second", type=float, default=400.0,
                        help="decode speed of the simulated model")
    parser.add_argument("--chain", type=int, default=4, help="tool rounds before a chain restarts")
    parser.add_argument("--url", default=None,
                        help="ws://127.0.0.1:port/v1/responses of a running server (loopback "
                        "only; none: start one with a temporary SQLite store)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where soak.json, soak.md and soak.png go (none: print)")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    if not 0 < args.minutes <= MAX_MINUTES:
        raise SystemExit(f"--minutes must be above 0 and at most {MAX_MINUTES:g}")
    if args.url and not is_loopback(urllib.parse.urlsplit(args.url).hostname or ""):
        raise SystemExit("the soak runs against a server on loopback only")
    connections, reason = connection_cap(args.connections)
    work = Workload(args.think, args.output_tokens, args.tokens_per_second, args.chain)
    with tempfile.TemporaryDirectory() as scratch:
        store = f"sqlite:///{scratch}/soak.db"
        with server_url(args.url, "--store", store) as url:
            record = trio.run(
                lambda: run(url, connections, args.minutes, warm_up=args.warm_up,
                            settle=args.settle, sample_every=args.sample_every, work=work)
            )  # fmt: skip
    record = {
        "config": {
            "requested": args.connections, "connections": connections, "cap_reason": reason,
            "minutes": args.minutes, "warm_up": args.warm_up, "settle": args.settle,
            **dataclasses.asdict(work), "url": args.url,
        },
        "machine": machine(),
        **record,
    }  # fmt: skip
    record["verdict"] = verdict(record["rss"])
    write_results(args.out, "soak", record, markdown(record))
    if args.out is not None:
        plot(record, args.out / "soak.png")
    soak = record["soak"].values()
    failures = sum(row["errors"] + row["sequence_gaps"] + row["lost_outputs"] for row in soak)
    return 0 if failures == 0 else 1
