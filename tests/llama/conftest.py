"""The real engine for the tests in this directory: llama.cpp's llama-server
with SmolLM2-135M, built by ``make engine`` (``scripts/engine.sh``).

Missing, the engine FAILS these tests (never skips): ``make test`` builds it
first. One server runs for the whole session (the model loads once); a test
that kills or reconfigures its engine starts its own :class:`LlamaServer`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from longresponse.llama_server import LlamaEngine, LlamaServer


@pytest.fixture(scope="session")
def llama_engine() -> LlamaEngine:
    try:
        return LlamaEngine.from_cache()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def llama(llama_engine: LlamaEngine) -> Iterator[LlamaServer]:
    """One llama-server for the session: two slots, two threads."""
    with LlamaServer(llama_engine) as server:
        yield server
