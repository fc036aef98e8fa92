"""The suite's tiers (tests/support/tiers.py): a run that selects tests needing
a part this machine lacks ends before any test, in one line that names the
part and the command that installs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tiers import MARKERS

#: pytest itself, in a child process.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def run_pytest(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_run_without_the_engine_says_what_is_missing_in_one_line(tmp_path: Path) -> None:
    done = run_pytest(
        "tests/llama/test_docs_commands.py", env={"LONGRESPONSE_ENGINE_CACHE": str(tmp_path)}
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    said = [line for line in done.stdout.splitlines() if "missing for the selected tests" in line]
    assert len(said) == 1, done.stdout
    assert "the engine (llama-server, SmolLM2); make engine installs" in said[0]
    assert "passed" not in done.stdout  # nothing ran
    assert "failed" not in done.stdout


def test_on_xdist_workers_each_test_of_the_tier_fails_with_the_line(tmp_path: Path) -> None:
    done = run_pytest(
        "tests/llama/test_docs_commands.py",
        "-n",
        "2",
        env={"LONGRESPONSE_ENGINE_CACHE": str(tmp_path)},
    )
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert "3 errors" in done.stdout  # each fails at its setup, none runs
    said = "missing for the selected tests: the engine (llama-server, SmolLM2); make engine"
    reports = [line for line in done.stdout.splitlines() if line.startswith(said)]
    assert len(reports) == 3  # each test's own report (the summary lines add more)


def test_deselecting_the_tier_runs_the_rest(tmp_path: Path) -> None:
    done = run_pytest(
        "tests/llama/test_docs_commands.py",
        "tests/test_llama_server.py",
        "-m",
        "not engine",
        env={"LONGRESPONSE_ENGINE_CACHE": str(tmp_path)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 passed" in done.stdout


def test_every_tier_is_registered_with_what_it_needs() -> None:
    done = run_pytest("--markers", env={})
    for name in MARKERS:
        assert f"@pytest.mark.{name}: {MARKERS[name]}" in done.stdout
