"""The PNG plots of a ``longresponse bench`` run.

Theory of operation
-------------------
:func:`write_plots` reads the ``turns.json`` document, through the medians
of :mod:`.analysis`, and draws :data:`PLOTS`: the client-observed overhead
per turn at each speed, the end-to-end time per transport and speed, the
server phases at the last turn, the ablations' pre-inference time per turn,
and (with the growth scenario) the server overhead against the history.

Plots use matplotlib's object API on an Agg canvas: no display, no global
pyplot state. matplotlib is imported when the first figure is made.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final

from .analysis import Record, at_turn, by_transport, median, per_turn, speeds_in, successful

__all__ = ["PHASES", "PLOTS", "write_plots"]

#: The PNG files a run writes (``growth.png`` only with the growth scenario).
PLOTS: Final = (
    "overhead_per_turn.png",
    "e2e_by_speed.png",
    "phase_breakdown.png",
    "ablation.png",
    "growth.png",
)
#: Server phases stacked in the phase breakdown, in the order they happen.
PHASES: Final = ("decode", "validate", "classify", "resolve", "render")


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _positive(values: Sequence[float]) -> list[float]:
    """Values for a log axis: non-positive and missing ones become gaps (NaN)."""
    return [v if v > 0 else math.nan for v in values]


def _log_if_positive(axes: Any, series: Iterable[Sequence[float]]) -> None:
    if any(v > 0 for values in series for v in values if not math.isnan(v)):
        axes.set_yscale("log")


def _legend(axes: Any, *, outside: bool = False) -> None:
    if not axes.get_legend_handles_labels()[0]:
        return
    if outside:
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        axes.legend(fontsize="small")


def _integer_turns(axes: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    axes.set_xlabel("turn (0 = the create)")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))


def _save(figure: Any, path: Path) -> None:
    figure.savefig(path, dpi=110)


def _turn_lines(
    axes: Any, grouped: dict[str, list[Record]], key: str, keep: Callable[[str], bool]
) -> list[list[float]]:
    drawn = []
    for name, records in grouped.items():
        if not keep(name):
            continue
        values = _positive(per_turn(records, key))
        drawn.append(values)
        axes.plot(range(len(values)), values, marker=".", label=name)
    return drawn


def write_plots(document: dict[str, Any], out: Path) -> list[Path]:
    """Write the PNG plots into ``out``; return their paths."""
    main = successful(document, "main")
    speeds = speeds_in(document)
    written = [
        _overhead_per_turn(main, speeds, out),
        _e2e_by_speed(main, speeds, out),
        _phase_breakdown(main, speeds, out),
        _ablation(main, speeds, out),
        _growth(successful(document, "growth"), out),
    ]
    return [path for path in written if path is not None]


def _overhead_per_turn(main: list[dict[str, Any]], speeds: list[float], out: Path) -> Path | None:
    """Client-observed overhead per turn, per transport, one panel per speed."""
    figure = _figure(5 * max(1, len(speeds)), 4)
    panels = figure.subplots(1, max(1, len(speeds)), squeeze=False)[0]
    for axes, speed in zip(panels, speeds, strict=False):
        grouped = by_transport(r for r in main if r["tokens_per_second"] == speed)
        drawn = _turn_lines(axes, grouped, "overhead_ms", lambda name: "/" not in name)
        _log_if_positive(axes, drawn)
        axes.set_title(f"{speed:g} tok/s" if speed else "unthrottled")
        _integer_turns(axes)
        axes.set_ylabel("client-observed overhead (ms)")
        _legend(axes)
    figure.suptitle("Overhead per turn (observed - model time)")
    _save(figure, out / "overhead_per_turn.png")
    return out / "overhead_per_turn.png"


def _e2e_by_speed(main: list[dict[str, Any]], speeds: list[float], out: Path) -> Path | None:
    """End-to-end rollout time per transport at each speed (grouped bars)."""
    base = [name for name in by_transport(main) if "/" not in name]
    figure = _figure(max(6, 1.6 * len(speeds) * max(1, len(base)) / 3), 4)
    axes = figure.subplots()
    width = 0.8 / max(1, len(base))
    heights: list[float] = []
    for offset, name in enumerate(base):
        values = [
            median(
                r["e2e_ms"] for r in main if r["transport"] == name and r["tokens_per_second"] == s
            )
            / 1000
            for s in speeds
        ]
        heights += values
        axes.bar(
            [i + offset * width for i in range(len(speeds))],
            [0 if math.isnan(v) else v for v in values],
            width,
            label=name,
        )
    axes.set_xticks([i + 0.4 - width / 2 for i in range(len(speeds))])
    axes.set_xticklabels([f"{s:g} tok/s" if s else "unthrottled" for s in speeds])
    _log_if_positive(axes, [heights])
    axes.set_ylabel("end-to-end rollout time (s, median)")
    axes.set_title("End-to-end rollout time per transport")
    _legend(axes, outside=True)
    _save(figure, out / "e2e_by_speed.png")
    return out / "e2e_by_speed.png"


def _phase_breakdown(main: list[dict[str, Any]], speeds: list[float], out: Path) -> Path | None:
    """Server phase breakdown at the last turn, at the speed with the most transports."""
    if not main:
        return None
    speed = max(speeds, key=lambda s: sum(r["tokens_per_second"] == s for r in main))
    grouped = by_transport(r for r in main if r["tokens_per_second"] == speed)
    names = list(grouped)
    figure = _figure(max(7, 0.6 * len(names) + 4), 5)
    axes = figure.subplots()
    bottom = [0.0] * len(names)
    stacks: dict[str, list[float]] = {}
    for phase in PHASES:
        stacks[phase] = [at_turn(grouped[n], "last", f"{phase}_ms") for n in names]
    listed = [sum(v for v in (stacks[p][i] for p in PHASES) if not math.isnan(v))
              for i in range(len(names))]  # fmt: skip
    stacks["other pre-inference (store, lookup)"] = [
        max(0.0, at_turn(grouped[n], "last", "resume_ms") - listed[i])
        for i, n in enumerate(names)
    ]
    stacks["encode"] = [at_turn(grouped[n], "last", "encode_ms") for n in names]
    stacks["post-inference"] = [at_turn(grouped[n], "last", "post_inference_ms") for n in names]
    for label, values in stacks.items():
        clean = [0.0 if math.isnan(v) else v for v in values]
        axes.bar(names, clean, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, clean, strict=True)]
    axes.set_ylabel("server time at the last turn (ms, median)")
    axes.set_title(
        f"Server phases at the last turn, {speed:g} tok/s (model inference not shown)"
    )
    axes.tick_params(axis="x", labelrotation=60, labelsize="small")
    _legend(axes, outside=True)
    _save(figure, out / "phase_breakdown.png")
    return out / "phase_breakdown.png"


def _ablation(main: list[dict[str, Any]], speeds: list[float], out: Path) -> Path | None:
    """Ablation: server pre-inference per turn with each reuse switch off."""
    figure = _figure(11, 4)
    panels = figure.subplots(1, 2, squeeze=False)[0]
    for axes, shape in zip(panels, ("append", "ws"), strict=True):
        grouped = by_transport(r for r in main if r["shape"] == shape)
        ablated = [r for rs in grouped.values() for r in rs if r["switch_off"]]
        # The speed the ablations ran at (without ablations: the last speed).
        at: float | None = (
            ablated[0]["tokens_per_second"] if ablated else (speeds[-1] if speeds else None)
        )
        grouped = {
            name: [r for r in rs if r["tokens_per_second"] == at]
            for name, rs in grouped.items()
            if any(r["tokens_per_second"] == at for r in rs)
        }
        drawn = _turn_lines(axes, grouped, "resume_ms", lambda name: True)
        _log_if_positive(axes, drawn)
        title = f"{shape}: each reuse switch off" if ablated else f"{shape} (no ablations run)"
        axes.set_title(title + (f", {at:g} tok/s" if at is not None else ""))
        _integer_turns(axes)
        axes.set_ylabel("server pre-inference (ms)")
        _legend(axes)
    _save(figure, out / "ablation.png")
    return out / "ablation.png"


def _growth(rows: list[dict[str, Any]], out: Path) -> Path | None:
    """Growth: server overhead per turn against the history."""
    growth = by_transport(rows)
    if not growth:
        return None
    figure = _figure(7, 4.5)
    axes = figure.subplots()
    drawn = []
    for name, records in growth.items():
        history = per_turn(growth.get("http", records), "input_tokens")
        values = _positive(per_turn(records, "server_overhead_ms"))
        drawn.append(values)
        axes.plot(history[: len(values)], values, marker=".", label=name)
    _log_if_positive(axes, drawn)
    axes.set_xlabel("history (input tokens of the turn)")
    axes.set_ylabel("server overhead per turn (ms)")
    axes.set_title("Server overhead as the conversation grows")
    _legend(axes)
    _save(figure, out / "growth.png")
    return out / "growth.png"
