"""The secrets classifier's child process ends with its server (issue 28).

A ``longresponse serve`` process reads a long text in its classifier's child
(a fork server's child), then is killed with SIGKILL: every process it had
started (the fork server, its child, the resource tracker) must be gone
within a few seconds, not left running under init.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import httpx
import pytest

from longresponse.serve.scan_process import FAR_CHARS
from longresponse.server_process import ServerProcess
from tests.support.waiting import wait_for


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (from ``/proc``; zombies left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        if int(parent) == pid and state != "Z":
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow  # starts a server process and waits for its children to end
def test_the_classifiers_child_ends_when_its_server_is_killed(tmp_path: Path) -> None:
    server = ServerProcess("--store", f"sqlite:///{tmp_path}/responses.db").start()
    assert server.process is not None
    started: list[int] = []
    try:
        text = "word " * (FAR_CHARS // 5 + 1)  # long enough to be read in the child
        reply = httpx.post(
            f"{server.http_url}/v1/responses", json={"model": "sim", "input": text}, timeout=60
        )
        assert reply.status_code == 200, reply.text
        started = _children(server.process.pid)
        started += [grandchild for child in started for grandchild in _children(child)]
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in started]
        assert sum(b"multiprocessing.forkserver" in command for command in commands) == 2

        server.process.kill()
        server.process.wait()
        wait_for(lambda: not any(_alive(pid) for pid in started), "the children to end", 5)
    finally:
        server.process.kill()
        server.process.wait()
        for pid in started:  # a failed run leaves nothing behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
