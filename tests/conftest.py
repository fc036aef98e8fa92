"""Shared fixtures: a real uvicorn (wsproto) server on a free loopback port.

The server runs in a thread with its own asyncio loop, so a test (trio, via
pytest-trio) talks to it over real TCP exactly as any client would, and can
still look at the app's state (live sessions) to check cleanup.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn

from longresponse.config import ServerConfig
from longresponse.serve.app import create_app
from longresponse.serve.collector import set_switch_interval
from longresponse.serve.shutdown import GracefulServer
from longresponse.serve.ws.oversize import LingeringWSProtocol
from longresponse.serve.ws.session import Session
from longresponse.server_process import ServerProcess
from tests.support import ast_guard
from tests.support.http_clients import OPEN_CLIENTS, SHARED_CLIENTS
from tests.support.http_clients import openai_client as openai_client  # where tests import it
from tests.support.redis_server import redis_server_fixture
from tests.support.uvicorn_thread import start_in_thread

ast_guard.install()  # before any server thread can format a traceback

pytest_plugins = ["tests.support.tiers"]  # the markers, and what a bare run lacks


class RunningServer:
    """A longresponse server on 127.0.0.1 in a background thread.

    ``graceful``: run it as ``longresponse serve`` does (``GracefulServer``), so
    that :meth:`stop` drains its WebSockets as SIGTERM would (turns in flight
    finish within ``shutdown_drain_timeout``, then 1012); otherwise plain
    uvicorn closes them 1012 at once."""

    def __init__(
        self, config: ServerConfig, *, shared: bool = False, graceful: bool = False
    ) -> None:
        self.config = config
        #: the run's one server (the ``server`` fixture), which tests share
        self.shared = shared
        #: The WebSocket session opened last (kept here, for tests that look
        #: at a connection's state after it closed; the server keeps none).
        self.last_session: Session | None = None
        self.app = create_app(config, on_session=self._opened)
        served = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=0,
            ws=LingeringWSProtocol,  # as the cli serves it
            ws_max_size=2 * config.max_message_bytes,
            ws_per_message_deflate=config.ws_compression,
            lifespan="on",
            log_level="warning",
        )
        self.server = (
            GracefulServer(
                served, self.app.parts.endpoint, drain_timeout=config.shutdown_drain_timeout
            )
            if graceful
            else uvicorn.Server(served)
        )

    def _opened(self, session: Session) -> None:
        self.last_session = session

    def start(self) -> RunningServer:
        self.thread = start_in_thread(self.server, "the test server")
        return self

    def stop(self, *, wait: bool = True) -> None:
        """Ask the server to exit and, with ``wait``, join its thread.

        uvicorn notices ``should_exit`` on its next 0.1 s tick and then
        waits 0.1 s more for connections to close, so a join takes 0.2 s;
        a test's own servers are joined together at the end of the run
        (:func:`_join_stopped_servers`) instead of one by one."""
        self.server.should_exit = True
        if wait:
            self.thread.join(timeout=10)
        else:
            STOPPING.append(self.thread)  # the thread alone: the app can be freed

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
    running = RunningServer(ServerConfig(port=0, store=f"sqlite:///{store}"), shared=True).start()
    yield running
    while SHARED_CLIENTS:
        SHARED_CLIENTS.popitem()[1].close()
    running.stop()


@pytest.fixture
def server_process(tmp_path: Any) -> Iterator[ServerProcess]:
    """A server in a process of its own (``longresponse serve``), with its own SQLite file."""
    with ServerProcess("--store", f"sqlite:///{tmp_path}/responses.db") as running:
        yield running


@pytest.fixture
def make_server(tmp_path: Any, served_process: None) -> Iterator[Callable[..., RunningServer]]:
    """Start a server with some configuration overridden (stopped after the test).

    Without a ``store`` override each server gets its own SQLite file;
    ``graceful=True`` runs it as ``longresponse serve`` does (:class:`RunningServer`).
    """
    started: list[RunningServer] = []

    def factory(*, graceful: bool = False, **overrides: Any) -> RunningServer:
        overrides.setdefault("store", f"sqlite:///{tmp_path}/responses-{len(started)}.db")
        config = dataclasses.replace(ServerConfig(port=0), **overrides)
        running = RunningServer(config, graceful=graceful).start()
        started.append(running)
        return running

    yield factory
    for running in started:
        running.stop(wait=False)


#: The threads of servers asked to exit and not yet joined (:meth:`RunningServer.stop`).
STOPPING: list[threading.Thread] = []


@pytest.fixture(scope="session", autouse=True)
def _join_stopped_servers() -> Iterator[None]:
    yield
    for thread in STOPPING:
        thread.join(timeout=10)
    stuck = [thread.name for thread in STOPPING if thread.is_alive()]
    STOPPING.clear()
    assert not stuck, f"test servers that did not exit: {stuck}"


@pytest.fixture(autouse=True)
def _close_openai_clients() -> Iterator[None]:
    """Close the SDK clients ``openai_client`` made during the test."""
    yield
    while OPEN_CLIENTS:
        OPEN_CLIENTS.pop().close()
