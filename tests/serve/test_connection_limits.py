"""One API key's connections cannot take another's place (issue 28, item 8).

- ``--max-connections-per-key``: a key at its cap of open WebSockets has its
  next handshake refused with HTTP 429 and the shipped error envelope
  (``too_many_connections``), while another key connects and is served; a
  connection closed gives its place back.
- At the process's open-file limit (a server process started with a low
  ``RLIMIT_NOFILE``, flooded with connections past it), the server backs off
  accepting: its log stays small (at most a line a second of the flood), a
  connection already open still gets its answers, and once the flood lets
  go new connections are served (``longresponse.serve.accept``).
"""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from longresponse.server_process import free_port
from tests.conftest import openai_client
from tests.support.shipped_ws import TERMINAL, sdk_turn
from tests.support.waiting import wait_for


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _answered(conn: Any) -> bool:
    """Whether a create on the shipped-shape socket ``conn`` completes."""
    conn.send(json.dumps({"type": "response.create", "model": "sim", "input": "hi"}))
    while (kind := json.loads(conn.recv(timeout=30))["type"]) not in TERMINAL:
        pass
    return kind == "response.completed"


def test_a_key_at_its_connection_cap_is_refused_while_another_connects(
    make_server: Any,
) -> None:
    server = make_server(api_keys=("key-a", "key-b"), max_connections_per_key=2)
    with contextlib.ExitStack() as held:
        key_a = [
            held.enter_context(ws_connect(server.url, additional_headers=_bearer("key-a")))
            for _ in range(2)
        ]
        with pytest.raises(InvalidStatus) as refused, ws_connect(
            server.url, additional_headers=_bearer("key-a")
        ):
            pass
        answer = refused.value.response
        assert answer.status_code == 429
        assert answer.headers["retry-after"] == "1"
        assert json.loads(answer.body or b"") == {
            "error": {
                "type": "rate_limit_error",
                "code": "too_many_connections",
                "message": "This API key has 2 WebSocket connections open, the most allowed "
                "(--max-connections-per-key). Close one and try again.",
                "param": None,
            }
        }
        # Another key connects and is served, over the official SDK.
        with openai_client(server, key="key-b").responses.connect() as conn:
            conn.response.create(model="sim", input="hello from b")
            assert sdk_turn(conn)[-1].type == "response.completed"
        # keyA's two are still open, and served.
        assert _answered(key_a[0])
        endpoint = server.app.parts.endpoint
        assert endpoint.open_per_key == {endpoint.keys.owner("Bearer key-a"): 2}
    # Closed, keyA's connections give their places back (once the server has
    # seen them close: the client does not wait for that).
    endpoint = server.app.parts.endpoint
    wait_for(lambda: endpoint.open_per_key == {}, "keyA's places to come back")
    with ws_connect(server.url, additional_headers=_bearer("key-a")) as again:
        assert _answered(again)
    wait_for(lambda: endpoint.open_per_key == {}, "the last place to come back")


#: The server process's open-file limit in the flood test: room for its own
#: files, the classifier's pipes and a few dozen connections.
FD_LIMIT = 64
#: Seconds the flood holds its connections.
FLOOD_SECONDS = 3.0


def _low_fd_limit() -> None:  # runs in the child, before exec
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in ticks of 1/100 s


@pytest.mark.slow  # holds a flood of connections for 3 s, and waits out the server's back-off
def test_at_the_open_file_limit_the_server_backs_off_and_serves_its_connections(
    tmp_path: Path,
) -> None:
    port = free_port()
    log_path = tmp_path / "server.log"
    command = [sys.executable, "-m", "longresponse", "serve", "--port", str(port),
               "--store", "memory://", "--log-level", "info"]  # fmt: skip
    url = f"ws://127.0.0.1:{port}/v1/responses"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=_low_fd_limit
        )
    flood: list[socket.socket] = []
    try:
        wait_for(lambda: _healthy(port) or process.poll() is not None, "the server", 20)
        assert process.poll() is None, log_path.read_text()
        with ws_connect(url, open_timeout=10) as held:
            assert _answered(held)  # the classifier and the store warmed up
            logged_before = log_path.stat().st_size
            cpu_before = _cpu_seconds(process.pid)
            # Past the limit: the kernel completes every handshake into the
            # listening socket's backlog; the server runs out of descriptors.
            for _ in range(FD_LIMIT + 200):
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            time.sleep(FLOOD_SECONDS)
            assert _answered(held), "an open connection was not served during the flood"
            cpu = _cpu_seconds(process.pid) - cpu_before
            logged = log_path.read_bytes()[logged_before:].decode(errors="replace")
            for sock in flood:
                sock.close()
            flood.clear()
            # Let go, the waiting connections are accepted (and end); new ones are served.
            with ws_connect(url, open_timeout=10) as fresh:
                assert _answered(fresh)
    finally:
        for sock in flood:
            sock.close()
        process.send_signal(2)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    lines = [line for line in logged.splitlines() if "accept" in line]
    print(f"flood: {len(logged)} bytes of log, {len(lines)} accept lines, {cpu:.2f} s of CPU")
    assert "cannot accept connections: Too many open files" in logged
    # At most a line a second of the flood (and one for the second it began in).
    assert 1 <= len(lines) <= FLOOD_SECONDS + 2, logged[:2000]
    assert len(logged) < 4096, logged[:2000]
    assert cpu < FLOOD_SECONDS / 2, f"the server spent {cpu:.2f} s of CPU in {FLOOD_SECONDS} s"
