"""``longresponse bench-throughput``: how fast one connection streams (target 4).

One connection, the simulated model unthrottled, one long answer
(``metadata.sim_output_tokens``). The client reads raw frames
(:class:`~longresponse.bench.echo.RawConnection`: no decoding except the
prefix of each frame and the final event) and counts
``response.output_text.delta`` events from the first delta to the terminal
event. Around each run it reads ``process_cpu_seconds_total`` from the
server's ``/metrics``, and its own CPU time, so a client that cannot keep up
shows (client CPU share near 1.0).

In the same run the bare echo endpoint streams the same number of copies of
one real delta frame captured from the server, to the same reader: the floor.
Target 4 is met when the server sustains at least 25,000 delta events/s and at
least half the echo's rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import httpx
import msgspec
import trio

from protocol import APPEND_SUBPROTOCOL

from ..server_process import server_url
from .echo import EchoProcess, RawConnection, stream_command
from .scrape import server_cpu_seconds

__all__ = [
    "DEFAULT_OUTPUT_TOKENS",
    "DEFAULT_REPEATS",
    "TARGET_ECHO_FRACTION",
    "TARGET_EVENTS_PER_SECOND",
    "EchoRun",
    "StreamRun",
    "add_arguments",
    "echo_stream_once",
    "http_url_of",
    "main",
    "run",
    "stream_once",
]

DEFAULT_OUTPUT_TOKENS: Final = 200_000
DEFAULT_REPEATS: Final = 3
TARGET_EVENTS_PER_SECOND: Final = 25_000
TARGET_ECHO_FRACTION: Final = 0.5
#: Seconds one streamed answer may take before the run is abandoned.
RUN_TIMEOUT: Final = 300.0

SHAPES: Final = ("append", "shipped")
#: A run whose client CPU share is above this was paced by the client.
CLIENT_BOUND_SHARE: Final = 0.9
_DELTA_PREFIX: Final = '{"type":"response.output_text.delta"'
_TERMINAL_PREFIXES: Final = (
    '{"type":"response.done"',
    '{"type":"response.completed"',
    '{"type":"response.incomplete"',
    '{"type":"response.failed"',
    '{"type":"error"',
)


@dataclasses.dataclass(frozen=True, slots=True)
class StreamRun:
    """One streamed answer from the server."""

    shape: str
    status: str
    output_tokens: int  # usage.output_tokens of the terminal event
    delta_events: int
    events: int  # every event, lifecycle included
    seconds: float  # first delta to the terminal event
    tokens_per_second: float
    delta_events_per_second: float
    server_cpu_seconds: float
    server_cpu_per_1000_tokens: float
    server_cpu_share: float  # server CPU / the client's wall time: near 1.0 = server-bound
    client_cpu_seconds: float
    client_cpu_share: float  # client CPU / client wall time: near 1.0 = client-bound
    delta_frame_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class EchoRun:
    """The echo endpoint streaming copies of one delta frame."""

    frames: int
    seconds: float  # first frame to the last
    events_per_second: float
    client_cpu_seconds: float
    client_cpu_share: float
    server_cpu_seconds: float | None  # the echo process's (None: not measurable here)
    server_cpu_share: float | None  # its CPU / the client's wall time


def http_url_of(ws_url: str) -> str:
    """``ws://host:port/path`` -> ``http://host:port``."""
    parts = urllib.parse.urlsplit(ws_url)
    return f"{'https' if parts.scheme == 'wss' else 'http'}://{parts.netloc}"


def _request(output_tokens: int) -> str:
    return json.dumps(
        {
            "type": "response.create",
            "model": "sim",
            "input": "Stream a long answer.",
            "store": False,
            "metadata": {"sim_output_tokens": str(output_tokens), "sim_tokens_per_second": "0"},
        }
    )


async def stream_once(
    url: str, http: httpx.AsyncClient, shape: str, output_tokens: int
) -> tuple[StreamRun, str]:
    """Stream one answer of about ``output_tokens`` tokens; return the run and one delta frame.

    Raises ``RuntimeError`` if the response does not complete, ``trio.TooSlowError``
    after :data:`RUN_TIMEOUT` seconds.
    """
    http_url = http_url_of(url)
    subprotocols = [APPEND_SUBPROTOCOL] if shape == "append" else []
    conn = await RawConnection.open(url, subprotocols)
    try:
        cpu_before = await server_cpu_seconds(http, http_url)
        wall_start, client_cpu_start = time.perf_counter(), time.process_time()
        await conn.send_text(_request(output_tokens))
        deltas = events = 0
        before_clock = -1  # deltas in the batch that started the clock (not timed)
        first_delta = 0.0
        sample = terminal = ""
        with trio.fail_after(RUN_TIMEOUT):
            while not terminal:
                batch = await conn.receive_batch()
                if not batch:
                    raise RuntimeError("the server closed the connection mid-stream")
                for message in batch:
                    events += 1
                    if message.startswith(_DELTA_PREFIX):
                        if not deltas:
                            first_delta, sample = time.perf_counter(), message
                        deltas += 1
                    elif message.startswith(_TERMINAL_PREFIXES):
                        terminal = message
                        break
                if deltas and before_clock < 0:
                    before_clock = deltas
        end = time.perf_counter()
        client_cpu = time.process_time() - client_cpu_start
        cpu = await server_cpu_seconds(http, http_url) - cpu_before
    finally:
        await conn.aclose()
    event = json.loads(terminal)
    if event["type"] == "error" or not deltas:
        raise RuntimeError(f"the server did not stream an answer: {terminal[:300]}")
    response = event["response"]
    tokens = int(response["usage"]["output_tokens"])
    # The clock starts when the first delta arrives; the deltas read with it
    # are not counted in the rates (nor are the echo's first frames).
    seconds = max(end - first_delta, 1e-9)
    return (
        StreamRun(
            shape=shape,
            status=response["status"],
            output_tokens=tokens,
            delta_events=deltas,
            events=events,
            seconds=seconds,
            tokens_per_second=tokens * (deltas - before_clock) / deltas / seconds,
            delta_events_per_second=(deltas - before_clock) / seconds,
            server_cpu_seconds=cpu,
            server_cpu_per_1000_tokens=1000 * cpu / tokens,
            server_cpu_share=cpu / (end - wall_start),
            client_cpu_seconds=client_cpu,
            client_cpu_share=client_cpu / (end - wall_start),
            delta_frame_bytes=len(sample.encode()),
        ),
        sample,
    )


async def echo_stream_once(
    url: str, frame: str, count: int, echo_cpu: Callable[[], float | None] = lambda: None
) -> EchoRun:
    """Ask the echo endpoint at ``url`` for ``count`` copies of ``frame`` and read them.

    ``echo_cpu`` reads the echo process's CPU seconds, if it can be read.
    """
    conn = await RawConnection.open(url)
    try:
        cpu_before = echo_cpu()
        wall_start, client_cpu_start = time.perf_counter(), time.process_time()
        await conn.send_text(stream_command(frame, count))
        frames = 0
        before_clock = 0  # frames in the batch that started the clock (not timed)
        first = 0.0
        with trio.fail_after(RUN_TIMEOUT):
            while frames < count:
                batch = await conn.receive_batch()
                if not batch:
                    raise RuntimeError("the echo endpoint closed the connection mid-stream")
                if not frames:
                    first, before_clock = time.perf_counter(), len(batch)
                frames += len(batch)
        end = time.perf_counter()
        client_cpu = time.process_time() - client_cpu_start
        cpu_after = echo_cpu()
    finally:
        await conn.aclose()
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    # The first batch's arrival starts the clock, so its frames are not counted
    # in the rate (as the server's first deltas are not).
    seconds = max(end - first, 1e-9)
    return EchoRun(
        frames=frames,
        seconds=seconds,
        events_per_second=(frames - before_clock) / seconds,
        client_cpu_seconds=client_cpu,
        client_cpu_share=client_cpu / (end - wall_start),
        server_cpu_seconds=cpu,
        server_cpu_share=None if cpu is None else cpu / (end - wall_start),
    )


async def run(
    url: str,
    echo_url: str,
    *,
    output_tokens: int,
    repeats: int,
    shapes: tuple[str, ...],
    echo_cpu: Callable[[], float | None] = lambda: None,
) -> dict[str, Any]:
    """Every run, interleaved (server shapes, then the echo, per repeat); the result record.

    ``echo_cpu`` reads the echo process's CPU seconds (see :meth:`EchoProcess.cpu_seconds`).
    """
    streams: list[StreamRun] = []
    echoes: list[EchoRun] = []
    async with httpx.AsyncClient(timeout=10.0) as http:
        # Warm-up: imports, caches and the first allocations are not measured.
        _, frame = await stream_once(url, http, shapes[0], min(output_tokens, 2_000))
        await echo_stream_once(echo_url, frame, 2_000)
        for _ in range(repeats):
            for shape in shapes:
                stream, frame = await stream_once(url, http, shape, output_tokens)
                streams.append(stream)
                echoes.append(
                    await echo_stream_once(echo_url, frame, stream.delta_events, echo_cpu)
                )
    return _record(streams, echoes, frame)


def _record(streams: list[StreamRun], echoes: list[EchoRun], frame: str) -> dict[str, Any]:
    echo_rate = statistics.median(e.events_per_second for e in echoes)
    summary: dict[str, Any] = {
        "echo_events_per_second": echo_rate,
        "echo_best_events_per_second": max(e.events_per_second for e in echoes),
        "echo_client_cpu_share": statistics.median(e.client_cpu_share for e in echoes),
    }
    targets: dict[str, Any] = {}
    for shape in dict.fromkeys(s.shape for s in streams):
        runs = [s for s in streams if s.shape == shape]
        rate = statistics.median(s.delta_events_per_second for s in runs)
        summary[shape] = {
            "tokens_per_second": statistics.median(s.tokens_per_second for s in runs),
            "delta_events_per_second": rate,
            "best_delta_events_per_second": max(s.delta_events_per_second for s in runs),
            "server_cpu_per_1000_tokens": statistics.median(
                s.server_cpu_per_1000_tokens for s in runs
            ),
            "client_cpu_share": statistics.median(s.client_cpu_share for s in runs),
            "server_cpu_share": statistics.median(s.server_cpu_share for s in runs),
            "fraction_of_echo": rate / echo_rate,
        }
        targets[shape] = {
            "events_per_second": {"target": TARGET_EVENTS_PER_SECOND, "measured": rate,
                                  "met": rate >= TARGET_EVENTS_PER_SECOND},
            "fraction_of_echo": {"target": TARGET_ECHO_FRACTION, "measured": rate / echo_rate,
                                 "met": rate >= TARGET_ECHO_FRACTION * echo_rate},
        }  # fmt: skip
    return {
        "streams": [dataclasses.asdict(s) for s in streams],
        "echo": [dataclasses.asdict(e) for e in echoes],
        "delta_frame": frame,
        "summary": summary,
        "targets": targets,
    }


def write_results(out: Path | None, name: str, record: dict[str, Any], text: str) -> None:
    """Print the markdown; with ``out``, also write ``name``.json and ``name``.md there."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.json").write_bytes(msgspec.json.format(msgspec.json.encode(record)))
        (out / f"{name}.md").write_text(text)
    print(text, end="")


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import os

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        # Other work on the machine while the bench ran shows here.
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def markdown(record: dict[str, Any]) -> str:
    """The summary table of a :func:`run` record."""
    config = record["config"]
    summary = record["summary"]
    lines = [
        "## Stream throughput (one connection, model unthrottled)",
        "",
        f"{config['output_tokens']:,} output tokens per answer, {config['repeats']} repeats "
        "(medians); the echo streams the same delta frame the same number of times.",
        "",
        "| shape | tokens/s | delta events/s (best) | server CPU s / 1,000 tokens "
        "| server CPU share | client CPU share | vs echo | target 4 |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for shape in config["shapes"]:
        figures = summary[shape]
        met = all(t["met"] for t in record["targets"][shape].values())
        lines.append(
            f"| {shape} | {figures['tokens_per_second']:,.0f} "
            f"| {figures['delta_events_per_second']:,.0f} "
            f"({figures['best_delta_events_per_second']:,.0f}) "
            f"| {figures['server_cpu_per_1000_tokens']:.4f} "
            f"| {figures['server_cpu_share']:.2f} "
            f"| {figures['client_cpu_share']:.2f} | {figures['fraction_of_echo']:.2f} "
            f"| {'met' if met else 'missed'} |"
        )
    echo_share = statistics.median(e["client_cpu_share"] for e in record["echo"])
    echo_server = [e["server_cpu_share"] for e in record["echo"]]
    echo_server = [share for share in echo_server if share is not None]
    echo_server_share = f"{statistics.median(echo_server):.2f}" if echo_server else "n/a"
    lines += [
        f"| echo (floor) | | {summary['echo_events_per_second']:,.0f} "
        f"({summary['echo_best_events_per_second']:,.0f}) | "
        f"| {echo_server_share} | {echo_share:.2f} | 1.00 | |",
        "",
        f"Target 4: at least {TARGET_EVENTS_PER_SECOND:,} delta events/s and at least "
        f"{TARGET_ECHO_FRACTION:.0%} of the echo's rate. A CPU share is CPU seconds over "
        "the run's wall time: near 1.0, that process set the pace. Load average (1 min) "
        f"when the record was written: {record['machine']['load_average_1m']}.",
    ]
    if summary["echo_client_cpu_share"] > CLIENT_BOUND_SHARE:
        lines += [
            "",
            "The echo runs were client-bound (client CPU share "
            f"{summary['echo_client_cpu_share']:.2f}): the floor is at least the echo's rate, "
            "so the fraction of it is an upper bound.",
        ]
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-tokens",
        type=int,
        default=DEFAULT_OUTPUT_TOKENS,
        help="output tokens per streamed answer (metadata.sim_output_tokens)",
    )
    parser.add_argument(
        "--url",
        default=None,
        help="ws://host:port/v1/responses of a running server to measure (none: start one)",
    )
    parser.add_argument(
        "--repeats", type=int, default=DEFAULT_REPEATS, help="measured answers per shape"
    )
    parser.add_argument(
        "--shapes",
        default="append,shipped",
        help="comma-separated connection shapes to measure: append, shipped",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for throughput.json and throughput.md (none: print only)",
    )


def main(args: argparse.Namespace) -> int:
    shapes = tuple(s.strip() for s in args.shapes.split(",") if s.strip())
    unknown = set(shapes) - set(SHAPES)
    if unknown or not shapes:
        print(f"--shapes: expected some of {', '.join(SHAPES)}, not {args.shapes!r}")
        return 2
    with server_url(args.url, "--store", "memory://") as url, EchoProcess() as echo:
        record = trio.run(
            lambda: run(
                url,
                echo.url,
                output_tokens=args.output_tokens,
                repeats=args.repeats,
                shapes=shapes,
                echo_cpu=echo.cpu_seconds,
            )
        )
    record = {
        "config": {
            "output_tokens": args.output_tokens,
            "repeats": args.repeats,
            "shapes": list(shapes),
            "url": args.url,
        },
        "machine": machine(),
        **record,
    }
    write_results(args.out, "throughput", record, markdown(record))
    return 0
