"""``scripts/stream_cost.py``, which docs/BENCHMARKS.md counts instructions with,
streams one delta a token through the engine into a protocol Connection."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import ROOT


@pytest.mark.slow  # runs the script as a process
def test_the_stream_cost_script_streams_a_delta_a_token() -> None:
    counted = {}
    for tokens in (100, 300):
        done = subprocess.run(
            [sys.executable, "scripts/stream_cost.py", str(tokens)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        counted[tokens] = int(done.stdout.split()[0])
    assert counted[300] - counted[100] == 200  # the difference is the tokens' deltas
