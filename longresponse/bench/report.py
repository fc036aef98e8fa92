"""What ``longresponse bench`` writes: ``turns.json``, ``summary.md`` and the plots.

Theory of operation
-------------------
:func:`write` saves the ``turns.json`` document built by
:func:`longresponse.bench.compare.run_bench` as it is, then writes what is
derived from it and from nothing else, so a report can be rebuilt from a
saved run: ``summary.md`` (:func:`summary_markdown`: the run, a table per
speed, the official SDK against the trio/h11 client, the Agents SDK against
the client resending the whole history, the growth scenario,
the consistency check and the targets) and the PNG plots (:mod:`.plots`).
:func:`console_summary` is the few lines the command prints.

The figures (medians over the successful rollouts of a transport) and the
targets come from :mod:`.analysis`.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Final

from .analysis import (
    Record,
    at_turn,
    by_transport,
    continuations,
    e2e_s,
    floor_targets,
    fmt,
    inconsistencies,
    median,
    percent_lower,
    speeds_in,
    successful,
    targets,
)
from .options import DEFLATE, Transport
from .plots import PLOTS, write_plots

__all__ = [
    "AGENTS_PAIRS",
    "PLOTS",
    "SDK_PAIRS",
    "console_summary",
    "floor_targets",
    "inconsistencies",
    "summary_markdown",
    "targets",
    "write",
    "write_plots",
]

#: Each transport driven by the official ``openai`` SDK, and its trio/h11 twin.
SDK_PAIRS: Final = (("ws-sdk", "ws"), ("http-sdk", "http"))
#: Each transport driven by the Agents SDK's Runner, and the trio/h11 client that
#: resends the whole history over the same transport.
AGENTS_PAIRS: Final = (("agents-ws", "ws-full"), ("agents-http", "http-full"))


def write(document: dict[str, Any], out: Path) -> None:
    """Write ``turns.json``, ``summary.md`` and the plots into ``out`` (created if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "turns.json").write_text(json.dumps(document, indent=1) + "\n")
    (out / "summary.md").write_text(summary_markdown(document))
    write_plots(document, out)


# --- summary.md ---------------------------------------------------------------------


def _pair_rows(
    grouped: dict[str, list[Record]], pairs: tuple[tuple[str, str], ...], heading: str
) -> list[str]:
    """Each SDK-driven transport of ``pairs`` against its trio/h11 twin."""
    rows = []
    for sdk, twin in pairs:
        if sdk not in grouped or twin not in grouped:
            continue
        cells = []
        for key in ("overhead_ms", "client_ttft_ms", "server_overhead_ms"):
            a = continuations(grouped[sdk], key, skip_last=True)
            b = continuations(grouped[twin], key, skip_last=True)
            cells += [fmt(a, 3), fmt(b, 3), fmt(a - b, 3)]
        e2e_sdk, e2e_twin = e2e_s(grouped[sdk]), e2e_s(grouped[twin])
        cells += [fmt(e2e_sdk, 3), fmt(e2e_twin, 3)]
        rows.append(f"| `{sdk}` vs `{twin}` | " + " | ".join(cells) + " |")
    if rows:
        rows[:0] = [
            "",
            heading + " (medians over continuation turns before the final answer; SDK - "
            "client in the third column of each group):",
            "",
            "| pair | overhead SDK (ms) | overhead client (ms) | diff | TTFT SDK (ms) "
            "| TTFT client (ms) | diff | server overhead SDK (ms) | server overhead client "
            "(ms) | diff | e2e SDK (s) | e2e client (s) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    return rows


def _compression_rows(grouped: dict[str, list[Record]]) -> list[str]:
    """Each WebSocket transport against a server with compression off and on, same client."""
    rows = []
    for deflated, records in grouped.items():
        plain = deflated.removesuffix(DEFLATE)
        if plain == deflated or plain not in grouped:
            continue
        cells = []
        for key in ("overhead_ms", "client_ttft_ms"):
            off = continuations(grouped[plain], key, skip_last=True)
            on = continuations(records, key, skip_last=True)
            cells += [fmt(off, 3), fmt(on, 3), fmt(on - off, 3)]
        cells += [
            fmt(e2e_s(grouped[plain]), 3),
            fmt(e2e_s(records), 3),
            fmt(median(r["cpu_s"] for r in grouped[plain]), 3),
            fmt(median(r["cpu_s"] for r in records), 3),
        ]
        transport = Transport.parse(deflated)
        negotiated = (
            "yes"
            if transport.sdk
            else "offered (the `websockets` default; not read back)"
            if transport.agents
            else "no (not offered)"
        )
        rows.append(f"| `{plain}` | {negotiated} | " + " | ".join(cells) + " |")
    if rows:
        rows[:0] = [
            "",
            "Server `--ws-compression` off vs on (with it on, the official SDK is asked for "
            "permessage-deflate, as the `websockets` library offers by default, and the "
            "rollout fails unless it was negotiated; the Agents SDK offers it at its defaults; "
            "the trio client never offers it; medians "
            "over continuation turns before the final answer; on - off in the third column "
            "of each group):",
            "",
            "| transport | deflate negotiated when on | overhead off (ms) | overhead on (ms) "
            "| diff | TTFT off (ms) | TTFT on (ms) | diff | e2e off (s) | e2e on (s) "
            "| server CPU s off | server CPU s on |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    return rows


def _verdict(target: dict[str, Any]) -> str:
    """``met`` / ``not met``; a figure measured away from the target's stated
    parameters (fewer turns, a shorter history) gets no verdict."""
    met = target["met"]
    if met is None:
        return "reported"
    if not target["stated"]:
        return "outside the stated parameters, would be " + ("met" if met else "not met")
    return "**met**" if met else "**not met**"


def _transport_rows(grouped: dict[str, list[Record]], total: dict[str, int]) -> list[str]:
    http_e2e = e2e_s(grouped.get("http", []))
    rows = []
    for name, records in grouped.items():
        e2e = e2e_s(records)
        sent = median(
            statistics.mean(t["sent_bytes"] for t in r["turns"]) for r in records if r["turns"]
        )
        cells = [
            f"`{name}`",
            f"{len(records)}/{total[name]}",
            fmt(e2e, 3),
            "" if name == "http" else fmt(percent_lower(e2e, http_e2e), 1) + "%",
            fmt(at_turn(records, 1, "client_ttft_ms")),
            fmt(at_turn(records, 1, "overhead_ms")),
            fmt(at_turn(records, "last", "overhead_ms")),
            fmt(at_turn(records, 1, "resume_ms"), 3),
            fmt(at_turn(records, "last", "resume_ms"), 3),
            fmt(median(r["cpu_s"] for r in records), 3),
            fmt(sent, 0),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


_HEADER: Final = (
    "| transport | ok | e2e median (s) | e2e saving vs http | TTFT turn 1 (ms) "
    "| overhead turn 1 (ms) | overhead last (ms) | server pre-inference turn 1 (ms) "
    "| server pre-inference last (ms) | server CPU s / rollout | bytes / turn |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def summary_markdown(document: dict[str, Any]) -> str:
    """The markdown summary: the run, a table per speed, the growth scenario, the targets."""
    meta = document["meta"]
    knobs, machine = meta["knobs"], meta["machine"]
    lines = [
        "# longresponse bench",
        "",
        f"Command: `{meta['command'] or 'run_bench(...)'}`  ",
        f"Machine: {machine['platform']}, {machine['cpu_count']} CPUs, "
        f"{machine['implementation']} {machine['python']}  ",
        f"Run: {meta['started']}, {meta['duration_s']:.0f} s  ",
        "Knobs: "
        + ", ".join(
            f"{k}={v}" for k, v in knobs.items() if k not in ("out", "progress", "transports")
        ),
        "",
        "Definitions: overhead = observed turn time - the simulated model's own time, "
        f"`{meta['model_time_formula']}`. Server pre-inference = `resume_ms` (from the "
        "request arriving to the sampler being called: store reads, validation, "
        "classification, resolution, render). TTFT is client-observed, from sending the turn "
        "to its first output item or delta (HTTP is not streamed: the whole response). "
        "Server CPU is per server process (one per transport and speed), read from "
        "`process_cpu_seconds_total`. Bytes are client→server wire bytes per turn. Medians "
        "over rollouts; turn 1 = the first tool output, last = the final turn. `ws-sdk` and "
        "`http-sdk` are `ws` and `http` driven by the official `openai` SDK (its sync client, "
        "one rollout per worker thread); their bytes are what the SDK sends. `agents-http` and "
        "`agents-ws` are the OpenAI Agents SDK's `Runner` resending the whole history every "
        "model request, over HTTP and over its Responses WebSocket (`agents-ws`: server "
        "times and bytes read from the server's inspector).",
    ]
    for note in meta["notes"]:
        lines += ["", f"Note: {note}"]
    main = successful(document, "main")
    for speed in speeds_in(document):
        all_at_speed = [
            r
            for r in document["rollouts"]
            if r["scenario"] == "main" and r["tokens_per_second"] == speed
        ]
        total = {name: len(rs) for name, rs in by_transport(all_at_speed).items()}
        grouped = by_transport(r for r in main if r["tokens_per_second"] == speed)
        label = "unthrottled" if speed == 0 else f"{speed:g} tokens/s"
        lines += ["", f"## {label}", "", _HEADER, *_transport_rows(grouped, total)]
        http_e2e = e2e_s(grouped.get("http", []))
        savings = [
            f"{name} {fmt(percent_lower(e2e_s(grouped[name]), http_e2e), 1)}%"
            for name in ("append", "ws")
            if name in grouped
        ]
        if savings and "http" in grouped:
            lines += ["", "End-to-end saving vs `http`: " + ", ".join(savings) + "."]
        lines += _pair_rows(grouped, SDK_PAIRS, "Official `openai` SDK vs the trio/h11 client")
        lines += _pair_rows(
            grouped,
            AGENTS_PAIRS,
            "Agents SDK's Runner vs the trio/h11 client resending the whole history (the "
            "Runner hands over a response whole: its TTFT is the whole turn; it stores every "
            "response, `store` left to the API's default)",
        )
        lines += _compression_rows(grouped)
    growth = by_transport(successful(document, "growth"))
    if growth:
        sample = next(iter(growth.values()))[0]
        lines += [
            "",
            f"## Growth: {sample['tool_calls']} tool calls of ~{sample['output_tokens']} tokens "
            f"at {sample['tokens_per_second']:g} tokens/s",
            "",
            f"Server overhead per turn: `{meta['server_overhead_formula']}`",
            "",
            "| transport | history tokens (last) | server overhead turn 1 (ms) "
            "| server overhead last (ms) | last / turn 1 | client overhead (ms) "
            "| echo RTT (ms) | above the floor (ms) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, records in growth.items():
            first = at_turn(records, 1, "server_overhead_ms")
            last = at_turn(records, "last", "server_overhead_ms")
            growth_ratio = last / first if first else math.nan
            lines.append(
                f"| `{name}` | {fmt(at_turn(records, 'last', 'input_tokens'), 0)} "
                f"| {fmt(first, 3)} | {fmt(last, 3)} | {fmt(growth_ratio)}x "
                f"| {fmt(continuations(records, 'overhead_ms', skip_last=True), 3)} "
                f"| {fmt(continuations(records, 'echo_rtt_ms', skip_last=True), 3)} "
                f"| {fmt(continuations(records, 'overhead_minus_echo_ms', skip_last=True), 3)} |"
            )
    lines += ["", "## Consistency", ""]
    problems = inconsistencies(document)
    if problems:
        lines += [f"- **inconsistent**: {problem}" for problem in problems]
    elif document["rollouts"]:
        names = sorted({r["transport"] for r in document["rollouts"] if not r["error"]})
        lines.append(
            f"Every successful rollout of a scenario and speed ended with the same final answer "
            f"after the same number of turns, across all {len(names)} transports."
        )
    lines += ["", "## Targets", ""]
    found = targets(document)
    if not found:
        lines.append("This run measured none of the targets (see the transports and speeds).")
    lines += [f"- Target {t['target']} ({_verdict(t)}): {t['text']}." for t in found]
    floor = floor_targets(document)
    if floor:
        lines += ["", "## Latency floor targets", ""]
        lines += [f"- Target {t['target']} ({_verdict(t)}): {t['text']}." for t in floor]
    failures = [r for r in document["rollouts"] if r["error"]]
    if failures:
        lines += ["", "## Failed rollouts", ""]
        lines += [
            f"- `{r['transport']}` at {r['tokens_per_second']:g} tok/s ({r['scenario']}): "
            f"{r['error']}"
            for r in failures
        ]
    lines += ["", "Plots: " + ", ".join(f"`{name}`" for name in PLOTS) + "."]
    return "\n".join(lines) + "\n"


def console_summary(document: dict[str, Any], out: Path) -> str:
    """A few lines for the terminal: the targets and where the results are."""
    lines = [f"{t['target']}. {_verdict(t).strip('*')}: {t['text']}" for t in targets(document)]
    lines += [f"floor {t['target']}. {_verdict(t).strip('*')}: {t['text']}"
              for t in floor_targets(document)]  # fmt: skip
    failed = sum(1 for r in document["rollouts"] if r["error"])
    if failed:
        lines.append(f"{failed} rollouts failed (see summary.md)")
    lines += [f"inconsistent: {problem}" for problem in inconsistencies(document)]
    lines.append(f"results: {out / 'summary.md'}, {out / 'turns.json'}, plots in {out}")
    return "\n".join(lines)
