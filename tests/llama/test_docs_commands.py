"""The llama.cpp command of the README and docs/REAL_MODELS.md is the one the
tests run (``LlamaServer.command()``), and REAL_MODELS.md's ``llama.toml`` is
the configuration they put in front of it (``LlamaServer.gateway_config()``),
read by ``longresponse serve --config`` as a user would run it."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

from longresponse.llama_server import LlamaServer
from longresponse.server_process import ServerProcess
from tests.conftest import openai_client
from tests.docs.test_docs import ROOT
from tests.llama.conftest import LOOP_TIMEOUT, MODEL, WEATHER

#: Real turns on two cores shared with other work: seconds on a quiet machine,
#: minutes on a loaded one (the engine measured 13-28 times slower).
pytestmark = pytest.mark.timeout(LOOP_TIMEOUT)

#: The port the docs' commands use.
DOCS_PORT = 8080
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(path: Path, language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(path.read_text()) if lang == language]


def documented_commands(path: Path) -> list[list[str]]:
    """Every ``llama-server`` command in ``path``'s sh blocks, as words."""
    found = []
    for body in blocks(path, "sh"):
        for line in body.replace("\\\n", " ").splitlines():
            if line.startswith("llama-server "):
                found.append(shlex.split(line))
    return found


def as_documented(server: LlamaServer) -> list[str]:
    """The command the tests run, as the docs write it: the program and the
    cache's files by name, the docs' port."""
    words = []
    for word in server.command():
        if word == str(server.port):
            word = str(DOCS_PORT)
        elif "/" in word:
            word = Path(word).name
        words.append(word)
    return words


def test_the_docs_llama_command_is_the_one_the_tests_run(llama: LlamaServer) -> None:
    expected = as_documented(llama)
    for doc in (ROOT / "README.md", ROOT / "docs" / "REAL_MODELS.md"):
        assert documented_commands(doc) == [expected], doc.name


def test_the_docs_llama_toml_is_the_one_the_tests_run(llama: LlamaServer) -> None:
    (documented,) = [
        tomllib.loads(body)
        for body in blocks(ROOT / "docs" / "REAL_MODELS.md", "toml")
        if f"[models.{MODEL}]" in body
    ]
    ours = tomllib.loads(llama.gateway_config())
    ours["models"][MODEL]["base_url"] = f"http://127.0.0.1:{DOCS_PORT}/v1"
    assert documented == ours


def test_longresponse_serve_with_the_docs_config_in_front_of_the_engine(
    llama: LlamaServer, tmp_path: Path
) -> None:
    """The README's second command, as a process: one real call through it."""
    config = tmp_path / "llama.toml"
    config.write_text(llama.gateway_config())
    with ServerProcess("--store", "memory://", "--config", str(config)) as gateway:
        client: Any = openai_client(gateway)  # (it reads only .http_url)
        models = {m.id: m.owned_by for m in client.models.list().data}
        assert models[MODEL] == "chat"
        # Greedy: sampled, about one call in forty ran past the budget.
        response = client.responses.create(
            model=MODEL,
            input="Weather in Oslo?",
            tools=[WEATHER],
            temperature=0,
            max_output_tokens=60,
        )
    assert response.status == "completed"
    (call,) = [o for o in response.output if o.type == "function_call"]
    assert call.name == "get_weather"
