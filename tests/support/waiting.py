"""Waiting for a condition that another thread or process makes true.

The servers under test run on another thread's asyncio loop (or in another
process), so there is no event a test could wait on: a short bounded poll is
the honest way to observe their state. Each wait has a deadline and says what
it waited for when the deadline passes; none sleeps for a fixed time in place
of waiting.

- ``wait_for``: from a plain (sync) test, blocking its thread.
- ``wait_until``: from a trio test, sleeping between polls so that the
  test's other tasks run; ``in_thread=True`` for a condition that blocks
  (an HTTP request to the server, say).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import trio

__all__ = ["wait_for", "wait_until"]

#: Between two looks at the condition.
INTERVAL = 0.01


def _timed_out(what: str, seconds: float) -> AssertionError:
    return AssertionError(f"timed out after {seconds:g} s waiting for {what}")


def wait_for(
    condition: Callable[[], object],
    what: str,
    seconds: float = 10.0,
    *,
    interval: float = INTERVAL,
) -> float:
    """Block until ``condition()`` is true; return the seconds it took.

    Raises ``AssertionError`` naming ``what`` if it is still false after
    ``seconds``; whatever ``condition`` raises propagates.
    """
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started >= seconds:
            raise _timed_out(what, seconds)
        time.sleep(interval)
    return time.monotonic() - started


async def wait_until(
    condition: Callable[[], object],
    what: str,
    seconds: float = 10.0,
    *,
    interval: float = INTERVAL,
    in_thread: bool = False,
) -> float:
    """Sleep (in trio) until ``condition()`` is true; return the seconds it took.

    ``in_thread`` runs each look in a worker thread, for a condition that
    blocks. Raises ``AssertionError`` naming ``what`` if it is still false
    after ``seconds``; whatever ``condition`` raises propagates.
    """
    started = time.monotonic()
    while not (await trio.to_thread.run_sync(condition) if in_thread else condition()):
        if time.monotonic() - started >= seconds:
            raise _timed_out(what, seconds)
        await trio.sleep(interval)
    return time.monotonic() - started
