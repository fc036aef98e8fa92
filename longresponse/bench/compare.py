"""``longresponse bench``: every transport side by side on simulated agent rollouts.

Theory of operation
-------------------
The same simulated agent rollout (:mod:`.options`: the task, ``--tool-calls``
tool calls, tool outputs of ``--output-tokens`` tokens, the final answer) is
driven through every transport, each at every decode speed of
``--tokens-per-second``, ``--rollouts`` rounds of ``--concurrency`` rollouts.

Every transport at every decode speed runs against its own server process,
started with the matching flags and reused for all of its rollouts, so the
server CPU (``process_cpu_seconds_total`` on ``/metrics``, read before and
after each batch of concurrent rollouts) belongs to that transport alone. The
processes of one speed (a block, :func:`plan`) run side by side and the
transports take turns, one batch each per round, so drift in the machine hits
them all alike. Each process first serves one short unrecorded rollout
(imports, tokenizer). With ``--url`` every transport that needs no server
flag of its own goes to that one server instead.

A separate "growth" scenario runs ``append``, ``ws`` and ``http`` with
``--growth-tool-calls`` calls at the fastest speed, long enough for the
history to pass 100,000 tokens (targets 1 and 2 of the benchmark issue). The
ablations (each reuse switch of ``append`` and ``ws`` turned off) run at one
speed only. When every block is done, the WebSocket continuation frames are
replayed against the echo endpoint for the floor.

Results go to ``--out``: ``turns.json`` (every turn of every rollout, the
knobs and the machine), ``summary.md`` (tables and targets) and PNG plots,
written by :mod:`.report`.

The modules below this one, in the order they build on each other:
:mod:`.options` (transports, workload, flags), :mod:`.conversation` (request
bodies and turn records), :mod:`.trio_transports`, :mod:`.sdk_transports`
and :mod:`.agents_transports` (driving a rollout), :mod:`.measure` (rows,
batches, the floor). The names a
caller of the bench uses (:class:`Transport`, :class:`Workload`,
:class:`BenchOptions`, :func:`add_arguments`, ...) are re-exported here.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import trio

from longresponse.server_process import ServerProcess

from .conversation import Endpoint, websocket_frame_bytes
from .measure import echo_floor, run_batch, run_rollout
from .options import (
    ABLATED,
    ABLATION_SWITCHES,
    AGENTS_TRANSPORTS,
    BASE_TRANSPORTS,
    ECHO_SHAPES,
    GATEWAY_TRANSPORTS,
    GROWTH_TRANSPORTS,
    MODEL_TIME_FORMULA,
    SERVER_OVERHEAD_FORMULA,
    URL_TRANSPORTS,
    BenchOptions,
    Transport,
    Workload,
    add_arguments,
    options_from_args,
)

__all__ = [
    "ABLATION_SWITCHES",
    "AGENTS_TRANSPORTS",
    "BASE_TRANSPORTS",
    "ECHO_SHAPES",
    "GATEWAY_TRANSPORTS",
    "MODEL_TIME_FORMULA",
    "SERVER_OVERHEAD_FORMULA",
    "URL_TRANSPORTS",
    "BenchOptions",
    "Block",
    "Endpoint",
    "Transport",
    "Workload",
    "add_arguments",
    "gateway_flags",
    "main",
    "plan",
    "run_bench",
    "run_rollout",
    "websocket_frame_bytes",
]


# --- the run ----------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Block:
    """The transports run side by side against one set of servers (one per transport).

    ``scenarios``: (name, workload, transports) run in this order; the
    growth scenario's transports are a subset of the main one's, so it
    reuses their servers.
    """

    speed: float
    transports: list[Transport]
    scenarios: list[tuple[str, Workload, list[Transport]]]


def plan(options: BenchOptions) -> tuple[list[Block], list[str]]:
    """The blocks to run, and notes on what was left out and why."""
    notes: list[str] = []
    chosen = [Transport.parse(name) for name in options.chosen_transports]
    base = _with_compression([t for t in chosen if t.switch_off is None], options.ws_compression)
    ablations = [t for t in chosen if t.switch_off is not None]
    if options.ablations:
        for shape in ABLATED:
            if any(t.shape == shape for t in base):
                ablations.extend(
                    Transport.parse(f"{shape}/no-{switch}")
                    for switch in ABLATION_SWITCHES
                    if f"{shape}/no-{switch}" not in options.transports
                )
    if options.url:
        kept = [t for t in base if t.name in URL_TRANSPORTS]
        dropped = [t.name for t in [*base, *ablations] if t not in kept]
        if dropped:
            notes.append(
                f"--url: left out {', '.join(dropped)} (they need server flags of their own)"
            )
        base, ablations = kept, []
    speeds = list(options.speeds)
    ablation_speed = options.ablation_speed if options.ablation_speed in speeds else speeds[-1]
    if ablations and len(speeds) > 1:
        notes.append(
            f"ablations run at {ablation_speed:g} tokens/s only (the pre-inference work they "
            "measure does not depend on the decode speed)"
        )
    growth = [t for t in base if t.name in GROWTH_TRANSPORTS]
    growth_speed = max(speeds) if options.growth_tool_calls > 0 and growth else None
    blocks = []
    for speed in speeds:
        transports = base + (ablations if speed == ablation_speed else [])
        scenarios = [("main", options.workload(speed), transports)]
        if speed == growth_speed:
            scenarios.append(("growth", options.workload(speed, growth=True), growth))
            growth_speed = None  # once, even if the speed is listed twice
        blocks.append(Block(speed, transports, scenarios))
    return blocks, notes


def _with_compression(transports: list[Transport], setting: str) -> list[Transport]:
    """Every WebSocket transport with the server's compression off, on (named with
    ``+deflate``) or both side by side; HTTP and already-named ones as they are."""
    chosen: list[Transport] = []
    for transport in transports:
        if not transport.websocket or transport.ws_compression:
            chosen.append(transport)
            continue
        if setting in ("off", "both"):
            chosen.append(transport)
        if setting in ("on", "both"):
            chosen.append(transport.deflated())
    return list(dict.fromkeys(chosen))


def _server_flags(options: BenchOptions, speed: float, store_dir: str) -> tuple[str, ...]:
    store = options.store
    if store == "sqlite":
        store = f"sqlite:///{store_dir}/responses-{time.monotonic_ns()}.db"
    return (
        "--store", store,
        "--sim-tokens-per-second", f"{speed:g}",
        "--sim-ttft-ms", f"{options.ttft_ms:g}",
        "--sim-prefill-tokens-per-second", f"{options.prefill_tokens_per_second:g}",
    )  # fmt: skip


def gateway_flags(kind: str, engine: ServerProcess) -> tuple[str, ...]:
    """A gateway's flags: serve ``sim`` through the ``kind`` backend in front of ``engine``
    (the engine runs the simulated model at the block's speed; the gateway's own sim
    is replaced, and the client's ``sim_*`` metadata reaches the engine)."""
    return (
        "--upstream", f"{engine.http_url}/v1",
        "--upstream-model", "sim",
        "--upstream-kind", kind,
        "--served-model-name", "sim",
    )  # fmt: skip


@contextlib.contextmanager
def _endpoints(
    options: BenchOptions, block: Block, store_dir: str
) -> Iterator[dict[str, Endpoint]]:
    """One server process per transport of ``block`` (or ``--url`` for all)."""
    if options.url:
        endpoint = Endpoint.from_url(options.url)
        yield {t.name: endpoint for t in block.transports}
        return
    servers: dict[str, ServerProcess] = {}
    engines: list[ServerProcess] = []  # the gateways' upstreams (not endpoints)
    for transport in block.transports:
        flags = (*_server_flags(options, block.speed, store_dir), *transport.server_flags)
        if transport.gateway is not None:
            engine = ServerProcess(*_server_flags(options, block.speed, store_dir))
            engines.append(engine)
            flags += gateway_flags(transport.gateway, engine)
        servers[transport.name] = ServerProcess(*flags)
    processes = [*engines, *servers.values()]
    # A worker per CPU: more processes importing at once only thrash.
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        try:
            for started in [pool.submit(server.start) for server in processes]:
                started.result()
            yield {
                name: Endpoint.from_url(server.url, server.flags)
                for name, server in servers.items()
            }
        finally:  # stopped side by side too (each waits for its process to drain)
            for stopped in [pool.submit(server.stop) for server in processes]:
                stopped.result()


async def _run_block(
    options: BenchOptions,
    block: Block,
    endpoints: dict[str, Endpoint],
    bar: Any,
) -> list[dict[str, Any]]:
    via_url = options.url is not None
    for transport in block.transports:  # not recorded: imports, tokenizer, first connection
        workload = dataclasses.replace(
            block.scenarios[0][1], tool_calls=1, output_tokens=64, tool_latency_ms=0
        )
        await run_rollout(endpoints[transport.name], transport, workload, via_url=via_url)
    records: list[dict[str, Any]] = []
    for scenario, workload, transports in block.scenarios:
        for round_index in range(options.rollouts):
            for transport in transports:
                bar.set_description(f"{scenario} {block.speed:g} tok/s {transport.name}")
                endpoint = endpoints[transport.name]
                batch = await run_batch(
                    endpoint,
                    transport,
                    workload,
                    concurrency=options.concurrency,
                    via_url=via_url,
                )
                bar.update(len(batch))
                records += [
                    {
                        "scenario": scenario,
                        "transport": transport.name,
                        "shape": transport.shape,
                        "switch_off": transport.switch_off,
                        "ws_compression": ("on" if transport.ws_compression else "off")
                        if transport.websocket
                        else None,
                        "tokens_per_second": block.speed,
                        "tool_calls": workload.tool_calls,
                        "output_tokens": workload.output_tokens,
                        "round": round_index,
                        "server_flags": list(endpoint.flags),
                        **record,
                    }
                    for record in batch
                ]
    return records


def _machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
    }


def run_bench(options: BenchOptions) -> dict[str, Any]:
    """Run every block; return the ``turns.json`` document (also written to ``--out``).

    Server processes are stopped when their block ends, also when it raises.
    """
    from tqdm import tqdm  # type: ignore[import-untyped]

    from . import report

    blocks, notes = plan(options)
    total = (
        options.concurrency
        * options.rollouts
        * sum(len(transports) for block in blocks for _, _, transports in block.scenarios)
    )
    started = time.perf_counter()
    rollouts: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="longresponse-bench-") as store_dir,
        tqdm(total=total, unit="rollout", file=sys.stderr, disable=not options.progress) as bar,
    ):
        for block in blocks:
            bar.set_description(f"starting servers for {block.speed:g} tok/s")
            with _endpoints(options, block, store_dir) as endpoints:
                rollouts += trio.run(_run_block, options, block, endpoints, bar)
        bar.set_description("echo floor")
        echo = echo_floor(rollouts, notes) if options.echo else None
    for record in rollouts:
        record.pop("frames", None)
    document = {
        "meta": {
            "command": "longresponse bench " + " ".join(sys.argv[2:])
            if sys.argv[1:2] == ["bench"]
            else None,
            "knobs": _knobs(options),
            "machine": _machine(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "duration_s": time.perf_counter() - started,
            "model_time_formula": MODEL_TIME_FORMULA,
            "server_overhead_formula": SERVER_OVERHEAD_FORMULA,
            "definitions": {
                "turn": "one model call: turn 0 answers the create, turn k the k-th tool output",
                "observed_ms": "client clock, from writing the turn's request to its terminal "
                "event (WebSocket) or the end of the HTTP response; agents-*: the Runner's "
                "on_llm_start to on_llm_end hooks",
                "client_ttft_ms": "from writing the request to the first output item or delta "
                "(HTTP is not streamed: the whole response; agents-*: the whole turn, as the "
                "Agents SDK's Runner hands a response over whole)",
                "overhead_ms": "observed_ms - model_ms",
                "echo_rtt_ms": "the same frame sent by a bare trio/wsproto client to a bare "
                "Starlette/uvicorn echo endpoint and read back (median of the repeats)",
                "client_echo_rtt_ms": "ws-sdk only: the same event sent by the SDK itself "
                "(conn.response.create) to the echo endpoint and read back (conn.recv_bytes)",
                "sent_bytes": "client-to-server wire bytes of the turn: the masked WebSocket "
                "frame, or the HTTP request (head and body); agents-ws: the frame of the "
                "message the server's inspector counted",
                "cpu_s": "server process CPU seconds (process_cpu_seconds_total on /metrics) "
                "over a batch of concurrent rollouts, divided by the batch size; one server "
                "process per transport and speed",
                "e2e_ms": "from opening the connection to the final answer, tool latency included",
            },
            "notes": notes,
        },
        "echo": echo,
        "rollouts": rollouts,
    }
    report.write(document, options.out)
    return document


def _knobs(options: BenchOptions) -> dict[str, Any]:
    knobs = dataclasses.asdict(options)
    knobs["out"] = str(options.out)
    knobs["speeds"] = list(options.speeds)
    knobs["transports"] = list(options.chosen_transports)
    return knobs


def main(args: argparse.Namespace) -> int:
    """Run the bench from parsed flags; 0 if every rollout finished with the same
    answer as the other transports, else 1."""
    from . import report

    document = run_bench(options_from_args(args))
    print(report.console_summary(document, args.out))
    failed = any(r["error"] for r in document["rollouts"])
    return 1 if failed or report.inconsistencies(document) else 0
