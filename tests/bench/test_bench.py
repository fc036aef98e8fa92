"""``longresponse bench`` in a tiny configuration: the outputs' shape and consistency.

One module-scoped run (3 tool calls, small outputs, one speed, one round)
through the command line, every transport (the official-SDK ones and the
Agents SDK's too); the tests read what it wrote. No timing is asserted:
only what a run must get right whatever the machine's speed.
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import trio

from longresponse import cli
from longresponse.bench import compare, report
from longresponse.server_process import ServerProcess

#: whole bench runs, each transport through real sockets and a second process
#: (the module's first test waits for a run of eleven transports, one server
#: process each: past the suite's 60 s on a loaded 2-core machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOOL_CALLS = 3
GROWTH_TOOL_CALLS = 4
TRANSPORTS = (
    "append",
    "ws",
    "http",
    "http-full",
    "ws-full",
    "http-cached",
    "ws-sdk",
    "http-sdk",
    "agents-http",
    "agents-ws",
)
ABLATION = "append/no-token-cache"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

TURN_FIELDS: dict[str, type | tuple[type, ...]] = {
    "turn": int,
    "kind": str,
    "sent_bytes": int,
    "observed_ms": float,
    "client_ttft_ms": float,
    "output_tokens": int,
    "input_tokens": int,
    "cached_tokens": int,
    "uncached_tokens": int,
    "model_ms": (int, float),
    "overhead_ms": float,
    "server_overhead_ms": float,
    "server": dict,
    "tool_latency_ms": (int, float),
    "echo_rtt_ms": (float, type(None)),
    "overhead_minus_echo_ms": (float, type(None)),
    "client_echo_rtt_ms": (float, type(None)),
}
ROLLOUT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "scenario": str,
    "transport": str,
    "shape": str,
    "switch_off": (str, type(None)),
    "tokens_per_second": float,
    "tool_calls": int,
    "output_tokens": int,
    "round": int,
    "slot": int,
    "server_flags": list,
    "batch_cpu_s": float,
    "cpu_s": float,
    "error": type(None),
    "e2e_ms": float,
    "final_answer": str,
    "turns": list,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench")
    status = cli.main(
        [
            "bench",
            "--tool-calls", str(TOOL_CALLS),
            "--output-tokens", "40",
            "--tokens-per-second", "0",
            "--rollouts", "1",
            "--transports", ",".join([*TRANSPORTS, ABLATION]),
            "--no-ablations",
            "--growth-tool-calls", str(GROWTH_TOOL_CALLS),
            "--growth-output-tokens", "40",
            "--ws-compression", "off",
            "--no-progress",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert status == 0
    return out, json.loads((out / "turns.json").read_text())


COMPRESSION_TRANSPORTS = ("ws", "ws-sdk", "agents-ws", "http")


@pytest.fixture(scope="module")
def compression_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench-compression")
    status = cli.main(
        [
            "bench",
            "--tool-calls", "2",
            "--output-tokens", "40",
            "--tokens-per-second", "0",
            "--rollouts", "1",
            "--transports", ",".join(COMPRESSION_TRANSPORTS),
            "--no-ablations",
            "--growth-tool-calls", "0",
            "--no-echo",
            "--ws-compression", "both",
            "--no-progress",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert status == 0
    return out, json.loads((out / "turns.json").read_text())


GATEWAY_RUN = ("append", *compare.GATEWAY_TRANSPORTS)


@pytest.fixture(scope="module")
def gateway_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench-gateways")
    status = cli.main(
        [
            "bench",
            "--tool-calls", "2",
            "--output-tokens", "40",
            "--tokens-per-second", "0",
            "--rollouts", "1",
            "--transports", ",".join(GATEWAY_RUN),
            "--no-ablations",
            "--growth-tool-calls", "0",
            "--no-echo",
            "--ws-compression", "off",
            "--no-progress",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert status == 0
    return out, json.loads((out / "turns.json").read_text())


def _main(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in document["rollouts"] if r["scenario"] == "main"]


def test_every_transport_ran_once_without_error(run: tuple[Path, dict[str, Any]]) -> None:
    _, document = run
    assert sorted(r["transport"] for r in _main(document)) == sorted([*TRANSPORTS, ABLATION])
    growth = [r["transport"] for r in document["rollouts"] if r["scenario"] == "growth"]
    assert sorted(growth) == ["append", "http", "ws"]
    assert [r for r in document["rollouts"] if r["error"]] == []


def test_turns_json_schema(run: tuple[Path, dict[str, Any]]) -> None:
    _, document = run
    meta = document["meta"]
    assert meta["knobs"]["tool_calls"] == TOOL_CALLS
    assert meta["knobs"]["speeds"] == [0.0]
    assert {"platform", "cpu_count", "python"} <= set(meta["machine"])
    assert meta["machine"]["cpu_count"] >= 1
    assert "model_ms" in meta["model_time_formula"]
    for record in document["rollouts"]:
        for field, kind in ROLLOUT_FIELDS.items():
            assert isinstance(record[field], kind), (record["transport"], field)
        for row in record["turns"]:
            for field, kind in TURN_FIELDS.items():
                assert isinstance(row[field], kind), (record["transport"], row["turn"], field)
            assert row["kind"] == ("create" if row["turn"] == 0 else "continuation")
            assert {"resume_ms", "pre_inference_ms", "render_ms"} <= set(row["server"])
            assert row["overhead_ms"] == pytest.approx(row["observed_ms"] - row["model_ms"])
            assert row["uncached_tokens"] == row["input_tokens"] - row["cached_tokens"]
            assert row["sent_bytes"] > 0
            assert row["output_tokens"] > 0
        assert record["cpu_s"] >= 0


def test_final_answers_are_identical_and_turn_counts_match(
    run: tuple[Path, dict[str, Any]],
) -> None:
    _, document = run
    for scenario, calls in (("main", TOOL_CALLS), ("growth", GROWTH_TOOL_CALLS)):
        records = [r for r in document["rollouts"] if r["scenario"] == scenario]
        answers = {r["final_answer"] for r in records}
        assert len(answers) == 1, {r["transport"]: r["final_answer"] for r in records}
        if scenario == "main":  # the SDK-driven transports are among them
            assert {"ws-sdk", "http-sdk", *compare.AGENTS_TRANSPORTS} <= {
                r["transport"] for r in records
            }
        assert f"I read {calls} tool outputs" in answers.pop()
        for record in records:
            assert [row["turn"] for row in record["turns"]] == list(range(calls + 1))
    assert report.inconsistencies(document) == []


def test_inconsistencies_name_the_disagreeing_transports() -> None:
    def record(transport: str, answer: str, turns: int) -> dict[str, Any]:
        return {
            "scenario": "main",
            "tokens_per_second": 1000.0,
            "transport": transport,
            "error": None,
            "final_answer": answer,
            "turns": [{}] * turns,
        }

    document = {"rollouts": [record("ws", "a", 4), record("ws-sdk", "b", 4)]}
    (problem,) = report.inconsistencies(document)
    assert "2 different final answers" in problem
    assert "ws-sdk" in problem
    document = {"rollouts": [record("http", "a", 4), record("http-sdk", "a", 5)]}
    (problem,) = report.inconsistencies(document)
    assert "turn counts differ" in problem


def test_sdk_transports_are_measured_like_their_twins(run: tuple[Path, dict[str, Any]]) -> None:
    _, document = run
    by_name = {r["transport"]: r for r in _main(document)}
    for sdk, twin in report.SDK_PAIRS:
        assert compare.Transport.parse(sdk).sdk
        assert not compare.Transport.parse(twin).sdk
        rows, twin_rows = by_name[sdk]["turns"], by_name[twin]["turns"]
        assert [r["output_tokens"] for r in rows] == [r["output_tokens"] for r in twin_rows]
        assert [r["cached_tokens"] > 0 for r in rows] == [r["cached_tokens"] > 0 for r in twin_rows]
        for row in rows:  # phases from the timing event / Server-Timing, like the twin's
            assert set(twin_rows[0]["server"]) - {"turn"} <= set(row["server"]), sdk


def test_agents_sdk_resends_the_whole_history_and_gets_it_cached(
    run: tuple[Path, dict[str, Any]],
) -> None:
    _, document = run
    by_name = {r["transport"]: r for r in _main(document)}
    for agents, twin in report.AGENTS_PAIRS:
        transport = compare.Transport.parse(agents)
        assert (transport.agents, transport.resends_history, transport.sdk) == (True, True, False)
        assert transport.server_flags == ()  # the serve defaults: prefix reuse on
        record, twin_rows = by_name[agents], by_name[twin]["turns"]
        assert record["error"] is None
        rows = record["turns"]
        # One model request of the Runner per turn: the create and one per tool output.
        assert [row["turn"] for row in rows] == list(range(TOOL_CALLS + 1))
        assert [row["output_tokens"] for row in rows] == [r["output_tokens"] for r in twin_rows]
        # From the second request on, the history it resends is reported cached,
        # as much of it as for the trio/h11 client resending the same history.
        cached = [row["cached_tokens"] for row in rows]
        assert cached[0] == 0
        assert all(c > 0 for c in cached[1:]), cached
        assert cached == [r["cached_tokens"] for r in twin_rows], agents
        for previous, row in itertools.pairwise(rows):
            assert row["cached_tokens"] > previous["cached_tokens"]
            assert row["cached_tokens"] < row["input_tokens"]
        for row in rows:
            # Server phases (Server-Timing, or the inspector for agents-ws) like the twin's.
            assert set(twin_rows[0]["server"]) - {"turn"} <= set(row["server"]), agents
            assert row["server"]["resume_ms"] > 0
            # Runner.run hands the agent a response whole: no earlier first output.
            assert row["client_ttft_ms"] == row["observed_ms"]
            assert row["echo_rtt_ms"] is None


def test_history_and_bytes_follow_the_transport(run: tuple[Path, dict[str, Any]]) -> None:
    _, document = run
    by_name = {r["transport"]: r for r in _main(document)}
    history = [row["input_tokens"] for row in by_name["http"]["turns"]]
    assert history == sorted(set(history))
    # Every transport's model sees the same context on every turn.
    for record in by_name.values():
        assert [row["input_tokens"] for row in record["turns"]] == history, record["transport"]
    # The whole input again: the requests grow.
    for name in ("ws-full", "http-full", *compare.AGENTS_TRANSPORTS):
        sent = [row["sent_bytes"] for row in by_name[name]["turns"]]
        assert sent == sorted(set(sent)), name
    append = [row["sent_bytes"] for row in by_name["append"]["turns"][1:]]
    full = [row["sent_bytes"] for row in by_name["ws-full"]["turns"][1:]]
    assert all(a < f for a, f in zip(append, full, strict=True))


def test_servers_got_the_transport_flags(run: tuple[Path, dict[str, Any]]) -> None:
    _, document = run
    flags = {r["transport"]: r["server_flags"] for r in _main(document)}
    assert "--prefix-reuse" in flags["http-cached"]
    assert "--no-token-cache" in flags[ABLATION]
    assert not any(f.startswith("--no-") or f == "--prefix-reuse" for f in flags["append"])
    assert all("--sim-tokens-per-second" in f for f in flags.values())


def test_echo_floor_is_recorded_for_websocket_continuations(
    run: tuple[Path, dict[str, Any]],
) -> None:
    _, document = run
    assert document["echo"] is not None
    for record in document["rollouts"]:
        rows = record["turns"]
        # Ablations send the same frames as their transport: the same floor.
        floor = record["shape"] in compare.ECHO_SHAPES
        assert all((row["echo_rtt_ms"] is not None) == floor for row in rows)
        # The SDK's own round trip to the echo: only for the SDK, and dearer
        # than the bare client's (it encodes each event through its types).
        sdk = record["shape"] == "ws-sdk"
        assert all((row["client_echo_rtt_ms"] is not None) == sdk for row in rows)
        for row in rows:
            if floor:
                assert row["overhead_minus_echo_ms"] == pytest.approx(
                    row["overhead_ms"] - row["echo_rtt_ms"]
                )
        if sdk:
            own = statistics.median(row["client_echo_rtt_ms"] for row in rows)
            assert own > statistics.median(row["echo_rtt_ms"] for row in rows)
    assert sorted(document["echo"]["sdk_rtt_ms"]) == ["main:ws-sdk"]
    (sdk_target,) = [t for t in report.floor_targets(document) if t["transport"] == "ws-sdk"]
    assert "above the SDK client's own echo round trip" in sdk_target["text"]
    assert "above the bare echo" in sdk_target["text"]


def test_summary_has_a_row_per_transport_and_the_targets(
    run: tuple[Path, dict[str, Any]],
) -> None:
    out, _ = run
    summary = (out / "summary.md").read_text()
    for name in (*TRANSPORTS, ABLATION):
        assert summary.count(f"| `{name}` |") >= 1, name
    assert "## unthrottled" in summary
    assert "## Growth" in summary
    assert "Target 1" in summary
    assert "| `ws-sdk` vs `ws` |" in summary
    assert "| `http-sdk` vs `http` |" in summary
    assert "Agents SDK's Runner vs the trio/h11 client resending the whole history" in summary
    assert "| `agents-ws` vs `ws-full` |" in summary
    assert "| `agents-http` vs `http-full` |" in summary
    assert "same final answer" in summary
    assert "Target 2" in summary
    # 3 tool calls: target 1 (turn 50) is reported without a verdict.
    assert "outside the stated parameters" in summary
    floor = summary.split("## Latency floor targets", 1)[1]
    for name in ("append", "ws", "ws-sdk"):  # turn 3 stands in for turn 50
        assert f"{name} at 0 tok/s: first output " in floor, name
        assert "at turn 3 (target ≤ 1.0 ms" in floor
    assert "at 0 tok/s, 3 tool calls: append " in floor


def test_plots_are_png_files(run: tuple[Path, dict[str, Any]]) -> None:
    out, _ = run
    for name in report.PLOTS:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE), name


def test_ws_compression_both_runs_every_websocket_transport_side_by_side(
    compression_run: tuple[Path, dict[str, Any]],
) -> None:
    out, document = compression_run
    records = {r["transport"]: r for r in _main(document)}
    assert sorted(records) == [
        "agents-ws",
        "agents-ws+deflate",
        "http",
        "ws",
        "ws+deflate",
        "ws-sdk",
        "ws-sdk+deflate",
    ]
    assert [r for r in document["rollouts"] if r["error"]] == []
    for name, record in records.items():
        on = name.endswith("+deflate")
        assert ("--ws-compression" in record["server_flags"]) is on, name
        assert record["ws_compression"] == (None if name == "http" else "on" if on else "off")
    assert len({r["final_answer"] for r in records.values()}) == 1
    summary = (out / "summary.md").read_text()
    assert "Server `--ws-compression` off vs on" in summary
    assert "| `ws-sdk` | yes |" in summary
    assert "| `ws` | no (not offered) |" in summary
    assert "| `agents-ws` | offered (the `websockets` default; not read back) |" in summary


def test_compression_names_and_settings() -> None:
    deflated = compare.Transport.parse("ws-sdk+deflate")
    assert (deflated.shape, deflated.ws_compression) == ("ws-sdk", True)
    assert deflated.server_flags == ("--ws-compression", "on")
    assert compare.Transport.parse("append").deflated().name == "append+deflate"
    with pytest.raises(ValueError, match="WebSocket transports only"):
        compare.Transport.parse("http+deflate")
    for setting, expected in (
        ("off", ["http", "append"]),
        ("on", ["http", "append+deflate"]),
        ("both", ["http", "append", "append+deflate"]),
    ):
        options = compare.BenchOptions(
            transports=("http", "append"),
            speeds=(1000.0,),
            ws_compression=setting,
            ablations=False,
        )
        (block,), _ = compare.plan(options)
        assert [t.name for t in block.transports] == expected


def test_transport_names() -> None:
    assert compare.Transport.parse("append/no-token-cache").server_flags == ("--no-token-cache",)
    assert compare.Transport.parse("http-cached").server_flags == ("--prefix-reuse",)
    # The token cache is on by default: the stateless baseline turns it off.
    assert compare.Transport.parse("http").server_flags == ("--no-prefix-reuse",)
    for bad in (
        "carrier-pigeon",
        "http/no-token-cache",
        "append/no-such-switch",
        "agents-ws/no-token-cache",
    ):
        with pytest.raises(ValueError, match=r"transport|ablations"):
            compare.Transport.parse(bad)
    agents_ws = compare.Transport.parse("agents-ws+deflate")
    assert (agents_ws.shape, agents_ws.agents, agents_ws.websocket) == ("agents-ws", True, True)
    assert agents_ws.server_flags == ("--ws-compression", "on")
    with pytest.raises(ValueError, match="WebSocket transports only"):
        compare.Transport.parse("agents-http+deflate")


def test_gateway_names_and_plan() -> None:
    gateway = compare.Transport.parse("append@responses-ws+deflate")
    assert (gateway.shape, gateway.gateway, gateway.ws_compression) == (
        "append",
        "responses-ws",
        True,
    )
    assert compare.Transport.parse("http@chat").gateway == "chat"
    assert compare.Transport.parse("http").gateway is None
    with pytest.raises(ValueError, match="unknown gateway kind"):
        compare.Transport.parse("append@grpc")
    options = compare.BenchOptions(
        transports=("append",),
        speeds=(1000.0,),
        gateways=True,
        ws_compression="off",
        ablations=False,
    )
    (block,), _ = compare.plan(options)
    assert [t.name for t in block.transports] == ["append", *compare.GATEWAY_TRANSPORTS]
    assert compare.gateway_flags("chat", ServerProcess(port=1234)) == (
        "--upstream", "http://127.0.0.1:1234/v1",
        "--upstream-model", "sim",
        "--upstream-kind", "chat",
        "--served-model-name", "sim",
    )  # fmt: skip


def test_model_time_formula() -> None:
    workload = compare.Workload(
        tool_calls=1,
        output_tokens=1,
        tool_latency_ms=0,
        tokens_per_second=1000,
        ttft_ms=20,
        prefill_tokens_per_second=10_000,
    )
    assert workload.model_ms(output_tokens=50, uncached_tokens=2000) == pytest.approx(270)
    unthrottled = compare.Workload(1, 1, 0, 0, 0, 0)
    assert unthrottled.model_ms(output_tokens=50, uncached_tokens=2000) == 0


def test_websocket_frame_bytes_follow_rfc6455_length_forms() -> None:
    assert compare.websocket_frame_bytes(125) == 125 + 2 + 4
    assert compare.websocket_frame_bytes(126) == 126 + 4 + 4
    assert compare.websocket_frame_bytes(65536) == 65536 + 10 + 4


def test_url_mode_keeps_the_transports_that_need_no_flags() -> None:
    options = compare.BenchOptions(url="ws://127.0.0.1:1/v1/responses", speeds=(1000.0,))
    blocks, notes = compare.plan(options)
    names = {t.name for block in blocks for t in block.transports}
    assert names == set(compare.URL_TRANSPORTS)
    assert any("http-cached" in note for note in notes)


def test_empty_run_still_writes_a_report(tmp_path: Path) -> None:
    document = {
        "meta": {
            "command": None,
            "knobs": {},
            "machine": {"platform": "p", "cpu_count": 1, "python": "3", "implementation": "C"},
            "started": "now",
            "duration_s": 0.0,
            "model_time_formula": "",
            "server_overhead_formula": "",
            "notes": [],
        },
        "echo": None,
        "rollouts": [],
    }
    report.write(document, tmp_path)
    assert "none of the targets" in (tmp_path / "summary.md").read_text()
    assert report.targets(document) == []
    assert report.floor_targets(document) == []
    assert (tmp_path / "overhead_per_turn.png").read_bytes().startswith(PNG_SIGNATURE)


def test_gateway_topologies_run_through_a_second_process(
    gateway_run: tuple[Path, dict[str, Any]],
) -> None:
    out, document = gateway_run
    records = _main(document)
    assert sorted(r["transport"] for r in records) == sorted(GATEWAY_RUN)
    assert [r for r in records if r["error"]] == []
    # The engine behind each gateway is the same simulated model: the same answer,
    # the same turns, whichever backend carried them.
    assert len({r["final_answer"] for r in records}) == 1
    assert "I read 2 tool outputs" in records[0]["final_answer"]
    for record in records:
        assert [row["turn"] for row in record["turns"]] == [0, 1, 2]
        kind = record["transport"].partition("@")[2]
        flags = record["server_flags"]
        if kind:
            assert flags[flags.index("--upstream-kind") + 1] == kind
            assert flags[flags.index("--upstream") + 1].startswith("http://127.0.0.1:")
        else:
            assert "--upstream" not in flags
    summary = (out / "summary.md").read_text()
    for name in GATEWAY_RUN:
        assert f"| `{name}` |" in summary, name  # a row of the transport table


def test_agents_ws_reads_its_server_times_from_the_inspector() -> None:
    # The Agents SDK reads every frame itself: without the server's inspector
    # there are no per-turn server times to report, and the rollout says so.
    workload = compare.Workload(1, 40, 0, 0, 0, 0)
    transport = compare.Transport.parse("agents-ws")
    with ServerProcess("--store", "memory://", "--no-inspector") as server:
        endpoint = compare.Endpoint.from_url(server.url)
        record = trio.run(compare.run_rollout, endpoint, transport, workload)
    assert record["turns"] == []
    assert record["error"].startswith("RuntimeError: turn 0: GET /inspect/api/rollouts/resp_")
    assert "inspector gives agents-ws its server times" in record["error"]
