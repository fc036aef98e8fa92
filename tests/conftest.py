"""Shared fixtures: a real uvicorn (wsproto) server on a free loopback port.

The server runs in a thread with its own asyncio loop, so a test (trio, via
pytest-trio) talks to it over real TCP exactly as any client would, and can
still look at the app's state (live sessions) to check cleanup.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn

from longresponse.config import ServerConfig
from longresponse.serve.app import create_app
from longresponse.serve.collector import set_switch_interval
from longresponse.serve.ws.oversize import LingeringWSProtocol
from tests.support.redis_server import redis_server_fixture


class RunningServer:
    """A longresponse server on 127.0.0.1 in a background thread."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.app = create_app(config)
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                host="127.0.0.1",
                port=0,
                ws=LingeringWSProtocol,  # as the cli serves it
                ws_max_size=2 * config.max_message_bytes,
                ws_per_message_deflate=config.ws_compression,
                lifespan="on",
                log_level="warning",
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> RunningServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    @property
    def port(self) -> int:
        sockets = self.server.servers[0].sockets
        return int(sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def live_sessions(self) -> int:
        return int(self.app.parts.endpoint.live_sessions)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real redis-server on a free loopback port, for the whole run (fails if missing)."""
    yield from redis_server_fixture()


@pytest.fixture(scope="session")
def served_process() -> Iterator[None]:
    """The process-wide tuning ``longresponse serve`` does (the interpreter's switch
    interval), for servers run in the test process; undone after the run."""
    before = set_switch_interval()
    yield
    set_switch_interval(before)


@pytest.fixture(scope="session")
def server(
    tmp_path_factory: pytest.TempPathFactory, served_process: None
) -> Iterator[RunningServer]:
    """One server with the default configuration (a real SQLite store), shared by the run."""
    store = tmp_path_factory.mktemp("store") / "responses.db"
    running = RunningServer(ServerConfig(port=0, store=f"sqlite:///{store}")).start()
    yield running
    running.stop()


@pytest.fixture
def make_server(tmp_path: Any, served_process: None) -> Iterator[Callable[..., RunningServer]]:
    """Start a server with some configuration overridden (stopped after the test).

    Without a ``store`` override each server gets its own SQLite file.
    """
    started: list[RunningServer] = []

    def factory(**overrides: Any) -> RunningServer:
        overrides.setdefault("store", f"sqlite:///{tmp_path}/responses-{len(started)}.db")
        config = dataclasses.replace(ServerConfig(port=0), **overrides)
        running = RunningServer(config).start()
        started.append(running)
        return running

    yield factory
    for running in started:
        running.stop()


#: SDK clients made by a test, closed after it (their HTTP pools hold sockets).
OPEN_CLIENTS: list[Any] = []


@contextlib.contextmanager
def stalled_post(port: int, path: str, body: dict[str, Any]) -> Iterator[socket.socket]:
    """A raw HTTP POST of ``body`` to ``path`` from a socket with a 4 KiB receive
    buffer that then reads nothing until the caller does (a slow reader)."""
    data = json.dumps(body).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    with sock:
        sock.connect(("127.0.0.1", port))
        sock.sendall(
            b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n" % path.encode()
            + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(data), data)
        )
        yield sock


def openai_client(server: RunningServer, key: str = "test-key") -> Any:
    """An official ``openai`` client for ``server``, closed when the test ends."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.http_url}/v1", api_key=key, max_retries=0)
    OPEN_CLIENTS.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_openai_clients() -> Iterator[None]:
    yield
    while OPEN_CLIENTS:
        OPEN_CLIENTS.pop().close()
