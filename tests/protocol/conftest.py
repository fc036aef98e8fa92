"""The protocol tests' fixtures: a fresh :class:`ConnectionPair`, and one paused on two calls."""

from __future__ import annotations

import pytest

from tests.support.connection_pair import ConnectionPair


@pytest.fixture(params=[False, True], ids=["bytes", "str"])
def pair(request: pytest.FixtureRequest) -> ConnectionPair:
    return ConnectionPair(as_text=request.param)


@pytest.fixture
def paused(pair: ConnectionPair) -> ConnectionPair:
    """``resp_1`` paused on two tool calls, ``c1`` and ``c2``."""
    pair.create(input="add things")
    pair.start()
    pair.call("c1")
    pair.call("c2")
    pair.pause("c1", "c2")
    return pair
