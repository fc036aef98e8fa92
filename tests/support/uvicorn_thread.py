"""A uvicorn server run in a daemon thread of the test process.

The test server, the loopback MCP servers and a plain-uvicorn server each
run on their own asyncio loop in a thread, so that a test (trio, or plain)
reaches them over real TCP; ``start_in_thread`` returns once the server
listens.
"""

from __future__ import annotations

import threading

import uvicorn

from tests.support.waiting import wait_for

__all__ = ["start_in_thread"]


def start_in_thread(server: uvicorn.Server, what: str, seconds: float = 10.0) -> threading.Thread:
    """Run ``server`` in a new daemon thread and return the thread once the
    server has started (the caller stops it: ``should_exit``, then ``join``).

    Raises ``AssertionError`` naming ``what`` if it has not started within
    ``seconds`` or its thread ended first (the thread is left running, if it
    still is).
    """
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), f"{what} to start", seconds)
    assert server.started, f"{what} ended before it started"
    return thread
