"""The command line: --help documents every flag; a real server process serves."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from longresponse.cli import build_parser
from longresponse.client import connect
from protocol import ResponseDone


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
def server_process() -> object:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "longresponse",
            "serve",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("server process did not start") from None
            time.sleep(0.05)
    yield port
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover
        proc.kill()


async def test_server_process_serves_a_rollout(server_process: int) -> None:
    async with connect(f"ws://127.0.0.1:{server_process}/v1/responses") as client:
        await client.create(model="sim", input="hello from a real process")
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "completed"
