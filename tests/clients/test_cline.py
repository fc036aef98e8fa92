"""The Cline CLI (``cline`` 3) at its defaults against the server: its
``openai-native`` provider (the Responses API) pointed at the server's
``/v1`` with ``cline auth``, asked two questions in one session, each
answered after a tool loop in which Cline really reads a file.

The CLI takes a second user turn only in its terminal UI (``cline --id
SESSION`` opens it and refuses a prompt argument and ``--json``), so the
conversation is held through Cline's Agent Client Protocol mode (``cline
--acp``, JSON-RPC over stdio, ``cline_acp.mjs``), as an editor holds one.
Three settings make that run here: ``HOME`` in the test's directory (Cline
keeps its settings and sessions in ``~/.cline``);
``CLINE_SESSION_BACKEND_MODE=local``, else Cline starts a background "hub"
daemon that outlives the test; and ``CLINE_PROVIDER`` with ``CLINE_API_KEY``,
since ACP mode otherwise signs in only to Cline's own accounts.

The simulated model cannot be told what to call by Cline (it sets no
``metadata``), so the server's flags script its calls (``--sim-call``).
Cline records the usage of each model request on its assistant message in
the session's messages file; the reuse it gets is the server's prefix reuse
alone, since it resends the whole conversation every time (issue 29).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from longresponse.server_process import ServerProcess
from tests.clients.whole_history import (
    HERE,
    NODE,
    RequestUsage,
    assert_prefix_reused,
    responses_by_transport,
    run_node,
    sim_answer,
)

#: Cline from npm, on Node 22 from npm (tests/clients/node_modules).
pytestmark = pytest.mark.npm

CLINE = HERE / "node_modules" / ".bin" / "cline"
NOTES = "notes: scratch-7f3a"
QUESTIONS = ("Read the notes.", "Now say it again.")


def _cline_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HOME=str(home),
        PATH=f"{NODE.parent}{os.pathsep}{env.get('PATH', '')}",  # its launcher on Node 22
        CLINE_SESSION_BACKEND_MODE="local",
        CLINE_PROVIDER="openai-native",
        CLINE_API_KEY="dummy",
    )
    return env


def _usages(home: Path, session_id: str) -> list[RequestUsage]:
    """Each model request's usage as Cline recorded it, in order."""
    path = home / ".cline" / "data" / "sessions" / session_id / f"{session_id}.messages.json"
    messages = json.loads(path.read_text())["messages"]
    metrics = [m["metrics"] for m in messages if m["role"] == "assistant"]
    return [RequestUsage(m["inputTokens"], m["cacheReadTokens"]) for m in metrics]


def _outputs(run: dict[str, Any]) -> list[tuple[str, str]]:
    """Each tool call's id and its output as Cline sent it to the model (JSON)."""
    calls = [call for turn in run["turns"] for call in turn["tool_calls"]]
    return [(c["call_id"], json.dumps(c["output"], separators=(",", ":"))) for c in calls]


@pytest.mark.slow  # a server process, and Cline started and run for two turns: about 10 s
def test_cline_runs_a_tool_loop_and_a_second_turn(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "NOTES.txt").write_text(NOTES + "\n")
    home = tmp_path / "home"
    settings = home / ".cline" / "data" / "settings"
    settings.mkdir(parents=True)
    # The user's choices, not the protocol's: no usage telemetry, no self-update.
    quiet = {"telemetryOptOut": True, "autoUpdateEnabled": False}
    (settings / "global-settings.json").write_text(json.dumps(quiet))
    env = _cline_env(home)
    script = (
        "--sim-tool-calls",
        "2",
        "--sim-call",
        f"read_files={json.dumps({'files': [{'path': str(repo / 'NOTES.txt')}]})}",
    )
    with ServerProcess("--store", "memory://", *script) as server:
        configured = subprocess.run(
            [str(CLINE), "auth", "-p", "openai-native", "-k", "dummy", "-m", "sim",
             "-b", f"{server.http_url}/v1"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert configured.returncode == 0, configured.stderr[-2000:]
        run = run_node("cline_acp.mjs", str(CLINE), str(repo), *QUESTIONS, env=env)
        counted = responses_by_transport(server.http_url)

    # Two turns, each two calls that Cline ran (it asked, once a call), then the answer.
    assert [turn["stop_reason"] for turn in run["turns"]] == ["end_turn", "end_turn"]
    assert [len(turn["tool_calls"]) for turn in run["turns"]] == [2, 2]
    assert run["permissions"] == 4
    for turn in run["turns"]:
        for call in turn["tool_calls"]:
            assert [read["result"] for read in call["output"]] == [f"1 | {NOTES}"]
    # Each answer quotes every question and tool output of the conversation so far.
    outputs = _outputs(run)
    assert run["turns"][0]["text"] == sim_answer(QUESTIONS[:1], outputs[:2])
    assert run["turns"][1]["text"] == sim_answer(QUESTIONS, outputs)
    assert counted == {"http": 6}

    # The usage Cline recorded, one entry per model request.
    seen = _usages(home, run["session_id"])
    assert len(seen) == 6
    grown = [usage.input_tokens for usage in seen]
    assert grown == sorted(set(grown))  # the whole conversation, longer each time
    assert_prefix_reused(seen)
