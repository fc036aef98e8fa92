"""The suite's tiers: what a test needs beyond Python, as pytest markers.

``engine`` (the real llama-server and its model), ``npm`` (the Node clients),
``browser`` (Debian's chromium and chromedriver), ``services`` (redis-server,
nginx) and ``slow`` (server processes, kill -9 cycles, waits that run a
timeout out, whole benchmarks: correct, but more than the fast tier's minute
allows; each such test says why beside its marker). ``make test`` runs every tier;
``make test-fast`` deselects all five.

A test gets a marker from the fixtures it uses (:data:`BY_FIXTURE`: every
test that asks for ``redis_url`` needs redis-server, wherever it lives) or
from its module's ``pytestmark``. Before anything runs,
:func:`pytest_collection_finish` checks that what the selected tests need is
there, and otherwise ends the run with one line naming what is missing and
the command that installs it (under pytest-xdist a worker cannot end the
run, so each test of such a tier fails with that line instead): the tests
themselves still fail, never skip, when a part goes missing under them.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

from longresponse.llama_server import LlamaEngine

ROOT: Final = Path(__file__).resolve().parent.parent.parent

#: Each tier's marker, and what it says in ``pytest --markers``.
MARKERS: Final = {
    "engine": "needs the real llama-server and SmolLM2 (make engine)",
    "npm": (
        "needs the Node clients from npm: Codex, the TypeScript SDK, the AI SDK, Cline, "
        "the Agents SDK for JavaScript, on Node 22 from npm (make node-clients)"
    ),
    "browser": "needs Debian's chromium and chromedriver (make test-services)",
    "services": "needs redis-server or nginx (make test-services)",
    "slow": "correct but too long for the fast tier: processes, timeouts run out, benchmarks",
    "serial": "measures another client's delay: runs alone, after the parallel part of make test",
}

#: A fixture that brings a tier's part in: its users carry the marker.
BY_FIXTURE: Final = {
    "redis_url": "services",
    "llama_engine": "engine",
    "browser": "browser",
}


def _engine() -> bool:
    try:
        LlamaEngine.from_cache()
    except FileNotFoundError:
        return False
    return True


def _nginx() -> bool:
    return bool(shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin"))


#: What each tier needs: (what it is called, whether it is here, what installs it).
NEEDS: Final[dict[str, list[tuple[str, Callable[[], bool], str]]]] = {
    "engine": [("the engine (llama-server, SmolLM2)", _engine, "make engine")],
    "npm": [
        (
            "the Node clients",
            lambda: (ROOT / "tests/clients/node_modules/.installed").is_file(),
            "make node-clients",
        )
    ],
    "browser": [
        ("chromium", lambda: shutil.which("chromium") is not None, "make test-services"),
        ("chromedriver", lambda: shutil.which("chromedriver") is not None, "make test-services"),
    ],
    "services": [
        ("redis-server", lambda: shutil.which("redis-server") is not None, "make test-services"),
        ("nginx", _nginx, "make test-services"),
    ],
}


def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker, and xdist groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            if marker := BY_FIXTURE.get(fixture):
                item.add_marker(marker)
        if item.get_closest_marker("engine"):
            # one engine for the run, on one worker (two would share two cores)
            item.add_marker(pytest.mark.xdist_group("engine"))


def lacking(items: list[pytest.Item]) -> dict[str, list[tuple[str, str]]]:
    """Each tier the selected ``items`` need whose part this machine lacks:
    tier -> [(part, the command that installs it)]."""
    tiers = {mark.name for item in items for mark in item.iter_markers() if mark.name in NEEDS}
    found = {
        tier: [(part, command) for part, present, command in NEEDS[tier] if not present()]
        for tier in sorted(tiers)
    }
    return {tier: parts for tier, parts in found.items() if parts}


def _said(lacking: list[tuple[str, str]]) -> str:
    parts = ", ".join(part for part, _ in lacking)
    commands = " and ".join(dict.fromkeys(command for _, command in lacking))
    return (
        f"missing for the selected tests: {parts}; {commands} installs "
        "(make test does all), or run only the fast tier: make test-fast"
    )


#: Under pytest-xdist, what this worker's tests lack (a worker cannot end the
#: run: its output is not shown, and the controller collects nothing itself).
_LACKING: dict[str, str] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or not (missing := lacking(session.items)):
        return
    if hasattr(session.config, "workerinput"):
        _LACKING.update((tier, _said(parts)) for tier, parts in missing.items())
        return
    pytest.exit(
        _said([part for parts in missing.values() for part in parts]),
        returncode=pytest.ExitCode.USAGE_ERROR,
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    """On an xdist worker, each test of a tier whose part is missing fails with the line."""
    for mark in item.iter_markers():
        if said := _LACKING.get(mark.name):
            pytest.fail(said, pytrace=False)
