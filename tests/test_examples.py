"""The examples run for real against a live server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # the example as a process, with real tools
def test_agent_loop_example_runs_real_tools(server: Any) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "agent_loop.py"),
            "--url",
            server.url,
            "--root",
            str(ROOT),
            "--calls",
            "4",
            "--parallel",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count("→ ") == 4  # four tool calls, run by the client
    assert "← list_dir:" in out
    assert "← read_file:" in out
    assert " completed in " in out
    assert "I read 4 tool outputs" in out
