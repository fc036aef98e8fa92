"""A real nginx in front of longresponse processes, for the deployment tests.

No root paths: :class:`NginxProxy` writes a config into a temporary
directory (pid file, error log and every temp path inside it), runs Debian's
``nginx`` binary with ``-p``/``-c``/``-e`` and ``daemon off;`` on a free loopback
port, waits (bounded) until a request through it reaches an upstream, and
stops it with SIGTERM. :data:`SITE` is the proxying part, the one docs/RELIABILITY.md
shows: WebSocket upgrades passed through, timeouts above the 60-minute
connection limit, no buffering (SSE); :data:`UPSTREAM_PARAMETERS` go on each
upstream server's line, as there. :func:`nginx_executable` FAILS the test
when nginx is missing (``make test`` installs it), never skips.
"""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import pytest

from longresponse.server_process import free_port

__all__ = ["SITE", "UPSTREAM_PARAMETERS", "NginxProxy", "nginx_executable"]

#: Seconds to wait for a started nginx to pass a request through.
START_TIMEOUT = 10.0
#: Seconds to wait for it to exit after SIGTERM before SIGKILL.
STOP_TIMEOUT = 10.0
#: Fresh ports to try if another process takes the chosen one first.
START_ATTEMPTS = 3

#: The proxy settings for longresponse (docs/RELIABILITY.md, "A load-balanced deployment").
#: ``$connection_upgrade`` comes from the ``map`` in :data:`CONFIG`.
SITE = """\
    location / {
        proxy_pass http://longresponse;
        proxy_http_version 1.1;
        proxy_set_header Upgrade $http_upgrade;
        proxy_set_header Connection $connection_upgrade;
        proxy_set_header Host $host;
        proxy_read_timeout 3700s;
        proxy_send_timeout 3700s;
        proxy_buffering off;
        proxy_request_buffering off;
        client_max_body_size 40m;
        # For the tests: which process answered.
        add_header X-Upstream $upstream_addr always;
    }
"""

#: Each upstream server's parameters (docs/RELIABILITY.md): no passive health
#: check. nginx counts a process that refused a connection (it is restarting)
#: as down until a request through it completes, and a WebSocket's request
#: completes only when the socket closes: after a restart it lets one new
#: socket through per ``fail_timeout`` and answers the rest 502 ("no live
#: upstreams"). Without it a refused connect goes on to the next process at once.
UPSTREAM_PARAMETERS = "max_fails=0"

CONFIG = """\
daemon off;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ''      close;
    }}
    upstream longresponse {{
{servers}
    }}
    server {{
        listen 127.0.0.1:{port};
{site}
    }}
}}
"""


def nginx_executable() -> str:
    """The nginx binary; fails (not skips) the test when it is not installed."""
    executable = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if executable is None:
        pytest.fail(
            "nginx is not installed: `make test` installs it (or: apt-get install nginx-light)",
            pytrace=False,
        )
    return executable


def _passes_through(port: int) -> bool:
    """A request through nginx got an upstream's answer (any but nginx's own 502/504)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status not in (502, 504)
    except OSError:
        return False
    finally:
        connection.close()


class NginxProxy:
    """nginx round-robin over ``upstreams`` (loopback ports), as a context manager."""

    def __init__(self, upstreams: list[int]) -> None:
        self.upstreams = upstreams
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir = tempfile.TemporaryDirectory(prefix="longresponse-nginx-")
        # Workers drop to an unprivileged user when nginx starts as root.
        os.chmod(self._workdir.name, 0o755)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        path = Path(self._workdir.name) / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> Self:
        """Start on a free port; raises RuntimeError (with nginx's log) if nothing passes."""
        executable = nginx_executable()
        failures: list[str] = []
        for _ in range(START_ATTEMPTS):
            self.port = free_port()
            error = self._try_start(executable)
            if error is None:
                return self
            failures.append(error)
        self._workdir.cleanup()
        raise RuntimeError("nginx did not start:\n" + "\n".join(failures))

    def _try_start(self, executable: str) -> str | None:
        root = self._workdir.name
        servers = "\n".join(
            f"        server 127.0.0.1:{port} {UPSTREAM_PARAMETERS};" for port in self.upstreams
        )
        config = Path(root) / "nginx.conf"
        config.write_text(CONFIG.format(root=root, servers=servers, port=self.port, site=SITE))
        output = Path(root) / "stderr.log"
        with output.open("wb") as stream:  # the child keeps its own descriptor
            process = subprocess.Popen(
                [executable, "-p", root, "-c", str(config), "-e", f"{root}/error.log"],
                stdout=stream,
                stderr=stream,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if _passes_through(self.port):
                self._process = process
                return None
            if process.poll() is not None:
                break
            time.sleep(0.05)
        _stop(process)
        return f"port {self.port}, exit code {process.returncode}:\n{output.read_text()}{self.log}"

    def stop(self) -> None:
        """Terminate nginx, wait for it, and remove its directory."""
        if self._process is not None:
            _stop(self._process)
            self._process = None
        self._workdir.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
