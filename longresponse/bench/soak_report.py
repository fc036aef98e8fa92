"""What ``longresponse soak`` reports: the RSS criteria, the table, the plot.

The criteria (issue 12): after its ramp-up, the soak's RSS samples stay
within :data:`FLAT_WITHIN` (10%) of each other (``(max - min) / min``), and
once every client has closed and the server has settled, its RSS is at most
10% above the warm idle figure read after the warm-up phase. The plot is
RSS over time coloured by phase, drawn with matplotlib's object API on an
Agg canvas (no display).
"""

from __future__ import annotations

import collections
import statistics
from pathlib import Path
from typing import Any, Final

__all__ = ["FLAT_WITHIN", "markdown", "plot", "verdict"]

#: The RSS criteria: flat within 10% after warm-up, back within 10% of warm idle.
FLAT_WITHIN: Final = 0.10


def verdict(rss: dict[str, Any]) -> dict[str, Any]:
    """The two RSS criteria, from a record's ``rss``."""
    ramp_end = rss["soak_started_s"] + rss["ramp_s"]
    steady = [s["rss"] for s in rss["samples"] if s["phase"] == "soak" and s["t"] >= ramp_end]
    low, high = (min(steady), max(steady)) if steady else (0, 0)
    spread = (high - low) / low if low else None
    back = rss["after"] / rss["warm_idle"] - 1 if rss["warm_idle"] else None
    return {
        "steady_samples": len(steady),
        "steady_min": low,
        "steady_max": high,
        "steady_median": statistics.median(steady) if steady else None,
        "spread": spread,
        "flat": spread is not None and spread <= FLAT_WITHIN,
        "after_vs_warm_idle": back,
        "returned": back is not None and back <= FLAT_WITHIN,
    }


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MiB"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def markdown(record: dict[str, Any]) -> str:
    config, verdicts = record["config"], record["verdict"]
    lines = [
        f"## Soak: {config['connections']} connections, {config['minutes']:g} minutes",
        "",
        f"Shapes in turn (append, shipped WebSocket, HTTP SSE chains); think "
        f"{config['think']:g} s, {config['output_tokens']} output tokens at "
        f"{config['tokens_per_second']:g} tokens/s, chains of {config['chain']} tool rounds; "
        f"warm-up {config['warm_up']:g} s, settle {config['settle']:g} s.",
        "",
        "| phase | shape | turns | errors | sequence gaps | lost outputs | p50 | p99 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for phase in ("warm_up", "soak"):
        for shape, row in record[phase].items():
            lines.append(
                f"| {phase} | {shape} | {row['turns']:,} | {row['errors']} | "
                f"{row['sequence_gaps']} | {row['lost_outputs']} | "
                f"{_ms(row['latency_p50_s'])} | {_ms(row['latency_p99_s'])} |"
            )
    rss = record["rss"]
    lines += [
        "",
        f"RSS: warm idle {_mib(rss['warm_idle'])}; during the soak after its ramp-up "
        f"{_mib(verdicts['steady_min'])} to {_mib(verdicts['steady_max'])} "
        f"(spread {_pct(verdicts['spread'])}: flat within 10%: "
        f"{'yes' if verdicts['flat'] else 'no'}); after closing {_mib(rss['after'])} "
        f"({_pct(verdicts['after_vs_warm_idle'])} against warm idle: back within 10%: "
        f"{'yes' if verdicts['returned'] else 'no'}).",
    ]
    for phase in ("warm_up", "soak"):
        for shape, row in record[phase].items():
            for kind, count in row["error_kinds"].items():
                lines.append(f"- {phase} {shape}: {count} x {kind}")
    return "\n".join(lines) + "\n"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def plot(record: dict[str, Any], path: Path) -> None:
    """RSS over time, coloured by phase (matplotlib's object API on Agg)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    by_phase: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for sample in record["rss"]["samples"]:
        by_phase[sample["phase"]].append(sample)
    for phase, points in by_phase.items():
        axes.plot([p["t"] for p in points], [p["rss"] / 2**20 for p in points], ".-", label=phase)
    warm_idle = record["rss"]["warm_idle"] / 2**20
    axes.axhline(warm_idle, color="grey", linestyle=":", label="warm idle")
    axes.axhline(warm_idle * (1 + FLAT_WITHIN), color="grey", linestyle="--", label="+10%")
    axes.set_xlabel("seconds since start")
    axes.set_ylabel("server RSS (MiB)")
    config = record["config"]
    axes.set_title(f"soak: {config['connections']} connections, {config['minutes']:g} min")
    axes.legend(fontsize="small")
    figure.savefig(path, dpi=110)
