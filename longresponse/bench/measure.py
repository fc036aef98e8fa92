"""What ``longresponse bench`` measures: one rollout's rows, a batch's CPU, the echo floor.

Theory of operation
-------------------
:func:`run_rollout` drives one rollout through its transport
(:mod:`.trio_transports`, :mod:`.sdk_transports` or
:mod:`.agents_transports`) and turns each
:class:`~.conversation.Turn` into a ``turns.json`` row (:func:`turn_row`). A
"turn" is one model call: turn 0 answers the create, turn k (k >= 1) the k-th
tool output. The simulated model's own time for the turn is computed from the
knobs (:data:`~.options.MODEL_TIME_FORMULA`, over the turn's uncached input:
``append`` reports the rollout's usage so far, so its turn is the difference
from the one before); what remains of the observed time is the
client-observed overhead. The server's overhead is its pre-inference and
post-inference phases (:data:`~.options.SERVER_OVERHEAD_FORMULA`). A rollout
that raises is recorded with its error, and the run goes on.

:func:`run_batch` runs ``--concurrency`` rollouts at once and reads the
server process's CPU time (``process_cpu_seconds_total``, through
:mod:`.scrape`) before and after: each rollout of the batch gets an equal
share of it.

The rollout's final answer is kept with its call ids masked (:data:`CALL_ID`):
the simulated model quotes every tool output under its call id, which is
random, so only the masked answers of two transports can be compared.

The floor (:func:`echo_floor`): the same continuation frames are sent to a
bare Starlette/uvicorn WebSocket echo endpoint (:mod:`.echo`) and the round
trip of each (send the frame, receive it back) is timed, the median of
:data:`ECHO_REPEATS`; a continuation's overhead minus that round trip is what
the server and the protocol add. The official SDK spends about a millisecond
of its own encoding an event before it leaves (it walks the body against its
parameter types), which a bare client does not: ``ws-sdk`` rows also get
``client_echo_rtt_ms``, the same frames sent by the SDK itself
(``conn.response.create``) to the echo endpoint and read back with
``conn.recv_bytes()``.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from typing import Any, Final

import httpx
import trio

from .conversation import Endpoint, Turn
from .options import ECHO_SHAPES, Transport, Workload
from .scrape import server_cpu_seconds as read_server_cpu_seconds
from .sdk_transports import sdk_echo_floor, sdk_rollout
from .trio_transports import http_rollout, ws_rollout

__all__ = [
    "CALL_ID",
    "ECHO_REPEATS",
    "echo_floor",
    "run_batch",
    "run_rollout",
    "server_cpu_seconds",
    "turn_row",
]

#: Round trips per frame against the echo endpoint (the median is kept).
ECHO_REPEATS: Final = 7
#: A call id in the final answer, replaced by ``call_…`` there.
CALL_ID: Final = re.compile(r"\bcall_[0-9A-Za-z]+")


async def server_cpu_seconds(endpoint: Endpoint) -> float:
    """``process_cpu_seconds_total`` of the server process behind ``endpoint`` (NaN if absent)."""
    async with httpx.AsyncClient(timeout=30.0) as http:
        try:
            return await read_server_cpu_seconds(http, endpoint.http_url)
        except (httpx.HTTPError, RuntimeError):
            return math.nan


def turn_row(turn: Turn, previous: Turn | None, workload: Workload, shape: str) -> dict[str, Any]:
    """One row of ``turns.json``; derived figures use the documented formulas."""
    input_tokens, cached = turn.input_tokens, turn.cached_tokens
    if shape in ("append", "append-stored") and previous is not None:
        # append mode reports the rollout's usage so far: this turn is the difference.
        input_tokens -= previous.input_tokens
        cached -= previous.cached_tokens
    uncached = max(0, input_tokens - cached)
    model_ms = workload.model_ms(turn.output_tokens, uncached)
    server = turn.server
    server_overhead = (
        server["resume_ms"] + server.get("count_ms", 0.0) + server.get("post_inference_ms", 0.0)
        if "resume_ms" in server
        else None
    )
    return {
        "turn": turn.index,
        "kind": "create" if turn.index == 0 else "continuation",
        "sent_bytes": turn.sent_bytes,
        "observed_ms": turn.observed_ms,
        "client_ttft_ms": turn.client_ttft_ms,
        "output_tokens": turn.output_tokens,
        "input_tokens": input_tokens,
        "cached_tokens": cached,
        "uncached_tokens": uncached,
        "model_ms": model_ms,
        "overhead_ms": turn.observed_ms - model_ms,
        "server_overhead_ms": server_overhead,
        "server": server,
        "tool_latency_ms": turn.tool_latency_ms,
        "echo_rtt_ms": None,
        "overhead_minus_echo_ms": None,
        "client_echo_rtt_ms": None,
    }


async def run_rollout(
    endpoint: Endpoint, transport: Transport, workload: Workload, *, via_url: bool = False
) -> dict[str, Any]:
    """Drive one rollout; return its ``turns.json`` record (``error`` set if it failed)."""
    if transport.agents:  # imported on use: importing the Agents SDK takes seconds
        from .agents_transports import agents_rollout, inspector_timing

        drive = agents_rollout
    else:
        drive = (
            sdk_rollout if transport.sdk else ws_rollout if transport.websocket else http_rollout
        )
    started = time.perf_counter()
    try:
        turns, answer = await drive(endpoint, transport, workload, via_url=via_url)
        e2e_ms = (time.perf_counter() - started) * 1000
        if transport.shape == "agents-ws":  # its SDK reads every frame: the clock is stopped
            await inspector_timing(endpoint, turns)
    except Exception as exc:  # recorded; the run goes on with the other transports
        return {
            "error": f"{type(exc).__name__}: {exc}",
            "turns": [],
            "final_answer": None,
            "frames": [],
        }
    rows = [
        turn_row(turn, turns[i - 1] if i else None, workload, transport.shape)
        for i, turn in enumerate(turns)
    ]
    return {
        "error": None,
        "e2e_ms": e2e_ms,
        "final_answer": CALL_ID.sub("call_…", answer),
        "turns": rows,
        "frames": [turn.frame for turn in turns],
    }


async def run_batch(
    endpoint: Endpoint,
    transport: Transport,
    workload: Workload,
    *,
    concurrency: int,
    via_url: bool,
) -> list[dict[str, Any]]:
    """``concurrency`` rollouts at once; the server CPU they took, shared out."""
    batch: list[dict[str, Any]] = []

    async def one(slot: int) -> None:
        record = await run_rollout(endpoint, transport, workload, via_url=via_url)
        batch.append({"slot": slot, **record})

    cpu_before = await server_cpu_seconds(endpoint)
    async with trio.open_nursery() as nursery:
        for slot in range(concurrency):
            nursery.start_soon(one, slot)
    cpu = (await server_cpu_seconds(endpoint)) - cpu_before
    for record in batch:
        # Per server process; the concurrent rollouts of a batch share it.
        record["batch_cpu_s"] = cpu
        record["cpu_s"] = cpu / concurrency
    return sorted(batch, key=lambda record: record["slot"])


def echo_floor(rollouts: list[dict[str, Any]], notes: list[str]) -> dict[str, Any] | None:
    """Round trips of the same continuation frames to the bare echo endpoint.

    Sets ``echo_rtt_ms`` and ``overhead_minus_echo_ms`` on the rows of
    ``rollouts``; returns the ``echo`` section of ``turns.json`` (``None``
    without WebSocket frames to replay, with a note in ``notes`` if the echo
    endpoint cannot be imported).
    """
    frames: dict[str, list[bytes]] = {}
    for record in rollouts:
        key = f"{record['scenario']}:{record['shape']}"  # a +deflate twin sends the same
        if record["switch_off"] is None and record["frames"] and key not in frames:
            if record["shape"] in ECHO_SHAPES:
                frames[key] = record["frames"]
    if not frames:
        return None
    try:
        from .echo import EchoProcess, echo_round_trip
    except ImportError as exc:
        notes.append(f"no echo floor: longresponse.bench.echo is not available ({exc})")
        return None

    async def measure(url: str) -> dict[str, list[float]]:
        await echo_round_trip(url, "{}", ECHO_REPEATS)  # warm-up
        rtts: dict[str, list[float]] = {}
        for key, payloads in frames.items():
            rtts[key] = [
                1000 * statistics.median(await echo_round_trip(url, p.decode(), ECHO_REPEATS))
                for p in payloads
            ]
        return rtts

    with EchoProcess() as echo:
        rtts = trio.run(measure, echo.url)
        # The official SDK's own floor: its encoding and threads, same frames.
        sdk_rtts: dict[str, list[float]] = {}
        for key, payloads in frames.items():
            if key.endswith(":ws-sdk"):
                try:
                    sdk_rtts[key] = sdk_echo_floor(echo.url, payloads, ECHO_REPEATS)
                except Exception as exc:  # reported; the run goes on
                    notes.append(f"no SDK echo floor for {key}: {type(exc).__name__}: {exc}")
    for record in rollouts:
        key = f"{record['scenario']}:{record['shape']}"
        if key not in rtts or record["error"]:
            continue
        for row, rtt in zip(record["turns"], rtts[key], strict=False):
            row["echo_rtt_ms"] = rtt
            row["overhead_minus_echo_ms"] = row["overhead_ms"] - rtt
        for row, rtt in zip(record["turns"], sdk_rtts.get(key, ()), strict=False):
            row["client_echo_rtt_ms"] = rtt
    return {"repeats": ECHO_REPEATS, "rtt_ms": rtts, "sdk_rtt_ms": sdk_rtts}
