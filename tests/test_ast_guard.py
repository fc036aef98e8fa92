"""The suite's guard against CPython's shared AST state (tests/support/ast_guard.py).

Two threads parse while the collector runs finalizers that execute Python
code, the way a server thread formatting a traceback and hypothesis reading a
test's source did in the fuzz test's one failure. Unguarded, the race shows
within a few parses on this machine; guarded, not once in 50.
"""

from __future__ import annotations

import ast
import gc
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support import ast_guard
from tests.support.paths import ROOT

SOURCE = "x = " + "(" * 40 + "1" + ")" * 40 + "\n" + "\n".join(
    f"def f{i}(a, b):\n    return [a + b for _ in range(3)]" for i in range(200)
)


class Finalized:
    """A cycle whose finalizer runs Python code: a point where threads switch."""

    def __del__(self) -> None:
        sum(range(200))


@pytest.fixture
def eager_switching() -> Iterator[None]:
    interval, threshold = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(50)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*threshold)


def race(parse: Callable[[str], Any], rounds: int = 25) -> tuple[list[SystemError], int]:
    """Two threads each parsing :data:`SOURCE` ``rounds`` times, until one fails."""
    errors: list[SystemError] = []
    parsed = [0, 0]

    def worker(index: int) -> None:
        while parsed[index] < rounds and not errors:
            for _ in range(50):
                cycle = Finalized()
                cycle.self = cycle  # type: ignore[attr-defined]
            try:
                parse(SOURCE)
            except SystemError as exc:
                errors.append(exc)
            parsed[index] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors, sum(parsed)


def test_the_suite_runs_with_the_guard() -> None:
    assert ast_guard.installed()  # tests/conftest.py installs it before any server starts


def test_unguarded_parsing_in_two_threads_corrupts_the_shared_state() -> None:
    """What the guard is for: if this stops failing on some CPython, the
    guard may go (CPython 3.11.7 here). Run in a child process: unguarded,
    the race could hit this process's own server threads too."""
    race_alone = (
        "import gc, sys; from tests.support import ast_guard; "
        "from tests.test_ast_guard import race; "
        "sys.setswitchinterval(1e-6); gc.set_threshold(50); "
        "errors, _ = race(ast_guard._UNGUARDED, rounds=500); "
        "print(errors[0] if errors else 'no error')"
    )
    done = subprocess.run(
        [sys.executable, "-c", race_alone],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "AST constructor recursion depth mismatch" in done.stdout, done.stdout


@pytest.mark.slow  # races two threads for a second
@pytest.mark.usefixtures("eager_switching")
def test_guarded_parsing_in_two_threads_never_fails() -> None:
    errors, parsed = race(ast.parse)
    assert errors == []
    assert parsed == 50  # both threads parsed all their rounds
