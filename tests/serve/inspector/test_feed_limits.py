"""The inspector's live feeds among tenants: per-key quota, lifetime, slow readers.

- With keys on, one key holds at most ``--inspector-watchers-per-key`` feeds;
  at its quota its next feed is refused (429 ``too_many_watchers``) while
  another key's opens (four never-reading feeds of keyB kept every other key
  at 429 for as long as it held them).
- A feed ends after ``--inspector-feed-lifetime``.
- A feed that is never read is cut off within ``--slow-reader-timeout`` and
  its place freed (one blocked in its send was never dropped).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.http_clients import unread_request
from tests.support.waiting import wait_for

FEED = "/inspect/api/feed"


@contextlib.contextmanager
def unread_feed(port: int, key: str) -> Iterator[socket.socket]:
    """A feed opened from a socket with a 4 KiB receive buffer that never reads."""
    request = b"GET %s?key=%s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % (FEED.encode(), key.encode())
    with unread_request(port, request) as sock:
        yield sock


def watchers(server: Any) -> int:
    return len(server.app.parts.inspector.watchers)


def test_one_key_at_its_feed_quota_does_not_stop_another(make_server: Any) -> None:
    server = make_server(
        api_keys=("key-a", "key-b"), inspector_watchers=4, inspector_watchers_per_key=2
    )
    with unread_feed(server.port, "key-b"), unread_feed(server.port, "key-b"):
        wait_for(lambda: watchers(server) == 2, "two feeds")
        with httpx.Client(base_url=server.http_url, timeout=10) as http:
            refused = http.get(FEED, params={"key": "key-b"})
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "too_many_watchers"
            assert "This API key" in refused.json()["error"]["message"]
            with http.stream("GET", FEED, params={"key": "key-a"}) as mine:
                assert mine.status_code == 200
    wait_for(lambda: watchers(server) == 0, "no feed")


def test_a_feed_ends_after_its_lifetime(make_server: Any) -> None:
    server = make_server(inspector_feed_lifetime=0.3)
    with httpx.Client(base_url=server.http_url, timeout=10) as http:
        started = time.monotonic()
        with http.stream("GET", FEED) as feed:
            lines = list(feed.iter_lines())  # ends on its own
        assert time.monotonic() - started < 5
    assert lines[0] == "event: state"
    wait_for(lambda: watchers(server) == 0, "no feed")


@pytest.mark.slow  # waits out the slow-reader timeout
def test_a_feed_that_is_never_read_is_cut_off(make_server: Any) -> None:
    server = make_server(api_keys=("key-a",), slow_reader_timeout=0.3, inspector_watchers=1)
    client = httpx.Client(
        base_url=server.http_url, timeout=30, headers={"authorization": "Bearer key-a"}
    )
    with client, unread_feed(server.port, "key-a") as sock:
        wait_for(lambda: watchers(server) == 1, "the feed")
        # Traffic for the feed to tell of, until its writes back up and it is cut off.
        deadline = time.monotonic() + 60
        while watchers(server):
            assert time.monotonic() < deadline, "the feed was never dropped"
            body = {
                "model": "sim",
                "input": "x",
                "metadata": {"sim_output_tokens": "2000"},
                "stream": True,
            }
            with client.stream("POST", "/v1/responses", json=body) as answer:
                for _ in answer.iter_bytes():
                    pass
        sock.settimeout(5)
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(1 << 16):
                pass  # what was in flight, then the end
        with httpx.stream("GET", f"{server.http_url}{FEED}", params={"key": "key-a"}) as again:
            assert again.status_code == 200  # its place is free
