"""A longresponse server in a child process, for benchmarks, examples and tests.

    with ServerProcess("--store", "memory://") as server:
        ... server.url ...   # ws://127.0.0.1:PORT/v1/responses

The process runs ``python -m longresponse serve`` on a free loopback port; it
is ready when the port accepts connections, and is stopped with SIGINT (a
clean stop: queued post-inference writes are drained), killed only if it does
not stop in time. Its output goes where the parent's does, or to ``log_file``
(:meth:`ServerProcess.log` reads it: what an operator would read).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Final, Self

__all__ = [
    "STARTUP_TIMEOUT",
    "STOP_TIMEOUT",
    "ServerProcess",
    "free_port",
    "server_url",
    "stop_process",
]

STARTUP_TIMEOUT: Final = 20.0
#: Above the server's default shutdown drain timeout (20 s), so a clean stop
#: that waits for a turn is not killed half-way.
STOP_TIMEOUT: Final = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(
    process: subprocess.Popen[bytes] | None, stop: signal.Signals, timeout: float
) -> None:
    """Send ``process`` the ``stop`` signal and wait for it to end; kill it if it
    takes longer than ``timeout`` seconds. Nothing for a process that has ended."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(stop)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class ServerProcess:
    """``longresponse serve`` with extra ``flags``, as a context manager."""

    def __init__(
        self,
        *flags: str,
        port: int | None = None,
        log_level: str = "warning",
        log_file: Path | None = None,
    ) -> None:
        self.port = port or free_port()
        self.flags = flags
        self.log_level = log_level
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line of the child process."""
        return [sys.executable, "-m", "longresponse", "serve", "--port", str(self.port),
                "--log-level", self.log_level, *self.flags]  # fmt: skip

    def start(self) -> Self:
        """Start the process and wait until it accepts connections.

        Raises ``RuntimeError`` (the process killed) if it exits or is not
        ready within :data:`STARTUP_TIMEOUT` seconds.
        """
        if self.log_file is None:
            self.process = subprocess.Popen(self.command())
        else:
            with self.log_file.open("ab") as output:  # the child keeps its own descriptor
                self.process = subprocess.Popen(
                    self.command(), stdout=output, stderr=subprocess.STDOUT
                )
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.process.kill()
                    self.process.wait()
                    raise RuntimeError(
                        f"server process on port {self.port} did not start"
                    ) from None
                time.sleep(0.05)

    def log(self) -> str:
        """What the server has written so far to ``log_file`` (empty without one)."""
        if self.log_file is None or not self.log_file.exists():
            return ""
        return self.log_file.read_text(errors="replace")

    def stop(self) -> None:
        """A clean stop (SIGINT); a kill if it takes longer than :data:`STOP_TIMEOUT`."""
        stop_process(self.process, signal.SIGINT, STOP_TIMEOUT)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


@contextmanager
def server_url(url: str | None, *flags: str) -> Iterator[str]:
    """``url`` as it is, or the url of a server process started with ``flags``."""
    if url:
        yield url
        return
    with ServerProcess(*flags) as server:
        yield server.url
