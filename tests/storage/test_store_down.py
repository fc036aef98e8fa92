"""A store that is down is loud: startup refuses it, /healthz says so, no false `completed`.

Real processes only: a ``redis-server`` of the test's own (stopped and started
again on the same port) behind a ``longresponse serve`` child process.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Any

import httpx
import pytest
from openai import OpenAI

from longresponse.server_process import ServerProcess, free_port
from tests.support.redis_server import RedisServer

#: a real redis-server, stopped under a running server.
pytestmark = pytest.mark.services


def serve_command(*flags: str) -> list[str]:
    return [sys.executable, "-m", "longresponse", "serve", "--port", str(free_port()), *flags]


@pytest.mark.parametrize(
    ("store", "says"),
    [
        ("redis://127.0.0.1:{port}/0", "cannot use the store"),
        ("bogus://nowhere", "unknown store URL scheme"),
        ("sqlite://", "names no SQLite file"),
    ],
    ids=["unreachable-redis", "bad-scheme", "empty-sqlite-path"],
)
def test_startup_refuses_a_store_it_cannot_use(store: str, says: str) -> None:
    url = store.format(port=free_port())  # nothing listens there
    result = subprocess.run(
        serve_command("--store", url), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # one line, no traceback
    assert lines[0].startswith("longresponse: ")
    assert says in lines[0]


def test_a_store_that_goes_down_is_reported_and_never_acknowledged() -> None:
    executable = shutil.which("redis-server")
    assert executable is not None, "redis-server is installed by make test"
    redis = RedisServer(executable).start()
    port = redis.port
    with ServerProcess("--store", redis.url) as server, httpx.Client(timeout=30) as http:
        health = http.get(f"{server.http_url}/healthz")
        assert (health.status_code, health.json()["store"]) == (200, "up")
        redis.stop()

        health = http.get(f"{server.http_url}/healthz")
        assert health.status_code == 503
        assert health.json()["store"] == "down"
        assert health.json()["status"] == "degraded"

        body: dict[str, Any] = {"model": "sim", "input": "keep this", "store": True}
        reply = http.post(f"{server.http_url}/v1/responses", json=body)
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["code"] == "store_unavailable"
        assert reply.json()["error"]["type"] == "server_error"
        # What needs no store still works.
        reply = http.post(f"{server.http_url}/v1/responses", json={**body, "store": False})
        assert (reply.status_code, reply.json()["status"]) == (200, "completed")

        client = OpenAI(base_url=f"{server.http_url}/v1", api_key="k", max_retries=0)
        try:
            with client.responses.connect() as conn:
                conn.response.create(model="sim", input="over ws", store=True)
                terminal = next(
                    e
                    for e in conn
                    if e.type.startswith("response.")
                    and (e.type in ("response.completed", "response.failed", "response.incomplete"))
                )
                assert terminal.type == "response.failed"
                assert terminal.response.error is not None
                assert terminal.response.error.code == "server_error"
                conn.response.create(model="sim", input="no store needed", store=False)
                terminal = next(
                    e for e in conn if e.type in ("response.completed", "response.failed")
                )
                assert terminal.type == "response.completed"
        finally:
            client.close()

        # The same Redis comes back: used again without a restart.
        again = RedisServer(executable)
        again.port = port
        assert again._try_start() is None
        try:
            health = http.get(f"{server.http_url}/healthz")
            assert (health.status_code, health.json()["store"]) == (200, "up")
            reply = http.post(f"{server.http_url}/v1/responses", json=body)
            assert (reply.status_code, reply.json()["status"]) == (200, "completed")
            stored = http.get(f"{server.http_url}/v1/responses/{reply.json()['id']}")
            assert stored.status_code == 200
        finally:
            again.stop()
