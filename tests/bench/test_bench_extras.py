"""The echo floor, ``bench-throughput`` and ``bench-scale`` in tiny configurations.

Shape and consistency only: every count matches, every figure is there and
positive. No timing assertions (timing belongs in the benchmarks).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from longresponse.bench import scale, throughput
from longresponse.bench.echo import EchoProcess, RawConnection, echo_round_trip, stream_command
from longresponse.cli import build_parser


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoProcess]:
    with EchoProcess() as process:
        yield process


async def test_echo_round_trip(echo: EchoProcess) -> None:
    times = await echo_round_trip(echo.url, '{"type":"x","n":1}', 5)
    assert len(times) == 5
    assert all(t > 0 for t in times)


async def test_echo_streams_the_frame_count_times(echo: EchoProcess) -> None:
    conn = await RawConnection.open(echo.url)
    try:
        await conn.send_text("plain text is echoed")
        assert await conn.receive_text() == "plain text is echoed"
        await conn.send_text(stream_command("frame é", 1_000))
        received = [await conn.receive_text() for _ in range(1_000)]
        assert set(received) == {"frame é"}
        await conn.send_text("after the stream")
        assert await conn.receive_text() == "after the stream"
    finally:
        await conn.aclose()
    assert conn.closed


@pytest.mark.slow  # a whole (tiny) benchmark
def test_throughput_tiny(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["bench-throughput", "--output-tokens", "3000", "--repeats", "2", "--out", str(tmp_path)]
    )
    assert throughput.main(args) == 0
    record = json.loads((tmp_path / "throughput.json").read_text())
    assert (tmp_path / "throughput.md").read_text().startswith("## Stream throughput")
    assert record["config"]["shapes"] == ["append", "shipped"]
    assert {"machine", "streams", "echo", "delta_frame", "summary", "targets"} <= set(record)
    streams, echoes = record["streams"], record["echo"]
    assert [s["shape"] for s in streams] == ["append", "shipped"] * 2
    assert len(echoes) == len(streams)
    assert record["delta_frame"].startswith('{"type":"response.output_text.delta"')
    for stream, echo_run in zip(streams, echoes, strict=True):
        assert stream["status"] == "completed"
        # The sim pads its answer to exactly sim_output_tokens words, one delta each.
        assert stream["delta_events"] == 3000
        assert stream["events"] > stream["delta_events"]
        assert stream["output_tokens"] >= stream["delta_events"]
        assert echo_run["frames"] == stream["delta_events"]
        for key in ("seconds", "tokens_per_second", "server_cpu_per_1000_tokens"):
            assert stream[key] > 0, key
        assert echo_run["seconds"] > 0
        assert echo_run["server_cpu_seconds"] is not None
    for shape in ("append", "shipped"):
        figures = record["summary"][shape]
        assert figures["delta_events_per_second"] > 0
        assert figures["fraction_of_echo"] > 0
        assert set(record["targets"][shape]) == {"events_per_second", "fraction_of_echo"}


def test_throughput_refuses_an_unknown_shape(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["bench-throughput", "--shapes", "append,carrier-pigeon"])
    assert throughput.main(args) == 2
    assert "--shapes" in capsys.readouterr().out


@pytest.mark.slow  # a whole (tiny) benchmark
def test_scale_tiny(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["bench-scale", "--connections", "20", "--batch", "8", "--out", str(tmp_path)]
    )
    assert scale.main(args) == 0
    record = json.loads((tmp_path / "scale.json").read_text())
    assert "## Paused rollouts at scale (20 connections)" in (tmp_path / "scale.md").read_text()
    assert record["counts"] == {
        "connections": 20,
        "connected": 20,
        "paused": 20,
        "resumed": 20,
        "finished": 20,
        "failed": 0,
    }
    assert record["failures"] == []
    assert record["config"]["cap_reason"] is None
    memory = record["memory"]
    assert memory["rss_bytes"]["baseline"] > 0
    assert memory["rollout_items_bytes"] > 0
    assert memory["rollout_tokens"] > 0
    assert memory["overhead_bytes"] == pytest.approx(
        memory["per_paused_rollout_bytes"] - memory["rollout_own_bytes"]
    )
    latency = record["resume_latency"]
    assert 0 < latency["p50_seconds"] <= latency["p99_seconds"] <= latency["max_seconds"]
    assert latency["server_p50_seconds"] <= latency["server_p99_seconds"]
    assert set(record["phases"]) == {"open", "pause", "resume_and_finish"}
    assert record["targets"]["overhead_per_paused_rollout"]["target_bytes"] == 64 * 1024


def test_connection_cap_reports_its_reason() -> None:
    assert scale.connection_cap(10) == (10, None)
    capped, reason = scale.connection_cap(10**9)
    assert 1 <= capped < 10**9
    assert reason is not None
    assert reason.startswith(f"capped at {capped:,}")


async def test_a_failed_rollout_is_recorded_and_the_run_goes_on() -> None:
    """One rollout that fails (nothing listens) leaves a record the rest of the run reads."""
    from longresponse.bench import measure
    from longresponse.bench.conversation import Endpoint
    from longresponse.bench.options import Transport, Workload
    from longresponse.server_process import free_port

    endpoint = Endpoint.from_url(f"ws://127.0.0.1:{free_port()}/v1/responses")
    workload = Workload(
        tool_calls=1,
        output_tokens=10,
        tool_latency_ms=0.0,
        tokens_per_second=0.0,
        ttft_ms=0.0,
        prefill_tokens_per_second=0.0,
    )
    for name in ("append", "http"):
        record = await measure.run_rollout(endpoint, Transport.parse(name), workload)
        assert record["error"]
        assert record["frames"] == []
        record.update(transport=name, scenario="main", shape=name, switch_off=None)
        assert measure.echo_floor([record], []) is None  # nothing to replay, no KeyError
