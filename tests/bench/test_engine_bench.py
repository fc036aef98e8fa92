"""``longresponse bench-engine``'s own arithmetic: the engine's log read, a
continuation's reuse, the gateway's configuration, the tool outputs. The run
itself needs the real engine; docs/BENCHMARKS.md holds one."""

from __future__ import annotations

from pathlib import Path

from longresponse.backends.settings import load_toml
from longresponse.bench.engine import (
    CONFIGS,
    TurnRecord,
    cache_row,
    continuations,
    engine_times,
    gateway_toml,
    reused,
    tool_output,
)

LOG = """\
0.11.449.505 I slot print_timing: id  1 | task 0 | prompt eval time =    7299.77 ms /   192 tokens
0.11.449.510 I slot print_timing: id  1 | task 0 |        eval time =     300.00 ms /    19 tokens
0.11.449.530 I slot print_timing: id  1 | task 0 |       total time =    7599.77 ms /   211 tokens
0.12.000.000 I srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 200
0.13.610.530 I slot print_timing: id  0 | task 7 |       total time =    5181.97 ms /    52 tokens
"""


def turn(rollout: int, number: int, prompt: int, cached: int) -> TurnRecord:
    return TurnRecord("many", "append", "slots", rollout, number, 1.0, 2.0, prompt, cached)


def test_the_engine_log_gives_each_request_its_total_time() -> None:
    assert engine_times(LOG) == [7599.77, 5181.97]


def test_a_continuation_reuses_the_share_of_the_previous_prompt_found_cached() -> None:
    # Two rollouts, their turns out of order as concurrent rollouts finish.
    records = [
        turn(1, 2, 1300, 1000),  # half of rollout 1's first prompt lost
        turn(2, 1, 900, 0),
        turn(1, 1, 1000, 0),
        turn(2, 2, 1250, 1180),  # more than the prefix: the call was cached too
    ]
    pairs = continuations(records)
    assert sorted((p.rollout, p.turn, t.turn) for p, t in pairs) == [(1, 1, 2), (2, 1, 2)]
    shares = {t.rollout: reused(p, t) for p, t in pairs}
    assert shares == {1: 1.0, 2: 1.0}
    lost = turn(1, 3, 1600, 650)
    assert reused(turn(1, 2, 1300, 1000), lost) == 0.5
    row = cache_row([*pairs, (turn(1, 2, 1300, 1000), lost)])
    assert row["continuations"] == 3
    assert row["reused_min"] == 0.5
    assert row["evaluated_max"] == 950
    assert row["evaluated_median"] == 300


def test_each_config_is_a_chat_backend_the_server_accepts(tmp_path: Path) -> None:
    for name, settings in CONFIGS.items():
        filled = {k: (2 if v == -1 else v) for k, v in settings.items()}
        path = tmp_path / f"{name}.toml"
        path.write_text(gateway_toml("http://127.0.0.1:8080/v1", filled, 48))
        (backend,) = load_toml(str(path))
        assert backend.kind == "chat"
        assert backend.max_output_tokens == 48
        assert backend.slots == filled.get("slots", 0)
        assert backend.cache_prompt is filled.get("cache_prompt", False)


def test_tool_outputs_are_the_same_per_turn_and_differ_between_rollouts() -> None:
    text = tool_output(3, 4, 60)
    assert text == tool_output(3, 4, 60)
    assert text != tool_output(4, 4, 60)
    assert len(text.split()) >= 60
