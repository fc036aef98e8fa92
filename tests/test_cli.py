"""The command line: --help documents every flag; a real server process serves."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from longresponse.cli import build_parser
from longresponse.client import connect
from longresponse.server_process import ServerProcess
from protocol.events import ResponseDone


def test_help_documents_every_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "longresponse", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    flags = [
        opt for action in serve._actions for opt in action.option_strings if opt.startswith("--")
    ]
    assert len(flags) > 10
    for flag in flags:
        assert flag in result.stdout
    for action in serve._actions:
        assert action.help, action


@pytest.fixture
def server_process(tmp_path: Any) -> Iterator[ServerProcess]:
    with ServerProcess("--store", f"sqlite:///{tmp_path}/responses.db") as running:
        yield running


async def test_server_process_serves_a_rollout(server_process: ServerProcess) -> None:
    async with connect(server_process.url) as client:
        await client.create(model="sim", input="hello from a real process")
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "completed"
