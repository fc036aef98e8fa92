"""The Codex CLI at its defaults against the server, over HTTP and over its
WebSocket transport: a multi-turn tool loop whose commands Codex really runs
(in a scratch repository, read-only sandbox), ``codex exec resume`` on a new
connection, a turn whose model is silent past Codex's stream idle timeout, and
Codex's remote compaction round trip in the middle of a tool loop.

The simulated model cannot be told what to call by Codex (it sets no
``metadata``), so the server's flags script its calls (``--sim-call``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from longresponse.server_process import ServerProcess
from tests.clients.codex import codex_home, items, run_codex, scratch_repo

#: Codex from npm (tests/clients/node_modules).
pytestmark = pytest.mark.npm

SCRIPT = (
    "--sim-tool-calls",
    "2",
    "--sim-call",
    'exec_command={"cmd": "cat NOTES.txt"}',
    "--sim-call",
    'exec_command={"cmd": "git rev-parse --is-inside-work-tree"}',
)


@pytest.fixture(params=["http", "websocket"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess("--store", f"sqlite:///{tmp_path}/r.db", *SCRIPT) as running:
        yield running


def _describe(events: list[dict[str, Any]], done: Any) -> str:
    return json.dumps(events, indent=1)[-4000:] + done.stderr[-2000:]


def test_codex_runs_the_models_commands_and_resumes_the_thread(
    scripted: ServerProcess, transport: str, tmp_path: Path
) -> None:
    home = codex_home(tmp_path, f"{scripted.http_url}/v1", websocket=transport == "websocket")
    repo = scratch_repo(tmp_path)
    events, done = run_codex(home, repo, "Read the notes.")
    assert done.returncode == 0, _describe(events, done)
    commands = items(events, "command_execution")
    assert [c["exit_code"] for c in commands] == [0, 0], _describe(events, done)
    assert "scratch-notes-7f3a" in commands[0]["aggregated_output"]  # Codex ran it
    assert commands[1]["aggregated_output"].strip().endswith("true")
    (answer,) = items(events, "agent_message")
    assert "«Read the notes.»" in answer["text"]
    assert "I read 2 tool outputs" in answer["text"]
    assert events[-1]["type"] == "turn.completed"
    thread = events[0]["thread_id"]

    events, done = run_codex(home, repo, "resume", thread, "Now the log.")
    assert done.returncode == 0, _describe(events, done)
    (answer,) = items(events, "agent_message")
    # The resumed thread's history reached the model: both requests, four outputs.
    assert "«Read the notes.» | «Now the log.»" in answer["text"]
    assert "I read 4 tool outputs" in answer["text"]
    assert len(items(events, "command_execution")) == 2


@pytest.mark.parametrize("keepalive", [True, False], ids=["keepalive", "silent"])
def test_a_model_silent_past_codexs_idle_timeout_completes_with_keepalives(
    transport: str, keepalive: bool, tmp_path: Path
) -> None:
    flags = ("--sim-tool-calls", "0", "--sim-ttft-ms", "2500")
    interval = ("--keepalive-interval", "0.3" if keepalive else "0")
    with ServerProcess("--store", "memory://", *flags, *interval) as server:
        home = codex_home(
            tmp_path,
            f"{server.http_url}/v1",
            websocket=transport == "websocket",
        )
        config = home / "config.toml"
        config.write_text(
            config.read_text() + "stream_idle_timeout_ms = 1000\nstream_max_retries = 0\n"
            "request_max_retries = 0\n"
        )
        events, done = run_codex(home, scratch_repo(tmp_path), "Think long.")
    completed = events[-1]["type"] == "turn.completed" if events else False
    if keepalive:
        assert completed, _describe(events, done)
        (answer,) = items(events, "agent_message")
        assert "«Think long.»" in answer["text"]
    else:  # without them Codex's watchdog gives up: the test can fail
        assert not completed, _describe(events, done)


def _compactions(home: Path) -> list[list[dict[str, Any]]]:
    """The replacement histories of the ``compacted`` entries in Codex's session files."""
    histories = []
    for session in sorted((home / "sessions").rglob("*.jsonl")):
        for line in session.read_text().splitlines():
            entry = json.loads(line)
            if entry["type"] == "compacted":
                histories.append(entry["payload"].get("replacement_history") or [])
    return histories


def _kinds(history: Sequence[dict[str, Any]]) -> list[str]:
    return [str(item.get("role") or item["type"]) for item in history]


@pytest.mark.parametrize("provider", ["OpenAI", "longresponse"], ids=["remote", "local"])
def test_codexs_compaction_mid_turn_keeps_the_tool_loop_going(
    transport: str, provider: str, tmp_path: Path
) -> None:
    # Codex compacts remotely (a compaction_trigger turn) only for a provider it
    # takes for OpenAI's (named "OpenAI") or Azure's; any other gets its local
    # compaction (it asks the model for a summary in a user message and sends
    # the summary back as the last user message). A limit below its own
    # instructions' size makes it compact after every tool turn.
    script = (*SCRIPT[2:], "--sim-tool-calls", "4")
    with ServerProcess("--store", "memory://", *script) as server:
        home = codex_home(
            tmp_path,
            f"{server.http_url}/v1",
            websocket=transport == "websocket",
            extra="model_auto_compact_token_limit = 2000",
        )
        config = home / "config.toml"
        named = config.read_text().replace('name = "longresponse"', f'name = "{provider}"')
        config.write_text(named)
        events, done = run_codex(home, scratch_repo(tmp_path), "Read the notes.")
    assert done.returncode == 0, _describe(events, done)
    assert events[-1]["type"] == "turn.completed", _describe(events, done)
    commands = items(events, "command_execution")
    # Four calls in all: compaction did not restart the count.
    assert [c["exit_code"] for c in commands] == [0, 0, 0, 0], _describe(events, done)
    assert "scratch-notes-7f3a" in commands[2]["aggregated_output"]
    histories = _compactions(home)
    assert histories, "Codex never compacted"
    for history in histories:
        kinds = _kinds(history)
        if provider == "OpenAI":
            # The one compaction item it got back (Codex fails the turn on any
            # other count), after the user messages it keeps.
            assert kinds.count("compaction") == 1, kinds
            assert kinds[-1] == "compaction"
            assert history[-1]["encrypted_content"]
        else:  # the sim's summary, handed back as the last user message
            assert "compaction" not in kinds
            assert "I read " in json.dumps(history[-1])
    (answer,) = items(events, "agent_message")
    assert "«Read the notes.»" in answer["text"]
    assert "I read 4 tool outputs" in answer["text"]  # every output, across compactions
