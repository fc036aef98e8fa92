"""``longresponse soak`` in a tiny configuration, and the checks it counts with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from longresponse.bench import soak
from longresponse.bench.soak_report import verdict
from longresponse.cli import build_parser

#: a soak, however tiny, runs for a while by design.
pytestmark = pytest.mark.slow


def test_soak_tiny_writes_its_report(server: Any, tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["soak", "--connections", "6", "--minutes", "0.05", "--warm-up", "1", "--settle", "0.3",
         "--sample-every", "0.5", "--think", "0.05", "--url", server.url, "--out", str(tmp_path)]
    )  # fmt: skip
    assert soak.main(args) == 0
    record = json.loads((tmp_path / "soak.json").read_text())
    assert "## Soak: 6 connections, 0.05 minutes" in (tmp_path / "soak.md").read_text()
    assert (tmp_path / "soak.png").read_bytes().startswith(b"\x89PNG")
    for phase in ("warm_up", "soak"):
        assert set(record[phase]) == {"append", "shipped", "http"}
        for row in record[phase].values():
            assert row["turns"] >= 2  # a tool round is two turns
            assert (row["errors"], row["sequence_gaps"], row["lost_outputs"]) == (0, 0, 0)
            assert 0 < row["latency_p50_s"] <= row["latency_p99_s"]
    phases = [sample["phase"] for sample in record["rss"]["samples"]]
    assert phases[0] == "cold idle"
    assert {"warm-up", "warm idle", "soak", "after"} <= set(phases)
    assert all(sample["rss"] > 0 for sample in record["rss"]["samples"])
    assert record["verdict"] == verdict(record["rss"])


def test_a_gap_a_repeat_and_a_lost_output_are_counted() -> None:
    tally = soak.Tally()
    sequences = soak.Sequences(tally)
    for event in (
        {"type": "response.created", "sequence_number": 0},
        {"type": "response.in_progress", "sequence_number": 1},
        {"type": "error", "error": {"code": "x"}},  # no sequence number: not counted
        {"type": "response.output_text.delta", "sequence_number": 3},  # 2 is missing
        {"type": "response.output_text.delta", "sequence_number": 3},  # a repeat
        {"type": "response.completed", "sequence_number": 4},
    ):
        sequences.see(event)
    assert tally.gaps == 2
    answer = {"output": [{"type": "message", "content": [{"text": "I read: [c1] «out-1»."}]}]}
    assert soak.quotes_output(answer, "c1", "out-1")
    assert not soak.quotes_output(answer, "c2", "out-1")  # under another call: lost
    assert not soak.quotes_output(answer, "c1", "out-2")


def test_verdict_applies_both_criteria() -> None:
    def sample(t: float, phase: str, mib: float) -> dict[str, Any]:
        return {"t": t, "phase": phase, "rss": int(mib * 2**20)}

    rss = {
        "samples": [sample(5, "soak", 300), sample(20, "soak", 100), sample(30, "soak", 108)],
        "warm_idle": 100 * 2**20,
        "after": 111 * 2**20,
        "soak_started_s": 0.0,
        "ramp_s": 10.0,
    }
    judged = verdict(rss)
    assert judged["steady_samples"] == 2  # the ramp-up's sample is not judged
    assert judged["flat"] is True
    assert judged["returned"] is False
    assert judged["after_vs_warm_idle"] == pytest.approx(0.11)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--minutes", "0"], "--minutes must be above 0"),
        (["--minutes", "1000"], "--minutes must be above 0"),
        (["--url", "ws://10.1.2.3:8000/v1/responses"], "loopback only"),
    ],
)
def test_the_soak_is_bounded_and_local(flags: list[str], message: str) -> None:
    args = build_parser().parse_args(["soak", *flags])
    with pytest.raises(SystemExit, match=message):
        soak.main(args)
