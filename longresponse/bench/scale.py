"""``longresponse bench-scale``: many paused rollouts at once (target 5, resume latency).

N connections in one trio process (default 1,000), each in append mode
holding one paused rollout: ``response.create`` with one tool, then
``response.done`` with ``status: "requires_action"``. The bench reads the
server's resident memory (``process_resident_memory_bytes`` on ``/metrics``)
three times:

1. ``baseline``: after one warm-up rollout, with no benchmark connection open;
2. ``connected``: with the N connections open and idle;
3. ``paused``: with every connection holding its paused rollout.

``(paused - connected) / N`` is what one paused rollout costs,
``(paused - baseline) / N`` what it costs with its connection. From each the
bench subtracts the rollout's own items (their JSON size) and tokens (4 bytes
each: the token cache is a 32-bit array) to get the overhead that target 5
bounds at 64 KiB.

Then every rollout is appended to at once (one event releases all the
tasks), and each measures its resume latency: from its own send of the
``response.append`` to the arrival of its ``response.in_progress``. The
rollouts then finish, and the connections close.

Connections are opened and rollouts created in batches (at most
``--batch`` at a time) so that a 2-core machine is not flooded. The client
raises its open-files soft limit to the hard limit (a server it starts
inherits it); N is capped below the limit and the ephemeral port range, and
the cap and its reason are reported.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, cast

import httpx
import trio

from protocol import APPEND_SUBPROTOCOL, TIMING_HEADER

from ..server_process import server_url
from .echo import RawConnection
from .scrape import PROCESS_CPU_SECONDS, PROCESS_RESIDENT_BYTES, read_samples
from .throughput import http_url_of, machine, write_results

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_CONNECTIONS",
    "TARGET_OVERHEAD_BYTES",
    "add_arguments",
    "connection_cap",
    "main",
    "run",
]

DEFAULT_CONNECTIONS: Final = 1_000
DEFAULT_BATCH: Final = 100
TARGET_OVERHEAD_BYTES: Final = 64 * 1024
#: Bytes of one token in the rollout's token cache (a 32-bit array).
TOKEN_BYTES: Final = 4
#: File descriptors kept free for everything but the benchmark connections.
FD_RESERVE: Final = 128
#: Seconds each phase (open, pause, resume, close) may take, per 1,000 connections.
PHASE_TIMEOUT_PER_1000: Final = 60.0

TOOLS: Final = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]
PROMPT: Final = "Find the bug in app.py"
TOOL_OUTPUT: Final = "def add(a, b): return a - b"
CREATE: Final = json.dumps(
    {
        "type": "response.create",
        "model": "sim",
        "input": PROMPT,
        "tools": TOOLS,
        "store": False,
        "metadata": {"sim_tool_calls": "1"},
    }
)
#: Seconds one awaited event (or a connection's upgrade) may take.
EVENT_TIMEOUT: Final = 60.0


@dataclasses.dataclass(slots=True)
class _Fleet:
    """What the connection tasks share: counters, the phase gates, what they measured."""

    size: int
    connected: int = 0
    paused: int = 0
    finished: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    all_connected: trio.Event = dataclasses.field(default_factory=trio.Event)
    all_paused: trio.Event = dataclasses.field(default_factory=trio.Event)
    all_finished: trio.Event = dataclasses.field(default_factory=trio.Event)
    create: trio.Event = dataclasses.field(default_factory=trio.Event)
    resume: trio.Event = dataclasses.field(default_factory=trio.Event)
    release: trio.Event = dataclasses.field(default_factory=trio.Event)
    resume_started: float = 0.0
    latencies: list[float] = dataclasses.field(default_factory=list)
    server_resume: list[float] = dataclasses.field(default_factory=list)
    since_release: list[float] = dataclasses.field(default_factory=list)
    item_bytes: list[int] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)

    def _account(self) -> None:
        failed = len(self.failures)
        if self.connected + failed >= self.size:
            self.all_connected.set()
        if self.paused + failed >= self.size:
            self.all_paused.set()
        if self.finished + failed >= self.size:
            self.all_finished.set()

    def step(self, phase: str) -> None:
        setattr(self, phase, getattr(self, phase) + 1)
        self._account()

    def fail(self, reason: str) -> None:
        self.failures.append(reason)
        self._account()


class _Rollout:
    """One append-mode connection holding one rollout, read as raw frames.

    Only the frames the bench needs are decoded: ``response.done``, the
    timing event after it; the rest are recognised by their prefix.
    """

    def __init__(self, conn: RawConnection) -> None:
        self.conn = conn
        self.response: dict[str, Any] = {}

    @classmethod
    async def open(cls, url: str) -> _Rollout:
        headers = [(TIMING_HEADER, "true")]
        return cls(await RawConnection.open(url, [APPEND_SUBPROTOCOL], headers))

    async def _until(self, prefix: str) -> str:
        while not (message := await self.conn.receive_text(EVENT_TIMEOUT)).startswith(prefix):
            if message.startswith('{"type":"error"'):
                raise RuntimeError(f"the server answered with an error: {message[:300]}")
        return message

    async def _done(self, status: str) -> dict[str, float]:
        """Wait for ``response.done`` with ``status``; the timing metrics that follow it."""
        self.response = json.loads(await self._until('{"type":"response.done"'))["response"]
        if self.response["status"] != status:
            raise RuntimeError(f"expected status {status}, got {self.response['status']}")
        timing = json.loads(await self._until('{"type":"responsesapi.websocket_timing"'))
        return cast("dict[str, float]", timing["timing_metrics"])

    async def pause(self) -> None:
        """Create the rollout and wait until it pauses for its tool call."""
        await self.conn.send_text(CREATE)
        await self._done("requires_action")

    async def resume(self) -> tuple[float, float, float]:
        """Append the tool outputs; (seconds to ``response.in_progress``, its arrival time,
        the server's ``resume_ms`` in seconds) once the rollout has completed."""
        call_ids = self.response["required_action"]["call_ids"]
        append = json.dumps(
            {
                "type": "response.append",
                "input": [
                    {"type": "function_call_output", "call_id": c, "output": TOOL_OUTPUT}
                    for c in call_ids
                ],
            }
        )
        sent = time.perf_counter()
        await self.conn.send_text(append)
        await self._until('{"type":"response.in_progress"')
        arrived = time.perf_counter()
        timing = await self._done("completed")
        return arrived - sent, arrived, timing["resume_ms"] / 1000

    def own_size(self) -> tuple[int, int]:
        """(JSON bytes of its items, its tokens) as the paused response reports them."""
        input_item = {"type": "message", "role": "user", "content": PROMPT}
        items = len(json.dumps(input_item)) + sum(
            len(json.dumps(item)) for item in self.response["output"]
        )
        usage = self.response["usage"]
        return items, usage["input_tokens"] + usage["output_tokens"]


async def _hold_rollout(url: str, fleet: _Fleet, limiter: trio.CapacityLimiter) -> None:
    """One connection: open, pause a rollout, resume it on the signal, finish."""
    phase = "started"
    rollout: _Rollout | None = None
    try:
        async with limiter:
            with trio.fail_after(EVENT_TIMEOUT):
                rollout = await _Rollout.open(url)
        fleet.step(phase := "connected")
        await fleet.create.wait()
        async with limiter:
            await rollout.pause()
        items, tokens = rollout.own_size()
        fleet.item_bytes.append(items)
        fleet.tokens.append(tokens)
        fleet.step(phase := "paused")
        await fleet.resume.wait()
        latency, arrived, server_resume = await rollout.resume()
        fleet.latencies.append(latency)
        fleet.since_release.append(arrived - fleet.resume_started)
        fleet.server_resume.append(server_resume)
        fleet.step(phase := "finished")
        await fleet.release.wait()
    except (Exception, trio.TooSlowError) as exc:
        fleet.fail(f"after {phase}: {type(exc).__name__}: {exc}"[:300])
    finally:
        if rollout is not None:
            with trio.CancelScope(shield=True):
                await rollout.conn.aclose()


async def _process_metrics(http: httpx.AsyncClient, http_url: str) -> tuple[int, float]:
    """The server's resident bytes and CPU seconds, from ``/metrics``."""
    samples = await read_samples(http, http_url, PROCESS_RESIDENT_BYTES, PROCESS_CPU_SECONDS)
    return int(samples[PROCESS_RESIDENT_BYTES]), samples[PROCESS_CPU_SECONDS]


async def _warm_up(url: str) -> None:
    """One paused-and-resumed rollout, so that first-use costs are in the baseline."""
    rollout = await _Rollout.open(url)
    try:
        await rollout.pause()
        await rollout.resume()
    finally:
        await rollout.conn.aclose()


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]


async def run(url: str, connections: int, *, batch: int = DEFAULT_BATCH) -> dict[str, Any]:
    """Measure ``connections`` paused rollouts against the server at ``url``; the record.

    Raises ``trio.TooSlowError`` if a phase takes longer than its bound
    (every connection is closed first).
    """
    http_url = http_url_of(url)
    fleet = _Fleet(size=connections)
    limiter = trio.CapacityLimiter(batch)
    phase_timeout = PHASE_TIMEOUT_PER_1000 * max(1.0, connections / 1000)
    phases: dict[str, dict[str, float]] = {}

    async def phase(name: str, start: Callable[[], object], end: trio.Event) -> int:
        """Run one phase: ``start()`` it, wait for ``end``; the server's RSS after it."""
        _, server_cpu = await _process_metrics(http, http_url)
        began, client_cpu = time.perf_counter(), time.process_time()
        start()
        with trio.fail_after(phase_timeout):
            await end.wait()
        seconds, client_cpu = time.perf_counter() - began, time.process_time() - client_cpu
        rss, server_cpu_after = await _process_metrics(http, http_url)
        phases[name] = {
            "seconds": seconds,
            "server_cpu_seconds": server_cpu_after - server_cpu,
            "client_cpu_seconds": client_cpu,
        }
        return rss

    def open_all() -> None:
        for _ in range(connections):
            nursery.start_soon(_hold_rollout, url, fleet, limiter)

    def resume_all() -> None:
        fleet.resume_started = time.perf_counter()
        fleet.resume.set()

    async with httpx.AsyncClient(timeout=30.0) as http:
        await _warm_up(url)
        rss = {"baseline": (await _process_metrics(http, http_url))[0]}
        async with trio.open_nursery() as nursery:
            try:
                rss["connected"] = await phase("open", open_all, fleet.all_connected)
                rss["paused"] = await phase("pause", fleet.create.set, fleet.all_paused)
                await phase("resume_and_finish", resume_all, fleet.all_finished)
            finally:
                fleet.create.set()
                fleet.resume.set()
                fleet.release.set()
    return _record(fleet, rss, phases)


def _record(
    fleet: _Fleet, rss: dict[str, int], phases: dict[str, dict[str, float]]
) -> dict[str, Any]:
    paused = fleet.paused
    items = statistics.fmean(fleet.item_bytes) if fleet.item_bytes else 0.0
    tokens = statistics.fmean(fleet.tokens) if fleet.tokens else 0.0
    own = items + TOKEN_BYTES * tokens
    per_rollout = (rss["paused"] - rss["connected"]) / paused if paused else 0.0
    with_connection = (rss["paused"] - rss["baseline"]) / paused if paused else 0.0
    overhead = per_rollout - own
    memory: dict[str, Any] = {
        "rss_bytes": rss,
        "per_connection_idle_bytes": (rss["connected"] - rss["baseline"]) / max(1, fleet.connected),
        "per_paused_rollout_bytes": per_rollout,
        "per_paused_rollout_with_connection_bytes": with_connection,
        "rollout_items_bytes": items,
        "rollout_tokens": tokens,
        "rollout_own_bytes": own,
        "overhead_bytes": overhead,
        "overhead_with_connection_bytes": with_connection - own,
    }
    latency: dict[str, float] = {}
    if fleet.latencies:
        latency = {
            "p50_seconds": _percentile(fleet.latencies, 0.50),
            "p99_seconds": _percentile(fleet.latencies, 0.99),
            "max_seconds": max(fleet.latencies),
            "all_resumed_seconds": max(fleet.since_release),
        }
    if fleet.server_resume:
        latency |= {
            "server_p50_seconds": _percentile(fleet.server_resume, 0.50),
            "server_p99_seconds": _percentile(fleet.server_resume, 0.99),
        }
    return {
        "counts": {
            "connections": fleet.size,
            "connected": fleet.connected,
            "paused": paused,
            "resumed": len(fleet.latencies),
            "finished": fleet.finished,
            "failed": len(fleet.failures),
        },
        "failures": fleet.failures[:20],
        "phases": phases,
        "memory": memory,
        "resume_latency": latency,
        "targets": {
            "overhead_per_paused_rollout": {
                "target_bytes": TARGET_OVERHEAD_BYTES,
                "measured_bytes": overhead,
                "met": overhead <= TARGET_OVERHEAD_BYTES,
            }
        },
    }


def connection_cap(wanted: int) -> tuple[int, str | None]:
    """Raise the open-files soft limit to the hard limit; the connections this allows.

    Returns ``(n, reason)``: ``n == wanted`` and ``reason is None`` unless the
    limit or the ephemeral port range caps it.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    caps: list[tuple[int, str]] = []
    if soft != resource.RLIM_INFINITY:
        caps.append(
            (soft - FD_RESERVE, f"open files limit (RLIMIT_NOFILE soft {soft}, hard {hard})")
        )
    with contextlib.suppress(OSError, ValueError):
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        caps.append((high - low + 1 - FD_RESERVE, f"ephemeral port range {low}-{high}"))
    for cap, reason in sorted(caps):
        if cap < wanted:
            return max(1, cap), f"capped at {max(1, cap):,}: {reason}"
    return wanted, None


def markdown(record: dict[str, Any]) -> str:
    """The summary of a :func:`run` record."""
    counts, memory, latency = record["counts"], record["memory"], record["resume_latency"]
    kib = 1024
    lines = [
        f"## Paused rollouts at scale ({counts['connections']:,} connections)",
        "",
    ]
    if record["config"].get("cap_reason"):
        lines += [
            f"Asked for {record['config']['requested']:,} connections; "
            f"{record['config']['cap_reason']}.",
            "",
        ]
    lines += [
        f"Connected {counts['connected']:,}, paused {counts['paused']:,}, "
        f"resumed {counts['resumed']:,}, finished {counts['finished']:,}, "
        f"failed {counts['failed']:,}.",
        "",
        "| figure | value |",
        "|---|---:|",
        "| server RSS: baseline / connected / paused (MiB) | "
        + " / ".join(f"{memory['rss_bytes'][k] / kib / kib:,.1f}"
                     for k in ("baseline", "connected", "paused"))
        + " |",
        f"| idle connection (KiB) | {memory['per_connection_idle_bytes'] / kib:,.1f} |",
        f"| paused rollout (KiB) | {memory['per_paused_rollout_bytes'] / kib:,.1f} |",
        f"| its items + tokens (KiB) | {memory['rollout_own_bytes'] / kib:,.2f} "
        f"({memory['rollout_items_bytes']:,.0f} B JSON, {memory['rollout_tokens']:,.0f} tokens) |",
        f"| **overhead beyond items and tokens (KiB)** | "
        f"**{memory['overhead_bytes'] / kib:,.1f}** |",
        f"| same, counting its connection (KiB) | "
        f"{memory['overhead_with_connection_bytes'] / kib:,.1f} |",
    ]  # fmt: skip
    if latency:
        lines += [
            f"| resume latency p50 (ms) | {latency['p50_seconds'] * 1000:,.2f} |",
            f"| resume latency p99 (ms) | {latency['p99_seconds'] * 1000:,.2f} |",
            f"| resume latency max (ms) | {latency['max_seconds'] * 1000:,.2f} |",
            f"| server-side resume p50 / p99 (ms; `resume_ms`) "
            f"| {latency['server_p50_seconds'] * 1000:,.2f} / "
            f"{latency['server_p99_seconds'] * 1000:,.2f} |",
            f"| all resumed, from the release (ms) "
            f"| {latency['all_resumed_seconds'] * 1000:,.1f} |",
        ]
    phases = ", ".join(
        f"{name} {p['seconds']:.1f} s (server CPU {p['server_cpu_seconds']:.1f} s, "
        f"client CPU {p['client_cpu_seconds']:.1f} s)"
        for name, p in record["phases"].items()
    )
    met = record["targets"]["overhead_per_paused_rollout"]["met"]
    lines += [
        "",
        f"Phases: {phases}. Target 5 (at most {TARGET_OVERHEAD_BYTES // kib} KiB beyond "
        f"items and tokens): {'met' if met else 'missed'}. Resume latency runs from a "
        "rollout's own send of `response.append` to its `response.in_progress`, with every "
        "rollout appended to at once.",
    ]
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--connections",
        type=int,
        default=DEFAULT_CONNECTIONS,
        help="concurrent connections, each holding one paused rollout (capped by the "
        "open-files limit and the ephemeral port range, with the reason reported)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=DEFAULT_BATCH,
        help="connections opened, or rollouts created, at once",
    )
    parser.add_argument(
        "--url",
        default=None,
        help="ws://host:port/v1/responses of a running server to measure (none: start one)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for scale.json and scale.md (none: print only)",
    )


def main(args: argparse.Namespace) -> int:
    connections, reason = connection_cap(args.connections)  # before the server starts
    with server_url(args.url, "--store", "memory://") as url:
        record = trio.run(lambda: run(url, connections, batch=args.batch))
    record = {
        "config": {
            "requested": args.connections,
            "connections": connections,
            "cap_reason": reason,
            "batch": args.batch,
            "url": args.url,
        },
        "machine": machine(),
        **record,
    }
    write_results(args.out, "scale", record, markdown(record))
    return 0 if not record["counts"]["failed"] else 1
