"""Running the real Codex CLI (``codex exec``) against a server, at its defaults.

Codex is installed by ``make test-services`` (tests/clients/package-lock.json).
Each run gets a temporary ``CODEX_HOME`` whose config names one custom model
provider: the server at ``base_url``, ``wire_api = "responses"``, model
``sim``, a dummy key from ``env_key``; ``supports_websockets`` picks its
WebSocket transport. No Codex feature is turned off.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Final

from tests.support.paths import ROOT

CODEX: Final = ROOT / "tests" / "clients" / "node_modules" / ".bin" / "codex"
NODE_MODULES: Final = ROOT / "tests" / "clients" / "node_modules"
#: The dummy key's variable (the server runs without API keys).
KEY_ENV: Final = "LONGRESPONSE_TEST_KEY"


def codex_home(tmp: Path, base_url: str, *, websocket: bool, extra: str = "") -> Path:
    home = tmp / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        f"""model = "sim"
model_provider = "longresponse"
{extra}
[model_providers.longresponse]
name = "longresponse"
base_url = "{base_url}"
wire_api = "responses"
env_key = "{KEY_ENV}"
supports_websockets = {"true" if websocket else "false"}
"""
    )
    return home


def scratch_repo(tmp: Path) -> Path:
    """A git repository with one file, for Codex to work in."""
    repo = tmp / "repo"
    repo.mkdir()
    (repo / "NOTES.txt").write_text("scratch-notes-7f3a\n")
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "."], cwd=repo, check=True)
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=repo, check=True)
    return repo


def run_codex(
    home: Path, repo: Path, *args: str, timeout: float = 120
) -> tuple[list[dict[str, Any]], subprocess.CompletedProcess[str]]:
    """``codex exec --json`` with a read-only sandbox; its JSON events and the process."""
    env = {**os.environ, "CODEX_HOME": str(home), KEY_ENV: "dummy", "NO_COLOR": "1"}
    done = subprocess.run(
        [str(CODEX), "exec", "--json", "-s", "read-only", *args],
        cwd=repo,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    events = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    return events, done


def items(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [
        event["item"]
        for event in events
        if event["type"] == "item.completed" and event["item"]["type"] == kind
    ]
