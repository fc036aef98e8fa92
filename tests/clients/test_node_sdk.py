"""The official openai SDK for Node (with ws), installed by ``make test-services``:
its streamed HTTP tool loop and its ``ResponsesWS`` tool loop
(``sdk_loops.mjs``), each with a function, a custom tool, a namespace and a
hosted tool, and each through keepalives while the model is silent."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from longresponse.server_process import ServerProcess

#: the TypeScript SDK from npm (tests/clients/node_modules).
pytestmark = pytest.mark.npm

HERE = Path(__file__).parent


def test_the_node_sdk_runs_its_http_and_websocket_tool_loops(tmp_path: Path) -> None:
    node = shutil.which("node")
    assert node is not None, "Node is needed (make test-services installs the SDK)"
    with ServerProcess("--store", "memory://", "--keepalive-interval", "0.05") as server:
        done = subprocess.run(
            [node, str(HERE / "sdk_loops.mjs"), f"{server.http_url}/v1"],
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    loops = {run["loop"]: run for run in map(json.loads, done.stdout.splitlines())}
    assert set(loops) == {"http", "ws"}
    for run in loops.values():
        assert run["turns"] == 4  # three calls, answered, then the final answer
        assert run["text"].startswith("You asked: «Fix the flaky test.». I read 3 tool outputs")
        for turn in range(3):
            assert f"«ran {turn}»" in run["text"]
        # Each client kind called in its own shape; the hosted tool echoed, never called.
        assert run["made"] == [
            ["function_call", "run_tests", None],
            ["custom_tool_call", "apply_diff", None],
            ["function_call", "read_file", "repo"],
        ]
        assert run["echoed"] == ["function", "custom", "namespace", "web_search"]
        assert "keepalive" in run["kinds"]  # read through, mid-turn
        assert run["kinds"].count("response.completed") == 4
