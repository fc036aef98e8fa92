"""``tests.support.waiting``: a wait ends when its condition holds, or at its
deadline with an error that names what it waited for."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from tests.support.waiting import wait_for, wait_until


def countdown(looks: int) -> tuple[list[int], Callable[[], bool]]:
    """A condition that is true from its ``looks``-th look on, and its count of looks."""
    seen: list[int] = []

    def condition() -> bool:
        seen.append(len(seen))
        return len(seen) >= looks

    return seen, condition


def test_wait_for_returns_once_the_condition_holds() -> None:
    seen, condition = countdown(3)
    assert wait_for(condition, "the third look", interval=0) >= 0
    assert len(seen) == 3


def test_wait_for_names_what_it_waited_for_at_its_deadline() -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0\.05 s waiting for the moon"):
        wait_for(lambda: False, "the moon", 0.05)


async def test_wait_until_returns_once_the_condition_holds() -> None:
    seen, condition = countdown(3)
    await wait_until(condition, "the third look", interval=0)
    assert len(seen) == 3


async def test_wait_until_names_what_it_waited_for_at_its_deadline() -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0\.05 s waiting for the moon"):
        await wait_until(lambda: False, "the moon", 0.05)


async def test_wait_until_in_thread_looks_from_a_worker_thread() -> None:
    threads: list[threading.Thread] = []

    def condition() -> bool:
        threads.append(threading.current_thread())
        return True

    await wait_until(condition, "one look", in_thread=True)
    assert threads
    assert threads[0] is not threading.main_thread()
