"""Whether the upstream serves the configured model: asked once at start, a wrong
setting logged at ERROR with the setting to change (``backends/served_model.py``).

The engine is :class:`tests.support.engine_peer.StandIn`, which answers the
gateway's ``GET /v1/models`` with the list it is given (or 503 without one).
The real llama-server's answers (a name it does not serve, a wrong path) are
in ``tests/llama/test_served_model.py``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from longresponse.backends.served_model import ServedModel, serves
from longresponse.config import BackendConfig
from longresponse.server_process import free_port
from tests.conftest import openai_client
from tests.support.engine_peer import StandIn, answer, choice, record
from tests.support.waiting import wait_for

LOGGER = "longresponse.backends.served_model"


def chat_config(url: str, model: str = "qwen") -> BackendConfig:
    return BackendConfig(name="qwen", kind="chat", base_url=url, upstream_model=model)


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


def hello(model: str | None = None) -> Any:
    """A stand-in answering every turn "ok", its records naming ``model`` if given."""

    def script(number: int, body: dict[str, Any]) -> list[Any]:
        named = {"model": model} if model else {}
        text = {"choices": [{"index": 0, "delta": {"content": "ok"}}], **named}
        return [answer(record(text), choice(finish="stop"), record("[DONE]"))]

    return script


def test_a_model_the_engine_does_not_list_is_one_error_with_the_fix(
    make_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with StandIn(hello(), models=["Qwen/Qwen3-8B", "Qwen/Qwen3-32B"]) as engine:
        gateway = make_server(store="memory://", backends=(chat_config(engine.url),))
        wait_for(lambda: lines(caplog), "the check's log line")
        for _ in range(2):  # turns do not ask again, nor log it again
            openai_client(gateway).responses.create(model="qwen", input="hi")
    assert engine.listings == 1
    (line,) = lines(caplog)
    assert line.levelno == logging.ERROR
    message = line.getMessage()
    assert "does not serve 'qwen'" in message
    assert "'Qwen/Qwen3-8B', 'Qwen/Qwen3-32B'" in message
    assert 'Set upstream_model = "Qwen/Qwen3-8B" in [models.qwen]' in message
    assert "--upstream-model" in message
    assert "--alias" not in message  # not a llama.cpp server


def test_a_listed_model_is_an_info_line(make_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with StandIn(hello(), models=["qwen"]) as engine:
        make_server(store="memory://", backends=(chat_config(engine.url),))
        wait_for(lambda: lines(caplog), "the check's log line")
    (line,) = lines(caplog)
    assert line.levelno == logging.INFO
    assert "serves 'qwen'" in line.getMessage()


def test_without_a_list_the_first_answers_model_decides_once(
    make_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with StandIn(hello(model="/models/other.gguf")) as engine:  # GET /v1/models: 503
        gateway = make_server(store="memory://", backends=(chat_config(engine.url),))
        wait_for(lambda: lines(caplog), "the check's log line")
        (unasked,) = lines(caplog)
        assert unasked.levelno == logging.WARNING
        assert "answered HTTP 503" in unasked.getMessage()
        assert "its first answer's model is checked instead" in unasked.getMessage()
        for _ in range(2):
            openai_client(gateway).responses.create(model="qwen", input="hi")
    _, wrong = lines(caplog)
    assert wrong.levelno == logging.ERROR
    assert "answers as '/models/other.gguf', not 'qwen'" in wrong.getMessage()
    assert 'Set upstream_model = "/models/other.gguf"' in wrong.getMessage()


def test_an_unreachable_upstream_is_a_warning_and_a_dated_snapshot_answers_for_its_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    served = ServedModel(chat_config(f"http://127.0.0.1:{free_port()}/v1", model="gpt-4o"))
    asyncio.run(served.check())  # nothing listens there
    (line,) = lines(caplog)
    assert line.levelno == logging.WARNING
    assert "could not be reached" in line.getMessage()
    assert served.verdict == "open"
    served.answered_as("gpt-4o-2024-08-06")  # OpenAI's answer for "gpt-4o"
    assert served.verdict == "settled"
    assert len(lines(caplog)) == 1


def test_a_name_is_served_as_listed_or_as_ollamas_latest() -> None:
    assert serves("qwen3", ["qwen3:latest"])
    assert serves("qwen3:8b", ["qwen3:8b"])
    assert not serves("qwen3:8b", ["qwen3:latest"])
    assert not serves("qwen", ["Qwen/Qwen3-8B"])
