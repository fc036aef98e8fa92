"""A real ``redis-server`` on a free loopback port, for the tests that need one.

No fakes: :class:`RedisServer` starts the binary that ``make test`` installs,
with nothing persisted, waits (bounded) until it answers ``PING``, and stops
it with SIGTERM. :func:`redis_server_fixture` is the body of the session-scoped
``redis_url`` fixture; if ``redis-server`` is missing it FAILS the tests that
use it (never skips).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["RedisServer", "redis_server_fixture"]

#: Seconds to wait for a started server to answer PING.
START_TIMEOUT = 10.0
#: Seconds to wait for it to exit after SIGTERM before SIGKILL.
STOP_TIMEOUT = 10.0
#: Fresh ports to try if another process takes the chosen one first.
START_ATTEMPTS = 3


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process: :meth:`start`, then :attr:`url`, then :meth:`stop`."""

    def __init__(self, executable: str) -> None:
        self.executable = executable
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir = tempfile.TemporaryDirectory(prefix="longresponse-redis-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start on a free port; raises RuntimeError (with the server's log) if it never answers."""
        failures: list[str] = []
        for _ in range(START_ATTEMPTS):
            self.port = _free_port()
            error = self._try_start()
            if error is None:
                return self
            failures.append(error)
        self._workdir.cleanup()
        raise RuntimeError("redis-server did not start:\n" + "\n".join(failures))

    def _try_start(self) -> str | None:
        log = Path(self._workdir.name) / f"redis-{self.port}.log"
        # fmt: off
        command = [
            self.executable,
            "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--dir", self._workdir.name, "--logfile", "", "--loglevel", "warning",
        ]
        # fmt: on
        with log.open("wb") as output:  # the child keeps its own descriptor
            process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if _answers_ping(self.port):
                self._process = process
                return None
            if process.poll() is not None:
                break
            time.sleep(0.02)
        _stop(process)
        output_text = log.read_text(errors="replace")
        return f"port {self.port}, exit code {process.returncode}:\n{output_text}"

    def stop(self) -> None:
        """Terminate the server, wait for it, and remove its working directory."""
        if self._process is not None:
            _stop(self._process)
            self._process = None
        self._workdir.cleanup()


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def redis_server_fixture() -> Iterator[str]:
    """Yield the URL of a real redis-server started for this test session.

    Fails (not skips) the tests that use it when ``redis-server`` is not installed.
    """
    executable = shutil.which("redis-server")
    if executable is None:
        pytest.fail(
            "redis-server is not installed: `make test` installs it "
            "(or: apt-get install redis-server)",
            pytrace=False,
        )
    server = RedisServer(executable).start()
    try:
        yield server.url
    finally:
        server.stop()
