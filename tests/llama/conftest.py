"""The real engine for the tests in this directory: llama.cpp's llama-server
with SmolLM2-135M, built by ``make engine`` (``scripts/engine.sh``).

Missing, the engine FAILS these tests (never skips): ``make test`` builds it
first. One server runs for the whole session (the model loads once); a test
that kills or reconfigures its engine starts its own :class:`LlamaServer`.
The gateway in front of it is configured by the TOML docs/REAL_MODELS.md
shows (:meth:`LlamaServer.gateway_config`), read as ``serve --config`` reads it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from longresponse.backends.settings import load_toml
from longresponse.llama_server import SERVED_NAME, LlamaEngine, LlamaServer

#: The tool every loop offers; its real calls come from the engine's grammar.
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
MODEL = SERVED_NAME
#: Seconds one test here may take (pytest-timeout; the suite's default is 60).
LOOP_TIMEOUT = 600
#: Seconds an engine's counters may take to settle after a stream ended.
SETTLE = 10.0


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


def gateway_backends(engine: LlamaServer, tmp_path: Path, **changes: Any) -> tuple[Any, ...]:
    """The backends of the docs' TOML for ``engine``, with ``changes`` set in its table
    (a key the docs set is replaced)."""
    lines = engine.gateway_config().splitlines()
    for key, value in changes.items():
        setting = f"{key} = {_toml(value)}"
        at = [i for i, line in enumerate(lines) if line.split("=", 1)[0].strip() == key]
        if at:
            lines[at[0]] = setting
        else:
            lines.append(setting)
    text = "\n".join(lines) + "\n"
    path = tmp_path / f"llama-{len(list(tmp_path.glob('llama-*.toml')))}.toml"
    path.write_text(text)
    return load_toml(str(path))


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    return str(value)


@pytest.fixture
def front(
    make_server: Callable[..., Any], llama: LlamaServer, tmp_path: Path
) -> Callable[..., Any]:
    """A gateway in front of the session's engine (more TOML settings as keywords)."""

    def start(engine: LlamaServer | None = None, **changes: Any) -> Any:
        backends = gateway_backends(engine or llama, tmp_path, **changes)
        return make_server(store="memory://", backends=backends)

    return start


class Counted:
    """The engine's own token counters, before and after: what it evaluated,
    found cached and generated meanwhile (``/metrics``)."""

    def __init__(self, engine: LlamaServer) -> None:
        self.engine = engine
        self.before = self.settled()

    def settled(self) -> dict[str, float]:
        """The counters once no request is processing (they move when one ends)."""
        deadline = time.monotonic() + SETTLE
        while True:
            values = self.engine.metrics()
            if values["requests_processing"] == 0 or time.monotonic() > deadline:
                return values
            time.sleep(0.02)

    def delta(self) -> tuple[int, int, int]:
        """(prompt tokens evaluated, prompt tokens cached, tokens generated) since."""
        after = self.settled()
        return (
            int(after["prompt_tokens_total"] - self.before["prompt_tokens_total"]),
            int(after["prompt_tokens_cached_total"] - self.before["prompt_tokens_cached_total"]),
            int(after["tokens_predicted_total"] - self.before["tokens_predicted_total"]),
        )
